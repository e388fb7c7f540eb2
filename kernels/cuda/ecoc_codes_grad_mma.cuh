// Codes-gradient split kernel of the kGradMma variants: the second product
// on the mma engine, G held in registers.
//
// Same grid, batch splits, logit recomputation, w and output layout as
// CodesGradSplitKernel (ecoc_codes_grad.cuh); what differs is the sum
//   G_c = sum_r w_rc (u_r - M_c)
// of a class tile (32 classes) over the BT-row batch tiles of the split.
// It runs in the expanded form
//   G (32 x kp) += W^T (32 x BT) . U (BT x kp)   on mma.m16n8k8,
//   G_c -= (sum_r w_rc) M_c                       in FP32, per batch tile,
// so the cancellation of the two terms (rows sitting on their codewords)
// is bounded by one tile's sum, not the split's.
//  * Warp layout: the kp / 8 n8 column tiles of G are dealt round-robin to
//    the 4 warps (warp w owns tiles w, w + 4, ...; at most kRegMaxK / 32 = 4
//    each), every warp covers both m16 tiles of 16 classes: 2 x 4 x 4 = 32
//    accumulator floats per thread at kp = 128, in registers across the
//    batch tiles of the split.
//  * Fragments: A = W^T (class g / g + 8 of the m-tile, batch row t / t + 4
//    of the k8 step) read from W_s[row][class]; B = U (row t / t + 4,
//    column g of the n8 tile) read from the staged u tile. 3xTF32 splits
//    both operands (small products first, as MmaEngine); plain TF32 runs one
//    product.
//  * Column sums: each thread sums w over its RW rows of class `lane` while
//    it writes them; the 4 warps' partials go through shared memory and are
//    added in warp order (fixed order, no atomics).
//  * Only the one-stage plan (nchunks == 1, kp <= kRegMaxK) runs here; the
//    launcher falls back to CodesGradSplitKernel elsewhere (MakePlan).
//  * Staging: the code tile once per block (every batch tile of the split
//    meets the same 32 classes), then CodesGradArgs::stages u buffers: two
//    overlap the next batch tile's copy with this one's products, one frees
//    a batch tile of shared memory where that buys a block per SM (MakePlan).
#ifndef KERAS_ECOC_KERNELS_CUDA_ECOC_CODES_GRAD_MMA_CUH_
#define KERAS_ECOC_KERNELS_CUDA_ECOC_CODES_GRAD_MMA_CUH_

#include <cstdint>
#include <type_traits>

#include "ecoc_codes_grad.cuh"
#include "ecoc_common.cuh"
#include "ecoc_engine.cuh"
#include "ecoc_forward_reg.cuh"

namespace keras_ecoc {
namespace cuda {
namespace detail {

// n8 column tiles of G per warp at most in the instantiation for padded
// rows up to kmax: kRegMaxK (4 tiles), or the launcher's kGradMmaMidK (2)
// where kp <= 64 and kRegShortK (1) where kp <= 32, so that a short row
// holds 8 or 16 accumulators of G per thread instead of 32.
constexpr int kGradMmaMidK = 64;
__host__ __device__ constexpr int GradMmaTilesPerWarp(int kmax) { return kmax / 8 / kWarps; }

// Shared-memory floats of CodesGradMmaKernel: the code tile and `stages`
// u tiles (CodesGradArgs::stages) at the engine's pitch kp + 4, the w tile
// as TF32 halves (two in 3xTF32: `split`), and the warps' partial column
// sums (no G: it lives in registers).
__host__ __device__ constexpr int64_t CodesGradMmaSmemFloats(int bt, int kp, int stages,
                                                             bool split) {
  return (kClassTile + stages * int64_t{bt}) * TilePitch(kp) +
         (split ? 2 : 1) * int64_t{bt} * kSPitch + kWarps * kClassTile +
         kClassTile;  // ... partial column sums, ct of the class tile
}

// Calls f(v, mt, h, cl, j) on each accumulator float v of the thread's G
// fragments acc[2][NJ][4]: class cl = mt * 16 + g + 8 h of the class tile,
// column j = jn * 8 + 2t + (e & 1) of the warp's n8 tiles jn = warp + 4 jw
// below kn (the mma.m16n8k8 accumulator layout).
template <int NJ, typename F>
__device__ __forceinline__ void ForEachGradFragment(float (&acc)[2][NJ][4], int warp, int kn,
                                                    int g, int t, F f) {
#pragma unroll
  for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
    for (int jw = 0; jw < NJ; ++jw) {
      const int jn = warp + kWarps * jw;
      if (jn < kn) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int h = e / 2;
          f(acc[mt][jw][e], mt, h, mt * 16 + g + 8 * h, jn * 8 + 2 * t + (e & 1));
        }
      }
    }
  }
}

// Blocks per SM the 16-row kernel asks for. Without a bound ptxas chose
// 128 registers in 3xTF32 (sm_90) once u took the finite split. 6 (at most
// 80 registers) is what it had before; on sm_90 it fits 8 (64 registers) with
// no spill and 2-3 % more instructions in its tile loop (sass_loop_stats.py),
// and at B = 16 the kernel is latency-bound (DRAM at 50 % of its peak, 4.2
// cycles between a warp's instructions on the H100 of 2026-11-27), so it
// takes the warps. sm_80 spills 12-20 B at 64 registers: 6 there and below.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
constexpr int kGradMmaMinBlocks16 = 8;
#else
constexpr int kGradMmaMinBlocks16 = 6;
#endif

template <int kMath, int BT, int KMAX = kRegMaxK>
__global__ void __launch_bounds__(kThreads, BT == 16 ? kGradMmaMinBlocks16 : 0)
    CodesGradMmaKernel(CodesGradArgs a) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
  extern __shared__ __align__(16) float smem[];
  constexpr bool kSplit = kMath == kMath3xTf32;
  // The 16-row 3xTF32 engine reads u by scalar loads (MmaEngine's
  // kLdmatrixA): no spill under its register bound.
  using Engine = std::conditional_t<kSplit && BT == 16,
                                    MmaEngine<BT, true, false>,
                                    typename EngineFor<kMath, BT>::type>;
  constexpr int CT = kClassTile;
  constexpr int RW = BT / kWarps;
  constexpr int NJ = GradMmaTilesPerWarp(KMAX);
  static_assert(KMAX == kRegMaxK || KMAX == kGradMmaMidK || KMAX == kRegShortK,
                "KMAX: kRegMaxK, kGradMmaMidK or kRegShortK");
  static_assert(CT == 32, "two m16 tiles of classes");
  static_assert(BT % 8 == 0, "k8 steps over the batch rows");
  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  const int g = lane / 4;
  const int t = lane % 4;
  const int kp = a.kc;  // one stage holds the whole padded row
  const int pitch = TilePitch(kp);
  const int kn = kp / 8;
  const int u_floats = BT * pitch;
  float* M_s = smem;              // [CT][pitch] the block's code tile
  float* U_s = M_s + CT * pitch;  // [stages][BT][pitch] u tiles
  float* W_s = U_s + a.stages * u_floats;  // [BT][kSPitch] w, TF32 big halves
  float* W_lo = W_s + BT * kSPitch;         // 3xTF32: [BT][kSPitch] small halves
  float* cs_s = W_lo + (kSplit ? BT * kSPitch : 0);  // [kWarps][CT] partial column sums
  float* ct_s = cs_s + kWarps * CT;  // [CT] the class tile's logit terms

  const int64_t k = a.code_length;
  const float scale = ReadScale(a.scale_ptr, a.scale);
  const auto [c0, split, nvalid, t_begin, t_end] = BlockRange(a);
  const int64_t ntiles = t_end - t_begin;

  // acc[mt][jw]: classes mt*16 + g (+ 8), columns (warp + 4*jw)*8 + 2t (+ 1).
  float acc[2][NJ][4];
#pragma unroll
  for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
    for (int jw = 0; jw < NJ; ++jw) {
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[mt][jw][e] = 0.0f;
    }
  }

  // u rows b0 .. b0 + BT of the batch into `dst` (zero rows past B).
  auto stage_u = [&](float* dst, int64_t b0) {
    StageTile(dst, pitch, a.u, a.kp, b0, a.batch, BT, 0, kp, a.kp, true);
    ptx::cp_async_commit();
  };
  Engine engine;
  engine.Init();
  if (ntiles > 0) {
    StageTile(M_s, pitch, a.codes, k, c0, a.num_classes, CT, 0, kp, k, a.codes_vec);
    stage_u(U_s, t_begin * BT);  // one commit group: code tile and first u tile
  }
  for (int64_t q = 0; q < ntiles; ++q) {
    float* cur = U_s + (a.stages == 2 ? (q & 1) : 0) * u_floats;
    if (a.stages == 2 && q + 1 < ntiles) {
      stage_u(U_s + ((q + 1) & 1) * u_floats, (t_begin + q + 1) * BT);
      ptx::cp_async_wait<1>();
    } else {
      ptx::cp_async_wait<0>();
    }
    __syncthreads();

    engine.Init();
    engine.Step(cur, M_s, pitch, kp);
    if (q == 0) LoadClassTerms(a, M_s, pitch, scale, c0, warp, lane, ct_s);
    const int64_t b0 = (t_begin + q) * BT;
    const int rows_valid = static_cast<int>(a.batch - b0 < BT ? a.batch - b0 : BT);
    engine.Store(W_s);
    // W_s and (first batch tile) ct_s complete.
    __syncthreads();
    cs_s[warp * CT + lane] =
        WriteTileWeights<RW, kSplit ? 2 : 1, kMath>(a, W_s, ct_s, scale, c0, b0, rows_valid, warp,
                                                    lane, W_lo);
    // Every w and partial column sum of the tile is written before any
    // warp reads the whole tile.
    __syncthreads();  // [barrier-mutation-test] only=gradmma

    // Column sums of the thread's four classes (mt*16 + g + 8h), warps in
    // increasing order.
    float csum[2][2];
#pragma unroll
    for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int cl = mt * 16 + g + 8 * h;
        float s = 0.0f;
#pragma unroll
        for (int w = 0; w < kWarps; ++w) s += cs_s[w * CT + cl];
        csum[mt][h] = s;
      }
    }

    // G += W^T U over the tile's BT rows (rows past the batch: w = 0 and a
    // zero-filled u row), for the warp's nv column blocks jw < nv (jn =
    // warp + 4 jw < kn): one loop per count, chosen once per tile, so that
    // no test separates the products of different blocks. A test per block
    // made each block's 2 x 3 dependent products a basic block of their own,
    // which ptxas issued back to back (sm_90 SASS); in one block the
    // products of the 2 x nv accumulators interleave. Each accumulator sees
    // the same products in the same order either way.
    const float* ub = cur + t * pitch + g;
    auto second_product = [&](auto nv_constant, auto test_constant) {
      constexpr int nv = decltype(nv_constant)::value;
      constexpr bool test = decltype(test_constant)::value;
#pragma unroll
      for (int ks = 0; ks < BT; ks += 8) {
        // The A fragments, split when w was written (WriteTileWeights).
        uint32_t ab[2][4], as[2][4];
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) {
          const int o = (ks + t) * kSPitch + mt * 16 + g;
          const int off[4] = {o, o + 8, o + 4 * kSPitch, o + 4 * kSPitch + 8};
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            ab[mt][e] = __float_as_uint(W_s[off[e]]);
            as[mt][e] = kSplit ? __float_as_uint(W_lo[off[e]]) : 0u;
          }
        }
#pragma unroll
        for (int jw = 0; jw < nv; ++jw) {
          const int jn = warp + kWarps * jw;
          if (!test || jn < kn) {
            uint32_t bb[2], bs[2];
            SplitTf32Finite(ub[ks * pitch + jn * 8], &bb[0], &bs[0]);
            SplitTf32Finite(ub[(ks + 4) * pitch + jn * 8], &bb[1], &bs[1]);
#pragma unroll
            for (int mt = 0; mt < 2; ++mt) MmaMode<kSplit>(acc[mt][jw], ab[mt], as[mt], bb, bs);
          }
        }
      }
    };
    if constexpr (kSplit && BT == 64 && NJ == 4) {
      using std::false_type;
      using std::integral_constant;
      switch (warp < kn ? (kn - warp + kWarps - 1) / kWarps : 0) {
        case 4: second_product(integral_constant<int, 4>{}, false_type{}); break;
        case 3: second_product(integral_constant<int, 3>{}, false_type{}); break;
        case 2: second_product(integral_constant<int, 2>{}, false_type{}); break;
        case 1: second_product(integral_constant<int, 1>{}, false_type{}); break;
        default: break;
      }
    } else {
      second_product(std::integral_constant<int, NJ>{}, std::true_type{});
    }
    // Every warp has read the tile's u, w and column sums: `cur` (with one
    // buffer, the next tile's target; with two, the one after), W_s and cs_s
    // are free. The emulator sees a missing one only with eager copies and
    // one warp running ahead.
    __syncthreads();  // [barrier-mutation-test] only=gradmma cp-async=eager schedule=warps
    if (a.stages == 1 && q + 1 < ntiles) stage_u(U_s, (t_begin + q + 1) * BT);
    // G_c -= (sum_r w_rc) M_c for the tile (the code tile is zero past k
    // and past the class count, and stays for the block's whole range),
    // while the next u tile lands.
    ForEachGradFragment(acc, warp, kn, g, t, [&](float& v, int mt, int h, int cl, int j) {
      v = fmaf(-csum[mt][h], M_s[cl * pitch + j], v);
    });
  }

  // splits == 1: s * G into grad_codes; else the unscaled G into the
  // workspace slot of the split (the same layout as CodesGradSplitKernel).
  const bool final = a.splits == 1;
  float* slot = a.out + (int64_t{split} * a.num_classes + c0) * k;
  const int nclasses = nvalid;  // C++17 lambdas cannot capture structured bindings
  ForEachGradFragment(acc, warp, kn, g, t, [&](float& v, int, int, int cl, int j) {
    if (cl < nclasses && j < k) slot[cl * k + j] = final ? scale * v : v;
  });
#endif
}

}  // namespace detail
}  // namespace cuda
}  // namespace keras_ecoc

#endif  // KERAS_ECOC_KERNELS_CUDA_ECOC_CODES_GRAD_MMA_CUH_
