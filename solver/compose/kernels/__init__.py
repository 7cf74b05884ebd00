"""The node-group DP's inner kernels, each twice: NumPy versions (small jobs, no compiler
start-up) and numba-compiled ones (large jobs), chosen per call by ``kernel_switch``; both give
the same floats.

Takes the DP's level arrays; hands on latencies, masks and bounds.
"""
