"""The gateway's per-process state, shared by every route: config, model facts, tokenizer, replicas.

Routes (routes_*.py) and the pipelines under them (pipeline.py, scoring.py, long_inputs.py)
depend on this module and on http.py; nothing here imports a route, so the import graph has no
circle. What it does not own: HTTP (front.py, http.py), validation of request fields (inputs.py).
"""
from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from bouquet.config import ServeConfig
from bouquet.gateway.errors import APIError, bad_request
from bouquet.gateway.inputs import TextInputs, opt_str
from bouquet.gateway.metrics import GatewayMetrics
from bouquet.gateway.replicas import ReplicaPool
from bouquet.modelspec import ModelSpec
from bouquet.proto import bouquet_pb2 as pb
from bouquet.tokenization import Encoded, TextTokenizer, TooLong

# Below this many characters tokenizing inline costs less than a thread hop (~50 µs).
INLINE_TOKENIZE_CHARS = 4096
TOKENIZER_THREADS = 4
PRIORITIES = {"interactive": pb.PRIORITY_INTERACTIVE, "batch": pb.PRIORITY_BATCH, "auto": pb.PRIORITY_AUTO}


@dataclass
class Gateway:
    """Per-process gateway state, built once at start-up and shared by the routes."""

    cfg: ServeConfig
    spec: ModelSpec
    pool: ReplicaPool
    tokenizer: TextTokenizer
    public_id: str
    names: frozenset[str]
    created: int = field(default_factory=lambda: int(time.time()))
    executor: ThreadPoolExecutor = field(default_factory=lambda: ThreadPoolExecutor(TOKENIZER_THREADS, thread_name_prefix="bouquet-tok"))
    metrics: GatewayMetrics = field(default_factory=GatewayMetrics)

    def check_model(self, model: Any) -> None:
        """Raises APIError 400 for a non-string ``model`` and 404 for one this server does not serve."""
        if model is None:
            return
        if not isinstance(model, str):
            raise bad_request(f"'model' must be a string, got {type(model).__name__}", "model", "invalid_type")
        if model not in self.names:
            raise APIError(404, f"The model '{model}' does not exist; this server serves '{self.public_id}'",
                           "model", "model_not_found")

    async def run_tokenizer(self, fn: Any, *args: Any) -> Any:
        """Run a tokenizer call inline when ``args[0]`` is small, else on the tokenizer threads;
        the time taken is recorded in the tokenization histogram."""
        t0 = time.perf_counter()
        try:
            items = args[0] if args and isinstance(args[0], list) else []
            if sum(len(x) if isinstance(x, str) else sum(map(len, x)) for x in items) <= INLINE_TOKENIZE_CHARS:
                return fn(*args)
            return await asyncio.get_running_loop().run_in_executor(self.executor, fn, *args)
        finally:
            self.metrics.tokenize_seconds.observe(time.perf_counter() - t0)

    async def infer(self, seqs: list[np.ndarray], type_ids: list[np.ndarray] | None = None, normalize: bool | None = None,
                    dimensions: int | None = None, priority: int = pb.PRIORITY_AUTO) -> np.ndarray:
        """ReplicaPool.infer, timed into the inference histogram. Returns float32 [B, D]."""
        t0 = time.perf_counter()
        try:
            return await self.pool.infer(seqs, type_ids, normalize, dimensions, priority)
        finally:
            self.metrics.inference_seconds.observe(time.perf_counter() - t0)

    async def tokenize(self, inputs: TextInputs, truncate: bool, side: str, prompt: str | None = None) -> Encoded:
        """Texts or token ids → Encoded. Raises APIError 400 (too long with truncation off, bad ids)."""
        try:
            if inputs.token_ids is not None:
                return self.tokenizer.check_ids(inputs.token_ids, truncate, side)  # type: ignore[arg-type]
            texts = inputs.texts or []
            if prompt:
                texts = [prompt + t for t in texts]
            return await self.run_tokenizer(self.tokenizer.encode, texts, truncate, side)
        except TooLong as e:
            raise bad_request(str(e), "input", "context_length_exceeded") from None
        except ValueError as e:
            raise bad_request(str(e), "input", "invalid_token_id") from None

    def resolve_prompt(self, body: dict[str, Any]) -> str | None:
        """``prompt`` / ``prompt_name`` / the model's default prompt → the text to prepend.
        Raises APIError 400 for both at once or an unknown name."""
        prompt = opt_str(body, "prompt")
        name = opt_str(body, "prompt_name")
        if prompt is not None and name is not None:
            raise bad_request("send either 'prompt' or 'prompt_name', not both", "prompt", "invalid_value")
        if name is not None:
            if name not in self.spec.prompts:
                raise bad_request(f"unknown prompt_name {name!r}; this model defines {sorted(self.spec.prompts)}",
                                  "prompt_name", "invalid_value")
            return self.spec.prompts[name]
        if prompt is None and self.spec.default_prompt_name:
            return self.spec.prompts.get(self.spec.default_prompt_name)
        return prompt
