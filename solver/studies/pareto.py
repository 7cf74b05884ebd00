"""Multi-objective plans: exact Pareto fronts of speed against cost and energy, budgets, deadlines.

Leaving islands idle is what trades speed for money or energy: a plan that uses the island set
``S`` holds ``Σ_{k∈S} gpus_k`` GPUs for its iteration time ``T``, so

    cost per iteration   = T · Σ_{k∈S} gpus_k · usd_per_hour_k / 3600
    energy per iteration = T · Σ_{k∈S} gpus_k · tdp_w_k                    (J; reported in kWh)

Both are ``T`` times a rate of ``S`` alone. For every non-empty subset ``S`` the planner runs
with only ``S``'s islands available (its pruning rules evaluated on ``S``: rule 2's compute
shares are shares *of S*, rule 4's reference stage is S's; candidate entries are shared between
subsets), and each plan is labelled by the islands it actually uses; per used set the fastest
plan is kept (the job's own plan competes too). Every point is an achievable, validated plan, and
the best plan using exactly ``S`` is matched or dominated by the run on ``S`` (which finds it,
or something at least as fast on a subset of ``S``, which costs no more per hour). So the
non-dominated set of these points is the front of the planner's problem; with the provably safe
rules (``Rule.safe()``) every run is the optimum over all plans on ``S`` and the front is exact
for the cost model. :mod:`solver.studies.budget` cross-checks it the other way round, as
``min T`` subject to a budget on ``Σ rate`` (CP-SAT, MILP or the DP).

Prices and powers are per node (a merged island of H100-SXM and H100-NVL pays each node's own
price), from ``usd_per_hour`` and ``tdp_w`` of the GPU catalog.
"""

from __future__ import annotations

import enum
import itertools
import time
from dataclasses import dataclass, replace
from typing import Any, Iterable

from solver.cost.parallelizer import AnalyticParallelizer, Parallelizer
from solver.islands import IslandSet
from solver.planner.plan import Plan
from solver.planner.stages.plancache import CachingParallelizer, MemoryStore
from solver.planner.stages.search import PlannerConfig, PlanningRun, plan_job, start_run
from solver.spec.domain import Island, JobSpec, PlannerOptions
from solver.spec.errors import InfeasibleError, InputError
from solver.spec.loaders import CATALOG_PATH
from solver.studies.sweep import candidate_n_micro, plan_auto

REL_TOL = 1e-9  # budgets and targets are met within this relative tolerance


class Objective(enum.Enum):
    """What a Pareto front trades against iteration time."""

    COST = "cost"      #: US dollars per iteration
    ENERGY = "energy"  #: kilowatt-hours per iteration (board power × time)


def usd_per_hour(islands: Iterable[Island]) -> float:
    """Hourly price of the islands' GPUs (each node at its own GPU's price).

    Raises
    ------
    InputError
        A GPU of the catalog has no ``usd_per_hour``.
    """
    total = 0.0
    for node in (n for i in islands for n in i.nodes):
        if node.gpu.usd_per_hour is None:
            raise InputError(str(CATALOG_PATH), f"{node.gpu.name}.usd_per_hour",
                             "missing: cost fronts, budgets and deadlines need a price per GPU")
        total += node.gpus * node.gpu.usd_per_hour
    return total


def watts(islands: Iterable[Island]) -> float:
    """Board power of the islands' GPUs (W)."""
    return sum(n.gpus * n.gpu.tdp_w for i in islands for n in i.nodes)


@dataclass(frozen=True)
class SubsetPlan:
    """The best plan found for one set of used islands.

    Attributes
    ----------
    islands : tuple[str, ...]
        Used islands in pipeline order.
    plan : Plan
        The plan (validated).
    usd_per_hour : float | None
        Price of the used GPUs per hour (None when a GPU has no catalog price).
    watts : float
        Board power of the used GPUs.
    """

    islands: tuple[str, ...]
    plan: Plan
    usd_per_hour: float | None
    watts: float

    @classmethod
    def of(cls, plan: Plan) -> "SubsetPlan":
        """Rates of the islands ``plan`` uses (an island is paid in full once any of its nodes
        hosts a stage)."""
        used = list(dict.fromkeys(s.island for s in plan.stages))
        try:
            price: float | None = usd_per_hour(used)
        except InputError:
            price = None
        return cls(tuple(i.name for i in used), plan, price, watts(used))

    @property
    def iteration_time_s(self) -> float:
        """Seconds per iteration."""
        return self.plan.iteration_time_s

    @property
    def tokens_per_s(self) -> float:
        """Throughput."""
        return self.plan.tokens_per_s

    @property
    def kwh_per_iteration(self) -> float:
        """Energy per iteration (kWh)."""
        return self.watts * self.iteration_time_s / 3.6e6

    @property
    def hourly_usd(self) -> float:
        """Price of the used GPUs per hour (raises InputError when a GPU has no price)."""
        if self.usd_per_hour is None:  # raises, naming the GPU
            return usd_per_hour(dict.fromkeys(s.island for s in self.plan.stages))
        return self.usd_per_hour

    @property
    def usd_per_iteration(self) -> float:
        """Cost per iteration (raises InputError when a used GPU has no price)."""
        return self.hourly_usd * self.iteration_time_s / 3600.0

    def value(self, objective: Objective) -> float:
        """Cost or energy per iteration."""
        return self.usd_per_iteration if objective is Objective.COST else self.kwh_per_iteration


def plan_subset(run: PlanningRun, members: tuple[Island, ...]) -> Plan | None:
    """The planner's plan when only ``members`` are available (validated), or None.

    The pruning rules are evaluated on ``members`` (rule 2's shares are shares of them, rule 4's
    reference stage is theirs). Candidate entries are shared with ``run``'s cache, so each
    entry is planned once across all subsets. The plan lists all of the job's islands (the
    unused ones idle).
    """
    job = run.job
    subset = IslandSet(tuple(members), run.islands.components, run.islands.merges)
    sub = start_run(job, run.config, run.n_micro, islands=subset, cache=run.cache)
    try:
        plan = plan_job(job, run.config, run=sub)
    except InfeasibleError:
        return None
    return replace(plan, islands=run.islands)


def _n_values(job: JobSpec) -> list[int]:
    return [job.training.n_micro] if job.training.n_micro is not None else candidate_n_micro(job)


def _run_candidates(run: PlanningRun) -> list[Plan]:
    """The planner's plan of ``run`` and the best plan of every island subset."""
    plans = []
    try:
        plans.append(plan_job(run.job, run.config, run=run))
    except InfeasibleError:
        pass
    isl = run.islands.islands
    for size in range(1, len(isl)):  # all islands: the planner's own run above
        for members in itertools.combinations(isl, size):
            found = plan_subset(run, members)
            if found is not None:
                plans.append(found)
    return plans


def default_parallelizer(job: JobSpec, config: PlannerConfig) -> Parallelizer:
    """The analytic parallelizer behind an in-memory cache (runs over n_micro share nothing,
    but the planner's and the subsets' passes over one n_micro share every entry)."""
    inner = AnalyticParallelizer(config.features or job.planner.features)
    return CachingParallelizer(inner, MemoryStore())


def subset_plans(job: JobSpec, config: PlannerConfig = PlannerConfig(),
                 parallelizer: Parallelizer | None = None) -> list[SubsetPlan]:
    """The best plan of every usable island set (over n_micro when it is "auto"), fastest first."""
    par = parallelizer or default_parallelizer(job, config)
    best: dict[frozenset[str], Plan] = {}
    for n in _n_values(job):
        for plan in _run_candidates(start_run(job, config, n, par)):
            used = frozenset(s.island.name for s in plan.stages)
            old = best.get(used)
            if old is None or plan.iteration_time_s < old.iteration_time_s * (1 - 1e-12):
                best[used] = plan
    return sorted((SubsetPlan.of(p) for p in best.values()), key=lambda s: s.iteration_time_s)


def pareto_front(points: list[SubsetPlan], objective: Objective) -> list[SubsetPlan]:
    """Points not dominated in (iteration time, cost or energy per iteration), fastest first."""
    ordered = sorted(points, key=lambda p: (p.iteration_time_s, p.value(objective)))
    front: list[SubsetPlan] = []
    for p in ordered:
        if not front or p.value(objective) < front[-1].value(objective) * (1 - 1e-12):
            front.append(p)
    return front


def plan_auto_with(job: JobSpec, config: PlannerConfig, parallelizer: Parallelizer) -> Plan:
    """:func:`solver.studies.sweep.plan_auto` with a given parallelizer: the job's n_micro, or the best
    over the candidates when it is "auto" (ties: the smaller n_micro)."""
    return plan_job(job, config, parallelizer=parallelizer)


def meets(point: SubsetPlan, opts: PlannerOptions) -> bool:
    """Whether a plan satisfies the job's budget and throughput target."""
    if opts.max_usd_per_hour is not None and \
            point.hourly_usd > opts.max_usd_per_hour * (1 + REL_TOL):
        return False
    return opts.min_tokens_per_s is None or \
        point.tokens_per_s >= opts.min_tokens_per_s * (1 - REL_TOL)


def choose_target(pool: list[SubsetPlan], opts: PlannerOptions) -> SubsetPlan:
    """The fastest plan within the budget, or with a throughput target the cheapest per
    iteration that reaches it (ties: the earlier in ``pool``)."""
    ok = [p for p in pool if meets(p, opts)]
    if not ok:
        raise InfeasibleError(_why_not(pool, opts))
    if opts.min_tokens_per_s is not None:
        return min(ok, key=lambda p: (p.usd_per_iteration, p.iteration_time_s))
    return min(ok, key=lambda p: p.iteration_time_s)


def _why_not(pool: list[SubsetPlan], opts: PlannerOptions) -> str:
    if not pool:
        return "no island set has a feasible plan"
    budget = opts.max_usd_per_hour
    affordable = [p for p in pool if budget is None or p.hourly_usd <= budget * (1 + REL_TOL)]
    if not affordable:
        cheapest = min(pool, key=lambda p: p.hourly_usd)
        return (f"no plan within max_usd_per_hour {budget:g}: the cheapest island set "
                f"({', '.join(cheapest.islands)}) costs {cheapest.hourly_usd:,.2f} $/h")
    fastest = min(affordable, key=lambda p: p.iteration_time_s)
    within = " within max_usd_per_hour" if budget is not None else ""
    return (f"no plan reaches min_tokens_per_s {opts.min_tokens_per_s:,.0f}{within}: the fastest "
            f"({', '.join(fastest.islands)}) gives {fastest.tokens_per_s:,.0f} tokens/s")


def plan_with_targets(job: JobSpec, config: PlannerConfig = PlannerConfig(),
                      parallelizer: Parallelizer | None = None) -> Plan:
    """The plan ``tangram plan`` prints, honouring ``max_usd_per_hour`` and ``min_tokens_per_s``.

    Without them: the planner's plan (:func:`plan_auto_with`). With a budget the planner's plan
    is kept when it fits; otherwise, and always with a throughput target, the choice is made
    among the best plans of every island set (:func:`subset_plans`).

    Raises
    ------
    InfeasibleError
        Nothing meets the budget / target (the message names the closest plan).
    """
    opts = job.planner
    if opts.max_usd_per_hour is None and opts.min_tokens_per_s is None:
        # Exactly what `tangram plan` did before these options existed.
        return plan_auto(job, config) if parallelizer is None else \
            plan_auto_with(job, config, parallelizer)
    start = time.perf_counter()
    par = parallelizer or default_parallelizer(job, config)
    before = getattr(par, "inner_calls", 0)
    chosen = None
    if opts.min_tokens_per_s is None:
        base = SubsetPlan.of(plan_auto_with(job, config, par))
        if meets(base, opts):
            chosen = base.plan
    if chosen is None:
        chosen = choose_target(subset_plans(job, config, par), opts).plan
    # Report the whole search: its wall time and every parallelizer call it made (a plan of
    # one island set alone would show only its own share, or none when cached).
    calls = getattr(par, "inner_calls", before) - before
    return replace(chosen, solver=replace(chosen.solver, time_s=time.perf_counter() - start,
                                          parallelizer_calls=calls or
                                          chosen.solver.parallelizer_calls))


def point_json(p: SubsetPlan, objective: Objective) -> dict[str, Any]:
    """One point of a front in the ``tangram pareto --json`` format."""
    out: dict[str, Any] = {"iteration_time_s": _r(p.iteration_time_s)}
    if objective is Objective.COST:
        out.update(usd_per_iteration=_r(p.usd_per_iteration), usd_per_hour=_r(p.hourly_usd))
    else:
        out.update(kwh_per_iteration=_r(p.kwh_per_iteration), kw=_r(p.watts / 1e3))
    out.update(islands=list(p.islands), gpus=sum(i.gpus for i in dict.fromkeys(
        s.island for s in p.plan.stages)),
               tokens_per_s=_r(p.tokens_per_s))
    return out


def fronts_json(points: list[SubsetPlan]) -> dict[str, Any]:
    """The ``tangram pareto --json`` object: both fronts, fastest first."""
    return {obj.value: [point_json(p, obj) for p in pareto_front(points, obj)]
            for obj in Objective}


def _r(x: float, digits: int = 9) -> float:
    return float(f"{x:.{digits}g}")
