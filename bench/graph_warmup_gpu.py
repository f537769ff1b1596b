"""Two graph-path figures the GPU issue asks for that `bouquet bench` does not take:

1. p99 during graph warm-up vs after: a fresh engine (``warmup()`` done as the server does, no
   start-up capture) serves a stream of batch-1 requests whose lengths cycle through
   ``--lengths``; the first ``--warm`` requests see every bucket eager once and captured once; the
   next ``--steady`` are replays. Latency = ``step()`` to result, ms, overall and per length.
2. Memory with every bucket up to the graph threshold captured: token counts 64 … 1,024 step 64
   and 1,280 … ``max_tokens`` step 256, each with slots {1, 8, 64, 512} where they fit and
   ``max_seqlen`` = min(tokens, the model's maximum). Reports graphs captured, capture seconds and
   peak GPU memory (GiB, ``torch.cuda.max_memory_allocated``; all graphs share one pool).

Usage (GPU): python3 bench/graph_warmup_gpu.py OUT_JSON [--shape qwen3-0.6b] [--tokenizer T]
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from bouquet.bench.meta import source_commit  # noqa: E402


def percentile(xs: list[float], q: float) -> float:
    return round(float(np.percentile(xs, q)), 4)


def warmup_latency(engine, lengths: list[int], warm: int, steady: int) -> dict:  # type: ignore[no-untyped-def]
    """Batch-1 requests cycling through ``lengths``: the first ``warm`` see each bucket eager once and
    captured once, the next ``steady`` are replays. Overall and per-length figures, ms."""
    from bouquet.engine.runtime.batch import Batch

    rng = np.random.default_rng(0)
    lat: list[tuple[int, float]] = []
    for i in range(warm + steady):
        n = lengths[i % len(lengths)]
        batch = Batch.pack([rng.integers(1000, 30000, size=n, dtype=np.int32)])
        t0 = time.perf_counter()
        engine.step(batch).wait()
        lat.append((n, (time.perf_counter() - t0) * 1e3))
    w, s = [x for _, x in lat[:warm]], [x for _, x in lat[warm:]]
    per_length = {}
    for n in lengths:
        mine = [x for m, x in lat if m == n]
        sw, ss = mine[:2], mine[2:]
        per_length[n] = {"eager_first_ms": round(sw[0], 3), "capture_ms": round(sw[1], 3) if len(sw) > 1 else None,
                         "steady_p50_ms": percentile(ss, 50), "steady_p99_ms": percentile(ss, 99),
                         "steady_p99_over_p50": round(percentile(ss, 99) / percentile(ss, 50), 3)}
    return {"warm_requests": warm, "warm_p50_ms": percentile(w, 50), "warm_p99_ms": percentile(w, 99),
            "warm_max_ms": round(max(w), 3), "steady_requests": steady, "steady_p50_ms": percentile(s, 50),
            "steady_p99_ms": percentile(s, 99), "per_length": per_length,
            "graphs": engine.graphs.stats()["captured"] if engine.graphs else 0,
            "capture_s": engine.graphs.stats()["capture_s"] if engine.graphs else 0}


def all_buckets(max_tokens: int, max_len: int, max_seqs: int) -> list:  # type: ignore[type-arg]
    from bouquet.engine.runtime.buckets import Bucket, round_max_seqlen

    tokens = list(range(64, 1025, 64)) + list(range(1280, max_tokens + 1, 256))
    out = []
    for t in tokens:
        for s in (1, 8, 64, 512):
            if s <= min(t, max_seqs):
                out.append(Bucket(s, t, round_max_seqlen(min(t, max_len), t)))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out_json")
    ap.add_argument("--shape", default="qwen3-0.6b")
    ap.add_argument("--tokenizer", default=None, help="tokenizer.json (default: the embedded MiniLM's)")
    ap.add_argument("--models-root", default="/tmp/models")
    ap.add_argument("--lengths", default="16,100,128,300,512,1000,2048")
    ap.add_argument("--warm", type=int, default=14, help="requests in the warm-up phase (2 per length)")
    ap.add_argument("--steady", type=int, default=700)
    a = ap.parse_args()
    from bouquet.bench.models import SHAPES, make_model_dir
    from bouquet.engine.runtime.engine import Engine, GraphOptions
    from bouquet.modelspec import load_spec

    spec = load_spec(str(make_model_dir(SHAPES[a.shape], Path(a.models_root), Path(a.tokenizer) if a.tokenizer else None)))
    lengths = [n for n in (int(x) for x in a.lengths.split(",")) if n <= spec.max_seq_length]
    res: dict = {"commit": source_commit(REPO), "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                 "shape": a.shape, "lengths": lengths}
    engine = Engine(spec, "cuda", "bfloat16", spin_wait=True)
    t0 = time.perf_counter()
    engine.warmup()  # what the server does before /health turns green: kernels compiled, one eager step
    res["server_warmup_s"] = round(time.perf_counter() - t0, 2)
    res["warmup"] = warmup_latency(engine, lengths, a.warm, a.steady)
    print(json.dumps(res["warmup"], indent=1), flush=True)
    del engine
    torch.cuda.empty_cache()
    opts = GraphOptions()
    engine = Engine(spec, "cuda", "bfloat16", graphs=opts)
    torch.cuda.reset_peak_memory_stats()
    buckets = all_buckets(opts.max_tokens, spec.max_seq_length, opts.max_seqs)
    t0 = time.perf_counter()
    with torch.inference_mode():
        engine.graphs.precapture(buckets)  # type: ignore[union-attr]
    res["all_graphs"] = {"buckets": len(buckets), "captured": engine.graphs.stats()["captured"],  # type: ignore[union-attr]
                         "capture_s": round(time.perf_counter() - t0, 2),
                         "peak_gib": round(torch.cuda.max_memory_allocated() / 2**30, 3),
                         "max_tokens": opts.max_tokens, "goal_gib": 10}
    print(json.dumps(res["all_graphs"], indent=1), flush=True)
    Path(a.out_json).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
