"""Measure before choosing: one long sequence's attention, the Triton kernel vs cuDNN.

Usage (GPU): python3 bench/probes/attn_long_single_probe.py OUT.json

Batch-1 steps run the Triton kernel (attention.triton_varlen; TRITON_SINGLE_CONFIGS above 128
tokens), measured as fast or faster than cuDNN at 128 and 512 tokens. For longer sequences cuDNN's
fused SDPA reaches ~600 TFLOP/s on equal lengths (DESIGN.md). For a causal model one sequence
padded to its graph bucket's token count can run cuDNN on the padded [1, tokens] layout: the real
rows never see the padding keys. GPU ms per layer (28 layers' distinct q/k/v in one CUDA graph):
Triton on the exact length vs cuDNN (is_causal, K/V heads shared) on the exact and the padded
length (next power of two), Qwen3-0.6B heads (16 q / 8 kv × 128), bf16; outputs compared.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
from bench.probes.probe_kernels import graph_us  # noqa: E402
from bouquet.engine.attention import triton_varlen  # noqa: E402


def cudnn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, T: int) -> torch.Tensor:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    qp, kp, vp = (x[:T].view(1, T, x.shape[1], x.shape[2]).transpose(1, 2) for x in (q, k, v))
    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
        o = F.scaled_dot_product_attention(qp, kp, vp, is_causal=True, enable_gqa=True)
    return o.transpose(1, 2).reshape(T, q.shape[1], q.shape[2])


def main() -> None:
    R: dict = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
               "cudnn": torch.backends.cudnn.version()}
    g = torch.Generator(device="cuda").manual_seed(0)
    for L in (300, 512, 1000, 2048, 3000, 4096, 8192):
        P = 1 << (L - 1).bit_length()
        qkv = [torch.randn(P, 32, 128, device="cuda", generator=g).to(torch.bfloat16) for _ in range(8)]
        views = [(x[:, :16], x[:, 16:24], x[:, 24:]) for x in qkv]
        cu = torch.tensor([0, L], dtype=torch.int32, device="cuda")
        row: dict = {"padded": P}
        want = triton_varlen(*(t[:L] for t in views[0]), cu, P, True).float()
        for name, fn in (("triton", lambda j: triton_varlen(*(t[:L] for t in views[j % 8]), cu, P, True)),
                         ("cudnn_exact", lambda j: cudnn(*views[j % 8], L)),
                         ("cudnn_padded", lambda j: cudnn(*views[j % 8], P)[:L])):
            out = fn(0).float()[:L]
            row[name + "_max_abs_diff"] = (out - want).abs().max().item()
            row[name + "_us"] = round(graph_us(fn), 2)
        R[f"L{L}"] = row
        print(L, row, flush=True)
        Path(sys.argv[1]).write_text(json.dumps(R, indent=1))


if __name__ == "__main__":
    main()
