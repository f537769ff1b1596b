"""Small requests that reach the gateway together go to a replica as one ``Embed`` call.

(Tokenizing their texts in one call too was tried and measured: per text it costs the same CPU
as one call each, bench/probes/probe_tokenizer.py; only the wall time drops, when the tokenizer's own
threads run, and they are off in multi-worker gateways.)

A gRPC call from Python costs about as much CPU as the rest of a small request's path (HTTP
parsing, validation, tokenization, the reply) on both sides of the hop. Under concurrent load many
small requests become ready in the same event-loop iteration; this module gathers them, per
(normalize, dimensions, priority, pool_skip: the prompt tokens left out of pooling, one count per
call), into one call, flushed at the end of the iteration they arrived
in (``loop.call_soon``): no timer, so a lone request waits for nothing. Rows come back in order and
are handed out by sequence count. A request alone in its group runs the call in its own task: no
task of its own for the call, and no hop through it for the rows (its batch-1 latency).

A failed combined call that the server blames on its input (HTTP 400/422 after translation) is
asked again request by request, so that each gets its own answer; other failures (503, 429, 504)
are shared, as they would be by requests sent one by one at that moment. A request whose client
goes away stops waiting; the combined call is cancelled only when every request in it has gone.

What it does not own: picking a replica, retries and chunking (replicas.py), priorities (decided
per request by the caller before it gets here).
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Awaitable, Callable

import numpy as np

from bouquet.gateway.errors import APIError

# (sequences, normalize, dimensions, priority, pool_skip) → float32 [B, D]
RunFn = Callable[[list[np.ndarray], "bool | None", "int | None", int, int], Awaitable[np.ndarray]]
Key = tuple["bool | None", "int | None", int, int]


@dataclass
class _Group:
    seqs: list[np.ndarray] = field(default_factory=list)
    counts: list[int] = field(default_factory=list)  # sequences per request, in order
    futures: list["asyncio.Future[np.ndarray]"] = field(default_factory=list)
    tokens: int = 0
    waiting: int = 0  # requests still waiting for their rows
    task: "asyncio.Task[None] | None" = None


class Coalescer:
    """Gathers small requests into combined calls of at most ``max_tokens`` tokens and ``max_rows``
    sequences (None: any number; a request is never split, so the caller sends none larger)."""

    def __init__(self, run: RunFn, max_tokens: int, max_rows: int | None = None) -> None:
        self.run, self.max_tokens, self.max_rows = run, max_tokens, max_rows
        self._open: dict[Key, _Group] = {}
        self.calls = 0  # combined calls sent (tests, benchmarks)

    async def submit(self, seqs: list[np.ndarray], tokens: int, normalize: bool | None, dimensions: int | None,
                     priority: int, pool_skip: int = 0) -> np.ndarray:
        """Rows float32 [len(seqs), D] for ``seqs`` (``tokens`` in all). Raises APIError as ``run``."""
        key = (normalize, dimensions, priority, pool_skip)
        loop = asyncio.get_running_loop()
        group = self._open.get(key)
        if (group is None or group.tokens + tokens > self.max_tokens
                or (self.max_rows is not None and len(group.seqs) + len(seqs) > self.max_rows)):
            group = self._open[key] = _Group()
            loop.call_soon(self._flush, key, group)
        fut: asyncio.Future[np.ndarray] = loop.create_future()
        group.seqs.extend(seqs)
        group.counts.append(len(seqs))
        group.futures.append(fut)
        group.tokens += tokens
        group.waiting += 1
        try:
            rows = await fut
            if rows is None:  # alone in its group (_flush): the call runs here, in the request's task
                return await self.run(group.seqs, *key)
            return rows
        finally:
            group.waiting -= 1
            if group.waiting == 0 and group.task is not None and not group.task.done():
                group.task.cancel()  # nobody is left to read the rows

    def _flush(self, key: Key, group: _Group) -> None:
        if self._open.get(key) is group:
            del self._open[key]
        if group.waiting:
            self.calls += 1
            if len(group.futures) == 1:  # nobody to share with: its request makes the call itself
                if not group.futures[0].done():  # (a cancelled one is done, its task not yet unwound)
                    group.futures[0].set_result(None)
                return
            group.task = asyncio.ensure_future(self._call(key, group))

    async def _call(self, key: Key, group: _Group) -> None:
        try:
            rows = await self.run(group.seqs, *key)
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
        start = 0
        for n, f in zip(group.counts, group.futures):
            seqs, start = group.seqs[start:start + n], start + n
            if f.done():
                continue
            try:
                rows = await self.run(seqs, *key)
            except APIError as e:
                if not f.done():
                    f.set_exception(e)
                continue
            if not f.done():  # its client may have gone meanwhile
                f.set_result(rows)

