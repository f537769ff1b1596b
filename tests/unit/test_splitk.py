"""Split-K plans and PartialRows on the CPU: which (tokens, weight) shapes get a plan, and that the
add + norm readers give the same rows for parts as for the summed GEMM output (the fallbacks
here; the Triton kernels are checked in test_gpu_splitk.py)."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from bouquet.engine.kernels.rows import PartialRows, materialize, norm_input_args, unscale_args
from bouquet.engine.kernels.layers import RMSNorm
from bouquet.engine.kernels.ops import add_layer_norm, add_rms_norm
from bouquet.engine.plan import SPLITK_MAX_TOKENS as MAX_TOKENS, SplitPlan, splitk_plan as plan_for
from bouquet.engine.linear.splitk import usable


@pytest.mark.parametrize("T,N,K", [(1, 1024, 2048), (128, 1024, 2048), (128, 1024, 3072), (16, 1024, 3072),
                                   (128, 768, 768), (16, 768, 3072), (128, 384, 1536), (64, 384, 384),
                                   (16, 768, 1152), (16, 1536, 8960), (64, 896, 4864)])  # K ranges by 64
def test_plans_tile_exactly_with_k_ranges_of_192_columns_or_more(T: int, N: int, K: int) -> None:
    p = plan_for(T, N, K, 132)
    assert p is not None and p.fits(T, N, K) and p.parts >= 2
    k_split = K // p.parts
    assert k_split >= 192 and k_split % p.bk == 0, p
    programs = -(-T // p.bm) * (N // p.bn) * p.parts
    assert programs <= 3 * 132, (p, programs)  # at most three waves
    # ... and the most split the rule allows: twice the parts would pass a limit or not tile K
    assert (K // (p.parts * 2) < 192 or K % (p.parts * 2) != 0 or (K // (p.parts * 2)) % 64 != 0
            or programs * 2 > 3 * 132 or p.parts == 16), p
    assert p.smem_bytes() <= 227 * 1024  # Hopper's shared memory per block


@pytest.mark.parametrize("T,N,K", [(129, 1024, 2048), (256, 1024, 3072), (200, 768, 768), (256, 384, 1536)])
def test_steps_of_129_to_256_tokens_take_the_wide_plan(T: int, N: int, K: int) -> None:
    p = plan_for(T, N, K, 132)
    assert p == SplitPlan(64, 128, 64, 4, warps=4, stages=4) and p.fits(T, N, K)
    assert p.smem_bytes() <= 227 * 1024


def test_no_plan_where_cublas_has_tiles_or_the_sizes_do_not_tile() -> None:
    assert plan_for(MAX_TOKENS + 1, 1024, 2048, 132) is None
    assert plan_for(0, 1024, 2048, 132) is None
    assert plan_for(128, 1000, 2048, 132) is None  # N not a multiple of the tile width
    assert plan_for(128, 1024, 200, 132) is None  # K too short to split
    assert plan_for(256, 1000, 2048, 132) is None  # the wide plan's tile width does not divide N
    assert plan_for(200, 384, 384, 132) is None  # K = 384 does not tile into four ranges of 64-column steps
    assert plan_for(200, 1024, 256, 132) is None  # four K ranges of 64 columns: one K step each, too short
    assert plan_for(256, 4096, 4096, 132) is None  # 4 × 32 × 4 = 512 programs: more than three waves
    assert not SplitPlan(64, 64, 128, 1).fits(128, 1024, 2048)  # one part is no split


def test_partial_rows_read_like_their_sum() -> None:
    torch.manual_seed(0)
    T, N = 7, 96
    parts = torch.randn(3, T, N)
    b = torch.randn(N).to(torch.bfloat16)
    p = PartialRows(parts, b, torch.bfloat16)
    dense = (parts.double()[0] + parts.double()[1] + parts.double()[2] + b.double()).to(torch.bfloat16)
    assert p.shape == (T, N)
    torch.testing.assert_close(materialize(p), dense, atol=0, rtol=2 ** -8)  # within one bf16 rounding
    dense = materialize(p)
    res = torch.randn(T, N).to(torch.bfloat16)
    norm = RMSNorm(N, 1e-6).to(torch.bfloat16)
    for got, want in zip(add_rms_norm(p, res, norm), add_rms_norm(dense, res, norm)):
        assert torch.equal(got, want)
    ln = torch.nn.LayerNorm(N).to(torch.bfloat16)
    assert torch.equal(add_layer_norm(p, res, ln), add_layer_norm(dense, res, ln))
    raw, dtype, args = norm_input_args(p)
    assert raw.shape == (T, N) and dtype == torch.bfloat16 and args["PARTS"] == 3 and args["part_stride"] == T * N
    with pytest.raises(TypeError, match="PartialRows"):
        unscale_args(p)  # the activation kernels never see parts


def test_cpu_projections_stay_plain_linears() -> None:
    from bouquet.engine.linear.base import Linear, SplitKLinear

    x = torch.randn(4, 256).to(torch.bfloat16)
    assert not usable(x) and not usable(x.float())
    w = torch.randn(128, 256).to(torch.bfloat16)
    layer = Linear(w, None, "o", readers="norm")
    layer.method = SplitKLinear()  # even if a plan chose it, a CPU tensor runs F.linear
    got = layer(x)
    assert isinstance(got, torch.Tensor) and torch.equal(got, torch.nn.functional.linear(x, w))


def test_triton_gemms_stay_off_on_the_cpu(tmp_path: Path) -> None:
    """The kernel plan turns the engine's Triton GEMMs on for measured Hopper GPUs only; on the CPU
    every projection runs the CPU's oneDNN method (linear/cpu.py), never a Triton one."""
    from bouquet.engine.runtime.engine import Engine
    from bouquet.engine.linear.base import linears
    from bouquet.engine.linear.cpu import OneDnnMethod
    from bouquet.engine.plan import DeviceProfile
    from bouquet.modelspec import load_spec
    from tests.fixtures.tiny_models import make_tiny_model

    eng = Engine(load_spec(str(make_tiny_model("qwen3", tmp_path / "qwen3"))), "cpu")
    assert eng.profile == DeviceProfile.cpu() and not eng.profile.measured_hopper
    assert not (eng.plan.split_k or eng.plan.gate_up_act or eng.plan.small_gemms)
    layers = list(linears(eng.model))
    assert layers and all(type(p.method) is OneDnnMethod for p in layers)
