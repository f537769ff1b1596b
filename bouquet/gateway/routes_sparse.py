"""Sparse and multi-vector outputs: TEI's ``POST /embed_sparse`` and ``POST /embed_all``, and the
``output`` extension of ``/v1/embeddings`` (docs/api.md).

Where the vectors come from:

* a SPLADE model (``ModelSpec.sparse``): its replica returns one vocabulary-sized float32 row per
  input (the engine's SPLADE pooling); the terms are that row's nonzero entries;
* bge-m3 (``ModelSpec.token_heads``): its replica returns one row per token (``step_tokens``:
  the lexical weight, then the L2-normalized ColBERT vector). As FlagEmbedding's ``BGEM3FlagModel``
  does, a term is a token id's largest weight over the input, special tokens (``<s>``, ``</s>``,
  ``<pad>``, ``<unk>``: tokenizer.json's special added tokens) and zero weights left out, and
  the ColBERT vectors are every token's but the first (``<s>``);
* any other embedding model: ``/embed_all`` returns the last hidden state of every token.

Sparse vectors keep the terms above ``threshold`` (default 0), only the ``top_k`` largest when
given, and are sent as (index, value) pairs in ascending index order:
``[[{"index", "value"}, ...], ...]`` on ``/embed_sparse``; ``{"indices": [...], "values": [...]}``
as a ``"sparse_embedding"`` item on ``/v1/embeddings``.

What it does not own: tokenization and the replicas (pipeline.py, core.py), prompts (core.py).
"""
from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import numpy as np
from starlette.responses import Response

from bouquet.gateway.core import PRIORITIES, Gateway
from bouquet.gateway.errors import APIError, bad_request, shown
from bouquet.gateway.http import json_response
from bouquet.gateway.inputs import direction, long_input_mode, opt_int, opt_str, parse_inputs
from bouquet.gateway.pipeline import embed

Terms = tuple[np.ndarray, np.ndarray]  # (indices int64 [n] ascending, values float32 [n])
# Output cap (--max-output-bytes) per value of a token vector: in a JSON reply at most 16 bytes, the
# longest float32 orjson writes ("-0.000012345679") and its comma; bge-m3's sparse terms come from
# its token rows, which the gateway holds as float32 while it reads them.
JSON_VALUE_BYTES = 16
FLOAT32_BYTES = 4


def select_terms(idx: np.ndarray, val: np.ndarray, threshold: float, top_k: int | None) -> Terms:
    """Terms (ascending ``idx``) → those above ``threshold``, the ``top_k`` largest of them when
    given (ties: the lower index), still in ascending index order."""
    keep = val > threshold
    idx, val = idx[keep], val[keep]
    if top_k is not None and idx.size > top_k:
        # a stable sort on -value keeps the lower index first among equal values
        pick = np.sort(np.argsort(-val, kind="stable")[:top_k])
        idx, val = idx[pick], val[pick]
    return idx, val


def sparse_terms(row: np.ndarray, threshold: float, top_k: int | None) -> Terms:
    """One vocabulary-sized row [V] float32 (SPLADE) → its selected terms."""
    idx = np.flatnonzero(row > 0)
    return select_terms(idx, row[idx], threshold, top_k)


def lexical_terms(ids: np.ndarray, weights: np.ndarray, special: frozenset[int]) -> Terms:
    """Token ids [L] and their weights [L] (bge-m3) → (distinct ids ascending, each id's largest
    weight), special tokens and zero weights left out."""
    keep = (weights > 0) & ~np.isin(ids, list(special))
    ids, weights = ids[keep].astype(np.int64), weights[keep]
    if ids.size == 0:
        return ids, weights
    order = np.argsort(ids, kind="stable")
    ids, weights = ids[order], weights[order]
    uniq, first = np.unique(ids, return_index=True)
    return uniq, np.maximum.reduceat(weights, first)


@functools.lru_cache(maxsize=16)
def special_ids(tokenizer_json: Path) -> frozenset[int]:
    """The ids of tokenizer.json's special added tokens (<s>, </s>, <pad>, <unk>, <mask>, ...)."""
    with open(tokenizer_json, encoding="utf-8") as f:
        added = json.load(f).get("added_tokens") or []
    return frozenset(int(t["id"]) for t in added if t.get("special"))


def _options(body: dict[str, Any]) -> tuple[float, int | None]:
    """``threshold`` (a number ≥ 0, default 0) and ``top_k`` (an integer ≥ 1, default all).
    Raises APIError 400 naming the field."""
    threshold = body.get("threshold")
    threshold = 0.0 if threshold is None else threshold  # null is unset, as for top_k and every optional field
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not threshold >= 0:
        raise bad_request(f"'threshold' must be a number >= 0, got {shown(threshold)}", "threshold", "invalid_value")
    top_k = opt_int(body, "top_k")
    if top_k is not None and top_k < 1:
        raise bad_request(f"'top_k' must be at least 1, got {top_k}", "top_k", "invalid_value")
    return float(threshold), top_k


def _check_body(gw: Gateway, body: dict[str, Any]) -> str:
    """Refuse what these vectors do not take; returns the long_input mode ("truncate" or "error").
    Raises APIError 400 (``dimensions``, ``normalize``, chunk modes)."""
    for key in ("dimensions", "normalize"):
        if body.get(key) is not None:
            raise bad_request(f"'{key}' does not apply to the sparse or per-token vectors of '{gw.public_id}'",
                              key, "invalid_value")
    mode = long_input_mode(body, gw.cfg.truncate)
    if mode not in ("truncate", "error"):
        raise bad_request(f"long_input {mode!r} does not apply to sparse or per-token vectors; use 'truncate' or "
                          "'error'", "long_input", "invalid_value")
    return mode


def _check_output(gw: Gateway, vectors: int, width: int, value_bytes: int, param: str) -> None:
    """The output cap (``--max-output-bytes``), checked before the work: ``vectors`` per-token
    vectors of ``width`` values at ``value_bytes`` each. Raises APIError 413 naming the cap and its
    flag."""
    size, cap = vectors * width * value_bytes, gw.cfg.max_output_bytes
    if size > cap:
        raise APIError(413, f"the per-token output of this request would take up to {size:,} bytes ({vectors:,} token "
                       f"vectors of {width} values), more than the limit of {cap:,} (--max-output-bytes); send fewer or "
                       "shorter inputs", param, "output_too_large")


async def _token_rows(gw: Gateway, body: dict[str, Any], param: str, side: str,
                      value_bytes: int) -> tuple[list[np.ndarray], list[np.ndarray], int]:
    """Tokenize and run a per-token request: (ids per input, token rows per input [len_i, D'],
    tokens embedded). ``value_bytes``: what one value of a token's vector costs the caller's
    output (JSON_VALUE_BYTES in a JSON reply), for the output cap. Raises APIError (400 for
    invalid fields, 413 over the token limit or the output cap, replica errors)."""
    inputs = parse_inputs(body.get(param), param, gw.cfg.max_inputs)
    mode = _check_body(gw, body)
    priority = PRIORITIES[opt_str(body, "priority", tuple(PRIORITIES)) or "auto"]
    enc = await gw.tokenize(inputs, mode == "truncate", side, gw.resolve_prompt(body, inputs), param)
    _check_output(gw, enc.num_tokens, gw.spec.token_width, value_bytes, param)
    rows = await gw.infer_tokens(enc.ids, priority)
    bounds = np.cumsum([0] + [len(s) for s in enc.ids])
    return enc.ids, [rows[a:b] for a, b in zip(bounds[:-1], bounds[1:])], enc.num_tokens


async def sparse_vectors(gw: Gateway, body: dict[str, Any], param: str, side: str) -> tuple[list[Terms], int]:
    """The selected terms of each input and the tokens embedded, for a SPLADE model or bge-m3.
    Raises APIError 424 for any other model (the caller re-raises it as its family's error)."""
    threshold, top_k = _options(body)
    if gw.spec.sparse:
        inputs = parse_inputs(body.get(param), param, gw.cfg.max_inputs)
        mode = _check_body(gw, body)
        priority = PRIORITIES[opt_str(body, "priority", tuple(PRIORITIES)) or "auto"]
        res = await embed(gw, inputs, mode, side, gw.resolve_prompt(body, inputs), False, None, priority, param)
        return [sparse_terms(row, threshold, top_k) for row in res.vectors], res.tokens
    if gw.spec.token_heads:
        ids, rows, tokens = await _token_rows(gw, body, param, side, FLOAT32_BYTES)
        special = special_ids(gw.spec.tokenizer_path)
        return [select_terms(*lexical_terms(i, r[:, 0], special), threshold, top_k) for i, r in zip(ids, rows)], tokens
    raise APIError(424, f"model '{gw.public_id}' has no sparse output (a SPLADE model or bge-m3's heads); use /embed",
                   param, "wrong_task")


async def token_vectors(gw: Gateway, body: dict[str, Any], param: str, side: str) -> tuple[list[np.ndarray], int]:
    """Per input its token vectors [n_i, D'] — bge-m3: the ColBERT vectors of every token but the
    first; any other embedding model: every token's last hidden state — and the tokens embedded.
    Raises APIError 424 for scoring and SPLADE models."""
    if gw.spec.task != "embed" or gw.spec.sparse:
        raise APIError(424, f"model '{gw.public_id}' has no per-token vectors", param, "wrong_task")
    _, rows, tokens = await _token_rows(gw, body, param, side, JSON_VALUE_BYTES)
    return [r[1:, 1:] if gw.spec.token_heads else r for r in rows], tokens


def _f32(a: np.ndarray) -> np.ndarray:
    """float32 and C-contiguous: what orjson serializes as an array, in float32's shortest form."""
    return np.ascontiguousarray(a, dtype=np.float32)


async def embed_sparse_route(gw: Gateway, body: dict[str, Any]) -> Response:
    """TEI ``/embed_sparse``: ``inputs``, ``truncate``, ``truncation_direction``, ``prompt_name``,
    plus ``top_k`` and ``threshold`` → ``[[{"index", "value"}, ...], ...]``. Raises APIError 424
    on a model without sparse output (TEI's answer), 400 for invalid fields."""
    terms, _ = await sparse_vectors(gw, body, "inputs", direction(body))
    # float32 values go out as float32 (shortest repr, ~9 digits), as on every other route
    return json_response([[{"index": i, "value": v} for i, v in zip(idx.tolist(), _f32(val))] for idx, val in terms])


async def embed_all_route(gw: Gateway, body: dict[str, Any]) -> Response:
    """TEI ``/embed_all``: ``inputs``, ``truncate``, ``truncation_direction``, ``prompt_name`` →
    per input its token vectors ``[[[float, ...], ...], ...]`` (``token_vectors``). Raises
    APIError 424 on a scoring or SPLADE model, 400 for invalid fields."""
    vecs, _ = await token_vectors(gw, body, "inputs", direction(body))
    return json_response([_f32(v) for v in vecs])


async def openai_token_embeddings(gw: Gateway, body: dict[str, Any], output: str) -> Response:
    """``/v1/embeddings`` with ``output`` "sparse" (the default of a SPLADE model) or
    "multi_vector": items ``{"object": "sparse_embedding", "index", "embedding": {"indices",
    "values"}}`` or ``{"object": "multi_vector_embedding", "index", "embedding": [[float, ...],
    ...]}``. ``encoding_format`` must be "float" (or absent). Raises APIError 400 for invalid
    fields and for an output the model does not have."""
    fmt = opt_str(body, "encoding_format")
    if fmt not in (None, "float"):
        raise bad_request(f"sparse and multi-vector embeddings are sent as JSON numbers only; 'encoding_format' "
                          f"{fmt!r} does not apply", "encoding_format", "invalid_value")
    side = opt_str(body, "truncation_side", ("left", "right")) or "right"
    try:
        if output == "sparse":
            terms, tokens = await sparse_vectors(gw, body, "input", side)
            data = [{"object": "sparse_embedding", "index": i, "embedding": {"indices": idx.tolist(), "values": _f32(val)}}
                    for i, (idx, val) in enumerate(terms)]
        else:
            vecs, tokens = await token_vectors(gw, body, "input", side)
            data = [{"object": "multi_vector_embedding", "index": i, "embedding": _f32(v)} for i, v in enumerate(vecs)]
    except APIError as e:
        if e.status != 424:
            raise
        raise bad_request(f"model '{gw.public_id}' has no {output} output", "output", "wrong_task") from None
    return json_response({"object": "list", "data": data, "model": gw.public_id,
                          "usage": {"prompt_tokens": tokens, "total_tokens": tokens}})
