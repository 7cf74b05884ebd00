"""The independent time check's machine: one GPU of an island and its links, derived from the
catalog and the calibration without the cost model's own link code (``solver.cost.efficiency``'s
``Links``): the NVLink domain, PCIe between peers outside it, and the NIC beyond, for rings,
strided groups and all-to-all. Used by :mod:`solver.planner.check.time_check`.
"""

from __future__ import annotations

from typing import NamedTuple

from solver.cost.efficiency import AttentionKernel, Calibration
from solver.spec.domain import Island, Precision

__all__ = ["Machine", "all_to_all", "consecutive", "machine", "ring", "strided"]


class Machine(NamedTuple):
    """One GPU of the island as the formulas see it (weakest-member figures, derated)."""

    peak: float         # GEMM FLOP/s at the precision run
    sixteen: float      # 16-bit FLOP/s (attention core)
    half: float         # FLOP/B at which a GEMM reaches half the ceiling
    ceiling: float      # largest fraction of ``peak`` a GEMM reaches
    kernel: float       # fixed seconds per GEMM kernel
    kappa: float        # in-training fraction of the stand-alone GEMM and attention speed
    attention: float | None  # fused-kernel efficiency, None when unfused
    intra: float        # bytes/s inside a node, per direction
    inter: float        # bytes/s over the NIC
    intra_lat: float
    inter_lat: float
    pcie: float
    hbm: float
    per_node: int
    nvlink: int = 0     # ranks sharing an NVLink domain (0: the node)
    pcie_peer: float = 0.0  # bytes/s between node peers outside the NVLink domain
    head_ceiling: float | None = None  # 16-bit ceiling of the LM head under FP8 (None: no FP8)
    cast: tuple[float, float] = (0.0, 0.0)  # FP8 cast bytes per element: norm output, other


def machine(island: Island, precision: Precision, calib: Calibration,
             unfused_software: bool) -> Machine:
    """The island's GPU as the formulas see it: weakest members, datasheet figures derated."""
    nodes, gpu = island.nodes, island.gpu
    sixteen = island.tflops_per_gpu * 1e12
    fused = (calib.attention is AttentionKernel.FLASH and not unfused_software
             and all(x.gpu.attention != "unfused" for x in nodes))
    intra = min((x.gpu.nvlink_gbs / 2 if x.gpu.nvlink_gbs else x.gpu.pcie_gbs) for x in nodes)
    return Machine(
        peak=sixteen * gpu.peak_tflops(precision) / gpu.peak_tflops(Precision.BF16),
        sixteen=sixteen,
        half=sixteen / (island.hbm_bw_gbs * 1e9) * max(
            calib.gemm_half_balance if x.gpu.gemm_half_balance is None
            else x.gpu.gemm_half_balance for x in nodes),
        ceiling=min(x.gpu.gemm_ceiling(precision) for x in nodes),
        kernel=max(calib.gemm_latency_s if x.gpu.gemm_latency_us is None
                   else x.gpu.gemm_latency_us / 1e6 for x in nodes),
        kappa=min(calib.gemm_in_training if x.gpu.gemm_in_training is None
                  else x.gpu.gemm_in_training for x in nodes),
        attention=min(x.gpu.attention_eff for x in nodes) if fused else None,
        intra=intra * 1e9 * calib.nvlink_eff, inter=island.nic_gbits * 1e9 / 8 * calib.nic_eff,
        intra_lat=calib.nvlink_latency_s, inter_lat=calib.nic_latency_s,
        pcie=island.pcie_gbs * 1e9 * calib.pcie_eff, hbm=island.hbm_bw_gbs * 1e9 * calib.hbm_eff,
        **_domain(island, intra * 1e9 * calib.nvlink_eff,
                  island.pcie_gbs * 1e9 * calib.pcie_eff), **_fp8(island, precision))


def _fp8(island: Island, precision: Precision) -> dict:
    """What FP8 changes when every GPU of the island runs it: the LM head stays 16-bit
    (Megatron-Core's output layer is outside Transformer Engine), and every GEMM operand is
    cast: amax pass, read, one byte written (5 B; 3 B for a norm's output, whose kernel takes
    the amax), plus a transposed byte where FP8 GEMMs are TN-only (not Blackwell); MXFP8:
    read, row- and column-wise bytes (4 B)."""
    gpus = [x.gpu for x in island.nodes]
    if not all(g.runs_fp8(precision) for g in gpus):
        return {}
    if precision is Precision.FP8_MX:
        cast = (4.0, 4.0)
    else:
        extra = 0.0 if all(g.mxfp8 for g in gpus) else 1.0
        cast = (3.0 + extra, 5.0 + extra)
    return {"head_ceiling": min(g.gemm_ceiling(Precision.BF16) for g in gpus), "cast": cast}


def _domain(island: Island, intra: float, pcie: float) -> dict:
    """NVLink domain of the island (GPU catalog ``nvlink_domain``): rack-scale above 8 GPUs
    (NVL72 spans servers), else at most the server; the server reaches the GPUs outside the
    domain over PCIe (never faster than NVLink)."""
    size = min(x.gpu.nvlink_domain for x in island.nodes)
    nvlink = size if size > 8 else min(size, island.gpus_per_node)
    per_node = max(nvlink, island.gpus_per_node)
    peer = intra if nvlink >= island.gpus_per_node else min(pcie, intra)
    return {"per_node": per_node, "nvlink": nvlink, "pcie_peer": peer}


def ring(nbytes: float, q: float, bw: float, lat: float, phases: float = 1.0) -> float:
    """Ring collective over ``q`` ranks: ``phases`` (q - 1) steps of ``nbytes / q`` each."""
    if q <= 1:
        return 0.0
    steps = phases * (q - 1)
    return steps * nbytes / q / bw + steps * lat


def consecutive(g: Machine, span: float) -> tuple[float, float]:
    """Link of a group of ``span`` consecutive ranks: NVLink if it fits in the NVLink domain,
    PCIe if in the node (or rack), else the NIC."""
    if span <= g.nvlink:
        return g.intra, g.intra_lat
    return (g.pcie_peer, g.intra_lat) if span <= g.per_node else (g.inter, g.inter_lat)


def _members_per_node(g: Machine, stride: int, group: int) -> int:
    """Members of a group of ranks ``stride`` apart that share one node (rails in use)."""
    return min(max(g.per_node // max(stride, 1), 1), max(group, 1))


def strided(g: Machine, stride: int, group: int) -> tuple[float, float]:
    """Link of ``group`` ranks ``stride`` apart: NVLink in a node, else one ring per rail."""
    if stride * group <= g.nvlink:
        return g.intra, g.intra_lat
    if stride * group <= g.per_node:
        return g.pcie_peer, g.intra_lat
    return min(g.pcie_peer, _members_per_node(g, stride, group) * g.inter), g.inter_lat


def all_to_all(g: Machine, nbytes: float, stride: int, group: int) -> float:
    """Each of ``group`` ranks ``stride`` apart sends ``nbytes`` spread evenly over the group."""
    if group <= 1:
        return 0.0
    k = _members_per_node(g, stride, group)
    # Of the k members in reach without the NIC, those of one NVLink domain use NVLink, the
    # rest of the server PCIe.
    k_nv = min(max(g.nvlink // max(stride, 1), 1), k)
    on_nvlink = (k_nv - 1) / group * nbytes / g.intra
    on_pcie = (k - k_nv) / group * nbytes / g.pcie_peer
    on_nic = (group - k) / group * nbytes / g.inter
    return (max(on_nvlink, on_pcie, on_nic)
            + (g.inter_lat if group > k else g.intra_lat) * (group - 1))
