"""`bouquet bench --benchmarks cpu` (`make bench-cpu`): bouquet on the CPU against the tools CPU users
pick, on the STS Benchmark sentences, every system in its own process with the same thread count.

Systems (``CPU_SYSTEMS``): sentence-transformers fp32; ONNX Runtime fp32 (the same weights exported
here with ``torch.onnx.export``, then ORT's BERT graph optimizer: fused attention / LayerNorm /
GELU) and ONNX Runtime int8 (``quantize_dynamic`` of that graph: int8 weights, uint8 activations,
one scale per tensor: the recipe of ORT's docs); bouquet's engine in process in fp32, bf16 and int8;
bouquet over HTTP (``bouquet serve --device cpu`` with its defaults, /v1/embeddings).

Per system: bulk sentences/s (every sentence of the split, one pass after a warm-up pass), batch-1
p50 / p99 ms (one sentence per call, ``--cpu-b1`` sentences), min cosine of its vectors against
sentence-transformers', STSb Spearman of the pair cosines. The CPU's flags and the thread count
go into the record. Workers: ``python -m bouquet.bench.cpu SYSTEM SPLIT N_B1 THREADS OUT_DIR``,
writing OUT_DIR/SYSTEM.npy (vectors) and OUT_DIR/SYSTEM.json (timings).
"""
from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from bouquet.bench.meta import source_commit
from bouquet.bench.sts import read_sts

REPO = Path(__file__).resolve().parents[2]
STS_DIR = REPO / "tests" / "data" / "stsbenchmark"
CPU_SYSTEMS = ("st-fp32", "ort-fp32", "ort-int8", "bouquet-fp32", "bouquet-bf16", "bouquet-int8", "bouquet-http")
REFERENCE = "st-fp32"


def run_suite(systems: tuple[str, ...], out: Path, split: str = "test", sentences: int = 0, b1: int = 200,
              threads: int = 2, rounds: int = 1) -> dict:
    """Run each system in its own process, one after another, then score them against
    sentence-transformers (always run: it is the reference). ``sentences``: the first N pairs of
    the split only (0: all). ``rounds``: how many times the whole order runs, round after round, so
    a shared machine's drift falls on every system alike; each timing of a row is then the median
    of its rounds (``ROUND_KEYS``), with every round's figures kept under ``rounds``.
    Writes OUT/cpu-results.json and OUT/cpu-results.md; returns the record.
    Progress goes to stderr, a line as each system starts and ends, and the files' paths at the end.
    Raises ValueError for an unknown system or split, or rounds < 1."""
    bad = [s for s in systems if s not in CPU_SYSTEMS]
    if bad:
        raise ValueError(f"unknown CPU system(s) {', '.join(bad)}; choose from {', '.join(CPU_SYSTEMS)}")
    if not (STS_DIR / f"sts-{split}.csv").is_file():
        raise ValueError(f"no STSb split {split!r} in {STS_DIR} (dev, test, train)")
    if rounds < 1:
        raise ValueError(f"rounds must be at least 1, got {rounds}")
    out.mkdir(parents=True, exist_ok=True)
    order = (REFERENCE,) + tuple(s for s in systems if s != REFERENCE)
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    runs: dict[str, list[dict]] = {name: [] for name in order}
    for r in range(rounds):
        for i, name in enumerate(order, 1):
            tag = f"[{i}/{len(order)}]" + (f" round {r + 1}/{rounds}" if rounds > 1 else "")
            runs[name].append(_run_worker(name, split, sentences, b1, threads, out, env, tag))
    rows = {name: _median_row(rs) for name, rs in runs.items()}
    s1, _, gold = _pairs(split, sentences)
    ref = np.load(out / f"{REFERENCE}.npy") if "error" not in rows[REFERENCE] else None
    for name, row in rows.items():
        if "error" in row:
            continue
        v = np.load(out / f"{name}.npy").astype(np.float64)
        v /= np.linalg.norm(v, axis=1, keepdims=True)
        n = len(s1)
        row["spearman"] = float(_spearman((v[:n] * v[n:]).sum(1), gold))
        if ref is not None:
            row["min_cos"] = float((v * ref).sum(1).min())
    command = ["bouquet bench --benchmarks cpu", *[f"--system {s}" for s in systems]] + ([f"--rounds {rounds}"] if rounds > 1 else [])
    record = {"command": " ".join(command), "commit": source_commit(REPO), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
              "cpu": platform.processor() or platform.machine(), "cpu_flags": _flags_of_note(), "threads": threads,
              "split": split, "pairs": len(s1), "rounds": rounds, "systems": rows}
    (out / "cpu-results.json").write_text(json.dumps(record, indent=1) + "\n")
    (out / "cpu-results.md").write_text(markdown(record))
    print(f"cpu suite: wrote {out / 'cpu-results.json'} and {out / 'cpu-results.md'}", file=sys.stderr, flush=True)
    return record


# a worker's timings: a row of several rounds gives the median of each, and keeps every round's
ROUND_KEYS = ("bulk_per_s", "b1_p50_ms", "b1_p99_ms")


def _run_worker(name: str, split: str, sentences: int, b1: int, threads: int, out: Path, env: dict[str, str],
                tag: str) -> dict:
    """One system's worker process → its timings (OUT/NAME.json), or {"error": [last stderr line]}.
    Its vectors stay in OUT/NAME.npy (the same every round: the last round's are scored)."""
    cmd = [sys.executable, "-m", "bouquet.bench.cpu", name, split, str(sentences), str(b1), str(threads), str(out)]
    print(f"cpu suite: {tag} {name} ...", file=sys.stderr, flush=True)  # a full run takes minutes
    t0 = time.perf_counter()
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        error = done.stderr.strip().splitlines()[-1:] or [f"exit {done.returncode}"]
        print(f"cpu suite: {tag} {name} failed: {error[0]}", file=sys.stderr, flush=True)
        return {"error": error}
    print(f"cpu suite: {tag} {name} done in {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
    return json.loads((out / f"{name}.json").read_text())


def _median_row(rounds: list[dict]) -> dict:
    """A system's row from its rounds: the first error, if any round failed; else each of
    ``ROUND_KEYS`` as the median of the rounds (one round: its own figures), and with several
    rounds every round's figures under "rounds"."""
    failed = [r for r in rounds if "error" in r]
    if failed:
        return failed[0]
    row = {**rounds[-1], **{k: float(np.median([r[k] for r in rounds])) for k in ROUND_KEYS}}
    if len(rounds) > 1:
        row["rounds"] = [{k: r[k] for k in ROUND_KEYS} for r in rounds]
    return row


def markdown(record: dict) -> str:
    """The record as a table (the issue's columns)."""
    rounds = record.get("rounds", 1)
    lines = [f"CPU benchmark, commit {record['commit']}, {record['date']}, {record['threads']} threads per system, "
             f"STSb {record['split']} ({record['pairs']} pairs); CPU flags of note: {' '.join(record['cpu_flags'])}"
             + (f"; {rounds} rounds, each timing the median (lowest–highest round)" if rounds > 1 else ""),
             "", "| system | dtype | bulk sentences/s | batch 1 p50 / p99 ms | min cos vs sentence-transformers | STSb Spearman |",
             "|---|---|---|---|---|---|"]
    for name, r in record["systems"].items():
        if "error" in r:
            lines.append(f"| {name} | | error: {' '.join(r['error'])} | | | |")
            continue
        lines.append(f"| {name} | {r.get('dtype', '')} | {_cell(r, 'bulk_per_s', '{:,.0f}')} | {_cell(r, 'b1_p50_ms', '{:.2f}')} / "
                     f"{_cell(r, 'b1_p99_ms', '{:.2f}')} | {r.get('min_cos', float('nan')):.5f} | {r['spearman']:.5f} |")
    return "\n".join(lines) + "\n"


def _cell(row: dict, key: str, fmt: str) -> str:
    """``row[key]`` formatted, and with several rounds its lowest–highest round in brackets."""
    text = fmt.format(row[key])
    if "rounds" in row:
        values = [r[key] for r in row["rounds"]]
        text += f" ({fmt.format(min(values))}–{fmt.format(max(values))})"
    return text


def _flags_of_note() -> list[str]:
    from bouquet.engine.linear.cpu import cpu_flags

    return sorted(f for f in cpu_flags() if f.startswith(("avx512", "amx", "avx2", "avx_vnni", "fma")))


def _pairs(split: str, sentences: int) -> tuple[list[str], list[str], np.ndarray]:
    s1, s2, gold = read_sts(STS_DIR, split)
    k = sentences or len(s1)
    return s1[:k], s2[:k], gold[:k]


def missing_packages(systems: tuple[str, ...]) -> list[str]:
    """The Python packages a run of ``systems`` needs that are not installed: scipy (the
    Spearman), sentence-transformers (the reference, always run), onnxruntime and onnx for the
    ONNX Runtime peers."""
    import importlib.util

    need = ["scipy", "sentence_transformers"] + (["onnxruntime", "onnx"] if any(s.startswith("ort-") for s in systems) else [])
    return [n.replace("_", "-") for n in need if importlib.util.find_spec(n) is None]


def _spearman(a: np.ndarray, b: np.ndarray) -> float:
    from scipy.stats import spearmanr

    return float(spearmanr(a, b).statistic)


def _worker(name: str, split: str, sentences: int, b1: int, threads: int, out: Path) -> None:
    """One system: encode every sentence (a warm-up pass, then the timed pass), then batch-1
    latencies; writes OUT/NAME.npy and OUT/NAME.json."""
    import torch

    torch.set_num_threads(threads)
    s1, s2, _ = _pairs(split, sentences)
    texts = s1 + s2
    from bouquet.bench.cpu_systems import make_system

    system = make_system(name, threads, out)
    encode, close = system.encode, system.close
    try:
        encode(texts[:64])  # warm-up: first-call allocations, oneDNN primitive creation
        t0 = time.perf_counter()
        vecs = encode(texts)
        bulk = len(texts) / (time.perf_counter() - t0)
        lat = []
        for t in texts[: max(b1, 1)]:
            t1 = time.perf_counter()
            encode([t])
            lat.append((time.perf_counter() - t1) * 1e3)
    finally:
        close()
    np.save(out / f"{name}.npy", np.asarray(vecs, dtype=np.float32))
    (out / f"{name}.json").write_text(json.dumps({"dtype": system.dtype, "bulk_per_s": bulk, "b1_p50_ms": float(np.percentile(lat, 50)),
                                                  "b1_p99_ms": float(np.percentile(lat, 99)), "b1_calls": len(lat)}))


if __name__ == "__main__":
    _worker(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), Path(sys.argv[6]))
