"""The gRPC service of one replica: decodes requests, feeds the scheduler, drives the engine.

The engine loop keeps up to ``depth`` batches in flight: it launches batch N+1 (``engine.step``
returns a lazy handle at once on CUDA) before it waits for batch N, and waits in a helper thread
so the asyncio loop keeps serving gRPC. Cheap steps (a CUDA-graph replay, the no-op engine) run on
the loop: no thread hop to launch them. The engine is anything implementing
``bouquet.engine.runtime.contract.StepEngine``. What this module does not own: batching policy
(scheduler.py), model math (engine/), HTTP and tokenization (gateway/).
"""
from __future__ import annotations

import asyncio
import itertools
import logging
import os
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, TypeVar

import grpc
import numpy as np

from bouquet.config import ServeConfig
from bouquet.engine.runtime.batch import Batch
from bouquet.engine.runtime.contract import ResultHandle, StepEngine
from bouquet.engine.heads.pooling import finalize
from bouquet.modelspec import ModelSpec
from bouquet.proto import bouquet_pb2 as pb
from bouquet.proto.rpc import MAX_REPLY_BYTES
from bouquet.server.scheduler import Priority, QueueFull, Request, ScheduledBatch, Scheduler
from bouquet.server.stats import ReplicaStats

log = logging.getLogger(__name__)
T = TypeVar("T")


def log_traced(traceparent: str, request_id: str, num_seqs: int, outcome: str, t0: float) -> None:
    """The replica's log line for a call that carries a W3C traceparent (gateway/tracing.py):
    both front ends write it when the call ends, so one request's lines join across processes.
    Values are cut to 128 characters: a direct gRPC client may send anything printable."""
    log.info("call traceparent=%.128s request_id=%.128s sequences=%d: %.300s in %.1f ms", traceparent, request_id,
             num_seqs, outcome, (time.perf_counter() - t0) * 1e3)


class RequestError(Exception):
    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code, self.message = code, message


def decode_sequences(input_ids: bytes, lengths_bytes: bytes, token_type_ids: bytes, spec: ModelSpec,
                     per_token: bool = False) -> tuple[list[np.ndarray], list[np.ndarray | None] | None]:
    """Split packed int32 LE bytes (ids [T], lengths [B], token types [T] or empty) into
    per-sequence arrays; validates lengths, ids and types, and the size of the reply the call
    asks for (``check_reply_size``; ``per_token``: one row per token). Shared by the gRPC and IPC
    front ends.

    Raises RequestError(INVALID_ARGUMENT) naming the offending sequence or field.
    """
    for name, raw in (("input_ids", input_ids), ("lengths", lengths_bytes), ("token_type_ids", token_type_ids)):
        if len(raw) % 4:
            raise RequestError(grpc.StatusCode.INVALID_ARGUMENT,
                               f"{name} has {len(raw)} bytes, not a whole number of int32 (4-byte) values")
    # before any per-sequence work: a 16 MB call asked for GBs of rows, all computed, then refused
    check_reply_size(len(input_ids if per_token else lengths_bytes) // 4, per_token, spec)
    ids = np.frombuffer(input_ids, dtype="<i4")
    # The lengths as Python ints: a request holds few sequences, and Python's min/max/sum and
    # slicing cost less than numpy's reductions and np.split on arrays that small.
    lengths = np.frombuffer(lengths_bytes, dtype="<i4").tolist()
    if not lengths:
        raise RequestError(grpc.StatusCode.INVALID_ARGUMENT, "request has no sequences")
    if min(lengths) < 1:
        raise RequestError(grpc.StatusCode.INVALID_ARGUMENT, f"sequence {lengths.index(min(lengths))} is empty")
    total = sum(lengths)
    if total != ids.size:
        raise RequestError(grpc.StatusCode.INVALID_ARGUMENT, f"lengths sum to {total} but {ids.size} ids were sent")
    longest = max(lengths)
    if longest > spec.max_seq_length:
        raise RequestError(grpc.StatusCode.INVALID_ARGUMENT,
                           f"sequence {lengths.index(longest)} has {longest} tokens; the model's maximum is {spec.max_seq_length}")
    if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= spec.vocab_size):
        bad = int(ids[(ids < 0) | (ids >= spec.vocab_size)][0])
        raise RequestError(grpc.StatusCode.INVALID_ARGUMENT,
                           f"token id {bad} is outside the vocabulary [0, {spec.vocab_size})")
    bounds = list(itertools.accumulate(lengths, initial=0))
    seqs = [ids] if len(lengths) == 1 else [ids[a:b] for a, b in zip(bounds, bounds[1:])]
    tts: list[np.ndarray | None] | None = None
    if token_type_ids:
        tt = np.frombuffer(token_type_ids, dtype="<i4")
        if tt.size != ids.size:
            raise RequestError(grpc.StatusCode.INVALID_ARGUMENT, "token_type_ids and input_ids differ in length")
        types = spec.config.get("type_vocab_size")  # models without token types ignore them
        types = None if types is None else max(int(types), 1)  # 0 means one type, as the BERT models read it
        if types is not None and tt.size and (int(tt.min()) < 0 or int(tt.max()) >= types):
            bad = int(tt[(tt < 0) | (tt >= types)][0])
            raise RequestError(grpc.StatusCode.INVALID_ARGUMENT,
                               f"token type id {bad} is outside the model's token types [0, {types})")
        tts = [tt[a:b] for a, b in zip(bounds, bounds[1:])]
    return seqs, tts


def check_reply_size(rows: int, per_token: bool, spec: ModelSpec) -> None:
    """Refuse a call whose reply would exceed MAX_REPLY_BYTES: ``rows`` float32 rows of the model's
    full width (``spec.dimension`` per sequence, ``spec.token_width`` per token with ``per_token``;
    the engine computes full rows before any Matryoshka truncation). A larger reply could not be
    sent (gRPC answered RESOURCE_EXHAUSTED once every row was computed, the replica holding several
    copies of them meanwhile); the gateway cuts its calls to fit (``ReplicaPool.row_bytes``).

    Raises RequestError(INVALID_ARGUMENT) naming the rows, their width and the limit.
    """
    width = spec.token_width if per_token else spec.dimension
    size = rows * width * 4
    if size > MAX_REPLY_BYTES:
        kind = "token" if per_token else "sequence"
        raise RequestError(grpc.StatusCode.INVALID_ARGUMENT,
                           f"the reply would hold {rows:,} {kind} rows of {width} float32 values ({size:,} bytes), "
                           f"more than the {MAX_REPLY_BYTES:,} bytes a reply may take; split the call")


def decode_request(req: pb.EmbedRequest, spec: ModelSpec) -> tuple[list[np.ndarray], list[np.ndarray | None] | None]:
    """``decode_sequences`` of a gRPC ``EmbedRequest``."""
    return decode_sequences(req.input_ids, req.lengths, req.token_type_ids, spec, req.per_token)


class InferenceService:
    """Implements ``bouquet.v1.Inference`` (see bouquet/proto/bouquet.proto)."""

    def __init__(self, cfg: ServeConfig, spec: ModelSpec, max_batch_tokens: int, depth: int = 1) -> None:
        self.cfg, self.spec = cfg, spec
        self.engine: StepEngine | None = None
        self.scheduler = Scheduler(max(max_batch_tokens, spec.max_seq_length), cfg.max_batch_seqs, cfg.max_queue_tokens)
        self.depth = depth
        self.ready = False
        self.draining = False
        self._wake = asyncio.Event()
        self._step_pool = ThreadPoolExecutor(1, thread_name_prefix="bouquet-step")
        self._wait_pool = ThreadPoolExecutor(1, thread_name_prefix="bouquet-wait")
        self._inflight_requests = 0
        self.stats = ReplicaStats()
        self.completed_requests = 0

    async def on_step_thread(self, fn: Callable[..., T], *args: object) -> T:
        """``fn(*args)`` on the thread that runs the engine's steps. Building and warming up the
        engine there keeps the CPU's OpenMP threads to one team: libgomp keeps a team per thread
        that ever ran a parallel region, and with more of its threads than cores it stops spinning
        at barriers, so every op of a step then waits on a futex wake (served batch 1 on 2 cores:
        a 2.5 ms forward took 4.9 ms)."""
        return await asyncio.get_running_loop().run_in_executor(self._step_pool, fn, *args)

    def attach(self, engine: StepEngine) -> None:
        """Start serving with ``engine`` (loaded and warmed up)."""
        self.engine = engine
        self.ready = True
        self._wake.set()

    # ---- RPCs ---------------------------------------------------------------------------
    async def Info(self, request: pb.InfoRequest, context: grpc.aio.ServicerContext) -> pb.InfoReply:
        s = self.spec
        e = self.engine.info if self.engine is not None else None  # None while the model loads
        reply = pb.InfoReply(
            model_id=s.model_id, architecture=s.architecture, task=s.task, dimension=s.dimension,
            max_seq_length=s.max_seq_length, device=e.device if e else "", dtype=e.dtype if e else "",
            ready=self.ready and not self.draining, attention=e.attention if e else "",
            pending_tokens=self.scheduler.pending_tokens, max_batch_tokens=self.scheduler.max_batch_tokens,
            pid=os.getpid(), completed_requests=self.completed_requests,
        )
        return self.stats.fill(reply, self.scheduler, self.engine, self._inflight_requests)

    async def Embed(self, request: pb.EmbedRequest, context: grpc.aio.ServicerContext) -> pb.EmbedReply:
        meta = dict(context.invocation_metadata() or ())
        traceparent = meta.get("traceparent")
        if traceparent:
            t0 = time.perf_counter()
            try:
                reply = await self._embed(request, context)
            except BaseException as e:
                code = context.code() if isinstance(e, Exception) else None
                log_traced(str(traceparent), str(meta.get("x-request-id", "")), len(request.lengths) // 4,
                           f"{getattr(code, 'name', type(e).__name__)}: {context.details() or ''}", t0)
                raise
            log_traced(str(traceparent), str(meta.get("x-request-id", "")), len(request.lengths) // 4, "ok", t0)
            return reply
        return await self._embed(request, context)

    async def _embed(self, request: pb.EmbedRequest, context: grpc.aio.ServicerContext) -> pb.EmbedReply:
        try:
            self.check_open()
            seqs, tts = decode_request(request, self.spec)
            dims = self.check_dimensions(request.dimensions)
        except RequestError as e:
            await context.abort(e.code, e.message)
            raise  # unreachable: abort raises
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        try:
            req = self.submit(seqs, tts, request.priority, lambda r: fut.done() or fut.set_result(None),
                              per_token=request.per_token, pool_skip=request.pool_skip, dimensions=dims)
        except QueueFull as e:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(e))
            raise  # unreachable: abort raises
        except RequestError as e:
            await context.abort(e.code, e.message)
            raise  # unreachable: abort raises
        try:
            await fut
        except asyncio.CancelledError:
            self.cancel(req)
            log.info("request %s cancelled by its client", request.request_id)
            raise
        if req.error is not None:
            await context.abort(grpc.StatusCode.INTERNAL if req.engine_failed else grpc.StatusCode.FAILED_PRECONDITION,
                                req.error)
        out = self.output(req, request.normalize if request.HasField("normalize") else None, dims)
        return pb.EmbedReply(output=pb.Tensor(data=out.tobytes(), dtype="float32", shape=list(out.shape)),
                             num_tokens=req.num_tokens)

    # ---- what both front ends (gRPC above, IPC in ipc_server.py) call ------------------------
    def check_open(self) -> None:
        """Raises RequestError(UNAVAILABLE) while the model loads or the replica drains."""
        if not self.ready or self.draining:
            raise RequestError(grpc.StatusCode.UNAVAILABLE,
                               "replica is not ready" if not self.ready else "replica is shutting down")

    def check_dimensions(self, dimensions: int) -> int | None:
        """0 → None (full size); else the value, or RequestError(INVALID_ARGUMENT) outside [1, D]."""
        if not dimensions:
            return None
        if not 1 <= dimensions <= self.spec.dimension:
            raise RequestError(grpc.StatusCode.INVALID_ARGUMENT,
                               f"dimensions must be in [1, {self.spec.dimension}], got {dimensions}")
        return dimensions

    def submit(self, seqs: list[np.ndarray], tts: list[np.ndarray | None] | None, priority: int,
               on_done: Callable[[Request], None], per_token: bool = False, pool_skip: int = 0,
               dimensions: int | None = None) -> Request:
        """Queue one request's sequences (int32 arrays); ``on_done(request)`` is called on the event
        loop once its rows are in or it failed (``request.error``). ``priority`` is a
        ``bouquet.v1.Priority``; AUTO is decided by size. ``per_token``: the engine's token
        outputs (``step_tokens``), one row per token. ``pool_skip``: leading tokens of every
        sequence (the prompt) left out of pooling; ``dimensions``: the Matryoshka size the caller
        will ask ``output`` for (checked here against ``per_token``). Raises QueueFull; RequestError
        (INVALID_ARGUMENT) when ``pool_skip`` is negative or set for a scoring model, for an unknown ``priority``, and for
        ``dimensions`` with ``per_token``. A ``pool_skip`` covering a whole sequence is not an error
        (mean pooling then gives sentence-transformers' zero vector)."""
        if pool_skip < 0:
            raise RequestError(grpc.StatusCode.INVALID_ARGUMENT, f"pool_skip must be >= 0, got {pool_skip}")
        if pool_skip and self.spec.task != "embed":  # a scoring head reads its own token: a skip would move it
            raise RequestError(grpc.StatusCode.INVALID_ARGUMENT,
                               "pool_skip applies to embedding models (a prompt left out of pooling), not to this "
                               "scoring model")
        if priority not in (pb.PRIORITY_AUTO, pb.PRIORITY_INTERACTIVE, pb.PRIORITY_BATCH):
            raise RequestError(grpc.StatusCode.INVALID_ARGUMENT,
                               f"priority must be 0 (auto), 1 (interactive) or 2 (batch), got {priority}")
        if per_token and dimensions:
            raise RequestError(grpc.StatusCode.INVALID_ARGUMENT,
                               "dimensions (Matryoshka truncation) applies to pooled rows, not to per_token outputs")
        n_tokens = sum(len(s) for s in seqs)
        if priority == pb.PRIORITY_INTERACTIVE:
            prio = Priority.INTERACTIVE
        elif priority == pb.PRIORITY_BATCH:
            prio = Priority.BATCH
        else:
            prio = Priority.INTERACTIVE if n_tokens <= self.cfg.interactive_max_tokens else Priority.BATCH

        def done(r: Request) -> None:
            self._inflight_requests -= 1
            on_done(r)

        req = Request(seqs, tts, prio, on_done=done, per_token=per_token, pool_skip=pool_skip)
        self.scheduler.add(req)  # raises QueueFull before anything is counted
        self._inflight_requests += 1
        self._wake.set()
        return req

    def cancel(self, req: Request) -> None:
        """The caller stopped waiting: drop ``req``'s queued sequences; its ``on_done`` never runs."""
        if req.remaining and not req.cancelled:
            self._inflight_requests -= 1
            req.on_done = None
            dropped = self.scheduler.cancel(req)
            log.debug("%d queued sequences dropped", dropped)

    def output(self, req: Request, normalize: bool | None, dims: int | None) -> np.ndarray:
        """A finished request's rows as float32 LE [B, D'] (pooled rows finalized: Matryoshka
        truncation to ``dims``, then L2 normalization, the model's default when ``normalize``
        is None; scores as they are)."""
        if req.per_token:  # token rows [len_i, D'] per sequence, back to back; nothing to finalize
            self.completed_requests += 1
            return np.ascontiguousarray(np.concatenate(req.rows), dtype="<f4")  # type: ignore[arg-type]
        rows = req.rows[0][None, :] if len(req.rows) == 1 else np.stack(req.rows)  # type: ignore[index, arg-type]
        if self.spec.task == "embed":
            rows = finalize(rows, self.spec.normalize if normalize is None else normalize, dims)
        self.completed_requests += 1
        return np.ascontiguousarray(rows, dtype="<f4")

    # ---- engine loop ----------------------------------------------------------------------
    def _inline(self, engine: StepEngine, batch: Batch) -> bool:
        """Whether ``engine.step(batch)`` is cheap enough to call on the event loop: the no-op
        engine (``inline_step``), or a CUDA-graph replay of a captured bucket (``replays``), whose
        host work costs less than two thread handoffs."""
        return engine.inline_step or engine.replays(batch)

    def _launch(self, engine: StepEngine, sb: ScheduledBatch) -> Callable[[Batch], ResultHandle]:
        """The engine call for a batch: token outputs for a per-token batch, pooled rows otherwise."""
        return engine.step_tokens if sb.per_token else engine.step

    async def run(self) -> None:
        """Form batches and drive the engine until cancelled.

        A cheap step (``_inline``) is launched on the loop, any other in a helper thread; a
        finished handle is read on the loop, a running one waited for in a helper thread, except
        a graph replay with nothing else queued or in flight, waited for on the loop (nothing could
        run meanwhile, and the two thread hops are much of a small model's batch-1 latency).
        Tried on the H200 and not done (6603f18:bench/results/h200-2026-11-30b/README.md): a loop that
        polled the device with ``sleep(0)`` starved gRPC's own thread of the GIL, and launching
        work that arrives during a wait at once (instead of after it) lowered served throughput.
        """
        loop = asyncio.get_running_loop()
        inflight: deque[tuple[ScheduledBatch, ResultHandle, float]] = deque()
        while True:
            engine, sb = self.engine, None
            if engine is not None and len(inflight) < self.depth:
                sb = self.scheduler.next_batch()
            if sb is not None:
                assert engine is not None
                t_launch = time.perf_counter()
                try:
                    if not sb.per_token and self._inline(engine, sb.batch):
                        handle = engine.step(sb.batch)
                    else:
                        handle = await loop.run_in_executor(self._step_pool, self._launch(engine, sb), sb.batch)
                except Exception as e:  # noqa: BLE001 - one bad batch must not stop the replica
                    log.exception("engine step failed")
                    self.scheduler.complete(sb, None, error=f"engine failure: {type(e).__name__}: {e}")
                    continue
                inflight.append((sb, handle, t_launch))
                continue
            if inflight:
                assert engine is not None  # batches are in flight only once an engine is attached
                sb0, h, t0 = inflight.popleft()
                try:
                    if h.ready():  # nothing to block on (CPU engine, finished CUDA event): no thread hop
                        rows = h.wait()
                    elif (not inflight and not self.scheduler.has_pending() and not sb0.per_token
                          and self._inline(engine, sb0.batch)):
                        # Idle but for this graph replay (bounded: at most --graph-max-tokens): wait
                        # on the loop. Nothing could be launched meanwhile, and two thread hops
                        # are the largest part of a small model's served batch-1 latency.
                        rows = h.wait()
                    else:
                        rows = await loop.run_in_executor(self._wait_pool, h.wait)
                except Exception as e:  # noqa: BLE001
                    log.exception("engine result failed")
                    self.scheduler.complete(sb0, None, error=f"engine failure: {type(e).__name__}: {e}")
                    continue
                self.stats.observe_step(sb0.batch.num_tokens, sb0.batch.num_seqs, time.perf_counter() - t0)
                self.scheduler.complete(sb0, rows)
                continue
            self._wake.clear()
            if not self.scheduler.has_pending():
                await self._wake.wait()

    async def drain(self, timeout_s: float) -> None:
        """Refuse new work and wait (bounded) for requests in flight to finish."""
        self.draining = True
        deadline = time.monotonic() + timeout_s
        while self._inflight_requests and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
