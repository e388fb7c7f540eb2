// Label rank and nearest codeword on the split grid of the forward pass,
// always with the FP32 engine (an order decision must not depend on a
// reduced-precision product). Keys are the scale-free logits
//   key_bi = u_b . M_i - 1/2 ||M_i||^2     (Logit with s = 1, rowc = 0),
// the order of the logits for any s > 0, as in the CPU kernel.
// Each (batch tile, class split) block writes per row:
//   rank:    the number of classes of the split with key > label key, and
//            whether a key of the split is not finite;
//   nearest: the best (key, smallest index) of the split, and the same flag.
// DecodeCombineKernel merges the splits in class order (ecoc_combine.cuh).
#ifndef KERAS_ECOC_KERNELS_CUDA_ECOC_DECODE_CUH_
#define KERAS_ECOC_KERNELS_CUDA_ECOC_DECODE_CUH_

#include <cstdint>

#include "ecoc_common.cuh"
#include "ecoc_engine.cuh"

namespace keras_ecoc {
namespace cuda {
namespace detail {

struct DecodeSplitArgs {
  const float* u;          // [batch, kp]
  const float* ct;         // [n]  -1/2 ||M_i||^2
  const float* codes;
  const float* label_key;  // [batch] (rank) or null (nearest)
  bool codes_vec;
  int64_t batch, num_classes, code_length, kp;
  int kc, nchunks;
  int splits;
  int64_t class_tiles;
  long long* part_count;  // [batch, splits]  rank
  float* part_key;        // [batch, splits]  nearest
  long long* part_index;  // [batch, splits]  nearest (-1: none)
  int* part_bad;          // [batch, splits]  a non-finite key
  // The labels (rank; DecodeRegKernel stages their codewords), or null.
  // Last, so that the fields above keep their offsets.
  const void* labels;
  bool labels_int64;
};

__host__ __device__ constexpr int64_t DecodeSmemFloats(int bt, int kc) {
  return 2 * int64_t{bt + kClassTile} * TilePitch(kc) + int64_t{bt} * kSPitch;
}

template <bool kRank, int BT>
__global__ void __launch_bounds__(kThreads) DecodeSplitKernel(DecodeSplitArgs a) {
  extern __shared__ __align__(16) float smem[];
  using Engine = Fp32Engine<BT>;
  constexpr int CT = kClassTile;
  constexpr int RW = BT / kWarps;
  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  const int pitch = TilePitch(a.kc);
  const int stage_floats = (BT + CT) * pitch;
  float* S_s = smem + 2 * stage_floats;

  const int64_t k = a.code_length;
  const int64_t b0 = int64_t{blockIdx.x} * BT;
  const int split = blockIdx.y;
  const int64_t t_begin = split * a.class_tiles / a.splits;
  const int64_t t_end = (split + 1) * a.class_tiles / a.splits;
  const int64_t num_stages = (t_end - t_begin) * a.nchunks;

  long long count[RW];
  bool bad[RW];
  float best[RW], label_key[RW];
  long long best_index[RW];
#pragma unroll
  for (int i = 0; i < RW; ++i) {
    const int64_t b = b0 + warp * RW + i;
    count[i] = 0;
    bad[i] = false;
    best[i] = -INFINITY;
    best_index[i] = -1;
    label_key[i] = (kRank && b < a.batch) ? a.label_key[b] : 0.0f;
  }

  Engine engine;
  engine.Init();
  if (num_stages > 0) {
    StageTile(smem, pitch, a.u, a.kp, b0, a.batch, BT, 0, a.kc, a.kp, true);
    StageTile(smem + BT * pitch, pitch, a.codes, k, t_begin * CT, a.num_classes, CT,
              0, a.kc, k, a.codes_vec);
    ptx::cp_async_commit();
  }
  for (int64_t q = 0; q < num_stages; ++q) {
    float* cur = smem + (q & 1) * stage_floats;
    if (q + 1 < num_stages) {
      float* nxt = smem + ((q + 1) & 1) * stage_floats;
      const int64_t nt = t_begin + (q + 1) / a.nchunks;
      const int64_t nj0 = ((q + 1) % a.nchunks) * a.kc;
      StageTile(nxt, pitch, a.u, a.kp, b0, a.batch, BT, nj0, a.kc, a.kp, true);
      StageTile(nxt + BT * pitch, pitch, a.codes, k, nt * CT, a.num_classes, CT, nj0,
                a.kc, k, a.codes_vec);
      ptx::cp_async_commit();
      ptx::cp_async_wait<1>();
    } else {
      ptx::cp_async_wait<0>();
    }
    __syncthreads();

    const int chunk = static_cast<int>(q % a.nchunks);
    if (chunk == 0) engine.Init();
    engine.Step(cur, cur + BT * pitch, pitch, a.kc);
    if (chunk == a.nchunks - 1) {
      const int64_t c = (t_begin + q / a.nchunks) * CT + lane;
      const bool valid = c < a.num_classes;
      const float ct = valid ? a.ct[c] : 0.0f;
      engine.Store(S_s);
      __syncthreads();
#pragma unroll
      for (int i = 0; i < RW; ++i) {
        const int r = warp * RW + i;
        const float x = Logit(S_s[r * kSPitch + lane], 1.0f, ct, 0.0f);
        bad[i] = bad[i] || (valid && !isfinite(x));
        if (kRank) {
          // A NaN key compares false and is never counted.
          count[i] += (valid && x > label_key[i]) ? 1 : 0;
        } else if (valid && (best_index[i] < 0 || x > best[i])) {
          // Each lane sees its classes in increasing order: a strict ">"
          // keeps the smallest index among equal keys.
          best[i] = x;
          best_index[i] = c;
        }
      }
    }
    __syncthreads();
  }

#pragma unroll
  for (int i = 0; i < RW; ++i) {
    const int64_t b = b0 + warp * RW + i;
    const bool any_bad = __any_sync(kFullMask, bad[i]);
    if (kRank) {
      const long long total = WarpSumLL(count[i]);
      if (b < a.batch && lane == 0) {
        a.part_count[b * a.splits + split] = total;
        a.part_bad[b * a.splits + split] = any_bad ? 1 : 0;
      }
    } else {
      float key = best[i];
      long long index = best_index[i];
#pragma unroll
      for (int offset = kWarpSize / 2; offset > 0; offset >>= 1) {
        const float ok = __shfl_xor_sync(kFullMask, key, offset);
        const long long oi = __shfl_xor_sync(kFullMask, index, offset);
        // Total order: "none" (-1) last, then larger key, then smaller index.
        // Symmetric, so every lane ends with the same winner.
        const bool other = oi >= 0 && (index < 0 || ok > key || (ok == key && oi < index));
        if (other) {
          key = ok;
          index = oi;
        }
      }
      if (b < a.batch && lane == 0) {
        a.part_key[b * a.splits + split] = key;
        a.part_index[b * a.splits + split] = index;
        a.part_bad[b * a.splits + split] = any_bad ? 1 : 0;
      }
    }
  }
}

}  // namespace detail
}  // namespace cuda
}  // namespace keras_ecoc

#endif  // KERAS_ECOC_KERNELS_CUDA_ECOC_DECODE_CUH_
