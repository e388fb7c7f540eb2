// Codes-gradient kernel of the kGradPersistent variants: one batch tile,
// persistent blocks that stream the class tiles.
//
// Same gradient, logit recomputation, weights and output bits as
// CodesGradSplitKernel (ecoc_codes_grad.cuh) with one batch split; what
// differs is the grid. Where the whole batch is one BT-row tile (B <= 16, or
// B <= 64 with kRows64) the split kernel's grid is one block per class tile,
// and each block stages its one code tile, waits for it, computes, writes and
// exits: no block ever overlaps a load with its compute, and the second
// buffer of its double-buffered stage sits unused in shared memory (25 KiB
// of its 68 KiB at k = 128: 3 blocks per H100 SM where 5 would fit). Here:
//  * grid = min(class tiles, SMs x blocks per SM) (MakePlan): one wave;
//    block x takes class tiles x, x + gridDim.x, ...;
//  * the u tile is staged once per block and stays resident;
//  * the code tiles are double-buffered (cp.async on sm_80 and later): the
//    next tile loads while the block computes the current one;
//  * ||M||^2 of each tile comes from its staged copy (AccumulateFoldedNorms),
//    so the pass reads the codes once and runs no PrepClasses;
//  * with one batch tile the gradient of a class needs no accumulation, so
//    G goes straight to grad_codes as s * (0 + t): the split kernel's
//    0-initialised G plus one tile sum, the same bits, no G in shared memory;
//  * the G update deals the (class, column) pairs of a tile to all 128
//    threads, in groups of min(k, 128) columns, so k = 32 uses every thread.
// Shared memory at k = 128 (pitch 132): 16-row 43.6 KiB (the split kernel
// 67.9 KiB), 64-row 75.1 KiB.
// Only the one-tile, one-stage plan runs here (MakePlan); elsewhere the
// launcher falls back to CodesGradSplitKernel.
#ifndef KERAS_ECOC_KERNELS_CUDA_ECOC_CODES_GRAD_PERSISTENT_CUH_
#define KERAS_ECOC_KERNELS_CUDA_ECOC_CODES_GRAD_PERSISTENT_CUH_

#include <cstdint>

#include "ecoc_codes_grad.cuh"
#include "ecoc_common.cuh"
#include "ecoc_engine.cuh"

namespace keras_ecoc {
namespace cuda {
namespace detail {

// Shared-memory floats of CodesGradPersistentKernel at the engine's pitch
// kp + 4: the resident u tile, two code tiles, the w tile and the tile's
// logit terms.
__host__ __device__ constexpr int64_t CodesGradPersistentSmemFloats(int bt, int kp) {
  return int64_t{bt + 2 * kClassTile} * TilePitch(kp) + int64_t{bt} * kSPitch + kClassTile;
}

template <int kMath, int BT>
__global__ void __launch_bounds__(kThreads, BT == 64 ? 5 : 0) CodesGradPersistentKernel(CodesGradArgs a) {
  extern __shared__ __align__(16) float smem[];
  using Engine = typename EngineFor<kMath, BT>::type;
  constexpr int CT = kClassTile;
  constexpr int RW = BT / kWarps;
  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  const int kp = a.kc;  // one stage holds the whole padded row
  const int pitch = TilePitch(kp);
  float* u_s = smem;                  // [BT][pitch], resident
  float* m_s = u_s + BT * pitch;      // [2][CT][pitch], double-buffered
  float* W_s = m_s + 2 * CT * pitch;  // [BT][kSPitch]
  float* ct_s = W_s + BT * kSPitch;   // [CT]

  const int64_t k = a.code_length;
  const int64_t n = a.num_classes;
  const float scale = ReadScale(a.scale_ptr, a.scale);
  const int64_t class_tiles = (n + CT - 1) / CT;
  const int rows_valid = static_cast<int>(a.batch < BT ? a.batch : BT);
  // The G update's layout: `cols` consecutive threads per group take
  // consecutive columns (coalesced stores), `groups` groups take every
  // groups-th class of the tile.
  const auto [cols, groups, group, col] = ColumnGroupsOf(k);

  // Stages class tile `t` of the codes into code buffer `b` (uncommitted).
  auto stage_codes = [&](int b, int64_t t) {
    StageTile(m_s + b * CT * pitch, pitch, a.codes, k, t * CT, n, CT, 0, kp, k, a.codes_vec);
  };

  int64_t tile = blockIdx.x;
  if (tile >= class_tiles) return;  // MakePlan's grid has none; whole block
  // u and the first code tile: one cp.async group.
  StageTile(u_s, pitch, a.u, a.kp, 0, a.batch, BT, 0, kp, a.kp, true);
  stage_codes(0, tile);
  ptx::cp_async_commit();
  // buf: the code buffer of this tile (a parity, not a tile counter: a
  // block may take more than 2^31 tiles of a 2^40-class problem).
  for (int buf = 0; tile < class_tiles; buf ^= 1, tile += gridDim.x) {
    float* cur = m_s + buf * CT * pitch;
    const int64_t next = tile + gridDim.x;
    if (next < class_tiles) {
      stage_codes(buf ^ 1, next);
      ptx::cp_async_commit();
      ptx::cp_async_wait<1>();
    } else {
      ptx::cp_async_wait<0>();
    }
    __syncthreads();

    const int64_t c0 = tile * CT;
    const int nvalid = static_cast<int>(n - c0 < CT ? n - c0 : CT);
    Engine engine;
    engine.Init();
    engine.Step(u_s, cur, pitch, kp);
    LoadClassTerms(a, cur, pitch, scale, c0, warp, lane, ct_s);
    engine.Store(W_s);
    // W_s and ct_s complete.
    __syncthreads();
    WriteTileWeights<RW, 0, kMath>(a, W_s, ct_s, scale, c0, 0, rows_valid, warp, lane);
    // Every w of the tile is written before any thread reads another
    // warp's rows.
    __syncthreads();  // [barrier-mutation-test] only=gradpersistent

    float* out = a.out + c0 * k;
    if (group < groups) {
      for (int64_t j = col; j < k; j += cols) {
        float uv[BT];
#pragma unroll
        for (int r = 0; r < BT; ++r) uv[r] = r < rows_valid ? u_s[r * pitch + j] : 0.0f;
        for (int cc = group; cc < nvalid; cc += groups) {
          // 0 + t as the split kernel's zeroed G plus its one tile sum
          // (-0 becomes +0 there too).
          const float t = TileGradSum<BT>(W_s, cc, uv, cur[cc * pitch + j], rows_valid);
          out[cc * k + j] = scale * (0.0f + t);
        }
      }
    }
    // Buffer `buf` (the next staging's target), W_s and ct_s are free for
    // the next tile. The emulator sees a missing one only with eager copies.
    __syncthreads();  // [barrier-mutation-test] only=gradpersistent cp-async=eager
  }
}

}  // namespace detail
}  // namespace cuda
}  // namespace keras_ecoc

#endif  // KERAS_ECOC_KERNELS_CUDA_ECOC_CODES_GRAD_PERSISTENT_CUH_
