"""A closed-loop HTTP load generator that spends little CPU: benchmark 5 ("queries") and the
serving-path scripts in bench/.

Each client is one keep-alive HTTP/1.1 connection that sends a request, waits for the whole
reply, and sends the next; clients run in separate processes (``processes``; by default one per
client, as independent users would), each on its own uvloop event loop. Replies are parsed by
``httptools`` (llhttp, the parser uvicorn uses), so a request costs the client ~20-30 µs of CPU
instead of the ~160 µs of ``http.client`` + orjson measured on the CI machine — on a machine
shared with the server, a heavy client is measured as the server's time. Only what the
benchmark needs: POST bodies prepared in advance, ``Content-Length`` or chunked replies, no
redirects, no TLS.

Clocks: every process times with ``time.monotonic()`` (system-wide on Linux), so the parent
passes absolute window bounds: requests sent in [``t_warm``, ``t0``) are untimed warm-up, replies
that finish in [``t0``, ``t1``) are counted.
"""
from __future__ import annotations

import asyncio
import multiprocessing
import time
from dataclasses import dataclass, field
from typing import Any

import httptools


@dataclass
class LoadResult:
    """What one process (or, merged, all of them) measured in the timed window.

    ``latencies``: seconds from send to the reply's last byte; ``samples``: the first 200 reply
    body for each request index (for checking); ``cpu_s``: CPU seconds of the client processes
    over the window."""

    latencies: list[float] = field(default_factory=list)
    statuses: dict[int, int] = field(default_factory=dict)
    samples: dict[int, bytes] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    cpu_s: float = 0.0

    @property
    def first_body(self) -> bytes:
        """One 200 reply's body (b"" when none came back)."""
        return next(iter(self.samples.values()), b"")

    def merge(self, other: "LoadResult") -> None:
        self.latencies += other.latencies
        for k, v in other.statuses.items():
            self.statuses[k] = self.statuses.get(k, 0) + v
        for k, v in other.samples.items():
            self.samples.setdefault(k, v)
        self.errors += other.errors
        self.cpu_s += other.cpu_s


class _Connection(asyncio.Protocol):
    """One keep-alive connection; ``request(raw)`` sends a complete request and returns
    (status, body) once the reply has been parsed."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.body: list[bytes] = []
        self.waiter: asyncio.Future[tuple[int, bytes]] | None = None

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as e:
            if self.waiter is not None and not self.waiter.done():
                self.waiter.set_exception(e)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(ConnectionError(f"connection closed: {exc}"))

    # httptools callbacks
    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result((self.parser.get_status_code(), b"".join(self.body)))
        self.body = []

    async def request(self, raw: bytes) -> tuple[int, bytes]:
        self.waiter = asyncio.get_running_loop().create_future()
        self.transport.write(raw)  # type: ignore[union-attr]
        return await self.waiter


class BlockingConnection:
    """One keep-alive connection used synchronously (one request at a time, any thread that holds
    it): the benchmark clients of benchmarks 1-4, parsed by httptools like the load generator's.
    ``request(raw)`` → (status, body). Raises ConnectionError when the server closes the connection
    and TimeoutError past ``timeout`` seconds."""

    def __init__(self, host: str, port: int, timeout: float = 600.0) -> None:
        import socket

        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.timeout = timeout
        self.parser = httptools.HttpResponseParser(self)
        self.body: list[bytes] = []
        self.done = False

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        self.done = True

    def request(self, raw: bytes, timeout: float | None = None) -> tuple[int, bytes]:
        if timeout is not None and timeout != self.timeout:
            self.timeout = timeout
            self.sock.settimeout(timeout)
        self.sock.sendall(raw)
        self.done, self.body = False, []
        while not self.done:
            data = self.sock.recv(1 << 20)
            if not data:
                raise ConnectionError("the server closed the connection")
            self.parser.feed_data(data)
        return self.parser.get_status_code(), b"".join(self.body)

    def close(self) -> None:
        self.sock.close()


def get_request(host: str, port: int, path: str) -> bytes:
    """A complete keep-alive ``GET``."""
    return f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode()


def post_request(host: str, port: int, path: str, body: bytes, headers: dict[str, str] | None = None) -> bytes:
    """A complete keep-alive ``POST`` with a JSON ``body``, ready to write to a socket."""
    extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
    return (f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n{extra}"
            f"Content-Length: {len(body)}\r\n\r\n").encode() + body


async def _clients(host: str, port: int, requests: list[bytes], first: int, stride: int, conns: int,
                   t_warm: float, t0: float, t1: float) -> LoadResult:
    loop = asyncio.get_running_loop()
    res = LoadResult()
    cpu = [0.0, 0.0]

    async def one(k: int) -> None:
        try:
            _, conn = await loop.create_connection(_Connection, host, port)
        except OSError as e:
            res.errors.append(f"connect: {e}")
            return
        await asyncio.sleep(max(0.0, t_warm - time.monotonic()))
        i = first + k
        try:
            while True:
                idx = i % len(requests)
                a = time.monotonic()
                status, body = await conn.request(requests[idx])
                b = time.monotonic()
                if b >= t1:
                    break
                if a >= t0:
                    res.latencies.append(b - a)
                    res.statuses[status] = res.statuses.get(status, 0) + 1
                if status == 200 and idx not in res.samples and len(res.samples) < 64:
                    res.samples[idx] = body
                elif status != 200 and len(res.errors) < 5:
                    res.errors.append(f"HTTP {status}: {body[:200]!r}")
                i += stride
        except Exception as e:  # noqa: BLE001 - reported, not raised: the other clients go on
            res.errors.append(f"{type(e).__name__}: {e}")
        finally:
            conn.transport.close()  # type: ignore[union-attr]

    async def clock() -> None:
        await asyncio.sleep(max(0.0, t0 - time.monotonic()))
        cpu[0] = time.process_time()
        await asyncio.sleep(max(0.0, t1 - time.monotonic()))
        cpu[1] = time.process_time()

    await asyncio.gather(clock(), *(one(k) for k in range(conns)))
    res.cpu_s = cpu[1] - cpu[0]
    return res


def run_clients(host: str, port: int, requests: list[bytes], first: int, stride: int, conns: int,
                t_warm: float, t0: float, t1: float) -> LoadResult:
    """``conns`` connections in this process; connection k sends ``requests[first + k + j*stride]``
    (modulo their number) for j = 0, 1, ... until ``t1``: client ids ``first + k`` are global, so
    with ``stride`` = all clients every client walks its own share of the requests."""
    try:
        import uvloop

        return uvloop.run(_clients(host, port, requests, first, stride, conns, t_warm, t0, t1))
    except ImportError:
        return asyncio.run(_clients(host, port, requests, first, stride, conns, t_warm, t0, t1))


def run_window(host: str, port: int, raw: bytes, conns: int, t0: float, t1: float) -> LoadResult:
    """``conns`` connections in this process send ``raw`` back to back from now until ``t1``;
    replies finished in [``t0``, ``t1``) are counted (the caller's own warm-up before ``t0``)."""
    return run_clients(host, port, [raw], 0, conns, conns, time.monotonic(), t0, t1)


def _ready(_: int) -> None:
    """Run once per pool process before any window is set: imports done, interpreter warm."""
    import uvloop  # noqa: F401

    time.sleep(0.05)


def run_load(host: str, port: int, requests: list[bytes], clients: int, seconds: float, warmup_s: float = 1.0,
             processes: int | None = None) -> LoadResult:
    """``clients`` closed-loop connections in ``processes`` processes (default: one each) for
    ``warmup_s`` untimed then ``seconds`` timed; the processes are started, and have imported what
    they need, before the windows are set."""
    procs = max(1, min(processes or clients, clients))
    per = [clients // procs + (1 if p < clients % procs else 0) for p in range(procs)]
    out = LoadResult()
    ctx = multiprocessing.get_context("spawn")  # the parent may hold a CUDA context: never fork it
    with ctx.Pool(procs) as pool:
        pool.map(_ready, range(procs), chunksize=1)
        t_warm = time.monotonic() + 0.5 + 0.002 * clients  # time to connect
        t0 = t_warm + warmup_s
        t1 = t0 + seconds
        jobs, first = [], 0
        for n in per:
            jobs.append(pool.apply_async(run_clients, (host, port, requests, first, clients, n, t_warm, t0, t1)))
            first += n
        for j in jobs:
            out.merge(j.get(timeout=warmup_s + seconds + 120))
    return out


def summarize(res: LoadResult, seconds: float) -> dict[str, Any]:
    """req/s and latency percentiles (ms) of a merged result."""
    lat = sorted(res.latencies)
    n = len(lat)
    if not n:
        return {"req_s": 0.0, "n": 0, "errors": res.errors[:5]}

    def q(p: float) -> float:
        return round(lat[min(n - 1, int(p * n))] * 1e3, 3)

    ok = res.statuses.get(200, 0)
    return {"req_s": round(n / seconds, 1), "ok_req_s": round(ok / seconds, 1), "n": n, "p50": q(0.50), "p90": q(0.90),
            "p99": q(0.99), "max": round(lat[-1] * 1e3, 3), "statuses": {str(k): v for k, v in res.statuses.items()},
            "client_cpu_us_per_req": round(res.cpu_s / n * 1e6, 1), "errors": res.errors[:5]}
