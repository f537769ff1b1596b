"""Load and soak clients for `bouquet serve` (loopback): mixed-length embedding requests from
concurrent async clients, every returned vector checked against the reference of its own input.

Used by `bouquet bench load` and `bouquet bench soak` (the full runs, results in bench/results/cpu-2core.md) and by
tests/integration/test_load.py (reduced runs). Units: seconds, kB of resident memory as /proc reports it.
"""
from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
import numpy as np

from bouquet.bench.procs import rss_kb

WORDS = ("river mountain city music paper learning fast slow red blue green house garden night day water fire "
         "stone light dark engine server batch search query document vector model token answer question").split()


def text_pool(n: int = 256, seed: int = 0) -> list[str]:
    """Distinct texts of 3-200 words (mixed lengths, some over the 256-token limit when tokenized)."""
    rng = random.Random(seed)
    return [f"{i} " + " ".join(rng.choice(WORDS) for _ in range(rng.choice([3, 8, 20, 60, 200]))) for i in range(n)]


def reference_vectors(texts: list[str]) -> np.ndarray:
    """sentence-transformers' all-MiniLM-L6-v2 vectors (normalized), the reference."""
    from sentence_transformers import SentenceTransformer

    from bouquet.modelspec import resolve_model_path

    st = SentenceTransformer(str(resolve_model_path(None)), device="cpu")
    return st.encode(texts, batch_size=64, convert_to_numpy=True, normalize_embeddings=True)


@dataclass
class Tally:
    """Outcomes of one run. ``lost``: requests without any HTTP reply (connection error, timeout)."""

    latencies: list[float] = field(default_factory=list)  # seconds, 200s only
    status: dict[int, int] = field(default_factory=dict)
    lost: int = 0
    retried: int = 0  # connection-level errors retried once (see client()); each also in ``errors``
    wrong: int = 0
    bad_shape: int = 0
    sent: int = 0
    errors: list[str] = field(default_factory=list)

    def add_error(self, msg: str) -> None:
        if len(self.errors) < 20:
            self.errors.append(msg)


def check_reply(r: httpx.Response, idx: list[int], refs: np.ndarray, tally: Tally) -> None:
    if r.status_code != 200:
        body = r.json()
        if not (isinstance(body, dict) and {"message", "type", "param", "code"} <= set(body.get("error", {}))):
            tally.bad_shape += 1
        return
    data = r.json()["data"]
    got = np.asarray([d["embedding"] for d in data], dtype=np.float32)
    if [d["index"] for d in data] != list(range(len(idx))) or got.shape != (len(idx), refs.shape[1]):
        tally.wrong += 1
        tally.add_error(f"indices/shape {[d['index'] for d in data]} {got.shape}")
        return
    cos = (got * refs[idx]).sum(1) / np.linalg.norm(got, axis=1)
    if cos.min() < 0.9999:
        tally.wrong += 1
        tally.add_error(f"cosine {cos.min():.6f} for inputs {idx}")


async def client(http: httpx.AsyncClient, url: str, texts: list[str], refs: np.ndarray, deadline: float,
                 rng: random.Random, tally: Tally) -> None:
    while time.monotonic() < deadline:
        idx = [rng.randrange(len(texts)) for _ in range(rng.randint(1, 8))]
        tally.sent += 1
        t0 = time.perf_counter()
        r = None
        for attempt in (0, 1):
            try:
                r = await http.post(url + "/v1/embeddings", json={"input": [texts[i] for i in idx]})
                break
            except (httpx.ReadError, httpx.WriteError, httpx.RemoteProtocolError) as e:
                # The connection broke under the request. The recorded cases are anyio's
                # ClosedResourceError: the socket was closed by this side (httpx's pool, under
                # 429 churn), not by the server; see docs/reliability.md. Embeddings are idempotent, so retry once like any
                # HTTP/1.1 client does on a dead pooled connection; count it separately.
                tally.add_error(f"{type(e).__name__} (attempt {attempt}): cause={e.__cause__!r} "
                                f"after {time.perf_counter() - t0:.2f}s")
                if attempt == 0:
                    tally.retried += 1
            except httpx.HTTPError as e:  # timeouts etc.: not retried
                tally.add_error(f"{type(e).__name__}: {e!r}")
                break
        if r is None:
            tally.lost += 1
            continue
        dt = time.perf_counter() - t0
        tally.status[r.status_code] = tally.status.get(r.status_code, 0) + 1
        if r.status_code == 200:
            tally.latencies.append(dt)
        check_reply(r, idx, refs, tally)
        if r.status_code == 429:  # honour Retry-After (bounded) like a well-behaved client
            await asyncio.sleep(min(float(r.headers.get("retry-after", "1")), 2.0) * rng.random())


async def run_load(url: str, clients: int, duration: float, texts: list[str], refs: np.ndarray,
                   timeout: float = 300.0, seed: int = 0) -> tuple[Tally, float]:
    """Run ``clients`` concurrent loops for ``duration`` s. Returns (tally, wall seconds)."""
    tally = Tally()
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(timeout=timeout, limits=limits) as http:
        t0 = time.monotonic()
        deadline = t0 + duration
        await asyncio.gather(*(client(http, url, texts, refs, deadline, random.Random(seed + i), tally)
                               for i in range(clients)))
        return tally, time.monotonic() - t0


def verdict(tally: Tally, allow_429: bool) -> list[str]:
    """The run's failures as sentences; empty when it passed."""
    bad = []
    allowed = {200, 429} if allow_429 else {200}
    if tally.lost:
        bad.append(f"{tally.lost} request(s) got no reply")
    if other := {s: n for s, n in tally.status.items() if s not in allowed}:
        bad.append(f"unexpected statuses {other}")
    if tally.wrong:
        bad.append(f"{tally.wrong} reply(ies) with a wrong vector or index")
    if tally.bad_shape:
        bad.append(f"{tally.bad_shape} error(s) not in the OpenAI shape")
    if not tally.status.get(200):
        bad.append("no request succeeded")
    return bad


def summary(tally: Tally, wall: float) -> dict[str, Any]:
    lat = np.asarray(tally.latencies) * 1000 if tally.latencies else np.zeros(1)
    return {"sent": tally.sent, "status": {str(k): v for k, v in sorted(tally.status.items())}, "lost": tally.lost,
            "retried": tally.retried, "wrong": tally.wrong, "wall_s": round(wall, 1), "ok_per_s": round(tally.status.get(200, 0) / wall, 1),
            "p50_ms": round(float(np.percentile(lat, 50)), 1), "p99_ms": round(float(np.percentile(lat, 99)), 1),
            "max_ms": round(float(lat.max()), 1), "errors": tally.errors[:5]}


def short_pool(n: int = 200, seed: int = 1) -> list[str]:
    rng = random.Random(seed)
    words = "cat dog bird river city music light water search vector answer question night day".split()
    return [f"{i} " + " ".join(rng.choice(words) for _ in range(rng.randint(3, 20))) for i in range(n)]


def growth_mb(samples: list[tuple[float, int]]) -> float:
    """RSS growth over the second half: median of the last tenth minus median around the midpoint."""
    kb = np.asarray([s for _, s in samples], dtype=np.float64)
    n = len(kb)
    if n < 10:
        return 0.0
    mid = np.median(kb[int(n * 0.45):int(n * 0.55) + 1])
    end = np.median(kb[int(n * 0.9):])
    return float(end - mid) / 1024


async def sampler(pids: list[int], out: list[tuple[float, int]], stop: asyncio.Event) -> None:
    t0 = time.monotonic()
    while not stop.is_set():
        try:
            out.append((time.monotonic() - t0, sum(rss_kb(p) for p in pids)))
        except (FileNotFoundError, RuntimeError):
            pass
        await asyncio.sleep(0.5)


async def soak(url: str, rerank_url: str | None, n: int, clients: int, texts: list[str], refs: np.ndarray,
               pids: list[int]) -> tuple[Tally, list[tuple[float, int]], float]:
    tally, samples, stop = Tally(), [], asyncio.Event()
    todo = iter(range(n))

    async def loop(rng: random.Random) -> None:
        for k in todo:
            t0 = time.perf_counter()
            try:
                if rerank_url and k % 4 == 3:
                    docs = [texts[rng.randrange(len(texts))] for _ in range(rng.randint(2, 6))]
                    r = await http.post(rerank_url + "/v1/rerank", json={"query": texts[k % len(texts)], "documents": docs, "top_n": 2})
                    ok = r.status_code == 200 and len(r.json()["results"]) == 2
                    tally.wrong += 0 if ok or r.status_code != 200 else 1
                else:
                    idx = [rng.randrange(len(texts)) for _ in range(rng.randint(1, 4))]
                    r = await http.post(url + "/v1/embeddings", json={"input": [texts[i] for i in idx]})
                    check_reply(r, idx, refs, tally)
            except httpx.HTTPError as e:
                tally.lost += 1
                tally.add_error(f"{type(e).__name__}: {e}")
                continue
            tally.sent += 1
            tally.status[r.status_code] = tally.status.get(r.status_code, 0) + 1
            if r.status_code == 200:
                tally.latencies.append(time.perf_counter() - t0)

    async with httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_connections=clients)) as http:
        task = asyncio.create_task(sampler(pids, samples, stop))
        t0 = time.monotonic()
        await asyncio.gather(*(loop(random.Random(i)) for i in range(clients)))
        wall = time.monotonic() - t0
        stop.set()
        await task
    return tally, samples, wall
