"""Benchmark 3 (high-throughput embedding) on one replica vs two: does a second GPU add ~2x?

Builds a BERT model directory with random weights (bge-base shape, or a tiny shape with --tiny)
and the all-MiniLM-L6-v2 tokenizer.json, then for each replica set starts
`bouquet serve --device cuda --gpus 0` and `--gpus 0,1` (or `--device cpu --replicas 1` / `2`),
and drives it from 4 client processes, each sending requests of 100 pre-tokenized sequences of
512 tokens (token-id lists over HTTP, base64 vectors back) back to back. Reports embeddings/s
for each and their ratio (target on two H200s: >= 1.8).

Clients use only the standard library (http.client), so the GPU machine needs no httpx.

Usage:
  bouquet bench replicas out.json                       # GPUs 0 and 0,1, bge-base shape
  bouquet bench replicas out.json --device cpu --tiny   # quick check on a CPU machine
"""
from __future__ import annotations

import argparse
import http.client
import json
import multiprocessing as mp
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(serve_args: list[str], log: Path, timeout_s: float = 600.0) -> tuple[subprocess.Popen[bytes], int]:
    """`bouquet serve --port <free> SERVE_ARGS...`, output to ``log``; returns once /health is 200.
    Raises RuntimeError when it exits first, TimeoutError after ``timeout_s``."""
    port = free_port()
    cmd = [sys.executable, "-m", "bouquet", "serve", "--port", str(port), *serve_args]
    print("+", " ".join(cmd), flush=True)
    proc = subprocess.Popen(cmd, stdout=open(log, "wb"), stderr=subprocess.STDOUT)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"bouquet serve exited ({proc.returncode}); see {log}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    return proc, port
        except OSError:
            pass
        time.sleep(0.5)
    proc.kill()
    raise TimeoutError(f"not healthy after {timeout_s:.0f} s; see {log}")


def start(args: argparse.Namespace, model: Path, n: int, log: Path) -> tuple[subprocess.Popen[bytes], int]:
    place = ["--gpus", ",".join(str(g) for g in range(n))] if args.device == "cuda" else ["--replicas", str(n)]
    return launch(["--model", str(model), "--device", args.device, *place, "--gateway-workers", str(args.gateway_workers),
                   "--max-request-bytes", str(16 << 20)], log)


def client(port: int, body: bytes, batch: int, warmup_s: float, seconds: float, out: "mp.Queue[tuple[int, float]]") -> None:
    """Send ``body`` back to back; count embeddings finished inside the timed window."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    t_start = time.monotonic() + warmup_s
    t_end = t_start + seconds
    done = 0
    while True:
        conn.request("POST", "/v1/embeddings", body, {"Content-Type": "application/json"})
        r = conn.getresponse()
        data = r.read()
        if r.status != 200:
            raise RuntimeError(f"HTTP {r.status}: {data[:300]!r}")
        now = time.monotonic()
        if now >= t_end:
            break
        if now >= t_start:
            done += batch
    out.put((done, seconds))


def measure(port: int, args: argparse.Namespace) -> float:
    import random

    rng = random.Random(0)
    ids = [[101] + [rng.randrange(1000, 29000) for _ in range(args.seq_len - 2)] + [102] for _ in range(args.batch)]
    body = json.dumps({"input": ids, "encoding_format": "base64", "priority": "batch"}).encode()
    q: mp.Queue[tuple[int, float]] = mp.Queue()
    procs = [mp.Process(target=client, args=(port, body, args.batch, args.warmup, args.seconds, q))
             for _ in range(args.clients)]
    for p in procs:
        p.start()
    results = [q.get(timeout=args.warmup + args.seconds + 600) for _ in procs]
    for p in procs:
        p.join()
    return sum(d for d, _ in results) / args.seconds


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", help="results JSON path")
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--tiny", action="store_true", help="tiny BERT instead of the bge-base shape (CPU check)")
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--batch", type=int, default=100)
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--seconds", type=float, default=30.0, help="timed window per run")
    ap.add_argument("--warmup", type=float, default=15.0, help="untimed load first (CUDA graph capture)")
    ap.add_argument("--gateway-workers", type=int, default=0, help="0 = 4 on cuda, 1 on cpu")
    args = ap.parse_args(argv)
    args.gateway_workers = args.gateway_workers or (4 if args.device == "cuda" else 1)
    shape = "tiny" if args.tiny else "bge-base"
    work = Path(tempfile.mkdtemp(prefix="bouquet-replicas-"))
    from bouquet.bench.models import SHAPES, make_model_dir, tiny

    bge = SHAPES["bge-base"]
    model = make_model_dir(tiny(bge, layers=2, hidden=128, heads=2, intermediate=512) if args.tiny else bge, work)
    res: dict[str, object] = {"shape": shape, "device": args.device, "clients": args.clients, "batch": args.batch,
                              "seq_len": args.seq_len, "seconds": args.seconds, "gateway_workers": args.gateway_workers}
    for n in (1, 2):
        proc, port = start(args, model, n, work / f"serve-{n}.log")
        try:
            res[f"emb_per_s_{n}_replica{'s' if n > 1 else ''}"] = rate = measure(port, args)
            print(f"{n} replica(s): {rate:,.0f} emb/s", flush=True)
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(120)
    res["ratio"] = res["emb_per_s_2_replicas"] / max(res["emb_per_s_1_replica"], 1e-9)  # type: ignore[operator]
    res["target_ratio"] = 1.8
    text = json.dumps(res, indent=2)
    print(text)
    Path(args.out).write_text(text + "\n")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
