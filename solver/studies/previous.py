"""Reading a previous plan back: a ``tangram plan --json`` object rebuilt and validated for a job.

``tangram replan`` and ``tangram export`` start from a plan file. It is rebuilt against the job:
its islands must be the job's islands (same names, same nodes), each stage's configuration is
re-evaluated with the cost model, and the whole plan is validated (every replica of a plan of
several pipeline replicas against its own batch share). Any mismatch is an InputError naming the
key of the plan file, so a plan made for another job, cluster or cost model is never used.
"""

from __future__ import annotations

from typing import Any

from solver.compose.table import slice_position
from solver.cost.runtime.frameworks import job_runtime
from solver.cost.parallelizer import MemoryBreakdown, PartialPlan
from solver.cost.stage import ConfigArrays, ModelSlice, StageConfig
from solver.cost.stage_costs import PipelineSetting, stage_costs, substage_latencies
from solver.islands import IslandSet, Thresholds, build_islands, group_island, whole_cluster
from solver.planner.plan import Plan, SolverInfo, StagePlan
from solver.planner.replica.replica_plan import (Replica, ReplicatedPlan, exchange_s, replica_job,
                                         validate_replicated)
from solver.planner.stages.search import job_islands
from solver.planner.check.validate import PlanInvalid, link_model, validate
from solver.spec.domain import ClusterSpec, Island, JobSpec, Node, Recompute, Schedule
from solver.spec.errors import InfeasibleError
from solver.spec.fields import Fields

__all__ = ["previous_plan", "read_previous"]

PREVIOUS = SolverInfo("previous", False, 0.0, 0)  # a plan read back, not solved here


def read_previous(payload: Any, job: JobSpec, source: str) -> Plan | ReplicatedPlan:
    """The plan of ``payload``: a :class:`Plan`, or a :class:`ReplicatedPlan` when it lists
    more than one pipeline replica; validated against ``job``.

    Raises
    ------
    InputError
        The plan does not belong to the job (islands, replicas, stages, configuration,
        objective).
    """
    f = _plan_fields(payload, source)
    if len(f.get("replicas", list, [])) > 1:
        return _replicated(f, job)
    return previous_plan(payload, job, source)


def previous_plan(payload: Any, job: JobSpec, source: str) -> Plan:
    """Rebuild a single-pipeline ``tangram plan --json`` object as a :class:`Plan` of ``job``.

    Raises
    ------
    InputError
        The plan does not belong to the job, or it has several pipeline replicas
        (:func:`read_previous` reads those).
    """
    f = _plan_fields(payload, source)
    replicas = f.get("replicas", list, [])
    f.check("replicas", len(replicas) <= 1,
            f"the plan has {len(replicas)} pipeline replicas; only single-pipeline plans are "
            "read here (plan with [constraints] max_replicas = 1)")
    view = f.get("view", str, "islands", choices=("islands", "whole cluster"))
    isl = whole_cluster(job.cluster) if view == "whole cluster" else \
        build_islands(job.cluster, Thresholds.of(job.planner))
    _check_islands(f, {i.name: i for i in isl.islands}, job.cluster)
    objective = f.sub("objective", required=True)
    n = objective.get("n_micro", int, lo=1, hi=job.training.global_batch)
    objective.check("n_micro", job.training.global_batch % n == 0,
                    f"{n} does not divide the job's global batch {job.training.global_batch}")
    _check_fixed_n(objective, job, n)
    raw = f.get("stages", list)
    v = f.get("virtual_stages", int, 1, lo=1, hi=job.model.layers)
    plan = _pipeline(f, job, isl, list(enumerate(raw)), (n, v), view)
    _check_time(objective, plan.iteration_time_s)
    return plan


def _plan_fields(payload: Any, source: str) -> Fields:
    """The plan file's fields; a ``tangram replan --json`` object is refused by name."""
    f = Fields(payload, source)
    f.check("plan", not f.has("previous_tokens_per_s"),
            "this is a `tangram replan --json` object, whose plan is for the changed cluster; "
            "give the `tangram plan --json` object of the job's own cluster")
    return f


def _pipeline(f: Fields, job: JobSpec, isl: IslandSet, raw: list[tuple[int, Any]],
              schedule: tuple[int, int], view: str = "islands", whose: str = "") -> Plan:
    """The validated pipeline of the stages ``raw`` (their indices in the file's ``stages``)
    for ``job`` over ``isl``, at ``schedule`` = (n_micro, virtual stages); ``whose`` names
    the replica in errors."""
    n, v = schedule
    f.check("stages", bool(raw), "the plan has no stages")
    stages = _stages(f, job, {i.name: i for i in isl.islands}, raw, schedule)
    lm = link_model(job, job.training.global_batch // n)
    links = tuple(lm.rate(a.island, b.island) / min(a.gpus, b.gpus)
                  for a, b in zip(stages, stages[1:]))
    plan = Plan(job, isl, stages, links, n, job.planner.overlap, PREVIOUS, view=view,
                virtual_stages=v)
    try:
        validate(plan, job)
    except InfeasibleError as exc:
        raise f.error("stages", f"{whose}does not fit the job: {exc}") from None
    return plan


def _check_fixed_n(g: Fields, job: JobSpec, n: int) -> None:
    """``n_micro`` of ``g`` must be the job's, when the job fixes it."""
    fixed = job.training.n_micro
    g.check("n_micro", fixed is None or n == fixed,
            f"{n} is not the job's training.n_micro {fixed}")


def _check_time(g: Fields, computed: float) -> None:
    """``iteration_time_s`` of ``g`` must be what the stages give under today's cost model."""
    claimed = g.get("iteration_time_s", float, lo=0, lo_open=True)
    if abs(claimed - computed) > 1e-6 * computed:
        raise g.error("iteration_time_s", f"the plan says {claimed:.6g} s but its stages give "
                                          f"{computed:.6g} s for this job (another job, batch or "
                                          "cost model?)")


def _replicated(f: Fields, job: JobSpec) -> ReplicatedPlan:
    """Rebuild a plan of several pipeline replicas: every replica as the job of its share on
    its islands, then the whole (disjoint islands, shares summing to the batch, all-reduce)."""
    islands = job_islands(job)
    by_name = {i.name: i for i in islands.islands}
    _check_islands(f, by_name, job.cluster)
    listed, raw = f.get("replicas", list), f.get("stages", list)
    for i, item in enumerate(raw):  # every stage belongs to one of the replicas
        Fields(item, f.file, f"stages[{i}]").get("replica", int, lo=0, hi=len(listed) - 1)
    unit = f.sub("replica_search", required=False)
    share_unit = 1 if unit is None else unit.get("share_unit", int, 1, lo=1,
                                                 hi=job.training.global_batch)
    replicas = tuple(_replica(f, Fields(item, f.file, f"replicas[{k}]"), k, job, by_name)
                     for k, item in enumerate(listed))
    extra = exchange_s(job, replicas)
    rp = ReplicatedPlan(job, replicas, extra, PREVIOUS, share_unit, islands=islands.islands,
                        note="the previous plan, read back")
    try:
        validate_replicated(rp, job)
    except PlanInvalid as exc:
        raise f.error("replicas", f"does not fit the job: {exc}") from None
    _check_time(f.sub("objective", required=True), rp.iteration_time_s)
    return rp


def _replica(f: Fields, g: Fields, k: int, job: JobSpec, islands: dict[str, Island]) -> Replica:
    """Replica ``k`` of the file ``f`` (``g``: its entry of ``replicas``): its islands, share and
    stages (those of ``stages`` with ``replica = k``)."""
    names = g.get("islands", list)
    unknown = [x for x in names if x not in islands]
    g.check("islands", bool(names) and not unknown and len(set(names)) == len(names),
            f"must list distinct islands of the job ({', '.join(islands)}), got "
            f"{unknown or names}")
    share = g.get("share", int, lo=1, hi=job.training.global_batch)
    n = g.get("n_micro", int, lo=1, hi=share)
    g.check("n_micro", share % n == 0, f"{n} does not divide the replica's share {share}")
    _check_fixed_n(g, job, n)
    own = [(i, s) for i, s in enumerate(f.get("stages", list)) if s["replica"] == k]
    g.check("stages", bool(own), f"no stage of the plan has replica = {k}")
    first = Fields(own[0][1], f.file, f"stages[{own[0][0]}]")
    v = first.get("virtual_stages", int, 1, lo=1, hi=job.model.layers)
    rjob = replica_job(job, names, share)
    plan = _pipeline(f, rjob, job_islands(rjob), own, (n, v), whose=f"replica {k}: ")
    _check_time(g, plan.iteration_time_s)
    return Replica(tuple(islands[x] for x in names), share, plan)


def _stages(f: Fields, job: JobSpec, islands: dict[str, Island], raw: list[tuple[int, Any]],
            schedule: tuple[int, int]) -> tuple[StagePlan, ...]:
    """The stages ``raw`` (index in the file's ``stages``, item) re-evaluated for ``job``."""
    n, v = schedule
    micro = job.training.global_batch // n
    out = []
    for pos, (i, item) in enumerate(raw):
        g = Fields(item, f.file, f"stages[{i}]")
        name = g.get("island", str)
        g.check("island", name in islands, f"unknown island {name!r}")
        layers = g.get("layers", list)
        g.check("layers", len(layers) == 2 and all(isinstance(x, int) for x in layers)
                and 0 <= layers[0] < layers[1] <= job.model.layers,
                f"must be [start, end) within 0..{job.model.layers}, got {layers}")
        nodes = _stage_nodes(g, islands[name])
        config = _stage_config(g, micro)
        out.append(_stage_plan(job, islands[name], (layers[0], layers[1]), config,
                               (n, min(len(raw) - pos, n), v), nodes))
    return tuple(out)


def _stage_plan(job: JobSpec, island: Island, layers: tuple[int, int], config: StageConfig,
                pipe: tuple[int, int, int], nodes: tuple[Node, ...] = ()) -> StagePlan:
    """A stage re-evaluated with the cost model (what the planner would have stored);
    ``pipe`` = (n_micro, micro-batches in flight, virtual stages)."""
    (start, end), (n_micro, in_flight, v) = layers, pipe
    total = job.model.layers
    slc = ModelSlice(job.model, end - start, start == 0, end == total)
    cfg = ConfigArrays.of([config])
    setting = PipelineSetting(n_micro, in_flight,
                              Schedule.INTERLEAVED if v > 1 else Schedule.ONE_F_ONE_B, v)
    group = group_island(island, len(nodes)) if nodes else island
    runtime = job_runtime(job)
    costs = stage_costs(slc, group, job.training.seq_len, cfg, setting, runtime=runtime)
    subs = substage_latencies(slc, group, job.training.seq_len, cfg, setting, runtime=runtime)[0]
    mem = costs.memory
    breakdown = MemoryBreakdown(*(float(getattr(mem, k)[0]) / 1e9
                                  for k in ("params", "grads", "optimizer", "activations",
                                            "fragmentation")))
    plan = PartialPlan(config, float(costs.latency_s[0]), float(costs.fwd.total[0]),
                       float(costs.bwd.total[0]), float(costs.iteration_s[0]),
                       float(mem.total[0]) / 1e9, breakdown, (config.tp, config.cp, config.dp),
                       tuple(subs), optimizer_s=float(costs.optimizer_s[0]),
                       p2p_s=float(costs.fwd.p2p[0] + costs.bwd.p2p[0]))
    return StagePlan(island, start, end, slice_position(start, end, total), in_flight, plan,
                     nodes)


def _check_islands(f: Fields, islands: dict[str, Island], cluster: ClusterSpec) -> None:
    """The file's ``islands`` must be exactly ``islands`` (names and nodes)."""
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
    """The stage's parallel configuration at ``micro`` sequences per micro-batch."""
    ints = {k: g.get(k, int, lo=1, hi=10**6) for k in ("tp", "cp", "ep", "pp", "dp")}
    g.check("dp", micro % ints["dp"] == 0, f"dp {ints['dp']} does not divide the micro-batch "
                                           f"of {micro} sequences")
    recompute = g.get_enum("recompute", Recompute)
    # Plans written before the block method have no ``recompute_layers``: all layers.
    k = None if g.data.get("recompute_layers") is None else \
        g.get("recompute_layers", int, lo=1, hi=10**6)
    g.check("recompute_layers", k is None or recompute is Recompute.FULL,
            "recompute_layers needs recompute = \"full\"")
    # Plans written before expert tensor parallelism have no ``expert_tp``: equal to tp.
    etp = None if g.data.get("expert_tp") is None else g.get("expert_tp", int, lo=1, hi=10**6)
    # Plans written before the MoE all-to-all overlap have no ``a2a_overlap``: off.
    return StageConfig(**ints, zero=g.get("zero", int, lo=0, hi=3), recompute=recompute,
                       offload=g.get("offload", bool), micro_batch=micro // ints["dp"],
                       recompute_layers=k, expert_tp=None if etp == ints["tp"] else etp,
                       a2a_overlap=g.get("a2a_overlap", bool, False))


def _stage_nodes(g: Fields, island: Island) -> tuple[Node, ...]:
    """The stage's nodes (``nodes``, a list of node ids of its island; absent in plans made
    before node groups: the whole island)."""
    ids = g.get("nodes", list, [n.node_id for n in island.nodes])
    by_id = {n.node_id: n for n in island.nodes}
    unknown = [i for i in ids if i not in by_id]
    g.check("nodes", bool(ids) and not unknown and len(set(ids)) == len(ids),
            f"must list distinct nodes of island {island.name}, got {unknown or ids}")
    return tuple(by_id[i] for i in ids)
