"""The ``tangram plan --json`` object (a public contract): every key, every value traced to the
plan it prints, for one pipeline and for replicas."""

from __future__ import annotations

import math

import pytest

from solver.planner.plan import _r, plan_json
from solver.planner.replica.replica_plan import replicated_json
from solver.planner.replica.replicas import ReplicaOptions, plan_replicas
from solver.planner.stages.search import plan_job
from solver.spec.loaders import load_job
from tests.planner.test_planner import write_job
from tests.planner.test_replicas import _write

TOP = {"pipeline_s", "per_iteration_s", "objective", "islands", "stages", "solver", "view",
       "framework", "schedule", "virtual_stages", "idle_nodes", "warnings"}
STAGE = {"island", "gpu", "gpus", "nodes", "layers", "tp", "cp", "ep", "pp", "dp", "zero",
         "recompute", "recompute_layers", "expert_tp", "offload", "micro_batch", "virtual_stages",
         "precision", "latency_s", "memory_gb", "a2a_overlap"}


def test_rounding_keeps_nine_significant_digits():
    assert _r(1.23456789012) == 1.23456789
    assert _r(123456.789, 4) == 123500.0
    assert _r(math.inf) == math.inf


@pytest.fixture(scope="module")
def plan(tmp_path_factory):
    path = write_job(tmp_path_factory.mktemp("json"), ["H100-SXM-80GB", "A100-SXM-80GB"])
    return plan_job(load_job(path))


def test_single_pipeline_json_traces_to_the_plan(plan):
    out = plan_json(plan, [{"name": "x"}])
    assert set(out) == TOP and out["islands"] == [{"name": "x"}]
    assert out["pipeline_s"] == _r(plan.pipeline_time_s)
    assert out["per_iteration_s"] == _r(plan.iteration_extra_s)
    assert out["objective"] == {"iteration_time_s": _r(plan.iteration_time_s),
                                "tokens_per_s": _r(plan.tokens_per_s),
                                "bubble_ratio": _r(plan.bubble_ratio), "n_micro": plan.n_micro}
    assert out["view"] == plan.view and out["framework"] == plan.job.planner.framework.value
    assert out["schedule"] == ("interleaved" if plan.virtual_stages > 1 else "1f1b")
    assert out["virtual_stages"] == plan.virtual_stages
    assert out["idle_nodes"] == [{"node": n, "reason": w} for n, w in plan.idle]
    assert out["solver"] == {"name": plan.solver.name, "optimal": True,
                             "time_s": _r(plan.solver.time_s, 4),
                             "parallelizer_calls": plan.solver.parallelizer_calls,
                             "heuristic_pruning": True}  # the paper's rules, the default
    for got, s in zip(out["stages"], plan.stages, strict=True):
        c = s.plan.config
        assert set(got) == STAGE
        assert got == {
            "island": s.island.name, "gpu": s.island.gpu.name, "gpus": s.gpus,
            "nodes": s.node_ids, "layers": [s.start, s.end], "tp": c.tp, "cp": c.cp, "ep": c.ep,
            "pp": c.pp, "dp": c.dp, "zero": c.zero, "recompute": c.recompute.value,
            "recompute_layers": c.recompute_layers, "offload": c.offload,
            "a2a_overlap": c.a2a_overlap,
            # None in the configuration: expert-TP equal to TP, which the JSON states.
            "expert_tp": c.tp if c.expert_tp is None else c.expert_tp,
            "micro_batch": c.micro_batch, "virtual_stages": plan.virtual_stages,
            "precision": s.island.gpu.runs_in(plan.job.training.precision),
            "latency_s": _r(s.plan.latency_s), "memory_gb": _r(s.plan.memory_gb)}


def test_unproven_plan_reports_bound_and_gap(plan):
    from dataclasses import replace
    from solver.planner.plan import SolverInfo
    out = plan_json(replace(plan, solver=SolverInfo("cpsat", False, 1.0, 3, 2.123456789123,
                                                    0.25)), [])
    assert out["solver"]["bound"] == 2.12345679 and out["solver"]["gap"] == 0.25
    none = plan_json(replace(plan, solver=SolverInfo("cpsat", False, 1.0, 3)), [])
    assert none["solver"]["bound"] is None and none["solver"]["gap"] is None


def test_replicated_json_traces_to_the_replicas(tmp_path):
    job = load_job(_write(tmp_path))
    # No wall-clock deadline: "optimal" below never depends on the machine's load.
    rp = plan_replicas(job, plan_job(job), options=ReplicaOptions(share_steps=8,
                                                                  time_limit_s=math.inf))
    out = replicated_json(rp, [])
    assert TOP <= set(out)
    assert out["allreduce_s"] == _r(rp.allreduce_s)
    assert out["objective"]["iteration_time_s"] == _r(rp.iteration_time_s)
    assert out["objective"]["tokens_per_s"] == _r(rp.tokens_per_s)
    slowest = max(rp.replicas, key=lambda r: r.plan.iteration_time_s).plan
    assert out["pipeline_s"] == _r(slowest.pipeline_time_s)
    assert out["per_iteration_s"] == _r(rp.iteration_time_s - slowest.pipeline_time_s)
    assert out["replicas"] == [
        {"islands": [i.name for i in r.islands], "share": r.share, "n_micro": r.plan.n_micro,
         "iteration_time_s": _r(r.plan.iteration_time_s), "pipeline_s": _r(r.plan.pipeline_time_s),
         "stages": len(r.plan.stages)} for r in rp.replicas]
    assert [s["replica"] for s in out["stages"]] == [
        k for k, r in enumerate(rp.replicas) for _ in r.plan.stages]
    assert out["exchange"] == rp.exchange and out["runtime"] == rp.runtime.json()
    assert out["replica_search"] == {
        "searched": True, "optimal": True, "time_s": _r(rp.solver.time_s, 4), "heuristic_pruning": True,
        "bound": None, "gap": None, "share_unit": rp.share_unit,
        "partitions": {"settled": rp.partitions[0], "enumerated": rp.partitions[1]}}
    assert out["idle_nodes"] == [{"node": n, "reason": w} for n, w in rp.idle]


def test_json_of_interleaved_fp8_idle_and_unrounded_gap(plan):
    from dataclasses import replace
    from solver.planner.plan import SolverInfo
    from solver.spec.domain import Precision
    fp8 = replace(plan.job, training=replace(plan.job.training, precision=Precision.FP8))
    odd = replace(plan, job=fp8, virtual_stages=2, idle=(("n9", "no layout fits"),),
                  solver=SolverInfo("cpsat", False, 1.0, 3, None, 0.123456789123))
    out = plan_json(odd, [])
    assert out["schedule"] == "interleaved" and out["virtual_stages"] == 2
    assert out["idle_nodes"] == [{"node": "n9", "reason": "no layout fits"}]
    assert out["solver"]["gap"] == 0.123456789 and out["solver"]["bound"] is None
    h100 = [s for s in out["stages"] if s["gpu"] == "H100-SXM-80GB"]
    assert h100 and all(s["precision"] == "fp8" for s in h100)
    assert plan_json(replace(plan, virtual_stages=1), [])["schedule"] == "1f1b"


def test_replicated_json_passes_islands_idle_and_search_status(tmp_path):
    from dataclasses import replace
    from solver.planner.plan import SolverInfo
    from solver.planner.stages.search import job_islands
    job = load_job(_write(tmp_path, gbits=3200.0, extra=""))  # fast enough for replicas
    rp = plan_replicas(job, plan_job(job), options=ReplicaOptions(share_steps=8))
    assert len(rp.replicas) > 1
    spare = job_islands(job).islands[0]
    extra = replace(spare, name="spare")
    odd = replace(rp, islands=rp.islands + (extra,), partitions=(3, 7),
                  solver=SolverInfo("replicas", False, 2.0, 5, 1.23456789012, 0.0123456789012))
    out = replicated_json(odd, [{"name": "payload"}])
    assert out["islands"] == [{"name": "payload"}]
    assert {"node": extra.nodes[0].node_id, "reason": "its island is in no replica"} in \
        out["idle_nodes"]
    assert out["replica_search"]["bound"] == 1.23456789 and \
        out["replica_search"]["gap"] == 0.0123456789
    assert out["replica_search"]["partitions"] == {"settled": 3, "enumerated": 7}
    slowest = max(rp.replicas, key=lambda r: r.plan.iteration_time_s).plan
    assert out["objective"]["bubble_ratio"] == _r(slowest.bubble_ratio)
    assert out["objective"]["n_micro"] == slowest.n_micro
    for s in out["stages"]:
        assert STAGE <= set(s)
