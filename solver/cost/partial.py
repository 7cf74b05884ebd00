"""Partial plans: what a homogeneous parallelizer answers for one (model slice, island).

The context it is asked in (:class:`PlanContext`), one way to run the slice
(:class:`PartialPlan`, with its :class:`MemoryBreakdown`), and how partial plans are built from
one vectorized cost-model evaluation of many configurations (:func:`partial_plans`, over
slices of several lengths at once: :class:`SliceBatch`). The parallelizer
(:mod:`solver.cost.parallelizer`) and the stage options of node-group composition
(:mod:`solver.cost.stage_options`) both build on these.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from solver.cost.runtime.frameworks import Runtime
from solver.cost.stage import RECOMPUTE_CODES, ConfigArrays, StageConfig
from solver.cost.stage_costs import StageCosts
from solver.spec.domain import (Constraints, CrossEntropyKernel, FeaturePreset, Framework,
                                ModelSpec, Precision, Schedule)

__all__ = ["MemoryBreakdown", "PartialPlan", "PlanContext", "SliceBatch", "partial_plans"]


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
        The user's memory margin: the share of the device's memory held back beyond the
        runtime's own reserves (:func:`~solver.cost.reserve.usable_bytes`); 0 by default.
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
    grad_reduce_bf16, fp8_param_gather : bool
        The job's gradient buffers and weights (:class:`~solver.cost.runtime.frameworks.
        Runtime`); FP8 weights also restrict ZeRO to the distributed optimizer.
    cross_entropy : CrossEntropyKernel
        The job's loss kernel.
    """

    seq_len: int
    micro_batch: int
    n_micro: int
    in_flight: int = 1
    epsilon: float = 0.0
    max_pp: int = 1
    features: FeaturePreset = FeaturePreset.FULL
    schedule: Schedule = Schedule.ONE_F_ONE_B
    virtual_stages: int = 1
    framework: Framework | None = None
    precision: Precision = Precision.BF16
    constraints: Constraints | None = None
    grad_reduce_bf16: bool = False
    fp8_param_gather: bool = False
    cross_entropy: CrossEntropyKernel = CrossEntropyKernel.UNFUSED

    @property
    def runtime(self) -> Runtime:
        """What the cost model prices the stage under."""
        return Runtime(self.framework or Framework.MEGATRON_CORE, self.precision,
                       grad_reduce_bf16=self.grad_reduce_bf16,
                       fp8_param_gather=self.fp8_param_gather, cross_entropy=self.cross_entropy)


@dataclass(frozen=True)
class MemoryBreakdown:
    """Per-GPU memory of the most loaded GPU, GB (10^9 bytes).

    Attributes
    ----------
    params, grads, optimizer, activations : float
        Weights (with ZeRO-3 prefetch buffers), gradients, optimizer states, activations.
    fragmentation : float
        What the caching allocator holds beyond the activations
        (:data:`~solver.cost.reserve.FRAGMENTATION` of them).
    """

    params: float
    grads: float
    optimizer: float
    activations: float
    fragmentation: float = 0.0

    @property
    def total(self) -> float:
        """Sum of the parts."""
        return self.params + self.grads + self.optimizer + self.activations + self.fragmentation


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
    optimizer_s : float
        The optimizer step's part of ``iteration_s``: the per-iteration time the number of
        model chunks does not change (0 where not computed, a plan read from a cache).
    p2p_s : float
        The pipeline transfers in ``latency_s`` (forward plus backward), the part a runtime that
        overlaps interleaved transfers may hide (:func:`~solver.planner.stages.interleaved.
        plain_floor`); infinite where not computed, which bounds nothing.
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
    optimizer_s: float = 0.0
    p2p_s: float = math.inf


@dataclass(frozen=True)
class SliceBatch:
    """Slices of several lengths at one position: ``layers`` is an array aligned with the
    configurations (the cost model only uses ``model``, ``layers`` and the two flags)."""

    model: ModelSpec
    layers: np.ndarray
    has_embedding: bool
    has_head: bool


def _column(values, index: np.ndarray, n: int) -> list:
    """``values`` (array or scalar) broadcast to ``n`` and picked at ``index``, as Python values."""
    return np.broadcast_to(values, (n,))[index].tolist()


def partial_plans(cfg: ConfigArrays, costs: StageCosts, index: np.ndarray,
           subs: list[tuple[float, ...]], caps: list[int] | None = None) -> list[PartialPlan]:
    """PartialPlans of the configurations at ``index``; columns are extracted once (a plan call
    returns about a hundred Pareto points, and per-element NumPy access dominated its time)."""
    n = len(cfg)
    cols = {f: _column(getattr(cfg, f), index, n)
            for f in ("tp", "cp", "ep", "pp", "dp", "zero", "recompute", "offload", "micro_batch",
                      "recompute_layers", "expert_tp", "a2a_overlap")}
    mem = costs.memory
    gb = {f: [x / 1e9 for x in _column(getattr(mem, f), index, n)]
          for f in ("params", "grads", "optimizer", "activations", "fragmentation")}
    total = [x / 1e9 for x in _column(mem.total, index, n)]
    lat, fwd, bwd, it, opt, p2p = (_column(a, index, n) for a in (
        costs.latency_s, costs.fwd.total, costs.bwd.total, costs.iteration_s,
        costs.optimizer_s, costs.fwd.p2p + costs.bwd.p2p))
    out = []
    for k in range(len(index)):
        config = StageConfig(cols["tp"][k], cols["cp"][k], cols["ep"][k], cols["pp"][k],
                             cols["dp"][k], cols["zero"][k], RECOMPUTE_CODES[cols["recompute"][k]],
                             bool(cols["offload"][k]), cols["micro_batch"][k],
                             cols["recompute_layers"][k] or None, cols["expert_tp"][k] or None,
                             bool(cols["a2a_overlap"][k]))
        breakdown = MemoryBreakdown(gb["params"][k], gb["grads"][k], gb["optimizer"][k],
                                    gb["activations"][k], gb["fragmentation"][k])
        out.append(PartialPlan(config, lat[k], fwd[k], bwd[k], it[k], total[k], breakdown,
                               (config.tp, config.cp, config.dp), subs[k],
                               caps[k] if caps is not None else 0, opt[k], p2p[k]))
    return out
