"""Sparse (SPLADE) outputs: TEI's ``POST /embed_sparse`` and the sparse form of ``/v1/embeddings``.

A sparse model's replica returns one vocabulary-sized float32 row per input (``ModelSpec.sparse``;
the engine's SPLADE pooling); this module keeps the terms above ``threshold`` (default 0: every
nonzero term), optionally only the ``top_k`` largest, and sends them as (index, value) pairs in
ascending index order:

* ``/embed_sparse`` (TEI's shape): ``[[{"index": int, "value": float}, ...], ...]``, one list per
  input;
* ``/v1/embeddings`` on a sparse model (bouquet's extension, docs/api.md): each item's
  ``embedding`` is ``{"indices": [...], "values": [...]}`` and its ``object`` is
  ``"sparse_embedding"``.

What it does not own: tokenization and the replicas (pipeline.py), prompts (core.py).
"""
from __future__ import annotations

from typing import Any

import numpy as np
from starlette.responses import Response

from bouquet.gateway.core import PRIORITIES, Gateway
from bouquet.gateway.errors import APIError, bad_request
from bouquet.gateway.http import json_response
from bouquet.gateway.inputs import long_input_mode, opt_int, opt_str, parse_inputs
from bouquet.gateway.pipeline import embed


def sparse_terms(row: np.ndarray, threshold: float, top_k: int | None) -> tuple[np.ndarray, np.ndarray]:
    """One vocabulary-sized row [V] float32 → (indices int64 [n] ascending, values float32 [n]):
    the terms above ``threshold``, the ``top_k`` largest of them when given (ties: lower index)."""
    idx = np.flatnonzero(row > threshold)
    if top_k is not None and idx.size > top_k:
        # stable sort on -value keeps the lower index first among equal values
        keep = np.argsort(-row[idx], kind="stable")[:top_k]
        idx = np.sort(idx[keep])
    return idx, row[idx]


def _options(body: dict[str, Any]) -> tuple[float, int | None]:
    """``threshold`` (a number ≥ 0, default 0) and ``top_k`` (an integer ≥ 1, default all).
    Raises APIError 400 naming the field."""
    threshold = body.get("threshold", 0.0)
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not threshold >= 0:
        raise bad_request(f"'threshold' must be a number >= 0, got {threshold!r}", "threshold", "invalid_value")
    top_k = opt_int(body, "top_k")
    if top_k is not None and top_k < 1:
        raise bad_request(f"'top_k' must be at least 1, got {top_k}", "top_k", "invalid_value")
    return float(threshold), top_k


async def _sparse_rows(gw: Gateway, body: dict[str, Any], param: str, side: str) -> tuple[np.ndarray, int]:
    """Validate and run a sparse request: (rows [N, V] float32, tokens embedded). Raises APIError
    400 for options a sparse vector does not take (``dimensions``, ``normalize``, chunking)."""
    inputs = parse_inputs(body.get(param), param, gw.cfg.max_inputs)
    for key in ("dimensions", "normalize"):
        if body.get(key) is not None:
            raise bad_request(f"'{key}' does not apply to the sparse vectors of '{gw.public_id}'", key, "invalid_value")
    mode = long_input_mode(body, gw.cfg.truncate)
    if mode not in ("truncate", "error"):
        raise bad_request(f"long_input {mode!r} does not apply to sparse vectors; use 'truncate' or 'error'",
                          "long_input", "invalid_value")
    priority = PRIORITIES[opt_str(body, "priority", tuple(PRIORITIES)) or "auto"]
    prompt = gw.resolve_prompt(body, inputs)
    res = await embed(gw, inputs, mode, side, prompt, False, None, priority, param)
    return res.vectors, res.tokens


async def embed_sparse_route(gw: Gateway, body: dict[str, Any]) -> Response:
    """TEI ``/embed_sparse``: ``inputs``, ``truncate``, ``truncation_direction``, ``prompt_name``,
    plus ``top_k`` and ``threshold`` → ``[[{"index", "value"}, ...], ...]``. Raises APIError 424
    on a model that is not sparse (TEI's answer), 400 for invalid fields."""
    if not gw.spec.sparse:
        raise APIError(424, f"model '{gw.public_id}' is not a sparse (SPLADE) model; use /embed", "inputs", "wrong_task")
    threshold, top_k = _options(body)
    direction = (opt_str(body, "truncation_direction") or "right").lower()
    if direction not in ("left", "right"):
        raise bad_request(f"'truncation_direction' must be 'Left' or 'Right', got {direction!r}",
                          "truncation_direction", "invalid_value")
    rows, _ = await _sparse_rows(gw, body, "inputs", direction)
    out = []
    for row in rows:
        idx, val = sparse_terms(row, threshold, top_k)
        out.append([{"index": int(i), "value": float(v)} for i, v in zip(idx.tolist(), val.tolist())])
    return json_response(out)


async def openai_sparse_embeddings(gw: Gateway, body: dict[str, Any]) -> Response:
    """``/v1/embeddings`` on a sparse model: ``{"object": "list", "data": [{"object":
    "sparse_embedding", "index", "embedding": {"indices", "values"}}], "model", "usage"}``.
    ``encoding_format`` must be "float" (or absent). Raises APIError 400 for invalid fields."""
    fmt = opt_str(body, "encoding_format")
    if fmt not in (None, "float"):
        raise bad_request(f"sparse embeddings are sent as JSON numbers only; 'encoding_format' {fmt!r} does not apply",
                          "encoding_format", "invalid_value")
    threshold, top_k = _options(body)
    side = opt_str(body, "truncation_side", ("left", "right")) or "right"
    rows, tokens = await _sparse_rows(gw, body, "input", side)
    data = []
    for i, row in enumerate(rows):
        idx, val = sparse_terms(row, threshold, top_k)
        data.append({"object": "sparse_embedding", "index": i,
                     "embedding": {"indices": idx.tolist(), "values": val.tolist()}})
    return json_response({"object": "list", "data": data, "model": gw.public_id,
                          "usage": {"prompt_tokens": tokens, "total_tokens": tokens}})
