"""Programmatic dependent launch on the GPU (engine/kernels/pdl.py): engines whose Triton kernels launch
with PDL (wait, then signal) give the same vectors as engines launching
plainly — eager, at capture and over many graph replays, where a missing wait would show as a
race — for the decoder and encoder shapes, bf16 and fp8. Equal to 1e-6: PDL changes no
arithmetic, but mean pooling sums rows with atomic adds (an fp32 ulp from run to run: 1.2e-7
seen once for EmbeddingGemma at 300 tokens, 12-01g call 1); a race reads stale rows, far above."""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Iterator

import numpy as np
import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


def test_hopper_launches_with_pdl() -> None:
    """On the GPUs it was measured on (compute capability 9.x) the engine does use PDL, so the
    equality tests below compare two different launch modes."""
    from bouquet.engine.kernels import pdl

    if torch.cuda.get_device_capability(0)[0] != 9:
        pytest.skip("PDL is measured and on by default for Hopper only")
    assert pdl.supported(0)
    x = torch.empty(1, device="cuda")
    assert pdl.launch_options(x, "splitk", 400) == {"PDL": True, "launch_pdl": True}
    assert pdl.launch_options(x, "qk_norm_rope", 16) == {"PDL": True, "launch_pdl": True}
    assert pdl.launch_options(x, "qk_norm_rope", 512) == {}  # a large grid after a cuBLAS GEMM: plain
    assert pdl.launch_options(x, "small_gemm", 512) == {"PDL": True, "launch_pdl": True}  # after an add + norm
    assert pdl.launch_options(torch.empty(1), "splitk", 1) == {}
    w = torch.empty((64, 1024), dtype=torch.bfloat16, device="cuda")
    assert pdl.launch_options(x, "splitk", 400, w)["PREFETCH"]  # the weight slab asked of L2 before the wait
    assert "PREFETCH" not in pdl.launch_options(x, "norm", 16, w)  # a norm streams no weights
    unaligned = w.view(-1)[4:4 + 63 * 1024].view(63, 1024)  # 8 bytes off a 16-byte boundary
    assert "PREFETCH" not in pdl.launch_options(x, "small_gemm", 64, unaligned)
    odd_rows = torch.empty((64, 1004), dtype=torch.bfloat16, device="cuda")  # 2,008-byte rows
    assert "PREFETCH" not in pdl.launch_options(x, "small_gemm", 64, odd_rows)
    big = torch.empty((pdl.PREFETCH_MAX_BYTES // 2048 + 1, 1024), dtype=torch.bfloat16, device="cuda")
    assert "PREFETCH" not in pdl.launch_options(x, "small_gemm", 64, big)  # above the measured size limit


@contextmanager
def _plain_launches(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    from bouquet.engine.kernels import pdl

    with monkeypatch.context() as m:
        m.setattr(pdl, "supported", lambda index: False)
        yield


@pytest.mark.parametrize("shape,quantization", [("qwen3-0.6b", "none"), ("bge-base", "none"),
                                                ("embeddinggemma-300m", "none"), ("qwen3-0.6b", "fp8"),
                                                ("bge-base", "fp8")])
def test_engine_with_pdl_gives_the_same_bits(tmp_path: Path, shape: str, quantization: str,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """(The PDL engine's GEMMs also prefetch their weights into L2: pdl.PREFETCHES.)"""
    from bouquet.bench.models import SHAPES, make_model_dir
    from bouquet.engine.kernels import pdl
    from bouquet.engine.runtime.batch import Batch
    from bouquet.engine.runtime.engine import Engine, GraphOptions
    from bouquet.modelspec import load_spec
    from tests.gpu.test_gpu_fastpath import _tokenizer, replan

    if not pdl.supported(0):
        pytest.skip("no programmatic dependent launch on this GPU / CUDA / Triton")
    s = SHAPES[shape]  # full width, two layers, a short vocabulary
    s = replace(s, config=dict(s.config, num_hidden_layers=2, vocab_size=min(s.config["vocab_size"], 32768)))
    spec = load_spec(str(make_model_dir(s, tmp_path, _tokenizer())))
    # small_gemms on in both: both engines run the same kernels, only their launches differ
    opts = dict(quantization=quantization, fp8_min_cosine=0.0, graphs=GraphOptions(debug=True))
    with _plain_launches(monkeypatch):
        plain = Engine(spec, "cuda", **opts)
        replan(plain, small_gemms=True)
    with_pdl = Engine(spec, "cuda", **opts)
    replan(with_pdl, small_gemms=True)
    rng = np.random.default_rng(0)
    for lengths in ([1], [7], [128], [200], [130, 60], [300], [512], [100, 28], [5] * 5, [512] * 8):
        batch = Batch.pack([rng.integers(1000, 30000, size=n, dtype=np.int32) for n in lengths])
        for i in range(8):  # eager, capture, then replays (a race would differ from one to the next)
            with _plain_launches(monkeypatch):
                want = plain.step(batch).wait()
            got = with_pdl.step(batch).wait()
            np.testing.assert_allclose(got, want, rtol=0, atol=1e-6, err_msg=f"{lengths} step {i}")
        assert with_pdl.replays(batch)
