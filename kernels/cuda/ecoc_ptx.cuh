// The few PTX instructions the ECOC kernels use beyond plain CUDA C++, each
// behind one inline function, so that the CUDA emulator (kernels/cuda/emu/)
// can supply a bit-exact CPU version of each: compiled with
// -DKERAS_ECOC_EMULATOR, this header includes emu/ptx_emu.h instead, which
// defines the same functions with the same signatures.
//
// Architecture rules (callers guard with __CUDA_ARCH__):
//   cp_async_*         sm_80 and later (plain loads before that).
//   cvt_rna_tf32, mma_m16n8k8_tf32   sm_80 and later.
//   ldmatrix_x2, ldmatrix_x4         sm_75 and later (the mma kernels' sm_80+).
//   ex2_approx_ftz     every architecture.
#ifndef KERAS_ECOC_KERNELS_CUDA_ECOC_PTX_CUH_
#define KERAS_ECOC_KERNELS_CUDA_ECOC_PTX_CUH_

#include <cstdint>

#ifdef KERAS_ECOC_EMULATOR
#include "emu/ptx_emu.h"
#else

namespace keras_ecoc {
namespace cuda {
namespace ptx {

// float32 -> TF32 with round-to-nearest, ties away from zero (cvt.rna.tf32.f32).
// The result is a 32-bit pattern whose low 13 mantissa bits are zero.
__device__ __forceinline__ uint32_t cvt_rna_tf32(float x) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  uint32_t r;
  asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(x));
  return r;
#else
  return __float_as_uint(x);
#endif
}

// d = a * b + c for a warp-wide 16x8x8 tile, TF32 inputs, FP32 accumulation
// (mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32). Warp-collective: all
// 32 lanes call it together. Fragment layout (PTX ISA, "Matrix Fragments for
// mma.m16n8k8", .tf32), with g = lane / 4 and t = lane % 4:
//   a[0] = A[g][t]      a[1] = A[g + 8][t]   a[2] = A[g][t + 4]  a[3] = A[g + 8][t + 4]
//   b[0] = B[t][g]      b[1] = B[t + 4][g]
//   c/d[0] = C[g][2t]   c/d[1] = C[g][2t + 1]
//   c/d[2] = C[g + 8][2t]  c/d[3] = C[g + 8][2t + 1]
__device__ __forceinline__ void mma_m16n8k8_tf32(float d[4], const uint32_t a[4],
                                                 const uint32_t b[2],
                                                 const float c[4]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%10, %11, %12, %13};\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]),
        "f"(c[0]), "f"(c[1]), "f"(c[2]), "f"(c[3]));
#else
  __trap();  // callers never reach this below sm_80
#endif
}

// Warp-collective loads of mma fragments from shared memory
// (ldmatrix.sync.aligned.m8n8.{x2,x4}.shared.b16), used here on tiles of
// 32-bit values: a "matrix" is 8 rows of 16 contiguous bytes (4 floats),
// and lane l receives in r[j] the 32-bit word l % 4 of row l / 4 of
// matrix j, i.e. exactly what a plain load of row[l / 4][l % 4] gives (the
// instruction copies bits; its b16 element type only names the layout).
// Lane l supplies the address of row l % 8 of matrix l / 8 (16-byte
// aligned); with x2 only lanes 0-15 are read. One instruction replaces the
// 2 or 4 scalar shared loads per lane of an A or B fragment of
// mma.m16n8k8.tf32 whose operand is stored K-contiguous (u's rows, the codes'
// rows), and the fragment's registers hold the same bits. Rows at a pitch of
// p floats with p = 4 (mod 8) fall in 8 distinct groups of 4 banks: no
// conflict.
__device__ __forceinline__ void ldmatrix_x4(uint32_t r[4], const void* row) {
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
}

__device__ __forceinline__ void ldmatrix_x2(uint32_t r[2], const void* row) {
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(a));
}

// 2^x by the special-function unit (ex2.approx.ftz.f32: one MUFU.EX2 on
// sm_90, where exp2f adds the scaling of subnormal results around it):
// within about 2 ulp (the CUDA C++ Programming Guide's bound for exp2f);
// a subnormal x counts as 0 and a subnormal result is +0 (x < -126, -inf);
// NaN gives NaN.
__device__ __forceinline__ float ex2_approx_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// Asynchronous 16-byte global -> shared copy (cp.async.cg); src_bytes in
// [0, 16] bytes are read and the rest of the 16 bytes is zero-filled. Both
// addresses 16-byte aligned.
__device__ __forceinline__ void cp_async_16(void* smem_dst, const void* gmem_src,
                                            int src_bytes = 16) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem_dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst),
               "l"(gmem_src), "r"(src_bytes));
#else
  const float4 zero = make_float4(0.f, 0.f, 0.f, 0.f);
  float4 v = zero;
  if (src_bytes >= 16) {
    v = *static_cast<const float4*>(gmem_src);
  } else {
    const char* s = static_cast<const char*>(gmem_src);
    char* p = reinterpret_cast<char*>(&v);
    for (int i = 0; i < src_bytes; ++i) p[i] = s[i];
  }
  *static_cast<float4*>(smem_dst) = v;
#endif
}

// Asynchronous 4-byte global -> shared copy (cp.async.ca); src_bytes 4 reads
// the float, 0 writes a zero. Both addresses 4-byte aligned.
__device__ __forceinline__ void cp_async_4(void* smem_dst, const void* gmem_src,
                                           int src_bytes = 4) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem_dst));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(gmem_src),
               "r"(src_bytes));
#else
  *static_cast<float*>(smem_dst) = src_bytes >= 4 ? *static_cast<const float*>(gmem_src) : 0.0f;
#endif
}

// Closes the current group of cp_async_16 and cp_async_4 copies (cp.async.commit_group).
__device__ __forceinline__ void cp_async_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::);
#endif
}

// Waits until at most N committed groups are still in flight
// (cp.async.wait_group N). A __syncthreads() is still needed before other
// threads read what this thread copied.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
#endif
}

}  // namespace ptx
}  // namespace cuda
}  // namespace keras_ecoc

#endif  // KERAS_ECOC_EMULATOR
#endif  // KERAS_ECOC_KERNELS_CUDA_ECOC_PTX_CUH_
