"""``--quantization int8`` on the CPU and its accuracy gate: the projections of ``kinds`` (default
``INT8_KINDS``), which the kernel plan gave a oneDNN method (linear/cpu.py, fp32 / bf16 models),
get an ``Int8Linear`` kernel instead. Embeddings, norms, attention, pooling and heads stay in the
model dtype: they hold a few percent of the FLOPs.

Gate: at load the engine runs a fixed probe batch (32 sequences of 8–128 random tokens, seed 0, as
the fp8 check) unquantized (which also calibrates the int8 layers) and in int8; a model whose worst output cosine
falls below the bar (``INT8_MIN_COSINE``) is refused with ValueError, so int8 never serves vectors
far from the model's own.
"""
from __future__ import annotations

import logging
from typing import Callable

import numpy as np
import torch
from torch import nn

from bouquet.engine.linear.base import linears
from bouquet.engine.plan import DeviceProfile
from bouquet.engine.linear.cpu import CpuMethod, Int8Linear, MaxRecorder, OneDnnMethod
from bouquet.engine.linear.fp8 import KINDS, agreement_name, output_cosines
from bouquet.engine.runtime.batch import Batch

log = logging.getLogger(__name__)

INT8_KINDS: tuple[str, ...] = KINDS  # all four matmuls of a layer (qkv, o, up, down)
# Kinds whose int8 input gets SmoothQuant's migration: those read a LayerNorm output (qkv, up) or
# attention's (o), whose outlier channels are the same for every input, so the random-token probe
# batch calibrates them. Not MLP down: its large channels after the activation depend on the text,
# and migration calibrated on random tokens made all-MiniLM-L6-v2's worst STSb vector worse
# (cosine 0.9968 → 0.9903; docs/decisions.md).
SMOOTHED_KINDS: tuple[str, ...] = ("qkv", "o", "up")


def describe(model: nn.Module) -> str:
    """The CPU kernels of ``model``'s projections, as logged at start."""
    cpu = DeviceProfile("cpu")
    names = sorted({lin.method.describe(lin, 1, cpu) for lin in linears(model)})
    return ", ".join(names) or "PyTorch's GEMM"


def probe_batch(vocab_size: int, max_seq_length: int) -> Batch:
    """32 sequences of 8–128 random token ids (seed 0; ids from 1,000 up where the vocabulary is
    large, past BERT's special and unused rows), packed: the load-time probe of the fp8 and int8
    accuracy gates."""
    rng = np.random.default_rng(0)
    top = min(128, max_seq_length)
    low = 1000 if vocab_size > 2000 else 0
    return Batch.pack([rng.integers(low, vocab_size, int(rng.integers(min(8, top), top + 1))).astype(np.int32)
                       for _ in range(32)])


def quantize_int8(model: nn.Module, forward: Callable[[Batch], torch.Tensor], batch: Batch, min_cosine: float,
                  kinds: tuple[str, ...] = INT8_KINDS) -> tuple[float, float]:
    """Swap the Projections of ``kinds`` to ``Int8Linear``: ``batch`` runs once unquantized,
    recording each one's per-channel input max (the SmoothQuant calibration) and the reference
    outputs, then once in int8. Returns the (min, mean) output cosine of the two runs.
    Raises ValueError, naming the cosine and the bar, below ``min_cosine`` or on non-finite
    outputs, and for a kind outside ``linear.fp8.KINDS``. Call after the kernel plan assigned the methods."""
    bad = [k for k in kinds if k not in KINDS]
    if bad:
        raise ValueError(f"int8 kinds must be among {', '.join(KINDS)}, got {', '.join(bad)}")
    chosen = [p for p in linears(model) if p.kind in kinds and isinstance(p.method, OneDnnMethod)]
    if not chosen:
        raise ValueError(f"--quantization int8 is not supported for {type(model).__name__} in this dtype: it needs "
                         "fp32 or bf16 and the matmuls of a BERT-family encoder or a decoder")
    recorders = [MaxRecorder(p.method.kernel) for p in chosen]  # type: ignore[attr-defined, arg-type]
    for p, r in zip(chosen, recorders):
        p.method = CpuMethod(r, "oneDNN, recording input maxima")
    ref = forward(batch)
    for p, r in zip(chosen, recorders):
        p.method = CpuMethod(Int8Linear.prepare(p.weight, p.bias, r.act_max if p.kind in SMOOTHED_KINDS else None),
                             "int8 (torch._int_mm)")
    cos = output_cosines(forward(batch), ref)
    if not np.isfinite(cos).all() or cos.min() < min_cosine:
        raise ValueError(f"--quantization int8 is refused for this model: on a probe batch its int8 outputs reach "
                         f"only {agreement_name(ref.shape[1])} {cos.min():.4f} against its own unquantized outputs "
                         f"(the bar is {min_cosine}); run it without --quantization")
    log.info("quantization: int8 for %d matmuls (%s of every layer; per-channel weight and per-token activation "
             "scales, SmoothQuant migration calibrated on the probe batch, int32 accumulation); probe batch %s "
             "vs the unquantized model min %.5f mean %.5f (bar %s)", len(chosen), "+".join(kinds),
             agreement_name(ref.shape[1]), cos.min(), cos.mean(), min_cosine)
    return float(cos.min()), float(cos.mean())
