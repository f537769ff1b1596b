"""CUDA graphs for the whole forward pass (embeddings → layers → pooling → head), one per bucket.

``GraphManager`` owns the static input buffer, the memory pool shared by every graph, and the
bucket table (through ``LazyCapture``: eager on first sight, capture on the second, then replay).

Input layout. All integer inputs of a batch travel as ONE int32 array, so an H2D transfer is one
copy from pinned memory. For a bucket of ``T`` tokens and ``S`` slots::

    [0, T)        input_ids       padding rows: 0
    [T, 2T)       position_ids    padding rows: 0
    [2T, 3T)      token_type_ids  padding rows: 0
    [3T, 4T)      segment id      sequence index of each token; padding rows, and the first
                                  ``Batch.pool_skip[b]`` tokens of sequence b: S (a discarded row)
    [4T, 4T+S+1)  cu_seqlens      the tail repeats the last offset: padding slots are empty

The graph for a bucket reads views of the first ``4T+S+1`` elements of the static buffer, so a
replay is: copy the packed host array into the buffer's first rows, replay, slice the first B
output rows. Padding is filled on the host while packing (``pack_inputs``), which costs less
than extra device kernels.

What it does NOT own: the model and its weights, pooling semantics (``pooling.pooler``),
the device→host result copy and its event (``engine.Engine.step``), batching policy, and
concurrency: graphs share one pool, so replays must come from one thread in stream order and the
caller must copy a replay's output out (enqueued on the same stream) before the next replay.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from bouquet.engine.batch import Batch
from bouquet.engine.buckets import Bucket, LazyCapture

log = logging.getLogger(__name__)

# forward(ids, pos, types, seg, cu, max_seqlen, uniform) → [S, out_dim] float32; shapes [T], [S+1] int32
ForwardFn = Callable[[torch.Tensor, torch.Tensor, "torch.Tensor | None", torch.Tensor, torch.Tensor, int, bool],
                     torch.Tensor]


def packed_size(tokens: int, seqs: int) -> int:
    return 4 * tokens + seqs + 1


def pack_inputs(batch: Batch, tokens: int, seqs: int, pin: bool = True) -> torch.Tensor:
    """Batch → int32 [4·tokens + seqs + 1] in the layout above (tokens ≥ batch tokens, seqs ≥
    batch sequences; equal for an eager batch). Pinned (when ``pin`` and CUDA is present) so the
    H2D copy is truly async; the CPU engine, which copies nothing, passes ``pin=False``."""
    t, b = batch.num_tokens, batch.num_seqs
    host = torch.empty(packed_size(tokens, seqs), dtype=torch.int32, pin_memory=pin and torch.cuda.is_available())
    h = host.numpy()
    T = tokens
    h[:4 * T] = 0
    h[0:t] = batch.input_ids
    h[T:T + t] = batch.position_ids
    if batch.token_type_ids is not None:
        h[2 * T:2 * T + t] = batch.token_type_ids
    seg = h[3 * T:3 * T + t]
    seg[:] = np.repeat(np.arange(b, dtype=np.int32), np.diff(batch.cu_seqlens))
    if batch.pool_skip is not None:
        # Prompt tokens that pooling leaves out join the padding's discarded segment: pooling
        # then needs no extra input, and a graph's buffers keep their layout.
        seg[skipped_tokens(batch)] = seqs
    h[3 * T + t:4 * T] = seqs
    h[4 * T:4 * T + b + 1] = batch.cu_seqlens
    h[4 * T + b + 1:] = t
    return host


def skipped_tokens(batch: Batch) -> np.ndarray:
    """bool [T]: the tokens of ``batch`` that ``Batch.pool_skip`` leaves out of pooling."""
    assert batch.pool_skip is not None
    lengths = np.diff(batch.cu_seqlens)
    return batch.position_ids < np.repeat(batch.pool_skip, lengths)


def input_views(buf: torch.Tensor, tokens: int, seqs: int) -> tuple[torch.Tensor, ...]:
    """(ids, pos, types, seg, cu) views of a packed device buffer; no copies."""
    T = tokens
    return buf[0:T], buf[T:2 * T], buf[2 * T:3 * T], buf[3 * T:4 * T], buf[4 * T:4 * T + seqs + 1]


@dataclass
class _Graph:
    graph: torch.cuda.CUDAGraph
    out: torch.Tensor  # [S, out_dim] float32, lives in the shared pool
    out_ptr: int


class GraphManager:
    """Captures and replays ``forward`` per bucket on ``device``.

    ``max_tokens``/``max_seqs``: the largest bucket (sizes the static buffer). ``use_types``:
    whether ``forward`` receives token-type ids (else None). ``debug``: assert on every replay that
    the static buffer and the graph's output never moved.
    """

    def __init__(self, forward: ForwardFn, device: torch.device, max_tokens: int, max_seqs: int,
                 use_types: bool, debug: bool = False) -> None:
        self.forward, self.device, self.use_types, self.debug = forward, device, use_types, debug
        self.max_tokens, self.max_seqs = max_tokens, max_seqs
        self.buf = torch.zeros(packed_size(max_tokens, max_seqs), dtype=torch.int32, device=device)
        self._buf_ptr = self.buf.data_ptr()
        self.pool = torch.cuda.graph_pool_handle()
        self.lazy: LazyCapture[_Graph] = LazyCapture(self._capture)
        self.replayed = 0  # replays so far (the replica's graph_replays counter)

    def _run_forward(self, bucket: Bucket) -> torch.Tensor:
        ids, pos, tt, seg, cu = input_views(self.buf, bucket.tokens, bucket.seqs)
        return self.forward(ids, pos, tt if self.use_types else None, seg, cu, bucket.max_seqlen, bucket.uniform)

    def _capture(self, bucket: Bucket) -> _Graph:
        # One run on a side stream first: lazy library state (cuBLAS workspaces, autotuning)
        # must not be initialised inside the capture.
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            self._run_forward(bucket)
        torch.cuda.current_stream(self.device).wait_stream(side)
        g = torch.cuda.CUDAGraph()
        # thread_local: the server's wait thread synchronizes events while we capture.
        with torch.cuda.graph(g, pool=self.pool, capture_error_mode="thread_local"):
            out = self._run_forward(bucket)
        log.debug("captured graph for bucket %s", bucket)
        return _Graph(g, out, out.data_ptr())

    def load(self, host: torch.Tensor) -> None:
        """Copy a packed (pinned) host array into the buffer's first rows, asynchronously."""
        self.buf[:host.shape[0]].copy_(host, non_blocking=True)

    def run(self, bucket: Bucket, host: torch.Tensor) -> torch.Tensor:
        """Inputs packed for ``bucket`` → [bucket.seqs, out_dim] float32 on the device. Eager on a
        bucket's first sight, captured on the second, replayed afterwards. The returned tensor
        is overwritten by the next call: copy it out first (stream order suffices)."""
        if self.debug:
            assert host.shape[0] == packed_size(bucket.tokens, bucket.seqs), (host.shape, bucket)
        self.load(host)
        g = self.lazy.lookup(bucket)
        if g is None:
            return self._run_forward(bucket)
        g.graph.replay()
        self.replayed += 1
        if self.debug:
            assert self.buf.data_ptr() == self._buf_ptr, "static input buffer moved"
            assert g.out.data_ptr() == g.out_ptr, f"graph output of {bucket} moved"
        return g.out

    def precapture(self, buckets: list[Bucket], vocab_ok_id: int = 1) -> None:
        """Capture ``buckets`` now (start-up), with dummy inputs of the right shape."""
        for b in buckets:
            if b.tokens > self.max_tokens or b.seqs > self.max_seqs:
                log.warning("skipping start-up bucket %s: larger than the graph limit (%d tokens, %d slots)",
                            b, self.max_tokens, self.max_seqs)
                continue
            seqs = [np.full(n, vocab_ok_id, dtype=np.int32) for n in b.example_lengths()]
            self.load(pack_inputs(Batch.pack(seqs), b.tokens, b.seqs))
            self.lazy.ensure(b)
        torch.cuda.synchronize(self.device)

    def stats(self) -> dict[str, object]:
        """Captured buckets, capture seconds, hit histogram (for logs and the bench)."""
        lz = self.lazy
        return {
            "captured": len(lz.graphs),
            "capture_s": round(sum(lz.capture_seconds.values()), 3),
            "hits": {str(b): n for b, n in lz.hits.most_common()},
        }
