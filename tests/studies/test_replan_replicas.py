"""Re-planning plans of several pipeline replicas: the previous plan read back and validated,
the result equal to a fresh ``tangram plan`` (single pipeline, then the replica search) of the
changed cluster, and tampered plan files refused with a one-line error."""

from __future__ import annotations

import json

import pytest

from solver.cli.main import main
from solver.cli.report import island_json
from solver.cost.parallelizer import AnalyticParallelizer
from solver.planner.stages.plancache import CachingParallelizer, MemoryStore
from solver.planner.plan import plan_json
from solver.planner.replica.replica_plan import ReplicatedPlan, replicated_json
from solver.planner.replica.replicas import ReplicaOptions, plan_replicas
from solver.spec.errors import InputError
from solver.spec.loaders import load_job
from solver.studies.pareto import plan_with_targets
from solver.studies.previous import previous_plan, read_previous
from solver.studies.replan import ClusterChange, replan

# Llama 2 7B on one H200, two H100 and one A100 nodes: with a fast inter-island network the
# plan is three replicas (checked below), and after losing an H100 node it is replicas too. The
# replica search is asked for; their layouts differ, so the exchange is the full-gradient
# all-reduce over one link per replica, hence the link of 8000 Gb/s.
JOB = """model = "llama2-7b"
[planner]
replicas = true
[cluster]
name = "mini4"
inter_island_gbits = 8000.0
[[cluster.nodes]]
gpu = "H200-SXM-141GB"
count = 1
name = "h200"
[[cluster.nodes]]
gpu = "H100-SXM-80GB"
count = {h100}
name = "h100"
[[cluster.nodes]]
gpu = "A100-SXM-80GB"
count = 1
name = "a100"
[training]
global_batch = 64
seq_len = 2048
n_micro = 4
"""
ONE = ReplicaOptions(workers=1)


def _job(tmp_path, h100=2, name="job.toml"):
    path = tmp_path / name
    path.write_text(JOB.format(h100=h100))
    return path


def _fresh(job):
    """What ``tangram plan`` gives: the single pipeline, then the replica search over it."""
    single = plan_with_targets(job)
    return plan_replicas(job, single, options=ONE)


def _layout(rp):
    """Per replica: islands, share and every stage's placement and configuration."""
    return [([i.name for i in r.islands], r.share,
             [(s.island.name, s.node_ids, s.start, s.end, s.plan.config) for s in r.plan.stages])
            for r in rp.replicas]


@pytest.fixture(scope="module")
def planned(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("replicas")
    path = _job(tmp)
    job = load_job(path)
    rp = _fresh(job)
    payload = json.loads(json.dumps(replicated_json(rp, [island_json(i) for i in rp.islands])))
    return tmp, path, job, rp, payload


def test_the_previous_plan_has_three_replicas(planned):
    *_, rp, payload = planned
    assert len(rp.replicas) == 3 and len(payload["replicas"]) == 3


def test_a_replicated_plan_is_read_back_exactly(planned):
    _, _, job, rp, payload = planned
    back = read_previous(payload, job, "plan.json")
    assert isinstance(back, ReplicatedPlan)
    assert back.shares == rp.shares and _layout(back) == _layout(rp)
    assert back.iteration_time_s == pytest.approx(rp.iteration_time_s, rel=1e-9)
    assert back.allreduce_s == rp.allreduce_s
    with pytest.raises(InputError, match="replicas: the plan has 3 pipeline replicas"):
        previous_plan(payload, job, "plan.json")  # the single-pipeline reader says why not


def test_replan_after_a_failure_equals_a_fresh_plan(planned):
    tmp, _, job, rp, payload = planned
    r = replan(job, payload, ClusterChange(("h100-1",)),
               CachingParallelizer(AnalyticParallelizer(), MemoryStore()), options=ONE)
    fresh = _fresh(load_job(_job(tmp, h100=1, name="changed.toml")))
    assert len(fresh.replicas) > 1  # the case this test is about: the new plan is replicas too
    assert r.plan is r.replicas
    assert r.plan.iteration_time_s == fresh.iteration_time_s
    assert _layout(r.plan) == _layout(fresh)
    assert r.previous.iteration_time_s == pytest.approx(rp.iteration_time_s, rel=1e-9)
    assert r.change == pytest.approx(fresh.tokens_per_s / rp.tokens_per_s - 1)
    assert r.replica_calls > 0


def test_replan_without_the_search_is_the_single_pipeline(tmp_path, planned):
    _, _, job, _, payload = planned
    path = tmp_path / "one.toml"
    path.write_text(JOB.format(h100=2) + "[constraints]\nmax_replicas = 1\n")
    one = load_job(path)
    single = plan_with_targets(one)
    r = replan(one, plan_json(single, [island_json(i) for i in single.islands.islands]),
               ClusterChange(("a100-0",)), CachingParallelizer(AnalyticParallelizer(),
                                                               MemoryStore()))
    assert r.replicas is None and r.plan is r.single and r.replica_calls == 0
    with pytest.raises(InputError, match="exceed constraints.max_replicas 1"):
        read_previous(payload, one, "plan.json")  # two replicas do not fit this job


def test_cli_replan_of_replicas(planned, capsys):
    tmp, path, _, _, payload = planned
    plan = tmp / "plan.json"
    plan.write_text(json.dumps(payload))
    argv = ["replan", str(plan), "--job", str(path), "--fail", "h100-1",
            "--cache", str(tmp / "c"), "--workers", "1"]
    assert main(argv + ["--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["previous_pipelines"] == 3 and out["pipelines"] == len(out["plan"]["replicas"])
    assert out["replica_search_calls"] > 0
    assert 64 * 2048 / out["plan"]["objective"]["iteration_time_s"] == pytest.approx(
        out["tokens_per_s"], rel=1e-6)
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert f"3 -> {out['pipelines']} pipeline replicas" in text and "replica search" in text


def _move_stage(d):
    """The first stage of replica 0 claimed by replica 1 (every replica here is one stage:
    replica 0 is left with none)."""
    d["stages"][0]["replica"] = 1


def _swap_stages(d):
    """Replica 0's stage and replica 1's swapped: each has a stage on an island that is not its
    own (unknown to the job of its islands)."""
    first = {}
    for s in d["stages"]:
        first.setdefault(s["replica"], s)
    first[0]["replica"], first[1]["replica"] = 1, 0


@pytest.mark.parametrize("edit, needle", [
    (lambda d: d["replicas"][0].update(islands=["nowhere"]), "replicas[0].islands"),
    (lambda d: d["stages"][0].update(replica=7), "stages[0].replica"),
    (lambda d: d["stages"][0].pop("replica"), "stages[0].replica"),
    (_move_stage, "replicas[0].stages: no stage of the plan has replica = 0"),
    (_swap_stages, "island: unknown island"),
    (lambda d: d["replicas"][1].update(iteration_time_s=d["replicas"][1]["iteration_time_s"] * 2),
     "replicas[1].iteration_time_s"),
    (lambda d: d["objective"].update(iteration_time_s=d["objective"]["iteration_time_s"] * 1.1),
     "objective.iteration_time_s"),
    (lambda d: d["replicas"][0].update(n_micro=3), "replicas[0].n_micro"),
    (lambda d: d["replica_search"].update(share_unit=7), "share unit 7"),
    (lambda d: d.update(previous_tokens_per_s=1.0), "tangram replan --json"),
])
def test_cli_refuses_a_tampered_replicated_plan(planned, edit, needle, capsys):
    tmp, path, _, _, payload = planned
    data = json.loads(json.dumps(payload))
    edit(data)
    plan = tmp / "tampered.json"
    plan.write_text(json.dumps(data))
    code = main(["replan", str(plan), "--job", str(path), "--cache", str(tmp / "c")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and needle in err and len(err.splitlines()) == 1, err
    assert err.startswith(f"error: {plan}: ")
