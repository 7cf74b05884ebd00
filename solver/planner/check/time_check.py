"""Per-micro-batch and per-iteration seconds of a plan's stages, recomputed independently.

The validator's time check. Scalar, closed-form arithmetic over plain floats, written from the
formulas of the vectorized cost model (:mod:`solver.cost.timing`, :mod:`solver.cost.sync`,
:mod:`solver.cost.stage_costs`) but sharing no function with it: the hardware figures are read
from the island, parameter and activation counts come from the model's shapes here, and only
the calibration constants and the framework profile's flags are taken as data.
``tests/planner/test_time_check.py`` holds the two equal on random configurations, so a bug
planted in either shows up as a disagreement.

One micro-batch on one GPU covers ``n = b s / cp`` tokens. Per layer and pass:

* GEMMs: ``2 x`` weights FLOPs per token (Narayanan et al., SC'21), each matrix at the fraction
  ``kappa ceiling xi / (xi + c B)`` of peak, ``xi = 1 / (1/M + 1/N + 1/K)`` of its TP-sharded
  shape, ``B`` the GPU's FLOP-per-byte balance and ``kappa`` the in-training fraction, plus a fixed
  ``t0`` per kernel (one per matrix and pass, and per local expert: Transformer Engine's grouped
  GEMM launches one cuBLAS GEMM per expert, ``multi_stream_cublas_gemm``); MoE adds
  the router and the busiest rank's experts at the capacity factor. The attention core is
  ``4 n s a d / tp`` FLOPs in 16 bits (half of it with a fused causal kernel, whose stand-alone
  efficiency ``kappa`` derates like the GEMMs'); norms,
  activations and the MoE permutation (and, with several local experts, the sort of the
  received tokens by expert) stream bytes through HBM. Under FP8 every GEMM operand is cast
  (activations forward, output gradients backward; amax, read, write, a transposed byte on
  TN-only GPUs; MXFP8 row- and column-wise), and the LM head stays 16-bit.
* Tensor parallelism with sequence parallelism (Korthikanti et al. 2022): four ring collectives
  of the ``2 n h``-byte activation per pass; with Megatron-Core's overlap only
  ``max(c - g, c / tp)`` stays exposed beside ``g`` seconds of GEMMs. The context-parallel K/V
  ring hides behind the attention core; expert parallelism does two all-to-alls per pass, on
  NVLink among the ranks of one node and on the NICs beyond.
* Backward costs twice the forward's work; full recomputation repeats the forward (and its TP
  and EP traffic) of every layer, or of the first ``k`` of a sub-stage with the block method
  (the others run as without recomputation), selective recomputation the attention core and
  the CP ring.

Per sub-stage and iteration (Rajbhandari et al. 2020 for ZeRO; the Scaling Book for ring
collectives, ``(q - 1)/q M / W`` per phase plus a step latency): fp32 gradients are all-reduced
(ZeRO-0), reduce-scattered once (ZeRO-1) or every micro-batch (ZeRO-2/3, which also gather the
16-bit weights); bucketed collectives hide behind the pass they overlap except the last bucket,
``max(c - w (1 - 1/nb), c / nb)``; ZeRO-3 pays a ring latency per module and DeepSpeed a third
gather of recomputed layers (:mod:`solver.planner.check.time_check_sync`). The Adam step
streams ``optimizer_bytes`` per locally held parameter through HBM. Offloaded activations
cross PCIe beside the compute of the same pass; pipeline neighbours exchange the ``1/tp``
share of the activation once per boundary and pass.
"""

from __future__ import annotations

from dataclasses import replace
from types import MappingProxyType
from typing import NamedTuple

from solver.cost.efficiency import DEFAULT_CALIBRATION, Calibration
from solver.cost.runtime.frameworks import FrameworkProfile, job_runtime
from solver.cost.stage import StageConfig
from solver.planner.check.memory_check import layer_counts, recomputed
from solver.planner.check.time_check_machine import Machine, consecutive, machine, ring
from solver.planner.check.time_check_moe import (expert_bias, expert_sort, one_all_to_all,
                                                 routed_rows)
from solver.planner.check.time_check_sync import hide, sync
from solver.spec.domain import Island, ModelSpec, Precision, Recompute

_hide = hide  # the name the validator's tests check the bucket formula under
#: HBM bytes per logit (forward, backward) of each loss kernel, recounted from the runtimes'
#: code: Megatron-LM's unfused vocab-parallel cross entropy (fp32 cast 2 + 4, max 4, subtract
#: 4 + 4, exp 4 + 4, sum 4, divide 4 + 4; backward scale 4 + 4, 16-bit cast 4 + 2) and
#: Transformer Engine's fused one (two reads of the 16-bit logits, the gradient written in
#: their place; backward one in-place scale).
_LOSS_BYTES = MappingProxyType({"unfused": (38.0, 14.0), "te": (6.0, 4.0)})
_PERMUTE_BYTES = 8.0   # HBM bytes per hidden element of every routed copy (permute, unpermute)


class _Setup(NamedTuple):
    model: ModelSpec
    seq: int
    gpu: Machine
    calib: Calibration
    overlap: bool
    profile: FrameworkProfile
    grad_bytes: float = 4.0      # gradient buffer bytes per parameter (2: bf16)
    fp8_params: bool = False     # weights stored in FP8 (--fp8-param-gather)
    loss: str = "unfused"        # the loss kernel ([training] cross_entropy): _LOSS_BYTES


def _gemm(st: _Setup, flops: float, m: float, n: float, k: float,
          sixteen: bool = False) -> float:
    """Seconds of one GEMM kernel of ``flops`` and shape (m, n, k): the curve's fraction of
    peak, derated to its in-training speed, plus the fixed cost per kernel (``sixteen``: the
    LM head, 16-bit even under FP8)."""
    m, n, k = max(m, 1.0), max(n, 1.0), max(k, 1.0)
    xi = 1.0 / (1.0 / m + 1.0 / n + 1.0 / k)
    g = st.gpu
    ceiling, peak = ((g.head_ceiling, g.sixteen) if sixteen and g.head_ceiling is not None
                     else (g.ceiling, g.peak))
    return flops / (peak * g.kappa * ceiling * xi / (xi + g.half)) + g.kernel


def _tp_exposed(st: _Setup, comm: float, gemm: float, tp: int) -> float:
    """TP traffic left over beside ``gemm`` seconds when the framework pipelines the two."""
    if not (st.overlap and st.profile.tp_comm_overlap):
        return comm
    return max(comm - gemm, comm / max(tp, 1))


def _mlp_gemms(st: _Setup, split: int, tokens: float, width: float, copies: float) -> float:
    """Up (gated: two matrices fused) and down projections of ``copies`` MLPs of ``width``,
    each matrix split ``split`` ways (TP, or expert-TP for routed experts)."""
    h, up = st.model.hidden, (2 if st.model.gated_mlp else 1)
    flops = 2 * tokens * copies * h * width * (up + 1) / split
    # One kernel per copy and matrix (the routed experts' GEMMs are launched one by one).
    return (_gemm(st, flops * up / (up + 1), tokens, up * width / split, h)
            + _gemm(st, flops / (up + 1), tokens, h, width / split)
            + 2 * (copies - 1) * st.gpu.kernel)


def _layer_gemms(st: _Setup, c: StageConfig, n: float) -> float:
    """Forward GEMM seconds of one layer."""
    m = st.model
    h, q, kv = m.hidden, m.heads * m.d_head, m.kv_heads * m.d_head
    t = _gemm(st, 2 * n * h * (q + 2 * kv) / c.tp, n, (q + 2 * kv) / c.tp, h)
    t += _gemm(st, 2 * n * q * h / c.tp, n, h, q / c.tp)
    if not m.is_moe:
        return t + _mlp_gemms(st, c.tp, n, m.ffn, 1.0)
    t += _gemm(st, 2 * n * h * m.experts / c.tp, n / c.tp, m.experts, h)
    return t + _expert_gemms(st, c, n)


def _expert_gemms(st: _Setup, c: StageConfig, n: float) -> float:
    """Forward GEMM seconds of a rank's routed experts (one kernel each) and shared experts."""
    m = st.model
    per_expert = routed_rows(st, c, n) * c.ep / m.experts
    t = _mlp_gemms(st, c.etp, per_expert, m.expert_ffn, m.experts / c.ep)
    if m.shared_experts:
        t += _mlp_gemms(st, c.tp, n, m.shared_experts * m.expert_ffn, 1.0)
    return t


def _layer(st: _Setup, c: StageConfig, n: float) -> tuple[float, float, float, float]:
    """(forward work, forward exposed comm, backward work, backward exposed comm) of a layer."""
    m, g = st.model, st.gpu
    square = 4 * n * st.seq * m.heads * m.d_head / c.tp
    attn = (square / 2 / (g.sixteen * g.attention * g.kappa) if g.attention is not None
            else square / (g.sixteen * st.calib.unfused_attention_eff))
    streamed = st.calib.elementwise_bytes * m.hidden + (
        _PERMUTE_BYTES * m.top_k * m.hidden if m.is_moe else 0.0)
    gemm = _layer_gemms(st, c, n)
    work = gemm + attn + streamed * n / c.tp / g.hbm
    if m.is_moe:  # several local experts: received tokens sorted, unsorted
        work += expert_sort(st, c, n)
    cast_f, cast_b = _fp8_casts(st, c, n)
    bias_f, bias_b = expert_bias(st, c, n)
    work += cast_f + bias_f
    tp = 4 * ring(2.0 * n * m.hidden, c.tp, *consecutive(g, c.tp))
    if m.is_moe:  # the MLP's gather and scatter run over the expert-TP group instead
        tp = tp / 2 + 2 * ring(2.0 * n * m.hidden * c.etp / c.tp, c.etp,
                               *consecutive(g, c.etp))
    kv_share = max(m.kv_heads / c.tp, 1.0) * m.d_head
    kv_ring = ring(2.0 * c.cp * 2 * n * kv_share, c.cp, *consecutive(g, c.tp * c.cp))
    cp = max(kv_ring - attn, 0.0) if st.overlap else kv_ring
    ep = 2 * one_all_to_all(st, c, n) if m.is_moe else 0.0
    full = c.recompute is Recompute.FULL
    tp_fwd = _tp_exposed(st, tp, gemm, c.tp)
    redo = work if full else (attn if c.recompute is Recompute.SELECTIVE else 0.0)
    bwd_comm = (_tp_exposed(st, tp, 2 * gemm, c.tp) + (tp_fwd if full else 0.0)
                + ep * (2 if full else 1) + cp * (2 if c.recompute is Recompute.NONE else 3))
    return (work, tp_fwd + cp + ep, 2 * (work - cast_f - bias_f) + cast_b + bias_b + redo,
            bwd_comm)


def _fp8_casts(st: _Setup, c: StageConfig, n: float) -> tuple[float, float]:
    """Seconds of one layer's FP8 casts (forward, backward): every GEMM operand, activations
    going forward and output gradients coming back. Norm outputs (QKV and dense up-projection
    inputs) are a sequence shard, ``n / tp`` tokens of ``h``; MoE casts the routed rows and
    the shared experts' operands instead of the dense MLP's."""
    norm, other = st.gpu.cast
    if not other:
        return 0.0, 0.0
    m = st.model
    h, q, kv = m.hidden, m.heads * m.d_head, m.kv_heads * m.d_head
    up = 2 if m.gated_mlp else 1
    local = n / c.tp
    fwd = norm * local * h + other * n * q / c.tp                    # QKV in, output-proj in
    bwd = other * local * h + other * n * (q + 2 * kv) / c.tp        # their output gradients
    mlps = []  # (rows, width, split, fed by the norm)
    if m.is_moe:
        rows = routed_rows(st, c, n)
        mlps.append((rows, m.expert_ffn, c.etp, False))
        if m.shared_experts:
            mlps.append((None, m.shared_experts * m.expert_ffn, c.tp, False))
    else:
        mlps.append((None, m.ffn, c.tp, True))
    for rows, width, split, from_norm in mlps:
        first = local if rows is None else rows  # h-wide operand rows (a shard if dense)
        inner = n if rows is None else rows      # f-wide operand rows
        fwd += (norm if from_norm else other) * first * h + other * inner * width / split
        bwd += other * first * h + other * inner * up * width / split
    return fwd / st.gpu.hbm, bwd / st.gpu.hbm


def _head(st: _Setup, c: StageConfig, n: float) -> tuple[float, float, float, float]:
    """The LM head and loss, as :func:`_layer` orders its terms."""
    m, g = st.model, st.gpu
    gemm = _gemm(st, 2 * n * m.hidden * m.vocab / c.tp, n, m.vocab / c.tp, m.hidden, True)
    fwd, bwd = (b * n * m.vocab / c.tp / g.hbm
                for b in _LOSS_BYTES[st.loss])
    one = ring(2.0 * n * m.hidden, c.tp, *consecutive(g, c.tp))
    return (gemm + fwd, _tp_exposed(st, one, gemm, c.tp),
            2 * gemm + bwd, _tp_exposed(st, one, 2 * gemm, c.tp))


def _stored_per_token(st: _Setup, rc: Recompute) -> float:
    """Activation bytes one layer keeps per token for backward (Korthikanti et al., recounted)."""
    m, flash = st.model, st.gpu.attention is not None
    h = m.hidden
    if rc is Recompute.FULL:
        return 2.0 * h
    q, kv = m.heads * m.d_head, m.kv_heads * m.d_head
    attn = 4 * h + 4 * q + 4 * kv + (4 * m.heads if flash else 0)
    if not flash and rc is Recompute.NONE:
        attn += 2 * m.heads * st.seq
    inter = 6 if m.gated_mlp else 4
    if not m.is_moe:
        return float(attn + 4 * h + inter * m.ffn)
    routed = st.calib.moe_capacity_factor * m.top_k * (4 * h + inter * m.expert_ffn)
    return float(attn + 4 * h + 4 * m.experts + routed + m.shared_experts * inter * m.expert_ffn)


def _setup(model, seq_len, island, calib, profile, precision, overlap,
           grad_bytes: float = 4.0, fp8_params: bool = False, loss: str = "unfused") -> _Setup:
    """Everything the formulas read besides the configuration."""
    gpu = machine(island, precision, calib, profile.unfused_attention)
    return _Setup(model, seq_len, gpu, calib, overlap, profile, grad_bytes, fp8_params, loss)


def _substage(st: _Setup, c: StageConfig, layers: int, emb: bool, head: bool,
              p2p_factor: float) -> tuple[float, float, float, float]:
    """(fwd + bwd seconds per micro-batch, exposed sync, optimizer step, the MoE overlap's
    exposed all-to-alls per iteration) of one sub-stage."""
    n = c.micro_batch * st.seq / c.cp
    redone = recomputed(c, layers)
    if c.recompute is Recompute.FULL and redone < layers:
        # Block method: ``redone`` layers recompute, the others run as without recomputation;
        # the per-layer terms below are their mean.
        plain = replace(c, recompute=Recompute.NONE, recompute_layers=None)
        lw_f, lc_f, lw_b, lc_b = ((redone * a + (layers - redone) * b) / layers
                                  for a, b in zip(_layer(st, c, n), _layer(st, plain, n)))
    else:
        lw_f, lc_f, lw_b, lc_b = _layer(st, c, n)
    hw_f, hc_f, hw_b, hc_b = _head(st, c, n) if head else (0.0, 0.0, 0.0, 0.0)
    lookup = ring(2.0 * n * st.model.hidden, c.tp, *consecutive(st.gpu, c.tp)) if emb else 0.0
    fwd_work, bwd_work = layers * lw_f + hw_f, layers * lw_b + hw_b
    fwd_comm, bwd_comm = layers * lc_f + lookup + hc_f, layers * lc_b + lookup + hc_b
    z_fwd, z_bwd, dp_s, opt_s = sync(st, c, layers, emb, head, fwd_work, bwd_work, redone,
                                     round(p2p_factor))
    kept = (redone * _stored_per_token(st, Recompute.FULL)
            + (layers - redone) * _stored_per_token(st, Recompute.NONE)
            if c.recompute is Recompute.FULL else _stored_per_token(st, c.recompute) * layers)
    copy = kept * n / c.tp / st.gpu.pcie if c.offload else 0.0
    hidden = 1.0 if st.overlap else 0.0
    off_f, off_b = max(copy - hidden * fwd_work, 0.0), max(copy - hidden * bwd_work, 0.0)
    p2p = 0.0
    if c.pp > 1:
        bw, lat = consecutive(st.gpu, 2 * c.tp * c.cp * c.dp)
        p2p = (2.0 * n * st.model.hidden / c.tp / bw + lat) * p2p_factor
    # overlap_p2p: an interleaved pass's transfers hide under the other pass's compute.
    under = 1.0 if st.profile.overlap_p2p and round(p2p_factor) > 1 and st.overlap else 0.0
    fwd = fwd_work + fwd_comm + z_fwd + off_f + max(p2p - under * bwd_work, 0.0)
    bwd = bwd_work + bwd_comm + z_bwd + off_b + max(p2p - under * fwd_work, 0.0)
    # Hidden from every micro-batch, exposed pp times per iteration (warm-up and cool-down).
    hid = (layers * _a2a_hidden(st, c, n, (lw_f, lc_f, lw_b, lc_b))
           if c.a2a_overlap and st.overlap else 0.0)
    return fwd + bwd - hid, dp_s, opt_s, c.pp * hid


def _a2a_hidden(st: _Setup, c: StageConfig, n: float,
                layer: tuple[float, float, float, float]) -> float:
    """Seconds per layer and micro-batch the MoE all-to-all overlap hides: each all-to-all of
    one pass beside one compute block of the other (combine-bwd / attention-fwd, dispatch-fwd /
    experts-bwd, dispatch-bwd / experts-fwd, combine-fwd / attention-bwd). ``layer``: the
    layer's :func:`_layer` terms."""
    if not st.model.is_moe:
        return 0.0
    work_f, comm_f, work_b, comm_b = layer
    experts = (_expert_gemms(st, c, n) + expert_sort(st, c, n)
               + expert_bias(st, c, n)[0])
    e = one_all_to_all(st, c, n)
    attn_f = work_f + comm_f - 2 * e - experts
    attn_b = work_b + comm_b - 2 * e - 2 * experts
    apart = attn_f + attn_b + 3 * experts + 4 * e
    together = max(attn_f, e) + max(2 * experts, e) + max(experts, e) + max(attn_b, e)
    return max(apart - together, 0.0)


def substage_seconds(model: ModelSpec, seq_len: int, island: Island, cfg: StageConfig,
                     layers: int, emb: bool, head: bool, *,
                     calib: Calibration = DEFAULT_CALIBRATION, profile: FrameworkProfile,
                     precision: Precision = Precision.BF16, overlap: bool = True,
                     p2p_factor: float = 1.0, grad_bytes: float = 4.0,
                     fp8_params: bool = False, loss: str = "unfused"
                     ) -> tuple[float, float, float]:
    """Seconds of one internal sub-stage running ``layers`` layers under ``cfg``.

    Parameters
    ----------
    model, seq_len : ModelSpec, int
        Model shapes and tokens per sequence.
    island : Island
        The GPUs the stage runs on (weakest-member figures).
    cfg : StageConfig
        The stage's configuration (``cfg.pp`` sub-stages; this is one of them).
    layers, emb, head : int, bool, bool
        Layers of the sub-stage and whether it holds the embedding / the LM head.
    calib : Calibration
        Efficiency constants.
    profile : FrameworkProfile
        What the runtime overlaps and whether it runs fused attention.
    precision : Precision
        GEMM precision the job asks for.
    overlap : bool
        Price overlap as scheduled (False: every transfer exposed, every profile overlap off).
    p2p_factor : float
        Boundaries a micro-batch crosses per sub-stage and pass (``v`` when interleaved), and
        so the model chunks whose data-parallel sync runs chunk by chunk.
    grad_bytes, fp8_params : float, bool
        Gradient-buffer bytes per parameter (2 with ``--grad-reduce-in-bf16``) and FP8 weights
        (``--fp8-param-gather``): what the data-parallel collectives move.
    loss : str
        The loss kernel, ``"unfused"`` or ``"te"`` (``[training] cross_entropy``).

    Returns
    -------
    tuple[float, float, float]
        Forward plus backward seconds per micro-batch, exposed data-parallel sync seconds per
        iteration (with the MoE all-to-all overlap, its exposed all-to-alls added),
        optimizer-step seconds per iteration.
    """
    st = _setup(model, seq_len, island, calib, profile, precision, overlap, grad_bytes,
               fp8_params, loss)
    lat, dp_s, opt_s, edge = _substage(st, cfg, layers, emb, head, p2p_factor)
    return lat, dp_s + edge, opt_s


def stage_seconds(model: ModelSpec, seq_len: int, island: Island, cfg: StageConfig,
                  layers: int, has_embedding: bool, has_head: bool, *,
                  calib: Calibration = DEFAULT_CALIBRATION, profile: FrameworkProfile,
                  precision: Precision = Precision.BF16, overlap: bool = True,
                  p2p_factor: float = 1.0, grad_bytes: float = 4.0,
                  fp8_params: bool = False, loss: str = "unfused"
                  ) -> tuple[list[float], float]:
    """Latency of each of the stage's ``cfg.pp`` sub-stages and its per-iteration seconds.

    Layers split as :func:`~solver.planner.check.memory_check.layer_counts`; the embedding sits on the
    first sub-stage and the head on the last (when the slice has them). The per-iteration term
    is the largest exposed sync plus optimizer step over all sub-stages (each from
    :func:`substage_seconds`), plus the largest exposed all-to-all of the MoE overlap.
    Keywords as in :func:`substage_seconds`.

    Returns
    -------
    tuple[list[float], float]
        Per-micro-batch seconds of every sub-stage in order, per-iteration seconds.
    """
    st = _setup(model, seq_len, island, calib, profile, precision, overlap, grad_bytes,
                fp8_params, loss)
    latencies, per_iteration, edge = [], 0.0, 0.0
    for j, count in enumerate(layer_counts(layers, cfg.pp)):
        lat, dp_s, opt_s, exposed = _substage(st, cfg, count, has_embedding and j == 0,
                                              has_head and j == cfg.pp - 1, p2p_factor)
        latencies.append(lat)
        per_iteration, edge = max(per_iteration, dp_s + opt_s), max(edge, exposed)
    return latencies, per_iteration + edge


def plan_stage_seconds(plan, calib: Calibration = DEFAULT_CALIBRATION
                       ) -> list[tuple[list[float], float]]:
    """Sub-stage latencies and per-iteration seconds of every stage of ``plan``, independently.

    Each stage is priced on the GPUs it is planned on (``s.group``) under the job's runtime
    (framework, precision), with ``v`` boundaries per sub-stage when the plan interleaves.
    """
    job = plan.job
    runtime = job_runtime(job)
    out = []
    for s in plan.stages:
        out.append(stage_seconds(
            job.model, job.training.seq_len, s.group, s.plan.config, s.end - s.start,
            s.start == 0, s.end == job.model.layers, calib=calib, profile=runtime.profile,
            precision=runtime.precision, overlap=runtime.overlap,
            p2p_factor=float(plan.virtual_stages), grad_bytes=runtime.grad_bytes,
            fp8_params=runtime.fp8_param_gather, loss=job.training.cross_entropy.value))
    return out
