"""`bouquet embed` against the bare engine on the same rows, in one run (GPU target: job ≥ 90%).

Builds a random-weight bge-base-shape BERT (``--tiny``: a 2-layer, 32-wide one), writes synthetic
documents of uniformly mixed length (16–512 tokens by default; each word is one WordPiece token, so
lengths are exact), then measures
  * engine: the same rows pre-tokenized, packed under the same token budget, stepped with one
    batch in flight ahead (what benchmark 3 measures of the engine), best of two passes;
  * job: the whole `bouquet embed` pipeline (JSONL read, tokenization, engine, Parquet write)
    with the same, already warm engine;
and prints both, their ratio, and writes them as JSON to OUT_JSON.

    python bench/embed_gpu.py OUT_JSON                       # H200: bge-base shape, 50,000 rows
    python bench/embed_gpu.py OUT_JSON --tiny --device cpu   # smoke test, seconds on a laptop
"""
from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def write_mixed(path: Path, rows: int, min_tokens: int, max_tokens: int, seed: int) -> Path:
    """JSONL rows {"id", "text"} whose token counts (with [CLS]/[SEP]) are uniform in [min, max]."""
    sys.path.insert(0, str(REPO))
    from bench.embed_stream import word_list

    rng = random.Random(seed)
    words = word_list()
    with open(path, "w", encoding="utf-8") as f:
        for i in range(rows):
            n = rng.randint(min_tokens, max_tokens) - 2
            f.write(json.dumps({"id": i, "text": " ".join(rng.choices(words, k=n))}) + "\n")
    return path


def engine_rows_per_s(engine: object, seqs: list, budget: int, max_seqs: int, normalize: bool) -> float:
    """Rows/s of the bare engine over pre-tokenized ``seqs`` (synchronizes at the end)."""
    from bouquet.engine.pooling import finalize
    from bouquet.jobs.packer import Group, Packer, drain, run_pipelined

    group = Group(seqs, None, engine.out_dim)  # type: ignore[attr-defined]
    packer = Packer(budget, max_seqs)
    packer.add(group)
    depth = 1 if engine.device.type == "cuda" else 0  # type: ignore[attr-defined]
    t0 = time.perf_counter()
    rows = sum(n for n, _ in run_pipelined(engine, drain(packer), lambda r: finalize(r, normalize, None), depth))
    return rows / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out_json")
    ap.add_argument("--tiny", action="store_true", help="tiny random BERT and few rows (CPU smoke test)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--rows", type=int, default=0, help="default: 50,000 (tiny: 300)")
    ap.add_argument("--min-tokens", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=512)
    ap.add_argument("--max-batch-tokens", type=int, default=0, help="0 = the job's default (16,384 GPU, 2,048 CPU)")
    ap.add_argument("--tokenizer-threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--work-dir", default=None)
    a = ap.parse_args()
    sys.path.insert(0, str(REPO))
    import torch

    from bench.tiny_bert import build_random_bert
    from bouquet.engine.engine import Engine
    from bouquet.gateway.tokenization import TextTokenizer
    from bouquet.jobs.embed_job import EmbedJobConfig, cpu_threads, default_budget, run_embed_job
    from bouquet.jobs.reader import discover, iter_file
    from bouquet.modelspec import load_spec

    rows = a.rows or (300 if a.tiny else 50_000)
    work = Path(a.work_dir or tempfile.mkdtemp(prefix="embed-gpu-"))
    shape = "tiny" if a.tiny else "bge-base"
    model_dir = build_random_bert(work / f"random-{shape}", shape)
    src = write_mixed(work / "mixed.jsonl", rows, a.min_tokens, a.max_tokens, a.seed)
    spec = load_spec(str(model_dir))
    if a.device == "cpu":
        torch.set_num_threads(cpu_threads(0))
    engine = Engine(spec, a.device, a.dtype)
    engine.warmup()
    budget = default_budget(a.max_batch_tokens, engine.device.type, spec.max_seq_length)
    texts = [t for c in iter_file(discover(src)[0], "text", "id", 0) for t in c.texts]
    seqs = TextTokenizer(spec).encode(texts).ids
    tokens = sum(len(s) for s in seqs)
    lengths = sorted(len(s) for s in seqs)
    engine_rows_per_s(engine, seqs[: min(len(seqs), 2000)], budget, 512, spec.normalize)  # warm-up (graphs, allocator)
    engine_runs = [engine_rows_per_s(engine, seqs, budget, 512, spec.normalize)]
    cfg = EmbedJobConfig(input=str(src), output=str(work / "out"), model=str(model_dir), device=a.device, dtype=a.dtype,
                         max_batch_tokens=budget, tokenizer_threads=a.tokenizer_threads, overwrite=True, progress=False)
    stats = run_embed_job(cfg, engine=engine)
    engine_runs.append(engine_rows_per_s(engine, seqs, budget, 512, spec.normalize))
    eng = max(engine_runs)
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    res = {
        "commit": commit, "device": str(engine.device), "gpu": torch.cuda.get_device_name() if engine.device.type == "cuda" else None,
        "torch": torch.__version__, "model_shape": shape, "dtype": engine.info.dtype, "attention": engine.info.attention,
        "rows": rows, "tokens": tokens, "token_length_min_median_max": [lengths[0], lengths[len(lengths) // 2], lengths[-1]],
        "max_batch_tokens": budget, "engine_rows_per_s_runs": [round(r, 1) for r in engine_runs],
        "engine_rows_per_s": round(eng, 1), "job_rows_per_s": round(stats.rows_per_s, 1),
        "job_tokens_per_s": round(stats.tokens_per_s, 1), "job_seconds": round(stats.seconds, 2),
        "job_over_engine": round(stats.rows_per_s / eng, 3), "target": 0.9,
    }
    res["meets_target"] = res["job_over_engine"] >= 0.9
    print(f"engine {eng:,.0f} rows/s, job {stats.rows_per_s:,.0f} rows/s: job/engine = {res['job_over_engine']:.3f}")
    Path(a.out_json).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
