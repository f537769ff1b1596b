"""Programmatic dependent launch (PDL) for the engine's Triton kernels, on Hopper.

Without it a kernel's programs start only once the previous kernel has finished and the GPU front
end has launched the new grid: at batch 1, where most of Qwen3-0.6B's ~270 kernels per forward
run for 1–5 µs, that launch gap and each grid's ramp-up are a large share of the step. A grid
launched with CUDA's programmatic stream serialization attribute may start as soon as every
program of the previous grid has signalled (``griddepcontrol.launch_dependents``) or exited; its
programs then block in ``griddepcontrol.wait`` until the previous grid has completed and its
writes are visible (CUDA programming guide, "Programmatic Dependent Launch and Synchronization";
PTX ISA, ``griddepcontrol``). Stream capture keeps the relation as a programmatic graph edge, so
CUDA-graph replays get it too.

The contract every kernel launched with ``launch_options`` keeps (``kernels._pdl_enter``): wait
first, before any load or store of data another kernel writes or reads, then signal. (The one
access before the wait: ``PREFETCHES`` kernels ask L2 for their weights, which no kernel writes.) Waiting
first keeps ordering transitive — the previous grid completes only after the one before it, so a
wait covers every earlier kernel. Kernels launched without the attribute (cuBLAS, PyTorch's) keep
full stream order; a wait without PDL is a no-op.

Which launches take part is decided here (``launch_options``: measured, see ``MAX_PROGRAMS``);
what this module does NOT own is kernel code or the launch sites, which pass their kernel's name
and grid size.
"""
from __future__ import annotations

import functools

import torch

MIN_CUDA = (12, 3)  # stream capture of PDL launches (graph programmatic edges) needs CUDA 12.3


@functools.lru_cache(maxsize=8)
def supported(device_index: int) -> bool:
    """Whether the Triton kernels launch with PDL on CUDA device ``device_index``: an NVIDIA
    Hopper GPU (compute capability 9.x, where it was measured), CUDA ≥ ``MIN_CUDA`` in both the
    build and the driver, and a Triton with ``griddepcontrol`` (``kernels.HAS_GDC``). Decided once
    per device."""
    if torch.version.hip is not None or torch.version.cuda is None:
        return False
    if tuple(int(v) for v in torch.version.cuda.split(".")[:2]) < MIN_CUDA:
        return False
    try:  # e.g. 13000; a 12.2 driver runs a 12.4 build, and capture of PDL launches is the driver's
        driver = int(torch._C._cuda_getDriverVersion())
    except (AttributeError, RuntimeError, TypeError):  # not in this build: the build's version decides
        driver = 0
    if driver and (driver // 1000, driver % 1000 // 10) < MIN_CUDA:
        return False
    if torch.cuda.get_device_capability(device_index)[0] != 9:  # measured on Hopper only (an H200)
        return False
    try:
        from bouquet.engine import kernels
    except ImportError:  # no Triton
        return False
    return kernels.HAS_GDC


# The launch sites' names for their kernels.
KERNELS = frozenset({"splitk", "norm_parts", "norm", "attention", "qk_norm_rope", "act", "act_quant", "small_gemm",
                     "small_gated"})
# Kernels that always take PDL: the add + norm kernels reading split-K parts (after the split-K
# GEMM) and the split-K GEMM itself — in decoders after our attention or gated activation; in
# encoders its MLP-down instance follows cuBLAS's up + GELU, and bge-base still gained (call 4);
# and the small steps' qkv / MLP-in GEMMs (fused_gemms.small_linear; small_gated: the gated MLP's
# gate/up, small_gate_up_act), which follow an add + norm.
FOLLOWS_OURS = frozenset({"splitk", "norm_parts", "small_gemm", "small_gated"})
# The others (attention, q/k-norm + rotary, the activations, norms of a cuBLAS output) follow a
# cuBLAS GEMM or our own kernel depending on the model and the step; they take PDL only with a
# grid this small, as their programs may start early and wait on the SMs through the whole
# predecessor: all of them with PDL made Qwen3-0.6B's batch-1 replays 8.8% faster at 16 tokens but
# 0.7% / 6.6% slower at 128 / 512 (bench/results/h200-2026-12-01g, call 2); 64 measured best of
# 0 / 32 / 64 / 160 (call 4).
MAX_PROGRAMS = 64
# Kernels that stream weights (the batch-1 GEMMs): launched early under PDL, their programs first ask
# L2 for their own weight slab (``kernels._prefetch_rows``), then wait; the weights do not depend on
# the previous grid, so HBM streams them while that grid still runs (norms, attention: latency-bound
# at batch 1) and the GEMM then reads them from L2.
PREFETCHES = frozenset({"splitk", "small_gemm", "small_gated"})
# ... but only weights of at most this many bytes: measured on the H200 (bench/results/h200-2026-12-02,
# calls 1–3), bge-base's (≤ 4.7 MB) and Qwen3-0.6B's o / down (4.2 / 6.3 MB) gain 1–4% per batch-1
# replay, while Qwen3-0.6B's qkv and gate/up (8.4 / 12.6 MB) lose 1–3%: more than HBM streams while
# the add + norm before them runs, the prefetch then queues ahead of the GEMM's own loads.
PREFETCH_MAX_BYTES = 7 << 20


def takes_pdl(kernel: str, programs: int) -> bool:
    """Whether a launch of ``kernel`` (one of ``KERNELS``) with ``programs`` programs uses PDL
    where the device supports it: it follows one of our kernels, or its grid is small. Raises
    ValueError for a name not in ``KERNELS``."""
    if kernel not in KERNELS:
        raise ValueError(f"unknown kernel name {kernel!r} (pdl.KERNELS: {sorted(KERNELS)})")
    return kernel in FOLLOWS_OURS or programs <= MAX_PROGRAMS


def _bulk_aligned(weight: torch.Tensor) -> bool:
    # the bulk prefetch takes 16-byte aligned addresses and sizes (PTX ISA, cp.async.bulk.prefetch)
    return weight.is_contiguous() and weight.data_ptr() % 16 == 0 and weight.shape[-1] * weight.element_size() % 16 == 0


def launch_options(x: torch.Tensor, kernel: str, programs: int, weight: torch.Tensor | None = None
                   ) -> dict[str, bool]:
    """Extra launch keywords for the Triton kernel ``kernel`` (a name of ``KERNELS``) launching
    ``programs`` programs on ``x``'s device: ``PDL`` (the kernel's constexpr: wait, then signal)
    and ``launch_pdl`` (Triton's launch attribute) where ``supported`` and ``takes_pdl``; else
    none (a plain launch). ``weight`` [N, K]: the kernel's weight, for ``PREFETCH`` (the kernel's
    constexpr: prefetch its slab into L2 before the wait) where ``kernel`` is in ``PREFETCHES``,
    the weight has at most ``PREFETCH_MAX_BYTES`` and suits the bulk prefetch. Raises ValueError
    for an unknown kernel name."""
    if not takes_pdl(kernel, programs) or not x.is_cuda:
        return {}
    if supported(x.device.index if x.device.index is not None else torch.cuda.current_device()):
        opts = {"PDL": True, "launch_pdl": True}
        if kernel in PREFETCHES and weight is not None and _bulk_aligned(weight) \
                and weight.numel() * weight.element_size() <= PREFETCH_MAX_BYTES:
            opts["PREFETCH"] = True
        return opts
    return {}
