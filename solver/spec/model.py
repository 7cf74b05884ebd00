"""The model domain type: a decoder-only Transformer's shape and its parameter counts.

Re-exported by ``solver.spec.domain`` with the other domain types.
"""

from __future__ import annotations

from dataclasses import dataclass

from solver.spec.fields import Fields


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only Transformer (dense or MoE), as in its published config.

    Attributes
    ----------
    name : str
        Model name.
    layers, hidden, ffn, heads, kv_heads, vocab : int
        Shape; ``ffn`` is the dense MLP width (unused by MoE layers except shared experts).
    gated_mlp : bool
        SwiGLU MLP with three matrices (else the classic two).
    tied_embeddings : bool
        LM head shares the embedding matrix.
    experts, top_k, expert_ffn, shared_experts : int
        MoE shape; ``experts == 0`` means dense. Shared experts have width ``expert_ffn`` each.
    head_dim : int
        Attention head width (``hidden // heads`` unless the config says otherwise, e.g. Qwen3).
    """

    name: str
    layers: int
    hidden: int
    ffn: int
    heads: int
    kv_heads: int
    vocab: int
    gated_mlp: bool = True
    tied_embeddings: bool = False
    experts: int = 0
    top_k: int = 0
    expert_ffn: int = 0
    shared_experts: int = 0
    head_dim: int = 0

    @property
    def is_moe(self) -> bool:
        """True when the MLP blocks are mixtures of experts."""
        return self.experts > 0

    @property
    def d_head(self) -> int:
        """Attention head width."""
        return self.head_dim or self.hidden // self.heads

    @property
    def attention_params(self) -> int:
        """Q, K, V, O projection weights of one layer (GQA: K and V have ``kv_heads`` heads)."""
        q_o = 2 * self.hidden * self.heads * self.d_head
        k_v = 2 * self.hidden * self.kv_heads * self.d_head
        return q_o + k_v

    @property
    def _mats(self) -> int:
        return 3 if self.gated_mlp else 2

    @property
    def dense_mlp_params(self) -> int:
        """Weights of one dense MLP block."""
        return self._mats * self.hidden * self.ffn

    @property
    def expert_params(self) -> int:
        """Weights of one routed (or shared) expert."""
        return self._mats * self.hidden * self.expert_ffn

    @property
    def mlp_params(self) -> int:
        """Stored MLP weights of one layer (all experts, router and shared experts for MoE)."""
        if not self.is_moe:
            return self.dense_mlp_params
        router = self.hidden * self.experts
        return router + (self.experts + self.shared_experts) * self.expert_params

    @property
    def active_mlp_params(self) -> int:
        """MLP weights one token passes through (top-k routed + shared experts)."""
        if not self.is_moe:
            return self.dense_mlp_params
        router = self.hidden * self.experts
        return router + (self.top_k + self.shared_experts) * self.expert_params

    @property
    def norm_params(self) -> int:
        """Two RMSNorm/LayerNorm weight vectors per layer."""
        return 2 * self.hidden

    @property
    def params_per_layer(self) -> int:
        """Stored weights of one Transformer layer."""
        return self.attention_params + self.mlp_params + self.norm_params

    @property
    def active_params_per_layer(self) -> int:
        """Weights one token's matmuls use in one layer."""
        return self.attention_params + self.active_mlp_params + self.norm_params

    @property
    def embedding_params(self) -> int:
        """Input embedding table (held by the first pipeline stage)."""
        return self.vocab * self.hidden

    @property
    def head_params(self) -> int:
        """LM head (held by the last stage); stored there even when tied (Megatron keeps a copy)."""
        return self.vocab * self.hidden + self.hidden

    @property
    def total_params(self) -> int:
        """All stored weights (tied embeddings counted once)."""
        head = self.hidden if self.tied_embeddings else self.head_params
        return self.layers * self.params_per_layer + self.embedding_params + head


def check_model(m: ModelSpec, f: Fields) -> None:
    """Cross-field checks of a model shape."""
    if not m.head_dim:
        f.check("heads", m.hidden % m.heads == 0,
                f"{m.heads} heads do not divide hidden {m.hidden}")
    f.check("kv_heads", m.heads % m.kv_heads == 0,
            f"{m.kv_heads} kv_heads do not divide heads {m.heads}")
    if m.experts:
        f.check("top_k", 1 <= m.top_k <= m.experts,
                f"top_k must be in 1..experts ({m.experts}), got {m.top_k}")
        f.check("expert_ffn", m.expert_ffn >= 1, "an MoE model needs expert_ffn >= 1")
    else:
        f.check("top_k", m.top_k == 0, "top_k needs experts > 0")
        f.check("shared_experts", m.shared_experts == 0, "shared_experts needs experts > 0")
