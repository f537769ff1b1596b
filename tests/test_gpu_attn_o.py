"""Attention with the o projection in its epilogue on the GPU (attn_o.py): the parts add up to the
projection of the attention kernel's own output, for the head layouts of the models it serves, one
and several sequences, graph-bucket padding rows and loose max_seqlen bounds; and whole engines with
it equal engines without it at batch 1 and small steps (eager first sight, capture, replay)."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


# (heads, kv heads, head dim, hidden): Qwen3-0.6B, bge-base, all-MiniLM-L6-v2, a GQA-4 decoder, Qwen2-0.5B-like
HEADS = [(16, 8, 128, 1024), (12, 12, 64, 768), (12, 12, 32, 384), (8, 2, 64, 512), (14, 2, 64, 896)]


@pytest.mark.parametrize("H,Hkv,D,N", HEADS)
@pytest.mark.parametrize("causal", [True, False])
def test_parts_add_up_to_the_projected_attention(H: int, Hkv: int, D: int, N: int, causal: bool) -> None:
    from bouquet.engine import attn_o
    from bouquet.engine.attention import TRITON_ATTN_CONFIGS, triton_varlen

    g = torch.Generator(device="cuda").manual_seed(H * D + causal)
    w = (torch.randn(N, H * D, device="cuda", generator=g) * (H * D) ** -0.5).to(torch.bfloat16)
    b = torch.randn(N, device="cuda", generator=g).to(torch.bfloat16)
    # (lengths, padding rows after them, max_seqlen passed): a bucket's bound may exceed every length
    for lengths, pad, bound in (([1], 0, 1), ([16], 0, 16), ([100], 28, 128), ([128], 0, 128), ([5, 60, 33], 30, 128),
                                ([3] * 9, 5, 64), ([64, 64], 0, 64)):
        T = sum(lengths) + pad
        qkv = torch.randn(T, (H + 2 * Hkv) * D, device="cuda", generator=g).to(torch.bfloat16)
        q, k, v = (t.view(T, -1, D) for t in qkv.split((H * D, Hkv * D, Hkv * D), dim=1))
        cu = torch.tensor(np.concatenate([[0], np.cumsum(lengths)]), dtype=torch.int32, device="cuda")
        tile = TRITON_ATTN_CONFIGS[D]
        assert attn_o.usable(q, k, v, w, tile)
        got = attn_o.attend_o(q, k, v, cu, bound, causal, w, b, tile)
        assert got is not None and got.parts.shape[1:] == (T, N) and got.parts.shape[0] <= attn_o.MAX_PARTS
        real = int(cu[-1])
        a = triton_varlen(q, k, v, cu, bound, causal)[:real].reshape(real, H * D)  # as the two-kernel path writes it
        want = a.double() @ w.double().t() + b.double()
        out = got.parts[:, :real].double().sum(0) + b.double()
        err = (out - want).abs().max().item()
        assert err < 1e-3 * want.abs().max().item() + 1e-4, (lengths, err)  # fp32 sums; same attention rows
        from bouquet.engine.fp8_rows import materialize
        torch.testing.assert_close(materialize(got)[:real].float(), want.float(), atol=2e-2, rtol=1e-2)


def test_not_usable_outside_its_limits() -> None:
    from bouquet.engine import attn_o
    from bouquet.engine.attention import TRITON_ATTN_CONFIGS as tiles

    w = torch.zeros(1024, 2048, device="cuda", dtype=torch.bfloat16)
    q = torch.zeros(attn_o.MAX_TOKENS + 1, 16, 128, device="cuda", dtype=torch.bfloat16)
    k = torch.zeros(attn_o.MAX_TOKENS + 1, 8, 128, device="cuda", dtype=torch.bfloat16)
    assert not attn_o.usable(q, k, k, w, tiles[128])  # too many rows
    assert attn_o.usable(q[:8], k[:8], k[:8], w, tiles[128])
    assert not attn_o.usable(q[:8].float(), k[:8].float(), k[:8].float(), w.float(), tiles[128])  # fp32
    assert not attn_o.usable(q[:8, :, :96].contiguous(), k[:8, :, :96].contiguous(), k[:8, :, :96].contiguous(),
                             w[:, :16 * 96].contiguous(), tiles.get(96))  # a head dim without a tile


@pytest.mark.parametrize("shape,quantization", [("qwen3-0.6b", "none"), ("bge-base", "none"), ("minilm", "none"),
                                                ("bge-base", "fp8")])
def test_engine_with_fused_o_equals_engine_without(tmp_path: Path, shape: str, quantization: str,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Both engines run split-K; only the o projection's place differs. Steps above attn_o.MAX_TOKENS
    take the two-kernel path in both (checked: the fused kernel ran only for the small ones)."""
    from bouquet.bench.models import SHAPES, make_model_dir
    from bouquet.engine import attn_o
    from bouquet.engine.batch import Batch
    from bouquet.engine.engine import Engine, GraphOptions
    from bouquet.modelspec import load_spec
    from tests.test_gpu_fastpath import _tokenizer

    s = SHAPES[shape]
    s = replace(s, config=dict(s.config, num_hidden_layers=2, vocab_size=min(s.config["vocab_size"], 32768)))
    spec = load_spec(str(make_model_dir(s, tmp_path, _tokenizer())))
    opts = dict(quantization=quantization, fp8_min_cosine=0.0, split_k=True)
    plain = Engine(spec, "cuda", graphs=GraphOptions(debug=True), fused_o=False, **opts)
    fused = Engine(spec, "cuda", graphs=GraphOptions(debug=True), fused_o=True, **opts)
    assert fused.fused_o and not plain.fused_o
    ran: list[int] = []  # rows of the steps (eager or captured) the fused kernel ran
    real = attn_o.attend_o

    def counted(q: torch.Tensor, *a: object) -> object:
        out = real(q, *a)
        if out is not None:
            ran.append(q.shape[0])
        return out

    monkeypatch.setattr(attn_o, "attend_o", counted)
    rng = np.random.default_rng(0)
    for lengths in ([1], [7], [16], [100], [128], [60, 40], [5] * 5, [200], [130, 60]):
        batch = Batch.pack([rng.integers(1000, 30000, size=n, dtype=np.int32) for n in lengths])
        for _ in range(3):  # eager, capture, replay
            want = plain.step(batch).wait()
            got = fused.step(batch).wait()
            cos = (got * want).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(want, axis=1)
            if quantization == "none":
                np.testing.assert_allclose(got, want, atol=2e-2, rtol=2e-2)
                assert cos.min() > 0.9999, (lengths, cos.min())
            else:  # a moved bf16 rounding flips fp8 roundings downstream (test_gpu_splitk's bar)
                assert cos.min() > 0.998, (lengths, cos.min())
        assert fused.replays(batch)
    assert ran and max(ran) <= attn_o.MAX_TOKENS  # graph buckets of ≤ 128 rows and the small eager steps
