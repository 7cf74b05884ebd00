"""Step 3, the cost of one model slice on one homogeneous island, and the best ways to run it.

Takes in a :class:`ModelSlice` (layers, with or without embedding and LM head), an island (its
weakest member's figures) and a :class:`PlanContext` (sequence, micro-batch, micro-batches in
flight, memory margin, features). The vectorized cost model (:mod:`solver.cost.stage_costs`,
with :mod:`~solver.cost.timing`, :mod:`~solver.cost.memory` and the constants of
:mod:`~solver.cost.efficiency`) prices thousands of :class:`StageConfig` at once; the
:class:`AnalyticParallelizer` hands on the Pareto set of :class:`PartialPlan` (latency,
per-iteration time, memory) per boundary layout (the partial-plan types:
:mod:`solver.cost.partial`). :func:`estimate` prices one fixed
configuration of a whole model (``tangram estimate``); :mod:`solver.cost.calibrate.calibration` is the
fit on Megatron-LM SC'21 Table 1.
"""

from solver.cost.efficiency import DEFAULT_CALIBRATION, Calibration
from solver.cost.estimating.estimate import Estimate, EstimateSetup, estimate
from solver.cost.parallelizer import (AnalyticParallelizer, MemoryBreakdown, Parallelizer,
                                      PartialPlan, PlanContext, best_plan)
from solver.cost.stage import ConfigArrays, ModelSlice, StageConfig
from solver.cost.stage_costs import PipelineSetting, stage_costs, substage_latencies

__all__ = ["AnalyticParallelizer", "Calibration", "ConfigArrays", "DEFAULT_CALIBRATION",
           "Estimate", "EstimateSetup", "MemoryBreakdown", "ModelSlice", "Parallelizer",
           "PartialPlan", "PipelineSetting", "PlanContext", "StageConfig", "best_plan",
           "estimate", "stage_costs", "substage_latencies"]
