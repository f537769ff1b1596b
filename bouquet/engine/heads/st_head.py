"""The sentence-transformers modules that run after pooling: ``Dense`` layers and any
``Normalize`` between them (a final ``Normalize`` is ``pooling.finalize``'s).

Built once at load from ``ModelSpec.head_steps`` (read by ``bouquet/st_modules.py``) and called by
the engine on the pooled rows inside the same forward function, so on CUDA it is captured in the
same graph as the transformer and pooling. Follows sentence-transformers 6.2's
``base/modules/dense.py`` (``act(linear(x))``, plus ``x`` or ``residual(x)`` with
``use_residual``) and ``base/modules/normalize.py`` (``F.normalize(x, p=2, dim=-1)``).
Dense weights are read from the module folder's ``model.safetensors`` only (never a pickle) and
kept in float32: they are small and the pooled rows are float32 already.
"""
from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from torch import nn

from bouquet.engine.models.weights import WeightError
from bouquet.st_modules import DenseSpec, Step

_ACTS: dict[str, nn.Module] = {"tanh": nn.Tanh(), "identity": nn.Identity(), "relu": nn.ReLU(), "gelu": nn.GELU(),
                               "sigmoid": nn.Sigmoid(), "silu": nn.SiLU()}


class Dense(nn.Module):
    """One sentence-transformers ``Dense``: [B, in] float32 → [B, out] float32."""

    def __init__(self, spec: DenseSpec) -> None:
        super().__init__()
        self.linear = nn.Linear(spec.in_features, spec.out_features, bias=spec.bias)
        self.act = _ACTS[spec.activation]
        self.use_residual = spec.use_residual
        if spec.use_residual and spec.in_features != spec.out_features:
            self.residual = nn.Linear(spec.in_features, spec.out_features, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.act(self.linear(x))
        if self.use_residual:
            y = y + (self.residual(x) if hasattr(self, "residual") else x)
        return y


class Normalize(nn.Module):
    """L2 normalization of each row (a Normalize that another module follows)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.normalize(x, p=2, dim=-1)


def _load_dense(spec: DenseSpec) -> Dense:
    """A Dense with its weights from ``spec.path / "model.safetensors"``. Raises WeightError
    naming the folder when names or shapes differ."""
    layer = Dense(spec)
    file: Path = spec.path / "model.safetensors"
    state = load_file(str(file))
    want = dict(layer.state_dict())
    missing, unexpected = sorted(set(want) - set(state)), sorted(set(state) - set(want))
    if missing or unexpected:
        raise WeightError(f"{file}: Dense weights missing {missing}, unexpected {unexpected}")
    for k, t in state.items():
        if tuple(t.shape) != tuple(want[k].shape):
            raise WeightError(f"{file}: {k} has shape {tuple(t.shape)}, the config says {tuple(want[k].shape)}")
    layer.load_state_dict({k: t.float() for k, t in state.items()})
    return layer


def build_head(steps: tuple[Step, ...], device: torch.device) -> nn.Sequential | None:
    """The steps as one module on ``device`` (float32, eval), or None when there are none.
    Raises WeightError for Dense weights that do not match their config."""
    if not steps:
        return None
    mods = [Normalize() if s == "normalize" else _load_dense(s) for s in steps]
    return nn.Sequential(*mods).to(device=device, dtype=torch.float32).eval()
