"""Direct dispatch of the API's POST routes, past FastAPI's per-request machinery.

The routes take a ``Request`` and return a ``Response``; they declare no parameters for FastAPI
to validate (they parse the body with orjson themselves, gateway/inputs.py). Yet every request
through FastAPI still paid for its telemetry check, four middlewares, route matching over all
routes, dependency solving and two ``AsyncExitStack``s: about as much CPU as the route's own work
for a small request (bench/gateway_overhead.py). ``FastRoutes`` sits in front of the FastAPI app
(inside the gateway's own middlewares: metrics, API key, disconnects) and calls those routes
directly, rendering ``APIError`` and unexpected exceptions as the app's exception handlers do.
Everything else (GET routes, docs, unknown paths, wrong methods) goes on to FastAPI unchanged,
which also keeps serving the OpenAPI description of the routes taken here.

What it does not own: the routes (app.py and routes_*.py), their error shapes (errors.py).
"""
from __future__ import annotations

import logging
from typing import Any, Awaitable, Callable

from fastapi import FastAPI
from fastapi.routing import APIRoute
from starlette.requests import Request
from starlette.responses import Response

from bouquet.gateway.errors import APIError, internal_error

log = logging.getLogger(__name__)
Endpoint = Callable[[Request], Awaitable[Response]]


def direct_routes(app: FastAPI) -> dict[tuple[str, str], Endpoint]:
    """The app's POST routes by (method, path). Raises TypeError for a route whose endpoint takes
    anything but the ``Request`` (FastAPI would have to inject or validate it)."""
    out: dict[tuple[str, str], Endpoint] = {}
    for r in app.routes:
        if isinstance(r, APIRoute) and r.methods == {"POST"}:
            d = r.dependant
            if d.query_params or d.body_params or d.path_params or d.header_params or d.dependencies:
                raise TypeError(f"route {r.path} declares parameters; it cannot be called directly")
            out[("POST", r.path)] = r.endpoint
    return out


class FastRoutes:
    """ASGI app: ``(method, path)`` in ``routes`` → that endpoint, anything else → ``app``."""

    def __init__(self, app: FastAPI, routes: dict[tuple[str, str], Endpoint]) -> None:
        self.app, self.routes = app, routes

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        endpoint = self.routes.get((scope.get("method", ""), scope["path"])) if scope["type"] == "http" else None
        if endpoint is None:
            await self.app(scope, receive, send)
            return
        scope["app"] = self.app  # what Starlette sets: routes reach their state as request.app.state
        request = Request(scope, receive, send)
        try:
            response = await endpoint(request)
        except APIError as e:
            response = e.response_for(scope["path"])
        except Exception as e:  # noqa: BLE001 - answered like the app's 500 handler, and logged
            log.exception("unhandled error on %s", scope["path"])
            response = internal_error(e).response_for(scope["path"])
        await response(scope, receive, send)
