"""bge-m3's token heads: the lexical (sparse) weight and the ColBERT vector of every token.

BAAI/bge-m3 ships, next to its XLM-R weights, ``sparse_linear.pt`` (a Linear hidden → 1) and
``colbert_linear.pt`` (a Linear hidden → C) as plain state dicts. Following FlagEmbedding's
``BGEM3FlagModel`` (``_sparse_embedding``, ``_colbert_embedding``, ``encode``): a token's weight is
relu(sparse_linear(h)); its ColBERT vector is colbert_linear(h), L2-normalized. Which tokens count
(every token but the first for ColBERT; no special tokens for the lexical weights, the maximum per
token id) is the gateway's business: the engine returns every token's row.

The files are read with ``torch.load(weights_only=True)`` only — tensors, never pickled code — and
anything else is refused naming the file.
"""
from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from bouquet.engine.models.weights import WeightError
from bouquet.modelspec import M3_HEAD_FILES

SPARSE_FILE, COLBERT_FILE = M3_HEAD_FILES


def _linear(file: Path, hidden: int, out: int | None) -> nn.Linear:
    """A Linear from a ``{"weight" [out, hidden], "bias" [out]}`` file. Raises WeightError naming the
    file when it is not such a dict of tensors (or holds anything torch's weights-only loader refuses)."""
    try:
        state = torch.load(file, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - any refusal is the same answer: not plain tensors
        raise WeightError(f"{file}: not loadable with torch.load(weights_only=True), which bouquet requires "
                          f"(tensors only, no pickled objects): {type(e).__name__}: {e}") from None
    if not isinstance(state, dict) or set(state) != {"weight", "bias"} or \
            not all(isinstance(t, torch.Tensor) for t in state.values()):
        raise WeightError(f"{file}: expected a state dict with 'weight' and 'bias' tensors, got "
                          f"{sorted(state) if isinstance(state, dict) else type(state).__name__}")
    w, b = state["weight"], state["bias"]
    if w.dim() != 2 or w.shape[1] != hidden or (out is not None and w.shape[0] != out) or tuple(b.shape) != (w.shape[0],):
        raise WeightError(f"{file}: weight {tuple(w.shape)} / bias {tuple(b.shape)} do not fit hidden size {hidden}")
    layer = nn.Linear(hidden, w.shape[0])
    layer.load_state_dict({"weight": w.float(), "bias": b.float()})
    return layer


class M3Heads(nn.Module):
    """hidden [T, H] (any float dtype) → [T, 1 + C] float32: column 0 the token's lexical weight,
    columns 1.. its L2-normalized ColBERT vector."""

    def __init__(self, path: Path, hidden: int) -> None:
        super().__init__()
        self.sparse_linear = _linear(path / SPARSE_FILE, hidden, 1)
        self.colbert_linear = _linear(path / COLBERT_FILE, hidden, None)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        h = hidden.float()
        weight = torch.relu(self.sparse_linear(h))  # [T, 1]
        colbert = F.normalize(self.colbert_linear(h), p=2, dim=-1)  # [T, C]
        return torch.cat([weight, colbert], dim=1)
