"""The single-pipeline stage search: candidate stage configurations, the node-group
composition passes, interleaving, and the solver dispatch (DP, CP-SAT, MILP, brute force).

Takes a JobSpec and its islands; hands on a Plan proven optimal over its candidates.
"""
