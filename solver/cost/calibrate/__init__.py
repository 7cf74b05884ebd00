"""Calibration against measured runs: the SC'21 table and the GEMM-efficiency fit.

Takes measured rows and the cost model; hands on fitted constants and their errors.
"""
