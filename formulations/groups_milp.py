"""Node-group composition as a MILP (PuLP with CBC or HiGHS): a cross-check of the exact DP.

The model is :mod:`formulations.groups_common` in float seconds. The reported objective is
recomputed from the decoded plan.
"""

from __future__ import annotations

import math
from time import perf_counter

import pulp

from formulations.assignment_milp import (MilpBackend, _make_solver, _PulpBackend, _quiet_stdout,
                                          _status)
from formulations.groups_common import build_model, decode, hint_values
from solver.compose.result import SolveStatus
from solver.compose.stage_table import (GroupRestrictions, GroupResult, StageTable,
                                        group_objective)


def solve_groups_milp(table: StageTable, restrictions: GroupRestrictions | None = None,
                      overlap: bool = False, time_limit_s: float = 10.0,
                      upper: float = math.inf, hint=(),
                      backend: MilpBackend = MilpBackend.CBC, *,
                      node_limit: int | None = None) -> GroupResult:
    """Optimal node-group composition with a MILP solver.

    Parameters
    ----------
    upper, hint
        As for :func:`formulations.groups_cpsat.solve_groups_cpsat` (the hint is a warm start).
    backend : MilpBackend
        CBC or HiGHS.
    time_limit_s, node_limit
        As for :func:`formulations.assignment_milp.solve_milp` (``node_limit``: a
        deterministic limit, the same answer under any load).

    Returns
    -------
    GroupResult
        ``solver="milp-cbc"`` or ``"milp-highs"``.
    """
    t0 = perf_counter()
    label = f"milp-{backend.value}"
    prob = pulp.LpProblem("node_groups", pulp.LpMinimize)
    built = build_model(_PulpBackend(prob), table, restrictions, overlap, upper)
    if built is None:
        return GroupResult((), None, label, True, "infeasible", perf_counter() - t0)
    prob.setObjective(built.objective)
    solver = _make_solver(backend, time_limit_s, node_limit)
    if hint:
        for xs, vals in zip(built.x, hint_values(built, hint)):
            for v, on in zip(xs, vals):
                v.setInitialValue(on)
        solver.optionsDict["warmStart"] = True
    with _quiet_stdout():
        prob.solve(solver)
        if backend is MilpBackend.HIGHS and prob.status == pulp.LpStatusInfeasible:
            # HiGHS 1.16's presolve calls some of these models infeasible that are not (hunt
            # seed 192, docs/hunt.md: without presolve it finds the optimum): confirm the
            # verdict without it.
            prob.solve(_make_solver(backend, time_limit_s, node_limit, presolve=False))
    elapsed = perf_counter() - t0
    status = _status(prob, elapsed, time_limit_s, node_limit)
    if status not in (SolveStatus.OPTIMAL, SolveStatus.FEASIBLE):
        return GroupResult((), None, label, status is SolveStatus.INFEASIBLE, status.value,
                           elapsed)
    stages = decode(table, built, [[(v.value() or 0.0) > 0.5 for v in xs] for xs in built.x])
    objective = group_objective(table, stages, overlap)[0]
    bound = objective if status is SolveStatus.OPTIMAL else None
    if backend is MilpBackend.HIGHS and getattr(prob, "solverModel", None) is not None:
        bound = min(float(prob.solverModel.getInfo().mip_dual_bound), objective)
    gap = None if bound is None else ((objective - bound) / objective if objective > 0 else 0.0)
    return GroupResult(stages, objective, label, status is SolveStatus.OPTIMAL, status.value,
                       elapsed, bound, gap)
