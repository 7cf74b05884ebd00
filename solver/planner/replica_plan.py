"""A plan of R pipeline replicas across islands: its objective, JSON form and validation.

Model (R ≥ 1 replicas on disjoint sets of islands, replica ``r`` given ``b_r`` sequences of the
global batch ``B``, every replica holding the whole model, ``Σ b_r = B``):

    T = max_r T_r(b_r) + A,   A = 2 (R − 1) / R · G / (min_r N_r · w)

``T_r(b_r)`` is replica ``r``'s iteration time as a job of its own (pipeline, its own data-parallel
sync and optimizer step), ``G`` the model's fp32 gradient bytes, ``N_r`` the GPUs of replica ``r``
and ``w`` the per-GPU bandwidth between islands (the cluster's ``inter_island_gbits``, else the
smallest NIC of the replicas' nodes). After a replica's own reduction every one of its GPUs
holds a ``1/N_r`` shard of the gradients (the distributed optimizer's layout); the replicas then
all-reduce shard by shard as a ring over the inter-island links, ``2 (R − 1)/R`` of the bytes
per GPU, and the replica with the fewest GPUs moves the most per GPU. ``A`` is counted
exposed: the profiles' overlapped gradient reduction (Megatron-Core, FlagScale) is bucketed
over the data-parallel group of one pipeline layout, and the cross-replica reduction follows
it. For ``R = 1``, ``A = 0`` and the plan is the single-pipeline plan.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Sequence

from solver.cost.memory import GRAD_BYTES
from solver.planner.plan import Plan, SolverInfo, plan_json
from solver.planner.validate import PlanInvalid, problems
from solver.spec.domain import Island, JobSpec

__all__ = ["Replica", "ReplicatedPlan", "allreduce_s", "not_exportable", "replica_job",
           "replicated_json", "validate_replicated"]


def allreduce_s(job: JobSpec, groups: Sequence[Sequence[Island]]) -> float:
    """``A`` of the module docstring for replicas on the island sets ``groups`` (0 for one)."""
    r = len(groups)
    if r <= 1:
        return 0.0
    gbits = job.cluster.inter_island_gbits or min(
        n.nic_gbits for g in groups for i in g for n in i.nodes)
    fewest = min(sum(i.gpus for i in g) for g in groups)
    grad_bytes = job.model.total_params * GRAD_BYTES
    return 2.0 * (r - 1) / r * grad_bytes / (fewest * gbits / 8 * 1e9)


def replica_job(job: JobSpec, islands: Sequence[Island | str], share: int) -> JobSpec:
    """The job replica ``r`` is planned as: ``share`` sequences on ``islands`` (or island
    names) only (the job's other constraints, ``n_micro`` included, still hold)."""
    names = tuple(i if isinstance(i, str) else i.name for i in islands)
    return replace(job, training=replace(job.training, global_batch=share),
                   constraints=replace(job.constraints, islands=names, exclude_islands=None,
                                       max_replicas=1))


@dataclass(frozen=True)
class Replica:
    """One pipeline replica.

    Attributes
    ----------
    islands : tuple[Island, ...]
        The islands it may use (its stages use node groups of them).
    share : int
        Sequences of the global batch it trains per iteration.
    plan : Plan
        Its plan, made and validated for :func:`replica_job` of ``share``.
    """

    islands: tuple[Island, ...]
    share: int
    plan: Plan


@dataclass(frozen=True)
class ReplicatedPlan:
    """A plan of one or more pipeline replicas (the single-pipeline plan is ``R = 1``).

    Attributes
    ----------
    job : JobSpec
        The job planned.
    replicas : tuple[Replica, ...]
        The replicas, in the order of their islands.
    allreduce_s : float
        ``A``: the exposed gradient all-reduce across replicas per iteration.
    solver : SolverInfo
        How the replica search ended (proof status, bound and gap, wall time, calls).
    share_unit : int
        Shares were searched in multiples of this many sequences.
    partitions : tuple[int, int]
        Island partitions settled (solved or cut by a safe bound) and enumerated.
    islands : tuple[Island, ...]
        The job's islands (Algorithm 1, after ``[constraints]``).
    note : str
        Why the search did not run, or how it ended, in words.
    """

    job: JobSpec
    replicas: tuple[Replica, ...]
    allreduce_s: float
    solver: SolverInfo
    share_unit: int = 1
    partitions: tuple[int, int] = (0, 0)
    islands: tuple[Island, ...] = ()
    note: str = ""

    @property
    def iteration_time_s(self) -> float:
        """Seconds per iteration: the slowest replica, then the all-reduce across replicas."""
        return max(r.plan.iteration_time_s for r in self.replicas) + self.allreduce_s

    @property
    def tokens_per_s(self) -> float:
        """Training throughput of the whole job."""
        return self.job.training.tokens / self.iteration_time_s

    @property
    def shares(self) -> tuple[int, ...]:
        """Sequences per replica."""
        return tuple(r.share for r in self.replicas)

    @property
    def idle(self) -> tuple[tuple[str, str], ...]:
        """Nodes no replica uses: whole islands left out, and each replica's idle nodes."""
        if len(self.replicas) == 1:
            return self.replicas[0].plan.idle
        used = {i.name for r in self.replicas for i in r.islands}
        out = tuple((n.node_id, "its island is in no replica") for i in self.islands
                    if i.name not in used for n in i.nodes)
        return out + tuple(x for r in self.replicas for x in r.plan.idle)


def not_exportable(shares: Sequence[Any]) -> str:
    """Why no runtime export exists for replicas with ``shares`` (one line)."""
    return (f"the plan trains {len(shares)} pipeline replicas with batch shares {list(shares)}; "
            "FlagScale's heterogeneous meshes form one pipeline and Megatron-LM runs one "
            "layout, so neither trains uneven shares on separate pipelines (plan with "
            "[constraints] max_replicas = 1 for an exportable plan)")


def validate_replicated(rp: ReplicatedPlan, job: JobSpec) -> None:
    """Check every replica against its own job and the whole against ``job``; raise
    :class:`PlanInvalid` listing everything wrong. The objective is recomputed here."""
    out: list[str] = []
    seen: set[str] = set()
    for k, r in enumerate(rp.replicas):
        names = {i.name for i in r.islands}
        if names & seen:
            out.append(f"replica {k}: islands {sorted(names & seen)} belong to another replica")
        seen |= names
        n = job.training.n_micro
        if r.share < 1 or r.share % rp.share_unit or (n and r.share % n):
            out.append(f"replica {k}: share {r.share} is not a positive multiple of the share "
                       f"unit {rp.share_unit}" + (f" and of n_micro {n}" if n else ""))
            continue
        own = job if len(rp.replicas) == 1 else replica_job(job, r.islands, r.share)
        out += [f"replica {k}: {p}" for p in problems(r.plan, own)]
        stray = {s.island.name for s in r.plan.stages} - names
        if stray and len(rp.replicas) > 1:
            out.append(f"replica {k}: stages on islands {sorted(stray)} outside the replica")
    if sum(rp.shares) != job.training.global_batch:
        out.append(f"shares {list(rp.shares)} sum to {sum(rp.shares)}, not the global batch "
                   f"{job.training.global_batch}")
    limit = job.constraints.max_replicas
    if limit is not None and len(rp.replicas) > limit:
        out.append(f"{len(rp.replicas)} replicas exceed constraints.max_replicas {limit}")
    out += _objective(rp, job)
    if out:
        raise PlanInvalid("invalid replicated plan: " + "; ".join(out))


def _objective(rp: ReplicatedPlan, job: JobSpec) -> list[str]:
    """The stored all-reduce against this module's formula recomputed from the job."""
    r = len(rp.replicas)
    if r == 1:
        return [] if rp.allreduce_s == 0 else ["one replica needs no all-reduce across replicas"]
    nodes = [n for x in rp.replicas for i in x.islands for n in i.nodes]
    gbits = job.cluster.inter_island_gbits or min(n.nic_gbits for n in nodes)
    per_gpu = job.model.total_params * GRAD_BYTES / min(
        sum(n.gpus for i in x.islands for n in i.nodes) for x in rp.replicas)
    expect = 2 * (r - 1) / r * per_gpu * 8 / (gbits * 1e9)
    if abs(expect - rp.allreduce_s) > 1e-9 * max(expect, 1e-12):
        return [f"all-reduce across replicas stored {rp.allreduce_s:.6g} s, "
                f"recomputed {expect:.6g} s"]
    return []


def replicated_json(rp: ReplicatedPlan, islands_payload: list[dict[str, Any]]) -> dict[str, Any]:
    """The ``tangram plan --json`` object of a replicated plan.

    Every key of the single-pipeline object is kept (``stages`` lists every replica's stages,
    each with its ``replica`` index; ``pipeline_s`` is the slowest replica's pipeline); the
    replicas, their shares and the all-reduce are added.
    """
    parts = [plan_json(r.plan, islands_payload) for r in rp.replicas]
    slowest = max(range(len(parts)), key=lambda k: rp.replicas[k].plan.iteration_time_s)
    out = dict(parts[slowest])
    out["stages"] = [dict(s, replica=k) for k, p in enumerate(parts) for s in p["stages"]]
    out["pipeline_s"] = parts[slowest]["pipeline_s"]
    out["per_iteration_s"] = _r(rp.iteration_time_s - rp.replicas[slowest].plan.pipeline_time_s)
    out["objective"] = dict(parts[slowest]["objective"],
                            iteration_time_s=_r(rp.iteration_time_s),
                            tokens_per_s=_r(rp.tokens_per_s))
    out["idle_nodes"] = [{"node": node, "reason": why} for node, why in rp.idle]
    out["replicas"] = [{"islands": [i.name for i in r.islands], "share": r.share,
                        "n_micro": r.plan.n_micro, "iteration_time_s": p["objective"]["iteration_time_s"],
                        "pipeline_s": p["pipeline_s"], "stages": len(p["stages"])}
                       for r, p in zip(rp.replicas, parts)]
    out["allreduce_s"] = _r(rp.allreduce_s)
    info = rp.solver
    out["replica_search"] = {"optimal": info.optimal, "time_s": _r(info.time_s, 4),
                             "heuristic_pruning": info.heuristic_pruning,
                             "bound": None if info.bound is None else _r(info.bound),
                             "gap": None if info.gap is None else _r(info.gap),
                             "share_unit": rp.share_unit,
                             "partitions": {"settled": rp.partitions[0],
                                            "enumerated": rp.partitions[1]}}
    return out


def _r(x: float, digits: int = 9) -> float:
    return float(f"{x:.{digits}g}")
