// Forward split kernel of the kRegSoftmax variants, FlashAttention-2 style:
// the logits of a class tile never leave the mma accumulator registers.
//
// Same grid and the same partial states as ForwardSplitKernel
// (ecoc_forward.cuh): (batch tiles of BT rows) x (class splits), each block
// streaming the 64-class tiles of its split; ecoc_combine.cuh merges the
// partial states. What differs:
//  * Warp layout: warp w = (wr, wc) owns the 16 rows wr*16 .. wr*16 + 15 of
//    the batch tile and the CW = 64 / WC classes wc*CW .. wc*CW + CW - 1 of
//    every class tile, WR = BT / 16 row groups x WC = 4 / WR class groups
//    (BT = 16: 4 warps on 16 classes each; BT = 64: 4 warps on 16 rows each,
//    all 64 classes).
//  * Logits: the warp's 16 x CW tile of u.M is NT = CW / 8 mma accumulators
//    (m16n8k8, TF32 or 3xTF32 with the MmaEngine's order of the three
//    products, so every logit has the bits of v2's). Thread (g, t) = (lane / 4,
//    lane % 4) holds rows g and g + 8, classes 8*nt + 2t and 8*nt + 2t + 1.
//  * Online softmax on the fragments: row max over the thread's 2*NT values,
//    then two xor-shuffles over the 4 threads that share the row (a "quad");
//    the running sums are per-thread partials (every thread of a quad
//    rescales by the same alpha) reduced over the quad once, at the end.
//    The label's logit is the fragment value itself (the softmax uses the
//    same number).
//  * Fragments of u and of the codes by ldmatrix (ecoc_engine.cuh:
//    FragRowA, LoadFragsB): the registers the PTX layout's scalar loads
//    gave, one instruction per A fragment and per two n8 B fragments.
//  * Expected code from registers: acc (16 rows x kp columns of the warp,
//    m16n8 accumulator fragments, kp <= kRegMaxK) is rescaled by alpha and
//    then accumulates P.M with mma, P taken from the logit fragments as the A
//    operand. In the 4-warp kernels the columns of each 4 blocks interleave
//    (RegAccColumn), so that the codes come by 16-byte loads. An
//    accumulator fragment holds classes 2t, 2t + 1 where the A operand
//    wants t, t + 4; the order of a dot product's terms is free, so
//    A's k index t stands for class 2t and t + 4 for class 2t + 1, and the B
//    operand (the codes) is read with the same permutation. 3xTF32 splits p
//    and M as the logit engine does; plain TF32 does not.
//  * u stays resident in shared memory (one stage for the whole block: the
//    row is never split into column stages here), after the code tiles;
//    only the code tiles are double-buffered, each with its classes' ct
//    and ||M||^2 in the rows' padding columns, so the softmax reads no
//    global memory.
//  * Each warp keeps its own softmax state over its classes: with WC > 1 a
//    block writes WC partial states per (row, split), slot split * WC + wc,
//    and the combine merges splits * WC states in that fixed order.
//  * NW = 8 (variant bit kWarps8): 256 threads share each staged code tile,
//    twice the warps in flight per byte of shared memory (WR x WC = 1 x 8
//    at BT = 16: 8 classes per warp and tile; 4 x 2 at BT = 64: 32). The
//    block then merges its WC warps' online-softmax states per row in
//    increasing wc (= class) order in shared memory (the code buffers,
//    free after the last tile) and writes one partial state per (row,
//    split), so the combine reads no more states than with 4 warps.
//  * BT = 128 (variant kRows128, 8 warps): 8 x 1, every warp 16 rows and
//    all 64 classes of each tile, as in the 4-warp 64-row kernel, so no
//    merge. The block loads each code tile into registers while the
//    previous one runs and stores it split into its TF32 halves, once, by
//    rows (the logits' B operand) and transposed (the expected code's A
//    operand: that product runs transposed, AccumulateExpectedCodeT).
//  * KWG (variant kWgmma, sm_90a only): the 128-row kernel with both
//    products on Hopper's wgmma, B read by the tensor cores from the tile's
//    halves in shared memory (the section "The 128-row kernel on Hopper's
//    wgmma" below); the expected code in row form again.
// The launcher uses it only on sm_80+ in a TF32 math mode with kp <= 128;
// other calls of the variant run ForwardSplitKernel (see MakePlan).
#ifndef KERAS_ECOC_KERNELS_CUDA_ECOC_FORWARD_REG_CUH_
#define KERAS_ECOC_KERNELS_CUDA_ECOC_FORWARD_REG_CUH_

#include <cstdint>

#include "ecoc_common.cuh"
#include "ecoc_engine.cuh"
#include "ecoc_forward.cuh"

namespace keras_ecoc {
namespace cuda {
namespace detail {

constexpr int kRegClassTile = 64;
// Widest padded code row whose expected-code accumulators stay in registers
// (kRegMaxK / 8 fragments of 4 floats per thread).
constexpr int kRegMaxK = 128;
// The 4-warp kernels' instantiation for short code rows (kp <= 32): a
// quarter of the accumulators, so fewer registers per thread.
constexpr int kRegShortK = 32;

// The 128-row tile of the 8-warp kernel (variant kRows128).
constexpr int kRegRows128 = 128;

// Expected-code blocks per test in the 4-warp kernels (AccumulateExpectedCode's
// kGroup), per instantiation: the group that gave ptxas (sm_90) the fewest
// stall cycles per tile (sass_loop_stats.py) without spills under the
// kernel's launch bound.
//  * 64-row, KMAX = kRegMaxK: 8. Groups of 2 or 4 still left runs of 20-23
//    dependent products in the 3xTF32 kernels' SASS; 16 left none either,
//    but at 219 registers and up to 15 wasted blocks.
//  * Every other 4-warp kernel: 4, one set of interleaved columns
//    (RegVecColumns). Before the fragments came by ldmatrix, 4 spilled in
//    the unfolded 16-row 3xTF32 kernel at KMAX = kRegMaxK and in the folded
//    kernels at kRegShortK, which took 2; with it none spills (sm_80, sm_90)
//    and 4 takes 2-9 % fewer instructions and up to 10 % fewer stall
//    cycles per tile than 2 (sm_90). At kp < 32 it computes up to 3 blocks
//    of columns past kp (at most 1 with 2); those rows are short.
__host__ __device__ constexpr int RegExpectedGroup(int bt, int kmax) {
  return kmax == kRegMaxK && bt == 64 ? 8 : 4;
}

// Whether ForwardRegKernel<kMath, bt, nw, fold, kmax> splits each code tile
// into its TF32 halves once, in shared memory, before its warps read it:
// the big halves in place, in 3xTF32 the small halves in two more tile
// buffers. In the 4-warp 64-row kernel every warp takes 16 rows and all 64
// classes of the tile, and split every code element it read, once for the
// logits and once for the expected code: 8 splits per element and tile,
// about a fifth of its tile loop's instructions at kp <= 32 (sm_90 SASS).
// There at kp <= 32 only: at kp = 128 the small halves (66 KiB) would
// leave one 4-warp block per SM. The 128-row 8-warp kernel (kRows128) is
// built around the split: its 8 row warps share each tile, which its block
// splits on the way from registers to shared memory (StoreRows128Codes),
// and its 200 KiB at kp = 128 hold as many warps per SM (8) as two 4-warp
// 64-row blocks. The 16-row kernels give each warp its own classes, and the
// folded-norms kernel reads the codes themselves.
__host__ __device__ constexpr bool RegPreSplitsCodes(int bt, int nw, bool fold, int kmax) {
  return (bt == 64 && nw == kWarps && !fold && kmax <= kRegShortK) || bt == kRegRows128;
}

// Where the small halves of a pre-split code tile lie: this many floats
// after its big halves. A compile-time distance (the two code buffers at
// the widest pitch of kp <= 32), so that a fragment's small half is one
// more shared load at an immediate offset from its big half's address.
constexpr int kRegSmallHalves = 2 * kRegClassTile * (kRegShortK + 4);

// Shared-memory floats of ForwardRegKernel: two code tiles (with
// `small_halves`, RegPreSplitsCodes in 3xTF32 at kp <= 32: their big halves,
// then from kRegSmallHalves their small halves), then the resident u tile,
// all at the engine's pitch kp + 4. Each code row's first two padding
// columns (kp, kp + 1) hold its class's ct and ||M||^2.
__host__ __device__ constexpr int64_t ForwardRegSmemFloats(int bt, int kp,
                                                           bool small_halves = false) {
  return small_halves ? int64_t{bt} * TilePitch(kp) + 2 * int64_t{kRegSmallHalves}
                      : int64_t{bt + 2 * kRegClassTile} * TilePitch(kp);
}

// Whether a kernel's expected-code blocks interleave their columns by sets
// of 4 (AccumulateExpectedCode's kVec): where its group of blocks per test
// is a whole number of sets, so that the interleave costs no product.
__host__ __device__ constexpr bool RegVecColumns(int group) { return group > 0 && group % 4 == 0; }
// ... except in the 16-row 3xTF32 kernel below sm_90, where the interleave
// spilled 24 bytes at its 128-register bound (sm_80; none on sm_90).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
constexpr bool kRegVec16Split = false;
#else
constexpr bool kRegVec16Split = true;
#endif

// The column of the expected code that accumulator block jn holds at n8
// index n (the accumulator layout's column 2t or 2t + 1): with the
// interleave (RegVecColumns), blocks 4 jv .. 4 jv + 3 hold the columns
// 32 jv + 4 n + (jn % 4); else block jn holds jn * 8 + n.
__host__ __device__ constexpr int RegAccColumn(bool vec, int jn, int n) {
  return vec ? (jn / 4) * 32 + 4 * n + jn % 4 : jn * 8 + n;
}

// Splits the kp columns of the CT-row code tile `tile` into TF32 halves in
// place (the big half) and, in 3xTF32, kRegSmallHalves floats on (the small half), with
// SplitTf32Finite, the split the warps applied to each element before
// (the same bits). The padding columns (ct, ||M||^2) are left as they are.
// 128 threads: thread (r, c) takes the 4 columns 4c of rows r, r + 16, ...
template <bool kSplit, int CT, int NTH>
__device__ __forceinline__ void SplitCodeTile(float* tile, int pitch, int kp) {
  static_assert(NTH == 128 && CT % 16 == 0, "16 rows x 8 four-column slots per pass");
  const int c = (threadIdx.x % 8) * 4;
  if (c >= kp) return;  // kp <= 32: slots past the row idle
#pragma unroll
  for (int r = threadIdx.x / 8; r < CT; r += 16) {
    float4* hp = reinterpret_cast<float4*>(tile + r * pitch + c);
    const float4 x = *hp;
    uint32_t b[4], sm[4];
    SplitTf32Finite(x.x, &b[0], &sm[0]);
    SplitTf32Finite(x.y, &b[1], &sm[1]);
    SplitTf32Finite(x.z, &b[2], &sm[2]);
    SplitTf32Finite(x.w, &b[3], &sm[3]);
    *hp = make_float4(__uint_as_float(b[0]), __uint_as_float(b[1]), __uint_as_float(b[2]),
                      __uint_as_float(b[3]));
    if (kSplit) {
      *reinterpret_cast<float4*>(tile + kRegSmallHalves + r * pitch + c) =
          make_float4(__uint_as_float(sm[0]), __uint_as_float(sm[1]), __uint_as_float(sm[2]),
                      __uint_as_float(sm[3]));
    }
  }
}

// Stages the ct and ||M||^2 of the 64 classes from c0 into the padding
// columns kp and kp + 1 of the code tile `tile` (zero past n), with 4-byte
// cp.async by the block's first 128 threads (the caller commits the group):
// the per-class terms arrive with the codes, and the padding the fragment
// loads never read costs no shared memory (a separate 1 KiB would cut the
// 16-row kernel at k = 128 from 3 to 2 blocks per H100 SM). kTerms = 1:
// ct only (the decode kernel's keys; sqn unused).
template <int kTerms = 2>
__device__ __forceinline__ void StageClassTerms(float* tile, int pitch, int kp, const float* ct,
                                                const float* sqn, int64_t c0, int64_t n) {
  static_assert(kTerms == 1 || kTerms == 2, "ct, or ct and ||M||^2");
  if (threadIdx.x < kTerms * kRegClassTile) {
    const int cl = threadIdx.x % kRegClassTile;
    const int which = threadIdx.x / kRegClassTile;  // 0: ct, 1: ||M||^2
    const bool ok = c0 + cl < n;
    const float* src = which == 0 ? ct : sqn;
    ptx::cp_async_4(tile + cl * pitch + kp + which, ok ? src + c0 + cl : src, ok ? 4 : 0);
  }
}

// Warps per row group (class groups) of the kRegSoftmax kernel with nw
// warps per block.
__host__ __device__ constexpr int RegWarpSplits(int bt, int nw = kWarps) {
  return nw / (bt / 16);
}

// The 8-warp kernel's merge keeps WC * BT = 128 rows of kp accumulators and
// 3 x 128 statistics in the two code buffers (128 * (kp + 4) floats).
static_assert(8 * 16 * kRegMaxK + 3 * 8 * 16 <= 2 * kRegClassTile * (kRegMaxK + 4),
              "merge scratch exceeds the code buffers");

// The TF32 halves of a code element for the tensor-core products: with
// kPreSplit x is already its big half and xs its small half (read from the
// pre-split tile's small halves, kRegSmallHalves on; unused in plain TF32),
// else x is split here.
template <bool kSplit, bool kPreSplit, bool kFiniteSplit>
__device__ __forceinline__ void CodeOperand(float x, float xs, uint32_t* big, uint32_t* small) {
  if constexpr (kPreSplit) {
    *big = __float_as_uint(x);
    *small = kSplit ? __float_as_uint(xs) : 0u;
  } else {
    SplitTf32Operand<kFiniteSplit>(x, big, small);
  }
}

// d += a * b in the math mode from split operands: 3xTF32 (small products
// first, as MmaEngine) or plain TF32 (the small halves unused).
template <bool kSplit>
__device__ __forceinline__ void MmaMode(float d[4], const uint32_t ab[4], const uint32_t as[4],
                                        const uint32_t bb[2], const uint32_t bs[2]) {
  if (kSplit) {
    ptx::mma_m16n8k8_tf32(d, as, bb, d);
    ptx::mma_m16n8k8_tf32(d, ab, bs, d);
  }
  ptx::mma_m16n8k8_tf32(d, ab, bb, d);
}

// ---------------------------------------------------------------------------
// The 128-row kernel (kRows128). Its expected code runs transposed,
//   acc^T (kp x 16 rows) += M^T (kp x 8 classes) . P^T (8 classes x 16 rows),
// so that P^T is the B operand straight from the logit fragments (thread
// (g, t) holds p of row g at classes 2t, 2t + 1 and of row g + 8: b[0], b[1]
// of the n8 tiles of rows 0-7 and 8-15, with k index t = class 2t and
// t + 4 = class 2t + 1 as in AccumulateExpectedCode) and M^T the A operand,
// which ldmatrix loads from a transposed copy of the code tile (FragRowA):
// each code column a row of kRegTPitch floats, the classes of each 8 in the
// order 0, 2, 4, 6, 1, 3, 5, 7 (RegTransposedClass), so that a row's 4
// words at 8 nt and 8 nt + 4 are classes 2t and 2t + 1. The mma's register
// pairs then come from the loads as they are; reading pre-split halves row
// by row instead (the 4-warp kernels' expected code) costs a move per loaded
// half (sm_90 SASS).
//
// Shared memory (floats, all offsets compile-time but u's rows): the code
// tile's big halves by rows at the pitch kp + 4 (ct and ||M||^2 in the
// padding), in 3xTF32 its small halves (Rows128RowMajor on), the transposed
// big halves, in 3xTF32 the transposed small halves (Rows128Transposed on),
// then the resident u tile. One copy of each: the block stores tile q + 1
// from registers (LoadRows128Codes, issued while tile q runs) after the
// barrier that ends tile q.
constexpr int kRegTPitch = kRegClassTile + 4;  // 68 = 4 (mod 32): ldmatrix rows conflict-free

// Where class cl of a tile sits in a row of the transposed copy.
__host__ __device__ constexpr int RegTransposedClass(int cl) {
  return (cl & ~7) | ((cl & 1) != 0 ? 4 + ((cl & 7) >> 1) : (cl & 7) >> 1);
}
__host__ __device__ constexpr int Rows128RowMajor(int kmax) { return kRegClassTile * (kmax + 4); }
__host__ __device__ constexpr int Rows128Transposed(int kmax) { return kmax * kRegTPitch; }

// The 128-row kernel on Hopper's wgmma (variant kWgmma, sm_90a; KWG below):
// both products of each warpgroup's 64 rows are wgmma with A from
// registers and B, the code tile's TF32 halves, read by the tensor cores
// from shared memory, so the 8 row warps no longer load and split code
// fragments. The logits: m64n64k8, A = u by the warp's ldmatrix and split
// as before. The expected code: m64nNk8 (N = 32, 64 or 128 columns, the
// narrowest that holds kp) in row form, A = P from the logit fragments
// (AccumulateExpectedCodeWg). Both copies of the tile are in wgmma's K-major
// core-matrix layout (ecoc_wgmma_desc.h) instead of at a padded pitch. By
// rows: 8 classes x 4 columns per 128 bytes, the 4-column groups of a class
// group adjacent (LBO 128 bytes), the class groups kRegMaxK / 4 core
// matrices apart (SBO); ct and ||M||^2 of the tile's classes, which sat in
// that copy's padding, in 2 x 64 floats of their own after it. Transposed:
// below. u as in the 128-row kernel.
constexpr uint32_t kWgRowsLbo = 128;                       // bytes
constexpr uint32_t kWgRowsSbo = kRegMaxK / 4 * 128;        // bytes: 4 KiB
constexpr int kWgRowsFloats = kRegClassTile * kRegMaxK;    // one half: 32 KiB
// The transposed copy under kWgmma, the expected code's B operand
// (N = kRegMaxK code columns x K = 64 classes, K-major): each code column's
// 64 classes (in RegTransposedClass's order) as 16 core matrices of 4
// classes, LBO 144 bytes apart (36 floats: the 32 lanes' stores of one
// column, classes c' at 36 (c' / 4) + c' % 4, fall in 32 distinct banks;
// at 128 bytes they would share 4), the 8-column groups SBO apart.
constexpr uint32_t kWgTLbo = 144;                               // bytes
constexpr uint32_t kWgTSbo = kRegClassTile / 4 * kWgTLbo;      // bytes: 2,304
constexpr int kWgTFloats = kRegMaxK / 8 * static_cast<int>(kWgTSbo / 4);  // one half: 36 KiB
__host__ __device__ constexpr int WgTOffset(int j, int ct) {
  return (j / 8) * static_cast<int>(kWgTSbo / 4) + (ct / 4) * static_cast<int>(kWgTLbo / 4) +
         (j % 8) * 4 + ct % 4;
}
// Float offset of class cl, column j in the core-matrix copy.
__host__ __device__ constexpr int WgRowOffset(int cl, int j) {
  return (cl / 8) * static_cast<int>(kWgRowsSbo / 4) + (j / 4) * static_cast<int>(kWgRowsLbo / 4) +
         (cl % 8) * 4 + j % 4;
}
// The by-rows copy's floats per half in either layout, and the class terms'
// floats (kWgmma only).
__host__ __device__ constexpr int Rows128RowCopy(int kmax, bool wg) {
  return wg ? kWgRowsFloats : Rows128RowMajor(kmax);
}
__host__ __device__ constexpr int Rows128Terms(bool wg) { return wg ? 2 * kRegClassTile : 0; }
__host__ __device__ constexpr int Rows128TCopy(int kmax, bool wg) {
  return wg ? kWgTFloats : Rows128Transposed(kmax);
}
// Shared-memory floats of the 128-row kernel at padded row kp (wg: kWgmma):
// 200 KiB in 3xTF32 at kp = 128 (split), 133 KiB in TF32; with kWgmma
// 202.5 KiB and 134.5 KiB.
__host__ __device__ constexpr int64_t ForwardRows128SmemFloats(int kp, bool split, bool wg) {
  return (split ? 2 : 1) *
             int64_t{Rows128RowCopy(kRegMaxK, wg) + Rows128TCopy(kRegMaxK, wg)} +
         Rows128Terms(wg) + int64_t{kRegRows128} * TilePitch(kp);
}
static_assert(ForwardRows128SmemFloats(kRegMaxK, true, true) * 4 < 16384 * 16,
              "wgmma descriptors address 256 KiB of shared memory");

// One thread's share of a code tile on its way to shared memory: class
// (warp % 2) * 32 + lane of the tile, columns (warp / 2) * 32 .. + 31 (8
// warps x 32 columns = kRegMaxK), zero past k and past n; ct and ||M||^2 of
// the class in the threads of columns 0-31.
struct Rows128Codes {
  float v[kRegMaxK / 4];
  float ct, sqn;
};

// This thread's share (Rows128Codes): its class in the tile and its first
// column. The one definition for the loads and the stores.
__device__ __forceinline__ int Rows128ShareClass() {
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  return (warp % 2) * kWarpSize + lane;
}
__device__ __forceinline__ int Rows128ShareColumn0() {
  const int warp = threadIdx.x / kWarpSize;
  return (warp / 2) * 32;
}

// Loads the share of the tile at class c0 (each lane 128 contiguous bytes of
// its class's row, as 16-byte loads where a.codes_vec). Columns at or past
// kp are not loaded: their slots idle.
__device__ __forceinline__ void LoadRows128Codes(Rows128Codes& r, const ForwardSplitArgs& a,
                                                 int64_t c0, int kp) {
  const int64_t c = c0 + Rows128ShareClass();
  const int j0 = Rows128ShareColumn0();
  const int64_t k = a.code_length;
  const bool row_ok = c < a.num_classes;
  const float* src = row_ok ? a.codes + c * k : a.codes;  // read only where ok
  if (j0 < kp) {
    if (a.codes_vec) {
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const int j = j0 + 4 * i;
        // k is a multiple of 4 here: a vector is all in or all out.
        const float4 x = row_ok && j < k ? *reinterpret_cast<const float4*>(src + j)
                                         : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        r.v[4 * i] = x.x;
        r.v[4 * i + 1] = x.y;
        r.v[4 * i + 2] = x.z;
        r.v[4 * i + 3] = x.w;
      }
    } else {
#pragma unroll
      for (int i = 0; i < 32; ++i) r.v[i] = row_ok && j0 + i < k ? src[j0 + i] : 0.0f;
    }
  }
  if (j0 == 0) {
    r.ct = row_ok ? a.ct[c] : 0.0f;
    r.sqn = row_ok ? a.sqn[c] : 0.0f;
  }
}

// Stores a share (LoadRows128Codes) as TF32 halves (SplitTf32Finite, the
// split the warps would apply): by rows into rows (pitch kp + 4; the small
// halves Rows128RowMajor on, in 3xTF32) and transposed into trans (the small
// halves Rows128Transposed on). Lanes are classes, so the transposed stores
// of a warp are 32 consecutive words and its row stores 16-byte vectors at
// the pitch's 4 (mod 8): no bank conflict either way. kp is a multiple of 8,
// so a vector of 4 columns is all below kp or all at or past it.
// kWg (kWgmma): the by-rows copy in the core-matrix layout (WgRowOffset:
// a warp's lanes are classes, so each quarter-warp's 16-byte stores fill one
// core matrix's 128 bytes) and ct, ||M||^2 into terms[cl], terms[64 + cl].
template <bool kSplit, bool kWg = false>
__device__ __forceinline__ void StoreRows128Codes(const Rows128Codes& r, float* rows,
                                                  float* trans, int pitch, int kp,
                                                  float* terms = nullptr) {
  const int cl = Rows128ShareClass();
  const int j0 = Rows128ShareColumn0();
  float* rrow = rows + cl * pitch;
  float* tcol = trans + RegTransposedClass(cl);
  constexpr int kSmall = Rows128RowCopy(kRegMaxK, kWg);
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int j = j0 + 4 * i;
    if (j < kp) {
      uint32_t b[4], sm[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) SplitTf32Finite(r.v[4 * i + e], &b[e], &sm[e]);
      float* at = kWg ? rows + WgRowOffset(cl, j) : rrow + j;
      *reinterpret_cast<float4*>(at) =
          make_float4(__uint_as_float(b[0]), __uint_as_float(b[1]), __uint_as_float(b[2]),
                      __uint_as_float(b[3]));
      if (kSplit) {
        *reinterpret_cast<float4*>(at + kSmall) =
            make_float4(__uint_as_float(sm[0]), __uint_as_float(sm[1]), __uint_as_float(sm[2]),
                        __uint_as_float(sm[3]));
      }
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float* tat = kWg ? trans + WgTOffset(j + e, RegTransposedClass(cl))
                         : tcol + (j + e) * kRegTPitch;
        *tat = __uint_as_float(b[e]);
        if (kSplit) tat[Rows128TCopy(kRegMaxK, kWg)] = __uint_as_float(sm[e]);
      }
    }
  }
  if (j0 == 0) {
    if (kWg) {
      terms[cl] = r.ct;
      terms[kRegClassTile + cl] = r.sqn;
    } else {
      rrow[kp] = r.ct;
      rrow[kp + 1] = r.sqn;
    }
  }
}

// acc^T = alpha * acc^T + M^T . P^T for the warp's 16 rows (the header
// above): acc[2 mt + h] is the fragment of code columns 16 mt .. 16 mt + 15
// and rows 8 h .. 8 h + 7 of the warp's, thread (g, t) holding columns
// 16 mt + g (e < 2) and 16 mt + g + 8 (e >= 2) of rows 8 h + 2t + (e & 1).
// arow[h][c]: alpha of row 8 h + 2t + c. Column tiles go 4 at a time
// behind one test (64 columns: those past kp are never stored; their
// transposed rows lie inside the copy, which has kRegMaxK of them), nt
// outer, so that each accumulator takes its products in increasing nt and
// 8 independent accumulators take each fragment's.
template <bool kSplit, int NT, int KN>
__device__ __forceinline__ void AccumulateExpectedCodeT(float (&acc)[KN][4],
                                                        const float (&d)[NT][4],
                                                        const float* trans, int kp,
                                                        const float (&arow)[2][2]) {
  constexpr int MT = KN / 2;  // 16-column tiles
  static_assert(MT % 4 == 0, "column tiles by fours");
  const int lane = threadIdx.x % kWarpSize;
  const float* la = FragRowA(trans, kRegTPitch, lane);
#pragma unroll
  for (int m0 = 0; m0 < MT; m0 += 4) {
    if (m0 * 16 < kp) {
#pragma unroll
      for (int mt = m0; mt < m0 + 4; ++mt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          acc[2 * mt][e] *= arow[0][e & 1];
          acc[2 * mt + 1][e] *= arow[1][e & 1];
        }
      }
    }
  }
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    // P^T: b[0] = p(row g, class 2t), b[1] = p(row g, class 2t + 1) of the
    // rows 0-7 (h = 0) and 8-15 (h = 1).
    uint32_t pb[2][2], ps[2][2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      SplitTf32(d[nt][2 * h], &pb[h][0], &ps[h][0]);
      SplitTf32(d[nt][2 * h + 1], &pb[h][1], &ps[h][1]);
    }
#pragma unroll
    for (int m0 = 0; m0 < MT; m0 += 4) {
      if (m0 * 16 < kp) {
#pragma unroll
        for (int mt = m0; mt < m0 + 4; ++mt) {
          uint32_t ab[4], as[4] = {0u, 0u, 0u, 0u};
          ptx::ldmatrix_x4(ab, la + mt * 16 * kRegTPitch + nt * 8);
          if (kSplit) {
            ptx::ldmatrix_x4(as, la + Rows128Transposed(kRegMaxK) + mt * 16 * kRegTPitch + nt * 8);
          }
          // MmaMode's order of the products in the row-wise form (P as A):
          // Ps.Mb, Pb.Ms, Pb.Mb, so that acc^T holds the bits acc would.
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            if (kSplit) {
              ptx::mma_m16n8k8_tf32(acc[2 * mt + h], ab, ps[h], acc[2 * mt + h]);
              ptx::mma_m16n8k8_tf32(acc[2 * mt + h], as, pb[h], acc[2 * mt + h]);
            }
            ptx::mma_m16n8k8_tf32(acc[2 * mt + h], ab, pb[h], acc[2 * mt + h]);
          }
        }
      }
    }
  }
}

// kWgmma's expected code, row form: acc (the warp's 16 rows x N columns,
// acc[j][e] = column 8 j + 2t + (e & 1) of row g + 8 (e / 2), the wgmma
// m64nN accumulator) = alpha * acc + P . M, the warpgroup's 64 rows per
// product: A = P from the logit fragments (k-step nt: classes
// 8 nt .. 8 nt + 7, k index t = class 2t and t + 4 = class 2t + 1, so
// a = {d[nt][0], d[nt][2], d[nt][1], d[nt][3]}), B = the transposed copy
// (whose classes RegTransposedClass orders the same way), in MmaMode's
// order (Ps.Mb, Pb.Ms, Pb.Mb): the bits of AccumulateExpectedCodeT's
// products. N: the smallest of 32, 64, 128 that holds kp (the caller's
// choice); columns from kp to N come from the copy's unstored columns and
// are never stored, nor are the accumulators past N touched. One commit
// group per k-step, the A registers in two sets (wait_group 1 before a set
// is rewritten), as the logits.
template <bool kSplit, int NT, int N>
__device__ __forceinline__ void AccumulateExpectedCodeWg(float (&acc_all)[kRegMaxK / 8][4],
                                                         const float (&d)[NT][4],
                                                         const float* trans,
                                                         const float (&alpha)[2]) {
  static_assert(NT == 8, "64 classes per tile");
  static_assert(N == 32 || N == 64 || N == kRegMaxK, "N: 32, 64 or kRegMaxK");
  float(&acc)[N / 8][4] = *reinterpret_cast<float(*)[N / 8][4]>(&acc_all[0][0]);
#pragma unroll
  for (int jn = 0; jn < N / 8; ++jn) {
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[jn][e] *= alpha[e / 2];
  }
  const uint64_t desc_b = wgmma::Descriptor(ptx::shared_address(trans), kWgTLbo, kWgTSbo);
  const uint64_t desc_s = wgmma::Advance(desc_b, Rows128TCopy(kRegMaxK, true) * 4);
  uint32_t pb[2][4], ps[2][4];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    uint32_t(&b)[4] = pb[nt & 1];
    uint32_t(&sm)[4] = ps[nt & 1];
    if (nt >= 2) ptx::wgmma_wait<1>();  // the group of k-step nt - 2 read this set
    constexpr int kFrom[4] = {0, 2, 1, 3};
#pragma unroll
    for (int e = 0; e < 4; ++e) SplitTf32(d[nt][kFrom[e]], &b[e], &sm[e]);
    ptx::wgmma_fence();
    const uint32_t at = static_cast<uint32_t>(2 * nt) * kWgTLbo;
    if (kSplit) {
      ptx::wgmma_tf32<N>(acc, sm, wgmma::Advance(desc_b, at));
      ptx::wgmma_tf32<N>(acc, b, wgmma::Advance(desc_s, at));
    }
    ptx::wgmma_tf32<N>(acc, b, wgmma::Advance(desc_b, at));
    ptx::wgmma_commit();
  }
  ptx::wgmma_wait<0>();  // [barrier-mutation-test] only=rows128+wgmma the products in acc
}

// acc[jn] = alpha * acc[jn] + P.M for the 8-column blocks jn < kn of the
// warp's 16 rows: P = the NT logit fragments d (already p), as the A operand
// (k index t = class 2t, t + 4 = class 2t + 1 of each n8 fragment), M read
// from the warp's code rows (mrow: the thread's row 2t) with the same
// permutation. Each acc[jn] receives its NT products in increasing nt in
// every order below, so all give the same bits:
//  * kGroup > 0 (the 4-warp kernels): the P fragments are split once; then
//    the blocks go kGroup at a time behind one test (the group's first
//    block < kn), nt outer and the group's blocks inner, so that the
//    products in flight are on kGroup different accumulators. A test per
//    block made each block a basic block of its own, and ptxas issued its
//    3 x NT dependent products back to back (24 on one accumulator per
//    block in the 64-row 3xTF32 kernel, sm_90 SASS): the tensor pipe waited
//    on each product's latency. A group's blocks past kn read the codes of
//    block kn - 1 (with kVec: the columns past kp, below) and their
//    accumulators are never stored (at most kGroup - 1 blocks of wasted
//    products, none where kn is a multiple of kGroup). Holds the NT split
//    P fragments: ptxas (sm_90) spills 4 bytes at the 8-warp kernel's
//    128-register bound (64-row tile), so that kernel keeps
//  * kGroup = 0: one P fragment split at a time, then its product with each
//    block jn < kn (a test per product; consecutive products are on
//    different accumulators).
//  * kVec (RegVecColumns: kGroup a multiple of 4): the columns of 4
//    consecutive blocks are interleaved (RegAccColumn), so that a thread's
//    B operands of the 4 blocks are 4 adjacent floats of a code row: one
//    16-byte shared load per code row and 4 blocks instead of 4 scalar
//    loads, each with its own address (sm_90: ~500 of the 64-row TF32
//    kernel's 3,659 instructions per tile at kp = 128 were these loads).
//    Each accumulator still receives the same products in the same order
//    (in 3xTF32 each of the three passes runs over the set's 4
//    accumulators in turn); only which accumulator holds which column
//    changes, and the mma's arithmetic per output does not depend on its
//    column. A group's blocks past kn then read the columns past kp (the
//    row's padding, the next rows, and past the second tile's last row the
//    u tile, which the kernel lays out after the code tiles): their
//    accumulators hold columns >= kp, which are never stored.
// mrow: the code row of class 2t of the warp's first n8 fragment.
template <bool kSplit, int NT, int KN, int kGroup, bool kFiniteSplit,
          bool kPreSplit = false, bool kVec = false>
__device__ __forceinline__ void AccumulateExpectedCode(float (&acc)[KN][4],
                                                       const float (&d)[NT][4],
                                                       const float* mrow, int pitch, int kn,
                                                       const float (&alpha)[2]) {
  static_assert(KN % (kGroup > 0 ? kGroup : 1) == 0, "kGroup divides KN");
  static_assert(!kVec || (kGroup > 0 && kGroup % 4 == 0), "kVec: groups of whole 4-block sets");
  const int g = threadIdx.x % kWarpSize / 4;
  const float* mb = mrow + g;  // scalar form: column jc * 8 + g
  uint32_t pb[kGroup > 0 ? NT : 1][4], ps[kGroup > 0 ? NT : 1][4];
  auto split_p = [&](int nt, uint32_t(&b)[4], uint32_t(&s)[4]) {
    const float pa[4] = {d[nt][0], d[nt][2], d[nt][1], d[nt][3]};
#pragma unroll
    for (int e = 0; e < 4; ++e) SplitTf32(pa[e], &b[e], &s[e]);
  };
  auto code = [](float x, float xs, uint32_t* big, uint32_t* small) {
    CodeOperand<kSplit, kPreSplit, kFiniteSplit>(x, xs, big, small);
  };
  // acc[jn] += P(nt).M, M from the code columns of block jc (jn but for
  // the blocks past kn of a group).
  auto product = [&](int nt, int jn, int jc, const uint32_t(&b)[4], const uint32_t(&s)[4]) {
    uint32_t bb[2], bs[2];
    const int o0 = nt * 8 * pitch + jc * 8, o1 = (nt * 8 + 1) * pitch + jc * 8;
    constexpr bool kSmall = kPreSplit && kSplit;  // small halves in shared memory
    code(mb[o0], kSmall ? mb[o0 + kRegSmallHalves] : 0.0f, &bb[0], &bs[0]);
    code(mb[o1], kSmall ? mb[o1 + kRegSmallHalves] : 0.0f, &bb[1], &bs[1]);
    MmaMode<kSplit>(acc[jn], b, s, bb, bs);
  };
  // acc[4 jv + jj] += P(nt).M for jj < 4: the 4 blocks of set jv, their
  // columns 32 jv + 4 n + jj (n = g for this thread's B operands).
  auto product_set = [&](int nt, int jv, const uint32_t(&b)[4], const uint32_t(&s)[4]) {
    const float* r = mrow + nt * 8 * pitch + jv * 32 + 4 * g;
    const float4 x0 = *reinterpret_cast<const float4*>(r);
    const float4 x1 = *reinterpret_cast<const float4*>(r + pitch);
    float4 y0 = x0, y1 = x1;  // kPreSplit: the small halves, kRegSmallHalves on
    if constexpr (kPreSplit && kSplit) {
      y0 = *reinterpret_cast<const float4*>(r + kRegSmallHalves);
      y1 = *reinterpret_cast<const float4*>(r + pitch + kRegSmallHalves);
    }
    const float v0[4] = {x0.x, x0.y, x0.z, x0.w}, v1[4] = {x1.x, x1.y, x1.z, x1.w};
    const float w0[4] = {y0.x, y0.y, y0.z, y0.w}, w1[4] = {y1.x, y1.y, y1.z, y1.w};
    uint32_t bb[4][2], bs[4][2];
#pragma unroll
    for (int jj = 0; jj < 4; ++jj) {
      code(v0[jj], w0[jj], &bb[jj][0], &bs[jj][0]);
      code(v1[jj], w1[jj], &bb[jj][1], &bs[jj][1]);
    }
    // MmaMode's products, each pass over the 4 accumulators in turn: the
    // same order per accumulator, 4 independent products back to back.
    if constexpr (kSplit) {
#pragma unroll
      for (int jj = 0; jj < 4; ++jj) {
        ptx::mma_m16n8k8_tf32(acc[4 * jv + jj], s, bb[jj], acc[4 * jv + jj]);
      }
#pragma unroll
      for (int jj = 0; jj < 4; ++jj) {
        ptx::mma_m16n8k8_tf32(acc[4 * jv + jj], b, bs[jj], acc[4 * jv + jj]);
      }
    }
#pragma unroll
    for (int jj = 0; jj < 4; ++jj) {
      ptx::mma_m16n8k8_tf32(acc[4 * jv + jj], b, bb[jj], acc[4 * jv + jj]);
    }
  };
  auto rescale = [&](int jn) {
    acc[jn][0] *= alpha[0];
    acc[jn][1] *= alpha[0];
    acc[jn][2] *= alpha[1];
    acc[jn][3] *= alpha[1];
  };
  if constexpr (kGroup > 0) {
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) split_p(nt, pb[nt], ps[nt]);
#pragma unroll
    for (int j0 = 0; j0 < KN; j0 += kGroup) {
      if (j0 < kn) {
#pragma unroll
        for (int jj = 0; jj < kGroup; ++jj) rescale(j0 + jj);
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
          if constexpr (kVec) {
#pragma unroll
            for (int jv = j0 / 4; jv < (j0 + kGroup) / 4; ++jv) {
              product_set(nt, jv, pb[nt], ps[nt]);
            }
          } else {
#pragma unroll
            for (int jj = 0; jj < kGroup; ++jj) {
              const int jn = j0 + jj;
              product(nt, jn, jn < kn ? jn : kn - 1, pb[nt], ps[nt]);
            }
          }
        }
      }
    }
  } else {
#pragma unroll
    for (int jn = 0; jn < KN; ++jn) {
      if (jn < kn) rescale(jn);
    }
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      split_p(nt, pb[0], ps[0]);
#pragma unroll
      for (int jn = 0; jn < KN; ++jn) {
        if (jn < kn) product(nt, jn, jn, pb[0], ps[0]);
      }
    }
  }
}

// kWgmma's logits: d = u . M of the warp's 16 rows x N classes, the
// warpgroup's 64 rows per wgmma.m64nNk8 (B: the tile's halves in `rows`, the
// core-matrix copy, through descriptors, 2 core matrices = 256 bytes per
// k-step, class groups `sbo` bytes apart, the small halves `small_bytes`
// after the big ones; A: the warp's u fragment by ldmatrix from la, split as
// the mma kernels split it), in MmaMode's order of the three products. d
// must hold zeros. The A registers alternate between two sets, each k-step
// one commit group, so that the next k-step's fragment loads and splits
// overlap the products in flight: wait_group 1 before a set is rewritten
// lets only the other set's group run on. N = 64: the 128-row forward's
// code tile (the defaults); N = 32: the wgmma codes gradient's class tile
// (ecoc_codes_grad_wgmma.cuh).
template <bool kSplit, bool kFiniteSplit, int N = kRegClassTile>
__device__ __forceinline__ void AccumulateLogitsWg(float (&d)[N / 8][4], const float* la,
                                                   const float* rows, int kp,
                                                   uint32_t sbo = kWgRowsSbo,
                                                   uint32_t small_bytes = kWgRowsFloats * 4) {
  const uint64_t desc_b = wgmma::Descriptor(ptx::shared_address(rows), kWgRowsLbo, sbo);
  const uint64_t desc_s = wgmma::Advance(desc_b, small_bytes);
  auto k_step = [&](int ks, uint32_t (&ab)[4], uint32_t (&as)[4]) {
    uint32_t av[4];
    ptx::ldmatrix_x4(av, la + ks);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      SplitTf32Operand<kFiniteSplit>(__uint_as_float(av[e]), &ab[e], &as[e]);
    }
    ptx::wgmma_fence();
    const uint32_t at = static_cast<uint32_t>(ks / 4) * kWgRowsLbo;
    if (kSplit) {
      ptx::wgmma_tf32<N>(d, as, wgmma::Advance(desc_b, at));
      ptx::wgmma_tf32<N>(d, ab, wgmma::Advance(desc_s, at));
    }
    ptx::wgmma_tf32<N>(d, ab, wgmma::Advance(desc_b, at));
    ptx::wgmma_commit();
  };
  // The first k-step on set 0, pairs on sets 1 and 0, and where kp / 8
  // is even a last one on set 1: no branch between a pair's stages. A
  // branch inside the loop made ptxas serialise the TF32 kernel's
  // products (note C7513: every HGMMA followed by a wait), the same
  // loop without the peeled first step both kernels' (C7515).
  uint32_t ab0[4], as0[4], ab1[4], as1[4];
  k_step(0, ab0, as0);  // kp >= 8
  int ks = 8;
  for (; ks + 16 <= kp; ks += 16) {
    ptx::wgmma_wait<1>();
    k_step(ks, ab1, as1);
    ptx::wgmma_wait<1>();
    k_step(ks + 8, ab0, as0);
  }
  if (ks < kp) {
    ptx::wgmma_wait<1>();
    k_step(ks, ab1, as1);
  }
  ptx::wgmma_wait<0>();  // [barrier-mutation-test] only=rows128+wgmma the logits in d
}

// NW = 4 or 8 warps; with 8 the launch bound asks for 2 blocks per SM, i.e.
// at most 128 registers per thread (65536 / 512). The 128-row tile
// (kRows128) asks for 1: its shared memory (200 KiB in 3xTF32 at kp = 128)
// holds one block per SM, and its registers (sm_90: 232 in 3xTF32, 228 in
// TF32) hold the next tile's share. The 16-row 3xTF32 kernel asks for 4
// (128 registers), the 4 blocks per SM by registers it had before u and the
// codes took the finite split (ptxas then chose 141, sm_90). The 64-row
// 3xTF32 kernels at KMAX = kRegShortK ask for 4 as well: with fragments by
// ldmatrix the folded one took 129 registers (3 blocks per
// SM by registers, 8 by shared memory), and under the bound 126 with no
// spill and 1 % more instructions per tile (sm_90).
//
// KMAX: the widest padded code row the instantiation takes, which sizes
// the expected-code accumulators (KMAX / 8 fragments of 4 floats per
// thread). The launcher runs the 4-warp kernels with KMAX = kRegShortK (32)
// where kp <= 32 and with kRegMaxK otherwise: the accumulators of columns
// past kp were registers held for nothing (the loops test jn < kp / 8), and
// at kp <= 32 the thread needs 16 of them instead of 64. ptxas (sm_90, no
// spills): the 16-row 3xTF32 kernels 126 -> 64 registers under a bound of
// 8 blocks per SM (80 under 6, at 1 % fewer instructions per tile), the
// 64-row ones 192 / 208 -> 120 / 119, plain TF32 127 -> 66 and 168 -> 119.
// The same bits: each accumulator sees the same products in the same order.
//
// kFold (4 warps only; the launcher sets it where the batch is one row tile,
// so that the forward reads the codes once): ||M||^2 and ct of the warp's
// classes come from the code fragments the logits load anyway, not from
// PrepClasses: thread (g, t) loads the columns t and t + 4 of every
// 8-column step of class g of each n8 fragment, which is the norm chain's
// share of thread t (ecoc_common.cuh: columns j = t mod 4 in increasing j,
// then the quad's butterfly), so the bits are PrepClasses'. Two fmas
// per loaded code, a butterfly and two shuffles per fragment and tile.
//
// KWG (kWgmma, BT = 128 only): both products on wgmma (the section "The
// 128-row kernel on Hopper's wgmma" above). Compiled for every
// architecture; its wgmma wrappers trap except in sm_90a code, and
// MakePlan launches it only there.
template <int kMath, int BT, int NW = kWarps, bool kFold = false, int KMAX = kRegMaxK,
          bool KWG = false>
__global__ void __launch_bounds__(NW * kWarpSize,
                                  BT == kRegRows128 ? 1
                                  : NW == 8 ? 2
                                  : BT == 16 && kMath == kMath3xTf32 ? (KMAX <= kRegShortK ? 8 : 4)
                                  : BT == 64 && kMath == kMath3xTf32 && KMAX <= kRegShortK ? 4
                                                                     : 0)
    ForwardRegKernel(ForwardSplitArgs a) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
  extern __shared__ __align__(16) float smem[];
  constexpr bool kSplit = kMath == kMath3xTf32;
  // u and the codes take the finite split (ecoc_tf32.cuh), except in the
  // 8-warp 64-row TF32 kernel, where its schedule spills 20 bytes at the
  // 128-register bound (sm_90): that one keeps cvt.rna (the same bits).
  constexpr bool kFiniteSplit = !(NW == 8 && BT == 64 && !kSplit);
  constexpr int CT = kRegClassTile;
  constexpr int NTH = NW * kWarpSize;
  constexpr int WC = RegWarpSplits(BT, NW);
  constexpr int CW = CT / WC;  // classes per warp and tile
  constexpr int NT = CW / 8;   // n8 fragments of logits per warp
  constexpr int KN = KMAX / 8;
  static_assert(KMAX % 8 == 0 && KMAX <= kRegMaxK, "KMAX: a multiple of 8, at most kRegMaxK");
  static_assert(BT == 16 || BT == 64 || (BT == kRegRows128 && NW == 8 && KMAX == kRegMaxK),
                "row tile 16 or 64; 128 with 8 warps at KMAX = kRegMaxK");
  static_assert(NW == 4 || NW == 8, "4 or 8 warps");
  static_assert(!KWG || BT == kRegRows128, "wgmma logits in the 128-row kernel only");
  static_assert(!kFold || NW == 4, "folded norms with 4 warps only");
  // In-block merge of the warps' states (8 warps) or one state per warp.
  constexpr bool kMerge = NW == 8 && WC > 1;
  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  const int g = lane / 4;
  const int t = lane % 4;
  const int wr = warp / WC;
  const int wc = warp % WC;
  const int kp = a.kc;  // one stage holds the whole padded row
  const int pitch = TilePitch(kp);
  const int kn = kp / 8;
  // kPreSplit: the code tiles split once per block (RegPreSplitsCodes).
  constexpr bool kPreSplit = RegPreSplitsCodes(BT, NW, kFold, KMAX);
  // kT (the 128-row kernel): the tile staged through registers by rows and
  // transposed, the expected code transposed (AccumulateExpectedCodeT).
  constexpr bool kT = BT == kRegRows128;
  // The expected code's blocks per test, and whether their columns
  // interleave (acc[jn] holds the columns RegAccColumn(kVec, jn, .)).
  constexpr int kGroup = NW == 4 ? RegExpectedGroup(BT, KMAX) : 0;
  constexpr bool kVec = RegVecColumns(kGroup) && (BT == 64 || !kSplit || kRegVec16Split);
  static_assert(!kVec || !kMerge, "the merge stores blocks in column order");
  static_assert(!kPreSplit || kFiniteSplit, "the pre-split is the finite split");
  // The code tiles first, then u: the interleaved expected-code columns
  // (kVec) read up to 20 floats past the second tile's last row where kp is
  // not a multiple of 32 (AccumulateExpectedCode), which then land in u.
  // kT: by rows (small halves kSmallAt on), then transposed (t_s), then u.
  // KWG: the by-rows copy in wgmma's layout, then the class terms (cls_s).
  constexpr int kSmallAt = kT ? Rows128RowCopy(KMAX, KWG) : kRegSmallHalves;
  float* m_s = smem;  // kPreSplit, 3xTF32: small halves kSmallAt on
  [[maybe_unused]] float* cls_s = smem + (kSplit ? 2 : 1) * Rows128RowCopy(KMAX, KWG);
  [[maybe_unused]] float* t_s = cls_s + Rows128Terms(KWG);
  float* u_s = kT ? t_s + (kSplit ? 2 : 1) * Rows128TCopy(KMAX, KWG)
                  : smem + (kPreSplit && kSplit ? 2 * kSmallAt : 2 * CT * pitch);

  const int64_t k = a.code_length;
  const float scale = ReadScale(a.scale_ptr, a.scale);
  const int64_t b0 = int64_t{blockIdx.x} * BT;
  const int split = blockIdx.y;
  const int64_t t_begin = split * a.class_tiles / a.splits;
  const int64_t t_end = (split + 1) * a.class_tiles / a.splits;
  const int64_t ntiles = t_end - t_begin;

  // Rows g and g + 8 of the warp's 16 (index h = 0, 1).
  int64_t row[2], label[2];
  float rowc[2], run_max[2], run_sum[2], run_sqn[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    row[h] = b0 + wr * 16 + g + 8 * h;
    const bool ok = row[h] < a.batch;
    rowc[h] = ok ? a.rowc[row[h]] : 0.0f;
    label[h] = ok ? LoadLabel(a.labels, a.labels_int64, row[h]) : -1;
    run_max[h] = -INFINITY;
    run_sum[h] = 0.0f;
    run_sqn[h] = 0.0f;
  }
  float acc[KN][4];
#pragma unroll
  for (int jn = 0; jn < KN; ++jn) {
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[jn][e] = 0.0f;
  }

  // The code tile at class c0 (its codes and, unless kFold, ct and ||M||^2
  // in the padding) into `buf`; the caller commits.
  auto stage_code_tile = [&](float* buf, int64_t c0) {
    StageTile(buf, pitch, a.codes, k, c0, a.num_classes, CT, 0, kp, k, a.codes_vec, NTH);
    if (!kFold) StageClassTerms(buf, pitch, kp, a.ct, a.sqn, c0, a.num_classes);
  };
  StageTile(u_s, pitch, a.u, a.kp, b0, a.batch, BT, 0, kp, a.kp, true, NTH);
  [[maybe_unused]] Rows128Codes pre;  // kT: the next tile's share, in registers
  if constexpr (kT) {
    if (ntiles > 0) LoadRows128Codes(pre, a, t_begin * CT, kp);
    ptx::cp_async_commit();
    ptx::cp_async_wait<0>();  // u: visible after the loop's first barrier
  } else {
    if (ntiles > 0) stage_code_tile(m_s, t_begin * CT);
    ptx::cp_async_commit();
  }
  for (int64_t q = 0; q < ntiles; ++q) {
    const float* cur = kT ? m_s : m_s + (q & 1) * CT * pitch;
    if constexpr (kT) {
      // The copies are free: the barrier that ended tile q - 1 follows
      // every read of them.
      StoreRows128Codes<kSplit, KWG>(pre, m_s, t_s, pitch, kp, cls_s);
      // KWG: the stores visible to wgmma's async proxy (before the barrier
      // that publishes them).
      if constexpr (KWG) ptx::fence_proxy_async_shared();
      // Tile q's halves (and u) visible to every thread.
      __syncthreads();  // [barrier-mutation-test] only=rows128
      // The next tile's loads, in flight while this one runs.
      if (q + 1 < ntiles) LoadRows128Codes(pre, a, (t_begin + q + 1) * CT, kp);
    } else if (q + 1 < ntiles) {
      // Prefetch the next code tile while this one runs.
      stage_code_tile(m_s + ((q + 1) & 1) * CT * pitch, (t_begin + q + 1) * CT);
      ptx::cp_async_commit();
      ptx::cp_async_wait<1>();
    } else {
      ptx::cp_async_wait<0>();
    }
    if constexpr (!kT) {
      // Tile q (and u) visible to every thread after this barrier.
      __syncthreads();  // [barrier-mutation-test] only=regsoftmax
    }
    if constexpr (kPreSplit && !kT) {
      SplitCodeTile<kSplit, CT, NTH>(m_s + (q & 1) * CT * pitch, pitch, kp);
      // Every half written before any warp reads its fragments. (The
      // emulator sees a missing one with the warp-major schedule: in its
      // default rounds the warps meet at u's ldmatrix before any reads a
      // code fragment.)
      __syncthreads();  // [barrier-mutation-test] only=regsoftmax schedule=warps
    }

    // Logits u.M of the warp's 16 rows x CW classes, in registers.
    float d[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) d[nt][e] = 0.0f;
    }
    // The fragments by ldmatrix (ecoc_engine.cuh: FragRowA, LoadFragsB):
    // the same registers as scalar loads, in a quarter of the instructions.
    const float* la = FragRowA(u_s + wr * 16 * pitch, pitch, lane);
    const float* lb = FragRowB(cur + wc * CW * pitch, pitch, lane);
    float fold[kFold ? NT : 1];  // kFold: thread t's share of ||M||^2, class g of fragment nt
    if (kFold) {
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) fold[nt] = 0.0f;
    }
    if constexpr (KWG) {
      AccumulateLogitsWg<kSplit, kFiniteSplit>(d, la, m_s, kp);
    } else {
      for (int ks = 0; ks < kp; ks += 8) {
        uint32_t av[4];
        ptx::ldmatrix_x4(av, la + ks);
        uint32_t ab[4], as[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          SplitTf32Operand<kFiniteSplit>(__uint_as_float(av[e]), &ab[e], &as[e]);
        }
        uint32_t mv[NT][2];  // kPreSplit: the big halves
        LoadFragsB<NT>(mv, lb, pitch, ks);
        uint32_t ms[kPreSplit && kSplit ? NT : 1][2];  // ... and the small ones
        if constexpr (kPreSplit && kSplit) LoadFragsB<NT>(ms, lb + kSmallAt, pitch, ks);
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
          const float m0 = __uint_as_float(mv[nt][0]), m1 = __uint_as_float(mv[nt][1]);
          if (kFold) fold[nt] = NormChainStep(m1, NormChainStep(m0, fold[nt]));
          uint32_t bb[2], bs[2];
          constexpr bool kSmall = kPreSplit && kSplit;
          CodeOperand<kSplit, kPreSplit, kFiniteSplit>(
              m0, kSmall ? __uint_as_float(ms[nt][0]) : 0.0f, &bb[0], &bs[0]);
          CodeOperand<kSplit, kPreSplit, kFiniteSplit>(
              m1, kSmall ? __uint_as_float(ms[nt][1]) : 0.0f, &bb[1], &bs[1]);
          MmaMode<kSplit>(d[nt], ab, as, bb, bs);
        }
      }
    }
    // kFold: the quad of class g holds ||M||^2 after the butterfly; thread
    // (g, t) needs those of its accumulator classes 2t and 2t + 1 of each
    // fragment, held by the quads 2t and 2t + 1.
    float fsq[kFold ? NT : 1][2];
    if (kFold) {
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        const float ss = NormQuadSum(fold[nt]);
        fsq[nt][0] = __shfl_sync(kFullMask, ss, 4 * (2 * t));
        fsq[nt][1] = __shfl_sync(kFullMask, ss, 4 * (2 * t + 1));
      }
    }

    // Online softmax on the fragments: logits, quad row max, p in place.
    // Class indices are tile-local ints from here on (class tile0 + cl), and
    // ct / ||M||^2 come from the code rows' padding (zero past n) or, kFold,
    // from the fold above, so that no element waits on a global load or
    // takes a branch.
    const int64_t tile0 = (t_begin + q) * CT;
    const int nvalid =
        static_cast<int>(a.num_classes - tile0 < CT ? a.num_classes - tile0 : CT);
    const int clbase = wc * CW + 2 * t;
    // Where the label's logit lies, as its offset from clbase when this
    // thread holds it (classes clbase + 8 nt and clbase + 8 nt + 1), else
    // -1: the store below is then one test per row instead of a compare
    // and a predicated store per logit (sm_90: 64 of a 64-row tile's
    // instructions), and the warp takes it in the few tiles that hold one
    // of its rows' labels.
    int label_at[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      // Compared before the subtraction: an invalid int64 label may be any
      // value.
      const bool in_tile = label[h] >= tile0 && label[h] < tile0 + nvalid;
      const int rel = (in_tile ? static_cast<int>(label[h] - tile0) : -CT) - clbase;
      label_at[h] = rel >= 0 && rel < NT * 8 && (rel & 6) == 0 ? rel : -1;
    }
    float sq[NT][2];
    float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int h = e / 2;
        const int cl = clbase + nt * 8 + (e & 1);
        const bool valid = cl < nvalid;
        const float* terms = cur + cl * pitch + kp;  // ct, ||M||^2 (StageClassTerms)
        const float msq = kFold ? fsq[nt][e & 1] : KWG ? cls_s[kRegClassTile + cl] : terms[1];
        const float ct = kFold ? ClassTerm(scale, msq) : KWG ? cls_s[cl] : terms[0];
        if (h == 0) sq[nt][e & 1] = msq;
        const float x = valid ? Logit(d[nt][e], scale, ct, rowc[h]) : -INFINITY;
        d[nt][e] = x;
        tile_max[h] = NanMax(tile_max[h], x);
      }
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      if (label_at[h] >= 0) {
        float x = 0.0f;
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
          for (int c = 0; c < 2; ++c) x = label_at[h] == nt * 8 + c ? d[nt][2 * h + c] : x;
        }
        a.label_logit[row[h]] = x;
      }
    }
    float alpha[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float m = tile_max[h];
      m = NanMax(m, __shfl_xor_sync(kFullMask, m, 1));
      m = NanMax(m, __shfl_xor_sync(kFullMask, m, 2));
      const float new_max = NanMax(run_max[h], m);
      alpha[h] = ExpDiffSelect<kMath>(run_max[h], new_max);
      run_max[h] = new_max;
      run_sum[h] *= alpha[h];
      run_sqn[h] *= alpha[h];
    }
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int h = e / 2;
        const float p = ExpDiffSelect<kMath>(d[nt][e], run_max[h]);
        d[nt][e] = p;
        run_sum[h] += p;
        run_sqn[h] = fmaf(p, sq[nt][e & 1], run_sqn[h]);
      }
    }

    // acc = alpha * acc + P.M, P from the fragments (A: k index t = class
    // 2t, t + 4 = class 2t + 1 of each n8 fragment), M from the staged tile
    // with the same permutation.
    if constexpr (KWG) {
      // The narrowest product that holds the row: at kp <= 32 a quarter of
      // m64n128's tensor work.
      if (kp <= 32) {
        AccumulateExpectedCodeWg<kSplit, NT, 32>(acc, d, t_s, alpha);
      } else if (kp <= 64) {
        AccumulateExpectedCodeWg<kSplit, NT, 64>(acc, d, t_s, alpha);
      } else {
        AccumulateExpectedCodeWg<kSplit, NT, kRegMaxK>(acc, d, t_s, alpha);
      }
    } else if constexpr (kT) {
      // acc^T's rows 8h + 2t + c are quads 2t + c's rows g + 8h.
      float arow[2][2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
#pragma unroll
        for (int c = 0; c < 2; ++c) arow[h][c] = __shfl_sync(kFullMask, alpha[h], 4 * (2 * t + c));
      }
      AccumulateExpectedCodeT<kSplit, NT, KN>(acc, d, t_s, kp, arow);
    } else {
      AccumulateExpectedCode<kSplit, NT, KN, kGroup, kFiniteSplit, kPreSplit, kVec>(
          acc, d, cur + (wc * CW + 2 * t) * pitch, pitch, kn, alpha);
    }
    // Buffer q & 1 is free for the prefetch of tile q + 2. The emulator sees
    // a missing one only with eager copies and one warp running ahead.
    __syncthreads();  // [barrier-mutation-test] only=warps8 cp-async=eager schedule=warps
  }

  // Epilogue: the quad's partial sums, then the warp's normalised state
  // (kMerge: the block's, merged over its WC warps).
  // Row g + 8h's softmax sum and sum of p ||M||^2 over the quad (its 4
  // threads' shares of the row's classes), in every thread of the quad.
  auto quad_totals = [&](int h, float* l, float* sqn) {
    float x = run_sum[h], y = run_sqn[h];
    x += __shfl_xor_sync(kFullMask, x, 1);
    x += __shfl_xor_sync(kFullMask, x, 2);
    y += __shfl_xor_sync(kFullMask, y, 1);
    y += __shfl_xor_sync(kFullMask, y, 2);
    *l = x;
    *sqn = y;
  };
  if constexpr (kMerge) {
    // Unnormalised states to shared memory: acc_s[(wc * BT + r) * kp + j],
    // then max, sum and sqn per (wc, r). The code buffers are free: the
    // loop's last barrier follows every read of them.
    float* acc_s = m_s;
    float* max_s = m_s + WC * BT * kp;
    float* sum_s = max_s + WC * BT;
    float* sqs_s = sum_s + WC * BT;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = wr * 16 + g + 8 * h;
      float l, sqn;
      quad_totals(h, &l, &sqn);
      if (t == 0) {
        max_s[wc * BT + r] = run_max[h];
        sum_s[wc * BT + r] = l;
        sqs_s[wc * BT + r] = sqn;
      }
      float* dst = acc_s + (wc * BT + r) * kp;
#pragma unroll
      for (int jn = 0; jn < KN; ++jn) {
        if (jn < kn) {
          dst[jn * 8 + 2 * t] = acc[jn][2 * h];
          dst[jn * 8 + 2 * t + 1] = acc[jn][2 * h + 1];
        }
      }
    }
    __syncthreads();  // [barrier-mutation-test] only=warps8 every warp's state visible to the merge
    // Row r, column j: the WC states in increasing wc order,
    //   M = max_w m_w,  c_w = exp(m_w - M),  L = sum_w c_w l_w,
    //   acc = sum_w c_w acc_w (/ L), sqn likewise; lse = M + log L.
    for (int e = threadIdx.x; e < BT * kp; e += NTH) {
      const int r = e / kp;
      const int j = e % kp;
      const int64_t rg = b0 + r;
      if (rg >= a.batch) continue;
      float m = -INFINITY;
#pragma unroll
      for (int w = 0; w < WC; ++w) m = NanMax(m, max_s[w * BT + r]);
      float l = 0.0f, sqn = 0.0f, v = 0.0f;
#pragma unroll
      for (int w = 0; w < WC; ++w) {
        const float c = ExpDiff(max_s[w * BT + r], m);
        l = fmaf(c, sum_s[w * BT + r], l);
        sqn = fmaf(c, sqs_s[w * BT + r], sqn);
        v = fmaf(c, acc_s[(w * BT + r) * kp + j], v);
      }
      // As below: a NaN sum keeps the NaN through inv = 0.
      const float inv = l > 0.0f ? 1.0f / l : 0.0f;
      const int64_t slot = rg * a.splits + split;
      if (j == 0) {
        a.part_lse[slot] = m + logf(l);
        a.part_sqn[slot] = sqn * inv;
      }
      if (j < k) a.part_acc[slot * k + j] = v * inv;
    }
  } else {
    // One state per (row, split, class group of the warp); kT: one group.
    const int64_t total_splits = int64_t{a.splits} * WC;
    const int64_t slot_split = int64_t{split} * WC + wc;
    [[maybe_unused]] float inv_h[2];  // kT: the rows' inv, for the transposed stores
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float l, sqn;
      quad_totals(h, &l, &sqn);
      // A NaN sum fails "> 0": inv = 0 keeps the NaN of acc and sqn (x*0).
      const float inv = l > 0.0f ? 1.0f / l : 0.0f;
      if constexpr (kT) inv_h[h] = inv;
      if (row[h] < a.batch) {
        const int64_t slot = row[h] * total_splits + slot_split;
        if (t == 0) {
          a.part_lse[slot] = run_max[h] + logf(l);
          a.part_sqn[slot] = sqn * inv;
        }
        if constexpr (!kT || KWG) {
          float* out = a.part_acc + slot * k;
          // Columns past k (blocks never computed, or past kp) are not stored.
#pragma unroll
          for (int jn = 0; jn < KN; ++jn) {
#pragma unroll
            for (int c = 0; c < 2; ++c) {
              const int j = RegAccColumn(kVec, jn, 2 * t + c);
              if (j < k) out[j] = acc[jn][2 * h + c] * inv;
            }
          }
        }
      }
    }
    if constexpr (kT && !KWG) {
      // acc^T (AccumulateExpectedCodeT): thread (g, t) holds columns
      // 16 mt + g and 16 mt + g + 8 of the warp's rows 8h + 2t + c, whose
      // sums the quads 2t + c hold.
#pragma unroll
      for (int h = 0; h < 2; ++h) {
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          const float w = __shfl_sync(kFullMask, inv_h[h], 4 * (2 * t + c));
          const int64_t r = b0 + wr * 16 + 8 * h + 2 * t + c;
          if (r < a.batch) {
            float* out = a.part_acc + (r * total_splits + slot_split) * k;
#pragma unroll
            for (int mt = 0; mt < KN / 2; ++mt) {
#pragma unroll
              for (int hi = 0; hi < 2; ++hi) {
                const int j = 16 * mt + g + 8 * hi;
                if (j < k) out[j] = acc[2 * mt + h][2 * hi + c] * w;
              }
            }
          }
        }
      }
    }
  }
#endif
}

}  // namespace detail
}  // namespace cuda
}  // namespace keras_ecoc

#endif  // KERAS_ECOC_KERNELS_CUDA_ECOC_FORWARD_REG_CUH_
