"""A heterogeneous training plan, its objective, its JSON form, and its independent validation.

The objective (``shared/design.md``): stages with per-micro-batch latencies ``τ_i`` and boundary
transfers ``c_i`` (links are pipeline stages of their own), ``n`` micro-batches:

    T_pipe = (n − 1) · max(τ, c) + Σ τ + Σ c      (overlap: e_i = max(τ_i, c_i), no link stages)
    T      = T_pipe + max_i (exposed DP sync + optimizer step of stage i)

``validate`` recomputes everything from the job and the cost model, trusting nothing the planner
stored: islands, layer coverage, configuration arithmetic, TP inside a node, memory with the 1F1B
in-flight count of each stage's actual position, and the objective.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

from solver.compose.table import Position
from solver.cost.parallelizer import PartialPlan
from solver.islands import IslandSet, group_island
from solver.planner.notices import plan_warnings
from solver.spec.domain import Island, JobSpec, Node


def cycle_time(taus: Sequence[float], links: Sequence[float], n_micro: int,
               overlap: bool = False) -> float:
    """``T_pipe`` of stages ``taus`` joined by ``links`` (len(taus) − 1 of them)."""
    if overlap:
        costs = [max(t, c) for t, c in zip(taus, list(links) + [0.0])]
    else:
        costs = list(taus) + list(links)
    return (n_micro - 1) * max(costs) + sum(costs)


def interleaved_cycle_time(taus: Sequence[float], n_micro: int, virtual_stages: int) -> float:
    """``T_pipe`` of one pipeline of sub-stages ``taus`` under interleaved 1F1B with ``v`` chunks:
    ``(n − 1) · max τ + max τ + (Σ τ − max τ) / v`` — the fill and drain shrink ``v``-fold
    (Narayanan et al., SC'21, Sec. 2.2: ``(n + (P − 1)/v) τ`` for equal stages, which the event
    simulator reproduces; for unequal stages it is an upper bound). Point-to-point transfers are
    inside the latencies (``v`` times as many boundaries).
    """
    top = max(taus)
    return (n_micro - 1) * top + top + (sum(taus) - top) / virtual_stages


def bubble_ratio(taus: Sequence[float], t_pipe: float, n_micro: int) -> float:
    """Eq. (7): ``1 − n · mean(τ) / T_pipe`` (compute stages only; links count as bubble)."""
    return 1.0 - n_micro * (sum(taus) / len(taus)) / t_pipe


@dataclass(frozen=True)
class StagePlan:
    """One pipeline stage: a group of nodes of an island running layers ``[start, end)``.

    Attributes
    ----------
    island : Island
        The island the group belongs to.
    start, end : int
        Half-open layer range.
    position : Position
        First / middle / last / only.
    in_flight : int
        Micro-batches of activations the plan was sized for (1F1B, by position).
    plan : PartialPlan
        Configuration, latency and memory (at ``in_flight``).
    nodes : tuple[Node, ...]
        The group's nodes; empty means the whole island (a stage of a baseline plan).
    """

    island: Island
    start: int
    end: int
    position: Position
    in_flight: int
    plan: PartialPlan
    nodes: tuple[Node, ...] = ()

    @property
    def group(self) -> Island:
        """The GPUs the stage is planned on: ``len(nodes)`` nodes at the island's effective
        figures (the whole island when ``nodes`` is empty)."""
        return group_island(self.island, len(self.nodes)) if self.nodes else self.island

    @property
    def gpus(self) -> int:
        """GPUs of the stage."""
        return self.group.gpus

    @property
    def node_ids(self) -> list[str]:
        """Ids of the stage's nodes."""
        return [n.node_id for n in (self.nodes or self.island.nodes)]


@dataclass(frozen=True)
class SolverInfo:
    """How the plan was found.

    Attributes
    ----------
    name : str
        Composition solver (``dp``, ``cpsat``, ``milp``) or baseline name.
    optimal : bool
        Optimality proven for the planner's problem.
    time_s : float
        Planning wall time (islands, candidates and composition).
    parallelizer_calls : int
        Calls to the homogeneous parallelizer.
    bound, gap : float | None
        Solver bound and relative gap when optimality was not proven.
    heuristic_pruning : bool
        Heuristic pruning rules (the paper's 2 and 4) were applied: ``optimal`` then holds
        over the candidates they left, not over every plan.
    """

    name: str
    optimal: bool
    time_s: float
    parallelizer_calls: int
    bound: float | None = None
    gap: float | None = None
    heuristic_pruning: bool = False

    @property
    def proof(self) -> str:
        """The proof status in words, for the plan's solver line."""
        if not self.optimal:
            return "NOT proven optimal" + ("" if self.gap is None else f" (gap {self.gap:.1%})")
        if self.heuristic_pruning:
            return ("proven optimal over the candidates that the heuristic rules 2 and 4 kept "
                    "(pruning = \"paper\"; pruning = \"safe\" would prove it over all plans)")
        return "proven optimal"


@dataclass(frozen=True)
class Plan:
    """A complete plan.

    Attributes
    ----------
    job : JobSpec
        The job planned.
    islands : IslandSet
        Islands of the cluster.
    stages : tuple[StagePlan, ...]
        Stages in pipeline order.
    links : tuple[float, ...]
        Boundary transfer seconds per micro-batch between consecutive stages.
    n_micro : int
        Micro-batches per iteration.
    overlap : bool
        Whether transfers were counted as overlapped (eq. 9).
    solver : SolverInfo
        How it was found.
    idle : tuple[tuple[str, str], ...]
        Nodes no stage uses, as ``(node id, reason)``.
    view : str
        ``"islands"`` (Algorithm 1) or ``"whole cluster"`` (every node at the weakest one's
        figures: the view of a heterogeneity-oblivious planner, which the planner also tries).
    virtual_stages : int
        Model chunks per GPU of the interleaved 1F1B schedule (1: plain 1F1B). Only a plan of
        one stage with internal pipelining interleaves (one layout, as Megatron-LM runs it).
    """

    job: JobSpec
    islands: IslandSet
    stages: tuple[StagePlan, ...]
    links: tuple[float, ...]
    n_micro: int
    overlap: bool
    solver: SolverInfo
    idle: tuple[tuple[str, str], ...] = ()
    view: str = "islands"
    virtual_stages: int = 1

    @property
    def taus(self) -> list[float]:
        """Per-micro-batch latency of every pipeline stage (internal sub-stages expanded)."""
        return [t for s in self.stages for t in s.plan.stage_latencies]

    @property
    def all_links(self) -> list[float]:
        """Transfer time after every pipeline stage but the last (0 inside an island, where the
        sub-stages' point-to-point traffic is part of their latency)."""
        out: list[float] = []
        for i, s in enumerate(self.stages):
            out += [0.0] * (len(s.plan.stage_latencies) - 1)
            if i < len(self.links):
                out.append(self.links[i])
        return out

    @property
    def pipeline_time_s(self) -> float:
        """``T_pipe`` of the stages and links (interleaved: :func:`interleaved_cycle_time`)."""
        if self.virtual_stages > 1:
            return interleaved_cycle_time(self.taus, self.n_micro, self.virtual_stages)
        return cycle_time(self.taus, self.all_links, self.n_micro, self.overlap)

    @property
    def iteration_extra_s(self) -> float:
        """Per-iteration terms: the largest exposed DP sync + optimizer step over stages."""
        return max(s.plan.iteration_s for s in self.stages)

    @property
    def iteration_time_s(self) -> float:
        """Seconds per training iteration."""
        return self.pipeline_time_s + self.iteration_extra_s

    @property
    def tokens_per_s(self) -> float:
        """Training throughput."""
        return self.job.training.tokens / self.iteration_time_s

    @property
    def bubble_ratio(self) -> float:
        """Eq. (7) of the seed note."""
        return bubble_ratio(self.taus, self.pipeline_time_s, self.n_micro)


def plan_json(plan: Plan, islands_payload: list[dict[str, Any]]) -> dict[str, Any]:
    """The ``tangram plan --json`` object (public contract)."""
    stages = []
    for s in plan.stages:
        c = s.plan.config
        stages.append({
            "island": s.island.name, "gpu": s.island.gpu.name, "gpus": s.gpus,
            "nodes": s.node_ids, "layers": [s.start, s.end], "tp": c.tp, "cp": c.cp, "ep": c.ep, "pp": c.pp,
            "dp": c.dp, "zero": c.zero, "recompute": c.recompute.value,
            "recompute_layers": c.recompute_layers, "expert_tp": c.etp, "offload": c.offload,
            "a2a_overlap": c.a2a_overlap,
            "micro_batch": c.micro_batch, "virtual_stages": plan.virtual_stages,
            "precision": s.island.gpu.runs_in(plan.job.training.precision),
            "latency_s": _r(s.plan.latency_s), "memory_gb": _r(s.plan.memory_gb)})
    info = plan.solver
    solver: dict[str, Any] = {"name": info.name, "optimal": info.optimal,
                              "time_s": _r(info.time_s, 4),
                              "parallelizer_calls": info.parallelizer_calls,
                              "heuristic_pruning": info.heuristic_pruning}
    if not info.optimal:
        solver.update(bound=info.bound if info.bound is None else _r(info.bound),
                      gap=info.gap if info.gap is None else _r(info.gap))
    return {"pipeline_s": _r(plan.pipeline_time_s), "per_iteration_s": _r(plan.iteration_extra_s),
            "objective": {"iteration_time_s": _r(plan.iteration_time_s),
                          "tokens_per_s": _r(plan.tokens_per_s),
                          "bubble_ratio": _r(plan.bubble_ratio),
                          "n_micro": plan.n_micro},
            "islands": islands_payload, "stages": stages, "solver": solver,
            "view": plan.view, "framework": plan.job.planner.framework.value,
            "schedule": "interleaved" if plan.virtual_stages > 1 else "1f1b",
            "virtual_stages": plan.virtual_stages,
            "idle_nodes": [{"node": node, "reason": why} for node, why in plan.idle],
            "warnings": plan_warnings(plan)}


def _r(x: float, digits: int = 9) -> float:
    """Round for stable, readable JSON (values are model estimates, not measurements)."""
    return float(f"{x:.{digits}g}") if math.isfinite(x) else x
