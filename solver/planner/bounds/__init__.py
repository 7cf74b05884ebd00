"""Lower bounds on a pipeline's step time (compute floors) that let the search skip
slices and groups without losing the optimum.

Takes stage candidates and islands; hands on floor tables the search reads.
"""
