"""Bucket arithmetic and the lazy-capture state machine of the CUDA-graph path (no torch, no CUDA).

A *bucket* is the static shape a CUDA graph is captured for: sequence slots, token count and the
``max_seqlen`` bound given to the attention kernel. Rounding a batch up to its bucket keeps the
number of graphs small; every quantity is rounded separately because each one costs time when it
is loose: varlen attention slows down with a loose ``max_seqlen`` bound or many empty sequence
slots (on the H200, one layer over 16,384 tokens about doubles with a 4× loose bound).

``LazyCapture`` decides, per bucket, whether a batch runs eagerly, is captured, or is replayed:
first sight → eager (it warms up kernels and allocator), second sight → capture, then replay. It
counts hits so the hot buckets can be saved on shutdown and captured at the next start. The
capture itself is a strategy passed in (the CUDA one lives in ``graphs.py``), so this file is
tested on CPU with real behaviour.
"""
from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Callable, Generic, TypeVar

G = TypeVar("G")

TOKEN_STEP_SMALL = 64  # token counts up to 1,024 round to a multiple of 64 …
TOKEN_STEP_LARGE = 256  # … and above to a multiple of 256
TOKEN_SMALL_LIMIT = 1024
MIN_MAX_SEQLEN = 16


def _ceil_to(n: int, step: int) -> int:
    return -(-n // step) * step


def round_tokens(n: int) -> int:
    """Token count → bucket: next multiple of 64 up to 1,024, of 256 above. Raises on n < 1."""
    if n < 1:
        raise ValueError(f"token count must be >= 1, got {n}")
    return _ceil_to(n, TOKEN_STEP_SMALL) if n <= TOKEN_SMALL_LIMIT else _ceil_to(n, TOKEN_STEP_LARGE)


def round_seqs(n: int) -> int:
    """Sequence count → slots: the next power of two (1, 2, 4, 8, …). Raises on n < 1."""
    if n < 1:
        raise ValueError(f"sequence count must be >= 1, got {n}")
    return 1 << (n - 1).bit_length()


def round_max_seqlen(n: int, tokens: int) -> int:
    """Longest sequence → attention bound: next power of two (at least 16), never above the
    bucket's token count (no sequence can be longer than the batch)."""
    if n < 1:
        raise ValueError(f"max_seqlen must be >= 1, got {n}")
    return min(max(MIN_MAX_SEQLEN, 1 << (n - 1).bit_length()), tokens)


@dataclass(frozen=True, order=True)
class Bucket:
    """Static shape of one graph: ``seqs`` slots, ``tokens`` rows, attention bound ``max_seqlen``.

    ``uniform``: every slot holds one sequence of exactly ``max_seqlen`` tokens (tokens = seqs ·
    max_seqlen, no padding), so attention can run on the dense [seqs, max_seqlen] layout (cuDNN),
    as eager steps of equal lengths do (``bucket_for``)."""

    seqs: int
    tokens: int
    max_seqlen: int
    uniform: bool = False

    def __str__(self) -> str:
        return f"{self.seqs}:{self.tokens}:{self.max_seqlen}" + (":uniform" if self.uniform else "")

    @staticmethod
    def parse(text: str) -> "Bucket":
        """'seqs:tokens:max_seqlen' → Bucket, rounded to valid bucket sizes; a fourth field
        ``uniform`` names a uniform bucket (``str`` of one; it must be one exactly).

        Raises ValueError naming the text when it is malformed or out of range.
        """
        fields = text.split(":")
        uniform = len(fields) == 4 and fields[3] == "uniform"
        try:
            s, t, m = (int(x) for x in (fields[:3] if uniform else fields))
        except ValueError:
            raise ValueError(f"bucket {text!r} must be 'seqs:tokens:max_seqlen' (three integers), "
                             "optionally followed by ':uniform'") from None
        if uniform:
            u = uniform_bucket(s, t, m)
            if u is None:
                raise ValueError(f"bucket {text!r}: a uniform bucket needs seqs >= 2, max_seqlen a power of two "
                                 f"(>= {MIN_MAX_SEQLEN}) and tokens = seqs x max_seqlen, a bucket size")
            return u
        if not (1 <= s <= t and 1 <= m <= t):
            raise ValueError(f"bucket {text!r} needs 1 <= seqs <= tokens and 1 <= max_seqlen <= tokens")
        tokens = round_tokens(t)
        return Bucket(round_seqs(s), tokens, round_max_seqlen(m, tokens))

    def example_lengths(self) -> list[int]:
        """Sequence lengths of a batch that fits this bucket exactly: one long sequence, the rest
        of length 1 (used to capture a bucket before any real batch has been seen); a uniform
        bucket's: ``seqs`` sequences of ``max_seqlen``."""
        if self.uniform:
            return [self.max_seqlen] * self.seqs
        first = min(self.max_seqlen, self.tokens - (self.seqs - 1))
        return [max(first, 1)] + [1] * (self.seqs - 1)


def _pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def uniform_bucket(num_seqs: int, num_tokens: int, max_seqlen: int) -> Bucket | None:
    """The uniform bucket of a batch of ``num_seqs`` ≥ 2 sequences of ``max_seqlen`` tokens each,
    when it fills one exactly: a length that is a power of two (≥ MIN_MAX_SEQLEN) and a token count
    that is already a bucket size; the slots are ``num_seqs`` exactly (a reranker's 25 pairs of 512
    tokens: 25 slots, not 32 with 7 empty). Else None (one sequence alone runs the same kernels in
    its ordinary bucket). Lengths of powers of two keep the number of such graphs small: they are
    what truncation to a model's maximum length gives."""
    if num_seqs < 2 or num_tokens != num_seqs * max_seqlen or not _pow2(max_seqlen):
        return None
    if max_seqlen < MIN_MAX_SEQLEN or round_tokens(num_tokens) != num_tokens:
        return None
    return Bucket(num_seqs, num_tokens, max_seqlen, uniform=True)


# A pure function of ints on every step's path: ~4 µs of host time uncached on the H200 host
@lru_cache(maxsize=4096)
def bucket_for(num_seqs: int, num_tokens: int, max_seqlen: int, graph_max_tokens: int, max_seqs: int,
               uniform: bool = False) -> Bucket | None:
    """The bucket a batch runs in, or None when it runs eagerly (more tokens than
    ``graph_max_tokens`` after rounding, or more sequence slots than ``max_seqs``). With
    ``uniform`` (the engine's attention has a faster kernel for equal lengths), the uniform bucket
    when the batch fills one exactly (``uniform_bucket``); else the rounded one."""
    tokens = round_tokens(num_tokens)
    if tokens > graph_max_tokens:
        return None
    u = uniform_bucket(num_seqs, num_tokens, max_seqlen) if uniform else None
    if u is not None and u.seqs <= max_seqs:  # exact slots: no rounding up to the next power of two
        return u
    seqs = round_seqs(num_seqs)
    if seqs > max_seqs:
        return None
    return Bucket(seqs, tokens, round_max_seqlen(max_seqlen, tokens))


def startup_buckets(text: str, uniform: bool) -> list[Bucket]:
    """The buckets to capture at start-up for a ``--capture-bucket`` text (or a saved histogram's
    entry) on an engine that takes uniform buckets (``uniform``) or not: the rounded bucket, plus
    the uniform one when the text's exact numbers are equal lengths filling one (a batch of that
    shape looks the uniform one up: '32:16384:512' gives both). A ':uniform' text on an engine
    without uniform buckets becomes the rounded bucket its batches run in. Raises ValueError as
    ``Bucket.parse``."""
    b = Bucket.parse(text)
    s, t, m = (int(x) for x in text.split(":")[:3])
    if b.uniform:
        return [b] if uniform else [Bucket(round_seqs(s), round_tokens(t), round_max_seqlen(m, round_tokens(t)))]
    u = uniform_bucket(s, t, m) if uniform else None
    return [b] if u is None else [b, u]


class LazyCapture(Generic[G]):
    """First sight of a bucket → None (run eagerly); second → ``capture(bucket)``; then the same
    graph. Keeps a hit count per bucket. Not thread-safe: one engine thread calls it."""

    def __init__(self, capture: Callable[[Bucket], G]) -> None:
        self._capture = capture
        self.graphs: dict[Bucket, G] = {}
        self.seen: set[Bucket] = set()
        self.hits: Counter[Bucket] = Counter()
        self.capture_seconds: dict[Bucket, float] = {}

    def lookup(self, bucket: Bucket) -> G | None:
        self.hits[bucket] += 1
        g = self.graphs.get(bucket)
        if g is not None:
            return g
        if bucket not in self.seen:
            self.seen.add(bucket)
            return None
        return self.ensure(bucket)

    def ensure(self, bucket: Bucket) -> G:
        """Capture now (start-up pre-capture, or the second sight)."""
        g = self.graphs.get(bucket)
        if g is None:
            import time

            t0 = time.perf_counter()
            g = self._capture(bucket)
            self.capture_seconds[bucket] = time.perf_counter() - t0
            self.graphs[bucket] = g
            self.seen.add(bucket)
        return g

    def save_stats(self, path: str | Path) -> None:
        """Write {bucket: hits} as JSON, hottest first (read back by ``load_hot``)."""
        data = {str(b): n for b, n in self.hits.most_common()}
        Path(path).write_text(json.dumps(data, indent=1), encoding="utf-8")


def load_hot(path: str | Path, limit: int = 32, min_hits: int = 2) -> list[Bucket]:
    """Buckets with at least ``min_hits`` hits in a saved histogram, hottest first; [] when the
    file does not exist. Raises ValueError on a malformed file."""
    p = Path(path)
    if not p.exists():
        return []
    raw = json.loads(p.read_text(encoding="utf-8"))
    ranked = sorted(((int(n), Bucket.parse(k)) for k, n in raw.items()), key=lambda x: -x[0])
    return [b for n, b in ranked if n >= min_hits][:limit]
