"""--quantization fp8 on the CPU: the quantization rule, the fp8 forward of each family against
the model's own fp32 outputs, the accuracy of the real all-MiniLM-L6-v2 on STSb in fp8, the
load-time refusal, and a real server started with the flag. (The Triton kernels and the CUDA
GEMMs are tested on the GPU: tests/test_gpu_fp8.py.)

On the CPU the fp8 numbers come from the same code (``ops.quantize_reference`` and PyTorch's
reference ``_scaled_mm``), so what is checked here is the scheme's accuracy, not a stand-in."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from bouquet.engine.ops import FP8_MAX, QRows, quantize_reference
from tests.helpers import REPO, BouquetProcess, cosine_rows, read_sts


def test_quantization_rule_is_per_row_amax_over_448() -> None:
    x = torch.randn(50, 384) * torch.logspace(-3, 3, 50)[:, None]  # rows of very different sizes
    x[7] = 0.0  # a padding row
    q, scale = quantize_reference(x)
    assert q.dtype == torch.float8_e4m3fn and scale.shape == (50, 1) and scale.dtype == torch.float32
    torch.testing.assert_close(scale[:, 0], (x.abs().amax(1) / FP8_MAX).clamp(min=1e-12 / FP8_MAX))
    deq = q.float() * scale
    assert torch.equal(deq[7], torch.zeros(384))
    assert (q.float().abs().amax(1)[torch.arange(50) != 7] == FP8_MAX).all()  # each row's largest value is ±448
    # e4m3 keeps 3 mantissa bits: every normal value within 1/16 of itself (relative)
    normal = q.float().abs() >= 2.0 ** -6
    assert ((deq - x).abs()[normal] <= x.abs()[normal] / 16 + 1e-30).all()


def _engine(model_dir: Path, quantization: str = "none", **kw: object):  # type: ignore[no-untyped-def]
    from bouquet.engine.engine import Engine
    from bouquet.modelspec import load_spec

    return Engine(load_spec(str(model_dir)), "cpu", quantization=quantization, **kw)


def _forward(eng, seqs: list[np.ndarray]) -> np.ndarray:  # type: ignore[no-untyped-def]
    from bouquet.engine.batch import Batch

    return eng.forward(Batch.pack(seqs)).numpy()


@pytest.mark.parametrize("kind", ["bert", "qwen3", "gemma3"])
def test_fp8_forward_of_each_family_tracks_fp32_and_rows_are_independent(tmp_path: Path, kind: str) -> None:
    from bouquet.engine.quant import set_fp8_min_tokens
    from tests.fixtures.tiny_models import make_tiny_model

    model_dir = make_tiny_model(kind, tmp_path / kind)
    ref, eng = _engine(model_dir), _engine(model_dir, "fp8", fp8_min_cosine=0.0)
    assert eng.fp8_cosine[0] > 0.95  # the load-time probe ran in fp8 (tiny models, initializer_range 0.2)
    set_fp8_min_tokens(eng.model, 0)  # every step in fp8, whatever its size
    rng = np.random.default_rng(0)
    seqs = [rng.integers(5, 200, size=int(n)).astype(np.int32) for n in rng.integers(2, 60, size=12)]
    got, want = _forward(eng, seqs), _forward(ref, seqs)
    assert cosine_rows(got, want).min() > 0.95
    assert not np.allclose(got, want, atol=1e-4)  # it did run in fp8
    # per-token activation scales: a row's result does not depend on the rows batched with it
    alone = np.concatenate([_forward(eng, [s]) for s in seqs[:3]])
    np.testing.assert_allclose(got[:3], alone, atol=1e-5, rtol=1e-4)


def test_fp8_refuses_an_architecture_without_an_fp8_path(tmp_path: Path) -> None:
    from tests.fixtures.tiny_models import make_tiny_model

    with pytest.raises(ValueError, match="not supported for ModernBertModel"):
        _engine(make_tiny_model("modernbert", tmp_path / "m"), "fp8")


def test_fp8_refuses_a_model_whose_probe_misses_the_bar(tmp_path: Path) -> None:
    from tests.fixtures.tiny_models import make_tiny_model

    with pytest.raises(ValueError, match=r"refused for this model: .* cosine 0\.9\d+ .* bar is 0\.99999"):
        _engine(make_tiny_model("bert", tmp_path / "b"), "fp8", fp8_min_cosine=0.99999)


@pytest.mark.slow
def test_minilm_fp8_on_stsb_meets_the_bars_with_the_default_matmuls_only() -> None:
    """The issue-14 bars for real weights: Spearman within 0.003 of the unquantized model and every
    vector's cosine ≥ 0.995. all-MiniLM-L6-v2 meets both with its default fp8 matmuls (qkv); with
    all four of a layer's matmuls in fp8 it keeps the Spearman but misses the cosine bar (e4m3's 3
    mantissa bits over 24 small matmuls): why encoders run only qkv in fp8."""
    from scipy.stats import spearmanr
    from tokenizers import Tokenizer

    from bouquet.engine.quant import KINDS, enable_fp8, set_fp8_min_tokens
    from bouquet.modelspec import resolve_model_path

    model_dir = resolve_model_path(None)
    ref, eng = _engine(model_dir), _engine(model_dir, "fp8")  # the default bar: accepted
    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    tok.enable_truncation(256)
    tok.no_padding()
    s1, s2, gold = read_sts("test")

    def embed(e, texts: list[str]) -> np.ndarray:  # type: ignore[no-untyped-def]
        ids = [np.asarray(t.ids, np.int32) for t in tok.encode_batch(texts)]
        return np.concatenate([_forward(e, ids[i:i + 256]) for i in range(0, len(ids), 256)])

    a1, a2 = embed(ref, s1), embed(ref, s2)
    rho_ref = spearmanr(cosine_rows(a1, a2), gold)[0]
    assert abs(rho_ref - 0.82032) < 5e-4  # sentence-transformers' figure for this model
    for kinds in (None, KINDS):
        if kinds is not None:
            enable_fp8(eng.model, eng.device, 0, kinds)
        set_fp8_min_tokens(eng.model, 0)  # every step in fp8, whatever its size
        b1, b2 = embed(eng, s1), embed(eng, s2)
        assert abs(spearmanr(cosine_rows(b1, b2), gold)[0] - rho_ref) < 0.003
        cos = np.concatenate([cosine_rows(a1, b1), cosine_rows(a2, b2)])
        assert cos.max() < 0.99999  # it did run in fp8
        assert (cos.min() >= 0.995) == (kinds is None), (kinds, cos.min())


def test_serve_with_fp8_answers_close_to_fp32_and_bad_values_are_refused(tmp_path: Path) -> None:
    import httpx

    from tests.fixtures.tiny_models import make_tiny_model

    model_dir = make_tiny_model("bert", tmp_path / "bert")
    bad = subprocess.run([sys.executable, "-m", "bouquet", "serve", "--model", str(model_dir), "--quantization", "int3"],
                         cwd=REPO, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--quantization must be one of ('none', 'fp8')" in bad.stderr
    texts = [" ".join(f"word{i}" for i in range(n)) for n in range(1, 60)]  # 1,000+ tokens in one request
    rows = {}
    for q in ("none", "fp8"):
        srv = BouquetProcess("--model", str(model_dir), "--quantization", q)
        try:
            r = httpx.post(srv.url + "/v1/embeddings", json={"input": texts}, timeout=60)
            assert r.status_code == 200, r.text
            rows[q] = np.array([d["embedding"] for d in r.json()["data"]])
            if q == "fp8":
                assert "quantization: fp8 e4m3 for 2 matmuls (qkv of every layer" in srv.log()
        finally:
            srv.stop()
    cos = cosine_rows(rows["fp8"], rows["none"])
    assert cos.min() > 0.98 and not np.allclose(rows["fp8"], rows["none"], atol=1e-5)


def test_qrows_shape_is_the_values_shape() -> None:
    q = QRows(torch.zeros(3, 16, dtype=torch.float8_e4m3fn), torch.ones(3, 1))
    assert q.shape == (3, 16) and q.dense is None
