// Label rank and nearest codeword on the tensor cores (3xTF32), with the
// register-softmax forward's tile loop (ecoc_forward_reg.cuh) and no softmax:
// the keys of a class tile never leave the mma accumulator registers.
//
// Same grid, keys and partial states as DecodeSplitKernel (ecoc_decode.cuh):
// (batch tiles of BT rows) x (class splits), each block streaming the
// 64-class tiles of its split and writing one partial state per (row, split)
// that DecodeCombineKernel merges in class order. The keys
//   key_bi = u_b . M_i - 1/2 ||M_i||^2      (Logit with s = 1, rowc = 0)
// come from 3xTF32 products (an error of about 2^-20 sum_j |u_j M_ij|, the
// size of an FP32 chain's) where DecodeSplitKernel runs the FP32 chain: an
// order decision may then differ from the FP32 pass's between two keys that
// lie within that error of each other; it never rests on a plain TF32
// product (a kTf32 request runs this kernel in 3xTF32).
//  * Warp layout and fragments: the 4-warp forward's (WR = BT / 16 row groups
//    x WC = 4 / WR class groups, ldmatrix fragments, the same splits and
//    order of the three products), so a key has the bits the forward's
//    logit engine gives it at s = 1.
//  * The label keys: before its first class tile, each block stages the
//    codewords of its rows' labels as one more code tile (row r of the tile =
//    M_{y_{b0 + r}}, its ct in the padding) and runs the same tile loop on
//    it; the key of (row r, tile row r) is the label's key, with the bits of
//    the label's key in its own class tile: the same code on the same
//    operands. So a label never outranks itself and a duplicate of its
//    codeword ties with it, as in the FP32 pass; the label's own class is
//    also never counted (one integer test per key), so that this holds even
//    if a tensor core's result depended on the operands' place in the tile.
//  * Rank: per row, the keys > the label's key and whether a key is not
//    finite; nearest: the largest key and its smallest class (BetterNearest's
//    order), NaN rules as in DecodeSplitKernel. The quad's 4 threads (and,
//    BT = 16, the 4 warps' class groups, through shared memory in warp
//    order) are merged in the block: one state per (row, split), no more
//    than DecodeSplitKernel's.
//  * ct (= -1/2 ||M_i||^2, PrepClasses with keys) rides in each staged code
//    row's padding column kp.
// The launcher uses it for a decode pass in a TF32 math mode on sm_80+ with
// kp <= kRegMaxK, within the opt-in shared memory (MakePlan); other calls
// run DecodeSplitKernel.
#ifndef KERAS_ECOC_KERNELS_CUDA_ECOC_DECODE_REG_CUH_
#define KERAS_ECOC_KERNELS_CUDA_ECOC_DECODE_REG_CUH_

#include <cstdint>

#include "ecoc_combine.cuh"
#include "ecoc_common.cuh"
#include "ecoc_decode.cuh"
#include "ecoc_engine.cuh"
#include "ecoc_forward_reg.cuh"

namespace keras_ecoc {
namespace cuda {
namespace detail {

// Shared-memory floats of DecodeRegKernel: two code tiles and the resident
// u tile at the engine's pitch kp + 4, as the forward's (the label tile
// uses the second code buffer before the loop; the rows' label keys go to
// u's padding column kp), so that it fits wherever the forward does: 99 KiB
// at 64 rows and kp = 128, an sm_86 / sm_89 card's opt-in limit.
__host__ __device__ constexpr int64_t DecodeRegSmemFloats(int bt, int kp) {
  return int64_t{bt + 2 * kRegClassTile} * TilePitch(kp);
}

// The per-row partial state of one thread (rows g and g + 8 of its warp).
struct DecodeRowState {
  long long count;  // rank: keys above the label's
  float best;       // nearest: the largest key ...
  long long index;  // ... and its smallest class (-1: none yet)
  int bad;          // a key that is not finite
};

// s takes in o's classes: counts add, flags or, the better (key, index) by
// BetterNearest's order (symmetric: any merge order gives the same winner).
__device__ __forceinline__ void MergeDecodeState(DecodeRowState& s, const DecodeRowState& o) {
  s.bad |= o.bad;
  s.count += o.count;
  if (BetterNearest(o.best, o.index, s.best, s.index)) {
    s.best = o.best;
    s.index = o.index;
  }
}

template <bool kRank, int BT>
__global__ void __launch_bounds__(kThreads, BT == 16 ? 4 : 0) DecodeRegKernel(DecodeSplitArgs a) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
  extern __shared__ __align__(16) float smem[];
  constexpr int CT = kRegClassTile;
  constexpr int WC = RegWarpSplits(BT);
  constexpr int CW = CT / WC;  // classes per warp and tile
  constexpr int NT = CW / 8;   // n8 fragments of keys per warp
  static_assert(BT == 16 || BT == 64, "row tile 16 or 64");
  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  const int g = lane / 4;
  const int t = lane % 4;
  const int wr = warp / WC;
  const int wc = warp % WC;
  const int kp = a.kc;  // one stage holds the whole padded row
  const int pitch = TilePitch(kp);
  float* m_s = smem;                  // [2][CT][pitch] code tiles
  float* u_s = m_s + 2 * CT * pitch;  // [BT][pitch] resident u; row r's label key at kp

  const int64_t k = a.code_length;
  const int64_t b0 = int64_t{blockIdx.x} * BT;
  const int split = blockIdx.y;
  const int64_t t_begin = split * a.class_tiles / a.splits;
  const int64_t t_end = (split + 1) * a.class_tiles / a.splits;
  const int64_t ntiles = t_end - t_begin;

  // The code tile at class c0 with ct in each row's padding; the caller
  // commits (ct goes by cp.async too).
  auto stage_code_tile = [&](float* buf, int64_t c0) {
    StageTile(buf, pitch, a.codes, k, c0, a.num_classes, CT, 0, kp, k, a.codes_vec);
    StageClassTerms<1>(buf, pitch, kp, a.ct, nullptr, c0, a.num_classes);
  };
  // The label tile: row r = the codeword of row b0 + r's label (r < BT, a
  // row of the batch with a label in [0, n)), else zeros; ct likewise.
  auto stage_label_tile = [&](float* buf) {
    const int per_row = kp / 4;  // 16-byte vectors (or 4 elements) per row
    for (int v = threadIdx.x; v < CT * per_row; v += kThreads) {
      const int r = v / per_row;
      const int j = (v - r * per_row) * 4;
      int64_t y = -1;
      if (kRank && r < BT && b0 + r < a.batch) {
        y = LoadLabel(a.labels, a.labels_int64, b0 + r);
        if (y < 0 || y >= a.num_classes) y = -1;
      }
      float* dst = buf + r * pitch + j;
      if (a.codes_vec) {
        const bool ok = y >= 0 && j < k;  // k is a multiple of 4 here
        ptx::cp_async_16(dst, ok ? a.codes + y * k + j : a.codes, ok ? 16 : 0);
      } else {
#pragma unroll
        for (int c = 0; c < 4; ++c) dst[c] = (y >= 0 && j + c < k) ? a.codes[y * k + j + c] : 0.0f;
      }
      if (j == 0) buf[r * pitch + kp] = y >= 0 ? a.ct[y] : 0.0f;
    }
  };

  // Keys of the warp's 16 rows x CW classes of the tile in `cur` (its first
  // nvalid rows are classes; -INFINITY past them), in registers: thread
  // (g, t) holds rows g (e < 2) and g + 8 (e >= 2), classes
  // clbase + 8 nt + (e & 1). The forward's logit loop at s = 1, rowc = 0.
  const int clbase = wc * CW + 2 * t;
  const float* la = FragRowA(u_s + wr * 16 * pitch, pitch, lane);
  auto tile_keys = [&](const float* cur, int nvalid, float (&d)[NT][4]) {
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) d[nt][e] = 0.0f;
    }
    const float* lb = FragRowB(cur + wc * CW * pitch, pitch, lane);
    for (int ks = 0; ks < kp; ks += 8) {
      uint32_t av[4];
      ptx::ldmatrix_x4(av, la + ks);
      uint32_t ab[4], as[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) SplitTf32Operand<true>(__uint_as_float(av[e]), &ab[e], &as[e]);
      uint32_t mv[NT][2];
      LoadFragsB<NT>(mv, lb, pitch, ks);
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        uint32_t bb[2], bs[2];
        CodeOperand<true, false, true>(__uint_as_float(mv[nt][0]), 0.0f, &bb[0], &bs[0]);
        CodeOperand<true, false, true>(__uint_as_float(mv[nt][1]), 0.0f, &bb[1], &bs[1]);
        MmaMode<true>(d[nt], ab, as, bb, bs);
      }
    }
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int cl = clbase + nt * 8 + (e & 1);
        d[nt][e] = cl < nvalid ? Logit(d[nt][e], 1.0f, cur[cl * pitch + kp], 0.0f) : -INFINITY;
      }
    }
  };

  // Rows g and g + 8 of the warp's 16 (index h = 0, 1).
  int64_t row[2], label[2];
  float label_key[2];
  DecodeRowState st[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    row[h] = b0 + wr * 16 + g + 8 * h;
    label[h] = (kRank && row[h] < a.batch) ? LoadLabel(a.labels, a.labels_int64, row[h]) : -1;
    st[h] = {0, -INFINITY, -1, 0};
  }

  StageTile(u_s, pitch, a.u, a.kp, b0, a.batch, BT, 0, kp, a.kp, true);
  if (kRank) stage_label_tile(m_s + CT * pitch);
  if (ntiles > 0) stage_code_tile(m_s, t_begin * CT);
  ptx::cp_async_commit();
  if constexpr (kRank) {
    ptx::cp_async_wait<0>();
    // u and the label tile visible to every thread.
    __syncthreads();  // [barrier-mutation-test] only=decodereg
    float d[NT][4];
    tile_keys(m_s + CT * pitch, BT, d);
    // The diagonal: tile row r = wr * 16 + g + 8h is the thread's class
    // when it lies in fragment nt at column e & 1.
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = wr * 16 + g + 8 * (e / 2);
        // u's padding: no fragment reads it, and it stays.
        if (clbase + nt * 8 + (e & 1) == r) u_s[r * pitch + kp] = d[nt][e];
      }
    }
    // Every label key written, and every read of the label tile done (its
    // buffer takes the second code tile next).
    __syncthreads();  // [barrier-mutation-test] only=decodereg
#pragma unroll
    for (int h = 0; h < 2; ++h) label_key[h] = u_s[(wr * 16 + g + 8 * h) * pitch + kp];
  }

  for (int64_t q = 0; q < ntiles; ++q) {
    const float* cur = m_s + (q & 1) * CT * pitch;
    if (q + 1 < ntiles) {
      stage_code_tile(m_s + ((q + 1) & 1) * CT * pitch, (t_begin + q + 1) * CT);
      ptx::cp_async_commit();
      ptx::cp_async_wait<1>();
    } else {
      ptx::cp_async_wait<0>();
    }
    // Tile q (and u) visible to every thread.
    __syncthreads();  // [barrier-mutation-test] only=decodereg

    const int64_t tile0 = (t_begin + q) * CT;
    const int nvalid = static_cast<int>(a.num_classes - tile0 < CT ? a.num_classes - tile0 : CT);
    float d[NT][4];
    tile_keys(cur, nvalid, d);
    // The label's class as an offset in the tile, or -1 (compared before
    // the subtraction: an int64 label may be any value).
    int own[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      own[h] = kRank && label[h] >= tile0 && label[h] < tile0 + nvalid
                   ? static_cast<int>(label[h] - tile0)
                   : -1;
    }
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int h = e / 2;
        const int cl = clbase + nt * 8 + (e & 1);
        const bool valid = cl < nvalid;
        const float x = d[nt][e];
        st[h].bad |= (valid && !isfinite(x)) ? 1 : 0;
        if constexpr (kRank) {
          // A NaN key compares false and is never counted.
          st[h].count += (valid && cl != own[h] && x > label_key[h]) ? 1 : 0;
        } else if (valid && (st[h].index < 0 || x > st[h].best)) {
          // The thread meets its classes in increasing order: a strict ">"
          // keeps the smallest index among equal keys.
          st[h].best = x;
          st[h].index = tile0 + cl;
        }
      }
    }
    // Buffer q & 1 is free for the prefetch of tile q + 2.
    __syncthreads();  // [barrier-mutation-test] only=decodereg cp-async=eager schedule=warps
  }

  // The quad's 4 threads hold different classes of the same two rows.
#pragma unroll
  for (int h = 0; h < 2; ++h) {
#pragma unroll
    for (int offset = 1; offset < 4; offset <<= 1) {
      // The partner's state: the fields this pass keeps, the others empty.
      DecodeRowState o{0, -INFINITY, -1, __shfl_xor_sync(kFullMask, st[h].bad, offset)};
      if constexpr (kRank) {
        o.count = __shfl_xor_sync(kFullMask, st[h].count, offset);
      } else {
        o.best = __shfl_xor_sync(kFullMask, st[h].best, offset);
        o.index = __shfl_xor_sync(kFullMask, st[h].index, offset);
      }
      MergeDecodeState(st[h], o);
    }
  }
  auto write = [&](int64_t b, const DecodeRowState& s) {
    const int64_t slot = b * a.splits + split;
    if (kRank) {
      a.part_count[slot] = s.count;
    } else {
      a.part_key[slot] = s.best;
      a.part_index[slot] = s.index;
    }
    a.part_bad[slot] = s.bad;
  };
  if constexpr (WC == 1) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      if (t == 0 && row[h] < a.batch) write(row[h], st[h]);
    }
  } else {
    // The WC class groups of each row through shared memory (the code
    // buffers: the loop's last barrier follows every read of them), merged
    // in warp order by one thread per row.
    DecodeRowState* st_s = reinterpret_cast<DecodeRowState*>(m_s);  // [WC][BT]
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      if (t == 0) st_s[wc * BT + wr * 16 + g + 8 * h] = st[h];
    }
    // Every warp's states written before the merge reads them.
    __syncthreads();  // [barrier-mutation-test] only=decodereg
    if (threadIdx.x < BT && b0 + threadIdx.x < a.batch) {
      DecodeRowState s = st_s[threadIdx.x];
      for (int w = 1; w < WC; ++w) MergeDecodeState(s, st_s[w * BT + threadIdx.x]);
      write(b0 + threadIdx.x, s);
    }
  }
#endif
}

static_assert(sizeof(DecodeRowState) * 4 * 16 <= 2 * kRegClassTile * (8 + 4) * sizeof(float),
              "the 16-row merge's states exceed the code buffers");

}  // namespace detail
}  // namespace cuda
}  // namespace keras_ecoc

#endif  // KERAS_ECOC_KERNELS_CUDA_ECOC_DECODE_REG_CUH_
