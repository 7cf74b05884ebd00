"""Pipeline composition as a CP-SAT model (OR-Tools), a cross-check of the exact DP.

The model is :mod:`formulations.assignment_common` on integer coefficients from
:mod:`formulations.scaling` (the stated rounding tolerance applies). The reported objective is
recomputed in floats from the decoded plan by :func:`~solver.compose.result.objective_of`; bound
and gap come from the solver (bound unscaled to seconds, on the rounded data).
"""

from __future__ import annotations

import math
from time import perf_counter
from types import MappingProxyType
from typing import Any, Sequence

from ortools.sat.python import cp_model

from formulations.assignment_common import build_model, decode
from formulations.scaling import scale_factor, to_seconds, to_units
from solver.compose.result import (
    CompositionResult,
    SolveStatus,
    infeasible_result,
    objective_of,
)
from solver.compose.table import LatencyTable, Restrictions

NUM_WORKERS = 2   # this project's CI machines have 2 cores
RANDOM_SEED = 12345  # fixed for reproducible search
_STATUS = MappingProxyType({cp_model.OPTIMAL: SolveStatus.OPTIMAL, cp_model.FEASIBLE: SolveStatus.FEASIBLE,
           cp_model.INFEASIBLE: SolveStatus.INFEASIBLE})


class _CpBackend:
    """The shared builder's view of a CpModel (integer units)."""

    def __init__(self, model: cp_model.CpModel, scale: float) -> None:
        self.model, self.scale = model, scale

    def new_bool(self, name: str) -> Any:
        return self.model.new_bool_var(name)

    def new_value(self, name: str, hi: float) -> Any:
        return self.model.new_int_var(0, int(hi), name)

    def coeff(self, seconds: float) -> int:
        return to_units(seconds, self.scale)

    def total(self, terms: Sequence[Any]) -> Any:
        return cp_model.LinearExpr.sum(list(terms))

    def add(self, constraint: Any, name: str) -> None:
        self.model.add(constraint).with_name(name)

    def add_max(self, target: Any, exprs: Sequence[Any], name: str) -> None:
        self.model.add_max_equality(target, list(exprs)).with_name(name)


def solve_cpsat(table: LatencyTable, restrictions: Restrictions | None = None,
                overlap: bool = False, time_limit_s: float = 10.0, *,
                work_limit: float | None = None) -> CompositionResult:
    """Optimal composition with CP-SAT (within ``scaling.objective_tolerance``).

    Parameters
    ----------
    table : LatencyTable
        The latency table.
    restrictions : Restrictions, optional
        Pruning rules, added as named constraints (balance, memory, interface).
    overlap : bool
        Overlapped objective (eq. 9).
    time_limit_s : float
        Wall-clock limit (``math.inf``: none); on expiry the best plan found is returned with
        status FEASIBLE.
    work_limit : float, optional
        A deterministic limit instead of the wall clock (:func:`_make_solver`): the same answer
        on any machine under any load.

    Returns
    -------
    CompositionResult
        ``solver="cpsat"``; ``optimal`` only when CP-SAT proved OPTIMAL.
    """
    t0 = perf_counter()
    model = cp_model.CpModel()
    scale = scale_factor(table)
    built = build_model(_CpBackend(model, scale), table, restrictions, overlap)
    if built is None:
        return infeasible_result("cpsat", perf_counter() - t0)
    model.minimize(built.objective)
    solver = _make_solver(time_limit_s, work_limit)
    code = solver.solve(model)
    status = _status(code, solver, time_limit_s, work_limit)
    elapsed = perf_counter() - t0
    if status not in (SolveStatus.OPTIMAL, SolveStatus.FEASIBLE):
        return CompositionResult((), None, "cpsat", False, status, elapsed)
    stages = decode(table, built, [solver.boolean_value(v) for v in built.s],
                    {key: solver.boolean_value(v) for key, v in built.z.items()})
    scaled, bound = solver.objective_value, solver.best_objective_bound
    gap = (scaled - bound) / scaled if scaled > 0 else 0.0
    objective = objective_of(table, stages, overlap)
    # The bound is for the rounded data: it may exceed the float objective by up to the
    # rounding tolerance, and a lower bound above the plan's own value is never useful.
    return CompositionResult(stages, objective, "cpsat", status is SolveStatus.OPTIMAL, status,
                             elapsed, min(to_seconds(bound, scale), objective), gap)


def _make_solver(time_limit_s: float, work_limit: float | None = None) -> cp_model.CpSolver:
    """A seeded CpSolver stopped by the wall clock (``time_limit_s``, none when infinite) or,
    with ``work_limit``, by CP-SAT's deterministic time (``max_deterministic_time``, a count of
    the work done) on one worker: a portfolio of workers races on the clock, one worker with a
    fixed seed repeats the same search, so the result does not depend on the machine's load."""
    solver = cp_model.CpSolver()
    solver.parameters.num_workers = NUM_WORKERS
    solver.parameters.random_seed = RANDOM_SEED
    if work_limit is not None:
        solver.parameters.num_workers = 1
        solver.parameters.max_deterministic_time = float(work_limit)
    elif math.isfinite(time_limit_s):
        solver.parameters.max_time_in_seconds = float(time_limit_s)
    return solver


def _status(code: Any, solver: cp_model.CpSolver, limit: float,
            work_limit: float | None = None) -> SolveStatus:
    """The status of a finished solve; no plan and no proof is TIME_LIMIT when the solve ran
    to its limit (deterministic time with ``work_limit``, else the wall clock)."""
    if code == cp_model.MODEL_INVALID:
        raise RuntimeError("CP-SAT rejected the composition model as invalid")  # a bug here
    if code in _STATUS:
        return _STATUS[code]
    if work_limit is not None:
        reached = solver.deterministic_time >= 0.95 * work_limit
    else:
        reached = solver.wall_time >= 0.95 * limit
    return SolveStatus.TIME_LIMIT if reached else SolveStatus.UNKNOWN
