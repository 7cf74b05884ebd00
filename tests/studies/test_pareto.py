"""Multi-objective plans: cost/energy arithmetic, the fronts, budgets in every composer, targets.

The fronts come from enumerating island subsets; they are cross-checked the other way round by
budget-constrained compositions (DP and CP-SAT, ``solver.studies.budget``): at every budget the
fastest plan within it must be the fastest subset point within it.
"""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest

from formulations.assignment_cpsat import solve_cpsat
from formulations.scaling import objective_tolerance
from solver.cli.main import main
from solver.compose.dp import compose_brute, compose_dp
from solver.compose.table import Budget, LatencyTable, Restrictions
from solver.planner.pruning import Rule
from solver.planner.stages.search import PlannerConfig, plan_job, start_run
from solver.planner.check.validate import problems
from solver.spec.domain import SolverKind
from solver.spec.errors import InfeasibleError, InputError
from solver.spec.loaders import load_job
from solver.studies.budget import fastest_within_budget
from solver.studies.pareto import (
    Objective,
    SubsetPlan,
    choose_target,
    pareto_front,
    plan_with_targets,
    subset_plans,
)

from conftest import CPSAT_WORK, NO_WALL_CLOCK

JOB = """model = "llama2-7b"
[cluster]
name = "trio"
inter_island_gbits = 200.0
[[cluster.nodes]]
gpu = "H100-SXM-80GB"
count = 1
name = "h100"
[[cluster.nodes]]
gpu = "A100-SXM-80GB"
count = 2
name = "a100"
[[cluster.nodes]]
gpu = "V100-SXM2-32GB"
count = 2
name = "v100"
[training]
global_batch = 64
seq_len = 2048
n_micro = 8
precision = "fp16"  # one precision per job: FP16 lets the V100 island (no BF16) join
{planner}"""
LOCAL = PlannerConfig(rules=Rule.DEDUPE | Rule.MEMORY)  # subset-independent rules
# Catalog: H100 $3.0/h 700 W, A100-80GB $1.8/h 400 W, V100-32GB $0.9/h 300 W; 8 GPUs a node.
RATE = {"i0-H100-SXM-80GB": (24.0, 5600.0), "i1-A100-SXM-80GB": (28.8, 6400.0),
        "i2-V100-SXM2-32GB": (14.4, 4800.0)}


def write(tmp_path, planner=""):
    path = tmp_path / "trio.toml"
    path.write_text(JOB.format(planner=planner))
    return path


@pytest.fixture(scope="module")
def trio(tmp_path_factory):
    return load_job(write(tmp_path_factory.mktemp("trio")))


@pytest.fixture(scope="module")
def points(trio):
    return subset_plans(trio)


@pytest.fixture(scope="module")
def local_points(trio):
    return subset_plans(trio, LOCAL)


def test_cost_and_energy_by_hand(points):
    assert len(points) == 7  # every non-empty subset of 3 islands has a plan of its own
    for p in points:
        usd = sum(RATE[name][0] for name in p.islands)
        watts = sum(RATE[name][1] for name in p.islands)
        assert p.hourly_usd == pytest.approx(usd) and p.watts == pytest.approx(watts)
        assert p.usd_per_iteration == pytest.approx(usd * p.iteration_time_s / 3600)
        assert p.kwh_per_iteration == pytest.approx(watts * p.iteration_time_s / 3.6e6)
        assert p.tokens_per_s == pytest.approx(64 * 2048 / p.iteration_time_s)


def test_every_point_is_a_valid_plan(trio, points):
    for p in points:
        assert problems(p.plan, trio) == []
        # The islands in pipeline order, each once (an island may host several stages).
        assert tuple(dict.fromkeys(s.island.name for s in p.plan.stages)) == p.islands


@pytest.mark.parametrize("objective", list(Objective))
def test_front_is_exactly_the_non_dominated_points(points, objective):
    front = pareto_front(points, objective)
    times = [p.iteration_time_s for p in front]
    values = [p.value(objective) for p in front]
    assert times == sorted(times) and values == sorted(values, reverse=True)
    assert len(set(values)) == len(values)
    for p in points:
        dominated = any(q.iteration_time_s <= p.iteration_time_s and q.value(objective) <=
                        p.value(objective) and q is not p for q in points)
        assert (p in front) == (not dominated)


def test_fastest_point_is_at_least_the_planners_plan(trio, points):
    assert points[0].iteration_time_s <= plan_job(trio).iteration_time_s


@pytest.mark.parametrize("objective", list(Objective))
def test_front_agrees_with_budget_constrained_dp_at_every_budget(trio, local_points, objective):
    run = start_run(trio, LOCAL, 8)
    rates = sorted({p.hourly_usd if objective is Objective.COST else p.watts
                    for p in local_points})
    budgets = rates + [(a + b) / 2 for a, b in zip(rates, rates[1:])] + [rates[0] / 2]
    for b in budgets:
        rate = (lambda p: p.hourly_usd) if objective is Objective.COST else (lambda p: p.watts)
        within = [p.iteration_time_s for p in local_points if rate(p) <= b]
        found = fastest_within_budget(run, b, objective)
        if not within:
            assert found is None
        else:
            assert found.optimal and found.iteration_time_s == pytest.approx(min(within), rel=1e-12)


# The CP-SAT cross-check runs on a smaller trio (one node per GPU type, Llama 2 7B's shape
# with 8 layers): on the 32-layer trio the all-island budget takes CP-SAT about 5 deterministic
# seconds (half a minute on a loaded machine); here about a second, without a wall-clock limit.
SMALL_TRIO = JOB.replace('model = "llama2-7b"', 'model = {{name = "llama2-7b-8-layers", '
                         'layers = 8, hidden = 4096, ffn = 11008, heads = 32, kv_heads = 32, '
                         'vocab = 32000}}').replace("count = 2", "count = 1")


def test_front_agrees_with_cpsat_budget_model(tmp_path):
    path = tmp_path / "small-trio.toml"
    path.write_text(SMALL_TRIO.format(planner=""))
    job = load_job(path)
    # No wall-clock limit (conftest): the proofs asserted below never depend on the load.
    run = start_run(job, PlannerConfig(rules=LOCAL.rules, solver=SolverKind.CPSAT,
                                       time_limit_s=NO_WALL_CLOCK), 8)
    front = pareto_front(subset_plans(job, LOCAL), Objective.COST)
    assert len(front) >= 2  # a budget that binds: the cheaper point leaves islands out
    for p, cheaper in itertools.zip_longest(front, front[1:]):
        found = fastest_within_budget(run, p.hourly_usd)
        assert found.optimal and found.islands == p.islands
        assert found.iteration_time_s == pytest.approx(p.iteration_time_s, rel=1e-6)
    below = fastest_within_budget(run, front[-1].hourly_usd - 1.0)  # under the cheapest point
    assert below is None or below.iteration_time_s > front[-1].iteration_time_s


# --- budgets in the composers, on tables --------------------------------------------------------

def _random_table(seed: int) -> LatencyTable:
    rng = np.random.default_rng(seed)
    names = ("A", "B", "C")
    lat = {k: {pos: [float(rng.uniform(0.5, 2.0)) * d for d in range(1, 6)]
               for pos in ("first", "middle", "last", "only")} for k in names}
    link = {(a, b): float(rng.uniform(0, 1)) for a in names for b in names if a != b}
    return LatencyTable(5, 4, names, lat, link)


@pytest.mark.parametrize("seed", range(4))
def test_budget_is_honoured_by_dp_brute_and_cpsat(seed):
    table = _random_table(seed)
    rates = {"A": 3.0, "B": 2.0, "C": 1.5}
    sums = sorted({sum(rates[k] for k in s) for n in (1, 2, 3)
                   for s in itertools.combinations("ABC", n)})
    for limit in sums + [1.0, 2.6]:
        r = Restrictions(budget=Budget(rates, limit))
        cp = solve_cpsat(table, r, False, NO_WALL_CLOCK, work_limit=CPSAT_WORK)  # no clock
        brute, dp = compose_brute(table, r), compose_dp(table, r)
        assert brute.feasible == dp.feasible == cp.feasible == (limit >= 1.5)
        if not brute.feasible:
            continue
        assert cp.optimal, cp.status
        used = [s.island for s in dp.stages]
        assert sum(rates[k] for k in used) <= limit + 1e-12
        assert dp.objective == pytest.approx(brute.objective, rel=1e-12)
        assert cp.objective - brute.objective <= objective_tolerance(table) + 1e-12


def test_budget_none_changes_nothing():
    table = _random_table(7)
    loose = Restrictions(budget=Budget({"A": 1.0, "B": 1.0, "C": 1.0}, 3.0))
    assert compose_dp(table, loose).stages == compose_dp(table).stages
    assert compose_dp(table, Restrictions()).objective == compose_dp(table).objective


@pytest.mark.parametrize("rates, limit, key", [({"A": 1.0, "B": 1.0}, 2.0, "budget.rates.C"),
                                               ({"A": 1, "B": 1, "C": -1}, 2.0, "budget.rates.C"),
                                               ({"A": 1, "B": 1, "C": 1, "D": 1}, 2, "rates.D"),
                                               ({"A": 1, "B": 1, "C": 1}, float("nan"), "limit")])
def test_bad_budget_is_an_input_error(rates, limit, key):
    with pytest.raises(InputError, match=key):
        compose_dp(_random_table(0), Restrictions(budget=Budget(rates, limit)))


# --- budget and deadline options of a job ------------------------------------------------------

def test_loose_budget_keeps_the_planners_plan(tmp_path, trio):
    job = load_job(write(tmp_path, "[planner]\nmax_usd_per_hour = 1000.0\n"))
    assert job.planner.max_usd_per_hour == 1000.0
    assert plan_with_targets(job).iteration_time_s == plan_job(trio).iteration_time_s


def test_budget_picks_the_fastest_affordable_set(tmp_path, points):
    # 50 $/h excludes every set with the A100 island and H100 together (52.8, 67.2 $/h).
    job = load_job(write(tmp_path, "[planner]\nmax_usd_per_hour = 50.0\n"))
    plan = plan_with_targets(job)
    best = min((p for p in points if p.hourly_usd <= 50.0), key=lambda p: p.iteration_time_s)
    assert plan.iteration_time_s == best.iteration_time_s
    assert SubsetPlan.of(plan).hourly_usd <= 50.0


def test_deadline_picks_the_cheapest_plan_fast_enough(tmp_path, points):
    target = 0.9 * points[0].tokens_per_s
    job = load_job(write(tmp_path, f"[planner]\nmin_tokens_per_s = {target}\n"))
    plan = SubsetPlan.of(plan_with_targets(job))
    ok = [p for p in points if p.tokens_per_s >= target]
    assert plan.tokens_per_s >= target
    assert plan.usd_per_iteration == pytest.approx(min(p.usd_per_iteration for p in ok))


def test_impossible_targets_are_infeasible(tmp_path, points):
    opts = load_job(write(tmp_path, "[planner]\nmax_usd_per_hour = 10.0\n")).planner
    with pytest.raises(InfeasibleError, match="max_usd_per_hour 10: the cheapest island set"):
        choose_target(points, opts)
    opts = load_job(write(tmp_path, "[planner]\nmin_tokens_per_s = 1e9\n")).planner
    with pytest.raises(InfeasibleError, match="min_tokens_per_s 1,000,000,000"):
        choose_target(points, opts)


@pytest.mark.parametrize("line", ["max_usd_per_hour = -1.0", "min_tokens_per_s = 0",
                                  'max_usd_per_hour = "cheap"'])
def test_bad_target_options_are_input_errors(tmp_path, line):
    with pytest.raises(InputError, match="planner.m"):
        load_job(write(tmp_path, f"[planner]\n{line}\n"))


# --- the command --------------------------------------------------------------------------------

def test_cli_pareto_json_and_plot(tmp_path, capsys, points):
    plot = tmp_path / "front.png"
    assert main(["pareto", str(write(tmp_path)), "--json", "--plot", str(plot)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) == {"cost", "energy"}
    assert {"iteration_time_s", "usd_per_iteration", "islands", "tokens_per_s"} <= set(out["cost"][0])
    assert {"iteration_time_s", "kwh_per_iteration", "islands", "tokens_per_s"} <= \
        set(out["energy"][0])
    front = pareto_front(points, Objective.COST)
    assert [e["islands"] for e in out["cost"]] == [list(p.islands) for p in front]
    for e, p in zip(out["cost"], front):  # full precision (9 digits), not the table's rounding
        assert e["tokens_per_s"] == pytest.approx(p.tokens_per_s, rel=1e-8)
        assert e["iteration_time_s"] == pytest.approx(p.iteration_time_s, rel=1e-8)
    assert plot.stat().st_size > 10_000


def test_cli_pareto_text(tmp_path, capsys):
    assert main(["pareto", str(write(tmp_path))]) == 0
    out = capsys.readouterr().out
    assert "cost front" in out and "energy front" in out and "$/iter" in out
