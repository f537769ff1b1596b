"""The gateway's view of the server replicas: channels, health, load balancing, retries.

A request's sequences are split into chunks of about ``chunk_tokens`` tokens; each chunk goes to
the healthy replica with the fewest outstanding tokens; results are reassembled in input order.
With ``batch_one_per_gpu`` (the layout sets it for models whose bulk steps keep a GPU busy,
bouquet/layout.py), batch-priority chunks skip all but one replica of each GPU (the first healthy
one in the list): replicas sharing a GPU time-slice it, and the other stays free for interactive
requests.
Every chunk carries the request's priority, decided here from the whole request's size (a server
sees only its chunk). A chunk whose replica fails (connection lost, replica draining) is retried
on another replica; a chunk refused for a full queue tries the others. When none is left the
caller gets APIError 503 (or 429), and the request's other chunks are cancelled, so their queued
sequences are dropped on the servers. Small requests without token types share calls with the
others of the same event-loop iteration (coalesce.py). Calls travel over a Unix socket to replicas
on this host that ``serve`` started, over gRPC otherwise (channels.py); health is always gRPC's
``Info``. What this module does not own: tokenization, HTTP parsing, response encoding, noticing
that the HTTP client went away (gateway/front.py).
"""
from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Coroutine, TypeVar

import grpc
import numpy as np

from bouquet.config import CHUNK_TOKENS, INTERACTIVE_MAX_TOKENS, REPLICA_POLL_S
from bouquet.gateway.channels import GrpcChannel, IpcChannel, Packed, ReplicaQueueFull, ReplicaUnavailable
from bouquet.gateway.coalesce import Coalescer
from bouquet.gateway.errors import APIError
from bouquet.gateway.tracing import TRACE
from bouquet.proto import bouquet_pb2 as pb
from bouquet.proto.rpc import CHANNEL_OPTIONS, MAX_REPLY_BYTES, InferenceStub

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass
class Replica:
    address: str  # gRPC host:port (health, Info; Embed too when there is no IPC endpoint)
    channel: grpc.aio.Channel
    stub: InferenceStub
    calls: "GrpcChannel | IpcChannel"  # where Embed calls go
    outstanding_tokens: int = 0
    healthy: bool = False
    info: pb.InfoReply | None = None
    last_error: str = ""
    served_chunks: int = 0  # chunks this gateway process got vectors for
    gpu: str = ""  # the GPU it runs on ("cuda:0"), "" when unknown or not a GPU (ReplicaPool.gpus)

    def describe(self) -> dict[str, object]:
        """The replica as /health shows it; server-side counters come from the last Info probe."""
        i = self.info
        return {"address": self.address, "transport": "ipc" if isinstance(self.calls, IpcChannel) else "grpc",
                "gpu": self.gpu or None, "healthy": self.healthy, "outstanding_tokens": self.outstanding_tokens,
                "chunks": self.served_chunks, "device": i.device if i else None, "pid": i.pid if i else None,
                "pending_tokens": i.pending_tokens if i else None,
                "completed_requests": i.completed_requests if i else None,
                "cancelled_sequences": i.cancelled_sequences if i else None, "error": self.last_error or None}


def _kind(error: str) -> str:
    """A replica error's kind for the log's "on a change" test: the gRPC status name before the
    colon (gRPC words one fault several ways: "Socket closed", "Connection reset by peer")."""
    return error.partition(":")[0]


def chunk_bounds(lengths: list[int], chunk_tokens: int, max_rows: int | None = None) -> list[tuple[int, int]]:
    """[start, end) index ranges of consecutive sequences, each of at most ``chunk_tokens`` tokens
    (a single longer sequence forms its own chunk) and at most ``max_rows`` sequences (None: any
    number). Order is kept: chunk k precedes chunk k+1."""
    out, start, tokens = [], 0, 0
    for i, n in enumerate(lengths):
        if i > start and (tokens + n > chunk_tokens or (max_rows is not None and i - start >= max_rows)):
            out.append((start, i))
            start, tokens = i, 0
        tokens += n
    out.append((start, len(lengths)))
    return out


class Siblings:
    """The chunks of one call with the replicas now. A replica takes a chunk into an empty queue
    whatever its size, and refuses one that would push a non-empty queue past
    ``--max-queue-tokens``; the chunks of one call are sent at once, so on an idle replica the first
    filled the queue and the next was refused by it: a call of more than ``--chunk-tokens`` and
    ``--max-queue-tokens`` tokens was answered 429 on an idle server, on every retry. A chunk
    refused by a replica that held nothing but this call's chunks (as this gateway process sees
    it: ``Replica.outstanding_tokens``) waits for a sibling to come back and asks again
    (``_run_chunk``); a refusal behind other requests' work is the back-pressure it was, a 429. A
    refusal wakes no one, so refused chunks do not retry in a loop."""

    def __init__(self) -> None:
        self.tokens_on: dict[str, int] = {}  # replica address → this call's tokens sent there, unanswered
        self._finished = asyncio.Event()

    def busy(self) -> bool:
        """Some chunk of this call is with a replica now."""
        return any(self.tokens_on.values())

    def finished(self) -> None:
        """A chunk came back (its rows or an error other than a refusal): its queue has room again."""
        self._finished.set()
        self._finished = asyncio.Event()

    async def one_finished(self) -> None:
        await self._finished.wait()


async def gather_or_cancel(coros: list[Coroutine[Any, Any, T]]) -> list[T]:
    """``asyncio.gather``, except that the first failure cancels the others (their queued work
    would be wasted), and cancelling the caller cancels them all."""
    if len(coros) == 1:  # the common case: awaited in the caller's task, no task to create
        return [await coros[0]]
    tasks = [asyncio.ensure_future(c) for c in coros]
    try:
        return await asyncio.gather(*tasks)
    except BaseException:
        for t in tasks:
            t.cancel()
        asyncio.gather(*tasks, return_exceptions=True)  # collects their outcomes; nothing to wait for
        raise


RECHECK_S = 0.05  # a request finding no healthy replica probes them again if the last check is older


@dataclass
class ReplicaPool:
    addresses: list[str]
    chunk_tokens: int = CHUNK_TOKENS
    interactive_max_tokens: int = INTERACTIVE_MAX_TOKENS  # PRIORITY_AUTO: up to this many tokens are interactive
    request_timeout_s: float = 600.0
    # Requests of at most this many tokens share Embed calls with the others of the same event-loop
    # iteration (gateway/coalesce.py), up to ``chunk_tokens`` per call; 0 turns this off.
    coalesce_max_tokens: int = 4096
    # Parallel to ``addresses``: the replica's Unix socket on this host, "" for gRPC only.
    ipc_paths: list[str] = field(default_factory=list)
    # Parallel to ``addresses``: the GPU the replica runs on ("cuda:0"), "" when unknown (--server)
    # or not a GPU.
    gpus: list[str] = field(default_factory=list)
    batch_one_per_gpu: bool = False  # batch-priority chunks on one replica of each GPU (module docstring)
    # Sent with every gRPC call (Info, Embed): replicas started with a key refuse calls without it.
    api_key: str | None = field(default=None, repr=False)
    # True while the gateway drains to shut down: a replica that goes away then was most likely
    # stopped by the same signal (SIGTERM to the whole process group), logged at INFO, not WARNING.
    shutting_down: Callable[[], bool] = lambda: False
    # Bytes of one pooled row in a replica's reply (float32 x the model's full dimension; 0: unknown).
    # A call holds at most MAX_REPLY_BYTES of them, which a replica would refuse (400): a SPLADE row is
    # vocabulary-sized (600 KB at 150k), so 1,000 four-token texts fit --chunk-tokens but not one reply.
    row_bytes: int = 0
    # What this gateway serves (its own --model): a replica whose Info says another task or output
    # width is not used (a `bouquet server` started with another folder, or with another name that
    # makes a Qwen3ForCausalLM a reranker on one side and an embedder on the other). "" / 0: unchecked.
    expect_task: str = ""
    expect_dimension: int = 0
    # The replicas were started by this `serve`, whose launcher reports one that fails at start-up
    # (its error, one line): until a replica has been ready, their not answering is logged at INFO.
    own_replicas: bool = False
    replicas: list[Replica] = field(default_factory=list)
    _health_task: asyncio.Task[None] | None = None
    _probed_at: float = 0.0  # time.monotonic() at which the last health check ended
    _probing: "asyncio.Future[None] | None" = None  # the health check in flight, which callers join
    _probe_began: float = 0.0  # time.monotonic() at which ``_probing`` began
    was_ready: bool = False  # a replica has answered ready at least once (``status``)
    _coalescer: Coalescer = field(init=False)

    def __post_init__(self) -> None:
        self._coalescer = Coalescer(lambda seqs, n, d, p, k: self._run_chunk(seqs, None, n, d, p, pool_skip=k),
                                    self.chunk_tokens, self.max_rows)

    @property
    def max_rows(self) -> int | None:
        """Pooled rows per call (``row_bytes``), None when unbounded."""
        return max(1, MAX_REPLY_BYTES // self.row_bytes) if self.row_bytes > 0 else None

    async def start(self) -> None:
        paths = self.ipc_paths or [""] * len(self.addresses)
        gpus = self.gpus or [""] * len(self.addresses)
        for a, path, gpu in zip(self.addresses, paths, gpus):
            ch = grpc.aio.insecure_channel(a, options=CHANNEL_OPTIONS)
            stub = InferenceStub(ch, self.api_key)
            calls: GrpcChannel | IpcChannel = IpcChannel(path) if path else GrpcChannel(a, stub)
            r = Replica(a, ch, stub, calls, gpu=gpu)
            if isinstance(calls, IpcChannel):
                calls.on_lost = lambda why, r=r: self._lost(r, why)
                await calls.connect()
            self.replicas.append(r)
        await self.check_health()
        self._health_task = asyncio.create_task(self._health_loop())

    async def close(self) -> None:
        if self._health_task:
            self._health_task.cancel()
        if self._probing is not None:
            self._probing.cancel()
        for r in self.replicas:
            r.calls.close()
            await r.channel.close()

    def _lost(self, r: Replica, why: str) -> None:
        if r.healthy:
            (log.info if self.shutting_down() else log.warning)("replica %s: %s", r.address, why)
        r.healthy, r.last_error = False, why

    @property
    def ready(self) -> bool:
        return any(r.healthy for r in self.replicas)

    @property
    def status(self) -> str:
        """/health's word for this pool: "ok" (a replica answers), "loading" (none has been ready
        yet: starting), "unavailable" (none answers now, though one was ready before: crashed,
        hung or unreachable — not a server still starting)."""
        if self.ready:
            return "ok"
        return "unavailable" if self.was_ready else "loading"

    async def _probe(self, r: Replica) -> None:
        was, said = r.healthy, r.last_error
        try:
            info = await r.stub.Info(pb.InfoRequest(), timeout=2.0)
            if isinstance(r.calls, IpcChannel) and info.ready:
                await r.calls.connect()  # (re)open after a start-up race or the replica's restart
            # An IPC replica is usable once its socket has connected too (it may lag Info briefly).
            other = self._other_model(info)
            up = bool(info.ready) and r.calls.connected and not other
            r.info, r.healthy = info, up
            self.was_ready = self.was_ready or up
            r.last_error = ("" if up else "loading" if not info.ready else other
                            or f"no IPC connection to {r.calls.address} yet")
        except grpc.aio.AioRpcError as e:
            hint = " (give the gateway the replica's API key: BOUQUET_API_KEY)" if e.code() == grpc.StatusCode.UNAUTHENTICATED else ""
            r.healthy, r.last_error = False, f"{e.code().name}: {e.details()}{hint}"
        # Changes only (the loop probes an unhealthy replica 4 times a second): a --server address
        # with nothing listening, or a replica that went away, is in the log and not only in /health.
        if r.healthy and not was:
            log.info("replica %s ready", r.address)
        elif not r.healthy and _kind(r.last_error) != _kind(said) and r.last_error != "loading":
            quiet = self.shutting_down() or (self.own_replicas and not self.was_ready)
            (log.info if quiet else log.warning)("replica %s not usable: %s", r.address, r.last_error)

    def _other_model(self, info: pb.InfoReply) -> str:
        """Why a replica's model is not this gateway's (its task or output width differ), or ""."""
        task_differs = bool(self.expect_task) and bool(info.task) and info.task != self.expect_task
        width_differs = self.expect_dimension > 0 and 0 < info.dimension != self.expect_dimension
        if not (task_differs or width_differs):
            return ""
        return (f"it serves {info.model_id or 'a model'} ({info.architecture}) as task {info.task!r} with {info.dimension} "
                f"outputs, and this gateway's model is task {self.expect_task!r} with {self.expect_dimension}: give "
                "`bouquet server` and the gateway the same --model and --served-model-name")

    async def check_health(self, since: float = 0.0) -> None:
        """Probe every replica; a check already in flight is joined, not doubled. ``since``
        (time.monotonic()): a check in flight that began before it may have asked before a
        replica turned ready, so another follows it."""
        while True:
            if self._probing is None or self._probing.done():
                self._probe_began = time.monotonic()
                self._probing = asyncio.ensure_future(self._probe_all())
            began = self._probe_began
            await asyncio.shield(self._probing)
            if began >= since:
                return

    async def _probe_all(self) -> None:
        try:
            await asyncio.gather(*(self._probe(r) for r in self.replicas))
        finally:
            self._probed_at = time.monotonic()

    async def _health_loop(self) -> None:
        while True:
            await asyncio.sleep(0.25 if not all(r.healthy for r in self.replicas) else REPLICA_POLL_S)
            try:
                await self.check_health()
            except Exception:  # noqa: BLE001 - health probing must never stop
                log.exception("health check failed")

    def _pick(self, exclude: set[str], batch: bool = False) -> Replica | None:
        """The healthy replica not in ``exclude`` with the fewest outstanding tokens; for a
        batch-priority chunk (``batch``) only the first such replica of each GPU competes."""
        cands = [r for r in self.replicas if r.healthy and r.address not in exclude]
        if batch:
            first: dict[str, Replica] = {}  # each GPU's first candidate, in list order
            for r in cands:
                first.setdefault(r.gpu, r)
            cands = [r for r in cands if not r.gpu or first[r.gpu] is r]
        return min(cands, key=lambda r: r.outstanding_tokens) if cands else None

    def resolve_priority(self, priority: int, total_tokens: int) -> int:
        """PRIORITY_AUTO → interactive up to ``interactive_max_tokens`` tokens, else batch."""
        if priority != pb.PRIORITY_AUTO:
            return priority
        return pb.PRIORITY_INTERACTIVE if total_tokens <= self.interactive_max_tokens else pb.PRIORITY_BATCH

    async def infer(
        self,
        seqs: list[np.ndarray],
        type_ids: list[np.ndarray] | None = None,
        normalize: bool | None = None,
        dimensions: int | None = None,
        priority: int = pb.PRIORITY_AUTO,
        pool_skip: int = 0,
    ) -> np.ndarray:
        """Run sequences (int32 arrays) on the replicas → float32 [B, D] in input order.
        ``pool_skip``: leading tokens of every sequence (their shared prompt) left out of pooling.

        Raises APIError: 400/422 for input the server refuses, 429 when queues are full,
        503 when no replica can serve, 504 on timeout.
        """
        lengths = [len(s) for s in seqs]
        total = sum(lengths)
        priority = self.resolve_priority(priority, total)
        # a traced request's call is its own, so the replica's log line for it is its alone (tracing.py)
        if (type_ids is None and total <= min(self.coalesce_max_tokens, self.chunk_tokens) and TRACE.get() is None
                and len(seqs) <= (self.max_rows or len(seqs))):
            return await self._coalescer.submit(seqs, total, normalize, dimensions, priority, pool_skip)
        parts = chunk_bounds(lengths, self.chunk_tokens, self.max_rows)
        siblings = Siblings() if len(parts) > 1 else None
        results = await gather_or_cancel([
            self._run_chunk(seqs[a:b], type_ids[a:b] if type_ids is not None else None, normalize, dimensions, priority,
                            pool_skip=pool_skip, siblings=siblings)
            for a, b in parts
        ])
        return results[0] if len(results) == 1 else np.concatenate(results, axis=0)

    async def infer_tokens(self, seqs: list[np.ndarray], priority: int = pb.PRIORITY_AUTO) -> np.ndarray:
        """The model's token outputs → float32 [T, D'], the sequences' token rows back to back in
        input order (not coalesced with other requests). Errors as ``infer``."""
        lengths = [len(s) for s in seqs]
        priority = self.resolve_priority(priority, sum(lengths))
        parts = chunk_bounds(lengths, self.chunk_tokens)
        siblings = Siblings() if len(parts) > 1 else None
        results = await gather_or_cancel([self._run_chunk(seqs[a:b], None, None, None, priority, per_token=True,
                                                          siblings=siblings) for a, b in parts])
        return results[0] if len(results) == 1 else np.concatenate(results, axis=0)

    async def _run_chunk(self, seqs: list[np.ndarray], type_ids: list[np.ndarray] | None,
                         normalize: bool | None, dimensions: int | None, priority: int,
                         per_token: bool = False, pool_skip: int = 0, siblings: Siblings | None = None) -> np.ndarray:
        call = Packed.pack(seqs, type_ids)
        tokens = call.num_tokens
        tried: set[str] = set()
        queue_full = ""
        only_siblings = False  # the last refusal came from a replica holding only this call's chunks
        batch = self.batch_one_per_gpu and priority == pb.PRIORITY_BATCH
        deadline = time.monotonic() + self.request_timeout_s
        while True:
            r = self._pick(tried, batch)
            if r is None and not tried and (not self.was_ready or time.monotonic() - self._probed_at > RECHECK_S):
                # none healthy as of the last poll: ask again before refusing. With several gateway
                # workers, one worker's /health can turn 200 while another's poll (every 0.25 s
                # until a replica is ready) has not yet seen that replica finish loading; until one
                # has been seen ready, a poll that just ended (or one in flight) may predate it, so ask
                # whatever its age.
                await self.check_health(0.0 if self.was_ready else time.monotonic())
                r = self._pick(tried, batch)
            if r is None and queue_full and only_siblings and siblings is not None and siblings.busy():
                # every replica refused this chunk, the last one while it held only this call's chunks:
                # once a sibling is back this chunk may fit, so it waits for that (Siblings) and asks again
                await siblings.one_finished()
                tried.clear()
                queue_full = ""
                continue
            if r is None:
                if queue_full:
                    raise APIError(429, f"every replica's queue is full ({queue_full}); retry later",
                                   code="queue_full", headers={"Retry-After": "1"})
                # a replica that answers but is still loading (start-up): say so, the first thing a new
                # user sees when the request comes right after `bouquet serve`
                loading = not self.was_ready and any(r.last_error == "loading" for r in self.replicas)
                raise APIError(503, "the model is still loading; retry in a few seconds (GET /health answers 200 once "
                               "it is ready)" if loading else "no healthy inference replica is available; retry later",
                               code="no_replica", headers={"Retry-After": "1"})
            tried.add(r.address)
            r.outstanding_tokens += tokens
            if siblings is not None:
                siblings.tokens_on[r.address] = siblings.tokens_on.get(r.address, 0) + tokens
            refused = False
            try:
                left = max(0.1, deadline - time.monotonic())
                if per_token:
                    rows = await r.calls.embed_tokens(call, priority, left)
                else:
                    rows = await r.calls.embed(call, normalize, dimensions, priority, left, pool_skip=pool_skip)
            except ReplicaUnavailable as e:
                self._lost(r, str(e))
                log.warning("replica %s failed (%s); retrying elsewhere", r.address, e)
                continue
            except ReplicaQueueFull as e:
                queue_full = str(e) or "queue full"
                refused = True
                only_siblings = siblings is not None and r.outstanding_tokens == siblings.tokens_on[r.address]
                continue
            finally:
                r.outstanding_tokens -= tokens
                if siblings is not None:
                    siblings.tokens_on[r.address] -= tokens
                    if not refused:
                        siblings.finished()
            r.served_chunks += 1
            return rows
