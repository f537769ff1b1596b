"""The HTTP front end's own refusals (protocol.py: 400, 408, 413, 414, 431, 501, 503, 505 answered
before a request reaches the app): counted and logged like the app's answers (docs/api.md).

Each refusal increments ``bouquet_http_refusals_total{status, code}`` (metrics.py) and writes one
INFO line to ``bouquet.access`` with its status, code, path and request id. Lines are rate-limited
per process (``LINES_PER_S`` a second) so a flood of bad requests cannot fill the log; the
refusals left out are counted and summarised in one line when the next second's first refusal
arrives (the counter has them all at once).

What it does not own: deciding or answering a refusal (protocol.py), the metric's definition
(metrics.py). The protocol finds the app's instance through ``GatewayConfig.load`` (limits.py).
"""
from __future__ import annotations

import logging
import time
from typing import Any, Callable

access_log = logging.getLogger("bouquet.access")
LINES_PER_S = 20  # log lines per second per process; the rest are counted and summarised


class Refusals:
    """Counts (``counter``: a prometheus_client Counter labelled status, code; None: not counted)
    and logs refusals; ``clock``: seconds, monotonic."""

    def __init__(self, counter: Any = None, lines_per_s: int = LINES_PER_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.counter = counter
        self.lines_per_s = lines_per_s
        self.clock = clock
        self._children: dict[tuple[int, str], Any] = {}
        self._window = -1.0  # start of the current one-second window
        self._lines = 0  # lines written in it
        self._left_out = 0  # refusals not logged since the last summary

    def record(self, status: int, code: str, path: str, request_id: bytes) -> None:
        """Count one refusal and log it unless this second's lines are spent."""
        if self.counter is not None:
            key = (status, code)
            child = self._children.get(key)
            if child is None:
                child = self._children[key] = self.counter.labels(str(status), code)
            child.inc()
        now = self.clock()
        if now - self._window >= 1.0:
            if self._left_out:
                access_log.info("refused %d more requests in the protocol without a log line "
                                "(at most %d lines a second; bouquet_http_refusals_total counts all)",
                                self._left_out, self.lines_per_s)
            self._window, self._lines, self._left_out = now, 0, 0
        if self._lines >= self.lines_per_s:
            self._left_out += 1
            return
        self._lines += 1
        # the path as sent, at most 200 characters: it is the client's text
        access_log.info("refused %.200r %d %s request_id=%s", path, status, code,
                        request_id.decode("latin-1"))


def find_refusals(app: Any) -> Refusals | None:
    """The ``refusals`` of ``app`` or of an app it wraps (``.app``: uvicorn's and Starlette's
    middlewares), or None."""
    for _ in range(8):  # a few wrappers at most
        found = getattr(app, "refusals", None)
        if isinstance(found, Refusals):
            return found
        app = getattr(app, "app", None)
        if app is None:
            return None
    return None
