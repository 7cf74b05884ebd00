"""Property tests: the DP is exact (equals brute force) and the models agree with it.

Small tables use dyadic values (multiples of 1/4), so every sum is exact in floating point and
"equal" means bit-equal. Medium tables use arbitrary floats and compare CP-SAT within the stated
scaling tolerance and the MILPs within 1e-6 relative.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from formulations.assignment_cpsat import solve_cpsat
from formulations.assignment_milp import MilpBackend, solve_milp
from formulations.scaling import objective_tolerance
from solver.compose.dp import (
    SolveStatus,
    compose_brute,
    compose_dp,
    objective_of,
    plan_problems,
)
from solver.compose.table import POSITIONS, Budget, LatencyTable, Restrictions

from conftest import CBC_NODES, CPSAT_WORK, NO_WALL_CLOCK

NAMES = "ABCDEFGH"


def _row(draw, L: int, values, null_p: float) -> list:
    nulls = draw(st.lists(st.booleans(), min_size=L, max_size=L)) if null_p else [False] * L
    vals = draw(st.lists(values, min_size=L, max_size=L))
    return [None if (n and draw(st.floats(0, 1)) < null_p) else v for n, v in zip(nulls, vals)]


@st.composite
def tables(draw, max_k=4, max_l=6, values=st.integers(0, 40).map(lambda v: v / 4)):
    """Random table with optional positions, links, nulls and use_all; three or more islands and
    four or more layers in most examples (deep plans are where composition goes wrong)."""
    K = draw(st.one_of(st.integers(min(3, max_k), max_k), st.integers(1, max_k)))
    L = draw(st.one_of(st.integers(min(4, max_l), max_l), st.integers(1, max_l)))
    n = draw(st.integers(1, 8))
    names = tuple(NAMES[:K])
    null_p = draw(st.sampled_from([0.0, 0.2]))
    lat = {}
    steep = draw(st.booleans())  # latencies superlinear in the slice length: splitting pays
    for name in names:
        if steep:
            c = draw(st.integers(1, 4))
            lat[name] = [c * d * d / 4 for d in range(1, L + 1)]
        elif draw(st.booleans()):
            lat[name] = {p.value: _row(draw, L, values, null_p) for p in POSITIONS}
        else:
            lat[name] = _row(draw, L, values, null_p)
    link = {}
    if draw(st.booleans()):
        pairs = [(a, b) for a in names for b in names if a != b]
        chosen = draw(st.lists(st.sampled_from(pairs), unique=True)) if pairs else []
        link = {p: draw(values) for p in chosen}
    return LatencyTable(L, n, names, lat, link, use_all=draw(st.booleans()) and K <= 3)


@st.composite
def restrictions(draw, table: LatencyTable):
    """Random windows, memory caps, bans, a stage limit and a budget over the table's islands
    (or None)."""
    if draw(st.integers(0, 3)) == 0:
        return None
    L, names = table.layers, table.islands
    window = {k: tuple(sorted(draw(st.lists(st.integers(1, L), min_size=2, max_size=2))))
              for k in names if draw(st.booleans())}
    memory = {(k, p): draw(st.integers(0, L)) for k in names for p in POSITIONS
              if draw(st.integers(0, 4)) == 0}
    pairs = [(a, b) for a in names for b in names if a != b]
    bans = frozenset(draw(st.lists(st.sampled_from(pairs), unique=True, max_size=3))
                     if pairs else ())
    budget = None
    if draw(st.booleans()):
        rates = {k: float(draw(st.integers(0, 3))) for k in names}
        budget = Budget(rates, float(draw(st.integers(0, 6))))
    return Restrictions(window, memory, bans, draw(st.one_of(st.none(), st.integers(1, 4))),
                        budget)


@st.composite
def problems(draw, **kw):
    table = draw(tables(**kw))
    return table, draw(restrictions(table)), draw(st.booleans())


def _own_objective(table, stages, overlap):
    """The iteration time written out here, apart from the library: look each stage up in the
    table's raw rows by its position, then (n - 1) times the bottleneck plus every cost once."""
    taus = []
    for s in stages:
        pos = ("only" if s.end == table.layers else "first") if s.start == 0 else \
            ("last" if s.end == table.layers else "middle")
        row = {p.value: v for p, v in table.latency[s.island].items()}[pos]
        taus.append(row[s.end - s.start - 1])
    links = [table.link.get((a.island, b.island), 0.0) for a, b in zip(stages, stages[1:])]
    if overlap:
        costs = [max(t, links[i]) if i < len(links) else t for i, t in enumerate(taus)]
    else:
        costs = taus + links
    return (table.n_micro - 1) * max(costs) + sum(costs)


def _check_plan(table, result, rules, overlap):
    assert not plan_problems(table, result.stages, rules)
    assert result.objective == objective_of(table, result.stages, overlap)
    assert result.objective == pytest.approx(_own_objective(table, result.stages, overlap),
                                             rel=1e-12, abs=1e-12)


@settings(max_examples=150, deadline=None, derandomize=True, database=None)
@given(problems())
def test_dp_equals_brute_force(problem):
    table, rules, overlap = problem
    dp, brute = compose_dp(table, rules, overlap), compose_brute(table, rules, overlap)
    assert dp.status == brute.status
    assert dp.objective == brute.objective  # dyadic values: exact
    assert dp.stages == brute.stages  # one tie rule (solver.compose.ties), two implementations
    if dp.feasible:
        _check_plan(table, dp, rules, overlap)


@settings(max_examples=60, deadline=None, derandomize=True, database=None)
@given(problems(), st.randoms(use_true_random=False))
def test_dp_ignores_island_listing_order(problem, rnd):
    table, rules, overlap = problem
    order = list(table.islands)
    rnd.shuffle(order)
    shuffled = LatencyTable(table.layers, table.n_micro, tuple(order), table.latency, table.link,
                            table.use_all)
    expected = compose_dp(table, rules, overlap).objective
    assert compose_dp(shuffled, rules, overlap).objective == expected


@settings(max_examples=60, deadline=None, derandomize=True, database=None)
@given(problems())
def test_restrictions_never_help(problem):
    table, rules, overlap = problem
    free, pruned = compose_dp(table, None, overlap), compose_dp(table, rules, overlap)
    if pruned.feasible:
        assert free.feasible and free.objective <= pruned.objective


FLOATS = st.floats(0.0, 3.0, allow_nan=False, allow_infinity=False)


@st.composite
def structured_tables(draw, max_k=5, max_l=14):
    """Realistic shape: τ_k(d, pos) = a_k·d + o_k + first/last extras + small noise, a memory
    limit (null above some length), links; splitting usually pays, as on real clusters."""
    K, L = draw(st.integers(2, max_k)), draw(st.integers(4, max_l))
    names = tuple(NAMES[:K])
    lat = {}
    for name in names:
        a, o, head, tail = (draw(st.floats(lo, hi)) for lo, hi in
                            ((0.5, 3.0), (0.0, 2.0), (0.0, 2.0), (0.0, 3.0)))
        longest = draw(st.integers(max(1, L // K), L))
        noise = draw(st.lists(st.floats(0.0, 0.2), min_size=L, max_size=L))
        base = [a * d + o + noise[d - 1] if d <= longest else None for d in range(1, L + 1)]
        extra = {"first": head, "middle": 0.0, "last": tail, "only": head + tail}
        lat[name] = {p: [None if v is None else v + x for v in base] for p, x in extra.items()}
    pairs = [(a, b) for a in names for b in names if a != b]
    link = {p: draw(FLOATS) for p in draw(st.lists(st.sampled_from(pairs), unique=True))}
    return LatencyTable(L, draw(st.integers(1, 32)), names, lat, link,
                        use_all=draw(st.integers(0, 4)) == 0)


@st.composite
def medium_problems(draw, **kw):
    table = draw(structured_tables(**kw))
    return table, draw(restrictions(table)), draw(st.booleans())


def _agree(problem, work: float) -> None:
    """The models prove the DP's optimum within deterministic limits (``work`` deterministic
    seconds for CP-SAT, conftest's node count for CBC; HiGHS without a wall-clock limit)."""
    table, rules, overlap = problem
    dp = compose_dp(table, rules, overlap)
    models = [solve_cpsat(table, rules, overlap, NO_WALL_CLOCK, work_limit=work),
              solve_milp(table, rules, overlap, NO_WALL_CLOCK, MilpBackend.CBC,
                         node_limit=CBC_NODES),
              solve_milp(table, rules, overlap, NO_WALL_CLOCK, MilpBackend.HIGHS)]
    for res in models:
        if dp.status is SolveStatus.INFEASIBLE:
            assert res.status is SolveStatus.INFEASIBLE, res.solver
            continue
        assert res.optimal, (res.solver, res.status)
        _check_plan(table, res, rules, overlap)
        tol = objective_tolerance(table, overlap) if res.solver == "cpsat" else 1e-6 * dp.objective
        assert dp.objective <= res.objective + 1e-9 * dp.objective, res.solver  # DP is optimal
        assert res.objective - dp.objective <= tol + 1e-9, res.solver


@settings(max_examples=25, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(medium_problems())
def test_models_agree_with_dp(problem):
    _agree(problem, work=CPSAT_WORK)


@pytest.mark.slow
@settings(max_examples=300, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(medium_problems(max_k=6, max_l=24))
def test_models_agree_with_dp_heavy(problem):
    _agree(problem, work=2 * CPSAT_WORK)


@pytest.mark.slow
@settings(max_examples=1500, deadline=None, derandomize=True, database=None)
@given(problems(max_k=4, max_l=7))
def test_dp_equals_brute_force_heavy(problem):
    test_dp_equals_brute_force.hypothesis.inner_test(problem)
