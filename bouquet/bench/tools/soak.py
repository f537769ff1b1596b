"""Soak test on the CPU: many requests, resident memory of every bouquet process sampled.

Usage:
  bouquet bench soak --requests 10000 [--clients 16] [--rerank-model DIR] [--record bench/out/soak-cpu.md]

Sends ``--requests`` small embedding requests (and, with ``--rerank-model``, /v1/rerank requests
to a second server running that cross-encoder, interleaved 1 in 4) from ``--clients`` concurrent
loops, checking every embedding against its reference like `bouquet bench load`. Every 0.5 s it reads
VmRSS (/proc/PID/status) of the launcher (gateway) and its replica processes. Passes when nothing
failed and the summed RSS grew by less than ``--max-growth-mb`` over the second half of the run
(median of the last tenth of samples minus median of the samples around the midpoint).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[3]  # the source checkout

from bouquet.bench.load import growth_mb, reference_vectors, short_pool, soak, verdict  # noqa: E402
from bouquet.bench.meta import source_commit  # noqa: E402
from bouquet.bench.procs import child_pids  # noqa: E402


def run(n: int, clients: int, rerank_model: str | None = None) -> dict[str, Any]:
    """Start the server(s), soak, stop. Returns the summary (``failures`` empty when it passed)."""
    from bouquet.bench.served import Served

    texts = short_pool()
    refs = reference_vectors(texts)
    srv = Served()
    rsrv = Served("--model", rerank_model) if rerank_model else None
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


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=10_000)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--rerank-model", default=None, help="a cross-encoder directory: also soak /v1/rerank")
    ap.add_argument("--max-growth-mb", type=float, default=50.0)
    ap.add_argument("--record", default=None)
    args = ap.parse_args(argv)
    res = run(args.requests, args.clients, args.rerank_model)
    if res["rss_growth_second_half_mb"] >= args.max_growth_mb:
        res["failures"].append(f"RSS grew {res['rss_growth_second_half_mb']} MB over the second half")
    print(json.dumps(res, indent=1))
    if args.record:
        with open(args.record, "a", encoding="utf-8") as f:
            f.write(f"\n## {time.strftime('%Y-%m-%d %H:%M')} — commit {source_commit(REPO)}\n\n`bouquet bench soak "
                    f"{' '.join(sys.argv[1:])}`\n\n```json\n{json.dumps(res, indent=1)}\n```\n")
    sys.exit(1 if res["failures"] else 0)


if __name__ == "__main__":
    main()
