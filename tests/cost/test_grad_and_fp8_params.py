"""Gradient buffers in bf16 (``--grad-reduce-in-bf16``) and FP8 weights as the parameters
(``--fp8-param-gather``): what they change in memory and in data-parallel traffic.

Sources: Megatron-LM ``megatron/training/arguments.py`` (``validate_args``: bf16 training turns
on ``accumulate_allreduce_grads_in_fp32`` unless ``--grad-reduce-in-bf16``; ``--fp8-param-gather``
needs the distributed optimizer or an FSDP); Megatron-Bridge ``scripts/performance`` at 97ad8cc6
(``ddp.grad_reduce_in_fp32 = False`` in every model's common settings; ``utils/precision.py``:
its FP8 precisions set ``fp8_param_gather = True``).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from solver.cost.efficiency import DEFAULT_CALIBRATION
from solver.cost.memory import model_state_bytes, weight_bytes
from solver.cost.runtime.frameworks import Runtime
from solver.cost.stage import ConfigArrays, ModelSlice, StageConfig
from solver.cost.stage_costs import PipelineSetting, _time_inputs, stage_costs
from solver.cost.sync import _zero_and_sync
from solver.planner.check.time_check import stage_seconds
from solver.spec.domain import Framework, Island, ModelSpec, Precision
from solver.spec.loaders import load_catalog

CAT = load_catalog()
# Two layers of 12 h^2 + 2 h weights (h = 1024, GELU MLP, RMSNorm): 12,584,960 parameters.
TINY = ModelSpec("tiny", layers=2, hidden=1024, ffn=4096, heads=16, kv_heads=16, vocab=32000,
                 gated_mlp=False)


def test_weight_bytes_by_hand():
    """16-bit weights 2 B; under FP8 plus Transformer Engine's FP8 copy and transpose (2 B);
    with FP8 weights as the parameters 1 B; without FP8 GEMMs the flag changes nothing."""
    assert weight_bytes(False) == 2.0 and weight_bytes(True) == 4.0
    assert weight_bytes(True, True) == 1.0 and weight_bytes(False, True) == 2.0


def test_state_bytes_by_hand():
    """Two layers, no embedding or head, ZeRO-1 over DP 2: P = 2 (12 h^2 + 2 h) parameters.
    Megatron-LM's default under FP8: weights 4 P, fp32 gradients 4 P, Adam 12 P / 2. Bridge's
    settings: weights 1 P, bf16 gradients 2 P, Adam unchanged."""
    p = 2 * (12 * 1024 ** 2 + 2 * 1024)
    assert TINY.params_per_layer * 2 == p
    cfg = ConfigArrays.of([StageConfig(dp=2, zero=1)])
    args = (TINY, cfg, np.asarray(2), np.asarray(False), np.asarray(False), False, True)
    w, g, o = (float(x[0]) for x in model_state_bytes(*args))
    assert (w, g, o) == (4.0 * p, 4.0 * p, 6.0 * p)
    w, g, o = (float(x[0]) for x in model_state_bytes(*args, grad_bytes=2.0, fp8_params=True))
    assert (w, g, o) == (1.0 * p, 2.0 * p, 6.0 * p)


def test_traffic_halves_with_the_bytes():
    """ZeRO-3 over 8 GPUs of one HGX B200 board, no overlap priced: the per-micro-batch gather
    moves FP8 weights (1 B, half of 2 B) and the reduce-scatter bf16 gradients (2 B, half of
    4 B); each ring's time is bandwidth plus (q - 1) latencies, so the bandwidth parts halve."""
    island = Island.homogeneous("b", CAT["B200"], 8)
    runtime = Runtime(Framework.FSDP, Precision.FP8, overlap=False)
    cfg = ConfigArrays.of([StageConfig(dp=8, zero=3)])
    args = (cfg, np.array([2]), np.array([False]), np.array([False]), np.array([1.0]),
            np.array([1.0]), 0.0)
    base = _time_inputs(TINY, island, 1024, DEFAULT_CALIBRATION, runtime)
    bridge = _time_inputs(TINY, island, 1024, DEFAULT_CALIBRATION, dataclasses.replace(
        runtime, grad_reduce_bf16=True, fp8_param_gather=True))
    fwd0, bwd0 = (float(x[0]) for x in _zero_and_sync(base, *args)[:2])
    fwd1, bwd1 = (float(x[0]) for x in _zero_and_sync(bridge, *args)[:2])
    _, lat = base.links.data_parallel(1, 8)
    steps = 7 * lat  # one ring of 8 over NVLink (FSDP: one collective per layer and pass)
    assert fwd1 - 2 * steps == pytest.approx((fwd0 - 2 * steps) / 2, rel=1e-9)
    scatter0, scatter1 = bwd0 - fwd0, bwd1 - fwd1
    assert scatter1 - 2 * steps == pytest.approx((scatter0 - 2 * steps) / 2, rel=1e-9)


@pytest.mark.parametrize("zero", [0, 1, 3])
def test_validator_agrees_under_bridge_settings(zero):
    """The independent time check prices the same traffic under Bridge's settings."""
    island = Island.homogeneous("b", CAT["B200"], 16)
    runtime = Runtime(Framework.MEGATRON_CORE if zero < 3 else Framework.FSDP, Precision.FP8,
                      grad_reduce_bf16=True, fp8_param_gather=True)
    c = StageConfig(tp=2, dp=8, zero=zero, micro_batch=2)
    slc = ModelSlice(TINY, 2, True, True)
    costs = stage_costs(slc, island, 1024, ConfigArrays.of([c]), PipelineSetting(4, 1),
                        DEFAULT_CALIBRATION, runtime)
    subs, per_iter = stage_seconds(TINY, 1024, island, c, 2, True, True,
                                   profile=runtime.profile, precision=Precision.FP8,
                                   grad_bytes=2.0, fp8_params=True)
    assert subs[0] == pytest.approx(float(costs.latency_s[0]), rel=1e-9)
    assert per_iter == pytest.approx(float(costs.iteration_s[0]), rel=1e-9)


def _estimate_file(tmp_path, training: str, zero: int = 1):
    from solver.spec.loaders import INSTANCES
    text = (INSTANCES / "estimate" / "llama3-70b-h100.toml").read_text()
    text = text.replace("seq_len = 8192", "seq_len = 8192\n" + training)
    text = text.replace("zero = 1", f"zero = {zero}")
    path = tmp_path / "e.toml"
    path.write_text(text)
    return path


def test_estimate_file_reads_the_settings(tmp_path):
    """``grad_reduce`` and ``fp8_param_gather`` reach the runtime ``tangram estimate`` prices;
    absent, Megatron-LM's defaults (fp32 gradients, 16-bit weights)."""
    from solver.cost.estimating.estimate_config import load_estimate_setup
    setup, _ = load_estimate_setup(_estimate_file(tmp_path, ""))
    assert (setup.runtime.grad_bytes, setup.runtime.fp8_param_gather) == (4.0, False)
    path = _estimate_file(tmp_path, 'precision = "fp8"\ngrad_reduce = "bf16"\n'
                          'fp8_param_gather = true')
    setup, _ = load_estimate_setup(path)
    assert (setup.runtime.grad_bytes, setup.runtime.fp8_param_gather) == (2.0, True)


@pytest.mark.parametrize("training, zero, key", [
    ('grad_reduce = "fp16"', 1, "training.grad_reduce"),
    ("fp8_param_gather = true", 1, "training.fp8_param_gather"),  # bf16: no FP8 weights
    ('precision = "fp8"\nfp8_param_gather = true', 0, "training.fp8_param_gather"),
])
def test_estimate_file_refuses_what_megatron_refuses(tmp_path, capsys, training, zero, key):
    """One line, exit status 2: an unknown gradient type, FP8 weights without FP8, and FP8
    weights without the distributed optimizer (Megatron-LM's ``validate_args``)."""
    from solver.cli.main import main
    path = _estimate_file(tmp_path, training, zero)
    assert main(["estimate", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith(f"error: {path}: {key}:")
