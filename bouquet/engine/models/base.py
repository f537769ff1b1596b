"""The model contract: what a class under ``engine/models/`` provides to the engine.

The engine (``engine/runtime/engine.py``) builds a model on the meta device from config.json, assigns the
checkpoint's tensors by name (``engine/models/weights.py``), moves it to the device and dtype, calls
``fuse()`` once, gives each ``linear.Linear`` its method (the kernel plan), then per batch calls ``forward`` on packed tokens and ``head`` on the pooled
rows (pooling itself is ``engine/heads/pooling.py``'s, chosen by the model spec). A model never sees
requests, padding or masks.

Which architecture string maps to which class is the family table's (``bouquet/families.py``).
"""
from __future__ import annotations

import torch
from torch import nn

from bouquet.engine.attention.backends import AttnMeta


class PackedModel(nn.Module):
    """Base class of every model: the attributes and methods the engine relies on.

    Class attributes (an instance may override them when they depend on the config, e.g. a tied
    LM head):

    IGNORED_KEYS  regexes (full match) of checkpoint entries this class does not use; any other
                  entry without a parameter is a load error (``weights.assign_weights``)
    PREFIXES      checkpoint name prefixes stripped when the module lacks them (``bert.``,
                  ``model.``), so base-model and task-model checkpoints both load
    causal        whether attention is causal (decoders; may depend on the config)
    layer_windows per layer, the sliding-window half-width its attention uses (None: global);
                  () when every layer is global

    Constructor: ``cls(cfg, attn, **extra)`` with config.json as a dict and the engine's attention
    backend; ``extra`` is ``yes_no_ids`` for yes/no rerankers. Raises ValueError for a config
    the class cannot serve (unknown activation, scaled rope, ...).
    """

    IGNORED_KEYS: tuple[str, ...] = ()
    PREFIXES: tuple[str, ...] = ()
    causal: bool = False
    layer_windows: tuple[int | None, ...] = ()

    def fuse(self) -> None:
        """Called once after the weights are loaded and moved to the device: build the fused
        tensors ``forward`` reads (q/k/v in one matmul, gate/up in one, a sliced LM head).
        ``forward`` is only valid afterwards; each model has this one (fused) forward path."""

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor, token_type_ids: torch.Tensor | None,
                meta: AttnMeta) -> torch.Tensor:
        """Packed ids/positions [T] int32 (positions restart at 0 per sequence), token types [T]
        int32 or None (models without them ignore it), ``meta`` from ``attn.prepare`` →
        hidden states [T, hidden] in the model dtype. No host syncs, no data-dependent shapes
        (captured in CUDA graphs)."""
        raise NotImplementedError

    def blocks(self) -> nn.ModuleList:
        """The transformer layers, in the order ``forward`` calls each of them once (the CUDA-graph
        manager cuts its captures between them). Default: the first ``nn.ModuleList`` among the
        submodules, which is the layer list of every model here; raises ValueError without one."""
        for m in self.modules():
            if isinstance(m, nn.ModuleList):
                return m
        raise ValueError(f"{type(self).__name__} has no nn.ModuleList of layers")

    def head(self, pooled: torch.Tensor) -> torch.Tensor:
        """Pooled rows [B, hidden] float32 → outputs [B, out_dim] float32 (``ModelSpec.dimension``):
        the rows themselves for an embedder, logits for a scorer."""
        return pooled


def table(rows: int, dim: int) -> nn.Embedding:
    """An embedding table [rows, dim] whose values the checkpoint provides: built without
    ``nn.Embedding``'s random init. On the meta device (where the engine builds models) that init's
    ``normal_`` runs through torch's Python reference ops, whose first call imports torch._dynamo:
    ~1.1 s of every replica start on a 2-core machine, for values that are overwritten."""
    return nn.Embedding.from_pretrained(torch.empty(rows, dim), freeze=False)
