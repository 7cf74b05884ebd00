"""The compute floor of a view (:func:`solver.planner.search.view_floor`): no plan beats it, so a
view whose floor is not below the bar is dismissed without losing a plan."""

from __future__ import annotations

import pytest
from conftest import INSTANCES

from solver.cost.parallelizer import AnalyticParallelizer
from solver.planner.interleaved import compute_floor
from solver.planner.search import PlannerConfig, search, view_floor, views
from solver.spec.loaders import load_job

JOBS = ["seed-llama3-70b", "odd-3h100-5a100-llama2-13b", "mixtral-a100-h100",
        "v100-a100-llama2-13b"]


@pytest.mark.parametrize("n", [1, 2, 8])
@pytest.mark.parametrize("name", JOBS)
def test_no_plan_of_a_view_beats_its_floor(name, n):
    job = load_job(INSTANCES / "jobs" / f"{name}.toml")
    config = PlannerConfig()
    runs = views(job, config, n, AnalyticParallelizer(job.planner.features))
    assert len(runs) == 2  # the islands, then the whole cluster
    for run in runs:
        found = search(run)
        assert found is not None and found.result.feasible, run.view
        assert found.total >= view_floor(run), (run.view, found.total, view_floor(run))


def test_the_floor_of_one_island_is_its_compute_floor_and_more_gpus_lower_it():
    job = load_job(INSTANCES / "jobs" / "seed-llama3-70b.toml")
    n = 32
    by_islands, whole = views(job, PlannerConfig(), n,
                              AnalyticParallelizer(job.planner.features))
    (one,) = whole.islands.islands
    # One island: the fill and drain cost nothing extra, T >= n · w / C = W / C.
    assert view_floor(whole) == pytest.approx(compute_floor(job, one, len(one.nodes)))
    # Two islands, W / F_k their capacities: W/n · ((n − 1)/(C_1 + C_2) + 1/max C), below
    # either island alone and above their summed capacity.
    floors = [compute_floor(job, i, len(i.nodes)) for i in by_islands.islands.islands]
    assert len(floors) == 2
    caps = [1 / f for f in floors]
    assert view_floor(by_islands) == pytest.approx(((n - 1) / sum(caps) + 1 / max(caps)) / n)
    assert 1 / sum(caps) < view_floor(by_islands) < min(floors)
