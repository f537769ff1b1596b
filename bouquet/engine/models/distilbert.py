"""DistilBERT (msmarco-distilbert, multi-qa-distilbert; DistilBERT cross-encoders) on packed sequences.

The same post-norm encoder as BERT (``bert.PostNormLayer`` holds the math), following HF
``transformers/models/distilbert/modeling_distilbert.py``; what differs is naming and a few facts:
- config.json says ``dim``, ``hidden_dim``, ``n_layers``, ``n_heads``, ``activation``;
- parameters: ``embeddings.{word,position}_embeddings``, ``transformer.layer.N.attention.
  {q,k,v,out}_lin``, ``sa_layer_norm``, ``ffn.lin1/lin2``, ``output_layer_norm``;
- no token types; every LayerNorm uses eps 1e-12 (hard-coded in HF, not in the config);
- the classifier reads the first token: ``pre_classifier`` → ReLU → ``classifier`` (no tanh pooler).
"""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from bouquet.engine.attention.backends import AttentionBackend, AttnMeta
from bouquet.engine.models.base import PackedModel
from bouquet.engine.kernels.rows import dense_rows
from bouquet.engine.models.bert import (BertEmbeddings, BertForSequenceClassification, LayerParts, PostNormLayer, modules,
                                         num_labels)

EPS = 1e-12  # DistilBERT's LayerNorms (modeling_distilbert.py), not configurable


class TransformerBlock(PostNormLayer):
    """HF's ``TransformerBlock``: BERT's layer under DistilBERT's names."""

    def __init__(self, cfg: dict[str, Any]) -> None:
        dim = cfg["dim"]
        super().__init__(dim, cfg["n_heads"], cfg.get("activation", "gelu"))
        self.attention = modules(**{n: nn.Linear(dim, dim) for n in ("q_lin", "k_lin", "v_lin", "out_lin")})
        self.sa_layer_norm = nn.LayerNorm(dim, eps=EPS)
        self.ffn = modules(lin1=nn.Linear(dim, cfg["hidden_dim"]), lin2=nn.Linear(cfg["hidden_dim"], dim))
        self.output_layer_norm = nn.LayerNorm(dim, eps=EPS)

    def parts(self) -> LayerParts:
        a = self.attention
        return LayerParts(a.q_lin, a.k_lin, a.v_lin, a.out_lin, self.sa_layer_norm, self.ffn.lin1, self.ffn.lin2,
                          self.output_layer_norm)


class Transformer(nn.Module):
    def __init__(self, cfg: dict[str, Any]) -> None:
        super().__init__()
        self.layer = nn.ModuleList(TransformerBlock(cfg) for _ in range(cfg["n_layers"]))


class DistilBertModel(PackedModel):
    """Embedding model: packed ids [T] → hidden states [T, dim]; pooling happens outside."""

    # the masked-LM head (vocab_transform, vocab_layer_norm, vocab_projector) of a full checkpoint
    IGNORED_KEYS: tuple[str, ...] = (r"vocab_(transform|layer_norm|projector)\..*",)
    PREFIXES: tuple[str, ...] = ("distilbert.",)
    causal = False

    def __init__(self, cfg: dict[str, Any], attn: AttentionBackend) -> None:
        super().__init__()
        self.embeddings = BertEmbeddings(cfg["vocab_size"], cfg["dim"], cfg["max_position_embeddings"], 0, EPS)
        self.transformer = Transformer(cfg)
        self.attn = attn

    def fuse(self) -> None:
        for layer in self.transformer.layer:
            layer.fuse()

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor, token_type_ids: torch.Tensor | None,
                meta: AttnMeta) -> torch.Tensor:
        """Packed ids/positions [T] int32 (token types ignored: DistilBERT has none) → [T, dim]."""
        x = self.embeddings(input_ids, position_ids, None)  # [T, dim]
        for layer in self.transformer.layer:
            x = layer(x, self.attn, meta)
        return dense_rows(x)  # fp8 layers hand on QRows (bert.PostNormLayer)


class DistilBertForSequenceClassification(BertForSequenceClassification):
    """Cross-encoder: first-token rows [B, dim] → pre_classifier → ReLU → classifier → logits
    [B, num_labels] float32 (raw; the API layer applies the sigmoid)."""

    IGNORED_KEYS: tuple[str, ...] = ()
    encoder_cls = DistilBertModel
    base_name = "distilbert"

    def build_head(self, cfg: dict[str, Any]) -> None:
        self.pre_classifier = nn.Linear(cfg["dim"], cfg["dim"])
        self.classifier = nn.Linear(cfg["dim"], num_labels(cfg))

    def head(self, pooled: torch.Tensor) -> torch.Tensor:
        """pooled first-token rows [B, dim] float32 → logits [B, num_labels] float32."""
        pre = self.pre_classifier
        return self.classifier(torch.relu(pre(pooled.to(pre.weight.dtype)))).float()
