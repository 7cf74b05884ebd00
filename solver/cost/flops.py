"""Model FLOPs per trained token (the MFU numerator, and the compute floors' attention share)."""

from __future__ import annotations

from solver.spec.domain import ModelSpec

__all__ = ["attention_flops_per_token", "model_flops_per_token"]


def model_flops_per_token(model: ModelSpec, seq_len: int) -> float:
    """Model FLOPs per trained token without recomputation: 3 x (forward GEMMs + attention).

    Forward: ``2 x`` active matmul weights of every layer and the LM head, plus ``4 s a d_head``
    per layer for the attention core (Narayanan et al. SC'21 count; equals
    ``72 B s l h^2 (1 + s/6h + V/12lh)`` per iteration for GPT).
    """
    per_layer = model.active_params_per_layer - model.norm_params
    forward = model.layers * 2.0 * per_layer + 2.0 * model.vocab * model.hidden
    return 3.0 * forward + attention_flops_per_token(model, seq_len)


def attention_flops_per_token(model: ModelSpec, seq_len: int) -> float:
    """The attention-core part of :func:`model_flops_per_token`: ``3 x 4 s a d_head`` per
    layer (the full square, as Megatron counts it; a fused kernel executes half of it)."""
    return 3.0 * model.layers * 4.0 * seq_len * model.heads * model.d_head
