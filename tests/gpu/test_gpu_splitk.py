"""The split-K GEMM and its readers on the GPU (splitk.py): parts add up to x · Wᵀ, the add + norm
kernels read PartialRows as they read the summed rows, and whole engines with split-K agree with
cuBLAS engines at batch 1 (eager and graph replay) for the decoder and the encoder shapes."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


def _plans(T: int, N: int, K: int) -> list:
    from bouquet.engine.plan import SplitPlan, splitk_plan as plan_for

    props = torch.cuda.get_device_properties(0)
    extra = [SplitPlan(64, 32, 64, 4), SplitPlan(128, 128, 128, 2), SplitPlan(16, 64, 128, 2, stages=4)]
    plans = [p for p in [plan_for(T, N, K, props.multi_processor_count), *extra] if p is not None and p.fits(T, N, K)]
    limit = getattr(props, "shared_memory_per_block_optin", 227 * 1024)
    assert all(p.smem_bytes() <= limit for p in plans[:1])  # plan_for's own choice always launches
    return [p for p in plans if p.smem_bytes() <= limit]


@pytest.mark.parametrize("N,K", [(1024, 2048), (1024, 3072), (768, 768), (384, 1536)])
def test_parts_add_up_to_the_product(N: int, K: int) -> None:
    from bouquet.engine.linear.splitk import splitk_linear

    g = torch.Generator(device="cuda").manual_seed(0)
    w = (torch.randn(N, K, device="cuda", generator=g) * 0.05).to(torch.bfloat16)
    for T in (1, 5, 64, 100, 128, 129, 200, 256, 300, 512):  # 129–256: the wide plan
        x = torch.randn(T, K, device="cuda", generator=g).to(torch.bfloat16)
        want = x.double() @ w.double().t()
        plans = _plans(T, N, K)
        assert plans, (T, N, K)
        for p in plans:
            got = splitk_linear(x, w, None, p)
            assert got is not None and got.parts.shape == (p.parts, T, N)
            err = (got.parts.double().sum(0) - want).abs().max().item()
            assert err < 1e-4 * want.abs().max().item() + 1e-5, (p, T, err)  # fp32 accumulation only


def test_norm_kernels_read_parts_as_the_summed_rows() -> None:
    from bouquet.engine.kernels.rows import PartialRows, materialize
    from bouquet.engine.kernels.layers import RMSNorm
    from bouquet.engine.kernels.ops import add_layer_norm, add_rms_norm

    g = torch.Generator(device="cuda").manual_seed(1)
    N = 1024
    norm = RMSNorm(N, 1e-6).to("cuda", torch.bfloat16)
    ln = torch.nn.LayerNorm(N, eps=1e-12, device="cuda", dtype=torch.bfloat16)
    for t in (norm.weight, ln.weight, ln.bias):
        torch.nn.init.normal_(t)
    for T, S, bias in ((1, 8, False), (130, 4, True), (512, 2, True)):
        parts = torch.randn(S, T, N, device="cuda", generator=g) * 3
        b = torch.randn(N, device="cuda", generator=g).to(torch.bfloat16) if bias else None
        p = PartialRows(parts, b, torch.bfloat16)
        dense = materialize(p)
        res = torch.randn(T, N, device="cuda", generator=g).to(torch.bfloat16)
        for r in (res, None):
            (out, s), (want, want_s) = add_rms_norm(p, r, norm), add_rms_norm(dense, r, norm)
            ulp = want_s.float().abs() * 2 ** -7 + 1e-6  # the sum order may move a bf16 rounding by one step
            assert ((s.float() - want_s.float()).abs() <= ulp).all()
            torch.testing.assert_close(out.float(), want.float(), atol=3e-2, rtol=2e-2)
            q8, q8_want = add_rms_norm(p, r, norm, fp8=True)[0], add_rms_norm(dense, r, norm, fp8=True)[0]
            torch.testing.assert_close((q8.values.float() * q8.scale), (q8_want.values.float() * q8_want.scale),
                                       atol=6e-2, rtol=7e-2)
        torch.testing.assert_close(add_layer_norm(p, res, ln).float(), add_layer_norm(dense, res, ln).float(),
                                   atol=3e-2, rtol=2e-2)
        q8, q8_want = add_layer_norm(p, res, ln, fp8=True), add_layer_norm(dense, res, ln, fp8=True)
        torch.testing.assert_close(q8.dense.float(), q8_want.dense.float(), atol=3e-2, rtol=2e-2)
        torch.testing.assert_close(q8.values.float() * q8.scale, q8_want.values.float() * q8_want.scale,
                                   atol=6e-2, rtol=7e-2)


@pytest.mark.parametrize("shape,quantization", [("qwen3-0.6b", "none"), ("bge-base", "none"), ("minilm", "none"),
                                                ("embeddinggemma-300m", "none"), ("qwen3-0.6b", "fp8"),
                                                ("bge-base", "fp8")])
def test_engine_with_split_k_equals_cublas_engine_at_batch_1(tmp_path: Path, shape: str, quantization: str,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """Batch-1 and small steps, split-K engine vs cuBLAS engine, each stepped the same way (eager
    first sight, capture, replay: the same buckets and attention kernels on both sides). Gemma3:
    the sandwich norm reads the attention output's parts with no residual; fp8: the norms that
    read parts also write the next GEMM's fp8 rows."""
    from bouquet.bench.models import SHAPES, make_model_dir
    from bouquet.engine.linear import splitk
    from bouquet.engine.runtime.batch import Batch
    from bouquet.engine.runtime.engine import Engine, GraphOptions
    from bouquet.modelspec import load_spec
    from tests.gpu.test_gpu_fastpath import _tokenizer, replan

    s = SHAPES[shape]  # full width (the projections' real N and K), two layers, a short vocabulary
    s = replace(s, config=dict(s.config, num_hidden_layers=2, vocab_size=min(s.config["vocab_size"], 32768)))
    spec = load_spec(str(make_model_dir(s, tmp_path, _tokenizer())))
    opts = dict(quantization=quantization, fp8_min_cosine=0.0)
    plain = Engine(spec, "cuda", graphs=GraphOptions(debug=True), **opts)
    replan(plain, split_k=False)
    split = Engine(spec, "cuda", graphs=GraphOptions(debug=True), **opts)
    replan(split, split_k=True)
    ran = []
    real = splitk.splitk_linear
    monkeypatch.setattr(splitk, "splitk_linear", lambda *a, **k: ran.append(real(*a, **k)) or ran[-1])
    rng = np.random.default_rng(0)
    for lengths in ([1], [7], [128], [200], [256], [130, 60], [300], [512], [100, 28], [5] * 5):
        batch = Batch.pack([rng.integers(1000, 30000, size=n, dtype=np.int32) for n in lengths])
        for _ in range(3):  # eager, capture, replay
            want = plain.step(batch).wait()
            got = split.step(batch).wait()
            cos = (got * want).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(want, axis=1)
            if quantization == "none":
                np.testing.assert_allclose(got, want, atol=2e-2, rtol=2e-2)
                assert cos.min() > 0.9999, (lengths, cos.min())
            else:  # a sum order that moves one bf16 rounding flips fp8 roundings downstream (12-01e call 1:
                # elements 0.09 apart after two layers); parts summed wrongly would be far below this
                assert cos.min() > 0.998, (lengths, cos.min())
        assert split.replays(batch)
    assert any(r is not None for r in ran)  # split-K did run (every shape has a projection with a plan)
