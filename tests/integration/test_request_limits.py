"""Issue 38, item 3: request limits that fit the work, through the real `bouquet serve`.

- The default limits admit 100 × 4,096 token ids (409,600 tokens, ~3 MB of JSON with a
  151,669-token vocabulary): the body limit follows from --max-request-tokens. The model is
  Qwen3-Embedding-0.6B's config.json (32,768 positions, its vocabulary) served with
  ``--engine noop``: the gateway, the Unix socket and the replica's scheduler run as with the real
  engine, but no model, whose CPU forward of 409,600 tokens would take minutes.
- A per-token output over --max-output-bytes (the default) is refused before the work: the
  gateway's memory stays flat, where the same request used to return ~300 MB.

Configured limits (a lowered --max-request-tokens and --max-output-bytes on every route) are in
test_security.py.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator

import httpx
import numpy as np
import pytest

from helpers import BouquetProcess
from reliability import openai_error, tei_error

from bouquet.bench.models import SHAPES
from bouquet.config import MAX_OUTPUT_BYTES, MAX_REQUEST_TOKENS, ServeConfig

IDS_PER_INPUT = 4096


@pytest.fixture(scope="module")
def qwen3_noop(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BouquetProcess]:
    from tests.fixtures.tiny_models import _byte_bpe

    model = tmp_path_factory.mktemp("qwen3-0.6b-config")
    (model / "config.json").write_text(json.dumps(SHAPES["qwen3-0.6b"].config))
    _byte_bpe(append_eos=True).save(str(model / "tokenizer.json"))  # read by the gateway; ids are sent here
    srv = BouquetProcess("--model", str(model), "--engine", "noop", "--log-level", "warning")
    yield srv
    srv.stop()


def _ids_body(n_inputs: int, seed: int) -> bytes:
    """``n_inputs`` × 4,096 random ids of Qwen3's vocabulary, as json.dumps writes them (", ")."""
    vocab = SHAPES["qwen3-0.6b"].config["vocab_size"]
    ids = np.random.default_rng(seed).integers(0, vocab, (n_inputs, IDS_PER_INPUT)).tolist()
    return json.dumps({"input": ids}).encode()


def test_default_limits_admit_100_x_4096_token_ids(qwen3_noop: BouquetProcess) -> None:
    assert MAX_REQUEST_TOKENS == 100 * IDS_PER_INPUT
    body = _ids_body(100, 0)
    assert len(body) > 2 * 2**20, len(body)  # ~2.9 MB: over the old 2 MiB limit, which refused it
    assert len(body) <= ServeConfig().request_bytes_limit
    r = httpx.post(qwen3_noop.url + "/v1/embeddings", content=body, headers={"content-type": "application/json"},
                   timeout=120)
    assert r.status_code == 200, r.text[:500]
    out = r.json()
    assert len(out["data"]) == 100 and len(out["data"][0]["embedding"]) == 1024
    assert out["usage"]["prompt_tokens"] == 100 * IDS_PER_INPUT

    # one input more: over the token limit (not the body limit), 413 naming the limit and its flag
    over = _ids_body(101, 1)
    assert len(over) <= ServeConfig().request_bytes_limit
    r = httpx.post(qwen3_noop.url + "/v1/embeddings", content=over, headers={"content-type": "application/json"},
                   timeout=120)
    err = openai_error(r, 413, "input", "too_many_tokens")
    assert "413,696" in err["message"] and "409,600" in err["message"] and "--max-request-tokens" in err["message"]
    # TEI's route, same limit, its own error shape; then the next request is served
    r = httpx.post(qwen3_noop.url + "/embed", content=over.replace(b'"input"', b'"inputs"', 1),
                   headers={"content-type": "application/json"}, timeout=120)
    assert "--max-request-tokens" in tei_error(r, 413)["error"]
    assert qwen3_noop.embed([[1, 2, 3]]).status_code == 200


def _memory(srv: BouquetProcess) -> tuple[float, float]:
    """(resident, peak resident) MiB of the gateway: `serve`'s own process (one worker), from
    /proc/PID/status (VmRSS, VmHWM)."""
    status = dict(line.split(":", 1) for line in Path(f"/proc/{srv.proc.pid}/status").read_text().splitlines())
    return int(status["VmRSS"].split()[0]) / 1024, int(status["VmHWM"].split()[0]) / 1024


def test_embed_all_over_the_output_cap_is_refused_before_the_work(minilm_server: BouquetProcess) -> None:
    """100 texts of all-MiniLM-L6-v2's 256 tokens (~150 KB of JSON) ask for 25,600 token vectors of
    384 floats, up to 157 MB of JSON: over the 64 MiB default → 413, and the gateway's memory,
    peak included, does not grow (it used to return ~300 MB and grow by ~490 MB)."""
    texts = [f"sentence {i} " + "the quick brown fox jumps over the lazy dog " * 30 for i in range(100)]
    body = {"inputs": texts}
    assert len(json.dumps(body)) < 200_000

    def refused() -> None:
        r = httpx.post(minilm_server.url + "/embed_all", json=body, timeout=120)
        msg = tei_error(r, 413)["error"]
        assert "--max-output-bytes" in msg and f"{MAX_OUTPUT_BYTES:,}" in msg, msg

    refused()  # the first request through the route's code (thread pools, buffers: ~5 MiB once) is not counted
    Path(f"/proc/{minilm_server.proc.pid}/clear_refs").write_text("5")  # the peak (VmHWM) restarts from here
    before, _ = _memory(minilm_server)
    for _ in range(3):
        refused()
    r = httpx.post(minilm_server.url + "/v1/embeddings", json={"input": texts, "output": "multi_vector"}, timeout=120)
    openai_error(r, 413, "input", "output_too_large")
    now, peak = _memory(minilm_server)
    assert now - before < 4 and peak - before < 4, f"the gateway grew from {before:.1f} MiB to {now:.1f} (peak {peak:.1f})"

    # under the cap: served, one vector per token
    r = httpx.post(minilm_server.url + "/embed_all", json={"inputs": texts[:4]}, timeout=120)
    assert r.status_code == 200, r.text[:300]
    vecs = r.json()
    assert [len(v) for v in vecs] == [256] * 4 and len(vecs[0][0]) == 384


def test_a_call_of_several_chunks_fits_a_small_queue_chunk_by_chunk() -> None:
    # A replica takes anything into an empty queue and refuses what would push a non-empty one past
    # --max-queue-tokens. The gateway sends a call's chunks (--chunk-tokens) at once, so the first
    # filled the queue and refused the second: a call over both limits got 429 "retry later" on an
    # idle server, on every retry. Now a refused chunk waits for its sibling and goes next.
    srv = BouquetProcess("--max-queue-tokens", "600", "--chunk-tokens", "1000", "--log-level", "warning")
    try:
        rng = np.random.default_rng(0)
        rows = [[101, *rng.integers(2000, 20000, 248).tolist(), 102] for _ in range(8)]  # 2,000 tokens: 2 chunks
        for _ in range(3):
            r = httpx.post(f"{srv.url}/v1/embeddings", json={"input": rows}, timeout=120)
            assert r.status_code == 200, r.text
        whole = np.array([d["embedding"] for d in r.json()["data"]])
        halves = [httpx.post(f"{srv.url}/v1/embeddings", json={"input": rows[a:a + 4]}, timeout=120) for a in (0, 4)]
        assert all(h.status_code == 200 for h in halves), [h.text for h in halves]
        parts = np.array([d["embedding"] for h in halves for d in h.json()["data"]])
        assert (whole * parts).sum(1).min() >= 0.9999
    finally:
        srv.stop()
