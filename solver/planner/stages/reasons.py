"""Why the planner left nodes idle, and why no plan exists: the one-line reasons it reports.

Both read a planning run (:class:`solver.planner.stages.runs.PlanningRun`: the job, its islands, the
run's ``n_micro``) and what the search found; neither plans anything.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from solver.cost.configs import tp_degrees
from solver.cost.reserve import usable_bytes
from solver.cost.runtime.frameworks import precision_problem
from solver.islands import node_key
from solver.planner.stages.candidates import granule
from solver.planner.plan import StagePlan

if TYPE_CHECKING:  # annotations only: search imports this module
    from solver.planner.stages.candidates import CandidateTable
    from solver.planner.stages.runs import PlanningRun


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
    return tuple(out) + outside_view(run.job, run.islands)


def outside_view(job, islands) -> tuple[tuple[str, str], ...]:
    """The job's nodes outside every island of ``islands`` (a view of one vendor's runnable
    islands: :func:`~solver.planner.stages.runs.runnable_views`), with the runtime rule that leaves
    each out (:mod:`solver.cost.runtime.frameworks`)."""
    inside = {n.node_id for i in islands.islands for n in i.nodes}
    used = {n.gpu.vendor for i in islands.islands for n in i.nodes}
    out = []
    for n in sorted(job.cluster.nodes, key=node_key):
        if n.node_id in inside:
            continue
        why = precision_problem(n.gpu, job.training.precision)
        if why is None and used and n.gpu.vendor not in used:
            why = (f"{n.gpu.name} (vendor {n.gpu.vendor}): the plan runs on "
                   f"{'/'.join(sorted(used))} GPUs, and one communicator (NCCL or RCCL) cannot "
                   f"span vendors")
        out.append((n.node_id, why or "left out by the job's [constraints] or by a mixed island"))
    return tuple(out)


def explain_infeasible(runs: list[PlanningRun]) -> str:
    """One line naming the tightest limit when nothing fits."""
    run = runs[0]
    job, model = run.job, run.job.model
    state_gb = model.total_params * 18 / 1e9
    room = sum(i.gpus * usable_bytes(i, job.planner.epsilon) for i in run.islands.islands) / 1e9
    if state_gb > room:
        return (f"{model.name} needs {state_gb:,.0f} GB of parameter+gradient+optimizer state; "
                f"the whole cluster offers {room:,.0f} GB usable (device memory less the "
                f"runtime's reserves and the ε margin)")
    why = tp_constraint_problem(job, run.islands.islands)
    if why:
        return why
    ns = sorted({r.n_micro for r in runs})
    most = min(model.layers, sum(len(i.nodes) for i in run.islands.islands))
    if job.constraints.pp is not None and min(job.constraints.pp) > most:
        return (f"constraints.pp {list(job.constraints.pp)}: node-group pipelines here have at "
                f"most {most} stages (one node each), and no interleaved pipeline of that depth "
                f"divides n_micro {', '.join(map(str, ns))} and the {model.layers} layers")
    biggest = max(run.islands.islands, key=lambda i: i.gpus * i.hbm_gb)
    return (f"no pipeline of {model.name} fits at n_micro {', '.join(map(str, ns))}: every "
            f"group's slices exceed the usable memory once the activations in flight are "
            f"counted, or no layout's data-parallel degree divides the micro-batch (largest island "
            f"{biggest.name}: {biggest.gpus} × {biggest.hbm_gb:g} GB)")


def tp_constraint_problem(job, islands) -> str | None:
    """Why ``[constraints] tp`` leaves no layout on any island, or None: no degree in it splits
    the model's attention heads (KV heads by the runtime's rule) and widths within a node."""
    wanted, m, fw = job.constraints.tp, job.model, job.planner.framework
    if wanted is None:
        return None
    can = sorted({t for i in islands for t in tp_degrees(m, min(i.gpus, i.gpus_per_node), fw)})
    if set(wanted) & set(can):
        return None
    return (f"constraints.tp {list(wanted)}: no degree in it splits the {m.heads} attention "
            f"heads and {m.kv_heads} KV heads of {m.name} (hidden {m.hidden}, ffn {m.ffn}) "
            f"evenly within a node under {fw.value}'s rules; the degrees that do here: "
            f"{', '.join(map(str, can)) or 'none'}")
