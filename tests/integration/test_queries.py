"""Online queries through the real processes: many concurrent clients, one text per request.

The path of issue 13: single-text requests from many connections are tokenized per request,
merged into shared calls to the replicas (gateway/coalesce.py) over the Unix-socket transport
(proto/ipc.py), batched by the replicas' schedulers and split back. Every answer must be its own
text's vector (checked against sentence-transformers), none may be lost, also when a replica is
killed under the load, and the same holds over gRPC (``--transport grpc``).
"""
from __future__ import annotations

import asyncio
import os
import signal
import time

import httpx
import numpy as np
import pytest
from openai import AsyncOpenAI

from helpers import BouquetProcess, cosine_rows, read_sts


@pytest.fixture(scope="module")
def texts() -> list[str]:
    s1, s2, _ = read_sts("test")
    return list(dict.fromkeys(s1 + s2))[:2000]


@pytest.fixture(scope="module")
def reference(st_sts_test, texts) -> np.ndarray:
    return np.stack([st_sts_test[t] for t in texts])


async def _clients(url: str, texts: list[str], n_clients: int, per_request: int = 1,
                   on_progress=None) -> list[tuple[int, list[list[float]] | Exception]]:  # type: ignore[no-untyped-def]
    """``n_clients`` OpenAI SDK clients (one connection each) share the texts: client c sends
    texts c, c + n, c + 2n, ... (``per_request`` consecutive ones per request), each awaiting its
    answer before the next. Returns (first text index, vectors or the exception) per request."""
    out: list[tuple[int, list[list[float]] | Exception]] = []
    starts = list(range(0, len(texts), per_request))

    async def client(c: int) -> None:
        async with AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=120) as oc:
            for k in range(c, len(starts), n_clients):
                i = starts[k]
                try:
                    r = await oc.embeddings.create(model="sentence-transformers/all-MiniLM-L6-v2",
                                                   input=texts[i] if per_request == 1 else texts[i:i + per_request])
                    assert [d.index for d in r.data] == list(range(len(r.data)))
                    out.append((i, [d.embedding for d in r.data]))
                except Exception as e:  # noqa: BLE001 - collected and asserted on by the test
                    out.append((i, e))
                if on_progress is not None:
                    on_progress(len(out))

    await asyncio.gather(*(client(c) for c in range(n_clients)))
    return out


def _check(results: list[tuple[int, list[list[float]] | Exception]], reference: np.ndarray, expected: int,
           per_request: int = 1) -> None:
    errors = [r for _, r in results if isinstance(r, Exception)]
    assert not errors, f"{len(errors)} requests failed, first: {errors[0]!r}"
    assert len(results) == expected
    for i, vecs in results:
        assert len(vecs) == min(per_request, len(reference) - i)  # type: ignore[arg-type]
        cos = cosine_rows(np.asarray(vecs, np.float32), reference[i:i + len(vecs)])  # type: ignore[arg-type]
        assert cos.min() >= 0.9999, (i, float(cos.min()))  # data[j] is input[j], for this request


@pytest.fixture(scope="module")
def two_replicas():
    srv = BouquetProcess("--replicas", "2", "--gateway-workers", "2")
    yield srv
    srv.stop()


@pytest.mark.slow
def test_2000_single_text_queries_from_64_clients(two_replicas, texts, reference):
    assert all(r["transport"] == "ipc" for r in httpx.get(two_replicas.url + "/health").json()["replicas"])
    t0 = time.monotonic()
    results = asyncio.run(_clients(two_replicas.url, texts, 64))
    _check(results, reference, len(texts))
    # and requests of several texts keep their order under the same load
    results = asyncio.run(_clients(two_replicas.url, texts[:600], 32, per_request=3))
    _check(results, reference, 200, per_request=3)
    assert time.monotonic() - t0 < 300


def test_queries_over_grpc_transport(texts, reference):
    """``--transport grpc``: the same path with gRPC between gateway and replicas."""
    srv = BouquetProcess("--transport", "grpc")
    try:
        assert [r["transport"] for r in httpx.get(srv.url + "/health").json()["replicas"]] == ["grpc"]
        results = asyncio.run(_clients(srv.url, texts[:400], 32))
        _check(results, reference, 400)
    finally:
        assert srv.stop() == 0


@pytest.mark.slow
def test_kill_9_one_replica_under_query_load_loses_no_request(texts, reference):
    srv = BouquetProcess("--replicas", "2")
    try:
        victim = httpx.get(srv.url + "/health").json()["replicas"][0]
        killed = {"at": 0}

        def on_progress(done: int) -> None:
            if done == 100 and not killed["at"]:  # the load is flowing; most requests are yet to come
                os.kill(victim["pid"], signal.SIGKILL)
                killed["at"] = done

        results = asyncio.run(_clients(srv.url, texts[:1000], 64, on_progress=on_progress))
        assert killed["at"], "the replica was never killed"
        _check(results, reference, 1000)
        after = {r["address"]: r for r in httpx.get(srv.url + "/health").json()["replicas"]}
        assert after[victim["address"]]["healthy"] is False and sum(r["healthy"] for r in after.values()) == 1
    finally:
        srv.stop()
