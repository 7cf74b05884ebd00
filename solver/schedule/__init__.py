"""Step 6, the schedule: a plan's pipeline simulated event by event, beside its closed form.

Takes in a validated :class:`~solver.planner.Plan` (or a bare :class:`PipelineSpec` of stage
forward/backward times and link times). :mod:`solver.schedule.simulator` runs GPipe, 1F1B or
interleaved 1F1B by list scheduling; :mod:`solver.schedule.report` hands on the simulated
iteration time, bubble and peak in-flight micro-batches per stage, and the closed forms (eq. 5,
eq. 9, GPipe's exact makespan) to compare with.
"""

from solver.schedule.report import (SimulatedPlan, check_objectives, closed_form, run_simulation,
                                    simulate_plan)
from solver.schedule.simulator import (EventKind, LinkDuplex, PipelineSpec, ScheduleKind,
                                       SimResult, TransferMode, simulate)

__all__ = ["EventKind", "LinkDuplex", "PipelineSpec", "ScheduleKind", "SimResult",
           "SimulatedPlan", "TransferMode", "check_objectives", "closed_form", "run_simulation",
           "simulate", "simulate_plan"]
