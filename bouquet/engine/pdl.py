"""Programmatic dependent launch (PDL) for the engine's Triton kernels, on Hopper and later.

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
first, before any load or store of data another kernel writes or reads, then signal (``MODE``). Waiting
first keeps ordering transitive — the previous grid completes only after the one before it, so a
wait covers every earlier kernel — and a grid may read only constants (weights) before it
(``kernels.splitk_gemm_kernel`` prefetches its weight tile into L2 there). Kernels launched
without the attribute (cuBLAS, PyTorch's) keep full stream order; a wait without PDL is a no-op.

What this module does NOT own: which kernels take part (their launch sites pass
``launch_options``) or any kernel code.
"""
from __future__ import annotations

import functools

import torch

MIN_CUDA = (12, 3)  # stream capture of PDL launches (graph programmatic edges) needs CUDA 12.3


@functools.lru_cache(maxsize=8)
def supported(device_index: int) -> bool:
    """Whether the Triton kernels launch with PDL on CUDA device ``device_index``: an NVIDIA GPU
    of compute capability 9.0 or later, CUDA ≥ ``MIN_CUDA``, and a Triton with ``griddepcontrol``
    (``kernels.HAS_GDC``). Decided once per device."""
    if torch.version.hip is not None or torch.version.cuda is None:
        return False
    if tuple(int(v) for v in torch.version.cuda.split(".")[:2]) < MIN_CUDA:
        return False
    if torch.cuda.get_device_capability(device_index)[0] < 9:
        return False
    try:
        from bouquet.engine import kernels
    except ImportError:  # no Triton
        return False
    return kernels.HAS_GDC


# What a launch does with PDL (kernels._pdl_enter / _pdl_exit): 1 = wait, then signal at once (the
# next grid's programs may start while this one runs); 2 = wait, signal after the last store.
MODE = 1
# The kernels that launch with PDL: those whose predecessor in a step is, as a rule, one of ours —
# attention (after q/k-norm + rotary in decoders), the split-K GEMM (after attention or the gated
# activation) and the add + norm kernels that read its parts ("norm_parts"). Left out: kernels after
# cuBLAS GEMMs ("qk_norm_rope", "act", "act_quant", "norm" of a cuBLAS output), whose waiting
# programs would sit on the SMs through the whole GEMM (bench/results/h200-2026-12-02).
KERNELS = frozenset({"attention", "splitk", "norm_parts"})


def launch_options(x: torch.Tensor, kernel: str) -> dict[str, int | bool]:
    """Extra launch keywords for the Triton kernel ``kernel`` (a name of ``KERNELS``' kind) on
    ``x``'s device: ``PDL`` (the kernel's constexpr: ``MODE``) and ``launch_pdl`` (Triton's launch
    attribute) where ``supported`` and ``kernel`` is in ``KERNELS``, else none (plain launches)."""
    if kernel in KERNELS and x.is_cuda and supported(x.device.index if x.device.index is not None
                                                     else torch.cuda.current_device()):
        return {"PDL": MODE, "launch_pdl": True}
    return {}
