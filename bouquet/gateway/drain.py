"""Graceful shutdown of the gateway: a drain phase between SIGTERM and exit.

uvicorn on its own closes the listening socket at SIGTERM, so a client that connects during
shutdown is refused at the TCP level and cannot tell "going away" from "crashed". Here SIGTERM
first flips the gateway to *draining*: requests already running finish; new ones (``/health``
included, so load balancers take this instance out) get 503 in the API's error shape with
``Retry-After``; once nothing is in flight, or after ``timeout_s``, uvicorn's normal shutdown
runs and the launcher then stops the replicas. Requests still running at ``timeout_s`` are cancelled
and answered 503 too (not left to uvicorn, whose own cancellation answers a plain-text 500). A
second SIGINT/SIGTERM ends the drain at once (what is in flight is answered 503, then it exits).

Two ways in: the single-process gateway runs ``DrainingServer``; each ``--gateway-workers`` process
(run by ``DrainingSupervisor``, which sends it SIGTERM) calls ``DrainState.take_signals`` at start-up.

What this module does not own: stopping replicas (launcher.py), draining inside a replica
(server/service.py ``drain``).
"""
from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
from types import FrameType
from typing import Any, Callable

import uvicorn
from uvicorn.config import STARTUP_FAILURE
from uvicorn.supervisors import Multiprocess

log = logging.getLogger("bouquet")


class DrainState:
    """Requests in flight and whether the gateway is draining; shared by the front (front.py,
    which counts requests and answers 503 while draining) and the server below."""

    def __init__(self, timeout_s: float, retry_after_s: int = 5, cancel_grace_s: float = 2.0) -> None:
        self.timeout_s, self.retry_after_s, self.cancel_grace_s = timeout_s, retry_after_s, cancel_grace_s
        self.inflight = 0
        self.deadline: float | None = None  # set when draining starts
        self.expired = False  # past the deadline: the requests still running were cancelled
        self.cut_short = False  # the deadline was brought forward by a second signal (expire_now)
        # The tasks of the POST requests running now (front.py adds and removes them): cancelled at
        # the deadline, and each answers 503 itself.
        self.tasks: set[asyncio.Task[Any]] = set()
        self._watch: asyncio.Task[None] | None = None  # take_signals: waits for done(), then exits

    @property
    def draining(self) -> bool:
        return self.deadline is not None

    def start(self) -> None:
        if self.deadline is None:
            self.deadline = time.monotonic() + self.timeout_s
            log.info("draining: %d request(s) in flight, waiting up to %g s (a second Ctrl-C or SIGTERM ends it now)",
                     self.inflight, self.timeout_s)

    def expire_now(self) -> None:
        """A second signal: end the drain now; the requests in flight are answered 503 (``done``)."""
        now = time.monotonic()
        if self.deadline is None or self.deadline > now:
            self.deadline = now
            self.cut_short = True

    def done(self) -> bool:
        """True once draining and either idle, or past the deadline by ``cancel_grace_s`` (the
        requests cancelled at the deadline have answered by then)."""
        if self.deadline is None:
            return False
        if not self.inflight:
            return True
        now = time.monotonic()
        if now < self.deadline:
            return False
        if not self.expired:
            self.expired = True
            log.warning("drain %s with %d request(s) still in flight: answering them 503",
                        "ended by a second signal" if self.cut_short else "timeout", self.inflight)
            for task in self.tasks:
                task.cancel()
            return False
        return now >= self.deadline + self.cancel_grace_s

    def take_signals(self) -> None:
        """In a gateway worker process, on its running event loop: the first SIGTERM starts the
        drain, and uvicorn's own handler (which closes the listener) runs once ``done()``; a second
        one goes to uvicorn's handler at once. Replaces the handler uvicorn.Server installed (it
        uses ``signal.signal``, so it is there to wrap). SIGINT is ignored: Ctrl-C reaches the
        whole process group, and the supervisor relays it to each worker as SIGTERM (a SIGINT
        here too would be the second signal that cuts the drain short). A second SIGTERM ends
        the drain at once (``expire_now``)."""
        loop = asyncio.get_running_loop()
        uvicorn_exit = signal.getsignal(signal.SIGTERM)
        if not callable(uvicorn_exit):
            return  # not run by uvicorn.Server (tests, other servers): leave signals alone
        signal.signal(signal.SIGINT, signal.SIG_IGN)

        def on_sigterm(signum: int, frame: FrameType | None) -> None:
            if self.draining:
                self.expire_now()  # the watcher below then exits through uvicorn's handler
                return
            self.start()
            loop.call_soon_threadsafe(self._watch_drain, uvicorn_exit, signum)

        signal.signal(signal.SIGTERM, on_sigterm)
        # Checked after on_sigterm is in place, so that no signal falls between the two: one that
        # came before went to uvicorn's handler, and uvicorn exits after start-up.
        if getattr(getattr(uvicorn_exit, "__self__", None), "should_exit", False):
            self.start()

    def _watch_drain(self, exit_: Callable[..., Any], signum: int) -> None:
        self._watch = asyncio.get_running_loop().create_task(self._exit_when_done(exit_, signum))  # kept: the loop holds tasks weakly

    async def _exit_when_done(self, exit_: Callable[..., Any], signum: int) -> None:
        while not self.done():
            await asyncio.sleep(0.1)
        exit_(signum, None)


class DrainingServer(uvicorn.Server):
    """uvicorn.Server whose first SIGTERM/SIGINT starts a drain instead of closing the listener."""

    def __init__(self, config: uvicorn.Config, state: DrainState) -> None:
        super().__init__(config)
        self.drain = state

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        # The signal is not recorded for uvicorn to re-raise after shutdown: that would kill this
        # process before the launcher stops its replicas; the launcher exits normally instead.
        if self.drain.draining:  # a second signal: stop now; what is in flight is answered 503 first
            self.drain.expire_now()
            return
        self.drain.start()

    async def on_tick(self, counter: int) -> bool:
        # uvicorn calls this every 0.1 s from its main loop; True ends the loop (normal shutdown).
        if self.drain.done():
            self.should_exit = True
        return await super().on_tick(counter)


class DrainingSupervisor(Multiprocess):
    """uvicorn's worker supervisor (``--gateway-workers``) that also relays a second SIGINT/SIGTERM
    to the workers while they drain. uvicorn's own stops reading signals once it has sent each
    worker its first SIGTERM and only waits for them, so the second signal, which should end
    the drain at once (``take_signals``), never reached a worker: they drained to the end.

    The base class queues signals from its handlers and runs ``handle_int`` / ``handle_term`` for
    them in its loop; both are counted here, and ``join_all`` keeps reading the queue."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.exit_signals = 0  # SIGINT/SIGTERM received (Ctrl-C reaches this process as SIGINT)

    def stopping(self) -> bool:
        """A SIGINT/SIGTERM has arrived: handled, or still in the queue the loop reads every 0.5 s."""
        return self.exit_signals > 0 or any(s in (signal.SIGINT, signal.SIGTERM) for s in list(self.signal_queue))

    def startup_failed(self) -> bool:
        """A worker exited with uvicorn's ``STARTUP_FAILURE`` (its app could not be built or started:
        ``GatewayConfig.load``, the lifespan), which made the supervisor stop the others."""
        return any(p.process.exitcode == STARTUP_FAILURE for p in self.processes)

    def handle_int(self) -> None:
        self.exit_signals += 1
        super().handle_int()

    def handle_term(self) -> None:
        self.exit_signals += 1
        super().handle_term()

    def join_all(self) -> None:
        relayed = min(self.exit_signals, 1)  # the signal terminate_all passed on (0: stopped from code)
        while alive := [p.process for p in self.processes if p.process.is_alive()]:
            # only SIGINT/SIGTERM now: SIGTTIN would start a worker that no one stops, SIGHUP a restart
            for sig in list(self.signal_queue):
                self.signal_queue.remove(sig)
                if sig in (signal.SIGINT, signal.SIGTERM):
                    self.exit_signals += 1
            if self.exit_signals > relayed:
                relayed = self.exit_signals
                for proc in alive:
                    if proc.pid is not None:
                        os.kill(proc.pid, signal.SIGTERM)
            alive[0].join(0.1)
