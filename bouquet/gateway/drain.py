"""Graceful shutdown of the gateway: a drain phase between SIGTERM and exit.

uvicorn on its own closes the listening socket at SIGTERM, so a client that connects during
shutdown is refused at the TCP level and cannot tell "going away" from "crashed". Here SIGTERM
first flips the gateway to *draining*: requests already running finish; new ones (``/health``
included, so load balancers take this instance out) get 503 in the API's error shape with
``Retry-After``; once nothing is in flight, or after ``timeout_s``, uvicorn's normal shutdown
runs and the launcher then stops the replicas. A second SIGINT/SIGTERM exits at once.

What this module does not own: stopping replicas (launcher.py), draining inside a replica
(server/service.py ``drain``).
"""
from __future__ import annotations

import logging
import time
from types import FrameType

import uvicorn

log = logging.getLogger("bouquet")


class DrainState:
    """Requests in flight and whether the gateway is draining; shared by the front (front.py,
    which counts requests and answers 503 while draining) and the server below."""

    def __init__(self, timeout_s: float, retry_after_s: int = 5) -> None:
        self.timeout_s, self.retry_after_s = timeout_s, retry_after_s
        self.inflight = 0
        self.deadline: float | None = None  # set when draining starts

    @property
    def draining(self) -> bool:
        return self.deadline is not None

    def start(self) -> None:
        if self.deadline is None:
            self.deadline = time.monotonic() + self.timeout_s
            log.info("bouquet: draining: %d request(s) in flight, waiting up to %.0f s", self.inflight, self.timeout_s)

    def done(self) -> bool:
        """True once draining and either idle or past the deadline."""
        if self.deadline is None:
            return False
        if self.inflight and time.monotonic() < self.deadline:
            return False
        if self.inflight:
            log.warning("bouquet: drain timeout with %d request(s) still in flight", self.inflight)
        return True


class DrainingServer(uvicorn.Server):
    """uvicorn.Server whose first SIGTERM/SIGINT starts a drain instead of closing the listener."""

    def __init__(self, config: uvicorn.Config, state: DrainState) -> None:
        super().__init__(config)
        self.drain = state

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        # The signal is not recorded for uvicorn to re-raise after shutdown: that would kill this
        # process before the launcher stops its replicas; the launcher exits normally instead.
        if self.drain.draining:  # a second signal: stop now, without waiting for open connections
            self.should_exit = self.force_exit = True
            return
        self.drain.start()

    async def on_tick(self, counter: int) -> bool:
        # uvicorn calls this every 0.1 s from its main loop; True ends the loop (normal shutdown).
        if self.drain.done():
            self.should_exit = True
        return await super().on_tick(counter)
