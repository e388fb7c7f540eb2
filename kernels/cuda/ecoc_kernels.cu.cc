// CUDA implementation of the fused ECOC kernels declared in ecoc_kernels.h.
//
// Compiled by nvcc alone (no TensorFlow headers), so the same object serves
// the TensorFlow GPU OpKernels (kernels/ecoc_ops_gpu.cc) and the stand-alone
// harness (kernels/cuda/harness.cu).
//
// Design (see kernels/cuda/README.md for the longer version)
// ------------------------------------------------------------
// Nothing here allocates memory: the contract has no workspace argument, and
// a cudaMallocAsync next to TensorFlow's BFC allocator (which by default has
// already reserved nearly all device memory) would fail exactly where the op
// is used.  So per-row quantities (u_b, ||M_i||^2) are recomputed on chip and
// never stored in global memory, and no [batch, num_classes] buffer exists.
//
// * Row-streaming kernel (forward, label rank, nearest codeword): a block owns
//   R = 4 warps x RPW rows of the batch.  Their normalized rows u_b live in
//   shared memory for the whole kernel.  The block then streams the code
//   matrix in tiles of 32 classes (one class per lane), staging each tile in
//   shared memory in column chunks of at most 128 so that long codes do not
//   need a 32 x k buffer.  Every lane accumulates the squared distance from
//   "its" class to each of the warp's RPW rows, so each code element loaded
//   from global memory is reused by all R rows of the block.  Distances are
//   computed as sum_j (M_ij - u_bj)^2 directly (not ||M||^2 - 2 u.M + ||u||^2),
//   which cannot cancel catastrophically for nearby codewords.
//   The forward pass folds each tile into a running (max, sum, expected code,
//   expected squared norm) per row with the flash-attention rescaling, so the
//   softmax never exists in memory.
// * Class-streaming kernel (codes gradient): the same structure with the roles
//   swapped.  A block owns 4 warps x CPW classes (their codes and gradient
//   accumulators in shared memory) and streams the batch in tiles of 32 rows
//   (one row per lane), recomputing u_b and logit_bi and taking p_bi from the
//   forward pass's lse_b.  Each class row of grad_codes is written by exactly
//   one block, so there are no atomics and the result is deterministic.
//
// Invariants the kernels rely on
// * The distance of (b, i) is always produced by the same instruction
//   sequence (sequential over j, explicit __fsub_rn/__fmaf_rn so the compiler
//   cannot contract or reorder differently in different places), whether it is
//   the label distance computed up front or the one computed inside a tile.
//   This keeps "logit_bi > logit_{b,y_b}" exact for i == y_b (the label never
//   outranks itself), makes bit-identical codewords tie exactly, and gives
//   the gradient kernel the forward kernel's distances bit for bit (u_b goes
//   through one shared norm helper too).
// * Warp reductions use the xor butterfly: IEEE addition is commutative, so
//   every lane ends with bit-identical sums and the per-row running state is
//   uniform across the warp without an extra broadcast.
// * All lanes of a warp always run the same loops (rows past the end of the
//   batch and classes past num_classes are computed on zeros and masked only
//   at the store), so full-mask shuffles and block barriers are always legal.
#include "ecoc_kernels.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>

namespace keras_ecoc {
namespace cuda {
namespace {

constexpr int kWarpSize = 32;
// 4 warps per block: small blocks give more of them for modest batches (the
// forward pass parallelizes over rows only).  Kernels are declared with
// __launch_bounds__(kThreads, 1): without the explicit minimum nvcc 13 capped
// them at 64 registers and spilled the per-row state.
constexpr int kWarpsPerBlock = 4;
constexpr int kThreads = kWarpSize * kWarpsPerBlock;
// Streamed items per tile: one class (row-streaming) or one batch row
// (class-streaming) per lane.
constexpr int kTile = 32;
// Widest column chunk of a staged tile.  32 x 129 floats = 16.5 KiB.
constexpr int kMaxChunk = 128;
constexpr unsigned kFullMask = 0xffffffffu;

// ---------------------------------------------------------------------------
// Small device helpers.

template <typename T>
__device__ __forceinline__ float ToFloat(T v);
template <>
__device__ __forceinline__ float ToFloat<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ float ToFloat<__half>(__half v) {
  return __half2float(v);
}
template <>
__device__ __forceinline__ float ToFloat<__nv_bfloat16>(__nv_bfloat16 v) {
  return __bfloat162float(v);
}

__device__ __forceinline__ float WarpSum(float v) {
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset >>= 1) {
    v += __shfl_xor_sync(kFullMask, v, offset);
  }
  return v;
}

__device__ __forceinline__ long long WarpSumInt(long long v) {
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset >>= 1) {
    v += __shfl_xor_sync(kFullMask, v, offset);
  }
  return v;
}

// max() that returns NaN when either argument is NaN.  fmaxf() returns the
// other argument instead, which would silently drop a NaN logit from the
// log-sum-exp.
__device__ __forceinline__ float NanMax(float a, float b) {
  return (a > b || a != a) ? a : b;
}

__device__ __forceinline__ float WarpNanMax(float v) {
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset >>= 1) {
    v = NanMax(v, __shfl_xor_sync(kFullMask, v, offset));
  }
  return v;
}

// exp(a - b) with exp(-inf - b) = 0 even when b is -inf too, so that a row
// whose running max is still -inf (nothing seen yet, or masked lanes) does
// not produce exp(-inf + inf) = NaN.  NaN in a or b still gives NaN.
__device__ __forceinline__ float ExpDiff(float a, float b) {
  return a == -INFINITY ? 0.0f : expf(a - b);
}

// One step of the squared distance.  Every distance in this file goes
// through here, in increasing j, so identical inputs give identical bits.
__device__ __forceinline__ float SqDistStep(float m, float u, float acc) {
  const float diff = __fsub_rn(m, u);
  return __fmaf_rn(diff, diff, acc);
}

// 1 / ||z_b|| as used by every kernel: float32 sum of squares with the lane
// partial sums combined by the butterfly, then 1/sqrt(max(ss, eps)).  The
// forward and gradient kernels both call this, so they see identical u_b.
// Lanes read z_b[lane], z_b[lane + 32], ...: coalesced.
template <typename ZT>
__device__ __forceinline__ float RowInvNorm(const ZT* z_row, int k,
                                            float epsilon, int lane) {
  float ss = 0.0f;
  for (int j = lane; j < k; j += kWarpSize) {
    const float v = ToFloat(z_row[j]);
    ss = __fmaf_rn(v, v, ss);
  }
  ss = WarpSum(ss);
  return 1.0f / sqrtf(fmaxf(ss, epsilon));
}

// Labels are read once per row (per batch tile in the gradient), so their
// width is a run-time flag rather than a template parameter: half the kernel
// instantiations, same speed.
__device__ __forceinline__ int64_t LoadLabel(const void* labels,
                                             bool labels_int64, int64_t b) {
  return labels_int64 ? static_cast<const int64_t*>(labels)[b]
                      : static_cast<int64_t>(static_cast<const int32_t*>(labels)[b]);
}

// Stages codes[c0 + c, j0 : j0 + width) for c < kTile into tile[c * pitch + j]
// (zeros for classes past num_classes).  Warp w copies rows w, w + 4, ...,
// lanes along the row: every global read is a contiguous 128-byte segment.
// If sqnorm is given, adds each row's partial squared norm to sqnorm[c]
// (first chunk: overwrites).
__device__ __forceinline__ void StageCodeTile(const float* codes,
                                              int64_t num_classes,
                                              int64_t code_length, int64_t c0,
                                              int j0, int width, int pitch,
                                              float* tile, float* sqnorm,
                                              int warp, int lane) {
  for (int c = warp; c < kTile; c += kWarpsPerBlock) {
    const bool valid = c0 + c < num_classes;
    const float* src = valid ? codes + (c0 + c) * code_length + j0 : codes;
    float ss = 0.0f;
    for (int j = lane; j < width; j += kWarpSize) {
      const float v = valid ? src[j] : 0.0f;
      tile[c * pitch + j] = v;
      ss = fmaf(v, v, ss);
    }
    if (sqnorm != nullptr) {
      ss = WarpSum(ss);
      if (lane == 0) sqnorm[c] = (j0 == 0 ? 0.0f : sqnorm[c]) + ss;
    }
  }
}

// ---------------------------------------------------------------------------
// Row-streaming kernel: forward, label rank and nearest codeword.

enum class RowMode { kForward, kRank, kNearest };

struct RowArgs {
  const void* z;
  const float* codes;
  const void* labels;
  bool labels_int64;
  float scale;
  float epsilon;
  int64_t batch;
  int64_t num_classes;
  int64_t code_length;
  int chunk;  // columns per staged chunk, min(code_length, kMaxChunk) >= 1
  // kForward
  float* loss;
  float* lse;
  float* expected_code;
  float* expected_sqnorm;
  // kRank
  int32_t* rank;
  // kNearest
  int64_t* index;
};

__host__ __device__ constexpr int Pitch(int chunk) {
  // Odd row pitch: lane c reading tile[c * pitch + j] for a fixed j hits 32
  // different banks.
  return chunk | 1;
}

// Shared-memory floats used by RowStreamKernel, in layout order.
__host__ __device__ constexpr int64_t RowSmemFloats(RowMode mode, int rpw,
                                                    int64_t k, int chunk) {
  const int64_t rows = int64_t{kWarpsPerBlock} * rpw;
  const bool fwd = mode == RowMode::kForward;
  return rows * k                         // u
         + (fwd ? rows * k : 0)           // expected-code accumulators
         + (fwd ? rows * kTile : 0)       // p of the current tile
         + int64_t{kTile} * Pitch(chunk)  // code tile chunk
         + kTile;                         // ||M_c||^2 of the tile
}

template <RowMode kMode, typename ZT, int RPW>
__global__ void __launch_bounds__(kThreads, 1) RowStreamKernel(RowArgs a) {
  extern __shared__ float smem[];
  constexpr bool kFwd = kMode == RowMode::kForward;
  constexpr int R = kWarpsPerBlock * RPW;
  const int k = static_cast<int>(a.code_length);  // host checked: fits smem
  const int chunk = a.chunk;
  const int pitch = Pitch(chunk);
  float* u_s = smem;                              // [R][k]
  float* acc_s = u_s + R * k;                     // [R][k]      (forward)
  float* p_s = acc_s + (kFwd ? R * k : 0);        // [R][kTile]  (forward)
  float* tile_s = p_s + (kFwd ? R * kTile : 0);   // [kTile][pitch]
  float* sqn_s = tile_s + kTile * pitch;          // [kTile]

  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  const ZT* z = static_cast<const ZT*>(a.z);
  const float neg_half_scale = -0.5f * a.scale;
  // Only reached when code_length == 0 (no chunk is ever staged); otherwise
  // the first chunk of every tile overwrites it.
  if (threadIdx.x < kTile) sqn_s[threadIdx.x] = 0.0f;
  __syncthreads();

  const int64_t num_row_tiles = (a.batch + R - 1) / R;
  for (int64_t row_tile = blockIdx.x; row_tile < num_row_tiles;
       row_tile += gridDim.x) {
    const int64_t row0 = row_tile * R + int64_t{warp} * RPW;
    __syncwarp();  // the previous row tile's reads of u_s are done

    // Per-row running state.  Identical in every lane of the warp (butterfly
    // reductions), kept in registers: all loops over t are unrolled.
    float label_dist[RPW], label_logit[RPW];
    float run_max[RPW], run_sum[RPW], run_sqn[RPW], alpha[RPW];
    long long count[RPW];
    float best_dist[RPW];
    int64_t best_index[RPW];
    bool label_ok[RPW];
    bool nonfinite[RPW];  // rank/nearest: a non-finite distance in this row

    // Prologue: u_b = z_b / max(||z_b||, sqrt(eps)) for this warp's rows.
#pragma unroll
    for (int t = 0; t < RPW; ++t) {
      const int64_t b = row0 + t;
      float* u = u_s + (warp * RPW + t) * k;
      if (b < a.batch) {
        const ZT* z_row = z + b * a.code_length;
        const float inv = RowInvNorm(z_row, k, a.epsilon, lane);
        for (int j = lane; j < k; j += kWarpSize) {
          u[j] = ToFloat(z_row[j]) * inv;
        }
      } else {
        for (int j = lane; j < k; j += kWarpSize) u[j] = 0.0f;
      }
      if (kFwd) {
        for (int j = lane; j < k; j += kWarpSize) acc_s[(warp * RPW + t) * k + j] = 0.0f;
      }
      run_max[t] = -INFINITY;
      run_sum[t] = 0.0f;
      run_sqn[t] = 0.0f;
      alpha[t] = 0.0f;
      count[t] = 0;
      best_dist[t] = INFINITY;
      best_index[t] = -1;
      label_dist[t] = 0.0f;
      label_logit[t] = 0.0f;
      label_ok[t] = false;
      nonfinite[t] = false;
    }
    __syncwarp();

    // Label distance, with the same instruction sequence as the tile loop
    // below (every lane computes it; the reads are broadcasts).
    if (kMode != RowMode::kNearest) {
#pragma unroll
      for (int t = 0; t < RPW; ++t) {
        const int64_t b = row0 + t;
        if (b < a.batch) {
          const int64_t y = LoadLabel(a.labels, a.labels_int64, b);
          // The caller validated the labels; an out-of-range one gives NaN
          // rather than an out-of-bounds read.
          label_ok[t] = y >= 0 && y < a.num_classes;
          if (label_ok[t]) {
            const float* m = a.codes + y * a.code_length;
            const float* u = u_s + (warp * RPW + t) * k;
            float d = 0.0f;
            for (int j = 0; j < k; ++j) d = SqDistStep(m[j], u[j], d);
            label_dist[t] = d;
            label_logit[t] = neg_half_scale * d;
          }
        }
      }
    }

    // Stream the classes, 32 per tile, one per lane.
    for (int64_t c0 = 0; c0 < a.num_classes; c0 += kTile) {
      const int64_t my_class = c0 + lane;
      const bool class_ok = my_class < a.num_classes;
      float dist[RPW];
#pragma unroll
      for (int t = 0; t < RPW; ++t) dist[t] = 0.0f;

      int last_j0 = 0;
      for (int j0 = 0; j0 < k; j0 += chunk) {
        const int width = min(chunk, k - j0);
        last_j0 = j0;
        __syncthreads();  // everyone is done with the previous chunk
        StageCodeTile(a.codes, a.num_classes, a.code_length, c0, j0, width,
                      pitch, tile_s, kFwd ? sqn_s : nullptr, warp, lane);
        __syncthreads();
        const float* m = tile_s + lane * pitch;
        for (int j = 0; j < width; ++j) {
          const float mv = m[j];
#pragma unroll
          for (int t = 0; t < RPW; ++t) {
            // Broadcast read: all lanes want the same u element.
            dist[t] = SqDistStep(mv, u_s[(warp * RPW + t) * k + j0 + j], dist[t]);
          }
        }
      }

      if (kFwd) {
        // Online softmax: fold this tile into the running state of each row.
#pragma unroll
        for (int t = 0; t < RPW; ++t) {
          const float x = class_ok ? neg_half_scale * dist[t] : -INFINITY;
          const float new_max = NanMax(run_max[t], WarpNanMax(x));
          alpha[t] = ExpDiff(run_max[t], new_max);
          const float p = ExpDiff(x, new_max);
          run_sum[t] = run_sum[t] * alpha[t] + WarpSum(p);
          run_sqn[t] = run_sqn[t] * alpha[t] + WarpSum(p * sqn_s[lane]);
          run_max[t] = new_max;
          p_s[(warp * RPW + t) * kTile + lane] = p;
        }
        __syncwarp();
        // acc_b = alpha_b * acc_b + sum_c p_bc M_c, lanes along j.  The chunks
        // go in reverse so that the chunk still staged is used first; each
        // element is rescaled exactly once per tile.
        const int num_valid = static_cast<int>(
            a.num_classes - c0 < kTile ? a.num_classes - c0 : kTile);
        for (int j0 = last_j0; j0 >= 0 && k > 0; j0 -= chunk) {
          const int width = min(chunk, k - j0);
          if (j0 != last_j0) {
            __syncthreads();
            StageCodeTile(a.codes, a.num_classes, a.code_length, c0, j0,
                          width, pitch, tile_s, nullptr, warp, lane);
            __syncthreads();
          }
          for (int j = lane; j < width; j += kWarpSize) {
            // This tile's sum_c p_c M_c first, then one rescale-and-add into
            // the running sum (as the CPU kernel does): one rounding of the
            // running sum per tile, not per class. Folding each class into
            // the running sum gave 1e-3 relative error at n = 10^6 on an
            // H200 (device_check grid, k = 1).
            float acc[RPW];
#pragma unroll
            for (int t = 0; t < RPW; ++t) acc[t] = 0.0f;
            for (int c = 0; c < num_valid; ++c) {
              const float mv = tile_s[c * pitch + j];  // consecutive j: no conflicts
#pragma unroll
              for (int t = 0; t < RPW; ++t) {
                acc[t] = fmaf(p_s[(warp * RPW + t) * kTile + c], mv, acc[t]);
              }
            }
#pragma unroll
            for (int t = 0; t < RPW; ++t) {
              float* run = acc_s + (warp * RPW + t) * k + j0 + j;
              *run = fmaf(*run, alpha[t], acc[t]);
            }
          }
        }
      } else if (kMode == RowMode::kRank) {
        // logit_bi > logit_by  <=>  dist_bi < dist_by (scale > 0).  A NaN
        // distance compares false and is not counted.
#pragma unroll
        for (int t = 0; t < RPW; ++t) {
          count[t] += (class_ok && dist[t] < label_dist[t]) ? 1 : 0;
          nonfinite[t] = nonfinite[t] || (class_ok && !isfinite(dist[t]));
        }
      } else {
        // Each lane sees its classes in increasing order, so a strict "<"
        // keeps the smallest index among equal distances.  NaN never wins.
#pragma unroll
        for (int t = 0; t < RPW; ++t) {
          const float d = dist[t];
          nonfinite[t] = nonfinite[t] || (class_ok && !isfinite(d));
          const bool take = class_ok && (best_index[t] < 0 ? !(d != d)
                                                           : d < best_dist[t]);
          if (take) {
            best_dist[t] = d;
            best_index[t] = my_class;
          }
        }
      }
    }

    // Epilogue: write this warp's rows.
#pragma unroll
    for (int t = 0; t < RPW; ++t) {
      const int64_t b = row0 + t;
      if (kMode == RowMode::kForward) {
        if (b < a.batch) {
          const float lse = run_max[t] + logf(run_sum[t]);
          const float inv_sum = 1.0f / run_sum[t];
          if (lane == 0) {
            a.lse[b] = lse;
            a.loss[b] = label_ok[t] ? lse - label_logit[t] : NAN;
            a.expected_sqnorm[b] = run_sqn[t] * inv_sum;
          }
          const float* acc = acc_s + (warp * RPW + t) * k;
          float* out = a.expected_code + b * a.code_length;
          for (int j = lane; j < k; j += kWarpSize) out[j] = acc[j] * inv_sum;
        }
      } else if (kMode == RowMode::kRank) {
        const long long total = WarpSumInt(count[t]);
        // Non-finite z or codeword: never a hit (rank n), as on the CPU.
        const bool row_bad = __any_sync(kFullMask, nonfinite[t]);
        if (b < a.batch && lane == 0) {
          // A NaN label distance (NaN in z) ranks last, as on the CPU.
          const long long worst =
              a.num_classes < INT_MAX ? a.num_classes : INT_MAX;
          a.rank[b] = !label_ok[t]                   ? -1
                      : (row_bad || label_dist[t] != label_dist[t])
                          ? static_cast<int32_t>(worst)
                                                       : static_cast<int32_t>(total);
        }
      } else {
        float d = best_dist[t];
        int64_t i = best_index[t];
        // Non-finite z or codeword: no valid class (-1), as on the CPU.
        const bool row_bad = __any_sync(kFullMask, nonfinite[t]);
#pragma unroll
        for (int offset = kWarpSize / 2; offset > 0; offset >>= 1) {
          const float od = __shfl_xor_sync(kFullMask, d, offset);
          const long long oi = __shfl_xor_sync(
              kFullMask, static_cast<long long>(i), offset);
          // Total order: "no candidate" (-1) last, then distance, then index.
          // Symmetric, so every lane ends with the same winner.
          const bool other_better =
              oi >= 0 && (i < 0 || od < d || (od == d && oi < i));
          if (other_better) {
            d = od;
            i = oi;
          }
        }
        if (b < a.batch && lane == 0) a.index[b] = (row_bad || i < 0) ? -1 : i;
      }
    }
  }
}

// ---------------------------------------------------------------------------
// Class-streaming kernel: gradient with respect to the codes.

struct GradArgs {
  const void* z;
  const float* codes;
  const void* labels;
  bool labels_int64;
  const float* lse;
  const float* grad_loss;
  float scale;
  float epsilon;
  int64_t batch;
  int64_t num_classes;
  int64_t code_length;
  int chunk;
  float* grad_codes;
};

__host__ __device__ constexpr int64_t GradSmemFloats(int cpw, int64_t k,
                                                     int chunk) {
  const int64_t classes = int64_t{kWarpsPerBlock} * cpw;
  return classes * k                      // own codes
         + classes * k                    // gradient accumulators
         + classes * kTile                // weights w_bi of the current tile
         + int64_t{kTile} * Pitch(chunk)  // u chunk of the batch tile
         + kTile;                         // 1/||z_b|| of the batch tile
}

// Stages u[b0 + r, j0 : j0 + width) = z[...] * inv_norm[r] for r < kTile into
// tile[r * pitch + j] (zeros past the end of the batch), with the same
// product as the forward kernel's prologue.  Coalesced like StageCodeTile.
template <typename ZT>
__device__ __forceinline__ void StageBatchTile(const ZT* z, int64_t code_length,
                                               int64_t b0, int rows, int j0,
                                               int width, int pitch,
                                               const float* inv_norm,
                                               float* tile, int warp, int lane) {
  for (int r = warp; r < kTile; r += kWarpsPerBlock) {
    const bool valid = r < rows;
    const ZT* src = valid ? z + (b0 + r) * code_length + j0 : z;
    for (int j = lane; j < width; j += kWarpSize) {
      tile[r * pitch + j] = valid ? ToFloat(src[j]) * inv_norm[r] : 0.0f;
    }
  }
}

template <typename ZT, int CPW>
__global__ void __launch_bounds__(kThreads, 1) ClassStreamKernel(GradArgs a) {
  extern __shared__ float smem[];
  constexpr int C = kWarpsPerBlock * CPW;
  const int k = static_cast<int>(a.code_length);
  const int chunk = a.chunk;
  const int pitch = Pitch(chunk);
  float* m_s = smem;                 // [C][k]
  float* g_s = m_s + C * k;          // [C][k]
  float* w_s = g_s + C * k;          // [C][kTile]
  float* u_s = w_s + C * kTile;      // [kTile][pitch]
  float* inv_s = u_s + kTile * pitch;  // [kTile]

  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  const ZT* z = static_cast<const ZT*>(a.z);
  const float neg_half_scale = -0.5f * a.scale;

  const int64_t num_class_tiles = (a.num_classes + C - 1) / C;
  for (int64_t class_tile = blockIdx.x; class_tile < num_class_tiles;
       class_tile += gridDim.x) {
    const int64_t cls0 = class_tile * C + int64_t{warp} * CPW;

    // Prologue: this warp's codes and zeroed accumulators (warp-private).
#pragma unroll
    for (int t = 0; t < CPW; ++t) {
      const int64_t i = cls0 + t;
      float* m = m_s + (warp * CPW + t) * k;
      float* g = g_s + (warp * CPW + t) * k;
      const float* src = i < a.num_classes ? a.codes + i * a.code_length : a.codes;
      for (int j = lane; j < k; j += kWarpSize) {
        m[j] = i < a.num_classes ? src[j] : 0.0f;
        g[j] = 0.0f;
      }
    }
    __syncwarp();

    // Stream the batch, 32 rows per tile, one per lane.
    for (int64_t b0 = 0; b0 < a.batch; b0 += kTile) {
      const int rows =
          static_cast<int>(a.batch - b0 < kTile ? a.batch - b0 : kTile);
      const int64_t b = b0 + lane;
      const bool row_ok = lane < rows;

      __syncthreads();  // everyone is done with the previous batch tile
      for (int r = warp; r < kTile; r += kWarpsPerBlock) {
        // Same function as the forward kernel: identical u_b.
        const float inv = r < rows ? RowInvNorm(z + (b0 + r) * a.code_length,
                                                k, a.epsilon, lane)
                                   : 0.0f;
        if (lane == 0) inv_s[r] = inv;
      }
      float lse_b = 0.0f, g_b = 0.0f;
      int64_t y_b = -1;
      if (row_ok) {
        lse_b = a.lse[b];
        g_b = a.grad_loss[b];
        y_b = LoadLabel(a.labels, a.labels_int64, b);
      }

      float dist[CPW];
#pragma unroll
      for (int t = 0; t < CPW; ++t) dist[t] = 0.0f;
      int last_j0 = 0;
      for (int j0 = 0; j0 < k; j0 += chunk) {
        const int width = min(chunk, k - j0);
        last_j0 = j0;
        __syncthreads();  // inv_s written / previous chunk consumed
        StageBatchTile(z, a.code_length, b0, rows, j0, width, pitch, inv_s,
                       u_s, warp, lane);
        __syncthreads();
        const float* u = u_s + lane * pitch;
        for (int j = 0; j < width; ++j) {
          const float uv = u[j];
#pragma unroll
          for (int t = 0; t < CPW; ++t) {
            // Broadcast read of the warp's own code element.
            dist[t] = SqDistStep(m_s[(warp * CPW + t) * k + j0 + j], uv, dist[t]);
          }
        }
      }

      // w_bi = g_b * (p_bi - [i == y_b]), with p from the forward's lse.
#pragma unroll
      for (int t = 0; t < CPW; ++t) {
        const int64_t i = cls0 + t;
        float w = 0.0f;
        if (row_ok && i < a.num_classes) {
          const float p = expf(neg_half_scale * dist[t] - lse_b);
          w = g_b * (p - (y_b == i ? 1.0f : 0.0f));
        }
        w_s[(warp * CPW + t) * kTile + lane] = w;
      }
      __syncwarp();

      // g_i += sum_b w_bi (u_b - M_i), lanes along j; chunks in reverse so the
      // staged one is used first.
      for (int j0 = last_j0; j0 >= 0 && k > 0; j0 -= chunk) {
        const int width = min(chunk, k - j0);
        if (j0 != last_j0) {
          __syncthreads();
          StageBatchTile(z, a.code_length, b0, rows, j0, width, pitch, inv_s,
                         u_s, warp, lane);
          __syncthreads();
        }
        for (int j = lane; j < width; j += kWarpSize) {
          float mv[CPW], g[CPW];
#pragma unroll
          for (int t = 0; t < CPW; ++t) {
            mv[t] = m_s[(warp * CPW + t) * k + j0 + j];
            g[t] = g_s[(warp * CPW + t) * k + j0 + j];
          }
          for (int r = 0; r < rows; ++r) {
            const float uv = u_s[r * pitch + j];  // consecutive j: no conflicts
#pragma unroll
            for (int t = 0; t < CPW; ++t) {
              g[t] = fmaf(w_s[(warp * CPW + t) * kTile + r], uv - mv[t], g[t]);
            }
          }
#pragma unroll
          for (int t = 0; t < CPW; ++t) g_s[(warp * CPW + t) * k + j0 + j] = g[t];
        }
      }
    }

    // Epilogue: grad_codes_i = scale * g_i (every row of the output written).
    __syncwarp();
#pragma unroll
    for (int t = 0; t < CPW; ++t) {
      const int64_t i = cls0 + t;
      if (i < a.num_classes) {
        const float* g = g_s + (warp * CPW + t) * k;
        float* out = a.grad_codes + i * a.code_length;
        for (int j = lane; j < k; j += kWarpSize) out[j] = a.scale * g[j];
      }
    }
  }
}

// ---------------------------------------------------------------------------
// Host side.

struct DeviceInfo {
  int num_sms = 1;
  int max_smem_optin = 48 * 1024;
};

cudaError_t GetDeviceInfo(DeviceInfo* info) {
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  err = cudaDeviceGetAttribute(&info->num_sms, cudaDevAttrMultiProcessorCount,
                               device);
  if (err != cudaSuccess) return err;
  return cudaDeviceGetAttribute(&info->max_smem_optin,
                                cudaDevAttrMaxSharedMemoryPerBlockOptin,
                                device);
}

int ChunkFor(int64_t code_length) {
  return static_cast<int>(std::max<int64_t>(
      1, std::min<int64_t>(code_length, kMaxChunk)));
}

// Picks items-per-warp (4, 2 or 1): the largest that still gives one block
// per SM (more items per block = more reuse of each staged tile, fewer
// blocks = less parallelism), and whose shared memory fits.  Returns 0 if
// even 1 does not fit (code_length too large for this device).
template <typename SmemFn>
int PickItemsPerWarp(int64_t items, const DeviceInfo& info, SmemFn smem_bytes) {
  for (int per_warp : {4, 2}) {
    const int64_t blocks = (items + kWarpsPerBlock * per_warp - 1) /
                           (int64_t{kWarpsPerBlock} * per_warp);
    if (blocks >= info.num_sms && smem_bytes(per_warp) <= info.max_smem_optin) {
      return per_warp;
    }
  }
  return smem_bytes(1) <= info.max_smem_optin ? 1 : 0;
}

unsigned GridFor(int64_t tiles) {
  return static_cast<unsigned>(std::min<int64_t>(tiles, INT_MAX));
}

template <typename Kernel, typename Args>
cudaError_t Launch(Kernel kernel, int64_t tiles, size_t smem, const Args& args,
                   cudaStream_t stream) {
  if (smem > 48 * 1024) {
    const cudaError_t err = cudaFuncSetAttribute(
        reinterpret_cast<const void*>(kernel),
        cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
    if (err != cudaSuccess) return err;
  }
  kernel<<<GridFor(tiles), kThreads, smem, stream>>>(args);
  return cudaGetLastError();
}

template <RowMode kMode, typename ZT>
cudaError_t LaunchRowTyped(const RowArgs& args, cudaStream_t stream) {
  DeviceInfo info;
  cudaError_t err = GetDeviceInfo(&info);
  if (err != cudaSuccess) return err;
  auto smem_bytes = [&](int rpw) {
    return RowSmemFloats(kMode, rpw, args.code_length, args.chunk) *
           static_cast<int64_t>(sizeof(float));
  };
  const int rpw = PickItemsPerWarp(args.batch, info, smem_bytes);
  if (rpw == 0) return cudaErrorInvalidValue;  // code_length too large
  const size_t smem = static_cast<size_t>(smem_bytes(rpw));
  switch (rpw) {
    case 4: {
      const int64_t tiles = (args.batch + 4 * kWarpsPerBlock - 1) / (4 * kWarpsPerBlock);
      return Launch(RowStreamKernel<kMode, ZT, 4>, tiles, smem, args, stream);
    }
    case 2: {
      const int64_t tiles = (args.batch + 2 * kWarpsPerBlock - 1) / (2 * kWarpsPerBlock);
      return Launch(RowStreamKernel<kMode, ZT, 2>, tiles, smem, args, stream);
    }
    default: {
      const int64_t tiles = (args.batch + kWarpsPerBlock - 1) / kWarpsPerBlock;
      return Launch(RowStreamKernel<kMode, ZT, 1>, tiles, smem, args, stream);
    }
  }
}

template <RowMode kMode>
cudaError_t LaunchRow(FloatType z_type, const RowArgs& args,
                      cudaStream_t stream) {
  switch (z_type) {
    case FloatType::kFloat32:
      return LaunchRowTyped<kMode, float>(args, stream);
    case FloatType::kFloat16:
      return LaunchRowTyped<kMode, __half>(args, stream);
    case FloatType::kBFloat16:
      return LaunchRowTyped<kMode, __nv_bfloat16>(args, stream);
  }
  return cudaErrorInvalidValue;
}

template <typename ZT>
cudaError_t LaunchGradTyped(const GradArgs& args, cudaStream_t stream) {
  DeviceInfo info;
  cudaError_t err = GetDeviceInfo(&info);
  if (err != cudaSuccess) return err;
  auto smem_bytes = [&](int cpw) {
    return GradSmemFloats(cpw, args.code_length, args.chunk) *
           static_cast<int64_t>(sizeof(float));
  };
  const int cpw = PickItemsPerWarp(args.num_classes, info, smem_bytes);
  if (cpw == 0) return cudaErrorInvalidValue;  // code_length too large
  const size_t smem = static_cast<size_t>(smem_bytes(cpw));
  const int64_t per_block = int64_t{kWarpsPerBlock} * cpw;
  const int64_t tiles = (args.num_classes + per_block - 1) / per_block;
  switch (cpw) {
    case 4:
      return Launch(ClassStreamKernel<ZT, 4>, tiles, smem, args, stream);
    case 2:
      return Launch(ClassStreamKernel<ZT, 2>, tiles, smem, args, stream);
    default:
      return Launch(ClassStreamKernel<ZT, 1>, tiles, smem, args, stream);
  }
}

cudaError_t LaunchGrad(FloatType z_type, const GradArgs& args,
                       cudaStream_t stream) {
  switch (z_type) {
    case FloatType::kFloat32:
      return LaunchGradTyped<float>(args, stream);
    case FloatType::kFloat16:
      return LaunchGradTyped<__half>(args, stream);
    case FloatType::kBFloat16:
      return LaunchGradTyped<__nv_bfloat16>(args, stream);
  }
  return cudaErrorInvalidValue;
}

bool BadSizes(int64_t batch, int64_t num_classes, int64_t code_length) {
  // code_length must also fit the int arithmetic used for shared-memory
  // offsets; anything that large fails the shared-memory check anyway.
  return batch < 0 || num_classes < 0 || code_length < 0 ||
         code_length > (int64_t{1} << 24);
}

bool BadLabelType(IndexType t) {
  return t != IndexType::kInt32 && t != IndexType::kInt64;
}

}  // namespace

cudaError_t EcocCrossEntropyForward(
    const void* z, FloatType z_type, const float* codes, const void* labels,
    IndexType label_type, float scale, float epsilon, int64_t batch,
    int64_t num_classes, int64_t code_length, float* loss, float* lse,
    float* expected_code, float* expected_sqnorm, cudaStream_t stream) {
  if (BadSizes(batch, num_classes, code_length) || BadLabelType(label_type)) {
    return cudaErrorInvalidValue;
  }
  if (batch == 0) return cudaSuccess;
  if (num_classes == 0) return cudaErrorInvalidValue;  // no valid label exists
  RowArgs args{};
  args.z = z;
  args.codes = codes;
  args.labels = labels;
  args.labels_int64 = label_type == IndexType::kInt64;
  args.scale = scale;
  args.epsilon = epsilon;
  args.batch = batch;
  args.num_classes = num_classes;
  args.code_length = code_length;
  args.chunk = ChunkFor(code_length);
  args.loss = loss;
  args.lse = lse;
  args.expected_code = expected_code;
  args.expected_sqnorm = expected_sqnorm;
  return LaunchRow<RowMode::kForward>(z_type, args, stream);
}

cudaError_t EcocCrossEntropyCodesGrad(
    const void* z, FloatType z_type, const float* codes, const void* labels,
    IndexType label_type, float scale, float epsilon, const float* lse,
    const float* grad_loss, int64_t batch, int64_t num_classes,
    int64_t code_length, float* grad_codes, cudaStream_t stream) {
  if (BadSizes(batch, num_classes, code_length) || BadLabelType(label_type)) {
    return cudaErrorInvalidValue;
  }
  // batch == 0 still launches: grad_codes must be overwritten with zeros.
  if (num_classes == 0 || code_length == 0) return cudaSuccess;
  GradArgs args{};
  args.z = z;
  args.codes = codes;
  args.labels = labels;
  args.labels_int64 = label_type == IndexType::kInt64;
  args.lse = lse;
  args.grad_loss = grad_loss;
  args.scale = scale;
  args.epsilon = epsilon;
  args.batch = batch;
  args.num_classes = num_classes;
  args.code_length = code_length;
  args.chunk = ChunkFor(code_length);
  args.grad_codes = grad_codes;
  return LaunchGrad(z_type, args, stream);
}

cudaError_t EcocLabelRank(const void* z, FloatType z_type, const float* codes,
                          const void* labels, IndexType label_type,
                          float epsilon, int64_t batch, int64_t num_classes,
                          int64_t code_length, int32_t* rank,
                          cudaStream_t stream) {
  if (BadSizes(batch, num_classes, code_length) || BadLabelType(label_type)) {
    return cudaErrorInvalidValue;
  }
  if (batch == 0) return cudaSuccess;
  if (num_classes == 0) return cudaErrorInvalidValue;
  RowArgs args{};
  args.z = z;
  args.codes = codes;
  args.labels = labels;
  args.labels_int64 = label_type == IndexType::kInt64;
  args.scale = 1.0f;  // unused: ranks compare distances
  args.epsilon = epsilon;
  args.batch = batch;
  args.num_classes = num_classes;
  args.code_length = code_length;
  args.chunk = ChunkFor(code_length);
  args.rank = rank;
  return LaunchRow<RowMode::kRank>(z_type, args, stream);
}

cudaError_t EcocNearestCodeword(const void* z, FloatType z_type,
                                const float* codes, float epsilon,
                                int64_t batch, int64_t num_classes,
                                int64_t code_length, int64_t* index,
                                cudaStream_t stream) {
  if (BadSizes(batch, num_classes, code_length)) return cudaErrorInvalidValue;
  if (batch == 0) return cudaSuccess;
  if (num_classes == 0) return cudaErrorInvalidValue;
  RowArgs args{};
  args.z = z;
  args.codes = codes;
  args.labels = nullptr;
  args.labels_int64 = false;
  args.scale = 1.0f;
  args.epsilon = epsilon;
  args.batch = batch;
  args.num_classes = num_classes;
  args.code_length = code_length;
  args.chunk = ChunkFor(code_length);
  args.index = index;
  return LaunchRow<RowMode::kNearest>(z_type, args, stream);
}

}  // namespace cuda
}  // namespace keras_ecoc
