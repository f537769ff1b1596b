"""Small concurrent requests share calls to the replica in the gateway (gateway/coalesce.py): fewer
calls than requests reach the replica, and each request still gets exactly its own rows, with its
own `dimensions` and `normalize`, as when sent alone."""
from __future__ import annotations

import asyncio

import httpx
import numpy as np

from helpers import BouquetProcess


def calls_to_replicas(server: BouquetProcess) -> int:
    """Calls to the replicas that returned vectors so far, as the gateway counts them (``chunks``
    of each replica on /health; one gateway worker, so one count)."""
    return sum(r["chunks"] for r in httpx.get(server.url + "/health", timeout=10).json()["replicas"])


def test_concurrent_small_requests_get_their_own_rows(minilm_server: BouquetProcess) -> None:
    options = [{}, {"dimensions": 128}, {"normalize": False}, {"dimensions": 256, "normalize": False}]
    bodies = [{"input": [f"request {i} sentence {j} about rivers" for j in range(1 + i % 3)], **options[i % 4]}
              for i in range(32)]
    before = calls_to_replicas(minilm_server)
    alone = [minilm_server.vectors(b["input"], **{k: v for k, v in b.items() if k != "input"}) for b in bodies]
    after_alone = calls_to_replicas(minilm_server)
    assert after_alone - before == len(bodies)  # one call per request when nothing arrives alongside

    async def together() -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=120) as client:
            return await asyncio.gather(*(client.post(minilm_server.url + "/v1/embeddings", json=b) for b in bodies))

    replies = asyncio.run(together())
    merged = calls_to_replicas(minilm_server) - after_alone
    # Requests that arrived in the same event-loop iteration shared a call (four option groups, so
    # at least four calls).
    assert 4 <= merged < len(bodies), merged
    for body, ref, r in zip(bodies, alone, replies):
        assert r.status_code == 200, r.text
        got = np.asarray([d["embedding"] for d in r.json()["data"]], dtype=np.float32)
        assert got.shape == ref.shape, body
        cos = (got * ref).sum(1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(ref, axis=1))
        assert cos.min() > 0.9999, body
        np.testing.assert_allclose(np.linalg.norm(got, axis=1), np.linalg.norm(ref, axis=1), rtol=1e-4)


def test_calls_leaving_out_different_prompts_are_not_merged() -> None:
    """``pool_skip`` (the prompt tokens a replica leaves out of pooling) is one count per call, so
    requests with different counts go in calls of their own; equal counts still merge."""
    from bouquet.gateway.coalesce import Coalescer

    calls: list[tuple[int, int]] = []  # (sequences, pool_skip) per call

    async def run(seqs: list[np.ndarray], normalize: bool | None, dims: int | None, priority: int,
                  pool_skip: int) -> np.ndarray:
        calls.append((len(seqs), pool_skip))
        return np.full((len(seqs), 2), pool_skip, dtype=np.float32)

    async def main() -> list[np.ndarray]:
        c = Coalescer(run, max_tokens=1000)
        seq = [np.arange(4, dtype=np.int32)]
        return await asyncio.gather(*(c.submit(seq, 4, None, None, 1, k) for k in (0, 5, 5, 0, 7)))

    rows = asyncio.run(main())
    assert sorted(calls) == [(1, 7), (2, 0), (2, 5)]
    assert [int(r[0, 0]) for r in rows] == [0, 5, 5, 0, 7]  # each request got the rows of its own call


def test_a_lone_request_makes_its_call_in_its_own_task() -> None:
    """A request alone in its group runs the call in its own task (no task for the call, no hop for the
    rows), and cancelling it cancels the call; requests together share one call in a task of its own."""
    from bouquet.gateway.coalesce import Coalescer

    tasks: list[asyncio.Task | None] = []
    cancelled: list[bool] = []

    async def run(seqs: list[np.ndarray], normalize: bool | None, dims: int | None, priority: int,
                  pool_skip: int) -> np.ndarray:
        tasks.append(asyncio.current_task())
        if priority == 2:  # a call that never ends: its caller gives up
            try:
                await asyncio.sleep(60)
            except asyncio.CancelledError:
                cancelled.append(True)
                raise
        return np.zeros((len(seqs), 2), dtype=np.float32)

    async def main() -> None:
        c = Coalescer(run, max_tokens=1000)
        seq = [np.arange(4, dtype=np.int32)]
        alone = asyncio.ensure_future(c.submit(seq, 4, None, None, 1))
        assert (await alone).shape == (1, 2) and tasks == [alone]
        both = [asyncio.ensure_future(c.submit(seq, 4, None, None, 1)) for _ in range(2)]
        assert [r.shape for r in await asyncio.gather(*both)] == [(1, 2), (1, 2)]
        assert len(tasks) == 2 and tasks[1] not in both and c.calls == 2
        stuck = asyncio.ensure_future(c.submit(seq, 4, None, None, 2))
        while len(tasks) < 3:
            await asyncio.sleep(0)
        stuck.cancel()
        await asyncio.gather(stuck, return_exceptions=True)
        assert tasks[2] is stuck and cancelled == [True]

    asyncio.run(main())


def test_calls_hold_no_more_rows_than_one_reply_takes() -> None:
    """A SPLADE row is vocabulary-sized (600 KB at 150k terms): 1,000 four-token texts fit one
    --chunk-tokens call but not one reply, which the replica refuses (it answered such a request
    400 "split the call"). The gateway's calls, chunked or coalesced, stay within MAX_REPLY_BYTES,
    the rows back in input order."""
    from bouquet.gateway.replicas import ReplicaPool
    from bouquet.proto.rpc import MAX_REPLY_BYTES

    pool = ReplicaPool(["127.0.0.1:1"], row_bytes=4 * 150_000)
    assert pool.max_rows == MAX_REPLY_BYTES // 600_000 == 894
    calls: list[int] = []

    async def run_chunk(seqs: list[np.ndarray], type_ids: object, normalize: bool | None, dims: int | None,
                        priority: int, per_token: bool = False, pool_skip: int = 0,
                        siblings: object = None) -> np.ndarray:
        calls.append(len(seqs))
        return np.stack([s[:1].astype(np.float32) for s in seqs])

    pool._run_chunk = run_chunk  # type: ignore[method-assign]  # the replica's side: one row per sequence

    def texts(first: int, n: int) -> list[np.ndarray]:
        return [np.full(4, first + i, dtype=np.int32) for i in range(n)]

    async def main() -> tuple[np.ndarray, list[np.ndarray]]:
        one = await pool.infer(texts(0, 1000))
        together = await asyncio.gather(*(pool.infer(texts(1000 * k, 300)) for k in range(1, 5)))
        return one, together

    one, together = asyncio.run(main())
    assert max(calls) <= 894 and sum(calls) == 1000 + 4 * 300, calls
    assert len(calls) < 2 + 4  # the four small requests still shared calls
    np.testing.assert_array_equal(one[:, 0], np.arange(1000))
    for k, rows in enumerate(together, 1):
        np.testing.assert_array_equal(rows[:, 0], 1000 * k + np.arange(300))
