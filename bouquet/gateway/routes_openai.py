"""OpenAI-compatible routes: ``POST /v1/embeddings`` (plus bouquet's extensions, docs/api.md),
``GET /v1/models``; and the operational ones: ``GET /health``, ``GET /metrics``.

Request and response shapes follow the OpenAI API reference ("Embeddings", "Models"); errors use
its ``{"error": {...}}`` shape (errors.py).
"""
from __future__ import annotations

from typing import Any

import numpy as np
from starlette.responses import Response

from bouquet import __version__
from bouquet.gateway.catalog import Catalog
from bouquet.gateway.core import PRIORITIES, Gateway
from bouquet.gateway.errors import bad_request, shown
from bouquet.gateway.encodings import OPENAI_FORMATS, encode_vectors
from bouquet.gateway.http import json_response
from bouquet.gateway.inputs import (check_dimensions, long_input_mode, opt_bool, opt_int, opt_str, parse_inputs,
                                    required_field)
from bouquet.gateway.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from bouquet.gateway.pipeline import embed
from bouquet.gateway.routes_sparse import openai_token_embeddings

VERSION = __version__


async def embeddings_route(gw: Gateway, body: dict[str, Any]) -> Response:
    """``input`` (string, strings, token ids) → ``{"object": "list", "data": [{"embedding", "index"}], ...}``."""
    output = opt_str(body, "output", ("dense", "sparse", "multi_vector"))
    if output in ("sparse", "multi_vector") or (gw.spec.sparse and output is None):  # docs/api.md
        return await openai_token_embeddings(gw, body, output or "sparse")
    if gw.spec.sparse:
        raise bad_request(f"model '{gw.public_id}' is a sparse (SPLADE) model: no dense output", "output", "wrong_task")
    inputs = parse_inputs(required_field(body, "input"), "input", gw.cfg.max_inputs)
    fmt = opt_str(body, "encoding_format")
    fmt = "float" if fmt is None else fmt  # "" is an unknown format, not the default
    if fmt not in OPENAI_FORMATS:  # float, base64 (OpenAI's); the rest bouquet's extension (encodings.py)
        raise bad_request(f"'encoding_format' must be one of {list(OPENAI_FORMATS)}, got {shown(fmt)}",
                          "encoding_format", "invalid_value")
    dims = check_dimensions(opt_int(body, "dimensions"), gw.spec.dimension, gw.spec.matryoshka_dims)
    normalize = opt_bool(body, "normalize")
    side = opt_str(body, "truncation_side", ("left", "right")) or "right"
    mode = long_input_mode(body, gw.cfg.truncate)
    priority = PRIORITIES[opt_str(body, "priority", tuple(PRIORITIES)) or "auto"]
    user = body.get("user")
    if user is not None and not isinstance(user, str):
        raise bad_request("'user' must be a string", "user", "invalid_type")
    if gw.spec.task != "embed":
        raise bad_request(f"model '{gw.public_id}' is a scoring model; use /v1/rerank or /v1/score", "model", "wrong_task")
    prompt = gw.resolve_prompt(body, inputs)
    res = await embed(gw, inputs, mode, side, prompt, normalize, dims, priority)
    data = [{"object": "embedding", "index": i, "embedding": e} for i, e in enumerate(encode_vectors(res.vectors, fmt))]
    if res.chunks is not None:  # long_input "chunks": one vector per window, with its offsets
        for item, windows in zip(data, res.chunks):
            vecs = encode_vectors(np.stack([w.vector for w in windows]), fmt)
            item["chunks"] = [w.to_json(v) for w, v in zip(windows, vecs)]
    return json_response({"object": "list", "data": data, "model": gw.public_id,
                          "usage": {"prompt_tokens": res.tokens, "total_tokens": res.tokens}})


def _overall(models: Catalog) -> str:
    """"ok" when every model's pool is; else "unavailable" when one lost its replicas after being
    ready, else "loading" (``ReplicaPool.status``)."""
    words = {gw.pool.status for gw in models.gateways}
    return "ok" if words == {"ok"} else "unavailable" if "unavailable" in words else "loading"


async def health_route(models: Catalog) -> Response:
    """200 once every model has a replica loaded and warmed up, 503 otherwise, with "loading"
    before any replica of a model was ready and "unavailable" after they all stopped answering;
    the replicas as the pools see them: ``{"status", "model", "replicas"}`` for one model,
    ``{"status", "models": [{"model", "task", "status", "replicas"}]}`` for several."""
    overall = _overall(models)
    status = 200 if overall == "ok" else 503
    if models.single:
        gw = models.gateways[0]
        return json_response({"status": overall, "model": gw.public_id,
                              "replicas": [r.describe() for r in gw.pool.replicas]}, status)
    each = [{"model": gw.public_id, "task": gw.spec.task, "status": gw.pool.status,
             "replicas": [r.describe() for r in gw.pool.replicas]} for gw in models.gateways]
    return json_response({"status": overall, "models": each}, status)


async def health_status_route(models: Catalog) -> Response:
    """``/health`` for a client without the API key (when one is set): ``{"status"}`` and the same
    200 / 503 as ``health_route``, what a load balancer or probe needs; replicas' addresses, pids
    and devices are for authenticated clients only."""
    overall = _overall(models)
    return json_response({"status": overall}, 200 if overall == "ok" else 503)


def _model(gw: Gateway) -> dict[str, Any]:
    return {"id": gw.public_id, "object": "model", "created": gw.created, "owned_by": "bouquet",
            "aliases": sorted(gw.names - {gw.public_id})}


async def models_route(models: Catalog) -> Response:
    """OpenAI "List models": the served models, in ``--model`` order."""
    return json_response({"object": "list", "data": [_model(gw) for gw in models.gateways]})


async def model_route(models: Catalog, model: str) -> Response:
    """OpenAI "Retrieve model" (``GET /v1/models/{model}``): a served model under any of its
    names (ids may contain '/'). Raises APIError 404 for another name."""
    return json_response(_model(models.find(model)))


async def metrics_route(models: Catalog) -> Response:
    return Response(models.gateways[0].metrics.render(), media_type=METRICS_CONTENT_TYPE)  # one registry for all
