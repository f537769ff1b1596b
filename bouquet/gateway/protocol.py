"""uvicorn's httptools protocol, with the limits of the HTTP front end and the errors it answers
itself kept inside the API's contract.

Limits (gateway/limits.py, docs/deploy.md), per connection:
- deadlines: a new connection that sends nothing for ``connect_idle_s`` is closed unanswered; a
  request's head must be complete ``headers_s`` after its first byte and its body ``body_s`` after
  the head, with no silence longer than ``read_gap_s`` in between, else 408. Time during which the
  gateway itself stopped reading (pipelined requests waiting for earlier ones) does not count;
- size: the head is fed to the parser at most ``max_header_bytes`` at a time, so a head that never
  ends costs that much memory and gets 431 (414 when the target is most of it); more than
  ``max_header_count`` field lines → 431; chunk extensions and trailers share one such budget;
- body: a ``Content-Length`` past ``max_body_bytes`` (``--max-request-bytes``) → 413 at once,
  before any of the body is read (the routes check bodies as they read them: http.py);
- count: past ``max_connections`` open connections in this process, a new connection's request
  is answered 503 with ``Retry-After`` (uvicorn's own ``limit_concurrency`` answers plain text,
  without ``Retry-After``, and on every connection, idle keep-alive ones counted).
Request semantics (RFC 9112 / RFC 9110): the checks of request_head.py; an unknown method that is
a valid token in a well-formed request line → 501 (RFC 9110 §9.1); ``OPTIONS *`` → 200 with
``Allow`` (§9.3.7).

Every refusal is counted and logged with its request id (refusals.py), and answered as a JSON
error in the API's shape (OpenAI on ``/v1/*``, TEI elsewhere: errors.py),
written after every response owed to earlier requests on the connection; then the sending side
is shut down and what the client still sends is read and dropped for up to ``linger_s`` (a close
with unread data would reset the connection, and a reset can destroy the answer in the client's
buffers: nginx's "lingering close").

End of input inside a request: the responses owed to the complete requests before it are
finished, then the cut one is answered: a body shorter than its ``Content-Length`` reaches the app
with the bytes that came and ``scope["extensions"]["bouquet.body_truncated"]``, so the route layer
answers a JSON 400 (http.py ``read_body``); one cut inside its head gets a JSON 400 here. End of
input between requests closes the connection at once, as uvicorn does: a close and a half-close
look alike there, and a client that went away must have its work cancelled.

What it does not own: anything after a request is parsed (front.py), the status of bodies that
parse (http.py). It overrides uvicorn's protocol callbacks (``connection_made/lost``,
``data_received``, ``eof_received``, ``on_message_*``, ``on_header(s_complete)``, ``on_body``,
``on_response_complete``, ``_start_asgi_task``); the uvicorn range in pyproject.toml is the one
its tests ran against.
"""
from __future__ import annotations

import asyncio
import logging
import math
import re
from http import HTTPStatus
from typing import Any

import httptools
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from bouquet.config import ServeConfig
from bouquet.gateway.errors import APIError
from bouquet.gateway.http import BODY_LIMIT_FLAGS, TRUNCATED
from bouquet.gateway.limits import HttpLimits
from bouquet.gateway.refusals import Refusals
from bouquet.gateway.request_head import Refusal, bad_request, check_head
from bouquet.gateway.tracing import new_request_id, request_headers

log = logging.getLogger("bouquet")
CAP_WARNING_EVERY_S = 60.0  # the connection cap's warning, at most this often per process

# A well-formed request line (RFC 9112 §3) whose method is a token (RFC 9110 §5.6.2)
_REQUEST_LINE = re.compile(rb"([!#$%&'*+\-.^_`|~0-9A-Za-z]+) [^ \r\n]+ HTTP/[0-9]\.[0-9]\r?\n")
_CHUNK_OVERHEAD = 32  # bytes of framing allowed per chunk beside the shared budget (size line, CRLFs)
_BODY_SLICE_MIN = 4096  # smallest body slice fed: a message's framing may pass its budget by this much


def _head_end(tail: bytes, data: bytes) -> int:
    """How many bytes of ``data`` reach the first empty line (the end of a header section, or an
    empty line before a request line) after ``tail``, the last bytes fed before it; len(data) + 1
    when none is in sight. A line ends with CRLF or, as llhttp may accept, a bare LF."""
    joined = tail + data
    ends = [i + len(m) for m in (b"\n\r\n", b"\n\n") if (i := joined.find(m)) >= 0]
    return min(ends) - len(tail) if ends else len(data) + 1


def error_bytes(status: int, message: str, code: str, path: str, headers: dict[str, str] | None = None,
                request_id: bytes | None = None) -> bytes:
    """A whole HTTP/1.1 error response (JSON body in the family's shape, ``connection: close``);
    ``request_id``: the one to answer with (tracing.py), None to generate one."""
    response = APIError(status, message, None, code, headers=headers).response_for(path)
    head = [f"HTTP/1.1 {status} {HTTPStatus(status).phrase}".encode()]
    head += [k + b": " + v for k, v in response.raw_headers]
    head.append(b"x-request-id: " + (request_id or new_request_id()))
    head.append(b"connection: close")
    return b"\r\n".join(head) + b"\r\n\r\n" + response.body


async def _server_options(scope: Any, receive: Any, send: Any) -> None:
    """``OPTIONS *``: the server's methods, for any resource (RFC 9110 §9.3.7), with the request id
    every answer carries (docs/api.md)."""
    rid, _ = request_headers(scope["headers"])
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"allow", b"GET, HEAD, POST, OPTIONS"), (b"content-length", b"0"),
                            (b"x-request-id", rid)]})
    await send({"type": "http.response.body", "body": b""})


# Where a connection stands, for its deadlines (plain ints: compared on every read)
_NEW = 0  # connected, nothing received yet
_HEAD = 1  # a request's head is arriving
_BODY = 2  # its body is arriving
_REST = 3  # nothing awaited from the client: the app runs, or a keep-alive wait (uvicorn's timer)


class _Refused(Exception):
    """Raised in a parser callback to stop the parser; the refusal is in ``HttpProtocol._refusal``."""


class HttpProtocol(HttpToolsProtocol):
    """``http=`` class for uvicorn (launcher.py); see the module docstring."""

    _cap_warned_at = -math.inf  # this process's last warning about the connection cap (loop time)

    def __init__(self, config: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(config, *args, **kwargs)
        self.limits: HttpLimits = getattr(config, "http_limits", None) or HttpLimits.from_config(ServeConfig())
        self.refusals: Refusals = getattr(config, "http_refusals", None) or Refusals()  # counted and logged
        self.parser.set_dangerous_leniencies(lenient_version=True)  # any HTTP/d.d: request_head.py decides
        self._in_message = False  # between on_message_begin and on_message_complete
        self._head_done = False  # the message being parsed has its cycle (headers complete)
        self._head_parsed = False  # its head is complete (refused or not)
        self._error: bytes | None = None  # a refusal owed after earlier responses (b"": only close)
        self._refusal: Refusal | None = None  # set by a parser callback that refuses the request
        self._flushed = False  # the refusal is written; reading and dropping until the close
        self._eof = False  # the client sent all it will
        self._running: Any = None  # the RequestResponseCycle whose app task runs now
        self._over_cap = False  # opened past max_connections
        self._phase, self._since, self._last_read = _NEW, 0.0, 0.0
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = math.inf
        self._head_bytes = 0  # bytes of the current head fed to the parser
        self._tail = b""  # the last 2 bytes fed in the head phase (an empty line may straddle reads)
        self._framing = 0  # body-phase bytes fed minus body bytes: chunk framing, extensions, trailers
        self._chunks = 0
        self._completed = False  # a message completed inside the current parser feed
        self._feeding_body = False  # the current parser feed began inside a body
        self._start = b""  # a read that began a request: its request line, for a 501

    # --- transport events ----------------------------------------------------------------
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._since = self.loop.time()
        self._over_cap = len(self.connections) > self.limits.max_connections
        if self._over_cap and self._since - HttpProtocol._cap_warned_at >= CAP_WARNING_EVERY_S:
            HttpProtocol._cap_warned_at = self._since
            log.warning("%d open connections, past --max-connections %d: new clients are answered 503",
                        len(self.connections), self.limits.max_connections)
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._error is not None:  # refused: the parser's state is gone; drop what still comes
            return
        self._unset_keepalive_if_required()
        self._last_read = self.loop.time()
        if self._phase == _NEW or self._phase == _REST:  # the first byte of a request (or of a preamble)
            self._phase, self._since = _HEAD, self._last_read
        if not self._in_message:
            self._start = data
        limit = self.limits.max_header_bytes
        while data:
            in_body = self._in_message and self._head_done
            if in_body:
                # At most what is left of the framing budget: a slice that ends the message is not
                # counted below, so a whole read of trailers would otherwise pass unseen.
                room = max(limit + _CHUNK_OVERHEAD * self._chunks - self._framing, _BODY_SLICE_MIN)
                piece, data = (data, b"") if room >= len(data) else (data[:room], data[room:])
            else:  # a head is fed at most up to its limit, and up to its end: what follows is body
                room = limit - self._head_bytes
                if room <= 0:
                    self._refuse_long_head()
                    return
                # at least one byte: a blank line wholly inside the stale tail must not stall the loop
                room = min(room, len(data), max(1, _head_end(self._tail, data)))
                piece, data = data[:room], data[room:]
                self._tail = (self._tail + piece)[-2:]
            self._completed = False
            self._feeding_body = in_body
            try:
                self.parser.feed_data(piece)
            except httptools.HttpParserUpgrade:  # served as a plain request (RFC 9110 §7.8), as uvicorn does
                return
            except httptools.HttpParserError as e:
                self._refuse(self._parse_refusal(e))
                return
            if self._completed:
                # A message ended inside the piece; a head that began after it (pipelining) is
                # counted from the next piece on: one piece more at most.
                continue
            if in_body:
                self._framing += len(piece)
                if self._framing > limit + _CHUNK_OVERHEAD * self._chunks:
                    self._refuse(Refusal(431, f"the chunked body's extensions and trailer fields exceed {limit} bytes "
                                              "(--max-header-bytes)", "request_header_fields_too_large"))
                    return
            elif not (self._in_message and self._head_done):  # still in the head
                self._head_bytes += len(piece)
        if self._phase == _HEAD or self._phase == _BODY:
            self._arm()

    def eof_received(self) -> bool | None:
        """The client sent all it will (a close or a half-close). True keeps the transport open
        for the responses still owed; None lets asyncio close it."""
        self._eof = True
        if self._error is not None:
            return None if self._flushed else True
        if self._in_message and self._head_done:  # the body stopped short
            cycle = self.cycle
            cycle.scope.setdefault("extensions", {})[TRUNCATED] = {}  # type: ignore[typeddict-item]
            cycle.more_body = False
            cycle.keep_alive = False
            cycle.message_event.set()
            return True
        if self._in_message:  # inside the request line or headers
            self._refuse(bad_request("the connection ended inside a request's headers", "incomplete_request"))
            return True
        # Between requests: the client is gone (a close and a half-close look alike here). Closing
        # lets the routes' disconnect watcher cancel the work still running for it (front.py).
        return None

    # --- parser callbacks ----------------------------------------------------------------
    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_message, self._head_done, self._head_parsed = True, False, False
        self._head_bytes = self._framing = self._chunks = 0
        if self._phase != _HEAD:
            self._phase, self._since = _HEAD, self._last_read

    def on_headers_complete(self) -> None:
        # Field lines are counted here: until now their memory was bounded by max_header_bytes.
        self._head_parsed = True
        refusal = self._cap_refusal() if self._over_cap else None
        if refusal is None and len(self.headers) > self.limits.max_header_count:
            refusal = self._count_refusal()
        if refusal is None:
            refusal = check_head(self.parser.get_method(), self.parser.get_http_version(), self.url, self.headers)
        if refusal is None and self.limits.max_body_bytes:
            refusal = self._body_refusal()
        if refusal is not None:
            self._refusal = refusal
            raise _Refused
        super().on_headers_complete()
        version = self.scope["http_version"]
        if version != "1.1" and version != "1.0":
            self.scope["http_version"] = "1.1"  # a later 1.x minor is served as 1.1 (RFC 9112 §2.3)
        self._head_done = True
        self._phase, self._since = _BODY, self._last_read

    def on_body(self, body: bytes) -> None:
        if self._feeding_body:  # of a piece counted in _framing
            self._framing -= len(body)
        super().on_body(body)

    def on_chunk_header(self) -> None:
        self._chunks += 1

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._in_message = False
        self._completed, self._start = True, b""
        self._phase = _REST

    # --- uvicorn hooks -------------------------------------------------------------------
    def _start_asgi_task(self, cycle: Any, app: Any) -> None:
        self._running = cycle  # uvicorn runs one cycle at a time; later ones wait in the pipeline
        super()._start_asgi_task(cycle, _server_options if cycle.scope["path"] == "*" else app)

    def _should_upgrade(self) -> bool:
        return False  # no WebSocket routes: an Upgrade header is ignored and the request served (RFC 9110 §7.8)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self._error is not None:
            self._flush_if_idle()

    # --- deadlines -----------------------------------------------------------------------
    def _deadline(self) -> tuple[float, str] | None:
        """When the current phase ends, and which limit ends it."""
        lim, phase = self.limits, self._phase
        if phase == _NEW:
            return self._since + lim.connect_idle_s, "--timeout-connect-idle"
        if phase == _REST:
            return None
        whole = (self._since + lim.headers_s, "--timeout-headers") if phase == _HEAD else \
            (self._since + lim.body_s, "--timeout-body")
        return min(whole, (self._last_read + lim.read_gap_s, "--timeout-read-gap"))

    def _arm(self) -> None:
        """Make sure a timer fires by the current deadline. Timers are re-checked when they fire
        (``_expire``), so a later deadline needs no new timer: at most one per phase change."""
        deadline = self._deadline()
        if deadline is not None and deadline[0] < self._timer_at:
            if self._timer is not None:
                self._timer.cancel()
            self._timer_at = deadline[0]
            self._timer = self.loop.call_at(deadline[0], self._expire)

    def _expire(self) -> None:
        self._timer, self._timer_at = None, math.inf
        deadline = self._deadline()
        if deadline is None or self._error is not None or self.transport.is_closing():
            return
        now = self.loop.time()
        if now < deadline[0]:
            self._arm()
            return
        if self.flow.read_paused:  # the gateway stopped reading, not the client: start the clock again
            self._since = self._last_read = now
            self._arm()
            return
        if self._phase == _NEW:  # never sent a byte: nothing to answer
            self.transport.close()
            return
        part = "header section" if self._phase == _HEAD else "body"
        flag = deadline[1]
        limit = {"--timeout-headers": self.limits.headers_s, "--timeout-body": self.limits.body_s,
                 "--timeout-read-gap": self.limits.read_gap_s}[flag]
        what = "a pause longer than" if flag == "--timeout-read-gap" else "not complete within"
        self._refuse(Refusal(408, f"the request's {part} came too slowly: {what} {limit:g} s ({flag})", "request_timeout"))

    # --- refusals ------------------------------------------------------------------------
    def _cap_refusal(self) -> Refusal:
        cap = self.limits.max_connections
        return Refusal(503, f"the server holds its limit of {cap} open connections (--max-connections); retry shortly",
                       "too_many_connections", {"Retry-After": "1"})

    def _count_refusal(self) -> Refusal:
        return Refusal(431, f"the request has more than {self.limits.max_header_count} header field lines "
                            "(--max-header-count)", "request_header_fields_too_large")

    def _body_refusal(self) -> Refusal | None:
        limit = self.limits.max_body_bytes
        for name, value in self.headers:
            if name == b"content-length" and int(value) > limit:  # llhttp parsed it: plain digits
                return Refusal(413, f"request body of {int(value)} bytes exceeds the limit of {limit} bytes "
                                    f"{BODY_LIMIT_FLAGS}", "payload_too_large")
        return None

    def _refuse_long_head(self) -> None:
        limit = self.limits.max_header_bytes
        fields = getattr(self, "headers", None) or []
        if len(fields) > self.limits.max_header_count:
            self._refuse(self._count_refusal())
        elif not fields and len(getattr(self, "url", b"")) > self._head_bytes // 2:
            self._refuse(Refusal(414, f"the request target exceeds {limit} bytes (--max-header-bytes)", "uri_too_long"))
        else:
            self._refuse(Refusal(431, f"the request's header section exceeds {limit} bytes (--max-header-bytes)",
                                 "request_header_fields_too_large"))

    def _parse_refusal(self, e: httptools.HttpParserError) -> Refusal:
        if self._refusal is not None:  # a callback refused (_Refused)
            return self._refusal
        line = _REQUEST_LINE.match(self._start[:512].lstrip(b"\r\n"))
        if isinstance(e, httptools.HttpParserInvalidMethodError) and line is not None:
            method = line.group(1).decode()
            return Refusal(501, f"method {method!r} is not implemented (methods are case-sensitive; RFC 9110 §9.1)",
                           "not_implemented")
        if self.parser.get_method() == b"PRI":  # the HTTP/2 connection preface (RFC 9113 §3.4)
            return Refusal(505, "HTTP/2 is not supported on this port; send HTTP/1.1", "http_version_not_supported")
        return bad_request("malformed HTTP request: its request line, a header or its framing (Content-Length, "
                           "Transfer-Encoding, chunks) could not be parsed (RFC 9112)")

    def _refuse(self, refusal: Refusal) -> None:
        """Answer ``refusal`` once the responses owed before it are sent, then close (lingering)."""
        log.debug("refused %s (%s): %s", self.client, refusal.status, refusal.message)
        # The client's X-Request-Id once its head was parsed; before that, none is trusted.
        rid = request_headers(self.headers)[0] if self._head_parsed else new_request_id()
        path = self._path()
        self.refusals.record(refusal.status, refusal.code, path, rid)
        self._error = error_bytes(refusal.status, refusal.message, refusal.code, path, refusal.headers, rid)
        if self._in_message and self._head_done:
            # The bad message already has a cycle (the error is in its body): it never reaches the app.
            bad = self.cycle
            if bad.response_started:  # it has its answer already: only close once that is sent
                self._error = b""
            else:
                for entry in list(self.pipeline):
                    if entry[0] is bad:
                        self.pipeline.remove(entry)
                if self._running is bad:
                    bad.disconnected = True
                    bad.message_event.set()
        self._flush_if_idle()

    def _path(self) -> str:
        url: bytes = getattr(self, "url", b"") or b""
        return url.split(b"?", 1)[0].decode("latin-1", "replace")

    def _owes_response(self) -> bool:
        """A response to an earlier request is still being produced or waits in the pipeline."""
        run = self._running
        return bool(self.pipeline) or (run is not None and not run.response_complete and not run.disconnected)

    def _flush_if_idle(self) -> None:
        if self._error is None or self._flushed or self._owes_response() or self.transport.is_closing():
            return
        self._flushed = True
        if self._error:
            self.transport.write(self._error)
        if self._eof or not self.transport.can_write_eof():
            self.transport.close()
            return
        self.transport.write_eof()  # FIN after the answer; keep reading (and dropping) for a while
        self.flow.resume_reading()
        self.loop.call_later(self.limits.linger_s, self.transport.close)
