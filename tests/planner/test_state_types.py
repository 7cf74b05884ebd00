"""Jobs that keep bf16 gradient buffers (``grad_reduce = "bf16"``) and FP8 weights
(``fp8_param_gather = true``): read, planned, checked by every solver and the validator, and
exported with the flags Megatron-LM takes for them.

Sources: Megatron-LM ``megatron/training/arguments.py`` (``core_v0.14.0``, the version FlagScale
pins): ``--grad-reduce-in-bf16`` (``_add_mixed_precision_args``; ``validate_args`` reads it only
under ``--bf16``), ``--fp8-param-gather`` (``_add_transformer_engine_args``; ``validate_args``:
"only supported with distributed optimizer, torch fsdp2, megatron fsdp").
"""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import yaml

from solver.cli.main import main
from solver.cost.memory import least_state_bytes
from solver.launch import flagscale_hostfile, flagscale_yaml
from solver.launch.flagscale_check import problems as judge
from solver.launch.megatron import megatron_args
from solver.planner.check.validate import problems
from solver.planner.pruning import job_state_bytes
from solver.planner.stages.search import PlannerConfig, plan_job
from solver.spec.domain import SolverKind
from solver.spec.loaders import load_job

#: 48 layers of Llama 3 70B's shape on one H100 node and one B200 node, FP8: memory binds (the
#: default plan runs TP 4 to fit), so the smaller states move the plan.
JOB = """
model = { layers = 48, hidden = 8192, ffn = 28672, heads = 64, kv_heads = 8, vocab = 128256 }
cluster = { nodes = [ { gpu = "H100-SXM-80GB", count = 1, name = "x" }, { gpu = "B200", count = 1, name = "y" } ] }
[training]
global_batch = 32
seq_len = 8192
n_micro = 8
precision = "fp8"
%s
[planner]
pruning = "safe"
"""
SETTINGS = 'grad_reduce = "bf16"\nfp8_param_gather = true'


def _job(tmp_path, extra: str, name: str = "job.toml"):
    path = tmp_path / name
    path.write_text(JOB % extra)
    return load_job(path)


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    d = tmp_path_factory.mktemp("state")
    return (_job(d, "", "default.toml"), _job(d, 'grad_reduce = "bf16"', "grads.toml"),
            _job(d, SETTINGS, "both.toml"))


def test_least_state_bytes_by_hand():
    """Weights + gradients + Adam per parameter: 2 + 4 + 12 = 18 by default, 2 + 2 + 12 = 16
    with bf16 gradients, 1 + 2 + 12 = 15 with FP8 weights too, 1 + 4 + 12 = 17 with FP8
    weights alone."""
    assert least_state_bytes() == 18.0 and least_state_bytes(True) == 16.0
    assert least_state_bytes(True, True) == 15.0 and least_state_bytes(False, True) == 17.0


def test_read_and_used_by_the_pruning_bound(jobs):
    default, grads, both = jobs
    assert (both.training.grad_reduce_bf16, both.training.fp8_param_gather) == (True, True)
    assert [job_state_bytes(j) for j in jobs] == [18.0, 16.0, 15.0]


def test_smaller_states_never_plan_slower(jobs):
    """bf16 gradients lower every stage's memory and gradient traffic and restrict nothing, so
    the optimum (proven over every plan: pruning "safe") cannot get slower; here memory binds
    and it gets faster."""
    default, grads, _ = jobs
    a, b = plan_job(default), plan_job(grads)
    assert b.iteration_time_s < a.iteration_time_s
    assert problems(a, default) == [] and problems(b, grads) == []


def test_fp8_weights_plan_with_the_distributed_optimizer(jobs):
    """FP8 weights keep every stage with replicas on the distributed optimizer (ZeRO-1), and
    the validator, which counts memory and time on its own, passes the plan."""
    both = jobs[2]
    plan = plan_job(both)
    assert problems(plan, both) == []
    assert all(s.plan.config.zero >= 1 for s in plan.stages
               if s.plan.config.dp * s.plan.config.cp > 1)
    zero0 = replace(plan.stages[0].plan, config=replace(plan.stages[0].plan.config, zero=0))
    broken = replace(plan, stages=[replace(plan.stages[0], plan=zero0)] + list(plan.stages[1:]))
    assert any("--fp8-param-gather" in p for p in problems(broken, both))


def test_all_solvers_agree(jobs):
    both = jobs[2]
    plans = [plan_job(both, PlannerConfig(solver=k, time_limit_s=math.inf))
             for k in (SolverKind.DP, SolverKind.CPSAT, SolverKind.MILP, SolverKind.BRUTE)]
    assert all(p.solver.optimal for p in plans)
    times = [p.iteration_time_s for p in plans]
    assert max(times) - min(times) <= 1e-6 * min(times)


def test_exports_carry_the_flags(jobs):
    both = jobs[2]
    plan = plan_job(both)
    args = megatron_args(plan)
    assert {"--grad-reduce-in-bf16", "--fp8-param-gather",
            "--use-distributed-optimizer"} <= set(args)
    doc = yaml.safe_load(flagscale_yaml(plan, "p.hostfile"))
    assert judge(doc, flagscale_hostfile(plan)) == []
    assert "grad_reduce_in_bf16: true" in flagscale_yaml(plan, "p.hostfile")
    assert "fp8_param_gather: true" in flagscale_yaml(plan, "p.hostfile")
    assert "--grad-reduce-in-bf16" not in megatron_args(plan_job(jobs[0]))


@pytest.mark.parametrize("precision, training, key", [
    ("fp8", 'grad_reduce = "fp8"', "training.grad_reduce"),
    ("fp16", 'grad_reduce = "bf16"', "training.grad_reduce"),
    ("bf16", "fp8_param_gather = true", "training.fp8_param_gather"),
])
def test_bad_settings_are_one_line(tmp_path, capsys, precision, training, key):
    """One line, exit status 2: an unknown gradient type, bf16 gradients in an fp16 job (Megatron
    reads the flag only under --bf16), FP8 weights without FP8."""
    path = tmp_path / "bad.toml"
    path.write_text((JOB % training).replace('precision = "fp8"', f'precision = "{precision}"'))
    assert main(["plan", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith(f"error: {path}: {key}:"), err


def test_the_plan_says_them(jobs, capsys):
    """The readable plan's first line names the state types when a job departs from Megatron-LM's
    defaults, and stays as it was otherwise."""
    for job, tail in ((jobs[0], "tokens"), (jobs[2], "tokens, bf16 gradients, FP8 weights")):
        assert main(["plan", str(job.path)]) == 0
        assert capsys.readouterr().out.splitlines()[0].endswith(tail)
