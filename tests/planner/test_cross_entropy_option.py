"""Jobs that run Transformer Engine's fused loss (``[training] cross_entropy = "te"``): read,
planned, checked by every solver and the validator, refused where the framework has no such
option, and exported with the flags Megatron-LM takes for it.

Sources: Megatron-LM at 8479eb3 (the version FlagScale pins): ``--cross-entropy-loss-fusion`` and
``--cross-entropy-fusion-impl {native,te}`` (``_add_training_args`` in
``megatron/training/arguments.py``); ``LanguageModule.compute_language_model_loss``
(``megatron/core/models/common/language_module/language_module.py``) calls
``te_parallel_cross_entropy`` under both. The bytes per logit are checked by hand in
``tests/cost/test_cross_entropy.py``.
"""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import yaml

from solver.cli.main import main
from solver.cost.estimating.estimate_config import load_estimate_setup
from solver.launch import flagscale_hostfile, flagscale_yaml
from solver.launch.flagscale_check import problems as judge
from solver.launch.megatron import megatron_args
from solver.planner.check.validate import problems
from solver.planner.stages.search import PlannerConfig, plan_job
from solver.spec.domain import CrossEntropyKernel, Framework, SolverKind
from solver.spec.errors import InputError
from solver.spec.loaders import load_job

#: 8 layers of Llama 3 8B's shape (its 128,256-word vocabulary) on one H100 node and one A100
#: node: the head is a large share of the last stage, so the loss kernel moves the optimum.
JOB = """
model = { layers = 8, hidden = 4096, ffn = 14336, heads = 32, kv_heads = 8, vocab = 128256 }
cluster = { nodes = [ { gpu = "H100-SXM-80GB", count = 1, name = "x" }, { gpu = "A100-SXM-80GB", count = 1, name = "y" } ] }
[training]
global_batch = 16
seq_len = 4096
n_micro = 4
%s
[planner]
pruning = "safe"
%s
"""


def _job(tmp_path, training: str, planner: str = "", name: str = "job.toml"):
    path = tmp_path / name
    path.write_text(JOB % (training, planner))
    return load_job(path)


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    d = tmp_path_factory.mktemp("loss")
    return _job(d, "", name="unfused.toml"), _job(d, 'cross_entropy = "te"', name="te.toml")


@pytest.fixture(scope="module")
def plans(jobs):
    return plan_job(jobs[0]), plan_job(jobs[1])


def test_read(jobs):
    assert [j.training.cross_entropy for j in jobs] == [CrossEntropyKernel.UNFUSED,
                                                         CrossEntropyKernel.TE]


def test_the_fused_loss_plans_faster_and_validates(jobs, plans):
    """The fused loss moves fewer bytes per logit in both passes and holds fewer, and restricts
    nothing, so the optimum (proven over every plan: pruning "safe") cannot get slower; every
    plan holds the head, so it gets faster. The validator, which restates the loss's bytes
    and memory on its own, passes both plans."""
    (unfused, te), (a, b) = jobs, plans
    assert b.iteration_time_s < a.iteration_time_s
    assert problems(a, unfused) == [] and problems(b, te) == []


def test_all_solvers_agree(jobs):
    te = jobs[1]
    found = [plan_job(te, PlannerConfig(solver=k, time_limit_s=math.inf))
             for k in (SolverKind.DP, SolverKind.CPSAT, SolverKind.MILP, SolverKind.BRUTE)]
    assert all(p.solver.optimal for p in found)
    times = [p.iteration_time_s for p in found]
    assert max(times) - min(times) <= 1e-6 * min(times)


def test_exports_carry_the_flags(jobs, plans):
    plan = plans[1]
    assert {"--cross-entropy-loss-fusion",
            "--cross-entropy-fusion-impl te"} <= set(megatron_args(plan))
    text = flagscale_yaml(plan, "p.hostfile")
    assert judge(yaml.safe_load(text), flagscale_hostfile(plan)) == []
    assert "cross_entropy_loss_fusion: true" in text and "cross_entropy_fusion_impl: te" in text
    assert not any("cross-entropy" in a for a in megatron_args(plans[0]))


def test_the_validator_refuses_it_where_the_framework_has_no_fused_loss(jobs, plans):
    """DeepSpeed computes the loss outside Megatron-Core: a plan of a "te" job under it is one
    its runtime cannot run as written."""
    te = jobs[1]
    deepspeed = replace(te, planner=replace(te.planner, framework=Framework.DEEPSPEED))
    assert any("cross_entropy \"te\"" in p for p in problems(plans[1], deepspeed))


def test_a_kernel_not_offered_is_one_line(tmp_path, capsys):
    """One line, exit status 2. (The planner plans for FlagScale and Megatron-Core only, which
    both run the fused loss; ``tangram estimate`` and the validator refuse it elsewhere.)"""
    path = tmp_path / "bad.toml"
    path.write_text(JOB % ('cross_entropy = "native"', ""))
    assert main(["plan", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith(f"error: {path}: training.cross_entropy:"), err


def test_the_plan_says_it(jobs, capsys):
    assert main(["plan", str(jobs[1].path)]) == 0
    assert capsys.readouterr().out.splitlines()[0].endswith("tokens, TE cross entropy")
    assert main(["plan", str(jobs[1].path), "--json"]) == 0
    assert '"cross_entropy": "te"' in capsys.readouterr().out


ESTIMATE = """
model = "llama3-8b"
gpu = "H100-SXM-80GB"
gpus = 8
framework = "%s"
[training]
global_batch = 64
seq_len = 4096
cross_entropy = "te"
[parallel]
tp = 1
pp = 1
dp = 8
zero = 1
recompute = "none"
"""


def test_estimate_reads_it(tmp_path):
    """``tangram estimate`` prices the fused loss where the framework runs it and refuses it
    with the key where not."""
    path = tmp_path / "e.toml"
    path.write_text(ESTIMATE % "megatron-core")
    assert load_estimate_setup(path)[0].cross_entropy is CrossEntropyKernel.TE
    path.write_text(ESTIMATE % "deepspeed")
    with pytest.raises(InputError, match="training.cross_entropy"):
        load_estimate_setup(path)
