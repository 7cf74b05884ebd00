"""Calibration constants, the GEMM efficiency curve and link/collective timing (the cost model's
hardware side). Every tunable number of the cost model lives in :class:`Calibration`.

Sources
-------
- Collective costs are the ring-algorithm bandwidth terms of the Scaling Book chapter "How to
  Parallelize a Transformer for Training" (``seeds/004``): all-reduce ``2 (q-1)/q M / W``,
  all-gather / reduce-scatter / all-to-all ``(q-1)/q M / W``, plus a per-step latency ``alpha``.
- Link bandwidths come from the datasheets in ``instances/gpus.toml``: NVLink figures are
  bidirectional totals, so one direction carries half; a NIC of ``x`` Gb/s moves ``x / 8`` GB/s.
- The GEMM curve's shape is fitted on measured stand-alone GEMMs (OpenXLA's GEMM table for H100,
  B200 and MI300X, ``instances/calibration/gemm-openxla.csv``; ``python -m
  solver.cost.calibrate.gemm_fit``); the in-training constants on Narayanan et al., SC'21, Table 1 only
  (``instances/calibration/megatron-sc21-table1.csv``; ``python -m solver.cost.calibrate.calibration``).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import numpy as np

from solver.spec.domain import Island, Precision


class AttentionKernel(enum.Enum):
    """How the attention core runs (a property of the training software).

    ``FLASH``: a fused, IO-aware kernel (Dao et al., FlashAttention, 2022/2023) that skips the
    masked half of causal attention and stores no ``s^2`` tensors. ``UNFUSED``: batched GEMMs
    around a materialised score matrix (softmax, dropout), as in Megatron-LM 2021; it computes the
    full square and stores the scores (Korthikanti et al.'s ``5 a s / h`` term).
    """

    FLASH = "flash"
    UNFUSED = "unfused"


@dataclass(frozen=True)
class Calibration:
    """The cost model's efficiency constants, in one place.

    GEMM time (:class:`GemmKernel`): a GEMM of shape ``(M, N, K)`` doing ``F = 2MNK`` FLOPs takes
    ``F / (peak * gemm_in_training * ceiling * xi / (xi + c * B)) + t0`` seconds, where
    ``ceiling`` is the GPU's max-achievable-matmul fraction (``gemm_eff`` / ``fp8_gemm_eff`` in
    ``instances/gpus.toml``: 86.9 % on A100, 80.3 % on H100), ``xi = 1 / (1/M + 1/N + 1/K)``
    the GEMM's arithmetic intensity in FLOP per byte of 16-bit operands, ``B`` the GPU's machine
    balance (peak FLOP/s over HBM bytes/s), ``c`` the half-intensity in balances and ``t0`` a
    fixed cost per GEMM kernel (prologue, epilogue, the last partial wave). Equivalently, a GEMM
    costs its FLOPs at the ceiling plus ``c / ceiling`` times its operand traffic at HBM speed
    plus ``t0``: a narrow TP shard or a small micro-batch pays the traffic and the fixed cost
    over less work. ``c`` and ``t0`` are the GPU's own where ``instances/gpus.toml`` gives them
    (fitted on measured cuBLAS/hipBLASLt GEMMs, :mod:`solver.cost.calibrate.gemm_fit`), else the defaults
    below. Fused attention runs at the GPU's ``attention_eff`` (its kernel: FlashAttention-3 on
    Hopper, FlashAttention-2 on Ampere/Ada, unfused on Volta).

    Provenance of the defaults. ``gemm_half_balance`` and ``gemm_latency_s`` are the pooled fit
    over the NVIDIA GPUs of the measured GEMM table (``instances/calibration/gemm-openxla.csv``:
    OpenXLA's H100 and B200 measurements; ``python -m solver.cost.calibrate.gemm_fit``); they price the
    GPUs without a table of their own (A100, V100, L40S, A10): the same fixed cost per kernel
    and the same traffic multiple. Fitted on SC'21 Table 1 under the ``megatron-2021`` profile
    (no overlapped communication, unfused attention; minimax of the log error over all ten
    rows, ``python -m solver.cost.calibrate.calibration --fit``): ``gemm_in_training``,
    ``unfused_attention_eff``, ``elementwise_bytes``. Chosen, not fitted: bus efficiencies and
    latencies (NCCL all-reduce bus bandwidth of about 230 GB/s on DGX A100 NVLink, 85 % of line
    rate on InfiniBand), ``hbm_eff`` and ``pcie_eff`` (typical STREAM-like fractions). What is
    overlapped is the framework profile's, scheduled (``solver.cost.runtime.frameworks``), not a fitted
    fraction.

    Attributes
    ----------
    gemm_half_balance : float
        Arithmetic intensity at which a GEMM kernel runs at half its ceiling (before the fixed
        cost), in multiples of the GPU's machine balance; for GPUs without their own figure.
    gemm_latency_s : float
        Fixed seconds per GEMM kernel, for GPUs without their own figure.
    gemm_in_training : float
        Fraction of its measured stand-alone speed a GEMM keeps inside a training step (the
        same on every GPU): what the microbenchmarks do not see (clocks under a whole step's
        power draw, collectives' kernels sharing the SMs, operand layouts and epilogues).
        Fitted on Megatron-LM 2021.
    attention : AttentionKernel
        Attention implementation of the software stack (default: FlashAttention where the GPU
        has a fused kernel).
    unfused_attention_eff : float
        Fraction of peak of an unfused attention core on the full-square FLOPs (the score
        matrix's softmax/dropout HBM traffic included). Fitted on Megatron-LM 2021.
    elementwise_bytes : float
        HBM bytes moved per hidden element per token per layer in the forward pass by the
        memory-bound operators (norms, activation function, residual adds, rotary, casts);
        the backward pass moves twice as much.
    hbm_eff : float
        Fraction of the HBM datasheet bandwidth reached by memory-bound kernels.
    nvlink_eff : float
        Collective bus efficiency on NVLink, applied to half the bidirectional datasheet figure.
    nic_eff : float
        Collective bus efficiency on the network (applied to NIC Gb/s / 8).
    pcie_eff : float
        Fraction of the host-link bandwidth reached by activation offload copies.
    nvlink_latency_s : float
        Latency per ring step of a collective inside a node.
    nic_latency_s : float
        Latency per ring step of a collective across nodes.
    offload_resident : float
        Micro-batches of activations that stay in HBM with offload (the one being computed).
    host_offload_gb : float
        Host memory per GPU available for offloaded activations, GB (a DGX A100/H100 node has
        2 TB for 8 GPUs; half is left to the OS, data loading and pinned buffers).
    optimizer_bytes : float
        HBM bytes an Adam step touches per parameter it updates: read the fp32 gradient (4),
        read and write fp32 master weight, m and v (24), write the bf16 weight (2).
    moe_capacity_factor : float
        Tokens the busiest expert rank receives relative to a perfectly balanced router: the
        expert GEMMs, the all-to-all and the dispatched-token activations of a rank are sized
        for it (the step waits for the busiest rank). Chosen, not fitted: 1.25, the Switch
        Transformer's default capacity factor (Fedus et al., JMLR 2022, Sec. 2.2), an upper
        bound of the load a capacity-limited router admits.
    zero3_prefetch : bool
        ZeRO-3 gathers and reduce-scatters overlap the compute as the framework schedules them
        (prefetch). False for DeepSpeed before v0.5.6: its "asynchronous" per-parameter
        gathers each called ``torch.cuda.synchronize()`` (PR #1188, October 2021: "the async
        version is not async at all"), so all of it was exposed. A fact of the software run,
        not fitted.
    zero3_list_collectives : bool
        ZeRO-3 gathers and reduce-scatters each parameter through ``torch.distributed``'s list
        API, one tensor per rank: DeepSpeed before v0.5.6 (``_allgather_param`` and
        ``_reduce_scatter_gradient`` in ``partition_parameters.py`` build a list of
        ``world_size`` views; PR #1188, October 2021, moved gathers to ``_all_gather_base``).
        PyTorch's ``ProcessGroupNCCL::allgather`` then copies each rank's part out of its flat
        buffer and ``reduce_scatter`` copies each in (``flatten_for_scatter_gather``): work per
        rank on the host, ``list_collective_rank_s`` each. A fact of the software run.
    list_collective_rank_s : float
        Host seconds per rank of one list-based collective: the rank's tensor view built in
        Python, its ``recordStream`` and its ``copy_`` launched on the NCCL stream. Fitted on
        the development set's four DeepSpeed ZeRO-3 rows (SC'21 Table 2; minimax of the log
        error, ``python scripts/fit_list_collective.py``): 15.0 us, at the top of a bottom-up
        count of those operations in eager PyTorch (about 8 to 14 us).
    """

    gemm_half_balance: float = 0.087
    gemm_latency_s: float = 6.24e-6
    gemm_in_training: float = 0.75
    attention: AttentionKernel = AttentionKernel.FLASH
    unfused_attention_eff: float = 0.1887
    elementwise_bytes: float = 16.61
    hbm_eff: float = 0.80
    nvlink_eff: float = 0.78
    nic_eff: float = 0.85
    pcie_eff: float = 0.80
    nvlink_latency_s: float = 3e-6
    nic_latency_s: float = 8e-6
    offload_resident: float = 1.0
    host_offload_gb: float = 128.0
    optimizer_bytes: float = 30.0
    moe_capacity_factor: float = 1.25
    zero3_prefetch: bool = True
    zero3_list_collectives: bool = False
    list_collective_rank_s: float = 15e-6


DEFAULT_CALIBRATION = Calibration()


@dataclass(frozen=True)
class GemmKernel:
    """How one island's GPUs run GEMMs: the cost model's GEMM time (curve on
    :class:`Calibration`).

    Attributes
    ----------
    ceiling : float
        Largest fraction of peak a large GEMM reaches (the weakest member's).
    half_intensity : float
        FLOP per byte at which the curve reaches half the ceiling (``c`` times the balance).
    latency_s : float
        Fixed seconds per GEMM kernel.
    in_training : float
        Fraction of the stand-alone speed kept inside a training step.
    """

    ceiling: float
    half_intensity: float
    latency_s: float
    in_training: float

    @classmethod
    def of(cls, island: Island, precision: Precision, calib: Calibration) -> "GemmKernel":
        """The island's GEMMs at ``precision``: its slowest member's ceiling, half-intensity
        and fixed cost (islands never mix generations, so these are one GPU's in practice)."""
        balance = machine_balance(island)
        gpus = island.gpu_types
        return cls(
            ceiling=min(g.gemm_ceiling(precision) for g in gpus),
            half_intensity=balance * max(calib.gemm_half_balance if g.gemm_half_balance is None
                                         else g.gemm_half_balance for g in gpus),
            latency_s=max(calib.gemm_latency_s if g.gemm_latency_us is None
                          else g.gemm_latency_us * 1e-6 for g in gpus),
            # The GPU generation's own in-training fraction where the catalog has one.
            in_training=min(calib.gemm_in_training if g.gemm_in_training is None
                            else g.gemm_in_training for g in gpus))

    def efficiency(self, m: np.ndarray, n: np.ndarray, k: np.ndarray) -> np.ndarray:
        """Fraction of peak of GEMMs of shape ``(m, n, k)`` (arrays broadcast), fixed cost
        aside."""
        m, n, k = (np.maximum(np.asarray(x, dtype=float), 1.0) for x in (m, n, k))
        xi = 1.0 / (1.0 / m + 1.0 / n + 1.0 / k)
        return self.in_training * self.ceiling * xi / (xi + self.half_intensity)

    def seconds(self, flops: np.ndarray, m: np.ndarray, n: np.ndarray, k: np.ndarray,
                peak_flops: float) -> np.ndarray:
        """Seconds of one GEMM kernel doing ``flops`` of work of shape ``(m, n, k)`` (a
        grouped GEMM, e.g. a rank's experts, is one kernel) on a GPU of ``peak_flops``."""
        return flops / (peak_flops * self.efficiency(m, n, k)) + self.latency_s


def machine_balance(island: Island) -> float:
    """Peak 16-bit FLOP/s per HBM byte/s of the island's GPUs (datasheet values)."""
    return island.tflops_per_gpu * 1e12 / (island.hbm_bw_gbs * 1e9)


def intra_node_gbs(island: Island) -> float:
    """GB/s one GPU of ``island`` sends to a peer of its NVLink domain in one direction, at its
    weakest GPU type."""
    # NVLink datasheet figures are bidirectional totals: one direction carries half. A GPU
    # without NVLink talks to its node peers over PCIe, whose figure is already per direction.
    return min(g.nvlink_gbs / 2 if g.nvlink_gbs else g.pcie_gbs for g in island.gpu_types)


#: GPUs of the largest server board (HGX/DGX): an NVLink domain up to this size is the board and
#: ends at the server; a larger one (GB200/GB300 NVL72) is rack-scale and spans servers.
BOARD_GPUS = 8


def nvlink_span(island: Island) -> int:
    """Consecutive ranks of ``island`` sharing one NVLink domain: the catalog's domain, capped
    at the server unless the domain is rack-scale (larger than a board)."""
    domain = island.nvlink_domain
    return domain if domain > BOARD_GPUS else min(domain, island.gpus_per_node)


@dataclass(frozen=True)
class Links:
    """Per-GPU, per-direction bandwidths (bytes/s) and step latencies of one island.

    Three tiers: the NVLink domain (``domain`` GPUs: 8 on an HGX board, 2 for NVLink-bridged
    H100 NVL pairs, 72 in a GB200/GB300 NVL72 rack, 1 without NVLink), the rest of the server
    over PCIe (``node_bw``; only where the domain is smaller than the server), and the network.
    A group is priced on the slowest tier it spans: TP, CP and EP get NVLink only inside the
    domain.

    Attributes
    ----------
    intra_bw, inter_bw : float
        Bus bandwidth of collectives inside the NVLink domain and across servers (network).
    intra_lat, inter_lat : float
        Latency per ring step inside a server and across servers (s).
    pcie_bw : float
        Host-link bandwidth for offload (bytes/s).
    hbm_bw : float
        Effective HBM bandwidth for memory-bound kernels (bytes/s).
    gpus_per_node : int
        Server size.
    domain : int
        NVLink domain size in GPUs (0: the server, the pre-domain default).
    node_bw : float
        Bus bandwidth between GPUs of one server outside one NVLink domain (PCIe; 0: as
        ``intra_bw``).
    """

    intra_bw: float
    inter_bw: float
    intra_lat: float
    inter_lat: float
    pcie_bw: float
    hbm_bw: float
    gpus_per_node: int
    domain: int = 0
    node_bw: float = 0.0

    @classmethod
    def of(cls, island: Island, calib: Calibration) -> "Links":
        """The island's links, derated by the calibration's efficiencies."""
        return cls(
            intra_bw=intra_node_gbs(island) * 1e9 * calib.nvlink_eff,
            inter_bw=island.nic_gbits / 8 * 1e9 * calib.nic_eff,
            intra_lat=calib.nvlink_latency_s,
            inter_lat=calib.nic_latency_s,
            pcie_bw=island.pcie_gbs * 1e9 * calib.pcie_eff,
            hbm_bw=island.hbm_bw_gbs * 1e9 * calib.hbm_eff,
            gpus_per_node=island.gpus_per_node,
            domain=nvlink_span(island),
            # Peers outside the NVLink domain inside a server: through the PCIe switch.
            node_bw=island.pcie_gbs * 1e9 * calib.pcie_eff,
        )

    @property
    def nvlink_span(self) -> int:
        """Consecutive ranks sharing one NVLink domain."""
        return self.domain or self.gpus_per_node

    @property
    def local_span(self) -> int:
        """Consecutive ranks reachable without the network (a server, or an NVL72 rack)."""
        return max(self.nvlink_span, self.gpus_per_node)

    @property
    def local_bw(self) -> float:
        """Bus bandwidth among the :attr:`local_span` ranks (NVLink where the domain covers
        the server, else PCIe)."""
        if self.nvlink_span >= self.gpus_per_node or not self.node_bw:
            return self.intra_bw
        return min(self.node_bw, self.intra_bw)

    def data_parallel(self, stride: np.ndarray, group: np.ndarray
                      ) -> tuple[np.ndarray, np.ndarray]:
        """Bandwidth and step latency of a collective over ``group`` ranks placed ``stride``
        apart (a data-parallel group under Megatron's tp-cp-ep-dp-pp rank order).

        Inside the NVLink domain it runs on NVLink, inside a server beyond the domain on PCIe.
        Across servers (or racks) each holds ``k = local_span / stride`` members of the group
        (at most ``group``), each with its own NIC, and NCCL runs one ring per rail (channel),
        each moving ``1/k`` of the data over its own NIC: the group moves ``k`` NICs' worth
        across, capped by the local links.
        """
        stride, group = np.asarray(stride), np.asarray(group)
        span = stride * group
        rails = np.clip(self.local_span // np.maximum(stride, 1), 1, np.maximum(group, 1))
        across = np.minimum(self.local_bw, rails * self.inter_bw)
        bw = np.where(span <= self.nvlink_span, self.intra_bw,
                      np.where(span <= self.local_span, self.local_bw, across))
        return bw, np.where(span <= self.local_span, self.intra_lat, self.inter_lat)

    def all_to_all(self, bytes_: np.ndarray, stride: np.ndarray, group: np.ndarray
                   ) -> np.ndarray:
        """Seconds of one all-to-all in which each of ``group`` ranks, placed ``stride`` apart,
        sends ``bytes_`` split evenly over the group (its own share stays).

        The ``k = nvlink_span / stride`` members sharing an NVLink domain (at most ``group``)
        exchange ``(k - 1) / group`` of the data over NVLink, the members sharing only the
        server their part over PCIe, and the rest leaves over each GPU's own NIC; the parts run
        at once, so the slowest decides, plus one step latency per peer.
        """
        stride, group = np.asarray(stride), np.asarray(group, dtype=float)
        step = np.maximum(stride, 1)
        k = np.clip(self.nvlink_span // step, 1, np.maximum(group, 1))
        k_local = np.clip(self.local_span // step, k, np.maximum(group, 1))
        intra = (k - 1) / group * bytes_ / self.intra_bw
        pcie = (k_local - k) / group * bytes_ / self.local_bw
        inter = (group - k_local) / group * bytes_ / self.inter_bw
        lat = np.where(group > k_local, self.inter_lat, self.intra_lat) * (group - 1)
        return np.where(group > 1, np.maximum(np.maximum(intra, pcie), inter) + lat, 0.0)

    def select(self, span: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Bandwidth and step latency for groups spanning ``span`` consecutive ranks: NVLink
        inside the domain, PCIe inside the server, else the network."""
        span = np.asarray(span)
        bw = np.where(span <= self.nvlink_span, self.intra_bw,
                      np.where(span <= self.local_span, self.local_bw, self.inter_bw))
        return bw, np.where(span <= self.local_span, self.intra_lat, self.inter_lat)


def ring_time(bytes_: np.ndarray, group: np.ndarray, bw: np.ndarray, lat: np.ndarray,
              factor: float = 1.0) -> np.ndarray:
    """One ring collective over ``group`` ranks on a tensor of ``bytes_`` (the full tensor).

    ``factor`` 1 gives all-gather / reduce-scatter / all-to-all, 2 gives all-reduce (the Scaling
    Book's ``(q-1)/q M / W`` per phase). A group of one costs nothing.
    """
    q = np.asarray(group, dtype=float)
    steps = factor * (q - 1.0)
    return np.where(q > 1, steps / q * bytes_ / bw + steps * lat, 0.0)
