"""HTTP helpers of the routes: reading and parsing bodies, writing JSON answers.

JSON is orjson both ways; numpy rows are written as numbers. Vector encodings (base64, int8,
binary, ...) are encodings.py's.
"""
from __future__ import annotations

from typing import Any, Awaitable, Callable, MutableMapping

import orjson
from starlette.requests import ClientDisconnect
from starlette.responses import Response

from bouquet.gateway.errors import APIError, bad_request, json_type

Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]


TRUNCATED = "bouquet.body_truncated"  # set by protocol.py on a request whose client stopped sending


def _json_type(value: bytes) -> bool:
    """``application/json`` or any ``+json`` type, parameters (``; charset=utf-8``) ignored."""
    media = value.split(b";", 1)[0].strip().lower()
    return media == b"application/json" or (media.startswith(b"application/") and media.endswith(b"+json"))


def check_body_headers(headers: list[tuple[bytes, bytes]], limit: int) -> int | None:
    """Refuse a POST by its headers alone; returns the announced Content-Length (None if chunked).

    Raises APIError 411 without ``Content-Length`` or chunked transfer encoding (RFC 9110
    §15.5.12), 413 beyond ``limit`` bytes, 415 for a declared media type that is not JSON (a
    request without ``Content-Type`` is read as JSON) or a ``Content-Encoding`` other than
    ``identity`` (bodies are not decompressed; RFC 9110 §15.5.16).
    """
    length: bytes | None = None
    chunked = False
    for name, value in headers:
        if name == b"content-length":
            length = value
        elif name == b"transfer-encoding":
            chunked = b"chunked" in value.lower()
        elif name == b"content-type" and not _json_type(value):
            media = value.split(b";", 1)[0].strip().decode("latin-1")
            raise APIError(415, f"Content-Type {media!r} is not supported; send the body as JSON with "
                                "'Content-Type: application/json'", None, "unsupported_media_type")
        elif name == b"content-encoding" and value.strip().lower() not in (b"", b"identity"):
            raise APIError(415, f"Content-Encoding {value.decode('latin-1')!r} is not supported; send the body "
                                "uncompressed", None, "unsupported_media_type", headers={"Accept-Encoding": "identity"})
    if length is None:
        if chunked:
            return None
        raise APIError(411, "a POST needs a Content-Length header (or chunked transfer encoding)", None, "length_required")
    n = int(length)  # the HTTP parser accepted it, so it is a plain decimal number
    if n > limit:
        raise APIError(413, f"request body of {n} bytes exceeds the limit of {limit} bytes", None, "payload_too_large")
    return n


async def read_body(scope: MutableMapping[str, Any], receive: Receive, limit: int) -> bytes:
    """The whole request body, after ``check_body_headers``.

    Raises APIError 411/413/415 (see there), 413 beyond ``limit`` bytes while reading, 400 when
    the client stopped sending before the end of its announced body, ClientDisconnect when the
    client went away meanwhile.
    """
    announced = check_body_headers(scope["headers"], limit)
    chunks: list[bytes] = []
    size = 0
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
    if TRUNCATED in (scope.get("extensions") or {}):
        expected = f"of the {announced} bytes its Content-Length announced" if announced is not None else "of its chunked body"
        raise bad_request(f"the request body ended after {size} bytes {expected}", None, "incomplete_body")
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def parse_json(body: bytes) -> dict[str, Any]:
    """A JSON object. Raises APIError 400 for invalid JSON (including invalid UTF-8 and excessive
    nesting) or a body that is not an object."""
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError as e:
        try:  # orjson names bad UTF-8 as "surrogates not allowed" at char 0: say where the byte is
            body.decode("utf-8")
        except UnicodeDecodeError as u:
            raise bad_request(f"request body is not valid UTF-8: byte 0x{body[u.start]:02x} at offset {u.start}",
                              None, "invalid_json") from None
        raise bad_request(f"request body is not valid JSON: {e}", None, "invalid_json") from None
    if not isinstance(obj, dict):
        raise bad_request(f"request body must be a JSON object, got {json_type(obj)}", None, "invalid_json")
    return obj


def json_response(obj: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(obj, option=orjson.OPT_SERIALIZE_NUMPY), status_code=status, media_type="application/json")

