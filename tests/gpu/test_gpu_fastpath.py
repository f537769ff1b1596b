"""GPU fast path: graph == eager for every captured bucket, fused kernels == PyTorch, and the
graph counters the replica exports (CUDA only)."""
from __future__ import annotations

import copy
import time
from pathlib import Path

import numpy as np
import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


def replan(engine: object, **features: bool) -> None:
    """Turn one family of the engine's Triton GEMMs on or off (``plan.KernelPlan``'s fields) and
    choose every projection's method again: the A/B of the GPU tests, before any graph is captured."""
    from dataclasses import replace

    from bouquet.engine.linear.select import assign_methods

    engine.plan = replace(engine.plan, **features)  # type: ignore[attr-defined]
    assign_methods(engine.model, engine.plan)  # type: ignore[attr-defined]


def layer_norm_reference(x: torch.Tensor, residual: torch.Tensor, ln: torch.nn.LayerNorm) -> torch.Tensor:
    """What ``ops.add_layer_norm`` computes, in fp32 PyTorch."""
    return torch.nn.functional.layer_norm(x.float() + residual.float(), ln.normalized_shape, ln.weight.float(),
                                          ln.bias.float(), ln.eps)


def test_add_layer_norm_matches_pytorch() -> None:
    from bouquet.engine.kernels.ops import add_layer_norm

    ln = torch.nn.LayerNorm(768, eps=1e-12, device="cuda", dtype=torch.bfloat16)
    torch.nn.init.normal_(ln.weight)
    torch.nn.init.normal_(ln.bias)
    for T in (1, 130, 4096):
        x, r = (torch.randn(T, 768, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        torch.testing.assert_close(add_layer_norm(x, r, ln).float(), layer_norm_reference(x, r, ln), atol=3e-2, rtol=2e-2)


def _bf16_close(got: torch.Tensor, want: torch.Tensor) -> None:
    """Within about one bf16 rounding step of the values' size."""
    torch.testing.assert_close(got.float().cpu(), want.float().cpu(), atol=3e-2, rtol=2e-2)


def test_add_rms_norm_matches_pytorch() -> None:
    from bouquet.engine.kernels.layers import RMSNorm
    from bouquet.engine.kernels.ops import add_rms_norm

    norm = RMSNorm(1024, 1e-6).to("cuda", torch.bfloat16)
    torch.nn.init.normal_(norm.weight)
    for T in (1, 130, 4096):
        x, r = (torch.randn(T, 1024, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        out, s = add_rms_norm(x, r, norm)
        assert torch.equal(s, x + r)  # the residual stream is HF's bf16 sum exactly
        _bf16_close(out, norm(x + r))
        out0, s0 = add_rms_norm(x, None, norm)
        assert s0 is x
        _bf16_close(out0, norm(x))


def test_qk_norm_rope_and_silu_mul_match_the_cpu_path() -> None:
    from bouquet.engine.kernels.layers import RMSNorm
    from bouquet.engine.kernels.ops import qk_norm_rope, rope_tables, silu_mul

    nq, nkv, D, T = 16, 8, 128, 300
    qn, kn = (RMSNorm(D, 1e-6).to("cuda", torch.bfloat16) for _ in range(2))
    for n in (qn, kn):
        torch.nn.init.normal_(n.weight)
    qkv = torch.randn(T, (nq + 2 * nkv) * D, device="cuda", dtype=torch.bfloat16)
    pos = torch.cat([torch.arange(200), torch.arange(100)]).to("cuda", torch.int32)
    cos, sin = rope_tables(pos, D, 1e6)
    qn_cpu, kn_cpu = (copy.deepcopy(n).cpu() for n in (qn, kn))  # Module.cpu() moves in place
    want = qk_norm_rope(qkv.cpu(), qn_cpu, kn_cpu, cos.cpu(), sin.cpu(), nq, nkv, D)
    got = qk_norm_rope(qkv.clone(), qn, kn, cos, sin, nq, nkv, D)
    for g, w in zip(got, want):
        assert g.shape == w.shape
        _bf16_close(g, w)
    gu = torch.randn(T, 2 * 3072, device="cuda", dtype=torch.bfloat16)
    _bf16_close(silu_mul(gu), torch.nn.functional.silu(gu[:, :3072]) * gu[:, 3072:])


def test_decoder_kernel_variants_match_the_cpu_path() -> None:
    """Gemma's (1 + w) norms (residual and q/k), rotary without a q/k norm (Qwen2, Mistral) and the
    tanh-GELU gate: the Triton kernels against the eager CPU code."""
    from bouquet.engine.kernels.layers import RMSNorm
    from bouquet.engine.kernels.ops import add_rms_norm, gelu_tanh_mul, qk_norm_rope, rope_tables

    norm = RMSNorm(768, 1e-6, unit_offset=True).to("cuda", torch.bfloat16)
    torch.nn.init.normal_(norm.weight, std=0.3)
    x, r = (torch.randn(130, 768, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    out, s = add_rms_norm(x, r, norm)
    _bf16_close(out, copy.deepcopy(norm).cpu()((x + r).cpu()))
    nq, nkv, D, T = 3, 1, 256, 200
    qn, kn = (RMSNorm(D, 1e-6, unit_offset=True).to("cuda", torch.bfloat16) for _ in range(2))
    for n in (qn, kn):
        torch.nn.init.normal_(n.weight, std=0.3)
    qkv = torch.randn(T, (nq + 2 * nkv) * D, device="cuda", dtype=torch.bfloat16)
    cos, sin = rope_tables(torch.arange(T, device="cuda", dtype=torch.int32), D, 1e4)
    for norms in ((qn, kn), (None, None)):
        cpu = tuple(None if n is None else copy.deepcopy(n).cpu() for n in norms)
        want = qk_norm_rope(qkv.cpu(), *cpu, cos.cpu(), sin.cpu(), nq, nkv, D)
        for g, w in zip(qk_norm_rope(qkv.clone(), *norms, cos, sin, nq, nkv, D), want):
            _bf16_close(g, w)
    gu = torch.randn(T, 2 * 1152, device="cuda", dtype=torch.bfloat16) * 3
    _bf16_close(gelu_tanh_mul(gu), torch.nn.functional.gelu(gu[:, :1152], approximate="tanh") * gu[:, 1152:])


def test_modernbert_kernels_match_the_cpu_path() -> None:
    """ModernBERT's pre-norm add + bias-free LayerNorm (the rounded sum kept as the residual) and
    its erf-GELU gate: the Triton kernels against the eager CPU code."""
    from bouquet.engine.kernels.ops import add_layer_norm_pre, gelu_mul

    ln = torch.nn.LayerNorm(768, eps=1e-5, bias=False, device="cuda", dtype=torch.bfloat16)
    torch.nn.init.normal_(ln.weight, mean=1.0, std=0.3)
    for T in (1, 130, 4096):
        x, r = (torch.randn(T, 768, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        out, s = add_layer_norm_pre(x, r, ln)
        want_out, want_s = add_layer_norm_pre(x.cpu(), r.cpu(), copy.deepcopy(ln).cpu())
        torch.testing.assert_close(s.cpu(), want_s, atol=0, rtol=0)  # the same bf16 sum
        _bf16_close(out, want_out)
    gu = torch.randn(200, 2 * 1152, device="cuda", dtype=torch.bfloat16) * 3
    _bf16_close(gelu_mul(gu), torch.nn.functional.gelu(gu[:, :1152]) * gu[:, 1152:])


def test_linear_gelu_epilogue_matches_erf_gelu() -> None:
    from bouquet.engine.kernels.ops import linear_gelu

    lin = torch.nn.Linear(768, 3072, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(200, 768, device="cuda", dtype=torch.bfloat16)
    want = torch.nn.functional.gelu(torch.nn.functional.linear(x.float(), lin.weight.float(), lin.bias.float()))  # erf, fp32
    _bf16_close(linear_gelu(x, lin, "gelu"), want)


def test_uniform_cudnn_attention_matches_varlen() -> None:
    from bouquet.engine.attention.backends import VarlenBackend

    be = VarlenBackend()
    B, L, H, D = 6, 96, 8, 64
    q, k, v = (torch.randn(B * L, H, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    cu = torch.arange(0, B * L + 1, L, device="cuda", dtype=torch.int32)
    for causal in (False, True):
        ref = be.attend(q, k, v, be.prepare(cu, L, causal))
        got = be.attend(q, k, v, be.prepare(cu, L, causal, uniform=True))
        torch.testing.assert_close(got.float(), ref.float(), atol=2e-2, rtol=2e-2)


def _tokenizer() -> Path:
    try:
        from bouquet.bench.models import default_tokenizer

        return default_tokenizer()
    except ImportError:  # GPU machines without the embedded-model package: a copied file
        p = Path(__file__).resolve().parents[2] / "bench" / "assets" / "tokenizer.json"
        if not p.exists():
            pytest.skip("no tokenizer.json available")
        return p


@pytest.mark.parametrize("shape", ["minilm", "qwen3-tiny", "qwen3-tiny-d64", "bge-tiny", "qwen2-tiny", "gemma3-tiny",
                                   "modernbert-tiny"])
def test_graph_replay_equals_eager_for_every_bucket(tmp_path: Path, shape: str) -> None:
    from dataclasses import replace

    from bouquet.bench.models import SHAPES, make_model_dir, tiny
    from bouquet.engine.runtime.batch import Batch
    from bouquet.engine.runtime.buckets import bucket_for
    from bouquet.engine.runtime.engine import Engine, GraphOptions
    from bouquet.engine.runtime.graphs import segment_starts
    from bouquet.modelspec import load_spec

    # qwen3-tiny: 2 layers, head_dim 32 (fused RMSNorm / q-k norm + rotary / SiLU kernels)
    s = tiny(SHAPES["qwen3-0.6b"], hidden=128) if shape == "qwen3-tiny" else SHAPES.get(shape)
    if shape == "qwen2-tiny":  # q/k/v biases, rotary without q/k norm
        s = tiny(SHAPES["gte-qwen2-1.5b"], hidden=128)
    if shape == "gemma3-tiny":  # bidirectional, sliding ±16 / global layers, (1 + w) norms, tanh-GELU
        s = tiny(SHAPES["embeddinggemma-300m"], hidden=128, layers=3)
        s = replace(s, config=dict(s.config, sliding_window=32,
                                   layer_types=["sliding_attention", "full_attention", "sliding_attention"]))
    if shape == "modernbert-tiny":  # global, local ±64, local; rotary without norm, GeGLU, bias-free LN
        s = tiny(SHAPES["modernbert-base"], hidden=128, layers=3)
    # head dims 64: equal lengths run cuDNN, so those batches get uniform buckets (causal and not)
    if shape == "qwen3-tiny-d64":
        s = tiny(SHAPES["qwen3-0.6b"], hidden=128, heads=2)
    if shape == "bge-tiny":
        s = tiny(SHAPES["bge-base"], hidden=128, heads=2)
    model_dir = make_model_dir(s, tmp_path, _tokenizer())
    eng = Engine(load_spec(str(model_dir)), "cuda", graphs=GraphOptions(debug=True))
    assert eng.uniform_buckets == (shape in ("qwen3-tiny-d64", "bge-tiny"))  # head dim 32: Triton for equal lengths too
    rng = np.random.default_rng(0)
    seen = set()
    replays = 0
    uniform = ([64] * 4, [128] * 8, [512] * 2, [16] * 4, [512] * 5, [64] * 3)  # equal lengths filling a bucket
    for lengths in ([1], [7], [128], [5, 5, 5], [300, 17, 64, 1], list(rng.integers(1, 257, size=20)), *uniform):
        batch = Batch.pack([rng.integers(1000, 30000, size=int(n), dtype=np.int32) for n in lengths])
        bucket = bucket_for(batch.num_seqs, batch.num_tokens, batch.max_seqlen, 16384, 512, eng.uniform_buckets)
        assert bucket is not None and bucket.uniform == (eng.uniform_buckets and lengths in uniform)
        assert eng.replays(batch) == (bucket in seen)  # only captured buckets are cheap steps
        replays += 3 if bucket in seen else 2  # a new bucket: eager, then capture + replay, replay
        seen.add(bucket)
        rows = [eng.step(batch).wait() for _ in range(3)]  # eager warm-up, capture, replay
        assert eng.replays(batch)
        assert (eng.graph_captures, eng.graph_replays) == (len(seen), replays)
        want = eng.forward(batch).cpu().numpy()
        for r in rows:
            np.testing.assert_allclose(r, want, atol=1e-2, rtol=1e-2)
    assert eng.graphs is not None and set(eng.graphs.lazy.graphs) == seen  # every bucket captured once
    # each capture cut at the layer boundaries (graphs.segment_starts), replayed segment by segment
    n_segments = len(segment_starts(len(eng.model.blocks()))) + 1
    assert n_segments >= 2 and all(len(g.segments) == n_segments for g in eng.graphs.lazy.graphs.values())


def test_steps_in_flight_each_get_their_own_inputs(tmp_path: Path) -> None:
    # Replays share one pinned staging buffer (graphs.py): steps enqueued back to back, none
    # waited for, in captured and new buckets alike, must each answer for their own batch.
    from bouquet.bench.models import SHAPES, make_model_dir
    from bouquet.engine.runtime.batch import Batch
    from bouquet.engine.runtime.engine import Engine, GraphOptions
    from bouquet.modelspec import load_spec

    eng = Engine(load_spec(str(make_model_dir(SHAPES["minilm"], tmp_path, _tokenizer()))), "cuda",
                 graphs=GraphOptions(debug=True))
    rng = np.random.default_rng(1)
    batches = [Batch.pack([rng.integers(1000, 30000, size=int(n), dtype=np.int32) for n in lengths])
               for lengths in ([9], [100], [9], [33, 7], [100], [256] * 4, [9], [50, 50, 3])]
    for b in batches:  # every bucket seen twice: captured
        for _ in range(2):
            eng.step(b).wait()
    want = [eng.forward(b).cpu().numpy() for b in batches]
    torch.cuda.synchronize()
    long = Batch.pack([rng.integers(1000, 30000, size=512, dtype=np.int32)] * 24)  # eager (first sight), GPU busy
    handles = [eng.step(long)] + [eng.step(b) for b in batches * 3]
    for i, h in enumerate(handles[1:]):
        np.testing.assert_allclose(h.wait(), want[i % len(batches)], atol=1e-2, rtol=1e-2)
    assert eng.graph_replays >= 3 * len(batches)


def test_startup_capture_from_saved_histogram(tmp_path: Path) -> None:
    from bouquet.bench.models import SHAPES, make_model_dir
    from bouquet.engine.runtime.batch import Batch
    from bouquet.engine.runtime.buckets import Bucket
    from bouquet.engine.runtime.engine import Engine, GraphOptions
    from bouquet.modelspec import load_spec

    spec = load_spec(str(make_model_dir(SHAPES["minilm"], tmp_path, _tokenizer())))
    stats = tmp_path / "buckets.json"
    eng = Engine(spec, "cuda", graphs=GraphOptions(stats_path=str(stats), debug=True))
    batch = Batch.pack([np.arange(1000, 1100, dtype=np.int32)])
    for _ in range(3):
        eng.step(batch).wait()
    eng.shutdown()  # writes the histogram
    again = Engine(spec, "cuda", graphs=GraphOptions(stats_path=str(stats), capture=("2:64:32",), debug=True))
    again.warmup()  # captures the configured bucket and the hot one
    assert {Bucket(1, 128, 128), Bucket(2, 64, 32)} <= set(again.graphs.lazy.graphs)
    np.testing.assert_allclose(again.step(batch).wait(), again.forward(batch).cpu().numpy(), atol=1e-2, rtol=1e-2)


def test_replica_graph_counters_count_real_replays(tmp_path: Path) -> None:
    """Issue 16 item 8: /metrics' bouquet_replica_graph_{captures,replays} are the engine's own
    counters (``contract.StepEngine``), nonzero once a captured graph has been replayed."""
    from helpers import BouquetProcess
    from helpers import graph_counters

    # The embedded all-MiniLM-L6-v2 (real weights): random full-size weights can overflow in bf16,
    # which the gateway answers with 422 (non-finite result) before any graph is replayed.
    # One gateway worker and one replica: on a 16-core host the default layout spreads four
    # requests over 12 workers and 2 replicas, and neither replica may see the bucket twice.
    # --dtype bfloat16: the suite's conftest sets BOUQUET_DTYPE=float32 for every server it starts
    # (its CPU references are fp32), and fp32 on CUDA runs eagerly: no graph to count.
    srv = BouquetProcess("--gateway-workers", "1", "--replicas-per-gpu", "1", "--dtype", "bfloat16", device="cuda")
    try:
        # One sequence of the same length each time, so one bucket: first sight eager, second
        # captured and replayed, then replayed (the warm-up batch has two sequences: another bucket).
        for _ in range(4):
            assert srv.embed("the same short text").status_code == 200
        time.sleep(1.3)  # replica numbers arrive with the gateway's next Info poll (about 1 s)
        counters = graph_counters(srv.url)
    finally:
        srv.stop()
    assert counters["captures"] >= 1 and counters["replays"] >= 3, counters


def test_fp32_on_cuda_steps_eagerly() -> None:
    """fp32 on CUDA attends with length-grouped SDPA, which sizes its groups on the host: no graph
    may be captured (a capture failed and broke the caching allocator for the steps after it)."""
    from bouquet.engine.runtime.batch import Batch
    from bouquet.engine.runtime.engine import Engine
    from bouquet.modelspec import load_spec

    eng = Engine(load_spec(None), "cuda", "float32")
    assert eng.graphs is None and not eng.attn.graph_safe
    seqs = [np.arange(101, 101 + n, dtype=np.int32) for n in (7, 7, 12)]
    for _ in range(3):  # the same bucket again and again: where a graph would have been captured
        rows = eng.step(Batch.pack(seqs)).wait()
        assert np.isfinite(rows).all()
        np.testing.assert_allclose(rows, eng.forward(Batch.pack(seqs)).cpu().numpy(), atol=1e-5)
