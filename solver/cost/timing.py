"""Per-micro-batch time of one Transformer layer, the embedding and the LM head, vectorized.

Compute (Narayanan et al., SC'21, Sec. 5.1 FLOP count): per token and layer the forward pass does
``2 x`` (active matmul weights) FLOPs in GEMMs plus ``4 s a d_head`` in the attention core (the full
square, Megatron's count); the backward pass twice the forward. GEMMs run at the size-dependent
efficiency of :class:`solver.cost.efficiency.GemmKernel` below the GPU's own ceiling, at the
precision the GPU runs (FP8 where it has it and the job asks for it), plus a fixed cost per
GEMM kernel (one per projection and pass, and per local expert: :func:`_routed_gemm_fwd`); the
attention core executes the full square at ``unfused_attention_eff`` (unfused kernels:
Megatron-LM 2021, or a GPU without a fused kernel, V100) or half of it, the causal triangle,
at the GPU's fused-kernel
efficiency (FlashAttention-2/3, a stand-alone figure derated by the GPU's in-training fraction
like its GEMMs), always in 16 bits; memory-bound operators move
``elementwise_bytes`` per hidden element per token through HBM (twice in backward), MoE layers
also their permutations (``MOE_PERMUTE_BYTES``; with several local experts the sort by expert,
``MOE_SORT_BYTES``). FP8 layers add Transformer Engine's casts of every GEMM operand
(:mod:`solver.cost.fp8_casts`); the LM head stays 16-bit.

Communication (the Scaling Book chapter, seeds/004; Korthikanti et al. 2022 for sequence
parallelism): per layer and pass (forward, and again backward), TP with SP does 2 all-gathers +
2 reduce-scatters of the ``n h 2``-byte activation (``n = b s / cp`` tokens per GPU); CP passes
K/V around a ring (``cp - 1`` chunks per pass, overlapped with the attention core, twice in
backward for dK/dV); EP dispatches and combines ``n k h 2 / tp`` bytes per GPU (times the
capacity factor: the busiest rank) with two all-to-alls per pass, split into the NVLink part
among the EP ranks of one node and the network part (:meth:`~solver.cost.efficiency.Links.
all_to_all`); the busiest rank's expert GEMMs see the capacity factor too. Full recomputation repeats the forward (compute and its collectives)
inside the backward pass, of every layer or, with the block method, of the recomputed ones
(:attr:`~solver.cost.stage.StageConfig.recompute_layers`); selective recomputation repeats the
attention core (and the CP ring).

TP overlap is the framework's (``solver.cost.runtime.frameworks``). Megatron-Core's
``--tp-comm-overlap`` (Transformer Engine userbuffers) splits each all-gather / reduce-scatter
into ``tp`` chunks exchanged while the GEMM that consumes or produces them runs on the chunks
already there, so only the first chunk, or what outlasts the GEMMs, stays exposed:
``max(c - g, c / tp)`` for communication ``c`` beside GEMM time ``g``. Megatron-LM 2021 and
DeepSpeed expose all of it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from solver.cost.efficiency import (
    Calibration,
    GemmKernel,
    Links,
    ring_time,
)
from solver.cost.fp8_casts import layer_cast_bytes
from solver.cost.runtime.frameworks import FrameworkProfile
from solver.cost.stage import ConfigArrays, expert_tp
from solver.spec.domain import CrossEntropyKernel, ModelSpec

MOE_PERMUTE_BYTES = 8.0   # bytes per hidden element per routed copy: permute + unpermute r/w
MOE_SORT_BYTES = 8.0      # the same for the sort by local expert and its inverse (r/w each)
#: Bytes per routed hidden element of the experts' second bias (forward, backward), added
#: outside the grouped GEMM in 16 bits (:func:`_expert_bias`): forward ``b * p`` writes 2,
#: ``t + b * p`` reads 4 and writes 2, ``torch.cat`` reads 2 and writes 2; backward the
#: gradients of ``b`` and ``p`` each write and read a product and read the gradient (6 each).
EXPERT_BIAS_BYTES = (12.0, 12.0)


@dataclass(frozen=True)
class Components:
    """Seconds of one pass (forward or backward) of one micro-batch, by cause (arrays).

    Attributes
    ----------
    compute : numpy.ndarray
        GEMMs, attention core and memory-bound operators of the pass itself.
    recompute : numpy.ndarray
        Recomputed forward work run inside the backward pass.
    tp, cp, ep : numpy.ndarray
        Exposed tensor-, context- and expert-parallel communication.
    zero : numpy.ndarray
        Exposed ZeRO-3 parameter all-gathers and gradient reduce-scatters.
    offload : numpy.ndarray
        Exposed activation copies to/from host memory.
    p2p : numpy.ndarray
        Point-to-point transfers between internal pipeline sub-stages.
    """

    compute: np.ndarray | float = 0.0
    recompute: np.ndarray | float = 0.0
    tp: np.ndarray | float = 0.0
    cp: np.ndarray | float = 0.0
    ep: np.ndarray | float = 0.0
    zero: np.ndarray | float = 0.0
    offload: np.ndarray | float = 0.0
    p2p: np.ndarray | float = 0.0

    # The field names, once: ``dataclasses.fields`` per call was a tenth of the cost model's
    # time (these run hundreds of thousands of times per plan).
    NAMES: ClassVar[tuple[str, ...]] = ("compute", "recompute", "tp", "cp", "ep", "zero",
                                        "offload", "p2p")

    @property
    def total(self) -> np.ndarray:
        """Sum of all components."""
        return sum(getattr(self, name) for name in self.NAMES)

    def scaled(self, k: np.ndarray | float) -> "Components":
        """Every component times ``k``."""
        return Components(*(getattr(self, name) * k for name in self.NAMES))

    def plus(self, other: "Components") -> "Components":
        """Component-wise sum."""
        return Components(*(getattr(self, name) + getattr(other, name) for name in self.NAMES))

    def where(self, mask: np.ndarray, other: "Components") -> "Components":
        """``self`` where ``mask`` else ``other``, component-wise."""
        return Components(*(np.where(mask, getattr(self, name), getattr(other, name))
                            for name in self.NAMES))


@dataclass(frozen=True)
class TimeInputs:
    """What the timing functions need besides the configuration.

    Attributes
    ----------
    model : ModelSpec
        Model shapes.
    seq_len : int
        Tokens per sequence.
    peak_flops : float
        Peak dense GEMM FLOP/s of one GPU at the precision it runs.
    attention_flops : float
        Peak dense 16-bit FLOP/s (the attention core never runs in FP8 here).
    gemm : GemmKernel
        How the GPU runs GEMMs (ceiling, curve, fixed cost per kernel).
    attention_eff : float | None
        Fused attention kernel efficiency (None: unfused attention).
    links : Links
        The island's bandwidths.
    calib : Calibration
        Efficiency constants.
    profile : FrameworkProfile
        What the runtime overlaps.
    overlap : bool
        Hide what the schedule hides (False: every transfer exposed, for reporting totals).
    head_gemm : GemmKernel | None
        The LM head's 16-bit GEMMs where the layers run FP8 (None: as the layers'):
        Megatron-Core's ``output_layer`` is a ``tensor_parallel.ColumnParallelLinear``, outside
        Transformer Engine's FP8 (``megatron/core/models/gpt/gpt_model.py``; an MXFP8 head is
        opt-in since May 2026, ``fp8_output_proj``).
    fp8_cast : tuple[float, float]
        HBM bytes per element of quantizing a GEMM operand to FP8, for an operand a norm kernel
        writes and for any other (:mod:`solver.cost.fp8_casts`); zeros without FP8.
    grad_bytes : float
        Bytes per parameter of the gradient buffer (:attr:`~solver.cost.runtime.frameworks.
        Runtime.grad_bytes`).
    fp8_params : bool
        The weights are stored in FP8 (``--fp8-param-gather`` with FP8 GEMMs).
    loss : CrossEntropyKernel
        The loss kernel (:attr:`~solver.cost.runtime.frameworks.Runtime.cross_entropy`).
    """

    model: ModelSpec
    seq_len: int
    peak_flops: float
    attention_flops: float
    gemm: GemmKernel
    attention_eff: float | None
    links: Links
    calib: Calibration
    profile: FrameworkProfile
    overlap: bool = True
    head_gemm: GemmKernel | None = None
    fp8_cast: tuple[float, float] = (0.0, 0.0)
    grad_bytes: float = 4.0
    fp8_params: bool = False
    loss: CrossEntropyKernel = CrossEntropyKernel.UNFUSED


def tokens_per_gpu(cfg: ConfigArrays, seq_len: int) -> np.ndarray:
    """Tokens of one micro-batch a GPU works on: ``b s / cp`` (all of them after SP gathers)."""
    return cfg.micro_batch * seq_len / cfg.cp


def _layer_gemm_fwd(ti: TimeInputs, cfg: ConfigArrays, n: np.ndarray) -> np.ndarray:
    """Forward GEMM seconds of one layer (QKV, O, MLP or router + experts + shared experts)."""
    m, tp = ti.model, cfg.tp
    h, dh = m.hidden, m.d_head

    def g(flops: np.ndarray, rows, cols, inner) -> np.ndarray:
        return ti.gemm.seconds(flops, rows, cols, inner, ti.peak_flops)

    q_dim, kv_dim = m.heads * dh, m.kv_heads * dh
    t = g(2 * n * h * (q_dim + 2 * kv_dim) / tp, n, (q_dim + 2 * kv_dim) / tp, h)
    t = t + g(2 * n * q_dim * h / tp, n, h, q_dim / tp)
    if not m.is_moe:
        return t + mlp_gemm_fwd(ti, cfg, n, m.ffn)
    t = t + g(2 * n * h * m.experts / tp, n / tp, m.experts, h)
    if m.shared_experts:
        t = t + mlp_gemm_fwd(ti, cfg, n, m.shared_experts * m.expert_ffn)
    return t + _routed_gemm_fwd(ti, cfg, n)


def mlp_gemm_fwd(ti: TimeInputs, cfg: ConfigArrays, n: np.ndarray, width: float) -> np.ndarray:
    """Forward GEMM seconds of a ``width``-wide MLP split ``tp`` ways over ``n`` tokens (the
    dense MLP, or the shared experts): up (and gate) projection, then down projection."""
    m, tp = ti.model, cfg.tp
    h, up = m.hidden, (2 if m.gated_mlp else 1)
    flops = 2 * n * h * width * (up + 1) / tp
    split = up / (up + 1)
    return (ti.gemm.seconds(flops * split, n, up * width / tp, h, ti.peak_flops)
            + ti.gemm.seconds(flops * (1 - split), n, h, width / tp, ti.peak_flops))


def _routed_gemm_fwd(ti: TimeInputs, cfg: ConfigArrays, n: np.ndarray) -> np.ndarray:
    """Forward GEMM seconds of a rank's routed experts, one GEMM kernel per expert and projection.

    A rank holds ``E / ep`` experts, each split ``etp`` ways; its expert-TP group gathers the
    routed tokens of its ``etp`` sequence shards (``n / tp`` tokens each), so each expert sees
    ``etp · n · k · ep / (tp · E)`` tokens, times the capacity factor on the busiest rank.
    Transformer Engine's grouped GEMM (``GroupedLinear``, Megatron-Core's ``TEGroupedMLP``)
    launches one cuBLAS GEMM per expert, round-robin over its compute streams
    (``multi_stream_cublas_gemm``, ``transformer_engine/common/gemm/cublaslt_gemm.cu``; the
    CUTLASS grouped kernel is Hopper-only and opt-in, ``NVTE_USE_CUTLASS_GROUPED_GEMM``), so each
    local expert pays the kernel's fixed cost: ``E / ep`` of them per projection, not one.
    """
    m, etp = ti.model, expert_tp(cfg)
    h, up = m.hidden, (2 if m.gated_mlp else 1)
    tokens = etp * n / cfg.tp * m.top_k * cfg.ep / m.experts * ti.calib.moe_capacity_factor
    flops = 2 * tokens * (m.experts / cfg.ep) * h * m.expert_ffn * (up + 1) / etp
    split = up / (up + 1)
    more = 2.0 * (m.experts / cfg.ep - 1.0) * ti.gemm.latency_s  # the other experts' kernels
    return (ti.gemm.seconds(flops * split, tokens, up * m.expert_ffn / etp, h, ti.peak_flops)
            + ti.gemm.seconds(flops * (1 - split), tokens, h, m.expert_ffn / etp, ti.peak_flops)
            + more)


def _layer_compute_fwd(ti: TimeInputs, cfg: ConfigArrays, n: np.ndarray
                       ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Forward compute seconds of one layer, its attention-core part and its GEMM part."""
    m, c = ti.model, ti.calib
    full_square = 4 * n * ti.seq_len * m.heads * m.d_head / cfg.tp
    if ti.attention_eff is not None:
        # The fused kernel's figure is stand-alone, like the GEMM ceiling: inside a step it
        # runs at the same sustained clock and shares its SMs alike (the in-training fraction).
        attn = 0.5 * full_square / (ti.attention_flops * ti.attention_eff * ti.gemm.in_training)
    else:
        attn = full_square / (ti.attention_flops * c.unfused_attention_eff)
    elem_bytes = ti.calib.elementwise_bytes * m.hidden
    if m.is_moe:
        elem_bytes += MOE_PERMUTE_BYTES * m.top_k * m.hidden
    elem = elem_bytes * n / cfg.tp / ti.links.hbm_bw
    if m.is_moe:
        elem = elem + _expert_sort(ti, cfg, n)
    gemm = _layer_gemm_fwd(ti, cfg, n)
    return gemm + attn + elem, attn, gemm


def _expert_sort(ti: TimeInputs, cfg: ConfigArrays, n: np.ndarray) -> np.ndarray:
    """Forward seconds of Megatron-Core's second permutation of the routed tokens.

    With more than one local expert the all-to-all dispatcher sorts the received tokens by
    local expert before the grouped GEMM and restores their order after it
    (``sort_chunks_by_idxs`` in ``MoEAlltoAllTokenDispatcher.dispatch_postprocess`` /
    ``combine_preprocess``, ``megatron/core/transformer/moe/token_dispatcher.py``): two passes
    reading and writing every token the rank's experts receive, ``etp · n / tp · k`` of them
    times the capacity factor on the busiest rank.
    """
    m = ti.model
    rows = expert_tp(cfg) * n / cfg.tp * m.top_k * ti.calib.moe_capacity_factor
    return np.where(m.experts / cfg.ep > 1,
                    MOE_SORT_BYTES * rows * m.hidden / ti.links.hbm_bw, 0.0)


def _expert_bias(ti: TimeInputs, cfg: ConfigArrays, n: np.ndarray
                 ) -> tuple[np.ndarray | float, np.ndarray | float]:
    """Forward and backward seconds of the experts' second bias (models with biases, ``bias``).

    Megatron-Core's ``TEGroupedMLP`` runs its second grouped GEMM without the bias
    (``skip_bias_add=True``) and adds it afterwards, expert by expert, weighted by the routing
    probability: ``torch.cat([t + b * p for each local expert])`` (``_apply_bias``,
    ``megatron/core/transformer/moe/experts.py``, core_v0.15.0 on), eager element-wise kernels
    over every routed row of ``h`` (:data:`EXPERT_BIAS_BYTES`, with the router's probabilities
    in the model's 16 bits, Megatron-Core's default ``moe_router_dtype``). The first GEMM's
    bias is fused into its epilogue by Transformer Engine and costs nothing extra.
    """
    m = ti.model
    if not (m.is_moe and m.bias):
        return 0.0, 0.0
    rows = expert_tp(cfg) * n / cfg.tp * m.top_k * ti.calib.moe_capacity_factor
    per_byte = rows * m.hidden / ti.links.hbm_bw
    return EXPERT_BIAS_BYTES[0] * per_byte, EXPERT_BIAS_BYTES[1] * per_byte


def tp_exposed(ti: TimeInputs, comm: np.ndarray, gemm: np.ndarray, tp: np.ndarray) -> np.ndarray:
    """TP communication left exposed beside ``gemm`` seconds of GEMMs (module docstring)."""
    if not ti.profile.tp_comm_overlap:
        return comm
    return np.maximum(comm - gemm, comm / np.maximum(tp, 1))


def _layer_comm(ti: TimeInputs, cfg: ConfigArrays, n: np.ndarray
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One layer's forward TP, CP (before overlap) and EP communication seconds."""
    m, links = ti.model, ti.links
    bw, lat = links.select(cfg.tp)
    tp = 4 * ring_time(n * m.hidden * 2.0, cfg.tp, bw, lat)
    etp = expert_tp(cfg)
    if m.is_moe:  # attention's gather and scatter over tp, the experts' over expert-TP
        bw_e, lat_e = links.select(etp)
        tp = tp / 2 + 2 * ring_time(etp / cfg.tp * n * m.hidden * 2.0, etp, bw_e, lat_e)
    kv_rank = np.maximum(m.kv_heads / cfg.tp, 1.0) * m.d_head
    bw, lat = links.select(cfg.tp * cfg.cp)
    cp = ring_time(cfg.cp * 2 * n * kv_rank * 2.0, cfg.cp, bw, lat)
    ep = np.zeros_like(tp)
    if m.is_moe:  # dispatch and combine; EP ranks sit etp apart (the expert grid, tp-ep-dp)
        sent = n * m.top_k * m.hidden * 2.0 / cfg.tp * ti.calib.moe_capacity_factor
        ep = 2 * links.all_to_all(sent, etp, cfg.ep)
    return tp, cp, ep


def layer_times(ti: TimeInputs, cfg: ConfigArrays, share: np.ndarray | float = 1.0
                ) -> tuple[Components, Components]:
    """Forward and backward :class:`Components` of one layer for one micro-batch.

    The backward pass costs twice the forward's compute (its FP8 quantization and the experts'
    second bias aside: the gradients' own, :func:`~solver.cost.fp8_casts.layer_cast_bytes`,
    :func:`_expert_bias`). Its TP and EP traffic
    equals the forward's (the conjugate collectives: reduce-scatter of input gradients,
    all-gather of output gradients, the reverse all-to-alls), overlapped (where the framework
    does) beside twice the GEMM time; the extra all-gather of the sequence-sharded input for
    the weight gradients overlaps with the data-gradient GEMM (Korthikanti et al. 2022,
    Sec. 4.2.2). The CP ring runs twice (K/V out, dK/dV back). Full recomputation (code 2)
    adds a forward's compute and collectives to it; selective recomputation (code 1) adds the
    attention core and its CP ring. CP communication is hidden behind the attention core of
    the same pass (ring attention); only the excess is exposed.

    ``share``: the fraction of the (sub-)stage's layers that full recomputation recomputes
    (the block method's ``r / layers``, :func:`~solver.cost.stage.recomputed_layers`); the
    returned backward is the mean over its layers, so ``layers`` times it is ``layers`` plain
    backward passes plus ``r`` recomputed forwards.
    """
    n = tokens_per_gpu(cfg, ti.seq_len)
    comp, attn, gemm = _layer_compute_fwd(ti, cfg, n)
    # FP8 quantization: the forward's is part of comp, the backward's quantizes gradients.
    cast_fwd, cast_bwd = (x / ti.links.hbm_bw for x in layer_cast_bytes(
        ti.model, cfg.tp, expert_tp(cfg), n, ti.calib.moe_capacity_factor, *ti.fp8_cast))
    bias_fwd, bias_bwd = _expert_bias(ti, cfg, n)
    comp = comp + cast_fwd + bias_fwd
    tp, cp, ep = _layer_comm(ti, cfg, n)
    rc_comm = np.where(cfg.recompute == 2, share, 0.0)
    rc_core = rc_comm * comp + np.where(cfg.recompute == 1, attn, 0.0)
    cp_exposed = np.maximum(cp - attn, 0.0) if ti.overlap else cp
    tp_fwd = tp_exposed(ti, tp, gemm, cfg.tp)
    tp_bwd = tp_exposed(ti, tp, 2 * gemm, cfg.tp)
    fwd = Components(compute=comp, tp=tp_fwd, cp=cp_exposed, ep=ep)
    bwd = Components(
        compute=2 * (comp - cast_fwd - bias_fwd) + cast_bwd + bias_bwd, recompute=rc_core,
        tp=tp_bwd + rc_comm * tp_fwd, ep=ep * (1 + rc_comm),
        cp=cp_exposed * (2 + rc_comm + np.where(cfg.recompute == 1, 1.0, 0.0)),
    )
    return fwd, bwd


def embedding_times(ti: TimeInputs, cfg: ConfigArrays) -> tuple[Components, Components]:
    """Input embedding: a vocab-parallel lookup whose partial sums are reduce-scattered (fwd) and
    whose gradient is all-gathered (bwd); the lookup itself is negligible."""
    n = tokens_per_gpu(cfg, ti.seq_len)
    bw, lat = ti.links.select(cfg.tp)
    one = ring_time(n * ti.model.hidden * 2.0, cfg.tp, bw, lat)
    return Components(tp=one), Components(tp=one)


def head_times(ti: TimeInputs, cfg: ConfigArrays) -> tuple[Components, Components]:
    """LM head and loss: logits GEMM ``(n, V/tp, h)`` in 16 bits, the cross entropy over
    ``n V / tp`` logits (HBM bytes per logit per pass: the job's
    :class:`~solver.spec.enums.CrossEntropyKernel`), an all-gather of the final hidden states
    (fwd) and a reduce-scatter (bwd)."""
    m = ti.model
    n = tokens_per_gpu(cfg, ti.seq_len)
    # 16-bit even when the layers run FP8 (TimeInputs.head_gemm).
    kernel, peak = ((ti.gemm, ti.peak_flops) if ti.head_gemm is None
                    else (ti.head_gemm, ti.attention_flops))
    gemm = kernel.seconds(2 * n * m.hidden * m.vocab / cfg.tp, n, m.vocab / cfg.tp, m.hidden,
                          peak)
    per_logit = n * m.vocab / cfg.tp / ti.links.hbm_bw
    loss_fwd, loss_bwd = (b * per_logit for b in ti.loss.bytes_per_logit)
    bw, lat = ti.links.select(cfg.tp)
    one = ring_time(n * m.hidden * 2.0, cfg.tp, bw, lat)
    return (Components(compute=gemm + loss_fwd, tp=tp_exposed(ti, one, gemm, cfg.tp)),
            Components(compute=2 * gemm + loss_bwd, tp=tp_exposed(ti, one, 2 * gemm, cfg.tp)))


def p2p_time(ti: TimeInputs, cfg: ConfigArrays) -> np.ndarray:
    """One boundary transfer between internal sub-stages, one direction, one micro-batch.

    Each TP rank sends its ``1/tp`` share of the ``n h 2``-byte activation (Megatron's
    scatter/gather optimisation); neighbours share a node only if two sub-stages fit in one.
    """
    n = tokens_per_gpu(cfg, ti.seq_len)
    bw, lat = ti.links.select(2 * cfg.tp * cfg.cp * cfg.dp)
    return np.where(cfg.pp > 1, n * ti.model.hidden * 2.0 / cfg.tp / bw + lat, 0.0)
