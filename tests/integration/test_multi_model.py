"""Several models behind one endpoint (issue 15 item 5): one real `bouquet serve --model A --model B`
on the CPU, the embedded all-MiniLM-L6-v2 and a tiny random cross-encoder, each model with its own
replica; every answer equals the single-model server's for the same model."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import httpx
import numpy as np
import openai
import pytest

from bouquet.config import ServeConfig
from bouquet.modelspec import resolve_model_path
from tests.fixtures.tiny_models import make_tiny_model
from helpers import REPO, BouquetProcess, cosine_rows

MINILM = str(resolve_model_path(None))
TEXTS = ["a search query about rivers", "the mountain city at night", "x", "fast red engine " * 40]
QUERY = "search query river"
DOCS = ["the river runs through the city", "blue music paper", "a river and a mountain", "river"]


@pytest.fixture(scope="module")
def cross_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model("bert-cross", tmp_path_factory.mktemp("tiny-cross"))


@pytest.fixture(scope="module")
def multi(cross_dir: Path) -> Iterator[BouquetProcess]:
    srv = BouquetProcess("--model", MINILM, "--model", str(cross_dir),
                         "--served-model-name", "minilm", "--served-model-name", "tiny-rr")
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def cross_single(cross_dir: Path) -> Iterator[BouquetProcess]:
    srv = BouquetProcess("--model", str(cross_dir))
    yield srv
    srv.stop()


def post(srv: BouquetProcess, path: str, body: dict[str, object]) -> httpx.Response:
    return httpx.post(srv.url + path, json=body, timeout=120)


def rerank_scores(srv: BouquetProcess, **extra: object) -> np.ndarray:
    """/v1/rerank relevance scores in document order."""
    r = post(srv, "/v1/rerank", {"query": QUERY, "documents": DOCS, **extra})
    assert r.status_code == 200, r.text
    out = np.zeros(len(DOCS))
    for item in r.json()["results"]:
        out[item["index"]] = item["relevance_score"]
    return out


def test_each_model_answers_as_its_own_single_model_server(multi, minilm_server, cross_single) -> None:
    want = minilm_server.vectors(TEXTS)
    for extra in ({"model": "minilm"}, {}):  # no 'model': the first embedding model
        got = multi.vectors(TEXTS, **extra)
        assert cosine_rows(got, want).min() >= 0.99999
    tei = post(multi, "/embed", {"inputs": TEXTS})  # TEI route without 'model'
    assert tei.status_code == 200, tei.text
    assert cosine_rows(np.asarray(tei.json()), want).min() >= 0.99999

    ref = rerank_scores(cross_single)
    assert np.ptp(ref) > 1e-3  # the tiny model tells documents apart: the comparison means something
    for extra in ({"model": "tiny-rr"}, {}):  # no 'model': the first scoring model
        np.testing.assert_allclose(rerank_scores(multi, **extra), ref, atol=1e-5)
    score = post(multi, "/v1/score", {"model": "tiny-rr", "text_1": QUERY, "text_2": DOCS})
    assert score.status_code == 200, score.text
    assert score.json()["model"] == "tiny-rr"
    np.testing.assert_allclose([d["score"] for d in score.json()["data"]], ref, atol=1e-5)
    tei_rr = post(multi, "/rerank", {"query": QUERY, "texts": DOCS})
    assert tei_rr.status_code == 200, tei_rr.text
    np.testing.assert_allclose(sorted(x["score"] for x in tei_rr.json()), sorted(ref), atol=1e-5)


def test_models_lists_and_finds_each(multi) -> None:
    listed = httpx.get(multi.url + "/v1/models").json()
    assert [m["id"] for m in listed["data"]] == ["minilm", "tiny-rr"]
    for name in ("minilm", "tiny-rr"):
        r = httpx.get(f"{multi.url}/v1/models/{name}")
        assert r.status_code == 200 and r.json()["id"] == name
    r = httpx.get(multi.url + "/v1/models/nope")
    assert r.status_code == 404 and "'minilm', 'tiny-rr'" in r.json()["error"]["message"]


def test_wrong_kind_is_a_clear_400_naming_the_model_to_use(multi) -> None:
    r = multi.embed(TEXTS[:1], model="tiny-rr")
    assert r.status_code == 400 and r.json()["error"]["code"] == "wrong_task"
    assert "'minilm'" in r.json()["error"]["message"]
    for path, body in (("/v1/rerank", {"query": QUERY, "documents": DOCS}),
                       ("/v1/score", {"text_1": QUERY, "text_2": DOCS})):
        r = post(multi, path, {"model": "minilm", **body})
        err = r.json()["error"]
        assert r.status_code == 400 and err["code"] == "wrong_task" and err["param"] == "model", r.text
        assert "use model 'tiny-rr'" in err["message"]
    r = post(multi, "/rerank", {"model": "minilm", "query": QUERY, "texts": DOCS})  # TEI shape
    assert r.status_code == 400 and "use model 'tiny-rr'" in r.json()["error"], r.text
    r = post(multi, "/embed", {"model": "tiny-rr", "inputs": "x"})
    assert r.status_code == 400 and "use model 'minilm'" in r.json()["error"], r.text
    r = multi.embed("x", model="nope")
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
    r = multi.embed("x", model=["minilm"])
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_type"


def test_health_and_metrics_cover_every_model(multi) -> None:
    r = httpx.get(multi.url + "/health")
    assert r.status_code == 200
    body = r.json()
    assert body["status"] == "ok"
    assert [(m["model"], m["task"], m["status"]) for m in body["models"]] == [("minilm", "embed", "ok"),
                                                                             ("tiny-rr", "score", "ok")]
    assert all(len(m["replicas"]) == 1 and m["replicas"][0]["healthy"] for m in body["models"])
    text = httpx.get(multi.url + "/metrics").text
    ups = [line for line in text.splitlines() if line.startswith("bouquet_replica_up{")]
    assert len(ups) == 2 and any('model="minilm"' in u for u in ups) and any('model="tiny-rr"' in u for u in ups)


def test_openai_client_with_each_name(multi, minilm_server) -> None:
    client = openai.OpenAI(base_url=multi.url + "/v1", api_key="unused", max_retries=0)
    got = client.embeddings.create(model="minilm", input=TEXTS[:2])
    assert got.model == "minilm"
    want = minilm_server.vectors(TEXTS[:2])
    assert cosine_rows(np.asarray([d.embedding for d in got.data]), want).min() >= 0.99999
    with pytest.raises(openai.BadRequestError, match="wrong_task|scoring model"):
        client.embeddings.create(model="tiny-rr", input="x")
    with pytest.raises(openai.NotFoundError):
        client.embeddings.create(model="nope", input="x")


def test_gateway_workers_serve_every_model_by_directory_name(cross_dir, minilm_server, cross_single) -> None:
    """Without --served-model-name each model is named by its --model value; every worker routes."""
    srv = BouquetProcess("--model", MINILM, "--model", str(cross_dir), "--gateway-workers", "2")
    try:
        assert [m["id"] for m in httpx.get(srv.url + "/v1/models").json()["data"]] == [MINILM, str(cross_dir)]
        want, ref = minilm_server.vectors(TEXTS), rerank_scores(cross_single)
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0)
        for _ in range(4):  # new connections: both workers answer some of them
            got = client.embeddings.create(model=MINILM, input=TEXTS)
            assert cosine_rows(np.asarray([d.embedding for d in got.data]), want).min() >= 0.99999
            np.testing.assert_allclose(rerank_scores(srv, model=str(cross_dir)), ref, atol=1e-5)
    finally:
        srv.stop()


def test_per_model_configs() -> None:
    cfg = ServeConfig(model="a", models=("a", "b"), served_model_name=("x", "y"), grpc_port=9000, replicas=2).validate()
    a, b = cfg.per_model()
    assert (a.model, a.served_model_name, a.grpc_port, a.models) == ("a", ("x",), 9000, ())
    assert (b.model, b.served_model_name, b.grpc_port, b.replicas) == ("b", ("y",), 9002, 2)
    assert ServeConfig(model="a").per_model() == [ServeConfig(model="a")]


@pytest.mark.parametrize("args, message", [
    (["--model", "a", "--model", "b", "--served-model-name", "x"], "one --served-model-name per model"),
    (["--model", "a", "--model", "b", "--server", "127.0.0.1:1"], "--server serves one model"),
    (["--model", MINILM, "--model", MINILM], f"--model #1 ({MINILM}) and --model #2 ({MINILM}) are both named"),
])
def test_bad_multi_model_command_lines_fail_at_start(args: list[str], message: str) -> None:
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "bouquet", "serve", "--device", "cpu", *args], cwd=REPO,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and message in r.stderr, r.stderr
    assert time.monotonic() - t0 < 60  # refused before any replica starts


def test_a_failing_second_model_is_named(tmp_path: Path) -> None:
    """A model whose replica fails after start-up checks (its config does not match its weights)
    is named in the one error line when several are served (fresh-clone trial: it said only
    'server replica: ...')."""
    bad = tmp_path / "bad"
    shutil.copytree(MINILM, bad)
    cfg = json.loads((bad / "config.json").read_text())
    (bad / "config.json").write_text(json.dumps({**cfg, "hidden_size": 256}))
    r = subprocess.run([sys.executable, "-m", "bouquet", "serve", "--device", "cpu", "--port", "0", "--model", MINILM,
                        "--model", str(bad), "--served-model-name", "a", "--served-model-name", "b"], cwd=REPO,
                       capture_output=True, text=True, timeout=180, env={**os.environ, "TMPDIR": str(tmp_path)})
    last = r.stderr.strip().splitlines()[-1]
    assert r.returncode == 1 and last.startswith("error: server replica") and f"(model {bad})" in last, r.stderr[-2000:]
    assert "checkpoint shape (384,)" in last
    assert list(tmp_path.glob("bouquet-*/")) == []  # no work folder left
