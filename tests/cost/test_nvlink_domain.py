"""TP, CP and EP get NVLink only inside the GPU's NVLink domain (hand-computed bandwidths)."""

from __future__ import annotations

import numpy as np
import pytest

from solver.cost.efficiency import Calibration, Links
from solver.spec.domain import Island
from solver.spec.loaders import load_catalog

CAT = load_catalog()
C = Calibration()


def _links(gpu: str, gpus: int, per_node: int) -> Links:
    return Links.of(Island.homogeneous("t", CAT[gpu], gpus, per_node), C)


def test_h100_nvl_pairs_nvlink_then_pcie_then_nic():
    """H100 NVL: NVLink bridge joins pairs (600 GB/s -> 300 per direction x 0.78); four GPUs
    of one server talk over PCIe Gen5 (64 GB/s x 0.8); two servers over the NIC (400/8 x 0.85)."""
    links = _links("H100-NVL-94GB", 16, 8)
    bw, _ = links.select(np.array([2, 4, 8, 16]))
    assert bw.tolist() == pytest.approx([300e9 * 0.78, 64e9 * 0.8, 64e9 * 0.8, 50e9 * 0.85])


def test_hgx_h100_unchanged_nvlink_in_the_server():
    links = _links("H100-SXM-80GB", 16, 8)
    bw, _ = links.select(np.array([8, 16]))
    assert bw.tolist() == pytest.approx([450e9 * 0.78, 50e9 * 0.85])


def test_nvl72_nvlink_across_compute_trays():
    """GB200 trays hold 4 GPUs, but the NVLink domain is the 72-GPU rack: a group of 64 runs on
    NVLink (900 GB/s per direction x 0.78), a group of 128 leaves the rack on the NIC."""
    links = _links("GB200", 256, 4)
    bw, _ = links.select(np.array([4, 64, 72, 128]))
    assert bw.tolist() == pytest.approx([900e9 * 0.78] * 3 + [50e9 * 0.85])


def test_all_to_all_on_nvl72_stays_on_nvlink():
    """EP 32 at stride 1 inside a rack: 31/32 of 1 GB over NVLink, nothing on the NIC."""
    links = _links("GB200", 256, 4)
    t = float(links.all_to_all(np.asarray(1e9), np.asarray(1), np.asarray(32)))
    assert t == pytest.approx(31 / 32 * 1e9 / (900e9 * 0.78) + 31 * C.nvlink_latency_s)


def test_all_to_all_on_nvl_pairs_splits_nvlink_pcie():
    """EP 8 on one H100 NVL server: 1/8 to the pair peer on NVLink, 6/8 over PCIe (slower
    part decides)."""
    links = _links("H100-NVL-94GB", 8, 8)
    t = float(links.all_to_all(np.asarray(1e9), np.asarray(1), np.asarray(8)))
    assert t == pytest.approx(6 / 8 * 1e9 / (64e9 * 0.8) + 7 * C.nvlink_latency_s)


def test_data_parallel_beyond_the_pair_on_pcie():
    """DP 4 at stride 1 on H100 NVL: beyond the NVLink pair, inside the server: PCIe."""
    links = _links("H100-NVL-94GB", 8, 8)
    bw, lat = links.data_parallel(np.asarray(1), np.asarray(4))
    assert float(bw) == pytest.approx(64e9 * 0.8)
    assert float(lat) == C.nvlink_latency_s
