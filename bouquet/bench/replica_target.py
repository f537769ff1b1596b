"""``ReplicaTarget``: the engine as one `bouquet serve` replica drives it, in this process.

``EngineTarget`` packs a whole request into one ``Engine.step``: benchmark 3's 100 × 512 tokens is one
eager 51,200-token forward, a step no served request ever runs (the replica steps at most
``batch_token_budget`` tokens, 16,384 on a GPU, and keeps two steps in flight, which then replay CUDA
graphs). This target runs the replica's own code instead: ``server.service.InferenceService`` (the
scheduler, the token budget, the depth-2 engine loop, ``output``'s pooling finalization) on an asyncio
loop in a thread of its own, with the engine ``server.main.build_engine`` builds from a ``ServeConfig``.
What it leaves out is only the transport (gRPC / the Unix socket) and the gateway (HTTP, tokenization):
the gap between this and the ``grpc`` / ``http`` systems is their cost.
"""
from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import numpy as np

from bouquet.bench.targets import Target


class ReplicaTarget(Target):
    """``max_batch_tokens``: the step budget, as `serve --max-batch-tokens` (0: the server's default).
    ``quantization="fp8"``: the served fp8 path, load-time accuracy check included (a model that
    fails it raises here, as `bouquet serve` refuses it). Calls from several threads are the
    replica's concurrent requests: their sequences share steps as the scheduler packs them.

    Raises what ``build_engine`` / ``Engine.warmup`` raise (a bad model directory, fp8 refused)."""

    def __init__(self, model_dir: Path, device: str, quantization: str = "none", max_batch_tokens: int = 0) -> None:
        from bouquet.config import ServeConfig, batch_token_budget
        from bouquet.engine.runtime.engine import resolve_device
        from bouquet.modelspec import load_spec
        from bouquet.server.main import build_engine
        from bouquet.server.service import InferenceService

        self.cfg = ServeConfig(model=str(model_dir), device=device, quantization=quantization,  # type: ignore[arg-type]
                               max_batch_tokens=max_batch_tokens)
        self.spec = load_spec(str(model_dir))
        dev = resolve_device(device)
        self.engine = build_engine(self.cfg, self.spec, device)
        self.engine.warmup()
        self.fp8_cosine = getattr(self.engine, "fp8_cosine", None)
        self.name = "bouquet-replica" + ("-fp8" if quantization == "fp8" else "")
        self.tolerance = 0.01 if quantization == "fp8" else 1e-3
        self.loop = asyncio.new_event_loop()
        started = threading.Event()

        def run_loop() -> None:
            asyncio.set_event_loop(self.loop)
            # made on the loop: its asyncio.Event belongs to this loop
            self.service = InferenceService(self.cfg, self.spec, batch_token_budget(self.cfg.max_batch_tokens, dev.type),
                                            depth=2 if dev.type == "cuda" else 1)
            self._task = self.loop.create_task(self.service.run())
            self.service.attach(self.engine)
            started.set()
            self.loop.run_forever()

        self._thread = threading.Thread(target=run_loop, name="bench-replica", daemon=True)
        self._thread.start()
        started.wait()

    async def _embed(self, seqs: list[np.ndarray]) -> np.ndarray:
        from bouquet.proto import bouquet_pb2 as pb

        fut: asyncio.Future[None] = self.loop.create_future()
        req = self.service.submit(seqs, None, pb.PRIORITY_AUTO, on_done=lambda r: fut.set_result(None))
        await fut
        if req.error is not None:
            raise RuntimeError(f"replica: {req.error}")
        return self.service.output(req, None, None)

    def embed_ids(self, seqs: list[np.ndarray]) -> np.ndarray:
        return asyncio.run_coroutine_threadsafe(self._embed(seqs), self.loop).result()

    def graph_captures(self) -> int | None:
        return self.engine.graph_captures

    def close(self) -> None:
        async def stop() -> None:
            self._task.cancel()

        asyncio.run_coroutine_threadsafe(stop(), self.loop).result()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)
        self.engine.shutdown()
