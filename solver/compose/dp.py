"""Exact pipeline composition: choose distinct islands, their order and the cut points.

Problem: split layers ``0..L-1`` into contiguous non-empty slices, each on a distinct island (all
islands when ``use_all``), minimizing ``T = (n-1)·max(all τ and c) + Σ τ + Σ c`` (links are pipeline
stages of their own), or with ``overlap`` ``T = (n-1)·max e + Σ e``, ``e_i = max(τ_i, c_{i→i+1})``.

Why not the paper's recurrence (Algorithm 2 / eq. 8): it keeps one (τ_max, τ_sum) pair per
state, but ``T`` is not monotone in that pair (a state with smaller max and larger sum can win
later), and it fixes the island order, while first/last positions and asymmetric links make the
order matter. See :func:`solver.compose.brute.compose_paper_recurrence` and the tests.

What :func:`compose_dp` does instead (exact): ``T`` is ``(n-1)·M + S`` with ``M`` the bottleneck.
For a cap ``C`` let ``S(C)`` be the least total over plans whose every entry is ``<= C`` (one
vectorized DP pass over (layers placed, islands used, next island), see
:mod:`solver.compose.dpcore`). Then ``OPT = min over candidate caps C of (n-1)·C + S(C)``, the
candidates being the distinct table entries. ``S`` is non-increasing in ``C``, so a
branch-and-bound over the sorted caps prunes an interval ``(a, b)`` as soon as
``(n-1)·C_{a+1} + S(C_b)`` exceeds the best ``T`` found, or ``S(C_a) = S(C_b)`` (flat). The
smallest feasible cap comes from one min-max pass. In practice 5–30 passes suffice.

Ties: the rule of :mod:`solver.compose.ties`. The branch-and-bound keeps the smallest
bottleneck ``M`` among optimal plans; at cap ``M`` every least-total plan is optimal with
bottleneck ``M`` (one with a smaller one would have a smaller ``T``), and the frontier
backtracking of :meth:`solver.compose.dpcore.DPCore.backtrack` picks rule 3's among them.
:func:`canonical_result` gives another solver's proven optimum the same plan.
"""

from __future__ import annotations

from dataclasses import replace
from time import perf_counter

import numpy as np

from solver.compose.brute import compose_brute, compose_paper_recurrence
from solver.compose.dpcore import DPCore, Mode
from solver.compose.result import (
    TIE_CANONICAL,
    CompositionResult,
    SolveStatus,
    StageAssignment,
    TooLargeError,
    infeasible_result,
    make_stages,
    objective_of,
    optimal_result,
    plan_problems,
)
from solver.compose.table import (
    LatencyTable,
    Position,
    Restrictions,
    dense_arrays,
    position_index,
)

__all__ = ["TIE_CANONICAL", "CompositionResult", "SolveStatus", "StageAssignment",
           "TooLargeError", "Position", "compose_dp", "compose_brute", "compose_paper_recurrence",
           "objective_of", "make_stages", "plan_problems", "explain_infeasible",
           "canonical_result", "MAX_DP_ISLANDS"]

MAX_DP_ISLANDS = 12
MAX_DP_WORK = 4e9  # elementwise operations of one pass, K·2^(K-1)·L² (×K with overlap)


def compose_dp(table: LatencyTable, restrictions: Restrictions | None = None,
               overlap: bool = False) -> CompositionResult:
    """Exact optimal composition by capped DP passes and branch-and-bound over the cap.

    Parameters
    ----------
    table : LatencyTable
        The latency table.
    restrictions : Restrictions, optional
        Pruning rules, applied by masking entries; a budget masks the final island sets.
    overlap : bool
        Use the overlapped objective (eq. 9) instead of links as separate stages.

    Returns
    -------
    CompositionResult
        ``solver="dp"``; status OPTIMAL with the plan, or INFEASIBLE.

    Raises
    ------
    TooLargeError
        More than ``MAX_DP_ISLANDS`` islands, or a pass would exceed ``MAX_DP_WORK``.

    Notes
    -----
    States: ``(layers placed l, islands used as a bitmask, island committed next)``, i.e.
    ``(L+1) · 2^K · K``. One pass costs ``O(K · 2^(K-1) · L · D)`` elementwise operations
    (``D <= L`` the range of slice lengths finite under the cap; ``×K`` with overlap) and
    ``O(2^K · K · L)`` memory. Passes: one min-max pass, one uncapped min-sum pass, then the
    branch-and-bound over caps, each pass bisecting an interval of caps (typically 5–30 passes
    in all). Measured: 1.7 ms at (L, K) = (80, 3), 140 ms at (128, 8).
    """
    t0 = perf_counter()
    _check_size(table, overlap)
    tau, link = dense_arrays(table, restrictions)
    limit = restrictions.max_stages if restrictions is not None else None
    budget = restrictions.budget if restrictions is not None else None
    allowed = budget.allowed_masks(table.islands) if budget is not None else None
    core = DPCore(tau, link, table.use_all, overlap, limit, allowed)
    plan = _search(core, table.n_micro, _cap_values(tau, link))
    elapsed = perf_counter() - t0
    if plan is None:
        return infeasible_result("dp", elapsed)
    stages = make_stages(table, [(table.islands[k], a, b) for k, a, b in plan])
    return optimal_result(table, stages, "dp", elapsed, overlap)


def canonical_result(table: LatencyTable, restrictions: Restrictions | None, overlap: bool,
                     result: CompositionResult) -> CompositionResult:
    """``result`` (another solver's proven optimum) with the tie rule's plan of its ``T``.

    The DP solves the table again; when its optimum equals ``result``'s (relative 1e-9, the
    solvers' common tolerance) its plan, the canonical one, replaces ``result``'s stages and
    ``tie_break`` says so. Otherwise — the table is too large for the DP, or the two optima
    differ, which would be a bug in one of them — ``result`` keeps its own plan and
    ``tie_break`` says why; nothing is replaced silently.
    """
    if not (result.optimal and result.feasible):
        return result
    try:
        dp = compose_dp(table, restrictions, overlap)
    except TooLargeError as exc:
        return replace(result, tie_break=f"the solver's own (no canonical plan: {exc})")
    if dp.objective is None or abs(dp.objective - result.objective) > 1e-9 * result.objective:
        return replace(result, tie_break=f"the solver's own: the DP's optimum {dp.objective} "
                                         f"differs from {result.objective}")
    return replace(result, stages=dp.stages, objective=dp.objective, bound=dp.objective,
                   tie_break=TIE_CANONICAL)


def _check_size(table: LatencyTable, overlap: bool) -> None:
    big_k, big_l = len(table.islands), table.layers
    if big_k > MAX_DP_ISLANDS:
        raise TooLargeError(f"the exact DP handles at most {MAX_DP_ISLANDS} islands, got {big_k} "
                            "(merge islands or prune first)")
    work = big_k * 2 ** (big_k - 1) * big_l * big_l * (big_k if overlap else 1)
    if work > MAX_DP_WORK:
        raise TooLargeError(f"{big_k} islands x {big_l} layers needs ~{work:.1e} operations per DP "
                            f"pass, over the limit {MAX_DP_WORK:.0e}")


def _cap_values(tau: np.ndarray, link: np.ndarray) -> np.ndarray:
    """Sorted distinct finite entries: the only values the bottleneck can take."""
    entries = np.concatenate([tau[np.isfinite(tau)], link[np.isfinite(link)]])
    return np.unique(entries)


class _Best:
    """Best plan so far, ordered by (T, bottleneck); updated only on strict improvement."""

    def __init__(self) -> None:
        self.key = (np.inf, np.inf)
        self.plan: list[tuple[int, int, int]] | None = None
        self.cap = np.inf

    def offer(self, t: float, m: float, plan: list, cap: float) -> None:
        if (t, m) < self.key:
            self.key, self.plan, self.cap = (t, m), plan, cap


def _search(core: DPCore, n_micro: int, values: np.ndarray) -> list[tuple[int, int, int]] | None:
    """Branch-and-bound over cap indices; returns the canonical optimal plan or None."""
    top = _evaluate(core, np.inf)
    if top is None:
        return None
    s_top, m_top, plan_top = top
    floor = core.run(np.inf, Mode.MAX).value  # least achievable bottleneck
    lo, hi = (int(np.searchsorted(values, v)) for v in (floor, m_top))
    best = _Best()
    best.offer((n_micro - 1) * m_top + s_top, m_top, plan_top, np.inf)
    s_lo, m_lo, plan_lo = _evaluate(core, values[lo])
    best.offer((n_micro - 1) * m_lo + s_lo, m_lo, plan_lo, values[lo])
    stack = [(lo, s_lo, hi, s_top)]
    while stack:
        a, s_a, b, s_b = stack.pop()
        # Interior caps C_i (a < i < b) have T >= (n-1)·C_{a+1} + S(C_b); flat S means cap a wins.
        if b - a <= 1 or s_a <= s_b or (n_micro - 1) * values[a + 1] + s_b > best.key[0]:
            continue
        mid = (a + b) // 2
        s_m, m_m, plan_m = _evaluate(core, values[mid])
        best.offer((n_micro - 1) * m_m + s_m, m_m, plan_m, values[mid])
        # S is flat on [M(mid), C_mid]: the plan found at C_mid also exists at its own bottleneck.
        j = int(np.searchsorted(values, m_m))
        stack.append((mid, s_m, b, s_b))
        if j > a:
            stack.append((a, s_a, j, s_m))
    if best.cap != best.key[1]:  # canonical plan: the min-sum pass at the optimal bottleneck
        best.plan = _evaluate(core, best.key[1])[2]
    return best.plan


def _evaluate(core: DPCore, cap: float) -> tuple[float, float, list[tuple[int, int, int]]] | None:
    """Least total under ``cap``, the bottleneck of the plan reaching it, and the plan."""
    run = core.run(cap, Mode.SUM)
    plan = core.backtrack(run)
    if plan is None:
        return None
    return run.value, _bottleneck(core, plan), plan


def _bottleneck(core: DPCore, plan: list[tuple[int, int, int]]) -> float:
    """Largest stage latency or link time in the plan (the same with and without overlap)."""
    big_l = core.layers
    taus = [core.tau[k, position_index(a, b, big_l), b - a] for k, a, b in plan]
    links = [core.link[p[0], q[0]] for p, q in zip(plan, plan[1:])]
    return float(max(taus + links))


def explain_infeasible(table: LatencyTable, restrictions: Restrictions | None = None) -> str:
    """One-line reason why no composition exists (best effort, for the CLI)."""
    tau, link = dense_arrays(table, restrictions)
    big_k, big_l = len(table.islands), table.layers
    if table.use_all and big_k > big_l:
        return f"use_all needs {big_k} non-empty slices but the model has {big_l} layers"
    if not np.isfinite(tau[:, 3, big_l]).any() and big_k == 1:
        return f"the only island cannot hold all {big_l} layers"
    if not np.isfinite(tau[:, (0, 3), :]).any():
        return "no island can hold layer 0 (all first/only entries are null or pruned)"
    if not np.isfinite(tau[:, (2, 3), :]).any():
        return f"no island can hold layer {big_l - 1} (all last/only entries are null or pruned)"
    if restrictions is not None and np.isfinite(dense_arrays(table)[0]).any():
        return "no split of the layers over distinct islands fits the table and restrictions"
    return "no split of the layers over distinct islands avoids null latencies"
