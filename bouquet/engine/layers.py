"""Building blocks shared by the model files: activations, RMSNorm, rotary embeddings, and
weight fusion. Nothing here knows about requests, padding or pooling.

Sources followed: RMSNorm and rotary as in ``transformers/models/qwen3/modeling_qwen3.py``
(``Qwen3RMSNorm``, ``rotate_half``/``apply_rotary_pos_emb``), computed in the same precision
order so that bf16 results agree with the reference.
"""
from __future__ import annotations

from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn

ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "gelu": F.gelu,
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "relu": F.relu,
    "silu": F.silu,
    "swish": F.silu,
}


def activation(name: str) -> Callable[[torch.Tensor], torch.Tensor]:
    """Raises ValueError naming the unsupported activation and the supported ones."""
    if name not in ACTIVATIONS:
        raise ValueError(f"activation {name!r} is not supported; supported: {sorted(ACTIVATIONS)}")
    return ACTIVATIONS[name]


class RMSNorm(nn.Module):
    """x [..., D] any float dtype → same shape and dtype. Normalizes in float32, then scales by
    ``weight`` in the input dtype (HF's order: the cast happens before the multiply)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)


def rope_theta(cfg: dict[str, Any]) -> float:
    """The rotary base from a config (transformers v5 ``rope_parameters`` or v4 ``rope_theta``).

    Raises ValueError for a scaled rope (yarn, linear, …): only the default rope is implemented.
    """
    params = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    kind = params.get("rope_type", params.get("type", "default"))
    if kind != "default":
        raise ValueError(f"rope_type {kind!r} is not supported; only 'default' rotary embeddings are")
    return float(params.get("rope_theta", cfg.get("rope_theta", 10000.0)))


class Rotary(nn.Module):
    """Rotary position embedding with per-token positions (packed batches: each sequence's
    positions restart at 0, taken from ``Batch.position_ids``).

    ``cos_sin(position_ids [T] int64, dtype)`` → (cos, sin) [T, 1, head_dim] in ``dtype``;
    ``apply(x [T, H, head_dim], cos, sin)`` → rotated x, same shape and dtype.
    """

    def __init__(self, head_dim: int, theta: float) -> None:
        super().__init__()
        self.head_dim = head_dim
        self.theta = theta

    def cos_sin(self, position_ids: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        # Built per call from positions (cheap next to the layers) so no table needs loading.
        inv = 1.0 / (self.theta ** (torch.arange(0, self.head_dim, 2, device=position_ids.device,
                                                  dtype=torch.int64).float() / self.head_dim))
        freqs = position_ids.float()[:, None] * inv[None, :]  # [T, head_dim/2] fp32
        emb = torch.cat((freqs, freqs), dim=-1)[:, None, :]  # [T, 1, head_dim]
        return emb.cos().to(dtype), emb.sin().to(dtype)

    @staticmethod
    def apply(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        half = x.shape[-1] // 2
        rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
        return x * cos + rotated * sin


def fuse_linears(*mods: nn.Linear) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Concatenate the weights (and biases) of linears that read the same input, so one GEMM
    replaces several. Each module's parameters are re-pointed at a view of the fused tensor, so
    memory is not doubled and ``state_dict`` names stay Hugging Face's.

    Returns (weight [sum(out), in], bias [sum(out)] or None).
    """
    w = torch.cat([m.weight.detach() for m in mods])
    has_bias = [m.bias is not None for m in mods]
    b = torch.cat([m.bias.detach() for m in mods]) if all(has_bias) else None
    if any(has_bias) and b is None:
        raise ValueError("cannot fuse linears where only some have a bias")
    start = 0
    for m in mods:
        n = m.weight.shape[0]
        m.weight = nn.Parameter(w[start:start + n], requires_grad=False)
        if b is not None:
            m.bias = nn.Parameter(b[start:start + n], requires_grad=False)
        start += n
    return w, b
