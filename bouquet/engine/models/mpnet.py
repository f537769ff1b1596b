"""MPNet (all-mpnet-base-v2, multi-qa-mpnet; MPNet cross-encoders) on packed sequences.

Follows HF ``transformers/models/mpnet/modeling_mpnet.py``. The layers are BERT's post-norm
layers (``bert.PostNormLayer``) under MPNet's names (``attention.attn.q/k/v/o``,
``attention.LayerNorm``, ``intermediate.dense``, ``output.dense/LayerNorm``); what differs:
- a relative position bias on the attention scores: ``encoder.relative_attention_bias``
  [buckets, H] indexed by the bucket of (key − query) position inside the sequence (T5-style
  buckets: 16 per direction, 8 exact, log-spaced up to distance 128; HF always buckets with 32,
  whatever the config says), the same for every layer; built once per forward as an [H, L, L]
  table for the batch's longest sequence L and handed to the attention backend (see
  ``engine/attention/backends.py`` for how each backend applies it and what it costs on the GPU);
- positions start after the padding row like RoBERTa (``padding_idx + 1`` = 2;
  ``positions_after_padding`` in families.py);
- no token types; the classifier is RoBERTa's (dense → tanh → out_proj on the first token).
"""
from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from bouquet.engine.attention.backends import AttentionBackend, AttnMeta
from bouquet.families import architecture_of, family
from bouquet.engine.models.base import PackedModel, table
from bouquet.engine.kernels.rows import dense_rows
from bouquet.engine.models.bert import BertEmbeddings, LayerParts, PostNormLayer, dense_norm, modules
from bouquet.engine.models.xlm_roberta import XLMRobertaForSequenceClassification

NUM_BUCKETS = 32  # MPNetEncoder.compute_position_bias's default, used whatever the config says
MAX_DISTANCE = 128


def relative_position_bucket(relative_position: torch.Tensor) -> torch.Tensor:
    """(key − query) distances, int64 any shape → bucket ids, same shape, in [0, NUM_BUCKETS).
    HF's ``MPNetEncoder.relative_position_bucket`` computed with the same float32 operations in
    the same order, so that boundary distances (16, 32, 64) fall in the same bucket."""
    n = -relative_position
    half = NUM_BUCKETS // 2
    ret = (n < 0).to(torch.long) * half
    n = torch.abs(n)
    max_exact = half // 2
    is_small = n < max_exact
    # clamp: log(0) is never selected below, but keep the cast defined
    large = max_exact + (torch.log(n.clamp(min=1).float() / max_exact) / math.log(MAX_DISTANCE / max_exact)
                         * (half - max_exact)).to(torch.long)
    large = torch.clamp(large, max=half - 1)
    return ret + torch.where(is_small, n, large)


class MPNetLayer(PostNormLayer):
    def __init__(self, cfg: dict[str, Any]) -> None:
        h, i, eps = cfg["hidden_size"], cfg["intermediate_size"], cfg.get("layer_norm_eps", 1e-12)
        super().__init__(h, cfg["num_attention_heads"], cfg.get("hidden_act", "gelu"))
        self.attention = modules(attn=modules(q=nn.Linear(h, h), k=nn.Linear(h, h), v=nn.Linear(h, h), o=nn.Linear(h, h)),
                                 LayerNorm=nn.LayerNorm(h, eps=eps))
        self.intermediate = modules(dense=nn.Linear(h, i))
        self.output = dense_norm(i, h, eps)

    def parts(self) -> LayerParts:
        a = self.attention
        return LayerParts(a.attn.q, a.attn.k, a.attn.v, a.attn.o, a.LayerNorm, self.intermediate.dense,
                          self.output.dense, self.output.LayerNorm)


class MPNetEncoder(nn.Module):
    buckets: torch.Tensor  # [2P − 1] int64: bucket of distance d at index d + P − 1; set by fuse()

    def __init__(self, cfg: dict[str, Any]) -> None:
        super().__init__()
        self.layer = nn.ModuleList(MPNetLayer(cfg) for _ in range(cfg["num_hidden_layers"]))
        self.relative_attention_bias = table(cfg.get("relative_attention_num_buckets", NUM_BUCKETS),
                                             cfg["num_attention_heads"])
        self.max_positions = cfg["max_position_embeddings"]

    def fuse(self) -> None:
        """Bucket every possible distance once, on the model's device (HF buckets on its device too)."""
        P = self.max_positions
        dev = self.relative_attention_bias.weight.device
        self.buckets = relative_position_bucket(torch.arange(-(P - 1), P, device=dev))

    def position_bias(self, length: int) -> torch.Tensor:
        """[H, L, L] in the model dtype: bias[h, i, j] for query i and key j of one sequence.
        L is a host int (the batch's or the graph bucket's max_seqlen), so this is graph-safe."""
        pos = torch.arange(length, device=self.buckets.device)
        dist = pos[None, :] - pos[:, None] + (self.max_positions - 1)  # [L, L] key − query, shifted ≥ 0
        per_head = self.relative_attention_bias.weight[self.buckets].t()  # [H, 2P − 1]
        return per_head[:, dist]  # [H, L, L]


class MPNetModel(PackedModel):
    """Embedding model: packed ids [T] → hidden states [T, hidden]; pooling happens outside."""

    IGNORED_KEYS: tuple[str, ...] = (r"pooler\..*", r"embeddings\.position_ids", r"lm_head\..*")
    PREFIXES: tuple[str, ...] = ("mpnet.",)
    causal = False

    def __init__(self, cfg: dict[str, Any], attn: AttentionBackend) -> None:
        super().__init__()
        self.embeddings = BertEmbeddings(cfg["vocab_size"], cfg["hidden_size"], cfg["max_position_embeddings"], 0,
                                         cfg.get("layer_norm_eps", 1e-12),
                                         family(architecture_of(cfg)).position_offset(cfg))
        self.encoder = MPNetEncoder(cfg)
        self.attn = attn

    def fuse(self) -> None:
        self.encoder.fuse()
        for layer in self.encoder.layer:
            layer.fuse()

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor, token_type_ids: torch.Tensor | None,
                meta: AttnMeta) -> torch.Tensor:
        """Packed ids/positions [T] int32 (no token types) → hidden [T, hidden] in the model dtype."""
        x = self.embeddings(input_ids, position_ids, None)  # [T, hidden]
        bias = self.encoder.position_bias(meta.max_seqlen)  # [H, L, L], shared by every layer
        for layer in self.encoder.layer:
            x = layer(x, self.attn, meta, bias)
        return dense_rows(x)  # fp8 layers hand on QRows (bert.PostNormLayer)


class MPNetForSequenceClassification(XLMRobertaForSequenceClassification):
    """Cross-encoder: first-token rows [B, hidden] → dense → tanh → out_proj → logits
    [B, num_labels] float32 (raw; the API layer applies the sigmoid). HF's
    ``MPNetClassificationHead`` has RoBERTa's layout and names."""

    IGNORED_KEYS: tuple[str, ...] = (r"mpnet\.embeddings\.position_ids",)
    encoder_cls = MPNetModel
    base_name = "mpnet"
