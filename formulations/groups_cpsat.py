"""Node-group composition as a CP-SAT model (OR-Tools): a cross-check of the exact DP.

The model is :mod:`formulations.groups_common` on integer coefficients: every latency,
per-iteration time and link time ``v`` becomes ``round(v · s)`` with ``s = SCALE_TARGET /
v_max`` (:mod:`formulations.scaling`), so the CP-SAT plan is within ``W · v_max /
SCALE_TARGET`` of the optimum, ``W = (n − 1) + 2P`` the total weight of the entries in ``T``
(``P`` the depth bound). The reported objective is recomputed in floats from the decoded plan.
"""

from __future__ import annotations

import math
from time import perf_counter

import numpy as np
from ortools.sat.python import cp_model

from formulations.assignment_cpsat import _CpBackend, _make_solver, _status
from formulations.groups_common import build_model, decode, hint_values
from formulations.scaling import SCALE_TARGET, to_seconds
from solver.compose.result import SolveStatus
from solver.compose.stage_table import (GroupRestrictions, GroupResult, StageTable,
                                        group_objective)


def stage_table_max(table: StageTable) -> float:
    """Largest finite latency, per-iteration time or link rate of the table."""
    vals = [0.0]
    for o in table.options.values():
        finite = np.isfinite(o.latency)
        if finite.any():
            vals += [float(o.latency[finite].max()), float(o.iteration[finite].max())]
    vals.append(float(table.link_rate.max()))
    return max(vals)


def solve_groups_cpsat(table: StageTable, restrictions: GroupRestrictions | None = None,
                       overlap: bool = False, time_limit_s: float = 10.0,
                       upper: float = math.inf, hint=(), *,
                       work_limit: float | None = None) -> GroupResult:
    """Optimal node-group composition with CP-SAT (within the scaling tolerance).

    Parameters
    ----------
    time_limit_s, work_limit
        As for :func:`formulations.assignment_cpsat.solve_cpsat` (``work_limit``: a
        deterministic limit, the same answer under any load).
    upper : float
        Objective of a known plan: entries no plan better than it can use are left out (see
        :mod:`formulations.groups_common`); infeasible then means nothing beats ``upper``.
    hint : sequence of GroupStage
        A plan to start the search from (a hint: it changes no answer, only the time).

    Returns
    -------
    GroupResult
        ``solver="cpsat"``; ``optimal`` only when CP-SAT proved OPTIMAL.
    """
    t0 = perf_counter()
    model = cp_model.CpModel()
    top = stage_table_max(table)
    scale = SCALE_TARGET / top if top > 0 else 1.0
    built = build_model(_CpBackend(model, scale), table, restrictions, overlap, upper)
    if built is None:
        return GroupResult((), None, "cpsat", True, "infeasible", perf_counter() - t0)
    model.minimize(built.objective)
    if hint:
        for xs, vals in zip(built.x, hint_values(built, hint)):
            for v, on in zip(xs, vals):
                model.add_hint(v, on)
    solver = _make_solver(time_limit_s, work_limit)
    # Presolve spends seconds per round on this model's wide integer domains (measured: 17 s of
    # a 0.3 s solve on a 3-slot table) and finds nothing the search does not.
    solver.parameters.cp_model_presolve = False
    code = solver.solve(model)
    status = _status(code, solver, time_limit_s, work_limit)
    elapsed = perf_counter() - t0
    if status not in (SolveStatus.OPTIMAL, SolveStatus.FEASIBLE):
        return GroupResult((), None, "cpsat", status is SolveStatus.INFEASIBLE, status.value,
                           elapsed)
    stages = decode(table, built, [[bool(solver.boolean_value(v)) for v in xs] for xs in built.x])
    objective = group_objective(table, stages, overlap)[0]
    scaled, bound = solver.objective_value, solver.best_objective_bound
    gap = (scaled - bound) / scaled if scaled > 0 else 0.0
    return GroupResult(stages, objective, "cpsat", status is SolveStatus.OPTIMAL, status.value,
                       elapsed, min(to_seconds(bound, scale), objective), gap)
