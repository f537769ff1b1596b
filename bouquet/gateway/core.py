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
from typing import Any, Callable, TypeVar

import numpy as np

from bouquet.config import ServeConfig
from bouquet.gateway.errors import APIError, bad_request, cut, json_type
from bouquet.gateway.inputs import TextInputs, opt_str
from bouquet.gateway.metrics import GatewayMetrics
from bouquet.gateway.replicas import ReplicaPool
from bouquet.modelspec import ModelSpec, resolve_prompt
from bouquet.proto import bouquet_pb2 as pb
from bouquet.text_window import PROBED_CHARS
from bouquet.tokenization import TextTokenizer
from bouquet.tokenized import BadTokenId, Encoded, NoRoom, TooLong

# Below this many characters tokenizing inline costs less than a thread hop (~50 µs); above it the
# tokenizer (which releases the GIL) runs beside the event loop (docs/decisions.md, 2026-12-04).
INLINE_TOKENIZE_CHARS = 512
# A batch of more characters than this is split into contiguous shards, one per tokenizer thread at
# most, tokenized side by side (run_sharded): ~3,000 tokens, a few ms of one core's work.
SHARD_CHARS = 16_384
TOKENIZER_THREADS = 4  # per gateway process when the config leaves it open (a gateway built without `serve`)
T = TypeVar("T")
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
            raise APIError(404, f"The model '{cut(model)}' does not exist; this server serves '{self.public_id}'{also}",
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

    async def run_sharded(self, fn: Callable[..., T], items: list[Any], *args: Any) -> list[T]:
        """``fn(items[a:b], a, *args)`` over contiguous shards of ``items`` (texts or pairs of texts)
        of about SHARD_CHARS characters, at most one per tokenizer thread, run at once on those
        threads (``a``, the shard's first index, lets ``fn`` name an item at fault); returns the
        results in shard order. One call (``run_tokenizer``) when one shard holds all, and under a
        single gateway worker whose Rust tokenizer spreads a batch over the cores itself (not
        tiktoken's: ``TextTokenizer.spreads_batches``). When shards
        raise, the first shard's exception is raised (the lowest item at fault, as one call would).

        Why: under several gateway workers the Rust tokenizer runs each batch on one core
        (TOKENIZERS_PARALLELISM=false, launcher.py), so a 100-document rerank would tokenize on
        one core while the worker's other tokenizer threads idle; the calls release the GIL."""
        threads = tokenizer_threads(self.cfg) if self.cfg.gateway_workers > 1 or not self.tokenizer.spreads_batches else 1
        sizes = list(map(_size, items)) if threads > 1 and len(items) > 1 else []
        total = sum(sizes)
        shards = max(1, min(threads, len(items), -(-total // SHARD_CHARS)))
        if shards == 1:
            return [await self.run_tokenizer(fn, items, 0, *args)]
        bounds, acc, start = [], 0, 0
        for i, n in enumerate(sizes):  # cut where the running size passes each shard's share
            acc += n
            if len(bounds) < shards - 1 and acc * shards >= total * (len(bounds) + 1) and i + 1 < len(items):
                bounds.append((start, i + 1))
                start = i + 1
        bounds.append((start, len(items)))
        t0 = time.perf_counter()
        try:
            loop = asyncio.get_running_loop()
            results = await asyncio.gather(*(loop.run_in_executor(self.executor, fn, items[a:b], a, *args)
                                             for a, b in bounds), return_exceptions=True)
        finally:
            self.metrics.tokenize_seconds.observe(time.perf_counter() - t0)
        for r in results:
            if isinstance(r, BaseException):
                raise r
        return results  # type: ignore[return-value]

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

    def check_tokens(self, tokens: int, param: str | None, at_least: bool = False) -> None:
        """One request's token limit (``--max-request-tokens``), checked after tokenization and
        before any work on the replicas: ``tokens`` are all the request's tokens as the model would
        run them (truncated, special tokens included; ``at_least``: counted only until past the
        limit). Raises APIError 413 naming the limit and its flag (``param``: the request field
        holding the inputs)."""
        limit = self.cfg.max_request_tokens
        if tokens > limit:
            counted = f"at least {tokens:,} tokens (counted until past the limit)" if at_least else f"{tokens:,} tokens"
            raise APIError(413, f"this request has {counted} after tokenization, more than the limit of {limit:,} "
                           "per request (--max-request-tokens); split it into smaller requests", param, "too_many_tokens")

    async def check_token_budget(self, texts: list[str], param: str) -> None:
        """For the routes that tokenize texts whole and build more than ids from them (``/tokenize``'s
        offsets and token strings, the chunk modes' windows): a request of more than PROBED_CHARS
        characters is first counted, ids only, until past ``--max-request-tokens`` (``tokens_at_least``).
        Raises APIError 413 ("at least") past it: 4 MB of rare 99-letter words took 20 s and left the
        gateway at 1.9 GB (``/tokenize``), 20 s and +1 GB (``chunk_mean``), before their 413."""
        if sum(map(len, texts)) > PROBED_CHARS:
            counted = await self.run_tokenizer(tokens_at_least, texts, self.tokenizer, self.cfg.max_request_tokens)
            self.check_tokens(counted, param, at_least=True)

    async def tokenize(self, inputs: TextInputs, truncate: bool, side: str, prompt: str | None = None,
                       param: str = "input", spent: int = 0) -> Encoded:
        """Texts or token ids → Encoded. Raises APIError 400 (too long with truncation off, bad ids)
        naming ``param[i]``, the input at fault (``param`` alone for a request of one bare item),
        and 413 when these tokens and the ``spent`` ones the request tokenized before exceed
        ``--max-request-tokens`` (``check_tokens``)."""
        try:
            if inputs.token_ids is not None:
                enc = self.tokenizer.check_ids(inputs.token_ids, truncate, side)  # type: ignore[arg-type]
            else:
                texts = inputs.texts or []
                if prompt:
                    texts = [prompt + t for t in texts]
                enc = Encoded.joined(await self.run_sharded(shard_of(self.tokenizer.encode), texts, truncate, side))
        except TooLong as e:
            where = item_param(param, inputs, e.index)
            raise bad_request(f"{where} {e.detail}", where, "context_length_exceeded") from None
        except BadTokenId as e:
            where = item_param(param, inputs, e.index)
            raise bad_request(f"{where} {e.detail}", where, "invalid_token_id") from None
        self.check_tokens(spent + enc.num_tokens, param)
        return enc

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


def tokens_at_least(texts: list[str], tok: TextTokenizer, limit: int) -> int:
    """The tokens of ``texts`` (special tokens left out), counted until they pass ``limit``: ids
    only, in batches of about PROBED_CHARS characters, and a longer text from a window at its
    start (``TextTokenizer.start_tokens``) grown towards the size the limit needs, while it stays
    shorter than the text. A lower bound: past ``limit``, it proves a request too large
    (``Gateway.check_token_budget``)."""
    total, batch, size = 0, [], 0
    for i, text in enumerate(texts):
        if len(text) <= PROBED_CHARS:
            batch.append(text)
            size += len(text)
        else:
            chars, n = PROBED_CHARS, 0
            while (got := tok.start_tokens(text, chars)) is not None:
                used, n = got
                want = max(2 * chars, (limit - total + 1) * used // max(n, 1) * 11 // 10)  # at least doubled
                if total + n > limit or want >= len(text):
                    break
                chars = want
            total += n
        if size > PROBED_CHARS or i == len(texts) - 1:
            total += sum(map(len, tok.plain_ids(batch))) if batch else 0
            batch, size = [], 0
        if total > limit:
            break
    return total


def shard_of(encode: Callable[..., Encoded]) -> Callable[..., Encoded]:
    """``encode(items, *args)`` as a ``run_sharded`` shard function: ``(items, first, *args)``, a
    TooLong or NoRoom naming the item's index in the whole request (``first`` + its index in the shard)."""

    def run(items: list[Any], first: int, *args: Any) -> Encoded:
        try:
            return encode(items, *args)
        except TooLong as e:
            raise TooLong(first + e.index, e.count, e.limit, e.at_least) from None
        except NoRoom as e:
            raise NoRoom(first + e.index, e.detail) from None

    return run


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
