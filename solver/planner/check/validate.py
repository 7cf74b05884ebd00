"""Independent validation of a plan against its job.

Nothing the planner computed is trusted: islands are rebuilt from the job; every stage's
sub-stage latencies and per-iteration terms are recomputed by the scalar reference
(:mod:`solver.planner.check.time_check`) and its memory by the independent count
(:mod:`solver.planner.check.memory_check`) at the in-flight count its position implies; link
times are recomputed, and the objective is recomputed from those numbers by this module's own
pipeline formula. From :mod:`solver.cost` it reads only the rule book (the rules the planner
searched under and the exporters check), the configuration types and the calibration constants,
never the cost model's functions.
"""

from __future__ import annotations

import math

from solver.cost.efficiency import DEFAULT_CALIBRATION
from solver.cost.runtime.frameworks import (interleaving_allowed, loss_kernel_problem,
                                            precision_problem, profile, violations)
from solver.islands import Thresholds, build_islands, whole_cluster, whole_cluster_views
from solver.planner.check.memory_check import plan_memory_gb, usable_gb
from solver.planner.plan import Plan
from solver.planner.check.time_check import plan_stage_seconds
from solver.planner.pruning import LinkModel
from solver.spec.domain import Island, JobSpec, Schedule
from solver.spec.errors import InfeasibleError

REL_TOL = 1e-9


class PlanInvalid(InfeasibleError):
    """A plan failed validation; the message lists what is wrong."""


def link_model(job: JobSpec, micro_batch: int) -> LinkModel:
    """Boundary transfer of a job: activations forward and gradients backward, bf16."""
    per_micro = 2 * micro_batch * job.training.seq_len * job.model.hidden * 2.0
    return LinkModel(per_micro, job.cluster.inter_island_gbits)


def problems(plan: Plan, job: JobSpec, islands: tuple[Island, ...] | None = None) -> list[str]:
    """Everything wrong with ``plan`` for ``job`` (empty when valid).

    ``islands`` replaces the job's islands for baselines that view the cluster differently.
    """
    out = _structure(plan, job, islands)
    if out:
        return out
    taus, extras = [], []
    n = plan.n_micro
    # Sub-stages behind each stage: its last sub-stage holds one more than that (1F1B).
    behind = [sum(t.plan.config.pp for t in plan.stages[i + 1:]) for i in range(len(plan.stages))]
    out += runtime_problems(plan, job) + _constraints(plan, job)
    independent = plan_memory_gb(plan, DEFAULT_CALIBRATION.moe_capacity_factor,
                                 [_flash(s, job) for s in plan.stages])
    seconds = plan_stage_seconds(plan)
    for i, s in enumerate(plan.stages):
        out += _config(s, job, n)
        held = min(behind[i] + 1, n)
        if s.in_flight < held:
            out.append(f"stage {i} ({s.island.name}): sized for {s.in_flight} micro-batches in "
                       f"flight, its position holds {held}")
        subs, extra = tuple(seconds[i][0]), seconds[i][1]
        limit = usable_gb(s.island, job.planner.epsilon)  # re-derived apart from the model's
        if independent[i] > limit * (1 + REL_TOL):
            out.append(f"stage {i} ({s.island.name}): {independent[i]:.2f} GB per GPU at its "
                       f"position's micro-batches in flight (independent count) exceeds the "
                       f"usable {limit:.2f} GB")
        if len(subs) != len(s.plan.stage_latencies) or not all(
                math.isclose(a, b, rel_tol=1e-6) for a, b in zip(subs, s.plan.stage_latencies)):
            out.append(f"stage {i}: latencies {s.plan.stage_latencies} do not match the "
                       f"reference model's {subs}")
        taus.append(subs)
        extras.append(extra)
    links = _links(plan, job)
    flat, flat_links = [], []
    for i, subs in enumerate(taus):
        flat += list(subs)
        flat_links += [0.0] * (len(subs) - 1) + ([links[i]] if i < len(links) else [])
    t = _pipeline_seconds(flat, flat_links, n, plan.overlap, plan.virtual_stages) + max(extras)
    if not math.isclose(t, plan.iteration_time_s, rel_tol=1e-6):
        out.append(f"objective {plan.iteration_time_s} does not match the recomputed {t}")
    return out


def runtime_problems(plan: Plan, job: JobSpec) -> list[str]:
    """What of ``plan`` the job's runtime cannot run, one line each ([] if nothing): its
    profile's rules (:func:`~solver.cost.runtime.frameworks.violations`: layouts, ZeRO, recomputation,
    TP over the KV heads, CP, the expert grid, one precision, one vendor, a tied embedding),
    Megatron's interleaving rules and the loss kernel
    (:func:`~solver.cost.runtime.frameworks.loss_kernel_problem`). The validator and the
    exporters (``--emit``) both call it."""
    pipelined = len(plan.stages) > 1 or any(s.plan.config.pp > 1 for s in plan.stages)
    out = violations([s.plan.config for s in plan.stages], profile(job.planner.framework),
                     pipelined, model=job.model, precision=job.training.precision,
                     stage_gpus=[{x.gpu for x in (s.nodes or s.island.nodes)}
                                 for s in plan.stages], virtual_stages=plan.virtual_stages)
    loss = loss_kernel_problem(profile(job.planner.framework), job.training.cross_entropy)
    return out + _interleaving(plan, job) + ([loss] if loss else [])


def _pipeline_seconds(taus: list[float], links: list[float], n: int, overlap: bool,
                      v: int) -> float:
    """``T_pipe`` recomputed here, apart from :mod:`solver.planner.plan`: the bottleneck
    (largest stage or link) runs all ``n`` micro-batches and every other stage and link is
    crossed once; interleaved, the others once per ``v`` chunks; with overlap a stage and the
    link after it cost the larger of the two."""
    if v > 1:
        top = max(taus)
        return n * top + (sum(taus) - top) / v
    if overlap:
        costs = [max(t, links[i]) if i < len(links) else t for i, t in enumerate(taus)]
    else:
        costs = taus + links
    top = max(costs)
    return n * top + sum(costs) - top


def validate(plan: Plan, job: JobSpec, islands: tuple[Island, ...] | None = None) -> None:
    """Raise :class:`PlanInvalid` naming every problem, or return silently."""
    found = problems(plan, job, islands)
    if found:
        raise PlanInvalid("invalid plan: " + "; ".join(found))


def _structure(plan: Plan, job: JobSpec, given: tuple[Island, ...] | None) -> list[str]:
    out = []
    if not plan.stages:
        return ["plan has no stages"]
    if given is None:  # Algorithm 1's islands, or the whole cluster as one (PlannerConfig)
        runs_it = (lambda gpu: precision_problem(gpu, job.training.precision) is None)
        views = [build_islands(job.cluster, Thresholds.of(job.planner)).islands,
                 whole_cluster(job.cluster).islands] + \
            [v.islands for v in whole_cluster_views(job.cluster, runs_it)]
        names = {s.island.name for s in plan.stages}
        given = next((v for v in views if names <= {i.name for i in v}), views[0])
    islands = {i.name: i for i in given}
    cursor, order, taken = 0, [], set()
    for s in plan.stages:
        real = islands.get(s.island.name)
        if real is None or real.nodes != s.island.nodes:
            out.append(f"{s.island.name} is not an island of the job's cluster")
        if order and order[-1] != s.island.name and s.island.name in order:
            out.append(f"island {s.island.name} hosts two separate blocks of stages")
        order.append(s.island.name)
        ids = s.node_ids
        if not set(ids) <= {n.node_id for n in s.island.nodes}:
            out.append(f"{s.island.name}: stage nodes {ids} are not all in the island")
        if taken & set(ids) or len(set(ids)) != len(ids):
            out.append(f"{s.island.name}: node(s) {sorted(taken & set(ids))} used by two stages")
        taken |= set(ids)
        if s.start != cursor or s.end <= s.start:
            out.append(f"{s.island.name}: layers [{s.start}, {s.end}) do not continue at {cursor}")
        cursor = s.end
    if cursor != job.model.layers:
        out.append(f"layers end at {cursor}, the model has {job.model.layers}")
    if len(plan.links) != len(plan.stages) - 1:
        out.append("one link time per stage boundary expected")
    return out


def _config(s, job: JobSpec, n: int) -> list[str]:
    c, isl, out = s.plan.config, s.group, []
    name = s.island.name
    if c.tp * c.cp * c.pp * c.dp != isl.gpus:
        out.append(f"{name}: tp·cp·pp·dp = {c.tp * c.cp * c.pp * c.dp} != {isl.gpus} GPUs")
    if isl.gpus_per_node % c.tp:
        out.append(f"{name}: TP group of {c.tp} does not fit in a node of {isl.gpus_per_node}")
    micro = job.training.global_batch // n
    if c.micro_batch * c.dp != micro:
        out.append(f"{name}: dp {c.dp} × {c.micro_batch} sequences != micro-batch of {micro}")
    if job.training.global_batch % n:
        out.append(f"n_micro {n} does not divide the global batch {job.training.global_batch}")
    if job.training.seq_len % c.cp:
        out.append(f"{name}: cp {c.cp} does not divide the sequence")
    if job.training.fp8_param_gather and c.dp * c.cp > 1 and c.zero < 1:
        out.append(f"{name}: FP8 weights (--fp8-param-gather) need the distributed optimizer, "
                   f"got ZeRO-{c.zero} (Megatron-LM validate_args)")
    return out


def _constraints(plan: Plan, job: JobSpec) -> list[str]:
    """What of the plan the job's ``[constraints]`` do not allow."""
    c, out = job.constraints, []
    for i, s in enumerate(plan.stages):
        k = s.plan.config
        for name, value in (("tp", k.tp), ("cp", k.cp), ("ep", k.ep), ("expert_tp", k.etp),
                            ("micro_batch", k.micro_batch)):
            allowed = getattr(c, name)
            if allowed is not None and value not in allowed:
                out.append(f"stage {i}: {name} {value} is not in constraints.{name} {list(allowed)}")
        if c.zero is not None and k.dp * k.cp > 1 and k.zero not in c.zero:
            out.append(f"stage {i}: ZeRO-{k.zero} is not in constraints.zero {list(c.zero)}")
        if c.recompute is not None and k.recompute not in c.recompute:
            out.append(f"stage {i}: recompute {k.recompute.value} is not allowed")
        if c.offload is False and k.offload:
            out.append(f"stage {i}: offload is not allowed")
        if c.a2a_overlap is False and k.a2a_overlap:
            out.append(f"stage {i}: the MoE all-to-all overlap is not allowed "
                       "(constraints.a2a_overlap)")
        if not c.allows_island(s.island):
            out.append(f"stage {i}: island {s.island.name} is left out by the constraints")
    depth = sum(s.plan.config.pp for s in plan.stages)
    if c.max_stages is not None and depth > c.max_stages:
        out.append(f"{depth} pipeline stages exceed constraints.max_stages {c.max_stages}")
    if c.pp is not None and depth not in c.pp:
        out.append(f"{depth} pipeline stages are not in constraints.pp {list(c.pp)}")
    fixed = job.training.n_micro  # None: the planner searches n_micro
    if fixed is not None and plan.n_micro != fixed:
        out.append(f"n_micro {plan.n_micro} is not the job's training.n_micro {fixed}")
    schedule = Schedule.INTERLEAVED if plan.virtual_stages > 1 else Schedule.ONE_F_ONE_B
    if not c.allows_schedule(schedule):
        out.append(f"schedule {schedule.value} is not in constraints.schedule")
    if c.virtual_stages is not None and plan.virtual_stages > 1 and \
            plan.virtual_stages not in c.virtual_stages:
        out.append(f"virtual_stages {plan.virtual_stages} is not allowed")
    return out


def _flash(s, job: JobSpec) -> bool:
    """The stage runs fused attention (its framework and every GPU of its island have it)."""
    return not profile(job.planner.framework).unfused_attention and all(
        x.gpu.attention != "unfused" for x in s.island.nodes)


def _interleaving(plan: Plan, job: JobSpec) -> list[str]:
    """Megatron's rules for virtual pipeline stages, and the framework's."""
    v = plan.virtual_stages
    if v == 1:
        return []
    if len(plan.stages) != 1:
        return [f"interleaving (v = {v}) needs one pipeline of one layout, not "
                f"{len(plan.stages)} stages"]
    pp, layers = plan.stages[0].plan.config.pp, job.model.layers
    out = []
    if pp < 2 or layers % (pp * v):
        out.append(f"interleaving needs pp >= 2 and layers ({layers}) divisible by pp·v = {pp}·{v}")
    if plan.n_micro % pp:
        out.append(f"interleaving needs n_micro ({plan.n_micro}) divisible by pp ({pp})")
    if not interleaving_allowed(profile(job.planner.framework), len(plan.stages)):
        out.append(f"{job.planner.framework.value} does not run virtual pipeline stages")
    return out


def _links(plan: Plan, job: JobSpec) -> list[float]:
    lm = link_model(job, job.training.global_batch // plan.n_micro)
    out = []
    for a, b in zip(plan.stages, plan.stages[1:]):
        out.append(lm.rate(a.island, b.island) / min(a.gpus, b.gpus))
    return out
