"""The independent validator: re-derives a plan's memory, time and runtime rules from the
plan itself and the spec, sharing no cost code with the search.

Takes a Plan and its JobSpec; hands on the problems found (an empty list: the plan is valid).
"""
