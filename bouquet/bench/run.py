"""The benchmarks of bench/README.md (1-4, mixed lengths, 5), run against any ``Target``.

1. batch 1, sequential, pre-tokenized, lengths ``lat_lengths``: p50/p90/p99/max ms
2. scoring: batches of 5/25/50 sequences of 512 tokens, sequential: ms
3. throughput: batches of 100, ``clients`` concurrent clients, lengths ``thr_lengths``: emb/s;
   ``mixed``: the same with lengths uniform in [16, 512], in arrival order
4. concurrency: text through an HTTP gateway, 512 tokens, batch 1, 1–16 clients: ms
5. queries: one short text per request from N client processes (64, 256), keep-alive, closed
   loop (bouquet/bench/loadgen.py): req/s, p50/p90/p99 ms

Every case runs for about ``seconds`` (at least ``min_iters`` requests) so slow baselines do not
blow the time budget; the concurrent ones (3, 4) first run ``warmup_s`` seconds of the same load
untimed. Each row carries its roofline: the model's FLOPs for the request over the
measured matmul rate (``floor_ms`` / ``ceiling_emb_s``) and the fraction of it reached.
"""
from __future__ import annotations

import functools
import shutil
import subprocess
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from bouquet.bench.models import ModelShape
from bouquet.bench.targets import Target


@dataclass(frozen=True)
class Settings:
    lat_lengths: tuple[int, ...] = (128, 512, 4096)
    score_batches: tuple[int, ...] = (5, 25, 50)
    score_len: int = 512
    thr_lengths: tuple[int, ...] = (512, 1024, 4096)
    thr_batch: int = 100
    clients: int = 4
    mixed: tuple[int, int] = (16, 512)
    concurrency: tuple[int, ...] = (1, 2, 4, 8, 16)
    conc_len: int = 512
    seconds: float = 3.0
    min_iters: int = 5
    warmup: int = 3
    # Benchmarks 3 and 4: the same concurrent load, untimed, for this long before each timed
    # window, so a server's first sights and captures of new CUDA-graph buckets (50-1,000 ms
    # each) are not in the figures; benchmark 4 reports the captures of its warm-up on their own.
    warmup_s: float = 1.0
    query_clients: tuple[int, ...] = (64, 256)  # benchmark 5: client processes
    query_tokens: tuple[int, int] = (16, 64)  # benchmark 5: text lengths, tokens (uniform)


def pct(xs: list[float], p: float) -> float:
    return float(np.percentile(np.asarray(xs), p))


def summary(ms: list[float]) -> dict[str, float]:
    return {"p50": round(pct(ms, 50), 3), "p90": round(pct(ms, 90), 3), "p99": round(pct(ms, 99), 3),
            "max": round(max(ms), 3), "n": len(ms)}


def random_seqs(rng: np.random.Generator, lengths: list[int], vocab: int) -> list[np.ndarray]:
    """Token ids in [1000, vocab) (clear of special tokens); every shape's vocab ≥ 30,522."""
    hi = min(vocab, 30522)
    return [rng.integers(1000, hi, size=n, dtype=np.int32) for n in lengths]


def measure_matmul_rate(device: str) -> float:
    """bf16 (GPU) / fp32 (CPU) square matmul rate in FLOP/s: the roofline's ceiling."""
    import torch

    cuda = device.startswith("cuda")
    n = 8192 if cuda else 512
    dt = torch.bfloat16 if cuda else torch.float32
    a = torch.randn(n, n, device=device, dtype=dt)
    b = torch.randn(n, n, device=device, dtype=dt)
    for _ in range(3):
        a @ b
    if cuda:
        torch.cuda.synchronize()
    reps = 10
    t = time.perf_counter()
    for _ in range(reps):
        a @ b
    if cuda:
        torch.cuda.synchronize()
    return 2.0 * n ** 3 * reps / (time.perf_counter() - t)


def cosine_check(target: Target, reference: Target, seqs: list[np.ndarray], tol: float = 1e-3) -> float:
    """Minimum row cosine between target and reference on ``seqs``. Raises AssertionError naming
    the target when any row is below 1 - tol (0.1%)."""
    a, b = target.embed_ids(seqs), reference.embed_ids(seqs)
    cos = (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1) + 1e-12)
    worst = float(cos.min())
    if worst < 1 - tol:
        raise AssertionError(f"{target.name}: cosine {worst:.5f} vs {reference.name} is below {1 - tol}")
    return worst


def gpu_state() -> dict[str, float] | None:
    """GPU 0's SM clock (MHz), power (W) and temperature (°C) from ``nvidia-smi``; None without one.

    Recorded in every row, sampled halfway through the case: a long run heats the GPU and its
    clock can drop, so a figure taken late in a run is only comparable with the clock next to it.
    """
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        out = subprocess.run([exe, "--query-gpu=clocks.sm,power.draw,temperature.gpu", "--format=csv,noheader,nounits",
                              "-i", "0"], capture_output=True, text=True, timeout=5).stdout
        sm, power, temp = (x.strip() for x in out.splitlines()[0].split(","))
        return {"sm_mhz": float(sm), "power_w": float(power), "temp_c": float(temp)}
    except (OSError, ValueError, IndexError, subprocess.SubprocessError):
        return None


class MidSample:
    """``gpu_state()`` taken ``delay_s`` after the start, in a timer thread: ``with MidSample(d) as m: …; m.state``."""

    def __init__(self, delay_s: float) -> None:
        self.state: dict[str, float] | None = None
        self._timer = threading.Timer(delay_s, self._take)
        self._timer.daemon = True

    def _take(self) -> None:
        self.state = gpu_state()

    def __enter__(self) -> "MidSample":
        self._timer.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._timer.cancel()


def _timed(fn: Callable[[], Any], s: Settings) -> list[float]:
    for _ in range(s.warmup):
        fn()
    ms: list[float] = []
    end = time.perf_counter() + s.seconds
    while len(ms) < s.min_iters or time.perf_counter() < end:
        t = time.perf_counter()
        fn()
        ms.append((time.perf_counter() - t) * 1e3)
    return ms


def _latency_row(bench: str, case: str, target: Target, ms: list[float], flops: float, rate: float) -> dict[str, Any]:
    floor = flops / rate * 1e3
    row = {"bench": bench, "case": case, "system": target.name, **summary(ms), "floor_ms": round(floor, 4)}
    row["roofline_frac"] = round(floor / row["p50"], 4)
    return row


def bench_latency(target: Target, shape: ModelShape, s: Settings, rate: float, rng: np.random.Generator,
                  benchmarks: tuple[str, ...] = ("1", "2")) -> list[dict[str, Any]]:
    """Benchmark 1 (batch 1 at each ``lat_lengths``) and 2 (``score_batches`` × ``score_len``), those
    of the two in ``benchmarks``: one row per case."""
    rows = []
    vocab = shape.config["vocab_size"]
    for L in (x for x in s.lat_lengths if x <= shape.max_len and "1" in benchmarks):
        seq = random_seqs(rng, [L], vocab)
        with MidSample(s.seconds / 2) as g:
            ms = _timed(lambda: target.embed_ids(seq), s)
        rows.append(_latency_row("1", f"b1 L{L}", target, ms, shape.sequence_flops(L), rate) | {"gpu": g.state})
    for B in (b for b in s.score_batches if "2" in benchmarks):
        seqs = random_seqs(rng, [s.score_len] * B, vocab)
        with MidSample(s.seconds / 2) as g:
            ms = _timed(lambda: target.embed_ids(seqs), s)
        rows.append(_latency_row("2", f"b{B} L{s.score_len}", target, ms, B * shape.sequence_flops(s.score_len), rate)
                    | {"gpu": g.state})
    return rows


def _window(n: int, work: Callable[[int, float], None], seconds: float) -> float:
    """Run ``work(client, end)`` in ``n`` threads until ``end`` = now + ``seconds``; returns the
    window's length in seconds (at least ``seconds``: every client finishes its request)."""
    start = time.perf_counter()
    stopping = threading.Event()  # the run is being interrupted: a client's failing request is expected

    def run(c: int) -> None:
        try:
            work(c, start + seconds)
        except Exception:
            if not stopping.is_set():
                raise

    # daemon: a SIGTERM / Ctrl-C that ends the run does not wait for the clients' last requests
    threads = [threading.Thread(target=run, args=(c,), daemon=True) for c in range(n)]
    try:
        for t in threads:  # a signal can land here too: the clients started so far are sending
            t.start()
        for t in threads:
            t.join()
    except BaseException:
        stopping.set()  # before the targets' connections close under the clients
        raise
    return time.perf_counter() - start


def _throughput(target: Target, make: Callable[[np.random.Generator], list[np.ndarray]], s: Settings) -> float:
    """Embeddings/s with ``s.clients`` threads each sending requests back to back, after an
    untimed window of the same load (``s.warmup_s``)."""
    reqs = [[make(np.random.default_rng(1000 * c + i)) for i in range(2)] for c in range(s.clients)]
    done = [0] * s.clients

    def client(c: int, end: float) -> None:
        i = 0
        while i < 1 or time.perf_counter() < end:
            seqs = reqs[c][i % len(reqs[c])]
            target.embed_ids(seqs)
            done[c] += len(seqs)
            i += 1

    target.embed_ids(reqs[0][0])  # lazy set-up (connections, first batch) before any window
    if s.warmup_s > 0:
        _window(s.clients, client, s.warmup_s)
    done[:] = [0] * s.clients
    elapsed = _window(s.clients, client, s.seconds)
    return sum(done) / elapsed


def bench_throughput(target: Target, shape: ModelShape, s: Settings, rate: float, mixed: bool, lengths_ok: bool = True) -> list[dict[str, Any]]:
    rows = []
    vocab = shape.config["vocab_size"]
    cases: list[tuple[str, Callable[[np.random.Generator], list[np.ndarray]], float]] = []
    if lengths_ok:
        for L in (x for x in s.thr_lengths if x <= shape.max_len):
            cases.append((f"b{s.thr_batch} L{L}", lambda r, L=L: random_seqs(r, [L] * s.thr_batch, vocab), shape.sequence_flops(L)))
    if mixed:
        lo, hi = s.mixed
        mean_flops = float(np.mean([shape.sequence_flops(n) for n in range(lo, hi + 1)]))
        cases.append((f"b{s.thr_batch} mixed {lo}-{hi}",
                      lambda r: random_seqs(r, list(r.integers(lo, hi + 1, size=s.thr_batch)), vocab), mean_flops))
    for case, make, seq_flops in cases:
        with MidSample(s.warmup_s + s.seconds / 2) as g:  # halfway through the timed window
            emb_s = _throughput(target, make, s)
        ceiling = rate / seq_flops
        rows.append({"bench": "3" if "mixed" not in case else "3-mixed", "case": case, "system": target.name,
                     "emb_s": round(emb_s, 1), "ceiling_emb_s": round(ceiling, 1), "roofline_frac": round(emb_s / ceiling, 4),
                     "gpu": g.state})
    return rows


def vocab_words(tok: Any) -> list[str]:
    """A ``tokenizers.Tokenizer``'s whole-word ASCII vocabulary entries past the first 2,000 ids, in
    id order (``get_vocab()``'s order is a hash map's, new in every process: a seed would not fix
    the texts drawn from it)."""
    return [w for w, i in sorted(tok.get_vocab().items(), key=lambda wi: wi[1]) if w.isalpha() and w.isascii() and i > 2000]


@functools.lru_cache(maxsize=4)
def _counting_tokenizer(tokenizer_path: str) -> tuple[Any, np.ndarray]:
    """``make_texts``' tokenizer and words, read once per file (~0.7 s for Qwen3's 151k entries).
    It counts as a server does: a tokenizer.json may truncate and pad (all-MiniLM-L6-v2's: both to
    128), which would hide a text's length and count padding as special tokens. The words are an
    array: ``rng.choice`` would turn a list into one on every call (~2 ms per text)."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(tokenizer_path)
    tok.no_truncation()
    tok.no_padding()
    return tok, np.asarray(vocab_words(tok))


def make_texts(tokenizer_path: str, n: int, tokens: int | tuple[int, int], seed: int = 0,
               appended: int = 0) -> list[str]:
    """``n`` texts of random whole-word vocabulary entries that tokenize to ``tokens`` tokens, special
    tokens included (or, for a (lo, hi) pair, to a length drawn uniformly from it per text), give or
    take the last word's pieces. A byte-level BPE (Qwen3) splits many such words into two or three
    pieces: each text is cut at the last whole word that fits, so a text row and a token-id row of
    one length do the same model work. ``appended``: tokens the server adds after the tokenizer's own
    special tokens (``TextTokenizer.appended``: Qwen3-Embedding's <|endoftext|> where tokenizer.json
    does not add it), counted in ``tokens`` too. One ``seed`` gives the same texts in every run."""
    tok, words = _counting_tokenizer(tokenizer_path)
    specials = len(tok.encode("a").ids) - len(tok.encode("a", add_special_tokens=False).ids) + appended
    rng = np.random.default_rng(seed)
    lo, hi = tokens if isinstance(tokens, tuple) else (tokens, tokens)
    out = []
    for _ in range(n):
        want = max(1, int(rng.integers(lo, hi + 1)) - specials)
        text = " ".join(rng.choice(words, size=want))  # at least ``want`` tokens: a word is one or more
        enc = tok.encode(text, add_special_tokens=False)
        if len(enc.ids) > want:
            end = enc.offsets[want - 1][1]  # the last kept token's end: cut at the word boundary at or before it
            cut = text.rfind(" ", 0, end + 1) if end < len(text) and text[end] != " " else end
            text = text[:cut] if cut > 0 else text.split(" ", 1)[0]
        out.append(text)
    return out


WARMUP_WINDOWS = 5  # benchmark 4: untimed windows at most, until one captures no new CUDA graph


def bench_concurrency(target: Target, shape: ModelShape, s: Settings, rate: float, texts: list[str]) -> list[dict[str, Any]]:
    """Benchmark 4: ``c`` clients each sending one text at a time; latency per request (after an
    untimed window of the same load, ``s.warmup_s``, repeated while the system still captured CUDA
    graphs in it, at most ``WARMUP_WINDOWS`` times). ``captures_in_window``: CUDA graphs the system
    captured during the timed window (each a stall of 50–1,000 ms for the batch that triggers it: a
    p99 far above the p50 with captures here is the warm-up's, not the steady state's);
    ``warmup_captures``: those of the untimed windows (what a server meets in its first traffic)."""
    rows = []
    for c in s.concurrency:
        for t in texts[:2]:
            target.embed_texts([t])
        lat: list[list[float]] = [[] for _ in range(c)]

        def client(k: int, end: float) -> None:
            i = k
            while len(lat[k]) < s.min_iters or time.perf_counter() < end:
                t0 = time.perf_counter()
                target.embed_texts([texts[i % len(texts)]])
                lat[k].append((time.perf_counter() - t0) * 1e3)
                i += c

        start = before = target.graph_captures()
        for _ in range(WARMUP_WINDOWS if s.warmup_s > 0 else 0):
            _window(c, client, s.warmup_s)
            for xs in lat:
                xs.clear()
            now = target.graph_captures()
            settled = now is None or now == before
            before = now
            if settled:
                break
        with MidSample(s.seconds / 2) as g:
            elapsed = _window(c, client, s.seconds)
        after = target.graph_captures()
        ms = [x for xs in lat for x in xs]
        row = _latency_row("4", f"c{c} L{s.conc_len}", target, ms, shape.sequence_flops(s.conc_len), rate)
        row["gpu"] = g.state
        if start is not None and before is not None and after is not None:
            row["captures_in_window"], row["warmup_captures"] = after - before, before - start
        row["req_s"] = round(len(ms) / elapsed, 1)
        rows.append(row)
    return rows


def bench_queries(url: str, texts: list[str], s: Settings, system: str, model: str | None = None,
                  check: Callable[[dict[int, bytes]], dict[str, float]] | None = None) -> list[dict[str, Any]]:
    """Benchmark 5 against the OpenAI-compatible ``url`` (``…/v1/embeddings``): per client count,
    that many processes each with one keep-alive connection send one text at a time (base64
    replies) for ``s.warmup_s`` untimed then ``s.seconds`` timed. ``check`` gets the replies kept
    per text index and returns figures to record (a cosine against the reference, say)."""
    from urllib.parse import urlsplit

    import orjson

    from bouquet.bench.loadgen import post_request, run_load, summarize

    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    extra = {"model": model} if model else {}
    reqs = [post_request(host, port, parts.path, orjson.dumps({"input": t, "encoding_format": "base64", **extra}))
            for t in texts]
    rows = []
    for c in s.query_clients:
        with MidSample(s.warmup_s + s.seconds / 2) as g:
            res = run_load(host, port, reqs, c, s.seconds, s.warmup_s)
        row: dict[str, Any] = {"bench": "5", "case": f"c{c}", "system": system, **summarize(res, s.seconds), "gpu": g.state}
        if check is not None and res.samples:
            row.update(check(res.samples))
        rows.append(row)
    return rows
