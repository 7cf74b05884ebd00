"""Reliability: mutated inputs never crash, outputs are reproducible, Ctrl-C is clean.

The fuzz test mutates the shipped instance files as text (delete a line, replace a value with an
absurd or wrongly typed one, insert garbage, truncate) and runs the command that reads them. Each
run must end in one of three ways: success (exit 0; ``plan`` prints only validated plans), bad
input (exit 2, exactly one line ``error: <file>: <key>: <reason>``) or infeasible (exit 3, exactly
one line ``no plan: ...``). Anything else — an exception escaping ``main`` — fails the test.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import MINI_FIXED
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import solver.cli.commands.verify as verify_cmd
from solver.cli.main import main
from solver.spec.loaders import INSTANCES

TOKENS = ["0", "-1", "1e9", "1000000000", "nan", "inf", "-inf", '"x"', "true", "[]", "{}",
          "1000000", "0.0", '"H999"', "3.5", "[1, 2]", '"auto"', "-0.5", "1e-300"]
SMALL_JOBS = ["h100-sxm-nvl-llama2-13b", "homog-a100-llama2-13b", "extreme-l40s-h100-llama3-8b"]
TABLES = ["links_nulls_6x3", "counterexample_order_links", "counterexample_recurrence"]


def mutate(text: str, kind: int, line: int, token: str) -> str:
    """One text mutation of a TOML or JSON file."""
    lines = text.splitlines()
    i = line % max(len(lines), 1)
    if kind == 0:  # delete a line
        del lines[i]
    elif kind == 1:  # replace the value of a `key = value` / `"key": value` line
        for sep in (" = ", ": "):
            if sep in lines[i]:
                key, _, _ = lines[i].partition(sep)
                lines[i] = f"{key}{sep}{token}" + ("," if lines[i].rstrip().endswith(",") else "")
                break
    elif kind == 2:  # insert a garbage line
        lines.insert(i, f"garbage_{line} = {token}")
    elif kind == 3:  # truncate
        lines = lines[:i]
    else:  # empty file
        lines = []
    return "\n".join(lines) + "\n"


def check_outcome(code: int, out: str, err: str) -> None:
    """Exit 0 with output, or a one-line error (2) / no-plan message (3)."""
    assert code in (0, 2, 3), (code, err)
    if code == 0:
        assert out.strip()
        return
    text = err.strip()
    assert "\n" not in text and "Traceback" not in text, text
    assert text.startswith("error: " if code == 2 else "no plan: "), text


def fuzz_once(tmp_path: Path, target: int, which: int, kind: int, line: int, token: str) -> tuple:
    if target == 0:  # a cluster file, read by `islands`
        clusters = sorted((INSTANCES / "clusters").glob("*.toml"))
        src = clusters[which % len(clusters)]
        dst = tmp_path / src.name
        dst.write_text(mutate(src.read_text(), kind, line, token))
        return ["islands", str(dst), "--json"]
    if target == 1:  # a job file with its model and cluster copied beside it, read by `plan`
        src = INSTANCES / "jobs" / f"{SMALL_JOBS[which % len(SMALL_JOBS)]}.toml"
        dst = tmp_path / src.name
        dst.write_text(mutate(src.read_text(), kind, line, token))
        return ["plan", str(dst), "--json"]
    if target == 2:  # a model file referenced by a small job
        job = (INSTANCES / "jobs" / "h100-sxm-nvl-llama2-13b.toml").read_text()
        model = tmp_path / "model.toml"
        model.write_text(mutate((INSTANCES / "models" / "llama2-13b.toml").read_text(),
                                kind, line, token))
        (tmp_path / "job.toml").write_text(job.replace('"llama2-13b"', '"model.toml"'))
        return ["plan", str(tmp_path / "job.toml")]
    if target == 3:  # a latency table, read by `compose`
        src = INSTANCES / "tables" / f"{TABLES[which % len(TABLES)]}.json"
        pretty = json.dumps(json.loads(src.read_text()), indent=1)
        dst = tmp_path / src.name
        dst.write_text(mutate(pretty, kind, line, token))
        return ["compose", str(dst), "--json"]
    configs = sorted((INSTANCES / "estimate").glob("*.toml"))  # an estimate config
    src = configs[which % len(configs)]
    dst = tmp_path / src.name
    dst.write_text(mutate(src.read_text(), kind, line, token))
    return ["estimate", str(dst), "--json"]


MUTATION = dict(target=st.integers(0, 4), which=st.integers(0, 50), kind=st.integers(0, 4),
                line=st.integers(0, 60), token=st.sampled_from(TOKENS))


def _fuzz(tmp_path_factory, capsys, **m):
    tmp = tmp_path_factory.mktemp("fuzz")
    argv = fuzz_once(tmp, **m)
    code = main(argv)
    captured = capsys.readouterr()
    check_outcome(code, captured.out, captured.err)
    shutil.rmtree(tmp, ignore_errors=True)


@settings(max_examples=100, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(**MUTATION)
def test_fuzz_shipped_instances(tmp_path_factory, capsys, target, which, kind, line, token):
    _fuzz(tmp_path_factory, capsys, target=target, which=which, kind=kind, line=line,
          token=token)


@pytest.mark.slow
@settings(max_examples=3000, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(**MUTATION)
def test_fuzz_shipped_instances_long(tmp_path_factory, capsys, target, which, kind, line, token):
    _fuzz(tmp_path_factory, capsys, target=target, which=which, kind=kind, line=line,
          token=token)


@pytest.mark.parametrize("text,key", [
    ("", "<file>"),
    ("[A100]\nbf16_tflops = [", "<file>"),
    ('[X]\nbf16_tflops = 1.0\nhbm_gb = 1.0\nhbm_bw_gbs = 1.0\nnvlink_gbs = -5.0\n'
     'nic_gbits = 1.0\ntdp_w = 1.0\nsource = "s"\n', "X.nvlink_gbs"),
    ('[X]\nbf16_tflops = "fast"\n', "X.bf16_tflops"),
])
def test_bad_gpu_catalog(tmp_path, capsys, monkeypatch, text, key):
    catalog = tmp_path / "gpus.toml"
    catalog.write_text(text)
    monkeypatch.setenv("TANGRAM_CATALOG", str(catalog))
    code = main(["islands", "seed-h100-a100"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.startswith(f"error: {catalog}: {key}: ") and "\n" not in err


@pytest.mark.parametrize("job", SMALL_JOBS + ["seed-llama3-70b"])
def test_plan_json_is_byte_identical_across_runs(job, capsys):
    path = str(INSTANCES / "jobs" / f"{job}.toml")
    outs = []
    for _ in range(2):
        assert main(["plan", path, "--json", "--stable-json"]) == 0
        outs.append(capsys.readouterr().out)
    assert outs[0] == outs[1]
    assert json.loads(outs[0])["solver"]["time_s"] == 0.0


def test_one_or_two_workers_print_the_same_plan_and_zero_is_refused(capsys):
    """``--workers`` sets the processes of the n_micro search (the job leaves n_micro open)."""
    path = str(INSTANCES / "jobs" / "odd-3h100-5a100-llama2-13b.toml")
    outs = []
    for workers in ("1", "2"):
        assert main(["plan", path, "--json", "--stable-json", "--workers", workers]) == 0
        outs.append(capsys.readouterr().out)
    assert outs[0] == outs[1]
    assert main(["plan", path, "--workers", "0"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == "error: <cli>: --workers: must be >= 1, got 0\n"


def test_solvers_give_identical_plans(tmp_path, capsys):
    # Small enough for CP-SAT and the MILP to prove their optimum (they search every plan that
    # could beat the DP's): three nodes, the shared mini job. No wall-clock limit, so the proof
    # (``optimal`` in every payload) never depends on the machine's load.
    path = tmp_path / "mini.toml"
    path.write_text(MINI_FIXED)
    path = str(path)
    payloads = []
    for solver in ("dp", "cpsat", "milp"):
        assert main(["plan", path, "--json", "--stable-json", "--solver", solver,
                     "--time-limit", "inf"]) == 0
        payload = json.loads(capsys.readouterr().out)
        assert payload["solver"].pop("name").startswith(solver)
        assert payload["solver"]["optimal"] is True, (solver, payload["solver"])
        payloads.append(payload)
    assert payloads[0] == payloads[1] == payloads[2]


#: One H100 node beside one A100 node: small enough that every rule set plans in a second.
TWO_NODES = ('model = "llama2-7b"\n[cluster]\nname = "two"\n'
             '[[cluster.nodes]]\ngpu = "H100-SXM-80GB"\ncount = 1\nname = "h"\n'
             '[[cluster.nodes]]\ngpu = "A100-SXM-80GB"\ncount = 1\nname = "a"\n'
             '[training]\nglobal_batch = 64\nseq_len = 2048\nn_micro = 8\n')


def test_ctrl_c_during_verify_prints_finished_rows(monkeypatch, capsys, tmp_path):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(verify_cmd, "cross_check", interrupted)
    job = tmp_path / "two-nodes.toml"
    job.write_text(TWO_NODES)
    code = main(["verify", str(job)])
    captured = capsys.readouterr()
    assert code == 130
    assert "none (unpruned)" in captured.out and "1,2s,3,4s" in captured.out
    assert "interrupted" in captured.err and "Traceback" not in captured.err


def test_time_limit_reports_bound_and_keeps_dp_answer():
    from solver.compose.dp import compose_dp
    from solver.compose.table import load_table
    from solver.planner.stages.solve import solve_table
    from solver.spec.domain import SolverKind
    table = load_table(INSTANCES / "tables" / "mixed_128x8.json")
    exact = compose_dp(table)
    for kind in (SolverKind.CPSAT, SolverKind.MILP):
        # 10 ms cannot prove optimality on 128 layers × 8 islands.
        result = solve_table(table, None, kind, time_limit_s=0.01)
        assert not result.optimal and result.solver.startswith(kind.value)
        assert result.objective == exact.objective and result.stages == exact.stages
        if result.bound is not None:
            assert result.bound <= exact.objective + 1e-9 and 0 <= result.gap <= 1


def test_too_large_for_solver_is_one_line(tmp_path, capsys):
    names = [f"k{i}" for i in range(13)]
    table = {"layers": 4, "n_micro": 2, "islands": names,
             "latency": {k: [1.0, 2.0, 3.0, 4.0] for k in names}}
    path = tmp_path / "wide.json"
    path.write_text(json.dumps(table))
    assert main(["compose", str(path), "--solver", "dp"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "at most 12 islands" in err and "\n" not in err


def test_verify_reports_a_solver_too_large_to_run(monkeypatch, capsys, tmp_path):
    """A CP-SAT/MILP model over its size limit no longer ends ``verify`` with an error after
    the whole ablation (qwen3-three-gen-512 ran 32 minutes into one): the solver is reported as
    not run, with the limit, the others still report, and the verdict is ``not proven``."""
    import formulations.groups_common as groups_common
    monkeypatch.setattr(groups_common, "MAX_SLOT_VARS", 0)
    job = tmp_path / "two-nodes.toml"
    job.write_text(TWO_NODES)
    assert main(["verify", str(job)]) == 0
    out = capsys.readouterr().out
    assert "cpsat not run (the slot model would have" in out and "limit 0" in out
    assert out.rstrip().endswith("-> not proven") and "dp " in out
    assert main(["verify", str(job), "--json"]) == 0
    solvers = json.loads(capsys.readouterr().out)["solvers"]
    assert solvers["cpsat"] is None and "limit 0" in solvers["status"]["cpsat"]["not_run"]
    assert solvers["dp"] is not None and solvers["verdict"] == "not proven"


def test_bench_reports_a_solver_too_large_to_run(monkeypatch, capsys, tmp_path):
    """``bench --solvers`` ended with the size error of one solver (and no table); now that
    solver reads ``not run`` with its limit, the DP still reports, and agreement is not
    proven."""
    import formulations.groups_common as groups_common
    monkeypatch.setattr(groups_common, "MAX_SLOT_VARS", 0)
    job = tmp_path / "two-nodes.toml"
    job.write_text(TWO_NODES)
    assert main(["bench", str(job), "--solvers", "dp,cpsat"]) == 0
    out = capsys.readouterr().out
    assert "not run (the slot model would have" in out and "limit 0" in out
    assert "not proven" in out
    assert main(["bench", str(job), "--solvers", "dp,cpsat", "--json"]) == 0
    row = json.loads(capsys.readouterr().out)["rows"][0]
    cpsat, dp = row["solvers"]["cpsat"], row["solvers"]["dp"]
    assert cpsat["status"] == "not run" and "limit 0" in cpsat["not_run"]
    assert cpsat["objective_s"] is None and dp["status"] == "optimal" and dp["not_run"] is None
    assert row["agree"] is False


def test_plan_with_a_solver_too_large_is_still_one_line(monkeypatch, capsys, tmp_path):
    """Asking for that solver directly keeps the one-line error and exit status 2."""
    import formulations.groups_common as groups_common
    monkeypatch.setattr(groups_common, "MAX_SLOT_VARS", 0)
    job = tmp_path / "two-nodes.toml"
    job.write_text(TWO_NODES)
    assert main(["plan", str(job), "--solver", "cpsat"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: <cli>: --solver: cpsat: the slot model would have")
    assert "\n" not in err
