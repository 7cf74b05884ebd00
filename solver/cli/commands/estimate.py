"""``tangram estimate CONFIG [--json]``: time, throughput and memory of one fixed configuration."""

from __future__ import annotations

import argparse
import dataclasses

from solver.cli.report import emit_json
from solver.cost.estimating.estimate import Estimate, EstimateSetup, estimate
from solver.cost.estimating.estimate_config import load_estimate_setup
from solver.cost.reserve import device_bytes, usable_bytes
from solver.cost.runtime.frameworks import megatron_fsdp


def register(sub: argparse._SubParsersAction) -> None:
    """Add the ``estimate`` subcommand."""
    p = sub.add_parser("estimate",
                       help="estimate iteration time, throughput and memory of one configuration")
    p.add_argument("config", metavar="CONFIG", help="estimate TOML file (see instances/estimate)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Load the CONFIG, estimate, print."""
    setup, calib = load_estimate_setup(args.config)
    result = estimate(setup, calib)
    if args.json:
        emit_json(result.to_json(), args)
    else:
        print("\n".join(_lines(setup, result)))
    return 0


def _lines(setup: EstimateSetup, e: Estimate) -> list[str]:
    c, isl = e.config, setup.island
    sched = ("interleaved" if e.virtual_stages > 1 else "1f1b" if setup.auto_virtual_stages
             else setup.schedule.value)
    sched += (f" (v={e.virtual_stages})" if e.virtual_stages > 1 else "")
    sched += " (v chosen: fastest that fits)" if setup.auto_virtual_stages else ""
    gemm = isl.gpu.runs_in(setup.precision)
    limit = usable_bytes(isl, setup.epsilon) / 1e9
    m = e.memory
    lines = [
        f"model {setup.model.name} on {isl.gpus} x {isl.gpu.name} "
        f"({isl.gpus_per_node} per node, {isl.nic_gbits:g} Gb/s per GPU)",
        f"parallel: tp {c.tp}, pp {c.pp}, dp {c.dp}, cp {c.cp}, ep {c.ep}, zero {c.zero}, "
        f"recompute {c.recompute.value}, offload {'yes' if c.offload else 'no'}, schedule {sched}",
        f"framework {setup.framework.value}"
        + (" (ZeRO-3 as Megatron-FSDP)" if megatron_fsdp(setup.framework, c) else "")
        + f", precision {setup.precision.value} (GEMMs in {gemm} on {isl.gpu.name})",
        f"micro-batch {c.micro_batch} sequences per replica, {e.n_micro} micro-batches per iteration"
        + (" (chosen: fastest that fits)" if setup.auto_micro_batch else ""),
        f"iteration time {e.iteration_time_s:.3f} s, {e.tokens_per_s:,.0f} tokens/s, "
        f"{e.tflops_per_gpu:.1f} TFLOP/s per GPU (MFU {e.mfu:.1%}{_fp8_share(setup, e)})",
        f"memory per GPU (most loaded): params {m.params:.1f} GB, grads {m.grads:.1f} GB, "
        f"optimizer {m.optimizer:.1f} GB, activations {m.activations:.1f} GB, "
        f"allocator fragmentation {m.fragmentation:.1f} GB, total {m.total:.1f} GB "
        + (f"(fits in {limit:.1f} GB usable)" if e.fits
           else f"(DOES NOT FIT in {limit:.1f} GB usable)")
        + f" of {device_bytes(isl) / 1e9:.1f} GB on the device",
        "time per iteration by cause:",
    ]
    for name, seconds in dataclasses.asdict(e.breakdown).items():
        share = seconds / e.iteration_time_s if e.iteration_time_s else 0.0
        lines.append(f"  {name:<10} {seconds:10.3f} s  {share:6.1%}")
    if e.communication is not None:
        lines.append("communication per iteration (total -> exposed after overlap):")
        for name, t in dataclasses.asdict(e.communication).items():
            lines.append(f"  {name:<10} {t['total_s']:10.3f} s -> {t['exposed_s']:8.3f} s")
    return lines


def _fp8_share(setup: EstimateSetup, e: Estimate) -> str:
    """Under FP8 the MFU above is of the 16-bit peak (the convention for mixed FP8 runs, where
    attention and the LM head stay 16-bit); say so, with the share of the FP8 peak beside it."""
    if e.mfu_fp8 is None:
        return ""
    return f" of the 16-bit peak; {e.mfu_fp8:.1%} of the FP8 peak"
