"""Request ids and W3C trace context: which request a response, a log line or a replica call belongs to.

Every response carries ``X-Request-Id``: the client's own when it sent a sane one (1-128 characters
of letters, digits and ``-._:/+=@``; anything else could forge log lines or blow up headers), else
one generated here (32 hex digits: a random per-process prefix and a counter; uvicorn spawns its
workers, so each has its own prefix). A ``traceparent`` header (W3C Trace Context, level 1, §3.2:
``00-<32 hex trace-id>-<16 hex parent-id>-<2 hex flags>``, ids not all zeros) is passed on to the
replicas with the request id, in the IPC call header or as gRPC metadata, and the replica logs
the call with both; a malformed one is dropped, as the spec tells a receiver to do.

The pair travels in a ``ContextVar`` set by the front for the request's task (each request is its
own task, so it never leaks into another request), and read where a call leaves for a replica
(channels.py). A traced request is not coalesced with others (replicas.py): its call is its own.
"""
from __future__ import annotations

import itertools
import os
import re
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Iterator

REQUEST_ID_HEADER = b"x-request-id"
TRACEPARENT_HEADER = b"traceparent"
_SANE_ID = re.compile(rb"[A-Za-z0-9._:/+=@-]{1,128}")
# W3C Trace Context §3.2.2: the version-00 layout, 55 characters (version ff is invalid; a later
# version with extra fields is dropped here rather than guessed at); trace-id and parent-id must not
# be all zeros.
_TRACEPARENT = re.compile(rb"(?!ff)[0-9a-f]{2}-(?!0{32})[0-9a-f]{32}-(?!0{16})[0-9a-f]{16}-[0-9a-f]{2}")


@dataclass(frozen=True)
class Trace:
    """What a replica call carries for the request it serves (both ASCII)."""

    traceparent: str
    request_id: str


TRACE: ContextVar[Trace | None] = ContextVar("bouquet_trace", default=None)


def request_headers(headers: list[tuple[bytes, bytes]]) -> tuple[bytes, bytes | None]:
    """(the request id to answer with, the valid ``traceparent`` or None) from ASGI headers
    (lower-case names). Generates the id when the client's is absent or not sane."""
    rid = trace = None
    for name, value in headers:
        if name == REQUEST_ID_HEADER:
            rid = value if _SANE_ID.fullmatch(value) else None
        elif name == TRACEPARENT_HEADER:
            value = value.strip(b" \t")
            trace = value if len(value) == 55 and _TRACEPARENT.fullmatch(value) else None
    return rid or next(_generated), trace


def new_request_id() -> bytes:
    """A generated request id (for answers to requests that could not be parsed, protocol.py)."""
    return next(_generated)


def _ids() -> Iterator[bytes]:
    """32 hex digits: this process's random 64-bit prefix and a counter. Unique across gateway
    workers and restarts without a system call per request (os.urandom cost ~2 µs a request)."""
    prefix = os.urandom(8).hex()
    for n in itertools.count(1):
        yield f"{prefix}{n:016x}".encode()


_generated = _ids()
