"""A plan of R pipeline replicas across islands: its objective, JSON form and validation.

Model (R ≥ 1 replicas on disjoint sets of islands, replica ``r`` given ``b_r`` sequences of the
global batch ``B``, every replica holding the whole model, ``Σ b_r = B``):

    T = max_r T_r(b_r) + A

``T_r(b_r)`` is replica ``r``'s iteration time as a job of its own (pipeline, its own data-parallel
sync and optimizer step); ``A`` is the gradient exchange across replicas, priced as a runtime
would have to run it, with ``G`` the model's fp32 gradient bytes and ``w`` the per-GPU
bandwidth between islands (the cluster's ``inter_island_gbits``, else the smallest NIC of the
replicas' nodes: the slowest link):

* replicas whose shard layouts match (:func:`~solver.planner.replica.replica_runtime.shard_layout`:
  the same stages and layouts, so GPU ``j`` of every replica holds the same ``1/N`` shard of
  the gradients after its own reduction) all-reduce shard by shard, a ring over the
  inter-island links: ``A = 2 (R − 1)/R · G / (N · w)`` (:func:`allreduce_s` with
  ``N = min_r N_r``);
* replicas whose shard layouts differ (PP2 DP8 beside PP4 DP8, TP4 beside TP8) hold different
  shards and no runtime reshards them, so the whole gradient crosses between replicas: a
  full-gradient all-reduce, ``2 (R − 1)/R · G`` bytes per replica over one inter-island link,
  ``A = 2 (R − 1)/R · G / w`` (:func:`full_allreduce_s`).

:func:`allreduce_s` of the island sets is so a lower bound of ``A`` for any plans of them
(``N ≥ 1``): the replica search's bounds use it. ``A`` is counted exposed: the profiles'
overlapped gradient reduction (Megatron-Core, FlagScale) is bucketed over the data-parallel
group of one pipeline layout, and the cross-replica reduction follows it. Uneven shares also
need each replica's loss weighted by its share (:mod:`solver.planner.replica.replica_runtime`). For
``R = 1``, ``A = 0`` and the plan is the single-pipeline plan.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Sequence

from solver.cost.runtime.frameworks import job_runtime
from solver.planner.plan import Plan, SolverInfo, plan_json
from solver.planner.replica.replica_runtime import Runtime, replicas_runtime, shard_layout
from solver.planner.check.validate import PlanInvalid, problems
from solver.spec.domain import Island, JobSpec

__all__ = ["Replica", "ReplicatedPlan", "allreduce_s", "full_allreduce_s", "exchange_s",
           "not_exportable", "replica_job", "replicated_json", "validate_replicated"]


def _gbits(job: JobSpec, groups: Sequence[Sequence[Island]]) -> float:
    """``w``: the cluster's bandwidth between islands, else the smallest NIC of the groups."""
    return job.cluster.inter_island_gbits or min(
        n.nic_gbits for g in groups for i in g for n in i.nodes)


def full_allreduce_s(job: JobSpec, groups: Sequence[Sequence[Island]]) -> float:
    """The full-gradient all-reduce across replicas on the island sets ``groups``:
    ``2 (R − 1)/R`` of the gradient bytes per replica over one inter-island link (0 for one)."""
    r = len(groups)
    if r <= 1:
        return 0.0
    return 2.0 * (r - 1) / r * job.model.total_params * job_runtime(job).grad_bytes / (
        _gbits(job, groups) / 8 * 1e9)


def allreduce_s(job: JobSpec, groups: Sequence[Sequence[Island]]) -> float:
    """The shard-wise ring across replicas on the island sets ``groups`` (0 for one): ``A``
    of replicas whose shard layouts match, and a lower bound of ``A`` for any replicas there
    (module docstring)."""
    if len(groups) <= 1:
        return 0.0
    return full_allreduce_s(job, groups) / min(sum(i.gpus for i in g) for g in groups)


def exchange_s(job: JobSpec, replicas: Sequence["Replica"]) -> float:
    """``A`` of the module docstring for ``replicas``: the shard-wise ring where their shard
    layouts match, else the full-gradient all-reduce."""
    groups = [r.islands for r in replicas]
    if len({shard_layout(r.plan) for r in replicas}) == 1:
        return allreduce_s(job, groups)
    return full_allreduce_s(job, groups)


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
    searched : bool
        Whether the replica search ran (``[planner] replicas = true``); False for a single
        pipeline planned without it.
    """

    job: JobSpec
    replicas: tuple[Replica, ...]
    allreduce_s: float
    solver: SolverInfo
    share_unit: int = 1
    partitions: tuple[int, int] = (0, 0)
    islands: tuple[Island, ...] = ()
    note: str = ""
    searched: bool = True

    @classmethod
    def single(cls, plan: Plan, info: SolverInfo, note: str, searched: bool = True,
               share_unit: int = 1, partitions: tuple[int, int] = (0, 0)) -> "ReplicatedPlan":
        """The one-pipeline plan (``R = 1``) as a replicated plan, on the islands it uses."""
        used = tuple(i for i in plan.islands.islands
                     if any(s.island.name == i.name for s in plan.stages))
        one = Replica(used or plan.islands.islands, plan.job.training.global_batch, plan)
        return cls(plan.job, (one,), 0.0, info, share_unit, partitions, plan.islands.islands,
                   note, searched)

    @property
    def runtime(self) -> Runtime:
        """Which runtime could train the plan as written
        (:func:`~solver.planner.replica.replica_runtime.replicas_runtime`)."""
        return replicas_runtime(self.job, [(r.share, r.plan) for r in self.replicas])

    @property
    def exchange(self) -> str:
        """How the replicas' gradients meet: ``none`` (one pipeline), ``shard-wise ring``
        (their shard layouts match) or ``full-gradient all-reduce``."""
        if len(self.replicas) == 1:
            return "none"
        same = len({shard_layout(r.plan) for r in self.replicas}) == 1
        return "shard-wise ring" if same else "full-gradient all-reduce"

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
        # A replica's own plan may also list the other replicas' nodes (its job leaves them
        # out): each replica reports the idle nodes of its own islands only.
        own = tuple(x for r in self.replicas for x in r.plan.idle
                    if x[0] in {n.node_id for i in r.islands for n in i.nodes})
        return out + own


def not_exportable(shares: Sequence[Any], why: str = "") -> str:
    """Why no runtime export exists for replicas with ``shares`` (one line); ``why``: the
    plan's runtime verdict (:attr:`ReplicatedPlan.runtime`), when known."""
    return (f"the plan trains {len(shares)} pipeline replicas with batch shares {list(shares)}; "
            + (why or "FlagScale's heterogeneous meshes form one pipeline and Megatron-LM runs "
               "one layout, so neither trains separate pipelines")
            + " (plan without [planner] replicas = true, or with [constraints] max_replicas = 1, "
              "for an exportable plan)")


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
    # Matching shard layouts pair GPU for GPU (the fewest GPUs move the most); else every
    # replica's whole gradient crosses one link.
    gpus = min(sum(n.gpus for i in x.islands for n in i.nodes) for x in rp.replicas) \
        if len({shard_layout(x.plan) for x in rp.replicas}) == 1 else 1
    grad = 2.0 if job.training.grad_reduce_bf16 else 4.0  # fp32 unless --grad-reduce-in-bf16
    expect = 2 * (r - 1) / r * job.model.total_params * grad / gpus * 8 / (gbits * 1e9)
    if abs(expect - rp.allreduce_s) > 1e-9 * max(expect, 1e-12):
        return [f"all-reduce across replicas stored {rp.allreduce_s:.6g} s, "
                f"recomputed {expect:.6g} s"]
    return []


def replicated_json(rp: ReplicatedPlan, islands_payload: list[dict[str, Any]]) -> dict[str, Any]:
    """The ``tangram plan --json`` object of a replicated plan.

    Every key of the single-pipeline object is kept (``stages`` lists every replica's stages,
    each with its ``replica`` index; ``pipeline_s`` is the slowest replica's pipeline); the
    replicas, their shares, the all-reduce across them (``allreduce_s``, priced as
    ``exchange`` says), the runtime that could train the plan (``runtime``: ``runs_on``,
    ``why``) and how the replica search ended (``replica_search``; ``searched`` false when
    it did not run) are added.
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
    out["exchange"] = rp.exchange
    out["runtime"] = rp.runtime.json()
    info = rp.solver
    out["replica_search"] = {"searched": rp.searched, "optimal": info.optimal,
                             "time_s": _r(info.time_s, 4),
                             "heuristic_pruning": info.heuristic_pruning,
                             "bound": None if info.bound is None else _r(info.bound),
                             "gap": None if info.gap is None else _r(info.gap),
                             "share_unit": rp.share_unit,
                             "partitions": {"settled": rp.partitions[0],
                                            "enumerated": rp.partitions[1]}}
    return out


def _r(x: float, digits: int = 9) -> float:
    return float(f"{x:.{digits}g}")
