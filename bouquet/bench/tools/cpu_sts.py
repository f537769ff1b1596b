"""CPU throughput on the STS Benchmark sentences: bouquet vs sentence-transformers, side by side.

Usage: bouquet bench cpu-sts [--split dev] [--repeats 3] [--out bench/out/cpu-sts.json]
(the recorded figures: bench/results/cpu-2core.md)

Rows (sentences/s, best of ``--repeats``, all in this one run on this machine):
- ``sentence-transformers``: ``SentenceTransformer.encode`` (batch 32, sorts by length).
- ``bouquet in-process``: gateway tokenizer + engine steps under a token budget, in arrival order
  and sorted by length (what sentence-transformers' ``encode`` does for offline work).
- ``bouquet HTTP``: the real ``bouquet serve`` (gateway + gRPC server), 4 concurrent clients
  sending 64 sentences per request.
Before timing, bouquet's vectors are checked against sentence-transformers' (cosine ≥ 0.9999).
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

from bouquet.bench.meta import source_commit
from bouquet.bench.served import Served
from bouquet.bench.sts import read_sts

REPO = Path(__file__).resolve().parents[3]  # the source checkout: tests/data/stsbenchmark


def cosine_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def best_rate(fn, n: int, repeats: int) -> float:
    rates = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        rates.append(n / (time.perf_counter() - t))
    return max(rates)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--split", default="dev")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--max-batch-tokens", type=int, default=2048)
    # bench/out/ is ignored by git: a re-run does not touch the recorded figures
    ap.add_argument("--out", default=str(REPO / "bench" / "out" / "cpu-sts.json"))
    args = ap.parse_args(argv)

    import torch
    from sentence_transformers import SentenceTransformer

    from bouquet.engine.runtime.batch import Batch
    from bouquet.engine.runtime.engine import Engine
    from bouquet.engine.heads.pooling import finalize
    from bouquet.tokenization import TextTokenizer
    from bouquet.modelspec import load_spec

    s1, s2, _ = read_sts(REPO / "tests" / "data" / "stsbenchmark", args.split)
    sents = s1 + s2
    n = len(sents)
    spec = load_spec(None)
    st = SentenceTransformer(str(spec.path), device="cpu")
    eng = Engine(spec, "cpu")
    tok = TextTokenizer(spec)

    def bouquet_in_process(sort: bool = False) -> np.ndarray:
        ids = tok.encode(sents).ids
        order = sorted(range(n), key=lambda i: len(ids[i])) if sort else list(range(n))
        out, cur, tokens = [], [], 0
        for s in [ids[i] for i in order] + [None]:  # type: ignore[list-item]
            if s is None or (cur and tokens + len(s) > args.max_batch_tokens):
                out.append(eng.step(Batch.pack(cur)).wait())
                cur, tokens = [], 0
            if s is not None:
                cur.append(s)
                tokens += len(s)
        rows = np.empty((n, spec.dimension), dtype=np.float32)
        rows[order] = np.concatenate(out)
        return finalize(rows, spec.normalize, None)

    ref = st.encode(sents, batch_size=32)
    ours = bouquet_in_process()
    cos_inproc = float(min(cosine_rows(ours, ref).min(), cosine_rows(bouquet_in_process(True), ref).min()))
    assert cos_inproc >= 0.9999, cos_inproc

    results: dict[str, float] = {}
    results["sentence-transformers"] = best_rate(lambda: st.encode(sents, batch_size=32), n, args.repeats)
    results["bouquet in-process (arrival order)"] = best_rate(bouquet_in_process, n, args.repeats)
    results["bouquet in-process (sorted by length, as sentence-transformers)"] = best_rate(
        lambda: bouquet_in_process(True), n, args.repeats)

    srv = Served()
    try:
        chunks = [sents[i:i + 64] for i in range(0, n, 64)]
        http_vecs = np.concatenate([srv.vectors(c) for c in chunks])
        cos_http = float(cosine_rows(http_vecs, ref).min())
        assert cos_http >= 0.9999, cos_http

        def over_http() -> None:
            with cf.ThreadPoolExecutor(4) as ex:
                list(ex.map(srv.vectors, chunks))

        results["bouquet HTTP (4 clients x 64)"] = best_rate(over_http, n, args.repeats)
    finally:
        srv.stop()

    base = results["sentence-transformers"]
    commit = source_commit(REPO)
    record = {
        "command": "bouquet bench cpu-sts " + " ".join(argv if argv is not None else sys.argv[1:]),
        "commit": commit, "split": args.split, "sentences": n, "cpu": platform.processor() or platform.machine(),
        "cores": os.cpu_count(), "torch": torch.__version__, "torch_threads": torch.get_num_threads(),
        "min_cosine_vs_st": {"in-process": cos_inproc, "http": cos_http},
        "sentences_per_s": {k: round(v, 1) for k, v in results.items()},
        "speedup_vs_st": {k: round(v / base, 3) for k, v in results.items()},
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(record, indent=2) + "\n")
    print(f"STSb {args.split}: {n} sentences, {os.cpu_count()} cores, commit {commit}")
    print("| system | sentences/s | vs sentence-transformers |\n|---|---|---|")
    for k, v in results.items():
        print(f"| {k} | {v:.0f} | {v / base:.2f}x |")


if __name__ == "__main__":
    main()
