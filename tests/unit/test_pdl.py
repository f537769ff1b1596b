"""Which Triton launches take programmatic dependent launch (engine/kernels/pdl.py), on the CPU: the rule
by kernel and grid size the H200 measurements chose, no PDL off CUDA, and unknown kernel names
refused (a typo at a launch site would otherwise silently change the rule). The launches
themselves are tested on the GPU (tests/gpu/test_gpu_pdl.py)."""
from __future__ import annotations

import pytest
import torch

from bouquet.engine.kernels import pdl


def test_kernels_after_ours_always_take_pdl_the_others_only_with_small_grids() -> None:
    for kernel in pdl.FOLLOWS_OURS:
        assert pdl.takes_pdl(kernel, 1) and pdl.takes_pdl(kernel, 100_000)
    for kernel in pdl.KERNELS - pdl.FOLLOWS_OURS:
        assert pdl.takes_pdl(kernel, pdl.MAX_PROGRAMS)
        assert not pdl.takes_pdl(kernel, pdl.MAX_PROGRAMS + 1)
    assert pdl.FOLLOWS_OURS < pdl.KERNELS
    assert pdl.PREFETCHES <= pdl.FOLLOWS_OURS  # a prefetch pays only in a grid launched early


def test_no_pdl_off_cuda_even_where_supported(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pdl, "supported", lambda index: True)
    assert pdl.launch_options(torch.empty(4), "splitk", 1) == {}


def test_unknown_kernel_names_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown kernel name"):
        pdl.launch_options(torch.empty(4), "split_k", 1)


def test_every_launch_site_names_a_known_kernel() -> None:
    """The names passed at the launch sites (kernels/ops.py, attention/, linear/splitk.py, linear/triton_gemms.py) are all in KERNELS."""
    import re
    from pathlib import Path

    root = Path(pdl.__file__).parents[1]
    names: set[str] = set()
    for f in ("kernels/ops.py", "attention/backends.py", "linear/splitk.py", "linear/triton_gemms.py"):
        text = (root / f).read_text()
        names |= set(re.findall(r'launch_options\([^,]+, "(\w+)"', text))
        for a, b in re.findall(r'launch_options\([^,]+, "(\w+)" if [^"]+ else "(\w+)"', text):  # name by a condition
            names |= {a, b}
    assert {"small_gemm", "small_gated", "splitk"} <= names  # the conditional site is read too
    assert names and names <= pdl.KERNELS, names - pdl.KERNELS


@pytest.mark.parametrize("cuda,driver,capability,hip,gdc", [((12, 2), (13, 0), (9, 0), False, True),
                                                          ((13, 0), (12, 2), (9, 0), False, True),
                                                          ((13, 0), (13, 0), (8, 0), False, True),
                                                          ((13, 0), (13, 0), (10, 0), False, True),
                                                          ((13, 0), (13, 0), (9, 0), True, True),
                                                          ((13, 0), (13, 0), (9, 0), False, False)])
def test_pdl_needs_cuda_12_3_in_build_and_driver_a_hopper_gpu_and_triton_gdc(
        cuda: tuple[int, int], driver: tuple[int, int], capability: tuple[int, int], hip: bool, gdc: bool) -> None:
    from dataclasses import replace

    from bouquet.engine.plan import DeviceProfile

    h200 = DeviceProfile.h200()
    assert h200.pdl and replace(h200, driver=None).pdl  # an unknown driver: the build's version decides
    assert not replace(h200, cuda=cuda, driver=driver, capability=capability, hip=hip, gdc=gdc).pdl
