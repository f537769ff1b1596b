"""The CPU path (issue 42): the dtype choice from the CPU's flags and its /info report, the CPU
linears against F.linear, the int8 accuracy gate (admitted and refused), and all-MiniLM-L6-v2 in
bf16 on the STSb test split against sentence-transformers."""
from __future__ import annotations

import platform
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import requests
import torch
import torch.nn.functional as F

from bouquet.config import ConfigError, ServeConfig
from bouquet.engine.linear.cpu import Int8Linear, OneDnnLinear, cpu_dtype, cpu_flags
from bouquet.engine.runtime.engine import Engine
from bouquet.engine.runtime.host_memory import keep_freed_memory
from bouquet.modelspec import load_spec
from helpers import BouquetProcess, read_sts

ST_SPEARMAN_TEST = 0.82032  # sentence-transformers fp32 on the STSb test split (bench/results/cpu-*.md)


@pytest.mark.parametrize("flags, want", [
    ({"avx512f", "avx512_vnni", "avx512_bf16"}, "bfloat16"),  # Cooper Lake, Zen 4
    ({"avx512f", "amx_tile", "amx_bf16", "amx_int8"}, "bfloat16"),  # Sapphire Rapids
    ({"avx2", "fma", "avx512f", "avx512_vnni"}, "float32"),  # Cascade Lake: VNNI but no bf16
    ({"avx2", "fma"}, "float32"),
    (set(), "float32"),  # flags unknown (no /proc/cpuinfo)
])
def test_cpu_dtype_from_flags(flags: set[str], want: str) -> None:
    assert cpu_dtype(flags) == want


def test_cpu_flags_reads_the_flags_line(tmp_path: Path) -> None:
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nmodel name\t: x\nflags\t\t: fpu avx512f avx512_bf16\n\nprocessor\t: 1\n")
    assert cpu_flags(info) == {"fpu", "avx512f", "avx512_bf16"}
    assert cpu_flags(tmp_path / "absent") == frozenset()


def test_auto_dtype_is_fp32_under_int8_whatever_the_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    """The int8 kernels take fp32 rows: with bf16 ones the conversions cost 6-8% of bulk throughput and
    ~0.1 ms at batch 1 (docs/decisions.md, 2026-12-05), so `auto` is fp32 under int8 on every CPU."""
    from bouquet.engine.runtime import engine

    cpu = torch.device("cpu")
    monkeypatch.setattr(engine, "cpu_flags", lambda: frozenset({"avx512f", "avx512_bf16"}))
    assert engine.resolve_dtype("auto", cpu) == torch.bfloat16
    assert engine.resolve_dtype("auto", cpu, "int8") == torch.float32
    assert engine.resolve_dtype("bfloat16", cpu, "int8") == torch.bfloat16  # asked for: kept
    assert engine.resolve_dtype("auto", torch.device("cuda"), "fp8") == torch.bfloat16


def test_info_reports_the_cpu_dtype_and_quantization() -> None:
    """`--dtype auto --quantization int8` on the CPU: /info's model_dtype is fp32 (what int8 runs
    in on every CPU), and its quantization the one served (int8 here, which then answers). The log
    says why auto chose fp32, and names the CPU kernels after quantization (a trial read "CPU linears
    in torch.float32: oneDNN, prepacked", logged before int8 replaced them)."""
    srv = BouquetProcess("--dtype", "auto", "--quantization", "int8")
    try:
        info = requests.get(f"{srv.url}/info", timeout=30).json()
        r = requests.post(f"{srv.url}/v1/embeddings", json={"input": ["A man is playing a guitar."]}, timeout=60)
    finally:
        srv.stop()
    assert info["model_dtype"] == "float32" and info["quantization"] == "int8"
    assert r.status_code == 200 and len(r.json()["data"][0]["embedding"]) == 384
    log = srv.log()
    assert "engine: --dtype auto: float32 (int8's kernels take fp32 rows)" in log, log[-3000:]
    assert "engine: CPU linears (model dtype float32): int8 (torch._int_mm)" in log, log[-3000:]


def test_auto_dtype_reason_names_the_cpu_flags() -> None:
    from bouquet.engine.runtime import engine

    cpu = torch.device("cpu")
    assert engine.auto_dtype_reason(cpu, "none", frozenset({"avx2", "avx512_bf16"})) == \
        "this CPU has native bf16 dot products: avx512_bf16"
    assert "no native bf16 dot products" in engine.auto_dtype_reason(cpu, "none", frozenset({"avx2"}))
    assert engine.auto_dtype_reason(cpu, "int8", frozenset({"avx512_bf16"})) == "int8's kernels take fp32 rows"


def test_int8_needs_the_cpu() -> None:
    with pytest.raises(ConfigError, match="int8 runs on the CPU only"):
        ServeConfig(device="cuda", quantization="int8").validate()
    # float16 is refused with the start's one error line, naming the dtype, not after a replica has loaded the model
    with pytest.raises(ConfigError, match="int8 needs --dtype auto, float32 or bfloat16 .*got float16"):
        ServeConfig(device="cpu", dtype="float16", quantization="int8").validate()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cpu_linears_match_f_linear(dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(0)
    w, b = torch.randn(96, 64, generator=g).to(dtype) * 0.1, torch.randn(96, generator=g).to(dtype)
    for t in (1, 14, 300):
        x = torch.randn(t, 64, generator=g).to(dtype)
        ref = F.linear(x.float(), w.float(), b.float())
        dense = OneDnnLinear.prepare(w, b).apply(x)
        assert dense.dtype == dtype and dense.shape == (t, 96)
        torch.testing.assert_close(dense.float(), ref, atol=2e-2 if dtype == torch.bfloat16 else 1e-5, rtol=1e-2)
        for algo, approximate in (("none", "none"), ("tanh", "tanh")):  # GELU as oneDNN's post-op
            fused = OneDnnLinear.prepare(w, b).apply(x, algo)
            torch.testing.assert_close(fused.float(), F.gelu(ref, approximate=approximate),
                                       atol=2e-2 if dtype == torch.bfloat16 else 1e-5, rtol=1e-2)
        x0 = x.clone()
        q = Int8Linear.prepare(w, b, x.abs().amax(0).float()).apply(x).float()
        assert torch.equal(x, x0)  # its in-place passes run on a copy, even of fp32 rows
        # int8 error: ~|x|·|w|·K / 127 per product sum; the vectors stay aligned
        cos = F.cosine_similarity(q, ref, dim=1)
        assert cos.min() > 0.999, cos.min()
        assert not torch.equal(q, ref)  # the int8 path really rounds


def test_int8_gate_admits_minilm_and_refuses_past_the_bar() -> None:
    """all-MiniLM-L6-v2 passes the default bar; the same model with the bar above what its int8
    vectors reach is refused, the message naming the cosine and the bar."""
    spec = load_spec(None)
    eng = Engine(spec, "cpu", "float32", quantization="int8")
    lo, _ = eng.int8_cosine
    assert 0.99 <= lo < 1.0
    with pytest.raises(ValueError, match=r"--quantization int8 is refused for this model: .* cosine 0\.9\d+ .*"
                                         r"the bar is 0\.99999"):
        Engine(spec, "cpu", "float32", quantization="int8", int8_min_cosine=0.99999)


def test_scorer_agreement_sees_the_ranking_under_a_constant_offset() -> None:
    """A scorer's probe agreement (``output_cosines``, D < 8) is the lower of cosine and Pearson
    correlation per output: logits of 3 + small values (a classifier bias) in an unrelated order
    read cosine ~0.999, correlation ~0; a shift of every score is caught by the cosine."""
    from bouquet.engine.linear.fp8 import output_cosines

    g = torch.Generator().manual_seed(0)
    ref = 3 + 0.1 * torch.randn(32, 1, generator=g)
    shuffled = 3 + 0.1 * torch.randn(32, 1, generator=g)
    assert F.cosine_similarity(shuffled.t(), ref.t()).item() > 0.99  # what the cosine alone saw
    assert output_cosines(shuffled, ref)[0] < 0.5
    assert output_cosines(ref + 1e-4 * torch.randn(32, 1, generator=g), ref)[0] > 0.999
    assert output_cosines(-ref, ref)[0] < 0  # a sign flip: both measures see it
    assert output_cosines(torch.full((32, 1), 3.0), torch.full((32, 1), 3.0))[0] == pytest.approx(1)  # flat: cosine alone
    emb = torch.randn(4, 16, generator=g)  # embeddings (D ≥ 8): per-row cosine, unchanged
    assert output_cosines(emb + 5, emb + 5) == pytest.approx(np.ones(4))


def test_int8_gate_refuses_a_cross_encoder_whose_ranking_it_breaks(tmp_path: Path) -> None:
    """A fresh-clone trial's reranker (random 2-layer BERT cross-encoder with weight outliers): int8
    reordered its documents, yet with a classifier bias of 3 the gate's plain cosine read 0.9991
    and admitted it. It is refused now, as the same model without the bias always was."""
    import shutil

    import transformers as tf

    from bouquet.modelspec import resolve_model_path

    torch.manual_seed(1)
    cfg = tf.BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, num_labels=1)
    model = tf.BertForSequenceClassification(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "encoder" in name and p.dim() == 2:
                p.normal_(0, 1.0)
                p.view(-1)[::97] *= 300
        model.classifier.weight.normal_(0, 1.0)
        model.classifier.bias.fill_(3.0)
    model.save_pretrained(tmp_path, safe_serialization=True)
    for f in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        shutil.copy(resolve_model_path(None) / f, tmp_path / f)
    with pytest.raises(ValueError, match=r"--quantization int8 is refused for this model"):
        Engine(load_spec(str(tmp_path)), "cpu", "float32", quantization="int8")


def test_minilm_bf16_on_stsb_test_matches_sentence_transformers(st_sts_test) -> None:
    """bf16 engine (what `auto` picks on AVX512-BF16 / AMX CPUs) vs sentence-transformers fp32 on
    every sentence of the STSb test split: min cosine ≥ 0.999, Spearman within 0.001."""
    from scipy.stats import spearmanr

    from bouquet.engine.runtime.batch import Batch
    from bouquet.tokenization import TextTokenizer

    s1, s2, gold = read_sts("test")
    spec = load_spec(None)
    eng = Engine(spec, "cpu", "bfloat16")
    ids = [np.asarray(x, np.int32) for x in TextTokenizer(spec).encode(s1 + s2).ids]
    rows = np.concatenate([eng.step(Batch.pack(ids[i:i + 128])).wait() for i in range(0, len(ids), 128)])
    rows /= np.linalg.norm(rows, axis=1, keepdims=True)
    ref = np.stack([st_sts_test[s] for s in s1 + s2])  # unit length (the model's Normalize module)
    assert (rows * ref).sum(1).min() >= 0.999
    n = len(s1)
    rho = spearmanr((rows[:n] * rows[n:]).sum(1), gold).statistic
    assert abs(rho - ST_SPEARMAN_TEST) <= 0.001, rho


def test_cpu_linears_run_at_a_bounded_set_of_row_counts() -> None:
    """oneDNN caches a primitive (~0.6 MB) per input shape, so the CPU methods pad rows to ~51 counts
    up to 16,384 (a served replica's memory stays flat: tests/integration/test_load.py); the padded
    rows are cut off again and change nothing."""
    from bouquet.engine.linear.base import Linear
    from bouquet.engine.linear.cpu import OneDnnMethod, padded_rows

    counts = {padded_rows(t) for t in range(1, 16385)}
    assert len(counts) <= 52
    assert all(t <= padded_rows(t) <= max(t + 15, 1.25 * t) for t in range(1, 16385))
    g = torch.Generator().manual_seed(1)
    w, b = torch.randn(96, 64, generator=g) * 0.1, torch.randn(96, generator=g)
    for act in (None, "gelu"):
        lin = Linear(w, b, "up", act=act)
        lin.method = OneDnnMethod()
        lin.method.process_weights_after_loading(lin)
        for t in (1, 17, 70):
            x = torch.randn(t, 64, generator=g)
            ref = F.linear(x, w, b)
            got = lin(x)
            assert got.shape == (t, 96)
            torch.testing.assert_close(got, F.gelu(ref) if act else ref, atol=1e-5, rtol=1e-4)


# A fresh process allocates 24 MiB, then frees it: where the block came from (the heap, below the
# program break, or a fresh mmap above it) and whether the break stayed put after the free.
_HEAP_PROBE = """
import ctypes, sys, torch
libc = ctypes.CDLL(None)
libc.sbrk.restype, libc.sbrk.argtypes = ctypes.c_void_p, [ctypes.c_ssize_t]
if sys.argv[1] == "engine":
    from bouquet.engine.runtime.engine import Engine
    from bouquet.modelspec import load_spec
    Engine(load_spec(None), "cpu", "float32")
x = torch.empty(24 << 18).fill_(1.0)
in_heap, top = x.data_ptr() < libc.sbrk(0), libc.sbrk(0)
del x
print(in_heap, libc.sbrk(0) == top)
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the thresholds are glibc malloc's")
def test_a_cpu_engine_keeps_freed_memory_for_the_next_step() -> None:
    """A CPU engine sets glibc's thresholds (engine/runtime/host_memory.py): a step's multi-MB
    tensors come from the heap and stay there when freed, instead of a fresh mmap each step whose
    pages fault in again. Without the setting (the first process) the same block is a fresh mmap."""
    def probe(mode: str) -> str:
        done = subprocess.run([sys.executable, "-c", _HEAP_PROBE, mode], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr[-2000:]
        return done.stdout.split("\n")[-2]

    assert probe("plain") == "False True"  # mmapped: the premise this test rests on
    assert probe("engine") == "True True"
    assert "glibc malloc keeps freed memory" in keep_freed_memory()
