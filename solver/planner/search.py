"""The end-to-end planner: islands → candidates → pruning → exact composition → plan.

A stage is a group of nodes of one island; an island may host several consecutive stages and
nodes may stay idle. For a fixed ``n_micro`` the planner builds one stage table per view of the
cluster — the islands of Algorithm 1, and the whole cluster as one island at its weakest
members' figures (what a heterogeneity-oblivious planner sees, so the result is never worse
than that plan) — and composes it exactly (:func:`solver.compose.group_dp.compose_groups_dp`,
or CP-SAT / MILP). Without a fixed ``n_micro`` every divisor of the global batch up to
:data:`solver.planner.candidates.MAX_AUTO_MICRO` is planned and the best kept (ties: smaller ``n``,
then the islands' view).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace

import numpy as np

from solver.cost.frameworks import job_runtime, profile
from solver.compose.stage_table import GroupRestrictions, GroupResult
from solver.compose.table import Position, slice_position
from solver.cost.parallelizer import (AnalyticParallelizer, FeatureSet, Parallelizer, PlanContext,
                                      framework_features)
from solver.cost.stage import ConfigArrays, ModelSlice
from solver.cost.stage_costs import PipelineSetting, stage_costs
from solver.islands import (IslandSet, Thresholds, build_islands, group_island, node_key,
                            whole_cluster)
from solver.planner.candidates import (CandidateTable, GroupCache, TableSpec, build_stage_table,
                                       candidate_n_micro, group_sizes)
from solver.planner.interleaved import best_interleaved
from solver.planner.plan import Plan, SolverInfo, StagePlan
from solver.planner.reasons import explain_infeasible, idle_nodes
from solver.planner.pruning import (LinkModel, Rule, balance_window, bound_window, interface_bans,
                                    interface_bans_safe, layer_work_flops, memory_cap,
                                    stage_time_lb)
from solver.planner.solve import solve_stage_table
from solver.planner.validate import link_model, validate
from solver.spec.domain import FeaturePreset, Island, JobSpec, Schedule, SolverKind
from solver.spec.errors import InfeasibleError, InputError

REL_TIE = 1e-12  # relative tolerance under which two iteration times tie (smaller n wins)
VIEW_ISLANDS, VIEW_WHOLE = "islands", "whole cluster"


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
        Also plan the whole cluster as one island at its weakest members' figures.
    """

    rules: Rule = Rule.paper()
    solver: SolverKind | None = None
    features: FeaturePreset | None = None
    time_limit_s: float | None = None
    interface_threshold: float = 0.5
    whole_cluster: bool = True


@dataclass
class PlanningRun:
    """State of one planning run: one view of the cluster at one ``n_micro``.

    Attributes
    ----------
    job, config : JobSpec, PlannerConfig
        What is planned and how.
    islands : IslandSet
        The islands of this view.
    cache : GroupCache
        Partial plans (shared between runs of one ``n_micro``).
    links : LinkModel
        Boundary transfers.
    n_micro : int
        Micro-batches per iteration.
    view : str
        ``"islands"`` or ``"whole cluster"``.
    """

    job: JobSpec
    config: PlannerConfig
    islands: IslandSet
    cache: GroupCache
    links: LinkModel
    n_micro: int
    view: str = VIEW_ISLANDS

    @property
    def features(self) -> FeatureSet:
        """The features the parallelizer may use."""
        return FeatureSet.of(self.config.features or self.job.planner.features).meet(
            framework_features(self.job.planner.framework))


@dataclass(frozen=True)
class Composed:
    """The best composition of one run: result, the candidates behind it, proof status."""

    result: GroupResult
    candidates: CandidateTable
    optimal: bool

    @property
    def total(self) -> float:
        """Iteration time (inf when dominated)."""
        return math.inf if self.result.objective is None else float(self.result.objective)


def start_run(job: JobSpec, config: PlannerConfig, n_micro: int | None = None,
              parallelizer: Parallelizer | None = None, islands: IslandSet | None = None,
              view: str = VIEW_ISLANDS, cache: GroupCache | None = None) -> PlanningRun:
    """Islands (Algorithm 1 unless given), the link model and a candidate cache for ``job``."""
    n = n_micro or job.training.n_micro
    if n is None:
        raise ValueError("n_micro must be fixed here; plan_job searches it")
    features = config.features or job.planner.features
    isl = islands or build_islands(job.cluster, Thresholds.of(job.planner))
    isl = _allowed_islands(job, isl)
    micro = job.training.global_batch // n
    by_name = {i.name: i for i in isl.islands}
    if cache is None:
        ctx = PlanContext(job.training.seq_len, micro, n, 1, job.planner.epsilon, 1, features,
                          framework=job.planner.framework, precision=job.training.precision,
                          constraints=job.constraints)
        cache = GroupCache(job.model, by_name, parallelizer or AnalyticParallelizer(features), ctx,
                           dedupe=Rule.DEDUPE in config.rules)
    else:
        cache = replace(cache, islands={**cache.islands, **by_name}, entries=cache.entries,
                        calls=0, mismatches=0)
    return PlanningRun(job, config, isl, cache, link_model(job, micro), n, view)


def job_islands(job: JobSpec) -> IslandSet:
    """Algorithm 1's islands of the job's cluster, after its ``[constraints]``."""
    return _allowed_islands(job, build_islands(job.cluster, Thresholds.of(job.planner)))


def _allowed_islands(job: JobSpec, isl: IslandSet) -> IslandSet:
    """``isl`` without the islands ``[constraints]`` leaves out (one-line error when a named
    island does not exist, or none is left)."""
    c = job.constraints
    if c.islands is None and c.exclude_islands is None:
        return isl
    known = {i.name for i in isl.islands} | {i.gpu.name for i in isl.islands}
    for key, names in (("islands", c.islands), ("exclude_islands", c.exclude_islands)):
        unknown = sorted(set(names or ()) - known)
        if unknown:
            raise InputError(str(job.path or job.name), f"constraints.{key}",
                             f"no island or GPU type {unknown[0]!r} (islands: "
                             f"{', '.join(sorted(i.name for i in isl.islands))})")
    kept = tuple(i for i in isl.islands if c.allows_island(i))
    if not kept:
        raise InputError(str(job.path or job.name), "constraints.islands",
                         "leaves no island to plan on")
    return replace(isl, islands=kept)


def views(job: JobSpec, config: PlannerConfig, n: int,
          parallelizer: Parallelizer) -> list[PlanningRun]:
    """The runs of one ``n_micro``: Algorithm 1's islands, then the whole cluster."""
    runs = [start_run(job, config, n, parallelizer)]
    restricted = job.constraints.islands is not None or job.constraints.exclude_islands is not None
    if config.whole_cluster and len(runs[0].islands.islands) > 1 and not restricted:
        # Groups of equal figures share their options across views (the cache is keyed so).
        runs.append(start_run(job, config, n, parallelizer, whole_cluster(job.cluster),
                              VIEW_WHOLE, cache=runs[0].cache))
    return runs


def plan_job(job: JobSpec, config: PlannerConfig = PlannerConfig(), n_micro: int | None = None,
             parallelizer: Parallelizer | None = None, run: PlanningRun | None = None,
             upper: float = math.inf) -> Plan:
    """Plan ``job`` exactly (``n_micro`` searched unless fixed); validated before it is returned.

    ``upper``: only plans faster than this many seconds per iteration are sought (the search
    cuts everything else); the optimum is returned when it is faster.

    Raises
    ------
    InfeasibleError
        Nothing fits (or nothing beats ``upper``); the message names the tightest limit.
    """
    start = time.perf_counter()
    par = parallelizer or AnalyticParallelizer(config.features or job.planner.features)
    fixed = n_micro or job.training.n_micro
    ns = [run.n_micro] if run is not None else ([fixed] if fixed else
                                                 search_order(candidate_n_micro(job)))
    best, calls, proven, tried = None, 0, True, []
    # Node-group composition where the runtime runs a layout per stage (FlagScale); a runtime
    # of one layout (Megatron-Core) gets one-mesh plans only (planner.interleaved).
    plain = job.constraints.allows_schedule(Schedule.ONE_F_ONE_B) and \
        not profile(job.planner.framework).uniform_layout
    for n in ns:
        for rank, r in enumerate([run] if run is not None else views(job, config, n, par)):
            bar = _bar(best, (n, rank), upper)
            found = search(r, bar) if plain else None
            calls += r.cache.calls
            tried.append(r)
            proven = proven and (found is None or found.optimal)
            if found is not None and found.result.feasible and found.total < bar:
                best = (found, r, (n, rank))
    bar = best[0].total * (1 - REL_TIE) if best is not None else upper
    seen = {r.view: r.islands for r in tried}
    alt, alt_calls = best_interleaved(job, config.features or job.planner.features, ns, par, bar,
                                      [(isl, view) for view, isl in seen.items()])
    calls += alt_calls  # every call the plan cost, as a caching parallelizer counts them
    if alt is not None:
        name = alt.solver.name if not plain else \
            f"{(config.solver or job.planner.solver).value}+{alt.solver.name}"
        plan = replace(alt, solver=SolverInfo(name, proven, time.perf_counter() - start, calls))
    elif best is None:
        raise InfeasibleError(explain_infeasible(tried))
    else:
        plan = decode(best[1], best[0], time.perf_counter() - start, calls, proven)
    validate(plan, job)
    return plan


def _bar(best: tuple | None, key: tuple[int, int], upper: float) -> float:
    """What a run must beat: ``upper`` before any plan; else the best plan's time, which a run
    of smaller ``(n_micro, view)`` ``key`` may tie (within :data:`REL_TIE`) and any other must
    beat, so the tie rule (smaller ``n``, then the islands' view) holds in any search order."""
    if best is None:
        return upper
    return best[0].total * (1 + REL_TIE if key < best[2] else 1 - REL_TIE)


def search_order(ns: list[int]) -> list[int]:
    """``n_micro`` candidates from the middle (in log scale) outwards: a good plan early lets
    the DP dismiss the others quickly. The order does not change the result (:func:`_bar`)."""
    mid = math.log2(ns[len(ns) // 2]) if ns else 0.0
    return sorted(ns, key=lambda n: (abs(math.log2(n) - mid), n))


def run_groups(run: PlanningRun) -> dict[str, tuple[int, ...]]:
    """Group sizes of every island that admit a layout."""
    return {i.name: group_sizes(run.job.model, i, run.cache.context, run.features)
            for i in run.islands.islands}


def rule_tables(run: PlanningRun, groups: dict[str, tuple[int, ...]]) -> tuple[dict, dict]:
    """Rule 3 caps and rule 2 windows per group (empty when the rule is off)."""
    job, rules, isl = run.job, run.config.rules, run.islands.islands
    by_name = {i.name: i for i in isl}
    caps, windows = {}, {}
    for name, sizes in groups.items():
        for g in sizes:
            grp = group_island(by_name[name], g)
            if Rule.MEMORY in rules:
                for p in Position:
                    caps[(name, g, p)] = memory_cap(job.model, grp, job.planner.epsilon,
                                                    p in (Position.FIRST, Position.ONLY),
                                                    p in (Position.LAST, Position.ONLY))
            if Rule.BALANCE in rules:
                windows[(name, g)] = balance_window(isl, grp, job.model.layers, job.planner.beta)
    return caps, windows


def _boundary_links(run: PlanningRun) -> dict[tuple[str, str], float]:
    """Fastest possible boundary time of every island pair (whole islands on both sides)."""
    isl = run.islands.islands
    return {(a.name, b.name): run.links.rate(a, b) / min(a.gpus, b.gpus)
            for a in isl for b in isl if a is not b}


def search(run: PlanningRun, incumbent: float = math.inf) -> Composed | None:
    """The best composition of ``run`` under its pruning rules, if it beats ``incumbent``
    (None: nothing fits; no stages: proven not to beat ``incumbent``).

    The safe variants of rules 2 and 4 need an upper bound on ``T``: the plan under the paper's
    heuristic rules.
    """
    rules, job = run.config.rules, run.job
    groups = run_groups(run)
    caps, windows = rule_tables(run, groups)
    work = layer_work_flops(job.model, run.cache.context.micro_batch, job.training.seq_len)
    whole = Island("all", tuple(n for i in run.islands.islands for n in i.nodes))
    reference = stage_time_lb(whole, job.model.layers, work)
    links = _boundary_links(run)
    heuristic_bans = interface_bans(links, reference, run.config.interface_threshold)
    bans = heuristic_bans if Rule.INTERFACE in rules else frozenset()
    if not rules & (Rule.BALANCE_SAFE | Rule.INTERFACE_SAFE):
        return compose(run, TableSpec(windows, caps, groups), bans, incumbent=incumbent)
    probe_windows = rule_tables(replace(run, config=replace(run.config, rules=rules | Rule.BALANCE)),
                                 groups)[1]
    probe = compose(run, TableSpec(probe_windows, caps, groups), heuristic_bans)
    upper = probe.total if probe is not None else math.inf
    if Rule.BALANCE_SAFE in rules:
        by_name = {i.name: i for i in run.islands.islands}
        for name, sizes in groups.items():
            for g in sizes:
                safe = bound_window(run.islands.islands, group_island(by_name[name], g),
                                    job.model.layers, work, run.n_micro, upper)
                old = windows.get((name, g))
                windows[(name, g)] = safe if old is None else (max(old[0], safe[0]),
                                                               min(old[1], safe[1]))
    if Rule.INTERFACE_SAFE in rules:
        bans = bans | interface_bans_safe(links, run.n_micro, upper)
    return compose(run, TableSpec(windows, caps, groups), bans, incumbent=incumbent)


def link_rates(run: PlanningRun) -> np.ndarray:
    """``rate[a, b]`` of :class:`~solver.compose.stage_table.StageTable` over the run's islands."""
    isl = run.islands.islands
    return np.array([[run.links.rate(a, b) for b in isl] for a in isl])


def compose(run: PlanningRun, spec: TableSpec, bans: frozenset,
            restrictions: GroupRestrictions | None = None,
            incumbent: float = math.inf) -> Composed | None:
    """Build the stage table ``spec`` allows and compose it with the run's solver (None: no
    plan fits; a result without stages: proven not to beat ``incumbent``)."""
    names = tuple(i.name for i in run.islands.islands)
    cand = build_stage_table(run.cache, spec, link_rates(run), names, run.features)
    if cand is None:
        return None
    kept = set(cand.table.names())
    base = restrictions or GroupRestrictions()
    limits = [x for x in (base.max_stages, run.job.constraints.max_stages) if x is not None]
    pp = run.job.constraints.pp
    restr = replace(base, banned_links=frozenset(p for p in bans | base.banned_links
                                                 if p[0] in kept and p[1] in kept),
                    max_stages=min(limits) if limits else None,
                    depths=base.depths if pp is None else frozenset(pp))
    job = run.job
    result = solve_stage_table(cand.table, restr, run.config.solver or job.planner.solver,
                               job.planner.overlap,
                               run.config.time_limit_s or job.planner.time_limit_s, incumbent)
    if not result.feasible and result.status != "dominated":
        return None
    return Composed(result, cand, result.optimal)


def restage(job: JobSpec, group: Island, start: int, end: int, plan, n_micro: int,
            in_flight: int):
    """A partial plan re-evaluated at the in-flight count of its position (memory as it will
    be); latency and per-iteration time do not depend on that count."""
    from solver.cost.parallelizer import MemoryBreakdown
    slc = ModelSlice(job.model, end - start, start == 0, end == job.model.layers)
    costs = stage_costs(slc, group, job.training.seq_len, ConfigArrays.of([plan.config]),
                        PipelineSetting(n_micro, in_flight), runtime=job_runtime(job))
    mem = costs.memory
    parts = MemoryBreakdown(*(float(getattr(mem, k)[0]) / 1e9
                              for k in ("params", "grads", "optimizer", "activations")))
    return replace(plan, memory_gb=float(mem.total[0]) / 1e9, memory=parts)


def decode(run: PlanningRun, best: Composed, elapsed: float, calls: int,
           proven: bool = True) -> Plan:
    """The plan of a composition: groups get the island's nodes in node order."""
    job, cand, L = run.job, best.candidates, run.job.model.layers
    used: dict[str, int] = {}
    stages = []
    for s in best.result.stages:
        island = cand.islands[s.k]
        order = sorted(island.nodes, key=node_key)
        first = used.get(island.name, 0)
        used[island.name] = first + s.nodes
        pos = slice_position(s.start, s.end, L)
        partial = cand.plans[(s.k, s.nodes, pos)][s.end - s.start][s.option]
        partial = restage(job, group_island(island, s.nodes), s.start, s.end, partial,
                          run.n_micro, s.in_flight)
        stages.append(StagePlan(island, s.start, s.end, pos, s.in_flight, partial,
                                tuple(order[first:first + s.nodes])))
    links = tuple(cand.table.link(a.k, a.nodes, b.k, b.nodes)
                  for a, b in zip(best.result.stages, best.result.stages[1:]))
    r = best.result
    optimal = best.optimal and proven
    info = SolverInfo(r.solver, optimal, elapsed, calls, None if optimal else r.bound,
                      None if optimal else r.gap)
    return Plan(job, run.islands, tuple(stages), links, run.n_micro, job.planner.overlap, info,
                idle_nodes(run, stages, cand), run.view)
