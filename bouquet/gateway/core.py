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
from bouquet.gateway.errors import APIError, bad_request, json_type
from bouquet.gateway.inputs import TextInputs, opt_str
from bouquet.gateway.metrics import GatewayMetrics
from bouquet.gateway.replicas import ReplicaPool
from bouquet.modelspec import ModelSpec
from bouquet.proto import bouquet_pb2 as pb
from bouquet.tokenization import BadTokenId, Encoded, TextTokenizer, TooLong, resolve_prompt

# Below this many characters tokenizing inline costs less than a thread hop (~50 µs).
INLINE_TOKENIZE_CHARS = 4096
TOKENIZER_THREADS = 4  # per gateway process when the config leaves it open (a gateway built without `serve`)
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
            raise bad_request(f"'model' must be a string, got {json_type(model)}", "model", "invalid_type")
        if model not in self.names:
            aliases = sorted(self.names - {self.public_id})
            also = f" (also named {', '.join(repr(a) for a in aliases)})" if aliases else ""
            raise APIError(404, f"The model '{model}' does not exist; this server serves '{self.public_id}'{also}",
                           "model", "model_not_found")

    async def run_tokenizer(self, fn: Any, *args: Any) -> Any:
        """Run a tokenizer call inline when ``args[0]`` is small (texts, pairs of texts or token-id
        lists: characters or ids in all), else on the tokenizer threads; the time taken is recorded
        in the tokenization histogram."""
        t0 = time.perf_counter()
        try:
            items = args[0] if args and isinstance(args[0], list) else []
            if sum(map(_size, items)) <= INLINE_TOKENIZE_CHARS:
                return fn(*args)
            return await asyncio.get_running_loop().run_in_executor(self.executor, fn, *args)
        finally:
            self.metrics.tokenize_seconds.observe(time.perf_counter() - t0)

    async def infer(self, seqs: list[np.ndarray], type_ids: list[np.ndarray] | None = None, normalize: bool | None = None,
                    dimensions: int | None = None, priority: int = pb.PRIORITY_AUTO, pool_skip: int = 0) -> np.ndarray:
        """ReplicaPool.infer, timed into the inference histogram. Returns float32 [B, D].
        ``pool_skip``: leading tokens of every sequence left out of pooling (``TextTokenizer.prompt_skip``).

        Identical sequences (same ids and token types) run once and share their row: equal inputs
        get bit-identical outputs wherever they sit in the request (rerank ties keep input order),
        which a batched forward does not promise (~1e-8 apart by position)."""
        t0 = time.perf_counter()
        try:
            unique, where = _dedupe(seqs, type_ids)
            if unique is None:
                return await self.pool.infer(seqs, type_ids, normalize, dimensions, priority, pool_skip)
            u_types = None if type_ids is None else [type_ids[i] for i in unique]
            rows = await self.pool.infer([seqs[i] for i in unique], u_types, normalize, dimensions, priority, pool_skip)
            return rows[where]
        finally:
            self.metrics.inference_seconds.observe(time.perf_counter() - t0)

    async def infer_tokens(self, seqs: list[np.ndarray], priority: int = pb.PRIORITY_AUTO) -> np.ndarray:
        """ReplicaPool.infer_tokens (the model's token outputs, float32 [T, D'], sequences back to
        back), timed into the inference histogram."""
        t0 = time.perf_counter()
        try:
            return await self.pool.infer_tokens(seqs, priority)
        finally:
            self.metrics.inference_seconds.observe(time.perf_counter() - t0)

    async def tokenize(self, inputs: TextInputs, truncate: bool, side: str, prompt: str | None = None,
                       param: str = "input") -> Encoded:
        """Texts or token ids → Encoded. Raises APIError 400 (too long with truncation off, bad ids)
        naming ``param[i]``, the input at fault (``param`` alone for a request of one bare item)."""
        try:
            if inputs.token_ids is not None:
                return self.tokenizer.check_ids(inputs.token_ids, truncate, side)  # type: ignore[arg-type]
            texts = inputs.texts or []
            if prompt:
                texts = [prompt + t for t in texts]
            return await self.run_tokenizer(self.tokenizer.encode, texts, truncate, side)
        except TooLong as e:
            where = item_param(param, inputs, e.index)
            raise bad_request(f"{where} {e.detail}", where, "context_length_exceeded") from None
        except BadTokenId as e:
            where = item_param(param, inputs, e.index)
            raise bad_request(f"{where} {e.detail}", where, "invalid_token_id") from None

    def resolve_prompt(self, body: dict[str, Any], inputs: TextInputs | None = None) -> str | None:
        """``prompt`` / ``prompt_name`` / the model's default prompt → the text to prepend to texts
        (None for token-id input: ids are embedded as given). Raises APIError 400 for both at once,
        an unknown name, or either one sent with token-id input (it cannot apply to ids)."""
        prompt, name = opt_str(body, "prompt"), opt_str(body, "prompt_name")
        if inputs is not None and inputs.token_ids is not None:
            if prompt is not None or name is not None:
                field = "prompt" if prompt is not None else "prompt_name"
                raise bad_request(f"'{field}' applies to text input only; this request sends token ids "
                                  "(prepend the prompt's ids yourself)", field, "invalid_value")
            return None
        try:
            return resolve_prompt(self.spec, prompt, name) or None
        except ValueError as e:
            raise bad_request(str(e), "prompt", "invalid_value") from None
        except KeyError as e:
            raise bad_request(str(e.args[0]), "prompt_name", "invalid_value") from None


def tokenizer_threads(cfg: ServeConfig) -> int:
    """Tokenizer threads of one gateway process: the layout's (``serve`` resolves it) or TOKENIZER_THREADS."""
    return cfg.tokenizer_threads or TOKENIZER_THREADS


def _size(item: Any) -> int:
    """Characters of a text or of a pair of texts; ids of a token-id list."""
    if isinstance(item, str) or (len(item) and not isinstance(item[0], str)):
        return len(item)
    return sum(map(len, item))


def item_param(param: str, inputs: TextInputs, index: int) -> str:
    """``param[index]`` for a list of inputs, ``param`` for a request of one bare item."""
    return param if inputs.single else f"{param}[{index}]"


def _dedupe(seqs: list[np.ndarray], type_ids: list[np.ndarray] | None) -> tuple[list[int] | None, np.ndarray]:
    """(indices of the first occurrence of each distinct sequence, row of each input among them);
    (None, _) when all are distinct."""
    if len(seqs) < 2:
        return None, np.empty(0, dtype=np.int64)
    first: dict[bytes, int] = {}
    where = np.empty(len(seqs), dtype=np.int64)
    unique: list[int] = []
    for i, s in enumerate(seqs):
        key = s.tobytes() if type_ids is None else s.tobytes() + b"|" + type_ids[i].tobytes()
        k = first.get(key)
        if k is None:
            k = first[key] = len(unique)
            unique.append(i)
        where[i] = k
    return (None, where) if len(unique) == len(seqs) else (unique, where)
