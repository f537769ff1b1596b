"""End to end: the real `bouquet serve` process with the tiny Qwen3-Embedding-style model, over
real HTTP, against transformers (same weights, same tokenizer.json).

Checks the Qwen3-Embedding conventions along the whole path: <|endoftext|> ends every sequence
and is the pooled token (last-token pooling), queries get the "Instruct: …\\nQuery:" prompt by
``prompt_name: query``, vectors are L2-normalized (the model's Normalize module).
"""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch

from tests.fixtures.tiny_models import QWEN3_QUERY_PROMPT, make_tiny_model

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def reference_vectors(model_dir: Path, texts: list[str]) -> np.ndarray:
    """transformers' Qwen3Model on the raw tokenizer's ids: last row, L2-normalized."""
    import transformers as tf
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    model = tf.Qwen3Model.from_pretrained(model_dir, dtype=torch.float32).eval()
    out = []
    with torch.inference_mode():
        for t in texts:
            ids = tok.encode(t).ids
            assert ids[-1] == tok.token_to_id("<|endoftext|>")
            h = model(input_ids=torch.tensor([ids])).last_hidden_state[0, -1]
            out.append((h / h.norm()).numpy())
    return np.stack(out)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    model_dir = make_tiny_model("qwen3", tmp_path_factory.mktemp("serve") / "qwen3")
    port = free_port()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.Popen([sys.executable, "-m", "bouquet", "serve", "--model", str(model_dir), "--port", str(port),
                             "--device", "cpu", "--log-level", "warning"], env=env, cwd=REPO)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 90
    while True:
        assert proc.poll() is None, f"bouquet serve exited with {proc.returncode}"
        assert time.monotonic() < deadline, "bouquet serve did not become healthy in 90 s"
        try:
            if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    yield base, model_dir
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def test_qwen3_embeddings_over_http(server: tuple[str, Path]) -> None:
    base, model_dir = server
    docs = ["the river runs by the mountain city", "fast engine", "a", "search query document " * 60]
    queries = ["what is a vector index?", "red house"]
    r = httpx.post(f"{base}/v1/embeddings", json={"model": str(model_dir), "input": docs}, timeout=60)
    assert r.status_code == 200, r.text
    got_docs = np.array([d["embedding"] for d in r.json()["data"]], dtype=np.float32)
    r = httpx.post(f"{base}/v1/embeddings", json={"model": str(model_dir), "input": queries, "prompt_name": "query"},
                   timeout=60)
    assert r.status_code == 200, r.text
    got_queries = np.array([d["embedding"] for d in r.json()["data"]], dtype=np.float32)

    # the over-long document is truncated to 127 text tokens + <|endoftext|> = the model's 128
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    tok.enable_truncation(128)
    long_text = tok.decode(tok.encode(docs[3]).ids[:-1])
    ref_docs = reference_vectors(model_dir, docs[:3] + [long_text])
    ref_queries = reference_vectors(model_dir, [QWEN3_QUERY_PROMPT + q for q in queries])
    np.testing.assert_allclose(np.linalg.norm(got_docs, axis=1), 1.0, atol=1e-5)
    assert (got_docs * ref_docs).sum(1).min() >= 0.9999
    assert (got_queries * ref_queries).sum(1).min() >= 0.9999
    # the prompt matters: without it the query vectors are different
    plain = reference_vectors(model_dir, queries)
    assert (got_queries * plain).sum(1).max() < 0.999


def test_chunk_offsets_with_prompt_name(server: tuple[str, Path]) -> None:
    """Windows of a long input report offsets in the input's own coordinates with the model's
    long ``query`` prompt too (issue 16: a 639-character input reported chars up to 730)."""
    base, _ = server
    text = " ".join(f"passage{i} about rivers" for i in range(40))
    out = {}
    for extra in ({}, {"prompt_name": "query"}):
        r = httpx.post(f"{base}/v1/embeddings", json={"input": text, "long_input": "chunks", **extra}, timeout=60)
        assert r.status_code == 200, r.text
        out[bool(extra)] = chunks = r.json()["data"][0]["chunks"]
        assert len(chunks) > 1
        assert chunks[0]["chars"][0] == 0 and chunks[0]["tokens"][0] == 0
        assert chunks[-1]["chars"][1] == len(text)
    assert out[True][-1]["tokens"][1] == out[False][-1]["tokens"][1]  # the input's own token count
