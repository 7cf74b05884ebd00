"""Dispatch a latency table to the chosen composition solver.

``formulations`` is imported inside the function: ``solver`` never imports it at module level.
"""

from __future__ import annotations

from solver.compose import compose_dp
from solver.compose_types import CompositionResult
from solver.specs import SolverKind
from solver.table import LatencyTable, Restrictions


def solve_table(table: LatencyTable, restrictions: Restrictions | None, kind: SolverKind,
                overlap: bool = False, time_limit_s: float = 30.0) -> CompositionResult:
    """Compose ``table`` with solver ``kind`` (same result type for every solver)."""
    if kind is SolverKind.DP:
        return compose_dp(table, restrictions, overlap)
    if kind is SolverKind.BRUTE:
        from solver.compose_brute import compose_brute
        return compose_brute(table, restrictions, overlap)
    if kind is SolverKind.CPSAT:
        from formulations.assignment_cpsat import solve_cpsat
        return solve_cpsat(table, restrictions, overlap, time_limit_s)
    from formulations.assignment_milp import solve_milp
    return solve_milp(table, restrictions, overlap, time_limit_s)
