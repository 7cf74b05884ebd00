"""Hardware domain objects: GPU types, nodes, node groups, clusters and islands.

All are frozen dataclasses. Loading and validation of user files lives in
``solver.spec.loaders``; the objects here only derive values (node lists, an island's effective
figures and stage-group nodes) from already-valid fields. :mod:`solver.spec.domain` re-exports
them with the job types.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import cached_property

from solver.spec.enums import Precision

__all__ = ["GPUSpec", "Node", "NodeGroup", "ClusterSpec", "Island"]


@dataclass(frozen=True)
class GPUSpec:
    """One GPU type of the catalog (``instances/gpus.toml``).

    Attributes
    ----------
    name : str
        Catalog key, e.g. ``"H100-SXM-80GB"``.
    bf16_tflops : float
        Dense 16-bit tensor throughput in TFLOP/s (FP16 for GPUs without BF16).
    hbm_gb : float
        Device memory as the datasheet states it ("80 GB"): binary gigabytes (GiB) for HBM
        parts, whose stacks come in powers of two (NVML reports 81,920 MiB for the A100 80GB).
    hbm_bw_gbs : float
        Device memory bandwidth in GB/s.
    nvlink_gbs : float
        Intra-node GPU-to-GPU bandwidth per GPU in GB/s (bidirectional datasheet figure; 0 = none,
        the PCIe link is used instead).
    nic_gbits : float
        Inter-node network bandwidth per GPU in Gb/s, typical deployment.
    tdp_w : float
        Board power in W.
    usd_per_hour : float | None
        Indicative rental price per GPU-hour.
    pcie_gbs : float
        Host link bandwidth per direction in GB/s (offload traffic; intra-node fallback).
    source : str
        Where the numbers come from.
    fp16_tflops : float | None
        Dense FP16 tensor throughput (None: as ``bf16_tflops``).
    fp8_tflops : float | None
        Dense FP8 tensor throughput (None: no FP8).
    bf16 : bool
        Has BF16 (V100 does not: it trains in FP16).
    gemm_eff, fp8_gemm_eff : float
        Largest fraction of 16-bit / FP8 peak a large GEMM reaches (max-achievable matmul).
    gemm_half_balance : float | None
        Arithmetic intensity, in machine balances, at which the GPU's GEMMs reach half the
        ceiling, fitted on its measured GEMMs (None: the calibration's default).
    gemm_in_training : float | None
        Fraction of its stand-alone speed the GPU keeps inside a training step (its GEMMs and
        its fused attention kernel, which share the tensor cores and the clock), fitted per
        GPU generation on the development set (``scripts/fit_in_training.py``; None: the
        calibration's ``gemm_in_training``, fitted on SC'21 Table 1, A100).
    gemm_latency_us : float | None
        Fixed microseconds per GEMM kernel, fitted on its measured GEMMs (None: the
        calibration's default).
    attention : str
        Fused attention kernel: ``"fa3"``, ``"fa2"`` or ``"unfused"``.
    attention_eff : float
        Fraction of 16-bit peak of the fused attention kernel on the FLOPs it executes, stand-
        alone (inside a step, times ``gemm_in_training``).
    kernel_source : str
        Where the kernel figures come from.
    vendor : str
        Who makes it (``"nvidia"``, ``"amd"``, ...): GPUs of two vendors cannot share a
        communicator (NCCL beside RCCL), so a job's meshes are all of one vendor
        (:func:`solver.cost.runtime.runtime_rules.vendor_problem`).
    mxfp8 : bool
        Runs MXFP8 block-scaled GEMMs (Blackwell and newer: Transformer Engine's MXFP8 support
        check needs compute capability 10.0); ``fp8-mx`` runs 16-bit elsewhere.
    nvlink_domain : int
        GPUs sharing one NVLink (NVSwitch) domain: 8 on an HGX/DGX board, 2 for NVLink-bridged
        PCIe cards (H100 NVL pairs), 72 in a GB200/GB300 NVL72 rack, 1 without NVLink. TP, CP
        and EP groups get NVLink only inside it (:class:`~solver.cost.efficiency.Links`).
    memory_mib : float | None
        Device memory as CUDA reports it (``cudaMemGetInfo``'s total, nvidia-smi's ``Total``),
        MiB: what a process can allocate from at most. None: ``hbm_gb`` read as GiB
        (:attr:`device_mib`). Give it where the two differ: GDDR cards with ECC on lose 1/16
        to it (L40S: 46,068 MiB of "48 GB"), the H100 keeps 361 MiB of its 80 GiB.
    defaults : tuple[str, ...]
        The optional fields its catalog entry omitted, which took their documented defaults
        (:data:`solver.spec.catalog.DEFAULTS`; ``tangram islands`` names them). Bookkeeping:
        not compared, not hashed.
    catalog_file : str
        The catalog file its entry was read from last (the shipped one or a user's).
        Bookkeeping: not compared, not hashed.
    """

    name: str
    bf16_tflops: float
    hbm_gb: float
    hbm_bw_gbs: float
    nvlink_gbs: float
    nic_gbits: float
    tdp_w: float
    usd_per_hour: float | None = None
    pcie_gbs: float = 32.0
    source: str = ""
    fp16_tflops: float | None = None
    fp8_tflops: float | None = None
    bf16: bool = True
    gemm_eff: float = 0.80
    fp8_gemm_eff: float = 0.70
    gemm_half_balance: float | None = None
    gemm_latency_us: float | None = None
    gemm_in_training: float | None = None
    attention: str = "fa2"
    attention_eff: float = 0.50
    kernel_source: str = ""
    vendor: str = "nvidia"
    nvlink_domain: int = 8
    mxfp8: bool = False
    memory_mib: float | None = None
    defaults: tuple[str, ...] = field(default=(), compare=False, repr=False)
    catalog_file: str = field(default="", compare=False, repr=False)

    @property
    def device_mib(self) -> float:
        """Device memory CUDA can allocate from, MiB: ``memory_mib``, else ``hbm_gb`` GiB."""
        return self.memory_mib if self.memory_mib is not None else self.hbm_gb * 1024.0

    def runs_fp8(self, precision: "Precision") -> bool:
        """The GPU runs ``precision``'s FP8 GEMMs (it has FP8, and MXFP8 where asked)."""
        return (precision.is_fp8 and bool(self.fp8_tflops)
                and (precision is not Precision.FP8_MX or self.mxfp8))

    def peak_tflops(self, precision: "Precision") -> float:
        """Dense GEMM throughput at ``precision`` (FP8 falls back to 16-bit without FP8)."""
        if self.runs_fp8(precision):
            return self.fp8_tflops
        if precision is Precision.FP16 or not self.bf16:
            return self.fp16_tflops or self.bf16_tflops
        return self.bf16_tflops

    def gemm_ceiling(self, precision: "Precision") -> float:
        """Max-achievable fraction of :meth:`peak_tflops` for a large GEMM."""
        return self.fp8_gemm_eff if self.runs_fp8(precision) else self.gemm_eff

    def runs_in(self, precision: "Precision") -> str:
        """The GEMM precision this GPU actually uses when the job asks for ``precision``."""
        if self.runs_fp8(precision):
            return "fp8"
        if precision is Precision.FP16 or not self.bf16:
            return "fp16"
        return "bf16"


@dataclass(frozen=True)
class Node:
    """One physical server; its GPUs always stay together.

    Attributes
    ----------
    node_id : str
        ``<prefix>-<i>``.
    gpu : GPUSpec
        GPU type.
    gpus : int
        GPUs in the node.
    nic_gbits : float
        Network bandwidth per GPU in Gb/s.
    perf : float
        Sustained-clock factor in (0, 1].
    """

    node_id: str
    gpu: GPUSpec
    gpus: int
    nic_gbits: float
    perf: float = 1.0

    @property
    def tflops(self) -> float:
        """Effective dense TFLOP/s per GPU (datasheet × sustained clock)."""
        return self.gpu.bf16_tflops * self.perf

    @property
    def kind(self) -> tuple:
        """Everything that distinguishes this node for planning (identical kinds are interchangeable)."""
        return (self.gpu.name, self.gpus, self.nic_gbits, self.perf)


@dataclass(frozen=True)
class NodeGroup:
    """A ``[[nodes]]`` entry of a cluster file: ``count`` identical nodes.

    Attributes
    ----------
    gpu : GPUSpec
        GPU type.
    count : int
        Number of nodes.
    gpus_per_node : int
        GPUs per node.
    nic_gbits : float
        Network bandwidth per GPU (Gb/s); the catalog value unless overridden.
    perf : float
        Sustained-clock factor in (0, 1].
    prefix : str
        Node id prefix; node ids are ``<prefix>-<i>``.
    """

    gpu: GPUSpec
    count: int
    gpus_per_node: int = 8
    nic_gbits: float = 0.0
    perf: float = 1.0
    prefix: str = ""

    def nodes(self) -> tuple[Node, ...]:
        """The group's nodes, ids numbered from 0."""
        return tuple(
            Node(f"{self.prefix}-{i}", self.gpu, self.gpus_per_node, self.nic_gbits, self.perf)
            for i in range(self.count)
        )


@dataclass(frozen=True)
class ClusterSpec:
    """A cluster: node groups plus the bandwidth between islands.

    Attributes
    ----------
    name : str
        Cluster name.
    groups : tuple[NodeGroup, ...]
        Node groups in file order.
    inter_island_gbits : float | None
        Per-GPU bandwidth between islands (Gb/s); ``None`` = the smaller NIC of the two sides.
    """

    name: str
    groups: tuple[NodeGroup, ...]
    inter_island_gbits: float | None = None

    @property
    def nodes(self) -> tuple[Node, ...]:
        """All nodes, group by group."""
        return tuple(n for g in self.groups for n in g.nodes())

    @property
    def total_gpus(self) -> int:
        """GPUs in the cluster."""
        return sum(g.count * g.gpus_per_node for g in self.groups)


@dataclass(frozen=True)
class Island:
    """A set of nodes the homogeneous parallelizer treats as identical GPUs.

    Effective values are the weakest member's, so a plan made for the island fits and keeps pace
    on every node of it (the seed note, Algorithm 1: effective HBM is the minimum).

    Attributes
    ----------
    name : str
        Island name (``i<k>-<gpu>``).
    nodes : tuple[Node, ...]
        Member nodes.

    The effective figures walk every node, and the planner asks for them many times per
    plan, so each is computed once per island (the island is immutable).
    """

    name: str
    nodes: tuple[Node, ...]

    @classmethod
    def homogeneous(cls, name: str, gpu: GPUSpec, gpus: int, gpus_per_node: int = 8,
                    nic_gbits: float | None = None, perf: float = 1.0) -> "Island":
        """An island of ``gpus`` GPUs of one type, packed ``gpus_per_node`` to a node."""
        nic = gpu.nic_gbits if nic_gbits is None else nic_gbits
        full, rest = divmod(gpus, gpus_per_node)
        sizes = [gpus_per_node] * full + ([rest] if rest else [])
        nodes = tuple(Node(f"{name}-{i}", gpu, s, nic, perf) for i, s in enumerate(sizes))
        return cls(name, nodes)

    @cached_property
    def gpu(self) -> GPUSpec:
        """The weakest member's GPU type (lowest effective TFLOP/s, then HBM)."""
        return min(self.nodes, key=lambda n: (n.tflops, n.gpu.hbm_gb, n.gpu.name)).gpu

    @cached_property
    def gpus(self) -> int:
        """GPU count."""
        return sum(n.gpus for n in self.nodes)

    @cached_property
    def gpus_per_node(self) -> int:
        """Smallest node size: a TP group must fit in every node."""
        return min(n.gpus for n in self.nodes)

    @cached_property
    def tflops_per_gpu(self) -> float:
        """Effective TFLOP/s per GPU: the minimum of datasheet × perf over members."""
        return min(n.tflops for n in self.nodes)

    @cached_property
    def hbm_gb(self) -> float:
        """Effective HBM per GPU: the minimum over members."""
        return min(n.gpu.hbm_gb for n in self.nodes)

    @cached_property
    def device_mib(self) -> float:
        """Effective device memory CUDA reports per GPU (MiB): the minimum over members."""
        return min(n.gpu.device_mib for n in self.nodes)

    @cached_property
    def hbm_bw_gbs(self) -> float:
        """Effective HBM bandwidth per GPU."""
        return min(n.gpu.hbm_bw_gbs for n in self.nodes)

    @cached_property
    def nvlink_gbs(self) -> float:
        """Effective intra-node bandwidth per GPU (PCIe where a member has no NVLink)."""
        return min(n.gpu.nvlink_gbs or n.gpu.pcie_gbs for n in self.nodes)

    @cached_property
    def nvlink_domain(self) -> int:
        """GPUs sharing one NVLink domain: the smallest over members (a group is priced on
        NVLink only where every member's domain holds it)."""
        return min(n.gpu.nvlink_domain for n in self.nodes)

    @cached_property
    def pcie_gbs(self) -> float:
        """Effective host-link bandwidth per GPU."""
        return min(n.gpu.pcie_gbs for n in self.nodes)

    @cached_property
    def nic_gbits(self) -> float:
        """Effective network bandwidth per GPU."""
        return min(n.nic_gbits for n in self.nodes)

    @cached_property
    def gpu_types(self) -> frozenset[GPUSpec]:
        """The GPU types of its members (one, unless islands were merged)."""
        return frozenset(n.gpu for n in self.nodes)

    @cached_property
    def effective_node(self) -> Node:
        """One node with the island's effective (weakest-member) figures."""
        gpu = replace(self.gpu, bf16_tflops=self.tflops_per_gpu, hbm_gb=self.hbm_gb,
                      memory_mib=self.device_mib, hbm_bw_gbs=self.hbm_bw_gbs,
                      nvlink_gbs=min(n.gpu.nvlink_gbs for n in self.nodes),
                      pcie_gbs=self.pcie_gbs, nic_gbits=self.nic_gbits,
                      nvlink_domain=self.nvlink_domain)
        return Node(f"{self.name}-weakest", gpu, self.gpus_per_node, self.nic_gbits, 1.0)

    @cached_property
    def effective_nodes(self) -> tuple[Node, ...]:
        """As many nodes as it has, each the :attr:`effective_node` (named ``<name>-g<i>``):
        the first ``g`` of them are any stage group of ``g`` of its nodes."""
        e = self.effective_node
        return tuple(Node(f"{self.name}-g{i}", e.gpu, e.gpus, e.nic_gbits, e.perf)
                     for i in range(len(self.nodes)))

    @cached_property
    def total_tflops(self) -> float:
        """Effective island compute: GPUs × effective TFLOP/s."""
        return self.gpus * self.tflops_per_gpu

    @cached_property
    def signature(self) -> tuple:
        """What a partial plan on this island depends on (cache key part)."""
        return (self.gpu.name, self.gpus, self.gpus_per_node, self.tflops_per_gpu,
                self.hbm_gb, self.hbm_bw_gbs, self.nvlink_gbs, self.nic_gbits,
                self.nvlink_domain, self.device_mib)
