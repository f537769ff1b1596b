"""XLM-RoBERTa (multilingual-e5, bge-m3 dense, bge-reranker) and RoBERTa (all-roberta-large-v1:
the same architecture and parameter names, served by these classes) on packed sequences.

Same layers as BERT (``bert.py``); what differs, following HF
``transformers/models/xlm_roberta/modeling_xlm_roberta.py``:
- positions start at ``padding_idx + 1`` (``create_position_ids_from_input_ids``): token i of a
  sequence reads ``position_embeddings[pad_token_id + 1 + i]``; with 514 rows and pad 1 the
  longest sequence is 512 tokens (``positions_after_padding`` in families.py: the
  embedding offset and the spec's limit both come from that row);
- checkpoint names carry ``roberta.`` in task models;
- the classification head is dense → tanh → out_proj on the ``<s>`` row, without a pooler.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from bouquet.engine.models.bert import BertForSequenceClassification, BertModel, modules, num_labels


class XLMRobertaModel(BertModel):
    """Embedding model: hidden states [T, hidden]; pooling happens outside (engine/heads/pooling.py)."""

    PREFIXES: tuple[str, ...] = ("roberta.", "model.")


class XLMRobertaForSequenceClassification(BertForSequenceClassification):
    """Cross-encoder: ``<s>`` row [B, hidden] → logits [B, num_labels] float32 (raw; the API
    layer applies the sigmoid)."""

    IGNORED_KEYS: tuple[str, ...] = (r"roberta\.embeddings\.position_ids",)
    encoder_cls = XLMRobertaModel
    base_name = "roberta"

    def build_head(self, cfg: dict[str, Any]) -> None:
        h = cfg["hidden_size"]
        self.classifier = modules(dense=nn.Linear(h, h), out_proj=nn.Linear(h, num_labels(cfg)))

    def head(self, pooled: torch.Tensor) -> torch.Tensor:
        c = self.classifier
        return c.out_proj(torch.tanh(c.dense(pooled.to(c.dense.weight.dtype)))).float()
