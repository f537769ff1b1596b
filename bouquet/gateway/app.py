"""The HTTP gateway's ASGI app: the front layer (front.py) over the routes, FastAPI for the rest.

Routes are thin: parse and validate (inputs.py), tokenize (bouquet/tokenization.py), run on the
replicas (replicas.py), encode the reply with orjson from numpy rows (http.py). Errors are
APIError, rendered in the OpenAI shape on ``/v1/*``, Cohere's on ``/v2/*`` and the TEI shape elsewhere. FastAPI holds
the OpenAPI description of every route (``/openapi.json``, ``/docs``), the lifespan that starts
the replica pool, and the JSON 404/405 answers; the front serves the routes themselves.
"""
from __future__ import annotations

import gc
import logging
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, Sequence

from fastapi import FastAPI, Request
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.middleware.cors import CORSMiddleware
from starlette.responses import Response

from bouquet.config import ServeConfig
from bouquet.gateway import openapi_docs as d
from bouquet.gateway import routes_cohere, routes_openai, routes_predict, routes_scoring, routes_sparse, routes_tei
from bouquet.gateway.catalog import Catalog, model_names
from bouquet.gateway.core import Gateway, tokenizer_threads
from bouquet.gateway.drain import DrainState
from bouquet.gateway.errors import APIError, internal_error
from bouquet.gateway.front import ASGIApp, Front, Routes
from bouquet.gateway.metrics import GatewayMetrics
from bouquet.gateway.replicas import ReplicaPool
from bouquet.modelspec import ModelSpec
from bouquet.parent import parent_alive
from bouquet.tokenization import TextTokenizer

log = logging.getLogger(__name__)

ROUTES = Routes(
    post={"/v1/embeddings": routes_openai.embeddings_route, "/v1/rerank": routes_scoring.rerank_route,
          "/v1/score": routes_scoring.score_route, "/embed": routes_tei.embed_route,
          "/rerank": routes_tei.rerank_route, "/tokenize": routes_tei.tokenize_route,
          "/similarity": routes_tei.similarity_route, "/decode": routes_tei.decode_route,
          "/embed_sparse": routes_sparse.embed_sparse_route, "/embed_all": routes_sparse.embed_all_route,
          "/v2/embed": routes_cohere.embed_route, "/v2/rerank": routes_cohere.rerank_route,
          "/predict": routes_predict.predict_route, "/": routes_predict.compat_route,
          "/invocations": routes_predict.compat_route},
    get={"/health": routes_openai.health_route, "/metrics": routes_openai.metrics_route,
         "/v1/models": routes_openai.models_route, "/info": routes_tei.info_route},
    get_items={"/v1/models/": routes_openai.model_route},
    public={"/health": routes_openai.health_status_route},
    kinds={"/v1/embeddings": "embed", "/v2/embed": "dense", "/embed": "dense", "/embed_sparse": "sparse", "/embed_all": "dense", "/similarity": "dense", "/v1/rerank": "score", "/v2/rerank": "score", "/v1/score": "score", "/rerank": "score", "/predict": "score"},
)


def create_app(models: Sequence[tuple[ServeConfig, ModelSpec]], drain: DrainState | None = None,
               take_signals: bool = False) -> ASGIApp:
    """Build the gateway's ASGI app for one or more models, each given as its single-model config
    (``ServeConfig.per_model``, its replicas in ``servers``, over a Unix socket where ``ipc_paths``
    names one) and spec; app-wide settings (API key, CORS, limits) are the first config's. The
    replica pools connect on start-up (ASGI lifespan). ``drain``: answer 503 while it says so
    (drain.py); with ``take_signals`` (a ``--gateway-workers`` process) SIGTERM/SIGINT start it.
    Raises ConfigError when two models share a name."""
    cfg = models[0][0]
    # One tokenizer thread pool and one metrics registry for the process, whatever the model count.
    executor = ThreadPoolExecutor(tokenizer_threads(cfg), thread_name_prefix="bouquet-tok")
    metrics = GatewayMetrics()
    gateways = [Gateway(c, spec, ReplicaPool(list(c.servers), c.chunk_tokens, c.interactive_max_tokens,
                                             ipc_paths=list(c.ipc_paths), gpus=list(c.replica_gpus),
                                             batch_one_per_gpu=c.batch_one_replica_per_gpu, api_key=c.api_key,
                                             shutting_down=lambda: drain is not None and drain.draining,
                                             row_bytes=4 * spec.dimension, expect_task=spec.task,
                                             expect_dimension=spec.dimension, own_replicas=c.own_replicas),
                        TextTokenizer(spec), public_id, names, executor=executor, metrics=metrics)
                for (c, spec), (public_id, names) in zip(models, model_names(models))]
    catalog = Catalog.of(gateways)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if drain is not None and take_signals:
            # uvicorn.Server has installed its handlers by now. Before the first probes: a SIGTERM
            # to the whole group while this worker starts stops the replicas too, and their going
            # away is then part of the shutdown (INFO), not a fault (WARNING).
            drain.take_signals()
        for gw in gateways:
            await gw.pool.start()
        # The app, its libraries and the tokenizer live as long as the worker: keep them out of
        # later garbage collections (their full passes showed in the per-request CPU).
        gc.collect()
        gc.freeze()
        yield
        try:
            for gw in gateways:
                await gw.pool.close()
            executor.shutdown(wait=False)
        finally:
            metrics.forget_process(launcher_alive=parent_alive())

    # redirect_slashes off: Starlette would answer "/v1/embeddings/" with an empty 307 whose Location
    # is built from the client's Host header; a JSON 404 that names the route is what clients can use
    api = FastAPI(title="bouquet", version=routes_openai.VERSION, lifespan=lifespan, redirect_slashes=False,
                  description="Embeddings and reranking: OpenAI-, Cohere- and TEI-compatible routes.")

    @api.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> Response:
        # Unknown routes (404) and wrong methods (405) answer JSON in the family's shape, not HTML.
        if exc.status_code == 404:
            msg = f"no route {request.method} {request.url.path}; see /openapi.json"
            bare = request.url.path.rstrip("/")
            if bare != request.url.path and any(getattr(r, "path", None) == bare for r in api.routes):
                msg = f"no route {request.method} {request.url.path}: the route is {bare} (no trailing slash)"
        elif exc.status_code == 405:
            msg = f"method {request.method} is not allowed on {request.url.path}"
        else:
            msg = str(exc.detail)
        headers = dict(exc.headers or {})
        allow = [m.strip() for m in headers.get("Allow", "").split(",") if m.strip()]
        if "GET" in allow and "HEAD" not in allow:  # the front answers HEAD for every GET route (front.py)
            headers["Allow"] = ", ".join([*allow, "HEAD"])
        return APIError(exc.status_code, msg, None, "not_found" if exc.status_code == 404 else "method_not_allowed",
                        headers=headers).response_for(request.url.path)

    @api.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception) -> Response:
        log.exception("unhandled error on %s", request.url.path)
        return internal_error(exc).response_for(request.url.path)

    describe_routes(api)
    metrics.watch_replicas([(gw.public_id, gw.pool) for gw in gateways])
    front = Front(api, catalog, ROUTES, cfg.api_key, drain)
    return Cors(front, cfg.cors_allow_origins) if cfg.cors_allow_origins else front


class Cors(CORSMiddleware):
    """Starlette's CORS handling (Fetch standard, "CORS protocol") for ``--cors-allow-origin``:
    preflights are answered before the front (they carry no API key), other responses get the
    ``Access-Control-Allow-Origin`` headers. A refused preflight is the API's JSON 400 instead of
    Starlette's plain text."""

    def __init__(self, app: ASGIApp, origins: tuple[str, ...]) -> None:
        super().__init__(app, allow_origins=list(origins), allow_methods=["GET", "HEAD", "POST", "OPTIONS"],
                         allow_headers=["Authorization", "Content-Type", "X-Request-Id", "traceparent"],
                         expose_headers=["X-Request-Id"], max_age=600)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["method"] == "OPTIONS":
            headers = Headers(scope=scope)
            if "origin" in headers and "access-control-request-method" in headers:
                response = self.preflight_response(request_headers=headers)
                if response.status_code >= 400:
                    reason = bytes(response.body).decode(errors="replace")
                    response = APIError(400, f"CORS preflight refused: {reason}", None, "cors_preflight_refused",
                                        headers={"Vary": "Origin"}).response_for(scope["path"])
                await response(scope, receive, send)
                return
        await super().__call__(scope, receive, send)


async def _served_by_front(request: Request) -> Response:
    """The endpoint FastAPI documents; the front serves the route before FastAPI sees it."""
    raise RuntimeError(f"{request.method} {request.url.path} should have been served by the gateway's front")


def describe_routes(app: FastAPI) -> None:
    """Register every route's OpenAPI description (schemas: openapi_docs.py)."""
    obj: dict[str, Any] = {"type": "object"}
    docs = [
        ("/health", "GET", None, obj, False, "200 once each model has a replica loaded and warmed up; 503 before"),
        ("/metrics", "GET", None, {"type": "string"}, False, "Prometheus metrics (gateway, and per replica)"),
        ("/v1/models", "GET", None, obj, False, "The served models (OpenAI shape)"),
        ("/v1/models/{model}", "GET", None, obj, False, "A served model under one of its names (OpenAI shape)"),
        ("/v1/embeddings", "POST", d.EMBEDDINGS_REQUEST, d.EMBEDDINGS_RESPONSE, False, "OpenAI embeddings (+ extensions)"),
        ("/v1/rerank", "POST", d.RERANK_REQUEST, d.RERANK_RESPONSE, False, "Cohere/Jina-style rerank"),
        ("/v1/score", "POST", d.SCORE_REQUEST, d.SCORE_RESPONSE, False, "vLLM-style pair scores"),
        ("/embed", "POST", d.TEI_EMBED_REQUEST, d.TEI_EMBED_RESPONSE, True, "TEI embed"),
        ("/embed_sparse", "POST", d.TEI_EMBED_SPARSE_REQUEST, d.TEI_EMBED_SPARSE_RESPONSE, True,
         "TEI embed_sparse (SPLADE, bge-m3): (index, value) pairs, top_k and threshold"),
        ("/embed_all", "POST", d.TEI_EMBED_ALL_REQUEST, d.TEI_EMBED_ALL_RESPONSE, True,
         "TEI embed_all: per-token vectors (bge-m3: ColBERT)"),
        ("/rerank", "POST", d.TEI_RERANK_REQUEST, d.TEI_RERANK_RESPONSE, True, "TEI rerank"),
        ("/tokenize", "POST", d.TEI_TOKENIZE_REQUEST, d.TEI_TOKENIZE_RESPONSE, True, "TEI tokenize"),
        ("/decode", "POST", d.TEI_DECODE_REQUEST, d.TEI_DECODE_RESPONSE, True, "TEI decode: token ids back to text"),
        ("/similarity", "POST", d.TEI_SIMILARITY_REQUEST, d.TEI_SIMILARITY_RESPONSE, True,
         "TEI similarity: cosine of each sentence with the source sentence"),
        ("/info", "GET", None, d.TEI_INFO_RESPONSE, True, "TEI info"),
        ("/predict", "POST", d.TEI_PREDICT_REQUEST, d.TEI_PREDICT_RESPONSE, True,
         "TEI predict: every label's score for a text, a pair or a batch (scoring models)"),
        ("/", "POST", d.TEI_COMPAT_REQUEST, d.TEI_COMPAT_RESPONSE, True,
         "TEI's default route: query + texts → /rerank; inputs → the model's /embed, /predict (scoring) or "
         "/embed_sparse (SPLADE); an inputs object → /similarity"),
        ("/invocations", "POST", d.TEI_COMPAT_REQUEST, d.TEI_COMPAT_RESPONSE, True,
         "SageMaker's route: as POST /"),
    ]
    # GET routes' errors: 401 where the server has an API key (all but /health), /health's 503 is its own object
    key = {401: "Missing or wrong API key (a server started with --api-key)"}
    get_errors = {"/health": {503: "Not ready: status loading, unavailable or shutting_down"},
                  "/v1/models/{model}": {**key, 404: "No served model under this name"}}
    for path, method, request, response, tei, summary in docs:
        kw = d.route_docs(request, response, tei=tei, media_type="text/plain" if path == "/metrics" else "application/json",
                          errors=get_errors.get(path, key), error=response if path == "/health" else None)
        app.add_api_route(path, _served_by_front, methods=[method], summary=summary, **kw)
    app.add_api_route("/v2/embed", _served_by_front, methods=["POST"],
                      summary="Cohere v2 embed: float, int8, uint8, binary, ubinary and base64 vectors",
                      **d.route_docs(d.COHERE_EMBED_REQUEST, d.COHERE_EMBED_RESPONSE, error=d.COHERE_ERROR))
    app.add_api_route("/v2/rerank", _served_by_front, methods=["POST"], summary="Cohere v2 rerank",
                      **d.route_docs(d.COHERE_RERANK_REQUEST, d.COHERE_RERANK_RESPONSE, error=d.COHERE_ERROR))
