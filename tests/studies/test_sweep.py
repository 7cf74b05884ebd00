"""The exact n_micro sweep (``n_micro = "auto"``, ``tangram sweep``) and eq. (10)'s predictions."""

from __future__ import annotations

import dataclasses
import json

import pytest
from conftest import INSTANCES
from conftest import MINI_AUTO as MINI

import solver.planner.stages.search as search
from solver.cli.main import main
from solver.planner.plan import cycle_time
from solver.planner.stages.search import PlannerConfig
from solver.planner.check.validate import validate
from solver.spec.domain import TrainingSpec
from solver.spec.loaders import load_job
from solver.studies.sweep import (
    NStarModel,
    SweepPoint,
    SweepResult,
    candidate_n_micro,
    eq10,
    plan_auto,
    point_json,
    sweep,
    sweep_json,
)

KEYS = {"n_micro", "iteration_time_s", "tokens_per_s", "bubble_ratio", "feasible"}


@pytest.fixture(scope="module")
def mini_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("sweep") / "mini.toml"
    path.write_text(MINI)
    return path


@pytest.fixture(scope="module")
def mini_sweep(mini_path):
    return sweep(load_job(mini_path), ns=[2, 8, 32])


def test_candidates_are_the_divisors_in_range(mini_path):
    job = load_job(mini_path)
    assert candidate_n_micro(job) == [1, 2, 4, 8, 16, 32]
    assert candidate_n_micro(job, 3, 16) == [4, 8, 16]
    big = dataclasses.replace(job, training=TrainingSpec(768, 2048))
    assert candidate_n_micro(big) == [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128]


def test_every_point_is_an_exact_validated_plan(mini_path, mini_sweep):
    job = load_job(mini_path)
    assert [p.n_micro for p in mini_sweep.points] == [2, 8, 32]
    for p in mini_sweep.points:
        assert p.feasible and p.plan.n_micro == p.n_micro
        validate(p.plan, job)   # raises when anything is off
        assert p.tokens_per_s == pytest.approx(32 * 2048 / p.iteration_time_s)
    best = min(mini_sweep.points, key=lambda p: p.iteration_time_s)
    assert mini_sweep.best is best


def test_a_job_that_fixes_n_micro_is_swept_at_every_n(mini_path):
    # n_micro fixed in the job is a constraint of `tangram plan`, not of the sweep: each point
    # is the job at that n (the validator refuses a plan at another n than the job fixes, and
    # once every point but the job's own came back empty).
    job = load_job(mini_path)
    fixed = dataclasses.replace(job, training=dataclasses.replace(job.training, n_micro=8))
    points = sweep(fixed, ns=[2, 8, 32]).points
    assert [p.feasible for p in points] == [True, True, True]
    for p in points:
        validate(p.plan, dataclasses.replace(job, training=dataclasses.replace(
            job.training, n_micro=p.n_micro)))


def test_json_has_exactly_the_contract_keys(mini_sweep):
    payload = sweep_json(mini_sweep)
    assert set(payload) == {"points", "best"}
    assert all(set(p) == KEYS for p in payload["points"]) and set(payload["best"]) == KEYS
    assert payload["best"]["n_micro"] == mini_sweep.best.n_micro


def test_infeasible_points_carry_nulls_and_best_skips_them(mini_sweep):
    ok = mini_sweep.points[0]
    bad = SweepPoint(4, None, "nothing fits")
    result = SweepResult((ok, bad), 0.0)
    assert point_json(bad) == {"n_micro": 4, "iteration_time_s": None, "tokens_per_s": None,
                               "bubble_ratio": None, "feasible": False}
    assert result.best is ok
    assert SweepResult((bad,), 0.0).best is None


def test_ties_go_to_the_smaller_n(mini_sweep):
    p = mini_sweep.points[1]
    twin = SweepPoint(64, p.plan)
    assert SweepResult((p, twin), 0.0).best is p


def test_auto_returns_the_sweeps_best(mini_path, mini_sweep):
    job = load_job(mini_path)
    full = sweep(job)
    auto = plan_auto(job)
    assert auto.n_micro == full.best.n_micro
    assert auto.iteration_time_s == pytest.approx(full.best.iteration_time_s, rel=1e-12)


def test_the_search_keeps_the_tie_rule_in_any_order():
    """What a run must beat, by hand: the best so far is 10 s at (n 32, islands view); a run
    of smaller n, or of the same n and an earlier view, may tie it; any other must beat it."""
    best = (10.0, (32, 1))
    assert search._bar(None, (8, 0), 7.5) == 7.5
    assert search._bar(best, (16, 0), 7.5) == 10.0 * (1 + search.REL_TIE)
    assert search._bar(best, (32, 0), 7.5) == 10.0 * (1 + search.REL_TIE)
    assert search._bar(best, (32, 1), 7.5) == 10.0 * (1 - search.REL_TIE)
    assert search._bar(best, (64, 0), 7.5) == 10.0 * (1 - search.REL_TIE)


@pytest.mark.parametrize("order", [sorted, lambda ns: sorted(ns, reverse=True)])
def test_the_n_micro_search_does_not_depend_on_its_order(mini_path, monkeypatch, order):
    job = load_job(mini_path)
    usual = plan_auto(job)
    monkeypatch.setattr(search, "search_order", order)
    other = plan_auto(job)
    assert (other.n_micro, other.view) == (usual.n_micro, usual.view)
    assert other.iteration_time_s == usual.iteration_time_s
    assert [(s.island.name, s.start, s.end, s.nodes) for s in other.stages] == \
        [(s.island.name, s.start, s.end, s.nodes) for s in usual.stages]


@pytest.mark.parametrize("shipped", [None, "odd-3h100-5a100-llama2-13b"])
def test_two_workers_find_the_plan_one_finds(mini_path, shipped):
    """The n_micro search in two forked processes sharing the best: the same plan (each n's
    searches may read another bound, which changes what they cut, not the answer)."""
    job = load_job(mini_path if shipped is None else INSTANCES / "jobs" / f"{shipped}.toml")
    job = dataclasses.replace(job, training=dataclasses.replace(job.training, n_micro=None))
    one, two = plan_auto(job), plan_auto(job, PlannerConfig(workers=2))
    assert (two.n_micro, two.view, two.iteration_time_s) == \
        (one.n_micro, one.view, one.iteration_time_s)
    assert [(s.island.name, s.start, s.end, s.nodes, s.plan.config) for s in two.stages] == \
        [(s.island.name, s.start, s.end, s.nodes, s.plan.config) for s in one.stages]
    assert two.solver.optimal and one.solver.optimal


def test_eq10_scaled_model_by_hand(mini_sweep):
    ref = max(mini_sweep.points, key=lambda p: len(p.plan.stages)).plan
    k = ref.n_micro
    est = eq10(ref, [1, k, 4 * k], NStarModel.SCALED)
    curve = dict(est.curve)
    assert curve[k] == pytest.approx(ref.iteration_time_s, rel=1e-12)
    # T(n) = (k/n)·((n − 1)·max + Σ) + extra, with every τ and link scaled by k/n.
    scaled = [t / 4 for t in ref.taus], [c / 4 for c in ref.all_links]
    assert curve[4 * k] == pytest.approx(cycle_time(*scaled, 4 * k) + ref.iteration_extra_s)
    if len(ref.taus) > 1:   # more micro-batches always help once τ ∝ 1/n: n* is the largest
        assert curve[1] > curve[k] > curve[4 * k] and est.n_star == 4 * k


def test_eq10_fixed_layout_reproduces_the_plan_at_its_own_n(mini_sweep):
    for p in mini_sweep.points:
        est = eq10(p.plan, [p.n_micro], NStarModel.FIXED_LAYOUT)
        assert dict(est.curve)[p.n_micro] == pytest.approx(p.iteration_time_s, rel=1e-9)


def test_eq10_fixed_layout_needs_dp_to_divide_the_micro_batch(mini_sweep):
    plan = mini_sweep.points[1].plan             # n = 8: micro-batches of 4 sequences
    dps = [s.plan.config.dp for s in plan.stages]
    curve = dict(eq10(plan, [1, 2, 4, 8, 16, 32], NStarModel.FIXED_LAYOUT).curve)
    undivided = [n for n in curve if any((32 // n) % dp for dp in dps)]
    assert undivided and all(curve[n] is None for n in undivided)


def test_cli_json(mini_path, capsys):
    assert main(["sweep", str(mini_path), "--n-micro", "2,8", "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert [p["n_micro"] for p in payload["points"]] == [2, 8]
    assert payload["best"]["n_micro"] in (2, 8) and payload["best"]["feasible"] is True


def test_cli_text_names_the_best_and_eq10(mini_path, capsys):
    assert main(["sweep", str(mini_path), "--n-micro", "4..8"]) == 0
    out = capsys.readouterr().out
    assert "best n_micro" in out and "eq. (10)" in out
    assert "\n4 " in out and "\n8 " in out


@pytest.mark.parametrize("arg", ["3", "x..4", "40..50", "0,2"])
def test_cli_rejects_bad_ranges(mini_path, capsys, arg):
    assert main(["sweep", str(mini_path), "--n-micro", arg]) == 2
    assert capsys.readouterr().err.startswith("error: <cli>: --n-micro: ")


def test_cli_nothing_fits_exits_3(tmp_path, capsys):
    path = tmp_path / "huge.toml"
    path.write_text(MINI.replace('"llama2-7b"', '"llama3.1-405b"'))
    assert main(["sweep", str(path), "--n-micro", "8..8"]) == 3
    assert capsys.readouterr().err.startswith("no plan: ")


def test_workers_give_the_same_curve(mini_path, mini_sweep):
    parallel = sweep(load_job(mini_path), ns=[2, 8, 32], workers=2)
    assert [p.iteration_time_s for p in parallel.points] == \
        [p.iteration_time_s for p in mini_sweep.points]
