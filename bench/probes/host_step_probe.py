"""Is a full 16,384-token step host-bound? Eager launch time against GPU time, and graphs up to the budget.

Usage (GPU): python3 bench/probes/host_step_probe.py OUT_JSON [--shapes bge-base minilm qwen3-0.6b]
[--models-root DIR] [--fp8-shapes bge-base]

The server steps at most ``GPU_BATCH_TOKENS`` (16,384) tokens, and only steps of up to
``GRAPH_MAX_TOKENS`` (8,192) replay a CUDA graph: every full step of a bulk request runs eagerly.
For each model shape (random weights, bf16; fp8 for ``--fp8-shapes``) and two batches of ~16k
tokens (32 × 512, and mixed 16–512 lengths packed to the budget) this records:
  * ``launch_ms``: host time of one eager ``forward`` (the GPU idle at its start, p50 of 20);
  * ``kernel_ms``: the kernels' summed GPU time (torch.profiler), and ``eager_b2b_ms``: eager
    forwards back to back (ms each) — above ``kernel_ms`` the GPU waits for the host;
  * ``graph_replay_ms`` and ``graph_b2b_ms``: the same batch as a captured graph (engine with
    ``GraphOptions(max_tokens=16384)``), replay alone and steps back to back; and the min cosine
    graph vs eager;
  * pipelined throughput (``jobs.packer.run_pipelined``, budget 16,384, depth 2) over 2,000 mixed
    and 500 × 512 sequences, eager above 8,192 tokens (today) against graphs up to 16,384,
    alternating A/B/A/B in one process, emb/s and the SM clock sampled in each pass (the baseline
    engine is built with ``GraphOptions(max_tokens=8192)``; before that was explicit it took the
    default, 16,384 from 5d54303 on, so call 3 of h200-2026-12-01c compared graphs with graphs in
    these rows and in ``eager_steps_b2b_ms``);
  * a cProfile of 20 eager forwards (where the host time goes).
"""
from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
from bench.probes.probe_kernels import gpu_ms  # noqa: E402
from bench.probes.profile_gpu import kernel_table  # noqa: E402


def sm_clock() -> int:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=5).stdout
        return int(out.split()[0])
    except Exception:  # noqa: BLE001 - a probe records what it can
        return -1


def batches(rng: np.random.Generator, vocab: int) -> dict[str, object]:
    from bouquet.engine.batch import Batch

    uni = Batch.pack([rng.integers(1000, vocab, size=512, dtype=np.int32) for _ in range(32)])
    seqs, total = [], 0
    while True:
        n = int(rng.integers(16, 513))
        if total + n > 16384:
            break
        seqs.append(rng.integers(1000, vocab, size=n, dtype=np.int32))
        total += n
    return {"32x512": uni, f"mixed{len(seqs)}x": Batch.pack(seqs)}


def launch_ms(engine, batch) -> float:  # type: ignore[no-untyped-def]
    ts = []
    for _ in range(20):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        engine.forward(batch)
        ts.append((time.perf_counter() - t0) * 1e3)
    torch.cuda.synchronize()
    return round(statistics.median(ts), 3)


def b2b_steps_ms(engine, batch, reps: int = 20) -> float:  # type: ignore[no-untyped-def]
    """Steps back to back with two in flight, as the server runs them: ms per step."""
    for _ in range(3):
        engine.step(batch).wait()
    t0 = time.perf_counter()
    prev = None
    for _ in range(reps):
        h = engine.step(batch)
        if prev is not None:
            prev.wait()
        prev = h
    prev.wait()
    return round((time.perf_counter() - t0) * 1e3 / reps, 3)


def throughput(engine, seqs, out_dim: int) -> tuple[float, int]:  # type: ignore[no-untyped-def]
    from bouquet.engine.pooling import finalize
    from bouquet.jobs.packer import Group, Packer, drain, run_pipelined

    packer = Packer(16384, 512)
    packer.add(Group(seqs, None, out_dim))
    clock: list[int] = []
    t = threading.Timer(0.3, lambda: clock.append(sm_clock()))
    t.start()
    t0 = time.perf_counter()
    rows = sum(n for n, _ in run_pipelined(engine, drain(packer), lambda r: finalize(r, True, None), 2))
    dt = time.perf_counter() - t0
    t.join()
    return round(rows / dt, 1), clock[0] if clock else -1


def probe_shape(name: str, fp8: bool, root: Path) -> dict:
    from bouquet.bench.models import SHAPES, make_model_dir
    from bouquet.engine.engine import Engine, GraphOptions
    from bouquet.modelspec import load_spec

    spec = load_spec(str(make_model_dir(SHAPES[name], root)))
    q = "fp8" if fp8 else "none"
    eager = Engine(spec, "cuda", "bfloat16", quantization=q, fp8_min_cosine=0.0,
                   graphs=GraphOptions(max_tokens=8192))  # the limit before 5d54303: 16k-token steps eager
    eager.warmup()
    big = Engine(spec, "cuda", "bfloat16", quantization=q, fp8_min_cosine=0.0,
                 graphs=GraphOptions(max_tokens=16384))
    big.warmup()
    rng = np.random.default_rng(0)
    vocab = min(spec.vocab_size, 30000)
    R: dict = {}
    for bname, batch in batches(rng, vocab).items():
        r: dict = {"tokens": batch.num_tokens, "seqs": batch.num_seqs}
        r["launch_ms"] = launch_ms(eager, batch)
        r["kernels"], r["kernel_ms"], top = kernel_table(lambda: eager.forward(batch), top=8)
        r["eager_b2b_ms"] = round(gpu_ms(lambda: eager.forward(batch), 20), 3)
        r["eager_steps_b2b_ms"] = b2b_steps_ms(eager, batch)
        ref = eager.step(batch).wait()
        for _ in range(3):
            out = big.step(batch).wait()  # eager, capture, replay
        a, b = torch.from_numpy(ref).double(), torch.from_numpy(out).double()
        r["graph_vs_eager_min_cos"] = round(float(torch.nn.functional.cosine_similarity(a, b).min()), 6)
        bucket = next(k for k in big.graphs.lazy.graphs if k.tokens >= batch.num_tokens and k.seqs >= batch.num_seqs)
        g = big.graphs.lazy.graphs[bucket]
        r["bucket"] = str(bucket)
        r["graph_replay_ms"] = round(gpu_ms(g.replay, 20), 3)
        r["graph_steps_b2b_ms"] = b2b_steps_ms(big, batch)
        r["top"] = top
        R[bname] = r
        print(name, q, bname, json.dumps({k: v for k, v in r.items() if k != "top"}), flush=True)
    mixed = [rng.integers(1000, vocab, size=int(rng.integers(16, 513)), dtype=np.int32) for _ in range(2000)]
    uni = [rng.integers(1000, vocab, size=512, dtype=np.int32) for _ in range(500)]
    for case, seqs in (("mixed2000", mixed), ("500x512", uni)):
        for e in (eager, big):  # first pass of each also captures
            throughput(e, seqs, eager.out_dim)
        runs: dict[str, list] = {"eager8192": [], "graphs16384": []}
        for _ in range(2):
            for key, e in (("eager8192", eager), ("graphs16384", big)):
                runs[key].append(throughput(e, seqs, eager.out_dim))
        R[f"thr_{case}"] = runs
        print(name, q, case, json.dumps(runs), flush=True)
    pr = cProfile.Profile()
    batch = batches(np.random.default_rng(1), vocab)["32x512"]
    torch.cuda.synchronize()
    pr.enable()
    for _ in range(20):
        eager.forward(batch)
    pr.disable()
    torch.cuda.synchronize()
    s = io.StringIO()
    pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(25)
    R["host_profile_32x512_x20"] = s.getvalue()[-5000:]
    del eager, big
    torch.cuda.empty_cache()
    return R


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out_json")
    ap.add_argument("--shapes", nargs="+", default=["bge-base", "minilm", "qwen3-0.6b"])
    ap.add_argument("--fp8-shapes", nargs="*", default=["bge-base"])
    ap.add_argument("--models-root", default="/tmp/bench-models")
    a = ap.parse_args()
    res: dict = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__}
    for name in a.shapes:
        for fp8 in (False, True) if name in a.fp8_shapes else (False,):
            res[f"{name}/{'fp8' if fp8 else 'bf16'}"] = probe_shape(name, fp8, Path(a.models_root))
            Path(a.out_json).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
