// Device pieces shared by every pass of the fused ECOC kernels: constants,
// conversions, warp reductions, the one expression for a logit, and the
// per-row / per-class preparation kernel whose outputs (u, ||u||^2 term,
// ||M||^2 terms) every later kernel of a pass reads from the workspace.
//
// Framework-free (CUDA C++ only) and limited to the subset listed in
// kernels/cuda/README.md ("The CUDA subset"), so that the CPU emulator of
// CUDA can run it.
#ifndef KERAS_ECOC_KERNELS_CUDA_ECOC_COMMON_CUH_
#define KERAS_ECOC_KERNELS_CUDA_ECOC_COMMON_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "ecoc_ptx.cuh"

namespace keras_ecoc {
namespace cuda {
namespace detail {

// MathMode as a template argument (0 = FP32, 1 = 3xTF32, 2 = TF32).
constexpr int kMathFp32 = 0;
constexpr int kMath3xTf32 = 1;
constexpr int kMathTf32 = 2;

constexpr int kWarpSize = 32;
constexpr int kWarps = 4;  // every kernel runs 4 warps per block
constexpr int kThreads = kWarpSize * kWarps;
constexpr unsigned kFullMask = 0xffffffffu;
// Classes per tile: one per lane (FP32 engine), four n-tiles of 8 (MMA).
constexpr int kClassTile = 32;
// Row pitch of the logit tile S [rows][kSPitch]: 36 keeps the MMA
// fragment stores at most 2-way bank conflicted, row reads conflict-free.
constexpr int kSPitch = kClassTile + 4;

// A block's kThreads threads as `groups` groups of `cols` consecutive
// threads, one column of a k-wide row each: cols = min(k, kThreads) (1 for
// k = 0: no columns, and no division by 0), thread = group * cols + col;
// the threads of group >= groups (kThreads % cols of them) have no column.
// The layout of the loops that give every warp work where k < kThreads.
struct ColumnGroups {
  int cols, groups, group, col;
};

__device__ __forceinline__ ColumnGroups ColumnGroupsOf(int64_t k) {
  const int cols = k < 1 ? 1 : k < kThreads ? static_cast<int>(k) : kThreads;
  const int group = static_cast<int>(threadIdx.x) / cols;
  return {cols, kThreads / cols, group, static_cast<int>(threadIdx.x) - group * cols};
}

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

// Butterfly reductions: IEEE addition is commutative, so every lane ends
// with bit-identical results (no broadcast needed, deterministic).
__device__ __forceinline__ float WarpSum(float v) {
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset >>= 1) {
    v += __shfl_xor_sync(kFullMask, v, offset);
  }
  return v;
}

__device__ __forceinline__ long long WarpSumLL(long long v) {
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset >>= 1) {
    v += __shfl_xor_sync(kFullMask, v, offset);
  }
  return v;
}

// max() that returns NaN when either argument is NaN (fmaxf would drop a NaN
// logit from the log-sum-exp).
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

// exp(a - b) with exp(-inf - b) = 0 even when b is -inf (nothing seen yet),
// NaN in a or b still NaN.
__device__ __forceinline__ float ExpDiff(float a, float b) {
  return a == -INFINITY ? 0.0f : expf(a - b);
}

// exp(x) in a softmax of math mode kMath: expf in the FP32 mode or, in the
// tensor-core math modes, 2^(x log2 e) by ex2.approx.ftz (FMUL and
// MUFU.EX2, 2 instructions where expf takes about 9 on sm_90; __expf adds
// the scaling of subnormal results). Its error is mostly the rounding of
// log2 e and of x log2 e, a relative 2^-23 |x| at most in exp(x): 2e-6 for
// the x >= -17 (p >= 4e-8) that carry a softmax (tests/test_cuda_emulator.py
// holds the emulated model to it), about the error a 3xTF32 logit already
// has (2^-20 of s sum_j |u_j M_ij|), plus ex2's 2 ulp. p, the log-sum-exp
// built from it and the gradients move by that much; the logits (and the
// label's) do not. A result below 2^-126 is 0 (expf: a subnormal).
template <int kMath>
__device__ __forceinline__ float SoftmaxExp(float x) {
  if constexpr (kMath != kMathFp32) {
    return ptx::ex2_approx_ftz(x * 1.44269504088896341f);
  } else {
    return expf(x);
  }
}

// ExpDiff's value, computed without a branch: the exponential is evaluated
// either way and the result selected. The register softmax's unrolled
// loops use it (ptxas branched around each expf there, sm_90: 34 of the 70
// branches of a 64-row tile's loop); the split kernels keep ExpDiff, whose
// code was timed (this form spills in the FP32 folded-norms forward).
template <int kMath>
__device__ __forceinline__ float ExpDiffSelect(float a, float b) {
  const float e = SoftmaxExp<kMath>(a - b);
  return a == -INFINITY ? 0.0f : e;
}

// The one expression for a logit from an inner product, as the CPU kernel
// (FinishLogit: s * dot + ct + rowc) and the XLA lowering:
//   logit = (s * (u . M_i) + ct_i) + rowc_b,
//   ct_i = -s/2 ||M_i||^2,  rowc_b = -s/2 ||u_b||^2.
// Label rank and nearest codeword use the scale-free key s = 1, rowc = 0.
// Explicit _rn intrinsics: the compiler may not contract or reorder it
// differently at different call sites.
__device__ __forceinline__ float Logit(float dot, float s, float ct, float rowc) {
  return __fadd_rn(__fmaf_rn(s, dot, ct), rowc);
}

// ct_i = -s/2 ||M_i||^2 from ||M_i||^2 (one expression for the prep kernel
// and the forward's folded norms, so both give the same bits).
__device__ __forceinline__ float ClassTerm(float s, float sqn) {
  return -0.5f * s * sqn;
}

// The FP32 inner product's chain: one sequential fma per element, in
// increasing j, starting from +0. The FP32 engine (ecoc_engine.cuh) runs the
// same chain on staged tiles (its zero padding adds exact zeros), so a dot
// computed here equals the engine's bit for bit.
__device__ __forceinline__ float DotChain(const float* __restrict__ u,
                                          const float* __restrict__ m, int64_t k) {
  float d = 0.0f;
  for (int64_t j = 0; j < k; ++j) d = __fmaf_rn(u[j], m[j], d);
  return d;
}

// The scale of a pass: *ptr (a device float, contract field scale_ptr)
// when ptr is non-null, else the host value. Not a finite number > 0: NaN,
// so that every output of the pass is NaN (a device scalar cannot be
// checked on the host without a copy and a stream sync).
__device__ __forceinline__ float ReadScale(const float* ptr, float host) {
  const float s = ptr != nullptr ? *ptr : host;
  return (s > 0.0f && s <= 3.402823466e38f) ? s : NAN;
}

__device__ __forceinline__ int64_t LoadLabel(const void* labels, bool int64,
                                             int64_t b) {
  return int64 ? static_cast<const int64_t*>(labels)[b]
               : static_cast<int64_t>(static_cast<const int32_t*>(labels)[b]);
}

// Inputs of the preparation kernels.
struct PrepArgs {
  const void* z;           // [batch, k] ZT
  const float* codes;      // [n, k]
  const void* labels;      // [batch] or null (no label keys)
  bool labels_int64;
  float scale;             // 1 for the scale-free keys
  const float* scale_ptr;  // device scale (wins over `scale`), or null
  bool keys;               // rank / nearest: rowc = 0, s = 1
  float epsilon;
  int64_t batch, num_classes, code_length;
  int64_t kp;              // row stride of u: code_length rounded up to 8
  float* u;                // [batch, kp]  z / max(||z||, sqrt(eps)), zero padded
  float* rowc;             // [batch]      -s/2 ||u||^2 (0 for keys)
  float* sqn;              // [n]          ||M_i||^2
  float* ct;               // [n]          -s/2 ||M_i||^2
  float* label_key;        // [batch] or null: the label's logit/key (FP32 chain)
};

// ||M_i||^2: the chain every kernel uses, so that all passes see the same
// ct and ||M||^2 bits. Four threads (a "quad", t = 0..3) share a class:
// thread t adds the squares of the columns j = t (mod 4) in increasing j,
// one fma each from +0 (NormChainStep), then the quad adds its four partial
// sums as (s0 + s1) + (s2 + s3) by a butterfly (NormQuadSum: commutative
// steps, so the four threads end with the same bits). A tile's zero padding
// past k adds exact zeros. The mma fragments of the register-softmax
// forward load exactly these columns of their class per thread (t and
// t + 4 of every 8-column step), so that kernel folds the norms from the
// codes its logits load anyway (ecoc_forward_reg.cuh).
__device__ __forceinline__ float NormChainStep(float v, float acc) {
  return __fmaf_rn(v, v, acc);
}

__device__ __forceinline__ float NormQuadSum(float v) {
  v += __shfl_xor_sync(kFullMask, v, 1);
  v += __shfl_xor_sync(kFullMask, v, 2);
  return v;
}

// The same chain on a staged code tile (row pitch `pitch`), so that a split
// kernel can skip PrepClasses and keep its bits: warp w owns the
// kFoldClassesPerWarp = 8 classes w*8 .. w*8 + 7 of the tile, lane l the
// class w*8 + l/4 and the columns j = l (mod 4); AccumulateFoldedNorms adds
// the lane's columns of one stage [j0, j0 + kc) to `fold` (zeroed before the
// first stage), FinishFoldedNorms after the last stage gives ||M||^2 and
// its logit term ct, written by the quad's first lane to sq_s (if not null)
// and ct_s. Used by the kFoldNorms forward and by the codes-gradient
// kernels.
constexpr int kFoldClassesPerWarp = kClassTile / kWarps;
static_assert(kFoldClassesPerWarp * 4 == kWarpSize, "a quad per class of the warp");

__device__ __forceinline__ void AccumulateFoldedNorms(float& fold, const float* tile, int pitch,
                                                      int j0, int kc, int warp, int lane) {
  const float* m = tile + (warp * kFoldClassesPerWarp + lane / 4) * pitch;
  // First column of this stage owned by the lane: j0 + jj = lane mod 4;
  // 8 of them per pass while they last (ptxas, sm_90: the fewest spills
  // of the loop forms tried in the codes-gradient kernels).
  int jj = ((lane - j0) % 4 + 4) % 4;
  for (; jj + 28 < kc; jj += 32) {
#pragma unroll
    for (int i = 0; i < 8; ++i) fold = NormChainStep(m[jj + 4 * i], fold);
  }
  for (; jj < kc; jj += 4) fold = NormChainStep(m[jj], fold);
}

__device__ __forceinline__ void FinishFoldedNorms(float fold, float scale, int warp, int lane,
                                                  float* sq_s, float* ct_s) {
  const float ss = NormQuadSum(fold);
  if (lane % 4 == 0) {
    const int c = warp * kFoldClassesPerWarp + lane / 4;
    if (sq_s != nullptr) sq_s[c] = ss;
    ct_s[c] = ClassTerm(scale, ss);
  }
}

// ||M_i||^2 of the class at `m` (k floats) by its quad: the lane's share of
// the norm chain (columns j = lane mod 4; a lane given null adds nothing),
// then the quad's butterfly. Every lane of the warp calls it.
__device__ __forceinline__ float QuadClassNorm(const float* m, int64_t k, int lane) {
  float ss = 0.0f;
  if (m != nullptr) {
    for (int64_t j = lane % 4; j < k; j += 4) ss = NormChainStep(m[j], ss);
  }
  return NormQuadSum(ss);
}

// Classes per warp of PrepClasses: one per quad.
constexpr int kPrepClassesPerWarp = kWarpSize / 4;

// A quad per class (warp w of `blocks` blocks from `block`, grid-stride):
// ||M_i||^2 and its logit term.
__device__ __forceinline__ void PrepClasses(const PrepArgs& a, int64_t block, int64_t blocks) {
  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  const int64_t k = a.code_length;
  const float scale = a.keys ? 1.0f : ReadScale(a.scale_ptr, a.scale);
  const int64_t stride = blocks * kWarps * kPrepClassesPerWarp;
  for (int64_t i0 = (block * kWarps + warp) * kPrepClassesPerWarp; i0 < a.num_classes;
       i0 += stride) {
    const int64_t i = i0 + lane / 4;  // the whole warp runs the butterfly
    const bool valid = i < a.num_classes;
    const float ss = QuadClassNorm(valid ? a.codes + i * k : nullptr, k, lane);
    if (lane % 4 == 0 && valid) {
      a.sqn[i] = ss;
      a.ct[i] = ClassTerm(scale, ss);
    }
  }
}

// One warp per batch row (warp w of `blocks` blocks from `block`,
// grid-stride): u_b, rowc_b and, when asked, the label's FP32 key. Every
// pass of a call reads u from here, so all of them see the same bits.
template <typename ZT>
__device__ __forceinline__ void PrepRows(const PrepArgs& a, int64_t block, int64_t blocks) {
  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  const int64_t k = a.code_length;
  const ZT* z = static_cast<const ZT*>(a.z);
  const float scale = a.keys ? 1.0f : ReadScale(a.scale_ptr, a.scale);
  for (int64_t b = block * kWarps + warp; b < a.batch; b += blocks * kWarps) {
    const ZT* zr = z + b * k;
    float ss = 0.0f;
    for (int64_t j = lane; j < k; j += kWarpSize) {
      const float v = ToFloat(zr[j]);
      ss = __fmaf_rn(v, v, ss);
    }
    ss = WarpSum(ss);
    const float inv = 1.0f / sqrtf(fmaxf(ss, a.epsilon));
    float* ur = a.u + b * a.kp;
    float usq = 0.0f;
    for (int64_t j = lane; j < a.kp; j += kWarpSize) {
      const float v = j < k ? ToFloat(zr[j]) * inv : 0.0f;
      ur[j] = v;
      usq = __fmaf_rn(v, v, usq);
    }
    usq = WarpSum(usq);
    if (lane == 0) a.rowc[b] = a.keys ? 0.0f : -0.5f * scale * usq;
    if (a.label_key != nullptr) {
      const int64_t y = LoadLabel(a.labels, a.labels_int64, b);
      const bool valid = y >= 0 && y < a.num_classes;
      // ct of the label's class by its own norm chain (lanes 0-3; the other
      // quads add nothing), the bits PrepClasses writes for it, so that
      // this launch needs nothing from the classes' blocks.
      const float msq = QuadClassNorm(valid && lane < 4 ? a.codes + y * k : nullptr, k, lane);
      __syncwarp();  // u_b written by all lanes before lane 0 reads it
      if (lane == 0) {
        a.label_key[b] = valid ? Logit(DotChain(ur, a.codes + y * k, k), scale,
                                       ClassTerm(scale, msq), a.keys ? 0.0f : -0.5f * scale * usq)
                               : NAN;
      }
    }
  }
}

// Steps 1 and 2 of a pass in one launch: blocks [0, row_blocks) prepare the
// rows (PrepRows), blocks [row_blocks, gridDim.x) the classes (PrepClasses;
// none where the split kernel folds the norms), so that the classes' pass
// costs no launch of its own. Neither part reads the other's output.
template <typename ZT>
__global__ void __launch_bounds__(kThreads) PrepKernel(PrepArgs a, unsigned row_blocks) {
  if (blockIdx.x < row_blocks) {
    PrepRows<ZT>(a, blockIdx.x, row_blocks);
  } else {
    PrepClasses(a, blockIdx.x - row_blocks, gridDim.x - row_blocks);
  }
}

}  // namespace detail
}  // namespace cuda
}  // namespace keras_ecoc

#endif  // KERAS_ECOC_KERNELS_CUDA_ECOC_COMMON_CUH_
