"""The memory a training process can give its tensors: device bytes less the runtime's reserves.

A stage fits when the bytes the cost model counts per GPU (:mod:`solver.cost.memory`: model
states, activations, and the caching allocator's fragmentation of the activations,
:data:`FRAGMENTATION`) are at most :func:`usable_bytes`::

    usable = (1 − ε) · device − CUDA_CONTEXT_BYTES − NCCL_RESERVE_BYTES

``device`` is the memory CUDA reports per GPU (``cudaMemGetInfo``'s total, nvidia-smi's
``Total``); the two reserves are what every process of a Megatron-style run holds outside
PyTorch's allocator, each a named constant with its source below; ``ε`` is the user's own margin
(``[planner] epsilon``, default 0) for what the model does not count. Before, one flat
``(1 − ε) · hbm_gb · 10⁹`` with ε = 0.1 stood for all of it, and in the wrong unit.

Units: memory dies come in powers of two, so a datasheet's "80 GB" of HBM is 80 GiB, 85.9·10⁹
bytes. NVML reports 81,920 MiB for the A100 80GB and 40,960 MiB for the A100 40GB; the H100
80GB keeps 361 of its 81,920 MiB (81,559 MiB, 85.52·10⁹ B) and the H200 613 of 141 GiB; GDDR
cards run ECC in 1/16 of their memory, so the L40S's "48 GB" is 46,068 MiB and the A10's
"24 GB" 23,028 MiB (C. Frye, Modal, "Why does an NVIDIA H100 80GB card offer 85.52 GB?",
thundergolfer.com/blog/nvidia-gpu-memory-capacity, NVML figures per GPU). The catalog gives
that figure as ``memory_mib`` where it is known; elsewhere ``hbm_gb`` is read as GiB
(:attr:`~solver.spec.hardware.GPUSpec.device_mib`).

The model's count and this cap are compared in bytes; reports print 10⁹-byte GB.
"""

from __future__ import annotations

from solver.spec.domain import GPUSpec, Island

__all__ = ["CUDA_CONTEXT_BYTES", "FRAGMENTATION", "GIB", "MIB", "NCCL_CHANNELS",
           "NCCL_COMMUNICATORS", "NCCL_COMMUNICATOR_BYTES", "NCCL_RESERVE_BYTES",
           "RUNTIME_RESERVE_BYTES", "device_bytes", "gpu_usable_bytes",
           "usable_bytes"]

GIB = float(2 ** 30)
MIB = float(2 ** 20)

CUDA_CONTEXT_BYTES = 1.0 * GIB
"""The CUDA context of one training process, with its kernels and library workspaces.

PyTorch's bare context is about 0.3 GB with lazy module loading (ptrblck, pytorch/pytorch
#107667; PR #86509 measured 287 MB lazy against 667 MB with every kernel loaded eagerly), and
before CUDA 11.7 loaded every kernel, over 1 GB. A training step also loads cuBLAS(Lt),
FlashAttention, Transformer Engine and NCCL kernels and keeps cuBLAS workspaces (32 MiB per
handle on Hopper); 1 GiB bounds the eager-loading figures."""

NCCL_LL_BYTES = 8 * 512 * 8 * 16
"""NCCL's LL protocol buffer per channel and peer: 8 lines per thread × 512 threads × 8 steps
× 16-byte lines = 524,288 B (``DEFAULT_LL_BUFFSIZE``, NCCL ``src/init.cc``, ``device.h``)."""

NCCL_LL128_BYTES = 120 * 640 * 8 * 8
"""NCCL's LL128 buffer: 120 elements per thread × 640 threads × 8 steps × 8 B = 4,915,200 B
(``DEFAULT_LL128_BUFFSIZE``)."""

NCCL_SIMPLE_BYTES = 4 * 2 ** 20
"""NCCL's Simple protocol buffer, ``NCCL_BUFFSIZE``: 4 MiB by default (NCCL user guide,
Environment Variables, NCCL_BUFFSIZE: "The default is 4194304 (4 MiB)")."""

NCCL_CHANNELS = 32
"""Channels of one NVLink communicator on an HGX H100 board (NCCL opens 32 per pair of
GPUs there: NVIDIA/nccl #1685); NCCL's memory grows linearly with them (sjeaugey, #864)."""

NCCL_COMMUNICATOR_BYTES = 2 * NCCL_CHANNELS * (NCCL_LL_BYTES + NCCL_LL128_BYTES
                                               + NCCL_SIMPLE_BYTES)
"""One ring communicator's buffers on one GPU: every channel connects one peer in and one out,
each with the three protocols' buffers: 2 × 32 × 9,633,792 B = 616,562,688 B (588 MiB). Measured:
544 MB per two-GPU group and 688 MB per larger group after one all-reduce on 4 A100 with NVLink
(NVIDIA/nccl #964)."""

NCCL_COMMUNICATORS = 3
"""Communicators a rank of a 3-D layout connects: its tensor-, pipeline- and data-parallel
groups. NCCL 2.22+ connects a communicator's peers only when it first communicates
(``NCCL_RUNTIME_CONNECT``, default 1), so groups a rank never uses hold no buffers. Left out:
an expert-parallel all-to-all connects every peer of its group (about 3.3 GB on 8 H100,
NVIDIA/nccl #1685)."""

NCCL_RESERVE_BYTES = NCCL_COMMUNICATORS * NCCL_COMMUNICATOR_BYTES
"""NCCL's buffers per GPU: 3 × 616,562,688 = 1,849,688,064 B (1.72 GiB)."""

RUNTIME_RESERVE_BYTES = CUDA_CONTEXT_BYTES + NCCL_RESERVE_BYTES
"""What a process holds outside PyTorch's allocator: 2,923,429,888 B (2.72 GiB)."""

FRAGMENTATION = 0.05
"""Bytes PyTorch's caching allocator holds beyond the activations it serves, per byte of them.

Weights, gradient buffers and optimizer states are allocated once, in large contiguous buffers;
activations are allocated and freed every micro-batch in varying sizes and orders, and the
allocator cannot always reuse the freed blocks: it rounds blocks and keeps split remainders
under 1 MiB unsplit (``c10/cuda/CUDACachingAllocator.cpp``), and blocks freed out of order
strand their neighbours. Measured over the whole pool, fragmentation (1 − allocated /
reserved) averages 15 % and reaches 33 % in LLM training with recomputation, ZeRO and offload
(Guo et al., "GMLake", ASPLOS 2024); ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``
("the single most effective fix", NVIDIA's Megatron-Bridge memory-tuning skill card) grows
segments page by page instead and removes most of it. 5 % of the activations sits between
the two; NVIDIA's Llama 3 70B FP8 layout on 64 H100 (TP 4, PP 8, VP 5), which runs, bounds it
at 7.0 % under this model (79.41 GB counted, 45.78 GB of it activations, 82.60 GB usable)."""


def device_bytes(island: Island) -> float:
    """Memory CUDA reports per GPU on ``island``: the smallest member's, bytes."""
    return island.device_mib * MIB


def gpu_usable_bytes(gpu: GPUSpec, epsilon: float) -> float:
    """Bytes per GPU of type ``gpu`` the cost model's count may reach: ``(1 − ε) · device``
    less the CUDA context and NCCL's buffers (module docstring)."""
    return (1.0 - epsilon) * gpu.device_mib * MIB - RUNTIME_RESERVE_BYTES


def usable_bytes(island: Island, epsilon: float) -> float:
    """:func:`gpu_usable_bytes` of ``island``'s smallest member: what a stage on it may use."""
    return (1.0 - epsilon) * device_bytes(island) - RUNTIME_RESERVE_BYTES
