"""FP8 quantization traffic: the casts an FP8 layer runs that a 16-bit one does not.

Transformer Engine quantizes every GEMM operand it feeds an FP8 GEMM: the activations entering
each projection in the forward pass and the gradients entering the data- and weight-gradient
GEMMs in the backward pass (weights are quantized once per iteration and cached over the
micro-batches, not priced). Per element, through HBM (``transformer_engine/pytorch/csrc``):

* per-tensor current scaling (``fp8-cs``, and ``fp8`` priced the same): an amax pass reading
  the 16-bit tensor, then the cast reading it again and writing one byte: 5 bytes; 3 where the
  operand is a norm's output, whose kernel computes the amax as it writes
  (``normalization.cpp``, ``FUSED_NORM_AMAX_FP8``). GPUs whose FP8 GEMMs take only the TN layout
  (Hopper, Ada: ``nvte_is_non_tn_fp8_gemm_supported`` false, ``quantizer.cpp``) also write a
  transposed copy for the weight-gradient GEMM: one byte more;
* MXFP8 (``fp8-mx``, Blackwell): no amax pass (the block scales come from the cast itself), but
  row-wise and column-wise blocks, both written: 2 + 2 = 4 bytes, norm outputs included (the
  norm kernel writes 16 bits, then the quantizer runs).

Operands per GPU and layer for ``n`` tokens (TP shards; with sequence parallelism TE casts the
sequence shard before its all-gather): forward, the QKV and up-projection inputs (norm outputs,
``n / tp`` tokens of ``h``), the output projection's (``n`` of ``q / tp``) and the
down-projection's (``n`` of ``f / tp``); backward, the output gradients of the same four GEMMs.
MoE layers cast the routed tokens instead of the dense MLP's (``etp n / tp k`` rows times the
capacity factor, ``h`` and ``f_e / etp`` wide), and the shared experts' as a dense MLP's; the
router stays in 16 bits.
"""

from __future__ import annotations

import numpy as np

from solver.spec.domain import Island, ModelSpec, Precision

__all__ = ["cast_bytes", "layer_cast_bytes"]


def cast_bytes(island: Island, precision: Precision, fp8: bool) -> tuple[float, float]:
    """Bytes per element of one FP8 cast on ``island``: (operand written by a norm, any other);
    zeros when the stage does not run FP8 GEMMs (``fp8`` false)."""
    if not fp8:
        return 0.0, 0.0
    if precision is Precision.FP8_MX:
        return 4.0, 4.0
    # Blackwell (the GPUs with MXFP8) runs FP8 GEMMs in any layout: no transposed copy.
    transposed = 0.0 if all(g.mxfp8 for g in island.gpu_types) else 1.0
    return 3.0 + transposed, 5.0 + transposed


def layer_cast_bytes(model: ModelSpec, tp, etp, n, capacity: float, from_norm: float,
                     other: float) -> tuple[np.ndarray, np.ndarray]:
    """HBM bytes of one layer's FP8 casts on one GPU, (forward, backward), for ``n`` tokens
    under TP ``tp`` and expert-TP ``etp`` (arrays broadcast); ``from_norm`` and ``other`` the
    bytes per element of :func:`cast_bytes` (the module docstring lists the operands)."""
    h, up = model.hidden, (2 if model.gated_mlp else 1)
    q, kv = model.heads * model.d_head, model.kv_heads * model.d_head
    n = np.asarray(n, dtype=float)
    shard = n / tp  # a sequence shard of h-wide tokens
    fwd = from_norm * shard * h + other * n * q / tp
    bwd = other * (shard * h + n * (q + 2 * kv) / tp)
    if not model.is_moe:
        return (fwd + from_norm * shard * h + other * n * model.ffn / tp,
                bwd + other * (shard * h + n * up * model.ffn / tp))
    rows = etp * shard * model.top_k * capacity
    fwd = fwd + other * rows * (h + model.expert_ffn / etp)
    bwd = bwd + other * rows * (h + up * model.expert_ffn / etp)
    if model.shared_experts:
        width = model.shared_experts * model.expert_ffn
        fwd = fwd + other * (shard * h + n * width / tp)
        bwd = bwd + other * (shard * h + n * up * width / tp)
    return fwd, bwd
