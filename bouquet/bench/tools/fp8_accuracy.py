"""fp8 accuracy on the GPU (issue 14), written to OUT.json:

1. the real all-MiniLM-L6-v2 (the embedded default model) on the STSb
   test sentences: Spearman and per-vector cosine against sentence-transformers in fp32, for the
   bouquet engine in bf16 and in fp8 (every step in fp8, and the load-time check's verdict);
2. random full-size models (folders that `bouquet bench` built, given as MODEL_DIR arguments):
   fp8 vs bf16 cosine (min, mean) on 64 random sequences of 16-512 tokens.

    bouquet bench fp8-accuracy OUT.json [MODEL_DIR ...] [--encoder-kinds qkv,up,down]

``--encoder-kinds``: the matmuls BERT-family layers run in fp8 (their ``FP8_KINDS``, default qkv),
to measure a candidate default before it is one.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from bouquet.bench.sts import read_sts
from bouquet.engine.runtime.batch import Batch
from bouquet.engine.runtime.engine import Engine
from bouquet.engine.linear.fp8 import set_fp8_min_tokens
from bouquet.modelspec import load_spec, resolve_model_path

REPO = Path(__file__).resolve().parents[3]  # the source checkout (tests/data)


def cos(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


def rows(eng: Engine, seqs: list[np.ndarray]) -> np.ndarray:
    return np.concatenate([eng.forward(Batch.pack(seqs[i:i + 256])).float().cpu().numpy() for i in range(0, len(seqs), 256)])


def minilm() -> dict:
    from scipy.stats import spearmanr
    from sentence_transformers import SentenceTransformer
    from tokenizers import Tokenizer

    d = resolve_model_path(None)
    spec = load_spec(str(d))
    s1, s2, gold = read_sts(REPO / "tests" / "data" / "stsbenchmark", "test")
    st = SentenceTransformer(str(d), device="cuda").float()
    ref = [st.encode(s, batch_size=256, convert_to_numpy=True) for s in (s1, s2)]
    tok = Tokenizer.from_file(str(d / "tokenizer.json"))
    tok.enable_truncation(spec.max_seq_length)
    tok.no_padding()
    ids = [[np.asarray(e.ids, np.int32) for e in tok.encode_batch(s)] for s in (s1, s2)]
    out: dict = {"st_spearman": float(spearmanr(cos(*ref), gold)[0])}
    try:
        Engine(spec, "cuda", quantization="fp8")
        out["load_check"] = "accepted"
    except ValueError as e:
        out["load_check"] = str(e)
    for name, eng in (("bf16", Engine(spec, "cuda")), ("fp8", Engine(spec, "cuda", quantization="fp8", fp8_min_cosine=0.0))):
        if name == "fp8":
            set_fp8_min_tokens(eng.model, 0)
        v = [rows(eng, x) for x in ids]
        c = np.concatenate([cos(v[0], ref[0]), cos(v[1], ref[1])])
        out[name] = {"spearman": float(spearmanr(cos(*v), gold)[0]), "cos_vs_st_min": float(c.min()),
                     "cos_vs_st_mean": float(c.mean()), "vectors_below_0.995": int((c < 0.995).sum()), "vectors": len(c)}
    return out


def random_model(d: str) -> dict:
    spec = load_spec(d)
    rng = np.random.default_rng(0)
    seqs = [rng.integers(1000, min(spec.vocab_size, 30000), int(n)).astype(np.int32) for n in rng.integers(16, 513, 64)]
    bf16 = Engine(spec, "cuda", quantization="none")
    a = rows(bf16, seqs)
    del bf16
    fp8 = Engine(spec, "cuda", quantization="fp8", fp8_min_cosine=0.0)
    set_fp8_min_tokens(fp8.model, 0)
    c = cos(rows(fp8, seqs), a)
    return {"cos_fp8_vs_bf16_min": float(c.min()), "cos_fp8_vs_bf16_mean": float(c.mean()), "probe": fp8.fp8_cosine}


def main(argv: list[str] | None = None) -> None:
    import argparse

    from bouquet.engine.models.bert import PostNormLayer

    ap = argparse.ArgumentParser()
    ap.add_argument("out_json")
    ap.add_argument("model_dirs", nargs="*")
    ap.add_argument("--encoder-kinds", default=None, help="comma-separated, e.g. qkv,up,down")
    a = ap.parse_args(argv)
    if a.encoder_kinds:
        PostNormLayer.FP8_KINDS = tuple(a.encoder_kinds.split(","))
    res: dict = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                 "encoder_fp8_kinds": list(PostNormLayer.FP8_KINDS)}
    res["minilm_stsb_test"] = minilm()
    print(json.dumps(res, indent=1), flush=True)
    for d in a.model_dirs:
        res[Path(d).name] = random_model(d)
        print(d, res[Path(d).name], flush=True)
        torch.cuda.empty_cache()
    Path(a.out_json).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
