"""TEI's ``POST /predict`` (sequence classification) and its compat routes ``POST /`` and
``POST /invocations`` (SageMaker's), as text-embeddings-inference's router defines them
(router/src/http/server.rs and types.rs of huggingface/text-embeddings-inference).

``/predict`` runs a scoring model (``*ForSequenceClassification`` cross-encoders, causal-LM
rerankers) on texts or text pairs and names every score with its label (``ModelSpec.labels``):

* ``inputs``: one input, ``"text"``, ``["text"]`` or ``["text", "text_pair"]``, answered with one
  list; or a batch ``[["text"], ["text", "text_pair"], ...]``, answered with a list of such lists.
  A list of strings is one input (a pair), never a batch, as in TEI.
* per input, ``[{"score", "label"}, ...]`` for every label, by score descending (ties keep label
  order); scores as ``scoring.activate``: the softmax over the labels, the sigmoid of a lone
  label, the logits with ``raw_scores``.

Tokenization and scores are scoring.py's (pairs as ``/rerank`` encodes them: over-long pairs lose
tokens of their second text only); a single text is one segment, truncated on ``truncation_direction``.
``/`` and ``/invocations`` pick a route by the body: ``query``/``texts`` → ``/rerank``; ``inputs`` →
the model's own (``/predict`` for a scoring model; ``/similarity`` for an ``inputs`` object, ``/embed_sparse``
for a SPLADE model, ``/embed`` otherwise), what TEI serves there for its one model.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from starlette.responses import Response

from bouquet.gateway import routes_sparse, routes_tei
from bouquet.gateway.core import Gateway, shard_of
from bouquet.gateway.errors import APIError, bad_request, json_type, shown
from bouquet.gateway.http import json_response
from bouquet.gateway.inputs import opt_int, opt_str
from bouquet.gateway.routes_scoring import common_options, ranked
from bouquet.gateway.scoring import Activation, PairFields, activate, check_instruction, encode_pairs
from bouquet.text_window import Side
from bouquet.tokenized import Encoded, TooLong

Item = tuple[str, str | None]  # (text, its pair's second text or None)
_SHAPES = "a string, a pair [text, text_pair], or a batch [[text], [text, text_pair], ...]"


@dataclass(frozen=True)
class _ItemFields(PairFields):
    """PairFields naming the request fields of predict's pairs: pair i of the pairs encoded is
    request item ``rows[i]``, whose two texts are ``names[rows[i]]``."""

    rows: tuple[int, ...] = ()
    names: tuple[tuple[str, str], ...] = ()

    def query_at(self, i: int) -> str:
        return self.names[self.rows[i]][0]

    def doc_at(self, i: int) -> str:
        return self.names[self.rows[i]][1]


def parse_predict_inputs(value: Any, max_inputs: int) -> tuple[list[Item], list[tuple[str, str]], bool]:
    """TEI's ``PredictInput`` → (items, each item's two field names, whether it was a batch).
    Raises APIError 400 naming the field for another shape, an empty list or text, and a list of
    strings longer than a pair; 413 for a batch of more than ``max_inputs`` items."""
    if value is None:
        raise bad_request(f"'inputs' is required: {_SHAPES}", "inputs", "missing_required_parameter")
    if isinstance(value, str):
        return [_item([value], "inputs", bare=True)], [("inputs", "inputs")], False
    if not isinstance(value, list):
        raise bad_request(f"'inputs' must be {_SHAPES}; got {json_type(value)}", "inputs", "invalid_type")
    if not value:
        raise bad_request(f"'inputs' is an empty list; send {_SHAPES}", "inputs", "empty_input")
    if isinstance(value[0], str):  # one input: [text] or [text, text_pair]
        if len(value) > 2:
            raise bad_request(f"'inputs' as a list of strings is one input, a text or a pair; got {len(value)} strings "
                              "(send a batch as [[text], [text], ...])", "inputs", "invalid_value")
        return [_item(value, "inputs")], [("inputs[0]", "inputs[1]")], False
    if not isinstance(value[0], list):
        raise bad_request(f"inputs[0] must be a string or a list of strings ({_SHAPES}); got {json_type(value[0])}",
                          "inputs[0]", "invalid_type")
    if len(value) > max_inputs:
        raise APIError(413, f"'inputs' has {len(value)} items; the limit is {max_inputs} per request (--max-inputs)",
                       "inputs", "too_many_inputs")
    items = [_item(v, f"inputs[{i}]") for i, v in enumerate(value)]
    return items, [(f"inputs[{i}][0]", f"inputs[{i}][1]") for i in range(len(value))], True


def _item(v: Any, param: str, bare: bool = False) -> Item:
    """One input of a batch (or the one input): [text] or [text, text_pair], no empty text."""
    if not isinstance(v, list) or not 1 <= len(v) <= 2:
        got = f"{len(v)} items" if isinstance(v, list) else json_type(v)
        raise bad_request(f"{param} must be [text] or [text, text_pair]; got {got}", param,
                          "invalid_value" if isinstance(v, list) else "invalid_type")
    for j, t in enumerate(v):
        where = param if bare else f"{param}[{j}]"
        if not isinstance(t, str):
            raise bad_request(f"{where} must be a string, got {json_type(t)}", where, "invalid_type")
        if not t:
            raise bad_request(f"{where} is an empty string; every input needs at least one character", where,
                              "empty_input")
    return v[0], v[1] if len(v) == 2 else None


def _parameters(body: dict[str, Any], raw: bool) -> tuple[Activation, int | None]:
    """``parameters`` as huggingface_hub's ``text_classification`` sends it (``function_to_apply``,
    ``top_k``), with ``raw_scores`` → (the activation, labels kept per input). Raises APIError 400
    for other values, and for ``raw_scores`` with a ``function_to_apply`` other than "none"."""
    params = body.get("parameters")
    if params is None:
        params = {}
    if not isinstance(params, dict):
        raise bad_request(f"'parameters' must be an object, got {json_type(params)}", "parameters", "invalid_type")
    fn = opt_str(params, "function_to_apply", ("softmax", "sigmoid", "none"))
    top_k = opt_int(params, "top_k")
    if top_k is not None and top_k < 1:
        raise bad_request(f"'top_k' must be >= 1, got {top_k}", "top_k", "invalid_value")
    if raw and fn not in (None, "none"):
        raise bad_request(f"'raw_scores': true contradicts 'function_to_apply': {shown(fn)}", "raw_scores",
                          "invalid_value")
    return ("none" if raw else fn or "auto"), top_k  # type: ignore[return-value]


async def predict_route(gw: Gateway, body: dict[str, Any]) -> Response:
    """TEI ``/predict``: ``inputs``, ``raw_scores``, ``truncate``, ``truncation_direction`` (and
    ``instruction``, ``priority``, ``parameters`` = {``function_to_apply``, ``top_k``}) → per input
    ``[{"score", "label"}, ...]`` (module docstring). Raises APIError 424 for a model that is not a
    classifier (as TEI), 400 for invalid inputs or options and for a lone text sent to a model that
    scores pairs only (causal-LM rerankers), 413 past ``--max-inputs`` / ``--max-request-tokens``."""
    if gw.spec.task != "score":
        raise APIError(424, f"model '{gw.public_id}' is not a classifier (a sequence-classification or reranker "
                       "model); /predict needs one: use /embed", "inputs", "wrong_task")
    items, names, batch = parse_predict_inputs(body.get("inputs"), gw.cfg.max_inputs)
    opts = common_options(gw, body)
    fn, top_k = _parameters(body, opts["raw"])
    check_instruction(gw, opts["instruction"])
    logits = await _logits(gw, items, names, opts["truncate"], opts["instruction"], opts["priority"],
                           routes_tei.direction(body))
    labels = gw.spec.labels
    out = [[{"score": float(row[j]), "label": labels[j]} for j in ranked(row, top_k)] for row in activate(logits, fn)]
    return json_response(out if batch else out[0])


async def _logits(gw: Gateway, items: list[Item], names: list[tuple[str, str]], truncate: bool,
                  instruction: str | None, priority: int, side: Side) -> np.ndarray:
    """float64 [N, labels]: every item run in one call, texts and pairs alike (a text is one
    segment of token type 0). Raises APIError 400 / 413 as ``predict_route``."""
    singles = [i for i, (_, b) in enumerate(items) if b is None]
    pairs = [i for i, (_, b) in enumerate(items) if b is not None]
    if singles and gw.spec.pair_template:
        where = names[singles[0]][0]
        raise bad_request(f"{where}: model '{gw.public_id}' scores (query, document) pairs only; send "
                          "[query, document]", where, "invalid_value")
    ids: list[np.ndarray | None] = [None] * len(items)
    types: list[np.ndarray | None] = [None] * len(items)
    tokens = 0
    if singles:
        try:
            enc = Encoded.joined(await gw.run_sharded(shard_of(gw.tokenizer.encode), [items[i][0] for i in singles],
                                                      truncate, side))
        except TooLong as e:
            where = names[singles[e.index]][0]
            raise bad_request(f"{where} {e.detail}", where, "context_length_exceeded") from None
        for k, i in enumerate(singles):
            ids[i] = enc.ids[k]
        tokens += enc.num_tokens
    if pairs:
        fields = _ItemFields(query="inputs", docs="inputs", rows=tuple(pairs), names=tuple(names))
        enc = await encode_pairs(gw, [items[i][0] for i in pairs], [items[i][1] or "" for i in pairs],
                                 truncate=truncate, instruction=instruction, fields=fields, side=side)
        for k, i in enumerate(pairs):
            ids[i] = enc.ids[k]
            types[i] = enc.type_ids[k] if enc.type_ids is not None else None
        tokens += enc.num_tokens
    gw.check_tokens(tokens, "inputs")
    seqs: list[np.ndarray] = ids  # type: ignore[assignment]  # every item was encoded above
    type_ids = None
    if any(t is not None for t in types):  # texts beside pairs: one segment, token type 0
        type_ids = [t if t is not None else np.zeros(len(s), dtype=np.int32) for t, s in zip(types, seqs)]
    return (await gw.infer(seqs, type_ids, None, None, priority)).astype(np.float64)


async def compat_route(gw: Gateway, body: dict[str, Any]) -> Response:
    """TEI's ``POST /`` and SageMaker's ``POST /invocations``: ``query`` + ``texts`` → ``/rerank``;
    ``inputs`` → the model's own route (module docstring). Raises APIError 400 for a body with
    both or neither (naming what is accepted), 424 for an ``inputs`` object (similarity) sent to a
    scoring model, else what the route chosen raises."""
    rerank, inputs = "query" in body or "texts" in body, "inputs" in body
    own = ("/predict" if gw.spec.task == "score" else "/embed_sparse" if gw.spec.sparse else "/embed")
    accepted = f"'query' and 'texts' (TEI /rerank) or 'inputs' (this model's {own})"
    if rerank and inputs:
        raise bad_request(f"send either {accepted}, not both", "inputs", "invalid_value")
    if rerank:
        return await routes_tei.rerank_route(gw, body)
    if not inputs:
        raise bad_request(f"this route takes {accepted}", "inputs", "missing_required_parameter")
    if isinstance(body["inputs"], dict) and gw.spec.task == "score":  # as /similarity's own wrong_task (424)
        raise APIError(424, f"model '{gw.public_id}' is a scoring model; similarity ('inputs' as {{\"source_sentence\", "
                            "\"sentences\"}) needs an embedding model: name one in 'model', or use POST /similarity",
                       "inputs", "wrong_task")
    if gw.spec.task == "score":
        return await predict_route(gw, body)
    if isinstance(body["inputs"], dict):  # {"source_sentence", "sentences"}: huggingface_hub's sentence_similarity
        return await routes_tei.similarity_route(gw, body)
    if gw.spec.sparse:
        return await routes_sparse.embed_sparse_route(gw, body)
    return await routes_tei.embed_route(gw, body)
