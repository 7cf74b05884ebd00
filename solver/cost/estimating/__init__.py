"""Pricing a layout the user gives (``tangram estimate``): a whole plan's time and memory
from a stated TP/PP/DP layout, and reading such layouts from TOML.

Takes a layout and a JobSpec; hands on the priced plan.
"""
