"""A plan's pipeline as runtime meshes, and the flags every Megatron-family runtime shares.

A *mesh* (FlagScale's ``hetero_process_meshes`` entry) is a run of consecutive pipeline stages
on one island with one layout ``(tp, cp, ep, dp)``: it has ``pp`` stages (internal sub-stages
count), one device type and ``tp·cp·dp·pp`` GPUs.
"""

from __future__ import annotations

from dataclasses import dataclass

from solver.cost.stage_costs import substage_layers
from solver.planner.plan import Plan
from solver.spec.domain import Precision, Recompute


class NotExpressible(Exception):
    """The runtime cannot express the plan (the message says why)."""


@dataclass(frozen=True)
class Mesh:
    """Consecutive pipeline stages of one island with one layout.

    Attributes
    ----------
    device : str
        GPU type of the island.
    tp, cp, ep, dp, pp : int
        Layout and the mesh's pipeline stages.
    layers : tuple[int, ...]
        Transformer layers of each of its pipeline stages, in order.
    recompute : tuple[Recompute, ...]
        Recomputation of each of its pipeline stages.
    """

    device: str
    tp: int
    cp: int
    ep: int
    dp: int
    pp: int
    layers: tuple[int, ...]
    recompute: tuple[Recompute, ...]

    @property
    def gpus(self) -> int:
        """GPUs of the mesh (``ep`` is carved out of ``dp``, as in Megatron)."""
        return self.tp * self.cp * self.dp * self.pp


def meshes(plan: Plan) -> list[Mesh]:
    """The plan's meshes in pipeline order (internal sub-stages expanded): consecutive stages of
    one island with one layout join one mesh."""
    out: list[Mesh] = []
    previous = None
    for s in plan.stages:
        c = s.plan.config
        layers = tuple(int(x) for x in substage_layers(s.end - s.start, c.pp))
        rc = (c.recompute,) * c.pp
        key = (s.island.gpu.name, c.tp, c.cp, c.ep, c.dp)
        same = (out and previous == s.island.name
                and (out[-1].device, out[-1].tp, out[-1].cp, out[-1].ep, out[-1].dp) == key)
        if same:
            last = out.pop()
            out.append(Mesh(*key, last.pp + c.pp, last.layers + layers, last.recompute + rc))
        else:
            out.append(Mesh(*key, c.pp, layers, rc))
        previous = s.island.name
    return out


def micro_batch_size(plan: Plan, dp: int) -> int:
    """Sequences per data-parallel rank per micro-batch at degree ``dp``."""
    return plan.job.training.global_batch // plan.n_micro // dp


def precision_flags(plan: Plan) -> dict[str, object]:
    """Megatron's precision flags (key: flag name with underscores)."""
    p = plan.job.training.precision
    devices = {s.island.gpu for s in plan.stages}
    if p is Precision.FP16 or any(not g.bf16 for g in devices):
        return {"fp16": True}
    out: dict[str, object] = {"bf16": True}
    if p is Precision.FP8:
        if not all(g.runs_in(Precision.FP8) == "fp8" for g in devices):
            raise NotExpressible("precision fp8: Transformer Engine's --fp8-format is one flag "
                                 "for the job, and some stages run on GPUs without FP8 "
                                 "(plan with precision \"bf16\" for this cluster)")
        out.update(fp8_format="hybrid", fp8_recipe="delayed")
    return out


def model_flags(plan: Plan) -> dict[str, object]:
    """The model's shape as Megatron flags."""
    m, t = plan.job.model, plan.job.training
    out: dict[str, object] = {
        "num_layers": m.layers, "hidden_size": m.hidden, "ffn_hidden_size": m.ffn,
        "num_attention_heads": m.heads, "seq_length": t.seq_len,
        "max_position_embeddings": t.seq_len, "normalization": "RMSNorm",
        "position_embedding_type": "rope", "swiglu": m.gated_mlp,
        "untie_embeddings_and_output_weights": not m.tied_embeddings,
        "disable_bias_linear": True,
    }  # the vocabulary comes from the tokenizer (--tokenizer-type / --vocab-size)
    if m.kv_heads != m.heads:
        out.update(group_query_attention=True, num_query_groups=m.kv_heads)
    if m.head_dim:
        out["kv_channels"] = m.head_dim
    if m.is_moe:
        out.update(num_experts=m.experts, moe_router_topk=m.top_k,
                   moe_ffn_hidden_size=m.expert_ffn)
        if m.shared_experts:
            out["moe_shared_expert_intermediate_size"] = m.shared_experts * m.expert_ffn
    return out


def optimizer_flags(plan: Plan) -> dict[str, object]:
    """Distributed optimizer (ZeRO-1) and the overlaps the cost model priced."""
    zero = {s.plan.config.zero for s in plan.stages if s.plan.config.dp * s.plan.config.cp > 1}
    if zero - {0, 1}:
        raise NotExpressible(f"ZeRO {sorted(zero)}: Megatron's optimizer shards optimizer "
                             "states only (--use-distributed-optimizer, ZeRO-1)")
    dist = 1 in zero
    return {"use_distributed_optimizer": dist, "overlap_grad_reduce": True,
            "overlap_param_gather": dist}
