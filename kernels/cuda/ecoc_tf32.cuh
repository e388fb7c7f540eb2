// The TF32 operand splits of the tensor-core products, x = big + small
// (3xTF32 multiplies both halves; plain TF32 uses big only). A header of
// their own, without kernels, so that the harness and the emulator's
// self-test can check them against the hardware's cvt.rna.tf32.
#ifndef KERAS_ECOC_KERNELS_CUDA_ECOC_TF32_CUH_
#define KERAS_ECOC_KERNELS_CUDA_ECOC_TF32_CUH_

#include <cstdint>

#include "ecoc_ptx.cuh"

namespace keras_ecoc {
namespace cuda {
namespace detail {

// The two TF32 splits x = big + small of the 3xTF32 products (plain TF32
// uses big only), with big = tf32(x) rounded to nearest, ties away from
// zero (cvt.rna.tf32.f32), and small = x - big exactly (a float32: big
// holds x's leading 11 bits, so the rest fits), NOT rounded to TF32. The
// tensor cores read a TF32 operand's top 19 bits and ignore the low 13
// (mmasim's measurements, modelled by kernels/cuda/emu/ptx_emu.h, whose
// mma reproduced an H100's on operands with full float32 mantissas:
// emu/selftest/mma_random.cu), so the product sees small truncated to
// TF32: x is then represented to within 2^-21 |x| (|small| <= 2^-11 |x|,
// truncation loses < 2^-10 |small|) instead of the 2^-22 |x| of a rounded
// small half, for one float add per split instead of three more
// instructions (sm_90, with ex2 for the softmax's exponential,
// ecoc_common.cuh's SoftmaxExp: 11-13 % fewer
// instructions per tile in the 64-row 3xTF32 register-softmax forward,
// 9-11 % in the 64-row kGradMma; kernels/cuda/README.md, "Cheaper softmax
// and splits").
//  * SplitTf32: big by cvt.rna itself, any x. For operands whose NaN must
//    reach the product: the probabilities of the expected code and the
//    weights of the codes gradient, where a NaN row shows only through them.
//  * SplitTf32Finite: the same bits for every finite x, big in the integer
//    form ptxas itself emits for cvt.rna on a finite input (add half a TF32 ulp
//    to the bit pattern, clear the 13 low bits; a carry into the exponent
//    rounds up, to infinity past the largest TF32), without cvt.rna's test
//    for a non-finite input (sm_90 SASS: 2 instructions for big instead of
//    about 4; kernels/cuda/README.md).
//    For u and the codes, the operands that are read once per tile by every
//    warp: u is finite or NaN, and a NaN row's logits are NaN through its
//    row term rowc = -s/2 ||u||^2 (and its codes-gradient products through
//    the weights, split exactly), whatever its products; the codes are
//    finite (checked where they enter the Python API). A NaN pattern taken
//    through this form can come out as a finite number or an infinity.
__device__ __forceinline__ uint32_t RoundTf32Finite(float x) {
  return (__float_as_uint(x) + 0x1000u) & 0xffffe000u;
}

__device__ __forceinline__ void SplitTf32(float x, uint32_t* big, uint32_t* small) {
  *big = ptx::cvt_rna_tf32(x);
  // A NaN x: big is NaN, and so is small.
  *small = __float_as_uint(x - __uint_as_float(*big));
}

__device__ __forceinline__ void SplitTf32Finite(float x, uint32_t* big, uint32_t* small) {
  *big = RoundTf32Finite(x);
  *small = __float_as_uint(x - __uint_as_float(*big));
}

// SplitTf32Finite where kFinite, else SplitTf32 (same bits on finite x):
// for a kernel instantiation in which the cheaper form's schedule needs
// registers that ptxas does not have under the launch bound.
template <bool kFinite>
__device__ __forceinline__ void SplitTf32Operand(float x, uint32_t* big, uint32_t* small) {
  if constexpr (kFinite) {
    SplitTf32Finite(x, big, small);
  } else {
    SplitTf32(x, big, small);
  }
}

}  // namespace detail
}  // namespace cuda
}  // namespace keras_ecoc

#endif  // KERAS_ECOC_KERNELS_CUDA_ECOC_TF32_CUH_
