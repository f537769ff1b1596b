"""A load generator that spends little CPU: raw HTTP/1.1 keep-alive connections on uvloop.

Each connection sends one pre-encoded request, waits for the whole reply (``Content-Length``
framing, as uvicorn answers every non-streaming route) and sends the next; nothing is parsed
beyond the status line and the length. About 15-25 µs of CPU per request on one core, a fraction
of what httpx or aiohttp spend, so that on a small machine the client does not starve the server
it measures. Not a general HTTP client: no chunked replies, no redirects, no TLS.
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field


@dataclass
class LoadResult:
    """Replies completed inside the timed window. Latencies in seconds, send to last byte."""

    latencies: list[float] = field(default_factory=list)
    statuses: dict[int, int] = field(default_factory=dict)
    first_body: bytes = b""  # the first 200 reply's body, for checking
    cpu_s: float = 0.0  # this process's CPU time over the timed window


class _Conn(asyncio.Protocol):
    def __init__(self) -> None:
        self.buf = bytearray()
        self.waiter: asyncio.Future[tuple[int, bytes]] | None = None
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.buf += data
        end = self.buf.find(b"\r\n\r\n")
        if end < 0 or self.waiter is None:
            return
        lines = bytes(self.buf[:end]).split(b"\r\n")
        length = next((int(v) for k, _, v in (ln.partition(b":") for ln in lines[1:])
                       if k.strip().lower() == b"content-length"), None)
        if length is None:
            self.waiter.set_exception(RuntimeError(f"reply without Content-Length: {lines[0]!r}"))
            return
        if len(self.buf) < end + 4 + length:
            return
        status = int(lines[0][9:12])
        body = bytes(self.buf[end + 4:end + 4 + length])
        del self.buf[:end + 4 + length]
        self.waiter.set_result((status, body))

    def connection_lost(self, exc: Exception | None) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(ConnectionError(f"connection closed: {exc}"))

    async def request(self, raw: bytes) -> tuple[int, bytes]:
        self.waiter = asyncio.get_running_loop().create_future()
        self.transport.write(raw)  # type: ignore[union-attr]
        try:
            return await self.waiter
        finally:
            self.waiter = None


def post_bytes(host: str, port: int, path: str, body: bytes) -> bytes:
    """A complete HTTP/1.1 keep-alive POST of a JSON ``body``."""
    return (f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode() + body


async def _run(host: str, port: int, raw: bytes, conns: int, t0: float, t1: float) -> LoadResult:
    loop = asyncio.get_running_loop()
    res = LoadResult()
    cpu = [0.0, 0.0]

    async def one() -> None:
        _, proto = await loop.create_connection(_Conn, host, port)
        while True:
            a = time.monotonic()
            status, body = await proto.request(raw)
            b = time.monotonic()
            if b >= t1:
                break
            if a >= t0:
                res.latencies.append(b - a)
                res.statuses[status] = res.statuses.get(status, 0) + 1
            if not res.first_body and status == 200:
                res.first_body = body
        proto.transport.close()  # type: ignore[union-attr]

    async def clock() -> None:
        await asyncio.sleep(max(0.0, t0 - time.monotonic()))
        cpu[0] = time.process_time()
        await asyncio.sleep(max(0.0, t1 - time.monotonic()))
        cpu[1] = time.process_time()

    await asyncio.gather(clock(), *(one() for _ in range(conns)))
    res.cpu_s = cpu[1] - cpu[0]
    return res


def run_load(host: str, port: int, raw: bytes, conns: int, t0: float, t1: float) -> LoadResult:
    """``conns`` connections send ``raw`` back to back until ``t1`` (``time.monotonic()``, which
    is system-wide on Linux, so the caller's clock); replies finished in [t0, t1) are kept."""
    try:
        import uvloop

        return uvloop.run(_run(host, port, raw, conns, t0, t1))
    except ImportError:
        return asyncio.run(_run(host, port, raw, conns, t0, t1))
