"""The linear layers alone, bf16 vs fp8 (issue 14): every layer's four matmuls for a model shape,
distinct weights per layer (so small batches stream weights from HBM as a forward pass does),
inside one CUDA graph; at several token counts M. fp8 variants: row-wise scales (what the engine
runs: per-token activations × per-channel weights, bias in the epilogue) and tensor-wise scales
(one scale each: the cuBLASLt fast path, for comparison); plus the cost of the engine's fused
per-token quantization kernel (ops.act_quant) on each GEMM input.

    python bench/probes/fp8_gemm_probe.py OUT.json
"""
from __future__ import annotations

import json
import sys

import torch

from bouquet.engine.ops import quantize_rows

SHAPES = {  # (N, K) of qkv, o, up(+gate), down; layers
    "qwen3-0.6b": ([(4096, 1024), (1024, 2048), (6144, 1024), (1024, 3072)], 28),
    "bge-base": ([(2304, 768), (768, 768), (3072, 768), (768, 3072)], 12),
}


def graph_ms(fn, reps: int = 20, rounds: int = 5) -> float:
    """Median ms of one call of ``fn`` captured in a CUDA graph (``rounds`` timings of ``reps`` replays)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    g.replay()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(rounds):
        a.record()
        for _ in range(reps):
            g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / reps)
    return sorted(times)[len(times) // 2]


def main(out: str) -> None:
    res = []
    for name, (mats, layers) in SHAPES.items():
        ws = [[torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02 for n, k in mats] for _ in range(layers)]
        q8 = [[(w.float() / (w.float().abs().amax(1, keepdim=True) / 448)).to(torch.float8_e4m3fn) for w in lw] for lw in ws]
        sc = [[(w.float().abs().amax(1, keepdim=True) / 448).t().contiguous() for w in lw] for lw in ws]
        one = torch.ones((), device="cuda")
        for M in (1, 128, 512, 1024, 2048, 8192, 51200):
            xs = [torch.randn(M, k, device="cuda", dtype=torch.bfloat16) for _, k in mats]
            xq = [quantize_rows(x) for x in xs]

            def bf16() -> None:
                for lw in ws:
                    for x, w in zip(xs, lw):
                        torch.nn.functional.linear(x, w)

            def rowwise() -> None:
                for lq, ls in zip(q8, sc):
                    for x, w, s in zip(xq, lq, ls):
                        torch._scaled_mm(x.values, w.t(), scale_a=x.scale, scale_b=s, out_dtype=torch.bfloat16)

            def tensorwise() -> None:
                for lq in q8:
                    for x, w in zip(xq, lq):
                        torch._scaled_mm(x.values, w.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16)

            def quant() -> None:
                for _ in range(layers):
                    for x in xs:
                        quantize_rows(x)

            row = {"model": name, "M": M, "bf16_ms": graph_ms(bf16), "fp8_rowwise_ms": graph_ms(rowwise),
                   "fp8_tensorwise_ms": graph_ms(tensorwise), "quant_all_inputs_ms": graph_ms(quant)}
            weight_bytes = sum(n * k for n, k in mats) * layers
            row["bf16_weight_TBps"] = 2 * weight_bytes / row["bf16_ms"] / 1e9
            row["fp8_rowwise_weight_TBps"] = weight_bytes / row["fp8_rowwise_ms"] / 1e9
            print(json.dumps(row), flush=True)
            res.append(row)
            del xs, xq
        del ws, q8, sc
        torch.cuda.empty_cache()
    with open(out, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
