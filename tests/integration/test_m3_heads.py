"""bge-m3's sparse and ColBERT heads (issue 15 item 3): a tiny XLM-R with random
``sparse_linear.pt`` / ``colbert_linear.pt`` beside it, served by ``bouquet serve``. The lexical
weights on ``/embed_sparse`` and the ColBERT vectors on ``/embed_all`` (and the ``output``
extension of ``/v1/embeddings``) equal FlagEmbedding's formulas applied to transformers' hidden
states with the same weights: weight = relu(sparse_linear(h)), the largest per token id, special
tokens left out; ColBERT = normalize(colbert_linear(h)) for every token but the first. Heads that
are not plain tensors are refused at load, naming the file.
"""
from __future__ import annotations

from pathlib import Path

import httpx
import numpy as np
import pytest
import torch

from bouquet.engine.runtime.engine import Engine
from bouquet.engine.models.weights import WeightError
from bouquet.modelspec import load_spec
from bouquet.tokenization import TextTokenizer
from helpers import BouquetProcess, cosine_rows
from tests.fixtures.tiny_models import make_tiny_model

TEXTS = ["x", "hello world hello", "a somewhat longer sentence about search and ranking"]
SPECIAL = {0, 1, 2, 3}  # the tiny XLM-R tokenizer's <s> <pad> </s> <unk>
COLBERT_DIM = 32


@pytest.fixture(scope="module")
def m3_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = make_tiny_model("xlmr", tmp_path_factory.mktemp("m3") / "xlmr")
    g = torch.Generator().manual_seed(3)
    torch.save({"weight": torch.randn(1, 64, generator=g) * 0.2, "bias": torch.tensor([0.05])}, d / "sparse_linear.pt")
    torch.save({"weight": torch.randn(COLBERT_DIM, 64, generator=g) * 0.2, "bias": torch.randn(COLBERT_DIM, generator=g)},
               d / "colbert_linear.pt")
    return d


def reference(d: Path, ids: list[np.ndarray]) -> tuple[list[dict[int, float]], list[np.ndarray]]:
    """Per input: {token id: weight} and the ColBERT vectors [len - 1, C], from transformers."""
    import transformers as tf

    model = tf.XLMRobertaModel.from_pretrained(str(d), add_pooling_layer=False).eval()
    sp, cb = torch.load(d / "sparse_linear.pt"), torch.load(d / "colbert_linear.pt")
    lexical, colbert = [], []
    with torch.inference_mode():
        for s in ids:
            h = model(input_ids=torch.from_numpy(s.astype(np.int64))[None]).last_hidden_state[0]  # [L, H]
            w = torch.relu(h @ sp["weight"].T + sp["bias"])[:, 0].numpy()
            terms: dict[int, float] = {}
            for t, v in zip(s.tolist(), w.tolist()):
                if t not in SPECIAL and v > 0:
                    terms[t] = max(terms.get(t, 0.0), v)
            lexical.append(terms)
            colbert.append(torch.nn.functional.normalize(h[1:] @ cb["weight"].T + cb["bias"], dim=-1).numpy())
    return lexical, colbert


def check_terms(got: list[dict], want: dict[int, float]) -> None:
    assert [t["index"] for t in got] == sorted(want)
    for t in got:  # relative 1e-4, with float32's rounding floor for values near zero
        assert abs(t["value"] - want[t["index"]]) <= 1e-4 * want[t["index"]] + 2e-6, (t, want[t["index"]])


@pytest.mark.parametrize("transport", ["auto", "grpc"])
def test_m3_heads_served(m3_dir, transport):
    """The heads' outputs over HTTP equal FlagEmbedding's, whether the gateway reaches its replica
    by the Unix socket (auto) or by gRPC (its per-token replies carry [T, D'] rows too)."""
    spec = load_spec(str(m3_dir))
    assert spec.token_heads
    ids = TextTokenizer(spec).encode(TEXTS).ids
    lexical, colbert = reference(m3_dir, ids)
    assert sum(map(len, lexical)) > 5 and any(len(set(s.tolist())) < len(s) for s in ids)  # a repeated token too
    srv = BouquetProcess("--model", str(m3_dir), "--log-level", "warning", "--transport", transport)
    try:
        want_transport = "grpc" if transport == "grpc" else "ipc"
        assert all(r["transport"] == want_transport for r in httpx.get(srv.url + "/health").json()["replicas"])
        r = httpx.post(srv.url + "/embed_sparse", json={"inputs": TEXTS}, timeout=60)
        assert r.status_code == 200, r.text
        for got, want in zip(r.json(), lexical):
            check_terms(got, want)
        r = httpx.post(srv.url + "/embed_all", json={"inputs": TEXTS}, timeout=60)
        assert r.status_code == 200, r.text
        for got, want in zip(r.json(), colbert):
            got = np.asarray(got, dtype=np.float32)
            assert got.shape == want.shape == (len(want), COLBERT_DIM)
            assert cosine_rows(got, want).min() >= 0.9999
        body = httpx.post(srv.url + "/v1/embeddings", json={"input": TEXTS, "output": "sparse", "top_k": 2},
                          timeout=60).json()
        for item, want in zip(body["data"], lexical):
            top = sorted(sorted(want, key=lambda k: -want[k])[:2])
            assert item["object"] == "sparse_embedding" and item["embedding"]["indices"] == top
        assert body["usage"]["prompt_tokens"] == sum(len(s) for s in ids)
        body = httpx.post(srv.url + "/v1/embeddings", json={"input": TEXTS[2], "output": "multi_vector"}, timeout=60).json()
        assert cosine_rows(np.asarray(body["data"][0]["embedding"], np.float32), colbert[2]).min() >= 0.9999
        dense = srv.vectors(TEXTS)  # the dense output is unchanged by the heads
        assert dense.shape == (len(TEXTS), 64)
    finally:
        srv.stop()


def test_pickled_head_is_refused(m3_dir, tmp_path):
    """A head saved as a pickled module (not a dict of tensors) fails torch's weights-only loader:
    the engine refuses to start and names the file."""
    import shutil

    d = tmp_path / "m3"
    shutil.copytree(m3_dir, d)
    torch.save(torch.nn.Linear(64, COLBERT_DIM), d / "colbert_linear.pt")  # a whole module: pickled code
    with pytest.raises(WeightError, match="colbert_linear.pt.*weights_only=True"):
        Engine(load_spec(str(d)), "cpu", "float32")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_token_outputs_on_cuda(m3_dir):
    """``step_tokens`` on the GPU (bf16, pinned copy back) agrees with the CPU in float32."""
    from bouquet.engine.runtime.batch import Batch

    spec = load_spec(str(m3_dir))
    batch = Batch.pack(TextTokenizer(spec).encode(TEXTS).ids)
    ref = Engine(spec, "cpu", "float32").step_tokens(batch).wait()
    got = Engine(spec, "cuda", "bfloat16").step_tokens(batch).wait()
    assert got.shape == ref.shape == (batch.num_tokens, 1 + COLBERT_DIM)
    assert np.abs(got[:, 0] - ref[:, 0]).max() < 0.05 * max(1.0, float(ref[:, 0].max()))
    assert cosine_rows(got[:, 1:], ref[:, 1:]).min() >= 0.99
