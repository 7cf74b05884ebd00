"""``tangram verify JOB``: pruning ablation and cross-solver check."""

from __future__ import annotations

import argparse
import sys

from solver.cli.report import emit_json, render_table
from solver.planner.plan import _r
from solver.spec.loaders import load_job
from solver.studies.verify import ablation_rows, cross_check


def register(sub: argparse._SubParsersAction) -> None:
    """Add the ``verify`` subcommand."""
    p = sub.add_parser("verify", help="check that pruning keeps the optimum; cross-check solvers")
    p.add_argument("job", metavar="JOB", help="job TOML file")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=run, own_progress=True)


def _n_micro(job) -> int:
    if job.training.n_micro:
        return job.training.n_micro
    from solver.studies.sweep import plan_auto
    return plan_auto(job).n_micro


def progress(console=None):
    """A progress display for the 7 steps of ``verify`` (6 ablation rows, the cross-check) on
    stderr, when it is a terminal (``rich``); ``console`` overrides where it draws."""
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
    console = console or Console(stderr=True)
    return Progress(TextColumn("verify: {task.description}"), BarColumn(),
                    TextColumn("{task.completed}/{task.total}"), TimeElapsedColumn(),
                    console=console, transient=True, disable=not console.is_terminal)


def run(args: argparse.Namespace, console=None) -> int:
    """Print the ablation table and the solver cross-check (progress on a terminal's stderr)."""
    job = load_job(args.job)
    n = _n_micro(job)
    done = []
    try:
        with progress(console) as bar:
            task = bar.add_task("unpruned run", total=7)
            for row in ablation_rows(job, n):
                done.append(row)
                bar.update(task, advance=1, description=f"rules {row.rules.label} next"
                           if len(done) > 1 else "rule sets")
            bar.update(task, description="DP, CP-SAT and MILP")
            solvers = cross_check(job, n)
            bar.update(task, advance=1)
    except KeyboardInterrupt:
        if done:
            print(render_table(_text_rows(done[0], done[1:])))
        print(f"interrupted after {len(done)} of 6 ablation rows", file=sys.stderr)
        return 130
    unpruned, rows = done[0], done[1:]
    if args.json:
        payload = {
            "unpruned": {"objective_s": _opt(unpruned.objective_s),
                         "parallelizer_calls": unpruned.parallelizer_calls,
                         "time_s": _r(unpruned.time_s, 4)},
            "ablation": [{"rules": r.rules.label, "objective_s": _opt(r.objective_s),
                          "parallelizer_calls": r.parallelizer_calls, "time_s": _r(r.time_s, 4),
                          "optimum_kept": r.optimum_kept} for r in rows],
            "solvers": {k: (_opt(v) if isinstance(v, float) or v is None else v)
                        for k, v in solvers.items()}}
        emit_json(payload, args)
        return 0
    print(f"job {job.name}, n_micro {n}")
    print(render_table(_text_rows(unpruned, rows)))
    print("solvers on the rules-1,2,3,4 candidate set: " + ", ".join(
        _solver_txt(k, solvers[k], solvers["status"][k]) for k in solvers["status"])
        + f" -> {solvers['verdict'].upper() if solvers['verdict'] == 'disagree' else solvers['verdict']}")
    return 0


def _solver_txt(kind: str, objective, status: dict) -> str:
    """``cpsat 2.997662`` or, for a solver its time limit stopped, the plan it had and what it
    proved: its bound and gap where it has them, else that it proved none; or why it did not
    run."""
    if status.get("not_run"):
        return f"{kind} not run ({status['not_run']})"
    if status["proven"]:
        return f"{kind} {_txt(objective)}"
    proved = [f"bound {status['bound_s']:.6f} s" if status["bound_s"] is not None else "",
              f"gap {status['gap']:.1%}" if status["gap"] is not None else ""]
    what = ", ".join(p for p in proved if p) or "no bound proven, so no gap"
    found = "no plan found" if objective is None else f"{_txt(objective)}"
    return f"{kind} {found}, not proven optimal (time limit; {what})"


def _text_rows(unpruned, rows) -> list[dict]:
    table = [{"rules": "none (unpruned)", "calls": unpruned.parallelizer_calls,
              "time s": unpruned.time_s, "objective s": _txt(unpruned.objective_s),
              "optimum kept": "-", "reduction": "1.0x"}]
    for r in rows:
        table.append({"rules": r.rules.label, "calls": r.parallelizer_calls, "time s": r.time_s,
                      "objective s": _txt(r.objective_s),
                      "optimum kept": "yes" if r.optimum_kept else f"NO (+{r.loss:.2%})",
                      "reduction": f"{unpruned.parallelizer_calls / max(r.parallelizer_calls, 1):.1f}x"})
    return table


def _opt(v):
    return None if v is None else _r(v)


def _txt(v) -> str:
    return "infeasible" if v is None else f"{v:.6f}"
