"""Hand-solved compositions, and the two counterexamples to the paper's recurrence (eq. 8).

Every expected number below can be checked by hand from the formula
``T = (n-1)·max(τ, c) + Σ τ + Σ c`` (links are stages of their own).
"""

from __future__ import annotations

import itertools

import pytest

from solver.compose.dp import (
    SolveStatus,
    TooLargeError,
    compose_brute,
    compose_dp,
    compose_paper_recurrence,
    make_stages,
    objective_of,
)
from solver.compose.table import LatencyTable, Position, Restrictions, load_table
from solver.spec.loaders import INSTANCES

TABLES = INSTANCES / "tables"


def plan(result) -> list[tuple[str, int, int]]:
    return [(s.island, s.start, s.end) for s in result.stages]


def linear(L: int, n: int, per: dict[str, float], link=None, use_all=False) -> LatencyTable:
    """Islands whose latency is ``per[island] · length`` at every position."""
    lat = {name: [p * d for d in range(1, L + 1)] for name, p in per.items()}
    return LatencyTable(L, n, tuple(per), lat, link or {}, use_all)


def best_in_order(table: LatencyTable, order: tuple[str, ...], use_all: bool) -> float:
    """Exact optimum over plans whose islands appear in ``order`` (skips allowed unless use_all);
    an independent enumeration used to pin 'exact per-order composition'."""
    best = float("inf")
    L = table.layers
    sizes = [len(order)] if use_all else range(1, len(order) + 1)
    for m in sizes:
        for seq in itertools.combinations(order, m):
            for inner in itertools.combinations(range(1, L), m - 1):
                cuts = (0, *inner, L)
                triples = list(zip(seq, cuts, cuts[1:]))
                if all(table.tau(*t) is not None for t in triples):
                    best = min(best, objective_of(table, make_stages(table, triples)))
    return best


# --- hand-solved instances -------------------------------------------------------------------

def test_single_island_is_n_times_only_latency():
    t = LatencyTable(3, 4, ("A",), {"A": {"first": [1, 1, 1], "middle": [1, 1, 1],
                                          "last": [1, 1, 1], "only": [9, 9, 7]}})
    r = compose_dp(t)
    assert plan(r) == [("A", 0, 3)] and r.objective == 28.0  # (4-1)·7 + 7
    assert r.stages[0].position is Position.ONLY and r.optimal and r.status is SolveStatus.OPTIMAL


def test_two_identical_islands_split_evenly():
    # one island: 2·2 + 2 = 6; split 1+1: 2·1 + (1+1) = 4
    r = compose_dp(linear(2, 3, {"A": 1, "B": 1}))
    assert r.objective == 4.0 and len(r.stages) == 2


def test_link_cost_makes_split_lose():
    # split: max(1, 1, c=2) = 2, sum 1+1+2 = 4 -> 2·2 + 4 = 8 > 6 for one island
    t = linear(2, 3, {"A": 1, "B": 1}, {("A", "B"): 2, ("B", "A"): 2})
    r = compose_dp(t)
    assert r.objective == 6.0 and len(r.stages) == 1


def test_overlap_hides_link_and_split_wins():
    # c = 1.5. Separate link stage: 2·1.5 + 3.5 = 6.5 > 6 (one island).
    # Overlap: e = (max(1, 1.5), 1) -> 2·1.5 + 2.5 = 5.5 < 6.
    t = linear(2, 3, {"A": 1, "B": 1}, {("A", "B"): 1.5, ("B", "A"): 1.5})
    assert compose_dp(t).objective == 6.0
    r = compose_dp(t, overlap=True)
    assert r.objective == 5.5 and len(r.stages) == 2
    assert objective_of(t, r.stages, overlap=False) == 6.5


def test_use_all_forces_the_slow_island():
    # alone A: 1·2 + 2 = 4; with B forced: max 10, sum 11 -> 21
    t = linear(2, 2, {"A": 1, "B": 10})
    assert compose_dp(t).objective == 4.0
    t_all = linear(2, 2, {"A": 1, "B": 10}, use_all=True)
    assert compose_dp(t_all).objective == 21.0


def test_restrictions_window_memory_and_ban():
    t = linear(4, 2, {"A": 1, "B": 1})
    assert compose_dp(t).objective == 6.0  # 2+2: 2 + 4
    window = Restrictions(length_window={"A": (3, 4), "B": (3, 4)})
    assert compose_dp(t, window).objective == 8.0  # no split fits: one island, 4 + 4
    one_window = Restrictions(length_window={"A": (3, 4)})
    assert compose_dp(t, one_window).objective == 7.0  # 3+1: 3 + 4
    memory = Restrictions(memory_cap={("A", Position.FIRST): 1, ("B", Position.FIRST): 1,
                                      ("A", Position.ONLY): 0, ("B", Position.ONLY): 0})
    r = compose_dp(t, memory)
    assert r.objective == 7.0 and r.stages[0].end == 1  # first stage holds one layer: 3 + 4
    ban = Restrictions(banned_links=frozenset({("A", "B"), ("B", "A")}))
    assert compose_dp(t, ban).objective == 8.0
    both = Restrictions(length_window={"A": (1, 3), "B": (1, 3)},
                        banned_links=frozenset({("A", "B"), ("B", "A")}))
    assert compose_dp(t, both).status is SolveStatus.INFEASIBLE


def test_positions_pick_who_holds_embedding_and_head():
    # B is cheap at the front, A at the back: B[0,1] (1) then A[1,2] (1): n=1 -> T = 2
    t = load_table(TABLES / "counterexample_order.json")
    r = compose_dp(t)
    assert plan(r) == [("B", 0, 1), ("A", 1, 2)] and r.objective == 2.0
    assert [s.position for s in r.stages] == [Position.FIRST, Position.LAST]


# --- counterexample 1: one (τ_max, τ_sum) pair per state is not enough -----------------------

def test_recurrence_counterexample_numbers():
    t = load_table(TABLES / "counterexample_recurrence.json")  # τ_k(d) = d·c_k + o_k
    assert [t.tau(k, 0, d) for k in "ABC" for d in (1, 2)] == [8, 13, 11, 15, 16, 24]
    # State (3 layers, islands A,B): split (2,1) = (13, 11): max 13, sum 24 -> 37 is kept over
    # split (1,2) = (8, 15): max 15, sum 23 -> 38 ...
    assert (max(13, 11), 13 + 11, 13 + 24) == (13, 24, 37)
    assert (max(8, 15), 8 + 15, 15 + 23) == (15, 23, 38)
    # ... but adding C on the last layer (16) gives 16 + 40 = 56 versus 16 + 39 = 55.
    paper = compose_paper_recurrence(t)
    assert plan(paper) == [("A", 0, 2), ("B", 2, 3), ("C", 3, 4)] and paper.objective == 56.0
    assert not paper.optimal
    assert best_in_order(t, ("A", "B", "C"), use_all=True) == 55.0
    exact = compose_dp(t)  # use_all: every order allowed, here order does not matter
    assert exact.objective == 55.0 and sorted(s.end - s.start for s in exact.stages) == [1, 1, 2]
    assert compose_brute(t).objective == 55.0


def test_recurrence_counterexample_without_use_all_drops_c():
    t = load_table(TABLES / "counterexample_recurrence.json")
    free = LatencyTable(t.layers, t.n_micro, t.islands, t.latency)
    r = compose_dp(free)
    # A2 + B2: max(13, 15) + 28 = 43, better than any plan using C
    assert r.objective == 43.0 and sorted(s.island for s in r.stages) == ["A", "B"]


# --- counterexample 2: the fixed island order ------------------------------------------------
# Found by a one-off search over τ_k(d, pos) = a_k·d + o_k + e_k·[pos∈{first,only}]
# + h_k·[pos∈{last,only}] (+ links c), ordered by (L, K, n, Σ integer parameters): the smallest
# instance where the best plan using islands in the listed order (skips allowed) loses to another
# order is L=2, K=2, n=1, a=(1,1), o=(0,0), e=(1,0), h=(0,1) (Σ=4). Without position extras or
# links the order never matters (T depends only on the multiset of (island, length)).

def test_order_counterexample_positions():
    t = load_table(TABLES / "counterexample_order.json")
    assert best_in_order(t, ("A", "B"), use_all=False) == 3.0  # A alone: only(2) = 3
    paper = compose_paper_recurrence(t)
    assert plan(paper) == [("A", 0, 1), ("B", 1, 2)] and paper.objective == 4.0  # 2 + 2
    assert compose_dp(t).objective == 2.0  # B first (1) then A last (1)
    assert compose_paper_recurrence(t, order=("B", "A")).objective == 2.0


def test_order_counterexample_links():
    # Smallest with n >= 2 via links: L=2, n=2, τ(d)=d for both, c(A→B)=1, c(B→A)=0.
    t = load_table(TABLES / "counterexample_order_links.json")
    assert best_in_order(t, ("A", "B"), use_all=False) == 4.0  # A alone: 1·2 + 2
    assert compose_paper_recurrence(t).objective == 4.0  # A→B: max(1, 1, c=1) + (1+1+1)
    r = compose_dp(t)
    assert plan(r) == [("B", 0, 1), ("A", 1, 2)] and r.objective == 3.0  # 1·1 + 2


def test_paper_recurrence_matches_exact_when_order_and_pairs_are_right():
    t = load_table(TABLES / "paper_80x3.json")
    assert compose_paper_recurrence(t).objective == pytest.approx(compose_dp(t).objective)


def test_paper_recurrence_loses_on_links_and_nulls():
    t = load_table(TABLES / "links_nulls_6x3.json")
    assert compose_paper_recurrence(t).objective == 41.5
    r = compose_dp(t)
    assert r.objective == 41.0
    assert plan(r) == [("slow", 0, 1), ("fast", 1, 4), ("mid", 4, 6)]  # 5, 6, 6; links 5, 1


# --- limits ----------------------------------------------------------------------------------

def test_brute_refuses_large_tables():
    with pytest.raises(TooLargeError, match="limit"):
        compose_brute(linear(40, 2, {k: 1 for k in "ABCDEF"}))


def test_dp_refuses_too_many_islands():
    with pytest.raises(TooLargeError, match="at most 12 islands"):
        compose_dp(linear(4, 2, {f"I{i}": 1 for i in range(13)}))


# --- command line ----------------------------------------------------------------------------

def _cli(monkeypatch, argv: list[str]) -> int:
    """``tangram compose ...`` through the project's CLI entry point."""
    from solver import cli
    return cli.main(argv)


def test_cli_json_contract(monkeypatch, capsys):
    import json
    code = _cli(monkeypatch, ["compose", str(TABLES / "links_nulls_6x3.json"), "--json"])
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) == {"objective", "stages", "solver", "optimal", "time_s", "tie_break"}
    assert out["objective"] == 41.0 and out["tie_break"] == "canonical"
    assert out["objective"] == 41.0 and out["solver"] == "dp" and out["optimal"] is True
    assert out["stages"] == [{"island": "slow", "start": 0, "end": 1, "latency": 5.0},
                             {"island": "fast", "start": 1, "end": 4, "latency": 6.0},
                             {"island": "mid", "start": 4, "end": 6, "latency": 6.0}]


@pytest.mark.parametrize("solver", ["dp", "cpsat", "milp", "brute"])
def test_cli_solvers_plain(monkeypatch, capsys, solver):
    code = _cli(monkeypatch, ["compose", str(TABLES / "counterexample_recurrence.json"),
                              "--solver", solver, "--time-limit", "inf"])  # 6 layers: proven
    out = capsys.readouterr().out
    assert code == 0 and "T = 55 s per iteration" in out and "optimal" in out
    # Three plans reach 55 s; every solver prints the tie rule's (solver.compose.ties), and
    # says nothing about ties when it is the canonical one.
    rows = [line.split()[1:3] for line in out.splitlines() if line[:1].isdigit()]
    assert rows == [["C", "[0,"], ["B", "[1,"], ["A", "[3,"]] and "ties:" not in out


def test_cli_infeasible_exit_3(monkeypatch, capsys, tmp_path):
    import json
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"layers": 2, "n_micro": 2, "islands": ["A", "B", "C"],
                                "latency": {k: [1, 2] for k in "ABC"}, "use_all": True}))
    assert _cli(monkeypatch, ["compose", str(path)]) == 3
    err = capsys.readouterr().err.strip()
    assert err == f"no plan: {path}: use_all needs 3 non-empty slices but the model has 2 layers"


def test_cli_malformed_exit_2(monkeypatch, capsys, tmp_path):
    path = tmp_path / "t.json"
    path.write_text('{"layers": 2, "n_micro": 2, "islands": ["A"], "latency": {"A": [1]}}')
    assert _cli(monkeypatch, ["compose", str(path)]) == 2
    assert capsys.readouterr().err.strip().startswith(f"error: {path}: latency.A: must have 2")
    big = str(TABLES / "mixed_128x8.json")
    assert _cli(monkeypatch, ["compose", big, "--solver", "brute"]) == 2
    assert "--solver: brute force would enumerate" in capsys.readouterr().err


def test_explain_infeasible_names_each_reason():
    from solver.compose.dp import explain_infeasible
    from solver.compose.table import POSITIONS
    nan = None
    three = LatencyTable(2, 1, ("A", "B", "C"), {k: [1.0, 1.0] for k in "ABC"}, {}, use_all=True)
    assert explain_infeasible(three) == "use_all needs 3 non-empty slices but the model has 2 layers"
    alone = LatencyTable(2, 1, ("A",), {"A": [1.0, nan]}, {})
    assert explain_infeasible(alone) == "the only island cannot hold all 2 layers"
    rows = {"first": [nan, nan], "middle": [1.0, 1.0], "last": [1.0, 1.0], "only": [nan, nan]}
    no_first = LatencyTable(2, 1, ("A", "B"), {"A": rows, "B": rows}, {})
    assert explain_infeasible(no_first) == \
        "no island can hold layer 0 (all first/only entries are null or pruned)"
    rows = {"first": [1.0] * 3, "middle": [1.0] * 3, "last": [nan] * 3, "only": [nan] * 3}
    no_last = LatencyTable(3, 1, ("A", "B"), {"A": rows, "B": rows}, {})
    assert explain_infeasible(no_last) == \
        "no island can hold layer 2 (all last/only entries are null or pruned)"
    gap = {"first": [1.0, nan, nan], "middle": [nan, nan, nan], "last": [1.0, nan, nan],
           "only": [nan, nan, nan]}
    holes = LatencyTable(3, 1, ("A", "B"), {"A": gap, "B": gap}, {})
    assert explain_infeasible(holes) == \
        "no split of the layers over distinct islands avoids null latencies"
    # Restricted, a first and a last stage of one layer each are all two islands may take.
    fine = LatencyTable(3, 1, ("A", "B"), {"A": [1.0] * 3, "B": [1.0] * 3}, {})
    caps = {(k, p): (1 if p.value in ("first", "last") else 0) for k in "AB" for p in POSITIONS}
    capped = Restrictions({}, caps, frozenset())
    assert explain_infeasible(fine, capped) == \
        "no split of the layers over distinct islands fits the table and restrictions"
