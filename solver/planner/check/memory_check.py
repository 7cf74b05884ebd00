"""Per-GPU memory of a plan's stages, recomputed independently of the cost model.

The validator's memory check. Scalar, closed-form arithmetic written apart from the vectorized
model (:mod:`solver.cost.memory`), sharing no function with it: parameters are counted from the
model's shapes here, and the in-flight count of every pipeline (sub-)stage comes from its global
position. ``tests/planner/test_memory_check.py`` holds the two equal on random configurations,
so a bug planted in either shows up as a disagreement, and a bug in the model cannot pass a plan
that does not fit.

Per GPU, in bytes (Megatron-LM's mixed-precision layout; Rajbhandari et al. 2020 for ZeRO;
Korthikanti et al. 2022 for activations, recounted for GQA, gated MLPs, MoE, FlashAttention):

* weights 2, fp32 gradients 4, fp32 Adam master weights and moments 12 per parameter; ZeRO-1/2/3
  divide optimizer / gradients / weights by the ``dp·cp`` replicas (experts: the expert-DP group
  ``tp·cp·dp/(etp·ep)``);
  ZeRO-3 adds its gathered buffer (two layers, or two of the largest matrices for DeepSpeed);
  FP8 adds Transformer Engine's FP8 copy and transpose (2 per held weight) and saves its GEMM
  inputs in one byte (QKV/fc1 inputs ``h``, fc2 inputs ``f``, plus an FP8 copy ``q`` of the
  O-projection input) instead of the counts below, which are 16-bit;
* activations: per token of a layer, full recomputation keeps the input ``2h`` (the block
  method: in its first ``k`` layers only, the others keep everything); otherwise
  attention ``4h + 4q + 4kv`` plus FlashAttention's ``4a`` (or unfused scores ``2as`` without
  recomputation), MLP ``4h`` plus ``6f`` (gated) or ``4f``, MoE ``4h + 4E`` plus the routed
  copies ``cf·k·(4h + 6f_e)`` and shared experts; tokens per GPU ``b s / (cp tp)``; times the
  micro-batches in flight (1F1B: ``min(P − j, n)`` at sub-stage ``j`` of ``P``; interleaved:
  ``min(2(P − j − 1) + (v − 1)P + 1, n v) / v``; with the MoE all-to-all overlap one layer's
  more); one recomputed layer's working set under full
  recomputation; offload keeps one micro-batch in HBM; the head stage adds ``4h`` per token per
  micro-batch held and one micro-batch of logits at the loss: the 16-bit ones beside the fp32
  copy Megatron-LM's unfused cross entropy keeps (6 bytes each), or the 16-bit ones alone under
  Transformer Engine's fused loss (2; ``[training] cross_entropy = "te"``);
* the caching allocator's fragmentation, 5 % of the activations.

The cap a stage's count must stay within (:func:`usable_gb`) is re-derived here too: ``(1 − ε)``
of the device's memory as CUDA reports it (the catalog's ``memory_mib``, else ``hbm_gb`` read
as GiB), less the CUDA context (1 GiB) and NCCL's buffers (three rings of 32 channels, each
channel holding NCCL's LL, LL128 and Simple buffers for one peer in and one out).
"""

from __future__ import annotations

from types import MappingProxyType

from solver.spec.domain import Framework, ModelSpec, Recompute

_W, _G, _O, _FP8 = 2.0, 4.0, 12.0, 2.0
_FRAG = 0.05                 # allocator fragmentation per byte of activations
#: Bytes per logit held at the loss: Megatron-LM's unfused loss keeps its fp32 copy (4) beside
#: the 16-bit logits (2); Transformer Engine's writes the gradient over the 16-bit logits (2).
_HELD_PER_LOGIT = MappingProxyType({"unfused": 2.0 + 4.0, "te": 2.0})
_CONTEXT = 2.0 ** 30         # CUDA context, kernels, library workspaces
# NCCL per channel and peer: LL (8 lines × 512 threads × 8 steps × 16 B), LL128 (120 × 640 × 8
# steps × 8 B) and Simple (NCCL_BUFFSIZE, 4 MiB); 32 channels, a peer in and out, 3 groups.
_NCCL = 3 * 2 * 32 * (8 * 512 * 8 * 16 + 120 * 640 * 8 * 8 + 4 * 2 ** 20)


def usable_gb(island, epsilon: float) -> float:
    """GB (10⁹ B) per GPU a stage on ``island`` may count: ``(1 − ε)`` of its smallest
    member's memory as CUDA reports it, less the CUDA context and NCCL's buffers."""
    device = min(n.gpu.memory_mib * 2.0 ** 20 if n.gpu.memory_mib is not None
                 else n.gpu.hbm_gb * 2.0 ** 30 for n in island.nodes)
    return ((1.0 - epsilon) * device - _CONTEXT - _NCCL) / 1e9


def layer_counts(layers: int, pp: int) -> list[int]:
    """Layers of each internal sub-stage: even, the remainder to the middle ones, then the first."""
    base, rem = divmod(layers, pp)
    counts = [base] * pp
    for j in range(1, pp - 1):
        if rem == 0:
            break
        counts[j] += 1
        rem -= 1
    counts[0] += rem
    return counts


def held_micro_batches(j: int, depth: int, n: int, v: int) -> float:
    """Micro-batches of activations sub-stage ``j`` of a ``depth``-deep pipeline holds."""
    if v > 1:
        return min(2 * (depth - j - 1) + (v - 1) * depth + 1, n * v) / v
    return float(min(depth - j, n))


def _params(m: ModelSpec) -> tuple[float, float, float]:
    """(dense, expert, largest matrix) weights of one layer, from the shapes."""
    h, d = m.hidden, m.head_dim or m.hidden // m.heads
    q, kv = m.heads * d, m.kv_heads * d
    mats = 3 if m.gated_mlp else 2
    attention = 2 * h * q + 2 * h * kv
    # Norm vectors (LayerNorm: weight and bias) and linear biases, from the architecture fields.
    norms = (2 * h + (2 * d if m.qk_norm else 0)) * (2 if m.normalization == "layernorm" else 1)
    norms += (q + 2 * kv) if (m.qkv_bias or m.bias) else 0
    norms += (2 * h + (mats - 1) * m.ffn) if m.bias else 0
    if m.is_moe:
        dense = attention + norms + h * m.experts + m.shared_experts * mats * h * m.expert_ffn
        expert = m.experts * mats * h * m.expert_ffn
    else:
        dense, expert = attention + norms + mats * h * m.ffn, 0
    width = max(m.ffn, m.expert_ffn if m.is_moe else 0)
    largest = max(h * (q + 2 * kv), q * h, (mats - 1) * h * width, width * h)
    return float(dense), float(expert), float(largest)


def _per_token(m: ModelSpec, seq: int, rc: Recompute, flash: bool, cf: float,
               fp8: bool = False) -> float:
    h = m.hidden
    if rc is Recompute.FULL:
        return 2.0 * h
    d = m.head_dim or h // m.heads
    q, kv = m.heads * d, m.kv_heads * d
    # FP8: Transformer Engine saves its GEMM inputs in one byte (QKV/fc1 inputs h, fc2
    # inputs f) and an FP8 copy of the O-projection input beside the attention output.
    saved_in = 1 if fp8 else 2
    attn = (2 + saved_in) * h + 4 * q + 4 * kv + (q if fp8 else 0) \
        + (4 * m.heads if flash else 0)
    if not flash and rc is Recompute.NONE:
        attn += 2 * m.heads * seq
    inter = (4 if m.gated_mlp else 2) + saved_in
    if m.is_moe:
        mlp = 4 * h + 4 * m.experts \
            + cf * m.top_k * ((2 + saved_in) * h + inter * m.expert_ffn) \
            + m.shared_experts * inter * m.expert_ffn
    else:
        mlp = (2 + saved_in) * h + inter * m.ffn
    return float(attn + mlp)


def recomputed(c, layers: int) -> int:
    """Layers of a sub-stage of ``layers`` layers that ``c`` recomputes: all under full
    recomputation, the first ``recompute_layers`` (at most all) under the block method."""
    if c.recompute is not Recompute.FULL:
        return 0
    k = c.recompute_layers
    return layers if k is None else min(k, layers)


def layer_weights(m: ModelSpec) -> tuple[float, float]:
    """(dense, routed-expert) weights of one layer, from the shapes."""
    dense_l, expert_l, _ = _params(m)
    return dense_l, expert_l


def held_params(m: ModelSpec, c, layers: int, emb: bool, head: bool) -> tuple[float, float]:
    """Dense and routed-expert parameters one GPU of a sub-stage holds before ZeRO: its
    layers' (dense ÷ tp, experts ÷ expert-tp·ep), the embedding and a learned position table on
    the first, the final norm and the LM head on the last (only the norm where a tied head is
    the embedding on the same stage)."""
    dense_l, expert_l = layer_weights(m)
    vh = float(m.vocab * m.hidden)
    pos = float(m.max_positions * m.hidden) if m.position_embedding == "learned" else 0.0
    final_norm = m.hidden * (2.0 if m.normalization == "layernorm" else 1.0)
    head_params = (final_norm if emb and m.tied_embeddings else vh + final_norm) if head else 0.0
    dense = (layers * dense_l + (vh + pos if emb else 0.0) + head_params) / c.tp
    return dense, layers * expert_l / (c.etp * c.ep)


def substage_bytes(m: ModelSpec, seq: int, c, layers: int, emb: bool, head: bool, held: float,
                   *, flash: bool, framework: Framework, fp8: bool, cf: float,
                   grad_bytes: float = _G, fp8_params: bool = False, loss: str = "unfused"
                   ) -> float:
    """Per-GPU bytes of one sub-stage running ``layers`` layers with configuration ``c``
    (``grad_bytes``: 2 with bf16 gradient buffers, ``--grad-reduce-in-bf16``; ``fp8_params``:
    ``--fp8-param-gather``, one byte per weight for the 16-bit weight and its FP8 cache;
    ``loss``: the loss kernel, ``[training] cross_entropy``)."""
    dense_l, expert_l, largest = _params(m)
    dense, expert = held_params(m, c, layers, emb, head)
    q = c.dp * c.cp
    q_e = c.tp * c.cp * c.dp / (c.etp * c.ep)  # the expert-data-parallel group

    def held_states(stage: int) -> float:
        return dense / q + expert / q_e if c.zero >= stage else dense + expert

    live = held_states(3)
    if c.zero >= 3:
        live += (2.0 * largest / c.tp * min(layers, 1) if framework is Framework.DEEPSPEED
                 else min(layers, 2) * (dense_l / c.tp + expert_l / (c.etp * c.ep)))
    per_weight = 1.0 if fp8 and fp8_params else _W + (_FP8 if fp8 else 0.0)
    states = per_weight * live + grad_bytes * held_states(2) + _O * held_states(1)
    tokens = c.micro_batch * seq / c.cp / c.tp
    in_hbm = min(held, 1.0) if c.offload else held
    redone = recomputed(c, layers)
    kept = (redone * _per_token(m, seq, Recompute.FULL, flash, cf, fp8)
            + (layers - redone) * _per_token(m, seq, Recompute.NONE, flash, cf, fp8)
            if c.recompute is Recompute.FULL
            else _per_token(m, seq, c.recompute, flash, cf, fp8) * layers)
    acts = kept * tokens * in_hbm
    if c.recompute is Recompute.FULL:
        acts += _per_token(m, seq, Recompute.NONE, flash, cf, fp8) * tokens
    if head:
        acts += tokens * (4.0 * m.hidden * in_hbm + _HELD_PER_LOGIT[loss] * m.vocab)
    return states + acts * (1.0 + _FRAG)


def plan_memory_gb(plan, cf: float, flash_by_stage: list[bool]) -> list[float]:
    """Peak per-GPU GB of every stage of ``plan`` (its most loaded sub-stage), independently."""
    job, n, v = plan.job, plan.n_micro, plan.virtual_stages
    depth = sum(s.plan.config.pp for s in plan.stages)
    out, j0 = [], 0
    for s, flash in zip(plan.stages, flash_by_stage):
        c = s.plan.config
        fp8 = all(x.gpu.runs_fp8(job.training.precision) for x in s.island.nodes)
        worst = 0.0
        for j, count in enumerate(layer_counts(s.end - s.start, c.pp)):
            emb = s.start == 0 and j == 0
            head = s.end == job.model.layers and j == c.pp - 1
            held = held_micro_batches(j0 + j, depth, n, v)
            if c.a2a_overlap:  # a forward layer stores before its backward twin frees
                held += 1.0 / max(count, 1)
            worst = max(worst, substage_bytes(
                job.model, job.training.seq_len, c, count, emb, head, held, flash=flash,
                framework=job.planner.framework, fp8=fp8, cf=cf,
                grad_bytes=2.0 if job.training.grad_reduce_bf16 else _G,
                fp8_params=job.training.fp8_param_gather,
                loss=job.training.cross_entropy.value))
        out.append(worst / 1e9)
        j0 += c.pp
    return out
