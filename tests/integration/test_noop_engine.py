"""`bouquet serve --engine noop` (the gateway benchmark's engine): the real gateway, gRPC server
and scheduler answer zero vectors of the model's dimension, and validate inputs as usual."""
from __future__ import annotations

import base64

import numpy as np
import pytest

from helpers import BouquetProcess

DIM = 384  # all-MiniLM-L6-v2


@pytest.fixture(scope="module")
def noop_server():
    srv = BouquetProcess("--engine", "noop")
    yield srv
    srv.stop()


def test_zero_vectors_of_the_model_dimension(noop_server: BouquetProcess) -> None:
    vecs = noop_server.vectors(["A man is playing guitar.", "x"])
    assert vecs.shape == (2, DIM) and not vecs.any()
    r = noop_server.embed("A man is playing guitar.", encoding_format="base64", dimensions=128)
    assert r.status_code == 200, r.text
    body = r.json()
    row = np.frombuffer(base64.b64decode(body["data"][0]["embedding"]), dtype="<f4")
    assert row.shape == (128,) and not row.any()
    assert body["usage"]["prompt_tokens"] == 8  # [CLS] + 6 WordPiece tokens + [SEP]: the real tokenizer ran


def test_replica_reports_noop_and_inputs_are_still_validated(noop_server: BouquetProcess) -> None:
    import httpx

    health = httpx.get(noop_server.url + "/health", timeout=10).json()
    assert [r["device"] for r in health["replicas"]] == ["noop"]
    r = noop_server.embed([[101, 40000, 102]])  # outside the 30,522-token vocabulary
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_token_id"
