"""Where a batch-1 step's time goes between the caller and the GPU (issue 14: engine p50 vs replay).

Usage (GPU): python3 bench/probes/b1_host_probe.py OUT.json [--models-root DIR] [--models bge-base,qwen3-0.6b]
[--lengths 16,128]

One engine per model (random full-size weights, bf16, graphs, spin-wait as the bench's engine),
the batch's graph captured. Host µs (median of 500, the GPU idle before each unless said) of each
piece of ``Engine.step``: bucket lookup, ``pack_inputs``, the H2D copy's enqueue, ``replay()``
(idle GPU, and back to back), the pinned output buffer + D2H copy + event, the whole ``step()``
return, and ``step().wait()`` end to end; the replay's GPU ms. Then a torch.profiler trace of 30
steps: per step, µs from the cudaGraphLaunch call's start to the first kernel's start on the GPU,
the launch call's length, and from the last kernel's end to the wait's end (medians). With
``--census``: the bucket captured again with its graph kept, its nodes by kind and the host µs of
launching it.
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


def host_us(fn, reps: int = 500, idle: bool = True) -> float:  # type: ignore[no-untyped-def]
    took = []
    for _ in range(reps):
        if idle:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        took.append(time.perf_counter() - t0)
    torch.cuda.synchronize()
    return round(float(np.median(took[20:])) * 1e6, 2)


def trace(eng, batch, steps: int = 30) -> dict:  # type: ignore[no-untyped-def]
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            torch.cuda.synchronize()
            eng.step(batch).wait()
    ev = [e for e in prof.events()]
    launches = sorted((e for e in ev if e.name == "cudaGraphLaunch"), key=lambda e: e.time_range.start)
    syncs = sorted((e for e in ev if "EventSynchronize" in e.name or "EventQuery" in e.name),
                   key=lambda e: e.time_range.start)
    kernels = sorted((e for e in ev if e.device_type.name == "CUDA" and "memcpy" not in e.name.lower()),
                     key=lambda e: e.time_range.start)
    to_first, launch_len, tail = [], [], []
    for i, la in enumerate(launches):
        end = launches[i + 1].time_range.start if i + 1 < len(launches) else float("inf")
        ks = [k for k in kernels if la.time_range.start <= k.time_range.start < end]
        if not ks:
            continue
        to_first.append(ks[0].time_range.start - la.time_range.start)
        launch_len.append(la.time_range.end - la.time_range.start)
        last = max(k.time_range.end for k in ks)
        after = [s.time_range.end for s in syncs if last <= s.time_range.end < end]
        if after:
            tail.append(after[0] - last)
    med = lambda xs: round(float(np.median(xs)), 2) if xs else None  # noqa: E731
    return {"launch_to_first_kernel_us": med(to_first), "launch_call_us": med(launch_len),
            "last_kernel_to_wait_end_us": med(tail), "steps_traced": len(to_first)}


NODE_KINDS = ("kernel", "memcpy", "memset", "host", "child_graph", "empty", "wait_event", "event_record",
              "ext_sem_signal", "ext_sem_wait", "mem_alloc", "mem_free", "batch_mem_op", "conditional")


def _cudart():  # type: ignore[no-untyped-def]
    import ctypes

    for line in Path("/proc/self/maps").read_text().splitlines():
        if "libcudart.so" in line:
            return ctypes.CDLL(line.split()[-1])
    raise RuntimeError("libcudart not loaded")


def graph_census(eng, bk) -> dict:  # type: ignore[no-untyped-def]
    """The bucket captured once more with its cudaGraph_t kept: its nodes by kind (cudaGraphGetNodes,
    cudaGraphNodeGetType), and the host µs of launching that graph."""
    import collections
    import ctypes

    rt = _cudart()
    g = torch.cuda.CUDAGraph(keep_graph=True)
    with torch.cuda.graph(g, pool=eng.graphs.pool):
        eng.graphs._run_forward(bk)
    graph = ctypes.c_void_p(g.raw_cuda_graph())
    n = ctypes.c_size_t(0)
    assert rt.cudaGraphGetNodes(graph, None, ctypes.byref(n)) == 0
    nodes = (ctypes.c_void_p * n.value)()
    assert rt.cudaGraphGetNodes(graph, nodes, ctypes.byref(n)) == 0
    kinds: collections.Counter = collections.Counter()
    for node in nodes:
        t = ctypes.c_int(-1)
        rt.cudaGraphNodeGetType(ctypes.c_void_p(node), ctypes.byref(t))
        kinds[NODE_KINDS[t.value] if 0 <= t.value < len(NODE_KINDS) else str(t.value)] += 1
    g.instantiate()
    return {"graph_nodes": dict(kinds), "census_graph_launch_idle_us": host_us(g.replay)}


def run(root: Path, models: list[str], lengths: list[int], census: bool) -> dict:
    from bouquet.bench.models import SHAPES, make_model_dir
    from bouquet.engine.batch import Batch
    from bouquet.engine.buckets import bucket_for
    from bouquet.engine.engine import Engine
    from bouquet.engine.graphs import pack_inputs
    from bouquet.modelspec import load_spec

    R: dict = {}
    for name in models:
        spec = load_spec(str(make_model_dir(SHAPES[name], root)))
        eng = Engine(spec, "cuda", "bfloat16", spin_wait=True)
        eng.warmup()
        rng = np.random.default_rng(0)
        for L in lengths:
            batch = Batch.pack([rng.integers(1000, 30000, size=L, dtype=np.int32)])
            for _ in range(3):
                eng.step(batch).wait()
            o = eng.graph_options
            bk = bucket_for(1, L, L, o.max_tokens, o.max_seqs, eng.uniform_buckets)
            g = eng.graphs.lazy.graphs[bk]
            host = pack_inputs(batch, bk.tokens, bk.seqs)
            out = g.out

            def d2h() -> None:
                h = torch.empty((1, out.shape[1]), dtype=torch.float32, pin_memory=True)
                h.copy_(out[:1], non_blocking=True)
                torch.cuda.Event(blocking=False).record()

            r = {
                "bucket_lookup_us": host_us(lambda: bucket_for(1, L, L, o.max_tokens, o.max_seqs, eng.uniform_buckets)),
                "pack_inputs_us": host_us(lambda: pack_inputs(batch, bk.tokens, bk.seqs)),
                "h2d_enqueue_us": host_us(lambda: eng.graphs._copy_in(bk)),  # staging → device (12-02b on)
                "replay_call_idle_us": host_us(g.replay),
                "replay_call_busy_us": host_us(g.replay, idle=False),
                "d2h_buffer_copy_event_us": host_us(d2h),
                "step_return_us": host_us(lambda: eng.step(batch)),
                "step_wait_us": host_us(lambda: eng.step(batch).wait()),
                "replay_gpu_ms": round(gpu_ms(g.replay, 200), 4),
            }
            eng.step(batch).wait()
            r.update(trace(eng, batch))
            if census:
                try:
                    r.update(graph_census(eng, bk))
                except Exception as e:  # noqa: BLE001 - a probe records what it can
                    r["graph_census_error"] = repr(e)
            R[f"{name}/b1_L{L}"] = r
            print(name, L, json.dumps(r), flush=True)
        del eng
        torch.cuda.empty_cache()
    return R


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out_json")
    ap.add_argument("--models-root", default="/tmp/bench-models")
    ap.add_argument("--models", default="bge-base,qwen3-0.6b")
    ap.add_argument("--lengths", default="16,128")
    ap.add_argument("--census", action="store_true", help="count each bucket graph's nodes by kind")
    a = ap.parse_args()
    res = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
           "steps": run(Path(a.models_root), a.models.split(","), [int(n) for n in a.lengths.split(",")], a.census)}
    Path(a.out_json).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
