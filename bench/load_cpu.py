"""Load test on the CPU, loopback only: N concurrent clients send mixed-length requests for T seconds.

Usage:
  python bench/load_cpu.py --clients 512 --duration 60 [--max-queue-tokens 4000000] [--allow-429]
                           [--record bench/results/load-cpu.md]

Starts `bouquet serve` on 127.0.0.1 (or uses ``--url``). Each client loops: pick 1-8 texts of
3-200 words from a fixed pool, POST /v1/embeddings, check every returned vector against the
sentence-transformers reference of *its own* input (cosine ≥ 0.9999) and its index. Clients stop
sending at the deadline; requests still open are awaited (bounded by ``--timeout``), so the run
stops by itself. Fails (exit 1) on any lost request, 5xx, wrong vector, or, unless
``--allow-429``, any 429; with ``--allow-429`` every reply must be 200 or 429.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

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


def commit() -> str:
    from bouquet.bench.meta import source_commit

    return source_commit(REPO)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", type=int, default=512)
    ap.add_argument("--duration", type=float, default=60.0)
    ap.add_argument("--max-queue-tokens", type=int, default=4_000_000)
    ap.add_argument("--allow-429", action="store_true", help="a low queue limit: 200 or 429, nothing else")
    ap.add_argument("--timeout", type=float, default=300.0, help="per-request timeout (s)")
    ap.add_argument("--url", default=None, help="use a running server on 127.0.0.1 instead of starting one")
    ap.add_argument("--record", default=None, help="append a result section to this markdown file")
    args = ap.parse_args()

    from helpers import BouquetProcess

    texts = text_pool()
    refs = reference_vectors(texts)
    srv = None if args.url else BouquetProcess("--max-queue-tokens", str(args.max_queue_tokens))
    url = args.url or srv.url  # type: ignore[union-attr]
    assert url.startswith(("http://127.0.0.1", "http://localhost")), "load tests run on loopback only"
    try:
        tally, wall = asyncio.run(run_load(url, args.clients, args.duration, texts, refs, args.timeout))
    finally:
        if srv:
            srv.stop()
    res = summary(tally, wall)
    bad = verdict(tally, args.allow_429)
    print(json.dumps({**res, "failures": bad}, indent=1))
    if args.record:
        cmd = "python bench/load_cpu.py " + " ".join(sys.argv[1:])
        with open(args.record, "a", encoding="utf-8") as f:
            f.write(f"\n## {time.strftime('%Y-%m-%d %H:%M')} — commit {commit()}\n\n`{cmd}`\n\n"
                    f"```json\n{json.dumps({**res, 'failures': bad}, indent=1)}\n```\n")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
