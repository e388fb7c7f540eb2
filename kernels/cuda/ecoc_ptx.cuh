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
//   wgmma_*, fence_proxy_async_shared, shared_address   sm_90a only (the
//                      architecture-specific target compute_90a / sm_90a, where
//                      nvcc defines __CUDA_ARCH_FEAT_SM90_ALL; KERAS_ECOC_WGMMA
//                      below): elsewhere they trap, and the launcher never runs
//                      a kernel that calls them (MakePlan, kWgmma). wgmma_pin,
//                      an empty asm, compiles everywhere.
#ifndef KERAS_ECOC_KERNELS_CUDA_ECOC_PTX_CUH_
#define KERAS_ECOC_KERNELS_CUDA_ECOC_PTX_CUH_

#include <cstdint>

#include "ecoc_ldmatrix_layout.h"
#include "ecoc_wgmma_desc.h"

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
// aligned); with x2 only lanes 0-15 are read (ecoc_ldmatrix_layout.h
// states this layout for the emulator and the selftest). One instruction
// replaces the 2 or 4 scalar shared loads per lane of an A or B fragment of
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


// --- Hopper's warpgroup products (wgmma), sm_90a only ----------------------
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define KERAS_ECOC_WGMMA_DEVICE 1
#endif

// The shared window's byte address of p (for wgmma's descriptors).
__device__ __forceinline__ uint32_t shared_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Makes this thread's generic-proxy shared-memory writes visible to the
// async proxy that wgmma reads its shared operands through
// (fence.proxy.async.shared::cta); a barrier then publishes them to the
// warpgroups.
__device__ __forceinline__ void fence_proxy_async_shared() {
#ifdef KERAS_ECOC_WGMMA_DEVICE
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#else
  __trap();
#endif
}

// Orders this thread's register writes (A fragments, accumulators) before
// the warpgroup's next wgmma reads them (wgmma.fence.sync.aligned).
__device__ __forceinline__ void wgmma_fence() {
#ifdef KERAS_ECOC_WGMMA_DEVICE
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#else
  __trap();
#endif
}

// Ties the values of A fragment registers to this point (an empty asm that
// reads and writes each): call it before wgmma_fence on registers that are
// not all read by the first product after the fence. Without it the
// compiler sinks their last arithmetic (a small half's subtraction) past the
// first wgmma, and ptxas then injects a warpgroup.arrive before the product
// that reads them (its note C7519), splitting the k-step's batch of HGMMAs.
template <int M>
__device__ __forceinline__ void wgmma_pin(uint32_t (&r)[M]) {
#pragma unroll
  for (int i = 0; i < M; ++i) asm volatile("" : "+r"(r[i]));
}

// Closes the group of wgmma issued since the last commit
// (wgmma.commit_group.sync.aligned).
__device__ __forceinline__ void wgmma_commit() {
#ifdef KERAS_ECOC_WGMMA_DEVICE
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#else
  __trap();
#endif
}

// Waits until at most N committed groups are in flight
// (wgmma.wait_group.sync.aligned N): their accumulators may then be read and
// their A registers and shared operands overwritten.
template <int N>
__device__ __forceinline__ void wgmma_wait() {
#ifdef KERAS_ECOC_WGMMA_DEVICE
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
#else
  __trap();
#endif
}

// d += A . B for the warpgroup's 64 x 64 tile, K = 8, TF32 in, FP32
// accumulate (wgmma.mma_async.sync.aligned.m64n64k8.f32.tf32.tf32, A from
// registers, B from shared memory through `desc_b`, ecoc_wgmma_desc.h: N = 64
// rows of B, K-major). Warpgroup-collective (4 consecutive warps, all
// lanes), asynchronous: wgmma_fence before, wgmma_commit / wgmma_wait
// after. Fragments (PTX ISA, "Matrix Fragments for wgmma.m64nNk8"): warp w
// of the group holds rows 16 w .. 16 w + 15 as mma.m16n8k8's A fragment
// (a[0] = A[g][t], a[1] = A[g + 8][t], a[2] = A[g][t + 4], a[3] = A[g + 8][t + 4])
// and d[j][e] is mma.m16n8k8's accumulator e of the columns 8 j .. 8 j + 7.
__device__ __forceinline__ void wgmma_m64n64k8_tf32(float (&d)[8][4], const uint32_t a[4],
                                                    uint64_t desc_b) {
#ifdef KERAS_ECOC_WGMMA_DEVICE
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k8.f32.tf32.tf32 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
      "{%32, %33, %34, %35}, %36, p, 1, 1;\n"
      "}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]),
        "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
        "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]),
        "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
        "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]),
        "+f"(d[7][2]), "+f"(d[7][3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(1));
#else
  (void)d, (void)a, (void)desc_b;
  __trap();
#endif
}

// The same with N = 128 and N = 32 (m64n128k8, m64n32k8): d[j][e] for the
// columns 8 j .. 8 j + 7, j < N / 8.
__device__ __forceinline__ void wgmma_m64n128k8_tf32(float (&d)[16][4], const uint32_t a[4],
                                                     uint64_t desc_b) {
#ifdef KERAS_ECOC_WGMMA_DEVICE
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k8.f32.tf32.tf32 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, "
      "%18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, "
      "%34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, "
      "%50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
      "{%64, %65, %66, %67}, %68, p, 1, 1;\n"
      "}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]),
        "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
        "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]),
        "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
        "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]),
        "+f"(d[7][2]), "+f"(d[7][3]), "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]),
        "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]), "+f"(d[10][0]),
        "+f"(d[10][1]), "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[11][0]), "+f"(d[11][1]),
        "+f"(d[11][2]), "+f"(d[11][3]), "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]),
        "+f"(d[12][3]), "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]),
        "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]), "+f"(d[15][0]),
        "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(1));
#else
  (void)d, (void)a, (void)desc_b;
  __trap();
#endif
}

__device__ __forceinline__ void wgmma_m64n32k8_tf32(float (&d)[4][4], const uint32_t a[4],
                                                    uint64_t desc_b) {
#ifdef KERAS_ECOC_WGMMA_DEVICE
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %21, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k8.f32.tf32.tf32 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, "
      "{%16, %17, %18, %19}, %20, p, 1, 1;\n"
      "}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]),
        "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
        "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(1));
#else
  (void)d, (void)a, (void)desc_b;
  __trap();
#endif
}

// d += A . B at N = 32, 64 or 128 (the wrappers above).
template <int N>
__device__ __forceinline__ void wgmma_tf32(float (&d)[N / 8][4], const uint32_t a[4],
                                           uint64_t desc_b) {
  static_assert(N == 32 || N == 64 || N == 128, "N: 32, 64 or 128");
  if constexpr (N == 32) {
    wgmma_m64n32k8_tf32(d, a, desc_b);
  } else if constexpr (N == 64) {
    wgmma_m64n64k8_tf32(d, a, desc_b);
  } else {
    wgmma_m64n128k8_tf32(d, a, desc_b);
  }
}

}  // namespace ptx
}  // namespace cuda
}  // namespace keras_ecoc

#endif  // KERAS_ECOC_EMULATOR
#endif  // KERAS_ECOC_KERNELS_CUDA_ECOC_PTX_CUH_
