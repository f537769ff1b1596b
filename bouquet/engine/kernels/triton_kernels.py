"""The Triton kernels behind ops.py and linear/fp8.py (imported only when a kernel is first used, so
importing the engine never needs Triton). Each kernel's contract, precision rules and fallback
are documented at its Python entry point: ``ops.add_layer_norm``, ``ops.add_rms_norm``,
``ops.qk_norm_rope``, ``ops.silu_mul`` (and the other gated activations), ``quant.act_quant``.

One program per row (token) everywhere: a row is at most a few thousand values, held in
registers, so every statistic (mean, variance, amax) is a register reduction with no second pass.

``SCALED`` inputs (ops.ScaledRows): the element loaded is an fp8 GEMM's unit-scale output and
``_unscale`` turns it into the true value before anything else reads it. ``PARTS`` inputs of the
add + norm kernels (PartialRows): split-K sums that ``_load_gemm_out`` adds up first.
"""
import triton
import triton.language as tl

try:  # griddepcontrol (pdl.py): Triton 3.4+
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
    HAS_GDC = True
except ImportError:  # pragma: no cover - older Triton: pdl.supported() is False, PDL never set
    gdc_launch_dependents = gdc_wait = None
    HAS_GDC = False

next_pow2 = triton.next_power_of_2


@triton.jit
def _pdl_enter(PDL: tl.constexpr):
    # pdl.py's contract: wait for the previous grid (and so every earlier one) before touching
    # memory, then let the next grid's programs start at once (signalling after the last store
    # instead measured slower: 6603f18:bench/results/h200-2026-12-01g)
    if PDL:
        gdc_wait()
        gdc_launch_dependents()


@triton.jit
def _prefetch_rows(base, row_stride, ROWS: tl.constexpr, row_bytes):
    # pdl.PREFETCHES: ask L2 for ROWS rows of row_bytes bytes, row_stride elements apart, from
    # base (Hopper's bulk prefetch, PTX cp.async.bulk.prefetch.L2: 16-byte aligned, sizes a multiple
    # of 16), one row per thread of the first ROWS threads (the others hold replicas of the rows).
    # A hint: nothing waits for it, and it reads only weights, which no kernel writes.
    r = tl.arange(0, ROWS)
    addr = (base + r.to(tl.int64) * row_stride).to(tl.int64, bitcast=True)
    zero = tl.zeros([ROWS], dtype=tl.int32)
    tl.inline_asm_elementwise(
        "{ .reg .pred p; .reg .u32 t; mov.u32 t, %tid.x; setp.lt.u32 p, t, $2; "
        "@p cp.async.bulk.prefetch.L2.global [$1], $3; mov.u32 $0, 0; }",
        "=r,l,r,r", [addr, zero + ROWS, zero + row_bytes], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _unscale(x, rs_ptr, cs_ptr, b_ptr, row, cols, mask, HAS_BIAS: tl.constexpr):
    # raw [cols] fp32 · row scale · column scales (+ bias), before the caller's rounding
    y = x * tl.load(rs_ptr + row) * tl.load(cs_ptr + cols, mask=mask, other=0.0)
    if HAS_BIAS:
        y += tl.load(b_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    return y


@triton.jit
def _load_gemm_out(x_ptr, rs_ptr, cs_ptr, xb_ptr, out_ptr, row, n_cols, cols, mask, part_stride, SCALED: tl.constexpr,
                   XBIAS: tl.constexpr, PARTS: tl.constexpr):
    # one row of a GEMM's output as the model-dtype GEMM would have written it, in fp32: plain,
    # ScaledRows (SCALED) or PartialRows (PARTS > 1 fp32 K-range sums, part_stride apart)
    dt = out_ptr.dtype.element_ty
    x = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=0.0).to(tl.float32)
    if SCALED:
        x = _unscale(x, rs_ptr, cs_ptr, xb_ptr, row, cols, mask, XBIAS).to(dt).to(tl.float32)
    if PARTS > 1:
        for p in tl.static_range(1, PARTS):
            x += tl.load(x_ptr + p * part_stride + row * n_cols + cols, mask=mask, other=0.0)
        if XBIAS:
            x += tl.load(xb_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        x = x.to(dt).to(tl.float32)
    return x


@triton.jit
def _norm_row_in(x_ptr, rs_ptr, cs_ptr, xb_ptr, out_ptr, n_cols, part_stride, SCALED: tl.constexpr,
                 XBIAS: tl.constexpr, PARTS: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr):
    # the norm kernels' prologue: one program per row; (row, cols, mask, the GEMM output row in fp32)
    _pdl_enter(PDL)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = _load_gemm_out(x_ptr, rs_ptr, cs_ptr, xb_ptr, out_ptr, row, n_cols, cols, mask, part_stride, SCALED, XBIAS, PARTS)
    return row, cols, mask, x


@triton.jit
def _store_fp8(q_ptr, scale_ptr, row, n_cols, cols, mask, y):
    # per-row e4m3: scale = amax / 448 (masked columns hold 0 and never raise the max)
    scale = tl.maximum(tl.max(tl.abs(y), axis=0), 1e-12) / 448.0
    tl.store(scale_ptr + row, scale)
    tl.store(q_ptr + row * n_cols + cols, tl.clamp(y / scale, -448.0, 448.0).to(q_ptr.dtype.element_ty), mask=mask)

@triton.jit
def add_ln_kernel(x_ptr, r_ptr, w_ptr, b_ptr, out_ptr, sum_ptr, q_ptr, scale_ptr, rs_ptr, cs_ptr, xb_ptr, n_cols, eps,
                  part_stride, HAS_BIAS: tl.constexpr, KEEP_SUM: tl.constexpr, QUANT: tl.constexpr,
                  SCALED: tl.constexpr, XBIAS: tl.constexpr, PARTS: tl.constexpr, BLOCK: tl.constexpr,
                  PDL: tl.constexpr = False):
    row, cols, mask, x = _norm_row_in(x_ptr, rs_ptr, cs_ptr, xb_ptr, out_ptr, n_cols, part_stride, SCALED, XBIAS, PARTS,
                                      BLOCK, PDL)
    dt = out_ptr.dtype.element_ty
    x += tl.load(r_ptr + row * n_cols + cols, mask=mask, other=0.0).to(tl.float32)
    if KEEP_SUM:  # pre-norm: the rounded sum is the residual stream, and HF normalizes it
        s = x.to(dt)
        tl.store(sum_ptr + row * n_cols + cols, s, mask=mask)
        x = s.to(tl.float32)
    mean = tl.sum(x, axis=0) / n_cols
    d = tl.where(mask, x - mean, 0.0)
    var = tl.sum(d * d, axis=0) / n_cols
    y = d * tl.rsqrt(var + eps) * tl.load(w_ptr + cols, mask=mask, other=1.0).to(tl.float32)
    if HAS_BIAS:
        y += tl.load(b_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * n_cols + cols, y.to(dt), mask=mask)
    if QUANT:  # also the fp8 rows of the rounded output (quant.quantize_reference's rule)
        _store_fp8(q_ptr, scale_ptr, row, n_cols, cols, mask, y.to(dt).to(tl.float32))

@triton.jit
def add_rms_kernel(x_ptr, r_ptr, w_ptr, out_ptr, sum_ptr, q_ptr, scale_ptr, rs_ptr, cs_ptr, xb_ptr, n_cols, eps,
                   part_stride, HAS_RES: tl.constexpr, UNIT_OFFSET: tl.constexpr, QUANT: tl.constexpr,
                   SCALED: tl.constexpr, XBIAS: tl.constexpr, PARTS: tl.constexpr, BLOCK: tl.constexpr,
                   PDL: tl.constexpr = False):
    row, cols, mask, x = _norm_row_in(x_ptr, rs_ptr, cs_ptr, xb_ptr, out_ptr, n_cols, part_stride, SCALED, XBIAS, PARTS,
                                      BLOCK, PDL)
    dt = out_ptr.dtype.element_ty
    if HAS_RES:
        x += tl.load(r_ptr + row * n_cols + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_RES or SCALED or PARTS > 1:  # the rounded sum (or true input) is the residual stream, HF normalizes it
        s = x.to(dt)
        tl.store(sum_ptr + row * n_cols + cols, s, mask=mask)
        x = s.to(tl.float32)
    rstd = tl.rsqrt(tl.sum(x * x, axis=0) / n_cols + eps)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    if UNIT_OFFSET:  # Gemma: x · (1 + w) in fp32, rounded once
        y = x * rstd * (1.0 + w)
    else:  # Llama/Qwen: the normed row is rounded before the weight multiply
        y = (x * rstd).to(dt).to(tl.float32) * w
    if QUANT:  # only the fp8 rows: the next GEMM is their one reader
        _store_fp8(q_ptr, scale_ptr, row, n_cols, cols, mask, y.to(dt).to(tl.float32))
    else:
        tl.store(out_ptr + row * n_cols + cols, y.to(dt), mask=mask)

@triton.jit
def qk_norm_rope_kernel(qkv_ptr, w_ptr, cos_ptr, sin_ptr, row_stride, n_q_heads, n_heads, eps,
                        HALF: tl.constexpr, HEADS: tl.constexpr, NORM: tl.constexpr, UNIT_OFFSET: tl.constexpr,
                        PDL: tl.constexpr = False):
    # One program per token, all its q and k heads as a [HEADS, HALF] tile per half.
    _pdl_enter(PDL)
    t = tl.program_id(0).to(tl.int64)
    heads = tl.arange(0, HEADS)[:, None]
    cols = tl.arange(0, HALF)[None, :]
    mask = (heads < n_heads) & (cols < HALF)
    dt = qkv_ptr.dtype.element_ty
    ptr = qkv_ptr + t * row_stride + heads * (2 * HALF) + cols
    x1 = tl.load(ptr, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(ptr + HALF, mask=mask, other=0.0).to(tl.float32)
    if NORM:
        rstd = tl.rsqrt((tl.sum(x1 * x1, axis=1) + tl.sum(x2 * x2, axis=1)) / (2 * HALF) + eps)[:, None]
        w = w_ptr + (heads >= n_q_heads).to(tl.int32) * (2 * HALF) + cols  # row 0: q_norm, row 1: k_norm
        w1, w2 = tl.load(w).to(tl.float32), tl.load(w + HALF).to(tl.float32)
        if UNIT_OFFSET:  # Gemma's (1 + w), in fp32 before the one rounding
            y1 = (x1 * rstd * (1.0 + w1)).to(dt).to(tl.float32)
            y2 = (x2 * rstd * (1.0 + w2)).to(dt).to(tl.float32)
        else:
            y1 = ((x1 * rstd).to(dt).to(tl.float32) * w1).to(dt).to(tl.float32)
            y2 = ((x2 * rstd).to(dt).to(tl.float32) * w2).to(dt).to(tl.float32)
    else:  # Qwen2, Mistral: rotary only
        y1, y2 = x1, x2
    c = tl.load(cos_ptr + t * HALF + cols)
    s = tl.load(sin_ptr + t * HALF + cols)
    tl.store(ptr, (y1 * c - y2 * s).to(dt), mask=mask)  # in place: this program read its token already
    tl.store(ptr + HALF, (y2 * c + y1 * s).to(dt), mask=mask)

@triton.jit
def _act(g, ACT: tl.constexpr):
    # ACT: 0 identity, 1 SiLU, 2 tanh-GELU, 3 erf-GELU, 4 ReLU; fp32 in, fp32 out
    if ACT == 1:
        a = g / (1.0 + tl.exp(-g))
    elif ACT == 2:  # 0.5·g·(1 + tanh(√(2/π)·(g + 0.044715·g³))); tanh(z) = 1 − 2/(1 + e^{2z})
        z = 0.7978845608028654 * (g + 0.044715 * g * g * g)
        a = 0.5 * g * (2.0 - 2.0 / (1.0 + tl.exp(2.0 * z)))
    elif ACT == 3:  # exact GELU: 0.5·g·(1 + erf(g/√2))
        a = 0.5 * g * (1.0 + tl.math.erf(g * 0.7071067811865476))
    elif ACT == 4:
        a = tl.maximum(g, 0.0)
    else:
        a = g
    return a


@triton.jit
def gated_act_kernel(gu_ptr, out_ptr, rs_ptr, cs_ptr, xb_ptr, n_cols, ACT: tl.constexpr, SCALED: tl.constexpr,
                     XBIAS: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr = False):
    _pdl_enter(PDL)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n_cols
    dt = out_ptr.dtype.element_ty
    g = tl.load(gu_ptr + row * 2 * n_cols + cols, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(gu_ptr + row * 2 * n_cols + n_cols + cols, mask=mask, other=0.0).to(tl.float32)
    if SCALED:  # gate and up as the GEMM would have written them
        g = _unscale(g, rs_ptr, cs_ptr, xb_ptr, row, cols, mask, XBIAS).to(dt).to(tl.float32)
        u = _unscale(u, rs_ptr, cs_ptr + n_cols, xb_ptr + n_cols, row, cols, mask, XBIAS).to(dt).to(tl.float32)
    a = _act(g, ACT).to(dt).to(tl.float32)  # HF rounds the activation first
    tl.store(out_ptr + row * n_cols + cols, (a * u).to(dt), mask=mask)


@triton.jit
def _fast_act(g, ACT: tl.constexpr):
    # act_quant's activations: each result is rounded to the model dtype and then to e4m3 (1/16
    # relative steps), so approximate division (2 fp32 ulps) and a 1.5e-7 erf cannot move it but
    # where a value sits on a rounding boundary; the kernel is instruction-bound, not memory-bound,
    # with libdevice's erf and IEEE division (6603f18:bench/results/h200-2026-12-01c)
    if ACT == 1:
        a = tl.math.fdiv(g, 1.0 + tl.exp(-g))
    elif ACT == 2:
        z = 0.7978845608028654 * (g + 0.044715 * g * g * g)
        a = 0.5 * g * (2.0 - tl.math.fdiv(2.0, 1.0 + tl.exp(2.0 * z)))
    elif ACT == 3:  # erf by Abramowitz & Stegun 7.1.26 (|error| <= 1.5e-7): one exp, one division
        x = tl.abs(g) * 0.7071067811865476
        t = tl.math.fdiv(1.0, 1.0 + 0.3275911 * x)
        p = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
        e = 1.0 - p * tl.exp(-x * x)  # erf(|g|/√2)
        a = 0.5 * g * (1.0 + tl.where(g < 0, -e, e))
    else:
        a = _act(g, ACT)
    return a


@triton.jit
def _act_part(x_ptr, rs_ptr, cs_ptr, xb_ptr, row, n_cols, x_stride, start, ACT: tl.constexpr, GATED: tl.constexpr,
              SCALED: tl.constexpr, XBIAS: tl.constexpr, BLOCK: tl.constexpr):
    # columns [start, start + BLOCK) of one row: act(x) (or act(gate) · up) in fp32, model-dtype rounded
    cols = start + tl.arange(0, BLOCK)
    mask = cols < n_cols
    dt = x_ptr.dtype.element_ty
    g = tl.load(x_ptr + row * x_stride + cols, mask=mask, other=0.0).to(tl.float32)
    if SCALED:
        g = _unscale(g, rs_ptr, cs_ptr, xb_ptr, row, cols, mask, XBIAS).to(dt).to(tl.float32)
    a = _fast_act(g, ACT).to(dt).to(tl.float32)
    if GATED:
        u = tl.load(x_ptr + row * x_stride + n_cols + cols, mask=mask, other=0.0).to(tl.float32)
        if SCALED:  # the up half's column scales and bias follow the gate half's
            u = _unscale(u, rs_ptr, cs_ptr + n_cols, xb_ptr + n_cols, row, cols, mask, XBIAS).to(dt).to(tl.float32)
        a = (a * u).to(dt).to(tl.float32)
    return a, cols, mask


@triton.jit
def act_quant_kernel(x_ptr, q_ptr, scale_ptr, rs_ptr, cs_ptr, xb_ptr, n_cols, x_stride, ACT: tl.constexpr,
                     GATED: tl.constexpr, SCALED: tl.constexpr, XBIAS: tl.constexpr, BLOCK: tl.constexpr,
                     BLOCK1: tl.constexpr, BLOCK2: tl.constexpr, PDL: tl.constexpr = False):
    # One program per whole row (the scale needs its amax). GATED: the row holds [gate | up]
    # (2·n_cols) and the output is act(gate) · up, rounded as gated_act_kernel rounds it.
    # The row is up to three power-of-two parts (BLOCK, BLOCK1, BLOCK2; 0 = none): 3,072 columns
    # as 2,048 + 1,024 instead of one 4,096 tile whose masked quarter still costs instructions.
    _pdl_enter(PDL)
    row = tl.program_id(0).to(tl.int64)
    a0, c0, m0 = _act_part(x_ptr, rs_ptr, cs_ptr, xb_ptr, row, n_cols, x_stride, 0, ACT, GATED, SCALED, XBIAS, BLOCK)
    amax = tl.max(tl.abs(a0), axis=0)
    if BLOCK1 > 0:
        a1, c1, m1 = _act_part(x_ptr, rs_ptr, cs_ptr, xb_ptr, row, n_cols, x_stride, BLOCK, ACT, GATED, SCALED, XBIAS,
                               BLOCK1)
        amax = tl.maximum(amax, tl.max(tl.abs(a1), axis=0))
    if BLOCK2 > 0:
        a2, c2, m2 = _act_part(x_ptr, rs_ptr, cs_ptr, xb_ptr, row, n_cols, x_stride, BLOCK + BLOCK1, ACT, GATED, SCALED,
                               XBIAS, BLOCK2)
        amax = tl.maximum(amax, tl.max(tl.abs(a2), axis=0))
    scale = tl.maximum(amax, 1e-12) / 448.0  # per-row e4m3, as _store_fp8
    tl.store(scale_ptr + row, scale)
    inv = 1.0 / scale  # one division per row; a multiply per element
    et = q_ptr.dtype.element_ty
    tl.store(q_ptr + row * n_cols + c0, tl.clamp(a0 * inv, -448.0, 448.0).to(et), mask=m0)
    if BLOCK1 > 0:
        tl.store(q_ptr + row * n_cols + c1, tl.clamp(a1 * inv, -448.0, 448.0).to(et), mask=m1)
    if BLOCK2 > 0:
        tl.store(q_ptr + row * n_cols + c2, tl.clamp(a2 * inv, -448.0, 448.0).to(et), mask=m2)


@triton.jit
def _attn_block(q, k_ptrs, v_ptrs, start_n, m_i, l_i, acc, offs_m, offs_n, n, qk_scale,
                MASKED: tl.constexpr, CAUSAL: tl.constexpr):
    # One key block of online softmax (log2 domain): k_ptrs [D, BN], v_ptrs [BN, D] at key 0.
    keys = start_n + offs_n
    if MASKED:
        valid = keys < n
        k = tl.load(k_ptrs, mask=valid[None, :], other=0.0)
        v = tl.load(v_ptrs, mask=valid[:, None], other=0.0)
    else:
        k = tl.load(k_ptrs)
        v = tl.load(v_ptrs)
    s = tl.dot(q, k) * qk_scale  # [BM, BN] fp32
    if MASKED:
        keep = valid[None, :]
        if CAUSAL:
            keep = keep & (offs_m[:, None] >= keys[None, :])
        s = tl.where(keep, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    p = tl.math.exp2(s - m_new[:, None])
    alpha = tl.math.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, axis=1)
    acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
    return m_new, l_i, acc


@triton.jit
def varlen_attn_kernel(q_ptr, k_ptr, v_ptr, o_ptr, cu_ptr, qk_scale,
                       sq_t, sq_h, sk_t, sk_h, sv_t, sv_h, so_t, so_h,
                       GROUP: tl.constexpr, PACK: tl.constexpr, CAUSAL: tl.constexpr, D: tl.constexpr,
                       BM: tl.constexpr, BN: tl.constexpr, PDL: tl.constexpr = False):
    # Program (m, b, g): BM query rows of sequence b against its keys [cu[b], cu[b+1]). PACK query
    # heads share the program (1, or all GROUP heads of one kv head, so K/V tiles are loaded once
    # for them): row r is token m·(BM/PACK) + r // PACK of head g·PACK + r % PACK, and the kv head
    # is that head // GROUP. Key blocks wholly visible to every row of the block run without
    # masks; only the last (and, causal, the diagonal) blocks are masked.
    _pdl_enter(PDL)
    TOKS: tl.constexpr = BM // PACK
    pid_m = tl.program_id(0)
    seq = tl.program_id(1)
    g = tl.program_id(2)
    start = tl.load(cu_ptr + seq).to(tl.int64)
    n = tl.load(cu_ptr + seq + 1) - tl.load(cu_ptr + seq)
    m0 = pid_m * TOKS
    if m0 >= n:
        return
    rows = tl.arange(0, BM)
    tok = m0 + rows // PACK  # [BM] token of each row
    head = g * PACK + rows % PACK  # [BM] query head of each row
    offs_n = tl.arange(0, BN)
    offs_d = tl.arange(0, D)
    kh = (g * PACK) // GROUP
    q = tl.load(q_ptr + (start + tok[:, None]) * sq_t + head[:, None] * sq_h + offs_d[None, :], mask=tok[:, None] < n,
                other=0.0)
    k_ptrs = k_ptr + (start + offs_n[None, :]) * sk_t + kh * sk_h + offs_d[:, None]
    v_ptrs = v_ptr + (start + offs_n[:, None]) * sv_t + kh * sv_h + offs_d[None, :]
    m_i = tl.full((BM,), float("-inf"), dtype=tl.float32)
    l_i = tl.zeros((BM,), dtype=tl.float32)
    acc = tl.zeros((BM, D), dtype=tl.float32)
    if CAUSAL:
        hi = tl.minimum(m0 + TOKS, n)
        full = (tl.minimum(m0 + 1, n) // BN) * BN
    else:
        hi = n
        full = (n // BN) * BN
    for start_n in range(0, full, BN):
        m_i, l_i, acc = _attn_block(q, k_ptrs + start_n * sk_t, v_ptrs + start_n * sv_t, start_n, m_i, l_i, acc,
                                    tok, offs_n, n, qk_scale, False, CAUSAL)
    for start_n in range(full, hi, BN):
        m_i, l_i, acc = _attn_block(q, k_ptrs + start_n * sk_t, v_ptrs + start_n * sv_t, start_n, m_i, l_i, acc,
                                    tok, offs_n, n, qk_scale, True, CAUSAL)
    out = acc / l_i[:, None]
    tl.store(o_ptr + (start + tok[:, None]) * so_t + head[:, None] * so_h + offs_d[None, :],
             out.to(o_ptr.dtype.element_ty), mask=tok[:, None] < n)


@triton.jit(do_not_specialize=["M"])  # M: the step's tokens; one compiled kernel for every M
def splitk_gemm_kernel(x_ptr, w_ptr, out_ptr, M, N, K, x_stride, K_SPLIT: tl.constexpr, BM: tl.constexpr,
                       BN: tl.constexpr, BK: tl.constexpr, PDL: tl.constexpr = False,
                       PREFETCH: tl.constexpr = False):
    # Program (n, m, s): out[s, m-tile, n-tile] = x[m-tile, K range s] · w[n-tile, K range s]ᵀ in fp32,
    # K range s = [s·K_SPLIT, (s + 1)·K_SPLIT). At batch 1 an N = hidden projection has few output
    # tiles; splitting K gives every SM weights to stream. The reader sums the parts (splitk.py).
    # PREFETCH: the first row tile's programs ask L2 for their weight slab before the PDL wait.
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    pid_s = tl.program_id(2)
    if PREFETCH:
        if pid_m == 0:
            _prefetch_rows(w_ptr + (pid_n * BN).to(tl.int64) * K + pid_s * K_SPLIT, K, BN,
                           K_SPLIT * w_ptr.dtype.element_ty.primitive_bitwidth // 8)
    _pdl_enter(PDL)
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    rk = pid_s * K_SPLIT + tl.arange(0, BK)
    a_ptrs = x_ptr + rm[:, None].to(tl.int64) * x_stride + rk[None, :]
    b_ptrs = w_ptr + rn[None, :].to(tl.int64) * K + rk[:, None]  # [BK, BN] tile of wᵀ, contiguous along K
    in_m = rm[:, None] < M
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for _ in range(K_SPLIT // BK):
        a = tl.load(a_ptrs, mask=in_m, other=0.0)
        acc = tl.dot(a, tl.load(b_ptrs), acc)
        a_ptrs += BK
        b_ptrs += BK
    tl.store(out_ptr + pid_s.to(tl.int64) * M * N + rm[:, None].to(tl.int64) * N + rn[None, :], acc, mask=in_m)
