"""Comparison baselines, emulated inside the same cost model.

- ``oblivious``: a full-feature homogeneous planner (what Aceso does on a mixed cluster) that
  treats the whole cluster as copies of its weakest GPU (minimum compute, HBM, bandwidths, node
  size) and splits the layers evenly over its internal pipeline stages. Its estimate is what the
  cluster delivers: every stage may hold slow GPUs, so all run at the slowest one's pace.
- ``restricted``: heterogeneity-aware composition with the ``metis`` feature preset (TP/PP/DP, no
  recomputation, no ZeRO), i.e. a Metis/Sailor-like planner.
"""

from __future__ import annotations

import enum
import time
from dataclasses import replace


from solver.compose.table import Position
from solver.cost.runtime.frameworks import precision_problem, state_types
from solver.cost.parallelizer import AnalyticParallelizer, PlanContext, best_plan
from solver.cost.stage import ModelSlice
from solver.islands import IslandSet, group_island
from solver.planner.micro import candidate_n_micro, plan_auto
from solver.planner.plan import Plan, SolverInfo, StagePlan
from solver.planner.stages.search import PlannerConfig
from solver.planner.check.validate import validate
from solver.spec.domain import FeaturePreset, Island, JobSpec
from solver.spec.errors import InfeasibleError

MAX_OBLIVIOUS_PP = 64


class Baseline(enum.Enum):
    """Baseline planners."""

    OBLIVIOUS = "oblivious"
    RESTRICTED = "restricted"


def oblivious_island(job: JobSpec) -> Island:
    """The whole cluster as one island of its weakest members: of the nodes a runtime can run
    together (:mod:`solver.cost.runtime.frameworks`: one vendor, the job's precision), the vendor with
    the most TFLOP/s when the cluster mixes vendors."""
    runs = [n for n in job.cluster.nodes
            if precision_problem(n.gpu, job.training.precision) is None] or job.cluster.nodes
    by_vendor: dict[str, list] = {}
    for n in runs:
        by_vendor.setdefault(n.gpu.vendor, []).append(n)
    nodes = max(by_vendor.values(), key=lambda ns: sum(n.gpus * n.tflops for n in ns))
    return Island("oblivious-all", tuple(nodes))


def plan_baseline(job: JobSpec, kind: Baseline, features: FeaturePreset | None = None) -> Plan:
    """Plan ``job`` with a baseline (validated)."""
    if kind is Baseline.RESTRICTED:
        plan = plan_auto(job, PlannerConfig(features=features or FeaturePreset.METIS))
        return replace(plan, solver=SolverInfo("restricted", plan.solver.optimal,
                                               plan.solver.time_s,
                                               plan.solver.parallelizer_calls))
    return _oblivious(job, features or FeaturePreset.FULL)


def _oblivious(job: JobSpec, features: FeaturePreset) -> Plan:
    start = time.perf_counter()
    island = oblivious_island(job)
    # Every node at the weakest member's figures, one GPU type's (as the planner's whole-cluster
    # view): not each figure from a different member, which would price an A100 at an H100's
    # in-training GEMM fraction.
    group = group_island(island, len(island.nodes))
    ns = [job.training.n_micro] if job.training.n_micro else candidate_n_micro(job)
    par = AnalyticParallelizer(features)
    best, calls = None, 0
    for n in ns:
        ctx = PlanContext(job.training.seq_len, job.training.global_batch // n, n, 1,
                          job.planner.epsilon, min(MAX_OBLIVIOUS_PP, job.model.layers), features,
                          framework=job.planner.framework, precision=job.training.precision,
                          **state_types(job))
        plans = par.plan(ModelSlice.whole(job.model), group, ctx)
        calls += 1
        chosen = best_plan(plans, n)
        if chosen is None:
            continue
        stage = StagePlan(island, 0, job.model.layers, Position.ONLY, 1, chosen, island.nodes)
        plan = Plan(job, IslandSet((island,), (island,), ()), (stage,), (), n, False,
                    SolverInfo("oblivious", True, 0.0, calls))
        if best is None or plan.iteration_time_s < best.iteration_time_s:
            best = plan
    if best is None:
        raise InfeasibleError(f"the oblivious baseline finds no configuration of "
                              f"{job.model.name} on {island.gpus} x {island.gpu.name}-class GPUs")
    best = Plan(best.job, best.islands, best.stages, (), best.n_micro, False,
                SolverInfo("oblivious", True, time.perf_counter() - start, calls))
    validate(best, job, islands=(island,))
    return best
