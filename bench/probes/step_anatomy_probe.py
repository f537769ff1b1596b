"""Where a batch-1 step's wall time goes beyond its graph replay (issue 14: engine p50 vs replay GPU ms).

Usage (GPU): python3 bench/probes/step_anatomy_probe.py OUT.json [--models-root DIR]
[--models bge-base,qwen3-0.6b] [--lengths 16,128] [--variants default,nosegments,cut0] [--steps 400]

For each model and variant (one engine alive at a time; random full-size weights, bf16, graphs,
spin-wait, as the bench's engine system) and each length, the bucket captured, then:

* ``replay_gpu_ms``: graph replays back to back (CUDA events), the figure the results call "replay";
* ``bench_wall_ms``: the bench's engine call, closed loop (``Batch.pack`` → ``Engine.step`` →
  ``wait`` → ``pooling.finalize``), p50 / p90 over ``--steps``;
* ``step_gpu_ms``: per closed-loop step, a timing event recorded just before ``step`` and one just
  after it returns (behind the D2H copy): the GPU's span from the idle device reaching the first
  event to the output's copy landing; ``host_ms`` = wall − that span (host work before the GPU
  starts and after it ends);
* ``phases_us``: the same step re-enacted piece by piece with host timestamps (medians): pack,
  bucket lookup, ``pack_inputs`` + H2D enqueue (before 12-02b) or ``stage`` (the staging buffer,
  whose copy is the graph's first node), each graph segment's launch, the output buffer, D2H
  enqueue, event, wait, finalize; and GPU µs from the first event to the H2D enqueue's end (to the
  staging's end from 12-02b on: nothing then runs on the GPU), to the replay's end, to the D2H
  copy's end;
* ``micro_us``: host µs of pieces the step pays each time (pinned ``torch.empty``, ``Event()``,
  ``torch.cuda.device`` context, ``inference_mode`` context).

Variants: ``default``; ``nosegments`` (one graph per bucket); ``cut0`` (a segment cut before the
first layer too: the first launch is the embeddings alone).
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
from bench.probes.probe_kernels import gpu_ms, variant_parser  # noqa: E402


def _pct(xs: list[float], q: float) -> float:
    return round(float(np.percentile(xs, q)), 4)


def micro(reps: int = 2000) -> dict:
    def us(fn) -> float:  # type: ignore[no-untyped-def]
        for _ in range(100):
            fn()
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        return round((time.perf_counter() - t0) / reps * 1e6, 2)

    dev = torch.device("cuda", 0)

    def ctx_device() -> None:
        with torch.cuda.device(dev):
            pass

    def ctx_inference() -> None:
        with torch.inference_mode():
            pass

    return {"pinned_empty_768f32": us(lambda: torch.empty((1, 768), dtype=torch.float32, pin_memory=True)),
            "pinned_empty_600i32": us(lambda: torch.empty(600, dtype=torch.int32, pin_memory=True)),
            "event_create": us(lambda: torch.cuda.Event(blocking=False)),
            "event_create_record": us(lambda: torch.cuda.Event(blocking=False).record()),
            "cuda_device_ctx": us(ctx_device), "inference_mode_ctx": us(ctx_inference)}


def closed_loop(eng, seq: np.ndarray, steps: int) -> dict:  # type: ignore[no-untyped-def]
    from bouquet.engine.batch import Batch
    from bouquet.engine.pooling import finalize

    walls, spans = [], []
    for i in range(steps + 20):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0 = time.perf_counter()
        a.record()
        batch = Batch.pack([seq])
        h = eng.step(batch)
        b.record()
        finalize(h.wait(), True, None)
        t1 = time.perf_counter()
        b.synchronize()
        if i >= 20:
            walls.append((t1 - t0) * 1e3)
            spans.append(a.elapsed_time(b))
    host = [w - s for w, s in zip(walls, spans)]
    return {"bench_wall_ms": [_pct(walls, 50), _pct(walls, 90)], "step_gpu_ms": [_pct(spans, 50), _pct(spans, 90)],
            "host_ms": [_pct(host, 50), _pct(host, 90)]}


def phases(eng, seq: np.ndarray, steps: int) -> dict:  # type: ignore[no-untyped-def]
    from bouquet.engine.batch import Batch
    from bouquet.engine.buckets import bucket_for
    from bouquet.engine.graphs import pack_inputs
    from bouquet.engine.pooling import finalize

    o, gm = eng.graph_options, eng.graphs
    names: list[str] = []
    rows: list[list[float]] = []
    gpu: list[list[float]] = []
    with torch.inference_mode(), torch.cuda.device(eng.device):
        for i in range(steps + 20):
            ev = [torch.cuda.Event(enable_timing=True) for _ in range(4)]
            t = [time.perf_counter_ns()]
            nm = ["start"]
            ev[0].record()
            batch = Batch.pack([seq]); t.append(time.perf_counter_ns()); nm.append("pack")
            bk = bucket_for(batch.num_seqs, batch.num_tokens, batch.max_seqlen, o.max_tokens, o.max_seqs,
                            eng.uniform_buckets); t.append(time.perf_counter_ns()); nm.append("bucket")
            if hasattr(gm, "stage"):  # 12-02b on: packed into the pinned staging buffer, copied in by the graph
                gm.stage(batch, bk); t.append(time.perf_counter_ns()); nm.append("stage")
                ev[1].record()
            else:  # before: a pinned buffer per step, then a copy call
                host_in = pack_inputs(batch, bk.tokens, bk.seqs); t.append(time.perf_counter_ns()); nm.append("pack_inputs")
                gm.load(host_in); t.append(time.perf_counter_ns()); nm.append("h2d_enqueue")
                ev[1].record()
            g = gm.lazy.lookup(bk)
            assert g is not None
            for k, s in enumerate(g.segments):
                s.replay(); t.append(time.perf_counter_ns()); nm.append(f"segment{k}")
            ev[2].record()
            out = g.out
            host = torch.empty((1, out.shape[1]), dtype=torch.float32, pin_memory=True)
            t.append(time.perf_counter_ns()); nm.append("out_buffer")
            host.copy_(out[:1], non_blocking=True); t.append(time.perf_counter_ns()); nm.append("d2h_enqueue")
            e = torch.cuda.Event(blocking=False)
            e.record(); t.append(time.perf_counter_ns()); nm.append("event")
            ev[3].record()
            e.synchronize(); t.append(time.perf_counter_ns()); nm.append("wait")
            finalize(host.numpy(), True, None); t.append(time.perf_counter_ns()); nm.append("finalize")
            ev[3].synchronize()
            if i >= 20:
                names = nm
                rows.append([(t[j + 1] - t[j]) / 1e3 for j in range(len(t) - 1)] + [(t[-1] - t[0]) / 1e3])
                gpu.append([ev[0].elapsed_time(ev[j]) * 1e3 for j in (1, 2, 3)])
    med = np.median(np.array(rows), axis=0)
    gmed = np.median(np.array(gpu), axis=0)
    res = {n: round(float(v), 2) for n, v in zip(names[1:] + ["total"], med)}
    res.update({"gpu_to_h2d_end": round(float(gmed[0]), 2), "gpu_to_replay_end": round(float(gmed[1]), 2),
                "gpu_to_d2h_end": round(float(gmed[2]), 2)})
    return res


def run(root: Path, models: list[str], lengths: list[int], variants: list[str], steps: int) -> dict:
    from bouquet.bench.models import SHAPES, make_model_dir
    from bouquet.engine.buckets import bucket_for
    from bouquet.engine.engine import Engine, GraphOptions
    from bouquet.engine.graphs import segment_starts
    from bouquet.modelspec import load_spec

    R: dict = {"micro_us": micro()}
    print("micro", R["micro_us"], flush=True)
    for name in models:
        spec = load_spec(str(make_model_dir(SHAPES[name], root)))
        for var in variants:
            eng = Engine(spec, "cuda", "bfloat16", spin_wait=True, graphs=GraphOptions(segments=var != "nosegments"))
            if var == "cut0":
                eng.graphs.cuts = [0] + segment_starts(len(eng.graphs.blocks))
            eng.warmup()
            rng = np.random.default_rng(0)
            for L in lengths:
                seq = rng.integers(1000, 30000, size=L, dtype=np.int32)
                closed_loop(eng, seq, 5)  # first sight, capture
                o = eng.graph_options
                bk = bucket_for(1, L, L, o.max_tokens, o.max_seqs, eng.uniform_buckets)
                g = eng.graphs.lazy.graphs[bk]
                r = {"segments": len(g.segments), "replay_gpu_ms": round(gpu_ms(g.replay, 300), 4)}
                r.update(closed_loop(eng, seq, steps))
                r["phases_us"] = phases(eng, seq, steps)
                r.update({"second_" + k: v for k, v in closed_loop(eng, seq, steps).items()})
                R[f"{name}/{var}/L{L}"] = r
                print(name, var, L, json.dumps(r), flush=True)
            del eng
            torch.cuda.empty_cache()
    return R


def main() -> None:
    ap = variant_parser("16,128", "default,nosegments,cut0")
    ap.add_argument("--steps", type=int, default=400)
    a = ap.parse_args()
    res = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
           "rows": run(Path(a.models_root), a.models.split(","), [int(n) for n in a.lengths.split(",")],
                       a.variants.split(","), a.steps)}
    Path(a.out_json).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
