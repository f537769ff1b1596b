"""Why ``AttnMeta.whole_rows`` gates cuDNN over a padded one-sequence bucket (the 12-01f review).

Usage (GPU): python3 bench/probes/cudnn_padding_probe.py

One causal sequence of 1,500 tokens in 1,536 rows (Qwen3-0.6B heads, bf16), its 36 padding rows
set to NaN / inf in K, V or both: how many real rows come out non-finite from the cuDNN branch of
``VarlenBackend.attend`` and from the Triton kernel. cuDNN multiplies masked probabilities by V, so
non-finite padding V leaks into the real rows of the last key block; NaN in K alone does not; the
Triton kernel loads masked rows as zeros. Then eager (1,500 rows) against the padded bucket (finite
padding): bitwise equal on the real rows. Run by the review helper in the 12-01f session (its
figures in bench/results/h200-2026-12-01f/README.md, section 5; the printed output was not kept).
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bouquet.engine import attention as A  # noqa: E402


def main() -> None:
    torch.manual_seed(0)
    be = A.VarlenBackend()
    T, n, H, Hk, D = 1536, 1500, 16, 8, 128
    cu = torch.tensor([0, n], device="cuda", dtype=torch.int32)
    for what in ("v_nan", "k_nan", "v_inf", "kv_nan"):
        q = torch.randn(T, H, D, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(T, Hk, D, device="cuda", dtype=torch.bfloat16)
        v = torch.randn(T, Hk, D, device="cuda", dtype=torch.bfloat16)
        which = what.split("_")[0]
        if "k" in which:
            k[n:] = float("nan")
        if "v" in which:
            v[n:] = float("inf") if "inf" in what else float("nan")
        got = be.attend(q, k, v, be.prepare(cu, T, True))  # whole_rows=True: the cuDNN branch
        bad = (~torch.isfinite(got[:n].float())).any(dim=(1, 2)).nonzero().flatten().tolist()
        tri = A.triton_varlen(q, k, v, cu, T, True)
        badt = (~torch.isfinite(tri[:n].float())).any(dim=(1, 2)).nonzero().flatten().tolist()
        print(what, "cuDNN branch: non-finite real rows", len(bad), bad[:3], bad[-3:], "| Triton:", len(badt))
    q = torch.randn(T, H, D, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(T, Hk, D, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    e = be.attend(q[:n], k[:n], v[:n], be.prepare(cu, n, True, True))
    g = be.attend(q, k, v, be.prepare(cu, T, True))
    print("eager == padded bucket on the real rows, bitwise:", torch.equal(e, g[:n]))


if __name__ == "__main__":
    main()
