// Codes-gradient split kernel of kRows64GradMmaWgmma (kGradMma | kRows64 |
// kWgmma, sm_90a only): the 64-row CodesGradMmaKernel with both of its
// products on Hopper's wgmma.mma_async, one warpgroup (the block's 4 warps)
// per product. Same grid, batch splits, class tile (32 classes), staging,
// weights, fixed-order column sums, correction and output as
// CodesGradMmaKernel<kMath, 64, KMAX> (ecoc_codes_grad_mma.cuh), and under
// the emulator the same bits: each logit and each G entry takes that
// kernel's products in that kernel's order.
//  * Logits, S (64 rows x 32 classes) = U . M^T: AccumulateLogitsWg at
//    N = 32 (ecoc_forward_reg.cuh), A = the warp's u fragment by ldmatrix,
//    split as MmaEngine splits it; B = the code tile's TF32 halves, split
//    once per block (not once per warp and batch tile: the first batch
//    tile's prologue) into wgmma's core-matrix layout (GradWgCodeOffset).
//    The accumulator layout is MmaEngine's 64-row one (warp w: rows
//    16 w .. 16 w + 15, all 32 classes), so S goes to W_s as there.
//  * Weights: WriteTileWeights<..., kCore = true> writes w's TF32 halves in
//    the core-matrix layout (GradWgWOffset) from the logits in W_s.
//  * Second product, transposed: G^T (kp x 32) += U^T (kp x 64) . W
//    (64 x 32), m64n32k8 per 64 code columns ("m-tile"; one at kp <= 64,
//    two above) and k-step of 8 batch rows. A = U^T by scalar loads from the
//    staged u tile (thread (g, t) of warp w: columns 64 mt + 16 w + g and
//    + 8, rows ks + t and + 4; 32 distinct banks at the pitch kp + 4) and
//    split as CodesGradMmaKernel splits its U operand; B = w's halves
//    through descriptors. With the operands' roles exchanged, MmaMode's
//    order W_s.U_b, W_b.U_s, W_b.U_b is the products (A = U_b, B = W_s),
//    (U_s, W_b), (U_b, W_b). wgmma has no transposed TF32 operand: both
//    operands K-major is why G is computed transposed (the u tile is K-major
//    for the logits, w's tile is written in the layout the second product
//    reads).
//  * G^T in registers: MT x 4 x 4 floats per thread (MT = 2 at kp > 64),
//    element (mt, n, e) = code column 64 mt + 16 w + g + 8 (e / 2) of
//    class 8 n + 2t + (e & 1). Columns at or past kp are computed from
//    zero A rows and never stored.
//  * Shared memory (floats): w's halves (2 x 2,048, constant offset), the
//    code tile's halves (2 x 32 kp; one of each in TF32), the logits W_s
//    [64][kSPitch], the warps' partial column sums and ct, the code tile in
//    FP32 (the correction G_c -= colsum(w)_c M_c needs M's float bits), then
//    the u buffers. 3xTF32 at kp = 128 with one u buffer: 107 KiB.
//  * Asynchronous proxy: the generic stores of both halves (codes once,
//    weights per tile) are made visible to wgmma by fence.proxy.async before
//    the barrier that precedes the products reading them; every product is
//    retired (wgmma_wait<0>) before the barrier after which the tile's
//    shared operands are rewritten.
#ifndef KERAS_ECOC_KERNELS_CUDA_ECOC_CODES_GRAD_WGMMA_CUH_
#define KERAS_ECOC_KERNELS_CUDA_ECOC_CODES_GRAD_WGMMA_CUH_

#include <cstdint>

#include "ecoc_codes_grad.cuh"
#include "ecoc_codes_grad_mma.cuh"
#include "ecoc_common.cuh"
#include "ecoc_engine.cuh"
#include "ecoc_forward_reg.cuh"
#include "ecoc_ptx.cuh"
#include "ecoc_wgmma_desc.h"

namespace keras_ecoc {
namespace cuda {
namespace detail {

constexpr int kGradWgRows = 64;  // batch rows per tile: one warpgroup's m64

// The code tile's copy for the logits' B operand (N = 32 classes x K = kp
// code columns, K-major): class cl's 4-column groups 128 bytes apart (LBO,
// the forward's kWgRowsLbo), the 8-class groups kp / 4 core matrices =
// 32 kp bytes apart (SBO); one half is 32 kp floats.
__host__ __device__ constexpr uint32_t GradWgCodeSbo(int kp) {
  return static_cast<uint32_t>(kp) / 4 * kWgRowsLbo;
}
__host__ __device__ constexpr int GradWgCodeOffset(int cl, int j, int kp) {
  return (cl / 8) * (8 * kp) + (j / 4) * static_cast<int>(kWgRowsLbo / 4) + (cl % 8) * 4 + j % 4;
}

// Shared-memory floats of CodesGradWgmmaKernel at padded row kp with
// `stages` u buffers (split: 3xTF32's small halves). The header has the
// layout.
__host__ __device__ constexpr int64_t CodesGradWgSmemFloats(int kp, int stages, bool split) {
  return (split ? 2 : 1) * (int64_t{kGradWgWFloats} + int64_t{kClassTile} * kp) +
         int64_t{kGradWgRows} * kSPitch + kWarps * kClassTile + kClassTile +
         (kClassTile + stages * int64_t{kGradWgRows}) * TilePitch(kp);
}
static_assert(CodesGradWgSmemFloats(kRegMaxK, 2, true) * 4 < 16384 * 16,
              "wgmma descriptors address 256 KiB of shared memory");

// The code tile M_s [32][pitch] (FP32, zero past k and past the class
// count) as TF32 halves (SplitTf32Finite, the split MmaEngine applies to its
// code fragments) into `halves` in GradWgCodeOffset's layout, the small
// ones 32 kp floats on (3xTF32). 16-byte loads and stores, lanes over
// classes: each quarter-warp's 8 stores fill one core matrix.
template <bool kSplit>
__device__ __forceinline__ void SplitCodeTileWg(const float* M_s, int pitch, int kp,
                                                float* halves) {
  const int groups = kClassTile * (kp / 4);
  for (int i = threadIdx.x; i < groups; i += kThreads) {
    const int cl = i % kClassTile;
    const int j = (i / kClassTile) * 4;
    const float4 x = *reinterpret_cast<const float4*>(M_s + cl * pitch + j);
    const float v[4] = {x.x, x.y, x.z, x.w};
    uint32_t b[4], sm[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) SplitTf32Finite(v[e], &b[e], &sm[e]);
    float* at = halves + GradWgCodeOffset(cl, j, kp);
    *reinterpret_cast<uint4*>(at) = make_uint4(b[0], b[1], b[2], b[3]);
    if (kSplit) {
      *reinterpret_cast<uint4*>(at + kClassTile * kp) = make_uint4(sm[0], sm[1], sm[2], sm[3]);
    }
  }
}

// G^T += U^T . W over the tile's 64 rows (the header's second product):
// MT m-tiles of 64 code columns, 8 k-steps of 8 rows, one commit group per
// k-step, the A registers in two sets (wait_group 1 before a set is
// rewritten, as AccumulateLogitsWg). ub: the u tile at row t, column
// 16 w + g (thread (g, t) of warp w); col_ok[mt][h]: whether column
// 64 mt + 16 w + g + 8 h is below kp (else its A entries are zero: the
// padding and the next row hold no operand).
template <bool kSplit, int MT>
__device__ __forceinline__ void AccumulateGradWg(float (&acc)[MT][4][4], const float* ub,
                                                 int pitch, const float* w_halves,
                                                 const bool (&col_ok)[MT][2]) {
  const uint64_t desc_b =
      wgmma::Descriptor(ptx::shared_address(w_halves), kGradWgWLbo, kGradWgWSbo);
  const uint64_t desc_s = wgmma::Advance(desc_b, kGradWgWFloats * 4);
  uint32_t ab[2][MT][4], as[2][MT][4];
#pragma unroll
  for (int ks = 0; ks < kGradWgRows; ks += 8) {
    const int set = (ks / 8) & 1;
    if (ks >= 16) ptx::wgmma_wait<1>();  // the group of k-step ks - 16 read this set
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      // A fragment: a0 (column g, row t), a1 (g + 8, t), a2 (g, t + 4),
      // a3 (g + 8, t + 4) of the m-tile and k-step.
      const float* p = ub + ks * pitch + mt * 64;
      const float v[4] = {col_ok[mt][0] ? p[0] : 0.0f, col_ok[mt][1] ? p[8] : 0.0f,
                          col_ok[mt][0] ? p[4 * pitch] : 0.0f,
                          col_ok[mt][1] ? p[4 * pitch + 8] : 0.0f};
#pragma unroll
      for (int e = 0; e < 4; ++e) SplitTf32Finite(v[e], &ab[set][mt][e], &as[set][mt][e]);
      // The first product reads a big half only (MmaMode's order).
      if (kSplit) ptx::wgmma_pin(as[set][mt]);
    }
    ptx::wgmma_fence();
    const uint32_t at = static_cast<uint32_t>(ks / 4) * kGradWgWLbo;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      if (kSplit) {
        ptx::wgmma_tf32<32>(acc[mt], ab[set][mt], wgmma::Advance(desc_s, at));
        ptx::wgmma_tf32<32>(acc[mt], as[set][mt], wgmma::Advance(desc_b, at));
      }
      ptx::wgmma_tf32<32>(acc[mt], ab[set][mt], wgmma::Advance(desc_b, at));
    }
    ptx::wgmma_commit();
  }
  ptx::wgmma_wait<0>();  // [barrier-mutation-test] only=gradmma+wgmma G^T in acc
}

// Calls f(v, n, h, cl, j) on each accumulator float v of G^T with j < kp:
// class cl = 8 n + 2t + h of the class tile, code column j (the header's
// layout).
template <int MT, typename F>
__device__ __forceinline__ void ForEachGradWgFragment(float (&acc)[MT][4][4],
                                                      const bool (&col_ok)[MT][2], int warp,
                                                      int g, int t, F f) {
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int n = 0; n < 4; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        if (col_ok[mt][e / 2]) {
          f(acc[mt][n][e], n, e & 1, 8 * n + 2 * t + (e & 1),
            mt * 64 + warp * 16 + g + 8 * (e / 2));
        }
      }
    }
  }
}

// KMAX: the widest padded row of the instantiation (kRegShortK, kGradMmaMidK
// or kRegMaxK, the launcher's choice as for CodesGradMmaKernel): one m-tile
// of G^T up to 64 columns, two above. Compiled for every architecture; its
// wgmma wrappers trap except in sm_90a code, and MakePlan launches it only
// there.
template <int kMath, int KMAX = kRegMaxK>
__global__ void __launch_bounds__(kThreads) CodesGradWgmmaKernel(CodesGradArgs a) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
  extern __shared__ __align__(16) float smem[];
  constexpr bool kSplit = kMath == kMath3xTf32;
  constexpr int CT = kClassTile;
  constexpr int BT = kGradWgRows;
  constexpr int RW = BT / kWarps;
  constexpr int MT = KMAX > 64 ? 2 : 1;
  static_assert(KMAX == kRegMaxK || KMAX == kGradMmaMidK || KMAX == kRegShortK,
                "KMAX: kRegMaxK, kGradMmaMidK or kRegShortK");
  static_assert(kThreads == 128, "one warpgroup per block");
  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  const int g = lane / 4;
  const int t = lane % 4;
  const int kp = a.kc;  // one stage holds the whole padded row
  const int pitch = TilePitch(kp);
  const int u_floats = BT * pitch;
  float* Wh_s = smem;                                    // w's halves (core matrices)
  float* Mh_s = Wh_s + (kSplit ? 2 : 1) * kGradWgWFloats;  // the code tile's halves
  float* W_s = Mh_s + (kSplit ? 2 : 1) * CT * kp;        // [BT][kSPitch] logits
  float* cs_s = W_s + BT * kSPitch;                      // [kWarps][CT] partial column sums
  float* ct_s = cs_s + kWarps * CT;                      // [CT] the class tile's logit terms
  float* M_s = ct_s + CT;                                // [CT][pitch] the code tile, FP32
  float* U_s = M_s + CT * pitch;                         // [stages][BT][pitch] u tiles

  const int64_t k = a.code_length;
  const float scale = ReadScale(a.scale_ptr, a.scale);
  const auto [c0, split, nvalid, t_begin, t_end] = BlockRange(a);
  const int64_t ntiles = t_end - t_begin;

  float acc[MT][4][4];
  bool col_ok[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int h = 0; h < 2; ++h) col_ok[mt][h] = mt * 64 + warp * 16 + g + 8 * h < kp;
#pragma unroll
    for (int n = 0; n < 4; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[mt][n][e] = 0.0f;
    }
  }

  auto stage_u = [&](float* dst, int64_t b0) {
    StageTile(dst, pitch, a.u, a.kp, b0, a.batch, BT, 0, kp, a.kp, true);
    ptx::cp_async_commit();
  };
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
    if (q == 0) {
      // The code tile split once for every batch tile of the block, visible
      // to wgmma's proxy before any warp's first logits.
      // (Deleted, only a warp running ahead shows it: under the emulator's
      // default rounds the warps finish the split together.)
      SplitCodeTileWg<kSplit>(M_s, pitch, kp, Mh_s);
      ptx::fence_proxy_async_shared();
      __syncthreads();  // [barrier-mutation-test] only=gradmma+wgmma schedule=warps
      LoadClassTerms(a, M_s, pitch, scale, c0, warp, lane, ct_s);
    }

    // The logits of the warp's 16 rows, into W_s at MmaEngine::Store's places
    // (the m64n32 accumulators have the 64-row engine's layout).
    float s[CT / 8][4];
#pragma unroll
    for (int nt = 0; nt < CT / 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) s[nt][e] = 0.0f;
    }
    const float* la = FragRowA(cur + warp * 16 * pitch, pitch, lane);
    AccumulateLogitsWg<kSplit, true, CT>(s, la, Mh_s, kp, GradWgCodeSbo(kp),
                                         static_cast<uint32_t>(CT * kp * 4));
    MmaEngine<BT, kSplit>::StoreFragments(s, W_s);
    const int64_t b0 = (t_begin + q) * BT;
    const int rows_valid = static_cast<int>(a.batch - b0 < BT ? a.batch - b0 : BT);
    // W_s and (first batch tile) ct_s complete.
    __syncthreads();
    cs_s[warp * CT + lane] = WriteTileWeights<RW, kSplit ? 2 : 1, kMath, true>(
        a, W_s, ct_s, scale, c0, b0, rows_valid, warp, lane, Wh_s);
    // w's halves visible to wgmma's proxy, and every partial column sum
    // written, before any warp's second product.
    ptx::fence_proxy_async_shared();
    __syncthreads();  // [barrier-mutation-test] only=gradmma+wgmma

    // Column sums of the thread's eight classes 8 n + 2t + h, warps in
    // increasing order (CodesGradMmaKernel's sums).
    float csum[4][2];
#pragma unroll
    for (int n = 0; n < 4; ++n) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int cl = 8 * n + 2 * t + h;
        float sum = 0.0f;
#pragma unroll
        for (int w = 0; w < kWarps; ++w) sum += cs_s[w * CT + cl];
        csum[n][h] = sum;
      }
    }
    AccumulateGradWg<kSplit, MT>(acc, cur + t * pitch + warp * 16 + g, pitch, Wh_s, col_ok);
    // Every warp has read the tile's u, w and column sums (and its products
    // are retired): `cur`, W_s, Wh_s and cs_s are free. (Not marked for the
    // barrier-deletion test: it is CodesGradMmaKernel's marked barrier in
    // the same place, and each mutant costs the suite a build.)
    __syncthreads();
    if (a.stages == 1 && q + 1 < ntiles) stage_u(U_s, (t_begin + q + 1) * BT);
    // G_c -= (sum_r w_rc) M_c for the tile, while the next u tile lands.
    ForEachGradWgFragment(acc, col_ok, warp, g, t, [&](float& v, int n, int h, int cl, int j) {
      v = fmaf(-csum[n][h], M_s[cl * pitch + j], v);
    });
  }

  // splits == 1: s * G into grad_codes; else the unscaled G into the
  // workspace slot of the split (CodesGradSplitKernel's layout).
  const bool final = a.splits == 1;
  float* slot = a.out + (int64_t{split} * a.num_classes + c0) * k;
  const int nclasses = nvalid;  // C++17 lambdas cannot capture structured bindings
  ForEachGradWgFragment(acc, col_ok, warp, g, t, [&](float& v, int, int, int cl, int j) {
    if (cl < nclasses && j < k) slot[cl * k + j] = final ? scale * v : v;
  });
#endif
}

}  // namespace detail
}  // namespace cuda
}  // namespace keras_ecoc

#endif  // KERAS_ECOC_KERNELS_CUDA_ECOC_CODES_GRAD_WGMMA_CUH_
