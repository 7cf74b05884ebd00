"""CP-SAT model of island merging (phase 2 of Algorithm 1), solved exactly.

Decision: partition the phase-1 components into islands. A component is never split (its nodes
are pairwise similar). An island made of two or more components must satisfy the same merge rule
as the greedy pass: running it at its weakest member loses at most ``t_merge`` of its compute and
of its HBM capacity. Objective, lexicographic: fewest islands, then least compute lost.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from ortools.sat.python import cp_model

from formulations.scaling import UNITS_PER_TFLOP, to_units
from solver.islands import Thresholds, partition_loss, same_vendor
from solver.spec.domain import Island, Node


@dataclass(frozen=True)
class MergeSolution:
    """Result of the exact merge.

    Attributes
    ----------
    groups : tuple[tuple[str, ...], ...]
        Phase-1 component names per island.
    islands : int
        Number of islands.
    loss : float
        Cluster-wide fraction of compute lost (``solver.islands.partition_loss``).
    optimal : bool
        Both lexicographic stages proved optimal.
    time_s : float
        Wall time.
    """

    groups: tuple[tuple[str, ...], ...]
    islands: int
    loss: float
    optimal: bool
    time_s: float


class _MergeModel:
    """The model's variables; built once per stage, never returned to callers."""

    def __init__(self, comps: tuple[Island, ...], th: Thresholds) -> None:
        self.comps = comps
        self.model = cp_model.CpModel()
        n = len(comps)
        self.c = [to_units(min(x.tflops for x in c.nodes), UNITS_PER_TFLOP) for c in comps]
        self.m = [to_units(c.hbm_gb, UNITS_PER_TFLOP) for c in comps]
        self.total_c = [sum(to_units(x.tflops, UNITS_PER_TFLOP) * x.gpus for x in c.nodes) for c in comps]
        self.total_m = [sum(to_units(x.gpu.hbm_gb, UNITS_PER_TFLOP) * x.gpus for x in c.nodes)
                        for c in comps]
        # x[i][g]: component i joins island g; island g is "opened" by its smallest member g.
        self.x = {(i, g): self.model.new_bool_var(f"x_{i}_{g}") for i in range(n) for g in range(i + 1)}
        self.floor = [self.model.new_int_var(0, max(self.c), f"floor_{g}") for g in range(n)]
        self.z = {(i, g): self.model.new_int_var(0, max(self.c), f"z_{i}_{g}") for (i, g) in self.x}
        self.add_each_component_once()
        self.add_opened_islands()
        self.add_weakest_member_floor()
        self.add_merge_loss_limit(th)

    def add_each_component_once(self) -> None:
        # Every component belongs to exactly one island.
        for i in range(len(self.comps)):
            self.model.add_exactly_one(self.x[i, g] for g in range(i + 1))

    def add_opened_islands(self) -> None:
        # A component may join island g only if component g opened it (symmetry breaking).
        for (i, g), var in self.x.items():
            if i != g:
                self.model.add_implication(var, self.x[g, g])
                if not same_vendor(self.comps[i].nodes + self.comps[g].nodes):
                    self.model.add(var == 0)  # two vendors never share an island (mesh)

    def add_weakest_member_floor(self) -> None:
        # The island's effective compute is at most every member's compute; z is that floor
        # counted for member i only when i is in the island.
        big = max(self.c)
        for (i, g), var in self.x.items():
            self.model.add(self.floor[g] <= self.c[i]).only_enforce_if(var)
            self.model.add(self.z[i, g] <= self.floor[g])
            self.model.add(self.z[i, g] <= big * var)

    def add_merge_loss_limit(self, th: Thresholds) -> None:
        # An island joining two or more components keeps ≥ (1 − t_merge) of its compute and of
        # its HBM capacity when run at its weakest member (the greedy pass's merge rule).
        keep = round((1 - th.t_merge) * 10_000)
        n = len(self.comps)
        for g in range(n):
            members = [i for i in range(g, n) if (i, g) in self.x]
            merged = self.model.new_bool_var(f"merged_{g}")
            self.model.add(sum(self.x[i, g] for i in members) <= 1 + n * merged)
            kept = sum(self.comps[i].gpus * self.z[i, g] for i in members)
            full = sum(self.total_c[i] * self.x[i, g] for i in members)
            self.model.add(10_000 * kept >= keep * full).only_enforce_if(merged)
            count = sum(self.comps[i].gpus * self.x[i, g] for i in members)
            hbm = sum(self.total_m[i] * self.x[i, g] for i in members)
            for j in members:
                # The smallest member HBM is one of the present members' values.
                self.model.add(10_000 * self.m[j] * count >= keep * hbm).only_enforce_if(
                    [merged, self.x[j, g]])

    def island_count(self):
        return sum(self.x[g, g] for g in range(len(self.comps)))

    def kept_compute(self):
        return sum(self.comps[i].gpus * self.z[i, g] for (i, g) in self.x)


def _solve(model: cp_model.CpModel, time_limit_s: float,
           work_limit: float | None = None) -> tuple[cp_model.CpSolver, int]:
    """Two seeded workers on the wall clock or, with ``work_limit``, one worker on CP-SAT's
    deterministic time (the same search under any load)."""
    solver = cp_model.CpSolver()
    solver.parameters.num_workers = 2
    solver.parameters.random_seed = 0
    if work_limit is not None:
        solver.parameters.num_workers = 1
        solver.parameters.max_deterministic_time = work_limit
    elif math.isfinite(time_limit_s):
        solver.parameters.max_time_in_seconds = time_limit_s
    return solver, solver.solve(model)


def solve_island_merge(components: tuple[Island, ...], th: Thresholds,
                       time_limit_s: float = 10.0, *,
                       work_limit: float | None = None) -> MergeSolution:
    """Exact phase 2: fewest islands, then least compute lost (two CP-SAT solves, each with
    half of ``time_limit_s``, or of ``work_limit`` deterministic seconds instead of the wall
    clock: the same answer on any machine under any load)."""
    start = time.perf_counter()
    half = None if work_limit is None else work_limit / 2
    first = _MergeModel(components, th)
    first.model.minimize(first.island_count())
    solver, status1 = _solve(first.model, time_limit_s / 2, half)
    count = round(solver.objective_value)
    second = _MergeModel(components, th)
    second.model.add(second.island_count() <= count)
    second.model.maximize(second.kept_compute())
    solver, status2 = _solve(second.model, time_limit_s / 2, half)
    groups = _decode(second, solver)
    nodes: list[tuple[Node, ...]] = [
        tuple(n for name in grp for c in components if c.name == name for n in c.nodes)
        for grp in groups]
    optimal = status1 == cp_model.OPTIMAL and status2 == cp_model.OPTIMAL
    return MergeSolution(groups, len(groups), partition_loss(nodes), optimal,
                         time.perf_counter() - start)


def _decode(m: _MergeModel, solver: cp_model.CpSolver) -> tuple[tuple[str, ...], ...]:
    groups: dict[int, list[str]] = {}
    for (i, g), var in m.x.items():
        if solver.value(var):
            groups.setdefault(g, []).append(m.comps[i].name)
    return tuple(tuple(sorted(v)) for _, v in sorted(groups.items()))
