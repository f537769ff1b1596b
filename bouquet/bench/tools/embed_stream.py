"""Streaming check of `bouquet embed`: a large synthetic input, a tiny random model, RSS over time.

Writes N synthetic documents (JSONL, 4–60 words each, fixed seed), runs the real command in a
subprocess, samples the resident memory of that process tree every 0.25 s, and reports peak RSS,
RSS at each tenth of the run, rows/s and tokens/s, as JSON (and Markdown with --md).

    bouquet bench embed-stream --rows 1000000 --md bench/out/embed-stream-cpu.md
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import psutil

from bouquet.bench.meta import source_commit
from bouquet.bench.models import TINY_BERT, make_model_dir
from bouquet.bench.stream import REPO, run_job, write_synthetic


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--work-dir", default=None, help="where input, model and output go (default: a temp folder)")
    ap.add_argument("--shard-rows", type=int, default=10_000)
    ap.add_argument("--json", default=None, help="write the result as JSON here")
    ap.add_argument("--md", default=None, help="write a Markdown report here")
    a = ap.parse_args(argv)
    work = Path(a.work_dir or tempfile.mkdtemp(prefix="embed-stream-"))
    work.mkdir(parents=True, exist_ok=True)
    model = make_model_dir(TINY_BERT, work)
    src = work / f"synthetic-{a.rows}.jsonl"
    if not src.exists():
        t = time.perf_counter()
        write_synthetic(src, a.rows)
        print(f"wrote {src} ({src.stat().st_size / 2**20:.0f} MiB) in {time.perf_counter() - t:.0f}s", file=sys.stderr)
    # Read before the run: the commit whose code the job ran.
    commit = source_commit(REPO)
    res = run_job([str(src), "--output", str(work / "out"), "--model", str(model), "--device", "cpu",
                   "--shard-rows", str(a.shard_rows), "--overwrite", "--no-progress"])
    res["input_mib"] = round(src.stat().st_size / 2**20, 1)
    res["commit"] = commit
    print(json.dumps(res, indent=1))
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1))
    if a.md:
        Path(a.md).parent.mkdir(parents=True, exist_ok=True)
        Path(a.md).write_text(
            f"# `bouquet embed` streaming on CPU: {res['rows']:,} rows, tiny random BERT\n\n"
            f"- command: `bouquet bench embed-stream --rows {a.rows} --shard-rows {a.shard_rows}`\n"
            f"- job: `{res['command']}`\n- commit: {commit}\n"
            f"- machine: {os.cpu_count()} CPU cores, {psutil.virtual_memory().total / 2**30:.0f} GiB RAM\n\n"
            f"| rows | input | tokens | pipeline s | rows/s | tokens/s | peak RSS |\n|---|---|---|---|---|---|---|\n"
            f"| {res['rows']:,} | {res['input_mib']} MiB | {res['tokens']:,} | {res['pipeline_s']} | {res['rows_per_s']:,} "
            f"| {res['tokens_per_s']:,} | {res['peak_rss_mb']} MiB |\n\n"
            f"RSS (MiB, max so far) at each tenth of the wall time: {res['rss_mb_by_tenth']}\n")


if __name__ == "__main__":
    main()
