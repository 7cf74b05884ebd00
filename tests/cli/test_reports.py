"""Reports that hide nothing: plain file errors, closest-name hints, half-open layer ranges,
the plan JSON's top-level times and per-stage keys."""

from __future__ import annotations

import json

import pytest

from solver.cli.main import main
from solver.spec.loaders import INSTANCES


def _err(capsys, argv) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err
    return err


def test_file_errors_in_plain_words(tmp_path, capsys):
    assert "no such file" in _err(capsys, ["plan", str(tmp_path / "missing.toml")])
    assert "is a directory" in _err(capsys, ["plan", str(tmp_path)])
    assert "Error" not in _err(capsys, ["plan", str(tmp_path)])  # no Python class names


def test_unknown_names_suggest_the_closest(tmp_path, capsys):
    path = tmp_path / "job.toml"
    path.write_text('model = "llama3-70x"\ncluster = "seed-h100-a100"\n'
                    '[training]\nglobal_batch = 8\nseq_len = 128\n')
    assert "did you mean 'llama3-70b'" in _err(capsys, ["plan", str(path)])
    path.write_text('model = "llama3-70b"\n[cluster]\nname = "c"\n[[cluster.nodes]]\n'
                    'gpu = "H100-SXM"\ncount = 1\n[training]\nglobal_batch = 8\nseq_len = 128\n')
    assert "did you mean 'H100-SXM-80GB'" in _err(capsys, ["plan", str(path)])


def test_compose_prints_half_open_ranges(capsys):
    table = INSTANCES / "tables" / "counterexample_recurrence.json"
    assert main(["compose", str(table)]) == 0
    out = capsys.readouterr().out
    assert "[0, 1)" in out and "0-0" not in out


def test_plan_json_top_level_times_add_up(capsys):
    assert main(["plan", str(INSTANCES / "jobs" / "seed-llama3-70b.toml"), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["pipeline_s"] + out["per_iteration_s"] == pytest.approx(
        out["objective"]["iteration_time_s"], rel=1e-5)
    assert all({"micro_batch", "virtual_stages", "precision", "nodes"} <= set(s)
               for s in out["stages"])
    assert "idle_nodes" in out


def test_pareto_text_counts_each_island_once(tmp_path, capsys):
    from tests.planner.test_planner import write_job
    path = write_job(tmp_path, ["H100-SXM-80GB", "A100-SXM-80GB", "L40S"], layers=8, n=4)
    assert main(["pareto", str(path), "--json"]) == 0
    fronts = json.loads(capsys.readouterr().out)
    assert main(["pareto", str(path)]) == 0
    text = capsys.readouterr().out
    for point in fronts["cost"]:
        assert point["gpus"] <= 24  # three 8-GPU nodes
        assert f"  {point['gpus']}  " in text


def test_explain_adds_up_to_the_model(capsys):
    from solver.cost.flops import model_flops_per_token
    from solver.spec.loaders import load_job
    job = load_job(INSTANCES / "jobs" / "seed-llama3-70b.toml")
    assert main(["plan", str(INSTANCES / "jobs" / "seed-llama3-70b.toml"), "--json",
                 "--explain"]) == 0
    out = json.loads(capsys.readouterr().out)
    rows = out["explain"]
    assert len(rows) == len(out["stages"])
    assert sum(r["params"] for r in rows) == pytest.approx(job.model.total_params)
    tokens = job.training.global_batch // out["objective"]["n_micro"] * job.training.seq_len
    flops = model_flops_per_token(job.model, job.training.seq_len) * tokens / 1e12
    assert sum(r["tflop_per_micro_batch"] for r in rows) == pytest.approx(flops)  # no recompute
    for r, s in zip(rows, out["stages"]):
        parts = (r["weights_gb"] + r["grads_gb"] + r["optimizer_gb"] + r["activations_gb"]
                 + r["fragmentation_gb"])
        assert parts == pytest.approx(r["total_gb"]) and r["total_gb"] == pytest.approx(
            s["memory_gb"], rel=1e-5)
    assert main(["plan", str(INSTANCES / "jobs" / "seed-llama3-70b.toml"), "--explain"]) == 0
    assert "TFLOP/micro-batch" in capsys.readouterr().out


def test_budget_search_reports_all_its_calls(tmp_path):
    from solver.cost.parallelizer import AnalyticParallelizer
    from solver.planner.stages.plancache import CachingParallelizer, MemoryStore
    from solver.spec.loaders import load_job
    from solver.studies.pareto import plan_with_targets
    from tests.planner.test_planner import write_job
    path = write_job(tmp_path, ["H100-SXM-80GB", "A100-SXM-80GB", "L40S"], layers=8, n=4)
    path.write_text(path.read_text() + "max_usd_per_hour = 40.0\n")  # under the full cluster's
    job = load_job(path)
    par = CachingParallelizer(AnalyticParallelizer(), MemoryStore())
    plan = plan_with_targets(job, parallelizer=par)
    assert plan.solver.parallelizer_calls == par.inner_calls > 0


def test_searched_n_micro_reports_every_call(tmp_path):
    """n_micro searched ("auto"): the plan counts every parallelizer call of the whole search
    (each n_micro and the interleaved family), as the parallelizer itself counts them."""
    from conftest import MINI_AUTO
    from solver.cost.parallelizer import AnalyticParallelizer
    from solver.planner.stages.plancache import CachingParallelizer, MemoryStore
    from solver.planner.stages.search import plan_job
    from solver.spec.loaders import load_job
    path = tmp_path / "auto.toml"
    path.write_text(MINI_AUTO)
    job = load_job(path)
    par = CachingParallelizer(AnalyticParallelizer(), MemoryStore())
    plan = plan_job(job, parallelizer=par)
    assert job.training.n_micro is None and plan.solver.parallelizer_calls > 0
    assert plan.solver.parallelizer_calls == par.inner_calls + par.hits
    again = plan_job(job, parallelizer=par)  # all from the cache now: the same calls
    assert again.solver.parallelizer_calls == plan.solver.parallelizer_calls


def test_bench_agree_column_says_not_proven_for_a_limit_hit():
    from types import SimpleNamespace as NS
    from solver.cli.commands.bench import _agree_cell
    from solver.studies.bench_rows import SolverStatus

    def run(value, status):
        return NS(objective_s=value, status=status)
    ok = [run(2.0, SolverStatus.OPTIMAL)] * 3
    assert _agree_cell(NS(agree=True, solvers=ok)) == "yes"
    limited = ok[:2] + [run(2.0, SolverStatus.LIMIT)]
    assert _agree_cell(NS(agree=False, solvers=limited)) == "not proven"
    wrong = ok[:2] + [run(2.5, SolverStatus.OPTIMAL)]
    assert _agree_cell(NS(agree=False, solvers=wrong)) == "NO"


def test_verify_shows_progress_on_a_terminal(tmp_path, capsys):
    import argparse
    import io

    from rich.console import Console

    from solver.cli.commands import verify
    from tests.planner.test_planner import write_job
    path = write_job(tmp_path, ["H100-SXM-80GB", "A100-SXM-80GB"], layers=4, n=4)
    screen = io.StringIO()
    console = Console(file=screen, force_terminal=True, width=100)
    args = argparse.Namespace(job=str(path), json=False, stable_json=False)
    assert verify.run(args, console=console) == 0
    assert "verify:" in screen.getvalue() and "7/7" in screen.getvalue()
    assert capsys.readouterr().err == ""  # no progress drawn on a non-terminal stderr
