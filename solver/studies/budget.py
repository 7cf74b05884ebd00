"""Budget-constrained composition: a cross-check of the Pareto fronts of :mod:`solver.studies.pareto`.

The fronts are built by enumerating island subsets. Here the same question is asked the other
way round, as one optimisation: minimise the iteration time ``T`` subject to
``Σ_k rate_k · used_k ≤ budget`` (the budget constraint of the CP-SAT and MILP node-group
models in :mod:`formulations`; masked final island sets in the DP).
On the front, the point of rate ``r`` is the fastest plan whose rate is at most ``r``, so both
methods must give the same ``T`` at every front point's rate.

Only the subset-independent pruning rules (rule 1 dedupe, rule 3 memory) are applied: rules 2
and 4 depend on which islands are in the pipeline, which a budget model does not fix in advance.
Compare with fronts planned under ``PlannerConfig(rules=Rule.DEDUPE | Rule.MEMORY)``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from solver.compose.stage_table import GroupRestrictions
from solver.compose.table import Budget
from solver.planner.stages.candidates import TableSpec
from solver.planner.stages.interleaved import best_interleaved
from solver.planner.pruning import Rule
from solver.planner.stages.search import PlanningRun, run_groups, rule_tables, compose
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


def fastest_within_budget(run: PlanningRun, limit: float,
                          objective: Objective = Objective.COST) -> BudgetResult | None:
    """Least iteration time over plans whose used islands' rate is at most ``limit``.

    One exact composition of the run's stage table (rule 1 and rule 3 only, see the module
    docstring), with the budget as a restriction on the used islands; the solver is the run's.
    None when nothing fits.
    """
    budget = Budget(island_rates(run, objective), limit)
    caps = {}
    if Rule.MEMORY in run.config.rules:
        caps = rule_tables(replace(run, config=replace(run.config, rules=Rule.MEMORY)),
                            run_groups(run))[0]
    found = compose(run, TableSpec({}, caps), frozenset(), GroupRestrictions(budget=budget))
    best = None
    if found is not None and found.result.feasible:
        order = tuple(dict.fromkeys(s.island for s in found.result.stages))
        best = BudgetResult(found.total, order, found.optimal)
    # The interleaved family (planner.interleaved) on every island the budget affords alone.
    rates = island_rates(run, objective)
    affordable = tuple(i for i in run.islands.islands if rates[i.name] <= limit * (1 + 1e-12))
    if affordable:
        bar = best.iteration_time_s if best else float("inf")
        alt, _ = best_interleaved(run.job, run.config.features or run.job.planner.features,
                                  [run.n_micro], run.cache.parallelizer, bar,
                                  [(replace(run.islands, islands=affordable), run.view)])
        if alt is not None:
            best = BudgetResult(alt.iteration_time_s, (alt.stages[0].island.name,),
                                best.optimal if best else True)
    return best
