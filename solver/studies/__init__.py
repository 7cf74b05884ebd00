"""Step 7, studies built on the planner: they call it many times and compare the answers.

Takes in jobs (and, for re-planning, a previous plan and a cluster change). Hands on tables of
results: the n_micro sweep against eq. (10) (:mod:`~solver.studies.sweep`), the τ_C sweep of the
islands (:mod:`~solver.studies.island_sweep`), Pareto fronts of time against cost and energy and
their budget cross-check (:mod:`~solver.studies.pareto`, :mod:`~solver.studies.budget`),
re-planning after failures (:mod:`~solver.studies.replan`, reading the previous plan back:
:mod:`~solver.studies.previous`), the pruning ablation and solver cross-check
(:mod:`~solver.studies.verify`), the benchmark suite (:mod:`~solver.studies.bench`, its rows
:mod:`~solver.studies.bench_rows`) and seeded random jobs (:mod:`~solver.studies.generate`). Each module is imported by the
command that uses it; nothing is re-exported here.
"""
