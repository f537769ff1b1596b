"""Which linear method each projection runs: chosen once at load from the kernel plan
(``assign_methods``), for the GPU (linear/base.py's Triton and cuBLAS methods) and the CPU
(linear/cpu.py)."""
from __future__ import annotations

import torch
from torch import nn

from bouquet.engine.linear import triton_gemms as fused_gemms
from bouquet.engine.linear.base import (CublasLinear, GatedTritonLinear, Linear, LinearMethod, SmallTritonLinear,
                                        SplitKLinear, linears)
from bouquet.engine.linear.cpu import OneDnnMethod
from bouquet.engine.plan import KernelPlan


def method_for(layer: Linear, plan: KernelPlan) -> LinearMethod:
    """The model-dtype method of ``layer`` under ``plan``: on the CPU oneDNN with prepacked weights
    (fp32 / bf16); on a GPU split-K for projections read only by an
    add + norm kernel, the gated Triton GEMMs for gate/up projections, the small-step Triton GEMM
    for qkv and BERT's intermediate; cuBLAS for the rest and wherever the plan has them off."""
    if plan.onednn and layer.weight.dtype in (torch.float32, torch.bfloat16):
        # oneDNN's fp16 linear needs AVX-NE-CONVERT / AVX512-FP16: fp16 keeps PyTorch's GEMM
        return OneDnnMethod()
    if layer.readers == "norm" and plan.split_k:
        return SplitKLinear()
    if layer.gated in fused_gemms.ACTS and layer.bias is None and (plan.small_gemms or plan.gate_up_act):
        return GatedTritonLinear(plan.small_gemms, plan.gate_up_act)
    if plan.small_gemms and (layer.kind == "qkv" or (layer.kind == "up" and layer.act is not None)):
        return SmallTritonLinear()
    return CublasLinear()


def assign_methods(model: nn.Module, plan: KernelPlan) -> None:
    """Give every Linear of ``model`` (after ``fuse``) its model-dtype method; once, at load."""
    for layer in linears(model):
        layer.method = method_for(layer, plan)
        layer.method.process_weights_after_loading(layer)
