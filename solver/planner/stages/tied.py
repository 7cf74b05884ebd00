"""A tied embedding across meshes: the search under FlagScale's rule on the pipeline's ends.

With ``untie_embeddings_and_output_weights`` false, FlagScale's heterogeneous mode requires the
first and last meshes to share one TP degree and, under the distributed optimizer, one of their
DP degrees to divide the other (``FSTrainArguments.pre_validate_args``,
``flagscale/train/arguments.py``; the rule book states it as
:func:`~solver.cost.runtime.runtime_rules.shared_embedding_problems`). The rule ties the two end
stages together, which the composition (one table entry per stage) cannot express, so it is
searched by cases:

* the plans whose end stages both run ``tp = t`` are searched once per ``t`` (the end stages'
  configurations limited, :attr:`~solver.spec.constraints.Constraints.end_tp`);
* where the best of a case breaks the DP rule, the case splits by the first stage's ``dp = a``,
  the last stage's dp limited to the divisors and multiples of ``a``.

Every plan the rule allows lies in one case and every case's plans obey it, so the best over the
cases is the optimum under the rule; each case is searched with the best so far as its bar.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Callable

from solver.cost.runtime.frameworks import profile
from solver.cost.runtime.runtime_rules import shared_embedding_problems
from solver.planner.plan import Plan
from solver.spec.domain import JobSpec
from solver.spec.errors import InfeasibleError

__all__ = ["tied_rule_binds", "plan_tied_ends"]

#: ``search(job, upper)``: the best plan of ``job`` faster than ``upper`` (raises
#: InfeasibleError when there is none), unvalidated.
Search = Callable[[JobSpec, float], Plan]


def tied_rule_binds(plan: Plan, job: JobSpec) -> bool:
    """Whether ``plan`` breaks the tied-embedding rule of ``job``'s runtime."""
    configs = [s.plan.config for s in plan.stages]
    return bool(shared_embedding_problems(configs, profile(job.planner.framework), job.model))


def _limited(job: JobSpec, **ends) -> JobSpec:
    return replace(job, constraints=replace(job.constraints, **ends))


def _tp_values(job: JobSpec) -> list[int]:
    """Every TP degree a stage may run: powers of two up to the largest node."""
    largest = max(g.gpus_per_node for g in job.cluster.groups)
    return [1 << k for k in range(largest.bit_length()) if (1 << k) <= largest]


def _dp_values(job: JobSpec) -> list[int]:
    """Every DP degree a stage may run: the divisors of the global batch up to the GPUs."""
    gpus = sum(g.count * g.gpus_per_node for g in job.cluster.groups)
    batch = job.training.global_batch
    return [d for d in range(1, min(batch, gpus) + 1) if batch % d == 0]


def _best(search: Search, job: JobSpec, upper: float) -> Plan | None:
    try:
        return search(job, upper)
    except InfeasibleError:
        return None


def plan_tied_ends(job: JobSpec, search: Search, upper: float = math.inf) -> Plan | None:
    """The best plan of ``job`` that obeys the tied-embedding rule (None: none beats ``upper``).

    ``search`` is the planner's exact search (see :data:`Search`); the cases are described in
    the module docstring."""
    best: Plan | None = None
    for t in _tp_values(job):
        bar = best.iteration_time_s if best is not None else upper
        found = _best(search, _limited(job, end_tp=(t,)), bar)
        if found is not None and tied_rule_binds(found, job):
            found = _by_first_dp(job, search, t, bar)
        if found is not None and (best is None or found.iteration_time_s < best.iteration_time_s):
            best = found
    return best


def _by_first_dp(job: JobSpec, search: Search, t: int, upper: float) -> Plan | None:
    """The best plan with both end stages at ``tp = t`` and end DP degrees that divide one
    another, split by the first stage's DP degree."""
    best: Plan | None = None
    values = _dp_values(job)
    for a in values:
        fits = tuple(d for d in values if a % d == 0 or d % a == 0)
        bar = best.iteration_time_s if best is not None else upper
        found = _best(search, _limited(job, end_tp=(t,), first_dp=(a,), last_dp=fits), bar)
        if found is not None and (best is None or found.iteration_time_s < best.iteration_time_s):
            best = found
    return best
