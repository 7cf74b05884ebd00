"""Reading a HuggingFace ``config.json`` (Llama, Mistral, Mixtral, Qwen2, Qwen2-MoE, Qwen3,
Qwen3-MoE, GPT-2).

The shape and the architecture fields a runtime needs (normalization and its epsilon, position
embedding and RoPE base, biases, activation). Key names and defaults are those of the
``transformers`` config and attention classes of each architecture: ``LlamaConfig`` /
``Qwen2Config`` (``rms_norm_eps``, ``rope_theta``, ``hidden_act``; Llama's and Qwen3's
``attention_bias`` / ``mlp_bias``), ``Qwen2Attention`` (q/k/v projections always have a bias,
the output projection none), ``Qwen3Attention`` (RMSNorm of queries and keys per head),
``GPT2Config`` (``n_layer``, ``n_embd``, ``n_head``, ``n_inner``
default ``4 n_embd``, ``n_positions``, ``layer_norm_epsilon``, ``activation_function``; GPT-2 has
LayerNorm, learned positions, biases on every linear layer and a tied LM head).
"""

from __future__ import annotations

from typing import Any

from solver.spec.domain import ModelSpec
from solver.spec.errors import InputError
from solver.spec.fields import Fields
from solver.spec.model import check_model

_DENSE = frozenset({"LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM",
                    "Qwen3ForCausalLM"})
_MOE = frozenset({"MixtralForCausalLM", "Qwen2MoeForCausalLM", "Qwen3MoeForCausalLM"})
_GPT2 = frozenset({"GPT2LMHeadModel"})
#: Architectures whose q/k/v projections always carry a bias (transformers' Qwen2Attention).
_QKV_BIAS = frozenset({"Qwen2ForCausalLM", "Qwen2MoeForCausalLM"})
#: Architectures that normalize queries and keys per head (transformers' Qwen3Attention).
_QK_NORM = frozenset({"Qwen3ForCausalLM", "Qwen3MoeForCausalLM"})
# Keys we read; everything else in a config.json (dropout, dtype, rope scaling, ...) is irrelevant
# to the plan and the runtime's model flags.
_KEYS = ("num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads",
         "num_key_value_heads", "vocab_size", "tie_word_embeddings", "head_dim",
         "num_local_experts", "num_experts", "num_experts_per_tok", "moe_intermediate_size",
         "shared_expert_intermediate_size", "architectures", "model_type", "rms_norm_eps",
         "rope_theta", "hidden_act", "attention_bias", "mlp_bias", "max_position_embeddings",
         "n_layer", "n_embd", "n_head", "n_inner", "n_positions", "layer_norm_epsilon",
         "activation_function")
_GELU = ("gelu", "gelu_new", "gelu_fast", "gelu_pytorch_tanh")


def model_from_hf_config(data: Any, file: str, name: str) -> ModelSpec:
    """Build a ModelSpec from a parsed HuggingFace config.json.

    Parameters
    ----------
    data : Any
        Parsed JSON.
    file : str
        File name for error messages.
    name : str
        Model name to use (the folder name of the config, usually).
    """
    if not isinstance(data, dict):
        raise InputError(file, "<file>", "a HuggingFace config.json must be a JSON object")
    arch = data.get("architectures") or []
    known = _DENSE | _MOE | _GPT2
    if not isinstance(arch, list) or not arch or arch[0] not in known:
        raise InputError(file, "architectures",
                         f"got {arch!r}; supported: {', '.join(sorted(known))}")
    f = Fields({k: v for k, v in data.items() if k in _KEYS}, file)
    f.get("architectures", list)
    f.get("model_type", str, "")
    fields = _gpt2(f) if arch[0] in _GPT2 else _llama_like(f, arch[0])
    spec = ModelSpec(name=name, **fields)
    f.done()
    check_model(spec, f)
    return spec


def _llama_like(f: Fields, arch: str) -> dict[str, Any]:
    """Llama, Mistral, Qwen2/3 and their MoE variants: RMSNorm, RoPE, SwiGLU."""
    heads = f.get("num_attention_heads", int, lo=1)
    act = f.get("hidden_act", str, "silu")
    f.check("hidden_act", act == "silu", f"{act!r}: this architecture's gated MLP is read as "
            "SwiGLU, which needs hidden_act \"silu\"")
    # Llama/Qwen3: attention_bias puts a bias on q, k, v *and* o; mlp_bias on the MLP. Neither
    # is a Megatron option on its own (--add-qkv-bias covers q, k, v only), so refuse them.
    f.check("attention_bias", not f.get("attention_bias", bool, False),
            "attention_bias = true (a bias on the output projection too) is not modelled; "
            "only QKV biases (Qwen2) are")
    f.check("mlp_bias", not f.get("mlp_bias", bool, False), "mlp_bias = true is not modelled")
    f.get("max_position_embeddings", int, 0, lo=0)  # RoPE: the context length, no weights
    return dict(
        layers=f.get("num_hidden_layers", int, lo=1, hi=4096),
        hidden=f.get("hidden_size", int, lo=1),
        ffn=f.get("intermediate_size", int, lo=1),
        heads=heads,
        kv_heads=f.get("num_key_value_heads", int, heads, lo=1),
        vocab=f.get("vocab_size", int, lo=1),
        gated_mlp=True,
        tied_embeddings=f.get("tie_word_embeddings", bool, False),
        head_dim=f.get("head_dim", int, 0, lo=0) or 0,
        normalization="rmsnorm",
        norm_epsilon=f.get("rms_norm_eps", float, 1e-6, lo=0, lo_open=True, hi=1.0),
        position_embedding="rope",
        rotary_base=f.get("rope_theta", float, 10000.0, lo=0, lo_open=True),
        bias=False,
        qkv_bias=arch in _QKV_BIAS,
        qk_norm=arch in _QK_NORM,
        **_moe_fields(f, arch),
    )


def _gpt2(f: Fields) -> dict[str, Any]:
    """GPT-2 (and GPT-3-shaped configs written in its format)."""
    hidden = f.get("n_embd", int, lo=1)
    act = f.get("activation_function", str, "gelu_new")
    f.check("activation_function", act in _GELU, f"{act!r}: GPT-2 style models are read with a "
            f"GELU MLP ({', '.join(_GELU)})")
    heads = f.get("n_head", int, lo=1)
    inner = f.get("n_inner", object, None)  # null: 4 n_embd (GPT2Config)
    f.check("n_inner", inner is None or (type(inner) is int and inner >= 1),
            f"must be null or a positive integer, got {inner!r}")
    return dict(
        layers=f.get("n_layer", int, lo=1, hi=4096),
        hidden=hidden,
        ffn=inner or 4 * hidden,
        heads=heads, kv_heads=heads,
        vocab=f.get("vocab_size", int, lo=1),
        gated_mlp=False,
        tied_embeddings=f.get("tie_word_embeddings", bool, True),
        normalization="layernorm",
        norm_epsilon=f.get("layer_norm_epsilon", float, 1e-5, lo=0, lo_open=True, hi=1.0),
        position_embedding="learned",
        max_positions=f.get("n_positions", int, 1024, lo=1),
        bias=True, qkv_bias=True,
    )


def _moe_fields(f: Fields, arch: str) -> dict[str, int]:
    if arch not in _MOE:
        return {}
    if arch == "MixtralForCausalLM":
        experts = f.get("num_local_experts", int, lo=1)
        expert_ffn = f.get("intermediate_size", int, lo=1)
        shared = 0
    else:
        experts = f.get("num_experts", int, lo=1)
        expert_ffn = f.get("moe_intermediate_size", int, lo=1)
        shared_width = f.get("shared_expert_intermediate_size", int, 0, lo=0)
        # Qwen2-MoE has one shared expert of its own width; count it in expert-ffn units.
        shared = round(shared_width / expert_ffn) if shared_width else 0
    return {"experts": experts, "top_k": f.get("num_experts_per_tok", int, lo=1),
            "expert_ffn": expert_ffn, "shared_experts": shared}
