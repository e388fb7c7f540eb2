// Merging the per-split partial states of the split grid, in an order fixed
// by the shapes alone (the split count, k and the block size, which depend
// only on the shapes and the card), so that a result depends only on the
// inputs: deterministic, no atomics. The forward's sums run over many
// threads in a fixed tree; the decode results are integers, flags and a
// best (key, index) pair, whose reductions give the sequential scan's
// result in any order.
#ifndef KERAS_ECOC_KERNELS_CUDA_ECOC_COMBINE_CUH_
#define KERAS_ECOC_KERNELS_CUDA_ECOC_COMBINE_CUH_

#include <climits>
#include <cstdint>

#include "ecoc_common.cuh"

namespace keras_ecoc {
namespace cuda {
namespace detail {

struct ForwardCombineArgs {
  const float* part_lse;     // [batch, splits]
  const float* part_sqn;     // [batch, splits]
  const float* part_acc;     // [batch, splits, k]
  const float* label_logit;  // [batch]
  const void* labels;
  bool labels_int64;
  int64_t batch, num_classes, code_length;
  int splits;
  float* loss;
  float* lse;
  float* expected_code;
  float* expected_sqnorm;
};

// The forward combine's block: up to 1024 threads, so that a row's many
// splits (up to 4 x 1024 partial states with the register softmax) are
// summed by many threads instead of one sequential chain per column, whose
// every step waited on a load from L2: at B = 16 only 16 blocks ran, one
// per row.
constexpr int kCombineMaxThreads = 1024;
constexpr int kCombineMaxWarps = kCombineMaxThreads / kWarpSize;

// Columns of the expected code per block: the smallest power of two >= k,
// at most one warp's width, so that a block's threads are (groups of
// splits) x (columns) with no idle lane below 32 columns.
__host__ __device__ constexpr int ForwardCombineColumns(int64_t k) {
  int c = 1;
  while (c < kWarpSize && c < k) c *= 2;
  return c;
}

// Threads of a forward combine block for S partial states per row and c
// columns: a power of two from 128 to 1024, about 4 states per thread and
// column (the groups of splits are threads / c).
__host__ __device__ constexpr int ForwardCombineThreads(int64_t splits, int cols) {
  int t = kThreads;
  while (t < kCombineMaxThreads && int64_t{t} * 4 < splits * cols) t *= 2;
  return t;
}

// Dynamic shared memory of a forward combine block, in floats: one per warp
// (the block reductions), the S weights rounded up to whole 16-byte vectors
// (memcheck on an H100, sm_90, nvcc 13.0, reported a 12-byte shared read at
// the start of a 4- or 8-byte allocation in the weight-sum loop of the
// kernel before this one: the SASS read the remainder as one wider load),
// and one per thread (the column sums).
__host__ __device__ constexpr int64_t ForwardCombineSmemFloats(int64_t splits, int threads) {
  return kCombineMaxWarps + (splits + 3) / 4 * 4 + threads;
}

// The sum (op = 0) or NaN-propagating max (op = 1) of v over the block, the
// same bits in every thread: a butterfly in each warp (commutative steps:
// both lanes of a pair end equal), then the warps' results in increasing
// warp order. `red` holds kCombineMaxWarps floats; the block's threads all
// call it.
template <int kOp>
__device__ __forceinline__ float CombineBlockReduce(float v, float* red) {
  v = kOp == 0 ? WarpSum(v) : WarpNanMax(v);
  const int warps = blockDim.x / kWarpSize;
  if (threadIdx.x % kWarpSize == 0) red[threadIdx.x / kWarpSize] = v;
  __syncthreads();
  float r = red[0];
  for (int w = 1; w < warps; ++w) r = kOp == 0 ? r + red[w] : NanMax(r, red[w]);
  __syncthreads();  // red is reused by the next reduction
  return r;
}

// Grid: x = rows (grid-stride), y = tiles of cols = ForwardCombineColumns(k)
// expected-code columns
// (grid-stride); T = blockDim.x threads (ForwardCombineThreads), thread t =
// (group g = t / cols, column c = t % cols). Per row, with S = splits:
//   lse = M + log L,  L = sum_s w_s,  w_s = exp(lse_s - M),  M = max_s lse_s
//   E[M] = sum_s w_s acc_s / L,  E[||M||^2] = sum_s w_s sqn_s / L
// Each sum in a fixed order that depends only on S, k and T (so only on the
// shapes): thread t adds its states s = t, t + T, ... (g, g + G, ... for a
// column, G = T / cols groups) in increasing s; the block then adds the
// threads' (the groups') sums in a fixed tree (CombineBlockReduce) or
// sequence. Every block of a row computes M and L alike (the same bits);
// the column tile 0 block writes lse, loss and E[||M||^2].
__global__ void __launch_bounds__(kCombineMaxThreads) ForwardCombineKernel(ForwardCombineArgs a) {
  extern __shared__ __align__(16) float smem[];
  const int64_t k = a.code_length;
  const int S = a.splits;
  const int T = blockDim.x;
  const int t = threadIdx.x;
  float* red = smem;                                  // [32]: CombineBlockReduce
  float* w_s = smem + kCombineMaxWarps;               // [S]: the weights w_s
  float* col_s = w_s + (S + 3) / 4 * 4;               // [T]: per-thread column sums
  const int cols = ForwardCombineColumns(k);
  const int groups = T / cols;
  const int g = t / cols;
  const int c = t % cols;
  const int64_t col_tiles = (k + cols - 1) / cols;
  for (int64_t b = blockIdx.x; b < a.batch; b += gridDim.x) {
    const float* lse_b = a.part_lse + b * S;
    float m = -INFINITY;
    for (int s = t; s < S; s += T) m = NanMax(m, lse_b[s]);
    m = CombineBlockReduce<1>(m, red);
    const bool head = blockIdx.y == 0;  // writes the row's scalars
    float total = 0.0f, sq = 0.0f;
    for (int s = t; s < S; s += T) {
      const float w = ExpDiff(lse_b[s], m);
      w_s[s] = w;
      total += w;
      if (head) sq = fmaf(w, a.part_sqn[b * S + s], sq);
    }
    total = CombineBlockReduce<0>(total, red);  // its barriers publish w_s
    if (head) sq = CombineBlockReduce<0>(sq, red);
    const float inv = 1.0f / total;
    if (head && t == 0) {
      const int64_t y = LoadLabel(a.labels, a.labels_int64, b);
      const float lse = m + logf(total);
      a.lse[b] = lse;
      // An out-of-range label (the caller's bug) gives NaN, never a read
      // out of bounds.
      a.loss[b] = (y >= 0 && y < a.num_classes) ? lse - a.label_logit[b] : NAN;
      a.expected_sqnorm[b] = sq * inv;
    }
    const float* acc_b = a.part_acc + b * S * k;
    for (int64_t tile = blockIdx.y; tile < col_tiles; tile += gridDim.y) {
      const int64_t j = tile * cols + c;
      float e = 0.0f;
      if (j < k) {
        // Eight loads ahead of their fmas, the fmas in the same order (the
        // same bits): ptxas kept one global load per step of the plain loop,
        // so each of a thread's S / groups steps waited on L2 (about 120 at
        // B = 16, k = 32, n = 1e6, where this launch took 45 us of the
        // H100's 0.19 ms forward on 2026-11-27).
        int s = g;
        for (; s + 7 * groups < S; s += 8 * groups) {
          float x[8];
#pragma unroll
          for (int u = 0; u < 8; ++u) x[u] = acc_b[(s + u * groups) * k + j];
#pragma unroll
          for (int u = 0; u < 8; ++u) e = fmaf(w_s[s + u * groups], x[u], e);
        }
        for (; s < S; s += groups) e = fmaf(w_s[s], acc_b[s * k + j], e);
      }
      col_s[t] = e;
      // Every group's sums visible to the column's first thread.
      __syncthreads();  // [barrier-mutation-test] only=cases
      if (t < cols && j < k) {
        float sum = col_s[t];
        for (int q = 1; q < groups; ++q) sum += col_s[q * cols + t];
        a.expected_code[b * k + j] = sum * inv;
      }
      __syncthreads();  // col_s is reused by the next tile
    }
    // w_s is rewritten by the next row only after every thread has passed
    // the reductions above it, which follow the last reads here.
  }
}

struct DecodeCombineArgs {
  const void* labels;  // rank: to flag invalid labels; null for nearest
  bool labels_int64;
  int64_t batch, num_classes;
  int splits;
  const long long* part_count;
  const float* part_key;
  const long long* part_index;
  const int* part_bad;
  int32_t* rank;   // rank, or null
  int64_t* index;  // nearest, or null
};

// (key, index) of the better of two split results for the nearest codeword:
// a valid one (index >= 0) over none, the larger key, on equal keys the
// smaller index. The order is total when the keys are finite (a row with a
// non-finite key is flagged bad and gives -1 whatever this picks), so a
// tree of these picks what the scan in split (= class) order picked: the
// largest key, the smallest index among equal keys (-0 equals +0).
__device__ __forceinline__ bool BetterNearest(float x, long long i, float key, long long index) {
  return i >= 0 && (index < 0 || x > key || (x == key && i < index));
}

// One warp per row (grid-stride): lane l reads the splits l, l + 32, ...
//   rank:    -1 for an out-of-range label; num_classes (clamped to INT_MAX)
//            when a key of the row is not finite; else the summed counts.
//   nearest: -1 when a key of the row is not finite; else the best key over
//            the splits (BetterNearest).
// The sums are of integers and the flags or-ed, so the results are those
// of a sequential scan in split order, bit for bit, in any lane order.
__global__ void __launch_bounds__(kThreads) DecodeCombineKernel(DecodeCombineArgs a) {
  const int lane = threadIdx.x % kWarpSize;
  const int64_t stride = int64_t{gridDim.x} * kWarps;
  for (int64_t b = int64_t{blockIdx.x} * kWarps + threadIdx.x / kWarpSize; b < a.batch;
       b += stride) {
    const int64_t base = b * a.splits;
    bool bad = false;
    for (int s = lane; s < a.splits; s += kWarpSize) bad = bad || a.part_bad[base + s] != 0;
    bad = __any_sync(kFullMask, bad) != 0;
    if (a.rank != nullptr) {
      long long total = 0;
      for (int s = lane; s < a.splits; s += kWarpSize) total += a.part_count[base + s];
      total = WarpSumLL(total);
      if (lane == 0) {
        const int64_t y = LoadLabel(a.labels, a.labels_int64, b);
        const long long worst = a.num_classes < INT_MAX ? a.num_classes : INT_MAX;
        a.rank[b] = !(y >= 0 && y < a.num_classes) ? -1
                    : bad                         ? static_cast<int32_t>(worst)
                                                  : static_cast<int32_t>(total);
      }
    } else {
      float key = -INFINITY;
      long long index = -1;
      for (int s = lane; s < a.splits; s += kWarpSize) {
        const long long i = a.part_index[base + s];
        const float x = a.part_key[base + s];
        if (BetterNearest(x, i, key, index)) {
          key = x;
          index = i;
        }
      }
#pragma unroll
      for (int offset = kWarpSize / 2; offset > 0; offset >>= 1) {
        const float x = __shfl_xor_sync(kFullMask, key, offset);
        const long long i = __shfl_xor_sync(kFullMask, index, offset);
        if (BetterNearest(x, i, key, index)) {
          key = x;
          index = i;
        }
      }
      if (lane == 0) a.index[b] = bad ? -1 : index;
    }
  }
}

}  // namespace detail
}  // namespace cuda
}  // namespace keras_ecoc

#endif  // KERAS_ECOC_KERNELS_CUDA_ECOC_COMBINE_CUH_
