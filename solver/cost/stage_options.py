"""Options of one pipeline stage for every slice length, for node-group composition.

A stage of a multi-stage pipeline runs its slice without internal pipelining (``pp = 1``) and
holds as many micro-batches of activations as its global position dictates, which composition
decides. So instead of checking one in-flight count, :func:`plan_stages` returns, per length,
the Pareto set over (latency ↓, per-iteration time ↓, most micro-batches in flight that fit ↑),
from one vectorized cost-model evaluation of every configuration and length. The options are
kept as arrays (:class:`StageOptions`); a :class:`~solver.cost.partial.PartialPlan` is
built only for the options a plan uses.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from solver.cost.configs import FeatureSet, _zero_allowed, enumerate_configs, multi_mesh_cp
from solver.cost.partial import PartialPlan, PlanContext, SliceBatch, partial_plans
from solver.cost.recompute_layers import (RECOMPUTE_LEVELS, partial_recompute_allowed,
                                          with_partial_recompute)
from solver.cost.reserve import usable_bytes
from solver.cost.stage import ConfigArrays, ModelSlice
from solver.cost.stage_costs import PipelineSetting, StageCosts, in_flight_capacity, stage_costs
from solver.spec.domain import Island, ModelSpec, Schedule


@dataclass(frozen=True)
class _Batch:
    """The chosen rows of one evaluation (configurations × lengths)."""

    cfg: ConfigArrays
    costs: StageCosts
    capacity: np.ndarray

    def plan(self, row: int, capacity: int) -> PartialPlan:
        index = np.array([row])
        return partial_plans(self.cfg, self.costs, index, [(float(self.costs.latency_s[row]),)],
                             [capacity])[0]


class StageOptions(Sequence):
    """The options of one slice length: arrays ``latency``, ``iteration``, ``capacity`` and,
    by index, the partial plans (built on first access)."""

    def __init__(self, batch: _Batch, rows: np.ndarray,
                 capacity: np.ndarray | None = None) -> None:
        self._batch, self._rows = batch, rows
        self.latency = batch.costs.latency_s[rows]
        self.iteration = batch.costs.iteration_s[rows]
        self.capacity = batch.capacity[rows] if capacity is None else capacity

    def __len__(self) -> int:
        return int(self._rows.size)

    def __getitem__(self, i):  # noqa: D105 - Sequence protocol
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        row = int(self._rows[i])  # IndexError past the end, as a Sequence's iteration needs
        return self._batch.plan(row, int(self.capacity[i]))

    def capped(self, n_micro: int) -> "StageOptions":
        """The options of this length at ``n_micro`` micro-batches, from the candidates of a
        larger count (:func:`stage_candidates`): capacities capped at ``n_micro``, then the
        Pareto set (identical options: the first configuration survives)."""
        if self._batch is None:
            return self
        cap = np.minimum(self.capacity, n_micro)
        keep = pareto_capacity_mask(np.zeros(cap.size, dtype=np.int64), self.latency,
                                    self.iteration, cap)
        return StageOptions(self._batch, self._rows[keep], cap[keep])

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, StageOptions):
            return NotImplemented
        return (np.array_equal(self.latency, other.latency)
                and np.array_equal(self.iteration, other.iteration)
                and np.array_equal(self.capacity, other.capacity)
                and [p.config for p in self] == [p.config for p in other])

    __hash__ = None  # mutable-looking sequence: not hashable


def plan_stages(parallelizer, model: ModelSpec, lengths: list[int], has_embedding: bool,
                has_head: bool, island: Island, context: PlanContext) -> list[StageOptions]:
    """Per length, the Pareto options of a stage on all of ``island`` (``parallelizer``'s
    features and calibration), each with its ``max_in_flight`` (capped at ``n_micro``); memory
    is reported at one micro-batch in flight."""
    return [o.capped(context.n_micro) for o in stage_candidates(
        parallelizer, model, lengths, has_embedding, has_head, island, context)]


def shares_across_n(context: PlanContext) -> bool:
    """Whether a stage's options at ``context`` depend on ``n_micro`` only through the cap on
    their capacities, so that :func:`stage_candidates` at a larger count serve it: a stage
    without internal pipelining holds one micro-batch per in-flight slot under 1F1B (GPipe
    holds all ``n_micro``; the interleaved schedule's chunks and Megatron's rule on it depend
    on ``n_micro``)."""
    return context.schedule is Schedule.ONE_F_ONE_B or (
        context.schedule is not Schedule.GPIPE and context.virtual_stages == 1)


def stage_candidates(parallelizer, model: ModelSpec, lengths: list[int], has_embedding: bool,
                     has_head: bool, island: Island, context: PlanContext
                     ) -> list[StageOptions]:
    """Per length, every option that is Pareto-optimal at some micro-batch count up to
    ``context.n_micro``, with its capacity capped at ``context.n_micro``; ordered by latency
    (ties: configuration order). :meth:`StageOptions.capped` then gives the options at any
    smaller count where :func:`shares_across_n` holds.

    An option is dropped only when another one has no larger latency, per-iteration time and
    capacity and comes before it (lower latency, else lower per-iteration time, else earlier
    configuration): capping both capacities keeps it beaten at every count, and every option
    Pareto-optimal at a count survives (:func:`candidate_mask`)."""
    ctx = PlanContext(**{**context.__dict__, "in_flight": 1, "max_pp": 1})
    feats = FeatureSet.of(parallelizer.features).meet(FeatureSet.of(ctx.features))
    base = enumerate_configs(ModelSlice(model, max(lengths), has_embedding, has_head), island,
                             ctx, feats) if lengths else ConfigArrays.of([])
    m = len(base)
    if m == 0:
        return [_empty() for _ in lengths]
    rows = np.tile(np.arange(m), len(lengths))
    length_index = np.repeat(np.arange(len(lengths)), m)
    per_row = np.asarray(lengths)[length_index]
    if ctx.framework is not None:  # a shorter slice is one stage of a pipelined plan
        whole = has_embedding and has_head and per_row == model.layers
        ok = whole | _zero_allowed(ctx.framework, base.zero[rows], np.asarray(base.pp)[rows],
                                   False, feats.zero)
        ok |= base.dp[rows] * base.cp[rows] == 1
        # A shorter slice is one mesh of several: CP only where the runtime runs it there.
        ok &= whole | multi_mesh_cp(ctx.framework, base.cp[rows])
        rows, per_row, length_index = rows[ok], per_row[ok], length_index[ok]
    cfg = base.take(rows)
    pipe = PipelineSetting(ctx.n_micro, 1, ctx.schedule, ctx.virtual_stages)
    if partial_recompute_allowed(ctx.framework):  # block method: least k per in-flight count
        # The same rows at every n_micro where options are shared across counts (memo).
        top = max(ctx.n_micro, RECOMPUTE_LEVELS) if shares_across_n(ctx) else ctx.n_micro
        cfg, src = with_partial_recompute(
            model, island, ctx.seq_len, cfg, per_row, has_embedding, has_head,
            replace(pipe, n_micro=top), list(range(1, top + 1)),
            usable_bytes(island, ctx.epsilon), parallelizer.calibration, ctx.runtime)
        per_row, length_index = per_row[src], length_index[src]
    batch = SliceBatch(model, per_row, has_embedding, has_head)
    costs = stage_costs(batch, island, ctx.seq_len, cfg, pipe, parallelizer.calibration,
                        ctx.runtime)
    cap = in_flight_capacity(batch, island, ctx.seq_len, cfg, costs, ctx.n_micro,
                             usable_bytes(island, ctx.epsilon),
                             parallelizer.calibration, ctx.runtime)
    idx = np.flatnonzero(cap > 0)
    keep = candidate_mask(length_index[idx], costs.latency_s[idx], costs.iteration_s[idx],
                          cap[idx])
    chosen = idx[keep]
    chosen = chosen[np.lexsort((costs.latency_s[chosen], length_index[chosen]))]
    owner = length_index[chosen]
    bounds = np.searchsorted(owner, np.arange(len(lengths) + 1))
    full = _Batch(cfg, costs, cap)
    return [StageOptions(full, chosen[bounds[i]:bounds[i + 1]]) for i in range(len(lengths))]


def _empty() -> StageOptions:
    """No option (nothing fits, or no layout)."""
    out = StageOptions.__new__(StageOptions)
    out._batch, out._rows = None, np.zeros(0, dtype=np.int64)
    out.latency = out.iteration = np.zeros(0)
    out.capacity = np.zeros(0, dtype=np.int64)
    return out


def pareto_capacity_mask(groups: np.ndarray, latency: np.ndarray, iteration: np.ndarray,
                         capacity: np.ndarray) -> np.ndarray:
    """Members not dominated within their group in (latency ↓, iteration ↓, capacity ↑).

    Same answer as :func:`~solver.cost.parallelizer.pareto_mask` on ``(latency, iteration,
    −capacity)`` (identical rows: the first survives): rows sorted by (group, latency,
    iteration, −capacity) are dominated exactly when an earlier row of their group has no
    larger iteration time and no smaller capacity (capacities are small integers).
    """
    order = np.lexsort((-capacity, iteration, latency, groups))
    dominated = _dominated(groups[order], iteration[order], capacity[order].astype(np.int64))
    keep = np.zeros(order.size, dtype=bool)
    keep[order[~dominated]] = True
    return keep


def candidate_mask(groups: np.ndarray, latency: np.ndarray, iteration: np.ndarray,
                   capacity: np.ndarray) -> np.ndarray:
    """Members no earlier member of their group beats at every capacity cap: rows sorted by
    (group, latency, iteration, position) are dropped when an earlier row has no larger
    iteration time and no smaller capacity. Unlike :func:`pareto_capacity_mask`, a larger
    capacity does not put a row first among equals: capped, the two may tie, and then the
    earlier configuration is the one the Pareto set keeps."""
    order = np.lexsort((iteration, latency, groups))
    dominated = _dominated(groups[order], iteration[order], capacity[order].astype(np.int64))
    keep = np.zeros(order.size, dtype=bool)
    keep[order[~dominated]] = True
    return keep


def _dominated(groups: np.ndarray, iteration: np.ndarray, capacity: np.ndarray) -> np.ndarray:
    """Rows (sorted by group first) that an earlier row of their group has no larger iteration
    time and no smaller capacity than; a row of infinite iteration time is always one.
    Compiled (numba) or NumPy, the same answer (:mod:`solver.compose.kernels.kernel_switch` picks, by
    the NumPy twin's work: all pairs of a few rows, else the rows times the capacities)."""
    from solver.compose.kernels.kernel_switch import compiled_now, numpy_seconds, use_compiled
    n = groups.size
    if compiled_now() or use_compiled(numpy_seconds(10, 6 * n * n) if n <= 64 else
                                      numpy_seconds(24, n * (4 * int(capacity.max()) + 24))):
        return _compiled_kernel()(groups, iteration, capacity)
    return _dominated_np(groups, iteration, capacity)


def _dominated_np(groups: np.ndarray, iteration: np.ndarray, capacity: np.ndarray) -> np.ndarray:
    """:func:`_dominated` in NumPy. A row is dominated exactly when an earlier row of its run of
    equal groups has no larger iteration time and no smaller capacity (the loops' running
    bests only keep that fact; a dominated row would change none of them): all pairs at once
    for a few rows, else per capacity level a running least of a key ordering rows by iteration
    time within their run (dense ranks) above which every earlier run lies."""
    n = groups.size
    out = iteration == np.inf  # the compiled loop: inf <= inf
    if n < 2:
        return out
    run = np.zeros(n, dtype=np.int64)
    np.cumsum(groups[1:] != groups[:-1], out=run[1:])
    if n <= 64:
        at = np.arange(n)
        pairs = (at[:, None] < at) & (run[:, None] == run) & (capacity[:, None] >= capacity) & \
            (iteration[:, None] <= iteration)  # [e, i]: e before i, same run, no worse
        return out | pairs.any(axis=0)
    order = np.argsort(iteration, kind="stable")
    ranked = iteration[order]
    rank = np.empty(n, dtype=np.int64)
    rank[order[0]] = 0
    rank[order[1:]] = np.cumsum(ranked[1:] != ranked[:-1])
    key = (run[-1] - run) * n + rank
    levels = np.unique(capacity)
    above = (run[-1] + 1) * n  # above every key
    running = np.minimum.accumulate(np.where(capacity[None, :] >= levels[:, None], key, above),
                                    axis=1)
    before = np.empty_like(running)
    before[:, 0] = above
    before[:, 1:] = running[:, :-1]
    return out | (before[np.searchsorted(levels, capacity), np.arange(n)] <= key)


_compiled_dominated = None  # the numba dispatcher, made at its first use (numba is imported then)


def _compiled_kernel():
    """:func:`_dominated_loops` compiled (cached by numba beside this file)."""
    global _compiled_dominated
    if _compiled_dominated is None:
        from numba import njit
        _compiled_dominated = njit(cache=True)(_dominated_loops)
    return _compiled_dominated


def _dominated_loops(groups: np.ndarray, iteration: np.ndarray,
                     capacity: np.ndarray) -> np.ndarray:
    """:func:`_dominated` as loops, for numba: one pass keeping, per capacity, the least
    iteration time among earlier rows of the group holding at least it."""
    out = np.zeros(groups.size, dtype=np.bool_)
    top = int(capacity.max()) + 1 if capacity.size else 1
    best = np.full(top + 1, np.inf)  # best[c]: least iteration among earlier rows of cap >= c
    for i in range(groups.size):
        if i == 0 or groups[i] != groups[i - 1]:
            best[:] = np.inf
        c = capacity[i]
        if best[c] <= iteration[i]:
            out[i] = True
            continue
        for cc in range(c + 1):
            if iteration[i] < best[cc]:
                best[cc] = iteration[i]
    return out
