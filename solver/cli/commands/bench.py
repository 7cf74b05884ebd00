"""``tangram bench [JOB ...] [--json] [--solvers dp,cpsat,milp] [--baselines] [--time-limit S]``.

One row per job (default: every job of ``instances/jobs``). Progress goes to stderr when it is a
terminal; Ctrl-C prints the rows finished so far and exits with status 130.
"""

from __future__ import annotations

import argparse
from dataclasses import replace
import os
import sys

from solver.cli.report import emit_json, render_table
from solver.spec.domain import SolverKind
from solver.spec.errors import InputError
from solver.studies.bench import BenchOptions, bench_job, suite_paths
from solver.studies.bench_rows import BenchRow, SolverRun, SolverStatus, row_json

INTERRUPTED = 130
_ALLOWED = tuple(s for s in SolverKind if s is not SolverKind.BRUTE)


def register(sub: argparse._SubParsersAction) -> None:
    """Add the ``bench`` subcommand."""
    p = sub.add_parser("bench", help="run the benchmark suite: one row of measurements per job")
    p.add_argument("jobs", metavar="JOB", nargs="*",
                   help="job files or suite job names (default: every job in instances/jobs)")
    p.add_argument("--json", action="store_true", help='print {"rows": [...]}')
    p.add_argument("--solvers", metavar="LIST",
                   help=f"also compose with these solvers and compare "
                        f"(comma-separated: {','.join(s.value for s in _ALLOWED)})")
    p.add_argument("--baselines", action="store_true",
                   help="also plan the oblivious and restricted baselines (Figure 7)")
    p.add_argument("--time-limit", type=float, metavar="S",
                   help="CP-SAT/MILP time limit per solve (s)")
    p.add_argument("--replicas", action="store_true",
                   help="also search pipeline replicas across islands (columns R, shares, "
                        "tokens/s R)")
    p.set_defaults(func=run, own_progress=True)


def parse_solvers(text: str | None) -> tuple[SolverKind, ...]:
    """``dp,cpsat,milp`` → solver kinds (order kept, duplicates dropped)."""
    if not text:
        return ()
    names = {s.value: s for s in _ALLOWED}
    out: list[SolverKind] = []
    for part in (p.strip() for p in text.split(",")):
        if part not in names:
            raise InputError("<cli>", "--solvers",
                             f"unknown solver {part!r} (choose from {', '.join(names)})")
        if names[part] not in out:
            out.append(names[part])
    return tuple(out)


def run(args: argparse.Namespace) -> int:
    """Bench the jobs; print the table or JSON (partial on Ctrl-C, exit 130)."""
    if args.time_limit is not None and not args.time_limit > 0:
        raise InputError("<cli>", "--time-limit", f"must be positive, got {args.time_limit}")
    options = BenchOptions(parse_solvers(args.solvers), args.baselines, args.time_limit,
                           replicas=args.replicas, replica_workers=min(2, os.cpu_count() or 1),
                           workers=min(2, os.cpu_count() or 1))
    paths = suite_paths(args.jobs)
    rows: list[BenchRow] = []
    status = 0
    try:
        for i, path in enumerate(paths, 1):
            _progress(f"[{i}/{len(paths)}] {path.stem}")
            rows.append(bench_job(path, options))
    except KeyboardInterrupt:
        status = INTERRUPTED
    _progress("")
    if status:
        print(f"interrupted: {len(rows)} of {len(paths)} jobs finished", file=sys.stderr)
    _emit(rows, options, args, interrupted=bool(status))
    return status


def _progress(text: str) -> None:
    # Only on a terminal: logs and pipes get no carriage-return noise. Never on stdout.
    if sys.stderr.isatty():
        sys.stderr.write("\r\033[K" + text)
        sys.stderr.flush()


def _emit(rows: list[BenchRow], options: BenchOptions, args: argparse.Namespace,
          interrupted: bool) -> None:
    if args.json:
        payload: dict = {"rows": [row_json(r) for r in rows]}
        if interrupted:
            payload["interrupted"] = True
        emit_json(payload, args)
        return
    if any(r.replicas is not None for r in rows):  # a job asked for them: show the columns
        options = replace(options, replicas=True)
    print(render_table([text_row(r, options) for r in rows]))
    print("calls: parallelizer calls with rules 1-4 / without pruning (rules: none; "
          "counted without planning)")
    if options.baselines:
        print("oblivious, restricted, tangram: throughput relative to the oblivious baseline "
              "(Figure 7; 'infeas.' = no feasible plan)")


def text_row(row: BenchRow, options: BenchOptions) -> dict:
    """The readable table row of ``row``."""
    out = {"job": row.job, "GPUs": row.gpus, "isl": row.islands,
           "split": row.split or "infeasible", "n": _txt(row.n_micro),
           "tokens/s": _txt(row.tokens_per_s), "bubble": _pct(row.bubble_ratio),
           "plan s": row.plan_time_s,
           "calls": f"{_txt(row.calls)}/{_txt(row.calls_unpruned)}"}
    for s in row.solvers:
        out[s.solver] = solver_cell(s)
    if options.solvers and len(options.solvers) > 1:
        out["agree"] = _agree_cell(row)
    for b in row.baselines:
        out[b.name] = "infeas." if b.tokens_per_s is None else (
            "n/a" if b.relative is None else f"{b.relative:.2f}")
    if options.replicas:
        r = row.replicas
        out["R"] = "-" if r is None else r.count
        out["shares"] = "-" if r is None else "/".join(map(str, r.shares))
        out["tokens/s R"] = "-" if r is None else f"{r.tokens_per_s:,.0f}" + \
            ("" if r.optimal else " (limit)")
        out["R s"] = "-" if r is None else f"{r.time_s:.1f}"
    return out


def _agree_cell(row) -> str:
    """yes / not proven (a solver stopped at its limit, its value equal to the others', or one
    did not run) / NO."""
    if row.agree is None:
        return "-"
    if row.agree:
        return "yes"
    values = {round(s.objective_s, 6) for s in row.solvers if s.objective_s is not None}
    limited = any(s.status.value in ("limit", "unproven", "not run") for s in row.solvers)
    return "not proven" if limited and len(values) <= 1 else "NO"


def solver_cell(s: SolverRun) -> str:
    """``18.121 s opt (0.01 s)``; a solver its limit stopped shows what it proved (bound,
    gap), or that it proved none."""
    if s.not_run:
        return f"not run ({s.not_run})"
    if s.objective_s is None:
        return f"{s.status.value} ({s.time_s:.2f} s)"
    text = f"{s.objective_s:.6f} s"
    if s.status is SolverStatus.OPTIMAL:
        return f"{text} opt ({s.time_s:.2f} s)"
    if s.status is SolverStatus.UNPROVEN:
        return f"{text} unproven: ran past a time limit ({s.time_s:.2f} s)"
    proved = ", ".join(p for p in (f"bound {s.bound:.6f}" if s.bound is not None else "",
                                   f"gap {s.gap:.2%}" if s.gap is not None else "") if p)
    return f"{text} LIMIT {proved or 'no bound proven'} ({s.time_s:.2f} s)"


def _txt(v) -> str:
    if v is None:
        return "-"
    return f"{v:,.0f}" if isinstance(v, float) else str(v)


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v:.1%}"
