"""Budget-constrained composition: a cross-check of the Pareto fronts of :mod:`solver.studies.pareto`.

The fronts are built by enumerating island subsets. Here the same question is asked the other
way round, as one optimisation per pipeline depth: minimise the iteration time ``T`` subject to
``Σ_k rate_k · used_k ≤ budget`` (the ``budget`` constraint of
:mod:`formulations.assignment_common` for CP-SAT and MILP; masked final island sets in the DP).
On the front, the point of rate ``r`` is the fastest plan whose rate is at most ``r``, so both
methods must give the same ``T`` at every front point's rate.

Only the subset-independent pruning rules (rule 1 dedupe, rule 3 memory) are applied: rules 2
and 4 depend on which islands are in the pipeline, which a budget model does not fix in advance.
Compare with fronts planned under ``PlannerConfig(rules=Rule.DEDUPE | Rule.MEMORY)``.
"""

from __future__ import annotations

from dataclasses import dataclass

from solver.compose.table import Budget, Position, Restrictions
from solver.planner.candidates import TableSpec, build_table
from solver.planner.pruning import Rule, memory_cap
from solver.planner.search import PlanningRun, compose_with_iteration
from solver.studies.pareto import Objective, usd_per_hour, watts


@dataclass(frozen=True)
class BudgetResult:
    """The fastest plan within a budget.

    Attributes
    ----------
    iteration_time_s : float
        Its iteration time (pipeline plus per-iteration terms).
    islands : tuple[str, ...]
        Used islands in pipeline order.
    optimal : bool
        Every composition behind it was proven optimal.
    """

    iteration_time_s: float
    islands: tuple[str, ...]
    optimal: bool


def island_rates(run: PlanningRun, objective: Objective) -> dict[str, float]:
    """$/h (cost) or W (energy) of every island of ``run``."""
    rate = usd_per_hour if objective is Objective.COST else watts
    return {i.name: rate([i]) for i in run.islands.islands}


def _memory_caps(run: PlanningRun) -> dict[tuple[str, Position], int]:
    job = run.job
    if Rule.MEMORY not in run.config.rules:
        return {}
    return {(i.name, p): memory_cap(job.model, i, job.planner.epsilon,
                                    p in (Position.FIRST, Position.ONLY),
                                    p in (Position.LAST, Position.ONLY))
            for i in run.islands.islands for p in Position}


def fastest_within_budget(run: PlanningRun, limit: float,
                          objective: Objective = Objective.COST) -> BudgetResult | None:
    """Least iteration time over plans whose used islands' rate is at most ``limit``.

    One exact composition per pipeline depth (the planner's tables, with the budget as a
    restriction; the solver is the run's), the best over depths. None when nothing fits.
    """
    budget = Budget(island_rates(run, objective), limit)
    caps = _memory_caps(run)
    best: BudgetResult | None = None
    for depth in range(1, len(run.islands.islands) + 1):
        table = build_table(run.cache, TableSpec(depth, {}, caps))
        found, _ = compose_with_iteration(run, table,
                                          Restrictions(max_stages=depth, budget=budget))
        if found is not None and (best is None or
                                  found.total < best.iteration_time_s * (1 - 1e-12)):
            best = BudgetResult(found.total, tuple(s.island for s in found.result.stages),
                                found.optimal)
    return best
