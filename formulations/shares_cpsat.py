"""CP-SAT model of the batch shares of pipeline replicas: the cross-check of the exact DP
:func:`solver.planner.replica.replicas.best_shares`.

Decision: one share per replica from its table of planned shares; the shares sum to the global
batch. Objective: the slowest replica's iteration time (min-max). Times are scaled to integers
as in :mod:`formulations.scaling` (the largest finite time maps to ``SCALE_TARGET`` units), so
the proven optimum is within ``max_time / SCALE_TARGET`` of the true one; the decoded value is
recomputed from the unscaled times.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from ortools.sat.python import cp_model

from formulations.scaling import SCALE_TARGET


@dataclass(frozen=True)
class SharesSolution:
    """Result of the share model (the DP returns ``(value, shares)`` of the same meaning).

    Attributes
    ----------
    value : float
        The slowest replica's time at ``shares`` (unscaled).
    shares : tuple[int, ...]
        One share per replica.
    optimal : bool
        CP-SAT proved the scaled model optimal.
    """

    value: float
    shares: tuple[int, ...]
    optimal: bool


def solve_shares(times: Sequence[dict[int, float]], batch: int,
                 time_limit_s: float = 10.0, *,
                 work_limit: float | None = None) -> SharesSolution | None:
    """The min-max shares of ``times`` summing to ``batch``; None when none exist.
    ``work_limit``: CP-SAT's deterministic time instead of the wall clock (on its one worker,
    the same answer under any load)."""
    finite = [t for table in times for t in table.values() if math.isfinite(t)]
    if not finite:
        return None
    scale = SCALE_TARGET / max(max(finite), 1e-300)
    model = cp_model.CpModel()
    pick = {(r, b): model.new_bool_var(f"pick_{r}_{b}")
            for r, table in enumerate(times) for b, t in table.items() if math.isfinite(t)}
    worst = model.new_int_var(0, SCALE_TARGET + 1, "worst")
    for r in range(len(times)):
        # Each replica trains exactly one of its planned shares.
        model.add_exactly_one(v for (q, _), v in pick.items() if q == r)
    # The shares cover the global batch exactly.
    model.add(sum(b * v for (_, b), v in pick.items()) == batch)
    for (r, b), v in pick.items():
        # The iteration waits for the slowest replica.
        model.add(worst >= round(times[r][b] * scale)).only_enforce_if(v)
    model.minimize(worst)
    solver = cp_model.CpSolver()
    solver.parameters.num_workers = 1
    if work_limit is not None:
        solver.parameters.max_deterministic_time = work_limit
    elif math.isfinite(time_limit_s):
        solver.parameters.max_time_in_seconds = time_limit_s
    status = solver.solve(model)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return None
    shares = tuple(next(b for (q, b), v in pick.items() if q == r and solver.value(v))
                   for r in range(len(times)))
    value = max(times[r][b] for r, b in enumerate(shares))
    return SharesSolution(value, shares, status == cp_model.OPTIMAL)
