"""``tangram bench``: row fields, Figure 7 normalization, solver agreement, Ctrl-C, JSON."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest

import solver.cli.commands.bench as bench_cmd
from solver.cli.main import main
from solver.planner.pruning import Rule
from solver.planner.stages.search import PlannerConfig, plan_job, start_run
from solver.spec.domain import SolverKind
from solver.spec.loaders import load_job
from solver.studies.bench import (
    BenchOptions,
    _solver_run,
    agreement,
    bench_job,
    suite_paths,
    unpruned_calls,
)
from solver.studies.bench_rows import SolverRun, SolverStatus, row_json

TINY_MODEL = ('model = { name = "tiny-8l", layers = 8, hidden = 2048, ffn = 5504, heads = 16, '
              'kv_heads = 16, vocab = 32000 }\n')
TRAINING = "[training]\nglobal_batch = 32\nseq_len = 2048\nn_micro = 4\n"


def _job(tmp_path, name: str, nodes: list[tuple[str, int]], model: str = TINY_MODEL) -> str:
    lines = [f"# test job {name}", model, TRAINING, "[cluster]", f'name = "{name}"',
             "inter_island_gbits = 200.0"]
    for i, (gpu, count) in enumerate(nodes):
        lines += ["[[cluster.nodes]]", f'gpu = "{gpu}"', f"count = {count}", f'name = "n{i}"']
    path = tmp_path / f"{name}.toml"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


@pytest.fixture
def three(tmp_path):
    """A tiny 3-island job (H100, A100, L40S nodes) with an 8-layer model."""
    return _job(tmp_path, "tiny3", [("H100-SXM-80GB", 1), ("A100-SXM-80GB", 1), ("L40S", 1)])


@pytest.fixture
def homog(tmp_path):
    """A tiny homogeneous job."""
    return _job(tmp_path, "tinyhomog", [("A100-SXM-80GB", 2)])


@pytest.fixture
def hopeless(tmp_path):
    """Llama 3.1 405B on two A10 nodes: nothing fits."""
    return _job(tmp_path, "hopeless", [("A10", 1), ("L40S", 1)], model='model = "llama3.1-405b"\n')


ROW_KEYS = {"job", "gpus", "islands", "split", "n_micro", "tokens_per_s", "iteration_time_s",
            "bubble_ratio", "planning_time_s", "parallelizer_calls", "parallelizer_calls_unpruned",
            "optimal", "infeasible", "solvers", "agree", "baselines", "replicas"}


def test_row_fields_and_split(three):
    row = bench_job(three)
    payload = row_json(row)
    assert set(payload) == ROW_KEYS
    assert payload["islands"] == 3 and payload["gpus"] == 24 and payload["n_micro"] == 4
    # The split names islands with their layer counts, which cover the model exactly.
    parts = [p.split(":") for p in row.split.split()]
    assert sum(int(n) for _, n in parts) == 8
    assert all(name.startswith("i") for name, _ in parts)
    assert row.tokens_per_s > 0 and 0 <= row.bubble_ratio < 1 and row.optimal
    assert 0 < row.calls <= row.calls_unpruned
    assert payload["solvers"] == {} and payload["agree"] is None and payload["baselines"] is None


def test_unpruned_count_matches_a_real_unpruned_run(three):
    job = load_job(three)
    config = PlannerConfig(rules=Rule.NONE)
    run = start_run(job, config)
    plan_job(job, config, run=run)
    assert unpruned_calls(job, 4) == run.cache.calls
    assert unpruned_calls(job, 4) > bench_job(three).calls


def test_baselines_normalized_to_oblivious(three):
    row = bench_job(three, BenchOptions(baselines=True))
    by = {b.name: b for b in row.baselines}
    assert list(by) == ["oblivious", "restricted", "tangram"]
    assert by["oblivious"].relative == 1.0
    assert by["tangram"].tokens_per_s == pytest.approx(row.tokens_per_s)
    assert by["tangram"].relative == pytest.approx(
        by["tangram"].tokens_per_s / by["oblivious"].tokens_per_s)
    assert by["restricted"].relative == pytest.approx(
        by["restricted"].tokens_per_s / by["oblivious"].tokens_per_s)


def test_infeasible_job_and_baselines_reported_not_hidden(hopeless):
    row = bench_job(hopeless, BenchOptions(baselines=True))
    assert row.infeasible and row.tokens_per_s is None and row.split == ""
    payload = row_json(row)
    assert payload["infeasible"] and payload["tokens_per_s"] is None
    for name in ("oblivious", "restricted", "tangram"):
        entry = payload["baselines"][name]
        assert entry["tokens_per_s"] is None and entry["relative"] is None and entry["infeasible"]


def test_solvers_agree_on_a_real_job(three):
    # No wall-clock limit: the proofs asserted below never depend on the machine's load.
    row = bench_job(three, BenchOptions(solvers=(SolverKind.DP, SolverKind.CPSAT,
                                                 SolverKind.MILP), time_limit_s=math.inf))
    assert [s.solver for s in row.solvers] == ["dp", "cpsat", "milp"]
    assert all(s.status is SolverStatus.OPTIMAL for s in row.solvers)
    assert row.agree is True
    assert row.solvers[0].objective_s == pytest.approx(row.iteration_time_s, rel=1e-12)


def _run(status, objective, bound=None, gap=None, name="x"):
    return SolverRun(name, status, objective, 0.1, bound, gap)


OPT, LIMIT = SolverStatus.OPTIMAL, SolverStatus.LIMIT


@pytest.mark.parametrize("runs, expected", [
    ([_run(OPT, 5.0)], None),
    ([_run(OPT, 5.0), _run(OPT, 5.0 * (1 + 1e-5))], True),
    ([_run(OPT, 5.0), _run(OPT, 5.01)], False),
    # A timed-out solver is never agreement, even when its objective happens to match.
    ([_run(OPT, 5.0), _run(LIMIT, 5.0, bound=4.0, gap=0.2)], False),
    ([_run(OPT, 5.0), _run(SolverStatus.NO_PLAN_LIMIT, None)], False),
    ([_run(OPT, 5.0), _run(SolverStatus.UNPROVEN, 5.0)], False),
    ([_run(SolverStatus.INFEASIBLE, None), _run(SolverStatus.INFEASIBLE, None)], True),
    ([_run(OPT, 5.0), _run(SolverStatus.INFEASIBLE, None)], False),
])
def test_agreement(runs, expected):
    assert agreement(runs) is expected


def _fake_plan(optimal: bool, bound=None, gap=None):
    info = SimpleNamespace(optimal=optimal, bound=bound, gap=gap)
    return SimpleNamespace(solver=info, iteration_time_s=5.0)


def test_solver_run_limits():
    # Proven and fast: optimal.
    assert _solver_run(SolverKind.CPSAT, _fake_plan(True), 1.0, 30.0).status is OPT
    # The solver reported a time limit: objective, bound and gap are kept.
    r = _solver_run(SolverKind.MILP, _fake_plan(False, 4.0, 0.2), 31.0, 30.0)
    assert (r.status, r.objective_s, r.bound, r.gap) == (LIMIT, 5.0, 4.0, 0.2)
    # "Optimal" after running past a limit is not a proof (a solve may have ended without a plan).
    assert _solver_run(SolverKind.CPSAT, _fake_plan(True), 30.5, 30.0).status is \
        SolverStatus.UNPROVEN
    assert _solver_run(SolverKind.DP, _fake_plan(True), 30.5, 30.0).status is OPT
    assert _solver_run(SolverKind.CPSAT, None, 31.0, 30.0).status is SolverStatus.NO_PLAN_LIMIT
    assert _solver_run(SolverKind.CPSAT, None, 1.0, 30.0).status is SolverStatus.INFEASIBLE


def test_cli_json_and_text(three, homog, capsys):
    assert main(["bench", three, homog, "--json", "--baselines"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert [r["job"] for r in payload["rows"]] == ["tiny3", "tinyhomog"]
    assert all(set(r) == ROW_KEYS for r in payload["rows"])
    assert all(r["baselines"]["oblivious"]["relative"] == 1.0 for r in payload["rows"])
    assert main(["bench", homog, "--solvers", "dp,cpsat", "--time-limit", "inf"]) == 0
    out = capsys.readouterr().out
    assert "tinyhomog" in out and "agree" in out and "yes" in out


def test_cli_rejects_bad_flags(homog, capsys):
    assert main(["bench", homog, "--solvers", "dp,gurobi"]) == 2
    assert "--solvers" in capsys.readouterr().err
    assert main(["bench", "no-such-job"]) == 2
    assert main(["bench", homog, "--time-limit", "0"]) == 2


def test_ctrl_c_prints_finished_rows_and_exits_130(three, homog, monkeypatch, capsys):
    real = bench_cmd.bench_job
    calls = []

    def interrupt_second(path, options):
        calls.append(path)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(path, options)

    monkeypatch.setattr(bench_cmd, "bench_job", interrupt_second)
    assert main(["bench", three, homog, "--json"]) == 130
    captured = capsys.readouterr()
    payload = json.loads(captured.out)
    assert [r["job"] for r in payload["rows"]] == ["tiny3"] and payload["interrupted"] is True
    assert "Traceback" not in captured.err and "interrupted" in captured.err


def test_suite_paths_default_and_names():
    paths = suite_paths()
    assert len(paths) >= 20 and all(p.suffix == ".toml" for p in paths)
    assert suite_paths(["seed-llama3-70b"])[0].name == "seed-llama3-70b.toml"


def test_stable_json_is_byte_identical(homog, capsys):
    outputs = []
    for _ in range(2):
        assert main(["bench", homog, "--json", "--solvers", "dp,milp", "--stable-json",
                     "--time-limit", "inf"]) == 0  # no clock: the same status each run
        outputs.append(capsys.readouterr().out)
    assert outputs[0] == outputs[1]
    row = json.loads(outputs[0])["rows"][0]
    assert row["planning_time_s"] == 0.0 and row["solvers"]["milp"]["time_s"] == 0.0


def test_replica_columns_never_below_the_single_pipeline(three):
    row = bench_job(three, BenchOptions(replicas=True))
    out = row_json(row)["replicas"]
    assert out is not None and out["count"] == len(out["shares"]) >= 1
    assert sum(out["shares"]) == load_job(three).training.global_batch
    assert row.replicas.tokens_per_s >= row.tokens_per_s * (1 - 1e-12)
    assert row_json(bench_job(three))["replicas"] is None  # only when asked


def test_bench_plans_what_tangram_plan_plans():
    # AMD beside NVIDIA: the runnable views are one vendor each, and the best is the MI300X
    # island as one interleaved mesh. The bench row must be the plan `tangram plan` prints.
    from solver.spec.loaders import INSTANCES
    path = INSTANCES / "jobs" / "mi300x-h100-llama3-70b.toml"
    row = bench_job(path)
    plan = plan_job(load_job(path))
    assert row.tokens_per_s == pytest.approx(plan.tokens_per_s, rel=1e-9)
