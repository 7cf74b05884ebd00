"""The planner's array kernels have two twins, compiled (numba) and NumPy, that must give the
same answers bit for bit (:mod:`solver.compose.kernels.kernel_switch` picks one per call): every kernel
call of the node-group DP on seeded tables runs both and compares, seeded random inputs check
the bounds and the Pareto filter, whole compositions agree in either mode, and the switch
follows its rule."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import solver.compose.groups.group_pass as group_pass
from solver.compose.groups import group_bounds
from solver.compose.kernels import group_bounds_jit, group_bounds_np
from solver.compose.kernels import group_kernel_jit, group_kernel_np, group_step_np, kernel_switch
from solver.compose.groups.group_dp import compose_groups_dp
from solver.cost import stage_options

from group_tables import seeded_problem

INF = np.inf


def _states(arr: np.ndarray, marks: np.ndarray) -> np.ndarray:
    """What a level array holds: its marked rows, ``inf`` elsewhere (unmarked rows are never
    read, whatever they hold)."""
    shape = marks.shape + (1,) * (arr.ndim - marks.ndim)
    return np.where(marks.reshape(shape) != 0, arr, INF)


def _with_state(arr: np.ndarray, marks: np.ndarray) -> np.ndarray:
    """The marks of the rows that hold a finite state."""
    axes = tuple(range(marks.ndim, arr.ndim))
    return (marks != 0) & (_states(arr, marks) != INF).any(axis=axes)


def _copies(args: list, at: tuple) -> list:
    return [a.copy() if i in at else a for i, a in enumerate(args)]


_KEEP_NUMPY = itertools.cycle([False, False, True])  # whose level arrays the DP goes on with


def _level_step(*args):
    """Both twins of one level step (the NumPy one on copies of what it writes), compared; the
    DP goes on with either's arrays, so each twin also reads what the other wrote (as when the
    rule switches in the middle of a pass)."""
    written = (15, 16, 17, 19, 21)
    mine = _copies(list(args), written)
    group_kernel_jit.level_step(*args)
    group_step_np.level_step(*mine)
    assert np.array_equal(args[17], mine[17])  # the best complete plan, ties included
    for arr, marks in ((16, 19), (15, 21)):    # new_x / new_live, new_w / new_rows
        assert np.array_equal(_states(args[arr], args[marks]), _states(mine[arr], mine[marks]))
        assert np.array_equal(_with_state(args[arr], args[marks]), mine[marks] != 0)
    if next(_KEEP_NUMPY):
        for i in written:
            args[i][...] = mine[i]


def _drop_dominated(x, units, ngroups, nmask, live):
    mine = x.copy()
    group_kernel_jit.drop_dominated(x, units, ngroups, nmask, live)
    group_kernel_np.drop_dominated(mine, units, ngroups, nmask, live)
    assert np.array_equal(_states(x, live), _states(mine, live))


def _prune_rows(x, live, rest, budget, scale=0.0, t_bound=INF):
    mine, my_live = x.copy(), live.copy()
    flags = group_kernel_jit.prune_rows(x, live, rest, budget, scale, t_bound)
    assert group_kernel_np.prune_rows(mine, my_live, rest, budget, scale, t_bound) == flags
    assert np.array_equal(live, my_live) and np.array_equal(_states(x, live), _states(mine, live))
    return flags


def _level_latencies(lat, it, cap, vcap, held, out):
    mine = out.copy()
    group_kernel_jit.level_latencies(lat, it, cap, vcap, held, out)
    group_kernel_np.level_latencies(lat, it, cap, vcap, held, mine)
    assert np.array_equal(out, mine)


def _cover_costs(tmin, gu, ngroups, units, cap):
    want = group_bounds_jit.cover_costs(tmin, gu, ngroups, units, cap)
    assert np.array_equal(group_bounds_np.cover_costs(tmin, gu, ngroups, units, cap), want)
    return want


def _layers_within(units, gu, ngroups, longest, depth):
    want = group_bounds_jit.layers_within(units, gu, ngroups, longest, depth)
    assert group_bounds_np.layers_within(units, gu, ngroups, longest, depth) == want
    return want


@pytest.mark.parametrize("first", range(0, 48, 12))
def test_every_kernel_call_of_the_dp_agrees(monkeypatch, first):
    """Seeded tables (islands, groups, restrictions, links with and without overlap), plain and
    bounded by an incumbent: each kernel call sees real DP states, level arrays reused from
    earlier passes included, and both twins must leave the same states and best plan."""
    for name, both in (("level_step", _level_step), ("drop_dominated", _drop_dominated),
                       ("prune_rows", _prune_rows), ("level_latencies", _level_latencies),
                       ("cover_costs", _cover_costs)):
        monkeypatch.setattr(group_pass, name, both)
    monkeypatch.setattr(group_bounds, "cover_costs", _cover_costs)
    monkeypatch.setattr(group_bounds, "layers_within", _layers_within)
    for seed in range(first, first + 12):
        table, restr, overlap, slack = seeded_problem(seed)
        for links_overlap in (overlap, not overlap):
            found = compose_groups_dp(table, restr, links_overlap)
            if found.objective is not None:
                compose_groups_dp(table, restr, links_overlap,
                                  incumbent=found.objective * slack + 1e-9)


@pytest.mark.parametrize("seed", range(0, 40, 4))
def test_compositions_are_identical_in_either_mode(seed):
    """The whole DP with every kernel NumPy, then every kernel compiled: the same stages and
    the same objective to the last bit."""
    for s in range(seed, seed + 4):
        table, restr, overlap, slack = seeded_problem(s)
        runs = []
        for mode in ("numpy", "compiled"):
            with kernel_switch.forced(mode):
                plain = compose_groups_dp(table, restr, overlap)
                bar = (plain.objective or 1.0) * slack + 1e-9
                runs.append([(r.stages, r.objective, r.status, r.optimal) for r in
                             (plain, compose_groups_dp(table, restr, overlap, incumbent=bar))])
        assert runs[0] == runs[1], s


def _linear(per: np.ndarray, layers: int) -> np.ndarray:
    """``tmin[k, g, d] = d · per[k, g]`` (``inf`` at ``d = 0`` and for missing groups)."""
    d = np.arange(layers + 1)
    with np.errstate(invalid="ignore"):  # inf · 0
        return np.where(d > 0, per[:, :, None] * d, INF)


def _random_cover(rng: np.random.Generator) -> tuple:
    """Islands, groups, a cap and two least-latency tables: linear in the length (ties in the
    sliding window's key included) and increasing at random with some lengths missing."""
    big_k, big_g = int(rng.integers(1, 4)), int(rng.integers(1, 5))
    layers = int(rng.integers(1, 40))
    ngroups = rng.integers(0, big_g + 1, big_k)
    gu, units = rng.integers(1, 5, (big_k, big_g)), rng.integers(0, 14, big_k)
    per = rng.choice([0.25, 0.5, 1.0, 1.5], (big_k, big_g)) if rng.integers(2) else \
        rng.uniform(0.3, 3.0, (big_k, big_g))
    steps = rng.uniform(0.1, 2.0, (big_k, big_g, layers + 1)).cumsum(axis=2)
    tmin = np.where(np.arange(layers + 1) > 0, np.round(steps, int(rng.integers(1, 4))), INF)
    tmin[rng.random(tmin.shape) < 0.15] = INF
    for k in range(big_k):
        per[k, ngroups[k]:] = INF
        tmin[k, ngroups[k]:] = INF
    linear = _linear(per, layers)
    finite = linear[np.isfinite(linear)]
    cap = float(rng.choice(finite)) if finite.size and rng.integers(2) else \
        float(rng.uniform(0.2, 3.0 * layers))
    return tmin, linear, per, gu, ngroups, units, cap


def test_the_bounds_agree_on_random_tables():
    rng = np.random.default_rng(20261207)
    for _ in range(400):
        tmin, linear, per, gu, ngroups, units, cap = _random_cover(rng)
        for table in (tmin, linear):
            for c in (cap, INF):
                assert np.array_equal(group_bounds_np.cover_costs(table, gu, ngroups, units, c),
                                      group_bounds_jit.cover_costs(table, gu, ngroups, units, c))
        assert np.array_equal(
            group_bounds_np.cover_costs_linear(linear, per, gu, ngroups, units, cap),
            group_bounds_jit.cover_costs_linear(linear, per, gu, ngroups, units, cap))
        longest = rng.integers(0, tmin.shape[2], gu.shape)
        depth = int(rng.integers(1, 12))
        assert group_bounds_np.layers_within(units, gu, ngroups, longest, depth) == \
            group_bounds_jit.layers_within(units, gu, ngroups, longest, depth)


def test_level_latencies_and_prune_agree_on_random_options():
    rng = np.random.default_rng(7)
    for _ in range(300):
        width, n_opt = int(rng.integers(1, 30)), int(rng.integers(0, 9))
        levels = int(rng.integers(1, 9))
        cap = -np.sort(-rng.choice([0, 1, 2, 3, 5, 1 << 30], (width, n_opt)), axis=1)
        lat = np.round(rng.uniform(0, 4, (width, n_opt)), 1)
        lat[rng.random(lat.shape) < 0.2] = INF
        it = np.round(rng.uniform(0, 4, (width, n_opt)), 1)
        held = np.minimum(np.arange(levels) + 1, int(rng.integers(1, 6)))
        vcap = float(rng.choice([1.0, 2.5, INF]))
        want, got = np.zeros((levels, width)), np.ones((levels, width))
        group_kernel_jit.level_latencies(lat, it, cap, vcap, held, want)
        group_kernel_np.level_latencies(lat, it, cap, vcap, held, got)
        assert np.array_equal(want, got)
        arr = np.where(rng.random((3, width)) < 0.3, INF,
                       np.round(rng.uniform(0, 5, (3, width)), 1))
        rest, mine = np.round(rng.uniform(0, 2, width), 1), arr.copy()
        bounds = (float(rng.uniform(1, 6)), float(rng.choice([0.0, 0.5])),
                  float(rng.choice([4.0, INF])))
        assert group_kernel_jit.prune(arr, rest, *bounds) == \
            group_kernel_np.prune(mine, rest, *bounds)
        assert np.array_equal(arr, mine)


@pytest.mark.parametrize("size", [0, 1, 5, 40, 64, 65, 300])
def test_the_pareto_filter_agrees(size):
    """Both twins of the stage options' domination test: ties in iteration time and capacity,
    infinite times, runs of groups; the pairwise path (a few rows) and the ranked one."""
    rng = np.random.default_rng(size)
    compiled = stage_options._compiled_kernel()
    for _ in range(40):
        groups = np.sort(rng.integers(0, int(rng.integers(1, 6)), size))
        iteration = rng.choice([0.5, 1.0, 1.5, INF], size) if rng.integers(2) else rng.random(size)
        capacity = rng.integers(0, 7, size)
        assert np.array_equal(stage_options._dominated_np(groups, iteration, capacity),
                              compiled(groups, iteration, capacity))


def test_the_rule_rents_numpy_until_the_price_of_numba():
    """Auto mode: NumPy while the work counted, the next call included, stays within the
    price; the call that would pass it and every call after it compiled, whatever its size."""
    price = kernel_switch.NUMBA_PRICE_S
    with kernel_switch.forced("auto"):
        assert not kernel_switch.use_compiled(0.6 * price)
        assert kernel_switch.spent_s() == pytest.approx(0.6 * price)
        assert not kernel_switch.use_compiled(0.3 * price, charge=False)  # the twin counts
        kernel_switch.count(0.3 * price)
        assert kernel_switch.use_compiled(0.2 * price)  # 1.1 × the price: compiled
        assert kernel_switch.use_compiled(0.0) and kernel_switch.compiled_now()
    with kernel_switch.forced("auto"):
        assert kernel_switch.use_compiled(1.5 * price)  # one call above the price: at once
    with kernel_switch.forced("numpy"):
        assert not kernel_switch.use_compiled(10 * price) and not kernel_switch.compiled_now()
    with kernel_switch.forced("compiled"):
        assert kernel_switch.use_compiled(0.0) and kernel_switch.spent_s() == 0.0
    with pytest.raises(ValueError):
        with kernel_switch.forced("fast"):
            pass


def test_a_small_table_stays_on_numpy_and_a_large_call_goes_compiled(monkeypatch):
    """The fronts ask the rule with their twin's cost: a composition of a small table counts a
    little NumPy work and no compiled kernel runs; a cover bound whose twin would cost more
    than the price runs compiled at once."""
    called = []
    real = kernel_switch.compiled_module
    monkeypatch.setattr(group_bounds, "compiled_module",
                        lambda name: called.append(name) or real(name))
    table, restr, overlap, _ = seeded_problem(3)
    with kernel_switch.forced("auto"):
        compose_groups_dp(table, restr, overlap)
        assert 0 < kernel_switch.spent_s() < kernel_switch.NUMBA_PRICE_S
        assert not kernel_switch.compiled_now() and not called
        layers = 500  # 120 granules of 1, stages up to 500 layers: about 0.5 s of NumPy
        tmin = np.where(np.arange(layers + 1) > 0, 1.0 * np.arange(layers + 1), INF)[None, None]
        group_bounds.cover_costs(tmin, np.array([[1]]), np.array([1]), np.array([120]), 1e9)
        assert called == ["solver.compose.kernels.group_bounds_jit"] and kernel_switch.compiled_now()
