"""CUDA graphs for the whole forward pass (embeddings → layers → pooling → head), one per bucket.

``GraphManager`` owns the static input buffer, the memory pool shared by every graph, and the
bucket table (through ``LazyCapture``: eager on first sight, capture on the second, then replay).

Segments. A bucket's forward pass is captured as a few graphs cut at layer boundaries (the model's
``blocks()``: after the first layer, then segments 4× longer, see ``segment_starts``), replayed in
order. Why: the host time of ``cudaGraphLaunch`` grows with the graph's nodes (~0.6 µs each on the
H200 host: ~0.19 ms for Qwen3-0.6B's ~300 kernels) and the GPU starts a graph only once its launch
returns, so at batch 1 one whole-forward graph adds its launch time to the latency. Cut this way,
the GPU starts after the first layer's launch and each later launch finishes while the GPU is still
running the segment before it (a layer's kernels take the GPU ≥ 3× longer than their launch).
The segments share the pool and are captured in the order they replay, which is what makes
memory shared between them safe (tensors crossing a cut, like the residual stream, stay allocated).
Always on (the ``--no-graph-segments`` baseline was removed; measurements: docs/decisions.md,
"the kernel plan").

Input layout. All integer inputs of a batch travel as ONE int32 array, so an H2D transfer is one
copy from pinned memory. For a bucket of ``T`` tokens and ``S`` slots::

    [0, T)        input_ids       padding rows: 0
    [T, 2T)       position_ids    padding rows: 0
    [2T, 3T)      token_type_ids  padding rows: 0
    [3T, 4T)      segment id      sequence index of each token; padding rows, and the first
                                  ``Batch.pool_skip[b]`` tokens of sequence b: S (a discarded row)
    [4T, 4T+S+1)  cu_seqlens      the tail repeats the last offset: padding slots are empty

The graph for a bucket reads views of the first ``4T+S+1`` elements of the static buffer. A step
packs its batch into the first elements of a pinned host twin of that buffer (``staging``), and
each graph's first node copies them in (a memcpy node captured with the graph), so a replay is:
pack on the host, replay, slice the first B output rows. Why the copy is in the graph: at batch 1
the host's time before the GPU starts is on the latency's path, and a separate copy call took
~14 µs of it on the H200 host, a pinned buffer per step ~2. The
staging buffer is reused, so a step first waits for the previous replay's copy to have read it
(an event after the first segment: at batch 1 long done; a pipelined step waits at most for the
step before it to start). Padding is filled on the host while packing (``pack_into``), which costs
less than extra device kernels.

What it does NOT own: the model and its weights, pooling semantics (``pooling.pooler``),
the device→host result copy and its event (``engine.Engine.step``), batching policy, and
concurrency: graphs share one pool and one staging buffer, so steps must come from one thread in
stream order and the caller must copy a replay's output out (enqueued on the same stream) before
the next replay.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
import torch
from torch import nn

from bouquet.engine.runtime.batch import Batch
from bouquet.engine.runtime.buckets import Bucket, LazyCapture

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
    host = torch.empty(packed_size(tokens, seqs), dtype=torch.int32, pin_memory=pin and torch.cuda.is_available())
    pack_into(host.numpy(), batch, tokens, seqs)
    return host


def pack_into(h: np.ndarray, batch: Batch, tokens: int, seqs: int) -> None:
    """Write ``batch`` into ``h`` (int32, at least ``packed_size(tokens, seqs)`` elements) in the
    layout above. A single sequence, the batch-1 case whose host time is on the latency's path,
    skips the per-token segment ids' arithmetic (its segment is 0)."""
    t, b, T = batch.num_tokens, batch.num_seqs, tokens
    h[0:t] = batch.input_ids
    h[t:T] = 0
    h[T:T + t] = batch.position_ids
    h[T + t:3 * T] = 0  # the positions' padding and the token types (overwritten below where given)
    if batch.token_type_ids is not None:
        h[2 * T:2 * T + t] = batch.token_type_ids
    seg = h[3 * T:3 * T + t]
    if b == 1:
        seg[:] = 0
    else:
        seg[:] = np.repeat(np.arange(b, dtype=np.int32), np.diff(batch.cu_seqlens))
    if batch.pool_skip is not None:
        # Prompt tokens that pooling leaves out join the padding's discarded segment: pooling
        # then needs no extra input, and a graph's buffers keep their layout.
        seg[skipped_tokens(batch)] = seqs
    h[3 * T + t:4 * T] = seqs
    h[4 * T:4 * T + b + 1] = batch.cu_seqlens
    h[4 * T + b + 1:packed_size(tokens, seqs)] = t


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
    segments: list[torch.cuda.CUDAGraph]  # the forward pass, in replay order
    out: torch.Tensor  # [S, out_dim] float32, lives in the shared pool
    out_ptr: int

    def replay(self) -> None:
        for g in self.segments:
            g.replay()


def segment_starts(n_blocks: int, first: int = 1, growth: int = 4) -> list[int]:
    """Indices of the blocks that begin a new graph segment: after ``first`` blocks, then segments
    ``growth`` times longer than the one before (n = 28: [1, 5, 21]; n = 12: [1, 5]; n = 6: [1, 5])."""
    starts, at, size = [], first, first * growth
    while at < n_blocks:
        starts.append(at)
        at, size = at + size, size * growth
    return starts


class GraphManager:
    """Captures and replays ``forward`` per bucket on ``device``.

    ``max_tokens``/``max_seqs``: the largest bucket (sizes the static buffer). ``use_types``:
    whether ``forward`` receives token-type ids (else None). ``blocks``: the model's layers in the
    order ``forward`` calls them (``PackedModel.blocks``), where captures are cut into segments;
    empty: one graph per bucket. ``debug``: assert on every replay that the static buffer and the
    graph's output never moved.
    """

    def __init__(self, forward: ForwardFn, device: torch.device, max_tokens: int, max_seqs: int,
                 use_types: bool, debug: bool = False, blocks: Sequence[nn.Module] = ()) -> None:
        self.forward, self.device, self.use_types, self.debug = forward, device, use_types, debug
        self.blocks = list(blocks)
        self.cuts = segment_starts(len(self.blocks))
        self.stream = torch.cuda.Stream(device)  # captures run off the current stream, as torch.cuda.graph's do
        self.max_tokens, self.max_seqs = max_tokens, max_seqs
        self.buf = torch.zeros(packed_size(max_tokens, max_seqs), dtype=torch.int32, device=device)
        self._buf_ptr = self.buf.data_ptr()
        self.staging = torch.zeros(self.buf.shape, dtype=torch.int32, pin_memory=True)  # the host twin
        self._staging_np = self.staging.numpy()
        self._staged = torch.cuda.Event()  # recorded behind the last enqueued copy out of staging
        self.pool = torch.cuda.graph_pool_handle()
        self.lazy: LazyCapture[_Graph] = LazyCapture(self._capture)
        self.replayed = 0  # replays so far (the replica's graph_replays counter)

    @torch.inference_mode()
    def _run_forward(self, bucket: Bucket) -> torch.Tensor:
        ids, pos, tt, seg, cu = input_views(self.buf, bucket.tokens, bucket.seqs)
        return self.forward(ids, pos, tt if self.use_types else None, seg, cu, bucket.max_seqlen, bucket.uniform)

    def _copy_in(self, bucket: Bucket) -> None:
        # pinned → device, asynchronous; inside a capture it becomes the graph's memcpy node
        n = packed_size(bucket.tokens, bucket.seqs)
        self.buf[:n].copy_(self.staging[:n], non_blocking=True)

    def stage(self, batch: Batch, bucket: Bucket) -> None:
        """Pack ``batch`` into the staging buffer for ``bucket``, once the copy of the step before
        has read it (``_staged``; returns at once when it has)."""
        self._staged.synchronize()
        pack_into(self._staging_np, batch, bucket.tokens, bucket.seqs)

    @torch.inference_mode()
    def _capture(self, bucket: Bucket) -> _Graph:
        # One run on a side stream first: lazy library state (cuBLAS workspaces, autotuning)
        # must not be initialised inside the capture.
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            self._copy_in(bucket)
            self._run_forward(bucket)
        torch.cuda.current_stream(self.device).wait_stream(side)
        torch.cuda.synchronize(self.device)
        segments = [torch.cuda.CUDAGraph() for _ in range(len(self.cuts) + 1)]
        live = iter(segments)
        current = next(live)

        def begin(graph: torch.cuda.CUDAGraph) -> None:
            # thread_local: the server's wait thread synchronizes events while we capture.
            graph.capture_begin(pool=self.pool, capture_error_mode="thread_local")

        def cut(_module: nn.Module, _args: object) -> None:  # a forward pre-hook on a block
            nonlocal current
            current.capture_end()
            current = next(live)
            begin(current)

        hooks = [self.blocks[i].register_forward_pre_hook(cut) for i in self.cuts]
        try:
            with torch.cuda.stream(self.stream):
                begin(current)
                try:
                    self._copy_in(bucket)
                    out = self._run_forward(bucket)
                finally:
                    current.capture_end()
        finally:
            for h in hooks:
                h.remove()
        torch.cuda.current_stream(self.device).wait_stream(self.stream)
        if current is not segments[-1]:
            raise RuntimeError(f"capture of {bucket} saw {segments.index(current) + 1} of {len(segments)} segments: "
                               "the model's blocks() are not the layers its forward calls")
        log.debug("captured graph for bucket %s in %d segments", bucket, len(segments))
        return _Graph(segments, out, out.data_ptr())

    def run(self, bucket: Bucket, batch: Batch) -> torch.Tensor:
        """``batch`` in ``bucket`` (its tokens ≤ bucket.tokens, sequences ≤ bucket.seqs) →
        [bucket.seqs, out_dim] float32 on the device. Eager on a bucket's first sight, captured
        on the second, replayed afterwards. The returned tensor is overwritten by the next call:
        copy it out first (stream order suffices)."""
        if self.debug:
            assert batch.num_tokens <= bucket.tokens and batch.num_seqs <= bucket.seqs, (batch.num_tokens, bucket)
        self.stage(batch, bucket)
        g = self.lazy.lookup(bucket)
        if g is None:
            self._copy_in(bucket)
            self._staged.record()
            return self._run_forward(bucket)
        g.segments[0].replay()  # its first node copies the staged inputs in
        self._staged.record()
        for seg in g.segments[1:]:
            seg.replay()
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
            self.stage(Batch.pack(seqs), b)
            self.lazy.ensure(b)  # its side-stream run reads staging; the capture only records
        torch.cuda.synchronize(self.device)

    def stats(self) -> dict[str, object]:
        """Captured buckets, capture seconds, hit histogram (for logs and the bench)."""
        lz = self.lazy
        return {
            "captured": len(lz.graphs),
            "capture_s": round(sum(lz.capture_seconds.values()), 3),
            "hits": {str(b): n for b, n in lz.hits.most_common()},
        }
