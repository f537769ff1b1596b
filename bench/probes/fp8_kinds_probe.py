"""Which matmuls to run in fp8 (issue 14): for each model shape (random weights, full size), the
fp8-vs-bf16 cosine (min, mean over 64 random sequences of 16-512 tokens) and the eager step time
of 64 × 512 tokens, with fp8 on every subset of a layer's matmuls that matters (each as the engine
runs it: deferred scales where the model defers them, quant.py): all four, all but the attention output (o: its input needs a separate cast pass, FlashAttention writes bf16), all
but the MLP's down projection (its input, act(gate)·up, has the widest rows), and so on.

    python bench/probes/fp8_kinds_probe.py OUT.json [--shapes qwen3-0.6b bge-base] [--models-root DIR]
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch

from bouquet.bench.models import SHAPES, make_model_dir
from bouquet.engine.batch import Batch
from bouquet.engine.engine import Engine
from bouquet.engine.quant import KINDS, enable_fp8, set_fp8_min_tokens
from bouquet.modelspec import load_spec

SUBSETS = [KINDS, ("qkv", "up", "down"), ("o", "up", "down"), ("qkv", "o", "up"), ("qkv", "up"), ("up", "down"),
           ("qkv",), ()]


def step_ms(eng: Engine, batch: Batch) -> float:
    for _ in range(2):
        eng.forward(batch)
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(5):
        eng.forward(batch)
    b.record()
    b.synchronize()
    return a.elapsed_time(b) / 5


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--shapes", nargs="+", default=["qwen3-0.6b", "bge-base"])
    ap.add_argument("--models-root", default="/tmp/bench-models")
    a = ap.parse_args()
    res = []
    for name in a.shapes:
        spec = load_spec(str(make_model_dir(SHAPES[name], Path(a.models_root))))
        eng = Engine(spec, "cuda", quantization="fp8", fp8_min_cosine=0.0)
        enable_fp8(eng.model, eng.device, 0, KINDS)  # every kind quantized (the engine did its defaults only)
        rng = np.random.default_rng(0)
        vocab = min(spec.vocab_size, 30000)
        seqs = [rng.integers(1000, vocab, int(n)).astype(np.int32) for n in rng.integers(16, 513, 64)]
        check = Batch.pack(seqs)
        timed = Batch.pack([rng.integers(1000, vocab, 512).astype(np.int32) for _ in range(64)])
        set_fp8_min_tokens(eng.model, None)
        ref = eng.forward(check).double().cpu()
        for kinds in SUBSETS:
            set_fp8_min_tokens(eng.model, None)
            set_fp8_min_tokens(eng.model, 0, kinds)
            got = eng.forward(check).double().cpu()
            cos = torch.nn.functional.cosine_similarity(got, ref, dim=1)
            row = {"model": name, "fp8": "+".join(kinds) or "none (bf16)", "cos_min": round(float(cos.min()), 5),
                   "cos_mean": round(float(cos.mean()), 5), "step_64x512_ms": round(step_ms(eng, timed), 3)}
            print(json.dumps(row), flush=True)
            res.append(row)
        del eng
        torch.cuda.empty_cache()
    Path(a.out).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
