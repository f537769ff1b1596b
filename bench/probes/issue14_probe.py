"""Issue 14, item 3, measured before building: ragged attention (and the step's kernel split).

    python bench/probes/issue14_probe.py OUT.json [--parts attn step]

(Its ``gemm`` part, a split-K Triton GEMM swept against cuBLAS, ran at 2026-12-01 call 2 — see
``git show c93be6b:bench/probes/issue14_probe.py`` — and is now ``splitk_probe.py``, which times
the engine's own kernel, bouquet/engine/splitk.py.)

``attn``: attention alone for 100 sequences of 16–512 tokens (arrival order, seed 0) and the same
token count at one uniform length, Qwen3-0.6B heads (16 q / 8 kv × 128, causal) and bge-base
heads (12 × 64): FlashAttention-2 varlen (what runs), cuDNN's ragged SDPA
(``aten._cudnn_attention_forward`` with cumulative offsets, the nested-tensor path), the
memory-efficient kernel's varlen form, cuDNN on a padded [B, L_max] copy, and cuDNN on the uniform
batch; outputs compared with varlen; cuDNN ragged also under CUDA-graph replay with other offsets.

``step``: one eager engine step of the mixed batch and of a uniform batch with the same tokens:
GPU ms split into GEMM / attention / Triton / other kernels (torch.profiler).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Callable

import numpy as np
import torch
import triton

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
from bench.probes.fp8_gemm_probe import graph_ms  # noqa: E402


def attn_part() -> dict:
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.attention.varlen import varlen_attn
    import torch.nn.functional as F

    from bench.probes.probe_kernels import gpu_ms

    R: dict = {}
    rng = np.random.default_rng(0)
    lens = rng.integers(16, 513, size=100)
    for label, H, Hkv, D, causal in (("qwen3", 16, 8, 128, True), ("bge", 12, 12, 64, False)):
        for case, ls in (("mixed", lens), ("uniform", np.full(100, int(lens.sum()) // 100)), ("L512", np.full(100, 512))):
            T = int(ls.sum())
            L = int(ls.max())
            cu = torch.tensor(np.concatenate([[0], np.cumsum(ls)]), device="cuda", dtype=torch.int32)
            q = torch.randn(T, H, D, device="cuda", dtype=torch.bfloat16)
            k, v = (torch.randn(T, Hkv, D, device="cuda", dtype=torch.bfloat16) for _ in range(2))
            kr, vr = (x.repeat_interleave(H // Hkv, dim=1) for x in (k, v))
            flops = sum(4 * int(n) * int(n) * D * H for n in ls) / (2 if causal else 1)
            size = (-1, 0) if causal else (-1, -1)
            fns: dict[str, Callable[[], torch.Tensor]] = {
                "varlen": lambda: varlen_attn(q, k, v, cu, cu, L, L, window_size=size),
                "cudnn_ragged_gqa": lambda: torch.ops.aten._cudnn_attention_forward(
                    q, k, v, None, cu, cu, L, L, False, 0.0, causal, False)[0],
                "cudnn_ragged": lambda: torch.ops.aten._cudnn_attention_forward(
                    q, kr, vr, None, cu, cu, L, L, False, 0.0, causal, False)[0],
                "efficient_varlen": lambda: torch.ops.aten._efficient_attention_forward(
                    q[None], kr[None], vr[None], None, cu, cu, L, L, 0.0, int(causal))[0][0],
            }
            if case != "mixed":
                B = len(ls)

                def uniform() -> torch.Tensor:
                    qp, kp, vp = (x.view(B, L, x.shape[1], D).transpose(1, 2) for x in (q, k, v))
                    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                        o = F.scaled_dot_product_attention(qp, kp, vp, is_causal=causal, enable_gqa=Hkv != H)
                    return o.transpose(1, 2).reshape(T, H, D)
                fns["cudnn_uniform"] = uniform
            else:
                B = len(ls)
                rows = torch.tensor(np.concatenate([b * L + np.arange(n) for b, n in enumerate(ls)]), device="cuda")
                key_pad = torch.arange(L, device="cuda")[None, :] < torch.tensor(ls, device="cuda")[:, None]
                mask = key_pad[:, None, None, :]  # [B, 1, 1, L]

                def padded() -> torch.Tensor:
                    outs = []
                    for x in (q, k, v):
                        p = x.new_zeros(B * L, x.shape[1], D)
                        p.index_copy_(0, rows, x)
                        outs.append(p.view(B, L, x.shape[1], D).transpose(1, 2))
                    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION, SDPBackend.EFFICIENT_ATTENTION]):
                        if causal:
                            o = F.scaled_dot_product_attention(*outs, is_causal=True, enable_gqa=Hkv != H)
                        else:
                            o = F.scaled_dot_product_attention(*outs, attn_mask=mask, enable_gqa=Hkv != H)
                    return o.transpose(1, 2).reshape(B * L, H, D).index_select(0, rows)
                fns["cudnn_padded"] = padded
            ref = fns["varlen"]().float()
            for name, fn in fns.items():
                key = f"{label}_{case}_{name}"
                try:
                    out = fn().float()
                    R[key + "_maxdiff"] = round(float((out - ref).abs().max()), 4)
                    R[key + "_ms"] = round(gpu_ms(fn, 20), 4)  # eager: cuDNN ragged does not capture (graph_part)
                    R[key + "_TFLOPs"] = round(flops / (R[key + "_ms"] * 1e9), 1)
                except Exception as e:  # noqa: BLE001 - the probe reports what is unsupported
                    R[key + "_error"] = str(e)[:240]
            print(json.dumps({k_: v_ for k_, v_ in R.items() if k_.startswith(f"{label}_{case}")}), flush=True)
            del q, k, v, kr, vr
    return R


def graph_part() -> dict:
    """cuDNN ragged SDPA under CUDA-graph capture (run last: a failed capture leaves the CUDA RNG
    unusable for the rest of the process): captured with one set of offsets, replayed with others."""
    from torch.nn.attention.varlen import varlen_attn

    R: dict = {}
    ls = np.random.default_rng(0).integers(16, 513, size=100)
    T, L = int(ls.sum()), 512
    ls2 = np.random.default_rng(1).integers(16, 513, size=100)
    ls2[-1] = max(1, T - int(ls2[:-1].sum()))
    T2 = int(ls2.sum())
    H, D = 16, 128
    q, k, v = (torch.randn(max(T, T2), H, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    cu = torch.tensor(np.concatenate([[0], np.cumsum(ls)]), device="cuda", dtype=torch.int32)
    cu2 = torch.tensor(np.concatenate([[0], np.cumsum(ls2)]), device="cuda", dtype=torch.int32)
    fn = lambda c: torch.ops.aten._cudnn_attention_forward(q, k, v, None, c, c, L, L, False, 0.0, True, False)[0]  # noqa: E731
    try:
        static = cu.clone()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            fn(static)
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            out = fn(static)
        static.copy_(cu2)
        g.replay()
        torch.cuda.synchronize()
        ref = varlen_attn(q, k, v, cu2, cu2, L, L, window_size=(-1, 0)).float()
        n = min(T, T2)
        R["cudnn_ragged_graph_other_offsets_maxdiff"] = round(float((out[:n].float() - ref[:n]).abs().max()), 4)
    except Exception as e:  # noqa: BLE001
        R["cudnn_ragged_graph_error"] = str(e)[:300]
    return R


TRITON_CONFIGS = [(64, 32, 4, 3), (64, 64, 4, 2), (64, 64, 4, 3), (64, 64, 4, 4), (64, 128, 4, 2), (64, 128, 8, 2),
                  (128, 32, 4, 3), (128, 32, 8, 3), (128, 64, 4, 2), (128, 64, 4, 3), (128, 64, 8, 2), (128, 64, 8, 3),
                  (128, 64, 8, 4), (128, 128, 8, 2), (128, 128, 8, 3), (32, 64, 4, 3)]


def triton_attn_part(labels: tuple[str, ...] = ()) -> dict:
    """The Triton varlen kernel (attention.triton_varlen) over its tile configurations vs
    FlashAttention-2 varlen and cuDNN on equal lengths, all inside CUDA graphs."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.attention.varlen import varlen_attn
    import torch.nn.functional as F

    from bouquet.engine.attention import triton_varlen

    R: dict = {}
    rng = np.random.default_rng(0)
    mixed = rng.integers(16, 513, size=100)
    cases = {"mixed": (mixed, 512), "uniform": (np.full(100, int(mixed.sum()) // 100), int(mixed.sum()) // 100),
             "L512": (np.full(100, 512), 512), "b1_L128": (np.array([128]), 128), "b1_L512": (np.array([512]), 512),
             "b16_mixed_bucket": (rng.integers(16, 513, size=16), 512), "b64_L128": (np.full(64, 128), 128)}
    for label, H, Hkv, D, causal in (("qwen3", 16, 8, 128, True), ("bge", 12, 12, 64, False), ("minilm", 12, 12, 32, False)):
        if labels and label not in labels:
            continue
        for case, (ls, L) in cases.items():
            T = int(ls.sum())
            cu = torch.tensor(np.concatenate([[0], np.cumsum(ls)]), device="cuda", dtype=torch.int32)
            qkv = torch.randn(T, (H + 2 * Hkv) * D, device="cuda", dtype=torch.bfloat16)
            q = qkv[:, :H * D].view(T, H, D)
            k = qkv[:, H * D:(H + Hkv) * D].view(T, Hkv, D)
            v = qkv[:, (H + Hkv) * D:].view(T, Hkv, D)
            flops = sum(4 * int(n) * int(n) * D * H for n in ls) / (2 if causal else 1)
            size = (-1, 0) if causal else (-1, -1)
            row: dict = {"tokens": T}
            ref = varlen_attn(q, k, v, cu, cu, L, L, window_size=size).float()
            row["varlen_ms"] = round(graph_ms(lambda: varlen_attn(q, k, v, cu, cu, L, L, window_size=size)), 4)
            if len(set(ls.tolist())) == 1:
                B, n = len(ls), int(ls[0])

                def uniform() -> torch.Tensor:
                    qp, kp, vp = (x.reshape(B, n, x.shape[1], D).transpose(1, 2) for x in (q, k, v))
                    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION]):
                        return F.scaled_dot_product_attention(qp, kp, vp, is_causal=causal, enable_gqa=Hkv != H)
                row["cudnn_uniform_ms"] = round(graph_ms(uniform), 4)
            for cfg in TRITON_CONFIGS:
              for pack in ((False, True) if Hkv != H else (False,)):
                name = f"{cfg}{' packed' if pack else ''}"
                try:
                    out = triton_varlen(q, k, v, cu, L, causal, cfg, pack).float()
                    err = float((out - ref).abs().max())
                    if err > 0.03:
                        row.setdefault("bad", []).append(f"{name}: maxdiff {err:.3g}")
                        continue
                    row.setdefault("triton", {})[name] = round(graph_ms(lambda: triton_varlen(q, k, v, cu, L, causal, cfg, pack), 10, 3), 4)
                except Exception as e:  # noqa: BLE001 - configs that exceed shared memory are reported
                    row.setdefault("bad", []).append(f"{name}: {str(e)[:100]}")
            if "triton" in row:
                best = min(row["triton"], key=row["triton"].get)
                row["triton_best"], row["triton_best_ms"] = best, row["triton"][best]
                row["triton_best_TFLOPs"] = round(flops / (row["triton_best_ms"] * 1e9), 1)
            row["varlen_TFLOPs"] = round(flops / (row["varlen_ms"] * 1e9), 1)
            R[f"{label}_{case}"] = row
            print(label, case, json.dumps({kk: vv for kk, vv in row.items() if kk != "triton"}), flush=True)
            del qkv, q, k, v
    return R


def long_part() -> dict:
    """Long sequences (bge-m3 / 8k-context models): the Triton kernel with its shipped tiles vs
    FlashAttention-2 varlen, mixed 1,024–8,192 and 2 × 8,192 tokens, in CUDA graphs."""
    from torch.nn.attention.varlen import varlen_attn

    from bouquet.engine.attention import triton_varlen

    R: dict = {}
    rng = np.random.default_rng(0)
    for label, H, Hkv, D, causal in (("bge-m3", 16, 16, 64, False), ("qwen3", 16, 8, 128, True)):
        for case, ls in (("mixed_1k_8k", rng.integers(1024, 8193, size=8)), ("2x8192", np.full(2, 8192))):
            T, L = int(ls.sum()), int(ls.max())
            cu = torch.tensor(np.concatenate([[0], np.cumsum(ls)]), device="cuda", dtype=torch.int32)
            qkv = torch.randn(T, (H + 2 * Hkv) * D, device="cuda", dtype=torch.bfloat16)
            q, k, v = qkv[:, :H * D].view(T, H, D), qkv[:, H * D:(H + Hkv) * D].view(T, Hkv, D), qkv[:, (H + Hkv) * D:].view(T, Hkv, D)
            size = (-1, 0) if causal else (-1, -1)
            ref = varlen_attn(q, k, v, cu, cu, L, L, window_size=size).float()
            got = triton_varlen(q, k, v, cu, L, causal).float()
            R[f"{label}_{case}"] = {
                "tokens": T, "maxdiff": round(float((got - ref).abs().max()), 4),
                "varlen_ms": round(graph_ms(lambda: varlen_attn(q, k, v, cu, cu, L, L, window_size=size)), 4),
                "triton_ms": round(graph_ms(lambda: triton_varlen(q, k, v, cu, L, causal)), 4)}
            print(label, case, json.dumps(R[f"{label}_{case}"]), flush=True)
            del qkv, q, k, v
    return R


def classify(name: str) -> str:
    n = name.lower()
    if any(s in n for s in ("flash", "fmha", "attn", "attention", "cudnn", "sdpa")):
        return "attention"
    if any(s in n for s in ("gemm", "nvjet", "xmma", "cutlass", "splitk", "sm90_", "cublas")):
        return "gemm"
    if "kernel" in n and ("triton" in n or any(s in n for s in ("add_ln", "add_rms", "rope", "silu", "act_", "gelu", "quant", "pool"))):
        return "triton"
    return "other"


def step_part(models_root: str) -> dict:
    from bouquet.bench.models import SHAPES as MS, make_model_dir
    from bouquet.engine.batch import Batch
    from bouquet.engine.engine import Engine
    from bouquet.modelspec import load_spec
    from bench.probes.probe_kernels import gpu_ms
    from torch.profiler import ProfilerActivity, profile

    R: dict = {}
    rng = np.random.default_rng(0)
    lens = rng.integers(16, 513, size=100)
    for name in ("qwen3-0.6b", "bge-base"):
        spec = load_spec(str(make_model_dir(MS[name], Path(models_root), None)))
        eng = Engine(spec, "cuda", "bfloat16")
        eng.warmup()
        vocab = min(spec.vocab_size, 30000)
        for case, ls in (("mixed", lens), ("uniform", np.full(100, int(lens.sum()) // 100))):
            batch = Batch.pack([rng.integers(1000, vocab, size=int(n), dtype=np.int32) for n in ls])
            fn = lambda: eng.forward(batch)  # noqa: E731
            ms = gpu_ms(fn, 10)
            fn()
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                fn()
                torch.cuda.synchronize()
            cats: dict[str, float] = {}
            top: dict[str, float] = {}
            for e in prof.events():
                if e.device_type.name != "CUDA" or "Memcpy" in e.name or "Memset" in e.name:
                    continue
                us = e.device_time if hasattr(e, "device_time") else e.cuda_time
                cats[classify(e.name)] = cats.get(classify(e.name), 0.0) + us / 1e3
                top[e.name[:80]] = top.get(e.name[:80], 0.0) + us / 1e3
            R[f"{name}_{case}"] = {"tokens": int(ls.sum()), "gpu_ms": round(ms, 3), "emb_per_s": round(100 / ms * 1e3, 1),
                                   "by_kind_ms": {k: round(v, 3) for k, v in cats.items()},
                                   "top": sorted(([k, round(v, 3)] for k, v in top.items()), key=lambda r: -r[1])[:12]}
            print(name, case, json.dumps(R[f"{name}_{case}"]), flush=True)
        del eng
        torch.cuda.empty_cache()
    return R


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--parts", nargs="+", default=["attn", "step", "graph"])
    ap.add_argument("--models-root", default="/tmp/models")
    ap.add_argument("--labels", nargs="*", default=[], help="tattn: head shapes to sweep (qwen3 bge minilm; default all)")
    a = ap.parse_args()
    res: dict = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
                 "cudnn": torch.backends.cudnn.version()}
    for part in a.parts:
        try:
            res[part] = {"attn": attn_part, "graph": graph_part, "tattn": lambda: triton_attn_part(tuple(a.labels)), "long": long_part,
                         "step": lambda: step_part(a.models_root)}[part]()
        except Exception as e:  # noqa: BLE001 - keep the other parts' results
            import traceback
            res[part + "_error"] = traceback.format_exc()[-2000:]
            print(res[part + "_error"], flush=True)
        Path(a.out).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
