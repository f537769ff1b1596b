"""Reduced CI versions of `bouquet bench load` and `bouquet bench soak` (full runs: bench/results/cpu-2core.md)."""
from __future__ import annotations

import asyncio
from typing import Iterator

import pytest

from bouquet.bench.load import growth_mb, reference_vectors, run_load, short_pool, soak, summary, text_pool, verdict
from bouquet.bench.procs import child_pids
from helpers import BouquetProcess

pytestmark = pytest.mark.slow  # ~1 minute of load and soak; skip locally with -m "not slow"


@pytest.fixture(scope="module")
def pool_refs():
    texts = text_pool(96)
    return texts, reference_vectors(texts)


def test_load_no_lost_no_5xx_every_vector_checked(minilm_server, pool_refs):
    texts, refs = pool_refs
    tally, wall = asyncio.run(run_load(minilm_server.url, clients=48, duration=8, texts=texts, refs=refs, timeout=240))
    assert verdict(tally, allow_429=False) == [], summary(tally, wall)
    assert tally.status[200] == tally.sent


@pytest.fixture(scope="module")
def low_queue_server() -> Iterator[BouquetProcess]:
    srv = BouquetProcess("--max-queue-tokens", "1024")
    yield srv
    srv.stop()


def test_low_queue_limit_only_200_or_429(low_queue_server, pool_refs):
    texts, refs = pool_refs
    tally, wall = asyncio.run(run_load(low_queue_server.url, clients=48, duration=6, texts=texts, refs=refs, timeout=240))
    assert verdict(tally, allow_429=True) == [], summary(tally, wall)
    assert tally.status.get(429, 0) > 0, summary(tally, wall)  # the limit was actually reached
    assert low_queue_server.embed(["after the storm"]).status_code == 200


def test_soak_reduced_memory_flat(minilm_server):
    texts = short_pool(64)
    refs = reference_vectors(texts)
    pids = [minilm_server.proc.pid, *child_pids(minilm_server.proc.pid)]
    tally, samples, wall = asyncio.run(soak(minilm_server.url, None, 600, 8, texts, refs, pids))
    assert verdict(tally, allow_429=False) == []
    assert tally.status[200] == 600
    assert growth_mb(samples) < 50, samples[::10]
