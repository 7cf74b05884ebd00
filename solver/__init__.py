"""Tangram planner: parallelization plans for LLM training on mixed-GPU clusters."""

__version__ = "0.1.0"
