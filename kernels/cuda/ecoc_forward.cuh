// Forward pass, flash-decoding style: a grid of (batch tiles of BT rows) x
// (class splits). Each block streams the class tiles of its split through a
// double-buffered shared-memory pipeline (cp.async on sm_80 and later),
// computes the tile's logits with the engine of the math mode, folds them
// into a running (max, sum, expected squared norm, expected code) per row
// (online softmax), and writes one normalised partial state per (row,
// split) to the workspace:
//   part_lse[b][s]     = log sum_{i in split s} exp(logit_bi)
//   part_sqn[b][s]     = sum_i p^s_bi ||M_i||^2     (p^s: softmax within s)
//   part_acc[b][s][:]  = sum_i p^s_bi M_i
// The label's logit is taken from the same tile S the softmax reads (so it
// is the same number in every math mode) by the one split that holds it.
// ecoc_combine.cuh merges the splits in a fixed order.
#ifndef KERAS_ECOC_KERNELS_CUDA_ECOC_FORWARD_CUH_
#define KERAS_ECOC_KERNELS_CUDA_ECOC_FORWARD_CUH_

#include <cstdint>

#include "ecoc_common.cuh"
#include "ecoc_engine.cuh"

namespace keras_ecoc {
namespace cuda {
namespace detail {

struct ForwardSplitArgs {
  const float* u;     // [batch, kp]
  const float* rowc;  // [batch]
  const float* sqn;   // [n]
  const float* ct;    // [n]
  const float* codes;
  const void* labels;
  bool labels_int64;
  bool codes_vec;     // codes rows can be copied 16 bytes at a time
  bool acc_in_smem;   // expected-code accumulators in shared memory
  float scale;
  const float* scale_ptr;  // device scale (wins over `scale`), or null
  int64_t batch, num_classes, code_length, kp;
  int kc, nchunks;
  int splits;
  int64_t class_tiles;
  float* label_logit;  // [batch]
  float* part_lse;     // [batch, splits]
  float* part_sqn;     // [batch, splits]
  float* part_acc;     // [batch, splits, k]
};

// Shared-memory floats of ForwardSplitKernel, in layout order.
__host__ __device__ constexpr int64_t ForwardSmemFloats(int bt, int kc, int64_t k,
                                                        bool acc_in_smem, bool fold) {
  return 2 * int64_t{bt + kClassTile} * TilePitch(kc)  // double-buffered stages
         + int64_t{bt} * kSPitch                       // logits / p of a tile
         + 2 * bt                                      // alpha, 1/sum per row
         + (acc_in_smem ? bt * k : 0)                  // expected code
         + (fold ? 2 * kClassTile : 0);                // ||M||^2, ct of a tile
}

// kFold: ||M_i||^2 and ct_i of each class tile are computed here, from the
// staged code tiles, instead of being read from the workspace (where
// PrepClasses, not launched then, would have put them). Warp w owns
// classes 8w .. 8w + 7 of the tile, a quad per class; lane l sums the
// squares of the columns j = l (mod 4) in increasing j across the column
// stages, then the quad's butterfly: exactly PrepClasses' chain
// (ecoc_common.cuh; the zero padding past k adds exact zeros), so the bits,
// the label's logit and the ties are those of v2.
template <int kMath, int BT, bool kFold>
__global__ void __launch_bounds__(kThreads, BT == 16 ? (kMath == kMathFp32 ? 4 : 5) : 0)
    ForwardSplitKernel(ForwardSplitArgs a) {
  extern __shared__ __align__(16) float smem[];
  using Engine = typename EngineFor<kMath, BT>::type;
  constexpr int CT = kClassTile;
  constexpr int RW = BT / kWarps;  // rows per warp in the softmax phase
  // Rows per pass of a thread in the expected-code update (below).
  constexpr int RB = BT == 16 ? 4 : 8;
  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  const int pitch = TilePitch(a.kc);
  const int stage_floats = (BT + CT) * pitch;
  float* S_s = smem + 2 * stage_floats;
  float* alpha_s = S_s + BT * kSPitch;
  float* inv_s = alpha_s + BT;
  float* acc_s = inv_s + BT;
  // kFold only: ||M||^2 and ct of the current class tile.
  float* fsq_s = acc_s + (a.acc_in_smem ? BT * a.code_length : 0);
  float* fct_s = fsq_s + CT;

  const int64_t k = a.code_length;
  const float scale = ReadScale(a.scale_ptr, a.scale);
  const int64_t b0 = int64_t{blockIdx.x} * BT;
  const int split = blockIdx.y;
  const int rows_valid = static_cast<int>(a.batch - b0 < BT ? a.batch - b0 : BT);
  const int64_t t_begin = split * a.class_tiles / a.splits;
  const int64_t t_end = (split + 1) * a.class_tiles / a.splits;
  const int64_t num_stages = (t_end - t_begin) * a.nchunks;

  // Expected-code accumulator of row r, column j: acc[r * acc_stride + j],
  // in shared memory or, when it does not fit, in this block's own slots of
  // part_acc (no other block touches them).
  float* acc = a.acc_in_smem ? acc_s : a.part_acc + (b0 * a.splits + split) * k;
  const int64_t acc_stride = a.acc_in_smem ? k : a.splits * k;
  for (int64_t e = threadIdx.x; e < rows_valid * k; e += kThreads) {
    acc[(e / k) * acc_stride + e % k] = 0.0f;
  }

  float run_max[RW], run_sum[RW], run_sqn[RW], rowc[RW];
  int64_t label[RW];
#pragma unroll
  for (int i = 0; i < RW; ++i) {
    const int64_t b = b0 + warp * RW + i;
    run_max[i] = -INFINITY;
    run_sum[i] = 0.0f;
    run_sqn[i] = 0.0f;
    rowc[i] = b < a.batch ? a.rowc[b] : 0.0f;
    label[i] = b < a.batch ? LoadLabel(a.labels, a.labels_int64, b) : -1;
  }

  Engine engine;
  engine.Init();
  float fold = 0.0f;  // kFold: the lane's partial ||M||^2 of its class
  if (num_stages > 0) {
    StageTile(smem, pitch, a.u, a.kp, b0, a.batch, BT, 0, a.kc, a.kp, true);
    StageTile(smem + BT * pitch, pitch, a.codes, k, t_begin * CT, a.num_classes, CT,
              0, a.kc, k, a.codes_vec);
    ptx::cp_async_commit();
  }
  for (int64_t q = 0; q < num_stages; ++q) {
    float* cur = smem + (q & 1) * stage_floats;
    if (q + 1 < num_stages) {
      // Prefetch the next stage into the other buffer while this one runs.
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
    // Stage q is visible to every thread after this barrier.
    __syncthreads();  // [barrier-mutation-test] only=cases

    const int chunk = static_cast<int>(q % a.nchunks);
    if (chunk == 0) engine.Init();
    engine.Step(cur, cur + BT * pitch, pitch, a.kc);
    if (kFold) {
      if (chunk == 0) fold = 0.0f;
      AccumulateFoldedNorms(fold, cur + BT * pitch, pitch, chunk * a.kc, a.kc, warp, lane);
      if (chunk == a.nchunks - 1) FinishFoldedNorms(fold, scale, warp, lane, fsq_s, fct_s);
    }

    if (chunk == a.nchunks - 1) {
      const int64_t c0 = (t_begin + q / a.nchunks) * CT;
      engine.Store(S_s);
      // S_s (and, kFold, this tile's ||M||^2 and ct) complete.
      __syncthreads();
      // Online softmax, one warp per row, one lane per class.
      const int64_t c = c0 + lane;
      const bool valid = c < a.num_classes;
      const float ct = valid ? (kFold ? fct_s[lane] : a.ct[c]) : 0.0f;
      const float sq = valid ? (kFold ? fsq_s[lane] : a.sqn[c]) : 0.0f;
#pragma unroll
      for (int i = 0; i < RW; ++i) {
        const int r = warp * RW + i;
        const float x = valid ? Logit(S_s[r * kSPitch + lane], scale, ct, rowc[i])
                              : -INFINITY;
        if (valid && c == label[i]) a.label_logit[b0 + r] = x;
        const float new_max = NanMax(run_max[i], WarpNanMax(x));
        const float alpha = ExpDiff(run_max[i], new_max);
        const float p = ExpDiff(x, new_max);
        run_sum[i] = run_sum[i] * alpha + WarpSum(p);
        run_sqn[i] = run_sqn[i] * alpha + WarpSum(valid ? p * sq : 0.0f);
        run_max[i] = new_max;
        S_s[r * kSPitch + lane] = p;
        if (lane == 0) alpha_s[r] = alpha;
      }
      __syncthreads();
      // acc_r = alpha_r * acc_r + sum_c p_rc M_c: this tile's sum first, then
      // one rescale-and-add (one rounding of the running sum per tile).
      // The codes come from the staged tile when it holds all of k, else from
      // global memory (L2).
      const int nvalid =
          static_cast<int>(a.num_classes - c0 < CT ? a.num_classes - c0 : CT);
      const float* msrc = a.nchunks == 1 ? cur + BT * pitch : a.codes + c0 * k;
      const int64_t mstride = a.nchunks == 1 ? pitch : k;
      // Layout: `groups` groups of `cols` consecutive threads (a column
      // each) take every groups-th row, so that every warp works where
      // k < kThreads (a thread per column left 3 of 4 warps idle at k = 32
      // while the fourth did all 16 rows). A thread runs its rows RB at a
      // time, each code read once per RB rows, with RB accumulators instead
      // of the tile's CT codes in registers. Every (row, column) is still
      // one chain over the tile's CT classes in increasing order (codes
      // past nvalid read as 0), then one rescale-and-add: the bits do not
      // depend on the layout.
      const auto [cols, groups, group, col] = ColumnGroupsOf(k);
      for (int64_t j = col; group < groups && j < k; j += cols) {
        for (int r0 = group; r0 < rows_valid; r0 += RB * groups) {
          // Rows past the tile (r0 + i * groups >= BT) read row BT - 1 and
          // are not written.
          const float* srow[RB];
          float t[RB];
#pragma unroll
          for (int i = 0; i < RB; ++i) {
            const int r = r0 + i * groups;
            srow[i] = S_s + (r < BT ? r : BT - 1) * kSPitch;
            t[i] = 0.0f;
          }
#pragma unroll 8
          for (int cc = 0; cc < CT; ++cc) {
            const float m = cc < nvalid ? msrc[cc * mstride + j] : 0.0f;
#pragma unroll
            for (int i = 0; i < RB; ++i) t[i] = fmaf(srow[i][cc], m, t[i]);
          }
#pragma unroll
          for (int i = 0; i < RB; ++i) {
            const int r = r0 + i * groups;
            if (r < rows_valid) {
              float* dst = acc + r * acc_stride + j;
              *dst = fmaf(*dst, alpha_s[r], t[i]);
            }
          }
        }
      }
    }
    __syncthreads();  // buffer q & 1 and S_s are free for the next stage
  }

  // Epilogue: normalised partial state of each valid row.
#pragma unroll
  for (int i = 0; i < RW; ++i) {
    const int r = warp * RW + i;
    if (r < rows_valid && lane == 0) {
      const int64_t slot = (b0 + r) * a.splits + split;
      // A NaN sum fails "> 0": inv = 0 keeps the NaN of acc and sqn (x*0).
      const float inv = run_sum[i] > 0.0f ? 1.0f / run_sum[i] : 0.0f;
      a.part_lse[slot] = run_max[i] + logf(run_sum[i]);
      a.part_sqn[slot] = run_sqn[i] * inv;
      inv_s[r] = inv;
    }
  }
  __syncthreads();
  float* out = a.part_acc + (b0 * a.splits + split) * k;
  for (int64_t e = threadIdx.x; e < rows_valid * k; e += kThreads) {
    const int64_t r = e / k;
    const int64_t j = e % k;
    out[r * a.splits * k + j] = acc[r * acc_stride + j] * inv_s[r];
  }
}

}  // namespace detail
}  // namespace cuda
}  // namespace keras_ecoc

#endif  // KERAS_ECOC_KERNELS_CUDA_ECOC_FORWARD_CUH_
