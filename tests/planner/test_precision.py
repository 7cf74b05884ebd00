"""FP8 per stage: GPUs with FP8 run FP8 GEMMs, the others 16-bit (FP16 on V100)."""

from __future__ import annotations

import json

from solver.cli.main import main
from solver.planner.stages.search import plan_job
from solver.spec.loaders import load_job
from tests.planner.test_planner import write_job


def _job(tmp_path, gpus, precision):
    path = write_job(tmp_path, gpus, layers=8)
    text = path.read_text().replace("n_micro = 4\n", f'n_micro = 4\nprecision = "{precision}"\n')
    path.write_text(text)
    return path


def test_fp8_runs_where_the_gpu_has_it(tmp_path, capsys):
    path = _job(tmp_path, ["H100-SXM-80GB", "A100-SXM-80GB", "V100-SXM2-32GB"], "fp8")
    assert main(["plan", str(path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    expected = {"H100-SXM-80GB": "fp8", "A100-SXM-80GB": "bf16"}
    assert out["stages"] and all(s["precision"] == expected[s["gpu"]] for s in out["stages"])
    # FP8 keeps BF16 weights, one precision per job: the V100 (no BF16) stays idle, said why.
    assert any(i["node"] == "n2-0" and "no BF16" in i["reason"] for i in out["idle_nodes"])


def test_fp8_plan_is_faster_on_hopper(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    bf16 = plan_job(load_job(_job(tmp_path / "a", ["H100-SXM-80GB"], "bf16")))
    fp8 = plan_job(load_job(_job(tmp_path / "b", ["H100-SXM-80GB"], "fp8")))
    assert fp8.iteration_time_s < bf16.iteration_time_s
