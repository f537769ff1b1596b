"""Gateway overhead on any CPU: `/v1/embeddings` in front of a server that runs no model.

Starts the real `bouquet serve --engine noop` (embedded all-MiniLM-L6-v2 spec and tokenizer; the
replica answers zero vectors through the real gRPC server and scheduler) with one gateway worker
process, and measures, for one ~16-token text per request:

  * ``grpc-1``: the replica called directly over gRPC with the same token ids, 1 client, sequential;
  * ``http-1 <fmt>``: the same text through the gateway, 1 client, sequential, float and base64;
  * ``http-N <fmt>``: N keep-alive connections back to back: requests/s, p50/p99, and the CPU
    time each process spent per request.

Added latency = p50(http-1) − p50(grpc-1). Per-worker capacity = requests / gateway CPU-seconds
(the requests/s one gateway process sustains when it has a core to itself); on a machine where the
replica and the client share the remaining cores, the measured requests/s can be limited by them
rather than by the gateway, so both are reported.

Pinning (Linux, ≥ 2 usable cores): the gateway process (every thread) gets the first core alone;
the replica and the client processes share the others. The client is bouquet/bench/loadgen.py
(keep-alive HTTP/1.1 on uvloop, httptools' parser, ~20-50 µs CPU per request).

    bouquet bench gateway-overhead                       # writes bench/out/gateway-overhead-cpu.{json,md}
    bouquet bench gateway-overhead --seconds 3 --out /tmp/x   # quick look
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from importlib import metadata
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[3]  # the source checkout
from bouquet.bench.meta import source_commit  # noqa: E402
from bouquet.bench.procs import cpu_seconds  # noqa: E402

from bouquet.bench.loadgen import LoadResult, post_request, run_window  # noqa: E402

TEXT = "A man is playing a guitar on the stage while the crowd sings along."  # 16 tokens with [CLS]/[SEP]
PACKAGES = ("fastapi", "starlette", "uvicorn", "httptools", "uvloop", "orjson", "grpcio", "protobuf", "tokenizers")


def pin(pid: int, cpus: set[int]) -> None:
    """Set the affinity of every thread of ``pid`` (sched_setaffinity acts on one thread)."""
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            os.sched_setaffinity(int(tid), cpus)
        except (ProcessLookupError, PermissionError):
            pass


def _pinned(cpus: set[int] | None, fn: Any, *args: Any) -> Any:
    if cpus:
        os.sched_setaffinity(0, cpus)
    return fn(*args)


def _warm() -> None:
    """Imports the client phases need, done before any timed window starts."""
    import grpc  # noqa: F401

    import bouquet.proto.rpc  # noqa: F401
    import bouquet.bench.loadgen  # noqa: F401


def grpc_sequential(address: str, ids: list[int], t0: float, t1: float) -> LoadResult:
    """One client calling Embed back to back; latencies of the calls finished in [t0, t1)."""
    import asyncio

    import grpc

    from bouquet.proto import bouquet_pb2 as pb
    from bouquet.proto.rpc import CHANNEL_OPTIONS, InferenceStub

    async def go() -> LoadResult:
        res = LoadResult()
        arr = np.asarray(ids, dtype="<i4")
        req = pb.EmbedRequest(input_ids=arr.tobytes(), lengths=np.asarray([arr.size], "<i4").tobytes(),
                              priority=pb.PRIORITY_INTERACTIVE)
        async with grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS) as ch:
            stub = InferenceStub(ch)
            c0 = None
            while True:
                a = time.monotonic()
                if c0 is None and a >= t0:
                    c0 = time.process_time()
                await stub.Embed(req, timeout=10)
                b = time.monotonic()
                if b >= t1:
                    break
                if a >= t0:
                    res.latencies.append(b - a)
            res.cpu_s = time.process_time() - (c0 or 0.0)
        res.statuses[200] = len(res.latencies)
        return res

    return asyncio.run(go())


def run_phase(pool: ProcessPoolExecutor, cpus: set[int] | None, watch: dict[str, int], warmup: float, seconds: float,
              fn: Any, *args: Any) -> tuple[LoadResult, float, dict[str, float]]:
    """Run ``fn(*args, t0, t1)`` in the client process; CPU seconds of the watched processes over
    the same window. Returns (result, window seconds, {name: cpu seconds})."""
    t0 = time.monotonic() + 1.0 + warmup  # 1 s for the client process to connect
    t1 = t0 + seconds
    fut = pool.submit(_pinned, cpus, fn, *args, t0, t1)
    time.sleep(max(0.0, t0 - time.monotonic()))
    before = {k: cpu_seconds(p) for k, p in watch.items()}
    time.sleep(max(0.0, t1 - time.monotonic()))
    after = {k: cpu_seconds(p) for k, p in watch.items()}
    res = fut.result(timeout=seconds + warmup + 60)
    return res, seconds, {k: after[k] - before[k] for k in watch}


def summarize(name: str, res: LoadResult, seconds: float, cpu: dict[str, float], conns: int) -> dict[str, Any]:
    lat = np.asarray(res.latencies) * 1e3
    n = int(lat.size)
    if not n:
        raise RuntimeError(f"{name}: no reply finished inside the {seconds:.1f} s window")
    row: dict[str, Any] = {"case": name, "connections": conns, "requests": n, "req_per_s": round(n / seconds, 1),
                           "p50_ms": round(float(np.percentile(lat, 50)), 3), "p99_ms": round(float(np.percentile(lat, 99)), 3),
                           "statuses": {str(k): v for k, v in res.statuses.items()},
                           "client_cpu_us_per_req": round(res.cpu_s / max(n, 1) * 1e6, 1)}
    for k, v in cpu.items():
        row[f"{k}_cpu_util"] = round(v / seconds, 3)
        row[f"{k}_cpu_us_per_req"] = round(v / max(n, 1) * 1e6, 1)
    if "gateway" in cpu and cpu["gateway"] > 0:
        row["gateway_capacity_req_per_s"] = round(n / cpu["gateway"], 0)
    return row


def check_reply(body: bytes, fmt: str, dim: int) -> None:
    """The reply is an OpenAI list with one zero vector of ``dim`` floats (the no-op engine)."""
    import base64

    item = json.loads(body)["data"][0]["embedding"]
    vec = np.frombuffer(base64.b64decode(item), "<f4") if fmt == "base64" else np.asarray(item, np.float32)
    if vec.shape != (dim,) or vec.any():
        raise RuntimeError(f"unexpected reply for {fmt}: shape {vec.shape}")


def environment() -> dict[str, Any]:
    model = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                  if ln.startswith("model name")), platform.processor())
    commit = source_commit(REPO)
    dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                           text=True).stdout.strip()
    versions = {"python": platform.python_version()}
    for p in PACKAGES:
        try:
            versions[p] = metadata.version(p)
        except metadata.PackageNotFoundError:
            versions[p] = None
    t0 = time.perf_counter()
    total = 0
    for i in range(10_000_000):  # the core's speed for pure Python, to compare machines
        total += i
    loop_s = time.perf_counter() - t0
    return {"commit": commit + ("-dirty" if dirty else ""), "cpu_model": model, "cpus": os.cpu_count(),
            "loadavg_before": os.getloadavg(), "python_loop_10M_s": round(loop_s, 3), "versions": versions,
            "date": time.strftime("%Y-%m-%d %H:%M:%S")}


def markdown(res: dict[str, Any]) -> str:
    e = res["env"]
    out = [f"# Gateway overhead on the CPU (no-op engine) — {e['date']}", "",
           f"`{res['command']}`", "",
           f"model {res['model']}; commit {e['commit']}; {e['cpu_model']} ({e['cpus']} CPUs); {res['pinning']}; load average before "
           f"{e['loadavg_before'][0]:.2f} (above {e['cpus']}, processes were waiting for a core); a 10 M-step pure-Python loop took "
           f"{e['python_loop_10M_s']:.2f} s", "",
           "versions: " + ", ".join(f"{k} {v}" for k, v in e["versions"].items()), "",
           f"One text of {res['tokens']} tokens per request. Added latency = p50(http-1) − p50(grpc-1). "
           "Capacity = requests / gateway CPU-seconds (requests/s of one gateway process with a core to itself).", "",
           "| case | conns | req/s | p50 ms | p99 ms | gateway CPU µs/req | gateway util | replica CPU µs/req | "
           "client CPU µs/req | gateway capacity req/s |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for r in res["cases"]:
        out.append(f"| {r['case']} | {r['connections']} | {r['req_per_s']:,.0f} | {r['p50_ms']:.3f} | {r['p99_ms']:.3f} | "
                   f"{r.get('gateway_cpu_us_per_req', '–')} | {r.get('gateway_cpu_util', '–')} | "
                   f"{r.get('replica_cpu_us_per_req', '–')} | {r['client_cpu_us_per_req']} | "
                   f"{r.get('gateway_capacity_req_per_s', '–')} |")
    out += ["", "| format | added p50 latency ms (≤ 0.3) | gateway capacity req/s (≥ 5,000) | measured req/s | met? |",
            "|---|---|---|---|---|"]
    for fmt, s in res["summary"].items():
        met = s["added_p50_ms"] <= 0.3 and s["capacity_req_per_s"] >= 5000
        out.append(f"| {fmt} | {s['added_p50_ms']:.3f} | {s['capacity_req_per_s']:,.0f} | {s['measured_req_per_s']:,.0f} | "
                   f"{'yes' if met else 'no'} |")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=10.0, help="timed window per case")
    ap.add_argument("--warmup", type=float, default=2.0, help="untimed load before each window")
    ap.add_argument("--conns", type=int, default=16, help="connections of the throughput cases")
    ap.add_argument("--no-pin", action="store_true", help="leave CPU affinity alone")
    ap.add_argument("--random-model", action="store_true",
                    help="serve a random all-MiniLM-L6-v2-shape BERT (same tokenizer and dimension) instead of the "
                         "embedded model: for machines that have only its tokenizer.json (the GPU host)")
    ap.add_argument("--out", default=str(REPO / "bench/out/gateway-overhead-cpu"), help="output path without suffix")
    ap.add_argument("--serve-arg", action="append", default=[], help="extra `bouquet serve` argument (repeatable), "
                    "e.g. --serve-arg=--transport --serve-arg=grpc")
    a = ap.parse_args(argv)
    from bouquet.bench.served import Served

    from bouquet.tokenization import TextTokenizer
    from bouquet.modelspec import load_spec

    model_args: list[str] = []
    if a.random_model:
        import tempfile

        from bouquet.bench.models import SHAPES, make_model_dir

        model_args = ["--model", str(make_model_dir(SHAPES["minilm"], Path(tempfile.mkdtemp(prefix="gw-overhead-"))))]
    spec = load_spec(model_args[1] if model_args else None)
    ids = TextTokenizer(spec).encode([TEXT]).ids[0].tolist()
    env = environment()
    srv = Served("--engine", "noop", "--log-level", "warning", *model_args, *a.serve_arg,
                         env={"TOKENIZERS_PARALLELISM": "false"})
    try:
        import httpx

        health = httpx.get(srv.url + "/health", timeout=10).json()
        replica = health["replicas"][0]
        watch = {"gateway": srv.proc.pid, "replica": int(replica["pid"])}
        cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
        client_cpus: set[int] | None = None
        pinning = "not pinned"
        if not a.no_pin and len(cpus) >= 2:
            rest = set(cpus[1:])
            pin(watch["gateway"], {cpus[0]})
            pin(watch["replica"], rest)
            client_cpus = rest
            pinning = f"gateway pinned to CPU {cpus[0]} alone; replica and client on CPUs {sorted(rest)}"
        host, port = "127.0.0.1", srv.port
        cases: list[dict[str, Any]] = []
        summary: dict[str, dict[str, float]] = {}
        with ProcessPoolExecutor(1, mp_context=get_context("spawn")) as pool:
            pool.submit(_pinned, client_cpus, _warm).result(timeout=120)
            res, secs, cpu = run_phase(pool, client_cpus, watch, a.warmup, a.seconds, grpc_sequential, replica["address"], ids)
            grpc_row = summarize("grpc-1 (direct)", res, secs, {"replica": cpu["replica"]}, 1)
            cases.append(grpc_row)
            print(json.dumps(grpc_row), flush=True)
            for fmt in ("float", "base64"):
                raw = post_request(host, port, "/v1/embeddings", json.dumps({"input": TEXT, "encoding_format": fmt}).encode())
                for conns in (1, a.conns):
                    res, secs, cpu = run_phase(pool, client_cpus, watch, a.warmup, a.seconds, run_window, host, port, raw, conns)
                    check_reply(res.first_body, fmt, spec.dimension)
                    row = summarize(f"http-{conns} {fmt}", res, secs, cpu, conns)
                    cases.append(row)
                    print(json.dumps(row), flush=True)
                    if set(res.statuses) != {200}:
                        raise RuntimeError(f"non-200 replies: {res.statuses}")
                one, many = cases[-2], cases[-1]
                summary[fmt] = {"added_p50_ms": round(one["p50_ms"] - grpc_row["p50_ms"], 3),
                                "capacity_req_per_s": many["gateway_capacity_req_per_s"],
                                "measured_req_per_s": many["req_per_s"]}
    finally:
        srv.stop()
    result = {"command": "bouquet bench gateway-overhead " + " ".join(argv if argv is not None else sys.argv[1:]), "env": env, "pinning": pinning,
              "model": spec.model_id if not model_args else "random all-MiniLM-L6-v2 shape", "text": TEXT, "tokens": len(ids), "seconds": a.seconds, "cases": cases, "summary": summary,
              "targets": {"added_p50_ms_max": 0.3, "req_per_s_per_worker_min": 5000}}
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out + ".json").write_text(json.dumps(result, indent=1) + "\n")
    Path(a.out + ".md").write_text(markdown(result))
    print(markdown(result))


if __name__ == "__main__":
    main()
