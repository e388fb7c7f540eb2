// Emulator self-test of shared memory and launch limits.
// Usage: shared_memory <case>:
//   limits      dynamic shared memory limits as on a GPU (48 KiB default,
//               cudaFuncSetAttribute up to the opt-in maximum), exit 0
//   oob         a kernel writes one float past its dynamic shared memory:
//               AddressSanitizer must stop it
//   nan         fresh shared memory reads as NaN, exit 0
//   cp_async    a cp.async destination read before its wait is stale; after
//               the wait it holds the data (zero-filled past src_bytes), for
//               16-byte (cp_async_16) and 4-byte (cp_async_4) copies, exit 0
//   cp_async_eager  the same kernels under KERAS_ECOC_EMU_CP_ASYNC=eager
//               (run.py --cp-async eager): the destination holds the data
//               already before the wait, exit 0
//   warp_ahead  warp 1 reads what warp 0 wrote after a __syncwarp, with no
//               block barrier between (a race): prints what warp 1 read; the
//               round schedules keep the warps in step (warp 1 sees 1), the
//               warp-major ones let warp 0 finish first (warps: 1) or warp 1
//               (warps-reverse: NaN, the fresh shared memory), exit 0
//   cp_async_oob  a cp.async reads 4 bytes past its global buffer: ASan
//               must stop it (the copy runs inside the emulator's runtime)
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstring>

#include "ecoc_ptx.cuh"

__global__ void Touch(float* out, int words, int past_end) {
  extern __shared__ float smem[];
  for (int i = threadIdx.x; i < words; i += blockDim.x) smem[i] = 1.0f;
  __syncthreads();
  if (past_end && threadIdx.x == 0) smem[words] = 2.0f;  // one float too far
  __syncthreads();
  if (threadIdx.x == 0) out[blockIdx.x] = smem[words - 1];
}

__global__ void ReadFresh(float* out) {
  extern __shared__ float smem[];
  out[threadIdx.x] = smem[threadIdx.x];
  __syncthreads();
  smem[threadIdx.x] = 0.0f;  // the next block must see NaN again
}

__global__ void CpAsyncStale(const float* src, float* out) {
  extern __shared__ __align__(16) float smem[];
  const int t = threadIdx.x;  // 8 threads, 4 floats each
  keras_ecoc::cuda::ptx::cp_async_16(smem + 4 * t, src + 4 * t, t == 7 ? 8 : 16);
  keras_ecoc::cuda::ptx::cp_async_commit();
  out[t] = smem[4 * t];  // before the wait: not copied yet
  keras_ecoc::cuda::ptx::cp_async_wait<0>();
  for (int j = 0; j < 4; ++j) out[8 + 4 * t + j] = smem[4 * t + j];
}

// 4-byte copies: thread t copies src[t] to smem[t]; thread 7 with src_bytes
// 0 (a zero). out[0 .. 7]: before the wait, out[8 .. 15]: after.
__global__ void CpAsync4Stale(const float* src, float* out) {
  extern __shared__ __align__(16) float smem[];
  const int t = threadIdx.x;  // 8 threads
  keras_ecoc::cuda::ptx::cp_async_4(smem + t, src + t, t == 7 ? 0 : 4);
  keras_ecoc::cuda::ptx::cp_async_commit();
  out[t] = smem[t];
  keras_ecoc::cuda::ptx::cp_async_wait<0>();
  out[8 + t] = smem[t];
}

// Two warps: warp 0 writes smem after a __syncwarp, warp 1 reads it after
// its own, with no block barrier between them.
__global__ void WarpAhead(float* out) {
  extern __shared__ float smem[];
  const int t = threadIdx.x;
  __syncwarp();
  if (t < 32) smem[t] = 1.0f;
  __syncwarp();
  if (t >= 32) out[t - 32] = smem[t - 32];
  __syncthreads();
}

int main(int argc, char** argv) {
  if (argc != 2) return 3;
  const char* c = argv[1];
  float* d = nullptr;
  cudaMalloc(&d, 4096 * sizeof(float));
  int bad = 0;
  if (std::strcmp(c, "limits") == 0) {
    int optin = 0;
    cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0);
    const int big = 48 * 1024 + 16;
    Touch<<<1, 64, big>>>(d, big / 4, 0);
    const cudaError_t e1 = cudaGetLastError();  // above 48 KiB without the attribute
    const cudaError_t e2 = cudaFuncSetAttribute(Touch, cudaFuncAttributeMaxDynamicSharedMemorySize, big);
    Touch<<<2, 64, big>>>(d, big / 4, 0);
    const cudaError_t e3 = cudaGetLastError();
    const cudaError_t e4 =
        cudaFuncSetAttribute(Touch, cudaFuncAttributeMaxDynamicSharedMemorySize, optin + 4);
    Touch<<<1, 64, optin + 4>>>(d, (optin + 4) / 4, 0);
    const cudaError_t e5 = cudaGetLastError();
    Touch<<<1, 2048, 0>>>(d, 1, 0);
    const cudaError_t e6 = cudaGetLastError();
    std::printf("optin %d: 48K+16 unset %s, set %s, launch %s; optin+4 set %s, launch %s; "
                "2048 threads %s\n",
                optin, cudaGetErrorName(e1), cudaGetErrorName(e2), cudaGetErrorName(e3),
                cudaGetErrorName(e4), cudaGetErrorName(e5), cudaGetErrorName(e6));
    bad = !(e1 == cudaErrorInvalidValue && e2 == cudaSuccess && e3 == cudaSuccess &&
            e4 == cudaErrorInvalidValue && e5 == cudaErrorInvalidValue &&
            e6 == cudaErrorInvalidConfiguration);
  } else if (std::strcmp(c, "oob") == 0) {
    Touch<<<1, 64, 1000 * sizeof(float)>>>(d, 1000, 1);
    cudaDeviceSynchronize();
    std::printf("oob: the write past the end was not caught\n");
    bad = 1;
  } else if (std::strcmp(c, "nan") == 0) {
    ReadFresh<<<3, 32, 32 * sizeof(float)>>>(d);
    float h[32];
    cudaMemcpy(h, d, sizeof(h), cudaMemcpyDeviceToHost);
    for (float v : h) bad += !std::isnan(v);
    std::printf("nan: %d of 32 fresh shared floats were not NaN\n", bad);
  } else if (std::strcmp(c, "cp_async") == 0 || std::strcmp(c, "cp_async_eager") == 0) {
    // Before the wait: stale (NaN) with deferred copies, the data with eager ones.
    const bool eager = std::strcmp(c, "cp_async_eager") == 0;
    float hs[32], ho[40];
    for (int i = 0; i < 32; ++i) hs[i] = static_cast<float>(i + 1);
    cudaMemcpy(d, hs, sizeof(hs), cudaMemcpyHostToDevice);
    CpAsyncStale<<<1, 8, 32 * sizeof(float)>>>(d, d + 64);
    cudaMemcpy(ho, d + 64, sizeof(ho), cudaMemcpyDeviceToHost);
    for (int t = 0; t < 8; ++t) {
      bad += eager ? ho[t] != static_cast<float>(4 * t + 1) : !std::isnan(ho[t]);
    }
    for (int i = 0; i < 32; ++i) {
      const float want = (i >= 30) ? 0.0f : static_cast<float>(i + 1);  // 8 of 16 bytes, zero fill
      bad += ho[8 + i] != want;
    }
    float h4[16];
    CpAsync4Stale<<<1, 8, 8 * sizeof(float)>>>(d, d + 128);
    cudaMemcpy(h4, d + 128, sizeof(h4), cudaMemcpyDeviceToHost);
    for (int t = 0; t < 8; ++t) {
      const float want = t == 7 ? 0.0f : static_cast<float>(t + 1);
      bad += eager ? h4[t] != want : !std::isnan(h4[t]);
      bad += h4[8 + t] != want;
    }
    std::printf("%s: %d wrong values\n", c, bad);
  } else if (std::strcmp(c, "warp_ahead") == 0) {
    float h[32];
    WarpAhead<<<1, 64, 32 * sizeof(float)>>>(d);
    cudaMemcpy(h, d, sizeof(h), cudaMemcpyDeviceToHost);
    int ones = 0, nans = 0;
    for (float v : h) {
      ones += v == 1.0f;
      nans += std::isnan(v);
    }
    std::printf("warp_ahead: warp 1 read %d ones and %d NaN of 32\n", ones, nans);
  } else if (std::strcmp(c, "cp_async_oob") == 0) {
    float* small = nullptr;
    cudaMalloc(&small, 29 * sizeof(float));  // 116 bytes: thread 7 reads bytes 112-119
    CpAsyncStale<<<1, 8, 32 * sizeof(float)>>>(small, d);
    cudaDeviceSynchronize();
    std::printf("cp_async_oob: the read past the end was not caught\n");
    bad = 1;
  } else {
    return 3;
  }
  cudaFree(d);
  return bad == 0 ? 0 : 1;
}
