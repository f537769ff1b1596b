"""The Triton attention kernels behind attention.py and attn_o.py (imported only when first used, so
importing the engine never needs Triton): ``varlen_attn_kernel``, attention over packed sequences,
and ``attn_o_kernel``, the same attention with the output projection (o_proj) in its epilogue, for
small steps. Both compute the rows of one block of queries with ``_attend_rows``: scores in fp32,
online softmax in the log2 domain (FlashAttention-2's algorithm, Dao 2023).
"""
import triton
import triton.language as tl

from bouquet.engine.kernels import _pdl_enter, _prefetch_rows


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
def _attend_rows(q_ptr, k_ptr, v_ptr, start, n, m0, tok, head, kh, qk_scale, sq_t, sq_h, sk_t, sk_h, sv_t, sv_h,
                 CAUSAL: tl.constexpr, D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, TOKS: tl.constexpr):
    # [BM, D] fp32 attention output of the rows (tok, head) [BM] of the sequence of n tokens at row
    # start, whose query tokens lie in [m0, m0 + TOKS); kv head kh (a scalar). Key blocks wholly
    # visible to every row run without masks; only the last (and, causal, the diagonal) are masked.
    offs_n = tl.arange(0, BN)
    offs_d = tl.arange(0, D)
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
    return acc / l_i[:, None]


@triton.jit
def varlen_attn_kernel(q_ptr, k_ptr, v_ptr, o_ptr, cu_ptr, qk_scale,
                       sq_t, sq_h, sk_t, sk_h, sv_t, sv_h, so_t, so_h,
                       GROUP: tl.constexpr, PACK: tl.constexpr, CAUSAL: tl.constexpr, D: tl.constexpr,
                       BM: tl.constexpr, BN: tl.constexpr, PDL: tl.constexpr = False):
    # Program (m, b, g): BM query rows of sequence b against its keys [cu[b], cu[b+1]). PACK query
    # heads share the program (1, or all GROUP heads of one kv head, so K/V tiles are loaded once
    # for them): row r is token m·(BM/PACK) + r // PACK of head g·PACK + r % PACK, and the kv head
    # is that head // GROUP.
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
    out = _attend_rows(q_ptr, k_ptr, v_ptr, start, n, m0, tok, head, (g * PACK) // GROUP, qk_scale,
                       sq_t, sq_h, sk_t, sk_h, sv_t, sv_h, CAUSAL, D, BM, BN, TOKS)
    offs_d = tl.arange(0, D)
    tl.store(o_ptr + (start + tok[:, None]) * so_t + head[:, None] * so_h + offs_d[None, :],
             out.to(o_ptr.dtype.element_ty), mask=tok[:, None] < n)


@triton.jit(do_not_specialize=["M"])  # M: the step's rows; one compiled kernel for every bucket
def attn_o_kernel(q_ptr, k_ptr, v_ptr, w_ptr, out_ptr, cu_ptr, qk_scale, M, N, w_stride,
                  sq_t, sq_h, sk_t, sk_h, sv_t, sv_h,
                  GROUP: tl.constexpr, PACK: tl.constexpr, LOOPS: tl.constexpr, CAUSAL: tl.constexpr,
                  D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, NC: tl.constexpr,
                  PDL: tl.constexpr = False, PREFETCH: tl.constexpr = False):
    # Program (c + p·N/NC, m, b): query block m of sequence b for the heads [p·HPP, (p+1)·HPP),
    # HPP = PACK · LOOPS (LOOPS passes of PACK packed heads, rows as in varlen_attn_kernel), then
    # out[p, rows, c·NC : (c+1)·NC] = Σ over those heads of o_h · w[cols, h·D : (h+1)·D]ᵀ in fp32:
    # o_proj split-K by heads, one part per head group p, summed by the add + norm kernel that reads
    # them (splitk.py's contract). o_h is rounded to the model dtype first, as the attention kernel
    # writes it for the GEMM. Every (head group, column chunk) program recomputes its heads'
    # attention: at ≤ 128 tokens that is a few key blocks, in parallel, and saves the GEMM's launch.
    # PREFETCH: the first query block's programs ask L2 for their weight slab before the PDL wait.
    TOKS: tl.constexpr = BM // PACK
    HPP: tl.constexpr = PACK * LOOPS
    n_chunks = N // NC
    c = tl.program_id(0) % n_chunks
    p = tl.program_id(0) // n_chunks
    pid_m = tl.program_id(1)
    seq = tl.program_id(2)
    if PREFETCH:
        if (pid_m == 0) & (seq == 0):
            _prefetch_rows(w_ptr + (c * NC).to(tl.int64) * w_stride + p * HPP * D, w_stride, NC,
                           HPP * D * w_ptr.dtype.element_ty.primitive_bitwidth // 8)
    _pdl_enter(PDL)
    start = tl.load(cu_ptr + seq).to(tl.int64)
    n = tl.load(cu_ptr + seq + 1) - tl.load(cu_ptr + seq)
    m0 = pid_m * TOKS
    if m0 >= n:
        return
    dt = q_ptr.dtype.element_ty
    rows = tl.arange(0, BM)
    tok = m0 + rows // PACK
    cols = c * NC + tl.arange(0, NC)
    offs_d = tl.arange(0, D)
    acc = tl.zeros((BM, NC), dtype=tl.float32)
    for loop in tl.static_range(LOOPS):
        h0 = p * HPP + loop * PACK
        o = _attend_rows(q_ptr, k_ptr, v_ptr, start, n, m0, tok, h0 + rows % PACK, h0 // GROUP, qk_scale,
                         sq_t, sq_h, sk_t, sk_h, sv_t, sv_h, CAUSAL, D, BM, BN, TOKS).to(dt)
        for j in tl.static_range(PACK):
            # row r holds head h0 + r % PACK: its product takes that head's columns of w only
            a = o if PACK == 1 else tl.where((rows % PACK == j)[:, None], o, tl.zeros_like(o))
            w = tl.load(w_ptr + cols[None, :].to(tl.int64) * w_stride + (h0 + j) * D + offs_d[:, None])  # [D, NC]
            acc = tl.dot(a, w, acc)
    if PACK > 1:
        out = tl.sum(tl.reshape(acc, (TOKS, PACK, NC)), axis=1)  # rows t·PACK + j → token t
    else:
        out = acc
    t = m0 + tl.arange(0, TOKS)
    tl.store(out_ptr + p.to(tl.int64) * M * N + (start + t[:, None]) * N + cols[None, :], out, mask=t[:, None] < n)
