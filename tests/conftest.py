"""Shared fixtures: the GPU catalog and small cluster builders."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import settings

# Every property test is reproducible: derandomized, no example database (issue: no test whose
# outcome depends on the run).
settings.register_profile("tangram", derandomize=True, database=None, deadline=None)
settings.load_profile("tangram")

from solver.spec.domain import ClusterSpec, ModelSpec, NodeGroup
from solver.spec.loaders import INSTANCES, load_catalog

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def catalog():
    """The shipped GPU catalog."""
    return load_catalog()


def make_cluster(catalog, *groups, name="test") -> ClusterSpec:
    """Cluster from (gpu name, node count[, perf[, gpus_per_node]]) tuples."""
    out = []
    for i, g in enumerate(groups):
        gpu, count = g[0], g[1]
        perf = g[2] if len(g) > 2 else 1.0
        gpn = g[3] if len(g) > 3 else 8
        out.append(NodeGroup(catalog[gpu], count, gpn, catalog[gpu].nic_gbits, perf, f"g{i}"))
    return ClusterSpec(name, tuple(out))


#: Model shapes of the independent-model checks (memory and time): GQA with a gated MLP, a tied
#: GPT-style dense model, and MoE with a shared expert.
REFERENCE_MODELS = [
    ModelSpec("llama", layers=16, hidden=4096, ffn=14336, heads=32, kv_heads=8, vocab=128256),
    ModelSpec("gpt", layers=12, hidden=2048, ffn=8192, heads=16, kv_heads=16, vocab=51200,
              gated_mlp=False, tied_embeddings=True),
    ModelSpec("moe", layers=8, hidden=2048, ffn=8192, heads=16, kv_heads=4, vocab=32000,
              experts=8, top_k=2, expert_ffn=4096, shared_experts=1),
]
SHIPPED_CLUSTERS = sorted((INSTANCES / "clusters").glob("*.toml"))
SHIPPED_JOBS = sorted((INSTANCES / "jobs").glob("*.toml"))


# A small three-node job (Llama 2 7B on one H100 node and two A100 nodes) shared by the simulator,
# sweep and plot tests; MINI_FIXED is the same job at n_micro = 8.
MINI_AUTO = """
description = "test: Llama 2 7B on one H100 node and two A100 nodes"
model = "llama2-7b"

[cluster]
name = "mini"
inter_island_gbits = 100.0

[[cluster.nodes]]
gpu = "H100-SXM-80GB"
count = 1
name = "h100"

[[cluster.nodes]]
gpu = "A100-SXM-80GB"
count = 2
name = "a100"

[training]
global_batch = 32
seq_len = 2048
n_micro = "auto"
"""
MINI_FIXED = MINI_AUTO.replace('n_micro = "auto"', "n_micro = 8")
