"""Does pruning ever drop the optimum? The ablation behind ``tangram verify``.

The job is solved without any rule (every island × every slice ``[a, b)`` × every in-flight
count, composed exactly), then with growing rule sets, and the objectives are compared. The
final candidate set is also composed by every solver (DP, CP-SAT, MILP) as a cross-check.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from solver.planner.plan import Plan
from solver.planner.pruning import Rule
from solver.planner.stages.search import PlannerConfig, plan_job
from solver.spec.domain import JobSpec, SolverKind
from solver.spec.errors import InfeasibleError, SolverTooLarge

REL_TOL = 1e-6
ABLATION = (Rule.DEDUPE,
            Rule.DEDUPE | Rule.BALANCE,
            Rule.DEDUPE | Rule.BALANCE | Rule.MEMORY,
            Rule.paper(),
            Rule.safe())


@dataclass(frozen=True)
class Row:
    """One ablation row.

    Attributes
    ----------
    rules : Rule
        Rules applied.
    objective_s : float | None
        Iteration time found (None: no plan).
    parallelizer_calls : int
        Calls made.
    time_s : float
        Planning time.
    optimum_kept : bool
        Objective equals the unpruned one (relative tolerance 1e-6).
    loss : float
        Relative loss against the unpruned optimum (0 when kept).
    """

    rules: Rule
    objective_s: float | None
    parallelizer_calls: int
    time_s: float
    optimum_kept: bool
    loss: float


def _run(job: JobSpec, rules: Rule, n_micro: int, solver: SolverKind = SolverKind.DP
         ) -> tuple[Plan | None, int, float]:
    start = time.perf_counter()
    from solver.planner.stages.search import start_run
    config = PlannerConfig(rules=rules, solver=solver)
    run = start_run(job, config, n_micro)
    try:
        plan = plan_job(job, config, run=run)
    except InfeasibleError:
        plan = None
    # The plan's count includes the whole-cluster alternative the planner also tries.
    calls = plan.solver.parallelizer_calls if plan else run.cache.calls
    return plan, calls, time.perf_counter() - start


def ablation_rows(job: JobSpec, n_micro: int, rule_sets=ABLATION):
    """Yield the unpruned row, then one row per rule set (a generator, so that an interrupted
    run can still report the rows it finished)."""
    base, calls, t = _run(job, Rule.NONE, n_micro)
    ref = base.iteration_time_s if base else None
    yield Row(Rule.NONE, ref, calls, t, True, 0.0)
    for rules in rule_sets:
        plan, calls, t = _run(job, rules, n_micro)
        obj = plan.iteration_time_s if plan else None
        kept = (obj is None and ref is None) or (
            obj is not None and ref is not None and math.isclose(obj, ref, rel_tol=REL_TOL))
        loss = 0.0 if kept or ref is None else (math.inf if obj is None else obj / ref - 1)
        yield Row(rules, obj, calls, t, kept, loss)


def ablation(job: JobSpec, n_micro: int, rule_sets=ABLATION) -> tuple[Row, list[Row]]:
    """The unpruned row and one row per rule set."""
    rows = list(ablation_rows(job, n_micro, rule_sets))
    return rows[0], rows[1:]


def cross_check(job: JobSpec, n_micro: int, rules: Rule = Rule.paper()
                ) -> dict[str, object]:
    """Objectives of DP, CP-SAT and MILP on the same candidate set, and whether they agree.

    Returns the objective per solver (keys ``dp``, ``cpsat``, ``milp``; None: no plan), ``agree``
    (every solver proved optimality and the objectives match within a relative 1e-4, the CP-SAT
    scaling tolerance of ``formulations.scaling``), ``status`` (per solver: ``proven``, ``bound_s``
    and ``gap`` when its time limit stopped it, ``not_run`` with the reason when the instance is
    larger than the solver's model is built for) and ``verdict``: ``agree``; ``not proven`` (some
    solver stopped at its limit or did not run, and every bound proved is at most the DP
    optimum, so nothing contradicts it); or ``disagree`` (proven objectives differ, feasibility
    differs, or a proved bound exceeds the DP optimum).

    A solver stopped by its limit returns the DP's plan (``solver.planner.stages.solve``), so its
    objective is the DP's by construction: only its bound is evidence.
    """
    out: dict[str, object] = {}
    status: dict[str, dict] = {}
    for kind in (SolverKind.DP, SolverKind.CPSAT, SolverKind.MILP):
        try:
            plan, _, _ = _run(job, rules, n_micro, kind)
        except SolverTooLarge as exc:  # the model's size limit: the other solvers still report
            out[kind.value] = None
            status[kind.value] = {"proven": False, "bound_s": None, "gap": None,
                                  "not_run": exc.limit}
            continue
        out[kind.value] = plan.iteration_time_s if plan else None
        proven = plan is None or plan.solver.optimal
        status[kind.value] = {"proven": proven,
                              "bound_s": None if proven else plan.solver.bound,
                              "gap": None if proven else plan.solver.gap}
    out["agree"], out["verdict"] = _verdict(out, status)
    out["status"] = status
    return out


def _verdict(objectives: dict, status: dict) -> tuple[bool, str]:
    """(all proven and equal, verdict) for :func:`cross_check`; a solver that did not run
    (``not_run``) contributes no evidence either way."""
    ran = [k for k in status if not status[k].get("not_run")]
    values = [objectives[k] for k in ran if objectives[k] is not None]
    if len(values) not in (0, len(ran)):
        return False, "disagree"
    ref = objectives["dp"]
    proven = [objectives[k] for k in status if status[k]["proven"] and objectives[k] is not None]
    if proven and max(proven) - min(proven) > 1e-4 * min(proven):
        return False, "disagree"
    bounds = [s["bound_s"] for s in status.values() if s["bound_s"] is not None]
    if ref is not None and any(b > ref * (1 + 1e-4) for b in bounds):
        return False, "disagree"
    if all(s["proven"] for s in status.values()):
        return True, "agree"
    return False, "not proven"
