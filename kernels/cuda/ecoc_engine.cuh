// The inner-product engine shared by every pass: staging of row tiles (u)
// and class tiles (codes) into shared memory, and the tile product
//   S[r][c] = u_{b0 + r} . M_{c0 + c}     (BT rows x kClassTile classes)
// accumulated over column chunks of width kc (a multiple of 8).
//
// Two engines with one interface (Init / Step / Store):
//  * Fp32Engine: register-blocked FP32 FMAs, every architecture. Thread
//    (warp w, lane l) owns class l and rows w*BT/4 ... w*BT/4 + BT/4 - 1;
//    each (row, class) product is ONE sequential fma chain in increasing j
//    (the same chain as DotChain in ecoc_common.cuh), so a label's product
//    computed anywhere equals the tile's bit for bit and identical codewords
//    tie exactly.
//  * MmaEngine: TF32 mma.sync.m16n8k8 on sm_80 and later; warp w owns the
//    8 classes 8w .. 8w + 7 of the 16-row tile, or the rows 16w .. 16w + 15
//    and all 32 classes of the 64-row one (its comment). kSplit = true is
//    3xTF32: x = big + small with big = tf32(x), small = tf32(x - big), and
//    d += a_small*b_big + a_big*b_small + a_big*b_big (the small products
//    first), close to FP32 accuracy; kSplit = false is plain TF32.
// Both read the tiles at a row pitch of kc + 4 floats (kc a multiple of 8,
// so the pitch is 4 mod 8): the FP32 engine's float4 reads (8 classes per
// quarter warp) and the MMA fragment reads (8 rows x 4 columns per warp)
// then hit 32 distinct banks.
#ifndef KERAS_ECOC_KERNELS_CUDA_ECOC_ENGINE_CUH_
#define KERAS_ECOC_KERNELS_CUDA_ECOC_ENGINE_CUH_

#include <cstdint>

#include "ecoc_common.cuh"
#include "ecoc_ptx.cuh"
#include "ecoc_tf32.cuh"

namespace keras_ecoc {
namespace cuda {
namespace detail {

__host__ __device__ constexpr int TilePitch(int kc) { return kc + 4; }

// Walks the items v = threadIdx.x, threadIdx.x + nthreads, ... < count of a
// row-major grid with `per_row` items per row, calling f(row, column) for
// each. The row and column advance by the quotient and remainder of nthreads
// / per_row (a carry when the column wraps), so the walk costs two integer
// divisions per call instead of a division and a remainder per item: per_row
// is a run-time value, and ptxas expands each into some twenty instructions
// (sm_90), which made the staging loops a sixth of a register-softmax tile.
template <typename F>
__device__ __forceinline__ void ForEachGridItem(int count, int per_row, int nthreads, F f) {
  int v = threadIdx.x;
  if (v >= count) return;
  int r = v / per_row;
  int c = v - r * per_row;
  const int dr = nthreads / per_row;
  const int dc = nthreads - dr * per_row;
  for (; v < count; v += nthreads) {
    f(r, c);
    r += dr;
    c += dc;
    if (c >= per_row) {
      c -= per_row;
      ++r;
    }
  }
}

// Copies rows [row0, row0 + rows) x columns [j0, j0 + kc) of a row-major
// matrix (row stride `stride`, `nrows` x `ncols` valid) into dst[r * pitch + j],
// zero-filling what lies outside. `vec` = 16-byte copies (cp.async on sm_80
// and later): needs ncols and stride multiples of 4 and a 16-byte aligned
// base; otherwise element copies. All `nthreads` threads of the block take
// part; the caller commits / waits and synchronizes.
__device__ __forceinline__ void StageTile(float* dst, int pitch,
                                          const float* __restrict__ src,
                                          int64_t stride, int64_t row0,
                                          int64_t nrows, int rows, int64_t j0,
                                          int kc, int64_t ncols, bool vec,
                                          int nthreads = kThreads) {
  if (vec) {
    const int per_row = kc / 4;
    if (nthreads % per_row == 0) {
      // The common widths (kc = 8, 16, 32, 64, 128 with 128 or 256
      // threads): each thread keeps one 4-column slot and steps down the
      // rows, so its source and destination advance by constant strides and
      // no item multiplies a 64-bit row index (sm_90: 17-18 instructions
      // per 16-byte copy here, about 33 in the general walk below).
      const int c = (threadIdx.x % per_row) * 4;
      const int dr = nthreads / per_row;
      const bool col_ok = j0 + c < ncols;
      int64_t gr = row0 + threadIdx.x / per_row;
      const float* s = src + gr * stride + j0 + c;  // read only where ok
      float* d = dst + (threadIdx.x / per_row) * pitch + c;
      for (int r = threadIdx.x / per_row; r < rows;
           r += dr, gr += dr, s += dr * stride, d += dr * pitch) {
        // ncols is a multiple of 4: a vector is all in or all out.
        const bool ok = col_ok && gr < nrows;
        ptx::cp_async_16(d, ok ? s : src, ok ? 16 : 0);
      }
      return;
    }
    ForEachGridItem(rows * per_row, per_row, nthreads, [&](int r, int c) {
      const int jj = c * 4;
      const int64_t gr = row0 + r;
      const int64_t gj = j0 + jj;
      const bool ok = gr < nrows && gj < ncols;
      // ncols is a multiple of 4: a vector is all in or all out.
      ptx::cp_async_16(dst + r * pitch + jj, ok ? src + gr * stride + gj : src,
                       ok ? 16 : 0);
    });
  } else {
    ForEachGridItem(rows * kc, kc, nthreads, [&](int r, int jj) {
      const int64_t gr = row0 + r;
      const int64_t gj = j0 + jj;
      dst[r * pitch + jj] = (gr < nrows && gj < ncols) ? src[gr * stride + gj] : 0.0f;
    });
  }
}

// Row addresses for ptx::ldmatrix_x4 / _x2 (ecoc_ptx.cuh) of mma.m16n8k8
// TF32 fragments from a tile stored K-contiguous at `pitch` floats a row
// (u's rows, the codes' rows; pitch = 4 mod 8 and 16-byte aligned rows, as
// TilePitch gives for a multiple of 8: no bank conflict), at k step 0 (add
// ks for step ks). The registers hold what the scalar loads of the PTX
// fragment layout gave, so the products keep their bits.
//  * FragRowA: the A fragment of rows 0-15 of `rows`: the 4 matrices are
//    (rows 0-7, col 0), (rows 8-15, col 0), (rows 0-7, col 4), (rows 8-15,
//    col 4), i.e. a[0] .. a[3].
//  * FragRowB: the B fragments of two n8 tiles, classes 0-7 and 8-15 of
//    `cls`: matrices (classes 0-7, col 0), (0-7, col 4), (8-15, col 0),
//    (8-15, col 4), i.e. b[0], b[1] of the first tile, then of the second.
//    With ldmatrix_x2 (one tile) lanes 16-31's rows are not read.
__device__ __forceinline__ const float* FragRowA(const float* rows, int pitch, int lane) {
  return rows + (lane % 8 + 8 * ((lane / 8) % 2)) * pitch + 4 * (lane / 16);
}
__device__ __forceinline__ const float* FragRowB(const float* cls, int pitch, int lane) {
  return cls + (lane % 8 + 8 * (lane / 16)) * pitch + 4 * ((lane / 8) % 2);
}

// b[nt][0..1] for the NT consecutive n8 tiles of classes from FragRowB's
// row `lb` at k step ks: one ldmatrix_x4 per two tiles, ldmatrix_x2 for an
// odd last one.
template <int NT>
__device__ __forceinline__ void LoadFragsB(uint32_t (&b)[NT][2], const float* lb, int pitch,
                                           int ks) {
#pragma unroll
  for (int np = 0; np < NT / 2; ++np) {
    uint32_t r[4];
    ptx::ldmatrix_x4(r, lb + np * 16 * pitch + ks);
    b[2 * np][0] = r[0];
    b[2 * np][1] = r[1];
    b[2 * np + 1][0] = r[2];
    b[2 * np + 1][1] = r[3];
  }
  if constexpr (NT % 2 == 1) ptx::ldmatrix_x2(b[NT - 1], lb + (NT - 1) * 8 * pitch + ks);
}

template <int BT>
struct Fp32Engine {
  static constexpr int kRowsPerThread = BT / kWarps;
  float acc[kRowsPerThread];

  __device__ __forceinline__ void Init() {
#pragma unroll
    for (int i = 0; i < kRowsPerThread; ++i) acc[i] = 0.0f;
  }

  // R: [BT][pitch] rows, C: [kClassTile][pitch] classes, kc columns.
  __device__ __forceinline__ void Step(const float* R, const float* C, int pitch,
                                       int kc) {
    const int warp = threadIdx.x / kWarpSize;
    const int lane = threadIdx.x % kWarpSize;
    const float* m = C + lane * pitch;
    const float* u = R + warp * kRowsPerThread * pitch;
    for (int j = 0; j < kc; j += 4) {
      const float4 mv = *reinterpret_cast<const float4*>(m + j);
#pragma unroll
      for (int i = 0; i < kRowsPerThread; ++i) {
        // Broadcast: every lane of the warp reads the same row.
        const float4 uv = *reinterpret_cast<const float4*>(u + i * pitch + j);
        float d = acc[i];
        d = __fmaf_rn(uv.x, mv.x, d);
        d = __fmaf_rn(uv.y, mv.y, d);
        d = __fmaf_rn(uv.z, mv.z, d);
        d = __fmaf_rn(uv.w, mv.w, d);
        acc[i] = d;
      }
    }
  }

  __device__ __forceinline__ void Store(float* S) const {
    const int warp = threadIdx.x / kWarpSize;
    const int lane = threadIdx.x % kWarpSize;
#pragma unroll
    for (int i = 0; i < kRowsPerThread; ++i) {
      S[(warp * kRowsPerThread + i) * kSPitch + lane] = acc[i];
    }
  }
};

// Warp layout: every warp takes one m16 tile of rows and kNTiles n8 tiles
// of classes. With one m16 tile (BT = 16) warp w takes the classes
// 8w .. 8w + 7 of the 16 rows; with four (BT = 64) warp w takes the rows
// 16w .. 16w + 15 and all four n8 tiles. Every warp splits the operand it
// shares with the others, so the 64-row layout shares the code fragments
// (2 per n8 tile and k-step) and not the u fragments (4 per m16 tile and
// k-step): 12 TF32 splits and 12 shared loads per warp and k-step instead
// of the 18 and 18 of warps that each took 8 classes of all four m16 tiles.
// Each logit is the same mma position (row mod 16, class mod 8) of the same
// k-steps in either layout: the same bits.
// kLdmatrixA = false loads the A fragment (u) by 4 scalar loads: for the
// 16-row 3xTF32 kGradMma, whose register bound (64 on sm_90 for 8 blocks
// per SM, 80 on sm_80) spilled 4 bytes with ldmatrix's register quad at
// KMAX = 128 (sm_90) and 64 (sm_80), and which issued about as many
// instructions per tile either way (sm_90 SASS).
template <int BT, bool kSplit, bool kLdmatrixA = true>
struct MmaEngine {
  static_assert(BT == 16 || BT == kWarps * 16, "one m16 tile, or one per warp");
  static_assert(kClassTile == kWarps * 8, "one n8 tile of classes per warp at BT = 16");
  static constexpr bool kWarpRows = BT == kWarps * 16;  // warp w: rows 16w ..
  static constexpr int kNTiles = kWarpRows ? kClassTile / 8 : 1;
  // k-steps per pass of Step's loop: 2 in the 64-row 3xTF32 engine. Its
  // loop drained every product before the back edge (ptxas pads the branch
  // with stall counts) and loaded the next step's operands only after it;
  // two steps a pass take 42 % fewer stall cycles per product in the
  // 64-row 3xTF32 kGradMma at KMAX = 128 (sm_90 SASS; 24.4 -> 14.2) and
  // 24 % in the 64-row 3xTF32 split forward. The others keep the loop as
  // ptxas unrolls it by itself: 2 cost the 16-row TF32 engines a third more.
  static constexpr int kStepsPerPass = kWarpRows && kSplit ? 2 : 1;
  float d[kNTiles][4];

  __device__ __forceinline__ void Init() {
#pragma unroll
    for (int nt = 0; nt < kNTiles; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) d[nt][e] = 0.0f;
    }
  }

  // The warp's first row and first class.
  __device__ __forceinline__ static int Row0(int warp) { return kWarpRows ? warp * 16 : 0; }
  __device__ __forceinline__ static int Class0(int warp) { return kWarpRows ? 0 : warp * 8; }

  __device__ __forceinline__ void Step(const float* R, const float* C, int pitch,
                                       int kc) {
    const int warp = threadIdx.x / kWarpSize;
    const int lane = threadIdx.x % kWarpSize;
    // The fragments by ldmatrix (FragRowA / FragRowB): one instruction for
    // A and one per two n8 tiles of B instead of 4 scalar loads each.
    const float* la = FragRowA(R + Row0(warp) * pitch, pitch, lane);
    const float* lb = FragRowB(C + Class0(warp) * pitch, pitch, lane);
    auto step = [&](int ks) {
      uint32_t av[4];
      if constexpr (kLdmatrixA) {
        ptx::ldmatrix_x4(av, la + ks);
      } else {
        const int g = lane / 4, t = lane % 4;
        const float* ra = R + (Row0(warp) + g) * pitch + ks + t;
        av[0] = __float_as_uint(ra[0]);
        av[1] = __float_as_uint(ra[8 * pitch]);
        av[2] = __float_as_uint(ra[4]);
        av[3] = __float_as_uint(ra[8 * pitch + 4]);
      }
      uint32_t a_big[4], a_small[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) SplitTf32Finite(__uint_as_float(av[e]), &a_big[e], &a_small[e]);
      uint32_t bv[kNTiles][2];
      LoadFragsB<kNTiles>(bv, lb, pitch, ks);
#pragma unroll
      for (int nt = 0; nt < kNTiles; ++nt) {
        uint32_t b_big[2], b_small[2];
        SplitTf32Finite(__uint_as_float(bv[nt][0]), &b_big[0], &b_small[0]);
        SplitTf32Finite(__uint_as_float(bv[nt][1]), &b_big[1], &b_small[1]);
        if (kSplit) {
          ptx::mma_m16n8k8_tf32(d[nt], a_small, b_big, d[nt]);
          ptx::mma_m16n8k8_tf32(d[nt], a_big, b_small, d[nt]);
        }
        ptx::mma_m16n8k8_tf32(d[nt], a_big, b_big, d[nt]);
      }
    };
    if constexpr (kStepsPerPass == 2) {
#pragma unroll 2
      for (int ks = 0; ks < kc; ks += 8) step(ks);
    } else {
      // No pragma: ptxas unrolls as it sees fit ("unroll 1" would forbid it).
      for (int ks = 0; ks < kc; ks += 8) step(ks);
    }
  }

  __device__ __forceinline__ void Store(float* S) const { StoreFragments(d, S); }

  // The logit fragments d of a warp into S [BT][kSPitch] (Store's layout):
  // also the wgmma codes gradient's, whose m64n32 accumulators have the
  // 64-row engine's layout.
  __device__ __forceinline__ static void StoreFragments(const float (&d)[kNTiles][4], float* S) {
    const int warp = threadIdx.x / kWarpSize;
    const int lane = threadIdx.x % kWarpSize;
    const int g = lane / 4;
    const int t = lane % 4;
    const int r = Row0(warp) + g;
#pragma unroll
    for (int nt = 0; nt < kNTiles; ++nt) {
      const int c = Class0(warp) + nt * 8 + 2 * t;
      S[r * kSPitch + c] = d[nt][0];
      S[r * kSPitch + c + 1] = d[nt][1];
      S[(r + 8) * kSPitch + c] = d[nt][2];
      S[(r + 8) * kSPitch + c + 1] = d[nt][3];
    }
  }
};

// The engine of a math mode on the architecture being compiled: below
// sm_80 there is no TF32 mma and every mode is the FP32 engine (the host
// launchers also ask for kMathFp32 there).
template <int kMath, int BT>
struct EngineFor {
  using type = Fp32Engine<BT>;
};
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
template <int BT>
struct EngineFor<kMath3xTf32, BT> {
  using type = MmaEngine<BT, true>;
};
template <int BT>
struct EngineFor<kMathTf32, BT> {
  using type = MmaEngine<BT, false>;
};
#endif

}  // namespace detail
}  // namespace cuda
}  // namespace keras_ecoc

#endif  // KERAS_ECOC_KERNELS_CUDA_ECOC_ENGINE_CUH_
