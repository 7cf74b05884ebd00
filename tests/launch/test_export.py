"""Exports: FlagScale YAML and Megatron-LM arguments, checked against the plan."""

from __future__ import annotations

import json

import pytest
import yaml

from solver.cli.main import main
from solver.launch import NotExpressible, flagscale_config, megatron_args, meshes
from solver.planner.stages.search import plan_job
from solver.spec.loaders import INSTANCES, load_job

SEED = INSTANCES / "jobs" / "seed-llama3-70b.toml"
HOMOG = INSTANCES / "jobs" / "homog-a100-llama2-13b.toml"


@pytest.fixture(scope="module")
def seed():
    job = load_job(SEED)
    return job, plan_job(job)


def test_flagscale_yaml_parses_and_matches_the_plan(seed, capsys):
    job, plan = seed
    assert main(["plan", str(SEED), "--emit", "flagscale"]) == 0
    doc = yaml.safe_load(capsys.readouterr().out)
    system, model = doc["train"]["system"], doc["train"]["model"]
    het = system["hetero"]
    assert het["enable_hetero"] is True
    flat = het["hetero_process_meshes"]
    assert len(flat) % 5 == 0
    mesh = [flat[i:i + 5] for i in range(0, len(flat), 5)]  # [tp, cp, ep, dp, pp]
    assert len(het["hetero_device_types"]) == len(mesh)
    # Meshes x GPUs: every stage's GPUs, in pipeline order, and nothing else.
    assert sum(tp * cp * dp * pp for tp, cp, ep, dp, pp in mesh) == sum(s.gpus for s in plan.stages)
    assert system["pipeline_model_parallel_size"] == sum(m[4] for m in mesh) == len(
        het["hetero_pipeline_layer_split"])
    assert het["hetero_pipeline_layer_split"] == [s.end - s.start for s in plan.stages]
    assert sum(het["hetero_pipeline_layer_split"]) == model["num_layers"] == job.model.layers
    assert het["hetero_device_types"] == [m.device for m in meshes(plan)]
    # FlagScale's batch rule: mesh i gets dp_0 * mbs / dp_i per rank, the same micro-batch count.
    micro = job.training.global_batch // plan.n_micro
    assert model["micro_batch_size"] * mesh[0][3] == micro
    assert all((mesh[0][3] * model["micro_batch_size"]) % m[3] == 0 for m in mesh)
    assert model["global_batch_size"] == job.training.global_batch
    assert system["context_parallel_size"] == 1 and all(m[1] == 1 for m in mesh)


def test_megatron_refuses_different_layouts_in_one_line(seed, capsys):
    job, plan = seed
    assert len({(s.plan.config.tp, s.plan.config.dp) for s in plan.stages}) > 1
    assert main(["plan", str(SEED), "--emit", "megatron"]) == 3
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "layouts differ" in err and "flagscale" in err
    with pytest.raises(NotExpressible):
        megatron_args(plan)


def test_megatron_args_for_a_one_layout_plan(tmp_path, capsys):
    job = load_job(HOMOG)
    plan = plan_job(job)
    assert main(["plan", str(HOMOG), "--json"]) == 0
    path = tmp_path / "plan.json"
    path.write_text(capsys.readouterr().out)
    out = tmp_path / "args.txt"
    assert main(["export", str(path), "--job", str(HOMOG), "--to", "megatron", "-o",
                 str(out)]) == 0
    flags = dict(line.rstrip(" \\").partition(" ")[::2] for line in out.read_text().splitlines()
                 if line.startswith("--"))
    c = plan.stages[0].plan.config
    assert flags["--tensor-model-parallel-size"] == str(c.tp)
    assert flags["--pipeline-model-parallel-size"] == str(c.pp)
    assert int(flags["--micro-batch-size"]) * c.dp * plan.n_micro == job.training.global_batch
    assert flags["--global-batch-size"] == str(job.training.global_batch)
    if plan.virtual_stages > 1:
        per_chunk = job.model.layers // (c.pp * plan.virtual_stages)
        assert flags["--num-layers-per-virtual-pipeline-stage"] == str(per_chunk)
    # Sequence parallelism only with TP (Megatron-LM's validate_args drops it at tp 1).
    assert ("--sequence-parallel" in flags) == (c.tp > 1) and "--bf16" in flags
    assert flags["--num-layers"] == str(job.model.layers)


def test_export_equals_emit_and_revalidates(seed, tmp_path, capsys):
    assert main(["plan", str(SEED), "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(payload))
    assert main(["export", str(path), "--job", str(SEED), "--to", "flagscale"]) == 0
    exported = capsys.readouterr().out
    assert main(["plan", str(SEED), "--emit", "flagscale"]) == 0
    assert exported == capsys.readouterr().out
    payload["stages"][0]["tp"] = 3  # a plan that is not the job's any more
    path.write_text(json.dumps(payload))
    assert main(["export", str(path), "--job", str(SEED), "--to", "flagscale"]) == 2
    assert capsys.readouterr().err.startswith("error: ")


def test_flagscale_refuses_what_hetero_mode_cannot_run(seed):
    from dataclasses import replace
    job, plan = seed
    with pytest.raises(NotExpressible, match="virtual pipeline"):
        flagscale_config(replace(plan, virtual_stages=2))


def test_flagscale_output_writes_the_hostfile_beside_and_names_it(seed, tmp_path, capsys):
    job, plan = seed
    out = tmp_path / "plan.yaml"
    assert main(["plan", str(SEED), "--emit", "flagscale", "-o", str(out)]) == 0
    doc = yaml.safe_load(out.read_text())
    hostfile = tmp_path / "plan.hostfile"
    assert doc["experiment"]["runner"]["hostfile"] == str(hostfile)
    lines = [x.split() for x in hostfile.read_text().splitlines() if not x.startswith("#")]
    assert [x[0] for x in lines] == [n for s in plan.stages for n in s.node_ids]
    assert {x[2] for x in lines} == {f"type={t}" for t in
                                     doc["train"]["system"]["hetero"]["hetero_device_types"]}
    # On stdout the YAML names <job>.hostfile and lists its lines as comments.
    assert main(["plan", str(SEED), "--emit", "flagscale"]) == 0
    text = capsys.readouterr().out
    assert f"#   {lines[0][0]} {lines[0][1]} {lines[0][2]}" in text
    assert yaml.safe_load(text)["experiment"]["runner"]["hostfile"] == f"{job.name}.hostfile"


def test_emit_with_json_prints_both_or_refuses_in_one_line(seed, tmp_path, capsys):
    job, plan = seed
    assert main(["plan", str(SEED), "--json", "--emit", "flagscale"]) == 0
    payload = json.loads(capsys.readouterr().out)
    export = payload["export"]
    assert export["framework"] == "flagscale" and "stages" in payload
    assert yaml.safe_load(export["text"])["train"]["model"]["num_layers"] == job.model.layers
    assert export["hostfile"].count("slots=") == sum(len(s.node_ids) for s in plan.stages)
    assert main(["plan", str(SEED), "--json", "--emit", "megatron"]) == 3
    captured = capsys.readouterr()
    assert captured.out == "" and "\n" not in captured.err.strip()
    assert captured.err.startswith("cannot export to megatron")


def test_nothing_is_silently_ignored(tmp_path, capsys):
    assert main(["plan", str(HOMOG), "-o", str(tmp_path / "x.yaml")]) == 2
    assert "--emit" in capsys.readouterr().err
    assert main(["plan", str(HOMOG), "--emit", "megatron", "--explain"]) == 2
    err = capsys.readouterr().err
    assert "--json" in err and "\n" not in err.strip()


@pytest.mark.slow
def test_every_shipped_job_exports_or_says_why():
    """Every shipped job's plan (fleet-8448 aside: it plans for minutes) exports to FlagScale, and
    to Megatron-LM or a one-line reason it cannot."""
    from solver.launch.flagscale import flagscale_yaml
    from solver.studies.sweep import plan_auto
    for path in sorted((INSTANCES / "jobs").glob("*.toml")):
        if path.stem == "fleet-8448-llama3-70b":
            continue
        plan = plan_auto(load_job(path))
        doc = yaml.safe_load(flagscale_yaml(plan))
        assert doc["train"]["model"]["num_layers"] == plan.job.model.layers
        try:
            args = megatron_args(plan)
            assert any(a.startswith("--tensor-model-parallel-size") for a in args)
        except NotExpressible as exc:
            assert "\n" not in str(exc) and str(exc)


def test_export_of_replicas_refuses_with_the_plans_own_verdict(seed, tmp_path, capsys):
    # A plan JSON of two replicas (``[planner] replicas = true``): no runtime export; the line
    # carries the verdict the replica search wrote (``runtime.why``), not a generic one.
    job, plan = seed
    assert main(["plan", str(SEED), "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    payload["replicas"] = [{"share": 24}, {"share": 8}]
    payload["runtime"] = {"runs_on": [], "why": "no supported runtime trains replicas of "
                                                "different layouts as one job"}
    path = tmp_path / "replicas.json"
    path.write_text(json.dumps(payload))
    assert main(["export", str(path), "--to", "flagscale", "--job", str(SEED)]) == 3
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("cannot export to flagscale: ")
    assert "2 pipeline replicas with batch shares [24, 8]" in err
    assert "replicas of different layouts as one job" in err
