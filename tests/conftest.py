"""Shared fixtures: the GPU catalog and small cluster builders."""

from __future__ import annotations

from pathlib import Path

import pytest

from solver.loaders import INSTANCES, load_catalog
from solver.specs import ClusterSpec, NodeGroup

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


SHIPPED_CLUSTERS = sorted((INSTANCES / "clusters").glob("*.toml"))
SHIPPED_JOBS = sorted((INSTANCES / "jobs").glob("*.toml"))
