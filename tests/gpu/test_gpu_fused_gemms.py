"""The gated MLP's gate/up GEMM with the activation in its epilogue (linear/triton_gemms.py) on the GPU:
the kernel against cuBLAS + the activation kernel, where it applies, and whole engines with it on
and off (eager, capture, replay) for both activations (Qwen3: SiLU, EmbeddingGemma: tanh-GELU);
and the batch-1 GEMMs (``small_linear``, ``small_gate_up_act``: qkv, MLP-in with bias / activation)
against cuBLAS + the activation, alone and in engines with ``small_gemms`` on and off."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] not in (9, 10), reason="needs a Hopper GPU (TMA)")]


@pytest.mark.parametrize("T,h,i,act", [(2048, 1024, 3072, "silu"), (2049, 1024, 3072, "silu"),
                                       (16384, 1024, 3072, "silu"), (8192, 768, 1152, "gelu_tanh"),
                                       (6000, 768, 1000, "silu")])  # clipped last row and column tiles
def test_kernel_equals_gemm_then_activation(T: int, h: int, i: int, act: str) -> None:
    from bouquet.engine.linear.triton_gemms import gate_up_act
    from bouquet.engine.kernels.ops import gelu_tanh_mul, silu_mul

    g = torch.Generator(device="cuda").manual_seed(T)
    x = torch.randn(T, h, device="cuda", generator=g).to(torch.bfloat16)
    w = (torch.randn(2 * i, h, device="cuda", generator=g) * 0.03).to(torch.bfloat16)
    got = gate_up_act(x, w, act)
    assert got is not None and got.shape == (T, i) and got.dtype == torch.bfloat16
    want = (silu_mul if act == "silu" else gelu_tanh_mul)(F.linear(x, w))
    # the GEMMs sum in another order: gate or up one bf16 rounding apart now and then
    torch.testing.assert_close(got.float(), want.float(), atol=2e-2, rtol=2e-2)
    assert (got.float() - want.float()).abs().mean() < 2e-3
    exact = (silu_mul if act == "silu" else gelu_tanh_mul)((x.double() @ w.double().t()).to(torch.bfloat16))
    assert (got.float() - exact.float()).abs().mean() <= (want.float() - exact.float()).abs().mean() * 1.5 + 1e-4


def test_usable_only_where_measured_faster_and_tma_can_run() -> None:
    from bouquet.engine.linear.triton_gemms import MIN_TOKENS, compile_now, gate_up_act, usable

    w = torch.randn(2 * 3072, 1024, device="cuda", dtype=torch.bfloat16)
    assert usable(torch.randn(MIN_TOKENS, 1024, device="cuda", dtype=torch.bfloat16), w, "silu")
    assert not usable(torch.randn(MIN_TOKENS - 1, 1024, device="cuda", dtype=torch.bfloat16), w, "silu")
    assert not usable(torch.randn(MIN_TOKENS, 1024, device="cuda"), w.float(), "silu")  # fp32
    assert not usable(torch.randn(MIN_TOKENS, 1024, dtype=torch.bfloat16), w.cpu(), "silu")  # CPU
    assert not usable(torch.randn(MIN_TOKENS, 1024, device="cuda", dtype=torch.bfloat16), w, "gelu")  # no such epilogue
    gemma = torch.randn(2 * 1152, 768, device="cuda", dtype=torch.bfloat16)  # 144 tiles at 2,048 tokens: 1.1 waves
    assert not usable(torch.randn(2048, 768, device="cuda", dtype=torch.bfloat16), gemma, "gelu_tanh")
    assert usable(torch.randn(16384, 768, device="cuda", dtype=torch.bfloat16), gemma, "gelu_tanh")
    assert compile_now(w, "silu") and compile_now(gemma, "gelu_tanh")  # what Engine.warmup runs
    strided = torch.randn(MIN_TOKENS, 2048, device="cuda", dtype=torch.bfloat16)[:, :1024]
    assert gate_up_act(strided, w, "silu") is None  # not contiguous: the caller's two kernels run


@pytest.mark.parametrize("shape", ["qwen3-0.6b", "embeddinggemma-300m"])
def test_engine_with_fused_gemms_equals_engine_without(tmp_path: Path, shape: str,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from bouquet.bench.models import SHAPES, make_model_dir
    from bouquet.engine.linear import triton_gemms as fused_gemms
    from bouquet.engine.runtime.batch import Batch
    from bouquet.engine.runtime.engine import Engine, GraphOptions
    from bouquet.modelspec import load_spec
    from tests.gpu.test_gpu_fastpath import _tokenizer, replan

    s = SHAPES[shape]  # full width, two layers, a short vocabulary
    s = replace(s, config=dict(s.config, num_hidden_layers=2, vocab_size=min(s.config["vocab_size"], 32768)))
    spec = load_spec(str(make_model_dir(s, tmp_path, _tokenizer())))
    graphs = GraphOptions(debug=True)
    plain = Engine(spec, "cuda", graphs=graphs)
    replan(plain, gate_up_act=False)
    fused = Engine(spec, "cuda", graphs=graphs)
    assert fused.plan.gate_up_act and not plain.plan.gate_up_act
    ran: list[bool] = []
    real = fused_gemms.gate_up_act

    def spy(*args: object) -> "torch.Tensor | None":
        out = real(*args)  # type: ignore[arg-type]
        ran.append(out is not None)
        return out

    monkeypatch.setattr(fused_gemms, "gate_up_act", spy)
    rng = np.random.default_rng(0)
    # Qwen3 takes the kernel from 2,048 tokens, EmbeddingGemma (i = 1,152) gate/up from ~4,700 (MIN_WAVES)
    for lengths in ([512] * 4, [2048], [300, 700, 1100, 12], [512] * 16, [16] * 64 + [500] * 14):
        batch = Batch.pack([rng.integers(1000, 30000, size=n, dtype=np.int32) for n in lengths])
        for _ in range(3):  # eager, capture, replay
            want = plain.step(batch).wait()
            got = fused.step(batch).wait()
            cos = (got * want).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(want, axis=1)
            assert cos.min() > 0.9999, (lengths, cos.min())
            np.testing.assert_allclose(got, want, atol=2e-2, rtol=2e-2)
    assert any(ran)  # the kernel did run


@pytest.mark.parametrize("T", [1, 16, 77, 128])
@pytest.mark.parametrize("N,K,bias,act", [(4096, 1024, False, None), (2304, 768, True, None),  # qkv: Qwen3, bge
                                          (3072, 768, True, "gelu"), (1536, 384, True, "gelu"),  # BERT up + GELU
                                          (1536, 768, True, "gelu_new")])
def test_small_linear_equals_linear_then_activation(T: int, N: int, K: int, bias: bool, act: str | None) -> None:
    """fused_gemms.small_linear (steps ≤ 128 tokens) against F.linear then the activation, as HF rounds."""
    from bouquet.engine.linear.triton_gemms import SMALL_MAX_OUTPUTS, small_linear
    from bouquet.engine.kernels.layers import activation

    g = torch.Generator(device="cuda").manual_seed(T + N)
    x = torch.randn(T, K, device="cuda", generator=g).to(torch.bfloat16)
    w = (torch.randn(N, K, device="cuda", generator=g) * 0.03).to(torch.bfloat16)
    b = torch.randn(N, device="cuda", generator=g).to(torch.bfloat16) if bias else None
    got = small_linear(x, w, b, act)
    if T * N > SMALL_MAX_OUTPUTS:  # cuBLAS's case (Qwen3-0.6B's qkv at 128 tokens)
        assert got is None
        return
    assert got is not None and got.shape == (T, N) and got.dtype == torch.bfloat16
    want = F.linear(x, w, b)
    want = activation(act)(want) if act else want
    torch.testing.assert_close(got.float(), want.float(), atol=2e-2, rtol=2e-2)
    assert small_linear(torch.randn(129, K, device="cuda").to(torch.bfloat16), w, b, act) is None  # above the limit


@pytest.mark.parametrize("T", [1, 16, 128])
@pytest.mark.parametrize("h,i,act", [(1024, 3072, "silu"), (768, 1152, "gelu_tanh")])
def test_small_gate_up_act_equals_gemm_then_activation(T: int, h: int, i: int, act: str) -> None:
    from bouquet.engine.linear.triton_gemms import small_gate_up_act
    from bouquet.engine.kernels.ops import gelu_tanh_mul, silu_mul

    g = torch.Generator(device="cuda").manual_seed(T + i)
    x = torch.randn(T, h, device="cuda", generator=g).to(torch.bfloat16)
    w = (torch.randn(2 * i, h, device="cuda", generator=g) * 0.03).to(torch.bfloat16)
    got = small_gate_up_act(x, w, act)
    assert got is not None and got.shape == (T, i)
    want = (silu_mul if act == "silu" else gelu_tanh_mul)(F.linear(x, w))
    torch.testing.assert_close(got.float(), want.float(), atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("shape", ["qwen3-0.6b", "bge-base", "minilm", "embeddinggemma-300m"])
def test_engine_with_small_gemms_equals_engine_without_at_batch_1(tmp_path: Path, shape: str,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Small steps (≤ 128 tokens) with the plan's small_gemms on / off, eager, capture, replay."""
    from bouquet.bench.models import SHAPES, make_model_dir
    from bouquet.engine.linear import triton_gemms as fused_gemms
    from bouquet.engine.runtime.batch import Batch
    from bouquet.engine.runtime.engine import Engine, GraphOptions
    from bouquet.modelspec import load_spec
    from tests.gpu.test_gpu_fastpath import _tokenizer, replan

    s = SHAPES[shape]
    s = replace(s, config=dict(s.config, num_hidden_layers=2, vocab_size=min(s.config["vocab_size"], 32768)))
    spec = load_spec(str(make_model_dir(s, tmp_path, _tokenizer())))
    plain = Engine(spec, "cuda", graphs=GraphOptions(debug=True))
    replan(plain, small_gemms=False)
    fused = Engine(spec, "cuda", graphs=GraphOptions(debug=True))
    replan(fused, small_gemms=True)
    assert fused.plan.small_gemms and not plain.plan.small_gemms
    ran: set[bool] = set()  # gated or not, for each small GEMM that did run
    real = fused_gemms._small

    def spy(*a):  # type: ignore[no-untyped-def]
        out = real(*a)
        if out is not None:
            ran.add(a[5])
        return out

    monkeypatch.setattr(fused_gemms, "_small", spy)
    rng = np.random.default_rng(0)
    for lengths in ([1], [7], [128], [100, 28], [5] * 5, [300]):
        batch = Batch.pack([rng.integers(1000, 30000, size=n, dtype=np.int32) for n in lengths])
        for _ in range(3):
            want = plain.step(batch).wait()
            got = fused.step(batch).wait()
            cos = (got * want).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(want, axis=1)
            assert cos.min() > 0.9999, (lengths, cos.min())
    # decoders: the gated gate/up (and qkv up to SMALL_MAX_OUTPUTS); encoders: qkv and up, plain
    assert ran == ({True, False} if shape in ("qwen3-0.6b", "embeddinggemma-300m") else {False}), ran
