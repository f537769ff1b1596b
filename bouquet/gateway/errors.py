"""One error type for the HTTP API, rendered in the shape of the API family that was called.

OpenAI shape (``/v1/*``): ``{"error": {"message", "type", "param", "code"}}`` (OpenAI API
reference, "Error codes"). TEI shape (TEI routes): ``{"error": "...", "error_type": "..."}``
(text-embeddings-inference's ``ErrorResponse``). Cohere shape (``/v2/*``): ``{"message": "..."}``
(the body the Cohere API answers errors with; the ``cohere`` SDK raises by status and keeps it).
"""
from __future__ import annotations

import orjson
from starlette.responses import Response

# Statuses not listed are "invalid_request_error" / "Validation" (every other 4xx).
_TYPES = {401: "authentication_error", 404: "not_found_error", 429: "rate_limit_error",
          500: "server_error", 503: "service_unavailable", 504: "timeout_error"}
_TEI_TYPES = {401: "Unauthorized", 424: "Backend", 429: "Overloaded", 500: "Backend", 503: "Unhealthy", 504: "Backend"}


class APIError(Exception):
    """An error answer. status: HTTP code; param: the request field at fault (OpenAI ``param``);
    code: a short machine-readable code (e.g. ``model_not_found``)."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.headers = headers or {}

    def openai_response(self) -> Response:
        body = {"error": {"message": self.message, "type": _TYPES.get(self.status, "invalid_request_error"),
                          "param": self.param, "code": self.code}}
        return Response(orjson.dumps(body), status_code=self.status, media_type="application/json", headers=self.headers)

    def tei_response(self) -> Response:
        body = {"error": self.message, "error_type": _TEI_TYPES.get(self.status, "Validation")}
        return Response(orjson.dumps(body), status_code=self.status, media_type="application/json", headers=self.headers)

    def cohere_response(self) -> Response:
        return Response(orjson.dumps({"message": self.message}), status_code=self.status, media_type="application/json",
                        headers=self.headers)

    def response_for(self, path: str) -> Response:
        if path.startswith("/v1/") or path == "/v1":
            return self.openai_response()
        if path.startswith("/v2/") or path == "/v2":
            return self.cohere_response()
        return self.tei_response()


def bad_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param, code)


_JSON_TYPES = {type(None): "null", bool: "a boolean", int: "a number", float: "a number", str: "a string",
               list: "an array", dict: "an object"}


def json_type(value: object) -> str:
    """The JSON kind of a parsed request value, for messages ("got a boolean", "got null"): clients
    wrote JSON, not Python (int, NoneType)."""
    return _JSON_TYPES.get(type(value), type(value).__name__)


def shown(value: object, limit: int = 60) -> str:
    """A parsed request value as the client wrote it (JSON: true, null, "abc"), cut to ``limit``
    characters, for messages."""
    try:
        text = orjson.dumps(value).decode()
    except TypeError:
        text = repr(value)
    return text if len(text) <= limit else text[:limit - 1] + "…"


def cut(text: str, limit: int = 200) -> str:
    """``text`` as it was sent, cut to ``limit`` characters, for a message that quotes a client's
    string (a 1 MB model name came back whole in its 404)."""
    return text if len(text) <= limit else text[:limit - 1] + "…"


def internal_error(exc: BaseException) -> APIError:
    """The 500 answer for an unexpected exception: names its type only (details go to the log)."""
    return APIError(500, f"internal error: {type(exc).__name__}", None, "internal_error")
