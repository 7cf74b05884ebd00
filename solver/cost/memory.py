"""Per-GPU memory of a stage: model states (eq. 1 of the seed note) and activations, vectorized.

Model states (Rajbhandari et al., "ZeRO", SC'20; Megatron-LM's mixed-precision layout):
bf16 weights 2 B/param, fp32 main gradients 4 B/param (Megatron accumulates and reduces gradients
in fp32 for bf16 training), fp32 Adam master weights + m + v 12 B/param: 18 B/param without ZeRO.
A run with ``--grad-reduce-in-bf16`` keeps 2 B of gradient, one with ``--fp8-param-gather`` 1 B
of FP8 weight (:func:`weight_bytes`), where a job asks (``[training] grad_reduce``,
``fp8_param_gather``).
ZeRO-1 shards the optimizer states, ZeRO-2 also the gradients, ZeRO-3 also the weights, over the
``dp * cp`` ranks holding the same weights (experts: over the expert-data-parallel group,
``tp * cp * dp / (expert_tp * ep)``). ZeRO-3 also holds a
prefetch buffer of two gathered layers.

Activations (Korthikanti et al., "Reducing Activation Recomputation in Large Transformer Models",
MLSys 2023 / arXiv 2205.05198): a GPT layer stores ``s b h (34 + 5 a s / h)`` bytes; the count is
redone here tensor by tensor for GQA, gated MLPs, MoE, FlashAttention and no dropout (see
:func:`activation_bytes_per_token`). Tensor parallelism with sequence parallelism divides
everything by ``tp``; context parallelism divides the sequence by ``cp``. Stage ``i`` of a 1F1B
pipeline holds ``min(p - i, m)`` micro-batches of activations (Narayanan et al., SC'21).
PyTorch's caching allocator holds :data:`~solver.cost.reserve.FRAGMENTATION` more than the
activations it serves; what the runtime holds outside it is the cap's part
(:func:`~solver.cost.reserve.usable_bytes`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from solver.cost.reserve import FRAGMENTATION
from solver.cost.stage import RECOMPUTE_CODES, ConfigArrays, expert_tp, recomputed_layers
from solver.spec.domain import CrossEntropyKernel, ModelSpec, Recompute

WEIGHT_BYTES = 2.0      # bf16 weights
GRAD_BYTES = 4.0        # fp32 main gradients (Megatron-LM, bf16 training)
GRAD_BF16_BYTES = 2.0   # bf16 gradient buffers (--grad-reduce-in-bf16)
OPTIMIZER_BYTES = 12.0  # fp32 master weights + Adam m + v
#: Per logit at Megatron-LM's unfused loss, the default (see
#: :attr:`~solver.spec.enums.CrossEntropyKernel.held_bytes_per_logit`).
LOGIT_BYTES = CrossEntropyKernel.UNFUSED.held_bytes_per_logit
ZERO3_PREFETCH_LAYERS = 2.0  # gathered layers held by ZeRO-3 (current + prefetched)
FP8_CACHE_BYTES = 2.0   # Transformer Engine's cached FP8 weight and its transpose, per param
FP8_PARAM_BYTES = 1.0   # FP8 weights stored as the parameters (--fp8-param-gather)


@dataclass(frozen=True)
class LayerParams:
    """Weights of one layer, split by how they are sharded.

    Attributes
    ----------
    dense : int
        Attention, norms, router and shared experts: sharded by ``tp``, replicated ``dp * cp``.
    expert : int
        Routed experts: sharded by ``expert_tp * ep``, replicated ``tp * cp * dp / (expert_tp * ep)``.
    """

    dense: int
    expert: int

    @classmethod
    def of(cls, model: ModelSpec) -> "LayerParams":
        """Split of ``model``'s per-layer weights."""
        expert = model.experts * model.expert_params if model.is_moe else 0
        return cls(model.params_per_layer - expert, expert)


def _mlp_intermediate_bytes(model: ModelSpec, width: int, gemm_input: float = 2.0) -> float:
    """Bytes per token an MLP of ``width`` stores between its two projections.

    Gated (SwiGLU): both up-projection outputs (4 f, the fused activation recomputes SiLU in
    backward) and their product, the down-projection input (2 f). Classic GELU MLP: the GELU input
    and output (2 f each), as in Korthikanti et al. ``gemm_input``: bytes per element of the
    saved down-projection input (1 under FP8: Transformer Engine saves it quantized).
    """
    return ((4.0 if model.gated_mlp else 2.0) + gemm_input) * width


def activation_bytes_per_token(model: ModelSpec, seq_len: int, recompute: Recompute,
                               flash: bool = True, dropout: bool = False,
                               capacity: float = 1.0, fp8: bool = False) -> float:
    """Activation bytes one layer stores per token for its backward pass (no parallelism).

    Korthikanti et al. (2022), Sec. 4.1, recounted. Attention: norm input 2h, QKV input 2h, Q 2q,
    K and V 2kv each, attention output (O-projection input) 2q, and either FlashAttention's fp32
    log-sum-exp (4 per head) or the materialised scores (softmax output 2as, plus dropout mask as
    and output 2as with dropout). MLP: norm input 2h, MLP input 2h and the intermediate
    (:func:`_mlp_intermediate_bytes`). MoE: router input 2h and fp32 router probabilities 4E; each
    of the k routed copies stores its permuted input 2h, intermediate and output 2h. Dropout adds
    1-byte masks after attention and MLP. With ``flash=False, dropout=True`` and a GPT shape
    (f = 4h, MHA) this is exactly ``34 h + 5 a s``.

    Selective recomputation drops the attention-score terms (nothing with FlashAttention, which
    already recomputes them); full recomputation keeps only the layer input, 2h.

    With ``fp8`` Transformer Engine saves the inputs of its FP8 GEMMs quantized, one byte per
    element (``transformer_engine/pytorch/module/layernorm_linear.py``, ``linear.py``,
    ``layernorm_mlp.py``: the forward's "Prepare backward state" saves ``ln_out`` /
    ``inputmat`` / the activation output as quantized tensors): the QKV, fc1 and expert fc1
    inputs (h), the fc2 inputs (f); the O-projection saves an FP8 copy of its input (q) beside
    FlashAttention's own 16-bit output, which the attention backward needs.
    """
    h, a = model.hidden, model.heads
    if recompute is Recompute.FULL:
        return 2.0 * h
    q, kv = a * model.d_head, model.kv_heads * model.d_head
    scores = 0.0
    if not flash and recompute is Recompute.NONE:
        scores = (5.0 if dropout else 2.0) * a * seq_len
    softmax_stats = 4.0 * a if flash else 0.0
    g = 1.0 if fp8 else 2.0  # bytes per element of a saved GEMM input
    o_copy = q if fp8 else 0.0
    attention = 2 * h + g * h + 2 * q + 4 * kv + 2 * q + o_copy + scores + softmax_stats
    if model.is_moe:
        # The busiest rank holds ``capacity`` times the balanced share of routed tokens.
        routed = capacity * model.top_k * (
            (g + 2.0) * h + _mlp_intermediate_bytes(model, model.expert_ffn, g))
        shared = model.shared_experts * _mlp_intermediate_bytes(model, model.expert_ffn, g)
        mlp = 2 * h + 2 * h + 4.0 * model.experts + routed + shared
    else:
        mlp = 2 * h + g * h + _mlp_intermediate_bytes(model, model.ffn, g)
    masks = 2.0 * h if dropout else 0.0
    return attention + mlp + masks


def stored_bytes_per_token(model: ModelSpec, seq_len: int, flash: bool = True,
                           capacity: float = 1.0, fp8: bool = False) -> np.ndarray:
    """:func:`activation_bytes_per_token` for each recompute code (index: RECOMPUTE_CODES)."""
    return np.array([activation_bytes_per_token(model, seq_len, r, flash, capacity=capacity,
                                                fp8=fp8)
                     for r in RECOMPUTE_CODES])


def stored_layer_bytes(per_token: np.ndarray, cfg: ConfigArrays, layers: np.ndarray
                       ) -> np.ndarray:
    """Bytes per token one micro-batch of ``layers`` layers keeps for its backward pass.

    ``per_token`` is :func:`stored_bytes_per_token`. Under full recomputation the ``r``
    recomputed layers (:func:`~solver.cost.stage.recomputed_layers`: all, or the block
    method's ``min(k, layers)``) keep only their input and the other ``layers - r`` keep their
    whole activations, as without recomputation (Megatron-Core's ``block`` method runs the
    layers past the first ``k`` of a pipeline rank unchanged: ``megatron/core/recompute.py``,
    ``checkpointed_forward``)."""
    r = recomputed_layers(cfg, layers)
    return np.where(cfg.recompute == 2, r * per_token[2] + (layers - r) * per_token[0],
                    per_token[cfg.recompute] * layers)


def recompute_saving(model: ModelSpec, seq_len: int, cfg: ConfigArrays, flash: bool = True,
                     capacity: float = 1.0) -> np.ndarray:
    """HBM bytes one more recomputed layer saves per micro-batch in flight: its whole
    activations less its kept input, ``(stored(none) - stored(full)) b s / (cp tp)``, and the
    allocator's fragmentation of them (``FRAGMENTATION``)."""
    per_token = stored_bytes_per_token(model, seq_len, flash, capacity)
    return ((1.0 + FRAGMENTATION) * (per_token[0] - per_token[2]) * cfg.micro_batch * seq_len
            / cfg.cp / cfg.tp)


@dataclass(frozen=True)
class MemoryArrays:
    """Per-GPU memory of one (sub-)stage in bytes, one entry per configuration.

    Attributes
    ----------
    params, grads, optimizer, activations : numpy.ndarray
        Weights (incl. ZeRO-3 prefetch buffer), gradients, optimizer states, activations.
    host : numpy.ndarray
        Offloaded activations in host memory (not part of ``total``).
    fragmentation : numpy.ndarray
        What the caching allocator holds beyond the activations in HBM
        (:data:`~solver.cost.reserve.FRAGMENTATION` of them).
    """

    params: np.ndarray
    grads: np.ndarray
    optimizer: np.ndarray
    activations: np.ndarray
    host: np.ndarray
    fragmentation: np.ndarray

    @property
    def total(self) -> np.ndarray:
        """HBM bytes: the four parts and the fragmentation."""
        return self.params + self.grads + self.optimizer + self.activations + self.fragmentation


def param_counts(model: ModelSpec, cfg: ConfigArrays, layers: np.ndarray, emb: np.ndarray,
                 head: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Dense and expert parameters held per GPU before ZeRO (after tp / ep sharding).

    The first sub-stage holds the embedding, the last the LM head (a copy even when tied, as
    Megatron does; a single stage holding both keeps one tied matrix).
    """
    lp = LayerParams.of(model)
    # Embedding (and a learned position table) on the first stage; LM head and final norm on
    # the last (only the final norm where the head is tied to the embedding on the same stage).
    vh = float(model.embedding_params)
    head_params = np.where(emb & model.tied_embeddings, model.final_norm_params,
                           model.head_params)
    dense = (layers * lp.dense + emb * vh + head * head_params) / cfg.tp
    expert = layers * lp.expert / (expert_tp(cfg) * cfg.ep)
    return dense, expert


def largest_matrix(model: ModelSpec) -> float:
    """Parameters of the layer's largest weight matrix (before sharding)."""
    q, kv, h = model.heads * model.d_head, model.kv_heads * model.d_head, model.hidden
    width = max(model.ffn, model.expert_ffn if model.is_moe else 0)
    up = 2 if model.gated_mlp else 1
    # The fused QKV and the (gated) up-projection; the output and down projections are never
    # larger (q·h ≤ h·(q + 2kv), width·h ≤ up·h·width).
    return float(max(h * (q + 2 * kv), up * h * width))


def weight_bytes(fp8: bool, fp8_params: bool = False) -> float:
    """Bytes per held parameter of the weights a GPU keeps: 16-bit weights, plus Transformer
    Engine's FP8 copy and transpose under FP8; with ``fp8_params`` (Megatron-Core's
    ``--fp8-param-gather``, Transformer Engine FP8 tensors as the model's parameters, the fp32
    master in the distributed optimizer) the FP8 weights alone."""
    if fp8 and fp8_params:
        return FP8_PARAM_BYTES
    return WEIGHT_BYTES + (FP8_CACHE_BYTES if fp8 else 0.0)


def least_state_bytes(grad_reduce_bf16: bool = False, fp8_param_gather: bool = False
                      ) -> float:
    """The fewest model-state bytes per parameter any configuration of a job holds, summed over
    its GPUs (every state sharded once): weights (1 with FP8 weights, else 2), gradients (2 in
    bf16, else 4) and Adam (12). 18 with Megatron-LM's defaults."""
    return (weight_bytes(fp8_param_gather, fp8_param_gather)
            + (GRAD_BF16_BYTES if grad_reduce_bf16 else GRAD_BYTES) + OPTIMIZER_BYTES)


def model_state_bytes(model: ModelSpec, cfg: ConfigArrays, layers: np.ndarray, emb: np.ndarray,
                      head: np.ndarray, zero3_per_module: bool = False, fp8: bool = False,
                      grad_bytes: float = GRAD_BYTES, fp8_params: bool = False
                      ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Weight, gradient and optimizer bytes per GPU under ZeRO (Rajbhandari et al. 2020).

    ZeRO-3 holds gathered weights beside its shard: two whole layers (current and prefetched,
    FSDP's per-layer wrapping), or with ``zero3_per_module`` two of the largest weight matrices
    (DeepSpeed gathers submodule by submodule, prefetching the next). With ``fp8`` Transformer
    Engine keeps, beside the 16-bit weights, an FP8 copy and its transpose of every weight it
    holds (``FP8_CACHE_BYTES``), reused across micro-batches; :func:`weight_bytes` says what
    ``fp8_params`` changes. ``grad_bytes``: the gradient buffer's bytes per parameter (4, fp32,
    Megatron-LM's default for bf16; 2 with ``--grad-reduce-in-bf16``).
    """
    dense, expert = param_counts(model, cfg, layers, emb, head)
    q_dense = (cfg.dp * cfg.cp).astype(float)
    # The expert-data-parallel group: the stage's tp·cp·dp GPUs over expert-TP × EP.
    q_expert = q_dense * cfg.tp / (expert_tp(cfg) * cfg.ep)

    def sharded(stage: int) -> np.ndarray:
        on = cfg.zero >= stage
        return np.where(on, dense / q_dense, dense) + np.where(on, expert / q_expert, expert)

    lp = LayerParams.of(model)
    if zero3_per_module:
        prefetch = np.minimum(layers, 1) * 2.0 * largest_matrix(model) / cfg.tp
    else:
        gathered = np.minimum(layers, ZERO3_PREFETCH_LAYERS)
        prefetch = gathered * (lp.dense / cfg.tp + lp.expert / (expert_tp(cfg) * cfg.ep))
    live = sharded(3) + np.where(cfg.zero >= 3, prefetch, 0.0)
    return (weight_bytes(fp8, fp8_params) * live, grad_bytes * sharded(2),
            OPTIMIZER_BYTES * sharded(1))


def activation_bytes(model: ModelSpec, seq_len: int, cfg: ConfigArrays, layers: np.ndarray,
                     head: np.ndarray, in_flight: np.ndarray, resident: float,
                     flash: bool = True, capacity: float = 1.0, fp8: bool = False,
                     logit_bytes: float = LOGIT_BYTES) -> tuple[np.ndarray, np.ndarray]:
    """Activation bytes per GPU in HBM and in host memory (offload).

    HBM: in-flight micro-batches x stored layers (:func:`stored_layer_bytes`: with the block
    method the recomputed layers keep their input, the others everything), plus working sets.

    Per micro-batch a GPU sees ``b s / cp`` tokens, sharded ``tp`` ways (sequence parallelism).
    Offload keeps only ``resident`` micro-batches in HBM, the rest in host memory. Full recomputation adds one layer's
    complete activations (the layer being recomputed during backward, Korthikanti et al.). The
    head stage adds the final-norm and head inputs (4h per token per in-flight micro-batch) and
    one micro-batch of logits at the loss, ``logit_bytes`` each (:data:`LOGIT_BYTES` for
    Megatron-LM's unfused cross entropy).
    """
    tokens = cfg.micro_batch * seq_len / cfg.cp / cfg.tp
    per_token = stored_bytes_per_token(model, seq_len, flash, capacity, fp8)
    held = np.where(cfg.offload, np.minimum(in_flight, resident), in_flight)
    per_micro = stored_layer_bytes(per_token, cfg, layers) * tokens
    working = np.where(cfg.recompute == 2, per_token[0] * tokens, 0.0)
    head_bytes = head * tokens * (4.0 * model.hidden * held + logit_bytes * model.vocab)
    return per_micro * held + working + head_bytes, per_micro * (in_flight - held)


def substage_memory(model: ModelSpec, seq_len: int, cfg: ConfigArrays, layers: np.ndarray,
                    emb: np.ndarray, head: np.ndarray, in_flight: np.ndarray,
                    resident: float, flash: bool = True, zero3_per_module: bool = False,
                    fp8: bool = False, capacity: float = 1.0, grad_bytes: float = GRAD_BYTES,
                    fp8_params: bool = False, logit_bytes: float = LOGIT_BYTES) -> MemoryArrays:
    """Memory per GPU of a sub-stage with ``layers`` layers holding ``in_flight`` micro-batches
    (``flash``: FlashAttention, no stored scores; the last two as in :func:`model_state_bytes`).
    Activations are counted in 16 bits also with FP8 GEMMs (conservative: Transformer Engine
    may keep some GEMM inputs in FP8)."""
    weights, grads, optim = model_state_bytes(model, cfg, layers, emb, head, zero3_per_module,
                                              fp8, grad_bytes, fp8_params)
    acts, host = activation_bytes(model, seq_len, cfg, layers, head, in_flight, resident, flash,
                                  capacity, fp8, logit_bytes)
    return MemoryArrays(weights, grads, optim, acts, host, FRAGMENTATION * acts)
