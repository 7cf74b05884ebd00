"""The end-to-end planner: islands → candidates → pruning → exact composition → plan.

A stage is a group of nodes of one island; an island may host several consecutive stages and
nodes may stay idle. For a fixed ``n_micro`` the planner builds one stage table per view of the
cluster — the islands of Algorithm 1, and the whole cluster as one island at its weakest
members' figures (what a heterogeneity-oblivious planner sees, so the result is never worse
than that plan) — and composes it exactly (:func:`solver.compose.groups.group_dp.compose_groups_dp`,
or CP-SAT / MILP). Without a fixed ``n_micro`` every divisor of the global batch up to
:data:`solver.planner.stages.candidates.MAX_AUTO_MICRO` is planned, largest first, and the best kept
(ties: smaller ``n``, then the islands' view); the ``n_micro`` values may be searched by several
processes that share the best plan (:mod:`solver.planner.stages.fanout`), each search reading it as it
runs, with the same result. What a run is made of is in :mod:`solver.planner.stages.runs`.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace

import numpy as np

from solver.cost.runtime.frameworks import job_runtime, profile
from solver.compose.groups.group_dp import Live
from solver.compose.stage_table import GroupRestrictions
from solver.compose.table import Position, slice_position
from solver.cost.parallelizer import AnalyticParallelizer, Parallelizer
from solver.cost.stage import ConfigArrays, ModelSlice
from solver.cost.stage_costs import PipelineSetting, stage_costs
from solver.islands import IslandSet, group_island, node_key
from solver.planner.stages.candidates import TableSpec, build_stage_table, candidate_n_micro
from solver.planner.stages.fanout import SharedBest, fan_out
from solver.planner.bounds.floor_table import floor_cuts, relaxed_cuts
from solver.planner.bounds.floors import view_floor
from solver.planner.stages.interleaved import best_interleaved
from solver.planner.plan import Plan, SolverInfo, StagePlan
from solver.planner.stages.reasons import explain_infeasible, idle_nodes
from solver.planner.stages.runs import (REL_TIE, VIEW_ISLANDS, VIEW_WHOLE, Composed, PlannerConfig,
                                 PlanningRun, cluster_islands, job_islands, resolved, start_run,
                                 views)
from solver.planner.pruning import (Rule, balance_window, job_state_bytes, bound_window, interface_bans,
                                    interface_bans_safe, layer_work_flops, memory_cap,
                                    stage_time_lb)
from solver.planner.stages.tied import plan_tied_ends, tied_rule_binds
from solver.planner.stages.solve import solve_stage_table
from solver.planner.check.validate import validate
from solver.spec.domain import Island, JobSpec, Schedule
from solver.spec.errors import InfeasibleError

__all__ = ["REL_TIE", "VIEW_ISLANDS", "VIEW_WHOLE", "PlannerConfig", "PlanningRun", "job_islands",
           "start_run", "views", "plan_job", "view_floor", "search", "search_order", "run_groups",
           "rule_tables", "compose", "link_rates", "restage", "decode"]

def plan_job(job: JobSpec, config: PlannerConfig = PlannerConfig(), n_micro: int | None = None,
             parallelizer: Parallelizer | None = None, run: PlanningRun | None = None,
             upper: float = math.inf, islands: IslandSet | None = None,
             check: bool = True) -> Plan:
    """Plan ``job`` exactly (``n_micro`` searched unless fixed); validated before it is returned
    unless ``check`` is False (the replica search, which validates the replicas it keeps).

    ``upper``: only plans faster than this many seconds per iteration are sought (the search
    cuts everything else); the optimum is returned when it is faster. With ``config.workers``
    > 1 (and no ``parallelizer`` given) the ``n_micro`` values are searched by that many
    processes sharing the best plan (:mod:`solver.planner.stages.fanout`); the plan is the same.
    ``islands``: Algorithm 1's islands of the job's cluster, when built already
    (:func:`~solver.planner.stages.runs.cluster_islands`; built once here otherwise).

    Raises
    ------
    InfeasibleError
        Nothing fits (or nothing beats ``upper``); the message names the tightest limit.
    """
    start = time.perf_counter()
    config = run.config if run is not None else resolved(config, job)
    par = parallelizer or AnalyticParallelizer(config.features or job.planner.features)
    fixed = n_micro or job.training.n_micro
    ns = [run.n_micro] if run is not None else ([fixed] if fixed else
                                                 search_order(candidate_n_micro(job)))
    memo: dict = {}  # node groups, the same at every n
    isl = islands or (cluster_islands(job) if run is None else None)
    runs_of = (lambda n: [run]) if run is not None else \
        (lambda n: views(job, config, n, par, memo, isl))
    # Node-group composition where the runtime runs a layout per stage (FlagScale); a runtime
    # of one layout (Megatron-Core) gets one-mesh plans only (planner.interleaved).
    plain = job.constraints.allows_schedule(Schedule.ONE_F_ONE_B) and \
        not profile(job.planner.framework).uniform_layout
    workers = config.workers if parallelizer is None and plain else 1
    outcomes = fan_out(ns, lambda n, shared: _plan_n(runs_of(n), n, shared, upper, plain),
                       workers)
    best = _merge(outcomes, upper)
    calls = sum(o.calls for o in outcomes)
    proven = all(o.proven for o in outcomes)
    bar = best.total * (1 - REL_TIE) if best is not None else upper
    seen = [(r.islands, r.view) for r in runs_of(ns[0])]
    alt, alt_calls = best_interleaved(job, config.features or job.planner.features, ns, par, bar,
                                      seen)
    calls += alt_calls  # every call the plan cost, as a caching parallelizer counts them
    elapsed = time.perf_counter() - start
    if alt is not None:
        name = alt.solver.name if not plain else \
            f"{(config.solver or job.planner.solver).value}+{alt.solver.name}"
        plan = replace(alt, solver=SolverInfo(name, proven, elapsed, calls))
    elif best is None:
        why = explain_infeasible([r for n in ns for r in runs_of(n)])
        if math.isfinite(upper):  # the cut, not a limit, may be why nothing was found
            why = (f"no plan faster than the bound of {upper:.6g} s per iteration it was asked "
                   f"to beat (slower plans are cut, so this may not be the reason: {why})")
        raise InfeasibleError(why, calls)
    else:
        plan = replace(best.plan, solver=best.info(proven, elapsed, calls))
    heuristic = config.rules.heuristic
    plan = replace(plan, solver=replace(plan.solver, heuristic_pruning=heuristic))
    if check and tied_rule_binds(plan, job):  # the runtime's rule on the pipeline's two ends
        plan = _tied(job, config, n_micro, parallelizer, upper, isl, start)
    if check:
        validate(plan, job)
    return plan


def _tied(job: JobSpec, config: PlannerConfig, n_micro: int | None, parallelizer,
          upper: float, islands, start: float) -> Plan:
    """The best plan under the tied-embedding rule (:mod:`solver.planner.stages.tied`), its
    proof the conjunction of its cases' and its time the whole search's."""
    calls: list[SolverInfo] = []

    def search(limited: JobSpec, bar: float) -> Plan:
        found = plan_job(limited, config, n_micro, parallelizer, upper=bar, islands=islands,
                         check=False)
        calls.append(found.solver)
        return replace(found, job=job)

    best = plan_tied_ends(job, search, upper)
    if best is None:
        raise InfeasibleError("no plan keeps the first and last meshes at one tp (a tied "
                              "embedding under FlagScale's pre_validate_args)", 0)
    info = replace(best.solver, optimal=all(c.optimal for c in calls),
                   time_s=time.perf_counter() - start,
                   parallelizer_calls=sum(c.parallelizer_calls for c in calls))
    return replace(best, solver=info)


@dataclass(frozen=True)
class _Outcome:
    """What the search of one ``n_micro`` found (picklable: workers send it back).

    Attributes
    ----------
    calls : int
        Parallelizer calls of its runs.
    proven : bool
        Every run's search was proven (or found nothing).
    plan : Plan | None
        Its best plan, if it beat the shared best when found.
    key : tuple[int, int]
        ``(n_micro, view rank)`` of that plan.
    total : float
        Its iteration time as the composition computed it (the value offered to the others).
    bound, gap : float | None
        The solver's bound and gap of that plan.
    """

    calls: int
    proven: bool
    plan: Plan | None = None
    key: tuple[int, int] = (0, 0)
    total: float = math.inf
    bound: float | None = None
    gap: float | None = None

    def info(self, proven: bool, elapsed: float, calls: int) -> SolverInfo:
        """The plan's solver line once every ``n`` is searched (``proven``: all of them)."""
        optimal = self.plan.solver.optimal and proven
        return SolverInfo(self.plan.solver.name, optimal, elapsed, calls,
                          None if optimal else self.bound, None if optimal else self.gap)


def _plan_n(runs: list[PlanningRun], n: int, shared: SharedBest, upper: float,
            plain: bool) -> _Outcome:
    """Search the views of one ``n_micro`` against the shared best, offering what beats it."""
    calls, proven, kept = 0, True, None
    for rank, r in enumerate(runs):
        key = (n, rank)

        def live(key: tuple[int, int] = key) -> float:  # what this run must beat, now
            return _bar(shared.get(), key, upper)
        bar, cut = live(), math.isfinite(upper)
        # Against a bound (a replica's budget) the relaxed floor settles most runs before the
        # search builds its rules' windows (floor_table.relaxed_cuts; compose checks again).
        found = search(r, bar, live, floor_cut=cut) \
            if plain and view_floor(r) < bar and not (cut and relaxed_cuts(r, bar)) else None
        calls += r.cache.calls
        proven = proven and (found is None or found.optimal)
        if found is None or not found.result.feasible or not found.total < bar:
            continue
        total = found.total
        if shared.offer(total, key, lambda best: total < _bar(best, key, upper)):
            kept = (r, found, key)
    if kept is None:
        return _Outcome(calls, proven)
    r, found, key = kept
    return _Outcome(calls, proven, decode(r, found, 0.0, 0), key, found.total,
                    found.result.bound, found.result.gap)


def _merge(outcomes: list[_Outcome], upper: float) -> _Outcome | None:
    """The best of the outcomes under the tie rule, taken in ``(n, view)`` order."""
    best = None
    for o in sorted((o for o in outcomes if o.plan is not None), key=lambda o: o.key):
        if o.total < _bar(None if best is None else (best.total, best.key), o.key, upper):
            best = o
    return best


def _bar(best: tuple[float, tuple[int, int]] | None, key: tuple[int, int],
         upper: float) -> float:
    """What a run must beat: ``upper`` before any plan; else the best plan's time, which a run
    of smaller ``(n_micro, view)`` ``key`` may tie (within :data:`REL_TIE`) and any other must
    beat, so the tie rule (smaller ``n``, then the islands' view) holds in any search order.
    ``best``: the best plan's ``(iteration time, key)``."""
    if best is None:
        return upper
    return best[0] * (1 + REL_TIE if key < best[1] else 1 - REL_TIE)


def search_order(ns: list[int]) -> list[int]:
    """``n_micro`` candidates best-first by their lower bound: the view floor
    (:func:`view_floor`, fill and drain at peak speed) falls as ``n`` grows, so the largest
    ``n`` comes first. Deep pipelines over many islands, the searches that cost, find their
    optimum at large ``n``, and with two workers the two largest run at once and cut each
    other as they go (``live`` bars); small ``n`` are then dismissed against that plan. The
    order does not change the result (:func:`_bar`)."""
    return sorted(ns, reverse=True)


def run_groups(run: PlanningRun) -> dict[str, tuple[int, ...]]:
    """Group sizes of every island that admit a layout."""
    return {i.name: run.cache.sizes(i.name, run.features) for i in run.islands.islands}


def rule_tables(run: PlanningRun, groups: dict[str, tuple[int, ...]]) -> tuple[dict, dict]:
    """Rule 3 caps and rule 2 windows per group (empty when the rule is off)."""
    job, rules, isl = run.job, run.config.rules, run.islands.islands
    caps, windows = {}, {}
    for name, sizes in groups.items():
        for g in sizes:
            grp = run.cache.group(name, g)
            if Rule.MEMORY in rules:
                for p in Position:
                    caps[(name, g, p)] = memory_cap(job.model, grp, job.planner.epsilon,
                                                    p in (Position.FIRST, Position.ONLY),
                                                    p in (Position.LAST, Position.ONLY),
                                                    job_state_bytes(job))
            if Rule.BALANCE in rules:
                windows[(name, g)] = balance_window(isl, grp, job.model.layers, job.planner.beta)
    return caps, windows


def _boundary_links(run: PlanningRun) -> dict[tuple[str, str], float]:
    """Fastest possible boundary time of every island pair (whole islands on both sides)."""
    isl = run.islands.islands
    return {(a.name, b.name): run.links.rate(a, b) / min(a.gpus, b.gpus)
            for a in isl for b in isl if a is not b}


def search(run: PlanningRun, incumbent: float = math.inf, live: Live | None = None,
           floor_cut: bool = False) -> Composed | None:
    """The best composition of ``run`` under its pruning rules, if it beats ``incumbent``
    (None: nothing fits, or no slice a plan beating ``incumbent`` could hold does; no stages:
    proven not to beat ``incumbent``). ``live``: the incumbent as it stands while the search
    runs (another process may lower it). ``floor_cut``: compose the floor table first
    (:func:`compose`); :func:`plan_job` asks for it when it is given a bound to beat (a replica
    against its budget), where most tables cannot beat it and pricing them is most of the time.
    Without a bound the cut rarely fires and costs more than it saves (``fleet-8448``: 20.4 →
    23.2 s in one process, measured 2026-12-05). The same plan either way.

    The safe variants of rules 2 and 4 need an upper bound on ``T``: the plan under the paper's
    heuristic rules.
    """
    rules, job = run.config.rules, run.job
    groups = run_groups(run)
    caps, windows = rule_tables(run, groups)
    work = layer_work_flops(job.model, run.cache.context.micro_batch, job.training.seq_len)
    _narrow(windows, incumbent_windows(run, groups, work, incumbent))
    whole = Island("all", tuple(n for i in run.islands.islands for n in i.nodes))
    reference = stage_time_lb(whole, job.model.layers, work)
    links = _boundary_links(run)
    heuristic_bans = interface_bans(links, reference, run.config.interface_threshold)
    bans = heuristic_bans if Rule.INTERFACE in rules else frozenset()
    if not rules & (Rule.BALANCE_SAFE | Rule.INTERFACE_SAFE):
        return compose(run, TableSpec(windows, caps, groups), bans, incumbent=incumbent,
                       live=live, floor_cut=floor_cut)
    probe_windows = rule_tables(replace(run, config=replace(run.config, rules=rules | Rule.BALANCE)),
                                 groups)[1]
    probe = compose(run, TableSpec(probe_windows, caps, groups), heuristic_bans)
    upper = probe.total if probe is not None else math.inf
    if Rule.BALANCE_SAFE in rules:
        _narrow(windows, incumbent_windows(run, groups, work, upper))
    if Rule.INTERFACE_SAFE in rules:
        bans = bans | interface_bans_safe(links, run.n_micro, upper)
    return compose(run, TableSpec(windows, caps, groups), bans, incumbent=incumbent, live=live,
                   floor_cut=floor_cut)


def incumbent_windows(run: PlanningRun, groups: dict[str, tuple[int, ...]], work: float,
                      incumbent: float) -> dict[tuple[str, int], tuple[int, int]]:
    """Per group, the stage lengths a plan faster than ``incumbent`` could use
    (:func:`~solver.planner.pruning.bound_window`: provably safe); none when it is infinite.

    A search asked only for plans that beat an incumbent (a later ``n_micro``, a replica
    against its budget) drops the slices no such plan holds before they are priced."""
    if not math.isfinite(incumbent):
        return {}
    return {(name, g): bound_window(run.islands.islands, run.cache.group(name, g),
                                    run.job.model.layers, work, run.n_micro, incumbent,
                                    run.job.training.precision)
            for name, sizes in groups.items() for g in sizes}


def _narrow(windows: dict[tuple[str, int], tuple[int, int]],
            extra: dict[tuple[str, int], tuple[int, int]]) -> None:
    """Intersect ``windows`` with ``extra`` in place (a group absent from one is unlimited)."""
    for key, (lo, hi) in extra.items():
        old = windows.get(key)
        windows[key] = (lo, hi) if old is None else (max(old[0], lo), min(old[1], hi))


def link_rates(run: PlanningRun) -> np.ndarray:
    """``rate[a, b]`` of :class:`~solver.compose.stage_table.StageTable` over the run's islands."""
    isl = run.islands.islands
    return np.array([[run.links.rate(a, b) for b in isl] for a in isl])


def compose(run: PlanningRun, spec: TableSpec, bans: frozenset,
            restrictions: GroupRestrictions | None = None,
            incumbent: float = math.inf, live: Live | None = None,
            floor_cut: bool = False) -> Composed | None:
    """Build the stage table ``spec`` allows and compose it with the run's solver (None: no
    plan fits, or the floor table proves none beats ``incumbent`` or ``live``; a result
    without stages: proven not to beat them). With ``floor_cut`` the floor table
    (:func:`~solver.planner.bounds.floor_table.floor_cuts`, provably safe) is composed first, so a
    table that cannot beat the bar is never priced."""
    rate = link_rates(run)
    restr = _restrictions(run, bans, restrictions)
    if floor_cut and floor_cuts(run, spec, restr, rate,
                                min(incumbent, live()) if live is not None else incumbent):
        return None
    names = tuple(i.name for i in run.islands.islands)
    cand = build_stage_table(run.cache, spec, rate, names, run.features)
    if cand is None:
        return None
    job = run.job
    result = solve_stage_table(cand.table, restr.among(set(cand.table.names())),
                               run.config.solver or job.planner.solver, job.planner.overlap,
                               run.config.time_limit_s or job.planner.time_limit_s, incumbent,
                               live)
    if not result.feasible and result.status != "dominated":
        return None
    return Composed(result, cand, result.optimal)


def _restrictions(run: PlanningRun, bans: frozenset,
                  restrictions: GroupRestrictions | None) -> GroupRestrictions:
    """``restrictions`` with the interface bans, the job's ``max_stages`` and its ``pp``."""
    base = restrictions or GroupRestrictions()
    limits = [x for x in (base.max_stages, run.job.constraints.max_stages) if x is not None]
    pp = run.job.constraints.pp
    return replace(base, banned_links=bans | base.banned_links,
                   max_stages=min(limits) if limits else None,
                   depths=base.depths if pp is None else frozenset(pp))


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
                              for k in ("params", "grads", "optimizer", "activations",
                                        "fragmentation")))
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
