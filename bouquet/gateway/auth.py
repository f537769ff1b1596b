"""``--api-key``: every route but ``/health`` needs ``Authorization: Bearer <key>``.

Answers 401 in the error shape of the route that was called (OpenAI on ``/v1/*``, TEI elsewhere)
with ``WWW-Authenticate: Bearer`` (RFC 6750). The key is compared in constant time.
"""
from __future__ import annotations

import hmac
from typing import Any

from bouquet.gateway.errors import APIError

OPEN_PATHS = frozenset({"/health"})


class APIKeyMiddleware:
    """Pure ASGI middleware; a no-op for non-HTTP scopes (lifespan)."""

    def __init__(self, app: Any, api_key: str) -> None:
        self.app = app
        self.expected = f"Bearer {api_key}".encode()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        given = next((v for k, v in scope["headers"] if k == b"authorization"), b"")
        if hmac.compare_digest(given, self.expected):
            await self.app(scope, receive, send)
            return
        msg = "missing 'Authorization: Bearer' header" if not given else "invalid API key"
        err = APIError(401, f"{msg}; this server requires an API key", None, "invalid_api_key",
                       headers={"WWW-Authenticate": "Bearer"})
        await err.response_for(scope["path"])(scope, receive, send)
