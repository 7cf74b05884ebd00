"""Which runtime could train a plan of pipeline replicas, and whether their gradient shards meet.

A plan of ``R ≥ 2`` replicas (``[planner] replicas = true``) is a research option: the
runtimes the planner exports to train one pipeline, and data parallelism only as copies of it.

* FlagScale's heterogeneous mode trains one pipeline of process meshes: the job's
  ``pipeline_model_parallel_size`` must equal the sum of the meshes' ``pp``, and its data
  parallelism is each mesh's ``dp`` (FlagScale ``flagscale/train/arguments.py``,
  ``FSTrainArguments.pre_validate_args``).
* Megatron-LM runs one layout on every data-parallel rank: ``data_parallel_size`` is
  ``world_size // (tp · pp · cp)`` (Megatron-LM ``megatron/core/parallel_state.py``,
  ``initialize_model_parallel``).
* Every data-parallel rank weighs alike: Megatron-Core scales each rank's gradient by
  ``1 / dp`` (``megatron/core/distributed/distributed_data_parallel.py``,
  ``DistributedDataParallel.__init__``, ``gradient_scaling_factor``), which is the batch mean
  only when every rank trains as many sequences. Uneven shares need each replica's loss
  weighted by ``b_r / B``, which neither runtime offers.

So replicas with identical stages (layer ranges, layouts, node counts, GPU kinds, micro-batches)
and equal shares are one pipeline whose every mesh has ``dp × R``: FlagScale runs that, and
Megatron-LM too when the pipeline is one layout on one GPU kind. Any other replicas run on no
supported runtime, and the plan says so. Replicas whose *shard layouts* match
(:func:`shard_layout`) hold the same gradient shards GPU by GPU, which is what prices their
exchange as a shard-wise ring (:mod:`solver.planner.replica.replica_plan`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from solver.planner.plan import Plan
from solver.spec.domain import JobSpec

__all__ = ["ShardLayout", "Runtime", "shard_layout", "replicas_runtime"]

ShardLayout = tuple  # (virtual stages, then per stage: start, end, tp, cp, ep, pp, dp, zero, etp)


def shard_layout(plan: Plan) -> ShardLayout:
    """Which parameters' gradients each GPU of ``plan`` holds after its own reduction: per
    stage its layer range and ``(tp, cp, ep, pp, dp, zero, expert_tp)``, with the interleaving (which
    deals layers to pipeline ranks). Two plans with equal shard layouts pair GPU for GPU."""
    return (plan.virtual_stages,) + tuple(
        (s.start, s.end, c.tp, c.cp, c.ep, c.pp, c.dp, c.zero, c.etp)
        for s in plan.stages for c in (s.plan.config,))


def _identity(plan: Plan) -> tuple:
    """Everything two replicas must share to be one pipeline's data parallelism: the shard
    layout, ``n_micro``, and per stage its nodes, GPU kinds, micro-batch, recomputation and
    offload."""
    return (shard_layout(plan), plan.n_micro) + tuple(
        (len(s.nodes or s.island.nodes), frozenset(n.gpu.name for n in s.nodes or s.island.nodes),
         c.micro_batch, c.recompute, c.offload)
        for s in plan.stages for c in (s.plan.config,))


def _one_megatron_mesh(plan: Plan) -> bool:
    """Whether the merged pipeline is one Megatron layout: one GPU kind, every stage the same
    ``(tp, cp, ep, dp)`` and as many layers per pipeline rank."""
    kinds = {n.gpu.name for s in plan.stages for n in s.nodes or s.island.nodes}
    layouts = {(c.tp, c.cp, c.ep, c.dp, c.etp) for c in (s.plan.config for s in plan.stages)}
    per_rank = {(s.end - s.start) / s.plan.config.pp for s in plan.stages}
    return len(kinds) == 1 and len(layouts) == 1 and len(per_rank) == 1


@dataclass(frozen=True)
class Runtime:
    """Which runtimes could train a plan as written.

    Attributes
    ----------
    runs_on : tuple[str, ...]
        The runtimes (``[planner] framework`` names); empty when none does.
    why : str
        The reason, in one line, citing the runtime's rule.
    """

    runs_on: tuple[str, ...]
    why: str

    def json(self) -> dict[str, Any]:
        """The ``runtime`` object of ``tangram plan --json``."""
        return {"runs_on": list(self.runs_on), "why": self.why}


def replicas_runtime(job: JobSpec, replicas: Sequence[tuple[int, Plan]]) -> Runtime:
    """Which runtime could train replicas of ``(share, plan)`` (module docstring)."""
    r = len(replicas)
    if r == 1:
        return Runtime((job.planner.framework.value,),
                       "one pipeline, planned under the rules of [planner] framework")
    shares = [b for b, _ in replicas]
    same = len({_identity(p) for _, p in replicas}) == 1
    even = len(set(shares)) == 1
    if same and even:
        runs = ("flagscale",) + (("megatron-core",) if _one_megatron_mesh(replicas[0][1]) else ())
        return Runtime(runs, f"the {r} replicas are identical (stages, layouts, node counts, "
                             f"GPU kinds) with equal shares: one pipeline with every stage's dp "
                             f"x {r}, its gradients reduced over that dp")
    why = []
    if len({shard_layout(p) for _, p in replicas}) > 1:
        why.append("the replicas' stages or layouts differ, so their GPUs hold different "
                   "gradient shards: FlagScale trains one pipeline of meshes, its data "
                   "parallelism each mesh's dp (flagscale/train/arguments.py, "
                   "FSTrainArguments.pre_validate_args), and Megatron-LM one layout on every "
                   "data-parallel rank (megatron/core/parallel_state.py, "
                   "initialize_model_parallel)")
    elif not same:
        why.append("the replicas hold the same shards but their stages differ in GPU kind, "
                   "node count, micro-batch or recomputation, so they are not the data "
                   "parallelism of one pipeline: FlagScale gives each mesh one device type "
                   "(flagscale/train/arguments.py, FSTrainArguments.pre_validate_args: one "
                   "hetero_device_types entry per mesh)")
    if not even:
        why.append(f"uneven shares {shares} need each replica's loss weighted by its share of "
                   "the batch, and Megatron-Core weighs every data-parallel rank alike "
                   "(megatron/core/distributed/distributed_data_parallel.py, "
                   "DistributedDataParallel.__init__: gradient_scaling_factor = 1/dp)")
    return Runtime((), "no supported runtime trains it: " + "; ".join(why))
