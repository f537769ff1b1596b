"""uvicorn's httptools protocol, with the errors it answers itself kept inside the API's contract.

uvicorn answers a request it cannot parse (a bad ``Content-Length``, a malformed header or
request line) with a plain-text 400 and closes the connection at once, and it closes the
connection when the client half-closes it (``shutdown(SHUT_WR)``) in the middle of a request.
Both cost neighbours their answers: a pipelined request that came before the bad one loses its
response. This subclass

- answers parse errors in the API's JSON error shape (OpenAI on ``/v1/*``, TEI elsewhere:
  errors.py), after every response owed to earlier requests on the connection has been sent;
- on end of input inside a request, finishes the responses owed to the complete requests before
  it, then answers the cut one: a body shorter than its ``Content-Length`` reaches the app with
  the bytes that came and ``scope["extensions"]["bouquet.body_truncated"]``, so the route layer
  answers a JSON 400 (http.py ``read_body``); one cut inside its headers gets a JSON 400 here.
  End of input between requests still closes the connection at once, as uvicorn does: a close
  and a half-close look alike there, and a client that went away must have its work cancelled.

What it does not own: anything after a request is parsed (front.py), the status of bodies that
parse (http.py). It overrides only uvicorn's protocol callbacks (``data_received``,
``eof_received``, ``on_message_*``, ``on_response_complete``, ``send_400_response``); the
uvicorn range in pyproject.toml is the one its tests ran against.
"""
from __future__ import annotations

from http import HTTPStatus
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from bouquet.gateway.errors import APIError
from bouquet.gateway.http import TRUNCATED
from bouquet.gateway.tracing import new_request_id


def error_bytes(status: int, message: str, code: str, path: str) -> bytes:
    """A whole HTTP/1.1 error response (JSON body in the family's shape, ``connection: close``)."""
    response = APIError(status, message, None, code).response_for(path)
    head = [f"HTTP/1.1 {status} {HTTPStatus(status).phrase}".encode()]
    head += [k + b": " + v for k, v in response.raw_headers]
    head.append(b"x-request-id: " + new_request_id())  # no request was parsed: never the client's
    head.append(b"connection: close")
    return b"\r\n".join(head) + b"\r\n\r\n" + response.body


class HttpProtocol(HttpToolsProtocol):
    """``http=`` class for uvicorn (launcher.py); see the module docstring."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._in_message = False  # between on_message_begin and on_message_complete
        self._head_done = False  # the message being parsed has its cycle (headers complete)
        self._error: bytes | None = None  # a parse-error answer owed after earlier responses
        self._running: Any = None  # the RequestResponseCycle whose app task runs now

    # --- parser callbacks: track where the current message stands -----------------------
    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_message, self._head_done = True, False

    def on_headers_complete(self) -> None:
        super().on_headers_complete()
        self._head_done = True

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._in_message = False

    # --- transport events ----------------------------------------------------------------
    def data_received(self, data: bytes) -> None:
        if self._error is None:  # after a parse error the parser's state is gone: read no more
            super().data_received(data)

    def _start_asgi_task(self, cycle: Any, app: Any) -> None:
        self._running = cycle  # uvicorn runs one cycle at a time; later ones wait in the pipeline
        super()._start_asgi_task(cycle, app)

    def send_400_response(self, msg: str) -> None:
        """Called by uvicorn on a parse error of the message now being read."""
        self._error = error_bytes(400, "malformed HTTP request: its request line, a header or its Content-Length "
                                       "could not be parsed (RFC 9112)", "invalid_http_request", self._path())
        if self._in_message and self._head_done:
            # The bad message already has a cycle (the error is in its body): it never reaches the app.
            bad = self.cycle
            for entry in list(self.pipeline):
                if entry[0] is bad:
                    self.pipeline.remove(entry)
            if self._running is bad:
                bad.disconnected = True
                bad.message_event.set()
        self._flush_if_idle()

    def eof_received(self) -> bool | None:
        """The client sent all it will (a close or a half-close). True keeps the transport open
        for the responses still owed; None lets asyncio close it."""
        if self._error is not None:
            return True
        if self._in_message and self._head_done:  # the body stopped short
            cycle = self.cycle
            cycle.scope.setdefault("extensions", {})[TRUNCATED] = {}  # type: ignore[typeddict-item]
            cycle.more_body = False
            cycle.keep_alive = False
            cycle.message_event.set()
            return True
        if self._in_message:  # inside the request line or headers
            self._error = error_bytes(400, "the connection ended inside a request's headers", "incomplete_request",
                                      self._path())
            self._flush_if_idle()
            return True
        # Between requests: the client is gone (a close and a half-close look alike here). Closing
        # lets the routes' disconnect watcher cancel the work still running for it (front.py).
        return None

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self._error is not None:
            self._flush_if_idle()

    def _path(self) -> str:
        url: bytes = getattr(self, "url", b"") or b""
        return url.split(b"?", 1)[0].decode("latin-1", "replace")

    def _owes_response(self) -> bool:
        """A response to an earlier request is still being produced or waits in the pipeline."""
        run = self._running
        return bool(self.pipeline) or (run is not None and not run.response_complete and not run.disconnected)

    def _flush_if_idle(self) -> None:
        if self._error is not None and not self._owes_response() and not self.transport.is_closing():
            self.transport.write(self._error)
            self.transport.close()
