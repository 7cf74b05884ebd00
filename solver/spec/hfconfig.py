"""Reading a HuggingFace ``config.json`` (Llama, Mistral, Mixtral, Qwen2, Qwen2-MoE, Qwen3, Qwen3-MoE).

Only the shape matters to the planner; the key names are those of the ``transformers`` config
classes of each architecture.
"""

from __future__ import annotations

from typing import Any

from solver.spec.domain import ModelSpec
from solver.spec.errors import InputError
from solver.spec.fields import Fields
from solver.spec.model import check_model

_DENSE = frozenset({"LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM"})
_MOE = frozenset({"MixtralForCausalLM", "Qwen2MoeForCausalLM", "Qwen3MoeForCausalLM"})
# Keys we read; everything else in a config.json (dropout, rope, dtype, ...) is irrelevant here.
_SHAPE_KEYS = ("num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads",
               "num_key_value_heads", "vocab_size", "tie_word_embeddings", "head_dim",
               "num_local_experts", "num_experts", "num_experts_per_tok", "moe_intermediate_size",
               "shared_expert_intermediate_size", "architectures", "model_type")


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
    if not isinstance(arch, list) or not arch or arch[0] not in _DENSE | _MOE:
        supported = ", ".join(sorted(_DENSE | _MOE))
        raise InputError(file, "architectures", f"got {arch!r}; supported: {supported}")
    shape = {k: v for k, v in data.items() if k in _SHAPE_KEYS}
    f = Fields(shape, file)
    f.get("architectures", list)
    f.get("model_type", str, "")
    heads = f.get("num_attention_heads", int, lo=1)
    spec = ModelSpec(
        name=name,
        layers=f.get("num_hidden_layers", int, lo=1, hi=4096),
        hidden=f.get("hidden_size", int, lo=1),
        ffn=f.get("intermediate_size", int, lo=1),
        heads=heads,
        kv_heads=f.get("num_key_value_heads", int, heads, lo=1),
        vocab=f.get("vocab_size", int, lo=1),
        gated_mlp=True,
        tied_embeddings=f.get("tie_word_embeddings", bool, False),
        head_dim=f.get("head_dim", int, 0, lo=0) or 0,
        **_moe_fields(f, arch[0]),
    )
    f.done()
    check_model(spec, f)
    return spec


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
