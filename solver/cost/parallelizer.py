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
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Protocol

import numpy as np

from solver.cost.efficiency import DEFAULT_CALIBRATION, Calibration
from solver.cost.configs import FeatureSet, enumerate_configs, framework_features
from solver.cost.frameworks import Runtime
from solver.cost.stage import RECOMPUTE_CODES, ConfigArrays, ModelSlice, StageConfig
from solver.cost.stage_costs import (
    PipelineSetting,
    StageCosts,
    stage_costs,
    substage_latencies,
)
from solver.spec.domain import (Constraints, FeaturePreset, Framework, Island, ModelSpec,
                                Precision, Recompute, Schedule)

__all__ = ["AnalyticParallelizer", "FeatureSet", "MemoryBreakdown", "Parallelizer", "PartialPlan",
           "PlanContext", "StageConfig", "best_plan", "framework_features", "kernel_calibration",
           "pipeline_time", "prices_interleaving_above_plain"]

_ALL_RC = (Recompute.NONE, Recompute.SELECTIVE, Recompute.FULL)


@dataclass(frozen=True)
class PlanContext:
    """What the caller fixes for one ``plan`` call.

    Attributes
    ----------
    seq_len : int
        Tokens per sequence.
    micro_batch : int
        Sequences per micro-batch for the whole stage; each of the ``dp`` replicas gets
        ``micro_batch / dp`` (configurations where ``dp`` does not divide it are skipped).
    n_micro : int
        Micro-batches per iteration.
    in_flight : int
        Micro-batches of activations the stage holds (its last internal sub-stage, if ``pp > 1``);
        a single-stage island at pipeline position ``i`` of ``P`` gets ``min(P - i, n_micro)``.
    epsilon : float
        Memory margin: plans use at most ``(1 - epsilon)`` of HBM.
    max_pp : int
        Largest internal pipeline degree (the heterogeneous planner passes 1).
    features : FeaturePreset
        Features the job allows (intersected with the parallelizer's own).
    schedule : Schedule
        Pipeline schedule (for memory in flight and internal point-to-point traffic).
    virtual_stages : int
        Model chunks per GPU with the interleaved schedule.
    framework : Framework | None
        Training runtime whose profile restricts the configurations (None: the features alone,
        priced as Megatron-Core).
    precision : Precision
        GEMM precision the job asks for.
    constraints : Constraints | None
        The user's per-stage limits (allowed tp, cp, ep, ZeRO, recomputation, offload,
        micro-batch); None: none.
    """

    seq_len: int
    micro_batch: int
    n_micro: int
    in_flight: int = 1
    epsilon: float = 0.1
    max_pp: int = 1
    features: FeaturePreset = FeaturePreset.FULL
    schedule: Schedule = Schedule.ONE_F_ONE_B
    virtual_stages: int = 1
    framework: Framework | None = None
    precision: Precision = Precision.BF16
    constraints: Constraints | None = None

    @property
    def runtime(self) -> Runtime:
        """What the cost model prices the stage under."""
        return Runtime(self.framework or Framework.MEGATRON_CORE, self.precision)


@dataclass(frozen=True)
class MemoryBreakdown:
    """Per-GPU memory of the most loaded GPU, GB (10^9 bytes).

    Attributes
    ----------
    params, grads, optimizer, activations : float
        Weights (with ZeRO-3 prefetch buffers), gradients, optimizer states, activations.
    """

    params: float
    grads: float
    optimizer: float
    activations: float

    @property
    def total(self) -> float:
        """Sum of the parts."""
        return self.params + self.grads + self.optimizer + self.activations


@dataclass(frozen=True)
class PartialPlan:
    """One way to run a slice on an island.

    Attributes
    ----------
    config : StageConfig
        The configuration (``micro_batch`` per replica).
    latency_s : float
        Forward + backward seconds per micro-batch (the bottleneck sub-stage if ``pp > 1``).
    fwd_s, bwd_s : float
        Forward and backward parts of ``latency_s``.
    iteration_s : float
        Per-iteration time outside the pipeline: exposed DP gradient sync + optimizer step.
    memory_gb : float
        Peak memory per GPU.
    memory : MemoryBreakdown
        Its parts.
    layout : tuple[int, int, int]
        ``(tp, cp, dp)`` of the activations at the stage boundary.
    stage_latencies : tuple[float, ...]
        Latency of each internal sub-stage, in order (one entry when ``pp == 1``).
    max_in_flight : int
        Most micro-batches in flight the plan holds in memory (:meth:`plan_stages` only;
        0 where not computed).
    """

    config: StageConfig
    latency_s: float
    fwd_s: float
    bwd_s: float
    iteration_s: float
    memory_gb: float
    memory: MemoryBreakdown
    layout: tuple[int, int, int]
    stage_latencies: tuple[float, ...]
    max_in_flight: int = 0


class Parallelizer(Protocol):
    """A homogeneous parallelizer."""

    def plan(self, slice: ModelSlice, island: Island, context: PlanContext) -> list[PartialPlan]:
        """Pareto set of partial plans (empty when nothing fits)."""
        ...


def prices_interleaving_above_plain(parallelizer: Parallelizer) -> bool:
    """Whether ``parallelizer`` declares (attribute ``interleaving_priced_above_plain``) that
    every plan it returns under interleaved 1F1B, ``v >= 2``, has a plan of the same layout
    under plain 1F1B (same slice, group, micro-batches, in-flight and limits) that is no slower
    in ``latency_s`` and ``iteration_s``: the premise of
    :func:`~solver.planner.interleaved.plain_floor`. Wrappers forward their inner's answer;
    a parallelizer that says nothing gets False, and no cut."""
    return bool(getattr(parallelizer, "interleaving_priced_above_plain", False))


def kernel_calibration(parallelizer: Parallelizer) -> Calibration | None:
    """The calibration whose kernel curves bound ``parallelizer``'s times from below (attribute
    ``kernel_calibration``: the analytic model's own), for the compute floors'
    size-dependent GEMM efficiency and memory-bound operators
    (:func:`~solver.planner.floors.kernel_floor`). Wrappers forward their inner's; a
    parallelizer that says nothing gets None, and floors from the catalog's ceilings only."""
    return getattr(parallelizer, "kernel_calibration", None)


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
    # the point-to-point time and holds at least as many micro-batches on every sub-stage
    # (:func:`~solver.cost.stage_costs.in_flight_of`), and no layout is offered that plain
    # 1F1B lacks: what :func:`prices_interleaving_above_plain` asks.
    interleaving_priced_above_plain: ClassVar[bool] = True

    @property
    def kernel_calibration(self) -> Calibration:
        """Its own calibration: every GEMM, attention core and memory-bound operator is priced
        by it (:func:`kernel_calibration`)."""
        return self.calibration

    def plan(self, slice: ModelSlice, island: Island, context: PlanContext) -> list[PartialPlan]:
        """Pareto set over (latency, iteration time, memory) per layout; [] when nothing fits."""
        feats = FeatureSet.of(self.features).meet(FeatureSet.of(context.features))
        cfg = enumerate_configs(slice, island, context, feats)
        if len(cfg) == 0:
            return []
        pipe = PipelineSetting(context.n_micro, context.in_flight, context.schedule,
                               context.virtual_stages)
        costs = stage_costs(slice, island, context.seq_len, cfg, pipe, self.calibration,
                            context.runtime)
        idx = np.flatnonzero(costs.fits(island.hbm_gb, context.epsilon, self.calibration))
        if idx.size == 0:
            return []
        groups = (cfg.tp[idx] * 1_000_003 + cfg.cp[idx]) * 1_000_003 + cfg.dp[idx]
        obj = np.column_stack([costs.latency_s[idx], costs.iteration_s[idx],
                               costs.memory.total[idx]])
        chosen = idx[pareto_mask(groups, obj)]
        chosen = chosen[np.argsort(costs.latency_s[chosen], kind="stable")]
        subs = substage_latencies(slice, island, context.seq_len, cfg.take(chosen), pipe,
                                  self.calibration, context.runtime)
        return _plans(cfg, costs, chosen, subs)

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
        layers = np.repeat(np.asarray(lengths), m)
        pipe = PipelineSetting(context.n_micro, context.in_flight, context.schedule,
                               context.virtual_stages)
        batch = _SliceBatch(model, layers, has_embedding, has_head)
        costs = stage_costs(batch, island, context.seq_len, cfg, pipe, self.calibration,
                            context.runtime)
        idx = np.flatnonzero(costs.fits(island.hbm_gb, context.epsilon, self.calibration))
        which = idx // m
        groups = ((which * 1_000_003 + cfg.tp[idx]) * 1_000_003 + cfg.cp[idx]) * 1_000_003 \
            + cfg.dp[idx]
        obj = np.column_stack([costs.latency_s[idx], costs.iteration_s[idx],
                               costs.memory.total[idx]])
        chosen = idx[pareto_mask(groups, obj)]
        chosen = chosen[np.lexsort((costs.latency_s[chosen], chosen // m))]
        subs = [(x,) for x in costs.latency_s[chosen].tolist()]
        plans = _plans(cfg, costs, chosen, subs)
        out: list[list[PartialPlan]] = [[] for _ in lengths]
        for i, plan in zip((chosen // m).tolist(), plans):
            out[i].append(plan)
        return out

    def plan_stages(self, model: ModelSpec, lengths: list[int], has_embedding: bool,
                    has_head: bool, island: Island, context: PlanContext) -> list:
        """Options of one pipeline stage for every length (:func:`solver.cost.stage_options.plan_stages`)."""
        from solver.cost.stage_options import plan_stages
        return plan_stages(self, model, lengths, has_embedding, has_head, island, context)


@dataclass(frozen=True)
class _SliceBatch:
    """Slices of several lengths at one position: ``layers`` is an array aligned with the
    configurations (the cost model only uses ``model``, ``layers`` and the two flags)."""

    model: ModelSpec
    layers: np.ndarray
    has_embedding: bool
    has_head: bool


def _column(values, index: np.ndarray, n: int) -> list:
    """``values`` (array or scalar) broadcast to ``n`` and picked at ``index``, as Python values."""
    return np.broadcast_to(values, (n,))[index].tolist()


def _plans(cfg: ConfigArrays, costs: StageCosts, index: np.ndarray,
           subs: list[tuple[float, ...]], caps: list[int] | None = None) -> list[PartialPlan]:
    """PartialPlans of the configurations at ``index``; columns are extracted once (a plan call
    returns about a hundred Pareto points, and per-element NumPy access dominated its time)."""
    n = len(cfg)
    cols = {f: _column(getattr(cfg, f), index, n)
            for f in ("tp", "cp", "ep", "pp", "dp", "zero", "recompute", "offload", "micro_batch")}
    mem = costs.memory
    gb = {f: [x / 1e9 for x in _column(getattr(mem, f), index, n)]
          for f in ("params", "grads", "optimizer", "activations")}
    total = [x / 1e9 for x in _column(mem.total, index, n)]
    lat, fwd, bwd, it = (_column(a, index, n) for a in (
        costs.latency_s, costs.fwd.total, costs.bwd.total, costs.iteration_s))
    out = []
    for k in range(len(index)):
        config = StageConfig(cols["tp"][k], cols["cp"][k], cols["ep"][k], cols["pp"][k],
                             cols["dp"][k], cols["zero"][k], RECOMPUTE_CODES[cols["recompute"][k]],
                             bool(cols["offload"][k]), cols["micro_batch"][k])
        breakdown = MemoryBreakdown(gb["params"][k], gb["grads"][k], gb["optimizer"][k],
                                    gb["activations"][k])
        out.append(PartialPlan(config, lat[k], fwd[k], bwd[k], it[k], total[k], breakdown,
                               (config.tp, config.cp, config.dp), subs[k],
                               caps[k] if caps is not None else 0))
    return out


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
