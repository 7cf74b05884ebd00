"""The model domain type: a decoder-only Transformer's shape, architecture and parameter counts.

Re-exported by ``solver.spec.domain`` with the other domain types. The architecture fields
(normalization, position embedding, biases, activation) are what a runtime needs to build the
model (the exports write them); they change the parameter counts only through biases, LayerNorm's
bias vectors and a learned position table.
"""

from __future__ import annotations

from dataclasses import dataclass

from solver.spec.fields import Fields

#: Normalizations, position embeddings and MLP activations a model may state.
NORMALIZATIONS = ("rmsnorm", "layernorm")
POSITION_EMBEDDINGS = ("rope", "learned")
ACTIVATIONS = ("swiglu", "gelu")


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
        SwiGLU MLP with three matrices (else the classic two with GELU); :attr:`activation`
        names it, and a model file may say either.
    tied_embeddings : bool
        LM head shares the embedding matrix.
    experts, top_k, expert_ffn, shared_experts : int
        MoE shape; ``experts == 0`` means dense. Shared experts have width ``expert_ffn`` each.
    head_dim : int
        Attention head width (``hidden // heads`` unless the config says otherwise, e.g. Qwen3).
    normalization : str
        ``"rmsnorm"`` (weight only) or ``"layernorm"`` (weight and bias).
    norm_epsilon : float
        Epsilon of every normalization layer.
    position_embedding : str
        ``"rope"`` (rotary, no weights) or ``"learned"`` (an absolute position table of
        ``max_positions`` rows, held with the input embedding).
    rotary_base : float
        RoPE base (``rope_theta``); unused with learned positions.
    bias : bool
        Every linear layer has a bias (GPT-2/GPT-3), the QKV projection included.
    qkv_bias : bool
        The QKV projection has a bias (Qwen2), also without ``bias``.
    max_positions : int
        Rows of a learned position table (0: none, or RoPE).
    qk_norm : bool
        Queries and keys are normalized per head before attention (Qwen3; Megatron's
        ``--qk-layernorm``): two more norm vectors of ``d_head`` per layer.
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
    normalization: str = "rmsnorm"
    norm_epsilon: float = 1e-5
    position_embedding: str = "rope"
    rotary_base: float = 10000.0
    bias: bool = False
    qkv_bias: bool = False
    max_positions: int = 0
    qk_norm: bool = False

    @property
    def activation(self) -> str:
        """The MLP's activation: ``"swiglu"`` (gated) or ``"gelu"``."""
        return "swiglu" if self.gated_mlp else "gelu"

    @property
    def has_qkv_bias(self) -> bool:
        """The QKV projection has a bias (``qkv_bias``, or every linear layer's ``bias``)."""
        return self.qkv_bias or self.bias

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
        """Two norms per layer (and the per-head query and key norms with ``qk_norm``): RMSNorm
        one weight vector each, LayerNorm weight and bias."""
        width = 2 * self.hidden + (2 * self.d_head if self.qk_norm else 0)
        return width * (2 if self.normalization == "layernorm" else 1)

    @property
    def bias_params_per_layer(self) -> int:
        """Biases of one layer's linear layers: QKV (``qkv_bias``), and with ``bias`` the
        output projection and the MLP (Megatron's fused gated ``fc1`` has ``2 ffn`` outputs).
        MoE layers are counted without their linear biases (the planner refuses them,
        :func:`check_model`; a few vectors per expert where a runtime has them)."""
        qkv = (self.heads + 2 * self.kv_heads) * self.d_head if self.has_qkv_bias else 0
        if not self.bias:
            return qkv
        fc1 = (2 if self.gated_mlp else 1) * self.ffn
        return qkv + self.hidden + fc1 + self.hidden

    @property
    def params_per_layer(self) -> int:
        """Stored weights of one Transformer layer (matrices, norms, biases)."""
        return self.attention_params + self.mlp_params + self.norm_params \
            + self.bias_params_per_layer

    @property
    def active_params_per_layer(self) -> int:
        """Weights one token's matmuls use in one layer, plus the norms (FLOP counts subtract
        :attr:`norm_params`; biases are additions, not matmul weights)."""
        return self.attention_params + self.active_mlp_params + self.norm_params

    @property
    def position_params(self) -> int:
        """A learned absolute position table (0 with RoPE)."""
        return self.max_positions * self.hidden if self.position_embedding == "learned" else 0

    @property
    def embedding_params(self) -> int:
        """Input embedding table, and a learned position table (held by the first stage)."""
        return self.vocab * self.hidden + self.position_params

    @property
    def final_norm_params(self) -> int:
        """The final norm before the LM head (LayerNorm: weight and bias)."""
        return self.hidden * (2 if self.normalization == "layernorm" else 1)

    @property
    def head_params(self) -> int:
        """LM head and final norm (held by the last stage); stored there even when tied
        (Megatron keeps a copy)."""
        return self.vocab * self.hidden + self.final_norm_params

    @property
    def total_params(self) -> int:
        """All stored weights (tied embeddings counted once)."""
        head = self.final_norm_params if self.tied_embeddings else self.head_params
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
        # Megatron-Core up to 0.15.0rc5 (FlagScale's pin; the megatron-core profile is 0.14):
        # TransformerConfig.__post_init__ asserts "Bias is not supported for MoE"
        # (add_bias_linear with num_moe_experts); QKV biases alone are fine (Qwen2-MoE). Core
        # 0.15.0 accepts expert biases (GPT-OSS; TEGroupedMLP._apply_bias), which the cost model
        # prices for the runs that used it (solver.cost.timing._expert_bias).
        f.check("bias", not m.bias, "linear biases (bias = true) are not supported with MoE "
                "(Megatron-Core's TransformerConfig rejects them up to 0.15.0rc5, the version "
                "FlagScale pins); qkv_bias is")
    else:
        f.check("top_k", m.top_k == 0, "top_k needs experts > 0")
        f.check("shared_experts", m.shared_experts == 0, "shared_experts needs experts > 0")
    f.check("normalization", m.normalization in NORMALIZATIONS,
            f"must be one of {', '.join(map(repr, NORMALIZATIONS))}, got {m.normalization!r}")
    f.check("position_embedding", m.position_embedding in POSITION_EMBEDDINGS,
            f"must be one of {', '.join(map(repr, POSITION_EMBEDDINGS))}, "
            f"got {m.position_embedding!r}")
    f.check("max_positions", m.position_embedding == "learned" or m.max_positions == 0,
            "max_positions sizes a learned position table: set position_embedding = "
            "\"learned\" or drop it")
    f.check("max_positions", m.position_embedding != "learned" or m.max_positions >= 1,
            "learned position embeddings need max_positions (the table's rows) >= 1")
