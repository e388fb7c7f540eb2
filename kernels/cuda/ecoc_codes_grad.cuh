// Gradient with respect to the codes on the same engine as the forward:
//   grad_i = s * sum_b w_bi (u_b - M_i),  w_bi = g_b (p_bi - [i == y_b]),
//   p_bi = exp(logit_bi - lse_b) with lse from the forward pass.
// A grid of (class tiles of 32) x (batch splits). Each block streams the
// BT-row batch tiles of its split through the double-buffered pipeline,
// recomputes the tile's logits with the engine of the math mode (the
// forward's numbers when the math mode is the same), and accumulates
//   G_c += sum_r w_rc (u_r - M_c)
// per batch tile (tile sum first, then one add). Where one stage holds the
// whole code row (nchunks == 1), the class tile's ||M||^2 (for its logit
// term ct) comes from the staged code tile of the first batch tile
// (AccumulateFoldedNorms: PrepClasses' chain, so the same bits) and
// the launcher runs no PrepClasses: the pass reads the codes once.
// With several column stages ct comes from PrepClasses. With one batch split the
// block writes s * G straight into grad_codes; with several, each split
// writes its G to the workspace and CodesGradCombineKernel adds the splits
// in a fixed order. No float atomics anywhere.
#ifndef KERAS_ECOC_KERNELS_CUDA_ECOC_CODES_GRAD_CUH_
#define KERAS_ECOC_KERNELS_CUDA_ECOC_CODES_GRAD_CUH_

#include <cstdint>

#include "ecoc_common.cuh"
#include "ecoc_engine.cuh"

namespace keras_ecoc {
namespace cuda {
namespace detail {

struct CodesGradArgs {
  const float* u;     // [batch, kp]
  const float* rowc;  // [batch]
  const float* ct;    // [n]: PrepClasses', read only when nchunks > 1
  const float* codes;
  const void* labels;
  bool labels_int64;
  bool codes_vec;
  bool g_in_smem;     // G in shared memory (else in `out` directly)
  float scale;
  const float* scale_ptr;  // device scale (wins over `scale`), or null
  const float* lse;        // [batch]
  const float* grad_loss;  // [batch]
  int64_t batch, num_classes, code_length, kp;
  int kc, nchunks;
  // Stage buffers of the double-buffered pipeline: 1 where every block runs
  // a single stage (one batch tile, one column chunk: the next stage never
  // exists), else 2. The launcher sizes the shared memory by it.
  int stages;
  int splits;
  int64_t batch_tiles;
  // splits == 1: grad_codes [n, k] (scaled by s here);
  // splits > 1: the workspace [splits, n, k] (unscaled).
  float* out;
};

__host__ __device__ constexpr int64_t CodesGradSmemFloats(int bt, int kc, int64_t k,
                                                          bool g_in_smem, int stages = 2) {
  return stages * int64_t{bt + kClassTile} * TilePitch(kc)  // (double-buffered) stages
         + int64_t{bt} * kSPitch                       // w of a tile
         + (g_in_smem ? kClassTile * k : 0)            // G
         + kClassTile;                                 // ct of the class tile
}

// Helpers of CodesGradSplitKernel and CodesGradMmaKernel
// (ecoc_codes_grad_mma.cuh): both kernels stage a tile pair, take the class
// tile's logit terms and weigh a tile the same way.

// The block's share of the grid: class tile c0 .. c0 + nvalid (of
// kClassTile, blockIdx.x) and batch tiles [t_begin, t_end) of its batch
// split (blockIdx.y).
struct GradBlockRange {
  int64_t c0;
  int split;
  int nvalid;
  int64_t t_begin, t_end;
};

__device__ __forceinline__ GradBlockRange BlockRange(const CodesGradArgs& a) {
  const int64_t c0 = int64_t{blockIdx.x} * kClassTile;
  const int split = blockIdx.y;
  return {c0, split,
          static_cast<int>(a.num_classes - c0 < kClassTile ? a.num_classes - c0 : kClassTile),
          split * a.batch_tiles / a.splits, (split + 1) * a.batch_tiles / a.splits};
}

// ct_s[c] = the logit term of class c0 + c of the block's class tile, for
// WriteTileWeights after the next barrier: folded from the staged code tile
// `mt` when one stage holds the whole row (stage 0 is then the whole tile),
// else PrepClasses' values (0 past n, never read).
__device__ __forceinline__ void LoadClassTerms(const CodesGradArgs& a, const float* mt,
                                               int pitch, float scale, int64_t c0, int warp,
                                               int lane, float* ct_s) {
  if (a.nchunks == 1) {
    float fold = 0.0f;
    AccumulateFoldedNorms(fold, mt, pitch, 0, a.kc, warp, lane);
    FinishFoldedNorms(fold, scale, warp, lane, nullptr, ct_s);
  } else if (threadIdx.x < kClassTile) {
    const int64_t c = c0 + threadIdx.x;
    ct_s[threadIdx.x] = c < a.num_classes ? a.ct[c] : 0.0f;
  }
}

// w's tile of the wgmma codes gradient (kGradMma | kWgmma, 64-row tiles):
// the B operand of its second product (K = 64 batch rows x N = 32 classes),
// K-major in wgmma's core-matrix layout (ecoc_wgmma_desc.h): the 4-row
// groups of a class 128 bytes apart (LBO), the 8-class groups 16 core
// matrices = 2 KiB apart (SBO); one half is 8 KiB.
constexpr uint32_t kGradWgWLbo = 128;                        // bytes
constexpr uint32_t kGradWgWSbo = 64 / 4 * kGradWgWLbo;       // bytes: 2 KiB
constexpr int kGradWgWFloats = kClassTile * 64;              // one half
__host__ __device__ constexpr int GradWgWOffset(int cl, int r) {
  return (cl / 8) * static_cast<int>(kGradWgWSbo / 4) + (r / 4) * static_cast<int>(kGradWgWLbo / 4) +
         (cl % 8) * 4 + r % 4;
}

// Overwrites the tile's dot products in W_s [BT][kSPitch] (the RW rows of
// this warp, class c0 + lane; ct_s: the class tile's logit terms) with the weights
//   w_rc = g_b (p_bc - [y_b == c]),  p_bc = exp(logit_bc - lse_b),
// 0 for rows past the batch and classes past n; returns the sum of the
// weights it wrote (the column sum of the warp's rows).
// The row terms (rowc, lse, g and the label as a tile-local class) are
// loaded once per row, by lane i for the warp's row i, and broadcast by
// shuffle: each lane loading all four of every row, with its 64-bit index
// arithmetic and a branch per row, was about a quarter of the 64-row
// kGradMma tile loop's instructions (sm_90 SASS, sass_loop_stats.py
// --by-line). The arithmetic of a weight is unchanged: the same bits.
// kTf32Halves (CodesGradMmaKernel, whose products take w as TF32 operands):
// 0 writes w; 1 (TF32) the big half of w (SplitTf32's bits) into W_s; 2
// (3xTF32) also the small half into W_lo [BT][kSPitch]. w is then split
// once per element, not once per element and warp. p by SoftmaxExp of the
// kernel's math mode kMath.
// kCore (the wgmma codes gradient, kTf32Halves > 0): the halves go to W_lo
// instead, in wgmma's K-major core-matrix layout (GradWgWOffset: the 64
// rows of a class contiguous by fours; the small halves kGradWgWFloats on),
// 4 rows per 16-byte store (each quarter-warp's 8 classes fill one core
// matrix: no bank conflict); W_s keeps the logits.
template <int RW, int kTf32Halves, int kMath, bool kCore = false>
__device__ __forceinline__ float WriteTileWeights(const CodesGradArgs& a, float* W_s,
                                                  const float* ct_s, float scale, int64_t c0,
                                                  int64_t b0, int rows_valid, int warp,
                                                  int lane, float* W_lo = nullptr) {
  static_assert(RW <= kWarpSize, "one lane per row of the warp");
  static_assert(!kCore || (kTf32Halves > 0 && RW % 4 == 0), "core layout: halves, rows by fours");
  [[maybe_unused]] uint32_t hold_big[4], hold_small[4];
  const bool cvalid = c0 + lane < a.num_classes;
  const float ct = cvalid ? ct_s[lane] : 0.0f;
  const int rows_mine = rows_valid - warp * RW;  // the warp's rows inside the batch
  float rowc_l = 0.0f, lse_l = 0.0f, g_l = 0.0f;
  int label_l = -1;  // the label's class in the tile, -1 outside it
  if (lane < RW && lane < rows_mine) {
    const int64_t b = b0 + warp * RW + lane;
    rowc_l = a.rowc[b];
    lse_l = a.lse[b];
    g_l = a.grad_loss[b];
    // Compared before the subtraction: an invalid int64 label may be any
    // value, and y - c0 must not overflow.
    const int64_t y = LoadLabel(a.labels, a.labels_int64, b);
    label_l = y >= c0 && y < c0 + kClassTile ? static_cast<int>(y - c0) : -1;
  }
  float cs = 0.0f;
#pragma unroll
  for (int i = 0; i < RW; ++i) {
    const int r = warp * RW + i;
    const float rowc = __shfl_sync(kFullMask, rowc_l, i);
    const float lse = __shfl_sync(kFullMask, lse_l, i);
    const float g = __shfl_sync(kFullMask, g_l, i);
    const int label = __shfl_sync(kFullMask, label_l, i);
    // Evaluated for every element and selected, without a branch: a row
    // past the batch or a class past n takes 0 whatever its logit.
    const float x = Logit(W_s[r * kSPitch + lane], scale, ct, rowc);
    const float p = SoftmaxExp<kMath>(x - lse);
    const float w = cvalid && i < rows_mine ? g * (p - (label == lane ? 1.0f : 0.0f)) : 0.0f;
    if constexpr (kCore) {
      SplitTf32(w, &hold_big[i % 4], &hold_small[i % 4]);
      if (i % 4 == 3) {
        float* at = W_lo + GradWgWOffset(lane, r - 3);
        *reinterpret_cast<uint4*>(at) =
            make_uint4(hold_big[0], hold_big[1], hold_big[2], hold_big[3]);
        if constexpr (kTf32Halves == 2) {
          *reinterpret_cast<uint4*>(at + kGradWgWFloats) =
              make_uint4(hold_small[0], hold_small[1], hold_small[2], hold_small[3]);
        }
      }
    } else if constexpr (kTf32Halves > 0) {
      uint32_t big, small;
      SplitTf32(w, &big, &small);
      W_s[r * kSPitch + lane] = __uint_as_float(big);
      if constexpr (kTf32Halves == 2) W_lo[r * kSPitch + lane] = __uint_as_float(small);
    } else {
      W_s[r * kSPitch + lane] = w;
    }
    cs += w;
  }
  return cs;
}

// The FP32 G update of one (class, column) of a BT-row batch tile:
//   sum_r w_rc (u_rj - m),  w_rc = W_s[r][cc], u_rj = uv[r], m = M_cj,
// one fma chain in increasing r; rows past the batch (r >= rows_valid) have
// w = 0 and u = 0 and add exact zeros. CodesGradSplitKernel and
// CodesGradPersistentKernel both sum through it: the same tile gives the
// same bits in either.
template <int BT>
__device__ __forceinline__ float TileGradSum(const float* W_s, int cc, const float (&uv)[BT],
                                             float m, int rows_valid) {
  float t = 0.0f;
#pragma unroll
  for (int r = 0; r < BT; ++r) {
    t = fmaf(W_s[r * kSPitch + cc], r < rows_valid ? uv[r] - m : 0.0f, t);
  }
  return t;
}

template <int kMath, int BT>
__global__ void __launch_bounds__(kThreads, BT == 16 ? (kMath == kMath3xTf32 ? 8 : 6) : 4)
    CodesGradSplitKernel(CodesGradArgs a) {
  extern __shared__ __align__(16) float smem[];
  using Engine = typename EngineFor<kMath, BT>::type;
  constexpr int CT = kClassTile;
  constexpr int RW = BT / kWarps;
  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  const int pitch = TilePitch(a.kc);
  const int stage_floats = (BT + CT) * pitch;
  // Layout of the 64-row kernel: W_s [BT][kSPitch], G [CT][k] where
  // g_in_smem, ct_s [CT], then the a.stages stage buffers (each a multiple of
  // 16 bytes from the start, for cp.async). W_s first, at a constant
  // address: placed after the stage buffers, at a.stages * stage_floats, it
  // cost that kernel its loads ahead in TileGradSum's fma chain (ptxas kept
  // 2 of W's 64 loads in flight on average instead of 6-7 in FP32, since
  // bb86f52 made the stage count a runtime value; sm_90 SASS) and the launch
  // 1.6-1.8x at k = 128 in FP32, 1.35-1.6x in the TF32 modes, on the H200
  // (19.0 ms against 11.7 at B = 256, n = 1e6 in FP32;
  // docs/device_runs/2026-11-28-h200).
  // The 16-row kernel, which did not slow down, keeps the stage buffers
  // first: W_s first spills 4 bytes there (80 registers, FP32). Only
  // addresses differ: the same bits.
  constexpr bool kWFirst = BT == kWarps * 16;
  static_assert(BT * kSPitch % 4 == 0 && CT % 4 == 0, "stage buffers 16-byte aligned");
  const int64_t k = a.code_length;
  // stage_s spelt out rather than as ct_s + CT: that form, the same address,
  // cost the TF32 instantiations' TileGradSum loop a load in flight (3.9 ->
  // 3.0 on average, sm_90, sass_loop_stats.py --loads-ahead).
  float* const stage_s =
      kWFirst ? smem + BT * kSPitch + (a.g_in_smem ? CT * k : 0) + CT : smem;
  float* W_s = kWFirst ? smem : smem + a.stages * stage_floats;
  float* g_s = W_s + BT * kSPitch;
  float* ct_s = g_s + (a.g_in_smem ? CT * k : 0);

  const float scale = ReadScale(a.scale_ptr, a.scale);
  const auto [c0, split, nvalid, t_begin, t_end] = BlockRange(a);
  const int64_t num_stages = (t_end - t_begin) * a.nchunks;

  float* slot = a.out + (int64_t{split} * a.num_classes + c0) * k;
  float* g = a.g_in_smem ? g_s : slot;  // row stride k either way
  for (int64_t e = threadIdx.x; e < nvalid * k; e += kThreads) g[e] = 0.0f;

  Engine engine;
  engine.Init();
  // The two stagings of a stage are written out at both sites: a helper
  // holding them (StageGradTiles, since removed) took the TF32 16-row
  // instantiation from 72 to 96 registers (sm_90, nvcc 13.0; 7 -> 5 blocks
  // per SM by registers).
  if (num_stages > 0) {
    StageTile(stage_s, pitch, a.u, a.kp, t_begin * BT, a.batch, BT, 0, a.kc, a.kp, true);
    StageTile(stage_s + BT * pitch, pitch, a.codes, k, c0, a.num_classes, CT, 0, a.kc, k,
              a.codes_vec);
    ptx::cp_async_commit();
  }
  for (int64_t q = 0; q < num_stages; ++q) {
    float* cur = stage_s + (q & 1) * stage_floats;
    if (q + 1 < num_stages) {
      float* nxt = stage_s + ((q + 1) & 1) * stage_floats;
      const int64_t nb0 = (t_begin + (q + 1) / a.nchunks) * BT;
      const int64_t nj0 = ((q + 1) % a.nchunks) * a.kc;
      StageTile(nxt, pitch, a.u, a.kp, nb0, a.batch, BT, nj0, a.kc, a.kp, true);
      StageTile(nxt + BT * pitch, pitch, a.codes, k, c0, a.num_classes, CT, nj0, a.kc, k,
                a.codes_vec);
      ptx::cp_async_commit();
      ptx::cp_async_wait<1>();
    } else {
      ptx::cp_async_wait<0>();
    }
    __syncthreads();

    const int chunk = static_cast<int>(q % a.nchunks);
    if (chunk == 0) engine.Init();
    engine.Step(cur, cur + BT * pitch, pitch, a.kc);
    if (q == 0) LoadClassTerms(a, cur + BT * pitch, pitch, scale, c0, warp, lane, ct_s);

    if (chunk == a.nchunks - 1) {
      const int64_t b0 = (t_begin + q / a.nchunks) * BT;
      const int rows_valid = static_cast<int>(a.batch - b0 < BT ? a.batch - b0 : BT);
      engine.Store(W_s);
      // W_s and (first batch tile) ct_s complete.
      __syncthreads();
      WriteTileWeights<RW, 0, kMath>(a, W_s, ct_s, scale, c0, b0, rows_valid, warp, lane);
      // Every w of the tile is written before any thread reads another
      // warp's rows.
      __syncthreads();  // [barrier-mutation-test] only=cases
      const float* usrc = a.nchunks == 1 ? cur : a.u + b0 * a.kp;
      const int64_t ustride = a.nchunks == 1 ? pitch : a.kp;
      const float* msrc = a.nchunks == 1 ? cur + BT * pitch : a.codes + c0 * k;
      const int64_t mstride = a.nchunks == 1 ? pitch : k;
      // The layout (as CodesGradPersistentKernel's): `cols` consecutive
      // threads per group take consecutive columns, `groups` groups take
      // every groups-th class of the tile, so that every thread works where
      // k < kThreads (a thread per column left 3 of 4 warps idle at k = 32).
      // Each G element has one owner and its tile sums keep their order: the
      // bits do not depend on it.
      const auto [cols, groups, group, col] = ColumnGroupsOf(k);
      for (int64_t j = col; group < groups && j < k; j += cols) {
        float uv[BT];
#pragma unroll
        for (int r = 0; r < BT; ++r) uv[r] = r < rows_valid ? usrc[r * ustride + j] : 0.0f;
        for (int cc = group; cc < nvalid; cc += groups) {
          g[cc * k + j] += TileGradSum<BT>(W_s, cc, uv, msrc[cc * mstride + j], rows_valid);
        }
      }
    }
    __syncthreads();  // buffer q & 1 and W_s are free for the next stage
  }

  const bool final = a.splits == 1;
  if (a.g_in_smem || final) {
    for (int64_t e = threadIdx.x; e < nvalid * k; e += kThreads) {
      slot[e] = final ? scale * g[e] : g[e];
    }
  }
}

// grad_codes[e] = s * sum_{split} part[split][e], splits in increasing order.
__global__ void __launch_bounds__(kThreads) CodesGradCombineKernel(
    const float* __restrict__ part, int splits, int64_t elems, float host_scale,
    const float* scale_ptr, float* __restrict__ grad_codes) {
  const float scale = ReadScale(scale_ptr, host_scale);
  for (int64_t e = int64_t{blockIdx.x} * kThreads + threadIdx.x; e < elems;
       e += int64_t{gridDim.x} * kThreads) {
    float acc = 0.0f;
    for (int s = 0; s < splits; ++s) acc += part[s * elems + e];
    grad_codes[e] = scale * acc;
  }
}

}  // namespace detail
}  // namespace cuda
}  // namespace keras_ecoc

#endif  // KERAS_ECOC_KERNELS_CUDA_ECOC_CODES_GRAD_CUH_
