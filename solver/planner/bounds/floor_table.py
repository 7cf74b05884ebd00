"""The floor stage table: proving an ``(n_micro, view)`` cannot beat a bar before pricing it.

Pricing a stage table (every slice length on every group size and position through the
parallelizer) is most of what a search costs, and a replica asked to beat its budget
(:func:`~solver.planner.stages.search.plan_job` with ``upper``) usually finds nothing.
The floor table has the real table's structure — the same islands, group sizes, slice lengths
the rules allow, links, banned boundaries and depth limits — and one option per entry, priced
from floors instead of the parallelizer:

* latency: the larger of the kernel floor ``(d · c_g + [the stage holds the LM head] · h_g) / n``
  (:func:`~solver.planner.bounds.floors.kernel_floor`, ``c_g`` and ``h_g`` the layer's and the head's
  floors per iteration, the GEMMs at the least time any of the group's layouts at the run's
  micro-batch gives them) and, where the parallelizer is priced by the cost model
  (:func:`~solver.cost.parallelizer.stage_calibration`), ``d · a + [head] · a_h + [embedding]
  · a_e``, the least latencies of a layer, the head and the embedding over the group's layouts
  (:func:`~solver.cost.least_costs.least_latencies`: every other term of a stage is
  non-negative and recomputation only adds);
* per-iteration time: the least exposed gradient sync and optimizer step over the group's
  layouts and ZeRO stages with the longest backward window any recomputation gives
  (:func:`~solver.cost.least_costs.least_iterations`), rounded down (0 where the
  parallelizer is not priced by the cost model);
* unlimited micro-batches in flight (every real option holds at most what fits).

Every option the parallelizer prices for an entry takes at least as long and at least as much
per iteration (``tests/planner/test_floor_table.py`` checks this premise on the cost model).
The floors of a group depend on the micro-batch, not on ``n_micro``: a parallelizer that
remembers (the replica search's memo) keeps them across shares and ``n_micro``.

The composition objective ``T = (n − 1)·max(τ, c) + Σ τ + Σ c + max v`` is monotone in every
``τ`` and ``v``, and every plan of the real table is a plan of the floor table (capacities are
only relaxed, links are the same), so the floor table's optimum is at most the real one. When
the exact group DP proves that nothing in the floor table beats the bar, nothing in the real
table does: the cut is provably safe.

Most tables that cannot beat the bar are settled before the table is even built: a relaxed
floor table (every group size the run admits, every slice length, a layer's floor times the
length and nothing else: :func:`_least_stages`) goes through the bounds the group DP cuts with
before its first pass (:class:`~solver.compose.groups.group_bounds.LeastStages`: the bottleneck's capacity
floor raised by the cover bound). Every plan of the floor table is a plan of the relaxed one,
no faster, so this cut is provably safe too. The relaxed table and the bounds computed on it
depend on the micro-batch alone and are remembered with the floors (``fleet-700``: 576 of the
722 tables the floor table settles, at a sixth of the cost).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from solver.compose.groups.group_bounds import (IterationLevels, LeastStages, least_stages,
                                         might_beat_with_iterations)
from solver.compose.groups.group_dp import beats
from solver.compose.result import TooLargeError
from solver.compose.stage_table import (UNLIMITED, GroupRestrictions, IslandSlots, Options,
                                        StageTable)
from solver.compose.table import Position
from solver.cost.configs import _layouts
from solver.cost.parallelizer import kernel_calibration, stage_calibration
from solver.cost.runtime.frameworks import a2a_overlap_problem, profile
from solver.cost.stage import ConfigArrays, ModelSlice
from solver.cost.least_costs import least_iterations, least_latencies
from solver.planner.stages.candidates import TableSpec
from solver.planner.bounds.floors import kernel_floor
from solver.planner.stages.runs import PlanningRun
from solver.spec.domain import Island, Recompute

__all__ = ["GroupFloors", "gemm_shapes", "floor_table", "relaxed_cuts", "floor_cuts"]

ROUNDING = 1e-9  # relative margin below the cost model's own sums
ITERATION_STEP = 1.1  # per-iteration floors are rounded down to its powers


@dataclass(frozen=True)
class GroupFloors:
    """What no stage on one group is faster than, per micro-batch (:func:`_group_floors`).

    Attributes
    ----------
    kernels : tuple[float, float]
        Seconds of a layer and of the LM head at the kernel floor
        (:func:`~solver.planner.bounds.floors.kernel_floor`).
    least : tuple[float, float, float] | None
        The cost model's least latency of a layer, the head and the embedding over the group's
        layouts (:func:`~solver.cost.least_costs.least_latencies`); None where the parallelizer
        is not priced by the cost model.
    """

    kernels: tuple[float, float]
    least: tuple[float, float, float] | None = None

    @property
    def layer(self) -> float:
        """A layer's latency floor at any position (the head and embedding terms only add)."""
        return self.kernels[0] if self.least is None else max(self.kernels[0], self.least[0])

    def entry(self, position: Position, lengths: list[int],
              free: tuple[np.ndarray, np.ndarray], iterations: np.ndarray | None) -> Options:
        """One option per allowed length at the largest latency floor and, by length, the
        per-iteration floor ``iterations`` (None: none); ``free``: the shared (read-only)
        columns of no per-iteration time and no memory limit."""
        first = position in (Position.FIRST, Position.ONLY)
        last = position in (Position.LAST, Position.ONLY)
        floors = [(self.kernels[0], self.kernels[1] * last)]
        if self.least is not None:
            floors.append((self.least[0], self.least[1] * last + self.least[2] * first))
        lat = np.full_like(free[0], np.inf)
        d = np.asarray(lengths)
        lat[d, 0] = np.max([d * a + b for a, b in floors], axis=0)
        if iterations is None:
            return Options(lat, free[0], free[1])
        it = np.zeros_like(free[0])
        it[d, 0] = iterations[d]
        return Options(lat, it, free[1])


def _step_down(values: np.ndarray) -> np.ndarray:
    """``values`` rounded down to powers of :data:`ITERATION_STEP` (0 stays 0), less the
    rounding margin: few distinct per-iteration times keep the group DP's sweep over them
    short."""
    with np.errstate(divide="ignore"):
        k = np.floor(np.log(values) / math.log(ITERATION_STEP))
    return np.where(values > 0, ITERATION_STEP ** k, 0.0) * (1 - ROUNDING)


def _group_floors(run: PlanningRun, group: Island, nodes: int) -> GroupFloors:
    """The latency floors of stages on ``group`` at the run's micro-batch. They depend on the
    micro-batch, not on ``n_micro``: a parallelizer that remembers (the replica search's
    memo) keeps them for every share and ``n_micro`` of that micro-batch."""
    return _remembered(run, group, "floors", lambda: _price_group_floors(run, group, nodes))


def _group_iterations(run: PlanningRun, group: Island) -> dict[Position, np.ndarray] | None:
    """Per position, by slice length, the least per-iteration seconds of a stage on ``group``
    (:func:`~solver.cost.least_costs.least_iterations`) rounded down to a power of
    :data:`ITERATION_STEP`; None where the parallelizer is not priced by the cost model.
    Remembered as :func:`_group_floors`."""
    calib = stage_calibration(run.cache.parallelizer)
    if calib is None:
        return None
    ctx, model = run.cache.context, run.job.model

    def price() -> dict[Position, np.ndarray]:
        cfg = _layout_configs(run, _group_layouts(run, group))
        lengths = np.arange(1, model.layers + 1)
        first = np.repeat([p in (Position.FIRST, Position.ONLY) for p in Position], lengths.size)
        last = np.repeat([p in (Position.LAST, Position.ONLY) for p in Position], lengths.size)
        every = least_iterations(model, group, ctx.seq_len, cfg, np.tile(lengths, len(Position)),
                                 first, last, calib, ctx.runtime).reshape(len(Position), -1)
        return {pos: _step_down(np.concatenate([[0.0], row])) for pos, row in zip(Position, every)}
    return _remembered(run, group, "iterations", price)


def _remembered(run: PlanningRun, group: Island, what: str, price):
    """``price()``, remembered by the run's parallelizer when it can (keyed by the group and
    the context without ``n_micro``)."""
    remember = getattr(run.cache.parallelizer, "remember", None)
    if remember is None:
        return price()
    return remember((what, replace(run.cache.context, n_micro=0), run.features), group, price)


def _price_group_floors(run: PlanningRun, group: Island, nodes: int) -> GroupFloors:
    """:func:`_group_floors`, computed."""
    ctx, n, job = run.cache.context, run.n_micro, run.job
    layouts = _group_layouts(run, group)
    layer, head = kernel_floor(job, group, nodes, kernel_calibration(run.cache.parallelizer),
                               gemm_shapes(run, layouts))
    calib = stage_calibration(run.cache.parallelizer)
    if calib is None:
        return GroupFloors((layer / n, head / n))
    least = least_latencies(job.model, group, ctx.seq_len, _layout_configs(run, layouts), calib,
                            ctx.runtime)
    # The stage sums the same terms in another order: a margin far above rounding keeps the
    # floor below every option.
    return GroupFloors((layer / n, head / n), tuple(x * (1 - ROUNDING) for x in least))


def _group_layouts(run: PlanningRun, group: Island) -> np.ndarray:
    """``(tp, cp, pp, dp, ep, expert_tp)`` rows of every layout a stage on ``group`` may use at the run's
    micro-batch: every layout the parallelizer enumerates there (stages never pipeline inside,
    and the framework's and the user's limits only remove layouts)."""
    return np.array(_layouts(ModelSlice(run.job.model, 1), group, run.cache.context,
                             run.features), dtype=np.int64).reshape(-1, 6)


def _layout_configs(run: PlanningRun, layouts: np.ndarray) -> ConfigArrays:
    """The ``layouts`` (:func:`_group_layouts`) at every ZeRO stage the run's features name
    (and 0; more stages only lower the floors), without recomputation or offload, with the MoE
    all-to-all overlap wherever the runtime could run it (it only shortens a micro-batch)."""
    stages = np.asarray(sorted(set(run.features.zero) | {0}), dtype=np.int64)
    rows = np.repeat(layouts, stages.size, axis=0)
    tp, cp, _, dp, ep, etp = rows.T
    nothing = np.zeros_like(tp)
    framework = run.cache.context.framework
    moe = run.job.model.is_moe and run.features.ep and framework is not None
    a2a = np.array([moe and a2a_overlap_problem(profile(framework), True, int(e),
                                                Recompute.NONE, False) is None for e in ep],
                   dtype=bool)
    return ConfigArrays(tp=tp, cp=cp, ep=ep, pp=np.ones_like(tp), dp=dp, expert_tp=etp,
                        zero=np.where(dp * cp > 1, np.tile(stages, len(layouts)), 0),
                        recompute=nothing, offload=nothing.astype(bool),
                        micro_batch=run.cache.context.micro_batch // np.maximum(dp, 1),
                        a2a_overlap=a2a)


def gemm_shapes(run: PlanningRun, layouts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """GEMM rows (a rank's tokens per micro-batch, ``b s / cp``) and tensor-parallel degree
    of each of ``layouts`` (:func:`_group_layouts`)."""
    ctx = run.cache.context
    tp, cp, dp = (layouts[:, i].astype(float) for i in (0, 1, 3))
    return (ctx.micro_batch // dp) * ctx.seq_len / cp, tp


def floor_table(run: PlanningRun, spec: TableSpec, rate: np.ndarray,
                iterations: bool = False) -> StageTable | None:
    """The floor stage table of ``run`` under ``spec`` (None: no entry is allowed).

    ``rate``: the link rates between the run's islands, in their order
    (:func:`~solver.planner.stages.search.link_rates`); ``iterations``: with the per-iteration
    floors (:func:`_group_iterations`; else none)."""
    layers, n = run.job.model.layers, run.n_micro
    slots: list[IslandSlots] = []
    options: dict[tuple[int, int, Position], Options] = {}
    kept: list[int] = []
    free = (np.zeros((layers + 1, 1)), np.full((layers + 1, 1), UNLIMITED, dtype=np.int64))
    for index, island in enumerate(run.islands.islands):
        name = island.name
        sizes = spec.groups[name] if spec.groups is not None else \
            run.cache.sizes(name, run.features)
        used = []
        for g in sizes:
            group = run.cache.group(name, g)
            floors = _group_floors(run, group, g)
            per_iteration = _group_iterations(run, group) if iterations else None
            for pos in Position:
                lengths = spec.lengths(name, g, pos, layers)
                if lengths:
                    options[(len(slots), g, pos)] = floors.entry(
                        pos, lengths, free, None if per_iteration is None else per_iteration[pos])
                    used.append(g)
        if used:
            full = run.cache.islands[name]
            slots.append(IslandSlots(name, len(full.nodes), full.gpus_per_node,
                                     tuple(sorted(set(used)))))
            kept.append(index)
    if not slots:
        return None
    return StageTable(layers, n, tuple(slots), options, rate[np.ix_(kept, kept)])


def _least_stages(run: PlanningRun, spec: TableSpec | None) -> LeastStages | None:
    """The relaxed floor table of :func:`relaxed_cuts` (None: no island admits a group):
    ``tmin[k, g, d] = d · a_{k,g}``, ``a`` a layer's latency floor on group ``g`` of island
    ``k`` (:attr:`GroupFloors.layer`), every length, with the groups in node granules. It
    depends on the micro-batch, not on ``n_micro`` or the bar, so a parallelizer that
    remembers keeps it, with the bounds computed on it, for every share and ``n_micro``."""
    sizes = _group_sizes(run, spec)
    if not sizes:
        return None
    remember = getattr(run.cache.parallelizer, "remember", None)
    if remember is None:
        return _price_least_stages(run, sizes)
    key = ("least stages", replace(run.cache.context, n_micro=0), run.features,
           _sizes_key(run, sizes))
    return remember(key, run.islands.islands[0], lambda: _price_least_stages(run, sizes))


def _group_sizes(run: PlanningRun, spec: TableSpec | None) -> dict[str, tuple[int, ...]]:
    """Each island's group sizes under ``spec`` (None: the run's own), islands without any
    left out: the islands of the relaxed table, in its order."""
    sizes = {i.name: spec.groups[i.name] if spec is not None and spec.groups is not None else
             run.cache.sizes(i.name, run.features) for i in run.islands.islands}
    return {name: got for name, got in sizes.items() if got}


def _sizes_key(run: PlanningRun, sizes: dict[str, tuple[int, ...]]) -> tuple:
    """What the relaxed table depends on besides the micro-batch: islands, nodes, groups
    (``sizes``: :func:`_group_sizes`)."""
    return tuple((name, len(run.cache.islands[name].nodes), got) for name, got in sizes.items())


def _price_least_stages(run: PlanningRun, sizes: dict[str, tuple[int, ...]]) -> LeastStages:
    """:func:`_least_stages`, computed (``sizes``: each island's group sizes, none empty)."""
    rows = []
    for name, got in sizes.items():
        per_layer = [_group_floors(run, run.cache.group(name, g), g).layer for g in got]
        unit = math.gcd(*got)
        rows.append((len(run.cache.islands[name].nodes) // unit, [g // unit for g in got],
                     per_layer))
    wide = max(len(r[1]) for r in rows)
    per_layer, gu = np.full((len(rows), wide), np.inf), np.zeros((len(rows), wide), np.int64)
    for k, (_, got, a) in enumerate(rows):
        per_layer[k, :len(a)], gu[k, :len(got)] = a, got
    return least_stages(per_layer, gu, np.array([len(r[1]) for r in rows], dtype=np.int64),
                        np.array([r[0] for r in rows], dtype=np.int64), run.job.model.layers)


def relaxed_cuts(run: PlanningRun, bar: float, spec: TableSpec | None = None) -> bool:
    """Whether the relaxed floor table (:func:`_least_stages`: no length rules, no head or
    embedding terms, no links, every group size) has no plan under ``bar``, by the group DP's
    bounds before any pass (:meth:`~solver.compose.groups.group_bounds.LeastStages.might_beat`), with
    the per-iteration floors or without (:func:`_iterations_cut`). Provably safe: every plan of
    the floor table is one of it, no faster. It settles most tables that cannot beat the bar
    without building them; ``spec`` None: the run's own group sizes (a search asks before it
    builds its spec, :func:`~solver.planner.stages.search.plan_job`)."""
    stages = _least_stages(run, spec)
    return stages is None or not stages.might_beat(run.n_micro, bar) or \
        _iterations_cut(run, spec, stages, bar)


def _iterations_cut(run: PlanningRun, spec: TableSpec | None, stages: LeastStages,
                    bar: float) -> bool:
    """Whether no plan of the relaxed floor table beats ``bar`` with its per-iteration time
    counted (:func:`~solver.compose.groups.group_bounds.might_beat_with_iterations` over
    :func:`_iteration_stages`; provably safe). The per-iteration term is what the latency
    bounds miss most (``fleet-8448``: 2.7% of its seven-island floor optimum; the check
    settles 183 of the 210 floor-table proofs of its dearest replica plans). ``stages``:
    :func:`_least_stages` of ``run`` and ``spec``."""
    levels = _iteration_stages(run, spec, stages)
    return levels is not None and not might_beat_with_iterations(levels, run.n_micro, bar)


def _iteration_stages(run: PlanningRun, spec: TableSpec | None,
                      stages: LeastStages) -> IterationLevels | None:
    """The relaxed floor table's ``stages`` (:func:`_least_stages`) by the largest
    per-iteration floor of a plan (:class:`~solver.compose.groups.group_bounds.IterationLevels`; a
    stage's floor is the least over positions of :func:`_group_iterations`). None where the
    parallelizer is not priced by the cost model. Remembered as :func:`_least_stages`."""
    if stage_calibration(run.cache.parallelizer) is None:
        return None
    sizes = _group_sizes(run, spec)
    remember = getattr(run.cache.parallelizer, "remember", None)
    price = lambda: _price_iteration_stages(run, sizes, stages)  # noqa: E731
    if remember is None:
        return price()
    key = ("iteration stages", replace(run.cache.context, n_micro=0), run.features,
           _sizes_key(run, sizes))
    return remember(key, run.islands.islands[0], price)


def _price_iteration_stages(run: PlanningRun, sizes: dict[str, tuple[int, ...]],
                            stages: LeastStages) -> IterationLevels:
    """:func:`_iteration_stages`, computed (``sizes``: :func:`_group_sizes`, the table's
    islands in its order)."""
    floors = np.zeros(stages.tmin.shape)  # no floor known: 0, the stage fits every level
    for k, (name, got) in enumerate(sizes.items()):
        for gi, g in enumerate(got):
            by_position = _group_iterations(run, run.cache.group(name, g))
            floors[k, gi] = np.min([by_position[p] for p in Position], axis=0)
    floors[~np.isfinite(floors)] = 0.0
    floors[:, :, 0] = np.inf  # no stage holds no layer
    return IterationLevels(stages, floors)


def floor_cuts(run: PlanningRun, spec: TableSpec, restrictions: GroupRestrictions,
               rate: np.ndarray, bar: float) -> bool:
    """Whether the floor table proves that no plan of ``run`` under ``spec`` and
    ``restrictions`` beats ``bar`` seconds per iteration (provably safe; the module docstring
    says why). False when ``bar`` is infinite, or the table is too large for the group DP."""
    if not math.isfinite(bar):
        return False
    if relaxed_cuts(run, bar, spec):
        return True
    # With the per-iteration floors from the start: the latencies alone come within a few
    # percent of the bar where the relaxed cut fails (``fleet-8448``: 0.95-0.99 of it), so
    # a check without them mostly finds a plan and the table is composed again; with them
    # these proofs have more room and cost less (its replica search: 10% less in all).
    try:
        table = floor_table(run, spec, rate, iterations=True)
        if table is None:
            return True  # nothing is allowed, so nothing beats the bar
        return not beats(table, restrictions.among(set(table.names())),
                         run.job.planner.overlap, bar)
    except TooLargeError:
        return False
