"""Re-planning after a cluster change (failed nodes, added nodes) with the partial-plan cache.

A node failure changes one island's signature; every other island keeps its cached partial
plans, so the parallelizer is only called for the changed island's entries (plus the few entries
of unchanged islands that the new cluster's pruning windows newly admit), and the composition is
redone exactly. Then, where ``tangram plan`` runs it (:func:`replica_search_runs`), the replica
search over the changed cluster's islands runs as well, with its own in-memory memo (it plans
replicas of many batch shares, which would flood the cache directory). The result is the plan a
fresh ``tangram plan`` of the changed cluster gives: one pipeline, or several replicas.

The previous plan comes as the ``tangram plan --json`` object, of one pipeline or of several
replicas, and is rebuilt and validated against the job (:mod:`solver.studies.previous`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from time import perf_counter
from typing import Any

from solver.planner.plan import Plan
from solver.planner.stages.plancache import CachingParallelizer
from solver.planner.replica.replica_plan import ReplicatedPlan
from solver.planner.replica.replicas import ReplicaOptions, plan_replicas, replica_search_runs
from solver.planner.stages.search import PlannerConfig
from solver.spec.domain import ClusterSpec, GPUSpec, JobSpec, Node
from solver.spec.errors import InputError
from solver.spec.loaders import load_cluster
from solver.studies.pareto import plan_with_targets
from solver.studies.previous import read_previous


@dataclass(frozen=True)
class ChangedCluster(ClusterSpec):
    """A cluster with some nodes out of service; the others keep their ids.

    Attributes
    ----------
    removed : frozenset[str]
        Ids of the nodes taken out (failed).
    """

    removed: frozenset[str] = frozenset()

    @property
    def nodes(self) -> tuple[Node, ...]:
        """The nodes in service, group by group."""
        return tuple(n for g in self.groups for n in g.nodes() if n.node_id not in self.removed)

    @property
    def total_gpus(self) -> int:
        """GPUs in service."""
        return sum(n.gpus for n in self.nodes)


@dataclass(frozen=True)
class ClusterChange:
    """What happened to the cluster.

    Attributes
    ----------
    failed : tuple[str, ...]
        Ids of failed nodes.
    added : ClusterSpec | None
        New node groups (a cluster file with ``[[nodes]]`` only), or None.
    added_from : str
        The file the new groups came from (for error messages).
    """

    failed: tuple[str, ...] = ()
    added: ClusterSpec | None = None
    added_from: str = "<nodes>"


def _id_ranges(cluster: ClusterSpec) -> str:
    return ", ".join(f"{g.prefix}-0..{g.prefix}-{g.count - 1}" for g in cluster.groups)


def apply_change(cluster: ClusterSpec, change: ClusterChange,
                 source: str = "<cli>") -> ChangedCluster:
    """The cluster after ``change``.

    Raises
    ------
    InputError
        An unknown or already removed node id, an added group whose id prefix is taken, or no
        node left.
    """
    removed = set(cluster.removed) if isinstance(cluster, ChangedCluster) else set()
    alive = {n.node_id for n in cluster.nodes}
    for node_id in change.failed:
        if node_id not in alive:
            gone = f", {len(removed)} already out of service" if removed else ""
            raise InputError(source, "--fail", f"unknown node {node_id!r} (nodes: "
                                               f"{_id_ranges(cluster)}{gone})")
    groups = cluster.groups
    if change.added is not None:
        taken = {g.prefix for g in groups}
        for i, g in enumerate(change.added.groups):
            if g.prefix in taken:
                raise InputError(change.added_from, f"nodes[{i}].name",
                                 f"node id prefix {g.prefix!r} is already used by the cluster; "
                                 "give the new group a distinct name")
        groups = groups + change.added.groups
    out = ChangedCluster(cluster.name, groups, cluster.inter_island_gbits,
                         frozenset(removed | set(change.failed)))
    if not out.nodes:
        raise InputError(source, "--fail", "no node would be left in service")
    return out


def load_added_nodes(path: Path | str, catalog: dict[str, GPUSpec] | None = None) -> ClusterSpec:
    """A ``NODES.toml`` of ``[[nodes]]`` groups in the cluster format."""
    return load_cluster(path, catalog)


@dataclass(frozen=True)
class Replanned:
    """The outcome of a re-planning.

    Attributes
    ----------
    single : Plan
        The new single-pipeline plan (validated, for the changed cluster).
    replicas : ReplicatedPlan | None
        The replica search's result over ``single`` (validated; one replica when no set of
        replicas is faster), or None where the search does not run for the job.
    previous : Plan | ReplicatedPlan
        The previous plan, rebuilt and validated against the original job.
    time_s : float
        Wall time of the re-planning (rebuilding the previous plan included).
    parallelizer_calls : int
        Calls of the single-pipeline planning that reached the inner parallelizer (misses).
    cache_hits : int
        Calls of the single-pipeline planning answered from the cache.
    """

    single: Plan
    replicas: ReplicatedPlan | None
    previous: Plan | ReplicatedPlan
    time_s: float
    parallelizer_calls: int
    cache_hits: int

    @property
    def plan(self) -> Plan | ReplicatedPlan:
        """The plan to run: the replicas when there are several, else the single pipeline."""
        return self.replicas if self.replicas is not None and len(self.replicas.replicas) > 1 \
            else self.single

    @property
    def replica_calls(self) -> int:
        """Parallelizer calls of the replica search (its in-memory memo's misses)."""
        if self.replicas is None:
            return 0
        return self.replicas.solver.parallelizer_calls - self.single.solver.parallelizer_calls

    @property
    def change(self) -> float:
        """Relative throughput change (new / previous − 1)."""
        return self.plan.tokens_per_s / self.previous.tokens_per_s - 1.0


def replan(job: JobSpec, payload: Any, change: ClusterChange, parallelizer: CachingParallelizer,
           config: PlannerConfig = PlannerConfig(), source: str = "<plan>",
           options: ReplicaOptions = ReplicaOptions()) -> Replanned:
    """Validate the previous plan, apply ``change`` and plan the changed cluster exactly.

    The planner is the same as ``tangram plan``: :func:`solver.studies.pareto.plan_with_targets`,
    with ``parallelizer`` answering from its cache wherever an island did not change, then the
    replica search (``options``) where it runs for the job.
    """
    start = perf_counter()
    calls0, hits0 = parallelizer.inner_calls, parallelizer.hits
    previous = read_previous(payload, job, source)
    changed = replace(job, cluster=apply_change(job.cluster, change))
    single = plan_with_targets(changed, config, parallelizer)
    calls, hits = parallelizer.inner_calls - calls0, parallelizer.hits - hits0
    replicas = plan_replicas(changed, single, config, options=options) \
        if replica_search_runs(changed) else None
    return Replanned(single, replicas, previous, perf_counter() - start, calls, hits)
