"""Soak test on the CPU: many requests, resident memory of every bouquet process sampled.

Usage:
  python bench/soak_cpu.py --requests 10000 [--clients 16] [--rerank-model DIR] [--record bench/results/soak-cpu.md]

Sends ``--requests`` small embedding requests (and, with ``--rerank-model``, /v1/rerank requests
to a second server running that cross-encoder, interleaved 1 in 4) from ``--clients`` concurrent
loops, checking every embedding against its reference like bench/load_cpu.py. Every 0.5 s it reads
VmRSS (/proc/PID/status) of the launcher (gateway) and its replica processes. Passes when nothing
failed and the summed RSS grew by less than ``--max-growth-mb`` over the second half of the run
(median of the last tenth of samples minus median of the samples around the midpoint).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "bench"))

from load_cpu import Tally, check_reply, commit, reference_vectors, verdict  # noqa: E402
from reliability import child_pids, rss_kb  # noqa: E402


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


def run(n: int, clients: int, rerank_model: str | None = None) -> dict[str, Any]:
    """Start the server(s), soak, stop. Returns the summary (``failures`` empty when it passed)."""
    from helpers import BouquetProcess

    texts = short_pool()
    refs = reference_vectors(texts)
    srv = BouquetProcess()
    rsrv = BouquetProcess("--model", rerank_model) if rerank_model else None
    try:
        pids = [srv.proc.pid, *child_pids(srv.proc.pid)]
        if rsrv:
            pids += [rsrv.proc.pid, *child_pids(rsrv.proc.pid)]
        tally, samples, wall = asyncio.run(soak(srv.url, rsrv.url if rsrv else None, n, clients, texts, refs, pids))
    finally:
        srv.stop()
        if rsrv:
            rsrv.stop()
    lat = np.asarray(tally.latencies or [0.0]) * 1000
    return {"requests": n, "clients": clients, "rerank": bool(rerank_model), "status": {str(k): v for k, v in tally.status.items()},
            "lost": tally.lost, "wrong": tally.wrong, "wall_s": round(wall, 1), "req_per_s": round(n / wall, 1),
            "p50_ms": round(float(np.percentile(lat, 50)), 1), "p99_ms": round(float(np.percentile(lat, 99)), 1),
            "rss_start_mb": round(samples[0][1] / 1024, 1) if samples else None,
            "rss_mid_mb": round(samples[len(samples) // 2][1] / 1024, 1) if samples else None,
            "rss_end_mb": round(samples[-1][1] / 1024, 1) if samples else None,
            "rss_growth_second_half_mb": round(growth_mb(samples), 2), "samples": len(samples),
            "failures": verdict(tally, allow_429=False), "errors": tally.errors[:5]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=10_000)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--rerank-model", default=None, help="a cross-encoder directory: also soak /v1/rerank")
    ap.add_argument("--max-growth-mb", type=float, default=50.0)
    ap.add_argument("--record", default=None)
    args = ap.parse_args()
    res = run(args.requests, args.clients, args.rerank_model)
    if res["rss_growth_second_half_mb"] >= args.max_growth_mb:
        res["failures"].append(f"RSS grew {res['rss_growth_second_half_mb']} MB over the second half")
    print(json.dumps(res, indent=1))
    if args.record:
        with open(args.record, "a", encoding="utf-8") as f:
            f.write(f"\n## {time.strftime('%Y-%m-%d %H:%M')} — commit {commit()}\n\n`python bench/soak_cpu.py "
                    f"{' '.join(sys.argv[1:])}`\n\n```json\n{json.dumps(res, indent=1)}\n```\n")
    sys.exit(1 if res["failures"] else 0)


if __name__ == "__main__":
    main()
