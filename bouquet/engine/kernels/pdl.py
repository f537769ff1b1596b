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

import torch

from bouquet.engine.plan import PDL_MAX_PROGRAMS as MAX_PROGRAMS, PDL_PREFETCH_MAX_BYTES as PREFETCH_MAX_BYTES, profile_of


def supported(device_index: int) -> bool:
    """Whether the Triton kernels launch with PDL on CUDA device ``device_index``
    (``plan.DeviceProfile.pdl``: a measured Hopper, CUDA ≥ 12.3 in build and driver, Triton's
    ``griddepcontrol``). Read once per device."""
    return profile_of(device_index).pdl


# The launch sites' names for their kernels.
KERNELS = frozenset({"splitk", "norm_parts", "norm", "attention", "qk_norm_rope", "act", "act_quant", "small_gemm",
                     "small_gated"})
# Kernels that always take PDL: the add + norm kernels reading split-K parts (after the split-K
# GEMM) and the split-K GEMM itself — in decoders after our attention or gated activation; in
# encoders its MLP-down instance follows cuBLAS's up + GELU, and bge-base still gained;
# and the small steps' qkv / MLP-in GEMMs (fused_gemms.small_linear; small_gated: the gated MLP's
# gate/up, small_gate_up_act), which follow an add + norm.
FOLLOWS_OURS = frozenset({"splitk", "norm_parts", "small_gemm", "small_gated"})
# The others (attention, q/k-norm + rotary, the activations, norms of a cuBLAS output) follow a
# cuBLAS GEMM or our own kernel depending on the model and the step; they take PDL only with a
# grid of at most plan.PDL_MAX_PROGRAMS programs (their programs may start early and wait on the SMs
# through the whole predecessor).
# Kernels that stream weights (the batch-1 GEMMs): launched early under PDL, their programs first ask
# L2 for their own weight slab (``kernels._prefetch_rows``), then wait; the weights do not depend on
# the previous grid, so HBM streams them while that grid still runs (norms, attention: latency-bound
# at batch 1) and the GEMM then reads them from L2.
PREFETCHES = frozenset({"splitk", "small_gemm", "small_gated"})
# ... but only weights of at most plan.PDL_PREFETCH_MAX_BYTES (larger ones queue ahead of the GEMM's own loads).


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
