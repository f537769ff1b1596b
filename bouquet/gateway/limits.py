"""The HTTP front end's own limits, which protocol.py enforces before a request reaches the app.

A client that connects and sends nothing, sends its head or body a byte at a time, sends a head
that never ends, or holds thousands of connections open costs the gateway a file descriptor and
memory each for as long as it likes unless the server bounds it. The values come from ServeConfig
(``--timeout-connect-idle``, ``--timeout-headers``, ``--timeout-body``, ``--timeout-read-gap``,
``--max-header-bytes``, ``--max-header-count``, ``--max-connections``; docs/deploy.md) and reach
each gateway process's protocol instances through the uvicorn config (``GatewayConfig``), which
uvicorn pickles into its worker processes.

What it does not own: the keep-alive wait between requests (uvicorn's ``timeout_keep_alive``), the
size of a body as it is read (``--max-request-bytes``, checked by the routes: http.py; only an
announced Content-Length past it is refused here).
"""
from __future__ import annotations

import logging
import resource
import sys
from dataclasses import dataclass
from typing import Any

import uvicorn

from bouquet.config import ServeConfig
from bouquet.gateway.refusals import Refusals, find_refusals

log = logging.getLogger("bouquet")

# File descriptors kept free beside the client connections: the listener, the event loop's own,
# one or two per replica (Unix socket or gRPC), logs, metrics files. 24 are open in a one-replica
# gateway; accept() failing with EMFILE makes uvloop close new connections unanswered.
FD_RESERVE = 128


@dataclass(frozen=True)
class HttpLimits:
    """Per-connection deadlines (seconds) and sizes, and the open-connection cap of one process."""

    connect_idle_s: float  # a new connection's wait for its first byte; then closed unanswered
    headers_s: float  # first byte of a request → end of its head; then 408
    body_s: float  # end of the head → end of the body; then 408
    read_gap_s: float  # the longest silence inside a request (head or body); then 408
    max_header_bytes: int  # request line + field lines; past it 431 (414 when the target is most of it)
    max_header_count: int  # field lines of the head; past it 431
    max_connections: int  # open connections; past it a new connection's request gets 503 + Retry-After
    # After a refusal the answer is written, the sending side shut down, and what the client still
    # sends is read and dropped for up to this long before the connection is closed (protocol.py).
    linger_s: float = 2.0
    # --max-request-bytes: a Content-Length past it is answered 413 before any of the body is read,
    # and the connection closed (lingering), instead of reading (or waiting for) the body (0: unchecked)
    max_body_bytes: int = 0

    @classmethod
    def from_config(cls, cfg: ServeConfig, max_connections: int | None = None) -> "HttpLimits":
        return cls(cfg.timeout_connect_idle, cfg.timeout_headers, cfg.timeout_body, cfg.timeout_read_gap,
                   cfg.max_header_bytes, cfg.max_header_count,
                   cfg.max_connections if max_connections is None else max_connections,
                   max_body_bytes=cfg.request_bytes_limit)


class GatewayConfig(uvicorn.Config):
    """uvicorn's config plus the HTTP limits, which the protocol of every connection reads
    (``config.http_limits``); a module-level class, so it pickles into ``--gateway-workers`` processes."""

    def __init__(self, app: Any, http_limits: HttpLimits, **kwargs: Any) -> None:
        super().__init__(app, **kwargs)
        self.http_limits = http_limits
        self.http_refusals: Refusals | None = None

    def load(self) -> None:
        """uvicorn's load, then the app's refusal counter and log (refusals.py) for the protocol:
        in a ``--gateway-workers`` process the app is built here, by the factory.

        An app that cannot be built (a dependency that fails to import, a broken tokenizer) ends
        the worker with uvicorn's ``STARTUP_FAILURE`` code, which stops the supervisor
        (``DrainingSupervisor.startup_failed``): uvicorn itself gives that code only to a factory's
        TypeError, and restarts a worker that exits with any other, so such a server would respawn
        its workers forever and never answer."""
        try:
            super().load()
        except Exception:  # noqa: BLE001 - whatever it is, every restart would fail the same way
            if not self.factory:  # one gateway process: the app was built by the launcher, which reports
                raise
            log.exception("gateway worker: the app could not be built")
            sys.exit(uvicorn.config.STARTUP_FAILURE)
        self.http_refusals = find_refusals(self.loaded_app)


def fit_connections(max_connections: int, reserve: int = FD_RESERVE) -> int:
    """Raise this process's soft ``RLIMIT_NOFILE`` (children inherit it) so that ``max_connections``
    client connections fit beside ``reserve`` other descriptors, as far as the hard limit allows.

    Returns the connection cap that fits: ``max_connections``, or less (at least 1, logged as a
    warning) when the hard limit is lower. Past the cap clients are answered 503; past the
    descriptor limit they would be dropped without an answer.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = max_connections + reserve
    if soft != resource.RLIM_INFINITY and soft < want:
        soft = want if hard == resource.RLIM_INFINITY else min(want, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    if soft == resource.RLIM_INFINITY or soft >= want:
        return max_connections
    fits = max(1, soft - reserve)
    log.warning("--max-connections %d does not fit the open-file limit %d (ulimit -n; %d kept for the "
                "gateway itself): capping at %d connections per gateway process", max_connections, soft, reserve, fits)
    return fits
