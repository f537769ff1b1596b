"""The process layout `serve` chooses when no layout flag is given (bouquet/layout.py): the pure
rule for several machines and model sizes, the facts read from this host, and what a real
`bouquet serve` reports in /info and its log."""
from __future__ import annotations

import json
import os
import shutil
import struct
import time
from pathlib import Path

import httpx
import pytest

from bouquet.layout import (CORES_PER_GPU_REPLICA, HOST_BOUND_BULK_PARAMS, MAX_TOKENIZER_THREADS, SMALL_MODEL_PARAMS, Layout, Machine, choose_layout, machine_facts,
                            model_parameters, visible_gpus)
from helpers import BouquetProcess

GiB = 2**30
MINILM, BGE_BASE, QWEN3_06B, QWEN3_8B = 22_713_728, 109_482_240, 595_776_512, 7_567_295_488


@pytest.mark.parametrize("machine, params, want", [
    # an H200 host (16 cores): small models get two host loops per GPU, the gateway the other 12 cores
    (Machine(16, 1, 128 * GiB), MINILM, (12, 2)),
    (Machine(16, 1, 128 * GiB), BGE_BASE, (12, 2)),
    # GPU-bound models: one replica, every core but its two to the gateway
    (Machine(16, 1, 128 * GiB), QWEN3_06B, (14, 1)),
    (Machine(16, 1, 128 * GiB), QWEN3_8B, (14, 1)),
    # too few cores for two replicas and workers: one replica
    (Machine(6, 1, 32 * GiB), MINILM, (4, 1)),
    (Machine(2, 1, 24 * GiB), MINILM, (1, 1)),
    # several GPUs (--gpus): two busy cores per replica on each
    (Machine(32, 4, 512 * GiB), MINILM, (16, 2)),
    (Machine(64, 8, 512 * GiB), QWEN3_06B, (32, 1)),  # 48 free cores, capped at 32 workers
    # the CPU: the model takes the cores, one worker per 8 cores
    (Machine(2, 0, 24 * GiB), MINILM, (1, 1)),
    (Machine(32, 0, 64 * GiB), BGE_BASE, (4, 1)),
    # little memory bounds the workers (512 MiB each, half the memory)
    (Machine(16, 1, 2 * GiB), QWEN3_06B, (2, 1)),
    # remote replicas (--server): every core to the gateway
    (Machine(8, 0, 32 * GiB, local_replicas=False), 0, (8, 1)),
])
def test_rule(machine: Machine, params: int, want: tuple[int, int]) -> None:
    lay = choose_layout(machine, params)
    assert (lay.gateway_workers, lay.replicas_per_gpu) == want, lay.reason
    assert 1 <= lay.tokenizer_threads <= MAX_TOKENIZER_THREADS
    # a lone large request may use every core the replicas leave (run_sharded), not more
    assert lay.tokenizer_threads <= max(1, machine.cpus - (CORES_PER_GPU_REPLICA * lay.replicas_per_gpu * machine.gpus
                                                          if machine.local_replicas else 0))
    if machine.gpus and machine.local_replicas:  # a 100-document rerank is cut into as many shards as cores are free
        busy = CORES_PER_GPU_REPLICA * lay.replicas_per_gpu * machine.gpus
        assert lay.tokenizer_threads == max(1, min(MAX_TOKENIZER_THREADS, machine.cpus - busy))
    # the engine is never starved: the busy cores of the GPU replicas stay free of gateway workers
    if machine.gpus and machine.local_replicas and machine.cpus > CORES_PER_GPU_REPLICA * machine.gpus:
        assert lay.gateway_workers + CORES_PER_GPU_REPLICA * lay.replicas_per_gpu * machine.gpus <= machine.cpus
    # GPU memory is not spent on a second copy of a large model
    if params > SMALL_MODEL_PARAMS:
        assert lay.replicas_per_gpu == 1
    # two replicas of a GPU: bulk work on one of them unless the model's bulk steps are host-bound
    assert lay.batch_one_replica_per_gpu == (lay.replicas_per_gpu > 1 and machine.gpus > 0 and params > HOST_BOUND_BULK_PARAMS)
    assert ("batch work on one replica per GPU" in lay.reason) == lay.batch_one_replica_per_gpu


def test_flags_win_and_are_named() -> None:
    m = Machine(16, 1, 128 * GiB)
    lay = choose_layout(m, MINILM, gateway_workers=3, replicas_per_gpu=1, tokenizer_threads=2)
    assert (lay.gateway_workers, lay.replicas_per_gpu, lay.tokenizer_threads) == (3, 1, 2)
    assert "as given: --gateway-workers, --replicas-per-gpu, --tokenizer-threads" in lay.reason
    # one flag given: the others are still chosen (workers around the given replicas)
    lay = choose_layout(m, MINILM, replicas_per_gpu=3)
    assert (lay.gateway_workers, lay.replicas_per_gpu) == (10, 3)
    assert choose_layout(m, MINILM, models=2).replicas_per_gpu == 2  # 16 >= 2*2*1*2 + 4
    assert choose_layout(m, MINILM, models=4).replicas_per_gpu == 1  # 16 < 2*2*1*4 + 4
    assert Layout(3, 1, 2, "").tokenization_workers == 6


def test_visible_gpus(tmp_path: Path) -> None:
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": ""}, tmp_path) == 0
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "-1"}, tmp_path) == 0
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "0,3"}, tmp_path) == 2
    for i in range(3):
        (tmp_path / f"0000:0{i}:00.0").mkdir()
    assert visible_gpus({}, tmp_path) == 3
    assert visible_gpus({}, tmp_path / "missing") == 0


def test_replica_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """Which GPU a local replica runs on: the pool sends batch chunks to one replica per GPU."""
    from bouquet.launcher import replica_gpu

    assert replica_gpu("cuda:1") == "cuda:1" and replica_gpu("cuda") == "cuda:0" and replica_gpu("cpu") == ""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert replica_gpu("auto") == ""  # no GPU: a CPU replica, never grouped
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    assert replica_gpu("auto") == "cuda:0"


def test_machine_facts_here() -> None:
    m = machine_facts("cpu", (), remote=False)
    assert m.cpus == len(os.sched_getaffinity(0)) and m.gpus == 0 and m.memory_bytes > GiB
    assert machine_facts("auto", (0, 1), remote=False).gpus == 2  # --gpus says how many
    assert not machine_facts("auto", (), remote=True).local_replicas


def test_model_parameters(tmp_path: Path) -> None:
    from bouquet.modelspec import resolve_model_path

    assert model_parameters(resolve_model_path(None)) == MINILM  # the real all-MiniLM-L6-v2
    header = json.dumps({"__metadata__": {"format": "pt"}, "a": {"dtype": "F32", "shape": [3, 4], "data_offsets": [0, 48]},
                         "b": {"dtype": "F32", "shape": [5], "data_offsets": [48, 68]}}).encode()
    (tmp_path / "model-00001.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + bytes(68))
    (tmp_path / "model-00002.safetensors").write_bytes(b"\x01")  # unreadable: skipped
    assert model_parameters(tmp_path) == 17
    assert model_parameters(tmp_path / "none") == 0


def test_serve_reports_the_layout(minilm_server: BouquetProcess) -> None:
    info = httpx.get(minilm_server.url + "/info", timeout=10).json()
    want = choose_layout(machine_facts("cpu", (), remote=False), MINILM)
    lay = info["layout"]
    assert (lay["gateway_workers"], lay["tokenizer_threads"]) == (want.gateway_workers, want.tokenizer_threads)
    assert lay["replicas"] == 1 and lay["chosen"] == want.reason
    assert info["tokenization_workers"] == want.tokenization_workers
    assert "bouquet: layout: " + want.reason in minilm_server.log_path.read_text(errors="replace")


def test_serve_flags_win() -> None:
    srv = BouquetProcess("--engine", "noop", "--gateway-workers", "2", "--tokenizer-threads", "3")
    try:
        info = httpx.get(srv.url + "/info", timeout=10).json()
        assert info["layout"]["gateway_workers"] == 2 and info["layout"]["tokenizer_threads"] == 3
        assert info["tokenization_workers"] == 6
        assert "as given: --gateway-workers, --tokenizer-threads" in info["layout"]["chosen"]
        assert srv.embed("still served").status_code == 200
        # the spawned workers log as the single-process gateway does (an answer >= 400 at INFO)
        r = httpx.get(srv.url + "/no-such-route", headers={"X-Request-Id": "two-workers-404"}, timeout=10)
        assert r.status_code == 404
        end = time.monotonic() + 5
        while "request_id=two-workers-404" not in srv.log_path.read_text(errors="replace") and time.monotonic() < end:
            time.sleep(0.1)
        line = next(ln for ln in srv.log_path.read_text(errors="replace").splitlines() if "request_id=two-workers-404" in ln)
        assert "INFO bouquet.access:" in line and " 404 " in line, line
    finally:
        assert srv.stop() == 0


def test_batch_on_one_replica_is_decided_per_model(tmp_path: Path) -> None:
    """Several models share one layout, sized by the largest; where batch chunks go is each model's
    own: a model of at most HOST_BOUND_BULK_PARAMS keeps both replicas of a GPU for batch work even
    beside a larger one. Real `serve` with the no-op engine; CUDA_VISIBLE_DEVICES=0 makes the
    launcher count one GPU (the replicas never touch it), and /health's per-replica ``chunks`` shows
    where a batch-priority request's chunks went."""
    from bouquet.modelspec import resolve_model_path

    small = resolve_model_path(None)  # the real all-MiniLM-L6-v2: below the bound
    big = tmp_path / "big"  # its files, with a weights header of 60M parameters (the no-op engine loads none)
    shutil.copytree(small, big, ignore=shutil.ignore_patterns("*.safetensors"))
    header = json.dumps({"w": {"dtype": "F32", "shape": [60_000_000], "data_offsets": [0, 240_000_000]}}).encode()
    (big / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header)
    assert model_parameters(small) <= HOST_BOUND_BULK_PARAMS < model_parameters(big)
    srv = BouquetProcess("--engine", "noop", "--model", str(small), "--model", str(big), "--served-model-name", "small",
                         "--served-model-name", "big", "--replicas-per-gpu", "2", "--chunk-tokens", "64", device="auto",
                         env={"CUDA_VISIBLE_DEVICES": "0"})
    try:
        chosen = httpx.get(srv.url + "/info", timeout=10).json()["layout"]["chosen"]
        assert "batch work on one replica per GPU for models over 50M parameters" in chosen, chosen
        texts = [f"text number {i} about rivers and mountains" for i in range(64)]
        for name in ("small", "big"):
            r = srv.embed(texts, model=name, priority="batch")
            assert r.status_code == 200, r.text
        chunks = {m["model"]: [r["chunks"] for r in m["replicas"]]
                  for m in httpx.get(srv.url + "/health", timeout=10).json()["models"]}
        assert chunks["big"][0] > 0 and chunks["big"][1] == 0, chunks  # one replica of the GPU takes batch work
        assert all(c > 0 for c in chunks["small"]), chunks  # host-bound bulk: both
        # /info describes the first model
        assert httpx.get(srv.url + "/info", timeout=10).json()["layout"]["batch_one_replica_per_gpu"] is False
    finally:
        assert srv.stop() == 0
