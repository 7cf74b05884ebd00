"""A plan's pipeline as runtime meshes, its nodes in rank order, and the flags every
Megatron-family runtime shares.

A *mesh* (FlagScale's ``hetero_process_meshes`` entry) is a run of consecutive pipeline stages
on one island with one layout ``(tp, cp, ep, dp)``: it has ``pp`` stages (internal sub-stages
count), one device type and ``tp·cp·dp·pp`` GPUs. Megatron orders ranks ``tp-cp-ep-dp-pp``
(innermost first; ``megatron/core/parallel_state.py``, ``RankGenerator``), so a mesh's first
``tp·cp·dp`` ranks are its first pipeline stage, and the nodes of a plan in rank order are the
stages' nodes in pipeline order.
"""

from __future__ import annotations

from dataclasses import dataclass

from solver.cost.runtime.frameworks import profile
from solver.cost.runtime.runtime_rules import vendor_problem
from solver.cost.stage import substage_layers
from solver.launch.errors import NotExpressible
from solver.launch.model_flags import model_flags
from solver.planner.plan import Plan
from solver.spec.domain import CrossEntropyKernel, Framework, Node, Precision, Recompute

__all__ = ["A2A_OVERLAP_NOTE", "Mesh", "NotExpressible", "max_connections", "meshes",
           "micro_batch_size", "model_flags",
           "nodes_in_rank_order", "optimizer_flags", "precision_flags", "slots", "vendor_check"]


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
    recompute_layers : tuple[int | None, ...]
        With full recomputation, the layers each pipeline stage recomputes by Megatron's block
        method (None: all, the uniform method); None without full recomputation.
    nodes : tuple[Node, ...]
        Its nodes in rank order (each node's GPUs are consecutive ranks).
    expert_tp : int
        Expert tensor-parallel degree of its routed experts.
    a2a_overlap : bool
        Its stages overlap the MoE all-to-alls (``--overlap-moe-expert-parallel-comm``).
    """

    device: str
    tp: int
    cp: int
    ep: int
    dp: int
    pp: int
    layers: tuple[int, ...]
    recompute: tuple[Recompute, ...]
    recompute_layers: tuple[int | None, ...] = ()
    nodes: tuple[Node, ...] = ()
    expert_tp: int = 1
    a2a_overlap: bool = False

    @property
    def gpus(self) -> int:
        """GPUs of the mesh (``ep`` is carved out of ``dp``, as in Megatron)."""
        return self.tp * self.cp * self.dp * self.pp

    @property
    def kinds(self) -> frozenset[str]:
        """GPU types of its nodes (one, unless its island merged types)."""
        return frozenset(n.gpu.name for n in self.nodes)


def _stage_nodes(stage) -> tuple[Node, ...]:
    return tuple(stage.nodes or stage.island.nodes)


def meshes(plan: Plan) -> list[Mesh]:
    """The plan's meshes in pipeline order (internal sub-stages expanded): consecutive stages of
    one island with one layout join one mesh."""
    out: list[Mesh] = []
    previous = None
    for s in plan.stages:
        c = s.plan.config
        layers = tuple(int(x) for x in substage_layers(s.end - s.start, c.pp))
        rc = (c.recompute,) * c.pp
        k = (c.recompute_layers,) * c.pp
        key = (s.island.gpu.name, c.tp, c.cp, c.ep, c.dp)
        last = out[-1] if out else None
        if last and previous == s.island.name and last.expert_tp == c.etp and \
                last.a2a_overlap == c.a2a_overlap and \
                (last.device, last.tp, last.cp, last.ep, last.dp) == key:
            out[-1] = Mesh(*key, last.pp + c.pp, last.layers + layers, last.recompute + rc,
                           last.recompute_layers + k, last.nodes + _stage_nodes(s), c.etp,
                           c.a2a_overlap)
        else:
            out.append(Mesh(*key, c.pp, layers, rc, k, _stage_nodes(s), c.etp, c.a2a_overlap))
        previous = s.island.name
    return out


#: What a launch with the MoE all-to-all overlap needs from its environment: torch >= 2.6
#: (``TransformerConfig.__post_init__`` asserts it) and more than one hardware queue, so that
#: the two streams' kernels run side by side (Megatron-Bridge's performance launcher sets 8 on
#: Hopper and 32 on Blackwell with it, ``scripts/performance/utils/overrides.py``;
#: ``validate_args`` then only warns about TP or CP on Hopper).
A2A_OVERLAP_NOTE = ("MoE all-to-all overlap: needs torch >= 2.6; set "
                    "CUDA_DEVICE_MAX_CONNECTIONS to")


def max_connections(ms: list[Mesh]) -> int:
    """``CUDA_DEVICE_MAX_CONNECTIONS`` for a run with the MoE all-to-all overlap: 32 when every
    GPU is a Blackwell (in the catalog: the GPUs with MXFP8, which Transformer Engine runs on
    Blackwell only), else 8 (:data:`A2A_OVERLAP_NOTE`)."""
    blackwell = all(n.gpu.mxfp8 for m in ms for n in m.nodes)
    return 32 if blackwell else 8


def nodes_in_rank_order(plan: Plan) -> list[Node]:
    """Every node the plan uses, in rank order (mesh by mesh, stage by stage)."""
    return [n for m in meshes(plan) for n in m.nodes]


def slots(mesh: Mesh) -> int:
    """GPUs the mesh uses on each of its nodes (a stage group uses the same count on each:
    its island's smallest node size)."""
    per, rest = divmod(mesh.gpus, len(mesh.nodes))
    if rest or per > min(n.gpus for n in mesh.nodes):
        raise NotExpressible(f"mesh of {mesh.gpus} GPUs on {len(mesh.nodes)} nodes does not "
                             "use the same number of GPUs on each node")
    return per


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
    if p.is_fp8:
        if not all(g.runs_fp8(p) for g in devices):
            raise NotExpressible(f"precision {p.value}: Transformer Engine's --fp8-format is one "
                                 "flag for the job, and some stages run on GPUs without "
                                 f"{'MXFP8' if p is Precision.FP8_MX else 'FP8'} (plan with "
                                 "precision \"bf16\" for this cluster)")
        out.update(fp8_format="hybrid", fp8_recipe=p.fp8_recipe)
    return out | state_type_flags(plan)


def state_type_flags(plan: Plan) -> dict[str, object]:
    """``--grad-reduce-in-bf16``, ``--fp8-param-gather`` and ``--cross-entropy-loss-fusion
    --cross-entropy-fusion-impl te`` where the job asks for them (Megatron-LM's
    ``_add_mixed_precision_args``, ``_add_transformer_engine_args`` and
    ``_add_training_args``, all present at 8479eb3, the Megatron-LM FlagScale pins)."""
    t = plan.job.training
    return ({"grad_reduce_in_bf16": True} if t.grad_reduce_bf16 else {}) | \
        ({"fp8_param_gather": True} if t.fp8_param_gather else {}) | \
        ({"cross_entropy_loss_fusion": True, "cross_entropy_fusion_impl": "te"}
         if t.cross_entropy is CrossEntropyKernel.TE else {})


def optimizer_flags(plan: Plan, framework: Framework) -> dict[str, object]:
    """Distributed optimizer (ZeRO-1) and the overlaps the cost model priced; ZeRO-3 where
    ``framework``'s profile runs it at the plan's pipelining (the rule the search reads,
    :meth:`~solver.cost.runtime.profile.FrameworkProfile.zero_stages`): Megatron-FSDP,
    ``--use-megatron-fsdp --data-parallel-sharding-strategy optim_grads_params`` with the
    distributed optimizer that steps its shards, ``--ckpt-format fsdp_dtensor``, which
    ``validate_args`` requires of Megatron-FSDP (``megatron/training/arguments.py``,
    core_v0.14.0), and ``--no-gradient-accumulation-fusion``, as its guide (``docs/source/
    api-guide/custom_fsdp.md``) asks: ``validate_args`` only warns that the fused accumulation
    needs a Transformer Engine built for FSDP."""
    zero = {s.plan.config.zero for s in plan.stages if s.plan.config.dp * s.plan.config.cp > 1}
    pipelined = sum(s.plan.config.pp for s in plan.stages) > 1
    fsdp = 3 in profile(framework).zero_stages(pipelined)
    if zero - {0, 1} and not (fsdp and zero == {3}):
        core = 3 in profile(Framework.MEGATRON_CORE).zero_stages(pipelined)
        raise NotExpressible(f"ZeRO {sorted(zero)}: Megatron's optimizer shards optimizer "
                             "states only (--use-distributed-optimizer, ZeRO-1)"
                             + ("; Megatron-FSDP (ZeRO-3) is reached by --emit megatron"
                                if 3 in zero and core and not fsdp else ""))
    if zero == {3}:
        return {"use_megatron_fsdp": True,
                "data_parallel_sharding_strategy": "optim_grads_params",
                "ckpt_format": "fsdp_dtensor", "no_gradient_accumulation_fusion": True,
                "use_distributed_optimizer": True,
                "overlap_grad_reduce": True, "overlap_param_gather": True}
    # FP8 weights need the distributed optimizer even where no stage has replicas to shard over
    # (validate_args: "--fp8-param-gather only supported with distributed optimizer").
    dist = 1 in zero or plan.job.training.fp8_param_gather
    return {"use_distributed_optimizer": dist, "overlap_grad_reduce": True,
            "overlap_param_gather": dist}


def vendor_check(plan: Plan) -> None:
    """One communicator for the job: the GPUs of one vendor
    (:func:`solver.cost.runtime.runtime_rules.vendor_problem` states the rule and its source)."""
    why = vendor_problem({n.gpu for n in nodes_in_rank_order(plan)})
    if why:
        raise NotExpressible(why)
