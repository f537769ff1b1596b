"""Interactive latency under a saturating bulk load, with and without priority classes (CPU).

Starts `bouquet serve --device cpu` (one replica, the embedded all-MiniLM-L6-v2) on a free
loopback port and measures single-text request latency (sequential, one at a time):
  1. unloaded;
  2. while bulk clients keep the replica's queue full with `"priority": "batch"` requests;
  3. while the same bulk requests are sent as `"priority": "interactive"` (everyone one class,
     first come first served).
It also times one maximum-size batch (a request of exactly --max-batch-tokens tokens, alone).
Claim checked: p99 in (2) <= unloaded p99 + one maximum-size batch; (3) shows the queueing that
priorities avoid.

Usage: bouquet bench priority [out.json] [--samples N] [--bulk-clients N] [--server-threads N]
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np

MAX_BATCH_TOKENS = 2048  # the CPU default; passed explicitly so the claim's batch size is fixed
BULK_SEQS, BULK_LEN = 64, 128  # 8,192 tokens per bulk request


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(port: int, log_path: Path, threads: int) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "bouquet", "serve", "--device", "cpu", "--port", str(port),
           "--max-batch-tokens", str(MAX_BATCH_TOKENS)]
    env = dict(os.environ, **({"OMP_NUM_THREADS": str(threads)} if threads else {}))
    proc = subprocess.Popen(cmd, stdout=open(log_path, "wb"), stderr=subprocess.STDOUT, env=env)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited: see {log_path}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    proc.kill()
    raise TimeoutError("server not healthy after 180 s")


def pct(xs: list[float]) -> dict[str, float]:
    a = np.asarray(xs) * 1000
    return {"n": len(xs), "p50_ms": float(np.percentile(a, 50)), "p90_ms": float(np.percentile(a, 90)),
            "p99_ms": float(np.percentile(a, 99)), "max_ms": float(a.max())}


def singles(client: httpx.Client, url: str, n: int) -> list[float]:
    """``n`` one-text requests, one at a time, with random pauses (20-300 ms) so that arrivals
    fall anywhere within the batch on the replica, not just after a batch boundary."""
    rng = np.random.default_rng(7)
    out = []
    for i in range(n):
        t0 = time.perf_counter()
        r = client.post(url, json={"input": f"what is the capital of country number {i}?"})
        r.raise_for_status()
        out.append(time.perf_counter() - t0)
        time.sleep(float(rng.uniform(0.02, 0.3)))
    return out


def max_batch_seconds(client: httpx.Client, url: str, reps: int = 5) -> float:
    """Median time of one request of exactly MAX_BATCH_TOKENS tokens, alone on the replica."""
    ids = np.random.default_rng(0).integers(1000, 20000, size=(MAX_BATCH_TOKENS // BULK_LEN, BULK_LEN)).tolist()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        client.post(url, json={"input": ids, "priority": "batch"}).raise_for_status()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def bulk_client(url: str, body: bytes, stop: "mp.synchronize.Event", out: "mp.Queue[int]") -> None:
    """One bulk client (its own process, so its JSON work does not share the measuring
    process's GIL): keeps one request outstanding until ``stop``; reports how many finished."""
    done = 0
    with httpx.Client(timeout=600) as c:
        while not stop.is_set():
            c.post(url, content=body, headers={"content-type": "application/json"}).raise_for_status()
            done += 1
    out.put(done)


def under_bulk(url: str, bulk_priority: str, clients: int, samples: int) -> dict[str, object]:
    """Interactive latencies while ``clients`` processes each keep one bulk request outstanding."""
    ids = np.random.default_rng(1).integers(1000, 20000, size=(BULK_SEQS, BULK_LEN)).tolist()
    body = json.dumps({"input": ids, "priority": bulk_priority, "encoding_format": "base64"}).encode()
    stop, out = mp.Event(), mp.Queue()
    procs = [mp.Process(target=bulk_client, args=(url, body, stop, out)) for _ in range(clients)]
    t0 = time.perf_counter()
    for p in procs:
        p.start()
    time.sleep(2.0)  # the queue fills
    with httpx.Client(timeout=600) as c:
        lat = singles(c, url, samples)
    stop.set()
    bulk_done = sum(out.get(timeout=600) for _ in procs)
    for p in procs:
        p.join()
    # The replica was busy with bulk work from start to end (the queue never ran dry), so this is
    # its token rate under exactly these conditions, and a maximum-size batch takes 2048 / rate.
    tok_s = bulk_done * BULK_SEQS * BULK_LEN / (time.perf_counter() - t0)
    return {"bulk_priority": bulk_priority, "bulk_clients": clients, "bulk_requests_done": bulk_done,
            "bulk_tokens_per_request": BULK_SEQS * BULK_LEN, "bulk_tokens_per_s": tok_s,
            "max_batch_ms_under_load": MAX_BATCH_TOKENS / tok_s * 1000, **pct(lat)}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", nargs="?", default=None, help="write the results as JSON here")
    ap.add_argument("--samples", type=int, default=50, help="interactive requests per phase")
    ap.add_argument("--bulk-clients", type=int, default=2)
    ap.add_argument("--server-threads", type=int, default=0,
                    help="OMP_NUM_THREADS for the replica (0: torch's default); 1 avoids OpenMP stalls on a crowded machine")
    args = ap.parse_args(argv)
    port = free_port()
    url = f"http://127.0.0.1:{port}/v1/embeddings"
    proc = start_server(port, Path(os.environ.get("TMPDIR", "/tmp")) / f"bouquet-priority-{port}.log", args.server_threads)
    try:
        with httpx.Client(timeout=600) as c:
            singles(c, url, 10)  # warm-up
            unloaded = pct(singles(c, url, args.samples))
            t_batch = max_batch_seconds(c, url)
        with_prio = under_bulk(url, "batch", args.bulk_clients, args.samples)
        one_class = under_bulk(url, "interactive", args.bulk_clients, max(6, args.samples // 5))
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    # Two readings of "the time of one maximum-size batch": alone (a 2048-token request on the idle
    # replica), and under the load itself (from the bulk token rate; other processes on a shared
    # machine slow both the batch in flight and everything else).
    bound_alone = unloaded["p99_ms"] + t_batch * 1000
    bound_loaded = unloaded["p99_ms"] + float(with_prio["max_batch_ms_under_load"])  # type: ignore[arg-type]
    res = {"model": "all-MiniLM-L6-v2 (embedded)", "device": "cpu", "cpu_count": os.cpu_count(),
           "server_threads": args.server_threads or "default",
           "load_average_1m": os.getloadavg()[0], "max_batch_tokens": MAX_BATCH_TOKENS,
           "max_batch_ms_alone": t_batch * 1000, "unloaded": unloaded, "bulk_as_batch": with_prio,
           "bulk_same_class": one_class, "bound_p99_ms_alone": bound_alone, "bound_p99_ms_under_load": bound_loaded,
           "claim_holds_alone": with_prio["p99_ms"] <= bound_alone,
           "claim_holds_under_load": with_prio["p99_ms"] <= bound_loaded}
    text = json.dumps(res, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
