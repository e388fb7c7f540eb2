// Merging the per-split partial states of the split grid, always in
// increasing split (= class) order, so that a result depends only on the
// inputs and the split count (which depends only on the shapes and the
// card): deterministic, no atomics.
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

// One block per row (grid-stride); dynamic shared memory: splits floats.
//   lse = M + log L,  L = sum_s w_s,  w_s = exp(lse_s - M),  M = max_s lse_s
//   E[M] = sum_s w_s acc_s / L,  E[||M||^2] = sum_s w_s sqn_s / L
__global__ void __launch_bounds__(kThreads) ForwardCombineKernel(ForwardCombineArgs a) {
  extern __shared__ __align__(16) float w_s[];
  const int64_t k = a.code_length;
  const int S = a.splits;
  for (int64_t b = blockIdx.x; b < a.batch; b += gridDim.x) {
    const float* lse_b = a.part_lse + b * S;
    float m = -INFINITY;
    for (int s = 0; s < S; ++s) m = NanMax(m, lse_b[s]);
    for (int s = threadIdx.x; s < S; s += kThreads) w_s[s] = ExpDiff(lse_b[s], m);
    __syncthreads();
    float total = 0.0f;
    for (int s = 0; s < S; ++s) total += w_s[s];
    const float inv = 1.0f / total;
    if (threadIdx.x == 0) {
      const float lse = m + logf(total);
      const int64_t y = LoadLabel(a.labels, a.labels_int64, b);
      float sq = 0.0f;
      for (int s = 0; s < S; ++s) sq = fmaf(w_s[s], a.part_sqn[b * S + s], sq);
      a.lse[b] = lse;
      // An out-of-range label (the caller's bug) gives NaN, never a read
      // out of bounds.
      a.loss[b] = (y >= 0 && y < a.num_classes) ? lse - a.label_logit[b] : NAN;
      a.expected_sqnorm[b] = sq * inv;
    }
    const float* acc_b = a.part_acc + b * S * k;
    for (int64_t j = threadIdx.x; j < k; j += kThreads) {
      float e = 0.0f;
      for (int s = 0; s < S; ++s) e = fmaf(w_s[s], acc_b[s * k + j], e);
      a.expected_code[b * k + j] = e * inv;
    }
    __syncthreads();  // w_s is reused by the next row
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

// One thread per row.
//   rank:    -1 for an out-of-range label; num_classes (clamped to INT_MAX)
//            when a key of the row is not finite; else the summed counts.
//   nearest: -1 when a key of the row is not finite; else the best key over
//            the splits in class order (a strict ">" keeps the smaller index).
__global__ void __launch_bounds__(kThreads) DecodeCombineKernel(DecodeCombineArgs a) {
  for (int64_t b = int64_t{blockIdx.x} * kThreads + threadIdx.x; b < a.batch;
       b += int64_t{gridDim.x} * kThreads) {
    const int64_t base = b * a.splits;
    bool bad = false;
    for (int s = 0; s < a.splits; ++s) bad = bad || a.part_bad[base + s] != 0;
    if (a.rank != nullptr) {
      const int64_t y = LoadLabel(a.labels, a.labels_int64, b);
      long long total = 0;
      for (int s = 0; s < a.splits; ++s) total += a.part_count[base + s];
      const long long worst = a.num_classes < INT_MAX ? a.num_classes : INT_MAX;
      a.rank[b] = !(y >= 0 && y < a.num_classes) ? -1
                  : bad                         ? static_cast<int32_t>(worst)
                                                : static_cast<int32_t>(total);
    } else {
      float key = -INFINITY;
      long long index = -1;
      for (int s = 0; s < a.splits; ++s) {
        const long long i = a.part_index[base + s];
        const float x = a.part_key[base + s];
        if (i >= 0 && (index < 0 || x > key)) {
          key = x;
          index = i;
        }
      }
      a.index[b] = bad ? -1 : index;
    }
  }
}

}  // namespace detail
}  // namespace cuda
}  // namespace keras_ecoc

#endif  // KERAS_ECOC_KERNELS_CUDA_ECOC_COMBINE_CUH_
