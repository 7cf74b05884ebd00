"""Pipeline composition as a PuLP MILP, solved by CBC (bundled) or HiGHS (highspy).

The model is :mod:`formulations.assignment_common` with float coefficients (no scaling). Optimal
means within the MIP gaps ``MIP_REL_GAP`` / ``MIP_ABS_GAP``; the reported objective is recomputed in
floats from the decoded plan. PuLP exposes no dual bound for CBC, so ``bound`` is the objective
when optimal and None otherwise; for HiGHS it is the solver's MIP dual bound.
"""

from __future__ import annotations

import contextlib
import enum
import math
import os
import sys
import warnings
from time import perf_counter
from typing import Any, Sequence

import pulp

from formulations.assignment_common import build_model, decode
from solver.compose.result import (
    CompositionResult,
    SolveStatus,
    infeasible_result,
    objective_of,
)
from solver.compose.table import LatencyTable, Restrictions

MIP_REL_GAP = 1e-9  # solvers' defaults (HiGHS: 1e-4) would stop short of the optimum
MIP_ABS_GAP = 1e-10  # seconds; HiGHS' default 1e-6 is coarse next to sub-second tables
RANDOM_SEED = 12345


class MilpBackend(enum.Enum):
    """Which MILP solver PuLP drives."""

    CBC = "cbc"
    HIGHS = "highs"


class _PulpBackend:
    """The shared builder's view of an LpProblem (float seconds)."""

    def __init__(self, prob: pulp.LpProblem) -> None:
        self.prob = prob

    def _var(self, name: str, lo: float, hi: float, cat: str) -> Any:
        # PuLP >= 3.3 wants variables created through the problem; older PuLP has no such method.
        make = getattr(self.prob, "add_variable", None)
        return make(name, lo, hi, cat) if make else pulp.LpVariable(name, lo, hi, cat)

    def new_bool(self, name: str) -> Any:
        return self._var(name, 0, 1, pulp.LpBinary)

    def new_value(self, name: str, hi: float) -> Any:
        return self._var(name, 0, float(hi), pulp.LpContinuous)

    def coeff(self, seconds: float) -> float:
        return float(seconds)

    def total(self, terms: Sequence[Any]) -> Any:
        return pulp.lpSum(terms)

    def add(self, constraint: Any, name: str) -> None:
        self.prob.addConstraint(constraint, name)

    def add_max(self, target: Any, exprs: Sequence[Any], name: str) -> None:
        # target >= each term; the objective pushes target down onto the largest one.
        for i, expr in enumerate(exprs):
            self.prob.addConstraint(target >= expr, f"{name}_{i}")


def _make_solver(backend: MilpBackend, time_limit_s: float, node_limit: int | None = None,
                 presolve: bool = True) -> Any:
    """A seeded one-thread CBC or HiGHS stopped by the wall clock (``time_limit_s``, none when
    infinite) or, with ``node_limit`` (CBC only), after that many branch-and-bound nodes and
    never by the clock: the same search, and the same answer, under any load. HiGHS searches
    a MIP deterministically on one thread: without a wall-clock limit it is load-independent
    too (PuLP 3.3 cannot read the status HiGHS ends with at a node limit)."""
    if node_limit is not None and backend is not MilpBackend.CBC:
        raise ValueError("node_limit: CBC only (use time_limit_s=math.inf with HiGHS)")
    wall = None if node_limit is not None or not math.isfinite(time_limit_s) else time_limit_s
    if backend is MilpBackend.CBC:
        with warnings.catch_warnings():
            # PuLP 3.3 deprecates its bundled CBC for 4.0; it is the CBC this project relies on.
            warnings.simplefilter("ignore", DeprecationWarning)
            return pulp.PULP_CBC_CMD(msg=False, timeLimit=wall, gapRel=MIP_REL_GAP,
                                     gapAbs=MIP_ABS_GAP, threads=1, maxNodes=node_limit,
                                     options=[f"randomCbcSeed {RANDOM_SEED}"])
    off = {} if presolve else {"presolve": "off"}  # HiGHS only (see groups_milp)
    return pulp.HiGHS(msg=False, timeLimit=wall, gapRel=MIP_REL_GAP, gapAbs=MIP_ABS_GAP,
                      random_seed=RANDOM_SEED, **off)


def solve_milp(table: LatencyTable, restrictions: Restrictions | None = None,
               overlap: bool = False, time_limit_s: float = 10.0,
               backend: MilpBackend = MilpBackend.CBC, *,
               node_limit: int | None = None) -> CompositionResult:
    """Optimal composition with a MILP solver through PuLP.

    Parameters
    ----------
    table, restrictions, overlap
        As for :func:`solver.compose.dp.compose_dp` (restrictions become named constraints).
    time_limit_s : float
        Wall-clock limit passed to the solver (``math.inf``: none).
    backend : MilpBackend
        CBC or HiGHS.
    node_limit : int, optional
        CBC: a deterministic limit instead of the wall clock (:func:`_make_solver`).

    Returns
    -------
    CompositionResult
        ``solver="milp-cbc"`` or ``"milp-highs"``.
    """
    t0 = perf_counter()
    label = f"milp-{backend.value}"
    prob = pulp.LpProblem("composition", pulp.LpMinimize)
    built = build_model(_PulpBackend(prob), table, restrictions, overlap)
    if built is None:
        return infeasible_result(label, perf_counter() - t0)
    prob.setObjective(built.objective)
    with _quiet_stdout():
        prob.solve(_make_solver(backend, time_limit_s, node_limit))
    elapsed = perf_counter() - t0
    status = _status(prob, elapsed, time_limit_s, node_limit)
    if status not in (SolveStatus.OPTIMAL, SolveStatus.FEASIBLE):
        return CompositionResult((), None, label, False, status, elapsed)
    stages = decode(table, built, [(v.value() or 0.0) > 0.5 for v in built.s],
                    {key: (v.value() or 0.0) > 0.5 for key, v in built.z.items()})
    objective = objective_of(table, stages, overlap)
    bound = _dual_bound(prob, backend, status, objective, table, overlap)
    gap = None if bound is None else (objective - bound) / objective if objective > 0 else 0.0
    return CompositionResult(stages, objective, label, status is SolveStatus.OPTIMAL, status,
                             elapsed, bound, gap)


@contextlib.contextmanager
def _quiet_stdout():
    """Silence file descriptor 1: highspy prints a banner from C++ on first use even with
    ``msg=False``, which would corrupt ``--json`` output."""
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 1)
            yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def _status(prob: pulp.LpProblem, elapsed: float, limit: float,
            node_limit: int | None = None) -> SolveStatus:
    """The status of a finished solve; no plan and no proof is TIME_LIMIT when the solve ran
    to its limit (a node limit is the only way a solve with one stops unproven)."""
    if prob.sol_status == pulp.LpSolutionOptimal:
        return SolveStatus.OPTIMAL
    if prob.sol_status == pulp.LpSolutionIntegerFeasible:
        return SolveStatus.FEASIBLE
    clock = node_limit is None and elapsed >= 0.95 * limit
    # CBC stopped by the clock before a first solution may come back labelled infeasible
    # through PuLP: at the limit that is no proof, so it is reported as the limit.
    if not clock and (prob.sol_status == pulp.LpSolutionInfeasible
                      or prob.status == pulp.LpStatusInfeasible):
        return SolveStatus.INFEASIBLE
    return SolveStatus.TIME_LIMIT if clock or node_limit is not None else SolveStatus.UNKNOWN


def _dual_bound(prob: pulp.LpProblem, backend: MilpBackend, status: SolveStatus,
                objective: float, table: LatencyTable, overlap: bool) -> float | None:
    """Solver's lower bound in seconds (HiGHS exposes it; CBC through PuLP does not)."""
    if backend is MilpBackend.HIGHS and getattr(prob, "solverModel", None) is not None:
        return float(prob.solverModel.getInfo().mip_dual_bound)
    return objective if status is SolveStatus.OPTIMAL else None
