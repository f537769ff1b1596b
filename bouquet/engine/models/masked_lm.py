"""BERT and DistilBERT with their masked-LM heads on packed sequences: SPLADE sparse encoders
(naver/splade-cocondenser-ensembledistil, naver/splade-v3; DistilBERT: naver/splade_v2_distil,
opensearch-neural-sparse-encoding-doc-v2-distill).

``forward`` returns the vocabulary logits of every token, [T, vocab]; the SPLADE pooling
(``engine/heads/pooling.py``: log(1 + relu(logits)), max over each sequence's tokens) turns them into
one vocabulary-sized row per sequence. Parameter names and the head follow Hugging Face's
``BertForMaskedLM`` (``transformers/models/bert/modeling_bert.py``: ``cls.predictions.transform``
dense → activation → LayerNorm, then the decoder tied to the word embeddings plus
``cls.predictions.bias``) and ``DistilBertForMaskedLM`` (``modeling_distilbert.py``:
``vocab_transform`` → activation → ``vocab_layer_norm`` → ``vocab_projector``, tied likewise).
"""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from bouquet.engine.attention.backends import AttentionBackend, AttnMeta
from bouquet.engine.kernels.layers import activation
from bouquet.engine.models.base import PackedModel
from bouquet.engine.models.bert import BertModel, dense_norm
from bouquet.engine.models.distilbert import DistilBertModel


class _Predictions(nn.Module):
    def __init__(self, cfg: dict[str, Any]) -> None:
        super().__init__()
        h, v = cfg["hidden_size"], cfg["vocab_size"]
        # dense [h, h] + LayerNorm: the same parameters as BERT's attention output block
        self.transform = dense_norm(h, h, cfg.get("layer_norm_eps", 1e-12))
        self.bias = nn.Parameter(torch.zeros(v))
        if cfg.get("tie_word_embeddings", True) is False:  # an untied decoder has its own matrix
            self.decoder = nn.Linear(h, v, bias=False)


class _Cls(nn.Module):
    def __init__(self, cfg: dict[str, Any]) -> None:
        super().__init__()
        self.predictions = _Predictions(cfg)


class BertForMaskedLM(PackedModel):
    """Packed ids/positions/types [T] → MLM logits [T, vocab] in the model dtype."""

    PREFIXES: tuple[str, ...] = ()
    causal = False

    def __init__(self, cfg: dict[str, Any], attn: AttentionBackend) -> None:
        super().__init__()
        self.bert = BertModel(cfg, attn)
        self.cls = _Cls(cfg)
        self.act = activation(cfg.get("hidden_act", "gelu"))
        self.tied = cfg.get("tie_word_embeddings", True) is not False
        # Older checkpoints store the tied decoder weight (and the bias a second time); the tied
        # model reads the word embeddings and ``cls.predictions.bias`` instead.
        self.IGNORED_KEYS = (r"bert\.embeddings\.position_ids", r"bert\.pooler\..*", r"cls\.predictions\.decoder\.bias",
                             *((r"cls\.predictions\.decoder\.weight",) if self.tied else ()))

    def fuse(self) -> None:
        self.bert.fuse()

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor, token_type_ids: torch.Tensor | None,
                meta: AttnMeta) -> torch.Tensor:
        """Packed ids/positions/types [T] int32 → logits [T, vocab] in the model dtype."""
        x = self.bert(input_ids, position_ids, token_type_ids, meta)  # [T, hidden]
        p = self.cls.predictions
        x = p.transform.LayerNorm(self.act(p.transform.dense(x)))
        w = self.bert.embeddings.word_embeddings.weight if self.tied else p.decoder.weight  # [vocab, hidden]
        return F.linear(x, w, p.bias)


class _Bias(nn.Module):
    """The tied projector's own parameter: its bias [vocab] (the weight is the word embeddings)."""

    def __init__(self, vocab: int) -> None:
        super().__init__()
        self.bias = nn.Parameter(torch.zeros(vocab))


class DistilBertForMaskedLM(PackedModel):
    """Packed ids/positions [T] → MLM logits [T, vocab] in the model dtype (no token types)."""

    # older checkpoints store the tied projector weight; the word embeddings are read instead
    IGNORED_KEYS: tuple[str, ...] = (r"vocab_projector\.weight",)
    PREFIXES: tuple[str, ...] = ()
    causal = False

    def __init__(self, cfg: dict[str, Any], attn: AttentionBackend) -> None:
        super().__init__()
        if cfg.get("tie_word_embeddings", True) is False:
            raise ValueError("DistilBertForMaskedLM with an untied vocab_projector is not supported")
        dim = cfg["dim"]
        self.distilbert = DistilBertModel(cfg, attn)
        self.vocab_transform = nn.Linear(dim, dim)
        self.vocab_layer_norm = nn.LayerNorm(dim, eps=1e-12)  # fixed in transformers' DistilBertForMaskedLM
        self.vocab_projector = _Bias(cfg["vocab_size"])
        self.act = activation(cfg.get("activation", "gelu"))

    def fuse(self) -> None:
        self.distilbert.fuse()

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor, token_type_ids: torch.Tensor | None,
                meta: AttnMeta) -> torch.Tensor:
        """Packed ids/positions [T] int32 → logits [T, vocab] in the model dtype."""
        x = self.distilbert(input_ids, position_ids, None, meta)  # [T, dim]
        x = self.vocab_layer_norm(self.act(self.vocab_transform(x)))
        return F.linear(x, self.distilbert.embeddings.word_embeddings.weight, self.vocab_projector.bias)
