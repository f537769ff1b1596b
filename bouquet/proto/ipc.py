"""The gateway → replica contract between processes of one host: frames on a Unix socket.

gRPC (``bouquet.proto``) stays the protocol to a replica on another machine (``--server
HOST:PORT``). Replicas that ``bouquet serve`` starts itself are reached this way instead: each
gateway worker holds one Unix-socket connection per replica, read on its event loop, and so does
the replica. Measured on the CI machine (bench/results/cpu-2core.md): a round trip costs
48 µs against 148 µs for ZeroMQ's DEALER/ROUTER over ``ipc://`` (two I/O-thread hops each way) and
~400 µs of CPU per side for a Python gRPC call.

A frame is ``header_len u32 | payload_len u32 | header | payload`` (little-endian): the header
is msgpack (msgspec), the payload raw little-endian tensors:

* ``EmbedCall``: payload = lengths int32 [B] ‖ input_ids int32 [T] ‖ token_type_ids int32 [T]
  (the last only when ``with_types``); one ``EmbedReply`` answers it, payload float32 [rows, dim]
  when OK (one row per sequence, or per token with ``per_token``: the sequences' token rows back
  to back), empty otherwise;
* ``CancelCall``: no payload and no reply (the gateway stopped waiting; queued sequences are
  dropped).

What this module does not own: sockets and event loops (gateway/channels.py, server/ipc_server.py).
"""
from __future__ import annotations

import struct
from enum import IntEnum
from typing import Callable

import msgspec


class Status(IntEnum):
    """A reply's outcome; the names follow the gRPC status codes the gRPC path uses."""

    OK = 0
    INVALID_ARGUMENT = 1  # the input is at fault (HTTP 400)
    FAILED_PRECONDITION = 2  # the model could not produce a finite result for it (HTTP 422)
    UNAVAILABLE = 3  # loading or draining: try another replica
    RESOURCE_EXHAUSTED = 4  # queue full: try another replica, else HTTP 429
    INTERNAL = 5  # the engine failed on the step that held the call (HTTP 500)


class EmbedCall(msgspec.Struct, tag="embed", array_like=True, frozen=True):
    """Run the sequences of the payload; one output row per sequence."""

    id: int  # chosen by the gateway connection, unique among its calls in flight
    num_seqs: int  # B
    with_types: bool  # the payload ends with token_type_ids
    priority: int  # bouquet.v1.Priority (0 auto, 1 interactive, 2 batch)
    normalize: bool | None = None  # None: the model's default
    dimensions: int = 0  # 0: the model's full size (Matryoshka truncation otherwise)
    per_token: bool = False  # one row per token (the model's token outputs: bge-m3 heads, hidden states)
    pool_skip: int = 0  # leading tokens of every sequence left out of pooling (a prompt; include_prompt=false)
    # The HTTP request's W3C traceparent and request id, for the replica's log ("" = not traced)
    traceparent: str = ""
    request_id: str = ""


class CancelCall(msgspec.Struct, tag="cancel", array_like=True, frozen=True):
    """The caller of ``id`` is gone: drop its sequences that have not run; no reply follows."""

    id: int


class EmbedReply(msgspec.Struct, array_like=True, frozen=True):
    """The answer to ``EmbedCall`` ``id``: ``rows`` × ``dim`` float32 in the payload when OK."""

    id: int
    status: int  # Status
    message: str = ""
    rows: int = 0
    dim: int = 0
    num_tokens: int = 0


Call = EmbedCall | CancelCall
_PREFIX = struct.Struct("<II")
_encode = msgspec.msgpack.Encoder().encode
decode_call = msgspec.msgpack.Decoder(Call).decode
decode_reply = msgspec.msgpack.Decoder(EmbedReply).decode


def frame(header: msgspec.Struct, *payload: bytes | memoryview) -> bytes:
    """One frame: the header and the payload parts (byte buffers: ``len`` counts bytes) back to back."""
    h = _encode(header)
    size = sum(len(p) for p in payload)
    return b"".join((_PREFIX.pack(len(h), size), h, *payload))


class FrameReader:
    """Feeds stream bytes in, calls ``on_frame(header, payload)`` once per complete frame (both
    ``bytes``). Frames may arrive split or several per read."""

    def __init__(self, on_frame: Callable[[bytes, bytes], None]) -> None:
        self.on_frame = on_frame
        self._buf = bytearray()

    def feed(self, data: bytes) -> None:
        if not self._buf and len(data) >= 8:
            # The common case: whole frames in this read; slice the bytes without buffering them.
            pos, n = 0, len(data)
            while n - pos >= 8:
                hl, pl = _PREFIX.unpack_from(data, pos)
                end = pos + 8 + hl + pl
                if end > n:
                    break
                self.on_frame(data[pos + 8:pos + 8 + hl], data[pos + 8 + hl:end])
                pos = end
            if pos < n:
                self._buf += data[pos:]
            return
        buf = self._buf
        buf += data
        while len(buf) >= 8:
            hl, pl = _PREFIX.unpack_from(buf, 0)
            end = 8 + hl + pl
            if len(buf) < end:
                return
            header, payload = bytes(buf[8:8 + hl]), bytes(buf[8 + hl:end])
            del buf[:end]
            self.on_frame(header, payload)
