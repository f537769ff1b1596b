"""`bouquet bench` end to end on the CPU at tiny sizes: servers start, outputs are checked against
transformers, and the table and a plot are written."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("matplotlib")
pytest.importorskip("transformers")
# The benchmark tool, not the server: servers and the transformers baseline start per test.
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def models_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One folder of random-weight models for the module's bench runs (``--models-root``): each
    run builds its models with transformers unless they are there (~3 s per run)."""
    return tmp_path_factory.mktemp("bench-models")


def test_bench_smoke_writes_table_and_plot(tmp_path: Path, models_root: Path) -> None:
    cmd = [sys.executable, "-m", "bouquet", "bench", "--model", "minilm", "--tiny", "--device", "cpu", "--models-root", str(models_root),
           "--system", "engine", "--system", "replica", "--system", "grpc", "--system", "transformers", "--out", str(tmp_path),
           "--benchmarks", "1,2,3,mixed", "--seconds", "0.1", "--min-iters", "2", "--lat-lengths", "16,32",
           "--thr-lengths", "32", "--score-batches", "2", "--score-len", "32", "--thr-batch", "4",
           "--mixed-range", "8,32", "--warmup", "1", "--warmup-seconds", "0.1"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    res = json.loads((tmp_path / "results.json").read_text())
    m = res["models"]["minilm-tiny"]
    assert not m["errors"]
    assert set(m["checks"]) == {"bouquet-engine", "bouquet-replica", "bouquet-grpc", "transformers"}
    systems = {r["system"] for r in m["rows"]}
    assert systems == {"bouquet-engine", "bouquet-replica", "bouquet-grpc", "transformers"}
    assert {r["bench"] for r in m["rows"]} == {"1", "2", "3", "3-mixed"}
    assert all(r["roofline_frac"] > 0 for r in m["rows"])
    md = (tmp_path / "results.md").read_text()
    assert "| b1 L16 |" in md and "bouquet-grpc" in md
    assert "throughput, batch 4, 4 clients" in md and "scoring latency, 32 tokens" in md  # this run's sizes
    assert (tmp_path / "bench-minilm-tiny.png").stat().st_size > 1000


def test_bench_results_without_matplotlib_skip_only_the_plots(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """matplotlib is in the ``bench`` extra, not in the serving install: the numbers still land."""
    from bouquet.bench.report import write_all

    results = {"meta": {"matmul_tflops": 1.0, "settings": {}}, "models": {"m": {"rows": [], "checks": {}, "errors": {}}}}
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib → ImportError
    files = write_all(results, tmp_path)
    assert [f.name for f in files] == ["results.json", "results.md"] and (tmp_path / "results.md").exists()
    assert not list(tmp_path.glob("*.png"))


def test_bench_http_text_path_smoke(tmp_path: Path, models_root: Path) -> None:
    """The HTTP system (`bouquet serve` started by the bench, keep-alive http.client + orjson
    client): ids checked against transformers, benchmark 3 over HTTP, benchmark 4 with text."""
    cmd = [sys.executable, "-m", "bouquet", "bench", "--model", "minilm", "--tiny", "--device", "cpu", "--models-root", str(models_root),
           "--system", "http", "--out", str(tmp_path), "--benchmarks", "3,4", "--seconds", "0.2",
           "--min-iters", "2", "--thr-lengths", "32", "--thr-batch", "4", "--concurrency", "1,2",
           "--conc-len", "32", "--warmup-seconds", "0.1"]
    # a key set for the user's own servers does not reach the server the bench starts for itself
    env = {**os.environ, "BOUQUET_API_KEY": "users-own-key"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    m = json.loads((tmp_path / "results.json").read_text())["models"]["minilm-tiny"]
    assert not m["errors"]
    assert m["checks"]["bouquet-http"] > 0.999 and m["checks"]["bouquet-http-text"] > 0.999
    rows = {(r["bench"], r["case"]): r for r in m["rows"]}
    assert rows[("3", "b4 L32")]["emb_s"] > 0
    assert {c for b, c in rows if b == "4"} == {"c1 L32", "c2 L32"}
    assert all(r["n"] >= 2 and r["req_s"] > 0 for (b, _), r in rows.items() if b == "4")
    # the server's capture counter read from /metrics around each timed window (no graphs on the CPU)
    assert all(r["captures_in_window"] == 0 for (b, _), r in rows.items() if b == "4")


def test_bench_queries_smoke(tmp_path: Path, models_root: Path) -> None:
    """Benchmark 5 (online queries) on bouquet with the model and with the no-op engine: client
    processes, replies checked (cosine against transformers; zero vectors for no-op), rows written.
    Windows of 1.5 s: with 0.5 s a 2-core machine under other load once answered no request in one."""
    cmd = [sys.executable, "-m", "bouquet", "bench", "--model", "minilm", "--tiny", "--device", "cpu", "--models-root", str(models_root),
           "--system", "http", "--system", "http-noop", "--out", str(tmp_path), "--benchmarks", "5",
           "--seconds", "1.5", "--warmup-seconds", "0.5", "--query-clients", "1,3", "--query-tokens", "8,24"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    m = json.loads((tmp_path / "results.json").read_text())["models"]["minilm-tiny"]
    assert not m["errors"]
    rows = {(r["system"], r["case"]): r for r in m["rows"]}
    assert set(rows) == {(s, c) for s in ("bouquet-http", "bouquet-http-noop") for c in ("c1", "c3")}
    for (system, _), r in rows.items():
        assert r["req_s"] > 0 and r["statuses"] == {"200": r["n"]} and not r["errors"], r
        assert r["p50"] <= r["p99"]
        if system == "bouquet-http":
            assert r["min_cosine"] > 0.999 and r["checked"] >= 1
        else:
            assert r["zero_vectors_ok"] == 1.0
    assert "Benchmark 5" in (tmp_path / "results.md").read_text()


def test_gateway_tokens_bench_smoke(tmp_path: Path) -> None:
    """`bouquet bench gateway-tokens` (issue #4 (b), run on the H200) works end to end before it
    spends device time: serve, client processes, replies checked, engine-only pass, JSON out."""
    out = tmp_path / "g.json"
    cmd = [sys.executable, "-m", "bouquet", "bench", "gateway-tokens", str(out), "--tiny", "--device", "cpu", "--clients", "3", "--batch", "4",
           "--seconds", "1", "--warmup", "0.5", "--engine-tokens", "3000", "--work-dir", str(tmp_path / "w")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    res = json.loads(out.read_text())
    assert res["requests"] > 0 and res["gateway_tokens_per_s"] > 0 and res["engine_tokens_per_s"] > 0
    assert res["gateway_over_engine"] > 0 and res["texts_per_request"] == 4


def _cmdline(p: "psutil.Process") -> list[str]:  # noqa: F821 - psutil is imported by the test
    """A child's command line, or [] when it exited between the listing and the read (CI: a
    short-lived child of the bench raised NoSuchProcess here)."""
    import psutil

    try:
        return p.cmdline()
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return []


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGKILL"])
def test_stopping_bench_stops_the_servers_it_started(tmp_path: Path, models_root: Path, sig: str) -> None:
    """A SIGTERM to `bouquet bench` alone (a job runner's stop) ends the run and the `bouquet serve`
    it started (gateway and replica) with it, and removes the server's work folder; after a SIGKILL
    the server still goes (it dies with its parent, parent.py), leaving only the bench's log folder."""
    import os
    import shutil
    import signal
    import tempfile
    import threading
    import time

    import psutil

    before = set(Path(tempfile.gettempdir()).glob("bouquet-bench-*"))
    cmd = [sys.executable, "-m", "bouquet", "bench", "--model", "minilm", "--tiny", "--device", "cpu", "--models-root", str(models_root),
           "--system", "http", "--out", str(tmp_path), "--benchmarks", "3", "--seconds", "120",
           "--thr-lengths", "32", "--thr-batch", "4"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    log: list[str] = []
    reader = threading.Thread(target=lambda: log.extend(proc.stderr), daemon=True)  # type: ignore[arg-type]
    reader.start()
    try:
        bench = psutil.Process(proc.pid)
        deadline = time.monotonic() + 120
        servers: list[psutil.Process] = []
        while time.monotonic() < deadline and proc.poll() is None:  # until the run's checks are done
            servers = [c for c in bench.children(recursive=True) if "serve" in _cmdline(c)]
            if servers and servers[0].children(recursive=True) and any("checking against" in line for line in log):
                break
            time.sleep(0.2)
        assert servers and proc.poll() is None, "the bench did not start its server"
        family = [servers[0], *servers[0].children(recursive=True)]
        time.sleep(1.5)  # inside benchmark 3: its client threads are sending
        signum = getattr(signal, sig)
        os.kill(proc.pid, signum)
        assert proc.wait(60) in (128 + signum, -signum)
        reader.join(10)
        assert sig == "SIGKILL" or not any("Traceback" in line for line in log), "".join(log)[-3000:]
        gone, alive = psutil.wait_procs(family, timeout=45)
        assert not alive, [_cmdline(p) for p in alive]
        left = set(Path(tempfile.gettempdir()).glob("bouquet-bench-*")) - before
        if sig == "SIGTERM":
            assert not left
        for d in left:  # SIGKILL: the bench could not remove its own log folder
            shutil.rmtree(d, ignore_errors=True)
    finally:
        if proc.poll() is None:
            proc.kill()


@pytest.mark.parametrize("benchmarks", [("1",), ("2",), ("1", "2")])
def test_latency_benchmarks_run_only_the_cases_asked_for(tmp_path: Path, benchmarks: tuple[str, ...]) -> None:
    """`--benchmarks 1` ran benchmark 2's scoring batches too and dropped their rows afterwards
    (minutes of a CPU run; fresh-clone trial): only the asked-for cases now reach the engine."""
    import numpy as np

    from bouquet.bench import run as R
    from bouquet.bench.models import TINY_BERT, make_model_dir
    from bouquet.bench.targets import EngineTarget

    target = EngineTarget(make_model_dir(TINY_BERT, tmp_path), "cpu")
    sizes: list[int] = []
    real = target.embed_ids
    target.embed_ids = lambda seqs: sizes.append(len(seqs)) or real(seqs)  # type: ignore[method-assign]
    s = R.Settings(lat_lengths=(16,), score_batches=(3,), score_len=16, seconds=0.0, min_iters=1, warmup=0)
    rows = R.bench_latency(target, TINY_BERT, s, 1e12, np.random.default_rng(0), benchmarks)
    assert {r["bench"] for r in rows} == set(benchmarks)
    assert set(sizes) == {n for b, n in (("1", 1), ("2", 3)) if b in benchmarks}  # batch 1 / the 3-pair batch


def test_concurrency_warm_up_lasts_until_no_new_graph_is_captured(tmp_path: Path) -> None:
    """Benchmark 4 repeats its untimed window while the system still captures CUDA graphs (on a GPU
    the first shapes' captures made 16 clients' p99 4–10× their p50: bench/results/history.csv, 2026-12-02),
    and records the captures of the warm-up and of the timed window apart. A CPU engine captures
    none, so its graph counter is stepped by hand: +1 per request for the first 12 requests."""
    import numpy as np

    from bouquet.bench import run as R
    from bouquet.bench.models import TINY_BERT, make_model_dir
    from bouquet.bench.targets import EngineTarget

    target = EngineTarget(make_model_dir(TINY_BERT, tmp_path), "cpu")
    ids = np.arange(1000, 1016, dtype=np.int32)
    calls: list[int] = []
    target.embed_texts = lambda texts: calls.append(1) or target.embed_ids([ids])  # type: ignore[method-assign]
    target.graph_captures = lambda: min(len(calls), 12)  # type: ignore[method-assign]
    windows: list[float] = []
    real_window = R._window
    try:
        R._window = lambda n, work, seconds: windows.append(seconds) or real_window(n, work, seconds)  # type: ignore[assignment]
        s = R.Settings(concurrency=(1,), seconds=0.05, min_iters=12, warmup_s=0.01)
        (row,) = R.bench_concurrency(target, TINY_BERT, s, 1e12, ["a text", "another"])
    finally:
        R._window = real_window  # type: ignore[assignment]
    assert row["warmup_captures"] == 12 - 2 and row["captures_in_window"] == 0  # 2 requests before the warm-up
    assert windows[:2] == [0.01, 0.01] and windows[-1] == 0.05  # a second warm-up window saw no capture
    assert 3 <= len(windows) <= R.WARMUP_WINDOWS + 1


def test_bench_rerank_smoke(tmp_path: Path, models_root: Path) -> None:
    """The rerank benchmark on bouquet (a cross-encoder of the shape built by the bench), on the
    no-op engine, and on a server given by URL (here a bouquet of its own): rows per (N, clients)."""
    from bouquet.bench.models import SHAPES, default_tokenizer, tiny
    from bouquet.bench.rerank import cross_model_dir
    from helpers import BouquetProcess

    # the bench's own cross-encoder, built first so that the "other server" can serve it too
    cross = cross_model_dir(tiny(SHAPES["minilm"]), models_root, default_tokenizer())
    other = BouquetProcess("--model", str(cross), "--served-model-name", "other")
    try:
        cmd = [sys.executable, "-m", "bouquet", "bench", "--model", "minilm", "--tiny", "--device", "cpu", "--models-root", str(models_root),
               "--system", "http", "--system", "http-noop", "--system", "rerank-url", "--rerank-url", other.url,
               "--rerank-model", "other", "--out", str(tmp_path / "out"), "--benchmarks", "rerank", "--seconds", "0.3",
               "--warmup-seconds", "0.1", "--rerank-docs", "3,7", "--rerank-doc-tokens", "20", "--rerank-clients", "1,2"]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    finally:
        other.stop()
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    m = json.loads((tmp_path / "out" / "results.json").read_text())["models"]["minilm-tiny"]
    assert not m["errors"], m["errors"]
    rows = {(r["system"], r["docs"], r["clients"]): r for r in m["rows"]}
    assert set(rows) == {(s, n, c) for s in ("bouquet-http", "bouquet-http-noop", "rerank-url") for n in (3, 7) for c in (1, 2)}
    for r in rows.values():
        assert r["bench"] == "rerank" and r["requests"] >= 1 and 0 < r["p50"] <= r["p99"], r
        assert r["pairs_s"] > 0
    assert (models_root / "minilm-tiny-cross" / "model.safetensors").exists()
    assert "Rerank: one query against N documents" in (tmp_path / "out" / "results.md").read_text()
