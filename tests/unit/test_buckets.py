"""Bucket arithmetic, the lazy-capture state machine and the graph input layout (CPU)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from bouquet.engine.runtime.batch import Batch
from bouquet.engine.runtime.buckets import Bucket, LazyCapture, bucket_for, load_hot, round_max_seqlen, round_seqs, round_tokens
from bouquet.engine.runtime.graphs import input_views, pack_inputs, pack_into, packed_size
from bouquet.engine.heads.pooling import pooler


def test_token_rounding_steps_of_64_then_256() -> None:
    assert [round_tokens(n) for n in (1, 64, 65, 1000, 1024)] == [64, 64, 128, 1024, 1024]
    assert [round_tokens(n) for n in (1025, 1280, 1281, 8192)] == [1280, 1280, 1536, 8192]
    with pytest.raises(ValueError):
        round_tokens(0)


def test_seq_slots_and_max_seqlen_rounding() -> None:
    assert [round_seqs(n) for n in (1, 2, 3, 5, 33, 64)] == [1, 2, 4, 8, 64, 64]
    assert round_max_seqlen(3, 64) == 16
    assert round_max_seqlen(100, 1024) == 128
    assert round_max_seqlen(512, 512) == 512
    assert round_max_seqlen(600, 640) == 640  # capped at the token bucket


def test_bucket_for_threshold_and_slots() -> None:
    assert bucket_for(3, 300, 128, 8192, 512) == Bucket(4, 320, 128)
    assert bucket_for(1, 9000, 9000, 8192, 512) is None  # above graph_max_tokens: eager
    assert bucket_for(600, 1200, 2, 8192, 512) is None  # more slots than the largest bucket


def test_uniform_buckets_only_for_batches_that_fill_them() -> None:
    from bouquet.engine.runtime.buckets import uniform_bucket

    # 100 texts of 512 tokens under a 16,384-token budget: steps of 32, 32, 32 and 4, each exact
    assert bucket_for(32, 16384, 512, 16384, 512, uniform=True) == Bucket(32, 16384, 512, uniform=True)
    assert bucket_for(4, 2048, 512, 16384, 512, uniform=True) == Bucket(4, 2048, 512, uniform=True)
    assert bucket_for(32, 16384, 512, 16384, 512) == Bucket(32, 16384, 512)  # the engine's attention has no faster kernel
    assert bucket_for(5, 2560, 512, 16384, 512, uniform=True) == Bucket(5, 2560, 512, uniform=True)  # 5 slots exactly
    assert bucket_for(5, 2560, 512, 16384, 512) == Bucket(8, 2560, 512)
    assert bucket_for(3, 48, 16, 16384, 512, uniform=True) == Bucket(4, 64, 16)  # 48 tokens is no bucket size
    assert bucket_for(4, 2000, 500, 16384, 512, uniform=True) == Bucket(4, 2048, 512)  # length not a power of two
    assert bucket_for(4, 1900, 512, 16384, 512, uniform=True) == Bucket(4, 2048, 512)  # unequal lengths
    assert uniform_bucket(1, 128, 128) is None  # one sequence: its ordinary bucket runs the same kernels
    assert uniform_bucket(2, 16, 8) is None and uniform_bucket(2, 32, 16) is None  # 32 tokens is no bucket size
    b = Bucket(32, 16384, 512, uniform=True)
    assert str(b) == "32:16384:512:uniform" and Bucket.parse(str(b)) == b
    assert b.example_lengths() == [512] * 32
    assert Bucket.parse("5:2560:512:uniform") == Bucket(5, 2560, 512, uniform=True)
    for bad in ("1:512:512:uniform", "4:2000:500:uniform", "4:4096:512:uniform", "3:48:16:uniform", "4:2048:512:even"):
        with pytest.raises(ValueError):
            Bucket.parse(bad)


def test_uniform_buckets_use_exact_slots_under_the_slot_limit_and_at_startup() -> None:
    from bouquet.engine.runtime.buckets import startup_buckets

    # 100 slots exactly fit --max-batch-seqs 100, where rounding up to 128 would not
    assert bucket_for(100, 12800, 128, 16384, 100, uniform=True) == Bucket(100, 12800, 128, uniform=True)
    assert bucket_for(100, 12800, 100 + 28, 16384, 100) is None
    # a start-up capture of equal lengths also captures the uniform bucket such batches look up
    assert startup_buckets("32:16384:512", True) == [Bucket(32, 16384, 512), Bucket(32, 16384, 512, uniform=True)]
    assert startup_buckets("32:16384:512", False) == [Bucket(32, 16384, 512)]
    assert startup_buckets("3:100:50", True) == [Bucket(4, 128, 64)]
    assert startup_buckets("5:2560:512:uniform", True) == [Bucket(5, 2560, 512, uniform=True)]
    assert startup_buckets("5:2560:512:uniform", False) == [Bucket(8, 2560, 512)]  # what its batches run in there


def test_row_parts_cover_a_row_with_at_most_three_tiles() -> None:
    from bouquet.engine.kernels.ops import row_parts

    for n in range(1, 16385):
        parts = [p for p in row_parts(n) if p]
        assert all(p & (p - 1) == 0 for p in parts) and list(parts) == sorted(parts, reverse=True), n
        assert sum(parts) == n or (len(parts) == 1 and n <= parts[0] < 2 * n), (n, parts)
    assert row_parts(3072) == (2048, 1024, 0) and row_parts(9728) == (8192, 1024, 512) and row_parts(100) == (128, 0, 0)


def test_bucket_parse_rounds_and_validates() -> None:
    assert Bucket.parse("3:100:50") == Bucket(4, 128, 64)
    assert str(Bucket(4, 128, 64)) == "4:128:64"
    for bad in ("1:2", "a:b:c", "10:5:5", "1:64:65"):
        with pytest.raises(ValueError):
            Bucket.parse(bad)
    b = Bucket(8, 256, 128)
    lengths = b.example_lengths()
    assert len(lengths) == 8 and sum(lengths) <= 256 and max(lengths) <= 128


def test_lazy_capture_eager_then_capture_then_replay(tmp_path) -> None:
    captured: list[Bucket] = []

    def capture(b: Bucket) -> tuple[int, int]:
        captured.append(b)
        return (b.seqs, b.tokens)

    lz: LazyCapture[tuple[int, int]] = LazyCapture(capture)
    b1, b2 = Bucket(1, 128, 128), Bucket(4, 512, 256)
    assert lz.lookup(b1) is None  # first sight: eager warm-up
    assert captured == []
    assert lz.lookup(b1) == (1, 128)  # second: captured
    assert lz.lookup(b1) == (1, 128)  # then replayed, never recaptured
    assert captured == [b1]
    assert lz.ensure(b2) == (4, 512)  # start-up capture skips the eager step
    assert lz.lookup(b2) == (4, 512)
    assert lz.hits[b1] == 3 and lz.hits[b2] == 1
    path = tmp_path / "hist.json"
    lz.save_stats(path)
    assert load_hot(path) == [b1]  # b2 had one hit: not hot
    assert load_hot(path, min_hits=1) == [b1, b2]
    assert load_hot(tmp_path / "missing.json") == []


def test_packed_layout_pads_with_empty_sequences() -> None:
    seqs = [np.array([5, 6, 7], np.int32), np.array([8], np.int32)]
    batch = Batch.pack(seqs, [np.array([0, 0, 1], np.int32), None])
    host = pack_inputs(batch, tokens=8, seqs=4)
    ids, pos, tt, seg, cu = input_views(host, 8, 4)
    assert ids.tolist() == [5, 6, 7, 8, 0, 0, 0, 0]
    assert pos.tolist() == [0, 1, 2, 0, 0, 0, 0, 0]
    assert tt.tolist() == [0, 0, 1, 0, 0, 0, 0, 0]
    assert seg.tolist() == [0, 0, 0, 1, 4, 4, 4, 4]  # padding tokens → discarded row S
    assert cu.tolist() == [0, 3, 4, 4, 4]  # tail repeats the last offset


def test_packing_into_a_reused_buffer_overwrites_every_element_of_the_bucket() -> None:
    # graphs.py reuses one pinned staging buffer: what a larger batch left there must not leak
    big = Batch.pack([np.arange(1, 40, dtype=np.int32)] * 3, [np.ones(39, np.int32)] * 3, pool_skip=[2, 2, 2])
    h = np.full(packed_size(256, 8) + 5, -7, dtype=np.int32)
    pack_into(h, big, 256, 8)
    for batch in (Batch.pack([np.array([5, 6, 7], np.int32)]),  # one sequence: the fast paths
                  Batch.pack([np.array([5, 6, 7], np.int32), np.array([8], np.int32)], [np.array([0, 0, 1], np.int32), None]),
                  Batch.pack([np.array([5, 6, 7], np.int32)], pool_skip=[1])):
        pack_into(h, batch, 8, 4)
        ids, pos, tt, seg, cu = input_views(h, 8, 4)
        t, b = batch.num_tokens, batch.num_seqs
        assert ids.tolist() == batch.input_ids.tolist() + [0] * (8 - t)
        assert pos.tolist() == batch.position_ids.tolist() + [0] * (8 - t)
        types = batch.token_type_ids.tolist() if batch.token_type_ids is not None else [0] * t
        assert tt.tolist() == types + [0] * (8 - t)
        owner = np.repeat(np.arange(b), np.diff(batch.cu_seqlens))
        if batch.pool_skip is not None:
            owner[batch.position_ids < np.repeat(batch.pool_skip, np.diff(batch.cu_seqlens))] = 4
        assert seg.tolist() == owner.tolist() + [4] * (8 - t)
        assert cu.tolist() == batch.cu_seqlens.tolist() + [t] * (4 - b)
        assert h[packed_size(8, 4):packed_size(256, 8)].min() >= 0  # beyond the bucket: the old batch, untouched
    assert Batch.pack([np.array([5, 6, 7], np.int32)]).max_seqlen == 3
    with pytest.raises(ValueError, match="at least one token"):
        Batch.pack([np.array([], np.int32)])


@pytest.mark.parametrize("mode", ["mean", "cls", "last"])
def test_pooling_ignores_padding(mode: str) -> None:
    torch.manual_seed(0)
    seqs = [np.arange(1, n + 1, dtype=np.int32) for n in (3, 1, 5)]
    batch = Batch.pack(seqs)
    host = pack_inputs(batch, tokens=16, seqs=4)
    _, _, _, seg, cu = input_views(host, 16, 4)
    hidden = torch.randn(16, 8)
    hidden[9:] = 1e6  # padding rows must not leak into real sequences
    got = pooler(mode)(hidden, seg, cu)[:3]
    rows = [hidden[a:b] for a, b in zip(batch.cu_seqlens[:-1], batch.cu_seqlens[1:])]  # the 3 real sequences
    want = torch.stack([r.mean(0) if mode == "mean" else r[0] if mode == "cls" else r[-1] for r in rows])
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize("args, message", [
    (["--capture-bucket", "2:64"], "must be 'seqs:tokens:max_seqlen'"),
    (["--capture-bucket", "1:17000:512"], "above --graph-max-tokens 16384"),
    (["--graph-max-tokens", "10"], "--graph-max-tokens must be >= 64"),
])
def test_graph_options_on_the_command_line_are_checked(args: list[str], message: str) -> None:
    import subprocess
    import sys

    for cmd in ("serve", "server"):
        r = subprocess.run([sys.executable, "-m", "bouquet", cmd, *args], capture_output=True, text=True, timeout=120)
        assert r.returncode == 2 and message in r.stderr, (cmd, r.returncode, r.stderr[-500:])


def test_graph_options_travel_to_the_replica_config() -> None:
    from bouquet.config import ServeConfig

    cfg = ServeConfig(graph_max_tokens=16384, capture_buckets=("3:100:50",), bucket_stats_path="/tmp/hist.json").validate()
    again = ServeConfig.from_json(cfg.to_json())  # what the replica process receives
    assert again == cfg and again.capture_buckets == ("3:100:50",)
    from bouquet.engine.runtime.engine import GraphOptions

    opts = GraphOptions.from_config(again)
    assert (opts.max_tokens, opts.capture, opts.stats_path) == (16384, ("3:100:50",), "/tmp/hist.json")
    assert Bucket.parse(opts.capture[0]) == Bucket(4, 128, 64)


def test_graph_segments_start_after_one_block_then_grow_fourfold() -> None:
    from bouquet.engine.runtime.graphs import segment_starts

    assert segment_starts(28) == [1, 5, 21]
    assert segment_starts(12) == segment_starts(6) == [1, 5]
    assert segment_starts(2) == [1] and segment_starts(1) == segment_starts(0) == []


@pytest.mark.parametrize("kind", ["bert", "qwen3", "modernbert", "distilbert", "mpnet", "xlmr-cross", "qwen3-reranker",
                                  "gemma3"])
def test_blocks_are_the_layers_forward_calls_once_each_in_order(tmp_path, kind: str) -> None:  # type: ignore[no-untyped-def]
    """The graph manager cuts CUDA-graph captures at the model's blocks() (a forward pre-hook on
    each cut block): that is exact only if forward calls every block once, in list order."""
    from bouquet.engine.runtime.batch import Batch
    from bouquet.engine.runtime.engine import Engine
    from bouquet.modelspec import load_spec
    from tests.fixtures.tiny_models import make_tiny_model

    eng = Engine(load_spec(str(make_tiny_model(kind, tmp_path / kind))), "cpu")
    blocks = eng.model.blocks()
    calls: list[int] = []
    hooks = [b.register_forward_pre_hook(lambda _m, _a, i=i: calls.append(i)) for i, b in enumerate(blocks)]
    eng.forward(Batch.pack([np.arange(5, 17, dtype=np.int32), np.arange(5, 9, dtype=np.int32)]))
    for h in hooks:
        h.remove()
    assert len(blocks) == eng.spec.config.get("num_hidden_layers", eng.spec.config.get("n_layers")) >= 2
    assert calls == list(range(len(blocks)))
