"""The systems a benchmark talks to, each behind the same two calls.

``embed_ids(seqs)``: pre-tokenized int32 sequences → [B, D] float32 (normalized, as served).
``embed_texts(texts)``: strings → [B, D] float32 (only targets that tokenize: HTTP ones).

- ``GrpcTarget``: a bouquet server replica over gRPC (no gateway).
- ``HttpTarget``: an OpenAI-compatible ``/v1/embeddings`` URL (bouquet's gateway or any other);
  token-id inputs for benchmarks 1–3, text for benchmark 4; base64 replies.
- ``EngineTarget``: bouquet's engine in this process (no server): the floor under (a) and (b).
- ``TransformersTarget``: what users run today: ``transformers`` in bf16 with SDPA, padded
  batches in arrival order, pooled as the model's sentence-transformers config says.

In-process targets serialise calls with a lock (one GPU stream); the engine overlaps the next
launch with the previous wait by holding the lock only around ``step``.
"""
from __future__ import annotations

import base64
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np


def _normalize(x: np.ndarray) -> np.ndarray:
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)


class Target:
    name = "target"
    tokenizes = False
    tolerance = 1e-3  # the correctness check's bar: every row's cosine to transformers ≥ 1 − tolerance

    def embed_ids(self, seqs: list[np.ndarray]) -> np.ndarray:
        raise NotImplementedError

    def embed_texts(self, texts: list[str]) -> np.ndarray:
        raise NotImplementedError(f"{self.name} takes pre-tokenized input only")

    def graph_captures(self) -> int | None:
        """CUDA graphs the system has captured so far (start-up and lazy captures); None where it
        does not say (transformers, other servers)."""
        return None

    def close(self) -> None:
        pass


class EngineTarget(Target):
    """``quantization="fp8"``: the engine's fp8 path; its load-time refusal is off here so that the
    speed is measured whatever the probe cosine, which is recorded as ``fp8_cosine`` (min, mean)
    next to the rows. ``cublas``: none of the engine's Triton GEMMs (as ``serve --no-triton-gemms``)."""

    def __init__(self, model_dir: Path, device: str, eager: bool = False, quantization: str = "none",
                 cublas: bool = False) -> None:
        from bouquet.engine.runtime.engine import Engine, GraphOptions
        from bouquet.modelspec import load_spec

        self.spec = load_spec(str(model_dir))
        self.engine = Engine(self.spec, device, graphs=GraphOptions(enabled=not eager), spin_wait=True,
                             quantization=quantization, fp8_min_cosine=0.0, triton_gemms=not cublas)
        self.engine.warmup()
        self.fp8_cosine = getattr(self.engine, "fp8_cosine", None)
        self.name = "bouquet-engine" + ("-eager" if eager else "") + ("-fp8" if quantization == "fp8" else "") \
            + ("-cublas" if cublas else "")
        self.tolerance = 0.01 if quantization == "fp8" else 1e-3
        self._lock = threading.Lock()

    def embed_ids(self, seqs: list[np.ndarray]) -> np.ndarray:
        from bouquet.engine.runtime.batch import Batch
        from bouquet.engine.heads.pooling import finalize

        batch = Batch.pack(seqs)
        with self._lock:
            handle = self.engine.step(batch)
        return finalize(handle.wait(), self.spec.normalize, None)

    def graph_captures(self) -> int | None:
        return self.engine.graph_captures


class TransformersTarget(Target):
    name = "transformers"

    def __init__(self, model_dir: Path, device: str) -> None:
        import torch
        from transformers import AutoModel

        from bouquet.modelspec import load_spec

        self.spec = load_spec(str(model_dir))
        self.torch, self.device = torch, device
        dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
        try:
            model = AutoModel.from_pretrained(model_dir, dtype=dtype, attn_implementation="sdpa")
        except ValueError:  # architectures without an SDPA path in transformers (MPNet): their eager one
            model = AutoModel.from_pretrained(model_dir, dtype=dtype, attn_implementation="eager")
        self.model = model.to(device).eval()
        self._lock = threading.Lock()

    def embed_ids(self, seqs: list[np.ndarray]) -> np.ndarray:
        torch = self.torch
        L = max(len(s) for s in seqs)
        ids = np.zeros((len(seqs), L), np.int64)
        mask = np.zeros((len(seqs), L), np.int64)
        for i, s in enumerate(seqs):  # right padding, arrival order (a server cannot sort)
            ids[i, :len(s)] = s
            mask[i, :len(s)] = 1
        with self._lock, torch.inference_mode():
            t_ids = torch.from_numpy(ids).to(self.device)
            t_mask = torch.from_numpy(mask).to(self.device)
            h = self.model(input_ids=t_ids, attention_mask=t_mask).last_hidden_state  # [B, L, D]
            if self.spec.pooling == "cls":
                v = h[:, 0]
            elif self.spec.pooling == "last":
                v = h[torch.arange(h.shape[0], device=h.device), t_mask.sum(1) - 1]
            else:
                m = t_mask.unsqueeze(-1).to(h.dtype)
                v = (h * m).sum(1) / m.sum(1)
            out = v.float().cpu().numpy()
        return _normalize(out) if self.spec.normalize else out


class GrpcTarget(Target):
    name = "bouquet-grpc"

    def __init__(self, address: str) -> None:
        import grpc

        from bouquet.proto import bouquet_pb2 as pb
        from bouquet.proto.rpc import CHANNEL_OPTIONS, SERVICE

        self.pb = pb
        self.channel = grpc.insecure_channel(address, options=CHANNEL_OPTIONS)
        self._embed = self.channel.unary_unary(f"/{SERVICE}/Embed", request_serializer=pb.EmbedRequest.SerializeToString,
                                               response_deserializer=pb.EmbedReply.FromString)
        self._info = self.channel.unary_unary(f"/{SERVICE}/Info", request_serializer=pb.InfoRequest.SerializeToString,
                                              response_deserializer=pb.InfoReply.FromString)

    def wait_ready(self, timeout_s: float, alive: Callable[[], None] = lambda: None) -> None:
        """Poll Info until ready; ``alive`` raises when the server process has died."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            alive()
            try:
                if self._info(self.pb.InfoRequest(), timeout=2).ready:
                    return
            except Exception:  # noqa: BLE001 - not up yet
                pass
            time.sleep(0.2)
        raise TimeoutError(f"gRPC server not ready after {timeout_s}s")

    def embed_ids(self, seqs: list[np.ndarray]) -> np.ndarray:
        lengths = np.array([len(s) for s in seqs], "<i4")
        req = self.pb.EmbedRequest(input_ids=np.concatenate(seqs).astype("<i4").tobytes(), lengths=lengths.tobytes())
        rep = self._embed(req, timeout=600)
        return np.frombuffer(rep.output.data, "<f4").reshape(tuple(rep.output.shape))

    def graph_captures(self) -> int | None:
        return int(self._info(self.pb.InfoRequest(), timeout=10).graph_captures)

    def close(self) -> None:
        self.channel.close()


class HttpTarget(Target):
    """``/v1/embeddings`` over keep-alive HTTP/1.1: blocking connections parsed by httptools
    (loadgen.BlockingConnection; one per request in flight, reused across client threads), bodies
    encoded and decoded with orjson. The client's own cost is part of every figure it takes, so it
    is kept small: ``http.client`` costs ~160 µs of client CPU per small request and httpx with the
    stdlib json ~8 ms per request of 100 × 512 token ids."""

    tokenizes = True

    def __init__(self, url: str, model: str | None = None, name: str = "bouquet-http") -> None:
        from urllib.parse import urlsplit

        self.url = url.rstrip("/") + "/v1/embeddings"
        parts = urlsplit(self.url)
        if parts.scheme != "http":
            raise ValueError(f"{url}: only http:// URLs are supported by the benchmark client")
        self._host, self._port = parts.hostname or "127.0.0.1", parts.port or 80
        self._path = parts.path
        self.model, self.name = model, name
        self._idle: list[Any] = []  # keep-alive connections not in use; reused across client threads
        self._conns: list[Any] = []

    def _request(self, method: str, path: str, body: bytes | None = None, timeout: float = 600) -> tuple[int, bytes]:
        """One request on an idle keep-alive connection (a new one when all are busy); the
        connection goes back to the idle list after a complete reply, and is dropped on an error."""
        from bouquet.bench.loadgen import BlockingConnection, get_request, post_request

        try:
            c = self._idle.pop()
        except IndexError:
            c = BlockingConnection(self._host, self._port, timeout)
            self._conns.append(c)
        raw = (post_request(self._host, self._port, path, body) if method == "POST" else
               get_request(self._host, self._port, path))
        try:
            out = c.request(raw, timeout)
        except Exception:
            c.close()
            raise
        self._idle.append(c)  # list.append/pop are atomic: client threads share the list
        return out

    def _post(self, inputs: Any) -> np.ndarray:
        import orjson

        body: dict[str, Any] = {"input": inputs, "encoding_format": "base64"}
        if self.model:
            body["model"] = self.model
        status, raw = self._request("POST", self._path, orjson.dumps(body))
        if status != 200:
            raise RuntimeError(f"POST {self.url} answered {status}: {raw[:300]!r}")
        data = sorted(orjson.loads(raw)["data"], key=lambda d: d["index"])
        return np.stack([np.frombuffer(base64.b64decode(d["embedding"]), "<f4") for d in data])

    def embed_ids(self, seqs: list[np.ndarray]) -> np.ndarray:
        return self._post([s.tolist() for s in seqs])

    def embed_texts(self, texts: list[str]) -> np.ndarray:
        return self._post(texts)

    def graph_captures(self) -> int | None:
        """The sum over replicas (of ``self.model`` when a replica serves it under that name) of the
        gateway's ``bouquet_replica_graph_captures`` counter, read from /metrics (parsed by
        prometheus_client) after waiting out the gateway's replica poll (``REPLICA_POLL_S``), so
        the figure is no older than the call; None when the server exports no such counter or
        /metrics cannot be read (other OpenAI-compatible servers)."""
        from prometheus_client.parser import text_string_to_metric_families

        from bouquet.config import REPLICA_POLL_S

        time.sleep(REPLICA_POLL_S * 1.25)
        try:
            status, raw = self._request("GET", self._path.removesuffix("/v1/embeddings") + "/metrics", timeout=10)
            if status != 200:
                return None
            samples = [s for f in text_string_to_metric_families(raw.decode())
                       if f.name == "bouquet_replica_graph_captures" for s in f.samples if s.name.endswith("_total")]
        except Exception:  # noqa: BLE001 - no bouquet /metrics here: the figure is simply not known
            return None
        mine = [s for s in samples if self.model and s.labels.get("model") == self.model]
        return int(sum(s.value for s in (mine or samples))) if samples else None

    def wait_ready(self, timeout_s: float, alive: Callable[[], None] = lambda: None) -> None:
        """Poll /health until 200; ``alive`` raises when the server process has died."""
        deadline = time.monotonic() + timeout_s
        health = self._path.removesuffix("/v1/embeddings") + "/health"
        while time.monotonic() < deadline:
            alive()
            try:
                if self._request("GET", health, timeout=2)[0] == 200:
                    return
            except Exception:  # noqa: BLE001 - not up yet
                pass
            time.sleep(0.3)
        raise TimeoutError(f"{self.url} not healthy after {timeout_s}s")

    def close(self) -> None:
        for c in self._conns:
            c.close()


class ServerProcess:
    """A bouquet server (``grpc``: one replica, ``http``: gateway + replica) started for the run.

    Raises RuntimeError with the log's tail when it exits before becoming ready."""

    def __init__(self, kind: str, model_dir: Path, device: str, extra_env: dict[str, str] | None = None,
                 gateway_workers: int = 0, engine: str = "torch", replicas_per_gpu: int = 0,
                 quantization: str = "none", serve_args: tuple[str, ...] = ()) -> None:
        from bouquet.config import ServeConfig

        self.tmp = Path(tempfile.mkdtemp(prefix="bouquet-bench-"))
        self.log = open(self.tmp / "server.log", "wb")
        self._started, self._told = time.monotonic(), False
        from bouquet.parent import PARENT_PID_ENV

        # the server dies with this process even when it is SIGKILLed (parent.py); a SIGTERM to the
        # bench stops it through stop() (cli.py turns SIGTERM into SystemExit)
        # The server is the bench's own, on 127.0.0.1: a BOUQUET_API_KEY set for the user's servers
        # would make it refuse the bench's clients, which send no key.
        env = {**{k: v for k, v in os.environ.items() if k != "BOUQUET_API_KEY"}, **(extra_env or {}),
               PARENT_PID_ENV: str(os.getpid())}
        if kind == "grpc":
            cfg = ServeConfig(model=str(model_dir), device=device, engine=engine,  # type: ignore[arg-type]
                              quantization=quantization).validate()  # type: ignore[arg-type]
            port_file = self.tmp / "port"
            cmd = [sys.executable, "-m", "bouquet.server", "--config", cfg.to_json(), "--port-file", str(port_file)]
            self.proc = subprocess.Popen(cmd, env=env, stdout=self.log, stderr=subprocess.STDOUT)
            while not port_file.exists():
                self.check()
                time.sleep(0.05)
            self.address = f"127.0.0.1:{port_file.read_text().strip()}"
        else:
            import socket

            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            cmd = [sys.executable, "-m", "bouquet", "serve", "--model", str(model_dir), "--device", device,
                   "--port", str(port), "--log-level", "warning", "--gateway-workers", str(gateway_workers),
                   "--engine", engine, "--replicas-per-gpu", str(replicas_per_gpu), "--quantization", quantization,
                   "--max-request-bytes", str(256 * 1024 * 1024),  # benchmark 3 sends 100 × 4,096 ids as JSON
                   *serve_args]
            self.proc = subprocess.Popen(cmd, env=env, stdout=self.log, stderr=subprocess.STDOUT)
            self.address = f"http://127.0.0.1:{port}"

    def check(self) -> None:
        """Raise RuntimeError with the server log's tail when the process has exited. Called while
        waiting for it: a server still not ready after 60 s has its log's tail logged once (a start
        that hangs would otherwise show nothing until the wait's end, and the log goes with stop())."""
        if self.proc.poll() is not None:
            raise RuntimeError(f"server exited with code {self.proc.returncode}:\n{self._tail()}")
        if not self._told and time.monotonic() - self._started > 60:
            self._told = True
            logging.getLogger("bouquet.bench").warning("server not ready after 60 s; its log so far:\n%s", self._tail())

    def _tail(self) -> str:
        """The last 3,000 characters of the server's log."""
        self.log.flush()
        return (self.tmp / "server.log").read_text(errors="replace")[-3000:]

    def stop(self) -> None:
        from bouquet.bench.procs import terminate

        terminate(self.proc)
        self.log.close()
        shutil.rmtree(self.tmp, ignore_errors=True)  # its log's tail is in the error when it failed (check)
