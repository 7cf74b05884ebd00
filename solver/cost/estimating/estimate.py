"""Iteration time, throughput and memory of one fixed homogeneous parallel configuration.

The engine behind ``tangram estimate`` and the Megatron calibration. A homogeneous pipeline of
``p`` equal stages with ``m`` micro-batches takes ``(m + p - 1) t`` (1F1B and GPipe) or
``(m + (p - 1) / v) t`` (interleaved 1F1B with ``v`` model chunks per GPU; Narayanan et al., SC'21,
Sec. 2.2), where ``t`` is the bottleneck stage's forward + backward time per micro-batch, plus the
exposed data-parallel gradient synchronisation and the optimizer step.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from solver.cost.efficiency import DEFAULT_CALIBRATION, Calibration
from solver.cost.reserve import usable_bytes
from solver.cost.stage import ConfigArrays, ModelSlice, StageConfig
from solver.cost.flops import model_flops_per_token
from solver.cost.stage_costs import PipelineSetting, StageCosts, stage_costs
from solver.cost.runtime.frameworks import Runtime
from solver.spec.domain import (CrossEntropyKernel, Framework, Island, ModelSpec, Precision,
                               Schedule)


@dataclass(frozen=True)
class EstimateSetup:
    """A training job on one homogeneous island with a fixed parallel configuration.

    Attributes
    ----------
    model : ModelSpec
        The model.
    island : Island
        The GPUs.
    global_batch : int
        Sequences per iteration.
    seq_len : int
        Tokens per sequence.
    parallel : StageConfig
        Degrees, ZeRO, recomputation, offload; its ``micro_batch`` is used unless
        ``auto_micro_batch``.
    auto_micro_batch : bool
        Choose the fastest micro-batch (a divisor of ``global_batch / dp``) that fits.
    schedule : Schedule
        Pipeline schedule.
    virtual_stages : int
        Model chunks per GPU for the interleaved schedule (1 otherwise).
    epsilon : float
        The user's memory margin: a configuration fits when its count is within the usable bytes,
        ``(1 - epsilon)`` of the device's memory less the runtime's reserves
        (:func:`~solver.cost.reserve.usable_bytes`; default 0), and its offloaded activations
        fit the host budget of the calibration.
    framework : Framework
        Training runtime (what overlaps; default Megatron-Core).
    precision : Precision
        GEMM precision.
    auto_virtual_stages : bool
        Choose the fastest fitting number of model chunks ``v`` (``virtual_stages = "auto"``):
        ``v = 1`` is plain 1F1B, ``v >= 2`` the interleaved schedule, Megatron's rules applied
        (layers divisible by ``pp v``, micro-batches by ``pp``).
    grad_reduce_bf16, fp8_param_gather : bool
        Gradient buffers in bf16 and FP8 weights as the parameters
        (:class:`~solver.cost.runtime.frameworks.Runtime`).
    cross_entropy : CrossEntropyKernel
        The loss kernel.
    """

    model: ModelSpec
    island: Island
    global_batch: int
    seq_len: int
    parallel: StageConfig
    auto_micro_batch: bool = False
    schedule: Schedule = Schedule.ONE_F_ONE_B
    virtual_stages: int = 1
    epsilon: float = 0.0
    framework: Framework = Framework.MEGATRON_CORE
    precision: Precision = Precision.BF16
    auto_virtual_stages: bool = False
    grad_reduce_bf16: bool = False
    fp8_param_gather: bool = False
    cross_entropy: CrossEntropyKernel = CrossEntropyKernel.UNFUSED

    @property
    def runtime(self) -> Runtime:
        """Framework, precision, gradient buffers, weights and loss kernel."""
        return Runtime(self.framework, self.precision, grad_reduce_bf16=self.grad_reduce_bf16,
                       fp8_param_gather=self.fp8_param_gather, cross_entropy=self.cross_entropy)


@dataclass(frozen=True)
class Breakdown:
    """Seconds per iteration by cause (they sum to the iteration time).

    Attributes
    ----------
    compute, recompute, tp_comm, cp_comm, ep_comm, dp_comm, optimizer, offload : float
        Steady-state pipeline time by cause (``m`` micro-batches of the bottleneck stage);
        ``dp_comm`` includes ZeRO-3 gathers and the exposed per-iteration gradient sync.
    pp_bubble : float
        Pipeline fill and drain, plus point-to-point transfers between stages.
    """

    compute: float
    recompute: float
    tp_comm: float
    cp_comm: float
    ep_comm: float
    pp_bubble: float
    dp_comm: float
    optimizer: float
    offload: float


@dataclass(frozen=True)
class Transfer:
    """Seconds per iteration of one kind of communication.

    Attributes
    ----------
    total_s : float
        All of it, as if nothing overlapped.
    exposed_s : float
        What the framework's schedule leaves on the critical path.
    """

    total_s: float
    exposed_s: float


@dataclass(frozen=True)
class Communication:
    """Each communication term of the bottleneck stage per iteration, total and exposed.

    Attributes
    ----------
    tp, cp, ep : Transfer
        Tensor-, context- and expert-parallel collectives.
    dp : Transfer
        Data-parallel gradient / weight synchronisation and ZeRO-2/3 collectives.
    pp : Transfer
        Point-to-point transfers between pipeline stages.
    """

    tp: Transfer
    cp: Transfer
    ep: Transfer
    dp: Transfer
    pp: Transfer


@dataclass(frozen=True)
class MemoryReport:
    """Per-GPU memory of the most loaded GPU, GB (10^9 bytes).

    Attributes
    ----------
    params, grads, optimizer, activations, fragmentation, total : float
        Weights, gradients, optimizer states, activations, the allocator's fragmentation of
        them (:data:`~solver.cost.reserve.FRAGMENTATION`) and their sum.
    """

    params: float
    grads: float
    optimizer: float
    activations: float
    fragmentation: float
    total: float


@dataclass(frozen=True)
class Estimate:
    """Result of :func:`estimate`.

    Attributes
    ----------
    config : StageConfig
        The configuration evaluated (with the chosen micro-batch).
    n_micro : int
        Micro-batches per iteration per pipeline.
    iteration_time_s, tokens_per_s : float
        Seconds per iteration and trained tokens per second.
    tflops_per_gpu : float
        Model FLOPs (no recomputation) per GPU per second, in TFLOP/s.
    mfu : float
        ``tflops_per_gpu`` over the GPU's 16-bit peak (the convention for mixed FP8 runs too,
        whose attention and LM head stay 16-bit).
    fits : bool
        Peak memory within the usable bytes (:func:`~solver.cost.reserve.usable_bytes`).
    memory : MemoryReport
        Memory of the most loaded GPU.
    breakdown : Breakdown
        Iteration time by cause.
    communication : Communication | None
        Each communication term, total and exposed.
    virtual_stages : int
        Model chunks per GPU of the estimate (1: not interleaved).
    mfu_fp8 : float | None
        ``tflops_per_gpu`` over the GPU's FP8 peak where its GEMMs run FP8 (None otherwise).
    """

    config: StageConfig
    n_micro: int
    iteration_time_s: float
    tokens_per_s: float
    tflops_per_gpu: float
    mfu: float
    fits: bool
    memory: MemoryReport
    breakdown: Breakdown
    communication: Communication | None = None
    virtual_stages: int = 1
    mfu_fp8: float | None = None

    def to_json(self) -> dict:
        """The public ``tangram estimate --json`` object."""
        return {
            "iteration_time_s": self.iteration_time_s, "tokens_per_s": self.tokens_per_s,
            "tflops_per_gpu": self.tflops_per_gpu, "mfu": self.mfu,
            "micro_batch": self.config.micro_batch, "fits": self.fits,
            "memory_gb": dataclasses.asdict(self.memory),
            "breakdown": dataclasses.asdict(self.breakdown),
            "communication": (dataclasses.asdict(self.communication)
                              if self.communication else None),
            "virtual_stages": self.virtual_stages, "mfu_fp8": self.mfu_fp8,
        }


def micro_batch_candidates(setup: EstimateSetup) -> list[int]:
    """Micro-batches to evaluate: all divisors of the per-replica batch, or the given one."""
    if not setup.auto_micro_batch:
        return [setup.parallel.micro_batch]
    per_replica = setup.global_batch // setup.parallel.dp
    return [b for b in range(1, per_replica + 1) if per_replica % b == 0]


def _bubble_stages(setup: EstimateSetup) -> float:
    """Fill/drain length in micro-batch times: ``p - 1``, or ``(p - 1) / v`` interleaved."""
    p = setup.parallel.pp
    if setup.schedule is Schedule.INTERLEAVED:
        return (p - 1) / setup.virtual_stages
    return float(p - 1)


def _evaluate(setup: EstimateSetup, calib: Calibration, overlap: bool = True
              ) -> tuple[ConfigArrays, StageCosts, np.ndarray, np.ndarray]:
    """Costs of every micro-batch candidate: configs, costs, n_micro and iteration time
    (infinite where the interleaved schedule's ``n_micro % pp == 0`` rule fails)."""
    configs = [dataclasses.replace(setup.parallel, micro_batch=b)
               for b in micro_batch_candidates(setup)]
    cfg = ConfigArrays.of(configs)
    n_micro = setup.global_batch // (setup.parallel.dp * cfg.micro_batch)
    pipe = PipelineSetting(n_micro, 1, setup.schedule, setup.virtual_stages)
    runtime = dataclasses.replace(setup.runtime, overlap=overlap)
    costs = stage_costs(ModelSlice.whole(setup.model), setup.island, setup.seq_len, cfg, pipe,
                        calib, runtime)
    time = (n_micro + _bubble_stages(setup)) * costs.latency_s + costs.iteration_s
    if setup.schedule is Schedule.INTERLEAVED:
        time = np.where(n_micro % setup.parallel.pp == 0, time, np.inf)
    return cfg, costs, n_micro, time


def chunk_options(setup: EstimateSetup) -> list[tuple[Schedule, int]]:
    """(schedule, v) pairs ``virtual_stages = "auto"`` tries: plain 1F1B, and every ``v >= 2``
    that splits the layers evenly, ``layers % (pp v) == 0`` (Megatron's
    ``--num-layers-per-virtual-pipeline-stage``), or with one layer fewer on the first and last
    stages, ``(layers + 2) % (pp v) == 0`` (``--decoder-first/last-pipeline-num-layers``, as the
    Llama 3 405B run did)."""
    pp, layers = setup.parallel.pp, setup.model.layers
    out = [(Schedule.ONE_F_ONE_B, 1)]
    if pp > 1:
        out += [(Schedule.INTERLEAVED, v) for v in range(2, layers // pp + 1)
                if layers % (pp * v) == 0 or (pp > 2 and (layers + 2) % (pp * v) == 0)]
    return out


def estimate(setup: EstimateSetup, calib: Calibration = DEFAULT_CALIBRATION) -> Estimate:
    """Evaluate the setup; with ``auto_micro_batch`` the fastest fitting micro-batch wins (or,
    when none fits, the one using the least memory, reported with ``fits = False``); with
    ``auto_virtual_stages`` likewise over :func:`chunk_options`."""
    if setup.auto_virtual_stages:
        # With pipeline stages the MoE all-to-all overlap runs interleaved only (its rule).
        plain = not (setup.parallel.a2a_overlap and setup.parallel.pp > 1)
        tries = [estimate(dataclasses.replace(setup, schedule=sched, virtual_stages=v,
                                              auto_virtual_stages=False), calib)
                 for sched, v in chunk_options(setup) if plain or v > 1]
        return min(tries, key=lambda e: (not e.fits, e.iteration_time_s, e.memory.total))
    cfg, costs, n_micro, time = _evaluate(setup, calib)
    total = costs.memory.total
    fits = costs.fits(usable_bytes(setup.island, setup.epsilon), calib) & np.isfinite(time)
    i = int(np.argmin(np.where(fits, time, np.inf))) if fits.any() else int(np.argmin(total))
    _, raw, _, _ = _evaluate(setup, calib, overlap=False)
    comm = _communication(setup, costs, raw, i, int(n_micro[i]))
    return _report(setup, cfg.config(i), costs, i, int(n_micro[i]), float(time[i]),
                   bool(fits[i]), comm)


def _communication(setup: EstimateSetup, costs: StageCosts, raw: StageCosts, i: int,
                   m: int) -> Communication:
    """Per-iteration communication of candidate ``i``: ``raw`` (nothing overlapped) against
    ``costs`` (as scheduled)."""
    def term(c: StageCosts, name: str) -> float:
        return m * float(getattr(c.fwd, name)[i] + getattr(c.bwd, name)[i])

    def pair(name: str) -> Transfer:
        return Transfer(term(raw, name), term(costs, name))

    dp = Transfer(term(raw, "zero") + float(raw.dp_s[i]),
                  term(costs, "zero") + float(costs.dp_s[i]))
    ep = Transfer(term(raw, "ep"), term(costs, "ep") + _edge(costs, i))
    return Communication(pair("tp"), pair("cp"), ep, dp, pair("p2p"))


def _edge(costs: StageCosts, i: int) -> float:
    """The MoE overlap's per-iteration exposed all-to-alls of candidate ``i``."""
    return float(np.broadcast_to(costs.edge_s, np.shape(costs.latency_s))[i])


def _report(setup: EstimateSetup, config: StageConfig, costs: StageCosts, i: int, m: int,
            time: float, fits: bool, comm: Communication | None = None) -> Estimate:
    tokens = setup.global_batch * setup.seq_len
    gpus = setup.island.gpus
    tflops = model_flops_per_token(setup.model, setup.seq_len) * tokens / time / gpus / 1e12
    mem = costs.memory
    memory = MemoryReport(*(float(getattr(mem, k)[i]) / 1e9
                            for k in ("params", "grads", "optimizer", "activations",
                                      "fragmentation", "total")))
    f, b = costs.fwd, costs.bwd

    def per_iter(name: str) -> float:
        return m * float(getattr(f, name)[i] + getattr(b, name)[i])

    breakdown = Breakdown(
        compute=per_iter("compute"), recompute=per_iter("recompute"), tp_comm=per_iter("tp"),
        cp_comm=per_iter("cp"), ep_comm=per_iter("ep") + _edge(costs, i),
        pp_bubble=_bubble_stages(setup) * float(costs.latency_s[i]) + per_iter("p2p"),
        dp_comm=per_iter("zero") + float(costs.dp_s[i]),
        optimizer=float(costs.optimizer_s[i]), offload=per_iter("offload"))
    v = setup.virtual_stages if setup.schedule is Schedule.INTERLEAVED else 1
    gpu = setup.island.gpu
    fp8 = tflops / gpu.fp8_tflops if gpu.runs_fp8(setup.precision) else None
    return Estimate(config, m, time, tokens / time, tflops, tflops / setup.island.tflops_per_gpu,
                    fits, memory, breakdown, comm, v, fp8)
