"""The decoders as scorers: a head on the pooled last-token rows of a ``decoder.py`` model.

``DecoderForSequenceClassification`` (transformers' ``GenericForSequenceClassification``: the
cross-encoders ``Qwen3``, ``Qwen2``, ``Mistral``, ``Gemma3Text`` ``*ForSequenceClassification``) and
``DecoderForCausalLM`` (Qwen3-Reranker: the LM head's "yes" and "no" logits). Parameter names are
Hugging Face's (``model.`` prefix for the decoder, ``score`` / ``lm_head`` for the heads).
"""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from bouquet.engine.attention.backends import AttentionBackend, AttnMeta
from bouquet.families import architecture_of
from bouquet.engine.models.base import PackedModel
from bouquet.engine.models.bert import num_labels
from bouquet.engine.models.decoder import DecoderModel, Gemma3TextModel, MistralModel, Qwen2Model, Qwen3Model

__all__ = ["DecoderForCausalLM", "DecoderForSequenceClassification", "DecoderWithHead", "Gemma3TextForSequenceClassification",
           "MistralForSequenceClassification", "Qwen2ForSequenceClassification", "Qwen3ForCausalLM",
           "Qwen3ForSequenceClassification", "Qwen3Model"]  # Qwen3Model: Qwen3ForCausalLM's embed_cls (families.py)


class DecoderWithHead(PackedModel):
    """A decoder (``base``, under the checkpoint's ``model.`` prefix) with a head on its pooled
    last-token rows; subclasses build the head and say what ``head`` returns."""

    base: type[DecoderModel] = DecoderModel
    IGNORED_KEYS: tuple[str, ...] = ()
    PREFIXES: tuple[str, ...] = ()

    def __init__(self, cfg: dict[str, Any], attn: AttentionBackend) -> None:
        super().__init__()
        self.model = self.base(cfg, attn)
        self.causal = self.model.causal

    def fuse(self) -> None:
        self.model.fuse()

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor, token_type_ids: torch.Tensor | None, meta: AttnMeta) -> torch.Tensor:
        return self.model(input_ids, position_ids, token_type_ids, meta)


class DecoderForCausalLM(DecoderWithHead):
    """A yes/no reranker (Qwen3-Reranker): the LM's next-token logits at the last position,
    restricted to the "yes" and "no" tokens. ``head`` returns [B, 1] float32 = logit(yes) −
    logit(no), so that sigmoid(score) = softmax([no, yes])[yes] = P("yes"), the model card's
    relevance score; the API layer applies that sigmoid as it does for cross-encoder logits.

    Only the two lm_head rows are used (sliced at ``fuse``). With ``tie_word_embeddings`` the
    rows come from ``embed_tokens`` and a stored ``lm_head.weight`` is skipped explicitly.
    Raises ValueError when ``yes_no_ids`` is missing or outside the vocabulary.
    """

    yes_no: torch.Tensor  # [2, hidden]: the "yes" and "no" rows of the LM head; set by fuse()

    def __init__(self, cfg: dict[str, Any], attn: AttentionBackend, yes_no_ids: tuple[int, int] | None = None) -> None:
        if yes_no_ids is None or not all(0 <= t < cfg["vocab_size"] for t in yes_no_ids):
            raise ValueError(f"{architecture_of(cfg)} scoring needs 'yes'/'no' token ids inside [0, {cfg['vocab_size']}), "
                             f"got {yes_no_ids}")
        super().__init__(cfg, attn)
        self.tied = bool(cfg.get("tie_word_embeddings", False))
        if not self.tied:
            self.lm_head = nn.Linear(cfg["hidden_size"], cfg["vocab_size"], bias=False)
        self.IGNORED_KEYS = (r"lm_head\.weight",) if self.tied else ()
        self.yes_no_ids = yes_no_ids

    def fuse(self) -> None:
        super().fuse()
        w = self.model.embed_tokens.weight if self.tied else self.lm_head.weight
        self.yes_no = w[list(self.yes_no_ids)].detach().clone()  # [2, hidden]: yes, no
        if not self.tied:
            del self.lm_head  # the other vocab rows are never read

    def head(self, pooled: torch.Tensor) -> torch.Tensor:
        """pooled last-token rows [B, hidden] float32 → [B, 1] float32 logit(yes) − logit(no)."""
        logits = F.linear(pooled.to(self.yes_no.dtype), self.yes_no).float()  # [B, 2]
        return (logits[:, 0] - logits[:, 1]).unsqueeze(1)


class DecoderForSequenceClassification(DecoderWithHead):
    """A decoder cross-encoder (transformers' ``GenericForSequenceClassification``: Qwen3, Qwen2,
    Mistral, Gemma3Text ``*ForSequenceClassification``): ``score``, a linear layer without bias,
    on the hidden state of the sequence's last token → logits [B, num_labels]; the API layer
    applies the sigmoid (one label) or the softmax (several).

    transformers pools the rightmost token whose id is not ``pad_token_id``; here the packed
    sequence's last token (the family row's "last" pooling), the same token unless a sequence
    ends with the pad id itself. Its pooling is last-token even when the decoder is bidirectional.
    """

    def __init__(self, cfg: dict[str, Any], attn: AttentionBackend) -> None:
        super().__init__(cfg, attn)
        self.score = nn.Linear(cfg["hidden_size"], num_labels(cfg), bias=False)

    def head(self, pooled: torch.Tensor) -> torch.Tensor:
        """pooled last-token rows [B, hidden] float32 → logits [B, num_labels] float32, computed in
        the model dtype as transformers does (its ``score`` runs on the model-dtype hidden states)."""
        return self.score(pooled.to(self.score.weight.dtype)).float()


class Qwen3ForCausalLM(DecoderForCausalLM):
    base = Qwen3Model


class Qwen3ForSequenceClassification(DecoderForSequenceClassification):
    base = Qwen3Model


class Qwen2ForSequenceClassification(DecoderForSequenceClassification):
    base = Qwen2Model


class MistralForSequenceClassification(DecoderForSequenceClassification):
    base = MistralModel


class Gemma3TextForSequenceClassification(DecoderForSequenceClassification):
    base = Gemma3TextModel
