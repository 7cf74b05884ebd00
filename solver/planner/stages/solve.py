"""Dispatch a latency table or a stage table to the chosen composition solver.

``formulations`` is imported inside the function: ``solver`` never imports it at module level.
A CP-SAT or MILP solve that stops at its time limit keeps its bound, but the plan returned is
the exact DP's (marked not proven, with the solver's bound and the gap to the DP's objective), so
a time limit never costs plan quality. A proven optimum of a latency table gets the plan of the
tie rule (:mod:`solver.compose.ties`), one of a stage table the DP's: every solver returns the
same plan.
"""

from __future__ import annotations

from dataclasses import replace

from solver.compose.dp import canonical_result, compose_dp
from solver.compose.groups.group_brute import compose_groups_brute
from solver.compose.groups.group_dp import Live, compose_groups_dp
from solver.compose.result import CompositionResult, SolveStatus, TooLargeError
from solver.compose.stage_table import GroupRestrictions, GroupResult, StageTable
from solver.compose.table import LatencyTable, Restrictions
from solver.spec.domain import SolverKind
from solver.spec.errors import SolverTooLarge


def solve_table(table: LatencyTable, restrictions: Restrictions | None, kind: SolverKind,
                overlap: bool = False, time_limit_s: float = 30.0) -> CompositionResult:
    """Compose ``table`` with solver ``kind`` (same result type for every solver).

    Raises
    ------
    SolverTooLarge
        The instance exceeds what the chosen solver is built for (its message says the limit).
    """
    try:
        result = _solve(table, restrictions, kind, overlap, time_limit_s)
    except TooLargeError as exc:
        raise SolverTooLarge(kind.value, str(exc)) from None
    if kind in (SolverKind.DP, SolverKind.BRUTE) or result.status is SolveStatus.INFEASIBLE:
        return result
    if result.optimal:  # of several optimal plans, the one every solver returns
        return canonical_result(table, restrictions, overlap, result)
    return with_limit(compose_dp(table, restrictions, overlap), result)


def with_limit(dp, result):
    """The DP's plan reported as ``result``'s (a solve stopped at its limit): its solver, status,
    time, bound and the gap of that bound to the DP's objective; never proven."""
    gap = None
    if result.bound is not None and dp.objective:
        gap = max(0.0, (dp.objective - result.bound) / dp.objective)
    return replace(dp, solver=result.solver, optimal=False, status=result.status,
                   time_s=result.time_s + dp.time_s, bound=result.bound, gap=gap)


def _solve(table: LatencyTable, restrictions: Restrictions | None, kind: SolverKind,
           overlap: bool, time_limit_s: float) -> CompositionResult:
    if kind is SolverKind.DP:
        return compose_dp(table, restrictions, overlap)
    if kind is SolverKind.BRUTE:
        from solver.compose.brute import compose_brute
        return compose_brute(table, restrictions, overlap)
    if kind is SolverKind.CPSAT:
        from formulations.assignment_cpsat import solve_cpsat
        return solve_cpsat(table, restrictions, overlap, time_limit_s)
    from formulations.assignment_milp import solve_milp
    return solve_milp(table, restrictions, overlap, time_limit_s)


def solve_stage_table(table: StageTable, restrictions: GroupRestrictions | None,
                      kind: SolverKind, overlap: bool = False, time_limit_s: float = 30.0,
                      incumbent: float = float("inf"), live: Live | None = None) -> GroupResult:
    """Compose a node-group stage table with solver ``kind`` (same result type for all).

    CP-SAT and MILP are given the DP's objective as an upper bound (entries no better plan can
    use are left out of their models, :mod:`formulations.groups_common`) and its plan as a
    starting point: they then search every plan that could beat the DP, so a proof of
    optimality from them is an independent proof of the DP's, and
    one that stops at its time limit keeps its bound and gap while the plan returned is the
    DP's (marked not proven). A proof of the DP's optimum returns the DP's plan: of several
    optimal plans every solver gives the same, the one the DP's tie rule picks. ``incumbent``
    lets the DP dismiss a table that cannot beat a plan the caller has (status ``dominated``);
    ``live`` is that incumbent as it stands while the DP runs (a plan another process finds).

    Raises
    ------
    SolverTooLarge
        The instance exceeds what the chosen solver is built for.
    """
    try:
        dp = compose_groups_dp(table, restrictions, overlap, incumbent, live)
        if kind is SolverKind.DP or dp.status == "dominated":
            return dp
        if kind is SolverKind.BRUTE:
            return compose_groups_brute(table, restrictions, overlap)
        upper = dp.objective * (1 + 1e-9) if dp.objective is not None else float("inf")
        result = _solve_model(table, restrictions, kind, overlap, time_limit_s, upper, dp.stages)
    except TooLargeError as exc:
        raise SolverTooLarge(kind.value, str(exc)) from None
    if result.optimal and result.feasible and dp.feasible and \
            abs(result.objective - dp.objective) <= 1e-9 * dp.objective:
        # Equal optima: the DP's plan, so every solver returns the same one (its tie rule).
        return replace(result, stages=dp.stages, objective=dp.objective)
    if result.optimal and (result.feasible or not dp.feasible):
        return result
    return with_limit(dp, result)


def _solve_model(table: StageTable, restrictions: GroupRestrictions | None, kind: SolverKind,
                 overlap: bool, time_limit_s: float, upper: float, hint) -> GroupResult:
    if kind is SolverKind.CPSAT:
        from formulations.groups_cpsat import solve_groups_cpsat
        return solve_groups_cpsat(table, restrictions, overlap, time_limit_s, upper, hint)
    from formulations.groups_milp import solve_groups_milp
    return solve_groups_milp(table, restrictions, overlap, time_limit_s, upper, hint)
