"""`bouquet embed` against the bare engine on the same rows, in one run (GPU target: job ≥ 90%).

Builds a random-weight bge-base-shape BERT (``--tiny``: a 2-layer, 32-wide one), writes synthetic
documents of uniformly mixed length (16–512 tokens by default; each word is one WordPiece token, so
lengths are exact), then measures
  * engine: the same rows pre-tokenized, packed under the same token budget, stepped with one
    batch in flight ahead (what benchmark 3 measures of the engine), best of two passes;
  * job: the whole `bouquet embed` pipeline (JSONL read, tokenization, engine, Parquet write)
    with the same, already warm engine;
and prints both, their ratio, and writes them as JSON to OUT_JSON. ``--noop`` adds the host-side
ceiling: the same job with a no-op engine (bouquet/engine/noop.py: unit vectors at once), i.e. read +
tokenize + pack + write alone; ``--sweep-threads 2,4,8`` repeats the job(s) per tokenizer-thread count
with the same warm engine; ``--host-only`` skips the real engine (a CPU-only machine).

    bouquet bench embed OUT_JSON                       # H200: bge-base shape, 50,000 rows
    bouquet bench embed OUT_JSON --tiny --device cpu   # smoke test, seconds on a laptop
    bouquet bench embed OUT_JSON --noop --sweep-threads 2,4,8,16          # H200: + host ceiling
    bouquet bench embed OUT_JSON --host-only --device cpu --rows 20000 --max-batch-tokens 16384
"""
from __future__ import annotations

import argparse
import json
import os
import random
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]  # the source checkout (tests/data)
from bouquet.bench.meta import source_commit  # noqa: E402
from bouquet.jobs.embed_job import EmbedJobConfig  # noqa: E402


def write_mixed(path: Path, rows: int, min_tokens: int, max_tokens: int, seed: int) -> Path:
    """JSONL rows {"id", "text"} whose token counts (with [CLS]/[SEP]) are uniform in [min, max]."""
    from bouquet.bench.stream import word_list

    rng = random.Random(seed)
    words = word_list()
    with open(path, "w", encoding="utf-8") as f:
        for i in range(rows):
            n = rng.randint(min_tokens, max_tokens) - 2
            f.write(json.dumps({"id": i, "text": " ".join(rng.choices(words, k=n))}) + "\n")
    return path


def engine_rows_per_s(engine: object, seqs: list, budget: int, max_seqs: int, normalize: bool) -> float:
    """Rows/s of the bare engine over pre-tokenized ``seqs`` (synchronizes at the end)."""
    from bouquet.engine.heads.pooling import finalize
    from bouquet.jobs.packer import Group, Packer, drain, run_pipelined

    group = Group(seqs, None, engine.out_dim)  # type: ignore[attr-defined]
    packer = Packer(budget, max_seqs)
    packer.add(group)
    from bouquet.jobs.embed_job import pipeline_depth

    depth = pipeline_depth(engine.device.type)  # type: ignore[attr-defined]  # as the job
    t0 = time.perf_counter()
    rows = sum(n for n, _ in run_pipelined(engine, drain(packer), lambda r: finalize(r, normalize, None), depth))
    return rows / (time.perf_counter() - t0)


def job_run(src: Path, out: Path, model_dir: Path, engine: object, a: argparse.Namespace, budget: int,
            threads: int) -> dict[str, float]:
    """One whole `bouquet embed` run over ``src`` with ``engine`` (already warm): rows/s, tokens/s,
    seconds, and the process's CPU time per row in µs (all threads, Rust's included; steadier than
    rows/s on a shared machine)."""
    from bouquet.jobs.embed_job import run_embed_job

    cfg = EmbedJobConfig(input=str(src), output=str(out), model=str(model_dir), device=a.device, dtype=a.dtype,
                         max_batch_tokens=budget, tokenizer_threads=threads, chunk_rows=a.chunk_rows,
                         overwrite=True, progress=False)
    cpu0 = time.process_time()
    stats = run_embed_job(cfg, engine=engine)
    cpu = time.process_time() - cpu0
    return {"rows_per_s": round(stats.rows_per_s, 1), "tokens_per_s": round(stats.tokens_per_s, 1),
            "seconds": round(stats.seconds, 2), "cpu_us_per_row": round(cpu / max(stats.rows, 1) * 1e6, 1)}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out_json")
    ap.add_argument("--tiny", action="store_true", help="tiny random BERT and few rows (CPU smoke test)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--rows", type=int, default=0, help="default: 50,000 (tiny: 300)")
    ap.add_argument("--min-tokens", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=512)
    ap.add_argument("--max-batch-tokens", type=int, default=0, help="0 = the job's default (16,384 GPU, 2,048 CPU)")
    ap.add_argument("--tokenizer-threads", type=int, default=0, help="0 = the job's default (auto from the cores)")
    ap.add_argument("--chunk-rows", type=int, default=EmbedJobConfig.chunk_rows, help="rows per tokenizer call")
    ap.add_argument("--sweep-threads", default="", help="e.g. 2,4,8,16: one more job run per tokenizer-thread count")
    ap.add_argument("--noop", action="store_true",
                    help="also run every job with a no-op engine (zero vectors at once): the host-side ceiling")
    ap.add_argument("--host-only", action="store_true", help="no real engine at all: only the no-op runs (implies --noop)")
    ap.add_argument("--simulate-rows-per-s", type=float, default=0.0,
                    help="with --host-only: the no-op engine models a device of this speed, pipelined as on CUDA")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--work-dir", default=None)
    a = ap.parse_args(argv)
    a.noop = a.noop or a.host_only
    import torch

    from bouquet.bench.models import SHAPES, TINY_BERT, make_model_dir
    from bouquet.engine.runtime.engine import resolve_device, resolve_dtype
    from bouquet.engine.runtime.noop import NoopEngine
    from bouquet.tokenization import TextTokenizer
    from bouquet.config import batch_token_budget
    from bouquet.jobs.embed_job import (build_job_engine, cpu_threads, reserve_cores_for_engine,
                                        tokenizer_threads, usable_cores)
    from bouquet.jobs.reader import discover, iter_file
    from bouquet.modelspec import load_spec

    rows = a.rows or (300 if a.tiny else 50_000)
    sweep = [int(n) for n in a.sweep_threads.split(",") if n.strip()]
    work = Path(a.work_dir or tempfile.mkdtemp(prefix="embed-gpu-"))
    shape = "tiny" if a.tiny else "bge-base"
    model_dir = make_model_dir(TINY_BERT if a.tiny else SHAPES["bge-base"], work)
    src = write_mixed(work / "mixed.jsonl", rows, a.min_tokens, a.max_tokens, a.seed)
    spec = load_spec(str(model_dir))
    if a.device == "cpu":
        torch.set_num_threads(cpu_threads(0))
    device = resolve_device(a.device)
    reserve_cores_for_engine()  # as `bouquet embed` does, before anything tokenizes
    engine = None if a.host_only else build_job_engine(spec, a.device, a.dtype, a.max_batch_tokens, 512)
    if engine is not None:
        engine.warmup()
    # A modelled device is pipelined as the job pipelines CUDA (one batch in flight ahead).
    noop_device = torch.device("cuda") if a.host_only and a.simulate_rows_per_s > 0 else device
    noop = NoopEngine(spec, noop_device, resolve_dtype(a.dtype, device), a.simulate_rows_per_s, random_rows=True)
    budget = batch_token_budget(a.max_batch_tokens, device.type, spec.max_seq_length)
    res: dict[str, object] = {
        "commit": source_commit(REPO),
        "device": str(device), "gpu": torch.cuda.get_device_name() if device.type == "cuda" else None,
        "cpu_count": os.cpu_count(), "usable_cores": usable_cores(), "torch": torch.__version__, "model_shape": shape,
        "dtype": (engine or noop).info.dtype, "attention": (engine or noop).info.attention, "rows": rows,
        "max_batch_tokens": budget, "chunk_rows": a.chunk_rows, "simulated_rows_per_s": a.simulate_rows_per_s or None,
    }
    eng = None
    if engine is not None:
        texts = [t for c in iter_file(discover(src)[0], "text", "id", 0) for t in c.texts]
        seqs = TextTokenizer(spec).encode(texts).ids
        lengths = sorted(len(s) for s in seqs)
        res["tokens"] = sum(lengths)
        res["token_length_min_median_max"] = [lengths[0], lengths[len(lengths) // 2], lengths[-1]]
        engine_rows_per_s(engine, seqs[: min(len(seqs), 2000)], budget, 512, spec.normalize)  # warm-up (graphs, allocator)
        engine_runs = [engine_rows_per_s(engine, seqs, budget, 512, spec.normalize)]
        job = job_run(src, work / "out", model_dir, engine, a, budget, a.tokenizer_threads)
        engine_runs.append(engine_rows_per_s(engine, seqs, budget, 512, spec.normalize))
        eng = max(engine_runs)
        res.update({
            "engine_rows_per_s_runs": [round(r, 1) for r in engine_runs], "engine_rows_per_s": round(eng, 1),
            "job_rows_per_s": job["rows_per_s"], "job_tokens_per_s": job["tokens_per_s"],
            "job_seconds": job["seconds"], "job_cpu_us_per_row": job["cpu_us_per_row"], "job_over_engine": round(job["rows_per_s"] / eng, 3), "target": 0.9,
        })
        res["meets_target"] = res["job_over_engine"] >= 0.9
        print(f"engine {eng:,.0f} rows/s, job {job['rows_per_s']:,.0f} rows/s: job/engine = {res['job_over_engine']:.3f}")
    res["tokenizer_threads"] = tokenizer_threads(a.tokenizer_threads)
    if a.noop:
        res["host_ceiling"] = job_run(src, work / "out-noop", model_dir, noop, a, budget, a.tokenizer_threads)
        _print_host(res["tokenizer_threads"], res["host_ceiling"], eng or a.simulate_rows_per_s)
    res["sweep"] = []
    for n in sweep:
        point: dict[str, object] = {"tokenizer_threads": n}
        if engine is not None:
            job = job_run(src, work / "out", model_dir, engine, a, budget, n)
            point.update({f"job_{k}": v for k, v in job.items()})
            point["job_over_engine"] = round(job["rows_per_s"] / eng, 3) if eng else None
            print(f"tokenizer threads {n}: job {job['rows_per_s']:,.0f} rows/s = {point['job_over_engine']} of the engine")
        if a.noop:
            host = job_run(src, work / "out-noop", model_dir, noop, a, budget, n)
            point.update({f"host_{k}": v for k, v in host.items()})
            _print_host(n, host, eng or a.simulate_rows_per_s)
        res["sweep"].append(point)
    Path(a.out_json).write_text(json.dumps(res, indent=1))


def _print_host(threads: int, host: dict[str, float], engine_rows_per_s: float | None) -> None:
    """One line per no-op run; ``engine_rows_per_s`` is the real (or modelled) engine's rate, if any."""
    vs = f" = {host['rows_per_s'] / engine_rows_per_s:.2f}x the engine" if engine_rows_per_s else ""
    print(f"tokenizer threads {threads}: host ceiling (no-op engine) {host['rows_per_s']:,.0f} rows/s, "
          f"{host['tokens_per_s'] / 1e6:.2f} M tokens/s, {host['cpu_us_per_row']:,.0f} µs CPU/row{vs}")

if __name__ == "__main__":
    main()
