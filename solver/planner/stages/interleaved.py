"""Interleaved 1F1B plans: one group of one island as one Megatron pipeline with ``v`` chunks.

The node-group DP composes stages with plain 1F1B. The interleaved schedule (Narayanan et al.,
SC'21, Sec. 2.2: ``v`` model chunks per GPU, fill and drain ``v`` times shorter, ``v`` times as
many point-to-point transfers, more activations in flight on the early stages) is searched here
over the family Megatron-LM runs: one group of ``N`` nodes of one island (of the islands view
or the whole-cluster view) runs all layers as an internal pipeline of ``pp >= 2`` stages with
one layout, under Megatron's rules — ``layers % (pp v) == 0`` (``--num-layers-per-virtual-
pipeline-stage``) and ``n_micro % pp == 0``. FlagScale rejects virtual stages with heterogeneous
meshes, so a multi-mesh plan never interleaves; a one-mesh plan is plain Megatron-LM, which does
(:func:`~solver.cost.runtime.frameworks.interleaving_allowed`).

The family is enumerated exhaustively (every island, node count, ``v`` and configuration the
parallelizer prices with the interleaved schedule), with three provably safe cuts: a group whose
compute lower bound (:func:`~solver.planner.bounds.floors.compute_floor`: the model's FLOPs per
iteration at its kernels' fastest rates) is not below the incumbent cannot win; at a group
and ``n_micro`` no ``v >= 2`` is priced when the group's plain-1F1B plans at that ``n_micro``
already bound every interleaved one from below at or above the incumbent (:func:`plain_floor`;
one call instead of one per ``v``); and those plain plans are not priced either when the cost
model's least layer latency of each layout already puts that bound at or above the incumbent
(:func:`one_mesh_floor`, about a tenth of a pricing call; ``fleet-700``'s replica search: 4,800
of 4,972 calls saved). The objective is
:func:`~solver.planner.plan.interleaved_cycle_time` plus the per-iteration terms.
"""

from __future__ import annotations

import math

import numpy as np

from solver.compose.table import Position
from solver.cost.runtime.frameworks import (interleaving_allowed, megatron_interleaves, profile,
                                            state_types)
from solver.cost.configs import FeatureSet, _layouts
from solver.cost.efficiency import Calibration
from solver.cost.least_costs import a2a_ceiling, layer_latencies
from solver.cost.parallelizer import (Parallelizer, PartialPlan, PlanContext,
                                      kernel_calibration, prices_interleaving_above_plain,
                                      stage_calibration)
from solver.cost.stage import ConfigArrays, ModelSlice
from solver.cost.stage import substage_layers
from solver.islands import IslandSet, group_island, node_key
from solver.planner.bounds.floors import compute_floor
from solver.planner.plan import Plan, SolverInfo, StagePlan, interleaved_cycle_time
from solver.planner.stages.reasons import outside_view
from solver.spec.domain import FeaturePreset, Island, JobSpec, Schedule

__all__ = ["chunk_counts", "plain_floor", "one_mesh_floor", "interleaved_depths",
           "best_interleaved"]

ROUNDING = 1e-9  # relative margin below the cost model's own sums


def chunk_counts(layers: int, allowed: tuple[int, ...] | None = None) -> list[int]:
    """``v >= 2`` for which some ``pp >= 2`` has ``layers % (pp v) == 0`` (within ``allowed``)."""
    return [v for v in range(2, layers // 2 + 1) if layers % v == 0 and layers // v >= 2
            and (allowed is None or v in allowed)]


def _context(job: JobSpec, features: FeaturePreset, n: int, v: int, nodes: int,
             island: Island, max_pp: int | None = None) -> PlanContext:
    # max_pp does not depend on the group (the parallelizer caps pp by the GPUs), so a group
    # of a given size shares its cache entries across clusters (replan).
    schedule = Schedule.INTERLEAVED if v > 1 else Schedule.ONE_F_ONE_B
    return PlanContext(job.training.seq_len, job.training.global_batch // n, n, 1,
                       job.planner.epsilon, max_pp or job.model.layers // v, features,
                       schedule, v, job.planner.framework, job.training.precision,
                       job.constraints.on_stages(), **state_types(job))


def interleaved_depths(job: JobSpec, n: int, v: int) -> list[int]:
    """The depths ``pp`` Megatron runs with ``v`` chunks and ``n`` micro-batches that the
    job's constraints allow (:func:`_best_of` keeps no other plan)."""
    layers = job.model.layers
    return [pp for pp in range(2, layers // v + 1)
            if megatron_interleaves(layers, pp, v, n) and job.constraints.allows_depth(pp)]


def _best_of(plans: list[PartialPlan], job: JobSpec, n: int, v: int
             ) -> tuple[float, PartialPlan] | None:
    """The fastest plan Megatron's pipeline rules accept, with its iteration time: interleaved,
    ``pp >= 2``, ``layers % (pp v) == 0`` and ``n % pp == 0``; plain (``v = 1``), a layer split
    whose middle stages are equal (only the first and last may differ)."""
    best = None
    for p in plans:
        pp = p.config.pp
        if not job.constraints.allows_depth(pp):
            continue
        if v > 1 and not megatron_interleaves(job.model.layers, pp, v, n):
            continue
        if v == 1 and len(set(substage_layers(job.model.layers, pp)[1:-1])) > 1:
            continue
        t = interleaved_cycle_time(p.stage_latencies, n, v) + p.iteration_s
        if best is None or t < best[0]:
            best = (t, p)
    return best


def chunk_options(job: JobSpec) -> list[int]:
    """Chunks per GPU ``v`` searched for one-mesh plans: ``v >= 2`` where the runtime
    interleaves one mesh; ``v = 1`` (plain 1F1B over the internal pipeline) where the runtime
    runs one layout only (Megatron-Core), whose plans are all one mesh."""
    prof, c = profile(job.planner.framework), job.constraints
    out = [1] if prof.uniform_layout and c.allows_schedule(Schedule.ONE_F_ONE_B) else []
    if interleaving_allowed(prof, meshes=1) and c.allows_schedule(Schedule.INTERLEAVED):
        out += chunk_counts(job.model.layers, c.virtual_stages)
    return out


def best_interleaved(job: JobSpec, features: FeaturePreset, ns: list[int],
                     parallelizer: Parallelizer, bar: float,
                     views: list[tuple[IslandSet, str]]) -> tuple[Plan | None, int]:
    """The fastest interleaved plan of the family faster than ``bar`` seconds (None if none),
    and the parallelizer calls the search made (one per group, n_micro and ``v``).

    ``ns``: micro-batch counts to try; ``views``: the island sets (and view names) the
    composition searched, whose islands host the candidate pipelines.
    """
    if not chunk_options(job):
        return None, 0
    best, calls = None, [0]
    for islands, view in views:
        for island in islands.islands:
            found = _on_island(job, features, ns, parallelizer, island, bar, calls)
            if found is not None and found[0] < bar:
                bar, best = found[0], (found, islands, view, island)
    return (None if best is None else _decode(job, *best, calls[0])), calls[0]


def overlap_possible(job: JobSpec, features: FeaturePreset) -> bool:
    """Whether a one-mesh plan of ``job`` may overlap its MoE all-to-alls (the runtime runs it,
    the features have EP and the constraints allow it): the bounds below then leave room for
    what it hides, which plain 1F1B with pipeline stages never does (it needs virtual ones)."""
    return (job.model.is_moe and profile(job.planner.framework).moe_a2a_overlap
            and FeatureSet.of(features).ep and job.constraints.a2a_overlap is not False)


def plain_floor(job: JobSpec, plain: list[PartialPlan], n: int,
                hidden: list[float] | None = None) -> float:
    """No interleaved plan (any ``v >= 2``) of the group and ``n`` that ``plain`` was priced
    for beats this: ``min n · max τ + iteration`` over the plain-1F1B plans ``plain`` whose
    depth Megatron could interleave (``pp >= 2``, ``layers % pp = 0``, ``n % pp = 0``, allowed
    by the constraints).

    Provably safe for a parallelizer that prices interleaving above plain 1F1B less its
    transfers (:func:`~solver.cost.parallelizer.prices_interleaving_above_plain`; the analytic
    cost model does): a configuration priced with ``v`` chunks has the same compute and
    optimizer step as under plain 1F1B, its ``v`` times as many point-to-point transfers
    exposed or hidden behind compute (Megatron's ``overlap_p2p_comm``), so its latency is at
    least the plain plan's less the plain plan's own transfers (``p2p_s``), and at least as
    many micro-batches in flight on every sub-stage (so it also fits under plain 1F1B, where
    it, or a plan of its layout no slower in latency less transfers and optimizer step, is in
    ``plain``); its data-parallel sync, run chunk by chunk, may be less
    (:func:`~solver.cost.sync.hide_interleaved`), so only the optimizer step (``optimizer_s``)
    counts of the per-iteration time; and :func:`~solver.planner.plan.interleaved_cycle_time`
    is at least ``n · max τ``. With the MoE all-to-all overlap (interleaved only) a sub-stage
    hides at most its layers' four all-to-alls each: ``hidden``, per plan of ``plain``, that
    much for its largest sub-stage (:func:`~solver.cost.least_costs.a2a_ceiling`), taken off
    too (its exposed part per iteration only adds).
    """
    hidden = hidden or [0.0] * len(plain)
    return min((n * max(p.latency_s - p.p2p_s - h, 0.0) + p.optimizer_s
                for p, h in zip(plain, hidden)
                if p.config.pp >= 2 and job.model.layers % p.config.pp == 0
                and n % p.config.pp == 0 and job.constraints.allows_depth(p.config.pp)),
               default=math.inf)


def _hidden(job: JobSpec, plain: list[PartialPlan], group: Island, context: PlanContext,
            calib: Calibration) -> list[float]:
    """Per plan of ``plain``, the most the overlap hides on its largest sub-stage
    (:func:`plain_floor`)."""
    cfg = ConfigArrays.of([p.config for p in plain])
    per_layer = a2a_ceiling(job.model, group, context.seq_len, cfg, calib, context.runtime)
    return [float(h) * -(-job.model.layers // p.config.pp) for p, h in zip(plain, per_layer)]


def one_mesh_floor(job: JobSpec, context: PlanContext, group: Island,
                   calib: Calibration) -> float:
    """No plan :func:`plain_floor` reads at ``context`` (plain 1F1B, ``n_micro``, internal
    depths up to ``context.max_pp``) on ``group`` gives less: ``min n · (L / pp) · a`` over the
    layouts Megatron could interleave (``pp >= 2``, ``L % pp = 0``, ``n % pp = 0``, allowed), ``a``
    the layout's layer latency without recomputation (:func:`~solver.cost.least_costs.
    layer_latencies`, under ``calib``, the parallelizer's stage calibration).

    Provably safe: such a plan's latency is its slowest sub-stage's, and the one with the most
    layers holds at least ``L / pp`` of them, each at least ``a`` (every other term of a
    sub-stage is non-negative and recomputation only adds); its per-iteration time is not
    negative. Layouts are those of the job's features before the framework's and the user's
    limits, which only remove some; a small margin covers the sums' order."""
    layers, n = job.model.layers, context.n_micro
    rows = np.array(_layouts(ModelSlice.whole(job.model), group, context,
                             FeatureSet.of(context.features)), dtype=np.int64).reshape(-1, 6)
    tp, cp, pp, dp, ep, etp = rows.T
    keep = (pp >= 2) & (layers % pp == 0) & (n % pp == 0) & \
        np.array([job.constraints.allows_depth(int(p)) for p in pp], dtype=bool)
    if not keep.any():
        return math.inf
    tp, cp, pp, dp, ep, etp = (x[keep] for x in (tp, cp, pp, dp, ep, etp))
    none = np.zeros_like(tp)
    cfg = ConfigArrays(tp=tp, cp=cp, ep=ep, pp=pp, dp=dp, expert_tp=etp, zero=none,
                       recompute=none,
                       offload=none.astype(bool), micro_batch=context.micro_batch // dp)
    per_layer = layer_latencies(job.model, group, context.seq_len, cfg, calib, context.runtime)
    if overlap_possible(job, context.features):  # what plain_floor takes off, per layer
        per_layer = per_layer - a2a_ceiling(job.model, group, context.seq_len, cfg, calib,
                                            context.runtime)
    return float(np.min(n * (layers / pp) * per_layer)) * (1 - ROUNDING)


def _on_island(job, features, ns, parallelizer, island, bar, calls: list[int]):
    """(time, plan, nodes, n, v) of the fastest interleaved plan on a group of ``island``;
    ``calls[0]`` counts the parallelizer calls. A ``v`` with no depth Megatron runs at ``n``
    is not priced; with a parallelizer that prices interleaving above plain 1F1B, one
    plain-1F1B call over those depths bounds every ``v >= 2`` (:func:`plain_floor`)."""
    best, bounded = None, prices_interleaving_above_plain(parallelizer)
    calib = stage_calibration(parallelizer) if bounded else None

    def priced(n: int, v: int, nodes: int, group: Island, max_pp: int | None = None):
        calls[0] += 1
        return parallelizer.plan(ModelSlice.whole(job.model), group,
                                 _context(job, features, n, v, nodes, island, max_pp))

    for nodes in range(len(island.nodes), 0, -1):
        if compute_floor(job, island, nodes, kernel_calibration(parallelizer)) >= bar:
            break  # fewer nodes only raise the floor
        group = group_island(island, nodes)
        for n in ns:
            depths = {v: interleaved_depths(job, n, v) for v in chunk_options(job) if v > 1}
            deepest = max((max(d) for d in depths.values() if d), default=0)
            plain = None
            for v in chunk_options(job):  # 1 (when searched) comes first
                if v > 1 and not depths[v]:
                    continue  # every plan priced would be refused
                if v > 1 and bounded:
                    if plain is None and calib is not None and one_mesh_floor(
                            job, _context(job, features, n, 1, nodes, island, deepest), group,
                            calib) >= bar:
                        break  # not even the plain plans' bound is under the bar
                    plain = priced(n, 1, nodes, group, deepest) if plain is None else plain
                    hidden = (_hidden(job, plain, group, _context(
                        job, features, n, 1, nodes, island), calib) if plain and
                        overlap_possible(job, features) else None)
                    if plain_floor(job, plain, n, hidden) * (1 - 1e-12) >= bar:  # rounding
                        break  # no v >= 2 at this group and n beats the bar
                plans = plain if v == 1 and plain is not None else priced(n, v, nodes, group)
                plain = plans if v == 1 else plain
                found = _best_of(plans, job, n, v)
                if found is not None and found[0] < bar:
                    bar, best = found[0], (found[0], found[1], nodes, n, v)
    return best


def _decode(job: JobSpec, found, islands: IslandSet, view: str, island: Island,
            calls: int) -> Plan:
    t, partial, nodes, n, v = found
    order = sorted(island.nodes, key=node_key)
    stage = StagePlan(island, 0, job.model.layers, Position.ONLY, 1, partial,
                      tuple(order[:nodes]))
    busy = {x.node_id for x in stage.nodes}
    kind = f"one interleaved pipeline (v = {v})" if v > 1 else \
        f"one Megatron pipeline of one layout (pp = {partial.config.pp})"
    why = f"the optimal plan is {kind} on {nodes} of the {len(island.nodes)} nodes of {island.name}"
    idle = tuple((x.node_id, why if x in island.nodes else
                  f"island {i.name} is not in the optimal plan ({kind})")
                 for i in islands.islands for x in sorted(i.nodes, key=node_key)
                 if x.node_id not in busy) + outside_view(job, islands)
    info = SolverInfo("interleaved" if v > 1 else "one-mesh", True, 0.0, calls)
    return Plan(job, islands, (stage,), (), n, job.planner.overlap, info, idle, view, v)
