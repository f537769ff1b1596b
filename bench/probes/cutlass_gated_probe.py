"""Measure before building: the gated MLP's gate/up projection as two CUTLASS GEMMs with fused
epilogues (bench/probes/csrc/gated_gemm.cu: act(x·Wgᵀ) → out, then (x·Wuᵀ)·out in place),
against cuBLAS + the activation kernel and the engine's Triton kernel (fused_gemms.gate_up_act).
Result (bench/results/h200-2026-12-03, call 1): the CUTLASS pair is 10-26% slower than the Triton
kernel; not adopted.

Build (any machine with CUDA 12.3+'s nvcc; no GPU needed; ~2.5 min on 2 cores), from the repository root:
    pip download --no-deps nvidia-cutlass==4.2.0.0 -d /tmp/cutlass && unzip -q -o /tmp/cutlass/*.whl -d /tmp/cutlass/w
    I=/tmp/cutlass/w/cutlass_library/source; mkdir -p .carry/cutlass
    nvcc -std=c++17 -O3 -gencode arch=compute_90a,code=sm_90a --expt-relaxed-constexpr -DNDEBUG -DBQ_TILE_SWEEP \
        -shared -Xcompiler -fPIC -I$I/include -I$I/tools/util/include bench/probes/csrc/gated_gemm.cu \
        -o .carry/cutlass/sweep.so
Usage (GPU; carry .carry/cutlass): python3 bench/probes/cutlass_gated_probe.py OUT.json --lib PATH.so
    [--sizes 2048,...] [--shape h,i] [--act silu] [--schedules 1:0,4:0] [--plain]
Each variant: 28 layers' distinct weights in one CUDA graph (bench/probes/probe_kernels.graph_us),
µs per layer and TFLOP/s (2·T·h·2i FLOPs); error: max |out − ref| / max |ref| with ref the fp32
product of the fp32 GEMMs (the bf16 paths round in different places, so each gets its own figure).
"""
from __future__ import annotations

import argparse
import ctypes
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
from bench.probes.probe_kernels import graph_us as _graph_us  # noqa: E402
from bouquet.engine import fused_gemms, ops  # noqa: E402

LAYERS = 28
ACTS = {"silu": 1, "gelu_tanh": 2}


def graph_us(fn) -> float:  # type: ignore[no-untyped-def]
    return _graph_us(fn, LAYERS, reps=10)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out_json")
    ap.add_argument("--lib", required=True)
    ap.add_argument("--sizes", default="2048,4096,16384,51200,102400")
    ap.add_argument("--shape", default="1024,3072")
    ap.add_argument("--act", default="silu")
    ap.add_argument("--schedules", default="1:0", help="swizzle:raster pairs (raster 0 heuristic, 1 along M, 2 along N)")
    ap.add_argument("--plain", action="store_true", help="also time plain GEMMs [T, h] x [2i, h]^T (cuBLAS and each tile)")
    args = ap.parse_args()
    lib = ctypes.CDLL(args.lib)
    lib.bq_gated_gemm.restype = ctypes.c_int
    lib.bq_gated_gemm.argtypes = [ctypes.c_int] * 3 + [ctypes.c_void_p] * 3 + [ctypes.c_int] * 4 + \
        [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    if hasattr(lib, "bq_plain_gemm"):
        lib.bq_plain_gemm.argtypes = [ctypes.c_int] + [ctypes.c_void_p] * 3 + [ctypes.c_int] * 4 + \
            [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
        lib.bq_set_schedule.argtypes = [ctypes.c_int, ctypes.c_int]
    tiles = lib.bq_gated_tiles()
    schedules = [tuple(int(v) for v in p.split(":")) for p in args.schedules.split(",")]
    h, i = (int(v) for v in args.shape.split(","))
    dev = torch.device("cuda")
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    ws = torch.empty(64 << 20, dtype=torch.uint8, device=dev)
    torch.manual_seed(0)
    weights = [torch.randn(2 * i, h, device=dev, dtype=torch.bfloat16) * h ** -0.5 for _ in range(LAYERS)]
    act_fn = {"silu": F.silu, "gelu_tanh": lambda v: F.gelu(v, approximate="tanh")}[args.act]
    rows = []
    for T in (int(s) for s in args.sizes.split(",")):
        x = torch.randn(T, h, device=dev, dtype=torch.bfloat16)
        out = torch.empty(T, i, device=dev, dtype=torch.bfloat16)
        flops = 2 * T * h * 2 * i
        w0 = weights[0].float()
        xf = x.float()
        ref = act_fn(xf @ w0[:i].T) * (xf @ w0[i:].T)
        scale = ref.abs().max().item()
        row: dict = {"tokens": T, "h": h, "i": i}

        def cublas(l: int) -> torch.Tensor:
            return ops.silu_mul(x @ weights[l].T) if args.act == "silu" else ops.gelu_tanh_mul(x @ weights[l].T)

        def triton(l: int) -> torch.Tensor | None:
            return fused_gemms.gate_up_act(x, weights[l], args.act)

        def cutlass(tile: int):  # type: ignore[no-untyped-def]
            def run(l: int) -> torch.Tensor:
                rc = lib.bq_gated_gemm(tile, 0, ACTS[args.act], x.data_ptr(), weights[l].data_ptr(), out.data_ptr(),
                                       T, i, h, sms, ws.data_ptr(), ws.numel(), torch.cuda.current_stream().cuda_stream)
                if rc != 0:
                    raise RuntimeError(f"bq_gated_gemm tile {tile}: status {rc}")
                return out
            return run

        gate_up = torch.empty(T, 2 * i, device=dev, dtype=torch.bfloat16)

        def plain(tile: int):  # type: ignore[no-untyped-def]
            def run(l: int) -> torch.Tensor:
                rc = lib.bq_plain_gemm(tile, x.data_ptr(), weights[l].data_ptr(), gate_up.data_ptr(), T, 2 * i, h, sms,
                                       ws.data_ptr(), ws.numel(), torch.cuda.current_stream().cuda_stream)
                if rc != 0:
                    raise RuntimeError(f"bq_plain_gemm tile {tile}: status {rc}")
                return gate_up
            return run

        variants = {"cublas+act": (cublas, None)}
        if triton(0) is not None:
            variants["triton"] = (triton, None)
        if args.plain:
            variants["cublas_gemm"] = (lambda l: x @ weights[l].T, None)
        for sw, ra in schedules:
            for t in range(tiles):
                variants[f"cutlass{t}_s{sw}r{ra}"] = (cutlass(t), (sw, ra))
                if args.plain:
                    variants[f"plain{t}_s{sw}r{ra}"] = (plain(t), (sw, ra))
        for name, (fn, sched) in variants.items():
            if sched is not None:
                lib.bq_set_schedule(*sched)
            try:
                if name.startswith(("plain", "cublas_gemm")):
                    us = graph_us(fn)
                    row[name] = {"us": round(us, 1), "tflops": round(flops / us / 1e6, 1)}
                    if name.startswith("plain"):
                        row[name]["max_abs_vs_cublas"] = round((fn(0).float() - (x @ weights[0].T).float()).abs().max().item(), 4)
                    continue
                got = fn(0).float()
                torch.cuda.synchronize()
                err = ((got - ref).abs().max().item()) / scale
                eager_last = fn(LAYERS - 1).clone()
                us = graph_us(fn)
                row[name] = {"us": round(us, 1), "tflops": round(flops / us / 1e6, 1), "rel_err": round(err, 5)}
                if name.startswith("cutlass"):  # the replays left the last layer's product in `out`
                    torch.cuda.synchronize()
                    row[name]["graph_eq_eager"] = bool(torch.equal(out, eager_last))
            except Exception as e:  # noqa: BLE001 -- a tile that cannot run is a result
                row[name] = {"error": f"{type(e).__name__}: {e}"}
        print(json.dumps(row), flush=True)
        rows.append(row)
        del x, out, gate_up
        torch.cuda.empty_cache()
    Path(args.out_json).write_text(json.dumps({"rows": rows, "act": args.act}, indent=1))


if __name__ == "__main__":
    main()
