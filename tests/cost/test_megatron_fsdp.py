"""Megatron-FSDP: Megatron-Core's ZeRO-3, a layout the runtime runs and the search now reaches.

Megatron-LM's ``--use-megatron-fsdp --data-parallel-sharding-strategy optim_grads_params``
(``_add_distributed_args``, ``megatron/training/arguments.py``, core_v0.14.0) wraps every
``TransformerLayer`` as one FSDP unit (``FullyShardedDataParallel.__init__``,
``megatron/core/distributed/fsdp/mcore_fsdp_adapter.py``), gathers a unit's weights before its
forward and backward and reduce-scatters its gradients after every backward
(``grad_reduce_every_bprop`` in ``MegatronFSDP``'s post-backward hook, ``megatron_fsdp.py``).
So its collectives are the cost model's per-layer ZeRO-3, paid every micro-batch.
"""

from __future__ import annotations

import pytest

from solver.cli.main import main
from solver.cost.estimating.estimate import EstimateSetup, estimate
from solver.cost.runtime.frameworks import profile, violations, zero_choices
from solver.cost.stage import StageConfig
from solver.spec.domain import Framework, Island, Precision, Recompute
from solver.spec.loaders import INSTANCES, load_catalog, load_model

CAT = load_catalog()
MODEL = load_model(INSTANCES / "models" / "llama3-8b.toml")
#: Two 8-GPU H100 nodes, one data-parallel group of 16 over NVLink and the network.
ISLAND = Island.homogeneous("2xH100", CAT["H100-SXM-80GB"], 16, 8, 400.0)


def _setup(framework: Framework, zero: int, n_micro: int) -> EstimateSetup:
    config = StageConfig(tp=1, dp=16, zero=zero, micro_batch=1)
    return EstimateSetup(MODEL, ISLAND, 16 * n_micro, 4096, config, framework=framework,
                         precision=Precision.BF16)


def test_megatron_core_reaches_zero3_for_one_stage_only():
    prof = profile(Framework.MEGATRON_CORE)
    # ZeRO-0 is dominated by ZeRO-1 (the distributed optimizer); ZeRO-3 is Megatron-FSDP.
    assert zero_choices(prof, False) == (1, 3)
    assert zero_choices(prof, True) == (1,)
    c = StageConfig(tp=1, dp=16, zero=3, micro_batch=1)
    assert violations([c], prof, False) == []
    assert any("not ZeRO-3" in v for v in violations([c, c], prof, True))
    # FlagScale's hetero meshes and DeepSpeed's stages are unchanged.
    assert zero_choices(profile(Framework.FLAGSCALE), False) == (1,)
    assert zero_choices(profile(Framework.DEEPSPEED), False) == (0, 1, 2, 3)


def test_megatron_fsdp_collectives_are_paid_every_micro_batch():
    # Nothing overlapped (the raw totals): 4 micro-batches gather and reduce-scatter 4 times
    # what one does; ZeRO-1's once-per-iteration sync does not grow with them.
    one = estimate(_setup(Framework.MEGATRON_CORE, 3, 1)).communication.dp.total_s
    four = estimate(_setup(Framework.MEGATRON_CORE, 3, 4)).communication.dp.total_s
    assert one > 0 and four == pytest.approx(4 * one, rel=1e-12)
    z1 = [estimate(_setup(Framework.MEGATRON_CORE, 1, m)).communication.dp.total_s
          for m in (1, 4)]
    assert z1[0] == pytest.approx(z1[1], rel=1e-12)


def test_megatron_fsdp_units_are_fsdp_per_layer_units():
    # The same per-layer collectives of the same bytes as PyTorch FSDP's FULL_SHARD: the raw
    # (nothing hidden) ZeRO-3 traffic of the two runtimes is equal.
    mc = estimate(_setup(Framework.MEGATRON_CORE, 3, 2)).communication.dp.total_s
    fsdp = estimate(_setup(Framework.FSDP, 3, 2)).communication.dp.total_s
    assert mc == pytest.approx(fsdp, rel=1e-12)


def test_megatron_fsdp_shards_the_weights_and_gradients():
    # ZeRO-3 keeps 1/16 of the 16-bit weights and of the gradients (plus the gathered layers
    # in flight); ZeRO-1 keeps them whole. The optimizer states are sharded in both.
    z1 = estimate(_setup(Framework.MEGATRON_CORE, 1, 2)).memory
    z3 = estimate(_setup(Framework.MEGATRON_CORE, 3, 2)).memory
    assert z3.params < z1.params / 4 and z3.grads == pytest.approx(z1.grads / 16, rel=1e-9)
    assert z3.optimizer == pytest.approx(z1.optimizer, rel=1e-9)


def test_block_recomputation_runs_with_megatron_fsdp():
    # Megatron-Core's --recompute-method block is independent of the data-parallel wrapper.
    c = StageConfig(tp=1, dp=16, zero=3, micro_batch=1, recompute=Recompute.FULL,
                    recompute_layers=4)
    assert violations([c], profile(Framework.MEGATRON_CORE), False) == []
    assert violations([c], profile(Framework.FSDP), False) != []


def test_estimate_names_megatron_fsdp_and_refuses_it_with_a_pipeline(tmp_path, capsys):
    src = (INSTANCES / "estimate" / "llama3-70b-h100.toml").read_text()
    one = src.replace("zero = 1", "zero = 3").replace("pp = 4", "pp = 1").replace(
        "dp = 2", "dp = 8").replace('schedule = "interleaved"', "").replace(
        "virtual_stages = 5", "")
    (tmp_path / "one.toml").write_text(one)
    assert main(["estimate", str(tmp_path / "one.toml")]) == 0
    assert "framework megatron-core (ZeRO-3 as Megatron-FSDP)" in capsys.readouterr().out
    (tmp_path / "piped.toml").write_text(src.replace("zero = 1", "zero = 3"))
    assert main(["estimate", str(tmp_path / "piped.toml")]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.endswith("megatron-core runs ZeRO [0, 1] with pipelining, "
                                            "not ZeRO-3")
