"""The model block of an export: the architecture fields as Megatron-LM flags.

Flag names and meanings as Megatron-LM (NVIDIA/Megatron-LM ``core_v0.14.0``,
``megatron/training/arguments.py``) defines them; FlagScale passes every key of its ``model``
block through as the flag of the same name (``flagscale/runner/runner_train.py``,
``_get_args_megatron`` -> ``flatten_dict_to_args``: ``_`` becomes ``-``, ``true`` a bare flag,
``false`` nothing, a list its items), so both exports write these keys.

* ``_add_network_size_args``: ``--num-layers``, ``--hidden-size``, ``--ffn-hidden-size``,
  ``--num-attention-heads``, ``--kv-channels`` (head width), ``--group-query-attention`` with
  ``--num-query-groups`` (KV heads), ``--max-position-embeddings``,
  ``--position-embedding-type`` (``learned_absolute`` default, ``rope``), ``--rotary-base``
  (``type=int``), ``--normalization`` (``LayerNorm`` default, ``RMSNorm``), ``--norm-epsilon``,
  ``--swiglu`` (gated SiLU; without it the MLP is GELU, the default),
  ``--untie-embeddings-and-output-weights``.
* ``_add_training_args``: ``--disable-bias-linear`` (``dest=add_bias_linear``, biases are on by
  default) and ``--add-qkv-bias``; ``validate_args`` sets ``add_qkv_bias`` whenever
  ``add_bias_linear`` is on.
* ``_add_vision_args``: ``--qk-layernorm`` (per-head query/key norm).
* ``_add_tokenizer_args``: ``--padded-vocab-size``. The model is built with
  ``vocab_size=args.padded_vocab_size`` (``pretrain_gpt.py``, ``model_provider``);
  ``build_tokenizer`` (``megatron/training/tokenizer/tokenizer.py``) fills it from the tokenizer,
  padded to ``--make-vocab-size-divisible-by`` x TP, only when it is unset. So the export pins
  it: the model's vocabulary, rounded up to a multiple of every mesh's TP (the vocab-parallel
  embedding splits its rows evenly: ``VocabUtility.vocab_range_from_global_vocab_size`` ->
  ``divide``). ``--vocab-size`` is read only by the null tokenizers.
* ``_add_moe_args``: ``--num-experts``, ``--moe-router-topk``, ``--moe-ffn-hidden-size``,
  ``--moe-shared-expert-intermediate-size``; ``--moe-token-dispatcher-type alltoall`` and
  ``--moe-grouped-gemm``, because the cost model prices the all-to-all dispatcher and a rank's
  experts as grouped GEMMs, while Megatron-Core defaults to the ``allgather`` dispatcher and a
  loop over the experts (``TransformerConfig``: ``moe_token_dispatcher_type = "allgather"``,
  ``moe_grouped_gemm = False``).
"""

from __future__ import annotations

import math

from solver.launch.errors import NotExpressible
from solver.planner.plan import Plan

__all__ = ["model_flags", "padded_vocab"]


def padded_vocab(vocab: int, tps: list[int] | tuple[int, ...]) -> int:
    """``vocab`` rounded up to a multiple of every TP degree in ``tps``."""
    step = math.lcm(*tps) if tps else 1
    return -(-vocab // step) * step


def model_flags(plan: Plan, tps: list[int] | tuple[int, ...] = ()) -> dict[str, object]:
    """The model's shape and architecture as Megatron flags (keys with underscores).

    Parameters
    ----------
    plan : Plan
        The plan (its job's model and sequence length).
    tps : sequence of int
        TP degrees of the plan's meshes (the padded vocabulary divides by each).
    """
    m, seq = plan.job.model, plan.job.training.seq_len
    out: dict[str, object] = {
        "num_layers": m.layers, "hidden_size": m.hidden, "ffn_hidden_size": m.ffn,
        "num_attention_heads": m.heads, "kv_channels": m.d_head,
        "seq_length": seq, "max_position_embeddings": _positions(m, seq),
        "normalization": "LayerNorm" if m.normalization == "layernorm" else "RMSNorm",
        "norm_epsilon": m.norm_epsilon,
        "position_embedding_type": "rope" if m.position_embedding == "rope" else
        "learned_absolute",
        "swiglu": m.activation == "swiglu",
        "disable_bias_linear": not m.bias, "add_qkv_bias": m.has_qkv_bias,
        "qk_layernorm": m.qk_norm,
        "untie_embeddings_and_output_weights": not m.tied_embeddings,
        "padded_vocab_size": padded_vocab(m.vocab, tps),
    }
    if m.position_embedding == "rope":
        out["rotary_base"] = _rotary_base(m.rotary_base)
    if m.kv_heads != m.heads:
        out.update(group_query_attention=True, num_query_groups=m.kv_heads)
    if m.is_moe:
        out.update(num_experts=m.experts, moe_router_topk=m.top_k,
                   moe_ffn_hidden_size=m.expert_ffn, moe_token_dispatcher_type="alltoall",
                   moe_grouped_gemm=True)
        if m.shared_experts:
            out["moe_shared_expert_intermediate_size"] = m.shared_experts * m.expert_ffn
    return out


def _positions(m, seq: int) -> int:
    """``--max-position-embeddings``: the sequence length with RoPE (no table); the learned
    table's rows, which must cover the sequence."""
    if m.position_embedding != "learned":
        return seq
    if seq > m.max_positions:
        raise NotExpressible(f"seq_len {seq} exceeds the model's learned position table "
                             f"({m.max_positions} rows)")
    return m.max_positions


def _rotary_base(base: float) -> int:
    """Megatron-LM reads ``--rotary-base`` as an integer."""
    if base != int(base):
        raise NotExpressible(f"rotary_base {base:g} is not an integer: Megatron-LM's "
                             "--rotary-base is type=int")
    return int(base)
