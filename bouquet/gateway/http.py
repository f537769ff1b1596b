"""HTTP helpers of the routes: reading and parsing bodies, writing JSON answers, encoding vectors.

JSON is orjson both ways; vectors are written from numpy rows (float) or as base64 of
little-endian float32 (``encoding_format: base64``, the OpenAI SDKs' default).
"""
from __future__ import annotations

import base64
from typing import Any, Awaitable, Callable, MutableMapping

import numpy as np
import orjson
from starlette.requests import ClientDisconnect
from starlette.responses import Response

from bouquet.gateway.errors import APIError, bad_request

Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]


async def read_body(headers: list[tuple[bytes, bytes]], receive: Receive, limit: int) -> bytes:
    """The whole request body. Raises APIError 413 beyond ``limit`` bytes (from Content-Length
    before reading, or while reading), ClientDisconnect when the client goes away meanwhile."""
    for name, value in headers:
        if name == b"content-length":
            cl = value.decode("latin-1")
            if cl.isdigit() and int(cl) > limit:
                raise APIError(413, f"request body of {cl} bytes exceeds the limit of {limit} bytes", None, "payload_too_large")
            break
    message = await receive()
    if message["type"] == "http.disconnect":
        raise ClientDisconnect()
    body = message.get("body", b"")
    if not message.get("more_body", False):
        if len(body) > limit:
            raise APIError(413, f"request body exceeds the limit of {limit} bytes", None, "payload_too_large")
        return body
    chunks, size = [body], len(body)
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
            return b"".join(chunks)


def parse_json(body: bytes) -> dict[str, Any]:
    """A JSON object. Raises APIError 400 for invalid JSON (including invalid UTF-8 and excessive
    nesting) or a body that is not an object."""
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError as e:
        raise bad_request(f"request body is not valid JSON: {e}", None, "invalid_json") from None
    if not isinstance(obj, dict):
        raise bad_request(f"request body must be a JSON object, got {type(obj).__name__}", None, "invalid_json")
    return obj


def json_response(obj: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(obj, option=orjson.OPT_SERIALIZE_NUMPY), status_code=status, media_type="application/json")


def encode_vectors(vectors: np.ndarray, fmt: str) -> list[Any]:
    """[N, D] float32 → per-row JSON values: numpy rows (orjson writes them) or base64 of LE float32."""
    if fmt == "base64":
        v = np.ascontiguousarray(vectors, dtype="<f4")
        return [base64.b64encode(row).decode("ascii") for row in v]
    return list(vectors)
