"""``tangram compose TABLE.json [--solver dp|cpsat|milp|brute] [--time-limit S] [--json]``.

Optimal pipeline composition of a latency table (format: :mod:`solver.compose.table`). ``--json`` prints
the public contract ``{"objective", "stages": [{"island", "start", "end", "latency"}], "solver",
"optimal", "time_s", "tie_break"}`` with half-open ``[start, end)`` layer ranges; of several
optimal plans every solver prints the same (:mod:`solver.compose.ties`). A malformed table raises
InputError (exit 2); no feasible composition raises InfeasibleError (exit 3, ``no plan: ...``).
"""

from __future__ import annotations

import argparse
import enum

from solver.cli.report import emit_json, render_table
from solver.compose.dp import (
    TIE_CANONICAL,
    CompositionResult,
    SolveStatus,
    TooLargeError,
    canonical_result,
    compose_brute,
    compose_dp,
    explain_infeasible,
)
from solver.compose.table import LatencyTable, load_table
from solver.spec.errors import InfeasibleError, InputError


class SolverChoice(enum.Enum):
    """The ``--solver`` options."""

    DP = "dp"
    CPSAT = "cpsat"
    MILP = "milp"
    BRUTE = "brute"


def register(sub: argparse._SubParsersAction) -> None:
    """Add the ``compose`` subcommand."""
    p = sub.add_parser("compose", help="optimal pipeline composition of a latency table")
    p.add_argument("table", metavar="TABLE.json", help="latency table (see instances/tables)")
    p.add_argument("--solver", choices=[s.value for s in SolverChoice], default="dp",
                   help="exact DP (default), CP-SAT, MILP or brute force (tiny tables)")
    p.add_argument("--time-limit", type=float, default=10.0, metavar="S",
                   help="time limit for cpsat/milp in seconds (default 10)")
    p.add_argument("--milp-backend", choices=["cbc", "highs"], default="cbc",
                   help="MILP solver behind --solver milp (default cbc)")
    p.add_argument("--overlap", action="store_true",
                   help="transfers overlap the sending stage's compute (eq. 9)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=run)


def solve(table: LatencyTable, choice: SolverChoice, time_limit: float, milp_backend: str,
          overlap: bool) -> CompositionResult:
    """Run the chosen solver (solver modules are imported only when used)."""
    if choice is SolverChoice.DP:
        return compose_dp(table, overlap=overlap)
    if choice is SolverChoice.BRUTE:
        return compose_brute(table, overlap=overlap)
    if choice is SolverChoice.CPSAT:
        from formulations.assignment_cpsat import solve_cpsat
        result = solve_cpsat(table, overlap=overlap, time_limit_s=time_limit)
    else:
        from formulations.assignment_milp import MilpBackend, solve_milp
        result = solve_milp(table, overlap=overlap, time_limit_s=time_limit,
                            backend=MilpBackend(milp_backend))
    # Several optimal plans: the one every solver returns (solver.compose.ties).
    return canonical_result(table, None, overlap, result)


def run(args: argparse.Namespace) -> int:
    """Compose the table and print the plan."""
    if not args.time_limit > 0:
        raise InputError("<cli>", "--time-limit", f"must be > 0 seconds, got {args.time_limit}")
    table = load_table(args.table)
    try:
        result = solve(table, SolverChoice(args.solver), args.time_limit, args.milp_backend,
                       args.overlap)
    except TooLargeError as exc:
        raise InputError(args.table, "--solver", str(exc)) from None
    if not result.feasible:
        raise InfeasibleError(f"{args.table}: {_why(table, result, args.time_limit)}")
    if args.json:
        emit_json(result_json(result), args)
    else:
        print(_plain(args.table, table, result))
    return 0


def _why(table: LatencyTable, result: CompositionResult, time_limit: float) -> str:
    if result.status is SolveStatus.INFEASIBLE:
        return explain_infeasible(table)
    if result.status is SolveStatus.TIME_LIMIT:
        return f"time limit of {time_limit:g} s reached before any composition was found"
    return f"{result.solver} stopped without a composition ({result.status.value})"


def result_json(result: CompositionResult) -> dict:
    """The ``--json`` payload (public contract)."""
    return {"objective": result.objective,
            "stages": [{"island": s.island, "start": s.start, "end": s.end, "latency": s.latency}
                       for s in result.stages],
            "solver": result.solver, "optimal": result.optimal, "time_s": result.time_s,
            "tie_break": result.tie_break}


def _plain(path: str, table: LatencyTable, result: CompositionResult) -> str:
    rows = []
    for i, s in enumerate(result.stages):
        nxt = result.stages[i + 1].island if i + 1 < len(result.stages) else None
        rows.append({"stage": i, "island": s.island, "layers": f"[{s.start}, {s.end})",
                     "count": s.end - s.start, "position": s.position.value,
                     "latency_s": s.latency,
                     "link_s": table.link_time(s.island, nxt) if nxt else "-"})
    proof = "optimal" if result.optimal else f"not proven optimal ({result.status.value})"
    head = (f"{path}: {table.layers} layers, {table.n_micro} micro-batches, "
            f"{len(table.islands)} islands; solver {result.solver}, {proof}, {result.time_s:.3f} s")
    ties = "" if result.tie_break == TIE_CANONICAL or not result.optimal else \
        f"\nties: {result.tie_break}"
    return f"{head}\n{render_table(rows)}\nT = {result.objective:.6g} s per iteration{ties}"
