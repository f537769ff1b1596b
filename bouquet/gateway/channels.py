"""How a gateway worker sends one ``Embed`` call to one replica: a Unix socket or gRPC.

Both channels take the same packed call (``Packed``) and return float32 rows [B, D], or raise one
of the errors below, so the replica pool's balancing and retries (replicas.py) do not depend on
the transport. ``IpcChannel`` (a Unix socket; contract: proto/ipc.py) serves the replicas
`bouquet serve` starts on this host; ``GrpcChannel`` serves ``--server HOST:PORT`` replicas and ``--transport grpc``.
Health and ``Info`` stay on gRPC for both.

What this module does not own: picking a replica, retries, chunking (replicas.py); the replica's
side (server/ipc_server.py, server/service.py).
"""
from __future__ import annotations

import asyncio
import itertools
import logging
from dataclasses import dataclass
from typing import Callable

import grpc
import numpy as np
from bouquet.gateway.errors import APIError
from bouquet.gateway.tracing import TRACE
from bouquet.proto import bouquet_pb2 as pb
from bouquet.proto import ipc
from bouquet.proto.rpc import InferenceStub

log = logging.getLogger(__name__)


class ReplicaUnavailable(Exception):
    """The replica cannot take the call (gone, loading, draining, not connected): try another."""


class ReplicaQueueFull(Exception):
    """The replica's queue is full: try another, else answer 429."""


@dataclass(frozen=True)
class Packed:
    """One call's sequences as the wire carries them (int32 LE bytes)."""

    input_ids: bytes  # [T]
    lengths: bytes  # [B]
    token_type_ids: bytes  # [T] or b""
    num_seqs: int
    num_tokens: int

    @classmethod
    def pack(cls, seqs: list[np.ndarray], type_ids: list[np.ndarray] | None = None) -> "Packed":
        """int32 arrays [len_i] (and their token types) → Packed."""
        lengths = [len(s) for s in seqs]
        ids = seqs[0] if len(seqs) == 1 else np.concatenate(seqs)
        tts = b""
        if type_ids:
            tts = np.concatenate(type_ids).astype("<i4", copy=False).tobytes()
        return cls(ids.astype("<i4", copy=False).tobytes(), np.asarray(lengths, "<i4").tobytes(), tts, len(seqs),
                   sum(lengths))


_HTTP_OF_GRPC = {grpc.StatusCode.INVALID_ARGUMENT: 400, grpc.StatusCode.FAILED_PRECONDITION: 422,
                 grpc.StatusCode.DEADLINE_EXCEEDED: 504, grpc.StatusCode.INTERNAL: 500}
_HTTP_OF_IPC = {ipc.Status.INVALID_ARGUMENT: 400, ipc.Status.FAILED_PRECONDITION: 422, ipc.Status.INTERNAL: 500}
# UNAUTHENTICATED: this replica wants another API key; the others may take the call
_RETRYABLE = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED, grpc.StatusCode.UNKNOWN,
              grpc.StatusCode.UNAUTHENTICATED}


def _rows(data: bytes | memoryview, shape: tuple[int, int], n: int, where: str) -> np.ndarray:
    if shape[0] != n:
        # Never hand out rows that cannot be matched to the call's inputs.
        raise APIError(500, f"replica {where} returned shape {list(shape)} for {n} inputs")
    return np.frombuffer(data, dtype="<f4").reshape(shape)


class GrpcChannel:
    """``Embed`` over a ``grpc.aio`` channel (also used for ``Info`` by the pool)."""

    def __init__(self, address: str, stub: InferenceStub) -> None:
        self.address, self.stub = address, stub

    @property
    def connected(self) -> bool:
        return True  # gRPC reconnects by itself; failures show up as UNAVAILABLE

    async def embed(self, call: Packed, normalize: bool | None, dimensions: int | None, priority: int,
                    timeout_s: float, per_token: bool = False, pool_skip: int = 0) -> np.ndarray:
        """Rows float32 [B, D] ([T, D'] with ``per_token``); ``pool_skip``: leading tokens of every
        sequence left out of pooling. Raises ReplicaUnavailable, ReplicaQueueFull or APIError."""
        req = pb.EmbedRequest(input_ids=call.input_ids, lengths=call.lengths, token_type_ids=call.token_type_ids,
                              priority=priority, dimensions=dimensions or 0, per_token=per_token,
                              pool_skip=pool_skip)  # type: ignore[arg-type]
        if normalize is not None:
            req.normalize = normalize
        trace = TRACE.get()
        metadata = () if trace is None else (("traceparent", trace.traceparent), ("x-request-id", trace.request_id))
        try:
            rep = await self.stub.Embed(req, timeout=timeout_s, metadata=metadata)
        except grpc.aio.AioRpcError as e:
            code = e.code()
            if code in _RETRYABLE:
                raise ReplicaUnavailable(f"{code.name}: {e.details()}") from None
            if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
                raise ReplicaQueueFull(e.details() or "queue full") from None
            raise APIError(_HTTP_OF_GRPC.get(code, 500), e.details() or code.name) from None
        t = rep.output
        if len(t.shape) != 2:
            raise APIError(500, f"replica {self.address} returned shape {list(t.shape)}")
        return _rows(t.data, (int(t.shape[0]), int(t.shape[1])), call.num_tokens if per_token else call.num_seqs,
                     self.address)

    async def embed_tokens(self, call: Packed, priority: int, timeout_s: float) -> np.ndarray:
        """One row per token [T, D'] (the model's token outputs); errors as ``embed``."""
        return await self.embed(call, None, None, priority, timeout_s, per_token=True)

    def close(self) -> None:
        pass  # the pool closes the gRPC channel it made


class IpcChannel(asyncio.Protocol):
    """One Unix-socket connection to one replica (proto/ipc.py), read on this worker's event loop.

    Calls in flight are futures keyed by call id. When the connection closes (the replica exited,
    crashed or was killed) every call in flight fails at once with ReplicaUnavailable, so the pool
    retries it elsewhere instead of waiting for its deadline, and ``on_lost`` marks the replica
    unhealthy; ``connect()`` (from the pool's health loop) opens it again.
    """

    def __init__(self, path: str, on_lost: Callable[[str], None] = lambda why: None) -> None:
        self.address = path
        self.on_lost = on_lost
        self._transport: asyncio.Transport | None = None
        self._reader = ipc.FrameReader(self._on_frame)
        self._pending: dict[int, tuple[asyncio.Future[np.ndarray], int]] = {}  # id → (future, sequences)
        self._ids = itertools.count(1)

    @property
    def connected(self) -> bool:
        return self._transport is not None

    async def connect(self) -> None:
        """Open the connection if it is not open; failures leave it closed (logged at debug)."""
        if self._transport is not None:
            return
        try:
            await asyncio.get_running_loop().create_unix_connection(lambda: self, self.address)
        except OSError as e:
            log.debug("IPC connection to %s failed: %s", self.address, e)

    def close(self) -> None:
        self._fail_all("gateway shutting down")
        self.on_lost = lambda why: None  # closed on purpose: not a lost replica (no warning at shutdown)
        if self._transport is not None:
            self._transport.close()

    # ---- asyncio.Protocol ----------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]
        self._reader = ipc.FrameReader(self._on_frame)

    def data_received(self, data: bytes) -> None:
        self._reader.feed(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
        self._fail_all(f"connection to {self.address} lost")
        self.on_lost(f"UNAVAILABLE: connection to {self.address} lost")

    # ---- calls ---------------------------------------------------------------------------
    async def embed(self, call: Packed, normalize: bool | None, dimensions: int | None, priority: int,
                    timeout_s: float, per_token: bool = False, pool_skip: int = 0) -> np.ndarray:
        """Rows float32 [B, D] ([T, D'] with ``per_token``). Raises ReplicaUnavailable,
        ReplicaQueueFull or APIError (400/422 for input the replica refuses, 504 past
        ``timeout_s``). ``pool_skip``: leading tokens of every sequence left out of pooling.
        Cancelling the caller cancels the call on the replica (its queued
        sequences are dropped)."""
        transport = self._transport
        if transport is None:
            raise ReplicaUnavailable(f"no connection to {self.address}")
        cid = next(self._ids)
        trace = TRACE.get()
        transport.write(ipc.frame(
            ipc.EmbedCall(cid, call.num_seqs, bool(call.token_type_ids), priority, normalize, dimensions or 0, per_token,
                          pool_skip, *(() if trace is None else (trace.traceparent, trace.request_id))),
            call.lengths, call.input_ids, call.token_type_ids))
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[np.ndarray] = loop.create_future()
        self._pending[cid] = (fut, call.num_tokens if per_token else call.num_seqs)
        timer = loop.call_later(timeout_s, self._expire, cid, timeout_s)
        try:
            return await fut
        except asyncio.CancelledError:
            if self._pending.pop(cid, None) is not None:
                self._send_cancel(cid)
            raise
        finally:
            timer.cancel()
            self._pending.pop(cid, None)

    async def embed_tokens(self, call: Packed, priority: int, timeout_s: float) -> np.ndarray:
        """One row per token [T, D'] (the model's token outputs); errors as ``embed``."""
        return await self.embed(call, None, None, priority, timeout_s, per_token=True)

    def _on_frame(self, header: bytes, payload: bytes) -> None:
        rep = ipc.decode_reply(header)
        entry = self._pending.pop(rep.id, None)
        if entry is None or entry[0].done():
            return  # cancelled or expired meanwhile
        fut, n = entry
        if rep.status == ipc.Status.OK:
            try:
                fut.set_result(_rows(payload, (rep.rows, rep.dim), n, self.address))
            except APIError as e:
                fut.set_exception(e)
        elif rep.status == ipc.Status.UNAVAILABLE:
            fut.set_exception(ReplicaUnavailable(rep.message))
        elif rep.status == ipc.Status.RESOURCE_EXHAUSTED:
            fut.set_exception(ReplicaQueueFull(rep.message))
        else:
            fut.set_exception(APIError(_HTTP_OF_IPC.get(rep.status, 500), rep.message))

    def _expire(self, cid: int, timeout_s: float) -> None:
        entry = self._pending.pop(cid, None)
        if entry is not None and not entry[0].done():
            self._send_cancel(cid)
            entry[0].set_exception(APIError(504, f"no answer from replica {self.address} within {timeout_s:.0f} s",
                                            code="timeout"))

    def _send_cancel(self, cid: int) -> None:
        if self._transport is not None:
            self._transport.write(ipc.frame(ipc.CancelCall(cid)))

    def _fail_all(self, why: str) -> None:
        pending, self._pending = self._pending, {}
        for fut, _ in pending.values():
            if not fut.done():
                fut.set_exception(ReplicaUnavailable(why))
