"""The gateway's outermost ASGI app: one layer between uvicorn and the routes.

Per request, in this order: request id and trace context (tracing.py), drain (503 while shutting
down), API key, routing, body read and JSON parse (POST routes), cancellation when the client goes
away, the route, error rendering, metrics and the request's log line (``bouquet.access``: answers
of 400 and above at INFO but /health's, the others at DEBUG, each with its request id).
These were five stacked middlewares plus FastAPI's per-request machinery (dependency solving,
two ``AsyncExitStack``s, route matching over every route): as much CPU as a small request's own
work (bench/results/cpu-2core.md). FastAPI still holds the OpenAPI description of every
route and serves ``/openapi.json``, ``/docs`` and the 404/405 answers for anything not routed here.

Cancellation: Starlette does not stop a route whose client disconnected, so an abandoned bulk
request would keep the replicas busy. Once the body is read, a request still running after
``watch_after_s`` gets a watcher that waits for ``http.disconnect`` and cancels the request's task
(not the response once it has started); the cancellation reaches the replicas, whose schedulers
drop the sequences that have not run (``cancelled_sequences``). Most small requests finish first
and never pay for the watcher's task.

What it does not own: the routes (routes_*.py), error shapes (errors.py), the drain's timing
(drain.py), the metrics' definitions (metrics.py).
"""
from __future__ import annotations

import asyncio
import hmac
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, MutableMapping

import orjson
from starlette.requests import ClientDisconnect
from starlette.responses import Response

from bouquet.gateway.catalog import Catalog, RouteKind
from bouquet.gateway.tracing import REQUEST_ID_HEADER, TRACE, Trace, request_headers
from bouquet.gateway.core import Gateway
from bouquet.gateway.drain import DrainState
from bouquet.gateway.errors import APIError, internal_error
from bouquet.gateway.http import parse_json, read_body
from bouquet.gateway.refusals import Refusals

log = logging.getLogger(__name__)
Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]
PostRoute = Callable[[Gateway, dict[str, Any]], Awaitable[Response]]
GetRoute = Callable[[Catalog], Awaitable[Response]]  # GET routes see every served model
ItemRoute = Callable[[Catalog, str], Awaitable[Response]]  # GET PREFIX{item}: the rest of the path
access_log = logging.getLogger("bouquet.access")


# status recorded for a request whose client disconnected before the answer (nginx's 499, "client
# closed request"): nothing is sent, but the request is counted in bouquet_http_requests_total
CLIENT_CLOSED = 499


@dataclass(frozen=True)
class Routes:
    """What the front serves itself: POST routes take the model's Gateway and the parsed JSON body,
    GET (and HEAD) routes the Catalog, GET item routes (``/v1/models/{id}``) the Catalog and the
    rest of the path after their prefix. ``kinds``: the model each POST route needs when several
    are served (absent = "any"). ``public``: GET routes that answer a client without the API key
    (when one is set) in their own reduced form (``/health``: the status a load balancer needs,
    no addresses or pids); every other route answers such a client 401."""

    post: dict[str, PostRoute]
    get: dict[str, GetRoute]
    get_items: dict[str, ItemRoute]
    kinds: dict[str, RouteKind]
    public: dict[str, GetRoute] = field(default_factory=dict)


def credentials(headers: list[tuple[bytes, bytes]]) -> tuple[bytes | None, bytes | None]:
    """(scheme, token) of the ``Authorization`` header: (None, None) without one; the token of
    ``Bearer <token>`` (the scheme is case-insensitive, surrounding whitespace ignored: RFC 9110
    §11.1, RFC 6750 §2.1); (the scheme as sent, None) for another scheme; (b"", None) for a value
    without a scheme."""
    for name, value in headers:
        if name == b"authorization":
            parts = value.split(None, 1)  # any run of spaces or tabs between scheme and token
            if len(parts) == 2 and parts[0].lower() == b"bearer":
                return parts[0], parts[1].strip()
            return (parts[0] if len(parts) == 2 else b""), None  # a bare value (the key itself?) is not echoed
    return None, None


def auth_refusal(scheme: bytes | None, token: bytes | None) -> str:
    """Why a request's credentials were refused: none sent, another scheme (named: ``Basic`` is
    the usual mistake of a client configured with a user and password), or the wrong key."""
    if scheme is None:
        return "missing 'Authorization: Bearer' header"
    if token is None:
        shown = scheme[:32].decode("latin-1") if scheme and scheme.isalpha() else ""
        return (f"the Authorization header uses the {shown!r} scheme; send 'Authorization: Bearer <API key>'"
                if shown else "the Authorization header is not of the form 'Bearer <API key>'")
    return "invalid API key"


class _Watch:
    """Cancels ``task`` when the client disconnects before the response starts (module docstring)."""

    __slots__ = ("task", "receive", "watcher", "started", "cancelled")

    def __init__(self, task: asyncio.Task[Any], receive: Receive) -> None:
        self.task, self.receive = task, receive
        self.watcher: asyncio.Task[None] | None = None
        self.started = False  # the response is on its way: never cancel then
        self.cancelled = False

    def start(self) -> None:
        if self.watcher is None and not self.started:
            self.watcher = asyncio.ensure_future(self._watch())

    async def _watch(self) -> None:
        while True:
            msg = await self.receive()
            if msg["type"] == "http.disconnect":
                if not self.started:
                    self.cancelled = True  # nobody is left to read the answer
                    self.task.cancel()
                return


class Front:
    """ASGI app: serves ``routes`` for the ``models``; everything else goes to ``api`` (FastAPI).
    A POST goes to the only model's Gateway, or, when several are served, to the one
    ``Catalog.pick`` finds for the body's ``model``."""

    def __init__(self, api: ASGIApp, models: Catalog, routes: Routes, api_key: str | None = None,
                 drain: DrainState | None = None, watch_after_s: float = 0.02) -> None:
        self.api, self.models, self.routes, self.drain = api, models, routes, drain
        self.gw: Gateway = models.gateways[0]  # every app-wide setting and the shared metrics live here too
        self.multi = not models.single
        self.key = api_key.encode() if api_key else None
        self.watch_after_s = watch_after_s
        self.body_limit = self.gw.cfg.request_bytes_limit  # --max-request-bytes, or derived from --max-request-tokens
        self.known = frozenset({*routes.post, *routes.get, *(p + "{id}" for p in routes.get_items)})
        metrics = self.gw.metrics
        # Labelled children looked up once: ``labels()`` takes a lock and builds a key per call.
        self._latency = {r: metrics.latency.labels(r) for r in (*self.known, "other")}
        self.refusals = Refusals(metrics.refusals)  # the protocol's own answers (refusals.py), this process's
        self._count: dict[tuple[str, str, int], Any] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.api(scope, receive, send)  # lifespan: the replica pool starts and stops there
            return
        t0 = time.perf_counter()
        path, method = scope["path"], scope["method"]
        rid, traceparent = request_headers(scope["headers"])
        scope["bouquet.request_id"] = rid
        if traceparent is not None:  # this request's task only (tracing.py)
            TRACE.set(Trace(traceparent.decode(), rid.decode()))
        drain = self.drain
        if drain is not None:
            if drain.draining and path != "/metrics":  # the last scrape still sees the drain's counts
                err = APIError(503, "the server is shutting down; retry on another instance", None, "shutting_down",
                               headers={"Retry-After": str(drain.retry_after_s), "Connection": "close"})
                response = err.response_for(path)
                if path == "/health":  # its word beside ok / loading / unavailable (docs/api.md), and the TEI error
                    body = {"status": "shutting_down", "error": err.message, "error_type": "Unhealthy"}
                    response = Response(orjson.dumps(body), 503, err.headers, media_type="application/json")
                await self._send(send, response, scope, t0)
                return
            drain.inflight += 1
        try:
            if self.key is not None:
                scheme, token = credentials(scope["headers"])
                if token is None or not hmac.compare_digest(token, self.key):
                    public = self.routes.public.get(path) if method in ("GET", "HEAD") else None
                    if public is not None:
                        await self._send(send, await public(self.models), scope, t0)
                        return
                    err = APIError(401, f"{auth_refusal(scheme, token)}; this server requires an API key", None,
                                   "invalid_api_key",
                                   headers={"WWW-Authenticate": "Bearer"})
                    await self._send(send, err.response_for(path), scope, t0)
                    return
            if method == "POST" and path in self.routes.post:
                if drain is None:
                    await self._post(self.routes.post[path], scope, receive, send, t0)
                else:
                    task = asyncio.current_task()
                    assert task is not None
                    drain.tasks.add(task)
                    try:
                        await self._post(self.routes.post[path], scope, receive, send, t0)
                    finally:
                        drain.tasks.discard(task)
            elif (method == "GET" or method == "HEAD") and (path in self.routes.get or self._item(path)):
                try:
                    if path in self.routes.get:
                        response = await self.routes.get[path](self.models)
                    else:
                        prefix = self._item(path)
                        response = await self.routes.get_items[prefix](self.models, path[len(prefix):])
                except APIError as e:
                    response = e.response_for(path)
                except Exception as e:  # noqa: BLE001 - answered as the API's 500, and logged
                    log.exception("unhandled error on %s (request id %s)", path, rid.decode())
                    response = internal_error(e).response_for(path)
                await self._send(send, response, scope, t0)  # uvicorn sends no body for HEAD
            else:
                await self._other(scope, receive, send, t0)
        finally:
            if drain is not None:
                drain.inflight -= 1

    def _item(self, path: str) -> str:
        """The item-route prefix ``path`` starts with (and goes past), or ""."""
        return next((p for p in self.routes.get_items if path.startswith(p) and len(path) > len(p)), "")

    async def _post(self, route: PostRoute, scope: Scope, receive: Receive, send: Send, t0: float) -> None:
        path = scope["path"]
        task = asyncio.current_task()
        assert task is not None
        watch = _Watch(task, receive)
        timer: asyncio.TimerHandle | None = None
        try:
            body = await read_body(scope, receive, self.body_limit)
            timer = asyncio.get_running_loop().call_later(self.watch_after_s, watch.start)
            obj = parse_json(body)
            if self.multi:
                gw = self.models.pick(obj.get("model"), self.routes.kinds.get(path, "any"))
            else:  # every POST route, TEI's included, refuses a name this server does not serve
                gw = self.gw
                gw.check_model(obj.get("model"))
            response = await route(gw, obj)
        except APIError as e:
            response = e.response_for(path)
        except ClientDisconnect:  # gone before its body arrived: no one to answer
            self._observe(scope, CLIENT_CLOSED, t0)
            return
        except asyncio.CancelledError:
            drain = self.drain
            if watch.cancelled:  # the client went away while its request ran: counted, not answered
                task.uncancel()
                self._observe(scope, CLIENT_CLOSED, t0)
                return
            if drain is None or not drain.expired:
                raise
            task.uncancel()  # cancelled at the drain deadline (drain.py): the client gets a 503, not a reset
            response = APIError(503, "the server shut down before this request finished; retry on another instance",
                                None, "shutting_down", headers={"Retry-After": str(drain.retry_after_s),
                                                                "Connection": "close"}).response_for(path)
        except Exception as e:  # noqa: BLE001 - answered as the API's 500, and logged
            log.exception("unhandled error on %s (request id %s)", path, scope["bouquet.request_id"].decode())
            response = internal_error(e).response_for(path)
        finally:
            watch.started = True
            if timer is not None:
                timer.cancel()
            if watch.watcher is not None:
                watch.watcher.cancel()
        await self._send(send, response, scope, t0)

    async def _send(self, send: Send, response: Response, scope: Scope, t0: float) -> None:
        status = response.status_code
        headers = [*response.raw_headers, (REQUEST_ID_HEADER, scope["bouquet.request_id"])]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": response.body})
        # Metrics and the log line once the answer has left: uvloop writes what was sent when this
        # loop iteration's callbacks have run, so any work here would delay the answer.
        asyncio.get_running_loop().call_soon(self._observe, scope, status, t0, time.perf_counter())

    async def _other(self, scope: Scope, receive: Receive, send: Send, t0: float) -> None:
        """FastAPI: docs, unknown paths (404), wrong methods (405); counted under the path's route
        when it is one of ours (a 405 on /v1/embeddings), else under "other"."""
        status = 500
        rid = (REQUEST_ID_HEADER, scope["bouquet.request_id"])

        async def send_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message = {**message, "headers": [*message.get("headers", ()), rid]}
            await send(message)

        try:
            await self.api(scope, receive, send_status)
        finally:
            self._observe(scope, status, t0)

    def _observe(self, scope: Scope, status: int, t0: float, t1: float | None = None) -> None:
        """Metrics and the request's log line (module docstring); ``t1``: when it was answered (now
        when None)."""
        route, method = scope["path"], scope["method"]
        elapsed = (time.perf_counter() if t1 is None else t1) - t0
        # /health's 503s while loading are probes' routine, not errors to read
        level = logging.INFO if status >= 400 and route != "/health" else logging.DEBUG
        if access_log.isEnabledFor(level):  # the path as sent, at most 200 characters: it is the client's text
            access_log.log(level, "%s %.200r %d %.1f ms request_id=%s", method, route, status, elapsed * 1e3,
                           scope["bouquet.request_id"].decode())
        if route not in self.known:
            prefix = self._item(route)
            route = prefix + "{id}" if prefix else "other"
        self._latency[route].observe(elapsed)
        key = (route, method, status)
        count = self._count.get(key)
        if count is None:
            count = self._count[key] = self.gw.metrics.requests.labels(route, method, str(status))
        count.inc()
