"""The MoE all-to-all overlap in the planner: searched, proven by every solver and by brute
force, validated, exported with the flag Megatron-LM takes, read back, and refused where the
runtime or the cost model does not run it.

Sources: Megatron-LM ``_add_moe_args`` (``--overlap-moe-expert-parallel-comm``, core_v0.14.0
on; FlagScale's pin 8479eb3 has it) and ``TransformerConfig.__post_init__`` (its rules);
Megatron-Bridge ``scripts/performance/utils/overrides.py`` (``CUDA_DEVICE_MAX_CONNECTIONS`` 8
on Hopper, 32 on Blackwell with it).
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import yaml

from solver.cli.main import main
from solver.cli.report import island_json
from solver.cost.configs import FeatureSet, enumerate_configs
from solver.cost.reserve import usable_bytes
from solver.cost.runtime.frameworks import job_runtime
from solver.cost.stage import ModelSlice
from solver.cost.stage_costs import PipelineSetting, stage_costs
from solver.islands import Thresholds, build_islands
from solver.launch import flagscale_hostfile, flagscale_yaml
from solver.launch.flagscale_check import problems as judge
from solver.launch.flagscale_read import read_back
from solver.launch.megatron import megatron_args, megatron_launch
from solver.planner.check.validate import problems
from solver.planner.plan import plan_json
from solver.planner.stages.interleaved import _context
from solver.planner.stages.search import PlannerConfig, plan_job
from solver.spec.domain import SolverKind
from solver.spec.errors import InputError
from solver.spec.loaders import load_job
from solver.studies.previous import previous_plan

#: Mixtral 8x7B's layer shape, 16 layers, on two DGX H100 under Megatron-Core: the experts do
#: not fit replicated, so the plan runs EP 8 in one stage, where the overlap hides the
#: all-to-alls.
JOB = """
model = { layers = 16, hidden = 4096, ffn = 14336, heads = 32, kv_heads = 8, vocab = 32000, experts = 8, top_k = 2, expert_ffn = 14336 }
cluster = { nodes = [ { gpu = "H100-SXM-80GB", count = 2, name = "x" } ] }
[training]
global_batch = 128
seq_len = 4096
[planner]
framework = "%s"
pruning = "safe"
%s
"""


def _job(tmp_path, framework="megatron-core", extra="", name="job.toml"):
    path = tmp_path / name
    path.write_text(JOB % (framework, extra))
    return load_job(path)


@pytest.fixture(scope="module")
def planned(tmp_path_factory):
    job = _job(tmp_path_factory.mktemp("a2a"))
    return job, plan_job(job)


def _brute(job, n: int) -> float:
    """Every single-stage configuration on the whole island at ``n`` micro-batches, priced by
    the cost model, no Pareto filter: the least ``n · latency + per-iteration`` that fits."""
    island = build_islands(job.cluster, Thresholds.of(job.planner)).islands[0]
    ctx = _context(job, job.planner.features, n, 1, len(island.nodes), island)
    slc = ModelSlice.whole(job.model)
    cfg = enumerate_configs(slc, island, ctx, FeatureSet.of(job.planner.features))
    cfg = cfg.take(np.asarray(cfg.pp) == 1)
    costs = stage_costs(slc, island, job.training.seq_len, cfg, PipelineSetting(n, 1),
                        runtime=job_runtime(job))
    fits = costs.memory.total <= usable_bytes(island, job.planner.epsilon)
    return float(np.min(np.where(fits, n * costs.latency_s + costs.iteration_s, np.inf)))


def test_the_plan_overlaps_and_matches_brute_force(planned):
    job, plan = planned
    (stage,) = plan.stages
    c = stage.plan.config
    assert c.a2a_overlap and c.ep > 1 and c.pp == 1
    assert problems(plan, job) == []
    assert plan.iteration_time_s == pytest.approx(_brute(job, plan.n_micro), rel=1e-12)


def test_all_solvers_agree(planned):
    job, plan = planned
    plans = [plan_job(job, PlannerConfig(solver=k, time_limit_s=math.inf))
             for k in (SolverKind.DP, SolverKind.CPSAT, SolverKind.MILP, SolverKind.BRUTE)]
    assert all(p.solver.optimal for p in plans)
    assert {p.stages[0].plan.config for p in plans} == {plan.stages[0].plan.config}
    times = [p.iteration_time_s for p in plans]
    assert max(times) - min(times) <= 1e-9 * min(times)


def test_switched_off_by_the_constraint(tmp_path, planned):
    """``[constraints] a2a_overlap = false`` takes it out of the search: the optimum without it
    is the brute force's without it, and slower."""
    job, plan = planned
    off = _job(tmp_path, extra="[constraints]\na2a_overlap = false", name="off.toml")
    other = plan_job(off)
    assert not any(s.plan.config.a2a_overlap for s in other.stages)
    assert other.iteration_time_s > plan.iteration_time_s
    assert problems(other, off) == []
    assert any("constraints.a2a_overlap" in p for p in problems(plan, off))


def test_a_tampered_plan_is_caught(planned):
    """The validator reads the rules: the overlap under full recomputation is refused."""
    from dataclasses import replace

    from solver.spec.domain import Recompute
    job, plan = planned
    s = plan.stages[0]
    bad = replace(s.plan, config=replace(s.plan.config, recompute=Recompute.FULL))
    found = problems(replace(plan, stages=[replace(s, plan=bad)]), job)
    assert any("all-to-all overlap runs without full recomputation" in p for p in found)


def test_exports_carry_the_flag_and_read_back(planned):
    job, plan = planned
    assert "--overlap-moe-expert-parallel-comm" in megatron_args(plan)
    assert "CUDA_DEVICE_MAX_CONNECTIONS to 8" in megatron_launch(plan)
    text = flagscale_yaml(plan, "p.hostfile")
    doc = yaml.safe_load(text)
    assert doc["train"]["system"]["overlap_moe_expert_parallel_comm"] is True
    assert doc["experiment"]["envs"]["CUDA_DEVICE_MAX_CONNECTIONS"] == 8
    assert judge(doc, flagscale_hostfile(plan)) == []
    assert read_back(doc, flagscale_hostfile(plan)).a2a_overlap


def test_the_checker_restates_megatrons_rules(planned):
    """FlagScale's config judge refuses the overlap where ``TransformerConfig.__post_init__``
    asserts: full recomputation, a pipeline without virtual stages."""
    job, plan = planned
    doc = yaml.safe_load(flagscale_yaml(plan, "p.hostfile"))
    system = doc["train"]["system"]
    system["recompute"] = {"recompute_granularity": "full", "recompute_method": "uniform",
                           "recompute_num_layers": 1}
    system["pipeline_model_parallel_size"] = 2
    found = judge(doc, None)
    assert any("without full recomputation" in p for p in found)
    assert any("needs virtual ones" in p for p in found)


def test_plan_json_round_trip(planned):
    """``tangram plan --json`` states it, and a replan reads it back (older plans without the
    key read as off)."""
    job, plan = planned
    payload = plan_json(plan, [island_json(i) for i in plan.islands.islands])
    assert payload["stages"][0]["a2a_overlap"] is True
    back = previous_plan(json.loads(json.dumps(payload)), job, "p.json")
    assert back.stages[0].plan.config == plan.stages[0].plan.config
    del payload["stages"][0]["a2a_overlap"]  # read as off: the same stages, slower
    with pytest.raises(InputError, match="iteration_time_s: the plan says 3.51"):
        previous_plan(payload, job, "p.json")


def test_estimate_refuses_it_where_megatron_does(tmp_path, capsys):
    """One line, exit status 2: with pipeline stages but no virtual ones, without expert
    parallelism, under DeepSpeed."""
    base = ('description = "x"\nmodel = "mixtral-8x22b"\ngpu = "H100-SXM-80GB"\ngpus = 16\n'
            '%s[training]\nglobal_batch = 64\nseq_len = 4096\n[parallel]\ntp = 1\n'
            'zero = 1\na2a_overlap = true\n')
    for top, layout, why in (
            ("", "pp = 2\ndp = 8\nep = 8\n", "needs virtual ones"),
            ("", "pp = 1\ndp = 16\nep = 1\n", "needs expert parallelism"),
            ('framework = "deepspeed"\n', "pp = 1\ndp = 16\nep = 8\n",
             "deepspeed does not overlap")):
        path = tmp_path / "e.toml"
        path.write_text(base % top + layout)
        assert main(["estimate", str(path)]) == 2
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and err.startswith(f"error: {path}: ") and why in err, err


#: Mixtral 8x22B on 128 H100 under Megatron-Core at TP 2, EP 8: pipelined, so the overlap
#: runs interleaved (Megatron-Core's combined 1F1B for virtual stages).
INTERLEAVED = """model = "mixtral-8x22b"
cluster = "h100-128"
[training]
global_batch = 512
seq_len = 4096
[planner]
framework = "megatron-core"
pruning = "safe"
[constraints]
tp = [2]
ep = [8]
%s
"""


@pytest.fixture(scope="module")
def interleaved(tmp_path_factory):
    path = tmp_path_factory.mktemp("a2a-vp") / "vp.toml"
    path.write_text(INTERLEAVED % "")
    job = load_job(path)
    return job, plan_job(job)


def test_pipelined_plans_overlap_interleaved(interleaved):
    """The plan interleaves with the overlap on, passes the validator, and is the interleaved
    family's optimum by brute force (every depth, chunk count and configuration,
    ``tests/planner/test_interleaved.py``)."""
    from tests.planner.test_interleaved import _brute
    job, plan = interleaved
    (stage,) = plan.stages
    c = stage.plan.config
    assert c.a2a_overlap and c.pp > 1 and plan.virtual_stages > 1
    assert problems(plan, job) == []
    assert plan.iteration_time_s == pytest.approx(_brute(job, plan.n_micro), rel=1e-12)


def test_interleaved_overlap_beats_none(interleaved, tmp_path):
    job, plan = interleaved
    path = tmp_path / "off.toml"
    path.write_text(INTERLEAVED % "a2a_overlap = false")
    off = load_job(path)
    other = plan_job(off)
    assert not other.stages[0].plan.config.a2a_overlap
    assert other.iteration_time_s > plan.iteration_time_s


def test_interleaved_exports(interleaved):
    job, plan = interleaved
    args = megatron_args(plan)
    assert "--overlap-moe-expert-parallel-comm" in args
    assert any(a.startswith("--num-layers-per-virtual-pipeline-stage") for a in args)
    doc = yaml.safe_load(flagscale_yaml(plan, "p.hostfile"))
    assert judge(doc, flagscale_hostfile(plan)) == []
    back = read_back(doc, flagscale_hostfile(plan))
    assert back.a2a_overlap and back.virtual_stages == plan.virtual_stages


def test_independent_memory_count_equals_the_model(planned, interleaved):
    """The validator's own memory count (one layer's activations more with the overlap) equals
    the vectorized model's, without pipelining and interleaved."""
    from solver.cost.efficiency import DEFAULT_CALIBRATION
    from solver.planner.check.memory_check import plan_memory_gb
    from solver.planner.check.validate import _flash
    for job, plan in (planned, interleaved):
        got = plan_memory_gb(plan, DEFAULT_CALIBRATION.moe_capacity_factor,
                             [_flash(s, job) for s in plan.stages])
        assert got == pytest.approx([s.plan.memory_gb for s in plan.stages], rel=1e-9)
