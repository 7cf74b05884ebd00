"""``tangram plan --simulate``: a plan's simulated 1F1B schedule beside its closed form."""

from __future__ import annotations

import dataclasses
import json

import pytest
from conftest import MINI_FIXED as MINI

from solver.cli.main import main
from solver.planner.baselines import Baseline, plan_baseline
from solver.planner.stages.search import plan_job
from solver.schedule.report import (
    check_objectives,
    closed_form,
    pipeline_spec,
    planned_in_flight,
    round_trip_estimate,
    simulate_plan,
)
from solver.schedule.simulator import PipelineSpec, simulate
from solver.spec.loaders import INSTANCES, load_job

SIM_KEYS = {"simulated_schedule", "simulated_transfers", "simulated_iteration_time_s",
            "closed_form_iteration_time_s", "simulated_vs_closed_form", "eq5_iteration_time_s",
            "eq9_iteration_time_s", "simulated_tokens_per_s", "simulated_bubble_ratio",
            "simulated_peak_in_flight", "planned_in_flight"}


@pytest.fixture(scope="module")
def mini_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("sim") / "mini.toml"
    path.write_text(MINI)
    return path


@pytest.fixture(scope="module")
def mini_plan(mini_path):
    return plan_job(load_job(mini_path))


def test_spec_splits_each_stage_and_keeps_the_links(mini_plan):
    spec = pipeline_spec(mini_plan)
    assert spec.taus == pytest.approx(mini_plan.taus, rel=1e-12)
    assert spec.links_s == tuple(mini_plan.all_links) and spec.n_micro == 8
    for s, f, b in zip(mini_plan.stages, spec.fwd_s, spec.bwd_s):
        assert f / b == pytest.approx(s.plan.fwd_s / s.plan.bwd_s)
    # c/2 each way, one channel: the link is busy n·c per iteration
    sim = simulate(spec)
    assert sum(sim.link_busy_s) == pytest.approx(8 * sum(mini_plan.links))


def test_simulate_plan_reports_both_and_memory_matches(mini_plan):
    out = simulate_plan(mini_plan)
    assert set(out) == SIM_KEYS
    sim = simulate(pipeline_spec(mini_plan))
    assert out["simulated_iteration_time_s"] == pytest.approx(
        sim.makespan_s + mini_plan.iteration_extra_s, rel=1e-5)
    assert out["closed_form_iteration_time_s"] == pytest.approx(mini_plan.iteration_time_s,
                                                                rel=1e-5)
    assert out["eq5_iteration_time_s"] == pytest.approx(out["closed_form_iteration_time_s"])  # no overlap
    # the planner sized each stage for exactly what 1F1B holds there: min(P − i, n)
    depth = len(mini_plan.stages)
    assert out["simulated_peak_in_flight"] == out["planned_in_flight"] == \
        [min(depth - i, 8) for i in range(depth)]


def test_internal_pipeline_stages_are_expanded(mini_path):
    plan = plan_baseline(load_job(mini_path), Baseline.OBLIVIOUS)
    pp = plan.stages[0].plan.config.pp
    spec = pipeline_spec(plan)
    assert pp > 1 and len(spec.fwd_s) == pp and spec.links_s == (0.0,) * (pp - 1)
    assert spec.taus == pytest.approx(list(plan.stages[0].plan.stage_latencies))
    out = simulate_plan(plan)
    assert out["simulated_peak_in_flight"] == planned_in_flight(plan) == \
        [min(pp - j, plan.n_micro) for j in range(pp)]


def test_check_objectives_orders_the_closed_forms(mini_plan):
    c = check_objectives(mini_plan)
    assert c.links_as_stages_s == pytest.approx(mini_plan.iteration_time_s, rel=1e-12)
    assert c.eq9_s <= c.links_as_stages_s              # eq. 9 drops Σc from the fill
    assert c.simulated_blocking_s >= c.simulated_s     # a blocked sender cannot be faster
    assert c.error(c.simulated_s) == 0.0


def test_overlap_flag_reaches_the_plan(mini_path):
    job = load_job(mini_path)
    on = dataclasses.replace(job, planner=dataclasses.replace(job.planner, overlap=True))
    plan = plan_job(on)
    assert plan.overlap
    assert plan.pipeline_time_s == pytest.approx(closed_form(pipeline_spec(plan), overlap=True))


def test_cli_json_merges_the_simulation(mini_path, capsys):
    assert main(["plan", str(mini_path), "--simulate", "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert SIM_KEYS <= set(payload) and {"objective", "stages", "solver"} <= set(payload)
    assert payload["closed_form_iteration_time_s"] == \
        pytest.approx(payload["objective"]["iteration_time_s"], rel=1e-5)


def test_cli_text_prints_key_value_lines(mini_path, capsys):
    assert main(["plan", str(mini_path), "--simulate"]) == 0
    out = capsys.readouterr().out
    assert "simulated_iteration_time_s: " in out and "closed_form_iteration_time_s: " in out


def test_overlap_demo_prices_hidden_transfers_below_links_as_stages():
    # The shipped demo joins the pods by a 5 Gb/s link. Eq. 9 hides the boundary transfers under
    # the sending stage's compute, so the plan made under it is never priced above the plan made
    # with links as stages (each is optimal under its own objective, and eq. 9 charges every
    # plan at most what links-as-stages charges). The simulator, which sends the transfers
    # asynchronously, is slower than eq. 9's closed form on the overlap plan: the hidden
    # transfers are not free.
    job = load_job(INSTANCES / "jobs" / "overlap-demo.toml")
    off = dataclasses.replace(job, planner=dataclasses.replace(job.planner, overlap=False))
    with_overlap, without = plan_job(job), plan_job(off)
    assert with_overlap.iteration_time_s <= without.iteration_time_s
    checked = check_objectives(with_overlap)
    assert checked.eq9_s <= checked.links_as_stages_s
    assert checked.simulated_s > checked.eq9_s


def test_round_trip_estimate_by_hand():
    # f = (1, 1), b = (2, 2), c = 2, n = 4 (simulated 19, eq. 5 17; tests/test_pipeline_sim.py):
    # R_0 = 3 + 3 + 2 = 8 over 2 slots → period 4; R_1 = 3 over 1 → 3; T ≈ 3·4 + 6 + 2 = 20.
    assert round_trip_estimate(PipelineSpec((1.0, 1.0), (2.0, 2.0), (2.0,), 4)) == 20.0
    # equal stages, no links: R_i / (P − i) = τ, eq. 5 exactly: (6 − 1)·3 + 9 = 24
    equal = PipelineSpec((1.0,) * 3, (2.0,) * 3, (0.0, 0.0), 6)
    assert round_trip_estimate(equal) == 24.0 == closed_form(equal) == simulate(equal).makespan_s
