"""Why the planner left nodes idle, and why no plan exists: the one-line reasons it reports.

Both read a planning run (:class:`solver.planner.runs.PlanningRun`: the job, its islands, the
run's ``n_micro``) and what the search found; neither plans anything.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from solver.islands import node_key
from solver.planner.candidates import granule
from solver.planner.plan import StagePlan

if TYPE_CHECKING:  # annotations only: search imports this module
    from solver.planner.candidates import CandidateTable
    from solver.planner.runs import PlanningRun


def idle_nodes(run: PlanningRun, stages: list[StagePlan],
               cand: CandidateTable) -> tuple[tuple[str, str], ...]:
    """Every node no stage uses, with the reason."""
    busy = {n.node_id for s in stages for n in s.nodes}
    sizes = {}
    for s in stages:
        sizes.setdefault(s.island.name, []).append(len(s.nodes))
    out = []
    for isl in run.islands.islands:
        if isl.name in cand.unusable:
            why = f"island {isl.name} is unusable: {cand.unusable[isl.name]}"
        elif isl.name not in sizes:
            why = f"island {isl.name} is not in the optimal plan (adding it does not help)"
        else:
            groups = "+".join(map(str, sizes[isl.name]))
            why = (f"the optimal plan uses groups of {groups} of the {len(isl.nodes)} nodes of "
                   f"{isl.name}")
            if granule(len(isl.nodes)) > 1:
                why += f" (groups are multiples of {granule(len(isl.nodes))} nodes here)"
        out += [(n.node_id, why) for n in sorted(isl.nodes, key=node_key) if n.node_id not in busy]
    return tuple(out)


def explain_infeasible(runs: list[PlanningRun]) -> str:
    """One line naming the tightest limit when nothing fits."""
    run = runs[0]
    job, model = run.job, run.job.model
    state_gb = model.total_params * 18 / 1e9
    room = sum(i.gpus * i.hbm_gb * (1 - job.planner.epsilon) for i in run.islands.islands)
    if state_gb > room:
        return (f"{model.name} needs {state_gb:,.0f} GB of parameter+gradient+optimizer state; "
                f"the whole cluster offers {room:,.0f} GB at (1 - ε)·HBM")
    ns = sorted({r.n_micro for r in runs})
    most = min(model.layers, sum(len(i.nodes) for i in run.islands.islands))
    if job.constraints.pp is not None and min(job.constraints.pp) > most:
        return (f"constraints.pp {list(job.constraints.pp)}: node-group pipelines here have at "
                f"most {most} stages (one node each), and no interleaved pipeline of that depth "
                f"divides n_micro {', '.join(map(str, ns))} and the {model.layers} layers")
    biggest = max(run.islands.islands, key=lambda i: i.gpus * i.hbm_gb)
    return (f"no pipeline of {model.name} fits at n_micro {', '.join(map(str, ns))}: every "
            f"group's slices exceed (1 - ε)·HBM once the activations in flight are counted, or "
            f"no layout's data-parallel degree divides the micro-batch (largest island "
            f"{biggest.name}: {biggest.gpus} × {biggest.hbm_gb:g} GB)")
