"""A tied embedding across FlagScale meshes: the first and last meshes share one TP degree and
their DP degrees divide one another (``FSTrainArguments.pre_validate_args``). The search finds
the optimum under that rule by cases (:mod:`solver.planner.stages.tied`); here it is checked
against a finer, independent enumeration and against the other solvers."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import yaml

from solver.launch import flagscale_hostfile, flagscale_yaml
from solver.launch.flagscale_check import problems as judge
from solver.planner.check.validate import problems
from solver.planner.stages.search import PlannerConfig, plan_job
from solver.planner.stages.tied import tied_rule_binds
from solver.spec.domain import SolverKind
from solver.spec.errors import InfeasibleError
from solver.spec.loaders import load_job

#: An 8B-shaped model with tied embeddings on one H100 node and one L40S node: its unrestricted
#: optimum runs the L40S stage at tp 4 and the H100 stage at tp 2 (checked below), which
#: FlagScale refuses.
JOB = """
model = { layers = 16, hidden = 4096, ffn = 14336, heads = 32, kv_heads = 8, vocab = 128256, tied_embeddings = true }
cluster = { nodes = [ { gpu = "H100-SXM-80GB", count = 1, name = "x" }, { gpu = "L40S", count = 1, name = "y" } ] }
[training]
global_batch = 32
seq_len = 4096
n_micro = 8
"""


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    path = tmp_path_factory.mktemp("tied") / "job.toml"
    path.write_text(JOB)
    return load_job(path)


def _ends(plan):
    a, b = plan.stages[0].plan.config, plan.stages[-1].plan.config
    return a.tp, a.dp, b.tp, b.dp


def test_the_rule_binds_and_the_plan_obeys_it(job):
    free = plan_job(job, check=False)
    assert tied_rule_binds(free, job)  # the unrestricted optimum breaks the rule
    plan = plan_job(job)
    assert not tied_rule_binds(plan, job) and problems(plan, job) == []
    ta, da, tb, db = _ends(plan)
    assert ta == tb and (da % db == 0 or db % da == 0)
    assert plan.iteration_time_s >= free.iteration_time_s * (1 - 1e-9)
    doc = yaml.safe_load(flagscale_yaml(plan, "p.hostfile"))
    assert judge(doc, flagscale_hostfile(plan)) == []


def test_cases_equal_a_finer_enumeration(job):
    # Every (tp, first dp, last dp) the rule allows, searched one by one: the least of them is
    # the optimum under the rule, which the case split must reach exactly.
    best = math.inf
    values = (1, 2, 4, 8, 16)
    for t in (1, 2, 4, 8):
        for a in values:
            for b in values:
                if a % b and b % a:
                    continue
                limited = replace(job, constraints=replace(job.constraints, end_tp=(t,),
                                                           first_dp=(a,), last_dp=(b,)))
                try:
                    best = min(best, plan_job(limited, check=False).iteration_time_s)
                except InfeasibleError:
                    pass
    assert plan_job(job).iteration_time_s == pytest.approx(best, rel=1e-9)


def test_all_solvers_agree_under_the_rule(job):
    plans = [plan_job(job, PlannerConfig(solver=k, time_limit_s=math.inf))
             for k in (SolverKind.DP, SolverKind.CPSAT, SolverKind.MILP)]
    assert all(p.solver.optimal for p in plans)
    times = [p.iteration_time_s for p in plans]
    assert max(times) - min(times) <= 1e-6 * min(times)
    assert all(not tied_rule_binds(p, job) for p in plans)
