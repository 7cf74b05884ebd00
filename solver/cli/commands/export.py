"""``tangram export PLAN.json --job JOB --to flagscale|megatron [-o FILE]``: a plan as the
runtime's configuration (the plan is re-validated against the job first). ``tangram plan JOB
--emit ...`` writes the same for a fresh plan (with ``--json``: under the plan's ``"export"``
key). FlagScale: the experiment YAML and its hostfile (with ``-o plan.yaml``, written beside it
as ``plan.hostfile`` and named in the YAML; on stdout, its lines follow as comments).
Megatron-LM: the launch (nodes in rank order, ``torchrun`` line, arguments). Exit status 3
when the runtime cannot express the plan, with one line saying why."""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

from solver.launch import NotExpressible, flagscale_hostfile, flagscale_yaml, megatron_launch
from solver.planner.plan import Plan
from solver.planner.replica.replica_plan import not_exportable
from solver.spec.errors import InputError
from solver.spec.fields import read_json, write_atomic
from solver.spec.loaders import load_job

TARGETS = ("flagscale", "megatron")


def register(sub: argparse._SubParsersAction) -> None:
    """Add the ``export`` subcommand."""
    p = sub.add_parser("export", help="write a plan as FlagScale YAML or a Megatron-LM launch")
    p.add_argument("plan", metavar="PLAN.json", help="output of `tangram plan JOB --json`")
    p.add_argument("--job", required=True, help="the job TOML the plan was made for")
    p.add_argument("--to", required=True, choices=TARGETS, help="runtime")
    p.add_argument("-o", "--output", metavar="FILE",
                   help="write to FILE (default: stdout); flagscale: and the hostfile beside "
                        "it, FILE with the suffix .hostfile")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Re-validate the plan against the job, then export it."""
    from solver.studies.previous import previous_plan
    job = load_job(args.job)
    payload = read_json(args.plan)
    replicas = payload.get("replicas") if isinstance(payload, dict) else None
    if isinstance(replicas, list) and len(replicas) > 1:
        shares = [r.get("share") for r in replicas if isinstance(r, dict)]
        # The plan's own verdict (``runtime.why``, written by the replica search) when present.
        verdict = payload.get("runtime") if isinstance(payload.get("runtime"), dict) else {}
        why = verdict.get("why") if isinstance(verdict.get("why"), str) else ""
        print(f"cannot export to {args.to}: {not_exportable(shares, why)}", file=sys.stderr)
        return 3
    plan = previous_plan(payload, job, args.plan)
    return emit(plan, args.to, args.output)


@dataclass(frozen=True)
class Export:
    """One export: the text the runtime reads, and FlagScale's hostfile.

    Attributes
    ----------
    framework : str
        ``flagscale`` or ``megatron``.
    text : str
        The YAML or the launch script.
    hostfile : str | None
        FlagScale's hostfile (None for Megatron-LM, whose node list is in the text).
    hostfile_path : str | None
        Where the YAML says the hostfile is (None: on stdout, listed as comments).
    """

    framework: str
    text: str
    hostfile: str | None = None
    hostfile_path: str | None = None


def hostfile_path(output: str) -> str:
    """``plan.yaml`` -> ``plan.hostfile`` (the same directory, as the user wrote it)."""
    return str(Path(output).with_suffix(".hostfile"))


def render(plan: Plan, target: str, output: str | None = None) -> Export:
    """The export (raises :class:`NotExpressible`); ``output``: where it will be written."""
    if target == "flagscale":
        where = hostfile_path(output) if output else None
        export = Export(target, flagscale_yaml(plan, where), flagscale_hostfile(plan), where)
        _judge(export)
        return export
    return Export(target, megatron_launch(plan))


def _judge(export: Export) -> None:
    """FlagScale's own rules (:mod:`solver.launch.flagscale_check`) on what is about to be
    written: a break is an exporter bug, refused rather than handed to a cluster."""
    import yaml
    from solver.launch.flagscale_check import problems
    found = problems(yaml.safe_load(export.text), export.hostfile)
    if found:
        raise NotExpressible(f"the export breaks {len(found)} FlagScale rule(s): "
                             + "; ".join(found))


def _write(export: Export, output: str) -> None:
    path = Path(output)
    if not path.parent.is_dir():
        raise InputError("<cli>", "-o", f"directory {path.parent} does not exist")
    if export.hostfile_path:
        write_atomic(Path(export.hostfile_path), export.hostfile or "")
    write_atomic(path, export.text)


def emit(plan: Plan, target: str, output: str | None) -> int:
    """Write the export to ``output`` (atomically, with its hostfile) or stdout; 3 when not
    expressible."""
    try:
        export = render(plan, target, output)
    except NotExpressible as exc:
        print(f"cannot export to {target}: {exc}", file=sys.stderr)
        return 3
    if output is None:
        sys.stdout.write(export.text)
        return 0
    _write(export, output)
    return 0


def export_json(plan: Plan, target: str, output: str | None) -> dict | None:
    """The ``"export"`` object of ``plan --json --emit`` (files written with ``-o`` too);
    None after printing the one-line reason when the runtime cannot express the plan."""
    try:
        export = render(plan, target, output)
    except NotExpressible as exc:
        print(f"cannot export to {target}: {exc}", file=sys.stderr)
        return None
    if output is not None:
        _write(export, output)
    out = {"framework": target, "text": export.text, "hostfile": export.hostfile}
    if output is not None:
        out.update(path=output, hostfile_path=export.hostfile_path)
    return out


def text_alone(args: argparse.Namespace) -> None:
    """``--emit`` prints only the export: the options that print more need ``--json``."""
    extra = [flag for flag, on in (("--simulate", args.simulate), ("--plot", args.plot),
                                   ("--explain", args.explain)) if on]
    if extra:
        raise InputError("<cli>", "--emit", f"prints only the export; with {', '.join(extra)} "
                                            "add --json (the plan's JSON holds both)")
