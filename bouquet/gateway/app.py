"""The HTTP gateway: an ASGI app (FastAPI on uvicorn) in front of the gRPC replicas.

Routes are thin: parse and validate (inputs.py), tokenize (tokenization.py), run on the replicas
(replicas.py), encode the reply with orjson from pre-built dicts of numpy rows. The POST API routes
are called directly, past FastAPI's per-request machinery (fastpath.py). Errors are
APIError, rendered in the OpenAI shape on ``/v1/*`` and the TEI shape elsewhere.
"""
from __future__ import annotations

import asyncio
import base64
import gc
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, AsyncIterator

import numpy as np
import orjson
from fastapi import FastAPI, Request
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from starlette.responses import Response

from bouquet.config import ServeConfig
from bouquet.gateway.auth import APIKeyMiddleware
from bouquet.gateway.disconnect import ASGIApp, CancelOnDisconnect
from bouquet.gateway.errors import APIError, bad_request, internal_error
from bouquet.gateway.fastpath import FastRoutes, direct_routes
from bouquet.gateway.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from bouquet.gateway.metrics import GatewayMetrics, MetricsMiddleware
from bouquet.gateway.inputs import TextInputs, check_dimensions, long_input_mode, opt_bool, opt_int, opt_str, parse_inputs
from bouquet.gateway.replicas import ReplicaPool
from bouquet.gateway.tokenization import Encoded, TextTokenizer, TooLong
from bouquet.modelspec import ModelSpec
from bouquet.proto import bouquet_pb2 as pb

log = logging.getLogger(__name__)

# Below this many characters tokenizing inline costs less than a thread hop (~50 µs).
_INLINE_TOKENIZE_CHARS = 4096
TOKENIZER_THREADS = 4
PRIORITIES = {"interactive": pb.PRIORITY_INTERACTIVE, "batch": pb.PRIORITY_BATCH, "auto": pb.PRIORITY_AUTO}


@dataclass
class Gateway:
    """Per-process gateway state, built once at start-up and shared by the routes."""

    cfg: ServeConfig
    spec: ModelSpec
    pool: ReplicaPool
    tokenizer: TextTokenizer
    public_id: str
    names: frozenset[str]
    created: int = field(default_factory=lambda: int(time.time()))
    executor: ThreadPoolExecutor = field(default_factory=lambda: ThreadPoolExecutor(TOKENIZER_THREADS, thread_name_prefix="bouquet-tok"))
    metrics: GatewayMetrics = field(default_factory=GatewayMetrics)

    def check_model(self, model: Any) -> None:
        if model is None:
            return
        if not isinstance(model, str):
            raise bad_request(f"'model' must be a string, got {type(model).__name__}", "model", "invalid_type")
        if model not in self.names:
            raise APIError(404, f"The model '{model}' does not exist; this server serves '{self.public_id}'",
                           "model", "model_not_found")

    async def run_tokenizer(self, fn: Any, *args: Any) -> Any:
        """Run a tokenizer call inline when ``args[0]`` is small, else on the tokenizer threads;
        the time taken is recorded in the tokenization histogram."""
        t0 = time.perf_counter()
        try:
            items = args[0] if args and isinstance(args[0], list) else []
            if sum(len(x) if isinstance(x, str) else sum(map(len, x)) for x in items) <= _INLINE_TOKENIZE_CHARS:
                return fn(*args)
            return await asyncio.get_running_loop().run_in_executor(self.executor, fn, *args)
        finally:
            self.metrics.tokenize_seconds.observe(time.perf_counter() - t0)

    async def infer(self, seqs: list[np.ndarray], type_ids: list[np.ndarray] | None = None, normalize: bool | None = None,
                    dimensions: int | None = None, priority: int = pb.PRIORITY_AUTO) -> np.ndarray:
        """ReplicaPool.infer, timed into the inference histogram. Returns float32 [B, D]."""
        t0 = time.perf_counter()
        try:
            return await self.pool.infer(seqs, type_ids, normalize, dimensions, priority)
        finally:
            self.metrics.inference_seconds.observe(time.perf_counter() - t0)

    async def tokenize(self, inputs: TextInputs, truncate: bool, side: str, prompt: str | None = None) -> Encoded:
        """Texts or token ids → Encoded. Raises APIError 400 (too long with truncation off, bad ids)."""
        try:
            if inputs.token_ids is not None:
                return self.tokenizer.check_ids(inputs.token_ids, truncate, side)  # type: ignore[arg-type]
            texts = inputs.texts or []
            if prompt:
                texts = [prompt + t for t in texts]
            return await self.run_tokenizer(self.tokenizer.encode, texts, truncate, side)
        except TooLong as e:
            raise bad_request(str(e), "input", "context_length_exceeded") from None
        except ValueError as e:
            raise bad_request(str(e), "input", "invalid_token_id") from None

    def resolve_prompt(self, body: dict[str, Any]) -> str | None:
        prompt = opt_str(body, "prompt")
        name = opt_str(body, "prompt_name")
        if prompt is not None and name is not None:
            raise bad_request("send either 'prompt' or 'prompt_name', not both", "prompt", "invalid_value")
        if name is not None:
            if name not in self.spec.prompts:
                raise bad_request(f"unknown prompt_name {name!r}; this model defines {sorted(self.spec.prompts)}",
                                  "prompt_name", "invalid_value")
            return self.spec.prompts[name]
        if prompt is None and self.spec.default_prompt_name:
            return self.spec.prompts.get(self.spec.default_prompt_name)
        return prompt


async def read_json(request: Request, limit: int) -> dict[str, Any]:
    """The request body as a JSON object. Raises APIError 413 beyond ``limit`` bytes, 400 for
    invalid JSON (including invalid UTF-8 and excessive nesting) or a non-object body."""
    for name, value in request.scope["headers"]:
        if name == b"content-length":
            cl = value.decode("latin-1")
            if cl.isdigit() and int(cl) > limit:
                raise APIError(413, f"request body of {cl} bytes exceeds the limit of {limit} bytes", None, "payload_too_large")
            break
    # The ASGI messages read directly, as Request.stream() does, without an async generator
    # (whose creation and finalizer hooks showed in the per-request CPU).
    receive = request.receive
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientDisconnect()
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise APIError(413, f"request body exceeds the limit of {limit} bytes", None, "payload_too_large")
        chunks.append(chunk)
        if not message.get("more_body", False):
            break
    request._stream_consumed = True  # as after Request.stream()
    try:
        body = orjson.loads(chunks[0] if len(chunks) == 1 else b"".join(chunks))
    except orjson.JSONDecodeError as e:
        raise bad_request(f"request body is not valid JSON: {e}", None, "invalid_json") from None
    if not isinstance(body, dict):
        raise bad_request(f"request body must be a JSON object, got {type(body).__name__}", None, "invalid_json")
    return body


def json_response(obj: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(obj, option=orjson.OPT_SERIALIZE_NUMPY), status_code=status, media_type="application/json")


def encode_vectors(vectors: np.ndarray, fmt: str) -> list[Any]:
    """[N, D] float32 → per-row JSON values: numpy rows (orjson writes them) or base64 of LE float32."""
    if fmt == "base64":
        v = np.ascontiguousarray(vectors, dtype="<f4")
        return [base64.b64encode(row.tobytes()).decode("ascii") for row in v]
    return list(vectors)


async def embeddings_route(request: Request) -> Response:
    gw: Gateway = request.app.state.gateway
    body = await read_json(request, gw.cfg.max_request_bytes)
    gw.check_model(body.get("model"))
    inputs = parse_inputs(body.get("input"), "input", gw.cfg.max_inputs)
    fmt = opt_str(body, "encoding_format")
    fmt = "float" if fmt is None else fmt  # "" is an unknown format, not the default
    if fmt not in ("float", "base64"):
        raise bad_request(f"'encoding_format' must be 'float' or 'base64', got {fmt!r}", "encoding_format", "invalid_value")
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
    prompt = gw.resolve_prompt(body) if inputs.texts is not None else None
    res = await embed(gw, inputs, mode, side, prompt, normalize, dims, priority)
    data = [{"object": "embedding", "index": i, "embedding": e} for i, e in enumerate(encode_vectors(res.vectors, fmt))]
    if res.chunks is not None:  # long_input "chunks": one vector per window, with its offsets
        for item, windows in zip(data, res.chunks):
            vecs = encode_vectors(np.stack([w.vector for w in windows]), fmt)
            item["chunks"] = [w.to_json(v) for w, v in zip(windows, vecs)]
    return json_response({"object": "list", "data": data, "model": gw.public_id,
                          "usage": {"prompt_tokens": res.tokens, "total_tokens": res.tokens}})


@dataclass(frozen=True)
class EmbedResult:
    vectors: np.ndarray  # float32 [N, D], one row per input
    tokens: int  # tokens embedded (every window counted in chunk modes)
    chunks: list[list[Any]] | None = None  # long_input "chunks": per input, its long_inputs.Window list


async def embed(gw: Gateway, inputs: TextInputs, mode: str, side: str, prompt: str | None,
                normalize: bool | None, dims: int | None, priority: int = pb.PRIORITY_AUTO) -> EmbedResult:
    """Inputs → EmbedResult. Shared by the OpenAI and TEI routes. Raises APIError."""
    if mode in ("chunk_mean", "chunks"):
        from bouquet.gateway.long_inputs import embed_long

        vectors, tokens, chunks = await embed_long(gw, inputs, prompt, normalize, dims, priority)
        return EmbedResult(vectors, tokens, chunks if mode == "chunks" else None)
    enc = await gw.tokenize(inputs, mode == "truncate", side, prompt)
    vectors = await gw.infer(enc.ids, None, normalize, dims, priority)
    return EmbedResult(vectors, enc.num_tokens)


async def health_route(request: Request) -> Response:
    gw: Gateway = request.app.state.gateway
    replicas = [r.describe() for r in gw.pool.replicas]
    ready = gw.pool.ready
    return json_response({"status": "ok" if ready else "loading", "model": gw.public_id, "replicas": replicas},
                         200 if ready else 503)


async def models_route(request: Request) -> Response:
    gw: Gateway = request.app.state.gateway
    return json_response({"object": "list", "data": [
        {"id": gw.public_id, "object": "model", "created": gw.created, "owned_by": "bouquet",
         "aliases": sorted(gw.names - {gw.public_id})}]})


def create_app(cfg: ServeConfig, spec: ModelSpec) -> ASGIApp:
    """Build the gateway's ASGI app for the replicas ``cfg.servers`` (over a Unix socket where
    ``cfg.ipc_paths`` names one). The replica pool connects on start-up (ASGI lifespan)."""
    public_id = cfg.served_model_name[0] if cfg.served_model_name else spec.model_id
    names = frozenset({public_id, spec.model_id, *cfg.served_model_name})
    pool = ReplicaPool(list(cfg.servers), cfg.chunk_tokens, cfg.interactive_max_tokens, ipc_paths=list(cfg.ipc_paths))
    gw = Gateway(cfg, spec, pool, TextTokenizer(spec), public_id, names)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await gw.pool.start()
        # The app, its libraries and the tokenizer live as long as the worker: keep them out of
        # later garbage collections (their full passes showed in the per-request CPU).
        gc.collect()
        gc.freeze()
        yield
        await gw.pool.close()
        gw.executor.shutdown(wait=False)

    api = FastAPI(title="bouquet", version="0.1.0", lifespan=lifespan,
                  description="Embeddings and reranking: OpenAI-compatible and TEI-compatible routes.")
    api.state.gateway = gw

    @api.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError) -> Response:
        return exc.response_for(request.url.path)

    @api.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> Response:
        # Unknown routes (404) and wrong methods (405) answer JSON in the family's shape, not HTML.
        if exc.status_code == 404:
            msg = f"no route {request.method} {request.url.path}; see /openapi.json"
        elif exc.status_code == 405:
            msg = f"method {request.method} is not allowed on {request.url.path}"
        else:
            msg = str(exc.detail)
        return APIError(exc.status_code, msg, None, "not_found" if exc.status_code == 404 else "method_not_allowed",
                        headers=dict(exc.headers or {})).response_for(request.url.path)

    @api.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception) -> Response:
        log.exception("unhandled error on %s", request.url.path)
        return internal_error(exc).response_for(request.url.path)

    add_routes(api)
    gw.metrics.watch_replicas(gw.pool)
    # Our middlewares wrap the FastAPI app from outside, and the POST API routes are called
    # directly (fastpath.py); FastAPI serves the rest: GET routes, docs, 404/405.
    app: ASGIApp = FastRoutes(api, direct_routes(api))
    app = CancelOnDisconnect(app)  # an abandoned request's queued work is dropped
    if cfg.api_key:
        app = APIKeyMiddleware(app, api_key=cfg.api_key)
    routes = frozenset(r.path for r in api.routes if hasattr(r, "path"))
    return MetricsMiddleware(app, metrics=gw.metrics, routes=routes)  # outermost: counts 401s too


async def metrics_route(request: Request) -> Response:
    gw: Gateway = request.app.state.gateway
    return Response(gw.metrics.render(), media_type=METRICS_CONTENT_TYPE)


def add_routes(app: FastAPI) -> None:
    """Register every route with its OpenAPI description (schemas: openapi_docs.py)."""
    from bouquet.gateway import openapi_docs as d
    from bouquet.gateway import routes_scoring, routes_tei

    obj = {"type": "object"}
    app.add_api_route("/health", health_route, methods=["GET"], **d.route_docs(None, obj),
                      summary="200 once a replica has loaded and warmed up; 503 before")
    app.add_api_route("/metrics", metrics_route, methods=["GET"], **d.route_docs(None, {"type": "string"}, media_type="text/plain"),
                      summary="Prometheus metrics (gateway, and per replica)")
    app.add_api_route("/v1/models", models_route, methods=["GET"], **d.route_docs(None, obj), summary="The served model (OpenAI shape)")
    app.add_api_route("/v1/embeddings", embeddings_route, methods=["POST"], summary="OpenAI embeddings (+ extensions)",
                      **d.route_docs(d.EMBEDDINGS_REQUEST, d.EMBEDDINGS_RESPONSE))
    app.add_api_route("/v1/rerank", routes_scoring.rerank_route, methods=["POST"], summary="Cohere/Jina-style rerank",
                      **d.route_docs(d.RERANK_REQUEST, d.RERANK_RESPONSE))
    app.add_api_route("/v1/score", routes_scoring.score_route, methods=["POST"], summary="vLLM-style pair scores",
                      **d.route_docs(d.SCORE_REQUEST, d.SCORE_RESPONSE))
    app.add_api_route("/embed", routes_tei.embed_route, methods=["POST"], summary="TEI embed",
                      **d.route_docs(d.TEI_EMBED_REQUEST, d.TEI_EMBED_RESPONSE, tei=True))
    app.add_api_route("/rerank", routes_tei.rerank_route, methods=["POST"], summary="TEI rerank",
                      **d.route_docs(d.TEI_RERANK_REQUEST, d.TEI_RERANK_RESPONSE, tei=True))
    app.add_api_route("/tokenize", routes_tei.tokenize_route, methods=["POST"], summary="TEI tokenize",
                      **d.route_docs(d.TEI_TOKENIZE_REQUEST, d.TEI_TOKENIZE_RESPONSE, tei=True))
    app.add_api_route("/info", routes_tei.info_route, methods=["GET"], summary="TEI info",
                      **d.route_docs(None, d.TEI_INFO_RESPONSE, tei=True))
