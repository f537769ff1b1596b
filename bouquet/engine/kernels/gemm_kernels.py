"""Triton GEMMs with fused epilogues (linear/triton_gemms.py says where and why each runs): the gated MLP's
gate/up with the activation for large steps (Hopper TMA tensor descriptors, ``triton.tools.
tensor_descriptor``, for the operands and the output; rows past a tensor's end are zero-filled on
load and clipped on store), and the small steps' GEMMs with bias / activation epilogues (pointer loads).
"""
import triton
import triton.language as tl

from bouquet.engine.kernels.triton_kernels import _act, _pdl_enter, _prefetch_rows


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


@triton.jit(do_not_specialize=["M"])  # M: the step's tokens; one compiled kernel per model shape
def small_gemm_kernel(x_ptr, w_ptr, b_ptr, out_ptr, M, N, K: tl.constexpr, x_stride, HAS_BIAS: tl.constexpr,
                      ACT: tl.constexpr, GATED: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                      PDL: tl.constexpr = False, PREFETCH: tl.constexpr = False):
    # Program (n, m): the [BM, BN] tile of epilogue(x · wᵀ), the whole K range, pointer loads (at
    # ≤ 128 tokens the weight tiles stream once; many narrow programs keep every SM reading).
    # Epilogue: + bias, rounded as the GEMM writes it, then act() rounded as HF rounds it; GATED:
    # w = [gate rows; up rows] [2N, K], a second accumulator for the up tile of the same columns,
    # out = act(gate) · up (gated_act_kernel's rounding). PREFETCH: the first row tile's programs
    # ask L2 for their weight rows before the PDL wait (pdl.PREFETCHES).
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    if PREFETCH:
        if pid_m == 0:
            _prefetch_rows(w_ptr + pid_n * BN * K, K, BN, K * w_ptr.dtype.element_ty.primitive_bitwidth // 8)
            if GATED:
                _prefetch_rows(w_ptr + (N + pid_n * BN) * K, K, BN, K * w_ptr.dtype.element_ty.primitive_bitwidth // 8)
    _pdl_enter(PDL)
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    a_ptrs = x_ptr + rm[:, None].to(tl.int64) * x_stride + rk[None, :]
    g_ptrs = w_ptr + rn[None, :].to(tl.int64) * K + rk[:, None]
    u_ptrs = g_ptrs + N * K
    in_m = rm[:, None] < M
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    acc_u = tl.zeros((BM, BN), dtype=tl.float32)
    for _ in range(K // BK):
        a = tl.load(a_ptrs, mask=in_m, other=0.0)
        acc = tl.dot(a, tl.load(g_ptrs), acc)
        if GATED:
            acc_u = tl.dot(a, tl.load(u_ptrs), acc_u)
            u_ptrs += BK
        a_ptrs += BK
        g_ptrs += BK
    dt = out_ptr.dtype.element_ty
    if HAS_BIAS:
        acc += tl.load(b_ptr + rn).to(tl.float32)[None, :]
    y = acc.to(dt)
    if GATED:
        g = _act(y.to(tl.float32), ACT).to(dt).to(tl.float32)
        y = (g * acc_u.to(dt).to(tl.float32)).to(dt)
    elif ACT != 0:
        y = _act(y.to(tl.float32), ACT).to(dt)
    tl.store(out_ptr + rm[:, None].to(tl.int64) * N + rn[None, :], y, mask=in_m)
