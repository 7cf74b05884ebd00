"""Homogeneous parallelizer: the best ways to run one model slice on one island.

The :class:`Parallelizer` protocol is the seam of the Tangram design (seed note, Sec. 3.3): it sees
a model slice and a homogeneous island, never the rest of the cluster, and returns partial plans
that are Pareto-optimal in (per-micro-batch latency, per-iteration time, peak memory) for each
boundary activation layout ``(tp, cp, dp)``.

:class:`AnalyticParallelizer` enumerates the whole configuration space exhaustively and evaluates
it in one vectorized call of :func:`solver.cost.stage_costs.stage_costs`. The space: ``tp`` a power of two
dividing heads and hidden size (across nodes too, on the network), ``cp`` a power of two with
``2 cp | seq_len``, ``pp <= max_pp`` dividing the island, ``dp`` the rest (``tp cp pp dp`` = island
GPUs, ``dp`` divides the micro-batch), ``ep`` dividing the experts and ``dp cp``, ZeRO 0-3,
recomputation none/selective/full and activation offload, each as the feature preset allows.
The types it answers in (:class:`PlanContext`, :class:`PartialPlan`, :class:`MemoryBreakdown`)
are defined in :mod:`solver.cost.partial` and re-exported here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Protocol

import numpy as np

from solver.cost.configs import FeatureSet, enumerate_configs, framework_features
from solver.cost.efficiency import DEFAULT_CALIBRATION, Calibration
from solver.cost.partial import MemoryBreakdown, PartialPlan, PlanContext, SliceBatch, partial_plans
from solver.cost.recompute_layers import partial_recompute_allowed, with_partial_recompute
from solver.cost.reserve import usable_bytes
from solver.cost.stage import ModelSlice, StageConfig
from solver.cost.stage_costs import PipelineSetting, stage_costs, substage_latencies
from solver.cost.stage_options import StageOptions, plan_stages, stage_candidates
from solver.spec.domain import FeaturePreset, Island, ModelSpec, Schedule

__all__ = ["AnalyticParallelizer", "FeatureSet", "MemoryBreakdown", "Parallelizer", "PartialPlan",
           "PlanContext", "StageConfig", "best_plan", "framework_features", "kernel_calibration",
           "stage_calibration",
           "pipeline_time", "prices_interleaving_above_plain"]


class Parallelizer(Protocol):
    """A homogeneous parallelizer."""

    def plan(self, slice: ModelSlice, island: Island, context: PlanContext) -> list[PartialPlan]:
        """Pareto set of partial plans (empty when nothing fits)."""
        ...


def prices_interleaving_above_plain(parallelizer: Parallelizer) -> bool:
    """Whether ``parallelizer`` declares (attribute ``interleaving_priced_above_plain``) that
    every plan it returns under interleaved 1F1B, ``v >= 2``, has a plan of the same layout
    under plain 1F1B (same slice, group, micro-batches, in-flight and limits) whose
    ``latency_s`` less its transfers ``p2p_s`` is at most the interleaved plan's ``latency_s``
    and whose ``optimizer_s`` is at most the interleaved plan's ``iteration_s``: the premise of
    :func:`~solver.planner.stages.interleaved.plain_floor`. Wrappers forward their inner's answer;
    a parallelizer that says nothing gets False, and no cut."""
    return bool(getattr(parallelizer, "interleaving_priced_above_plain", False))


def kernel_calibration(parallelizer: Parallelizer) -> Calibration | None:
    """The calibration whose kernel curves bound ``parallelizer``'s times from below (attribute
    ``kernel_calibration``: the analytic model's own), for the compute floors'
    size-dependent GEMM efficiency and memory-bound operators
    (:func:`~solver.planner.bounds.floors.kernel_floor`). Wrappers forward their inner's; a
    parallelizer that says nothing gets None, and floors from the catalog's ceilings only."""
    return getattr(parallelizer, "kernel_calibration", None)


def stage_calibration(parallelizer: Parallelizer) -> Calibration | None:
    """The calibration under which :func:`~solver.cost.stage_costs.stage_costs` prices every
    stage option ``parallelizer`` returns (attribute ``stage_calibration``: the analytic
    model's own), so that a stage's latency is at least its layers' least latency
    (:func:`~solver.cost.least_costs.least_latencies`, the floor stage table's premise).
    Wrappers forward their inner's; a parallelizer that says nothing gets None, and the
    floor stage table prices kernels only (:func:`kernel_calibration`)."""
    return getattr(parallelizer, "stage_calibration", None)


def pareto_mask(groups: np.ndarray, objectives: np.ndarray) -> np.ndarray:
    """Members not dominated within their group (rows of ``objectives``, smaller is better).

    Ties are broken by position: of identical rows only the first survives.
    """
    keep = np.zeros(len(groups), dtype=bool)
    order = np.lexsort(tuple(objectives.T[::-1]) + (groups,))
    g_sorted = groups[order]
    starts = np.flatnonzero(np.r_[True, g_sorted[1:] != g_sorted[:-1], True])
    for lo, hi in zip(starts[:-1], starts[1:]):
        idx = order[lo:hi]
        obj = objectives[idx]
        # Sorted lexicographically, anything dominating row i precedes it.
        leq = np.all(obj[None, :, :] <= obj[:, None, :], axis=2)
        dominated = np.any(np.tril(leq, k=-1), axis=1)
        keep[idx[~dominated]] = True
    return keep


@dataclass(frozen=True)
class AnalyticParallelizer:
    """Exhaustive, vectorized search with the analytic cost model.

    Attributes
    ----------
    features : FeaturePreset
        The parallelizer's capabilities (intersected with the context's).
    calibration : Calibration
        Cost-model constants.
    """

    features: FeaturePreset = FeaturePreset.FULL
    calibration: Calibration = DEFAULT_CALIBRATION
    # With v >= 2 chunks a configuration keeps its compute and per-iteration terms, pays v times
    # the point-to-point time or hides it (so at least plain 1F1B's latency less its own
    # transfers) and holds at least as many micro-batches on every sub-stage
    # (:func:`~solver.cost.stage_costs.in_flight_of`), and no layout is offered that plain
    # 1F1B lacks: what :func:`prices_interleaving_above_plain` asks.
    interleaving_priced_above_plain: ClassVar[bool] = True

    @property
    def kernel_calibration(self) -> Calibration:
        """Its own calibration: every GEMM, attention core and memory-bound operator is priced
        by it (:func:`kernel_calibration`)."""
        return self.calibration

    @property
    def stage_calibration(self) -> Calibration:
        """Its own calibration: its stage options are :func:`stage_costs`' under it
        (:func:`stage_calibration`)."""
        return self.calibration

    def plan(self, slice: ModelSlice, island: Island, context: PlanContext) -> list[PartialPlan]:
        """Pareto set over (latency, iteration time, memory) per layout; [] when nothing fits."""
        feats = FeatureSet.of(self.features).meet(FeatureSet.of(context.features))
        cfg = enumerate_configs(slice, island, context, feats)
        if len(cfg) == 0:
            return []
        pipe = PipelineSetting(context.n_micro, context.in_flight, context.schedule,
                               context.virtual_stages)
        if partial_recompute_allowed(context.framework):  # block method: the least k that fits
            cfg = with_partial_recompute(
                slice.model, island, context.seq_len, cfg, slice.layers, slice.has_embedding,
                slice.has_head, pipe, [context.in_flight],
                usable_bytes(island, context.epsilon), self.calibration,
                context.runtime)[0]
        costs = stage_costs(slice, island, context.seq_len, cfg, pipe, self.calibration,
                            context.runtime)
        idx = np.flatnonzero(costs.fits(usable_bytes(island, context.epsilon), self.calibration))
        if idx.size == 0:
            return []
        groups = (cfg.tp[idx] * 1_000_003 + cfg.cp[idx]) * 1_000_003 + cfg.dp[idx]
        obj = np.column_stack([costs.latency_s[idx], costs.iteration_s[idx],
                               costs.memory.total[idx]])
        chosen = idx[pareto_mask(groups, obj)]
        chosen = chosen[np.argsort(costs.latency_s[chosen], kind="stable")]
        subs = substage_latencies(slice, island, context.seq_len, cfg.take(chosen), pipe,
                                  self.calibration, context.runtime)
        return partial_plans(cfg, costs, chosen, subs)

    def plan_many(self, model: ModelSpec, lengths: list[int], has_embedding: bool,
                  has_head: bool, island: Island, context: PlanContext) -> list[list[PartialPlan]]:
        """``plan`` for slices of every length in ``lengths`` (same position), in one call.

        Equal to ``[plan(ModelSlice(model, n, ...), island, context) for n in lengths]`` (a test
        checks it) but evaluated as one array: the per-call NumPy overhead, not arithmetic,
        dominates a single ``plan``. Internal pipelining (``max_pp > 1``) makes the layouts depend
        on the length, so that case falls back to one ``plan`` per length.
        """
        if context.max_pp > 1 or not lengths:
            return [self.plan(ModelSlice(model, n, has_embedding, has_head), island, context)
                    for n in lengths]
        feats = FeatureSet.of(self.features).meet(FeatureSet.of(context.features))
        base = enumerate_configs(ModelSlice(model, max(lengths), has_embedding, has_head),
                                 island, context, feats)
        m = len(base)
        if m == 0:
            return [[] for _ in lengths]
        cfg = base.take(np.tile(np.arange(m), len(lengths)))
        owner = np.repeat(np.arange(len(lengths)), m)
        layers = np.asarray(lengths)[owner]
        pipe = PipelineSetting(context.n_micro, context.in_flight, context.schedule,
                               context.virtual_stages)
        if partial_recompute_allowed(context.framework):  # as in ``plan``
            cfg, src = with_partial_recompute(
                model, island, context.seq_len, cfg, layers, has_embedding, has_head, pipe,
                [context.in_flight], usable_bytes(island, context.epsilon),
                self.calibration, context.runtime)
            owner, layers = owner[src], layers[src]
        batch = SliceBatch(model, layers, has_embedding, has_head)
        costs = stage_costs(batch, island, context.seq_len, cfg, pipe, self.calibration,
                            context.runtime)
        idx = np.flatnonzero(costs.fits(usable_bytes(island, context.epsilon), self.calibration))
        which = owner[idx]
        groups = ((which * 1_000_003 + cfg.tp[idx]) * 1_000_003 + cfg.cp[idx]) * 1_000_003 \
            + cfg.dp[idx]
        obj = np.column_stack([costs.latency_s[idx], costs.iteration_s[idx],
                               costs.memory.total[idx]])
        chosen = idx[pareto_mask(groups, obj)]
        chosen = chosen[np.lexsort((costs.latency_s[chosen], owner[chosen]))]
        subs = [(x,) for x in costs.latency_s[chosen].tolist()]
        plans = partial_plans(cfg, costs, chosen, subs)
        out: list[list[PartialPlan]] = [[] for _ in lengths]
        for i, plan in zip(owner[chosen].tolist(), plans):
            out[i].append(plan)
        return out

    def plan_stages(self, model: ModelSpec, lengths: list[int], has_embedding: bool,
                    has_head: bool, island: Island, context: PlanContext) -> list[StageOptions]:
        """Options of one pipeline stage for every length (:func:`solver.cost.stage_options.plan_stages`)."""
        return plan_stages(self, model, lengths, has_embedding, has_head, island, context)

    def stage_candidates(self, model: ModelSpec, lengths: list[int], has_embedding: bool,
                         has_head: bool, island: Island, context: PlanContext
                         ) -> list[StageOptions]:
        """Options of one pipeline stage for every length at every micro-batch count up to
        ``context.n_micro`` (:func:`solver.cost.stage_options.stage_candidates`)."""
        return stage_candidates(self, model, lengths, has_embedding, has_head, island, context)


def pipeline_time(plan: PartialPlan, n_micro: int, schedule: Schedule = Schedule.ONE_F_ONE_B,
                  virtual_stages: int = 1) -> float:
    """Iteration time of the plan run alone: ``(m + p - 1) t`` (interleaved: ``(p - 1) / v``
    fill/drain) plus its per-iteration terms."""
    fill = plan.config.pp - 1
    if schedule is Schedule.INTERLEAVED:
        fill = fill / virtual_stages
    return (n_micro + fill) * plan.latency_s + plan.iteration_s


def best_plan(plans: list[PartialPlan], n_micro: int, schedule: Schedule = Schedule.ONE_F_ONE_B,
              virtual_stages: int = 1) -> PartialPlan | None:
    """The plan with the shortest :func:`pipeline_time` (ties: less memory); None if empty."""
    if not plans:
        return None
    return min(plans, key=lambda p: (pipeline_time(p, n_micro, schedule, virtual_stages),
                                     p.memory_gb))
