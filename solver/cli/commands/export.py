"""``tangram export PLAN.json --job JOB --to flagscale|megatron [-o FILE]``: a plan as the
runtime's configuration (the plan is re-validated against the job first). ``tangram plan JOB
--emit ...`` writes the same for a fresh plan. Exit status 3 when the runtime cannot express
the plan, with one line saying why."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from solver.launch import NotExpressible, flagscale_yaml, megatron_args
from solver.planner.plan import Plan
from solver.planner.replica_plan import not_exportable
from solver.spec.errors import InputError
from solver.spec.fields import read_json, write_atomic
from solver.spec.loaders import load_job

TARGETS = ("flagscale", "megatron")


def register(sub: argparse._SubParsersAction) -> None:
    """Add the ``export`` subcommand."""
    p = sub.add_parser("export", help="write a plan as FlagScale YAML or Megatron-LM arguments")
    p.add_argument("plan", metavar="PLAN.json", help="output of `tangram plan JOB --json`")
    p.add_argument("--job", required=True, help="the job TOML the plan was made for")
    p.add_argument("--to", required=True, choices=TARGETS, help="runtime")
    p.add_argument("-o", "--output", metavar="FILE", help="write to FILE (default: stdout)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Re-validate the plan against the job, then export it."""
    from solver.studies.previous import previous_plan
    job = load_job(args.job)
    payload = read_json(args.plan)
    replicas = payload.get("replicas") if isinstance(payload, dict) else None
    if isinstance(replicas, list) and len(replicas) > 1:
        shares = [r.get("share") for r in replicas if isinstance(r, dict)]
        print(f"cannot export to {args.to}: {not_exportable(shares)}", file=sys.stderr)
        return 3
    plan = previous_plan(payload, job, args.plan)
    return emit(plan, args.to, args.output)


def render(plan: Plan, target: str) -> str:
    """The export text (raises :class:`NotExpressible`)."""
    if target == "flagscale":
        return flagscale_yaml(plan)
    lines = megatron_args(plan)
    return " \\\n".join(lines) + "\n"


def emit(plan: Plan, target: str, output: str | None) -> int:
    """Write the export to ``output`` (atomically) or stdout; 3 when not expressible."""
    try:
        text = render(plan, target)
    except NotExpressible as exc:
        print(f"cannot export to {target}: {exc}", file=sys.stderr)
        return 3
    if output is None:
        sys.stdout.write(text)
        return 0
    path = Path(output)
    if not path.parent.is_dir():
        raise InputError("<cli>", "-o", f"directory {path.parent} does not exist")
    write_atomic(path, text)
    return 0
