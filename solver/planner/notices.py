"""Warnings a user needs with a plan: what the planner cannot change but the user can.

Read from a finished plan (single pipeline); nothing is planned here. The plan's report (the CLI
text and ``tangram plan --json``'s ``warnings``) prints them after the idle nodes, each one line.
"""

from __future__ import annotations

from solver.cost.runtime.frameworks import mixed_kinds_note

#: A bubble above this fraction of the pipeline time gets a warning (issue 45: 25%).
BUBBLE_WARNING = 0.25


def plan_warnings(plan) -> list[str]:
    """One line per thing to know about ``plan`` (:class:`~solver.planner.plan.Plan`): idle
    nodes in all, a bubble over :data:`BUBBLE_WARNING` and what would cut it, islands whose
    name (their weakest GPU type) hides other GPU types."""
    return _idle(plan) + _bubble(plan) + _mixed_islands(plan)


def _idle(plan) -> list[str]:
    """How much of the cluster the plan leaves idle (the reasons are on the idle lines)."""
    if not plan.idle:
        return []
    nodes = plan.job.cluster.nodes
    idle = {node for node, _ in plan.idle}
    gpus = sum(n.gpus for n in nodes if n.node_id in idle)
    return [f"{len(idle)} of {len(nodes)} nodes ({gpus} GPUs) stay idle; the idle lines say why"]


def _bubble(plan) -> list[str]:
    """A large pipeline bubble: more micro-batches per pipeline (a larger global batch, or a
    smaller micro-batch) or a shorter pipeline (fewer nodes or stages) cut it."""
    bubble = plan.bubble_ratio
    if bubble <= BUBBLE_WARNING:
        return []
    depth = sum(s.plan.config.pp for s in plan.stages)
    return [f"bubble {bubble:.0%} of the pipeline time ({depth} pipeline stages, "
            f"{plan.n_micro} micro-batches): a larger global batch (more micro-batches per "
            f"iteration) or fewer nodes (a shorter pipeline) would cut it"]


def _mixed_islands(plan) -> list[str]:
    """Islands of the plan whose nodes are of several GPU types: the name shows the weakest, the
    island is planned at its figures and exported as one device type."""
    out, seen = [], set()
    for s in plan.stages:
        isl = s.island
        note = mixed_kinds_note({n.gpu for n in isl.nodes})
        if note and isl.name not in seen:
            seen.add(isl.name)
            out.append(f"island {isl.name} {note}")
    return out
