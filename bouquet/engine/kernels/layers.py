"""Building blocks shared by the model files: activations, RMSNorm, the rotary base, and
weight fusion. Nothing here knows about requests, padding or pooling (fused kernels: ops.py).

Sources followed: RMSNorm as in ``transformers/models/qwen3/modeling_qwen3.py``
(``Qwen3RMSNorm``), computed in the same precision order so that bf16 results agree with it.
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
    ``weight`` in the input dtype (HF's order: the cast happens before the multiply).

    ``unit_offset`` (Gemma, ``Gemma3RMSNorm``): the scale is (1 + weight), applied in float32
    before the one cast to the input dtype."""

    def __init__(self, dim: int, eps: float, unit_offset: bool = False) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(dim) if unit_offset else torch.ones(dim))
        self.eps = eps
        self.unit_offset = unit_offset

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        if self.unit_offset:
            return (xf * (1.0 + self.weight.float())).to(x.dtype)
        return self.weight * xf.to(x.dtype)


def rope_theta(cfg: dict[str, Any]) -> float:
    """The rotary base from a config (transformers v5 ``rope_parameters`` or v4 ``rope_theta``).

    Raises ValueError for a scaled rope (yarn, linear, …) in ``rope_parameters`` or in
    ``rope_scaling``: only the default rope is implemented. Both keys are read: a transformers-5
    config.json holds ``rope_parameters`` with the default type, and the edit model cards ask for
    (``"rope_scaling": {"rope_type": "yarn", ...}``) adds the other, which transformers applies.
    """
    params = cfg.get("rope_parameters") or {}
    for scaled in (params, cfg.get("rope_scaling") or {}):
        kind = scaled.get("rope_type", scaled.get("type", "default"))
        if kind != "default":
            raise ValueError(f"rope_type {kind!r} is not supported; only 'default' rotary embeddings are")
    return float(params.get("rope_theta", cfg.get("rope_theta", 10000.0)))


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
