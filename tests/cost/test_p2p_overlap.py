"""Pipeline transfers under Megatron's interleaved schedule run beside compute.

Megatron-LM's ``overlap_p2p_comm`` is on unless ``--no-overlap-p2p-communication`` is given and
``validate_args`` (``megatron/training/arguments.py``) turns it off without virtual stages. In
``forward_backward_pipelining_with_interleaving`` (``megatron/core/pipeline_parallel/
schedules.py``) a forward chunk posts its send and the next receive asynchronously and the
backward chunk that follows runs before the wait (and the other way round), so a pass's
transfers are exposed only beyond the other pass's compute. Plain 1F1B (``batch_p2p_comm``)
and Megatron-LM 2021 wait on every transfer.
"""

from __future__ import annotations

import pytest

from solver.cost.efficiency import DEFAULT_CALIBRATION
from solver.cost.runtime.frameworks import PROFILES, Runtime
from solver.cost.stage import ConfigArrays, ModelSlice, StageConfig
from solver.cost.stage_costs import PipelineSetting, stage_costs
from solver.planner.check.time_check import stage_seconds
from solver.spec.domain import Framework, Island, ModelSpec, Schedule
from solver.spec.loaders import load_catalog

CAT = load_catalog()
#: GPT 314B's shape (Megatron-LM's H100 table): 96 layers of hidden 16,384.
GPT = ModelSpec("gpt-314b", layers=96, hidden=16384, ffn=65536, heads=128, kv_heads=128,
                vocab=131072, gated_mlp=False, tied_embeddings=False)
#: tp 8, pp 8 over 48 data-parallel ranks: neighbouring stages sit 384 ranks apart.
CFG = StageConfig(tp=8, pp=8, dp=48, zero=1, micro_batch=1)


def _costs(framework, v, island=None, model=GPT, cfg=CFG):
    island = island or Island.homogeneous("h", CAT["H100-SXM-80GB"], 3072, 8, 400.0)
    schedule = Schedule.INTERLEAVED if v > 1 else Schedule.ONE_F_ONE_B
    pipe = PipelineSetting(n_micro=32, in_flight=8, schedule=schedule, virtual_stages=v)
    return stage_costs(ModelSlice.whole(model), island, 4096, ConfigArrays.of([cfg]), pipe,
                       DEFAULT_CALIBRATION, Runtime(framework))


def test_one_transfer_by_hand():
    """Each TP rank sends its eighth of a micro-batch's 4,096 x 16,384 activation in 16 bits
    (16.78 MB) over its 400 Gb/s NIC at 85 % (42.5 GB/s), plus the network step latency:
    about 0.395 ms per boundary and pass. Plain 1F1B exposes it, forward and backward."""
    t = 4096 * 16384 * 2 / 8 / (400 / 8 * 1e9 * 0.85) + DEFAULT_CALIBRATION.nic_latency_s
    assert t == pytest.approx(0.395e-3, rel=0.02)
    plain = _costs(Framework.MEGATRON_CORE, 1)
    assert float(plain.fwd.p2p[0]) == pytest.approx(t, rel=1e-9)
    assert float(plain.bwd.p2p[0]) == pytest.approx(t, rel=1e-9)
    # Megatron-LM 2021 interleaved: every one of the 12 chunks' transfers waits.
    old = _costs(Framework.MEGATRON_2021, 12)
    assert float(old.fwd.p2p[0]) == pytest.approx(12 * t, rel=1e-9)


def test_interleaved_megatron_core_hides_them():
    """12 chunks of one layer: 4.7 ms of transfers per pass beside one layer's backward and
    forward (tens of ms each) hide entirely; the pass's compute is the same."""
    hidden, waited = _costs(Framework.MEGATRON_CORE, 12), _costs(Framework.MEGATRON_2021, 12)
    assert float(hidden.fwd.p2p[0]) == float(hidden.bwd.p2p[0]) == 0.0
    assert float(hidden.bwd.compute[0]) > float(waited.fwd.p2p[0])
    assert PROFILES[Framework.MEGATRON_CORE].overlap_p2p
    assert not PROFILES[Framework.MEGATRON_2021].overlap_p2p


def test_only_the_excess_is_exposed():
    """A slow link (1 Gb/s per node, one GPU per node) and a small model: a transfer outlasts the
    other pass, and exactly the excess shows: the forward's transfers beyond the backward's
    compute, the backward's beyond the forward's."""
    small = ModelSpec("small", layers=8, hidden=4096, ffn=16384, heads=32, kv_heads=32,
                      vocab=32000, gated_mlp=False, tied_embeddings=False)
    island = Island.homogeneous("slow", CAT["H100-SXM-80GB"], 4, 1, 1.0)
    cfg = StageConfig(tp=1, pp=4, dp=1, zero=0, micro_batch=1)
    over = _costs(Framework.MEGATRON_CORE, 2, island, small, cfg)
    waited = _costs(Framework.MEGATRON_2021, 2, island, small, cfg)
    whole = float(waited.fwd.p2p[0])
    # Two chunks, each 4096 x 4096 x 2 bytes over 1 Gb/s at 85 %: about 0.63 s per transfer.
    assert whole == pytest.approx(2 * (4096 * 4096 * 2 / (0.125e9 * 0.85)
                                       + DEFAULT_CALIBRATION.nic_latency_s), rel=1e-9)
    bwd_work = float(over.bwd.compute[0] + over.bwd.recompute[0])
    assert 0 < bwd_work < whole
    assert float(over.fwd.p2p[0]) == pytest.approx(whole - bwd_work, rel=1e-9)
    assert float(over.bwd.p2p[0]) == pytest.approx(whole - float(over.fwd.compute[0]), rel=1e-9)


@pytest.mark.parametrize("v", [1, 2, 12])
def test_validator_agrees(v):
    """The independent time check restates the rule (plain, two and twelve chunks)."""
    costs = _costs(Framework.MEGATRON_CORE, v)
    island = Island.homogeneous("h", CAT["H100-SXM-80GB"], 3072, 8, 400.0)
    latencies, _ = stage_seconds(GPT, 4096, island, CFG, GPT.layers, True, True,
                                 profile=PROFILES[Framework.MEGATRON_CORE], p2p_factor=float(v))
    assert max(latencies) == pytest.approx(float(costs.latency_s[0]), rel=1e-9)
