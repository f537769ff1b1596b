"""Small requests that reach the gateway together share work: one tokenizer call for their texts
(``TextCoalescer``), one ``Embed`` call to a replica (``Coalescer``).

Tokenizing a batch of short texts costs a third per text of tokenizing them one call each
(bench/probe_tokenizer.py on the H200 host: 16 µs for one STSb sentence, 5-7 µs each in batches
of 16-64), and under load tokenization was the largest item of the gateway's per-request CPU.

A gRPC call from Python costs about as much CPU as the rest of a small request's path (HTTP
parsing, validation, tokenization, the reply) on both sides of the hop. Under concurrent load many
small requests become ready in the same event-loop iteration; this module gathers them, per
(normalize, dimensions, priority), into one call, flushed at the end of the iteration they arrived
in (``loop.call_soon``): no timer, so a lone request waits for nothing. Rows come back in order and
are handed out by sequence count.

A failed combined call that the server blames on its input (HTTP 400/422 after translation) is
asked again request by request, so that each gets its own answer; other failures (503, 429, 504)
are shared, as they would be by requests sent one by one at that moment. A request whose client
goes away stops waiting; the combined call is cancelled only when every request in it has gone.

What it does not own: picking a replica, retries and chunking (replicas.py), priorities (decided
per request by the caller before it gets here).
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Awaitable, Callable

import numpy as np

from bouquet.gateway.errors import APIError
from bouquet.tokenization import Encoded

# (sequences, normalize, dimensions, priority) → float32 [B, D]
RunFn = Callable[[list[np.ndarray], "bool | None", "int | None", int], Awaitable[np.ndarray]]
Key = tuple["bool | None", "int | None", int]


@dataclass
class _Group:
    seqs: list[np.ndarray] = field(default_factory=list)
    counts: list[int] = field(default_factory=list)  # sequences per request, in order
    futures: list["asyncio.Future[np.ndarray]"] = field(default_factory=list)
    tokens: int = 0
    waiting: int = 0  # requests still waiting for their rows
    task: "asyncio.Task[None] | None" = None


class Coalescer:
    """Gathers small requests into combined calls of at most ``max_tokens`` tokens."""

    def __init__(self, run: RunFn, max_tokens: int) -> None:
        self.run, self.max_tokens = run, max_tokens
        self._open: dict[Key, _Group] = {}
        self.calls = 0  # combined calls sent (tests, benchmarks)

    async def submit(self, seqs: list[np.ndarray], tokens: int, normalize: bool | None, dimensions: int | None,
                     priority: int) -> np.ndarray:
        """Rows float32 [len(seqs), D] for ``seqs`` (``tokens`` in all). Raises APIError as ``run``."""
        key = (normalize, dimensions, priority)
        loop = asyncio.get_running_loop()
        group = self._open.get(key)
        if group is None or group.tokens + tokens > self.max_tokens:
            group = self._open[key] = _Group()
            loop.call_soon(self._flush, key, group)
        fut: asyncio.Future[np.ndarray] = loop.create_future()
        group.seqs.extend(seqs)
        group.counts.append(len(seqs))
        group.futures.append(fut)
        group.tokens += tokens
        group.waiting += 1
        try:
            return await fut
        finally:
            group.waiting -= 1
            if group.waiting == 0 and group.task is not None and not group.task.done():
                group.task.cancel()  # nobody is left to read the rows

    def _flush(self, key: Key, group: _Group) -> None:
        if self._open.get(key) is group:
            del self._open[key]
        if group.waiting:
            self.calls += 1
            group.task = asyncio.ensure_future(self._call(key, group))

    async def _call(self, key: Key, group: _Group) -> None:
        normalize, dimensions, priority = key
        try:
            rows = await self.run(group.seqs, normalize, dimensions, priority)
        except APIError as e:
            if len(group.futures) > 1 and e.status in (400, 422):
                await self._one_by_one(key, group)
                return
            for f in group.futures:
                if not f.done():
                    f.set_exception(e)
            return
        except Exception as e:  # noqa: BLE001 - a bug: each waiter's route answers 500 and logs it
            for f in group.futures:
                if not f.done():
                    f.set_exception(e)
            return
        start = 0
        for n, f in zip(group.counts, group.futures):
            if not f.done():
                f.set_result(rows[start:start + n])
            start += n

    async def _one_by_one(self, key: Key, group: _Group) -> None:
        normalize, dimensions, priority = key
        start = 0
        for n, f in zip(group.counts, group.futures):
            seqs, start = group.seqs[start:start + n], start + n
            if f.done():
                continue
            try:
                rows = await self.run(seqs, normalize, dimensions, priority)
            except APIError as e:
                if not f.done():
                    f.set_exception(e)
                continue
            if not f.done():  # its client may have gone meanwhile
                f.set_result(rows)


EncodeFn = Callable[[list[str], bool, str], Encoded]  # (texts, truncate, side) → Encoded


@dataclass
class _TextGroup:
    texts: list[str] = field(default_factory=list)
    counts: list[int] = field(default_factory=list)  # texts per request, in order
    futures: list["asyncio.Future[Encoded]"] = field(default_factory=list)
    chars: int = 0


class TextCoalescer:
    """Tokenizes the texts of the requests of one event-loop iteration in one ``encode`` call, up to
    ``max_texts`` texts / ``max_chars`` characters per call; flushed at the end of the iteration
    (``loop.call_soon``), so a lone request waits for nothing. ``on_call(seconds)`` is told each
    call's duration (the tokenization histogram). A call that raises (an over-long text with
    truncation off) is repeated request by request, so that only the request at fault fails."""

    def __init__(self, encode: EncodeFn, on_call: Callable[[float], None] = lambda s: None,
                 max_texts: int = 256, max_chars: int = 16384) -> None:
        self.encode, self.on_call = encode, on_call
        self.max_texts, self.max_chars = max_texts, max_chars
        self._open: dict[tuple[bool, str], _TextGroup] = {}
        self.calls = 0  # tokenizer calls made (tests)

    async def submit(self, texts: list[str], truncate: bool, side: str) -> Encoded:
        """``Encoded`` of ``texts``, as ``encode(texts, truncate, side)`` would return it. Raises as
        ``encode`` does (TooLong with the index inside ``texts``)."""
        key = (truncate, side)
        chars = sum(map(len, texts))
        group = self._open.get(key)
        if group is None or len(group.texts) + len(texts) > self.max_texts or group.chars + chars > self.max_chars:
            group = self._open[key] = _TextGroup()
            asyncio.get_running_loop().call_soon(self._flush, key, group)
        fut: asyncio.Future[Encoded] = asyncio.get_running_loop().create_future()
        group.texts.extend(texts)
        group.counts.append(len(texts))
        group.futures.append(fut)
        group.chars += chars
        return await fut

    def _flush(self, key: tuple[bool, str], group: _TextGroup) -> None:
        if self._open.get(key) is group:
            del self._open[key]
        truncate, side = key
        t0 = time.perf_counter()
        self.calls += 1
        try:
            enc = self.encode(group.texts, truncate, side)
        except Exception:  # noqa: BLE001 - each request gets its own answer below
            self._one_by_one(key, group)
            return
        finally:
            self.on_call(time.perf_counter() - t0)
        start = 0
        for n, f in zip(group.counts, group.futures):
            ids = enc.ids[start:start + n]
            start += n
            if not f.done():
                f.set_result(Encoded(ids, None, sum(len(x) for x in ids)))

    def _one_by_one(self, key: tuple[bool, str], group: _TextGroup) -> None:
        truncate, side = key
        start = 0
        for n, f in zip(group.counts, group.futures):
            texts, start = group.texts[start:start + n], start + n
            if f.done():
                continue
            try:
                f.set_result(self.encode(texts, truncate, side))
            except Exception as e:  # noqa: BLE001 - the route turns it into its 400
                f.set_exception(e)
