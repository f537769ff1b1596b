"""The kernel plan (engine/plan.py) on the CPU: the one "measured Hopper" rule, what the plan turns
on for an H200 and elsewhere, and the dispatch table of docs/engine.md rendered from the plan with
the H200 profile (so the document cannot drift from the code)."""
from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import pytest

from bouquet.bench.models import SHAPES
from bouquet.engine.dispatch import render
from bouquet.engine.plan import DeviceProfile, KernelPlan

DOC = Path(__file__).resolve().parents[2] / "docs" / "engine.md"
# the families of docs/engine.md, by the shapes the benchmarks use
FAMILIES = {"Qwen3 (Qwen3-0.6B shape)": "qwen3-0.6b", "BERT (all-MiniLM-L6-v2 shape)": "minilm",
            "BERT (bge-base shape)": "bge-base", "ModernBERT (ModernBERT-base shape)": "modernbert-base"}
CPU_FAMILIES = {"Qwen3 (Qwen3-0.6B shape) on the CPU": "qwen3-0.6b"}


def _block(name: str) -> str:
    text = DOC.read_text()
    m = re.search(rf"<!-- {name}: begin.*?-->\n(.*?)\n<!-- {name}: end -->", text, re.S)
    assert m, f"docs/engine.md has no {name} block"
    return m.group(1).strip()


@pytest.mark.parametrize("name,profile,families", [("h200", DeviceProfile.h200(), FAMILIES),
                                                    ("cpu", DeviceProfile.cpu(), CPU_FAMILIES)])
def test_docs_dispatch_table_is_the_plan(name: str, profile: DeviceProfile, families: dict[str, str]) -> None:
    want = render({title: SHAPES[shape].config for title, shape in families.items()}, profile)
    assert _block(name) == want, f"docs/engine.md is stale; its {name} block should read:\n{want}"


def test_only_a_measured_hopper_gets_the_triton_gemms() -> None:
    h200 = DeviceProfile.h200()
    on = KernelPlan.for_profile(h200)
    assert h200.measured_hopper and h200.pdl and on.split_k and on.gate_up_act and on.small_gemms
    assert KernelPlan.for_profile(h200, triton_gemms=False) == KernelPlan(h200, False, False, False)
    for other in (replace(h200, capability=(8, 9)), replace(h200, capability=(10, 0)), replace(h200, hip=True)):
        assert not other.measured_hopper
        assert KernelPlan.for_profile(other) == KernelPlan(other, False, False, False)
    cpu = DeviceProfile.cpu()  # no Triton GEMMs; oneDNN linears with prepacked weights
    assert not cpu.measured_hopper and KernelPlan.for_profile(cpu) == KernelPlan(cpu, False, False, False, True)
    no_pdl = replace(h200, gdc=False)  # a Triton without griddepcontrol: the small GEMMs no longer pay
    assert KernelPlan.for_profile(no_pdl) == KernelPlan(no_pdl, True, True, False)


def test_fp8_needs_tensor_cores_on_cuda_only() -> None:
    assert DeviceProfile.h200().fp8_tensor_cores and DeviceProfile.cpu().fp8_tensor_cores
    assert replace(DeviceProfile.h200(), capability=(8, 9)).fp8_tensor_cores
    assert not replace(DeviceProfile.h200(), capability=(8, 0)).fp8_tensor_cores
