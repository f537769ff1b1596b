// Probe (not engine code): the gated MLP's gate/up projection on Hopper (sm_90a) as two CUTLASS 3
// GEMMs whose epilogues do the activation and the product:
//   out = act(x · Wgᵀ)           x [T, K], Wg = weight[:I]   [I, K], out [T, I]  (act rounded to out's dtype)
//   out = (x · Wuᵀ) · out        Wu = weight[I:]              the second GEMM's epilogue reads out as C
// The second GEMM reads and writes `out` in place: each output tile's C tile is loaded before that
// tile's D is stored, by the same CTA, and no two tiles overlap.
// Two GEMMs because CUTLASS's sm90 mainloops have one B operand. The hope was that the extra T·I
// read and write would hide behind the next tile's mainloop (ping-pong schedule) so both GEMMs run
// at cuBLAS's rate. Measured on the H200 (bench/results/h200-2026-12-03, call 1), they do not: the
// pair takes 10-26% longer than the engine's Triton kernel (fused_gemms.gate_up_act) at 2k-102k
// tokens, while this file's plain GEMM matches cuBLAS. Kept as the record of that measurement.
// C ABI (no torch headers), loaded with ctypes by bench/probes/cutlass_gated_probe.py, whose
// docstring has the build command. Source followed: CUTLASS examples 48/49 (collective builder,
// epilogue visitor trees), CUTLASS 4.2.
#include <cuda_runtime.h>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/fusion/sm90_callbacks_tma_warpspecialized.hpp"
#include "cutlass/epilogue/thread/activation.h"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/util/packed_stride.hpp"

using namespace cute;
namespace fusion = cutlass::epilogue::fusion;

namespace {

constexpr auto kRound = cutlass::FloatRoundStyle::round_to_nearest;

struct Pingpong128x128 {  // two consumer warp groups, one 128 × 128 tile each, epilogue overlapped
  using Tile = Shape<_128, _128, _64>;
  using Cluster = Shape<_2, _1, _1>;
  using Kernel = cutlass::gemm::KernelTmaWarpSpecializedPingpong;
  using Epi = cutlass::epilogue::TmaWarpSpecialized;
};
template <int M, int N, int CM, int CN>
struct Cooperative {  // both consumer warp groups on one M × N tile
  using Tile = Shape<Int<M>, Int<N>, _64>;
  using Cluster = Shape<Int<CM>, Int<CN>, _1>;
  using Kernel = cutlass::gemm::KernelTmaWarpSpecializedCooperative;
  using Epi = cutlass::epilogue::TmaWarpSpecializedCooperative;
};

int g_swizzle = 1;   // the persistent scheduler's swizzle (1, 2, 4, 8); the sweep sets it
int g_raster = 0;    // 0 heuristic, 1 along M, 2 along N

// act(acc) → D; no C operand.
template <class T, template <class> class Act>
using ActEVT = fusion::Sm90EVT<fusion::Sm90Compute<Act, T, float, kRound>, fusion::Sm90AccFetch>;
// acc · C → D.
template <class T>
using MulEVT = fusion::Sm90EVT<fusion::Sm90Compute<cutlass::multiplies, T, float, kRound>,
                               fusion::Sm90AccFetch, fusion::Sm90SrcFetch<T>>;

template <class T, class ElementC, class EVT, class Cfg>
struct Gemm {
  static constexpr int kAlign = 16 / sizeof(T);
  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, typename Cfg::Tile, typename Cfg::Cluster,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float,
      ElementC, cutlass::layout::RowMajor, kAlign, T, cutlass::layout::RowMajor, kAlign,
      typename Cfg::Epi, EVT>::CollectiveOp;
  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp,
      T, cutlass::layout::RowMajor, kAlign, T, cutlass::layout::ColumnMajor, kAlign, float,
      typename Cfg::Tile, typename Cfg::Cluster,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename Epilogue::SharedStorage))>,
      typename Cfg::Kernel>::CollectiveOp;
  using Kernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, Mainloop, Epilogue>;
  using Op = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;

  // D [M, N] = epilogue(A [M, K] · B [N, K]ᵀ, C [M, N]); returns a cutlass::Status (0 = success).
  static int run(const void* a, const void* b, const void* c, void* d, int M, int N, int K, int sms,
                 void* workspace, size_t workspace_bytes, cudaStream_t stream) {
    using StrideA = typename Kernel::StrideA;
    using StrideB = typename Kernel::StrideB;
    using StrideC = typename Kernel::StrideC;
    using StrideD = typename Kernel::StrideD;
    cutlass::KernelHardwareInfo hw;
    hw.sm_count = sms;
    typename Op::Arguments args{
        cutlass::gemm::GemmUniversalMode::kGemm,
        {M, N, K, 1},
        {static_cast<const T*>(a), cutlass::make_cute_packed_stride(StrideA{}, {M, K, 1}),
         static_cast<const T*>(b), cutlass::make_cute_packed_stride(StrideB{}, {N, K, 1})},
        {{}, static_cast<const ElementC*>(c), cutlass::make_cute_packed_stride(StrideC{}, {M, N, 1}),
         static_cast<T*>(d), cutlass::make_cute_packed_stride(StrideD{}, {M, N, 1})},
        hw};
    args.scheduler.max_swizzle_size = g_swizzle;
    args.scheduler.raster_order = static_cast<decltype(args.scheduler.raster_order)>(g_raster);
    Op op;
    if (Op::get_workspace_size(args) > workspace_bytes) return -1;
    cutlass::Status s = op.can_implement(args);
    if (s != cutlass::Status::kSuccess) return static_cast<int>(s);
    s = op.initialize(args, workspace, stream);
    if (s != cutlass::Status::kSuccess) return static_cast<int>(s);
    return static_cast<int>(op.run(stream));
  }
};

template <class T, template <class> class Act, class Cfg>
int gated(const void* x, const void* weight, void* out, int T_, int I, int K, int sms, void* ws, size_t wsb,
          cudaStream_t stream) {
  const T* w = static_cast<const T*>(weight);
  int s = Gemm<T, void, ActEVT<T, Act>, Cfg>::run(x, w, nullptr, out, T_, I, K, sms, ws, wsb, stream);
  if (s != 0) return s;
  return Gemm<T, T, MulEVT<T>, Cfg>::run(x, w + static_cast<size_t>(I) * K, out, out, T_, I, K, sms, ws, wsb, stream);
}

template <class T, template <class> class Act>
int by_tile(int tile, const void* x, const void* w, void* out, int T_, int I, int K, int sms, void* ws, size_t wsb,
            cudaStream_t st) {
  switch (tile) {
    case 0: return gated<T, Act, Pingpong128x128>(x, w, out, T_, I, K, sms, ws, wsb, st);
#ifdef BQ_TILE_SWEEP
    case 1: return gated<T, Act, Cooperative<256, 128, 1, 2>>(x, w, out, T_, I, K, sms, ws, wsb, st);
    case 2: return gated<T, Act, Cooperative<256, 128, 2, 1>>(x, w, out, T_, I, K, sms, ws, wsb, st);
    case 3: return gated<T, Act, Cooperative<128, 256, 1, 2>>(x, w, out, T_, I, K, sms, ws, wsb, st);
    case 4: return gated<T, Act, Cooperative<128, 256, 2, 1>>(x, w, out, T_, I, K, sms, ws, wsb, st);
#endif
    default: return -2;
  }
}

}  // namespace

extern "C" {

// Tiles compiled in (see by_tile).
int bq_gated_tiles() {
#ifdef BQ_TILE_SWEEP
  return 5;
#else
  return 1;
#endif
}

// out [T, I] = act(x [T, K] · weight[:I]ᵀ) · (x · weight[I:]ᵀ), weight [2I, K], all row-major and
// contiguous in `dtype` (0 = bf16, 1 = fp16); act 1 = SiLU, 2 = GELU (tanh form). K and I multiples
// of 8; pointers 16-byte aligned. Returns 0, or a cutlass::Status code / -1 (workspace too small)
// / -2 (unknown tile, dtype or act).
int bq_gated_gemm(int tile, int dtype, int act, const void* x, const void* weight, void* out, int T_, int I, int K,
                  int sms, void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  using cutlass::epilogue::thread::GELU_taylor;
  using cutlass::epilogue::thread::SiLu;
  if (dtype == 0 && act == 1) return by_tile<cutlass::bfloat16_t, SiLu>(tile, x, weight, out, T_, I, K, sms, workspace, workspace_bytes, stream);
#ifndef BQ_TILE_SWEEP  // the sweep compiles bf16 SiLU only
  if (dtype == 0 && act == 2) return by_tile<cutlass::bfloat16_t, GELU_taylor>(tile, x, weight, out, T_, I, K, sms, workspace, workspace_bytes, stream);
  if (dtype == 1 && act == 1) return by_tile<cutlass::half_t, SiLu>(tile, x, weight, out, T_, I, K, sms, workspace, workspace_bytes, stream);
  if (dtype == 1 && act == 2) return by_tile<cutlass::half_t, GELU_taylor>(tile, x, weight, out, T_, I, K, sms, workspace, workspace_bytes, stream);
#endif
  return -2;
}

#ifdef BQ_TILE_SWEEP
void bq_set_schedule(int swizzle, int raster) { g_swizzle = swizzle; g_raster = raster; }

// D [M, N] = A [M, K] · B [N, K]ᵀ in bf16 with the plain epilogue: what each tile reaches without the fusion.
int bq_plain_gemm(int tile, const void* a, const void* b, void* d, int M, int N, int K, int sms, void* ws,
                  size_t wsb, cudaStream_t st) {
  using T = cutlass::bfloat16_t;
  using EVT = fusion::Sm90EVT<fusion::Sm90Compute<cutlass::epilogue::thread::Identity, T, float, kRound>,
                              fusion::Sm90AccFetch>;
  switch (tile) {
    case 0: return Gemm<T, void, EVT, Pingpong128x128>::run(a, b, nullptr, d, M, N, K, sms, ws, wsb, st);
    case 1: return Gemm<T, void, EVT, Cooperative<256, 128, 1, 2>>::run(a, b, nullptr, d, M, N, K, sms, ws, wsb, st);
    case 2: return Gemm<T, void, EVT, Cooperative<256, 128, 2, 1>>::run(a, b, nullptr, d, M, N, K, sms, ws, wsb, st);
    case 3: return Gemm<T, void, EVT, Cooperative<128, 256, 1, 2>>::run(a, b, nullptr, d, M, N, K, sms, ws, wsb, st);
    case 4: return Gemm<T, void, EVT, Cooperative<128, 256, 2, 1>>::run(a, b, nullptr, d, M, N, K, sms, ws, wsb, st);
    default: return -2;
  }
}
#endif

}  // extern "C"
