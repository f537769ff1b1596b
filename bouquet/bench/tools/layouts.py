"""Online queries through `bouquet serve`: one short text per request, many clients, a sweep over
server layouts (gateway workers × replica processes × transport) in one run.

For each layout the real server is started (``--engine noop`` or the model), checked, then driven
by closed-loop clients in separate processes (bouquet/bench/loadgen.py: keep-alive, one request
in flight per client, base64 replies) for each client count; req/s, p50/p90/p99, and the CPU time
of the server's processes per request. Texts: STS Benchmark test sentences (real, short:
~10-30 tokens), cycled.

Checks, per layout with a real model: every query reply's vector equals (cosine ≥ 0.999) the
vector of the same text from one batched request, and the STSb test Spearman correlation of the
batched vectors (sentence-transformers, fp32 CPU: 0.82032).

    bouquet bench layouts --engine noop --layout 4:1:auto --layout 12:1:auto --clients 64,256
    bouquet bench layouts --model DIR --device cuda --layout 12:2:auto --clients 1,64,256

A layout is ``WORKERS:REPLICAS:TRANSPORT`` (replicas = --replicas-per-gpu on a GPU, --replicas
on the CPU; transport auto = the Unix socket, grpc), or ``default`` (no layout flag: what `serve`
chooses for the machine, read back from /info). Writes OUT.json and OUT.md. To measure an
older commit beside this one, run it from a checkout of that commit (``cd OLD && python -m bouquet
bench layouts ...``): the server is started from the current folder.
"""
from __future__ import annotations

import argparse
import base64
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import orjson

REPO = Path(__file__).resolve().parents[3]  # the source checkout (tests/data)

from bouquet.bench.loadgen import post_request, run_load, summarize  # noqa: E402
from bouquet.bench import sts  # noqa: E402
from bouquet.bench.meta import source_commit  # noqa: E402
from bouquet.bench.procs import cpu_seconds as cpu_s  # noqa: E402
from bouquet.bench.procs import tree_pids  # noqa: E402

STS = REPO / "tests" / "data" / "stsbenchmark"


def read_sts(split: str) -> tuple[list[str], list[str], np.ndarray]:
    return sts.read_sts(STS, split)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(port: int, body: dict[str, Any], timeout: float = 120) -> dict[str, Any]:
    import http.client

    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    c.request("POST", "/v1/embeddings", body=orjson.dumps(body), headers={"content-type": "application/json"})
    r = c.getresponse()
    raw = r.read()
    c.close()
    if r.status != 200:
        raise RuntimeError(f"HTTP {r.status}: {raw[:300]!r}")
    return orjson.loads(raw)


def vectors(reply: dict[str, Any]) -> np.ndarray:
    data = sorted(reply["data"], key=lambda d: d["index"])
    return np.stack([np.frombuffer(base64.b64decode(d["embedding"]), "<f4") for d in data])


def batched(port: int, texts: list[str], chunk: int = 256) -> np.ndarray:
    return np.concatenate([vectors(post(port, {"input": texts[i:i + chunk], "encoding_format": "base64"}))
                           for i in range(0, len(texts), chunk)])


def run_layout(a: argparse.Namespace, layout: str, texts: list[str], sts: tuple[list[str], list[str], np.ndarray]) -> dict[str, Any]:
    workers, replicas, transport = layout.split(":") if layout != "default" else ("default", "default", "auto")
    port = free_port()
    cmd = [sys.executable, "-m", "bouquet", "serve", "--port", str(port), "--device", a.device, "--engine", a.engine,
           "--log-level", "warning"]
    # Flags at their defaults are left out, so that an older tree (no --transport) can be served
    # the same way: run this script from that tree's folder (`python -m bouquet` imports from the cwd).
    # "default": no layout flag at all, as a user starts it.
    cmd += ["--gateway-workers", workers] if workers != "default" else []
    cmd += ["--transport", transport] if transport != "auto" else []
    if replicas != "default":
        cmd += (["--replicas-per-gpu", replicas] if replicas != "1" else []) if a.device == "cuda" else ["--replicas", replicas]
    if a.model:
        cmd += ["--model", a.model]
    cmd += a.serve_arg
    log_path = Path(tempfile.mkdtemp(prefix="queries-")) / "server.log"
    log = open(log_path, "wb")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "TOKENIZERS_PARALLELISM": "false"})
    row: dict[str, Any] = {"layout": layout, "transport": transport, "command": " ".join(cmd[1:]), "cases": []}
    try:
        deadline = time.monotonic() + 300
        import http.client

        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"server exited with {proc.returncode}")
            try:
                c = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
                c.request("GET", "/health")
                if c.getresponse().status == 200:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError("server not healthy after 300 s")
            time.sleep(0.3)
        try:  # what the server chose (trees before the layout's /info field have none)
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            c.request("GET", "/info")
            row["chosen"] = orjson.loads(c.getresponse().read()).get("layout")
        except (OSError, ValueError):
            pass
        if a.engine != "noop":
            s1, s2, gold = sts
            ref = batched(port, texts[:512])
            e1, e2 = batched(port, s1), batched(port, s2)
            from scipy.stats import spearmanr

            cos = (e1 * e2).sum(1) / (np.linalg.norm(e1, axis=1) * np.linalg.norm(e2, axis=1))
            row["sts_test_spearman"] = round(float(spearmanr(cos, gold).statistic), 5)
        if a.batch > 1:  # bulk: each request carries `batch` consecutive texts
            reqs = [post_request("127.0.0.1", port, "/v1/embeddings", orjson.dumps(
                {"input": [texts[(i + j) % len(texts)] for j in range(a.batch)], "encoding_format": "base64"}))
                for i in range(0, len(texts), a.batch)]
        else:
            reqs = [post_request("127.0.0.1", port, "/v1/embeddings", orjson.dumps({"input": t, "encoding_format": "base64"}))
                    for t in texts]
        pids = tree_pids(proc.pid)
        for clients in a.clients:
            c0, t0 = cpu_s(pids), time.monotonic()
            res = run_load("127.0.0.1", port, reqs, clients, a.seconds, a.warmup, processes=min(clients, a.max_procs))
            wall = time.monotonic() - t0
            server_cpu = cpu_s(pids) - c0
            case = {"clients": clients, "batch": a.batch, **summarize(res, a.seconds),
                    "server_cpu_us_per_req": round(server_cpu / max(1, len(res.latencies)) * 1e6 * a.seconds / wall, 1)}
            case["texts_s"] = round(case["req_s"] * a.batch, 1)
            if a.engine != "noop" and res.samples and a.batch == 1:
                got = np.stack([vectors(orjson.loads(b))[0] for i, b in sorted(res.samples.items()) if i < 512])
                want = ref[[i for i in sorted(res.samples) if i < 512]]
                cosv = (got * want).sum(1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(want, axis=1))
                case["min_cosine_vs_batched"] = round(float(cosv.min()), 6)
            row["cases"].append(case)
            print(json.dumps({"layout": layout, **case}), flush=True)
    except Exception as e:  # noqa: BLE001 - one failing layout keeps the others
        row["error"] = f"{type(e).__name__}: {e}"
        log.flush()
        row["log_tail"] = log_path.read_text(errors="replace")[-3000:]
        print(f"{layout}: {row['error']}\n{row['log_tail']}", flush=True)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
    return row


def markdown(res: dict[str, Any]) -> str:
    e = res["env"]
    out = [f"# Online queries — {e['host']} ({e['cpus']} CPUs), commit {e['commit']}, {e['date']}", "",
           f"`{res['command']}`", "", f"engine {res['engine']}, model {res['model'] or 'embedded all-MiniLM-L6-v2'}, device "
           f"{res['device']}; one STSb test sentence per request, base64; {res['seconds']} s per case after "
           f"{res['warmup']} s of the same load", "",
           "| layout (workers:replicas:transport) | clients × texts | req/s | texts/s | p50 ms | p99 ms | server CPU µs/req | client CPU µs/req | check |",
           "|---|---|---|---|---|---|---|---|---|"]
    for r in res["layouts"]:
        if "error" in r:
            out.append(f"| {r['layout']} | – | error: {r['error'][:100]} | | | | | | |")
        for c in r["cases"]:
            check = []
            if "min_cosine_vs_batched" in c:
                check.append(f"cos ≥ {c['min_cosine_vs_batched']:.5f}")
            if "sts_test_spearman" in r:
                check.append(f"STSb ρ {r['sts_test_spearman']}")
            if set(c.get("statuses", {})) - {"200"} or c.get("errors"):
                check.append(f"statuses {c.get('statuses')} errors {c.get('errors')}")
            out.append(f"| {r['layout']} | {c['clients']} × {c.get('batch', 1)} | {c['req_s']:,.0f} | {c.get('texts_s', 0):,.0f} | "
                       f"{c.get('p50', '–')} | {c.get('p99', '–')} | "
                       f"{c['server_cpu_us_per_req']} | {c.get('client_cpu_us_per_req', '–')} | {'; '.join(check)} |")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None)
    ap.add_argument("--engine", default="torch", choices=("torch", "noop"))
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--layout", action="append", default=[])
    ap.add_argument("--clients", default="64,256")
    ap.add_argument("--batch", type=int, default=1, help="texts per request (1: queries; e.g. 256: bulk)")
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--warmup", type=float, default=1.0)
    ap.add_argument("--max-procs", type=int, default=256, help="client processes at most (clients share them beyond)")
    ap.add_argument("--serve-arg", action="append", default=[])
    ap.add_argument("--out", default="/tmp/queries")
    a = ap.parse_args(argv)
    a.clients = [int(x) for x in a.clients.split(",")]
    layouts = a.layout or ["1:1:auto"]
    s1, s2, gold = read_sts("test")
    texts = list(dict.fromkeys(s1 + s2))
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    env = {"commit": source_commit(REPO), "host": platform.node(), "cpus": len(os.sched_getaffinity(0)),
           "python": platform.python_version(), "date": time.strftime("%Y-%m-%d %H:%M:%S")}
    res = {"command": "bouquet bench layouts " + " ".join(argv if argv is not None else sys.argv[1:]), "env": env, "engine": a.engine,
           "model": a.model, "device": a.device, "seconds": a.seconds, "warmup": a.warmup, "layouts": []}
    for layout in layouts:
        res["layouts"].append(run_layout(a, layout, texts, (s1, s2, gold)))
        Path(a.out + ".json").write_text(json.dumps(res, indent=1) + "\n")
    Path(a.out + ".md").write_text(markdown(res))
    print(markdown(res))


if __name__ == "__main__":
    main()
