"""``tangram gen``: determinism, loadable output, realistic shapes, and the plan+validate property.

The property test plans every generated job, validates the plan independently, and accepts
``InfeasibleError`` only when a provably safe rule set (rule 1 alone: no balance window, no memory
cap, no interface ban) finds nothing either; at least 80 % of the jobs must be feasible.
"""

from __future__ import annotations

import tomllib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from solver.cli.main import main
from solver.planner.pruning import Rule
from solver.planner.stages.search import PlannerConfig, plan_job
from solver.planner.check.validate import problems
from solver.spec.errors import InfeasibleError, InputError
from solver.spec.loaders import load_job
from solver.studies.generate import (
    GPUS_PER_NODE,
    MAX_BATCH_TOKENS,
    SEQ_LENS,
    STATE_BYTES_PER_PARAM,
    GenOptions,
    Scale,
    ScaleLimits,
    catalog_models,
    generate,
    write_job,
)

# The 50 random jobs run in the default suite (~20 s on 2 cores at the time of writing).
PROPERTY_JOBS = 50
REALISTIC_JOBS = 20
MIN_FEASIBLE = 0.8


@pytest.fixture(scope="module")
def models():
    """The shipped models by name."""
    return catalog_models()


def test_same_seed_same_bytes(catalog, models):
    for scale in Scale:
        a = generate(GenOptions(7, scale=scale), catalog, models).to_toml()
        b = generate(GenOptions(7, scale=scale), catalog, models).to_toml()
        assert a == b


def test_seeds_differ(catalog, models):
    texts = {generate(GenOptions(s), catalog, models).to_toml() for s in range(20)}
    assert len(texts) == 20


def test_cli_prints_and_writes_the_same_job(tmp_path, capsys, catalog, models):
    assert main(["gen", "--seed", "11", "--small"]) == 0
    printed = capsys.readouterr().out
    assert printed == generate(GenOptions(11, scale=Scale.SMALL), catalog, models).to_toml()
    out = tmp_path / "j.toml"
    assert main(["gen", "--seed", "11", "--small", "--out", str(out)]) == 0
    assert out.read_text() == printed and capsys.readouterr().out == ""
    assert "--seed 11 --small" in printed.splitlines()[0]


def test_cli_rejects_bad_options(capsys):
    assert main(["gen", "--seed", "1", "--gpus", "20"]) == 2
    assert "--gpus" in capsys.readouterr().err
    assert main(["gen", "--seed", "1", "--gpus", "8"]) == 2
    assert main(["gen", "--seed", "1", "--model", "gpt-5"]) == 2
    assert "--model" in capsys.readouterr().err


@settings(max_examples=60, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**32), nodes=st.none() | st.integers(2, 512),
       scale=st.sampled_from(Scale))
def test_generated_jobs_are_realistic_and_load(tmp_path, catalog, models, seed, nodes, scale):
    gpus = None if nodes is None else nodes * GPUS_PER_NODE
    gen = generate(GenOptions(seed, gpus, None, scale), catalog, models)
    job = load_job(write_job(gen, tmp_path / "gen.toml"), catalog)
    limits = ScaleLimits.of(scale)
    kinds = {g.gpu.name for g in job.cluster.groups}
    assert len(kinds) == len(job.cluster.groups)
    assert min(limits.kinds[0], nodes or 99) <= len(kinds) <= limits.kinds[1]
    if gpus is not None:
        assert job.cluster.total_gpus == gpus
    else:
        assert all(g.count in limits.node_counts for g in job.cluster.groups)
    t = job.training
    assert t.seq_len in SEQ_LENS and t.global_batch % t.n_micro == 0
    unit = 1 << (max(g.count for g in job.cluster.groups) - 1).bit_length()
    assert (t.global_batch // t.n_micro) % unit == 0
    assert t.global_batch * t.seq_len <= MAX_BATCH_TOKENS or \
        (t.global_batch // t.n_micro == unit and t.n_micro == min(limits.n_micro))
    hbm = sum(g.count * g.gpus_per_node * g.gpu.hbm_gb for g in job.cluster.groups)
    fits = job.model.total_params * STATE_BYTES_PER_PARAM / 1e9 <= 0.5 * hbm
    smallest = min(m.total_params for m in models.values())
    assert fits or job.model.total_params == smallest
    assert job.model.total_params <= limits.max_params or job.model.total_params == smallest


def test_model_option_is_used(catalog, models):
    gen = generate(GenOptions(3, 64, "llama3-70b"), catalog, models)
    assert gen.model == "llama3-70b" and gen.total_gpus == 64
    assert tomllib.loads(gen.to_toml())["model"] == "llama3-70b"


def test_bad_options_raise_input_error(catalog, models):
    with pytest.raises(InputError):
        generate(GenOptions(1, gpus=12), catalog, models)
    with pytest.raises(InputError):
        generate(GenOptions(1, model="nope"), catalog, models)


def _plan_and_validate(seeds, tmp_path, catalog, models, scale=Scale.SMALL) -> float:
    """Plan every generated job of ``seeds``; returns the feasible fraction."""
    feasible = 0
    for seed in seeds:
        gen = generate(GenOptions(seed, scale=scale), catalog, models)
        job = load_job(write_job(gen, tmp_path / f"{gen.name}.toml"), catalog)
        try:
            plan = plan_job(job)
        except InfeasibleError:
            _assert_really_infeasible(job, seed)
            continue
        assert problems(plan, job) == [], f"seed {seed}"
        assert plan.tokens_per_s > 0 and sum(s.end - s.start for s in plan.stages) == \
            job.model.layers
        feasible += 1
    return feasible / len(seeds)


def _assert_really_infeasible(job, seed: int) -> None:
    # Rule 1 alone is provably safe: if it finds a plan, the default (heuristic) rules lost one.
    try:
        plan_job(job, PlannerConfig(rules=Rule.DEDUPE))
    except InfeasibleError:
        return
    pytest.fail(f"seed {seed}: the default rules report no plan, rule 1 alone finds one")


def test_plan_validate_property(tmp_path, catalog, models):
    assert _plan_and_validate(range(PROPERTY_JOBS), tmp_path, catalog, models) >= MIN_FEASIBLE


@pytest.mark.slow
def test_plan_validate_property_realistic(tmp_path, catalog, models):
    """Realistic-size jobs (up to 4 kinds x 64 nodes, any model): slower, run with ``-m slow``."""
    assert _plan_and_validate(range(REALISTIC_JOBS), tmp_path, catalog, models,
                              Scale.REALISTIC) >= MIN_FEASIBLE


SAFE_JOBS = 4  # the default run; the slow test takes the next 68


def test_provably_safe_rules_never_drop_the_optimum(tmp_path, catalog, models):
    """Over generated jobs: the safe rule set (1, 2s, 3, 4s) finds exactly the optimum of the
    unpruned search (no rule at all: every slice planned, no window, cap or ban), or both find
    nothing."""
    _safe_equals_unpruned(range(SAFE_JOBS), tmp_path, catalog, models)


@pytest.mark.slow
def test_provably_safe_rules_never_drop_the_optimum_many(tmp_path, catalog, models):
    _safe_equals_unpruned(range(SAFE_JOBS, 72), tmp_path, catalog, models)


def _safe_equals_unpruned(seeds, tmp_path, catalog, models) -> None:
    compared = 0
    for seed in seeds:
        gen = generate(GenOptions(seed, scale=Scale.SMALL), catalog, models)
        job = load_job(write_job(gen, tmp_path / f"{gen.name}.toml"), catalog)
        found = []
        for rules in (Rule.safe(), Rule.NONE):
            try:
                found.append(plan_job(job, PlannerConfig(rules=rules)).iteration_time_s)
            except InfeasibleError:
                found.append(None)
        safe, unpruned = found
        assert (safe is None) == (unpruned is None), f"seed {seed}"
        if safe is not None:
            assert safe == pytest.approx(unpruned, rel=1e-9), f"seed {seed}"
            compared += 1
    assert compared >= len(seeds) // 2


def test_the_papers_heuristic_rules_never_beat_every_plan_and_the_plan_says_so(tmp_path, catalog,
                                                                               models, capsys):
    """Generated job 149: the paper's rules prune a subset of every plan, so their plan is never
    faster than the unpruned optimum, and the plan says that its proof covers only what rules 2
    and 4 kept; ``[planner] pruning = "safe"`` finds the unpruned optimum and says so plainly.
    (Under the cost model of 2026-12-06 the rules dropped this job's optimum by 3.3%; with the
    fitted Hopper GEMM fraction and the new catalog entries they no longer do, and a search over
    generated seeds found no other drop: `tangram verify` is how a user checks a job.)"""
    gen = generate(GenOptions(149, scale=Scale.SMALL), catalog, models)
    path = write_job(gen, tmp_path / "paper.toml")
    job = load_job(path, catalog)
    paper, every = plan_job(job), plan_job(job, PlannerConfig(rules=Rule.NONE))
    assert paper.solver.heuristic_pruning and paper.solver.optimal
    assert paper.iteration_time_s >= every.iteration_time_s * (1 - 1e-12)
    assert main(["plan", str(path)]) == 0
    assert "proven optimal over the candidates that the heuristic rules 2 and 4 kept " \
        "(pruning = \"paper\"" in capsys.readouterr().out
    safe_path = tmp_path / "safe.toml"
    safe_path.write_text(path.read_text() + '\n[planner]\npruning = "safe"\n')
    safe = plan_job(load_job(safe_path, catalog))
    assert not safe.solver.heuristic_pruning
    assert safe.iteration_time_s == pytest.approx(every.iteration_time_s, rel=1e-12)
    assert main(["plan", str(safe_path), "--json"]) == 0
    out = capsys.readouterr().out
    assert '"heuristic_pruning": false' in out
