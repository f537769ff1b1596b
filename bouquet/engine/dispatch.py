"""The dispatch table: which GEMM kernel each projection of a model runs, per step size (tokens in
one engine step), in the model dtype and with ``--quantization fp8``, under a kernel plan.

Rendered from the same objects the engine uses (the model class built on the meta device and
fused, ``linear.select.assign_methods`` under ``plan.KernelPlan``, each method's ``describe``), so the
table in docs/engine.md is checked against the code (tests/unit/test_kernel_plan.py) and a plan
can be printed for any ``DeviceProfile``.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from bouquet.engine.attention.backends import SdpaGroupedBackend
from bouquet.engine.linear.base import Linear
from bouquet.engine.linear.select import assign_methods
from bouquet.engine.plan import FP8_MIN_TOKENS, DeviceProfile, KernelPlan
from bouquet.engine.linear.fp8 import Fp8Linear
from bouquet.engine.models.registry import model_class

STEPS = (1, 128, 2048, 16384)  # tokens per step: batch 1 short and long, a mid batch, a full GPU step


def first_layer(cfg: dict[str, Any], plan: KernelPlan, dtype: torch.dtype = torch.bfloat16
                ) -> tuple[nn.Module, list[Linear]]:
    """The first layer of the model ``cfg`` (config.json as a dict) describes, built on the meta
    device, fused, its Linears given their methods under ``plan``: (the layer, its Linears)."""
    with torch.device("meta"):
        model = model_class(cfg["architectures"][0], "embed")(cfg, SdpaGroupedBackend())
    model = model.to(dtype=dtype)
    model.fuse()
    assign_methods(model, plan)
    layer = next(m for m in model.modules() if callable(getattr(m, "linears", None)))
    return layer, list(layer.linears())


def kernel(layer: nn.Module, lin: Linear, tokens: int, fp8: bool, profile: DeviceProfile) -> str:
    """The kernel ``lin`` runs for a step of ``tokens`` tokens (fp8: with ``--quantization fp8``,
    where the layer class runs it in fp8 by default, its ``FP8_KINDS``)."""
    if fp8 and lin.kind in layer.FP8_KINDS and tokens >= FP8_MIN_TOKENS:
        return Fp8Linear().describe(lin, tokens, profile)
    return lin.method.describe(lin, tokens, profile)


def _name(lin: Linear) -> str:
    n, k = lin.shape
    what = {"qkv": "qkv", "o": "attention out", "up": "gate/up + act" if lin.gated else "up + act", "down": "down"}
    return f"{what[lin.kind]} [{lin.weight.shape[0]} × {k}]"


def table(cfg: dict[str, Any], profile: DeviceProfile, fp8: bool, steps: tuple[int, ...] = STEPS) -> str:
    """A markdown table: one row per projection of a layer, one column per step size (the model
    dtype: bf16 on CUDA, fp32 on the CPU, the engine's defaults)."""
    plan = KernelPlan.for_profile(profile)
    layer, lins = first_layer(cfg, plan, torch.bfloat16 if profile.kind == "cuda" else torch.float32)
    head = "| projection [N × K] | " + " | ".join(f"{t:,} token{'s' * (t > 1)}" for t in steps) + " |"
    rows = [head, "|" + "---|" * (len(steps) + 1)]
    for lin in lins:
        rows.append(f"| {_name(lin)} | " + " | ".join(kernel(layer, lin, t, fp8, profile) for t in steps) + " |")
    return "\n".join(rows)


def render(families: dict[str, dict[str, Any]], profile: DeviceProfile) -> str:
    """The dispatch tables of docs/engine.md: for each family (title → config.json), in the model
    dtype and in fp8."""
    plan = KernelPlan.for_profile(profile)
    out = [f"Device profile: {profile.name} (capability {profile.capability[0]}.{profile.capability[1]}, "
           f"{profile.sms} SMs); split-K {'on' if plan.split_k else 'off'}, gate/up + act "
           f"{'on' if plan.gate_up_act else 'off'}, small-step Triton GEMMs {'on' if plan.small_gemms else 'off'}, "
           f"programmatic dependent launch {'on' if profile.pdl else 'off'}"
           + (", oneDNN linears with prepacked weights." if plan.onednn else ".")]
    for title, cfg in families.items():
        for fp8 in (False, True):
            dtype = "bf16" if profile.kind == "cuda" else "fp32"
            out += ["", f"#### {title}, {'fp8 (`--quantization fp8`)' if fp8 else dtype}", "", table(cfg, profile, fp8)]
    return "\n".join(out)
