"""Serving over several replicas: three real server processes behind one gateway.

Chunks of a large request are spread over the replicas and reassembled in order; a replica killed
with SIGKILL under load costs no request a hang or a wrong vector, and the survivors carry on.
"""
from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

from bouquet.proto.rpc import HEALTH_SERVING
from helpers import BouquetProcess, GrpcServer, cosine_rows, free_port, grpc_health, read_sts

REQUEST_TIMEOUT_S = 60.0


@pytest.fixture(scope="module")
def three_replicas():
    srv = BouquetProcess("--replicas", "3", "--chunk-tokens", "64")
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def texts() -> list[str]:
    s1, s2, _ = read_sts("test")
    return list(dict.fromkeys(s1 + s2))  # distinct sentences, stable order


@pytest.fixture(scope="module")
def reference(st_sts_test, texts):
    return np.stack([st_sts_test[t] for t in texts[:1400]])


def health(srv: BouquetProcess) -> dict:
    return httpx.get(srv.url + "/health", timeout=10).json()


def gateway_children(pid: int) -> list[str]:
    """Command lines of ``pid``'s child processes (Linux /proc)."""
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
                if ppid == pid:
                    with open(f"/proc/{d}/cmdline", "rb") as f:
                        out.append(f.read().replace(b"\0", b" ").decode())
            except (OSError, ValueError, IndexError):
                continue
    return out


def test_large_request_is_spread_and_reassembled(three_replicas, texts, reference):
    before = {r["address"]: r["chunks"] for r in health(three_replicas)["replicas"]}
    ours = three_replicas.vectors(texts[:1000])
    after = health(three_replicas)["replicas"]
    assert len(after) == 3
    got = {r["address"]: r["chunks"] - before[r["address"]] for r in after}
    assert all(n > 0 for n in got.values()), got  # every replica got a share of the chunks
    assert sum(got.values()) >= 100  # ~13k tokens in chunks of 64 tokens
    cos = cosine_rows(ours, reference[:1000])
    assert cos.min() >= 0.9999, (int(np.argmin(cos)), float(cos.min()))
    for i in (0, 1, 137, 500, 998, 999):  # the single-request vector, row for row
        np.testing.assert_allclose(three_replicas.vectors([texts[i]])[0], ours[i], atol=2e-5)


def test_batch_chunks_take_one_replica_per_gpu(three_replicas, texts, reference):
    """Replicas sharing a GPU time-slice it: a batch-priority request's chunks go to one replica of
    each GPU, interactive ones to any. The real replicas of ``three_replicas`` (CPU; the GPU labels
    are the pool's only view of where a replica runs) behind an in-process pool."""
    from bouquet.gateway.replicas import ReplicaPool
    from bouquet.proto import bouquet_pb2 as pb
    from bouquet.modelspec import load_spec
    from bouquet.tokenization import TextTokenizer

    addresses = [r["address"] for r in health(three_replicas)["replicas"]]
    seqs = TextTokenizer(load_spec(None)).encode(texts[:200]).ids

    async def run(one_per_gpu: bool) -> tuple[dict[str, int], dict[str, int], np.ndarray]:
        pool = ReplicaPool(addresses, chunk_tokens=64, gpus=["cuda:0", "cuda:0", "cuda:1"], batch_one_per_gpu=one_per_gpu)
        await pool.start()
        try:
            rows = await pool.infer(seqs, priority=pb.PRIORITY_BATCH)
            batch = {r.address: r.served_chunks for r in pool.replicas}
            await pool.infer(seqs[:40], priority=pb.PRIORITY_INTERACTIVE)
            both = {r.address: r.served_chunks for r in pool.replicas}
            return batch, both, rows
        finally:
            await pool.close()

    batch, both, rows = asyncio.run(run(True))
    first, second, other = addresses
    assert batch[second] == 0 and batch[first] > 0 and batch[other] > 0, batch  # cuda:0's second sat out
    assert both[second] > 0, both  # interactive chunks may use it
    assert cosine_rows(rows, reference[:200]).min() >= 0.9999
    spread, _, rows = asyncio.run(run(False))  # a small model's layout: every replica takes batch work
    assert all(spread[a] > 0 for a in addresses), spread
    np.testing.assert_allclose(rows, reference[:200], atol=2e-5)


@pytest.fixture(scope="module")
def standalone_server():
    """`bouquet server`: one replica on a fixed address, as on a remote machine."""
    srv = GrpcServer()
    yield srv.proc, srv.address
    srv.stop()


def test_a_replica_serving_another_model_is_not_used(standalone_server, tmp_path: Path):
    """A gateway whose --model is not the `bouquet server`'s (another output width here; a
    Qwen3ForCausalLM named a reranker on one side only differs in task): the replica is not used,
    and /health, the log and the 503 say why, instead of vectors of the other model (a trial's
    gateway returned the replica's embedder scores as rerank scores). Before the test below, which
    stops the module's `bouquet server`."""
    from bouquet.bench.models import TINY_BERT, make_model_dir

    _, address = standalone_server
    gw = BouquetProcess("--server", address, "--model", str(make_model_dir(TINY_BERT, tmp_path)), wait_for=(503,))
    try:
        r = httpx.post(gw.url + "/v1/embeddings", json={"input": "hello"}, timeout=30)
        assert r.status_code == 503, r.text
        rep = health(gw)["replicas"][0]
        assert rep["healthy"] is False and "with 384 outputs, and this gateway's model is task 'embed' with 32" in rep["error"], rep
        assert "the same --model and --served-model-name" in gw.log(), gw.log()[-2000:]
    finally:
        gw.stop()


def test_gateway_workers_share_external_replicas(three_replicas, standalone_server, texts, reference):
    """`--server` (repeatable) + `--gateway-workers 2`: a gateway that starts no replica, in front
    of a standalone `bouquet server` and a replica of another gateway."""
    server_proc, server_addr = standalone_server
    addrs = [server_addr, health(three_replicas)["replicas"][1]["address"]]
    gw = BouquetProcess(*(a for addr in addrs for a in ("--server", addr)), "--gateway-workers", "2",
                        "--chunk-tokens", "32")
    try:
        workers = [c for c in gateway_children(gw.proc.pid) if "spawn_main" in c]
        assert len(workers) == 2, gateway_children(gw.proc.pid)
        reps = health(gw)["replicas"]
        assert [r["address"] for r in reps] == addrs and reps[0]["pid"] == server_proc.pid
        for k in range(4):  # fresh connections, so both workers are likely to take some
            with httpx.Client() as c:
                r = c.post(gw.url + "/v1/embeddings", json={"input": texts[1200 + 10 * k:1210 + 10 * k]}, timeout=60)
            vecs = np.asarray([d["embedding"] for d in r.json()["data"]], dtype=np.float32)
            assert cosine_rows(vecs, reference[1200 + 10 * k:1210 + 10 * k]).min() >= 0.9999
    finally:
        assert gw.stop() == 0
    server_proc.terminate()  # SIGTERM: drains, then exits cleanly
    assert server_proc.wait(30) == 0


def test_no_replica_left_is_a_quick_503():
    address = f"127.0.0.1:{free_port()}"
    gw = BouquetProcess("--server", address, wait_for=(503,))
    try:
        t0 = time.monotonic()
        r = httpx.post(gw.url + "/v1/embeddings", json={"input": "hello"}, timeout=30)
        assert r.status_code == 503 and "replica" in r.json()["error"]["message"] and r.headers["retry-after"]
        assert time.monotonic() - t0 < 5
        h = health(gw)
        assert h["replicas"][0]["healthy"] is False and h["status"] == "loading"  # never ready: not "unavailable"
        # the log says so too, once (the address is probed 4 times a second, logged on a change only)
        said = [line for line in gw.log().splitlines() if f"replica {address} not usable: UNAVAILABLE" in line]
        assert 1 <= len(said) <= 2, gw.log()[-2000:]
    finally:
        gw.stop()


def _slow_loading_model(root: Path, layers: int = 1000) -> Path:
    """A tiny BERT with ``layers`` copies of one layer: ~5 s of replica start-up on a 2-core
    machine (building and packing the layers), against the gateway's ~1 s. The embedded model now
    loads in ~0.5 s, before the gateway listens, so it leaves no window to ask in."""
    from safetensors.numpy import load_file, save_file

    from bouquet.bench.models import TINY_BERT, make_model_dir

    out = root / "slow"
    shutil.copytree(make_model_dir(TINY_BERT, root), out)
    state = load_file(out / "model.safetensors")
    deep = {k: v for k, v in state.items() if ".layer." not in k}
    for k, v in state.items():
        if ".layer.0." in k:
            deep.update({k.replace(".layer.0.", f".layer.{i}."): v for i in range(layers)})
    save_file(deep, out / "model.safetensors")
    cfg = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**cfg, "num_hidden_layers": layers}))
    return out


def test_a_request_while_the_model_loads_says_so(tmp_path: Path):
    # It was told "no healthy inference replica is available; retry later" (new-user run, 2026-12-05).
    model = _slow_loading_model(tmp_path)
    gw = BouquetProcess("--model", str(model), wait_for=(503, 200))  # 503: the gateway is up, the replica loads
    try:
        r = httpx.post(gw.url + "/v1/embeddings", json={"input": "hello"}, timeout=30)
        assert r.status_code == 503 and r.headers["retry-after"] == "1", r.text
        assert r.json()["error"] == {"message": "the model is still loading; retry in a few seconds (GET /health answers "
                                     "200 once it is ready)", "type": "service_unavailable", "param": None,
                                     "code": "no_replica"}
        gw.wait_healthy(120)
        assert gw.embed("hello").status_code == 200
    finally:
        gw.stop()


async def _one(client: httpx.AsyncClient, url: str, idx: list[int], texts: list[str]) -> tuple[list[int], int, object, float]:
    body = {"input": [texts[i] for i in idx]}
    try:
        r = await client.post(url, json=body, timeout=REQUEST_TIMEOUT_S)
    except httpx.TimeoutException:
        return idx, -1, None, time.monotonic()
    return idx, r.status_code, r.json(), time.monotonic()


async def _load_with_kill(srv: BouquetProcess, texts: list[str], victim_pid: int, n: int = 200, per: int = 6):
    limits = httpx.Limits(max_connections=n, max_keepalive_connections=n)
    async with httpx.AsyncClient(limits=limits) as client:
        tasks = [asyncio.create_task(_one(client, srv.url + "/v1/embeddings", list(range(k * per, (k + 1) * per)), texts))
                 for k in range(n)]
        done_before = 0
        # Kill once the load is flowing: a few answers are back, most are still queued.
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            done_before = sum(t.done() for t in tasks)
            if done_before >= 5:
                break
            await asyncio.sleep(0.02)
        os.kill(victim_pid, signal.SIGKILL)
        killed_at = time.monotonic()
        results = await asyncio.gather(*tasks)
    return results, done_before, killed_at


@pytest.mark.slow
def test_kill_9_one_replica_under_200_concurrent_requests(three_replicas, texts, reference):
    replicas = health(three_replicas)["replicas"]
    victim = replicas[0]
    assert all(r["pid"] for r in replicas) and len({r["pid"] for r in replicas}) == 3
    assert grpc_health(victim["address"]) == HEALTH_SERVING  # what a Kubernetes grpc probe asks
    t0 = time.monotonic()
    results, done_before, killed_at = asyncio.run(_load_with_kill(three_replicas, texts, victim["pid"]))
    statuses = [s for _, s, _, _ in results]
    assert -1 not in statuses, "a request hung past the timeout"
    # Survivors exist, so the failed replica's chunks are retried there: 200 for all (a 503 would
    # be the clear answer only when no replica is left; see test_no_replica_left_is_a_quick_503).
    assert statuses == [200] * len(results), {s: statuses.count(s) for s in set(statuses)}
    assert time.monotonic() - t0 < REQUEST_TIMEOUT_S
    assert sum(1 for *_, t in results if t > killed_at) >= 50  # the kill hit a loaded system
    for idx, status, body, _ in results:
        vecs = np.asarray([d["embedding"] for d in body["data"]], dtype=np.float32)
        cos = cosine_rows(vecs, reference[idx])
        assert cos.min() >= 0.9999, (idx, cos)  # its own inputs' vectors, in order
    # Later requests succeed on the survivors; /health reports the dead one.
    for k in range(5):
        a, b = 1200 + 40 * k, 1240 + 40 * k
        assert cosine_rows(three_replicas.vectors(texts[a:b]), reference[a:b]).min() >= 0.9999
    after = {r["address"]: r for r in health(three_replicas)["replicas"]}
    assert after[victim["address"]]["healthy"] is False
    assert sum(r["healthy"] for r in after.values()) == 2


def _infer_after_stale_view(stale) -> np.ndarray:
    """One request's rows from a pool of a real, ready replica after ``stale(pool)`` set by hand the
    view of a poll made while the replica loaded. A 503 fails the test with its message."""
    from bouquet.gateway.errors import APIError
    from bouquet.gateway.replicas import ReplicaPool

    replica = GrpcServer()
    try:
        async def run() -> np.ndarray:
            pool = ReplicaPool([replica.address])
            await pool.start()
            try:
                assert pool.ready
                stale(pool)
                return await pool.infer([np.array([101, 7592, 102], dtype=np.int32)])
            except APIError as e:
                raise AssertionError(f"{e.status} from a ready replica: {e}") from None
            finally:
                await pool.close()

        return asyncio.run(run())
    finally:
        replica.stop()


def test_a_pool_that_has_not_yet_seen_its_replica_ready_asks_again_before_refusing() -> None:
    """With several gateway workers, one worker's /health can answer 200 while another worker's
    pool last polled its replica before that replica finished loading: its first request got 503
    (CI, test_ctrl_c_stops_cleanly[2]). A pool with no healthy replica now probes again before it
    refuses."""
    def stale(pool) -> None:
        pool.replicas[0].healthy = False
        pool._probed_at = time.monotonic() - 1.0

    rows = _infer_after_stale_view(stale)
    assert rows.shape[0] == 1 and np.isfinite(rows).all()


def test_a_pool_that_has_not_yet_seen_its_replica_ready_does_not_trust_a_check_begun_before_the_request() -> None:
    """The check a request joins may have asked before the replica turned ready (the health loop's,
    in flight when the request came): it answers "not ready", and the request got 503 from a
    ready replica. The check begun before is awaited, then another is made. Here the earlier check
    is one that ends 0.2 s later and leaves the replica unhealthy."""
    def stale(pool) -> None:
        pool.replicas[0].healthy, pool.was_ready = False, False
        pool._probing = asyncio.ensure_future(asyncio.sleep(0.2))  # that poll, still in flight
        pool._probe_began = time.monotonic() - 0.1

    rows = _infer_after_stale_view(stale)
    assert rows.shape[0] == 1 and np.isfinite(rows).all()


def test_health_says_unavailable_when_a_ready_replica_is_gone() -> None:
    """/health: "loading" is a server none of whose replicas has been ready yet (the test above);
    once its only replica was ready and then is gone (SIGKILL), 503 "unavailable", and requests
    get a quick 503."""
    srv = GrpcServer()
    # one gateway worker: each worker process has its own view (one that never saw the replica ready says "loading")
    gw = BouquetProcess("--server", srv.address, "--gateway-workers", "1")
    try:
        assert health(gw)["status"] == "ok"
        os.kill(srv.proc.pid, signal.SIGKILL)
        srv.proc.wait(30)
        deadline = time.monotonic() + 30
        r = httpx.get(gw.url + "/health", timeout=10)
        while time.monotonic() < deadline and r.status_code == 200:
            time.sleep(0.25)
            r = httpx.get(gw.url + "/health", timeout=10)
        assert r.status_code == 503 and r.json()["status"] == "unavailable", r.text
        assert httpx.post(gw.url + "/v1/embeddings", json={"input": "hello"}, timeout=30).status_code == 503
    finally:
        gw.stop()
        srv.stop()
