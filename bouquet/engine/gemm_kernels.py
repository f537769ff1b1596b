"""Triton GEMMs with fused epilogues (fused_gemms.py says where and why each runs): the gated MLP's
gate/up with the activation. Hopper TMA tensor descriptors (``triton.tools.tensor_descriptor``) for
the operands and the output; rows past a tensor's end are zero-filled on load and clipped on store.
"""
import triton
import triton.language as tl

from bouquet.engine.kernels import _act


@triton.jit(do_not_specialize=["M"])  # M: the step's tokens; one compiled kernel per model shape
def gate_up_act_kernel(x_desc, w_desc, o_desc, M, I, K: tl.constexpr, ACT: tl.constexpr, BM: tl.constexpr,
                       BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr):
    # Program t: the [BM, BN] tile (pm, pn) of act(x·w_gᵀ) · (x·w_uᵀ), w = [gate rows; up rows] [2I, K]:
    # the gate and up tiles of the same columns share each x tile (two fp32 accumulators).
    # Grouped order: GROUP_M row tiles take each weight tile in turn while it is in L2.
    pid = tl.program_id(0)
    n_n = tl.cdiv(I, BN)
    per_group = GROUP_M * n_n
    first = (pid // per_group) * GROUP_M
    size = tl.minimum(tl.cdiv(M, BM) - first, GROUP_M)
    pm = first + (pid % per_group) % size
    pn = (pid % per_group) // size
    acc_g = tl.zeros((BM, BN), dtype=tl.float32)
    acc_u = tl.zeros((BM, BN), dtype=tl.float32)
    for k in range(0, K, BK):
        x = x_desc.load([pm * BM, k])
        # the last gate tile may read up rows for columns ≥ I: those columns are clipped on store
        acc_g = tl.dot(x, w_desc.load([pn * BN, k]).T, acc_g)
        acc_u = tl.dot(x, w_desc.load([I + pn * BN, k]).T, acc_u)
    dt = o_desc.dtype
    g = acc_g.to(dt).to(tl.float32)  # gate and up rounded as the GEMM writes them, the activation
    u = acc_u.to(dt).to(tl.float32)  # as HF rounds it (gated_act_kernel's rounding)
    a = _act(g, ACT).to(dt).to(tl.float32)
    o_desc.store([pm * BM, pn * BN], (a * u).to(dt))
