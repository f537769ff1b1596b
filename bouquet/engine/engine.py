"""The engine: one model on one device, stepping packed batches.

``Engine.step(batch)`` returns a ``PendingResult`` at once. On CUDA the forward pass, pooling, the
head and an asynchronous device→host copy into pinned memory are enqueued and a CUDA event is
recorded; ``wait()`` blocks only the calling (helper) thread. On the CPU the work runs inside
``step`` and the handle is already complete.

What the engine does not own: request bookkeeping, batching policy (server/scheduler.py),
tokenization (gateway), per-request normalization/truncation (pooling.finalize, in the server).
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import numpy as np
import torch

from bouquet.engine.attention import AttentionBackend, select_backend
from bouquet.engine.batch import Batch
from bouquet.engine.pooling import pool
from bouquet.engine.registry import model_class
from bouquet.engine.weights import assign_weights, load_safetensors
from bouquet.modelspec import ModelSpec

log = logging.getLogger(__name__)

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def resolve_device(device: str) -> torch.device:
    """'auto' → cuda when available, else cpu. Raises ValueError when cuda is asked but absent."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError("--device cuda was requested but torch sees no CUDA device")
    return torch.device(device)


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """'auto' → bfloat16 on CUDA, float32 on CPU."""
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if dtype not in _DTYPES:
        raise ValueError(f"dtype must be one of {sorted(_DTYPES)} or auto, got {dtype!r}")
    return _DTYPES[dtype]


class PendingResult:
    """A batch's output rows, [B, out_dim] float32, available after ``wait()`` (blocking, no GIL
    held while the CUDA event is pending)."""

    def __init__(self, host: np.ndarray, event: "torch.cuda.Event | None" = None, keepalive: object = None) -> None:
        self._host = host
        self._event = event
        self._keepalive = keepalive  # pinned buffer (and inputs) that must outlive the copy

    def ready(self) -> bool:
        return self._event is None or self._event.query()

    def wait(self) -> np.ndarray:
        if self._event is not None:
            self._event.synchronize()
            self._event = None
        return self._host


@dataclass(frozen=True)
class EngineInfo:
    device: str
    dtype: str
    attention: str
    out_dim: int
    load_seconds: float


class Engine:
    """One model on one device. Raises WeightError/UnsupportedArchitecture/ValueError at
    construction on a bad model.

    ``state``: an in-memory checkpoint (Hugging Face names, tensors on any device) used instead
    of reading ``spec.path``; see ``from_state_dict``.
    """

    def __init__(self, spec: ModelSpec, device: str = "auto", dtype: str = "auto", attention: str | None = None,
                 state: dict[str, torch.Tensor] | None = None) -> None:
        t0 = time.perf_counter()
        self.spec = spec
        self.device = resolve_device(device)
        self.dtype = resolve_dtype(dtype, self.device)
        self.attn: AttentionBackend = select_backend(self.device, self.dtype, attention)
        cls = model_class(spec.architecture, spec.task)
        extra = {"yes_no_ids": spec.yes_no_ids} if spec.yes_no_ids is not None else {}
        with torch.device("meta"):
            model = cls(spec.config, self.attn, **extra)
        if state is None:
            state = load_safetensors(spec.path)
        # Instance attributes: what a model skips can depend on its config (tied embeddings).
        self.loaded = assign_weights(model, state, model.IGNORED_KEYS, model.PREFIXES)
        model = model.to(device=self.device, dtype=self.dtype).eval()
        model.fuse()
        self.model = model
        self.causal = bool(model.causal)
        self.out_dim = spec.dimension
        self.info = EngineInfo(str(self.device), str(self.dtype).removeprefix("torch."), self.attn.name,
                               self.out_dim, time.perf_counter() - t0)
        log.info("engine: %s on %s (%s), %d tensors loaded in %.2fs", spec.architecture, self.device,
                 self.info.dtype, len(self.loaded), self.info.load_seconds)

    @classmethod
    def from_state_dict(cls, spec: ModelSpec, state: dict[str, torch.Tensor], device: str = "auto",
                        dtype: str = "auto", attention: str | None = None) -> "Engine":
        """Build from tensors already in memory (e.g. a transformers model's ``state_dict()`` on
        the GPU: no disk round trip). Tensors already on ``device`` in ``dtype`` are used without
        a copy. Same checks and errors as loading from disk."""
        return cls(spec, device, dtype, attention, state=state)

    @torch.inference_mode()
    def forward(self, batch: Batch) -> torch.Tensor:
        """Eager forward of a packed batch → [B, out_dim] float32 on the engine's device."""
        dev = self.device
        ids = torch.from_numpy(batch.input_ids).to(dev, non_blocking=True).long()
        pos = torch.from_numpy(batch.position_ids).to(dev, non_blocking=True).long()
        tt = None
        if batch.token_type_ids is not None:
            tt = torch.from_numpy(batch.token_type_ids).to(dev, non_blocking=True).long()
        cu = torch.from_numpy(batch.cu_seqlens).to(dev, non_blocking=True)
        meta = self.attn.prepare(cu, batch.max_seqlen, self.causal)
        hidden = self.model(ids, pos, tt, meta)  # [T, hidden]
        return self.model.head(pool(hidden, cu, self.spec.pooling)).float()

    def step(self, batch: Batch) -> PendingResult:
        out = self.forward(batch)
        if self.device.type != "cuda":
            return PendingResult(out.numpy())
        host = torch.empty(out.shape, dtype=torch.float32, pin_memory=True)
        host.copy_(out, non_blocking=True)
        ev = torch.cuda.Event(blocking=True)
        ev.record()
        return PendingResult(host.numpy(), ev, keepalive=(host, out))

    def warmup(self) -> None:
        """One small batch through the whole path, so /health turns green only on a working model."""
        n = min(8, self.spec.max_seq_length)
        ids = np.full(n, min(100, self.spec.vocab_size - 1), dtype=np.int32)
        rows = self.step(Batch.pack([ids, ids[:1]])).wait()
        if not np.isfinite(rows).all():
            raise RuntimeError("warm-up produced non-finite outputs; check --dtype and the weights")
