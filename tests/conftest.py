"""Shared fixtures: the GPU catalog and small cluster builders."""

from __future__ import annotations

import importlib
import math
import pkgutil
from pathlib import Path

import pytest
from hypothesis import settings

import formulations
import solver


def import_project_modules() -> list[str]:
    """Import every module of ``solver`` and ``formulations`` (not ``__main__``), now.

    Hypothesis mixes the literal constants of every imported local module into its draws
    (``hypothesis.internal.conjecture.providers._get_local_constants``, 6.170; no setting or
    environment variable turns that pool off). Were the modules imported by the tests
    themselves, the pool, and so the examples a derandomized test draws, would depend on
    which tests ran before it. Imported here, before any test draws, the pool is the same in
    any order and in any selection of tests.
    """
    names = []
    for pkg in (solver, formulations):
        for info in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + "."):
            if info.name.rsplit(".", 1)[-1] == "__main__":  # the CLI entry point runs on import
                continue
            try:
                importlib.import_module(info.name)
            except ModuleNotFoundError as exc:
                if (exc.name or "").split(".")[0] in ("solver", "formulations"):
                    raise
                continue  # an optional extra not installed: the same pool in this environment
            names.append(info.name)
    return names


PROJECT_MODULES = import_project_modules()

# Every property test is reproducible: derandomized, no example database (issue: no test whose
# outcome depends on the run), and a failure prints the ``@reproduce_failure`` line that replays
# it (pin the example with ``@example`` beside the fix).
settings.register_profile("tangram", derandomize=True, database=None, deadline=None,
                          print_blob=True)
settings.load_profile("tangram")

from solver.spec.domain import ClusterSpec, ModelSpec, NodeGroup
from solver.spec.loaders import INSTANCES, load_catalog

ROOT = Path(__file__).resolve().parent.parent

#: Solver limits of the tests: none is the wall clock, so no outcome depends on the machine's
#: load (issue 46). CP-SAT stops after ``CPSAT_WORK`` deterministic seconds on one worker, CBC
#: after ``CBC_NODES`` branch-and-bound nodes; HiGHS (deterministic on one thread) and the
#: planner's solves run with ``NO_WALL_CLOCK``. Each is far above what the test instances
#: need, so the tests assert the proof (a test that may stop at a limit asserts bound and gap).
CPSAT_WORK = 60.0
CBC_NODES = 200_000
NO_WALL_CLOCK = math.inf


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
