"""fp8 on the GPU: each quantizing Triton kernel against ``ops.quantize_reference`` of the bf16
path's output, the fp8 GEMM against a dequantized fp32 matmul, and whole models in fp8: close to
bf16, CUDA-graph replay == eager for fp8 buckets (fp8 tensor cores: compute capability 8.9+)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 9), reason="needs fp8 tensor cores")]


def _same_fp8(got, want_rows: torch.Tensor) -> None:  # type: ignore[no-untyped-def]
    """QRows ``got`` == quantize_reference(want_rows): scales to fp32 rounding; values equal but for
    at most 0.1% of entries (or 8, for a row or two: one row of 3,072 had 4 on an H100), each within
    one e4m3 step (1/8 relative: an input one bf16 step apart, or fp32 division order, can round to
    the next fp8 value)."""
    from bouquet.engine.kernels.rows import quantize_reference

    q, s = quantize_reference(want_rows)
    torch.testing.assert_close(got.scale, s, rtol=1e-6, atol=0)
    a, b = got.values.float(), q.float()
    assert int((a != b).sum()) <= max(8, 1e-3 * a.numel())
    torch.testing.assert_close(a, b, rtol=0.13, atol=2.0 ** -8)


@pytest.mark.parametrize("T", [1, 130, 4096])
def test_norm_kernels_write_the_reference_fp8_rows(T: int) -> None:
    from bouquet.engine.kernels.layers import RMSNorm
    from bouquet.engine.kernels.ops import add_layer_norm, add_rms_norm

    for unit in (False, True):
        norm = RMSNorm(1024, 1e-6, unit).to("cuda", torch.bfloat16)
        torch.nn.init.normal_(norm.weight)
        x, r = (torch.randn(T, 1024, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        (q, s), (want, s_ref) = add_rms_norm(x, r, norm, fp8=True), add_rms_norm(x, r, norm)
        assert torch.equal(s, s_ref)
        _same_fp8(q, want)
    ln = torch.nn.LayerNorm(768, eps=1e-12, device="cuda", dtype=torch.bfloat16)
    torch.nn.init.normal_(ln.weight)
    torch.nn.init.normal_(ln.bias)
    x, r = (torch.randn(T, 768, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    got, want = add_layer_norm(x, r, ln, fp8=True), add_layer_norm(x, r, ln)
    assert torch.equal(got.dense, want)
    _same_fp8(got, want)


@pytest.mark.parametrize("T", [1, 130, 4096])
def test_activation_kernels_write_the_reference_fp8_rows(T: int) -> None:
    from bouquet.engine.kernels.ops import act_quant, gelu_tanh_mul, quantize_rows, silu_mul

    gu = torch.randn(T, 2 * 3072, device="cuda", dtype=torch.bfloat16) * 3
    _same_fp8(silu_mul(gu, fp8=True), silu_mul(gu))
    _same_fp8(gelu_tanh_mul(gu, fp8=True), gelu_tanh_mul(gu))
    x = gu[:, :3072].contiguous()
    _same_fp8(quantize_rows(x), x)
    _same_fp8(act_quant(x, "gelu"), torch.nn.functional.gelu(x))
    _same_fp8(act_quant(x, "relu"), torch.relu(x))
    for n in (3584, 896, 100):  # tiles 2,048 + 1,024 + 512; 512 + 256 + 128; one tile of 128, masked past 100
        g2 = torch.randn(T, 2 * n, device="cuda", dtype=torch.bfloat16) * 3
        y = g2[:, :n].contiguous()
        _same_fp8(act_quant(y, "gelu"), torch.nn.functional.gelu(y))
        _same_fp8(silu_mul(g2, fp8=True), silu_mul(g2))


def test_fp8_gemm_equals_the_dequantized_matmul() -> None:
    from bouquet.engine.linear.base import Linear
    from bouquet.engine.kernels.ops import quantize_rows
    from bouquet.engine.linear.fp8 import quantize_linear

    w = torch.randn(2304, 768, device="cuda", dtype=torch.bfloat16) * 0.05
    b = torch.randn(2304, device="cuda", dtype=torch.bfloat16)
    p = Linear(w, b, "qkv")
    quantize_linear(p, 0)
    fp8 = p.fp8_method.weight
    assert fp8 is not None
    for T in (1, 100, 5000):
        xq = quantize_rows(torch.randn(T, 768, device="cuda", dtype=torch.bfloat16))
        want = (xq.values.float() * xq.scale) @ (fp8.weight.float() * fp8.scale.t()).t() + b.float()
        torch.testing.assert_close(p(xq).float(), want, rtol=2e-2, atol=2e-2)


def _scaled(T: int, N: int, bias: bool):  # type: ignore[no-untyped-def]
    """ScaledRows [T, N] as a unit-scale fp8 GEMM writes them: raw in the hundreds, small scales."""
    from bouquet.engine.kernels.rows import ScaledRows

    def dev(t: torch.Tensor) -> torch.Tensor:
        return t.to("cuda")

    raw = dev(torch.randn(T, N) * 300).to(torch.bfloat16)
    b = dev(torch.randn(N)).to(torch.bfloat16) if bias else None
    return ScaledRows(raw, dev(torch.rand(T, 1) * 1e-3 + 1e-4), dev(torch.rand(1, N) * 1e-2 + 1e-3), b, torch.bfloat16)


def _one_step(got: torch.Tensor, want: torch.Tensor) -> None:
    """Equal but for rare one-ulp moves (the kernel's fp32 multiply-add order vs PyTorch's); where
    a moved input feeds a product (SiLU(gate) · up), the output can move two ulps."""
    assert (got != want).float().mean() < 2e-3
    torch.testing.assert_close(got.float(), want.float(), rtol=2 ** -6, atol=1e-6)


@pytest.mark.parametrize("T", [1, 130, 4096])
def test_kernels_apply_deferred_scales_as_pytorch_does(T: int) -> None:
    """Each consumer of ScaledRows (add + RMSNorm, add + LayerNorm, the gated activation with and
    without the fp8 cast, the plain one with it) on the device == the same kernel on the rows
    ``materialize`` makes."""
    from bouquet.engine.kernels.rows import materialize
    from bouquet.engine.kernels.layers import RMSNorm
    from bouquet.engine.kernels.ops import act_quant, add_layer_norm, add_rms_norm, silu_mul

    for bias in (False, True):
        x = _scaled(T, 1024, bias)
        r = torch.randn(T, 1024, device="cuda", dtype=torch.bfloat16)
        dense = materialize(x)
        norm = RMSNorm(1024, 1e-6).to("cuda", torch.bfloat16)
        torch.nn.init.normal_(norm.weight)
        for res in (r, None):
            (y, s), (y_ref, s_ref) = add_rms_norm(x, res, norm), add_rms_norm(dense, res, norm)
            _one_step(s, s_ref)
            _one_step(y, y_ref)
            _same_fp8(add_rms_norm(x, res, norm, fp8=True)[0], y_ref)
        ln = torch.nn.LayerNorm(1024, eps=1e-12, device="cuda", dtype=torch.bfloat16)
        torch.nn.init.normal_(ln.weight)
        _one_step(add_layer_norm(x, r, ln), add_layer_norm(dense, r, ln))
        gu = _scaled(T, 2 * 3072, bias)
        _same_fp8(silu_mul(gu, fp8=True), silu_mul(materialize(gu)))
        _one_step(silu_mul(gu), silu_mul(materialize(gu)))  # gate/up in fp8, down not: bf16 out
        u = _scaled(T, 3072, bias)
        _same_fp8(act_quant(u, "gelu"), torch.nn.functional.gelu(materialize(u)))


def test_deferred_fp8_gemm_equals_the_rowwise_one() -> None:
    """Unit-scale GEMM + scales applied afterwards == the row-wise scaled GEMM, to bf16 rounding."""
    from bouquet.engine.kernels.rows import ScaledRows, materialize
    from bouquet.engine.kernels.ops import quantize_rows
    from bouquet.engine.linear.base import Linear
    from bouquet.engine.linear.fp8 import quantize_linear

    w = torch.randn(3072, 1024, device="cuda", dtype=torch.bfloat16) * 0.05
    b = torch.randn(3072, device="cuda", dtype=torch.bfloat16)
    rowwise, deferred = Linear(w, b, "up"), Linear(w, b, "up", readers="act")
    for p in (rowwise, deferred):
        quantize_linear(p, 0)
    assert deferred.fp8_method.deferred and not rowwise.fp8_method.deferred
    for T in (1, 100, 5000):
        xq = quantize_rows(torch.randn(T, 1024, device="cuda", dtype=torch.bfloat16))
        got = deferred(xq)
        assert isinstance(got, ScaledRows) and got.raw.dtype == torch.bfloat16
        torch.testing.assert_close(materialize(got).float(), rowwise(xq).float(), rtol=2 ** -7, atol=2e-2)


def _cos(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


@pytest.mark.parametrize("shape", ["minilm", "qwen3-tiny"])
def test_fp8_model_tracks_bf16_and_graph_replay_equals_eager(tmp_path: Path, shape: str) -> None:
    from bouquet.bench.models import SHAPES, make_model_dir, tiny
    from bouquet.engine.runtime.batch import Batch
    from bouquet.engine.runtime.engine import Engine, GraphOptions
    from bouquet.engine.linear.fp8 import fp8_linears
    from bouquet.modelspec import load_spec
    from tests.gpu.test_gpu_fastpath import _tokenizer

    s = tiny(SHAPES["qwen3-0.6b"], hidden=128) if shape == "qwen3-tiny" else SHAPES[shape]
    spec = load_spec(str(make_model_dir(s, tmp_path, _tokenizer())))
    eng = Engine(spec, "cuda", graphs=GraphOptions(debug=True), quantization="fp8", fp8_min_cosine=0.0)
    ref = Engine(spec, "cuda", graphs=GraphOptions(enabled=False))
    rng = np.random.default_rng(0)
    for lengths in ([128] * 12, list(rng.integers(16, 257, size=12)), [7, 300]):
        batch = Batch.pack([rng.integers(1000, 30000, size=int(n), dtype=np.int32) for n in lengths])
        rows = [eng.step(batch).wait() for _ in range(3)]  # eager, capture + replay, replay
        want = eng.forward(batch).cpu().numpy()
        for r in rows:  # graph vs eager: the same math, but attention may take another kernel (cuDNN
            # for equal lengths eagerly, varlen in the graph): a bf16 ulp there can move an fp8
            # value one e4m3 step, so rows agree by cosine, not elementwise
            assert _cos(r, want).min() > 0.999
        bf16 = ref.forward(batch).cpu().numpy()
        cos = _cos(want, bf16)
        if any(p.reads_fp8(batch.num_tokens) for p in fp8_linears(eng.model)):
            assert cos.min() > 0.98 and not np.array_equal(want, bf16)
        else:  # small steps keep the bf16 weights (row-wise projections, e.g. MiniLM's qkv, below
            # FP8_MIN_TOKENS): the bf16 engine's rows (to float32 rounding)
            np.testing.assert_allclose(want, bf16, atol=1e-6, rtol=1e-6)
    assert eng.graph_captures == 3
    deferred = [p for p in fp8_linears(eng.model) if p.fp8_method.deferred]
    assert bool(deferred) == (shape == "qwen3-tiny")  # the decoder's MLP; MiniLM's qkv feeds attention


def test_checkpoint_stored_in_fp8_runs_its_own_rows_on_the_gpu(tmp_path: Path) -> None:
    """A Qwen3 checkpoint stored in e4m3 with per-channel scales: the fp8 GEMMs use the stored
    rows unchanged (on the device), and the model tracks its dequantized bf16 weights."""
    from bouquet.engine.runtime.batch import Batch
    from bouquet.engine.runtime.engine import Engine
    from bouquet.engine.linear.fp8 import fp8_linears, set_fp8_min_tokens
    from bouquet.modelspec import load_spec
    from tests.fixtures.tiny_models import make_tiny_model
    from tests.fixtures.fp8_checkpoints import fp8_checkpoint

    ckpt = fp8_checkpoint(make_tiny_model("qwen3", tmp_path / "src"), tmp_path / "fp8", "channel")
    eng = Engine(load_spec(str(ckpt)), "cuda", quantization="fp8", fp8_min_cosine=0.0)
    ref = Engine(load_spec(str(tmp_path / "fp8-dequantized")), "cuda")
    chosen = fp8_linears(eng.model)
    assert chosen and all(p.fp8_method.from_checkpoint and p.fp8_method.weight.weight.is_cuda for p in chosen)
    set_fp8_min_tokens(eng.model, 0)
    rng = np.random.default_rng(1)
    batch = Batch.pack([rng.integers(5, 200, size=int(n)).astype(np.int32) for n in rng.integers(2, 60, size=16)])
    assert _cos(eng.forward(batch).cpu().numpy(), ref.forward(batch).cpu().numpy()).min() > 0.99
