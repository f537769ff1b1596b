"""`bouquet bench`'s named suites: the listing, the arguments each kind takes, bad names refused
before anything starts, every tool suite importable with its own parser, and the history and
baseline tables a run writes (bouquet/bench/suites.py, bouquet/bench/history.py)."""
from __future__ import annotations

import csv
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

from bouquet.bench.history import COLUMNS, append_history, compare, history_rows
from bouquet.bench.suites import LOAD_SUITES, TOOL_SUITES


def _bench(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "bouquet", "bench", *args], capture_output=True, text=True, timeout=120)


def test_suites_lists_every_suite_with_its_command() -> None:
    proc = _bench("suites")
    assert proc.returncode == 0, proc.stderr
    for name in LOAD_SUITES:
        assert f"`bouquet bench --suite {name}`" in proc.stdout
    for name in TOOL_SUITES:
        assert f"`bouquet bench {name} --help`" in proc.stdout


def test_unknown_suite_and_system_are_refused_before_anything_runs() -> None:
    proc = _bench("--suite", "nope", "--device", "cpu")
    assert proc.returncode == 2 and "unknown --suite 'nope'" in proc.stderr and "models-check" in proc.stderr
    proc = _bench("--suite", "queries", "--device", "cpu", "--system", "bogus")
    assert proc.returncode == 2 and "--system 'bogus'" in proc.stderr
    proc = _bench("--suite", "writeup", "--device", "cpu", "--baseline", "/nonexistent/results.json")
    assert proc.returncode == 2 and "--baseline" in proc.stderr


def test_a_tool_suite_gets_its_own_arguments() -> None:
    proc = _bench("models-check", "--help")
    assert proc.returncode == 0 and "--tiny" in proc.stdout and "--only" in proc.stdout, proc.stderr
    proc = _bench("models-check", "out.json", "--no-such-flag")
    assert proc.returncode == 2 and "unrecognized arguments: --no-such-flag" in proc.stderr
    # usage and errors name the command as typed (they said `usage: bouquet [-h] ...`)
    proc = _bench("wrk")
    assert proc.returncode == 2 and proc.stderr.startswith("usage: bouquet bench wrk [-h] --url URL"), proc.stderr
    assert "bouquet bench wrk: error: the following arguments are required: --url" in proc.stderr, proc.stderr


@pytest.mark.parametrize("name", sorted(TOOL_SUITES))
def test_every_tool_suite_imports_with_a_main(name: str) -> None:
    pytest.importorskip("torch")
    mod = importlib.import_module(f"bouquet.bench.tools.{TOOL_SUITES[name][0]}")
    assert callable(mod.main)


def _results(commit: str, p50: float, emb_s: float) -> dict:
    rows = [{"bench": "1", "case": "b1 L128", "system": "bouquet-engine", "p50": p50, "p99": p50 * 2, "n": 5},
            {"bench": "3", "case": "b100 L512", "system": "bouquet-engine", "emb_s": emb_s}]
    return {"meta": {"commit": commit, "date": "2026-12-04T10:00:00", "gpu": "NVIDIA H200"},
            "models": {"qwen3-0.6b": {"rows": rows, "checks": {"bouquet-engine": 0.9999}, "errors": {}}}}


def test_history_rows_append_to_one_csv(tmp_path: Path) -> None:
    path = tmp_path / "history.csv"
    append_history(path, history_rows(_results("abc1234", 1.1, 1000.0), "out/a/results.json"))
    append_history(path, history_rows(_results("def5678", 1.0, 1100.0), "out/b/results.json"))
    with path.open() as f:
        got = list(csv.DictReader(f))
    assert list(got[0]) == list(COLUMNS) and len(got) == 2 * 4  # p50, p99, emb_s and the check, per run
    p50 = [r for r in got if r["metric"] == "p50"]
    assert [(r["commit"], r["value"], r["unit"], r["case"]) for r in p50] == [
        ("abc1234", "1.1", "ms", "qwen3-0.6b b1 L128"), ("def5678", "1.0", "ms", "qwen3-0.6b b1 L128")]
    assert {r["device"] for r in got} == {"NVIDIA H200"} and {r["date"] for r in got} == {"2026-12-04"}
    assert b"\r" not in path.read_bytes()  # plain lines, as bench/results/history.csv is kept


def test_compare_sets_each_row_beside_the_baseline() -> None:
    table = compare(_results("new", 1.0, 1100.0), _results("old", 1.25, 1000.0))
    assert "commit old" in table
    assert "| qwen3-0.6b | 1 | b1 L128 | bouquet-engine | p50 | 1.25 | 1.00 | 0.800 |" in table
    assert "| qwen3-0.6b | 3 | b100 L512 | bouquet-engine | emb_s | 1,000.00 | 1,100.00 | 1.100 |" in table
    other = _results("old", 1.0, 1.0)
    other["models"] = {"bge-base": other["models"]["qwen3-0.6b"]}
    assert compare(_results("new", 1.0, 1.0), other) == ""


def test_served_starts_a_real_server_for_the_tool_suites_and_stops_it() -> None:
    """bouquet/bench/served.py: the server the CPU tool suites (cpu-sts, load, soak, gateway-overhead,
    serving-profile) start; the no-op engine answers zero vectors of the model's size."""
    import numpy as np

    from bouquet.bench.served import Served

    srv = Served("--engine", "noop", "--log-level", "warning")
    try:
        vecs = srv.vectors(["a short text", "another one"])
        assert vecs.shape == (2, 384) and vecs.dtype == np.float32 and not vecs.any()
        with pytest.raises(RuntimeError, match="answered 400"):
            srv.vectors([])
    finally:
        srv.stop()
    assert srv.proc.poll() is not None


def test_served_reports_a_server_that_cannot_start() -> None:
    from bouquet.bench.served import Served

    with pytest.raises(RuntimeError, match="did not become healthy"):
        Served("--model", "/nonexistent/model-dir", timeout_s=60)


def test_bench_readme_and_make_bench_cpu_name_the_suites_as_they_are() -> None:
    """bench/README.md's suite table has a row per suite `bouquet bench suites` lists, and only the suite
    the Makefile's `bench-cpu` target runs says "make bench-cpu" (in the listing and in the table)."""
    import re

    repo = Path(__file__).resolve().parents[2]
    readme = (repo / "bench" / "README.md").read_text()
    rows = {cell.strip() for line in readme.splitlines() if line.startswith("| ")
            for cell in line.split("|")[1].split(",")}
    assert not (set(LOAD_SUITES) | set(TOOL_SUITES)) - rows, "suites missing from bench/README.md's table"
    target = re.search(r"^bench-cpu:.*\n\t.*--suite (\S+)", (repo / "Makefile").read_text(), re.M)
    assert target, "the Makefile's bench-cpu target runs no --suite"
    listed = [line for line in _bench("suites").stdout.splitlines() if "make bench-cpu" in line]
    assert [line.split("|")[1].strip() for line in listed] == [target.group(1)]
    in_readme = [line.split("|")[1].strip() for line in readme.splitlines() if "make bench-cpu" in line]
    assert in_readme == [target.group(1)]
