"""The small-M split-K GEMM (engine/splitk.py) against F.linear, across calls and CUDA-graph
replays, and inside a full-size model at batch 1 (CUDA only)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


@pytest.mark.parametrize("N,K", [(1024, 2048), (1024, 3072), (768, 3072), (200, 4096)])
def test_splitk_linear_matches_f_linear(N: int, K: int) -> None:
    from bouquet.engine import splitk

    g = torch.Generator(device="cuda").manual_seed(N + K)
    w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16, generator=g) * 0.02
    b = torch.randn(N, device="cuda", dtype=torch.bfloat16, generator=g)
    assert splitk.eligible(w)
    counters = splitk.new_counters(w)
    for M in (1, 7, 16, 17, 100, 128):
        x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16, generator=g)
        for bias in (None, b):
            want = torch.nn.functional.linear(x.float(), w.float(), None if bias is None else bias.float())
            first = splitk.linear(x, w, bias, counters)
            torch.testing.assert_close(first.float(), want, atol=2e-2, rtol=2e-2)
            for _ in range(5):  # the counters reset themselves: every call gives the same rows
                assert torch.equal(splitk.linear(x, w, bias, counters), first)
    torch.cuda.synchronize()
    assert int(counters.abs().sum()) == 0


def test_splitk_linear_under_graph_replay() -> None:
    from bouquet.engine import splitk

    w = torch.randn(1024, 3072, device="cuda", dtype=torch.bfloat16) * 0.02
    counters = splitk.new_counters(w)
    x = torch.randn(128, 3072, device="cuda", dtype=torch.bfloat16)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        splitk.linear(x, w, None, counters)  # compile outside the capture
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = splitk.linear(x, w, None, counters)
    for i in range(4):
        x.copy_(torch.randn(128, 3072, device="cuda", dtype=torch.bfloat16))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, splitk.linear(x, w, None, counters)), i


def test_bge_base_at_batch_1_equals_cublas_path(tmp_path: Path) -> None:
    """Full-size bge-base (random weights): its down_proj (K = 3072) takes split-K for steps of
    ≤ 128 tokens; graph replays agree with the same engine's cuBLAS path."""
    from bouquet.bench.models import SHAPES, make_model_dir
    from bouquet.engine.batch import Batch
    from bouquet.engine.engine import Engine
    from bouquet.engine.quant import projections
    from bouquet.modelspec import load_spec
    from tests.test_gpu_fastpath import _tokenizer

    spec = load_spec(str(make_model_dir(SHAPES["bge-base"], tmp_path, _tokenizer())))
    eng, ref = Engine(spec, "cuda"), Engine(spec, "cuda")
    kinds = {p.kind for p in projections(eng.model) if p.splitk is not None}
    assert kinds == {"down"}  # K = 3072; q/k/v, o and up have K = 768
    for p in projections(ref.model):
        p.splitk = None
    rng = np.random.default_rng(0)
    for lengths in ([128], [9], [30, 50, 40], [200]):  # 200 tokens: over MAX_TOKENS, cuBLAS in both
        batch = Batch.pack([rng.integers(1000, 30000, size=n, dtype=np.int32) for n in lengths])
        want = ref.step(batch).wait()
        for _ in range(3):  # eager, capture + replay, replay
            got = eng.step(batch).wait()
            cos = (got * want).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(want, axis=1)
            assert cos.min() > 0.9999
