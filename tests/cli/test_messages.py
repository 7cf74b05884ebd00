"""Messages that used to mislead (issue 47), each as the user meets it: the line the command
prints names what is wrong, and nothing it did not check."""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import io
import json
import shutil
import sys
import time

import pytest

from solver.cli.main import main
from solver.spec.loaders import INSTANCES, load_job
from tests.conftest import ROOT

DATA = ROOT / "tests" / "data"
SEED = str(INSTANCES / "jobs" / "seed-llama3-70b.toml")
TRAINING = "[training]\nglobal_batch = 256\nseq_len = 2048\n"


def _error(capsys, argv, code=2) -> str:
    assert main(argv) == code
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err
    return err


# -- the model of a HuggingFace config.json ------------------------------------------------


def test_config_json_beside_the_job_is_not_named_after_the_folder(tmp_path):
    """The newcomer's layout: job.toml and config.json in one folder "newcomer-job". The folder
    names the job's work, not the model; the config names no model either, so the name is its
    architecture and size (LlamaForCausalLM, Llama 3 70B's shape: 70.6 B parameters)."""
    folder = tmp_path / "newcomer-job"
    folder.mkdir()
    shutil.copy(DATA / "llama-config.json", folder / "config.json")
    (folder / "job.toml").write_text(f'model = "config.json"\ncluster = "seed-h100-a100"\n'
                                     f"{TRAINING}")
    assert load_job(folder / "job.toml").model.name == "llama-70.6b"


def test_config_json_names_the_model_by_hub_id_or_own_folder(tmp_path):
    config = json.loads((DATA / "llama-config.json").read_text())
    own = tmp_path / "models" / "Meta-Llama-3-70B"
    own.mkdir(parents=True)
    (own / "config.json").write_text(json.dumps(config))
    hub = tmp_path / "hub"
    hub.mkdir()
    (hub / "config.json").write_text(json.dumps({**config,
                                                 "_name_or_path": "meta-llama/Llama-3.3-70B"}))
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    for ref, name in (("../models/Meta-Llama-3-70B/config.json", "Meta-Llama-3-70B"),
                      ("../hub/config.json", "Llama-3.3-70B")):
        path = jobs / "job.toml"
        path.write_text(f'model = "{ref}"\ncluster = "seed-h100-a100"\n{TRAINING}')
        assert load_job(path).model.name == name


# -- typos, missing files ------------------------------------------------------------------


def test_a_typo_of_a_required_key_is_named_as_the_typo(tmp_path, capsys):
    path = tmp_path / "job.toml"
    path.write_text('model = "llama3-8b"\ncluster = "seed-h100-a100"\n[training]\n'
                    "global_bacth = 256\nseq_len = 2048\n")
    assert _error(capsys, ["plan", str(path)]) == (
        f"error: {path}: training.global_bacth: unknown key global_bacth "
        "(did you mean global_batch?)")


def test_a_missing_key_beside_a_real_one_is_not_called_a_typo(tmp_path, capsys):
    """``fp16_tflops`` is a real key two letters away from the missing ``bf16_tflops``."""
    path = tmp_path / "cluster.toml"
    path.write_text('[[gpus]]\nname = "X"\nfp16_tflops = 100.0\nhbm_gb = 10.0\n'
                    'hbm_bw_gbs = 100.0\nnvlink_gbs = 0.0\nnic_gbits = 100.0\ntdp_w = 100.0\n'
                    '[[nodes]]\ngpu = "X"\ncount = 1\n')
    assert _error(capsys, ["islands", str(path)]) == (
        f"error: {path}: gpus[0].bf16_tflops: missing required key")


def test_a_typo_is_one_slip_from_the_key():
    from solver.spec.fields import is_typo
    assert is_typo("global_bacth", "global_batch")  # two neighbours swapped
    assert is_typo("seqlen", "seq_len") and is_typo("seq_lenn", "seq_len")  # one dropped, added
    assert not is_typo("fp16_tflops", "bf16_tflops")  # two letters changed: a real key
    assert not is_typo("pp", "tp")  # too short to tell a slip from another key


def test_an_unknown_key_names_the_closest_allowed_one(tmp_path, capsys):
    path = tmp_path / "job.toml"
    path.write_text(f'model = "llama3-8b"\nclustr = "seed-h100-a100"\n{TRAINING}')
    assert _error(capsys, ["plan", str(path)]).endswith(
        "clustr: unknown key clustr (did you mean cluster?)")


def test_a_model_file_that_does_not_exist_is_no_such_file(tmp_path, capsys):
    path = tmp_path / "job.toml"
    path.write_text(f'model = "missing.json"\ncluster = "seed-h100-a100"\n{TRAINING}')
    err = _error(capsys, ["plan", str(path)])
    assert err.startswith(f"error: {path}: model: no such file: {tmp_path / 'missing.json'}")
    assert "unknown model" not in err


# -- sweep's range ---------------------------------------------------------------------------


def test_sweep_range_from_zero_says_n_micro_starts_at_one(capsys):
    err = _error(capsys, ["sweep", SEED, "--n-micro", "0..5"])
    assert "at least 1" in err and "divides" not in err


def test_sweep_range_keeps_the_divisors():
    from solver.cli.commands.sweep import parse_n_micro
    job = load_job(SEED)  # global batch 512 = 2^9: of 1..6, the divisors are 1, 2 and 4
    assert parse_n_micro("1..6", job) == [1, 2, 4]
    with pytest.raises(Exception, match="empty range"):
        parse_n_micro("5..2", job)


# -- [constraints] tp ------------------------------------------------------------------------


TP_JOB = """
[model]
name = "qwen-like"
layers = 4
hidden = 3584
ffn = 18944
heads = 28
kv_heads = 4
vocab = 32000

[training]
global_batch = 16
seq_len = 1024
n_micro = 4

[cluster]
name = "two"
[[cluster.nodes]]
gpu = "H100-SXM-80GB"
count = 1
[[cluster.nodes]]
gpu = "A100-SXM-80GB"
count = 1

[constraints]
"""


def test_tp_constraint_that_splits_no_head_names_itself_and_the_heads(tmp_path, capsys):
    """28 heads and 4 KV heads: of the powers of two up to a node's 8 GPUs, TP 1, 2 and 4
    divide both; 3 divides neither the 4 KV heads nor is it searched."""
    path = tmp_path / "job.toml"
    path.write_text(TP_JOB + "tp = [3]\n")
    err = _error(capsys, ["plan", str(path)], code=3)
    assert err.startswith("no plan: constraints.tp [3]: ")
    assert "28 attention heads and 4 KV heads" in err and err.endswith("do here: 1, 2, 4")


def test_tp_constraint_with_a_usable_degree_is_not_blamed(tmp_path):
    from solver.planner.stages.reasons import tp_constraint_problem
    path = tmp_path / "job.toml"
    path.write_text(TP_JOB + "tp = [3, 4]\n")
    job = load_job(path)
    from solver.islands import build_islands
    assert tp_constraint_problem(job, build_islands(job.cluster).islands) is None


# -- the proof line, bench, verify -----------------------------------------------------------


def test_proof_line_names_the_pruning_actually_used():
    from solver.planner.plan import SolverInfo
    paper = SolverInfo("dp", True, 0.1, 10, heuristic_pruning=True).proof
    assert 'pruning = "paper"' in paper and "heuristic rules 2 and 4" in paper
    assert '"safe": over all plans' not in paper  # read as if safe pruning had been used
    assert SolverInfo("dp", True, 0.1, 10).proof == "proven optimal"


def test_bench_footer_prints_values_not_python_names(capsys):
    from solver.cli.commands.bench import _emit
    from solver.studies.bench import BenchOptions
    _emit([], BenchOptions(), argparse.Namespace(json=False), interrupted=False)
    out = capsys.readouterr().out
    assert "Rule." not in out and "rules: none" in out


def test_verify_says_what_a_stopped_solver_proved():
    from solver.cli.commands.verify import _solver_txt
    nothing = _solver_txt("cpsat", 2.5, {"proven": False, "bound_s": None, "gap": None})
    assert " -" not in nothing and "no bound proven" in nothing and "2.500000" in nothing
    some = _solver_txt("milp", 2.5, {"proven": False, "bound_s": 2.4, "gap": 0.04})
    assert "bound 2.400000 s, gap 4.0%" in some
    assert _solver_txt("dp", 2.5, {"proven": True, "bound_s": None, "gap": None}) == \
        "dp 2.500000"


def test_bench_says_what_a_stopped_solver_proved():
    from solver.cli.commands.bench import solver_cell
    from solver.studies.bench_rows import SolverRun, SolverStatus
    bare = solver_cell(SolverRun("cpsat", SolverStatus.LIMIT, 2.5, 10.0))
    assert "?" not in bare and "no bound proven" in bare
    assert "bound 2.400000, gap 4.00%" in solver_cell(
        SolverRun("milp", SolverStatus.LIMIT, 2.5, 10.0, bound=2.4, gap=0.04))


# -- --plot before planning ------------------------------------------------------------------


def _no_planning(monkeypatch):
    plan_cmd = importlib.import_module("solver.cli.commands.plan")

    def refuse(args):
        raise AssertionError("planned before checking --plot")
    monkeypatch.setattr(plan_cmd, "run", refuse)


def test_plot_without_matplotlib_fails_before_planning(tmp_path, monkeypatch, capsys):
    _no_planning(monkeypatch)
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "matplotlib" else real(name, *a))
    err = _error(capsys, ["plan", SEED, "--plot", str(tmp_path / "g.png")])
    assert err == "error: <cli>: --plot: needs matplotlib (pip install 'tangram-planner[plot]')"


def test_plot_into_a_missing_folder_fails_before_planning(tmp_path, monkeypatch, capsys):
    pytest.importorskip("matplotlib")
    _no_planning(monkeypatch)
    err = _error(capsys, ["plan", SEED, "--plot", str(tmp_path / "nowhere" / "g.png")])
    assert err.endswith("does not exist")


# -- progress on a terminal -------------------------------------------------------------------


class _Terminal(io.StringIO):
    """A stream that says it is a terminal."""

    def isatty(self) -> bool:
        return True


def _wait_shown(progress, limit_s=30.0) -> bool:
    """Whether the indicator appears (its timer thread draws it; a loaded machine may take a
    while, so the wait is long and ends as soon as it shows)."""
    for _ in range(int(limit_s / 0.01)):
        if progress.shown:
            break
        time.sleep(0.01)
    return progress.shown


def test_progress_appears_on_a_terminal_and_goes_when_output_starts(monkeypatch):
    from solver.cli.progress import DelayedProgress
    screen, out = _Terminal(), io.StringIO()
    monkeypatch.setattr(sys, "stdout", out)
    with DelayedProgress("plan job", delay_s=0.0, stream=screen) as progress:
        assert _wait_shown(progress)
        print("the plan")  # the command's output ends the indicator first
        assert not progress.shown
    assert "tangram plan job: working" in screen.getvalue()
    assert out.getvalue() == "the plan\n" and sys.stdout is out


def test_progress_is_silent_off_a_terminal_and_for_commands_with_their_own():
    from solver.cli.progress import DelayedProgress
    for stream, enabled in ((io.StringIO(), True), (_Terminal(), False)):
        with DelayedProgress("plan job", enabled=enabled, delay_s=0.0,
                             stream=stream) as progress:
            assert not progress.enabled
        assert stream.getvalue() == "" and not progress.shown
    from solver.cli.main import build_parser
    parser = build_parser()
    for command in ("verify", "bench"):  # they draw their own progress
        assert parser.parse_args([command, SEED]).own_progress
