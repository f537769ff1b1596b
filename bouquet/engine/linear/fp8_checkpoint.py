"""Checkpoints whose linear weights are already stored in fp8 (e4m3), loaded as they are.

Two layouts are read, both described by ``quantization_config`` in config.json:

- per-channel or per-tensor scales (``weight_scale`` [N, 1], [N], [1] or []): compressed-tensors'
  "float-quantized" checkpoints (``quant_method: compressed-tensors``, weights ``strategy:
  channel | tensor``, e.g. the FP8-dynamic models made by llm-compressor) and ``fbgemm_fp8``. The
  stored e4m3 values and scales are exactly what ``quant.Fp8Weight`` holds, so with
  ``--quantization fp8`` the engine's fp8 matmuls use them unchanged (no re-quantization).
- 2-D block scales (``weight_scale_inv`` [⌈N/bn⌉, ⌈K/bk⌉], transformers' ``quant_method: fp8``
  with ``weight_block_size``): the row-wise fp8 GEMM takes one scale per output channel, so these
  are dequantized, and ``--quantization fp8`` re-quantizes them per channel (logged as such).

Either way the model's own (bf16/fp32) weights are the dequantized values W = Wq · s: a step that
runs in the model dtype (small steps, the CPU, or no ``--quantization fp8``) computes with exactly
the weights the checkpoint defines. Static activation scales (``input_scale``) are dropped:
activations are always quantized per token at run time, which is at least as fine.

What this module does not own: which matmuls run in fp8 and from how many tokens (linear/fp8.py and
each layer's ``FP8_KINDS``), the load-time accuracy check (engine.py).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

FP8_DTYPES = (torch.float8_e4m3fn,)


@dataclass
class StoredFp8:
    """What a checkpoint stored in fp8 leaves for the fp8 path. ``rows``: Hugging Face weight
    name → (e4m3 values [N, K], per-output-channel scales [N] float32), for the per-channel and
    per-tensor layouts only. ``description``: one line for the start-up log."""

    rows: dict[str, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)
    description: str = ""


def split_fp8_checkpoint(state: dict[str, torch.Tensor], config: dict[str, Any]) -> tuple[dict[str, torch.Tensor], StoredFp8]:
    """Replace every e4m3 ``*.weight`` of ``state`` by its dequantized float32 values and drop the
    scale entries (``weight_scale``, ``weight_scale_inv``, ``input_scale``). Returns the new
    state and the stored fp8 rows (empty when the checkpoint has no fp8 weights; ``state`` is
    then returned as it is).

    Raises ValueError when an fp8 weight has no scale, a scale's shape fits no layout above, or
    the checkpoint stores fp8 in another format (e5m2)."""
    fp8_names = [k for k, t in state.items() if k.endswith(".weight") and t.dtype in FP8_DTYPES]
    other = [k for k, t in state.items() if t.dtype == torch.float8_e5m2]
    if other:
        raise ValueError(f"fp8 weights in e5m2 are not supported (only e4m3): {other[:3]}")
    if not fp8_names:
        return state, StoredFp8()
    qc = config.get("quantization_config") or {}
    out = dict(state)
    stored = StoredFp8()
    blocks = 0
    for name in fp8_names:
        base = name[: -len("weight")]
        w = state[name]
        n, k = w.shape
        if base + "weight_scale" in state:
            s = state[base + "weight_scale"].float().reshape(-1)
            if s.numel() == 1:
                s = s.expand(n).contiguous()  # per-tensor: the same scale on every channel
            elif s.numel() != n:
                raise ValueError(f"{base}weight_scale has {s.numel()} values; expected 1 or {n} (one per output channel)")
            out[name] = w.float() * s[:, None]
            stored.rows[name] = (w, s)
        elif base + "weight_scale_inv" in state:
            s = state[base + "weight_scale_inv"].float()  # [⌈N/bn⌉, ⌈K/bk⌉], multiplied in
            bn, bk = qc.get("weight_block_size") or (-(-n // s.shape[0]), -(-k // s.shape[1]))
            full = s.repeat_interleave(bn, 0)[:n].repeat_interleave(bk, 1)[:, :k]
            out[name] = w.float() * full
            blocks += 1
        else:
            raise ValueError(f"{name} is stored in fp8 but the checkpoint has no {base}weight_scale")
        for suffix in ("weight_scale", "weight_scale_inv", "input_scale"):
            out.pop(base + suffix, None)
    method = qc.get("quant_method", "unknown")
    stored.description = (f"checkpoint stores {len(fp8_names)} weights in fp8 e4m3 (quant_method {method}): "
                          f"{len(stored.rows)} with per-channel/per-tensor scales, {blocks} with block scales")
    return out, stored


def stored_rows_for(model: torch.nn.Module, weight: torch.Tensor, stored: StoredFp8) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The stored e4m3 rows and scales of one (possibly fused) projection weight [N, K], or None
    when any of its parts was not stored per channel. Fused projections (q/k/v, gate/up) are
    found by storage: ``layers.fuse_linears`` re-points each part's parameter at a view of the
    fused weight, so a part's row offset is its storage offset."""
    if not stored.rows:
        return None
    K = weight.shape[1]
    base = weight.untyped_storage().data_ptr()
    parts: list[tuple[int, str]] = []
    for name, p in model.named_parameters():
        if p.dim() == 2 and p.shape[1] == K and p.untyped_storage().data_ptr() == base:
            parts.append(((p.storage_offset() - weight.storage_offset()) // K, name))
    parts.sort()
    rows, scales, at = [], [], 0
    for offset, name in parts:
        if name not in stored.rows or offset != at:
            return None
        q, s = stored.rows[name]
        rows.append(q)
        scales.append(s)
        at += q.shape[0]
    if at != weight.shape[0]:
        return None
    dev = weight.device
    return torch.cat(rows).to(dev).contiguous(), torch.cat(scales).to(dev, torch.float32)
