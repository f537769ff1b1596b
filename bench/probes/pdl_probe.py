"""Programmatic dependent launch (engine/pdl.py) on and off, in one process (issue 14, batch 1).

Usage (GPU): python3 bench/probes/pdl_probe.py OUT.json [--models-root DIR] [--lengths 16,128,512]
[--models qwen3-0.6b,bge-base] [--rounds 2]

For each model (random full-size weights, bf16) engines are built in turn, ``--rounds`` times, one
per variant (``--variants``): ``off`` (``pdl.supported`` patched to False: plain launches, the
baseline); ``early-all`` / ``late-all``: every Triton kernel with PDL, signalling at its start
(``pdl.MODE`` 1) or after its last store (2); ``early`` / ``late``: only ``pdl.KERNELS``' default
set; ``early-nopf``: that set without the split-K weight prefetch (``SplitPlan.prefetch``). Per batch-1
length: GPU ms per graph replay (200 back to back), the p50 of ``step().wait()`` end to end (400
steps), the kernels per replay (torch.profiler), and the largest |difference| of the outputs
against ``off`` (PDL changes no arithmetic: expected 0). Then one large step per engine, 32 × 512
tokens (a graph bucket at the 16,384-token budget): GPU ms per replay, to show the throughput
path is not slowed.

12-01b measured an earlier form (a wait only, no signal, no prefetch) across processes, whose
batch-1 p50s move by up to 0.25 ms: this probe alternates in one process instead.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
from bench.probes.probe_kernels import gpu_ms  # noqa: E402
from bouquet.engine import pdl, splitk  # noqa: E402

ALL_KERNELS = frozenset({"attention", "splitk", "norm_parts", "norm", "qk_norm_rope", "act", "act_quant"})
_SUPPORTED, _PLAN_FOR, _MODE, _KERNELS = pdl.supported, splitk.plan_for, pdl.MODE, pdl.KERNELS


def _no_prefetch(*args: int) -> "splitk.SplitPlan | None":
    p = _PLAN_FOR(*args)
    return None if p is None else dataclasses.replace(p, prefetch=False)


def use(variant: str) -> None:
    """Set the launch mode the next engine's kernels (and graph captures) take."""
    pdl.supported = (lambda i: False) if variant == "off" else _SUPPORTED
    pdl.MODE = 2 if variant.startswith("late") else 1
    pdl.KERNELS = ALL_KERNELS if variant.endswith("-all") else _KERNELS
    splitk.plan_for = _no_prefetch if variant.endswith("-nopf") else _PLAN_FOR


def restore() -> None:
    pdl.supported, pdl.MODE, pdl.KERNELS, splitk.plan_for = _SUPPORTED, _MODE, _KERNELS, _PLAN_FOR


def kernels_per_replay(replay) -> int:  # type: ignore[no-untyped-def]
    from torch.profiler import ProfilerActivity, profile

    replay()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        replay()
        torch.cuda.synchronize()
    return sum(1 for e in prof.events() if e.device_type.name == "CUDA" and "memcpy" not in e.name.lower()
               and "memset" not in e.name.lower())


def run(root: Path, models: list[str], lengths: list[int], rounds: int, variants: list[str]) -> dict:
    from bouquet.bench.models import SHAPES, make_model_dir
    from bouquet.engine.batch import Batch
    from bouquet.engine.buckets import bucket_for
    from bouquet.engine.engine import Engine, GraphOptions
    from bouquet.modelspec import load_spec

    R: dict = {}
    for name in models:
        spec = load_spec(str(make_model_dir(SHAPES[name], root)))
        rng = np.random.default_rng(0)
        b1 = {L: Batch.pack([rng.integers(1000, 30000, size=L, dtype=np.int32)]) for L in lengths}
        big = Batch.pack([rng.integers(1000, 30000, size=512, dtype=np.int32) for _ in range(32)])
        ref: dict = {}
        for r in range(rounds):
            for v in variants:
                use(v)
                eng = Engine(spec, "cuda", "bfloat16", spin_wait=True, graphs=GraphOptions(max_tokens=16384))
                eng.warmup()
                for L, batch in list(b1.items()) + [("32x512", big)]:
                    for _ in range(3):  # eager, capture, replay
                        out = eng.step(batch).wait()
                    key = f"{name}/{'b1_L' + str(L) if L != '32x512' else L}"
                    if v == "off" and r == 0:
                        ref[L] = out
                    diff = float(np.abs(np.asarray(out, np.float64) - np.asarray(ref[L], np.float64)).max())
                    R.setdefault(key + "_max_abs_diff_vs_off", {})[f"{v}/{r}"] = diff
                    o = eng.graph_options
                    gr = eng.graphs.lazy.graphs[bucket_for(batch.num_seqs, batch.num_tokens, batch.max_seqlen,
                                                           o.max_tokens, o.max_seqs, eng.uniform_buckets)]
                    R.setdefault(key + "_replay_ms", {}).setdefault(v, []).append(
                        round(gpu_ms(gr.graph.replay, 200 if L != "32x512" else 20), 4))
                    if r == 0:
                        R.setdefault(key + "_kernels", {})[v] = kernels_per_replay(gr.graph.replay)
                    if L == "32x512":
                        continue
                    took = []
                    for _ in range(400):  # as a caller sees it: pack, copy in, replay, copy out, wait
                        t0 = time.perf_counter()
                        eng.step(batch).wait()
                        took.append(time.perf_counter() - t0)
                    R.setdefault(key + "_step_p50_ms", {}).setdefault(v, []).append(
                        round(float(np.median(took[50:])) * 1e3, 4))
                del eng
                torch.cuda.empty_cache()
        restore()
        print(name, json.dumps({k: v for k, v in R.items() if k.startswith(name)}), flush=True)
    return R


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out_json")
    ap.add_argument("--models-root", default="/tmp/bench-models")
    ap.add_argument("--models", default="qwen3-0.6b,bge-base")
    ap.add_argument("--lengths", default="16,128,512")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--variants", default="off,early-all,late-all,early,late,early-nopf")
    a = ap.parse_args()
    res: dict = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                 "pdl_supported": _SUPPORTED(torch.cuda.current_device())}
    res["engines"] = run(Path(a.models_root), a.models.split(","), [int(n) for n in a.lengths.split(",")], a.rounds,
                         a.variants.split(","))
    Path(a.out_json).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
