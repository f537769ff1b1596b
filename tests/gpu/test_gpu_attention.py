"""The Triton varlen attention kernel (attention.triton_varlen) against a per-sequence fp32
reference and FlashAttention-2, eagerly and under CUDA-graph replay with other offsets (CUDA only)."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


def _reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lengths: list[int], causal: bool) -> torch.Tensor:
    """fp32 SDPA one sequence at a time, K/V heads repeated for grouped-query attention."""
    out = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    g = q.shape[1] // k.shape[1]
    start = 0
    for n in lengths:
        if n:
            qs, ks, vs = (x[start:start + n].float().transpose(0, 1) for x in (q, k, v))  # [heads, n, D]
            ks, vs = ks.repeat_interleave(g, 0), vs.repeat_interleave(g, 0)
            o = torch.nn.functional.scaled_dot_product_attention(qs, ks, vs, is_causal=causal)
            out[start:start + n] = o.transpose(0, 1)
        start += n
    return out


def _packed(lengths: list[int], H: int, Hkv: int, D: int, seed: int = 0) -> tuple[torch.Tensor, ...]:
    """q/k/v as views of one fused [T, (H + 2·Hkv)·D] projection (row stride ≠ H·D, as models pass them)."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    T = sum(lengths)
    qkv = torch.randn(T, (H + 2 * Hkv) * D, device="cuda", dtype=torch.bfloat16, generator=g)
    q = qkv[:, :H * D].view(T, H, D)
    k = qkv[:, H * D:(H + Hkv) * D].view(T, Hkv, D)
    v = qkv[:, (H + Hkv) * D:].view(T, Hkv, D)
    cu = torch.tensor(np.concatenate([[0], np.cumsum(lengths)]), device="cuda", dtype=torch.int32)
    return q, k, v, cu


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("heads", [(12, 12, 32), (12, 12, 64), (16, 8, 128), (4, 1, 64)])
def test_triton_varlen_matches_the_reference(causal: bool, heads: tuple[int, int, int]) -> None:
    from bouquet.engine.attention.backends import triton_varlen

    H, Hkv, D = heads
    lengths = [1, 7, 300, 64, 513, 16, 0, 0]  # two empty padding slots at the end, as graph buckets have
    q, k, v, cu = _packed(lengths, H, Hkv, D)
    want = _reference(q, k, v, lengths, causal)
    for max_seqlen in (513, 1024):  # exact and loose (a graph bucket's bound)
        got = triton_varlen(q, k, v, cu, max_seqlen, causal)
        torch.testing.assert_close(got.float(), want, atol=2e-2, rtol=2e-2)
    for n in (1, 100, 513):  # one sequence: TRITON_SINGLE_CONFIGS' tiles
        q1, k1, v1, cu1 = _packed([n], H, Hkv, D, seed=n)
        torch.testing.assert_close(triton_varlen(q1, k1, v1, cu1, 1024, causal).float(),
                                   _reference(q1, k1, v1, [n], causal), atol=2e-2, rtol=2e-2)


def test_backend_routes_ragged_batches_to_triton_and_agrees_with_flash() -> None:
    from bouquet.engine.attention.backends import VarlenBackend, select_backend

    tri = select_backend(torch.device("cuda"), torch.bfloat16)
    assert isinstance(tri, VarlenBackend) and tri.ragged == "triton" and tri.name == "varlen"
    fa2 = VarlenBackend("flash")  # FlashAttention-2 varlen: the route without Triton
    assert isinstance(fa2, VarlenBackend) and fa2.ragged == "flash"
    lengths = [5, 200, 33, 128]
    q, k, v, cu = _packed(lengths, 16, 8, 128, seed=1)
    for causal in (False, True):
        a = tri.attend(q, k, v, tri.prepare(cu, 200, causal))
        b = fa2.attend(q, k, v, fa2.prepare(cu, 200, causal))
        torch.testing.assert_close(a.float(), b.float(), atol=2e-2, rtol=2e-2)


def test_triton_varlen_graph_replay_with_other_offsets_equals_eager() -> None:
    """Captured once with one set of offsets, replayed with another of the same token count and
    bound: the kernel reads cu_seqlens on the device, so a graph bucket serves any lengths."""
    from bouquet.engine.attention.backends import triton_varlen

    a, b = [100, 3, 400, 9, 0], [250, 250, 1, 10, 1]
    q, k, v, cu = _packed(a, 16, 8, 128, seed=2)
    static_cu = cu.clone()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        triton_varlen(q, k, v, static_cu, 512, False)  # compile outside the capture
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = triton_varlen(q, k, v, static_cu, 512, False)
    for lengths in (b, a):
        new_cu = torch.tensor(np.concatenate([[0], np.cumsum(lengths)]), device="cuda", dtype=torch.int32)
        static_cu.copy_(new_cu)
        graph.replay()
        torch.cuda.synchronize()
        want = triton_varlen(q, k, v, new_cu, 512, False)
        assert torch.equal(out, want)
        torch.testing.assert_close(out.float(), _reference(q, k, v, lengths, False), atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("n,rows", [(1500, 1500), (1500, 1536), (2048, 2048), (1024, 1024)])
def test_one_long_causal_sequence_runs_cudnn_and_padding_stays_out(n: int, rows: int) -> None:
    """One causal sequence of more than CUDNN_SINGLE_MIN_TOKENS rows: cuDNN over all rows (a graph
    bucket's padding rows after the sequence included) equals the reference on the real rows;
    bidirectional ones and 1,024 rows stay on the Triton kernel."""
    from unittest import mock

    from bouquet.engine.attention import backends as attention
    from bouquet.engine.attention.backends import select_backend

    backend = select_backend(torch.device("cuda"), torch.bfloat16)
    q, k, v, _ = _packed([rows], 16, 8, 128, seed=n)
    cu = torch.tensor([0, n], device="cuda", dtype=torch.int32)
    for causal, whole_rows in ((True, True), (False, True), (True, False)):
        with mock.patch.object(attention, "triton_varlen", wraps=attention.triton_varlen) as tri:
            got = backend.attend(q, k, v, backend.prepare(cu, rows, causal, whole_rows=whole_rows))
        assert tri.called == (not causal or not whole_rows or rows <= attention.CUDNN_SINGLE_MIN_TOKENS)
        want = _reference(q[:n], k[:n], v[:n], [n], causal)
        torch.testing.assert_close(got[:n].float(), want, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("shape", ["qwen3-tiny-d64", "gemma3-causal-tiny-d64"])
def test_engine_one_long_causal_sequence_graph_equals_eager(tmp_path: Path, shape: str,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """1,500 tokens in one step: eagerly (1,500 rows) and from a 1,536-row graph bucket (36 padding
    rows). Qwen3 (one kind of layer) runs cuDNN over all rows; a causal Gemma3 with sliding and global
    layers (a windowed layer leaves padding rows unwritten) must not: finite, graph == eager."""
    from bouquet.bench.models import SHAPES, make_model_dir, tiny
    from bouquet.engine.attention import backends as attention
    from bouquet.engine.runtime.batch import Batch
    from bouquet.engine.runtime.engine import Engine, GraphOptions
    from bouquet.modelspec import load_spec
    from tests.gpu.test_gpu_fastpath import _tokenizer

    if shape == "qwen3-tiny-d64":
        s = tiny(SHAPES["qwen3-0.6b"], hidden=128, heads=2)
    else:
        s = tiny(SHAPES["embeddinggemma-300m"], hidden=128, heads=2, layers=3)
        s = replace(s, config=dict(s.config, use_bidirectional_attention=False, sliding_window=32,
                                   layer_types=["sliding_attention", "full_attention", "sliding_attention"]))
    s = replace(s, max_len=4096)
    eng = Engine(load_spec(str(make_model_dir(s, tmp_path, _tokenizer()))), "cuda", graphs=GraphOptions(debug=True))
    assert eng.causal and eng.mixed_windows == (shape != "qwen3-tiny-d64")
    dense: list[int] = []
    real = attention.VarlenBackend._dense
    monkeypatch.setattr(attention.VarlenBackend, "_dense", staticmethod(lambda q, *a: dense.append(q.shape[0]) or real(q, *a)))
    batch = Batch.pack([np.random.default_rng(1).integers(1000, 30000, size=1500, dtype=np.int32)])
    rows = [eng.step(batch).wait() for _ in range(3)]  # the bucket's first sight, capture, replay: 1,536 rows
    assert eng.replays(batch)
    exact = eng.forward(batch).cpu().numpy()  # eager on the exact 1,500 rows
    assert all(np.isfinite(r).all() for r in rows + [exact])
    np.testing.assert_allclose(rows[2], exact, atol=1e-2, rtol=1e-2)
    assert ({1500, 1536} <= set(dense)) if shape == "qwen3-tiny-d64" else not dense, dense
