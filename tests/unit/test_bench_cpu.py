"""`bouquet bench --benchmarks cpu` (bouquet/bench/cpu.py): its argument checks, and a tiny run of
three systems (16 STSb pairs; one of them a served `bouquet serve`) whose record holds every column, scored against sentence-transformers."""
from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

from bouquet.bench.cpu import CPU_SYSTEMS, run_suite


def test_unknown_cpu_system_is_refused_before_any_run(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "bouquet", "bench", "--benchmarks", "cpu", "--system", "ort-fp16",
                           "--out", str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert "unknown --system ort-fp16 for --benchmarks cpu" in done.stderr
    assert not list(tmp_path.iterdir())
    with pytest.raises(ValueError, match="no STSb split 'nope'"):
        run_suite(("bouquet-fp32",), tmp_path, split="nope")


def test_tiny_cpu_run_records_every_column(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "bouquet", "bench", "--benchmarks", "cpu", "--system", "bouquet-fp32",
                           "--system", "bouquet-http", "--tiny", "--out", str(tmp_path / "out"),
                           "--history", str(tmp_path / "history.csv")],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    record = json.loads((tmp_path / "out" / "cpu-results.json").read_text())
    assert set(record["systems"]) == {"st-fp32", "bouquet-fp32", "bouquet-http"}  # the reference always runs
    assert record["pairs"] == 16 and record["threads"] == 2 and record["cpu_flags"]
    for r in record["systems"].values():
        assert r["bulk_per_s"] > 0 and 0 < r["b1_p50_ms"] <= r["b1_p99_ms"] and r["b1_calls"] == 8
        assert r["min_cos"] > 0.9999 and -1 <= r["spearman"] <= 1
    assert "| bouquet-fp32 | float32 |" in done.stdout
    assert record["systems"]["bouquet-http"]["dtype"] in ("float32", "bfloat16")  # the served default: /info's
    # a full run takes minutes: each system's start and end, then where the record went, on stderr
    for line in ("[1/3] st-fp32 ...", "[2/3] bouquet-fp32 ...", "[2/3] bouquet-fp32 done in", "[3/3] bouquet-http done in",
                 "cpu-results.md"):
        assert line in done.stderr, done.stderr[-2000:]
    assert set(CPU_SYSTEMS) >= set(record["systems"])
    # --history: a row per system and figure, the record's values
    with (tmp_path / "history.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert {(r["system"], r["metric"]) for r in rows} == {(s, m) for s in record["systems"] for m in
                                                          ("bulk_per_s", "b1_p50_ms", "b1_p99_ms", "min_cos", "spearman")}
    http = {r["metric"]: float(r["value"]) for r in rows if r["system"] == "bouquet-http"}
    assert http["b1_p50_ms"] == record["systems"]["bouquet-http"]["b1_p50_ms"]
    assert {r["commit"] for r in rows} == {record["commit"]} and rows[0]["case"] == "STSb test 16 pairs"


def test_benchmarks_cpu_alone_runs_every_cpu_system(tmp_path: Path) -> None:
    """`bouquet bench --benchmarks cpu` without --system (what --help offers: "or cpu alone") starts the CPU
    systems rather than refusing the default suite's (engine, grpc, http, transformers) as unknown. The
    run is stopped (SIGTERM, exit 128 + 15) once it has begun: its first worker has made OUT."""
    import signal
    import time

    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-m", "bouquet", "bench", "--benchmarks", "cpu", "--tiny", "--out", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while proc.poll() is None and not out.is_dir() and time.monotonic() < deadline:
            time.sleep(0.1)
        started = out.is_dir()
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    assert started, err[-2000:]
    assert "unknown --system" not in err and proc.returncode == 128 + signal.SIGTERM, (proc.returncode, err[-2000:])


def test_missing_packages_name_what_the_systems_need(monkeypatch: pytest.MonkeyPatch) -> None:
    """A `make serve` venv has no scipy, sentence-transformers or ONNX Runtime: the suite says so
    before any run (bench/command.py) instead of failing after its systems ran."""
    import importlib.util

    from bouquet.bench.cpu import missing_packages

    assert missing_packages(("ort-int8", "bouquet-bf16")) == []  # the test extra is installed here
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name in ("scipy", "onnxruntime") else real(name, *a))
    assert missing_packages(("bouquet-bf16",)) == ["scipy"]
    assert missing_packages(("ort-fp32", "bouquet-http")) == ["scipy", "onnxruntime"]


def test_rounds_give_each_timing_its_median_and_range() -> None:
    """--rounds N: a row's timings are the median of its rounds, each round kept; the table shows
    the median with the lowest and highest round; a round that failed makes the row an error."""
    from bouquet.bench.cpu import _median_row, markdown

    rounds = [{"bulk_per_s": b, "b1_p50_ms": p, "b1_p99_ms": 2 * p, "b1_calls": 200}
              for b, p in ((900.0, 2.6), (1100.0, 2.2), (1000.0, 2.4))]
    row = _median_row(rounds)
    assert (row["bulk_per_s"], row["b1_p50_ms"], row["b1_p99_ms"]) == (1000.0, 2.4, 4.8)
    assert [r["bulk_per_s"] for r in row["rounds"]] == [900.0, 1100.0, 1000.0] and row["b1_calls"] == 200
    assert "rounds" not in _median_row(rounds[:1]) and _median_row(rounds[:1])["bulk_per_s"] == 900.0
    assert _median_row([rounds[0], {"error": ["boom"]}]) == {"error": ["boom"]}
    record = {"commit": "abc", "date": "d", "threads": 2, "split": "test", "pairs": 3, "cpu_flags": ["avx2"], "rounds": 3,
              "systems": {"bouquet-bf16": {**row, "dtype": "bfloat16", "min_cos": 0.99986, "spearman": 0.82047}}}
    table = markdown(record)
    assert "3 rounds, each timing the median (lowest–highest round)" in table
    assert "| bouquet-bf16 | bfloat16 | 1,000 (900–1,100) | 2.40 (2.20–2.60) / 4.80 (4.40–5.20) | 0.99986 | 0.82047 |" in table


def test_rounds_below_one_are_refused(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "bouquet", "bench", "--benchmarks", "cpu", "--system", "bouquet-fp32",
                           "--rounds", "0", "--out", str(tmp_path / "out")], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "--rounds must be at least 1, got 0" in done.stderr, done.stderr[-2000:]
    assert not (tmp_path / "out").exists()
