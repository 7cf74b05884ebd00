"""One suite, every composition solver: DP, CP-SAT, MILP (CBC and HiGHS), brute force.

Each instance has a pinned optimum (hand-checkable; see test_compose_hand.py for derivations),
and, where the optimum is unique, the pinned plan. Every result is re-checked by an independent
structural check and an independent recomputation of T written here, not in the library.
"""

from __future__ import annotations


import pytest

from formulations.assignment_cpsat import solve_cpsat
from formulations.assignment_milp import MilpBackend, solve_milp
from formulations.scaling import objective_tolerance
from solver.compose.dp import SolveStatus, compose_brute, compose_dp, objective_of
from solver.compose.table import LatencyTable, Position, Restrictions, load_table
from solver.spec.loaders import INSTANCES

from conftest import CBC_NODES, CPSAT_WORK, NO_WALL_CLOCK

TABLES = INSTANCES / "tables"

# Deterministic limits (conftest): the proof each test asserts never depends on the load.
SOLVERS = {
    "dp": lambda t, r, o: compose_dp(t, r, o),
    "cpsat": lambda t, r, o: solve_cpsat(t, r, o, NO_WALL_CLOCK, work_limit=CPSAT_WORK),
    "milp-cbc": lambda t, r, o: solve_milp(t, r, o, NO_WALL_CLOCK, MilpBackend.CBC,
                                           node_limit=CBC_NODES),
    "milp-highs": lambda t, r, o: solve_milp(t, r, o, NO_WALL_CLOCK, MilpBackend.HIGHS),
    "brute": lambda t, r, o: compose_brute(t, r, o),
}


def linear(L, n, per, link=None, use_all=False) -> LatencyTable:
    lat = {name: [p * d for d in range(1, L + 1)] for name, p in per.items()}
    return LatencyTable(L, n, tuple(per), lat, link or {}, use_all)


THREE = LatencyTable(5, 5, ("A", "B", "C"), {
    "A": {"first": [4, 6, 8, 10, 12], "middle": [2, 4, 6, 8, 10], "last": [5, 7, 9, 11, 13],
          "only": [9, 11, 13, 15, 17]},
    "B": {"first": [3, 7, 11, 15, 19], "middle": [3, 7, 11, 15, 19], "last": [2, 6, 10, 14, 18],
          "only": [5, 9, 13, 17, 21]},
    "C": [6, 7, 8, 9, 10]},
    {("A", "B"): 1, ("B", "A"): 3, ("C", "A"): 0.5, ("A", "C"): 2, ("B", "C"): 1, ("C", "B"): 0.25})
LN = load_table(TABLES / "links_nulls_6x3.json")
LN_RULES = Restrictions(length_window={"fast": (1, 2)}, memory_cap={("mid", Position.LAST): 1},
                        banned_links=frozenset({("slow", "fast")}))
BOTH_BANNED = Restrictions(banned_links=frozenset({("A", "B"), ("B", "A")}))
SHORT = Restrictions(length_window={"A": (1, 3), "B": (1, 3)})

# id: (table, restrictions, overlap, optimum or None if infeasible, unique optimal plan or None)
CASES = {
    "split_even": (linear(2, 3, {"A": 1, "B": 1}), None, False, 4.0, None),
    "link_blocks_split": (linear(2, 3, {"A": 1, "B": 1}, {("A", "B"): 2, ("B", "A"): 2}),
                          None, False, 6.0, None),
    "overlap_split": (linear(2, 3, {"A": 1, "B": 1}, {("A", "B"): 1.5, ("B", "A"): 1.5}),
                      None, True, 5.5, None),
    "use_all_slow": (linear(2, 2, {"A": 1, "B": 10}, use_all=True), None, False, 21.0, None),
    "window": (linear(4, 2, {"A": 1, "B": 1}), Restrictions(length_window={"A": (3, 4)}),
               False, 7.0, None),
    "ban": (linear(4, 2, {"A": 1, "B": 1}), BOTH_BANNED, False, 8.0, None),
    "memory": (linear(4, 2, {"A": 1, "B": 1}),
               Restrictions(memory_cap={(k, p): 1 for k in "AB" for p in (Position.FIRST,
                                                                          Position.ONLY)}),
               False, 7.0, None),
    "order_positions": (load_table(TABLES / "counterexample_order.json"), None, False, 2.0,
                        [("B", 0, 1), ("A", 1, 2)]),
    "order_links": (load_table(TABLES / "counterexample_order_links.json"), None, False, 3.0,
                    [("B", 0, 1), ("A", 1, 2)]),
    "recurrence_cx": (load_table(TABLES / "counterexample_recurrence.json"), None, False, 55.0,
                      None),
    "links_nulls": (LN, None, False, 41.0, [("slow", 0, 1), ("fast", 1, 4), ("mid", 4, 6)]),
    "links_nulls_overlap": (LN, None, True, 35.0, [("slow", 0, 1), ("fast", 1, 4), ("mid", 4, 6)]),
    "links_nulls_rules": (LN, LN_RULES, False, 48.5, None),
    "links_nulls_rules_overlap": (LN, LN_RULES, True, 47.0, None),
    "three_positions_links": (THREE, None, False, 39.5, [("C", 0, 1), ("A", 1, 4), ("B", 4, 5)]),
    "three_overlap": (THREE, None, True, 38.0, [("C", 0, 1), ("A", 1, 4), ("B", 4, 5)]),
    "infeasible_ban": (linear(4, 2, {"A": 1, "B": 1}),
                       Restrictions(length_window=SHORT.length_window,
                                    banned_links=BOTH_BANNED.banned_links), False, None, None),
    # One stage of 2 layers at n = 3: (3 - 1)·2 + 2 = 6 instead of the split's 4.
    "max_stages_one": (linear(2, 3, {"A": 1, "B": 1}), Restrictions(max_stages=1), False, 6.0,
                       None),
    "infeasible_depth_use_all": (linear(2, 2, {"A": 1, "B": 1}, use_all=True),
                                 Restrictions(max_stages=1), False, None, None),
    "infeasible_use_all": (linear(2, 2, {"A": 1, "B": 1, "C": 1}, use_all=True), None, False,
                           None, None),
    "infeasible_nulls": (LatencyTable(3, 2, ("A", "B"), {"A": [1, None, None],
                                                         "B": [None, None, None]}),
                         None, False, None, None),
}


def independent_time(table: LatencyTable, stages, overlap: bool) -> float:
    """T written out again from the raw table, without the library's objective_of."""
    L = table.layers
    taus = []
    for s in stages:
        pos = ("only" if s.end == L else "first") if s.start == 0 else ("last" if s.end == L
                                                                        else "middle")
        taus.append(table.latency[s.island][Position(pos)][s.end - s.start - 1])
    links = [table.link.get((a.island, b.island), 0.0) for a, b in zip(stages, stages[1:])]
    if overlap:
        costs = [max(t, c) for t, c in zip(taus, links + [0.0])]
    else:
        costs = taus + links
    return (table.n_micro - 1) * max(costs) + sum(costs)


def check_structure(table: LatencyTable, stages, restrictions: Restrictions | None) -> None:
    """Layers covered exactly once and in order, islands distinct, lengths allowed."""
    assert stages, "no stages"
    assert stages[0].start == 0 and stages[-1].end == table.layers
    for a, b in zip(stages, stages[1:]):
        assert a.end == b.start
    covered = [layer for s in stages for layer in range(s.start, s.end)]
    assert covered == list(range(table.layers))
    names = [s.island for s in stages]
    assert len(set(names)) == len(names) and set(names) <= set(table.islands)
    if table.use_all:
        assert set(names) == set(table.islands)
    for s in stages:
        raw = table.latency[s.island][s.position][s.end - s.start - 1]
        assert raw is not None and s.latency == raw
        if restrictions is not None:
            lo, hi = restrictions.length_window.get(s.island, (1, table.layers))
            assert lo <= s.end - s.start <= hi
            assert s.end - s.start <= restrictions.memory_cap.get((s.island, s.position), 10**9)
    if restrictions is not None:
        assert not any(p in restrictions.banned_links for p in zip(names, names[1:]))
        assert len(stages) <= (restrictions.max_stages or len(stages))


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("solver", list(SOLVERS))
def test_solver_finds_pinned_optimum(solver, case):
    table, rules, overlap, optimum, unique = CASES[case]
    result = SOLVERS[solver](table, rules, overlap)
    assert result.solver == solver
    if optimum is None:
        assert result.status is SolveStatus.INFEASIBLE and not result.stages
        assert result.objective is None and not result.optimal
        return
    assert result.status is SolveStatus.OPTIMAL and result.optimal
    check_structure(table, result.stages, rules)
    assert result.objective == objective_of(table, result.stages, overlap)
    assert result.objective == pytest.approx(independent_time(table, result.stages, overlap),
                                             rel=1e-12)
    tol = objective_tolerance(table, overlap) if solver == "cpsat" else 1e-9
    assert abs(result.objective - optimum) <= tol
    if unique is not None:
        assert [(s.island, s.start, s.end) for s in result.stages] == unique
    if result.bound is not None:
        assert result.bound <= result.objective + tol


@pytest.mark.parametrize("solver", ["dp", "cpsat", "milp-cbc", "milp-highs"])
def test_solvers_agree_on_shipped_tables(solver):
    """The realistic tables (paper shape 80x3 with links and memory nulls)."""
    table = load_table(TABLES / "paper_80x3.json")
    result = SOLVERS[solver](table, None, False)
    assert result.optimal
    check_structure(table, result.stages, None)
    # h100x64 [0,25) 0.16, a100x128 [25,60) 0.1605, h200x32 [60,80) 0.16, links 2 x 0.0027:
    # 31 · 0.1605 + (0.16 + 0.1605 + 0.16 + 0.0054) = 5.4614
    assert result.objective == pytest.approx(5.4614, abs=1e-9)
    assert [(s.island, s.start, s.end) for s in result.stages] == [
        ("h100x64", 0, 25), ("a100x128", 25, 60), ("h200x32", 60, 80)]
