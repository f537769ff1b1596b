"""Model-family facts, one row per ``architectures`` string of config.json; torch-free.

Read by ``bouquet.modelspec`` (gateway and replica: task, pooling, sequence limit, prompt) and
by ``engine/models/registry.py`` (which class to import). Everything else a model needs lives in its
model file under ``engine/models/``.

Adding an architecture (e.g. ``ElectraModel``):
1. write ``engine/models/electra.py`` with a class implementing ``engine/models/base.py``'s
   ``PackedModel`` (parameter names as in the Hugging Face checkpoint); a post-norm BERT-style
   encoder under other names is a ``bert.PostNormLayer`` subclass naming its parts, as
   ``distilbert.py`` and ``mpnet.py`` are, not a copy of BERT's layer;
2. add one row to ``FAMILIES`` below: ``"ElectraModel": Family("electra", "ElectraModel", ...)``,
   with the facts that differ from the defaults (an encoder, mean pooling, no score head,
   positions from 0);
3. add a tiny random model of it to ``tests/fixtures/tiny_models.py``: ``tests/unit/test_model_families.py``
   then compares it with transformers.
A decoder family (RMSNorm, rotary, gated MLP) is not a new file: subclass ``DecoderModel`` in
``engine/models/decoder.py`` with the ``DecoderFacts`` in which it differs, and give its row
``decoder=True`` (causal unless config.json says bidirectional; see ``modelspec.is_causal``).
A task model (``...ForSequenceClassification``) is a second row with ``score_head=True`` and
``pooling="cls"`` (a decoder's: ``decoder=True``, ``pooling="last"``, its class a
``decoder_heads.DecoderForSequenceClassification`` subclass naming the base model). A position
embedding table that reserves rows before position 0 (RoBERTa's ``padding_idx + 1``) is
``positions_after_padding=True``: the model reads the offset from ``position_offset`` and the
spec's sequence limit shrinks by it, both from this one row.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

Pooling = Literal["cls", "mean", "last"]

# Qwen3-Reranker's prompt (its model card): a chat turn asking for "yes" or "no", scored at the
# position after the assistant's empty think block. Placeholders: {instruction} {query} {document}.
QWEN3_RERANKER_TEMPLATE = (
    "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the "
    'Instruct provided. Note that the answer can only be "yes" or "no".<|im_end|>\n<|im_start|>user\n'
    "<Instruct>: {instruction}\n<Query>: {query}\n<Document>: {document}"
    "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
)
QWEN3_DEFAULT_INSTRUCTION = "Given a web search query, retrieve relevant passages that answer the query"


@dataclass(frozen=True)
class Family:
    """What bouquet knows about one architecture.

    module, cls             the implementation: ``bouquet.engine.models.<module>.<cls>``
    embed_cls               the class that serves the checkpoint as an embedder when its own head
                            is not used (Qwen3-Embedding ships as ``Qwen3ForCausalLM``); None: ``cls``
    score_head              a classifier on the pooled row: task "score", ``num_labels`` outputs
                            (cross-encoders; the API applies the sigmoid)
    decoder                 causal attention unless config.json says bidirectional (see
                            ``modelspec.is_causal``); a causal decoder pools the last token, a
                            bidirectional one the mean
    pooling                 default pooling when no sentence-transformers ``1_Pooling`` says otherwise
    positions_after_padding position ids start at ``pad_token_id + 1`` (RoBERTa, XLM-R)
    reranker_template       a causal LM of this family can be a yes/no reranker with this prompt
                            (placeholders {instruction} {query} {document}); None: it cannot
    default_instruction     the reranker's {instruction} when the request gives none
    sparse                  a masked LM served as a SPLADE encoder: its logits pooled into one
                            vocabulary-sized row per text (``/embed_sparse``)
    pooling_key             a config.json key naming the pooling the checkpoint's own head uses
                            (ModernBERT's ``classifier_pooling``: "cls" or "mean"), read before
                            ``pooling``; None: the row's ``pooling``
    """

    module: str
    cls: str
    embed_cls: str | None = None
    score_head: bool = False
    decoder: bool = False
    pooling: Pooling = "mean"
    positions_after_padding: bool = False
    reranker_template: str | None = None
    default_instruction: str | None = None
    sparse: bool = False
    pooling_key: str | None = None

    def position_offset(self, cfg: dict[str, Any]) -> int:
        """Row of ``position_embeddings`` that holds position 0 (0, or ``pad_token_id + 1``)."""
        return int(cfg.get("pad_token_id", 1)) + 1 if self.positions_after_padding else 0

    def default_pooling(self, causal: bool, cfg: dict[str, Any] | None = None) -> Pooling:
        """The pooling when the model directory does not declare one (no sentence-transformers
        Pooling module): config.json's ``pooling_key`` value when the row has one, else the row's."""
        if self.pooling_key and cfg and cfg.get(self.pooling_key) in ("cls", "mean", "last"):
            return cfg[self.pooling_key]
        # a score head reads the token its training pooled (the last), whatever the attention
        return "mean" if self.decoder and not causal and not self.score_head else self.pooling


FAMILIES: dict[str, Family] = {
    "BertModel": Family("bert", "BertModel"),
    "BertForSequenceClassification": Family("bert", "BertForSequenceClassification", score_head=True, pooling="cls"),
    "BertForMaskedLM": Family("masked_lm", "BertForMaskedLM", sparse=True),
    "DistilBertForMaskedLM": Family("masked_lm", "DistilBertForMaskedLM", sparse=True),
    "XLMRobertaModel": Family("xlm_roberta", "XLMRobertaModel", positions_after_padding=True),
    "XLMRobertaForSequenceClassification": Family("xlm_roberta", "XLMRobertaForSequenceClassification",
                                                  score_head=True, pooling="cls", positions_after_padding=True),
    # RoBERTa (all-roberta-large-v1) is XLM-R's architecture under another name: same parameters,
    # positions after padding, the same classification head
    "RobertaModel": Family("xlm_roberta", "XLMRobertaModel", positions_after_padding=True),
    "RobertaForSequenceClassification": Family("xlm_roberta", "XLMRobertaForSequenceClassification",
                                               score_head=True, pooling="cls", positions_after_padding=True),
    "MPNetModel": Family("mpnet", "MPNetModel", positions_after_padding=True),
    "MPNetForSequenceClassification": Family("mpnet", "MPNetForSequenceClassification", score_head=True,
                                             pooling="cls", positions_after_padding=True),
    "DistilBertModel": Family("distilbert", "DistilBertModel"),
    "DistilBertForSequenceClassification": Family("distilbert", "DistilBertForSequenceClassification",
                                                  score_head=True, pooling="cls"),
    "Qwen3Model": Family("decoder", "Qwen3Model", decoder=True, pooling="last"),
    "Qwen3ForCausalLM": Family("decoder_heads", "Qwen3ForCausalLM", embed_cls="Qwen3Model", decoder=True, pooling="last",
                               reranker_template=QWEN3_RERANKER_TEMPLATE,
                               default_instruction=QWEN3_DEFAULT_INSTRUCTION),
    # gte-Qwen2 ships as Qwen2ForCausalLM: served as an embedder (its LM head unused)
    "Qwen2Model": Family("decoder", "Qwen2Model", decoder=True, pooling="last"),
    "Qwen2ForCausalLM": Family("decoder", "Qwen2Model", decoder=True, pooling="last"),
    "MistralModel": Family("decoder", "MistralModel", decoder=True, pooling="last"),
    "MistralForCausalLM": Family("decoder", "MistralModel", decoder=True, pooling="last"),
    # EmbeddingGemma: bidirectional (use_bidirectional_attention), so mean pooling by default
    "Gemma3TextModel": Family("decoder", "Gemma3TextModel", decoder=True, pooling="last"),
    # decoder cross-encoders: a bias-free ``score`` layer on the last token (bidirectional or not)
    **{f"{name}ForSequenceClassification": Family("decoder_heads", f"{name}ForSequenceClassification",
                                                  score_head=True, decoder=True, pooling="last")
       for name in ("Qwen3", "Qwen2", "Mistral", "Gemma3Text")},
    "ModernBertModel": Family("modernbert", "ModernBertModel"),
    "ModernBertForSequenceClassification": Family("modernbert", "ModernBertForSequenceClassification",
                                                  score_head=True, pooling="cls", pooling_key="classifier_pooling"),
}

# An architecture without a row: read like a BERT-style encoder, so that the gateway can still
# describe it; the replica refuses it at start-up (registry.UnsupportedArchitecture).
UNKNOWN = Family("", "")


def unsupported(architecture: str) -> str:
    """The message that refuses ``architecture``, listing the ones bouquet serves."""
    return f"architecture {architecture!r} is not supported; supported: {sorted(FAMILIES)}"


def family(architecture: str) -> Family:
    """The row of ``architecture``, or ``UNKNOWN`` when bouquet has none."""
    return FAMILIES.get(architecture, UNKNOWN)


def num_labels(cfg: dict[str, Any]) -> int:
    """Outputs of a ``*ForSequenceClassification`` head: ``id2label``'s size, else ``num_labels``,
    else transformers' default of 2 (transformers 5 writes neither into config.json for 2 labels)."""
    if cfg.get("id2label"):
        return len(cfg["id2label"])
    return int(cfg.get("num_labels", 2))


def architecture_of(cfg: dict[str, Any]) -> str:
    """config.json's first ``architectures`` entry ("" when absent)."""
    return (cfg.get("architectures") or [""])[0]


def hidden_size(cfg: dict[str, Any]) -> int:
    """config.json's hidden width: ``hidden_size``, or ``dim`` (DistilBERT's name for it)."""
    return int(cfg["hidden_size"] if "hidden_size" in cfg else cfg["dim"])
