"""``framework = "megatron-core"``: one-mesh plans only (one layout, Megatron's layer split),
so the Megatron-LM export always works; exact over that family (checked by enumeration)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from solver.cli.main import main
from solver.cost.parallelizer import AnalyticParallelizer
from solver.cost.stage import ModelSlice
from solver.cost.stage import substage_layers
from solver.islands import group_island, whole_cluster
from solver.launch import megatron_args
from solver.planner.stages.interleaved import _context
from solver.planner.plan import interleaved_cycle_time
from solver.planner.stages.search import job_islands, plan_job
from solver.planner.check.validate import problems
from solver.spec.domain import Framework
from solver.spec.loaders import INSTANCES, load_job
from tests.planner.test_planner import write_job


def _core(job):
    return dataclasses.replace(job, planner=dataclasses.replace(
        job.planner, framework=Framework.MEGATRON_CORE))


def _family_optimum(job) -> float:
    """Every island of both views, node count, configuration and v the parallelizer offers,
    with Megatron's rules written out here; no cut."""
    par = AnalyticParallelizer(job.planner.features)
    best, layers, n = float("inf"), job.model.layers, job.training.n_micro
    views = {job_islands(job).islands, whole_cluster(job.cluster).islands}
    for islands in views:
        for island in islands:
            for nodes in range(1, len(island.nodes) + 1):
                for v in [1] + [v for v in range(2, layers + 1) if layers % v == 0]:
                    ctx = _context(job, job.planner.features, n, v, nodes, island)
                    for p in par.plan(ModelSlice.whole(job.model), group_island(island, nodes),
                                      ctx):
                        pp = p.config.pp
                        if v > 1 and (pp < 2 or layers % (pp * v) or n % pp):
                            continue
                        counts = substage_layers(layers, pp)
                        if v == 1 and len(set(counts[1:-1])) > 1:
                            continue
                        t = interleaved_cycle_time(p.stage_latencies, n, v) + p.iteration_s
                        best = min(best, t)
    return best


@pytest.fixture(scope="module")
def mini(tmp_path_factory):
    path = write_job(tmp_path_factory.mktemp("one-mesh"),
                     ["H100-SXM-80GB", "A100-SXM-80GB", "A100-SXM-80GB"], layers=12, n=4)
    path.write_text(path.read_text() + 'framework = "megatron-core"\n')
    return load_job(path)


def test_a_megatron_core_plan_is_one_mesh_and_exports(mini):
    plan = plan_job(mini)
    assert len(plan.stages) == 1 and problems(plan, mini) == []
    args = megatron_args(plan)  # never NotExpressible
    assert f"--pipeline-model-parallel-size {plan.stages[0].plan.config.pp}" in args
    assert plan.solver.name in ("one-mesh", "interleaved") and plan.solver.optimal
    free = plan_job(dataclasses.replace(mini, planner=dataclasses.replace(
        mini.planner, framework=Framework.FLAGSCALE)))
    assert plan.iteration_time_s >= free.iteration_time_s * (1 - 1e-9)  # a restriction


def test_the_one_mesh_search_finds_the_family_optimum(mini):
    plan = plan_job(mini)
    assert plan.iteration_time_s == pytest.approx(_family_optimum(mini), rel=1e-12)


@pytest.mark.parametrize("name", ["seed-llama3-70b", "homog-h100-llama3-70b",
                                  "mixtral-a100-h100", "v100-a100-llama2-13b"])
def test_shipped_jobs_under_megatron_core_export_to_megatron(name):
    job = _core(load_job(INSTANCES / "jobs" / f"{name}.toml"))
    plan = plan_job(job)
    assert len(plan.stages) == 1 and problems(plan, job) == []
    assert any(a.startswith("--tensor-model-parallel-size") for a in megatron_args(plan))


def test_a_whole_cluster_plan_says_so_and_why(tmp_path, capsys):
    """The worked example under Megatron-Core runs best as one mesh over all 24 nodes at the
    A100's pace; the plan says that it treats the cluster as its weakest GPU, and why, and
    leaves no node idle."""
    src = (INSTANCES / "jobs" / "seed-llama3-70b.toml").read_text()
    path = tmp_path / "seed-core.toml"
    path.write_text(src.replace("[planner]\n", '[planner]\nframework = "megatron-core"\n'))
    assert main(["plan", str(path)]) == 0
    out = capsys.readouterr().out
    assert "the whole cluster as one island at its weakest node's figures" in out
    assert "beats every plan over the islands" in out
    plan = plan_job(load_job(path))
    assert plan.view == "whole cluster" and not plan.idle
    assert plan.stages[0].island.gpu.name == "A100-SXM-80GB" and plan.stages[0].gpus == 192


def test_megatron_fsdp_is_reached_exactly_and_exports(tmp_path, capsys):
    """Two H100 nodes, 24 layers at 8,192 tokens: the best Megatron-Core plan shards the
    weights and gradients (ZeRO-3, Megatron-FSDP), the one-mesh search finds the family's
    optimum by enumeration, DP, CP-SAT and the MILP agree and prove it, and the export asks
    Megatron-LM for Megatron-FSDP."""
    path = write_job(tmp_path, ["H100-SXM-80GB"] * 2, layers=24, seq=8192, n=4)
    # A day's limit: the solvers' proof never depends on the clock.
    path.write_text(path.read_text() + 'framework = "megatron-core"\ntime_limit_s = 86400.0\n')
    job = load_job(path)
    plan = plan_job(job)
    assert plan.stages[0].plan.config.zero == 3 and problems(plan, job) == []
    assert plan.iteration_time_s == pytest.approx(_family_optimum(job), rel=1e-12)
    args = megatron_args(plan)
    assert "--use-megatron-fsdp" in args and "--ckpt-format fsdp_dtensor" in args
    assert main(["verify", str(path), "--json"]) == 0
    solvers = json.loads(capsys.readouterr().out)["solvers"]
    assert solvers["verdict"] == "agree" and all(x["proven"] for x in solvers["status"].values())
    assert solvers["dp"] == pytest.approx(plan.iteration_time_s, abs=1e-8)  # JSON: 8 decimals
