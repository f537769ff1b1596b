"""Triton GEMMs with fused epilogues (fused_gemms.py says where and why each runs): the gated MLP's
gate/up with the activation, and the attention's fused QKV with per-head q/k RMSNorm and rotary.
Both take Hopper TMA tensor descriptors (``triton.tools.tensor_descriptor``) for their operands and
output; rows past M and columns past N are zero-filled on load and clipped on store.
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
        acc_g = tl.dot(x, w_desc.load([pn * BN, k]).T, acc_g)
        acc_u = tl.dot(x, w_desc.load([I + pn * BN, k]).T, acc_u)
    dt = o_desc.dtype
    g = acc_g.to(dt).to(tl.float32)  # gate and up rounded as the GEMM writes them, the activation
    u = acc_u.to(dt).to(tl.float32)  # as HF rounds it (gated_act_kernel's rounding)
    a = _act(g, ACT).to(dt).to(tl.float32)
    o_desc.store([pm * BM, pn * BN], (a * u).to(dt))


@triton.jit(do_not_specialize=["M"])
def qkv_rope_kernel(x_desc, w_desc, o_desc, b_ptr, w_norm_ptr, cos_ptr, sin_ptr, M, n_q_heads, n_rot_heads, eps,
                    K: tl.constexpr, HALF: tl.constexpr, HAS_BIAS: tl.constexpr, NORM: tl.constexpr,
                    UNIT_OFFSET: tl.constexpr, BM: tl.constexpr, BK: tl.constexpr):
    # Program (m, h): rows [m·BM, m·BM + BM) of head h of x·wᵀ (+ bias), its two halves as two
    # accumulators; q and k heads (h < n_rot_heads) then get qk_norm_rope_kernel's per-head RMSNorm
    # and rotary, rounded where it rounds; v heads are stored as the GEMM wrote them.
    pm = tl.program_id(0)
    h = tl.program_id(1)
    lo = h * 2 * HALF
    acc1 = tl.zeros((BM, HALF), dtype=tl.float32)
    acc2 = tl.zeros((BM, HALF), dtype=tl.float32)
    for k in range(0, K, BK):
        x = x_desc.load([pm * BM, k])
        acc1 = tl.dot(x, w_desc.load([lo, k]).T, acc1)
        acc2 = tl.dot(x, w_desc.load([lo + HALF, k]).T, acc2)
    dt = o_desc.dtype
    cols = tl.arange(0, HALF)
    if HAS_BIAS:
        acc1 += tl.load(b_ptr + lo + cols).to(tl.float32)[None, :]
        acc2 += tl.load(b_ptr + lo + HALF + cols).to(tl.float32)[None, :]
    x1 = acc1.to(dt).to(tl.float32)  # the GEMM's output, as cuBLAS rounds it
    x2 = acc2.to(dt).to(tl.float32)
    if h < n_rot_heads:
        if NORM:
            rstd = tl.rsqrt((tl.sum(x1 * x1, axis=1) + tl.sum(x2 * x2, axis=1)) / (2 * HALF) + eps)[:, None]
            w = w_norm_ptr + (h >= n_q_heads).to(tl.int32) * (2 * HALF) + cols  # row 0: q_norm, row 1: k_norm
            w1, w2 = tl.load(w).to(tl.float32)[None, :], tl.load(w + HALF).to(tl.float32)[None, :]
            if UNIT_OFFSET:
                x1 = (x1 * rstd * (1.0 + w1)).to(dt).to(tl.float32)
                x2 = (x2 * rstd * (1.0 + w2)).to(dt).to(tl.float32)
            else:
                x1 = ((x1 * rstd).to(dt).to(tl.float32) * w1).to(dt).to(tl.float32)
                x2 = ((x2 * rstd).to(dt).to(tl.float32) * w2).to(dt).to(tl.float32)
        t = (pm * BM + tl.arange(0, BM)).to(tl.int64)
        in_m = t[:, None] < M
        c = tl.load(cos_ptr + t[:, None] * HALF + cols[None, :], mask=in_m, other=0.0)
        s = tl.load(sin_ptr + t[:, None] * HALF + cols[None, :], mask=in_m, other=0.0)
        x1, x2 = x1 * c - x2 * s, x2 * c + x1 * s
    o_desc.store([pm * BM, lo], x1.to(dt))
    o_desc.store([pm * BM, lo + HALF], x2.to(dt))
