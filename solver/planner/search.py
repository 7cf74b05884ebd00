"""The end-to-end planner: islands → candidates → pruning → exact composition → plan.

Composition is exact for the planner's problem: for every pipeline depth ``P`` it composes the
depth-``P`` table (entries sized for their 1F1B in-flight count, see ``solver.planner.candidates``) with
at most ``P`` stages, and adds the per-iteration terms exactly by a descending sweep over the
largest per-iteration time a plan may use (:func:`compose_with_iteration`). The best over ``P``
wins; ties go to the shallower pipeline.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace

from solver.compose.result import CompositionResult, SolveStatus
from solver.compose.table import Position, Restrictions
from solver.cost.parallelizer import AnalyticParallelizer, Parallelizer, PlanContext
from solver.islands import IslandSet, Thresholds, build_islands, whole_cluster
from solver.planner.candidates import (
    CandidateCache,
    DepthTable,
    TableSpec,
    after_for,
    build_table,
)
from solver.planner.plan import Plan, SolverInfo, StagePlan
from solver.planner.pruning import (
    Rule,
    balance_window,
    bound_window,
    interface_bans,
    interface_bans_safe,
    layer_work_flops,
    memory_cap,
    stage_time_lb,
)
from solver.planner.solve import solve_table
from solver.planner.validate import link_model, validate
from solver.spec.domain import FeaturePreset, JobSpec, SolverKind
from solver.spec.errors import InfeasibleError


@dataclass(frozen=True)
class PlannerConfig:
    """How to plan (defaults come from the job's ``[planner]`` table).

    Attributes
    ----------
    rules : Rule
        Pruning rules to apply.
    solver : SolverKind | None
        Composition solver (None: the job's).
    features : FeaturePreset | None
        Parallelizer features (None: the job's).
    time_limit_s : float | None
        CP-SAT / MILP time limit per solve (None: the job's).
    interface_threshold : float
        Rule 4: ban links slower than this fraction of a balanced stage.
    whole_cluster : bool
        Also plan the whole cluster as one island at its weakest members' values (one stage,
        pipelined inside): the plan a heterogeneity-oblivious planner would make, so the result
        is never worse than it.
    """

    rules: Rule = Rule.paper()
    solver: SolverKind | None = None
    features: FeaturePreset | None = None
    time_limit_s: float | None = None
    interface_threshold: float = 0.5
    whole_cluster: bool = True


@dataclass(frozen=True)
class Composed:
    """The best composition at one depth: result, total with per-iteration terms, and the option
    behind each chosen (island, position, length) entry."""

    result: CompositionResult
    total: float
    depth: int
    plans: dict
    optimal: bool


@dataclass
class PlanningRun:
    """State shared by the passes of one planning run (caches, islands, links)."""

    job: JobSpec
    config: PlannerConfig
    islands: IslandSet
    cache: CandidateCache
    links: dict[tuple[str, str], float]
    n_micro: int


def start_run(job: JobSpec, config: PlannerConfig, n_micro: int | None = None,
              parallelizer: Parallelizer | None = None,
              islands: IslandSet | None = None) -> PlanningRun:
    """Islands (Algorithm 1 unless given), link times and an empty candidate cache for ``job``."""
    n = n_micro or job.training.n_micro
    if n is None:
        raise ValueError("n_micro must be fixed here; 'auto' is resolved by solver.studies.sweep")
    features = config.features or job.planner.features
    isl = islands or build_islands(job.cluster, Thresholds.of(job.planner))
    micro = job.training.global_batch // n
    ctx = PlanContext(job.training.seq_len, micro, n, 1, job.planner.epsilon, 1, features)
    par = parallelizer or AnalyticParallelizer(features)
    by_name = {i.name: i for i in isl.islands}
    cache = CandidateCache(job.model, by_name, par, ctx, dedupe=Rule.DEDUPE in config.rules)
    lm = link_model(job, micro)
    links = {(a.name, b.name): lm.time(a, b) for a in isl.islands for b in isl.islands if a is not b}
    return PlanningRun(job, config, isl, cache, links, n)


def plan_job(job: JobSpec, config: PlannerConfig = PlannerConfig(), n_micro: int | None = None,
             parallelizer: Parallelizer | None = None, run: PlanningRun | None = None) -> Plan:
    """Plan ``job``; the result is validated before it is returned.

    Raises
    ------
    InfeasibleError
        No composition fits; the message names the tightest limit.
    """
    start = time.perf_counter()
    run = run or start_run(job, config, n_micro, parallelizer)
    best = _pruned_search(run)
    calls = run.cache.calls
    if config.whole_cluster and len(run.islands.islands) > 1:
        whole = start_run(job, config, run.n_micro, run.cache.parallelizer,
                          whole_cluster(job.cluster))
        alt = _pruned_search(whole)
        calls += whole.cache.calls
        if alt is not None and (best is None or alt.total < best.total * (1 - 1e-12)):
            proven = alt.optimal and (best is None or best.optimal)
            best, run = replace(alt, optimal=proven), whole
        elif best is not None and alt is not None:
            best = replace(best, optimal=best.optimal and alt.optimal)
    if best is None:
        raise InfeasibleError(explain_infeasible(run))
    plan = _decode(run, best, time.perf_counter() - start, calls)
    validate(plan, job)
    return plan


def _pruned_search(run: PlanningRun) -> Composed | None:
    rules, job = run.config.rules, run.job
    isl = run.islands.islands
    L = job.model.layers
    caps = {}
    if Rule.MEMORY in rules:
        caps = {(i.name, p): memory_cap(job.model, i, job.planner.epsilon,
                                        p in (Position.FIRST, Position.ONLY),
                                        p in (Position.LAST, Position.ONLY))
                for i in isl for p in Position}
    windows = {i.name: balance_window(isl, i, L, job.planner.beta) for i in isl} \
        if Rule.BALANCE in rules else {}
    work = layer_work_flops(job.model, run.cache.context.micro_batch, job.training.seq_len)
    reference = stage_time_lb(_whole(isl), L, work)
    bans = interface_bans(run.links, reference, run.config.interface_threshold) \
        if Rule.INTERFACE in rules else frozenset()
    if not rules & (Rule.BALANCE_SAFE | Rule.INTERFACE_SAFE):
        return search_depths(run, windows, caps, bans)
    # Safe variants need an upper bound: the plan under the paper's heuristic rules.
    probe = search_depths(run, {i.name: balance_window(isl, i, L, job.planner.beta) for i in isl},
                          caps, interface_bans(run.links, reference, run.config.interface_threshold))
    upper = probe.total if probe else math.inf
    if Rule.BALANCE_SAFE in rules:
        windows = {i.name: _meet(windows.get(i.name),
                                 bound_window(isl, i, L, work, run.n_micro, upper)) for i in isl}
    if Rule.INTERFACE_SAFE in rules:
        bans = bans | interface_bans_safe(run.links, run.n_micro, upper)
    return search_depths(run, windows, caps, bans)


def _meet(a: tuple[int, int] | None, b: tuple[int, int]) -> tuple[int, int]:
    return b if a is None else (max(a[0], b[0]), min(a[1], b[1]))


def _whole(islands):
    from solver.spec.domain import Island
    return Island("all", tuple(n for i in islands for n in i.nodes))


def search_depths(run: PlanningRun, windows: dict, caps: dict,
                  bans: frozenset) -> Composed | None:
    """Best composition over pipeline depths 1..K (ties: shallower)."""
    best: Composed | None = None
    proven = True
    for depth in range(1, len(run.islands.islands) + 1):
        table = build_table(run.cache, TableSpec(depth, windows, caps))
        restr = Restrictions(banned_links=bans, max_stages=depth)
        found, solved = compose_with_iteration(run, table, restr)
        proven = proven and solved
        if found is None:
            continue
        if best is None or found.total < best.total * (1 - 1e-12):
            best = found
    return None if best is None else replace(best, optimal=proven)


def compose_with_iteration(run: PlanningRun, table: DepthTable,
                           restr: Restrictions) -> tuple[Composed | None, bool]:
    """Exact ``min T_pipe + max_i iteration_i`` by a descending sweep over the iteration cap.

    ``f(v)`` = best ``T_pipe`` among plans whose stages all have per-iteration time ``≤ v``
    (each entry then uses its fastest option within ``v``). The optimum is
    ``min_v f(v) + maxit(plan_v)``; after solving at ``v`` the next cap is the largest value below
    the found plan's ``maxit``, and the sweep stops once ``f(v)`` alone reaches the best total
    (``f`` only grows as ``v`` shrinks). Each step is one exact composition. Returns the best
    composition (None if none) and whether every solve proved its answer (a time-limited solve
    that found nothing is not a proof of infeasibility).
    """
    values = table.iteration_values()
    cap, best, proven = math.inf, None, True
    while True:
        latency, chosen = table.at(run.cache, cap, run.links)
        result = solve_table(latency, restr, run.config.solver or run.job.planner.solver,
                             run.job.planner.overlap,
                             run.config.time_limit_s or run.job.planner.time_limit_s)
        proven = proven and (result.optimal or result.status is SolveStatus.INFEASIBLE)
        if not result.feasible or (best and result.objective >= best.total):
            break
        picked = {(s.island, s.position, s.end - s.start): chosen[(s.island, s.position,
                                                                    s.end - s.start)]
                  for s in result.stages}
        top = max(o.iteration for o in picked.values())
        if best is None or result.objective + top < best.total:
            best = Composed(result, result.objective + top, table.depth, picked, True)
        lower = [v for v in values if v < top]
        if not lower:
            break
        cap = lower[-1]
    return (None if best is None else replace(best, optimal=proven)), proven


def _decode(run: PlanningRun, best: Composed, elapsed: float, calls: int | None = None) -> Plan:
    by_name = run.cache.islands
    stages = []
    for s in best.result.stages:
        after = after_for(s.position, best.depth)
        stages.append(StagePlan(by_name[s.island], s.start, s.end, s.position,
                                min(after + 1, run.n_micro),
                                best.plans[(s.island, s.position, s.end - s.start)].plan))
    links = tuple(run.links[(a.island.name, b.island.name)] for a, b in zip(stages, stages[1:]))
    r = best.result
    info = SolverInfo(r.solver, best.optimal, elapsed,
                      run.cache.calls if calls is None else calls,
                      None if best.optimal else r.bound, None if best.optimal else r.gap)
    return Plan(run.job, run.islands, tuple(stages), links, run.n_micro,
                run.job.planner.overlap, info)


def explain_infeasible(run: PlanningRun) -> str:
    """One line naming the tightest limit when nothing fits."""
    job = run.job
    model = job.model
    biggest = max(run.islands.islands, key=lambda i: i.gpus * i.hbm_gb)
    state_gb = model.total_params * 18 / 1e9
    room = sum(i.gpus * i.hbm_gb * (1 - job.planner.epsilon) for i in run.islands.islands)
    if state_gb > room:
        return (f"{model.name} needs {state_gb:,.0f} GB of parameter+gradient+optimizer state; "
                f"the whole cluster offers {room:,.0f} GB at (1 - ε)·HBM")
    return (f"no composition of {model.name} fits: every slice exceeds (1 - ε)·HBM once "
            f"activations for {run.n_micro} micro-batches of {run.cache.context.micro_batch} "
            f"sequences are counted, or no parallel layout divides the micro-batch "
            f"(largest island {biggest.name}: {biggest.gpus} × {biggest.hbm_gb:g} GB)")
