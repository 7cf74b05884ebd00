"""Choosing n_micro: the exact sweep behind ``n_micro = "auto"``.

Per-micro-batch latency changes with the micro-batch size (GEMM efficiency) and activation memory
with both the size and the in-flight count, so every ``n`` is planned afresh and composed exactly.
"""

from __future__ import annotations

from solver.errors import InfeasibleError
from solver.plan import Plan
from solver.planner import PlannerConfig, plan_job
from solver.specs import JobSpec

MAX_AUTO_MICRO = 128


def candidate_n_micro(job: JobSpec, limit: int = MAX_AUTO_MICRO) -> list[int]:
    """Micro-batch counts that divide the global batch, up to ``limit``."""
    b = job.training.global_batch
    return [n for n in range(1, min(b, limit) + 1) if b % n == 0]


def plan_auto(job: JobSpec, config: PlannerConfig = PlannerConfig()) -> Plan:
    """``plan_job`` at the job's n_micro, or the best over :func:`candidate_n_micro` for "auto"."""
    if job.training.n_micro is not None:
        return plan_job(job, config)
    best: Plan | None = None
    reasons = []
    for n in candidate_n_micro(job):
        try:
            plan = plan_job(job, config, n_micro=n)
        except InfeasibleError as exc:
            reasons.append(str(exc))
            continue
        if best is None or plan.iteration_time_s < best.iteration_time_s * (1 - 1e-12):
            best = plan
    if best is None:
        raise InfeasibleError(reasons[-1] if reasons else "no n_micro divides the global batch")
    return best
