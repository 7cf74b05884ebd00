"""Result types of pipeline composition and the one objective every solver is judged by.

All solvers (exact DP, brute force, CP-SAT, MILP) return a :class:`CompositionResult` whose
``objective`` is recomputed from the stages by :func:`objective_of`, in floats, from the table: no
solver reports its own internal (possibly scaled or rounded) number as the objective.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Sequence

from solver.compose.table import LatencyTable, Position, Restrictions, slice_position


TIE_CANONICAL = "canonical"  #: the plan the tie rule picks among the optimal ones


class SolveStatus(enum.Enum):
    """How a solve ended."""

    OPTIMAL = "optimal"        #: proven optimal (within the solver's stated tolerance)
    FEASIBLE = "feasible"      #: a plan, optimality not proven (time limit hit)
    INFEASIBLE = "infeasible"  #: proven: no composition satisfies the table and restrictions
    TIME_LIMIT = "time_limit"  #: time limit hit before any plan was found
    UNKNOWN = "unknown"        #: the solver gave up for another reason


class TooLargeError(ValueError):
    """The instance exceeds what a solver is built for; the message says the limit."""


@dataclass(frozen=True)
class StageAssignment:
    """One pipeline stage: ``island`` runs layers ``[start, end)``.

    Attributes
    ----------
    island : str
        Island name.
    start, end : int
        Half-open layer range, ``0 <= start < end <= L``.
    latency : float
        Per-micro-batch latency of the slice at its position (from the table).
    position : Position
        FIRST/MIDDLE/LAST/ONLY, implied by ``start == 0`` and ``end == L``.
    """

    island: str
    start: int
    end: int
    latency: float
    position: Position


@dataclass(frozen=True)
class CompositionResult:
    """What a composition solver found.

    Attributes
    ----------
    stages : tuple[StageAssignment, ...]
        Stages in pipeline order; empty when no plan was found.
    objective : float | None
        ``T`` recomputed by :func:`objective_of` (seconds per iteration); None without a plan.
    solver : str
        Label of the solver (``"dp"``, ``"brute"``, ``"cpsat"``, ``"milp-cbc"``, ...).
    optimal : bool
        True only when the solver proved optimality.
    status : SolveStatus
        How the solve ended.
    time_s : float
        Wall time of the solve, seconds.
    bound : float | None
        Best proven lower bound on ``T`` reported by the solver (seconds), if any.
    gap : float | None
        Relative gap ``(objective - bound) / objective`` reported by the solver, if any.
    tie_break : str
        Which of several optimal plans this is: :data:`TIE_CANONICAL` (the rule of
        :mod:`solver.compose.ties`), or why the solver's own plan was kept.
    """

    stages: tuple[StageAssignment, ...]
    objective: float | None
    solver: str
    optimal: bool
    status: SolveStatus
    time_s: float
    bound: float | None = None
    gap: float | None = None
    tie_break: str = "the solver's own"

    @property
    def feasible(self) -> bool:
        """True when the result carries a plan."""
        return bool(self.stages)


def make_stages(table: LatencyTable,
                plan: Sequence[tuple[str, int, int]]) -> tuple[StageAssignment, ...]:
    """StageAssignments for ``(island, start, end)`` triples, latencies looked up in the table."""
    out = []
    for island, start, end in plan:
        tau = table.tau(island, start, end)
        if tau is None:
            raise ValueError(f"{island} cannot run layers [{start}, {end}) (null latency)")
        pos = slice_position(start, end, table.layers)
        out.append(StageAssignment(island, start, end, tau, pos))
    return tuple(out)


def objective_of(table: LatencyTable, stages: Sequence[StageAssignment],
                 overlap: bool = False) -> float:
    """Iteration time ``T`` of a plan, recomputed from the table alone.

    Without overlap, links are pipeline stages of their own:
    ``T = (n-1)·max(τ_i, c_i) + Σ τ_i + Σ c_i``. With ``overlap`` (eq. 9 of the seed note), each
    stage costs ``e_i = max(τ_i, c_{i→i+1})`` (``c = 0`` after the last stage) and
    ``T = (n-1)·max e_i + Σ e_i``.

    Raises
    ------
    ValueError
        When ``stages`` is empty or uses an infeasible (null) entry.
    """
    if not stages:
        raise ValueError("a plan needs at least one stage")
    taus = []
    for s in stages:
        tau = table.tau(s.island, s.start, s.end)
        if tau is None:
            raise ValueError(f"{s.island} cannot run layers [{s.start}, {s.end}) (null latency)")
        taus.append(tau)
    links = [table.link_time(a.island, b.island) for a, b in zip(stages, stages[1:])]
    if overlap:
        costs = [max(t, c) for t, c in zip(taus, links + [0.0])]
    else:
        costs = taus + links
    return (table.n_micro - 1) * max(costs) + sum(costs)


def plan_problems(table: LatencyTable, stages: Sequence[StageAssignment],
                  restrictions: Restrictions | None = None) -> list[str]:
    """Everything structurally wrong with a plan (empty list when it is valid).

    Checks: layers ``0..L-1`` covered exactly once in order, islands distinct and known, every
    entry feasible, ``use_all`` honoured, and the restrictions (windows, memory caps, bans).
    """
    problems: list[str] = []
    cursor = 0
    for s in stages:
        if s.island not in table.islands:
            problems.append(f"unknown island {s.island!r}")
            continue
        if s.start != cursor or s.end <= s.start:
            problems.append(f"{s.island} slice [{s.start}, {s.end}) does not start at {cursor}")
        cursor = s.end
        in_range = 0 <= s.start < s.end <= table.layers
        if in_range and table.tau(s.island, s.start, s.end) is None:
            problems.append(f"{s.island} slice [{s.start}, {s.end}) is infeasible")
    if cursor != table.layers:
        problems.append(f"layers end at {cursor}, expected {table.layers}")
    names = [s.island for s in stages]
    if len(set(names)) != len(names):
        problems.append(f"island used twice: {names}")
    if table.use_all and set(names) != set(table.islands):
        problems.append("use_all: some island holds no slice")
    if restrictions is not None:
        problems += _restriction_problems(table, stages, restrictions)
    return problems


def _restriction_problems(table: LatencyTable, stages: Sequence[StageAssignment],
                          r: Restrictions) -> list[str]:
    problems = []
    for s in stages:
        n = s.end - s.start
        lo, hi = r.length_window.get(s.island, (1, table.layers))
        if not lo <= n <= hi:
            problems.append(f"{s.island}: length {n} outside window [{lo}, {hi}]")
        pos = slice_position(s.start, s.end, table.layers)
        if n > r.memory_cap.get((s.island, pos), table.layers):
            problems.append(f"{s.island}: length {n} over memory cap at {pos.value}")
    for a, b in zip(stages, stages[1:]):
        if (a.island, b.island) in r.banned_links:
            problems.append(f"banned link {a.island} -> {b.island}")
    if r.max_stages is not None and len(stages) > r.max_stages:
        problems.append(f"{len(stages)} stages exceed max_stages {r.max_stages}")
    if r.budget is not None and not r.budget.allows([s.island for s in stages]):
        problems.append(f"islands {[s.island for s in stages]} exceed the budget {r.budget.limit}")
    return problems


def infeasible_result(solver: str, time_s: float) -> CompositionResult:
    """A proven-infeasible result."""
    return CompositionResult((), None, solver, False, SolveStatus.INFEASIBLE, time_s)


def optimal_result(table: LatencyTable, stages: tuple[StageAssignment, ...], solver: str,
                   time_s: float, overlap: bool) -> CompositionResult:
    """A proven-optimal result with bound = objective and zero gap, its plan the tie rule's
    (the DP and brute force apply it themselves)."""
    t = objective_of(table, stages, overlap)
    return CompositionResult(stages, t, solver, True, SolveStatus.OPTIMAL, time_s, t, 0.0,
                             TIE_CANONICAL)
