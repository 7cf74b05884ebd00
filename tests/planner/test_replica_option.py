"""Pipeline replicas are a research option: ``[planner] replicas = true`` (or ``--replicas``)
turns the search on, the default plan is one pipeline with the replica keys of ``--json`` kept,
and a plan of replicas says which runtime could train it (and ``--emit`` refuses it)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from solver.cli.main import main
from solver.planner.replica.replica_runtime import replicas_runtime, shard_layout
from solver.planner.replica.replicas import replica_search_runs, why_no_replica_search
from solver.planner.stages.search import plan_job
from solver.spec.loaders import load_job
from tests.planner.test_replicas import REPLICAS, THREE, _write


@pytest.fixture(scope="module")
def three(tmp_path_factory):
    """MINI3 where three replicas win when asked for (tests/planner/test_replicas.py)."""
    tmp = tmp_path_factory.mktemp("option")
    return _write(tmp, **THREE), _write(tmp, **THREE, extra=REPLICAS, name="asked.toml")


def test_the_option_is_off_by_default_and_read_from_the_job(three):
    off, on = (load_job(p) for p in three)
    assert off.planner.replicas is False and on.planner.replicas is True
    assert not replica_search_runs(off) and replica_search_runs(on)
    assert "[planner] replicas = false" in why_no_replica_search(off)
    assert why_no_replica_search(on) == ""
    capped = replace(on, constraints=replace(on.constraints, max_replicas=1))
    assert not replica_search_runs(capped)  # max_replicas = 1 keeps its meaning
    assert "max_replicas = 1" in why_no_replica_search(capped)


def test_a_bad_value_is_one_line_and_status_2(tmp_path, capsys):
    path = _write(tmp_path, extra='\n[planner]\nreplicas = "yes"\n')
    assert main(["plan", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error: ") and "replicas" in err


def test_the_default_plan_is_one_pipeline_with_the_replica_keys(three, capsys):
    off, _ = three
    assert main(["plan", str(off), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    job = load_job(off)
    single = plan_job(job)
    # The one-pipeline values of every key a plan of replicas has.
    assert [r["share"] for r in out["replicas"]] == [job.training.global_batch]
    assert out["allreduce_s"] == 0.0 and out["exchange"] == "none"
    assert out["runtime"]["runs_on"] == ["flagscale"]
    assert out["replica_search"]["searched"] is False
    assert out["replica_search"]["partitions"] == {"settled": 0, "enumerated": 0}
    assert {s["replica"] for s in out["stages"]} == {0}
    assert out["objective"]["iteration_time_s"] == pytest.approx(single.iteration_time_s,
                                                                 rel=1e-8)


def test_asked_for_the_replicas_say_no_runtime_trains_them(three, capsys):
    off, on = three
    for argv in (["plan", str(on)], ["plan", str(off), "--replicas"]):
        assert main(argv + ["--json"]) == 0
        out = json.loads(capsys.readouterr().out)
        assert len(out["replicas"]) == 3 and out["runtime"]["runs_on"] == []
        assert out["exchange"] == "full-gradient all-reduce"
        assert out["replica_search"]["searched"] is True
        assert out["idle_nodes"] == []  # each replica runs its one node; none is listed twice
        why = out["runtime"]["why"]
        assert "different gradient shards" in why and "weighted" in why
        assert "flagscale/train/arguments.py" in why  # the runtime's own rule, cited
    assert main(["plan", str(on)]) == 0
    text = capsys.readouterr().out
    assert "runtime: none (no supported runtime trains it" in text
    assert "exchange across replicas: full-gradient all-reduce" in text


def test_emit_of_replicas_no_runtime_trains_is_one_line_and_status_3(three, capsys):
    _, on = three
    for target in ("flagscale", "megatron"):
        assert main(["plan", str(on), "--emit", target]) == 3
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and err.startswith(f"cannot export to {target}: ")
        assert "no supported runtime trains it" in err


def test_runtime_of_identical_replicas_with_equal_shares(three):
    # One plan twice: the same stages, layouts, nodes and GPU kinds: data parallelism of one
    # pipeline, which FlagScale runs (every mesh's dp doubled).
    job = load_job(three[0])
    plan = plan_job(job)
    even = replicas_runtime(job, [(48, plan), (48, plan)])
    assert even.runs_on[0] == "flagscale" and "dp x 2" in even.why
    kinds = {n.gpu.name for s in plan.stages for n in s.nodes or s.island.nodes}
    # Megatron-LM only where the pipeline is one layout on one GPU kind: not across kinds.
    assert len(kinds) > 1 and even.runs_on == ("flagscale",)
    uneven = replicas_runtime(job, [(64, plan), (32, plan)])
    assert uneven.runs_on == () and "uneven shares [64, 32]" in uneven.why
    assert "different gradient shards" not in uneven.why  # the same shards
    assert "gradient_scaling_factor" in uneven.why
    one = replicas_runtime(job, [(96, plan)])
    assert one.runs_on == (job.planner.framework.value,)


def test_shard_layout_tells_stages_and_layouts_apart(three):
    job = load_job(three[0])
    plan = plan_job(job)
    assert shard_layout(plan) == shard_layout(replace(plan))
    first = plan.stages[0]
    wider = replace(first, plan=replace(first.plan, config=replace(
        first.plan.config, tp=first.plan.config.tp * 2, dp=max(1, first.plan.config.dp // 2))))
    assert shard_layout(replace(plan, stages=(wider,) + plan.stages[1:])) != shard_layout(plan)
    moved = replace(first, end=first.end - 1) if first.end - first.start > 1 else \
        replace(first, end=first.end + 1)
    assert shard_layout(replace(plan, stages=(moved,) + plan.stages[1:])) != shard_layout(plan)
