"""Tangram planner: parallelization plans for LLM training on mixed-GPU clusters.

The subpackages are the steps of the pipeline, in data-flow order: :mod:`solver.spec` (the job,
validated) → :mod:`solver.islands` (homogeneous GPU islands) → :mod:`solver.cost` (cost model and
homogeneous parallelizer) → :mod:`solver.compose` (exact composition of a latency table) →
:mod:`solver.planner` (candidates, pruning, search, validated plan) → :mod:`solver.schedule`
(pipeline simulation) → :mod:`solver.studies` (sweeps, fronts, re-planning, verification,
benchmarks) → :mod:`solver.cli` (the ``tangram`` command). Each imports only those before it.
"""

__version__ = "0.1.0"
