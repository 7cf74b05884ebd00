"""Re-planning after a cluster change (failed nodes, added nodes) with the partial-plan cache.

A node failure changes one island's signature; every other island keeps its cached partial
plans, so the parallelizer is only called for the changed island's entries (plus the few entries
of unchanged islands that the new cluster's pruning windows newly admit), and the composition is
redone exactly. The result is the plan a fresh ``tangram plan`` of the changed cluster gives.

The previous plan comes as the ``tangram plan --json`` object. It is rebuilt against the job:
its islands must be the job's islands (same names, same nodes), each stage's configuration is
re-evaluated with the cost model and the whole plan is validated; any mismatch is an InputError
naming the key of the plan file.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from time import perf_counter
from typing import Any

from solver.cost.frameworks import job_runtime
from solver.compose.table import slice_position
from solver.cost.parallelizer import MemoryBreakdown, PartialPlan
from solver.cost.stage import ConfigArrays, ModelSlice, StageConfig
from solver.cost.stage_costs import PipelineSetting, stage_costs, substage_latencies
from solver.islands import Thresholds, build_islands, group_island, whole_cluster
from solver.planner.plan import Plan, SolverInfo, StagePlan
from solver.planner.plancache import CachingParallelizer
from solver.planner.search import PlannerConfig
from solver.planner.validate import link_model, validate
from solver.spec.domain import ClusterSpec, GPUSpec, Island, JobSpec, Node, Recompute, Schedule
from solver.spec.errors import InfeasibleError, InputError
from solver.spec.fields import Fields
from solver.spec.loaders import load_cluster
from solver.studies.pareto import plan_with_targets


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


def _stage_plan(job: JobSpec, island: Island, start: int, end: int, config: StageConfig,
                n_micro: int, in_flight: int, nodes: tuple[Node, ...] = (), v: int = 1
                ) -> StagePlan:
    """A stage re-evaluated with the cost model (what the planner would have stored)."""
    layers = job.model.layers
    slc = ModelSlice(job.model, end - start, start == 0, end == layers)
    cfg = ConfigArrays.of([config])
    pipe = PipelineSetting(n_micro, in_flight,
                           Schedule.INTERLEAVED if v > 1 else Schedule.ONE_F_ONE_B, v)
    group = group_island(island, len(nodes)) if nodes else island
    costs = stage_costs(slc, group, job.training.seq_len, cfg, pipe, runtime=job_runtime(job))
    subs = substage_latencies(slc, group, job.training.seq_len, cfg, pipe,
                              runtime=job_runtime(job))[0]
    mem = costs.memory
    breakdown = MemoryBreakdown(*(float(getattr(mem, k)[0]) / 1e9
                                  for k in ("params", "grads", "optimizer", "activations")))
    plan = PartialPlan(config, float(costs.latency_s[0]), float(costs.fwd.total[0]),
                       float(costs.bwd.total[0]), float(costs.iteration_s[0]),
                       float(mem.total[0]) / 1e9, breakdown, (config.tp, config.cp, config.dp),
                       tuple(subs))
    return StagePlan(island, start, end, slice_position(start, end, layers), in_flight, plan,
                     nodes)


def _check_islands(f: Fields, islands: dict[str, Island], cluster: ClusterSpec) -> None:
    listed = f.get("islands", list)
    names = []
    for i, raw in enumerate(listed):
        g = Fields(raw, f.file, f"islands[{i}]")
        name, nodes = g.get("name", str), g.get("nodes", list)
        real = islands.get(name)
        if real is None or [n.node_id for n in real.nodes] != nodes:
            raise g.error("nodes", f"island {name!r} with nodes {nodes[:3]}... is not an island "
                                   f"of the job's cluster {cluster.name!r} (its islands: "
                                   f"{', '.join(islands)})")
        names.append(name)
    missing = sorted(set(islands) - set(names))
    if missing:
        raise f.error("islands", f"the job's cluster has island(s) {', '.join(missing)} the plan "
                                 "does not list: the plan was made for another cluster")


def _stage_config(g: Fields, micro: int) -> StageConfig:
    ints = {k: g.get(k, int, lo=1, hi=10**6) for k in ("tp", "cp", "ep", "pp", "dp")}
    g.check("dp", micro % ints["dp"] == 0, f"dp {ints['dp']} does not divide the micro-batch "
                                           f"of {micro} sequences")
    return StageConfig(**ints, zero=g.get("zero", int, lo=0, hi=3),
                       recompute=g.get_enum("recompute", Recompute),
                       offload=g.get("offload", bool), micro_batch=micro // ints["dp"])


def previous_plan(payload: Any, job: JobSpec, source: str) -> Plan:
    """Rebuild a ``tangram plan --json`` object as a :class:`Plan` of ``job`` and validate it.

    Raises
    ------
    InputError
        The plan does not belong to the job (islands, stages, configuration, objective).
    """
    f = Fields(payload, source)
    replicas = f.get("replicas", list, [])
    f.check("replicas", len(replicas) <= 1,
            f"the plan has {len(replicas)} pipeline replicas; only single-pipeline plans are "
            "re-read (plan with [constraints] max_replicas = 1)")
    view = f.get("view", str, "islands", choices=("islands", "whole cluster"))
    isl = whole_cluster(job.cluster) if view == "whole cluster" else \
        build_islands(job.cluster, Thresholds.of(job.planner))
    by_name = {i.name: i for i in isl.islands}
    _check_islands(f, by_name, job.cluster)
    objective = f.sub("objective", required=True)
    n = objective.get("n_micro", int, lo=1, hi=job.training.global_batch)
    objective.check("n_micro", job.training.global_batch % n == 0,
                    f"{n} does not divide the job's global batch {job.training.global_batch}")
    v = f.get("virtual_stages", int, 1, lo=1, hi=job.model.layers)
    stages = _stages(f, job, by_name, n, v)
    lm = link_model(job, job.training.global_batch // n)
    links = tuple(lm.rate(a.island, b.island) / min(a.gpus, b.gpus)
                  for a, b in zip(stages, stages[1:]))
    plan = Plan(job, isl, stages, links, n, job.planner.overlap,
                SolverInfo("previous", False, 0.0, 0), view=view, virtual_stages=v)
    try:
        validate(plan, job)
    except InfeasibleError as exc:
        raise f.error("stages", f"does not fit the job: {exc}") from None
    claimed = objective.get("iteration_time_s", float, lo=0, lo_open=True)
    if abs(claimed - plan.iteration_time_s) > 1e-6 * plan.iteration_time_s:
        raise objective.error("iteration_time_s", f"the plan says {claimed:.6g} s but its stages "
                              f"give {plan.iteration_time_s:.6g} s for this job (another job, "
                              "batch or cost model?)")
    return plan


def _stages(f: Fields, job: JobSpec, islands: dict[str, Island], n: int, v: int = 1
            ) -> tuple[StagePlan, ...]:
    raw = f.get("stages", list)
    f.check("stages", bool(raw), "the plan has no stages")
    micro = job.training.global_batch // n
    out = []
    for i, item in enumerate(raw):
        g = Fields(item, f.file, f"stages[{i}]")
        name = g.get("island", str)
        g.check("island", name in islands, f"unknown island {name!r}")
        layers = g.get("layers", list)
        g.check("layers", len(layers) == 2 and all(isinstance(x, int) for x in layers)
                and 0 <= layers[0] < layers[1] <= job.model.layers,
                f"must be [start, end) within 0..{job.model.layers}, got {layers}")
        nodes = _stage_nodes(g, islands[name])
        config = _stage_config(g, micro)
        out.append(_stage_plan(job, islands[name], layers[0], layers[1], config, n,
                               min(len(raw) - i, n), nodes, v))
    return tuple(out)


def _stage_nodes(g: Fields, island: Island) -> tuple[Node, ...]:
    """The stage's nodes (``nodes``, a list of node ids of its island; absent in plans made
    before node groups: the whole island)."""
    ids = g.get("nodes", list, [n.node_id for n in island.nodes])
    by_id = {n.node_id: n for n in island.nodes}
    unknown = [i for i in ids if i not in by_id]
    g.check("nodes", bool(ids) and not unknown and len(set(ids)) == len(ids),
            f"must list distinct nodes of island {island.name}, got {unknown or ids}")
    return tuple(by_id[i] for i in ids)


@dataclass(frozen=True)
class Replanned:
    """The outcome of a re-planning.

    Attributes
    ----------
    plan : Plan
        The new plan (validated, for the changed cluster).
    previous : Plan
        The previous plan, rebuilt and validated against the original job.
    time_s : float
        Wall time of the re-planning (rebuilding the previous plan included).
    parallelizer_calls : int
        Calls that reached the inner parallelizer (cache misses).
    cache_hits : int
        Calls answered from the cache.
    """

    plan: Plan
    previous: Plan
    time_s: float
    parallelizer_calls: int
    cache_hits: int

    @property
    def change(self) -> float:
        """Relative throughput change (new / previous − 1)."""
        return self.plan.tokens_per_s / self.previous.tokens_per_s - 1.0


def replan(job: JobSpec, payload: Any, change: ClusterChange, parallelizer: CachingParallelizer,
           config: PlannerConfig = PlannerConfig(), source: str = "<plan>") -> Replanned:
    """Validate the previous plan, apply ``change`` and plan the changed cluster exactly.

    The planner is the same as ``tangram plan`` (:func:`solver.studies.pareto.plan_with_targets`), with
    ``parallelizer`` answering from its cache wherever an island did not change.
    """
    start = perf_counter()
    calls0, hits0 = parallelizer.inner_calls, parallelizer.hits
    previous = previous_plan(payload, job, source)
    changed = replace(job, cluster=apply_change(job.cluster, change))
    plan = plan_with_targets(changed, config, parallelizer)
    return Replanned(plan, previous, perf_counter() - start, parallelizer.inner_calls - calls0,
                     parallelizer.hits - hits0)

