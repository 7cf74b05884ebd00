"""The runtimes' job-level rules in the planner: island merging, the views a plan may use, the
idle reasons, the independent validator, and the shipped jobs where each rule binds."""

from __future__ import annotations

from dataclasses import replace

import pytest

from formulations.island_merge import solve_island_merge
from solver.cost.estimating.estimate_config import load_estimate_setup
from solver.islands import Thresholds, build_islands, phase1
from solver.planner.stages.runs import runnable_views
from solver.planner.stages.search import plan_job
from solver.planner.check.validate import problems
from solver.spec.domain import ClusterSpec, NodeGroup, Precision
from solver.spec.errors import InputError
from solver.spec.loaders import INSTANCES, load_job

# Thresholds that would merge anything: only the vendor rule keeps islands apart.
LOOSE = Thresholds(tau_c=1.0, tau_m=1.0, tau_b=1.0, t_merge=1.0)


def _cluster(catalog, *kinds):
    groups = tuple(NodeGroup(catalog[k], 2, 8, catalog[k].nic_gbits, 1.0, f"g{i}")
                   for i, k in enumerate(kinds))
    return ClusterSpec("c", groups, 400.0)


def _vendors(island):
    return {n.gpu.vendor for n in island.nodes}


def test_islands_never_join_two_vendors(catalog):
    cluster = _cluster(catalog, "MI300X", "H100-SXM-80GB", "H200-SXM-141GB")
    built = build_islands(cluster, LOOSE)
    assert all(len(_vendors(i)) == 1 for i in built.islands)
    assert len(built.islands) == 2  # the NVIDIA GPUs merge, the AMD ones stay apart
    exact = solve_island_merge(phase1(cluster, LOOSE), LOOSE, work_limit=60.0)  # no clock
    comps = {c.name: c for c in phase1(cluster, LOOSE)}
    for group in exact.groups:
        assert len({v for name in group for v in _vendors(comps[name])}) == 1
    assert exact.islands == len(built.islands)


def _job(name, **training):
    job = load_job(INSTANCES / "jobs" / f"{name}.toml")
    return replace(job, training=replace(job.training, **training)) if training else job


def test_views_are_one_vendor_and_one_precision():
    job = _job("mi300x-h100-llama3-70b")
    views = runnable_views(job, build_islands(job.cluster, Thresholds.of(job.planner)))
    assert views and all(len({n.gpu.vendor for i in v.islands for n in i.nodes}) == 1
                         for v, _ in views)
    for precision, v100 in ((Precision.BF16, False), (Precision.FP16, True)):
        job = _job("v100-a100-llama2-13b", precision=precision)
        views = runnable_views(job, build_islands(job.cluster, Thresholds.of(job.planner)))
        used = {n.gpu.name for v, _ in views for i in v.islands for n in i.nodes}
        assert ("V100-SXM2-32GB" in used) is v100


def test_a_cluster_without_the_precision_is_refused_in_one_line(catalog):
    job = _job("v100-a100-llama2-13b", precision=Precision.BF16)
    job = replace(job, cluster=_cluster(catalog, "V100-SXM2-32GB"))
    with pytest.raises(InputError, match='training.precision.*precision = "fp16"'):
        runnable_views(job, build_islands(job.cluster))


def test_mi300x_h100_plans_one_vendor_and_says_why():
    job = _job("mi300x-h100-llama3-70b")
    plan = plan_job(job)
    used = {n.gpu.vendor for s in plan.stages for n in (s.nodes or s.island.nodes)}
    assert len(used) == 1
    other = [n for n in job.cluster.nodes if n.gpu.vendor not in used]
    reasons = dict(plan.idle)
    assert other and all("cannot span vendors" in reasons[n.node_id] for n in other)
    from solver.planner.plan import plan_json
    warnings = plan_json(plan, [])["warnings"]
    assert any(f"{len(other)} of {len(job.cluster.nodes)} nodes" in w for w in warnings)


def test_validator_reads_the_precision_rule_itself():
    job = _job("v100-a100-llama2-13b")  # ships with precision = "fp16": V100 in the plan
    assert job.training.precision is Precision.FP16
    plan = plan_job(job)
    assert any(n.gpu.name.startswith("V100") for s in plan.stages for n in s.nodes)
    assert problems(plan, job) == []
    bf16 = replace(job, training=replace(job.training, precision=Precision.BF16))
    assert any("no BF16" in p for p in problems(replace(plan, job=bf16), bf16))


def test_estimate_runs_flagscale_interleaved_on_one_mesh(tmp_path):
    text = """model = "llama3-70b"
gpu = "H100-SXM-80GB"
gpus = 64
framework = "flagscale"
[training]
global_batch = 512
seq_len = 8192
[parallel]
tp = {tp}
pp = 4
dp = {dp}
zero = 1
recompute = "none"
schedule = "interleaved"
virtual_stages = 5
"""
    path = tmp_path / "e.toml"
    path.write_text(text.format(tp=8, dp=2))
    assert load_estimate_setup(path)[0].virtual_stages == 5
    # Qwen3-235B-A22B has 4 KV heads: TP 8 does not divide them.
    path.write_text(text.replace('model = "llama3-70b"', 'model = "qwen3-235b-a22b"')
                    .format(tp=8, dp=2))
    with pytest.raises(InputError, match="KV heads"):
        load_estimate_setup(path)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["qwen3-h100-h200", "qwen3-three-gen-512"])
def test_qwen3_jobs_plan_tp_dividing_the_kv_heads(name):
    job = _job(name)
    plan = plan_job(job)
    assert all(job.model.kv_heads % s.plan.config.tp == 0 for s in plan.stages)


def test_warnings_a_user_needs(catalog):
    from types import SimpleNamespace

    from solver.cost.runtime.frameworks import mixed_kinds_note
    from solver.planner.notices import BUBBLE_WARNING, plan_warnings
    sxm, nvl = catalog["H100-SXM-80GB"], catalog["H100-NVL-94GB"]
    assert mixed_kinds_note({sxm}) is None
    assert "H100-NVL-94GB, H100-SXM-80GB" in mixed_kinds_note({sxm, nvl})
    stage = SimpleNamespace(plan=SimpleNamespace(config=SimpleNamespace(pp=2)),
                            island=SimpleNamespace(name="i0", nodes=()))
    plan = SimpleNamespace(idle=(), bubble_ratio=BUBBLE_WARNING + 0.01, n_micro=4,
                           stages=(stage, stage), job=None)
    found = plan_warnings(plan)
    assert len(found) == 1 and "4 pipeline stages" in found[0] and "larger global batch" in found[0]
    plan.bubble_ratio = BUBBLE_WARNING  # at the threshold: no warning
    assert plan_warnings(plan) == []
