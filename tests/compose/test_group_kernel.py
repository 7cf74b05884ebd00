"""The node-group DP's compiled helpers on arrays small enough to check by hand.

Layout of an open-block level: ``X[k, mi, u, g, l]`` (island, mask index, node granules used,
front group, layers covered) and its row marks ``live[k, mi, u]``.
"""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from solver.compose.groups.group_bounds import cover_costs, cover_costs_linear
from solver.compose.kernels.group_kernel import drop_dominated, prune_rows

INF = np.inf


def one_row_level(values_by_u: dict[int, list[float]], units: int = 3) -> tuple:
    """One island, one mask, one group, 3 lengths: ``X[0, 0, u, 0, :] = values_by_u[u]``."""
    x = np.full((1, 1, units + 1, 1, 3), INF)
    live = np.zeros((1, 1, units + 1), dtype=np.uint8)
    for u, row in values_by_u.items():
        x[0, 0, u, 0] = row
        live[0, 0, u] = 1
    return x, live


def test_a_state_using_more_nodes_for_more_time_is_dropped():
    # l = 0: 3 (1 node), 5 (2 nodes), 2 (3 nodes): 5 is beaten by 3 with fewer nodes; 2 stays.
    # l = 1: 4, 4, 6: the equal 4 stays (the tie rule sees both), 6 goes. l = 2: inf, 1, 1.
    x, live = one_row_level({1: [3, 4, INF], 2: [5, 4, 1], 3: [2, 6, 1]})
    drop_dominated(x, np.array([3]), np.array([1]), np.array([1]), live)
    assert x[0, 0, 1:, 0].tolist() == [[3, 4, INF], [INF, 4, 1], [2, INF, 1]]


def test_rows_not_marked_live_are_not_read():
    # The 2-node row is not marked: it cannot dominate the 3-node one (nor be dropped).
    x, live = one_row_level({2: [1, 1, 1], 3: [5, 5, 5]})
    live[0, 0, 2] = 0
    drop_dominated(x, np.array([3]), np.array([1]), np.array([1]), live)
    assert x[0, 0, 3, 0].tolist() == [5, 5, 5] and x[0, 0, 2, 0].tolist() == [1, 1, 1]


def test_prune_unmarks_emptied_rows():
    # Budget 4 with nothing left to cover (rest = 0): the 1-node row keeps 3, the 2-node row
    # loses all its states and is unmarked; flags: a state is left (1) and some were cut (2).
    x, live = one_row_level({1: [3, 9, INF], 2: [5, 6, 7]})
    flags = prune_rows(x, live, np.zeros(3), 4.0)
    assert flags == 3 and live[0, 0].tolist() == [0, 1, 0, 0]
    assert x[0, 0, 1, 0].tolist() == [3, INF, INF] and np.isinf(x[0, 0, 2]).all()


def _linear_table(per_layer: np.ndarray, layers: int) -> np.ndarray:
    d = np.arange(layers + 1)
    with np.errstate(invalid="ignore"):
        return np.where(d > 0, per_layer[:, :, None] * d, INF)


def test_the_linear_cover_by_hand():
    # One island of 4 granules; groups of 1 granule (2 s a layer) and 2 granules (1 s a layer);
    # 4 layers. Within a cap of 2 s a 2-granule stage holds 2 layers, so two of them cover all
    # 4 for 4 s; within 1 s each holds 1: two stages cover 2 layers for 2 s, no more fit.
    per_layer = np.array([[2.0, 1.0]])
    gu, ng, units = np.array([[1, 2]]), np.array([2]), np.array([4])
    table = _linear_table(per_layer, 4)
    at_two = cover_costs_linear(table, per_layer, gu, ng, units, 2.0)
    assert at_two.tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]
    at_one = cover_costs_linear(table, per_layer, gu, ng, units, 1.0)
    assert at_one.tolist() == [0.0, 1.0, 2.0, INF, INF]
    assert at_two.tolist() == cover_costs(table, gu, ng, units, 2.0).tolist()


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_the_linear_cover_equals_the_general_one(seed):
    """Seeded random islands, groups and caps: the sliding-window kernel gives the general
    knapsack's values (up to rounding) and the same uncoverable lengths."""
    rng = np.random.default_rng(seed)
    big_k, big_g, layers = int(rng.integers(1, 4)), int(rng.integers(1, 5)), int(rng.integers(1, 30))
    per_layer = rng.uniform(0.5, 3.0, (big_k, big_g))
    ngroups = rng.integers(1, big_g + 1, big_k)
    for k in range(big_k):
        per_layer[k, ngroups[k]:] = INF
    gu, units = rng.integers(1, 5, (big_k, big_g)), rng.integers(0, 12, big_k)
    cap = float(rng.uniform(0.5, 3.0 * layers))
    table = _linear_table(per_layer, layers)
    want = cover_costs(table, gu, ngroups, units, cap)
    got = cover_costs_linear(table, per_layer, gu, ngroups, units, cap)
    assert np.array_equal(np.isinf(want), np.isinf(got))
    assert np.allclose(want[np.isfinite(want)], got[np.isfinite(got)], rtol=1e-12, atol=0)
