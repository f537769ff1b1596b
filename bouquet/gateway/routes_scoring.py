"""``POST /v1/rerank`` (Cohere / Jina rerank shape) and ``POST /v1/score`` (vLLM score API shape).

Both parse with orjson and the shared validators, then call ``scoring.score_pairs``; errors use
the OpenAI shape (these are ``/v1/*`` routes). What scores mean per model kind: scoring.py.
"""
from __future__ import annotations

import time
import uuid
from typing import Any

import numpy as np
from starlette.responses import Response

from bouquet.gateway.core import PRIORITIES, Gateway
from bouquet.gateway.errors import bad_request, json_type, shown
from bouquet.gateway.http import json_response
from bouquet.gateway.inputs import opt_bool, opt_int, opt_str, parse_inputs, required_field
from bouquet.gateway.scoring import PairFields, score_pairs


def parse_texts(value: Any, param: str, max_inputs: int) -> list[str]:
    """A string or a non-empty list of non-empty strings → list. Raises APIError 400 / 413."""
    inputs = parse_inputs(value, param, max_inputs)
    if inputs.texts is None:
        raise bad_request(f"'{param}' must be text here, not token ids", param, "invalid_type")
    return inputs.texts


def parse_documents(value: Any, param: str, max_inputs: int) -> list[str]:
    """Documents as strings or ``{"text": ...}`` objects (Cohere / Jina both accept either)."""
    if isinstance(value, list):
        for i, d in enumerate(value):
            text = d.get("text") if isinstance(d, dict) else d
            if not isinstance(text, str):  # documents are text: no token ids, no numbers, no null text
                got = ("an object without 'text'" if isinstance(d, dict) and "text" not in d
                       else json_type(text) if not isinstance(d, dict) else f"'text' as {json_type(text)}")
                raise bad_request(f"{param}[{i}] must be a string or an object with a 'text' string, got {got}",
                                  f"{param}[{i}]", "invalid_type")
        value = [d.get("text") if isinstance(d, dict) else d for d in value]
    return parse_texts(value, param, max_inputs)


def parse_query(body: dict[str, Any]) -> str:
    q = body.get("query")
    if not isinstance(q, str) or not q:
        code = "missing_required_parameter" if q is None else "invalid_value" if q == "" else "invalid_type"
        raise bad_request("'query' must be a non-empty string", "query", code)
    return q


def ranked(scores: np.ndarray, top_n: int | None) -> list[int]:
    """Indices by descending score (stable: ties keep input order), cut to ``top_n``."""
    order = np.argsort(-scores, kind="stable")
    return [int(i) for i in order[:top_n]]


def common_options(gw: Gateway, body: dict[str, Any]) -> dict[str, Any]:
    """The extension fields shared by the scoring routes: raw_scores, truncate, instruction, priority."""
    truncate = opt_bool(body, "truncate")
    return {"raw": bool(opt_bool(body, "raw_scores")), "truncate": gw.cfg.truncate if truncate is None else truncate,
            "instruction": opt_str(body, "instruction"),
            "priority": PRIORITIES[opt_str(body, "priority", tuple(PRIORITIES)) or "auto"]}


# Cohere rerank fields this server does not implement: refused rather than accepted and ignored,
# so a client never gets scores computed otherwise than it asked (docs/api.md lists every field).
_COHERE_UNSUPPORTED = {
    "max_chunks_per_doc": "documents are not split into chunks here; a long document is truncated (see 'truncate')",
    "max_tokens_per_doc": "documents are cut at the model's maximum length only (see 'truncate')",
}


def _refuse_unsupported(body: dict[str, Any]) -> None:
    for name, why in _COHERE_UNSUPPORTED.items():
        if body.get(name) is not None:
            raise bad_request(f"'{name}' is not supported: {why}", name, "unsupported_parameter")
    fields = body.get("rank_fields")
    if fields is not None and fields != ["text"]:  # documents are ranked on their 'text' only
        raise bad_request(f"'rank_fields' can only be [\"text\"] here (documents are strings or {{\"text\": ...}} "
                          f"objects), got {shown(fields)}", "rank_fields", "unsupported_parameter")


async def ranked_results(gw: Gateway, body: dict[str, Any]) -> tuple[list[dict[str, Any]], int]:
    """The rerank of ``body`` (``query``, ``documents``, ``top_n``, ``return_documents``): results
    sorted by ``relevance_score`` descending, each with its original ``index``, and the tokens
    scored. Shared by ``/v1/rerank`` and Cohere's ``/v2/rerank``. Raises APIError 400 for Cohere's
    ``max_chunks_per_doc`` / ``max_tokens_per_doc``, and ``rank_fields`` other than ["text"]."""
    _refuse_unsupported(body)
    query = parse_query(body)
    docs = parse_documents(required_field(body, "documents"), "documents", gw.cfg.max_inputs)
    top_n = opt_int(body, "top_n")
    if top_n is not None and top_n < 1:
        raise bad_request(f"'top_n' must be >= 1, got {top_n}", "top_n", "invalid_value")
    return_docs = bool(opt_bool(body, "return_documents"))
    opts = common_options(gw, body)
    s = await score_pairs(gw, [query] * len(docs), docs, **opts)
    results = []
    for i in ranked(s.values, top_n):
        item: dict[str, Any] = {"index": i, "relevance_score": float(s.values[i])}
        if return_docs:
            item["document"] = {"text": docs[i]}
        results.append(item)
    return results, s.tokens


async def rerank_route(gw: Gateway, body: dict[str, Any]) -> Response:
    """Cohere/Jina rerank (``ranked_results``) → ``{"id", "model", "results", "usage"}``."""
    results, tokens = await ranked_results(gw, body)
    return json_response({"id": f"rerank-{uuid.uuid4().hex}", "model": gw.public_id, "results": results,
                          "usage": {"prompt_tokens": tokens, "total_tokens": tokens}})


async def score_route(gw: Gateway, body: dict[str, Any]) -> Response:
    """vLLM score API: ``text_1`` and ``text_2`` (string or list). One string against a list scores
    it with each item; two lists are paired item by item (equal lengths, or ``text_1`` of one)."""
    t1 = parse_texts(body.get("text_1"), "text_1", gw.cfg.max_inputs)
    t2 = parse_texts(body.get("text_2"), "text_2", gw.cfg.max_inputs)
    if len(t1) == 1:
        t1 = t1 * len(t2)
    elif len(t2) == 1 and isinstance(body.get("text_2"), str):
        t2 = t2 * len(t1)
    if len(t1) != len(t2):
        raise bad_request(f"'text_1' has {len(t1)} items and 'text_2' {len(t2)}; send one text_1, or lists of "
                          "equal length", "text_2", "invalid_value")
    fields = PairFields("text_1", isinstance(body.get("text_1"), list), "text_2", isinstance(body.get("text_2"), list))
    s = await score_pairs(gw, t1, t2, **common_options(gw, body), fields=fields)
    data = [{"index": i, "object": "score", "score": float(v)} for i, v in enumerate(s.values)]
    return json_response({"id": f"score-{uuid.uuid4().hex}", "object": "list", "created": int(time.time()),
                          "model": gw.public_id, "data": data,
                          "usage": {"prompt_tokens": s.tokens, "total_tokens": s.tokens}})
