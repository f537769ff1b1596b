"""--quantization fp8 on the CPU: the quantization rule, the fp8 forward of each family against
the model's own fp32 outputs, the accuracy of the real all-MiniLM-L6-v2 on STSb in fp8, the
load-time refusal, and a real server started with the flag. (The Triton kernels and the CUDA
GEMMs are tested on the GPU: tests/gpu/test_gpu_fp8.py.)

On the CPU the fp8 numbers come from the same code (``ops.quantize_reference`` and PyTorch's
reference ``_scaled_mm``), so what is checked here is the scheme's accuracy, not a stand-in."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from bouquet.engine.kernels.rows import FP8_MAX, QRows, quantize_reference
from tests.fixtures.fp8_checkpoints import fp8_checkpoint
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
    from bouquet.engine.runtime.engine import Engine
    from bouquet.modelspec import load_spec

    return Engine(load_spec(str(model_dir)), "cpu", quantization=quantization, **kw)


def _forward(eng, seqs: list[np.ndarray]) -> np.ndarray:  # type: ignore[no-untyped-def]
    from bouquet.engine.runtime.batch import Batch

    return eng.forward(Batch.pack(seqs)).numpy()


@pytest.mark.parametrize("kind", ["bert", "qwen3", "gemma3"])
def test_fp8_forward_of_each_family_tracks_fp32_and_rows_are_independent(tmp_path: Path, kind: str) -> None:
    from bouquet.engine.linear.fp8 import set_fp8_min_tokens
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


def test_modernbert_runs_its_mlp_in_fp8_behind_the_same_gate(tmp_path: Path) -> None:
    """ModernBERT goes through the engine's linear layers like every family: --quantization fp8
    runs its GeGLU MLP in fp8 (Wo with row-wise scales: its LayerNorm kernel reads model-dtype rows only),
    close to the fp32 vectors, and the load-time gate applies to it as to the others."""
    from bouquet.engine.linear.fp8 import fp8_linears
    from tests.fixtures.tiny_models import make_tiny_model

    model_dir = make_tiny_model("modernbert", tmp_path / "m")
    ref, eng = _engine(model_dir), _engine(model_dir, "fp8", fp8_min_cosine=0.0)
    chosen = fp8_linears(eng.model)
    assert chosen and {p.kind for p in chosen} == {"up", "down"}
    assert {(p.kind, p.fp8_method.deferred) for p in chosen} == {("up", True), ("down", False)}
    rng = np.random.default_rng(5)
    seqs = [rng.integers(5, 200, size=int(n)).astype(np.int32) for n in rng.integers(2, 40, size=8)]
    got, want = _forward(eng, seqs), _forward(ref, seqs)
    assert cosine_rows(got, want).min() > 0.95 and not np.allclose(got, want, atol=1e-4)
    with pytest.raises(ValueError, match=r"refused for this model: .* cosine 0\.9\d+ .* bar is 0\.99999"):
        _engine(model_dir, "fp8", fp8_min_cosine=0.99999)


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

    from bouquet.engine.linear.fp8 import KINDS, enable_fp8, set_fp8_min_tokens
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
        n = len(s1) if kinds is None else 600  # the miss shows on a part too (a part's minimum is >= the whole's)
        if kinds is not None:
            enable_fp8(eng.model, eng.device, 0, kinds)
        set_fp8_min_tokens(eng.model, 0)  # every step in fp8, whatever its size
        b1, b2 = embed(eng, s1[:n]), embed(eng, s2[:n])
        rho_part = rho_ref if kinds is None else spearmanr(cosine_rows(a1[:n], a2[:n]), gold[:n])[0]
        assert abs(spearmanr(cosine_rows(b1, b2), gold[:n])[0] - rho_part) < 0.003
        cos = np.concatenate([cosine_rows(a1[:n], b1), cosine_rows(a2[:n], b2)])
        assert cos.max() < 0.99999  # it did run in fp8
        assert (cos.min() >= 0.995) == (kinds is None), (kinds, cos.min())


def test_serve_with_fp8_answers_close_to_fp32_and_bad_values_are_refused(tmp_path: Path) -> None:
    import httpx

    from tests.fixtures.tiny_models import make_tiny_model

    model_dir = make_tiny_model("bert", tmp_path / "bert")
    bad = subprocess.run([sys.executable, "-m", "bouquet", "serve", "--model", str(model_dir), "--quantization", "int3"],
                         cwd=REPO, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--quantization must be one of none, fp8, int8, got 'int3'" in bad.stderr
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


def test_deferred_scales_give_the_rowwise_gemm_and_every_consumer_takes_them() -> None:
    """A projection whose reader applies the scales (``defer``) returns ScaledRows from a unit-scale
    GEMM; applied, they are the row-wise scaled GEMM's output, and each consumer (add + RMSNorm,
    add + LayerNorm, the activations with or without the fp8 cast) reads them as those rows."""
    from bouquet.engine.kernels.rows import ScaledRows, materialize
    from bouquet.engine.kernels.layers import RMSNorm
    from bouquet.engine.kernels.ops import act_quant, add_layer_norm, add_rms_norm, quantize_rows, silu_mul
    from bouquet.engine.linear.base import Linear
    from bouquet.engine.linear.fp8 import quantize_linear

    torch.manual_seed(0)
    w, b = torch.randn(96, 64) * 0.1, torch.randn(96)
    rowwise, deferred = Linear(w, b, "up"), Linear(w, b, "up", readers="act")
    for p in (rowwise, deferred):
        quantize_linear(p, 1)
    assert deferred.fp8_method.deferred and not rowwise.fp8_method.deferred
    xq = quantize_rows(torch.randn(9, 64))
    got = deferred(xq)
    assert isinstance(got, ScaledRows) and got.shape == (9, 96) and got.bias is b
    assert not torch.allclose(got.raw, rowwise(xq), atol=1.0)  # the scales are not in raw
    dense = materialize(got)
    torch.testing.assert_close(dense, rowwise(xq), rtol=1e-5, atol=1e-5)
    r, norm, ln = torch.randn(9, 96), RMSNorm(96, 1e-6), torch.nn.LayerNorm(96)
    for res in (r, None):
        for a_, b_ in zip(add_rms_norm(got, res, norm), add_rms_norm(dense, res, norm)):
            assert torch.equal(a_, b_)
    assert torch.equal(add_layer_norm(got, r, ln), add_layer_norm(dense, r, ln))
    gate_up = deferred(quantize_rows(torch.randn(9, 64)))
    assert torch.equal(silu_mul(gate_up), silu_mul(materialize(gate_up)))
    q1, q2 = act_quant(gate_up, "silu", gated=True), act_quant(materialize(gate_up), "silu", gated=True)
    assert torch.equal(q1.values.view(torch.uint8), q2.values.view(torch.uint8)) and torch.equal(q1.scale, q2.scale)


@pytest.mark.parametrize("kind,dtype", [("bert", "float32"), ("qwen3", "float32"), ("qwen3", "float16")])
def test_fp8_runs_every_step_so_a_text_alone_equals_it_inside_a_large_batch(tmp_path: Path, kind: str,
                                                                             dtype: str) -> None:
    """fp8 on every step, whatever its size: with per-token activation scales a text's vector does not
    depend on what it is batched with (a 1,024-token threshold once made it ~4% different). Decoders
    defer their MLP's scales to the next kernel, except in fp16 (a unit-scale output could overflow
    it); encoders' q/k/v feed attention, so they keep the row-wise GEMM."""
    from bouquet.engine.linear.fp8 import fp8_linears
    from tests.fixtures.tiny_models import make_tiny_model

    eng = _engine(make_tiny_model(kind, tmp_path / kind), "fp8", fp8_min_cosine=0.0, dtype=dtype)
    chosen = fp8_linears(eng.model)
    assert chosen and all(p.fp8_min_tokens == 1 for p in chosen)
    assert {p.fp8_method.deferred for p in chosen} == {kind == "qwen3" and dtype == "float32"}
    rng = np.random.default_rng(7)
    seqs = [rng.integers(5, 200, size=60).astype(np.int32) for _ in range(30)]  # 1,800 tokens in one step
    big, alone = _forward(eng, seqs), _forward(eng, seqs[:1])
    tol = 1e-4 if dtype == "float32" else 2e-3  # fp16: rounding of a different GEMM blocking only
    np.testing.assert_allclose(alone[0], big[0], rtol=tol, atol=tol)


def test_qrows_shape_is_the_values_shape() -> None:
    q = QRows(torch.zeros(3, 16, dtype=torch.float8_e4m3fn), torch.ones(3, 1))
    assert q.shape == (3, 16) and q.dense is None


@pytest.mark.parametrize("kind,layout", [("qwen3", "channel"), ("bert", "channel"), ("bert", "tensor"), ("qwen3", "block")])
def test_checkpoint_stored_in_fp8_loads_as_stored(tmp_path: Path, kind: str, layout: str) -> None:
    """Without --quantization fp8 the model runs the dequantized weights (equal to a float32
    checkpoint of the same values); with it the fp8 matmuls use the stored e4m3 rows and scales
    unchanged (per-channel / per-tensor) or re-quantized per channel (block scales)."""
    from safetensors.torch import load_file

    from bouquet.engine.linear.fp8 import fp8_linears, set_fp8_min_tokens
    from tests.fixtures.tiny_models import make_tiny_model

    src = make_tiny_model(kind, tmp_path / "src")
    ckpt = fp8_checkpoint(src, tmp_path / "fp8", layout)
    ref = _engine(tmp_path / "fp8-dequantized")
    plain, fp8 = _engine(ckpt), _engine(ckpt, "fp8", fp8_min_cosine=0.0)
    assert plain.stored_fp8.description.startswith("checkpoint stores")
    rng = np.random.default_rng(3)
    seqs = [rng.integers(5, 200, size=int(n)).astype(np.int32) for n in rng.integers(2, 40, size=6)]
    np.testing.assert_allclose(_forward(plain, seqs), _forward(ref, seqs), rtol=1e-5, atol=1e-6)
    chosen = fp8_linears(fp8.model)
    assert chosen and all(p.fp8_method.from_checkpoint == (layout != "block") for p in chosen)
    if layout != "block":  # the first fp8 matmul's rows are the stored ones, in fused order
        state = load_file(str(ckpt / "model.safetensors"))
        p = chosen[0]
        parts = [n for n, t in fp8.model.named_parameters() if t.dim() == 2 and t.shape[1] == p.weight.shape[1]
                 and t.untyped_storage().data_ptr() == p.weight.untyped_storage().data_ptr()]
        parts = [n for _, n in sorted((dict(fp8.model.named_parameters())[n].storage_offset(), n) for n in parts)]
        want = torch.cat([state[n] for n in parts])
        assert torch.equal(p.fp8_method.weight.weight.view(torch.uint8), want.view(torch.uint8))
    set_fp8_min_tokens(fp8.model, 0)
    assert cosine_rows(_forward(fp8, seqs), _forward(ref, seqs)).min() > 0.99


def test_fp8_checkpoint_without_scales_is_refused_by_name(tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    from tests.fixtures.tiny_models import make_tiny_model

    ckpt = fp8_checkpoint(make_tiny_model("bert", tmp_path / "src"), tmp_path / "fp8", "channel")
    state = load_file(str(ckpt / "model.safetensors"))
    gone = next(k for k in state if k.endswith(".weight_scale"))
    del state[gone]
    save_file(state, str(ckpt / "model.safetensors"))
    with pytest.raises(ValueError, match=gone.replace(".", r"\.")):
        _engine(ckpt)


def test_fp8_with_the_noop_engine_is_refused_by_name() -> None:
    from bouquet.config import ConfigError, ServeConfig

    with pytest.raises(ConfigError, match="--quantization fp8 needs a model: --engine noop runs none"):
        ServeConfig(engine="noop", quantization="fp8").validate()
