"""MPNet's biased attention on the GPU: correctness of the memory-efficient varlen path against
padded SDPA with the same bias, and its cost next to FlashAttention-2 varlen (bge-base heads,
12 × 64), then whole-engine step times of the mpnet-base and bge-base shapes (random bf16 weights).

Usage (GPU): python3 bench/probes/probe_mpnet_bias.py OUT_JSON
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch.nn.attention.varlen import varlen_attn

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench.probes.probe_kernels import gpu_ms  # noqa: E402
from bouquet.bench.models import SHAPES  # noqa: E402
from bouquet.engine.attention import SdpaGroupedBackend, VarlenBackend  # noqa: E402
from bouquet.engine.batch import Batch  # noqa: E402
from bouquet.engine.engine import Engine  # noqa: E402
from bouquet.modelspec import spec_from_config  # noqa: E402

H, D = 12, 64


def attention(lengths: list[int]) -> dict[str, float | str]:
    dev = torch.device("cuda")
    T, L = sum(lengths), max(lengths)
    q, k, v = (torch.randn(T, H, D, device=dev, dtype=torch.bfloat16) for _ in range(3))
    bias = torch.randn(H, L, L, device=dev, dtype=torch.bfloat16)
    cu = torch.tensor(np.concatenate([[0], np.cumsum(lengths)]), dtype=torch.int32, device=dev)
    vb, gb = VarlenBackend(), SdpaGroupedBackend()
    meta, gmeta = vb.prepare(cu, L, False), gb.prepare(cu, L, False)
    got = vb.attend(q, k, v, meta, bias=bias)
    ref = gb.attend(q, k, v, gmeta, bias=bias)  # grouped SDPA with the bias as float mask
    err = float((got.float() - ref.float()).abs().max())
    return {"tokens": T, "max_abs_err_vs_sdpa": err,
            "biased_ms": gpu_ms(lambda: vb.attend(q, k, v, meta, bias=bias)),
            "fa2_varlen_ms": gpu_ms(lambda: varlen_attn(q, k, v, cu, cu, L, L)),
            "sdpa_grouped_biased_ms": gpu_ms(lambda: gb.attend(q, k, v, gmeta, bias=bias))}


@torch.inference_mode()
def engine_times(name: str, batches: dict[str, list[int]]) -> dict[str, float]:
    import transformers as tf

    shape = SHAPES[name]
    cls = getattr(tf, shape.config["architectures"][0])
    cfg = cls.config_class(**{k: v for k, v in shape.config.items() if k not in ("architectures", "model_type")})
    with torch.device("cuda"):
        model = cls._from_config(cfg, dtype=torch.bfloat16).eval()
    spec = spec_from_config(dict(cfg.to_dict(), architectures=shape.config["architectures"]), None, name)
    engine = Engine.from_state_dict(spec, model.state_dict(), device="cuda", dtype="bfloat16")
    del model
    rng = np.random.default_rng(0)
    out = {}
    for label, lengths in batches.items():
        batch = Batch.pack([rng.integers(5, 30000, n).astype(np.int32) for n in lengths])
        for _ in range(3):
            engine.step(batch).wait()  # captures the graph bucket when it has one
        t0 = time.perf_counter()
        for _ in range(20):
            engine.step(batch).wait()
        out[label] = (time.perf_counter() - t0) / 20 * 1e3
    return out


def main() -> None:
    rng = np.random.default_rng(1)
    mixed = [int(x) for x in rng.integers(16, 513, 64)]
    report: dict[str, object] = {"torch": torch.__version__, "attention": {
        "64x128": attention([128] * 64), "16x512": attention([512] * 16), "mixed64_16-512": attention(mixed),
        "one_1": attention([1]), "odd": attention([1, 7, 300, 2, 129, 512, 33])}}
    batches = {"1x128": [128], "64x128": [128] * 64, "16x512": [512] * 16, "mixed64_16-512": mixed}
    report["engine_ms"] = {n: engine_times(n, batches) for n in ("bge-base", "mpnet-base")}
    print(json.dumps(report, indent=1))
    Path(sys.argv[1]).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
