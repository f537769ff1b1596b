"""CPU throughput on the STS Benchmark sentences: bouquet vs sentence-transformers, side by side.

Usage: python bench/cpu_sts.py [--split dev] [--repeats 3] [--out bench/out/cpu-sts.json]
(the recorded figures were written with --out bench/results/cpu-sts.json)

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

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from bouquet.bench.meta import source_commit  # noqa: E402
sys.path.insert(0, str(REPO / "tests"))

from helpers import BouquetProcess, cosine_rows, read_sts  # noqa: E402


def best_rate(fn, n: int, repeats: int) -> float:
    rates = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        rates.append(n / (time.perf_counter() - t))
    return max(rates)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--split", default="dev")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--max-batch-tokens", type=int, default=2048)
    # bench/out/ is ignored by git: a re-run does not overwrite the recorded bench/results/cpu-sts.json
    ap.add_argument("--out", default=str(REPO / "bench" / "out" / "cpu-sts.json"))
    args = ap.parse_args()

    import torch
    from sentence_transformers import SentenceTransformer

    from bouquet.engine.runtime.batch import Batch
    from bouquet.engine.runtime.engine import Engine
    from bouquet.engine.heads.pooling import finalize
    from bouquet.tokenization import TextTokenizer
    from bouquet.modelspec import load_spec

    s1, s2, _ = read_sts(args.split)
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

    srv = BouquetProcess()
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
        "command": "python bench/cpu_sts.py " + " ".join(sys.argv[1:]),
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
