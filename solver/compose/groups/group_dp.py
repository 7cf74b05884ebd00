"""Exact composition over node-group stages: the DP behind the planner.

Problem (:mod:`solver.compose.stage_table`): choose an ordered sequence of stages, each a group
of ``g`` nodes of one island running a contiguous slice of layers with one of its options, such
that every layer is covered once, each island's stages are consecutive (one block per island),
an island's groups fit in its nodes, and every option holds the micro-batches its global
position keeps in flight (stage ``i`` of ``P``: ``min(P − i, n)``); minimize
``T = (n − 1)·max(τ, c) + Σ τ + Σ c + max v``.

How (exact). The per-iteration term is handled by a descending sweep over an iteration cap
``V`` (options above it are dropped; each step is exact, the sweep stops once the pipeline time
alone reaches the best total). For a fixed ``V`` the pipeline time ``(n − 1)·M + S`` is handled
by the bottleneck cap ``C`` of :mod:`solver.compose.dp`: one pass gives ``S(C)``, the least sum
over plans whose every stage and link is ``<= C``; ``S`` never increases with ``C``, so a
branch-and-bound over the sorted caps above a lower bound on the bottleneck
(:mod:`solver.compose.groups.group_bounds`), bisecting each
interval at its middle value and pruned with a lower bound on ``S``, finds the optimum. Every
plan found is kept: it is a plan under any larger caps too, so its sum is where a later pass's
first trial budget can start.

One pass walks the pipeline from its end, one stage per level ``j`` (``j`` = stages already
placed behind, which fixes the stage's in-flight count ``min(j + 1, n)`` and its position:
``j = 0`` holds the LM head). States:

* ``W[j][mask, k][g, l]`` — the last ``l`` layers on ``j`` stages over the islands of ``mask``,
  whose front block is island ``k`` with a front stage of ``g`` nodes (needed for the link to the
  block placed before it);
* ``X[j][k][mask, u, g, l]`` — the same, with island ``k``'s block still open after using ``u``
  nodes, its front stage on ``g`` nodes (``mask`` = the closed islands behind it).

Placing a stage of ``g'`` nodes and ``d`` layers in front moves ``X[u, g] → X[u + g', g']``
through the link between the two groups; a closed block (``W``) opens the next island's block
through the link between the islands. Without overlap the link is minimized over the previous
group (and island) *before* the slice-length sweep, so the previous group costs memory, not
time; with overlap the stage costs ``max(τ, c)``, which depends on ``τ``, and each previous
group is swept. Only rows ``X[k, mask, u]`` and ``W[mask, k, g]`` that hold a state are
visited and pruned (the kernel marks the rows it writes, filling each with ``inf`` first),
and a state is dropped when the same state with fewer nodes used has a strictly smaller value
(provably safe: every completion of the one is a completion of the other at the same
cost). Complexity per pass, ``R`` the rows holding a state over all levels
(at most ``J · Σ_k 2^(K−1) · U_k``), ``G`` the groups per island, ``D`` the longest slice under
the cap: ``O(R · L · G · (G + D))`` without overlap, ``O(R · L · G² · D)`` with it, plus
``O(J · 2^K · K · G · L)`` for the closed blocks; memory ``O(J · Σ_k 2^(K−1) · U_k · G · L)``
for the stored levels, used to backtrack the plan.

Ties (deterministic): among plans of equal ``T`` the search keeps the first found with the
smaller bottleneck; backtracking prefers, at every step, the lowest island index, the smallest
group, then the shortest slice.
"""

from __future__ import annotations

from dataclasses import replace
from time import perf_counter
from typing import Callable

import numpy as np

from solver.compose.groups.group_pass import (_INF, MAX_GROUP_ISLANDS, Mode, _backtrack,
                                       _decode, _Kernels, _kernels, _Prep, _prepare, _run_pass,
                                       level_in_flight)
from solver.compose.groups.group_bounds import LeastStages, Slots
from solver.compose.stage_table import GroupRestrictions, GroupResult, StageTable, group_objective

Live = Callable[[], float]  # the current bar of a search whose incumbent may fall as it runs

__all__ = ["MAX_GROUP_ISLANDS", "Mode", "beats", "compose_groups_dp", "level_in_flight"]


def _bottleneck(table: StageTable, stages, overlap: bool) -> float:
    links = [table.link(a.k, a.nodes, b.k, b.nodes) for a, b in zip(stages, stages[1:])]
    taus = [s.latency for s in stages]
    if overlap:
        return max(max(t, c) for t, c in zip(taus, links + [0.0]))
    return max(taus + links)


def _cap_values(prep: _Prep, kern: _Kernels, floor: float) -> np.ndarray:
    """Sorted distinct latencies and link times ``>= floor``: the values a bottleneck takes."""
    vals = np.concatenate([kern.tau[np.isfinite(kern.tau)], prep.link[np.isfinite(prep.link)]])
    allv = np.unique(vals)
    return allv[allv >= floor]


def _rate_floor(kern: _Kernels) -> float:
    """``min τ/d`` over every entry: a stage of ``d`` layers costs at least ``d`` times it."""
    tau = kern.tau[..., 1:]  # missing options are inf, and stay inf divided by d
    return float((tau / np.arange(1, tau.shape[-1] + 1)).min()) if tau.size else _INF


def _evaluate(prep: _Prep, kern: _Kernels, cap: float, budget: float, rate: float,
              t_bound: float = _INF, s_floor: float = 0.0, s_known: float = _INF):
    """``(S, bottleneck, stages)`` of the least-sum plan under the caps, or None when no plan's
    sum is within ``budget``.

    Passes run under growing trial budgets (×1.5 each) from 1.5 times the larger of two lower
    bounds on ``S``, ``L·rate`` and ``s_floor`` (the caller's: ``S`` at a larger cap, or a bound
    on it; ``S`` never rises with the cap), up to ``budget``: a pass that finds a plan within
    its trial budget is exact (every better plan is within it too), and a pass that finds none
    is cheap, its states pruned early. ``s_known``, the sum of a plan known to be one under
    these caps, caps the first trial (it then succeeds unless the incumbent cuts that plan).
    A budget within :data:`TRIAL_SPAN` times the first trial is used at once: so near it, a
    trial that fails costs about a full pass. Where the trials start changes the work, not the
    answer.
    """
    vcap = kern.vcap
    trial = min(max(rate * prep.table.layers, s_floor, 1e-12) * 1.5, s_known * (1 + 1e-9))
    if budget < trial * TRIAL_SPAN:
        trial = budget
    while True:
        ps = _run_pass(prep, kern, cap, Mode.SUM, min(budget, trial), rate, t_bound)
        if ps.final is not None or trial >= budget or not ps.pruned:
            break  # a plan; or the real budget was used; or the trial budget cut nothing
        trial *= 1.5
    if ps.final is None:
        return None
    stages = _decode(prep, _backtrack(prep, ps), cap, vcap)
    return ps.value, _bottleneck(prep.table, stages, prep.overlap), stages


# A budget less than this many times the first trial budget is tried at once (replaying the
# dearest replica plans of fleet-8448: 4% less time than with trials always; 1.5 and 2 in
# between, always at once no better).
TRIAL_SPAN = 3.0


def _known_sum(known: list, cap: float, vcap: float) -> float:
    """The least sum of the plans in ``known`` (``(bottleneck, largest per-iteration time,
    sum)`` of plans found so far) that are plans under ``cap`` and ``vcap`` too (``inf``: none):
    an upper bound on ``S`` there, where a pass's first trial budget can start."""
    return min((s for m, v, s in known if m <= cap and v <= vcap), default=_INF)


def _middle(values: np.ndarray, a: int, b: int) -> int:
    """The index in ``(a, b)`` of the first value at or above the middle of the interval's."""
    at = int(np.searchsorted(values, 0.5 * (values[a + 1] + values[b - 1])))
    return min(max(at, a + 1), b - 1)


def _useful_top(values: np.ndarray, a: int, b: int, s_b: float, n: int, bar: float) -> int:
    """The interval ``(a, b)`` of cap indices cut above at the first cap ``C`` with
    ``(n − 1)·C + s_b >= bar``: a plan whose bottleneck is that large takes ``T_pipe >=``
    that (its sum is at least ``s_b``, a lower bound on ``S`` at every cap of the interval),
    so it cannot beat ``bar``, and the passes skip those caps (provably safe)."""
    if n <= 1 or not np.isfinite(bar):
        return b
    return min(b, max(a + 1, int(np.searchsorted(values, (bar - s_b) / (n - 1), "left"))))


def _search_caps(prep: _Prep, vcap: float, t_budget: float = _INF, known: list | None = None,
                 live: Live | None = None, first: bool = False):
    """Best ``(T_pipe, stages)`` with every option's per-iteration time ``<= vcap`` and
    ``T_pipe < t_budget`` (None if there is none): branch-and-bound over the bottleneck cap.
    ``live``, read before each pass, may lower ``t_budget`` while the search runs.

    Intervals of cap indices ``(a, b)`` carry ``S(C_a)`` (``inf`` when it exceeded the budget)
    and a lower bound on ``S(C_b)``; caps inside have ``T >= (n−1)·C_{a+1} + S(C_b)``. An
    interval is split at its middle value (:func:`_middle`). ``known`` collects
    ``(bottleneck, largest per-iteration time, S)`` of every plan found, shared with the
    caller's other searches (:func:`_known_sum`). ``first``: stop at the first plan found under
    ``t_budget`` (it answers whether one exists, not which is best).
    """
    n = prep.table.n_micro
    known = [] if known is None else known
    kern = _kernels(prep, vcap)
    rate = _rate_floor(kern)
    values = _cap_values(prep, kern, 0.0)
    floor = LeastStages(kern.tmin, Slots(prep.gu, prep.ngroups, prep.units, prep.depth),
                        values).bottleneck_floor(n, t_budget)
    s_lb = max(floor, rate * prep.table.layers)
    if not np.isfinite(floor) or (n - 1) * floor + s_lb >= t_budget:
        return None
    values = values[values >= floor]
    best = [t_budget, _INF, None]
    stack = [(-1, _INF, values.size, s_lb)]
    while stack and not (first and best[2] is not None and best[0] < t_budget):
        a, s_a, b, s_b = stack.pop()
        bar = _read(live)
        if bar < best[0]:  # beaten elsewhere: the plan here, if any, no longer wins
            best = [bar, _INF, None]
        b = _useful_top(values, a, b, s_b, n, best[0])
        if b - a <= 1 or s_a <= s_b or (n - 1) * values[a + 1] + s_b >= best[0]:
            continue
        mid = _middle(values, a, b)
        # Plans of interest here have their bottleneck above C_a: T >= (n−1)·C_{a+1} + S.
        found = _evaluate(prep, kern, float(values[mid]), best[0] - (n - 1) * values[a + 1],
                          rate, best[0], s_b, _known_sum(known, float(values[mid]), vcap))
        if found is None:  # S(C_mid) is over budget, and so is S at every smaller cap
            stack.append((mid, _INF, b, s_b))
            continue
        s_m, m_m, plan_m = found
        known.append((m_m, max(st.iteration for st in plan_m), s_m))
        if ((n - 1) * m_m + s_m, m_m) < (best[0], best[1]):
            best = [(n - 1) * m_m + s_m, m_m, plan_m]
        jm = int(np.searchsorted(values, m_m))
        stack.append((mid, s_m, b, s_b))
        if jm > a:
            stack.append((a, s_a, jm, s_m))
    return None if best[2] is None else (best[0], best[2])


def _read(live: Live | None) -> float:
    """The bar ``live`` reads now (``inf`` without one): a plan found elsewhere while this
    search runs; a plan here must beat it, so the search cuts against it at once."""
    return _INF if live is None else live()


def _search_iteration(prep: _Prep, values: np.ndarray, incumbent: float = _INF,
                      live: Live | None = None, first: bool = False):
    """Best ``(T, stages)`` over iteration caps: ``T* = min_V pipe(V) + V`` (the optimal plan's
    largest per-iteration time ``v`` has ``pipe(v) + v <= T*``), ``pipe`` non-increasing in
    ``V``: a walk down the sorted values.

    The walk solves at the largest value ``V_b`` not yet settled, for ``pipe < best − V_0``
    (only then can a plan at or below ``V_b`` beat the best). Nothing found settles every value
    at or below ``V_b`` (``pipe`` only rises as ``V`` falls). A plan found with pipeline time
    ``p`` and largest per-iteration time ``v`` settles ``[v, V_b]`` (``pipe`` is ``p`` there,
    and its best is that plan) and every ``V >= best − p`` (``T >= p + V`` below ``V_b``); the
    walk goes on below both. Fewer solves than a bisection where ``pipe`` has few steps near
    the optimum, the case that costs. Only plans below ``incumbent`` (and below what ``live``
    reads, which may fall while the walk runs) are sought; with ``first``, the first plan
    found below ``incumbent`` is returned (whether one exists, not the best).
    """
    known: list = []  # plans found at any cap, shared by the searches below
    v0 = float(values[0])
    pipe_live = None if live is None else (lambda: live() - v0)
    if first:  # a plan with pipe < incumbent − V_max is one; with one value, none is none
        vmax = float(values[-1])
        found = _search_caps(prep, vmax, incumbent - vmax, known, first=True)
        if found is not None and found[0] < incumbent - vmax:  # not a tie with the bar
            return found[0] + max(st.iteration for st in found[1]), found[1]
        if values.size == 1:
            return None
        return _search_iteration(prep, values, incumbent, live)
    top = _search_caps(prep, float(values[-1]), incumbent - v0, known, pipe_live)
    if top is None:
        return None
    pipe, stages = top
    best = [incumbent, None]
    while True:
        it = max(s.iteration for s in stages)
        bar = _read(live)
        if bar < best[0]:
            best = [bar, None]
        if pipe + it < best[0]:
            best = [pipe + it, stages]
        b = min(int(np.searchsorted(values, it)), int(np.searchsorted(values, best[0] - pipe)))
        if b <= 0 or pipe + float(values[0]) >= best[0]:
            break
        found = _search_caps(prep, float(values[b - 1]), best[0] - v0, known, pipe_live)
        if found is None:  # pipe >= best − V_0 at every V <= V_{b−1}: none of them wins
            break
        pipe, stages = found
    # A bar that fell during the last search (which then found nothing under it) may have
    # fallen below the plan kept from before: that plan is beaten elsewhere too.
    if best[1] is None or best[0] >= _read(live):
        return None
    return best[0], best[1]


# Stages of the first, cheap search whose plan bounds the full one. The answer does not depend
# on it; 4 was the fastest of 2-16 on large-4096, fleet-700, deep-405b and b200-h100.
SHALLOW_DEPTH = 4


def _shallow_first(table, restrictions, overlap, prep, iters, live: Live | None = None):
    """The best plan of at most :data:`SHALLOW_DEPTH` stages first (a cheap search: few
    levels), then the full search for anything strictly better: its passes drop every state
    that cannot beat that plan. Exact: the answer is the better of the two."""
    shallow = replace(restrictions or GroupRestrictions(), max_stages=SHALLOW_DEPTH)
    first = _search_iteration(_prepare(table, shallow, overlap), iters, live=live)
    if first is None:
        return _search_iteration(prep, iters, live=live)
    better = _search_iteration(prep, iters, first[0], live)
    if better is not None:
        return better
    # The bar may have fallen below the shallow plan while the full search ran: it is then
    # beaten elsewhere, as every plan the full search cut.
    return first if first[0] < _read(live) else None


def _iteration_values(table: StageTable) -> np.ndarray:
    """Sorted distinct per-iteration times of the table's options (empty: no option)."""
    return np.unique(np.concatenate([o.iteration[np.isfinite(o.latency)]
                                     for o in table.options.values()] + [np.array([])]))


def beats(table: StageTable, restrictions: GroupRestrictions | None, overlap: bool,
          bar: float) -> bool:
    """Whether some plan of ``table`` takes less than ``bar`` seconds per iteration (exact).

    The search of :func:`compose_groups_dp` with ``bar`` as its incumbent, stopped at the
    first plan found under it: a plan is a witness, and the search finding none is the proof.

    Raises
    ------
    TooLargeError
        As :func:`compose_groups_dp`.
    """
    prep, iters = _prepare(table, restrictions, overlap), _iteration_values(table)
    return bool(iters.size) and _search_iteration(prep, iters, bar, first=True) is not None


def compose_groups_dp(table: StageTable, restrictions: GroupRestrictions | None = None,
                      overlap: bool = False, incumbent: float = _INF,
                      live: Live | None = None) -> GroupResult:
    """Exact optimal composition of ``table`` over node-group stages.

    Parameters
    ----------
    incumbent : float
        Only plans faster than this are sought (a plan the caller already has).
    live : callable, optional
        The incumbent as it stands now, read before every pass: a plan found elsewhere while
        this search runs (another process's) cuts it at once. Same answer, less work.

    Returns
    -------
    GroupResult
        ``solver="dp"``: proven optimal; or no stages with status ``infeasible`` (nothing fits)
        or ``dominated`` (proven: nothing beats ``incumbent``).

    Raises
    ------
    TooLargeError
        More than ``MAX_GROUP_ISLANDS`` islands or more stored values than ``MAX_LEVEL_FLOATS``.

    Notes
    -----
    Passes: a bisection over iteration caps (:func:`_search_iteration`), at each one min-max pass
    and a bisection over bottleneck caps (:func:`_search_caps`); passes drop states whose sum
    cannot beat the incumbent. Cost of one pass: see the module docstring.
    """
    t0 = perf_counter()
    prep = _prepare(table, restrictions, overlap)
    iters = _iteration_values(table)
    if not iters.size:
        found = None
    elif prep.depth > SHALLOW_DEPTH and not np.isfinite(incumbent):
        found = _shallow_first(table, restrictions, overlap, prep, iters, live)
    else:
        found = _search_iteration(prep, iters, incumbent, live)
    best = None if found is None else found[1]
    elapsed = perf_counter() - t0
    if best is None:
        beaten = np.isfinite(min(incumbent, _read(live)))
        status = "dominated" if beaten else "infeasible"
        return GroupResult((), None, "dp", status == "dominated", status, elapsed)
    total = group_objective(table, best, overlap)[0]
    return GroupResult(best, total, "dp", True, "optimal", elapsed, total, 0.0)
