"""Optimization-model formulations (OR-Tools CP-SAT, PuLP MILP) built on solver's domain types."""
