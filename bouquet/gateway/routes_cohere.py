"""Cohere v2 compatible routes: ``POST /v2/embed`` and ``POST /v2/rerank``.

Request and response follow Cohere's API reference ("Embed", v2) as its Python SDK
(``cohere.ClientV2.embed``) sends and parses them; errors are ``{"message": ...}`` with a 4xx
(errors.py). Fields, and what bouquet does with each (docs/api.md, "Cohere /v2/embed"):

- ``model`` (required): a name this server serves (404 otherwise, as on every route).
- ``texts`` (required): a non-empty list of non-empty strings, at most ``--max-inputs``.
- ``input_type`` (required): ``search_query`` / ``search_document`` / ``classification`` /
  ``clustering`` → the first of INPUT_TYPE_PROMPTS[input_type] the model's
  config_sentence_transformers.json names among its ``prompts``; when it names none, the model's
  default prompt (``default_prompt_name``), as on the other routes, usually none. ``image`` → 400.
- ``embedding_types``: any of ``float``, ``int8``, ``uint8``, ``binary``, ``ubinary``, ``base64``
  (encodings.py); default ``["float"]``. Vectors are L2-normalized first (Cohere's are unit length).
- ``truncate``: ``NONE`` (400 for a text over the model's limit), ``START`` (drop the start, keep
  the end), ``END`` (drop the end); absent → ``END``, or ``NONE`` when the server runs with
  ``--no-truncate``.
- ``output_dimension``: Matryoshka size, as ``dimensions`` on /v1/embeddings.
- ``images``, ``inputs``, ``max_tokens``, ``priority``: not supported → 400 naming the field,
  never silently ignored.

``/v2/rerank`` (Cohere's "Rerank", v2, as ``cohere.ClientV2.rerank`` sends it): ``model`` (required),
``query``, ``documents``, ``top_n`` as on ``/v1/rerank`` (routes_scoring.py); ``max_tokens_per_doc``,
``relevant_spans`` and ``priority`` → 400 naming the field. Answer: ``{"id", "results": [{"index",
"relevance_score"}], "meta": {"api_version", "billed_units": {"input_tokens"}}}``.
"""
from __future__ import annotations

import uuid
from typing import Any

from starlette.responses import Response

from bouquet.gateway.core import Gateway
from bouquet.gateway.encodings import COHERE_TYPES, encode_vectors
from bouquet.gateway.errors import APIError, bad_request, json_type, shown
from bouquet.gateway.http import json_response
from bouquet.gateway.inputs import TextInputs, check_dimensions, opt_int, opt_str
from bouquet.gateway.pipeline import embed
from bouquet.gateway.routes_scoring import parse_texts, ranked_results
from bouquet.modelspec import resolve_prompt

# input_type → prompt names tried in order among the model's ``prompts`` (exact names as models
# spell them: Qwen3-Embedding and e5-style "query"/"document"/"passage", nomic's
# "search_query"/"search_document", EmbeddingGemma's "Classification"/"Clustering").
INPUT_TYPE_PROMPTS: dict[str, tuple[str, ...]] = {
    "search_query": ("search_query", "query"),
    "search_document": ("search_document", "document", "passage"),
    "classification": ("classification", "Classification"),
    "clustering": ("clustering", "Clustering"),
}
TRUNCATE = {"NONE": ("error", "right"), "START": ("truncate", "left"), "END": ("truncate", "right")}
_UNSUPPORTED = {"images": "only 'texts' can be embedded (bouquet serves text models)",
                "inputs": "only 'texts' can be embedded (bouquet serves text models)",
                "max_tokens": "texts are cut at the model's own limit only (see 'truncate')",
                "priority": "request priorities are not supported on this route"}
_RERANK_UNSUPPORTED = {"relevant_spans": "relevant spans are not computed here",
                       "priority": "request priorities are not supported on this route"}


def input_type_prompt(gw: Gateway, input_type: str) -> str | None:
    """The prompt prepended for ``input_type`` (module docstring), None for none."""
    for name in INPUT_TYPE_PROMPTS[input_type]:
        if name in gw.spec.prompts:
            return gw.spec.prompts[name] or None
    return resolve_prompt(gw.spec) or None


def _embedding_types(body: dict[str, Any]) -> list[str]:
    value = body.get("embedding_types")
    if value is None:
        return ["float"]
    if not isinstance(value, list) or not value:
        raise bad_request(f"'embedding_types' must be a non-empty list of {list(COHERE_TYPES)}, got {shown(value)}",
                          "embedding_types", "invalid_value")
    for i, t in enumerate(value):
        if t not in COHERE_TYPES:
            raise bad_request(f"embedding_types[{i}] must be one of {list(COHERE_TYPES)}, got {shown(t)}",
                              f"embedding_types[{i}]", "invalid_value")
    return list(dict.fromkeys(value))  # each type once, in the order asked


async def embed_route(gw: Gateway, body: dict[str, Any]) -> Response:
    """``{"model", "texts", "input_type", "embedding_types"?, "truncate"?, "output_dimension"?}`` →
    ``{"id", "embeddings": {type: [row, ...]}, "texts", "meta": {"api_version", "billed_units":
    {"input_tokens"}}, "response_type": "embeddings_by_type"}``. Raises APIError 400 for a missing
    or invalid field (the module docstring lists them), 413 beyond ``--max-inputs`` texts, 424
    for a model that is not a dense embedding model."""
    for key, why in _UNSUPPORTED.items():
        if body.get(key) is not None:
            raise bad_request(f"'{key}' is not supported: {why}", key, "unsupported_parameter")
    if body.get("model") is None:
        raise bad_request("'model' is required (one of the names in /v1/models)", "model", "missing_required_parameter")
    if gw.spec.task != "embed" or gw.spec.sparse:
        raise APIError(424, f"model '{gw.public_id}' is not a dense embedding model", "model", "wrong_task")
    texts = body.get("texts")
    if not isinstance(texts, list):
        raise bad_request(f"'texts' must be a list of strings, got {json_type(texts)}", "texts",
                          "missing_required_parameter" if texts is None else "invalid_type")
    texts = parse_texts(texts, "texts", gw.cfg.max_inputs)
    input_type = opt_str(body, "input_type", (*INPUT_TYPE_PROMPTS, "image"))
    if input_type is None:
        raise bad_request(f"'input_type' is required: one of {list(INPUT_TYPE_PROMPTS)}", "input_type",
                          "missing_required_parameter")
    if input_type == "image":
        raise bad_request("input_type 'image' is not supported: bouquet serves text models", "input_type", "invalid_value")
    types = _embedding_types(body)
    truncate = opt_str(body, "truncate", tuple(TRUNCATE))
    mode, side = TRUNCATE[truncate or ("END" if gw.cfg.truncate else "NONE")]
    dims = check_dimensions(opt_int(body, "output_dimension"), gw.spec.dimension, gw.spec.matryoshka_dims,
                            "output_dimension")
    res = await embed(gw, TextInputs(texts, None, False), mode, side, input_type_prompt(gw, input_type), True, dims,
                      param="texts")
    return json_response({"id": str(uuid.uuid4()), "embeddings": {t: encode_vectors(res.vectors, t) for t in types},
                          "texts": texts, "meta": {"api_version": {"version": "2"},
                                                   "billed_units": {"input_tokens": res.tokens}},
                          "response_type": "embeddings_by_type"})


async def rerank_route(gw: Gateway, body: dict[str, Any]) -> Response:
    """``{"model", "query", "documents", "top_n"?}`` → ``{"id", "results": [{"index",
    "relevance_score"}, ...], "meta": {"api_version": {"version": "2"}, "billed_units":
    {"input_tokens"}}}``, results by descending score (module docstring). Raises APIError 400 for a
    missing ``model`` or an unsupported field, and as ``/v1/rerank`` does (``ranked_results``)."""
    for key, why in _RERANK_UNSUPPORTED.items():
        if body.get(key) is not None:
            raise bad_request(f"'{key}' is not supported: {why}", key, "unsupported_parameter")
    if body.get("model") is None:
        raise bad_request("'model' is required (one of the names in /v1/models)", "model", "missing_required_parameter")
    results, tokens = await ranked_results(gw, body)
    return json_response({"id": str(uuid.uuid4()), "results": results,
                          "meta": {"api_version": {"version": "2"}, "billed_units": {"input_tokens": tokens}}})
