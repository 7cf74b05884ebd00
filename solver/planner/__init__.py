"""Step 5, the planner: islands × slices → candidates → pruning → composition → a validated plan.

Takes in a :class:`~solver.spec.JobSpec`. Builds the islands, asks the homogeneous parallelizer
for partial plans of every (island, slice length, position, micro-batches in flight) the
pruning rules (:mod:`solver.planner.pruning`) let through (:mod:`solver.planner.stages.candidates`;
views and groups no plan could win from are dismissed by :mod:`solver.planner.bounds.floors`),
composes one latency table per pipeline depth exactly, adds the per-iteration terms exactly
(:mod:`solver.planner.stages.search`) and chooses ``n_micro`` (:mod:`solver.planner.micro`). Hands on
a :class:`Plan` that :func:`validate` has checked against the job, or raises
:class:`~solver.spec.InfeasibleError`. Baselines (:mod:`solver.planner.baselines`) and the
persistent partial-plan cache (:mod:`solver.planner.stages.plancache`) plug into the same search.
Last, on request (``[planner] replicas = true``), :mod:`solver.planner.replica.replicas` searches plans
of several pipeline replicas across islands with uneven batch shares (:class:`ReplicatedPlan`,
the single plan is one replica; :mod:`solver.planner.replica.replica_runtime` says which runtime could
train them).
"""

from solver.planner.baselines import Baseline, plan_baseline
from solver.planner.micro import candidate_n_micro, plan_auto, sweep
from solver.planner.plan import Plan, SolverInfo, StagePlan, cycle_time, plan_json
from solver.planner.stages.plancache import CachingParallelizer, MemoryStore, open_store
from solver.planner.pruning import Rule
from solver.planner.replica.replica_plan import ReplicatedPlan, validate_replicated
from solver.planner.replica.replicas import ReplicaOptions, plan_replicas
from solver.planner.stages.search import PlannerConfig, PlanningRun, plan_job, start_run
from solver.planner.check.validate import PlanInvalid, link_model, validate

__all__ = ["Baseline", "CachingParallelizer", "MemoryStore", "Plan", "PlanInvalid",
           "PlannerConfig", "PlanningRun", "ReplicaOptions", "ReplicatedPlan", "Rule",
           "SolverInfo", "StagePlan", "plan_replicas", "validate_replicated",
           "candidate_n_micro", "cycle_time", "link_model", "open_store", "plan_auto",
           "plan_baseline", "plan_job", "plan_json", "start_run", "sweep", "validate"]
