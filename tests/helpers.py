"""Shared test utilities: real server processes on free ports, the STS Benchmark, references."""
from __future__ import annotations

import atexit
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable, TypeVar

import httpx
import numpy as np

from bouquet.bench.sts import read_sts as _read_sts

REPO = Path(__file__).resolve().parents[1]
T = TypeVar("T")
# Server logs of this test run, in one folder removed when the run ends (a failing test puts the
# log's tail in its message).
LOG_DIR = Path(tempfile.mkdtemp(prefix="bouquet-test-logs-"))
atexit.register(shutil.rmtree, LOG_DIR, True)
# The STS Benchmark travels with the repository (tests/data/stsbenchmark, its LICENSE.txt beside it).
STS_DIR = REPO / "tests" / "data" / "stsbenchmark"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def read_sts(split: str) -> tuple[list[str], list[str], np.ndarray]:
    """STS Benchmark split → (sentences 1, sentences 2, gold scores), from the repository's copy."""
    return _read_sts(STS_DIR, split)


def cosine_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def peak_rss_growth_mib(pid: int, work: Callable[[], T]) -> tuple[T, int]:
    """``work()``'s result and how far process ``pid``'s RSS rose above its level before, at its
    highest while ``work`` ran (MiB, sampled every 20 ms)."""
    page = os.sysconf("SC_PAGE_SIZE")

    def rss() -> int:
        return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * page >> 20

    before, peak, done = rss(), [0], threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], rss())
            time.sleep(0.02)

    watcher = threading.Thread(target=sample)
    watcher.start()
    try:
        out = work()
    finally:
        done.set()
        watcher.join()
    return out, max(0, peak[0] - before)


def grpc_health(address: str) -> bytes:
    """The raw grpc.health.v1 Check answer, or b"" when nothing answers."""
    import grpc

    with grpc.insecure_channel(address) as ch:
        try:
            return ch.unary_unary("/grpc.health.v1.Health/Check")(b"", timeout=10)
        except grpc.RpcError:
            return b""


class GrpcServer:
    """`bouquet server` (one replica, gRPC only) on a free port of 127.0.0.1, started on the CPU
    and ready (grpc.health.v1 SERVING) when the constructor returns; ``stop()`` sends SIGTERM."""

    def __init__(self, *args: str, startup_timeout: float = 180, env: dict[str, str] | None = None) -> None:
        from bouquet.proto.rpc import HEALTH_SERVING

        port = free_port()
        self.address = f"127.0.0.1:{port}"
        self._log = open(LOG_DIR / f"server-{port}.log", "wb")
        self.proc = subprocess.Popen([sys.executable, "-m", "bouquet", "server", "--host", "127.0.0.1", "--port",
                                      str(port), "--device", "cpu", *args], stdout=self._log, stderr=subprocess.STDOUT,
                                     env={**os.environ, **(env or {})})
        deadline = time.monotonic() + startup_timeout
        while grpc_health(self.address) != HEALTH_SERVING:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"bouquet server did not become ready; log: {self._log.name}")
            time.sleep(0.5)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(30)
        self._log.close()


class BouquetProcess:
    """`bouquet serve` as a real child process on free ports; stop() sends SIGTERM."""

    def __init__(self, *args: str, env: dict[str, str] | None = None, startup_timeout: float = 180.0,
                 wait_for: tuple[int, ...] = (200,), device: str = "cpu", new_session: bool = False,
                 preexec_fn: Callable[[], None] | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [sys.executable, "-m", "bouquet", "serve", "--port", str(self.port), "--device", device, *args]
        self.log_path = LOG_DIR / f"serve-{self.port}.log"
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, cwd=REPO,
                                     env={**os.environ, **(env or {})}, start_new_session=new_session,
                                     preexec_fn=preexec_fn)
        self.wait_healthy(startup_timeout, wait_for)

    def wait_healthy(self, timeout: float, wait_for: tuple[int, ...] = (200,)) -> None:
        """Wait until /health answers with a status in ``wait_for`` (503 = up, no replica ready)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"bouquet serve exited with {self.proc.returncode}:\n{self.log()}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code in wait_for:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.stop()
        raise TimeoutError(f"bouquet serve not healthy after {timeout}s:\n{self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-5000:]

    def stop(self, timeout: float = 30.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return self.proc.returncode

    def embed(self, inputs: object, **extra: object) -> httpx.Response:
        return httpx.post(self.url + "/v1/embeddings", json={"input": inputs, **extra}, timeout=120)

    def vectors(self, inputs: object, **extra: object) -> np.ndarray:
        r = self.embed(inputs, **extra)
        assert r.status_code == 200, r.text
        data = r.json()["data"]
        assert [d["index"] for d in data] == list(range(len(data)))
        return np.asarray([d["embedding"] for d in data], dtype=np.float32)


def cross_encoder_reference(model_dir: Path | str, max_length: int) -> Callable[[list[str], list[str]], np.ndarray]:
    """transformers' BertForSequenceClassification logits for (query, doc) pairs, pair-encoded and
    truncated on the document side, as the server does: the reference for rerank / score."""
    import torch
    import transformers as tf

    tok = tf.AutoTokenizer.from_pretrained(model_dir)
    model = tf.BertForSequenceClassification.from_pretrained(model_dir).eval()

    def logits(queries: list[str], docs: list[str]) -> np.ndarray:
        enc = tok(queries, docs, padding=True, truncation="only_second", max_length=max_length, return_tensors="pt")
        with torch.no_grad():
            return model(**enc).logits[:, 0].double().numpy()

    return logits


def graph_counters(url: str) -> dict[str, float]:
    """Sum over replicas of bouquet_replica_graph_{captures,replays} scraped from ``url``/metrics."""
    from prometheus_client.parser import text_string_to_metric_families

    out = {"captures": 0.0, "replays": 0.0}
    seen = set()
    for fam in text_string_to_metric_families(httpx.get(url + "/metrics", timeout=10).text):
        for s in fam.samples:
            for k in out:
                if s.name in (f"bouquet_replica_graph_{k}", f"bouquet_replica_graph_{k}_total"):
                    out[k] += s.value
                    seen.add(k)
    assert seen == set(out), f"/metrics lacks the graph counters: {sorted(seen)}"
    return out
