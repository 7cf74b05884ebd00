"""Cost model of one pipeline stage on a homogeneous island, vectorized over configurations.

:func:`stage_costs` returns, for every configuration of a :class:`~solver.cost.stage.ConfigArrays`,
the per-micro-batch forward and backward time of the stage, its per-iteration terms (exposed
data-parallel gradient synchronisation, optimizer step) and its peak per-GPU memory.

A stage with ``pp > 1`` runs as a 1F1B pipeline of ``pp`` sub-stages inside the island (Narayanan
et al., SC'21): layers are split as evenly as possible, extra layers going to middle sub-stages
first, then to the first (the embedding is cheap, the LM head is not). The stage's latency is its
bottleneck sub-stage's; its memory is the most loaded sub-stage's. Sub-stage ``j`` holds
``min(in_flight + pp - 1 - j, n_micro)`` micro-batches of activations (``in_flight`` is what the
last sub-stage holds); GPipe holds all ``n_micro``; with the interleaved schedule (``v`` chunks,
each ``1/v`` of the sub-stage's activations) sub-stage ``j`` of a ``P``-deep pipeline runs
``2 (P - j - 1) + (v - 1) P`` warm-up forward chunks before its first backward (Megatron's
schedule), so it holds ``min(2 (P - j - 1) + (v - 1) P + 1, n v) / v`` micro-batches (the
simulator's peak, chunk for chunk: ``tests/schedule``).

Per iteration (Rajbhandari et al. 2020; the Scaling Book, seeds/004): without ZeRO the fp32
gradients are all-reduced over the ``dp * cp`` replicas; with ZeRO-1 they are reduce-scattered
once and the 16-bit weights all-gathered after the step (Megatron's distributed optimizer keeps a
full fp32 gradient buffer for that); ZeRO-2 shards the gradients, so it must reduce-scatter them
every micro-batch (DeepSpeed ``overlap_comm``, FSDP ``SHARD_GRAD_OP``); ZeRO-3 also gathers the
weights every micro-batch. Data-parallel collectives run on NVLink inside a node and on ``k``
rails across nodes (:meth:`~solver.cost.efficiency.Links.data_parallel`).

What overlaps is the framework's (:mod:`solver.cost.runtime.frameworks`), scheduled bucket by bucket:
with ``overlap_grad_reduce`` the gradient collective of each bucket starts when its gradients
are final during the last micro-batch's backward pass, so it hides behind that pass except for
the last bucket (``max(c - w (1 - 1/nb), c / nb)`` for collective ``c``, window ``w``, ``nb``
buckets); with ``overlap_param_gather`` the weight all-gather hides likewise behind the next
forward pass. ZeRO-2/3 per-micro-batch collectives hide the same way behind every pass. Without
overlap (Megatron-LM 2021) everything is exposed. The Adam step is memory-bound:
``optimizer_bytes`` per locally updated parameter through HBM. Offload copies overlap with the
compute of the same pass (separate copy engines); only the excess is exposed.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, fields

import numpy as np

from solver.cost.a2a_overlap import a2a_overlap_hidden, held_micro_batches
from solver.cost.efficiency import (
    DEFAULT_CALIBRATION,
    AttentionKernel,
    Calibration,
    GemmKernel,
    Links,
)
from solver.cost.fp8_casts import cast_bytes
from solver.cost.runtime.frameworks import Runtime
from solver.cost.memory import (MemoryArrays, stored_bytes_per_token, stored_layer_bytes,
                                substage_memory)
from solver.cost.stage import (ConfigArrays, ModelSlice, light_middle, recomputed_layers,
                               split_layers, substage_layers)
from solver.cost.sync import _zero_and_sync
from solver.cost.timing import (
    Components,
    TimeInputs,
    embedding_times,
    head_times,
    layer_times,
    p2p_time,
    tokens_per_gpu,
)
from solver.spec.domain import Framework, Island, ModelSpec, Precision, Schedule


@dataclass(frozen=True)
class PipelineSetting:
    """How the stage sits in the pipeline.

    Attributes
    ----------
    n_micro : int | numpy.ndarray
        Micro-batches per iteration.
    in_flight : int | numpy.ndarray
        Micro-batches of activations the stage's last sub-stage holds (1F1B: stages after + 1).
    schedule : Schedule
        Pipeline schedule.
    virtual_stages : int
        Model chunks per sub-stage for the interleaved schedule (1 otherwise).
    """

    n_micro: int | np.ndarray = 1
    in_flight: int | np.ndarray = 1
    schedule: Schedule = Schedule.ONE_F_ONE_B
    virtual_stages: int = 1


@dataclass(frozen=True)
class SubStageCosts:
    """Costs of one sub-stage (arrays over configurations).

    Attributes
    ----------
    fwd, bwd : Components
        Per-micro-batch forward and backward seconds by cause.
    memory : MemoryArrays
        Per-GPU memory (bytes).
    dp_s, optimizer_s : numpy.ndarray
        Per-iteration exposed gradient synchronisation and optimizer step (s).
    edge_s : numpy.ndarray
        Per-iteration all-to-all the MoE overlap leaves exposed: the first forward's and the
        last backward's (:mod:`solver.cost.a2a_overlap`; 0 without it).
    """

    fwd: Components
    bwd: Components
    memory: MemoryArrays
    dp_s: np.ndarray
    optimizer_s: np.ndarray
    edge_s: np.ndarray | float = 0.0

    @property
    def latency(self) -> np.ndarray:
        """Forward plus backward seconds per micro-batch."""
        return self.fwd.total + self.bwd.total

    def where(self, mask: np.ndarray, other: "SubStageCosts") -> "SubStageCosts":
        """``self`` where ``mask`` else ``other``."""
        mem = MemoryArrays(**{f.name: np.where(mask, getattr(self.memory, f.name),
                                               getattr(other.memory, f.name))
                              for f in fields(MemoryArrays)})
        return SubStageCosts(self.fwd.where(mask, other.fwd), self.bwd.where(mask, other.bwd), mem,
                             np.where(mask, self.dp_s, other.dp_s),
                             np.where(mask, self.optimizer_s, other.optimizer_s),
                             np.where(mask, self.edge_s, other.edge_s))


@dataclass(frozen=True)
class StageCosts:
    """What :func:`stage_costs` returns (arrays over configurations).

    Attributes
    ----------
    fwd, bwd : Components
        Per-micro-batch forward / backward seconds of the bottleneck sub-stage, by cause.
    latency_s : numpy.ndarray
        Bottleneck sub-stage forward + backward seconds per micro-batch.
    dp_s, optimizer_s : numpy.ndarray
        Exposed gradient synchronisation and optimizer seconds per iteration (slowest sub-stage).
    memory : MemoryArrays
        Per-GPU bytes of the most loaded sub-stage.
    host_bytes : numpy.ndarray
        Offloaded activation bytes per GPU in host memory (largest over sub-stages).
    edge_s : numpy.ndarray | float
        The largest :attr:`SubStageCosts.edge_s` over the sub-stages.
    """

    fwd: Components
    bwd: Components
    latency_s: np.ndarray
    dp_s: np.ndarray
    optimizer_s: np.ndarray
    memory: MemoryArrays
    host_bytes: np.ndarray
    edge_s: np.ndarray | float = 0.0

    @property
    def iteration_s(self) -> np.ndarray:
        """Per-iteration seconds outside the pipeline: exposed DP sync, optimizer step and the
        MoE overlap's exposed all-to-alls."""
        return self.dp_s + self.optimizer_s + self.edge_s

    def fits(self, cap_bytes: float, calib: Calibration) -> np.ndarray:
        """Device memory within ``cap_bytes`` (the usable bytes,
        :func:`~solver.cost.reserve.usable_bytes`) and offloaded activations within the host
        budget ``calib.host_offload_gb``."""
        return ((self.memory.total <= cap_bytes)
                & (self.host_bytes <= calib.host_offload_gb * 1e9))


def _time_inputs(model: ModelSpec, island: Island, seq_len: int, calib: Calibration,
                 runtime: Runtime) -> TimeInputs:
    """What timing needs: the island's weakest GPU at the precision it runs, its kernels."""
    gpu, prec = island.gpu, runtime.precision
    sixteen = island.tflops_per_gpu * 1e12
    peak = sixteen * gpu.peak_tflops(prec) / gpu.peak_tflops(Precision.BF16)
    fused = attention_fused(island, calib, runtime)
    attention = min(g.attention_eff for g in island.gpu_types) if fused else None
    fp8 = _fp8(island, runtime)
    # The LM head stays 16-bit under FP8 (TimeInputs.head_gemm).
    head = GemmKernel.of(island, Precision.BF16, calib) if fp8 else None
    return TimeInputs(model, seq_len, peak, sixteen, GemmKernel.of(island, prec, calib), attention,
                      Links.of(island, calib), calib, runtime.profile, runtime.overlap, head,
                      cast_bytes(island, prec, fp8), runtime.grad_bytes,
                      fp8 and runtime.fp8_param_gather, runtime.cross_entropy)


def attention_fused(island: Island, calib: Calibration, runtime: Runtime) -> bool:
    """Whether the stage runs a fused attention kernel (FlashAttention: no stored scores)."""
    return (calib.attention is AttentionKernel.FLASH and not runtime.profile.unfused_attention
            and all(g.attention != "unfused" for g in island.gpu_types))


def _fp8(island: Island, runtime: Runtime) -> bool:
    """The stage runs FP8 GEMMs (asked for, and every GPU of the island has them)."""
    return all(g.runs_fp8(runtime.precision) for g in island.gpu_types)


def substage_costs(ti: TimeInputs, cfg: ConfigArrays, layers: np.ndarray, emb: np.ndarray,
                   head: np.ndarray, in_flight: np.ndarray, p2p_factor: float,
                   fp8: bool = False) -> SubStageCosts:
    """Costs of a sub-stage with ``layers`` layers (plus embedding/head flags), all broadcast."""
    layers = np.asarray(layers)
    share = recomputed_layers(cfg, layers) / np.maximum(layers, 1)
    lf, lb = layer_times(ti, cfg, share)
    a2a = a2a_overlap_hidden(ti, cfg, tokens_per_gpu(cfg, ti.seq_len), lf, lb) * layers
    ef, eb = embedding_times(ti, cfg)
    hf, hb = head_times(ti, cfg)
    fwd = lf.scaled(layers).plus(ef.scaled(emb)).plus(hf.scaled(head))
    bwd = lb.scaled(layers).plus(eb.scaled(emb)).plus(hb.scaled(head))
    p2p = p2p_time(ti, cfg) * p2p_factor
    bwd_work = bwd.compute + bwd.recompute
    # The interleaved schedule's v chunks cross v boundaries and sync chunk by chunk.
    z_fwd, z_bwd, dp_s, optimizer = _zero_and_sync(ti, cfg, layers, emb, head, fwd.compute,
                                                   bwd_work, share, p2p_factor)
    flash = ti.attention_eff is not None
    cf = ti.calib.moe_capacity_factor
    stored = (stored_layer_bytes(stored_bytes_per_token(ti.model, ti.seq_len, flash, cf), cfg,
                                 layers) * tokens_per_gpu(cfg, ti.seq_len) / cfg.tp)
    copy = np.where(cfg.offload, stored / ti.links.pcie_bw, 0.0)
    hidden = 1.0 if ti.overlap else 0.0  # copy engines run beside the compute of the pass
    # Interleaved Megatron: a pass's transfers run under the other pass's compute.
    behind = 1.0 if ti.profile.overlap_p2p and p2p_factor > 1 else 0.0
    fwd = Components(fwd.compute, fwd.recompute, fwd.tp, fwd.cp, fwd.ep - a2a / 2, z_fwd,
                     np.maximum(copy - hidden * fwd.compute, 0.0),
                     np.maximum(p2p - behind * bwd_work, 0.0))
    bwd = Components(bwd.compute, bwd.recompute, bwd.tp, bwd.cp, bwd.ep - a2a / 2, z_bwd,
                     np.maximum(copy - hidden * bwd_work, 0.0),
                     np.maximum(p2p - behind * fwd.compute, 0.0))
    per_module = ti.profile.framework is Framework.DEEPSPEED
    in_flight = held_micro_batches(cfg, in_flight, layers)
    memory = substage_memory(ti.model, ti.seq_len, cfg, layers, emb, head, in_flight,
                             ti.calib.offload_resident, flash, per_module, fp8, cf,
                             ti.grad_bytes, ti.fp8_params,
                             ti.loss.held_bytes_per_logit)
    # The overlap's exposed all-to-alls: the first forward and last backward alone without
    # pipelining; ``pp`` times a rank's share interleaved (solver.cost.a2a_overlap).
    return SubStageCosts(fwd, bwd, memory, dp_s, optimizer, a2a * cfg.pp)


def in_flight_of(pipe: PipelineSetting, pp: np.ndarray, j: np.ndarray) -> np.ndarray:
    """Micro-batches of activations sub-stage ``j`` of ``pp`` holds (see the module docstring)."""
    if pipe.schedule is Schedule.GPIPE:
        return np.broadcast_to(np.asarray(pipe.n_micro, dtype=float), np.shape(pp)).copy()
    if pipe.schedule is Schedule.INTERLEAVED and pipe.virtual_stages > 1:
        v = pipe.virtual_stages
        depth = pp + pipe.in_flight - 1  # sub-stages of the whole pipeline
        behind = depth - 1 - j
        chunks = np.minimum(2 * behind + (v - 1) * depth + 1, pipe.n_micro * v)
        return np.asarray(chunks, dtype=float) / v
    return np.minimum(pipe.in_flight + pp - 1 - j, pipe.n_micro).astype(float)


def _p2p_factor(pipe: PipelineSetting) -> float:
    """Interleaving sends every micro-batch across ``v`` times as many boundaries."""
    return float(pipe.virtual_stages) if pipe.schedule is Schedule.INTERLEAVED else 1.0


def stage_costs(slc: ModelSlice, island: Island, seq_len: int, cfg: ConfigArrays,
                pipe: PipelineSetting = PipelineSetting(),
                calib: Calibration = DEFAULT_CALIBRATION,
                runtime: Runtime = Runtime()) -> StageCosts:
    """Per-micro-batch time, per-iteration terms and peak memory of every configuration.

    Parameters
    ----------
    slc : ModelSlice
        The layers (and embedding/head) the stage runs.
    island : Island
        The GPUs (effective, weakest-member values).
    seq_len : int
        Tokens per sequence.
    cfg : ConfigArrays
        Configurations; ``tp * cp * pp * dp`` need not equal the island size here (callers check).
    pipe : PipelineSetting
        Micro-batches, activations in flight and schedule.
    calib : Calibration
        Efficiency constants.
    runtime : Runtime
        Framework (what overlaps) and precision.
    """
    ti = _time_inputs(slc.model, island, seq_len, calib, runtime)
    fp8 = _fp8(island, runtime)
    pp = np.asarray(cfg.pp)
    if not np.any(pp > 1):  # one sub-stage: no representatives to combine
        one = substage_costs(ti, cfg, np.asarray(slc.layers), np.asarray(slc.has_embedding),
                             np.asarray(slc.has_head), in_flight_of(pipe, pp, np.zeros_like(pp)),
                             _p2p_factor(pipe), fp8)
        one = one.where(np.ones(len(cfg), dtype=bool), one)  # every field as long as cfg
        return StageCosts(one.fwd, one.bwd, one.latency, one.dp_s, one.optimizer_s, one.memory,
                          one.memory.host, one.edge_s)
    first, second, last = split_layers(slc.layers, pp)
    light, light_at, has_light = light_middle(slc.layers, pp)
    only = pp == 1
    factor = _p2p_factor(pipe)
    none = np.asarray(False)
    s0 = substage_costs(ti, cfg, first, np.asarray(slc.has_embedding),
                        slc.has_head & only, in_flight_of(pipe, pp, np.zeros_like(pp)), factor,
                        fp8)
    s1 = substage_costs(ti, cfg, second, none, none, in_flight_of(pipe, pp, np.ones_like(pp)),
                        factor, fp8)
    s1b = substage_costs(ti, cfg, light, none, none, in_flight_of(pipe, pp, light_at), factor,
                         fp8)
    s2 = substage_costs(ti, cfg, last, none, np.asarray(slc.has_head),
                        in_flight_of(pipe, pp, pp - 1), factor, fp8)
    reps = [(s0, np.ones_like(only)), (s1, pp >= 3), (s1b, has_light), (s2, pp >= 2)]
    return _combine(reps)


def _pick(reps: list[tuple[SubStageCosts, np.ndarray]], key) -> SubStageCosts:
    """The representative with the largest ``key`` among the valid ones, per configuration."""
    best, best_val = reps[0][0], key(reps[0][0])
    for rep, valid in reps[1:]:
        val = np.where(valid, key(rep), -np.inf)
        better = val > best_val
        best, best_val = rep.where(better, best), np.where(better, val, best_val)
    return best


def _combine(reps: list[tuple[SubStageCosts, np.ndarray]]) -> StageCosts:
    slow = _pick(reps, lambda r: r.latency)
    heavy = _pick(reps, lambda r: r.memory.total)
    sync = _pick(reps, lambda r: r.dp_s + r.optimizer_s)
    host = _pick(reps, lambda r: r.memory.host).memory.host
    edge = _pick(reps, lambda r: r.edge_s).edge_s  # the upper bound the simulator checks
    return StageCosts(slow.fwd, slow.bwd, slow.latency, sync.dp_s, sync.optimizer_s, heavy.memory,
                      host, edge)


def island_substage_memory(model: ModelSpec, island: Island, seq_len: int, cfg: ConfigArrays,
                           layers: np.ndarray, emb: np.ndarray, head: np.ndarray,
                           in_flight: np.ndarray, calib: Calibration = DEFAULT_CALIBRATION,
                           runtime: Runtime = Runtime()) -> MemoryArrays:
    """:func:`~solver.cost.memory.substage_memory` of a sub-stage on ``island`` under
    ``runtime`` (its attention kernel, FP8 and ZeRO-3 gathering, as :func:`stage_costs`)."""
    ti = _time_inputs(model, island, seq_len, calib, runtime)
    in_flight = held_micro_batches(cfg, in_flight, layers)
    return substage_memory(model, seq_len, cfg, layers, emb, head, in_flight,
                           calib.offload_resident, ti.attention_eff is not None,
                           runtime.framework is Framework.DEEPSPEED, _fp8(island, runtime),
                           calib.moe_capacity_factor, ti.grad_bytes, ti.fp8_params,
                           ti.loss.held_bytes_per_logit)


def in_flight_capacity(slc: ModelSlice, island: Island, seq_len: int, cfg: ConfigArrays,
                       costs: StageCosts, n_micro: int, cap_bytes: float,
                       calib: Calibration = DEFAULT_CALIBRATION,
                       runtime: Runtime = Runtime()) -> np.ndarray:
    """Most micro-batches in flight each single-sub-stage (``pp = 1``) configuration can hold
    within ``cap_bytes`` (the usable bytes) and the host offload budget, capped at ``n_micro``
    (0: never fits).

    ``costs`` are the configurations' costs at one micro-batch in flight. Memory is affine in the
    in-flight count (activations scale with it, offload keeps ``offload_resident`` in HBM and
    the rest on the host), so two evaluations give it exactly: ``m(h) = m(1) + (h − 1)·Δ``.
    """
    two = island_substage_memory(slc.model, island, seq_len, cfg, np.asarray(slc.layers),
                                 np.asarray(slc.has_embedding), np.asarray(slc.has_head),
                                 np.asarray(2.0), calib, runtime)
    hbm_limit = cap_bytes
    host_limit = calib.host_offload_gb * 1e9
    out = np.full(np.shape(costs.memory.total), float(n_micro))
    for one, slope, limit in ((costs.memory.total, two.total - costs.memory.total, hbm_limit),
                              (costs.host_bytes, two.host - costs.host_bytes, host_limit)):
        with np.errstate(divide="ignore", invalid="ignore"):
            extra = np.where(slope > 0, np.floor((limit - one) / np.where(slope > 0, slope, 1.0)),
                             np.inf)
        out = np.minimum(out, np.where(one <= limit, 1.0 + extra, 0.0))
    return np.clip(out, 0, n_micro).astype(np.int64)


def substage_latencies(slc: ModelSlice, island: Island, seq_len: int, cfg: ConfigArrays,
                       pipe: PipelineSetting = PipelineSetting(),
                       calib: Calibration = DEFAULT_CALIBRATION,
                       runtime: Runtime = Runtime()) -> list[tuple[float, ...]]:
    """Per-micro-batch latency of every internal sub-stage, in order, for each configuration.

    All (configuration, sub-stage) pairs are evaluated in one vectorized call.
    """
    n = len(cfg)
    pps = np.broadcast_to(cfg.pp, (n,))
    owner = np.repeat(np.arange(n), pps)
    j = np.concatenate([np.arange(p) for p in pps])
    layers = np.concatenate([substage_layers(slc.layers, int(p)) for p in pps])
    pp = pps[owner]
    emb = (j == 0) & slc.has_embedding
    head = (j == pp - 1) & slc.has_head
    per_pair = dataclasses.replace(
        pipe, n_micro=np.broadcast_to(pipe.n_micro, (n,))[owner],
        in_flight=np.broadcast_to(pipe.in_flight, (n,))[owner])
    ti = _time_inputs(slc.model, island, seq_len, calib, runtime)
    sub = substage_costs(ti, cfg.take(owner), layers, emb, head, in_flight_of(per_pair, pp, j),
                         _p2p_factor(pipe), _fp8(island, runtime))
    lat = np.broadcast_to(sub.latency, owner.shape)
    bounds = np.concatenate([[0], np.cumsum(pps)])
    return [tuple(float(x) for x in lat[bounds[i]:bounds[i + 1]]) for i in range(n)]

