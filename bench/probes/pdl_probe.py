"""Programmatic dependent launch (engine/pdl.py) on and off, in one process (issue 14, batch 1).

Usage (GPU): python3 bench/probes/pdl_probe.py OUT.json [--models-root DIR] [--lengths 16,128,512]
[--models qwen3-0.6b,bge-base] [--rounds 2] [--variants off,p0,p32,p64,p160]

For each model (random full-size weights, bf16) one engine per variant (``--variants``), all
alive at once, each with its graphs captured under its own launch mode: ``off`` (``pdl.supported``
patched to False: plain launches, the baseline); ``pN``: ``pdl.MAX_PROGRAMS`` = N (the kernels of
``pdl.FOLLOWS_OURS`` always take PDL, the others when their grid has at most N programs; ``p0``:
only the former, ``p1000000``: every Triton kernel); ``pdl`` / ``nopdl``: PDL as the engine has it
/ off; a ``-whole`` suffix: one CUDA graph per bucket instead of segments (``GraphOptions.segments``).
Per batch-1 length: GPU ms per graph replay
(200 back to back, variants in turn, ``--rounds`` times), the p50 / p99 of ``step().wait()`` end
to end and of ``step()``'s return (``--steps`` steps, the variants in turn 100 steps at a
time, so drift hits all alike), the kernels per replay (torch.profiler), and the largest |difference| of
the outputs against ``off`` (PDL changes no arithmetic: expected 0). Then one large step, 32 × 512
tokens (a graph bucket at the 16,384-token budget): GPU ms per replay, to show the throughput
path is not slowed.

12-01b measured an earlier form (a wait only, no signal, every kernel) across processes, whose
batch-1 p50s move by up to 0.25 ms: this probe alternates in one process instead. Call 2 of
12-01g also ran a signal after the last store and an L2 prefetch of the split-K weights before
the wait (both no better: removed).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
from bench.probes.probe_kernels import gpu_ms  # noqa: E402
from bouquet.engine import pdl  # noqa: E402

_SUPPORTED, _MAX_PROGRAMS = pdl.supported, pdl.MAX_PROGRAMS


def use(variant: str) -> None:
    """Set the launch mode the next engine's kernels (and graph captures) take."""
    pdl.supported = (lambda i: False) if variant == "off" or "nopdl" in variant else _SUPPORTED
    n = variant.split("-")[0]
    pdl.MAX_PROGRAMS = int(n[1:]) if n[:1] == "p" and n[1:].isdigit() else _MAX_PROGRAMS


def restore() -> None:
    pdl.supported, pdl.MAX_PROGRAMS = _SUPPORTED, _MAX_PROGRAMS


def kernels_per_replay(replay) -> int:  # type: ignore[no-untyped-def]
    from torch.profiler import ProfilerActivity, profile

    replay()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        replay()
        torch.cuda.synchronize()
    return sum(1 for e in prof.events() if e.device_type.name == "CUDA" and "memcpy" not in e.name.lower()
               and "memset" not in e.name.lower())


def run(root: Path, models: list[str], lengths: list[int], rounds: int, variants: list[str], steps: int) -> dict:
    from bouquet.bench.models import SHAPES, make_model_dir
    from bouquet.engine.batch import Batch
    from bouquet.engine.buckets import bucket_for
    from bouquet.engine.engine import Engine, GraphOptions
    from bouquet.modelspec import load_spec

    R: dict = {}
    for name in models:
        spec = load_spec(str(make_model_dir(SHAPES[name], root)))
        rng = np.random.default_rng(0)
        cases = {f"b1_L{L}": Batch.pack([rng.integers(1000, 30000, size=L, dtype=np.int32)]) for L in lengths}
        cases["32x512"] = Batch.pack([rng.integers(1000, 30000, size=512, dtype=np.int32) for _ in range(32)])
        engines, graphs, ref = {}, {}, {}
        for v in variants:  # every variant's engine alive at once: its graphs hold its launch mode
            use(v)
            opts = GraphOptions(max_tokens=16384, segments="whole" not in v)
            eng = engines[v] = Engine(spec, "cuda", "bfloat16", spin_wait=True, graphs=opts)
            eng.warmup()
            for key, batch in cases.items():
                for _ in range(3):  # eager, capture, replay
                    out = eng.step(batch).wait()
                ref.setdefault(key, out)  # variants[0]'s (off)
                R.setdefault(f"{name}/{key}_max_abs_diff_vs_{variants[0]}", {})[v] = float(
                    np.abs(np.asarray(out, np.float64) - np.asarray(ref[key], np.float64)).max())
                o = eng.graph_options
                graphs[v, key] = eng.graphs.lazy.graphs[bucket_for(batch.num_seqs, batch.num_tokens, batch.max_seqlen,
                                                                   o.max_tokens, o.max_seqs, eng.uniform_buckets)]
                R.setdefault(f"{name}/{key}_kernels", {})[v] = kernels_per_replay(graphs[v, key].replay)
        restore()
        for key, batch in cases.items():
            for _ in range(rounds):  # GPU ms per replay, variants in turn
                for v in variants:
                    engines[v].step(batch).wait()  # the graph reads the inputs last copied in: this batch's
                    R.setdefault(f"{name}/{key}_replay_ms", {}).setdefault(v, []).append(
                        round(gpu_ms(graphs[v, key].replay, 200 if key != "32x512" else 20), 4))
            if key == "32x512":
                continue
            took: dict = {v: [] for v in variants}
            ret: dict = {v: [] for v in variants}
            for _ in range(steps // 100):  # as a caller sees it (pack, copy in, replay, copy out, wait),
                for v in variants:  # the variants in turn, 100 steps each (the first 10 not counted)
                    for i in range(100):
                        t0 = time.perf_counter()
                        h = engines[v].step(batch)
                        t1 = time.perf_counter()
                        h.wait()
                        if i >= 10:
                            took[v].append(time.perf_counter() - t0)
                            ret[v].append(t1 - t0)
            for v in variants:
                R.setdefault(f"{name}/{key}_step_p50_ms", {})[v] = round(float(np.median(took[v])) * 1e3, 4)
                R.setdefault(f"{name}/{key}_step_p99_ms", {})[v] = round(float(np.percentile(took[v], 99)) * 1e3, 4)
                R.setdefault(f"{name}/{key}_step_return_p50_ms", {})[v] = round(float(np.median(ret[v])) * 1e3, 4)
        del engines, graphs
        torch.cuda.empty_cache()
        print(name, json.dumps({k: v for k, v in R.items() if k.startswith(name)}), flush=True)
    return R


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out_json")
    ap.add_argument("--models-root", default="/tmp/bench-models")
    ap.add_argument("--models", default="qwen3-0.6b,bge-base")
    ap.add_argument("--lengths", default="16,128,512")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--variants", default="off,p0,p32,p64,p160", help="the first is the baseline")
    ap.add_argument("--steps", type=int, default=1000, help="end-to-end steps per variant and length")
    a = ap.parse_args()
    res: dict = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                 "pdl_supported": _SUPPORTED(torch.cuda.current_device())}
    res["engines"] = run(Path(a.models_root), a.models.split(","), [int(n) for n in a.lengths.split(",")], a.rounds,
                         a.variants.split(","), a.steps)
    Path(a.out_json).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
