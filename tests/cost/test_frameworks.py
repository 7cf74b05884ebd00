"""Framework profiles: the parallelizer and the planner only return what the runtime runs."""

from __future__ import annotations

import numpy as np
import pytest

from solver.cost.runtime.frameworks import PROFILES, profile, violations, zero_choices
from solver.cost.parallelizer import AnalyticParallelizer, FeatureSet, PlanContext
from solver.cost.stage import ConfigArrays, ModelSlice, StageConfig
from solver.cost.stage_costs import PipelineSetting, stage_costs
from solver.spec.domain import Framework, Island, ModelSpec, Recompute
from solver.spec.errors import InputError
from solver.spec.loaders import load_job

LLAMA_SMALL = ModelSpec("small", layers=16, hidden=4096, ffn=11008, heads=32, kv_heads=8,
                        vocab=32000)


@pytest.fixture(scope="module")
def island(catalog):
    return Island.homogeneous("a100", catalog["A100-SXM-80GB"], 16)


def _ctx(framework, max_pp=4):
    return PlanContext(seq_len=4096, micro_batch=16, n_micro=8, in_flight=2, max_pp=max_pp,
                       framework=framework)


@pytest.mark.parametrize("framework", list(Framework))
@pytest.mark.parametrize("whole", [True, False])
def test_parallelizer_returns_only_runnable_configs(island, framework, whole):
    slc = ModelSlice.whole(LLAMA_SMALL) if whole else ModelSlice(LLAMA_SMALL, 6, True, False)
    prof = profile(framework)
    for p in AnalyticParallelizer().plan(slc, island, _ctx(framework)):
        pipelined = p.config.pp > 1 or not whole
        assert violations([p.config], prof, pipelined) == [], p.config


def test_flagscale_drops_what_hetero_training_cannot_run(island):
    plans = AnalyticParallelizer().plan(ModelSlice.whole(LLAMA_SMALL), island,
                                        _ctx(Framework.FLAGSCALE))
    assert plans
    assert all(not p.config.offload for p in plans)
    # A stage of several meshes runs under hetero, which asserts cp == 1; one mesh may use CP.
    part = AnalyticParallelizer().plan(ModelSlice(LLAMA_SMALL, 6, True, False), island,
                                       _ctx(Framework.FLAGSCALE, max_pp=1))
    assert part and all(p.config.cp == 1 for p in part)
    assert all(p.config.recompute in (Recompute.NONE, Recompute.FULL) for p in plans)
    # One distributed-optimizer flag: every stage with replicas uses ZeRO-1.
    assert {p.config.zero for p in plans if p.config.dp * p.config.cp > 1} == {1}


def test_deepspeed_zero3_only_without_pipelining(island):
    from solver.cost.parallelizer import enumerate_configs
    ctx = _ctx(Framework.DEEPSPEED)
    cfg = enumerate_configs(ModelSlice.whole(LLAMA_SMALL), island, ctx,
                            FeatureSet.of_framework(Framework.DEEPSPEED, False))
    assert set(cfg.zero[cfg.pp == 1]) == {0, 1, 2, 3}  # a single stage may shard everything
    assert set(cfg.zero[cfg.pp > 1]) == {0, 1}          # PipelineEngine asserts ZeRO < 2
    # A slice that is one stage of a longer pipeline never gets ZeRO-2/3 either.
    part = AnalyticParallelizer().plan(ModelSlice(LLAMA_SMALL, 8, True, False), island,
                                       _ctx(Framework.DEEPSPEED, max_pp=1))
    assert part and all(p.config.zero <= 1 for p in part)


def test_violations_by_hand():
    c = StageConfig(tp=8, cp=1, pp=1, dp=4, zero=2)
    ds = profile(Framework.DEEPSPEED)
    assert violations([c], ds, pipelined=False) == []
    assert len(violations([c], ds, pipelined=True)) == 1
    fs = profile(Framework.FLAGSCALE)
    mixed = [StageConfig(tp=8, dp=2, zero=1), StageConfig(tp=4, dp=4, zero=0)]
    assert any("one ZeRO stage" in v for v in violations(mixed, fs, True))
    # One mesh is plain Megatron-LM (CP runs); hetero asserts cp == 1 (two meshes).
    assert violations([StageConfig(tp=2, cp=2, dp=2, zero=1)], fs, True) == []
    assert violations([StageConfig(tp=2, cp=2, dp=2, zero=1)] * 2, fs, True)
    mc = profile(Framework.MEGATRON_CORE)
    assert any("one (tp, cp, ep, dp)" in v for v in violations(
        [StageConfig(tp=8, dp=2, zero=1), StageConfig(tp=4, dp=4, zero=1)], mc, True))


def test_zero1_dominates_zero0_term_by_term(island):
    """The fact :func:`zero_choices` relies on: same latency, no more sync, optimizer or memory."""
    layouts = [(t, d) for t in (1, 2, 4, 8) for d in (2, 4, 16) if t * d <= 16]
    rows = [StageConfig(tp=t, dp=d, zero=z, micro_batch=1, recompute=r)
            for t, d in layouts for r in Recompute for z in (0, 1)]
    for slc in (ModelSlice(LLAMA_SMALL, 5, True, False), ModelSlice.whole(LLAMA_SMALL)):
        c = stage_costs(slc, island, 4096, ConfigArrays.of(rows), PipelineSetting(8, 3))
        z0, z1 = slice(0, None, 2), slice(1, None, 2)
        assert np.allclose(c.latency_s[z0], c.latency_s[z1])
        assert np.all(c.dp_s[z1] <= c.dp_s[z0] + 1e-12)
        assert np.all(c.optimizer_s[z1] <= c.optimizer_s[z0] + 1e-12)
        assert np.all(c.memory.total[z1] <= c.memory.total[z0])


def test_zero_choices():
    assert zero_choices(profile(Framework.FLAGSCALE), True) == (1,)
    assert zero_choices(profile(Framework.DEEPSPEED), False) == (0, 1, 2, 3)
    assert zero_choices(profile(Framework.FSDP), False) == (2, 3)
    assert all(3 not in p.zero_pipelined for p in PROFILES.values())  # nobody runs ZeRO-3 + PP


def test_feature_set_of_framework_meets_presets():
    fs = FeatureSet.of_framework(Framework.FLAGSCALE, True)
    # CP is a FlagScale feature (one mesh); the stage rows of several meshes drop it.
    assert fs.cp and not fs.offload and fs.zero == (0, 1)
    # A preset without ZeRO keeps ZeRO-0 (the reduction to ZeRO-1 happens after the meet).
    assert zero_choices(profile(Framework.FLAGSCALE), True, allowed=(0,)) == (0,)


def test_job_with_an_unplanned_framework_is_refused(tmp_path):
    from tests.planner.test_planner import write_job
    path = write_job(tmp_path, ["H100-SXM-80GB", "A100-SXM-80GB"], layers=8)
    path.write_text(path.read_text() + 'framework = "deepspeed"\n')
    with pytest.raises(InputError, match="planner.framework"):
        load_job(path)


FAST_JOBS = ["seed-llama3-70b", "homog-a100-llama2-13b", "v100-a100-llama2-13b",
             "mixtral-a100-h100", "long-context-llama3-8b", "mi300x-h100-llama3-70b"]


@pytest.mark.parametrize("name", FAST_JOBS)
def test_no_shipped_plan_uses_what_its_framework_cannot_run(name):
    """Over the bench suite's jobs (all of them in the slow variant below)."""
    _check_job(name)


@pytest.mark.slow
def test_no_plan_of_the_whole_bench_suite_breaks_its_framework():
    from solver.studies.bench import SUITE
    for path in sorted(SUITE.glob("*.toml")):
        if path.stem not in FAST_JOBS and path.stem != "fleet-8448-llama3-70b":  # minutes
            _check_job(path.stem)


def _check_job(name):
    from solver.spec.loaders import INSTANCES
    from solver.studies.sweep import plan_auto
    job = load_job(INSTANCES / "jobs" / f"{name}.toml")
    plan = plan_auto(job)
    pipelined = len(plan.stages) > 1 or any(s.plan.config.pp > 1 for s in plan.stages)
    # Every rule of the runtime, the job-level ones included (model, precision, GPU types).
    found = violations([s.plan.config for s in plan.stages], profile(job.planner.framework),
                       pipelined, model=job.model, precision=job.training.precision,
                       stage_gpus=[{n.gpu for n in (s.nodes or s.island.nodes)}
                                   for s in plan.stages])
    assert found == [], (name, found)
