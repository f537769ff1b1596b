"""The replica's front end for gateway workers on the same host: a Unix socket (proto/ipc.py).

Each gateway worker keeps one connection; frames are read on the replica's event loop by a
``asyncio.Protocol``, so a call costs no task, no future and no thread hop: it is decoded,
validated (``decode_sequences``, as on the gRPC path) and queued with the service, and the
scheduler's completion callback writes the reply. That is what takes a Python gRPC call's cost
off every request (bench/results/cpu-2core.md). A connection that closes (its gateway
worker exited) drops the queued sequences of its calls, as a cancelled gRPC call does.

What this module does not own: batching and the engine (service.py, scheduler.py), health and
``Info`` (still gRPC), the gateway side (gateway/channels.py).
"""
from __future__ import annotations

import asyncio
import logging
import os
import time

import grpc
import numpy as np

from bouquet.proto import ipc
from bouquet.server.scheduler import QueueFull, Request
from bouquet.server.service import InferenceService, RequestError, decode_sequences, log_traced

log = logging.getLogger(__name__)

_INVALID = grpc.StatusCode.INVALID_ARGUMENT
_STATUS = {"INVALID_ARGUMENT": ipc.Status.INVALID_ARGUMENT, "UNAVAILABLE": ipc.Status.UNAVAILABLE,
           "FAILED_PRECONDITION": ipc.Status.FAILED_PRECONDITION, "RESOURCE_EXHAUSTED": ipc.Status.RESOURCE_EXHAUSTED}


class _Connection(asyncio.Protocol):
    """One gateway worker's connection: its calls in flight, keyed by call id."""

    def __init__(self, service: InferenceService) -> None:
        self.service = service
        self.transport: asyncio.Transport | None = None
        self.reader = ipc.FrameReader(self._on_frame)
        self.live: dict[int, Request] = {}

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.reader.feed(data)

    def connection_lost(self, exc: Exception | None) -> None:
        live, self.live = self.live, {}
        for req in live.values():
            self.service.cancel(req)
        self.transport = None

    def _on_frame(self, header: bytes, payload: bytes) -> None:
        try:
            call = ipc.decode_call(header)
        except Exception:  # noqa: BLE001 - a malformed frame is logged; the connection goes on
            log.exception("malformed IPC frame (%d header bytes)", len(header))
            return
        if isinstance(call, ipc.CancelCall):
            req = self.live.pop(call.id, None)
            if req is not None:
                self.service.cancel(req)
            return
        svc = self.service
        t0 = time.perf_counter()
        try:
            svc.check_open()
            b = call.num_seqs
            if b < 1 or len(payload) < 4 * b:
                raise RequestError(_INVALID, f"payload of {len(payload)} bytes holds no lengths for {b} sequences")
            body = memoryview(payload)
            ids, tts = body[4 * b:], memoryview(b"")
            if call.with_types:
                half = len(ids) // 2
                ids, tts = ids[:half], ids[half:]
            seqs, types = decode_sequences(ids, body[:4 * b], tts, svc.spec, call.per_token)
            dims = svc.check_dimensions(call.dimensions)
            self.live[call.id] = svc.submit(seqs, types, call.priority, lambda r: self._finish(call, dims, r, t0),
                                            per_token=call.per_token, pool_skip=call.pool_skip, dimensions=dims)
        except RequestError as e:
            self._send(ipc.frame(ipc.EmbedReply(call.id, _STATUS.get(e.code.name, ipc.Status.INVALID_ARGUMENT), e.message)))
            if call.traceparent:
                log_traced(call.traceparent, call.request_id, call.num_seqs, f"{e.code.name}: {e.message}", t0)
        except QueueFull as e:
            self._send(ipc.frame(ipc.EmbedReply(call.id, ipc.Status.RESOURCE_EXHAUSTED, str(e))))
            if call.traceparent:
                log_traced(call.traceparent, call.request_id, call.num_seqs, f"RESOURCE_EXHAUSTED: {e}", t0)

    def _finish(self, call: ipc.EmbedCall, dims: int | None, req: Request, t0: float) -> None:
        self.live.pop(call.id, None)
        status = ipc.Status.INTERNAL if req.engine_failed else ipc.Status.FAILED_PRECONDITION
        if call.traceparent:
            log_traced(call.traceparent, call.request_id, call.num_seqs, f"{status.name}: {req.error}"
                       if req.error is not None else f"ok, {req.num_tokens} tokens", t0)
        if req.error is not None:
            self._send(ipc.frame(ipc.EmbedReply(call.id, status, req.error)))
            return
        out: np.ndarray = self.service.output(req, call.normalize, dims)
        self._send(ipc.frame(ipc.EmbedReply(call.id, ipc.Status.OK, "", out.shape[0], out.shape[1], req.num_tokens),
                             out.data.cast("B")))

    def _send(self, data: bytes) -> None:
        if self.transport is not None:  # a gateway worker that went away gets nothing
            self.transport.write(data)


class IpcServer:
    """Serves ``EmbedCall``/``CancelCall`` frames on the Unix socket ``path`` for ``service``."""

    def __init__(self, service: InferenceService, path: str) -> None:
        self.service, self.path = service, path
        self._server: asyncio.AbstractServer | None = None

    async def start(self) -> None:
        """Listen (replacing a stale socket file left by a killed replica). The socket is the
        replica's only unauthenticated way in, so it must be private: its folder owned by this user
        and closed to others (``bouquet serve`` makes it with mkdtemp: mode 0700), the socket
        itself mode 0600. Raises ValueError for a folder others can enter."""
        folder = os.path.dirname(os.path.abspath(self.path))
        st = os.stat(folder)
        if st.st_uid != os.getuid() or st.st_mode & 0o077:
            raise ValueError(f"--ipc-path {self.path}: its folder must be private to this user (mode 0700), "
                             f"it has mode {st.st_mode & 0o777:o} and owner uid {st.st_uid}")
        if os.path.exists(self.path):
            os.unlink(self.path)
        loop = asyncio.get_running_loop()
        self._server = await loop.create_unix_server(lambda: _Connection(self.service), self.path)
        os.chmod(self.path, 0o600)  # only this user's processes may connect (the folder already says so)

    def close(self) -> None:
        if self._server is not None:
            self._server.close()
        try:
            os.unlink(self.path)
        except OSError:
            pass

