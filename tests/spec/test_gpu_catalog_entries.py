"""Catalog entries added for the development set and FlagScale's users (GB200, GB300, H800,
A800, H20) against their datasheet figures, and the NVLink domain of every entry.

Each expected value is the datasheet's own figure, converted by hand where the datasheet prints
a rack total or a sparsity figure (dense = sparse / 2; per GPU = rack / 72).
"""

from __future__ import annotations

import pytest

from solver.spec.loaders import load_catalog

CATALOG = load_catalog()

# (entry, field, expected, how the datasheet states it)
DATASHEET = [
    # GB200 NVL72 datasheet, per rack of 72 GPUs.
    ("GB200", "bf16_tflops", 360e3 / 72 / 2, "FP16/BF16 360 PFLOPS sparse per rack"),
    ("GB200", "fp8_tflops", 720e3 / 72 / 2, "FP8 720 PFLOPS sparse per rack"),
    ("GB200", "hbm_gb", 186.0, "13.4 TB HBM3e per rack = 186 GB per GPU"),
    ("GB200", "hbm_bw_gbs", 576e3 / 72, "576 TB/s per rack"),
    ("GB200", "nvlink_gbs", 1800.0, "NVLink 5: 1.8 TB/s per GPU (130 TB/s per rack)"),
    ("GB200", "nvlink_domain", 72, "one NVLink domain of 72 GPUs"),
    ("GB200", "tdp_w", 1200.0, "up to 1,200 W per GPU"),
    # GB300 NVL72 datasheet.
    ("GB300", "bf16_tflops", 360e3 / 72 / 2, "FP16/BF16 360 PFLOPS sparse per rack"),
    ("GB300", "fp8_tflops", 720e3 / 72 / 2, "FP8 720 PFLOPS sparse per rack"),
    ("GB300", "hbm_gb", 288.0, "288 GB HBM3e per GPU (up to 21 TB per rack)"),
    ("GB300", "hbm_bw_gbs", 576e3 / 72, "576 TB/s per rack"),
    ("GB300", "nvlink_gbs", 1800.0, "NVLink 5: 1.8 TB/s per GPU"),
    ("GB300", "nvlink_domain", 72, "one NVLink domain of 72 GPUs"),
    ("GB300", "nic_gbits", 800.0, "ConnectX-8 800 Gb/s per GPU"),
    ("GB300", "tdp_w", 1400.0, "1,400 W per GPU"),
    # H800 SXM datasheet: H100 SXM's compute and memory, NVLink cut to 400 GB/s.
    ("H800-SXM-80GB", "bf16_tflops", 1979 / 2, "BF16 1,979 TFLOPS sparse"),
    ("H800-SXM-80GB", "fp8_tflops", 3958 / 2, "FP8 3,958 TFLOPS sparse"),
    ("H800-SXM-80GB", "hbm_gb", 80.0, "80 GB HBM3"),
    ("H800-SXM-80GB", "hbm_bw_gbs", 3350.0, "3.35 TB/s"),
    ("H800-SXM-80GB", "nvlink_gbs", 400.0, "NVLink 400 GB/s"),
    ("H800-SXM-80GB", "tdp_w", 700.0, "up to 700 W"),
    # A800 80GB SXM datasheet: A100's compute and memory, NVLink cut to 400 GB/s.
    ("A800-SXM-80GB", "bf16_tflops", 624 / 2, "BF16 624 TFLOPS sparse"),
    ("A800-SXM-80GB", "hbm_gb", 80.0, "80 GB HBM2e"),
    ("A800-SXM-80GB", "hbm_bw_gbs", 2039.0, "2,039 GB/s"),
    ("A800-SXM-80GB", "nvlink_gbs", 400.0, "NVLink 400 GB/s"),
    ("A800-SXM-80GB", "tdp_w", 400.0, "400 W"),
    # HGX H20 specification (dense figures).
    ("H20", "bf16_tflops", 148.0, "BF16 148 TFLOPS"),
    ("H20", "fp8_tflops", 296.0, "FP8 296 TFLOPS"),
    ("H20", "hbm_gb", 96.0, "96 GB HBM3"),
    ("H20", "hbm_bw_gbs", 4000.0, "4.0 TB/s"),
    ("H20", "nvlink_gbs", 900.0, "NVLink 900 GB/s"),
    ("H20", "tdp_w", 400.0, "400 W"),
]


@pytest.mark.parametrize("name,field,expected,datasheet", DATASHEET,
                         ids=[f"{n}-{f}" for n, f, _, _ in DATASHEET])
def test_new_entry_matches_its_datasheet(name, field, expected, datasheet):
    # Datasheets round (13.4 TB / 72 = 186.1 GB): agreement to 0.1 %.
    assert getattr(CATALOG[name], field) == pytest.approx(expected, rel=1e-3), datasheet


@pytest.mark.parametrize("name", ["GB200", "GB300", "H800-SXM-80GB", "A800-SXM-80GB", "H20"])
def test_new_entry_names_its_datasheet(name):
    assert "datasheet" in CATALOG[name].source or "specification" in CATALOG[name].source


# NVLink domain per board: HGX/DGX boards 8 (MI300X: 8 on Infinity Fabric), NVLink-bridged
# PCIe cards pairs of 2, PCIe-only cards 1, NVL72 racks 72.
DOMAINS = {"A100-SXM-40GB": 8, "A100-SXM-80GB": 8, "H100-SXM-80GB": 8, "H200-SXM-141GB": 8,
           "B200": 8, "V100-SXM2-16GB": 8, "V100-SXM2-32GB": 8, "MI300X": 8,
           "H100-NVL-94GB": 2, "H100-PCIe-80GB": 2, "L40S": 1, "A10": 1, "GB200": 72,
           "GB300": 72, "H800-SXM-80GB": 8, "A800-SXM-80GB": 8, "H20": 8}


def test_every_entry_has_its_board_nvlink_domain():
    assert {n: g.nvlink_domain for n, g in CATALOG.items() if n in DOMAINS} == DOMAINS


def test_domain_defaults_by_nvlink(tmp_path):
    """A site catalog without the field: 8 where the GPU has NVLink, 1 where it has none."""
    base = ('bf16_tflops = 100.0\nhbm_gb = 10.0\nhbm_bw_gbs = 100.0\nnic_gbits = 100.0\n'
            'tdp_w = 100.0\nsource = "test"\n')
    path = tmp_path / "gpus.toml"
    path.write_text(f"[a]\nnvlink_gbs = 300.0\n{base}\n[b]\nnvlink_gbs = 0.0\n{base}")
    got = load_catalog(path)
    assert (got["a"].nvlink_domain, got["b"].nvlink_domain) == (8, 1)


# Precision names: Megatron-Core's --fp8-recipe values (megatron/core/enums.py, Fp8Recipe).
def test_precision_names_and_recipes():
    from solver.spec.enums import Precision
    assert [p.value for p in Precision] == ["bf16", "fp16", "fp8", "fp8-cs", "fp8-mx"]
    assert {p.value: p.fp8_recipe for p in Precision} == {
        "bf16": None, "fp16": None, "fp8": "delayed", "fp8-cs": "tensorwise", "fp8-mx": "mxfp8"}
    assert [p.value for p in Precision if p.is_fp8] == ["fp8", "fp8-cs", "fp8-mx"]


def test_mxfp8_only_on_blackwell_and_fp8_cs_priced_as_fp8():
    """fp8-mx runs FP8 on the Blackwell entries only (H100: 16-bit, 989 TF); fp8 and fp8-cs are
    the same per-tensor FP8 GEMMs (H100: 1,979 TF at the FP8 ceiling)."""
    from solver.spec.enums import Precision
    h100, gb200 = CATALOG["H100-SXM-80GB"], CATALOG["GB200"]
    assert h100.runs_in(Precision.FP8_MX) == "bf16" and h100.peak_tflops(Precision.FP8_MX) == 989.0
    assert gb200.runs_in(Precision.FP8_MX) == "fp8"
    assert gb200.peak_tflops(Precision.FP8_MX) == 5000.0
    assert h100.peak_tflops(Precision.FP8_CS) == h100.peak_tflops(Precision.FP8) == 1979.0
    assert h100.gemm_ceiling(Precision.FP8_CS) == h100.gemm_ceiling(Precision.FP8) == 0.709
    assert [n for n, g in CATALOG.items() if g.mxfp8] == ["B200", "GB200", "GB300"]
