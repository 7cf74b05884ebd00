"""Greedy island merging (Algorithm 1, phase 2) against the exact CP-SAT merge.

Where greedy needs more islands or loses more compute than CP-SAT, the test records the case
(``GREEDY_WORSE``) instead of hiding it; CP-SAT must never be worse than greedy.
"""

from __future__ import annotations

import random

import pytest
from conftest import CPSAT_WORK, SHIPPED_CLUSTERS, make_cluster

from formulations.island_merge import solve_island_merge
from solver.islands import Thresholds, build_islands, merge_loss_of, partition_loss
from solver.spec.loaders import load_cluster

GREEDY_WORSE = [(14, 4, 4, 0.0189, 0.0157)]
GPUS = ["A100-SXM-40GB", "A100-SXM-80GB", "H100-SXM-80GB", "H100-NVL-94GB", "H100-PCIe-80GB",
        "H200-SXM-141GB", "L40S", "V100-SXM2-32GB"]


def compare(cluster, th):
    greedy = build_islands(cluster, th)
    exact = solve_island_merge(greedy.components, th, work_limit=CPSAT_WORK)  # no clock
    assert exact.optimal
    g_loss = partition_loss([i.nodes for i in greedy.islands])
    assert exact.islands <= len(greedy.islands)
    if exact.islands == len(greedy.islands):
        assert exact.loss <= g_loss + 1e-9
    for island in greedy.islands:  # greedy respects the merge rule it shares with CP-SAT
        if len([c for c in greedy.components if set(c.nodes) <= set(island.nodes)]) > 1:
            assert merge_loss_of(island.nodes) <= th.t_merge + 1e-12
    return len(greedy.islands), g_loss, exact.islands, exact.loss


@pytest.mark.parametrize("path", SHIPPED_CLUSTERS, ids=lambda p: p.stem)
def test_shipped_clusters_greedy_equals_cpsat(path):
    g_count, g_loss, e_count, e_loss = compare(load_cluster(path), Thresholds())
    # On every shipped cluster greedy is optimal (the seed note: "精确最优和贪心结果一致").
    assert (g_count, round(g_loss, 9)) == (e_count, round(e_loss, 9))


def test_hand_case_merge_of_throttled_pair(catalog):
    # Components 989 (16 GPUs) and 890.1 (16 GPUs) at τ_C = 0.05: one merge, loss 5.3% ≤ 10%.
    cluster = make_cluster(catalog, ("H100-SXM-80GB", 2), ("H100-SXM-80GB", 2, 0.9))
    th = Thresholds(tau_c=0.05, t_merge=0.1)
    exact = solve_island_merge(build_islands(cluster, th).components, th,
                               work_limit=CPSAT_WORK)
    assert exact.islands == 1
    assert exact.loss == pytest.approx(1 - 32 * 890.1 / (16 * 989 + 16 * 890.1))


def test_random_clusters(catalog):
    rng = random.Random(7)
    greedy_worse = []
    for trial in range(25):
        groups = [(rng.choice(GPUS), rng.randint(1, 4), rng.choice([1.0, 1.0, 0.95, 0.85, 0.75]))
                  for _ in range(rng.randint(2, 6))]
        th = Thresholds(tau_c=rng.choice([0.05, 0.1, 0.2]), t_merge=rng.choice([0.05, 0.1, 0.2]))
        g_count, g_loss, e_count, e_loss = compare(make_cluster(catalog, *groups), th)
        if (g_count, round(g_loss, 9)) != (e_count, round(e_loss, 9)):
            greedy_worse.append((trial, g_count, e_count, round(g_loss, 4), round(e_loss, 4)))
    # Recorded, not hidden: on these 25 seeded clusters greedy matches CP-SAT's island count
    # every time and loses slightly more compute once (trial 14: 1.89% vs 1.57% of the cluster).
    assert greedy_worse == GREEDY_WORSE
