"""The gateway's view of the server replicas: gRPC channels, health, load balancing, retries.

A request's sequences are split into chunks of about ``chunk_tokens`` tokens; each chunk goes to
the healthy replica with the fewest outstanding tokens; results are reassembled in input order.
A chunk whose replica fails (connection lost, replica draining) is retried on another replica;
when none is left the caller gets APIError(503). What this module does not own: tokenization,
HTTP parsing, response encoding.
"""
from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field

import grpc
import numpy as np

from bouquet.gateway.errors import APIError
from bouquet.proto import bouquet_pb2 as pb
from bouquet.proto.rpc import CHANNEL_OPTIONS, InferenceStub

log = logging.getLogger(__name__)

_RETRYABLE = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED, grpc.StatusCode.UNKNOWN}
_STATUS_HTTP = {
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.FAILED_PRECONDITION: 422,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
}


@dataclass
class Replica:
    address: str
    channel: grpc.aio.Channel
    stub: InferenceStub
    outstanding_tokens: int = 0
    healthy: bool = False
    info: pb.InfoReply | None = None
    last_error: str = ""
    served_chunks: int = 0

    def describe(self) -> dict[str, object]:
        return {"address": self.address, "healthy": self.healthy, "outstanding_tokens": self.outstanding_tokens,
                "device": self.info.device if self.info else None, "chunks": self.served_chunks,
                "error": self.last_error or None}


@dataclass
class ReplicaPool:
    addresses: list[str]
    chunk_tokens: int = 8192
    request_timeout_s: float = 600.0
    replicas: list[Replica] = field(default_factory=list)
    _health_task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        for a in self.addresses:
            ch = grpc.aio.insecure_channel(a, options=CHANNEL_OPTIONS)
            self.replicas.append(Replica(a, ch, InferenceStub(ch)))
        await self.check_health()
        self._health_task = asyncio.create_task(self._health_loop())

    async def close(self) -> None:
        if self._health_task:
            self._health_task.cancel()
        for r in self.replicas:
            await r.channel.close()

    @property
    def ready(self) -> bool:
        return any(r.healthy for r in self.replicas)

    async def _probe(self, r: Replica) -> None:
        try:
            info = await r.stub.Info(pb.InfoRequest(), timeout=2.0)
            r.info, r.healthy, r.last_error = info, bool(info.ready), "" if info.ready else "loading"
        except grpc.aio.AioRpcError as e:
            r.healthy, r.last_error = False, f"{e.code().name}: {e.details()}"

    async def check_health(self) -> None:
        await asyncio.gather(*(self._probe(r) for r in self.replicas))

    async def _health_loop(self) -> None:
        while True:
            await asyncio.sleep(0.25 if not all(r.healthy for r in self.replicas) else 1.0)
            try:
                await self.check_health()
            except Exception:  # noqa: BLE001 - health probing must never stop
                log.exception("health check failed")

    def _pick(self, exclude: set[str]) -> Replica | None:
        cands = [r for r in self.replicas if r.healthy and r.address not in exclude]
        return min(cands, key=lambda r: r.outstanding_tokens) if cands else None

    def _chunks(self, lengths: list[int]) -> list[tuple[int, int]]:
        out, start, tokens = [], 0, 0
        for i, n in enumerate(lengths):
            if i > start and tokens + n > self.chunk_tokens:
                out.append((start, i))
                start, tokens = i, 0
            tokens += n
        out.append((start, len(lengths)))
        return out

    async def infer(
        self,
        seqs: list[np.ndarray],
        type_ids: list[np.ndarray] | None = None,
        normalize: bool | None = None,
        dimensions: int | None = None,
        priority: int = pb.PRIORITY_AUTO,
    ) -> np.ndarray:
        """Run sequences (int32 arrays) on the replicas → float32 [B, D] in input order.

        Raises APIError: 400/422 for input the server refuses, 429 when queues are full,
        503 when no replica can serve, 504 on timeout.
        """
        if priority == pb.PRIORITY_AUTO and len(self.replicas) > 1:
            # The server cannot see the whole request once it is chunked; decide here.
            total = sum(len(s) for s in seqs)
            priority = pb.PRIORITY_INTERACTIVE if total <= 2048 else pb.PRIORITY_BATCH
        parts = self._chunks([len(s) for s in seqs])
        results = await asyncio.gather(*(
            self._run_chunk(seqs[a:b], type_ids[a:b] if type_ids is not None else None, normalize, dimensions, priority)
            for a, b in parts
        ))
        return results[0] if len(results) == 1 else np.concatenate(results, axis=0)

    async def _run_chunk(self, seqs: list[np.ndarray], type_ids: list[np.ndarray] | None,
                         normalize: bool | None, dimensions: int | None, priority: int) -> np.ndarray:
        lengths = np.fromiter((len(s) for s in seqs), dtype="<i4", count=len(seqs))
        req = pb.EmbedRequest(
            input_ids=np.concatenate(seqs).astype("<i4", copy=False).tobytes(), lengths=lengths.tobytes(),
            token_type_ids=np.concatenate(type_ids).astype("<i4", copy=False).tobytes() if type_ids else b"",
            priority=priority, dimensions=dimensions or 0,  # type: ignore[arg-type]
        )
        if normalize is not None:
            req.normalize = normalize
        tokens = int(lengths.sum())
        tried: set[str] = set()
        deadline = time.monotonic() + self.request_timeout_s
        while True:
            r = self._pick(tried)
            if r is None:
                raise APIError(503, "no healthy inference replica is available; retry later", code="no_replica",
                               headers={"Retry-After": "1"})
            tried.add(r.address)
            r.outstanding_tokens += tokens
            try:
                rep = await r.stub.Embed(req, timeout=max(0.1, deadline - time.monotonic()))
                r.served_chunks += 1
            except grpc.aio.AioRpcError as e:
                code = e.code()
                if code in _RETRYABLE:
                    r.healthy, r.last_error = False, f"{code.name}: {e.details()}"
                    log.warning("replica %s failed (%s); retrying elsewhere", r.address, code.name)
                    continue
                status = _STATUS_HTTP.get(code, 500)
                headers = {"Retry-After": "1"} if status == 429 else None
                raise APIError(status, e.details() or code.name, headers=headers) from None
            finally:
                r.outstanding_tokens -= tokens
            t = rep.output
            return np.frombuffer(t.data, dtype="<f4").reshape(tuple(t.shape))
