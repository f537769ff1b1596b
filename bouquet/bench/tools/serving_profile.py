"""Where one online query's CPU time goes: `bouquet serve --engine noop` under load, profiled.

Starts the real server with the no-op engine (everything but the model: HTTP, JSON, validation,
tokenization, the gateway → replica hop, scheduling, the reply), drives it with N keep-alive
connections sending one short text per request (bouquet/bench/loadgen.py, ~20-50 µs of client
CPU a request), samples the gateway worker and the replica with py-spy for the timed window, and reads
their CPU time from /proc over the same window. Each sample is put in the category of the
innermost frame that matches a rule below; a category's µs per request = its share of the
process's samples × the process's CPU µs per request (an estimate: py-spy samples threads that
hold or wait for the GIL, the CPU time is exact).

    bouquet bench serving-profile --conns 16 --out /tmp/prof        # this machine
    bouquet bench serving-profile --serve-arg=--transport --serve-arg=grpc   # the gRPC hop instead

Needs py-spy (``pip install py-spy``; on the GPU host, carried as a wheel). Writes
``OUT.json`` and ``OUT.md``.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[3]  # the source checkout

from bouquet.bench.tools.gateway_overhead import environment, pin  # noqa: E402
from bouquet.bench.procs import cpu_seconds  # noqa: E402
from bouquet.bench.loadgen import post_request, run_window  # noqa: E402

TEXT = "A man is playing a guitar on the stage while the crowd sings along."
# (category, substrings of a frame "function (file:line)"), tried from the innermost frame out;
# the first rule that matches any frame of the sample, walking outwards, wins.
RULES: list[tuple[str, tuple[str, ...]]] = [
    ("tokenize", ("tokenization.py", "tokenizers")),
    ("metrics", ("prometheus_client", "metrics.py")),
    ("json", ("orjson", "parse_json", "json_response")),
    ("reply encode", ("encode_vectors", "base64", "starlette/responses.py")),
    ("hop: ipc", ("channels.py", "ipc_server.py", "ipc.py")),
    ("hop: grpc", ("grpc/", "grpc_", "rpc.py", "_channel.py", "cygrpc")),
    ("coalesce/balance", ("coalesce.py", "replicas.py")),
    ("schedule", ("scheduler.py", "batch.py")),
    ("engine step + finalize", ("noop.py", "pooling.py", "engine/")),
    ("replica service", ("service.py", "stats.py")),
    ("validate/route", ("inputs.py", "app.py", "routes_", "core.py", "pipeline.py", "front.py", "gateway/http.py")),
    # (disconnect.py, auth.py, fastpath.py: the middlewares before front.py, for profiles of older trees)
    ("middlewares", ("drain.py", "proxy_headers", "starlette/", "fastapi/", "disconnect.py", "auth.py", "fastpath.py")),
    ("http server (uvicorn)", ("uvicorn/", "httptools")),
    ("event loop + sockets (uvloop, C)", ("runners.py", "uvloop", "asyncio/")),
]


def classify(path: Path) -> Counter[str]:
    """py-spy raw output (``stack count`` lines) → samples per category."""
    out: Counter[str] = Counter()
    for line in path.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        frames = stack.split(";")[::-1]
        cat = "other"
        for f in frames:
            hit = next((c for c, keys in RULES if any(k in f for k in keys)), None)
            if hit is not None:
                cat = hit
                break
        out[cat] += int(n)
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--conns", type=int, default=16)
    ap.add_argument("--seconds", type=float, default=6.0)
    ap.add_argument("--rate", type=int, default=250, help="py-spy samples per second")
    ap.add_argument("--serve-arg", action="append", default=[], help="extra `bouquet serve` argument (repeatable)")
    ap.add_argument("--engine", default="noop", choices=("noop", "torch"))
    ap.add_argument("--device", default="cpu", help="with --engine torch: the replica's device")
    ap.add_argument("--gateway-workers", type=int, default=1, help="profiled together (their samples and CPU summed)")
    ap.add_argument("--random-model", action="store_true", help="a random all-MiniLM-L6-v2-shape model (GPU host)")
    ap.add_argument("--no-pin", action="store_true")
    ap.add_argument("--out", default="/tmp/serving-profile")
    a = ap.parse_args(argv)
    from bouquet.bench.served import Served

    import httpx

    model_args: list[str] = []
    if a.random_model:
        import tempfile

        from bouquet.bench.models import SHAPES, make_model_dir

        model_args = ["--model", str(make_model_dir(SHAPES["minilm"], Path(tempfile.mkdtemp(prefix="prof-"))))]
    env = environment()
    srv = Served("--engine", a.engine, "--log-level", "warning", "--gateway-workers", str(a.gateway_workers),
                         *model_args, *a.serve_arg, env={"TOKENIZERS_PARALLELISM": "false"}, device=a.device)
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        replica = httpx.get(srv.url + "/health", timeout=10).json()["replicas"][0]
        procs = {"gateway": [srv.proc.pid], "replica": [int(replica["pid"])]}
        if a.gateway_workers > 1:  # uvicorn's worker processes: the launcher's children that are no replica
            kids = Path(f"/proc/{srv.proc.pid}/task/{srv.proc.pid}/children").read_text().split()
            procs["gateway"] = [int(k) for k in kids if b"bouquet.server" not in Path(f"/proc/{k}/cmdline").read_bytes()]
        cpus = sorted(os.sched_getaffinity(0))
        pinning = "not pinned"
        if a.gateway_workers > 1 or a.no_pin:
            pass
        elif len(cpus) >= 3:
            # gateway and replica one core each, the client the rest: neither waits for a core
            pin(procs["gateway"][0], {cpus[0]})
            pin(procs["replica"][0], {cpus[1]})
            os.sched_setaffinity(0, set(cpus[2:]))
            pinning = f"gateway CPU {cpus[0]}, replica CPU {cpus[1]}, client CPUs {cpus[2:]}"
        elif len(cpus) == 2:
            pin(procs["gateway"][0], {cpus[0]})
            pin(procs["replica"][0], {cpus[1]})
            os.sched_setaffinity(0, {cpus[1]})
            pinning = f"gateway CPU {cpus[0]}, replica and client CPU {cpus[1]}"
        raw = post_request("127.0.0.1", srv.port, "/v1/embeddings",
                         json.dumps({"input": TEXT, "encoding_format": "base64"}).encode())
        t = time.monotonic()
        run_window("127.0.0.1", srv.port, raw, a.conns, t, t + 1.5)  # warm-up: imports, first batches
        spies = {(name, i): subprocess.Popen(
            ["py-spy", "record", "--nonblocking", "-r", str(a.rate), "-d", str(int(a.seconds)), "-f", "raw",
             "-o", f"{out}-{name}{i}.txt", "-p", str(pid)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            for name, pids in procs.items() for i, pid in enumerate(pids)}
        t = time.monotonic() + 0.5
        c0 = {k: sum(cpu_seconds(p) for p in ps) for k, ps in procs.items()}
        res = run_window("127.0.0.1", srv.port, raw, a.conns, t, t + a.seconds)
        c1 = {k: sum(cpu_seconds(p) for p in ps) for k, ps in procs.items()}
        for (name, i), sp in spies.items():
            _, err = sp.communicate(timeout=60)
            if sp.returncode:
                raise RuntimeError(f"py-spy on {name} {i} failed: {err.decode(errors='replace')[-500:]}")
    finally:
        srv.stop()
    n = len(res.latencies)
    rows: dict[str, Any] = {}
    for name in procs:
        us = (c1[name] - c0[name]) / n * 1e6
        cats: Counter[str] = Counter()
        for i in range(len(procs[name])):
            cats += classify(Path(f"{out}-{name}{i}.txt"))
        total = sum(cats.values()) or 1
        rows[name] = {"cpu_us_per_req": round(us, 1), "samples": total,
                      "categories_us_per_req": {k: round(us * v / total, 1) for k, v in cats.most_common()}}
    lat = sorted(res.latencies)
    result = {"command": "bouquet bench serving-profile " + " ".join(argv if argv is not None else sys.argv[1:]), "env": env, "pinning": pinning,
              "conns": a.conns, "req_per_s": round(n / a.seconds, 1), "p50_ms": round(lat[n // 2] * 1e3, 3),
              "client_cpu_us_per_req": round(res.cpu_s / n * 1e6, 1), "statuses": res.statuses, "processes": rows}
    Path(f"{out}.json").write_text(json.dumps(result, indent=1) + "\n")
    md = [f"engine {a.engine} ({a.device}), {a.gateway_workers} gateway worker(s), conns {a.conns}: {result['req_per_s']:,.0f} req/s, p50 {result['p50_ms']} ms; {pinning}; commit {env['commit']}",
          "", "| process | category | CPU µs/req |", "|---|---|---|"]
    for name, r in rows.items():
        md.append(f"| {name} | **all** | **{r['cpu_us_per_req']}** |")
        md += [f"| {name} | {k} | {v} |" for k, v in r["categories_us_per_req"].items()]
    Path(f"{out}.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
