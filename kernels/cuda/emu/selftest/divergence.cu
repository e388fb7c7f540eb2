// Emulator self-test: warp divergence, a partial __syncthreads and a
// deadlock each abort the emulator with a message (the test checks which).
// Usage: divergence <case>, case = shuffle | syncwarp | syncthreads |
// exited_lane | ok. "ok" runs the same kernels' correct variants and
// checks their results (exit 0).
#include <cuda_runtime.h>

#include <cstdio>
#include <cstring>

__global__ void ShuffleSites(float* out, int diverge) {
  extern __shared__ float smem[];
  const int lane = threadIdx.x % 32;
  float v = static_cast<float>(threadIdx.x);
  if (diverge && lane < 16) {
    v += __shfl_xor_sync(0xffffffffu, v, 1);  // one call site ...
  } else {
    v += __shfl_xor_sync(0xffffffffu, v, 1);  // ... and another one
  }
  smem[threadIdx.x] = v;
  __syncthreads();
  out[blockIdx.x * blockDim.x + threadIdx.x] = smem[blockDim.x - 1 - threadIdx.x];
}

__global__ void SyncwarpExited(float* out, int diverge) {
  const int lane = threadIdx.x % 32;
  if (diverge && lane >= 16) return;  // these lanes never reach the __syncwarp
  out[threadIdx.x] = 1.0f;
  __syncwarp();
  const float other = out[threadIdx.x ^ 1];
  __syncwarp();  // every lane has read before any lane writes
  out[threadIdx.x] += other;
}

__global__ void PartialSyncthreads(float* out, int diverge) {
  if (!diverge || threadIdx.x < 64) __syncthreads();
  out[threadIdx.x] = 2.0f;
}

__global__ void HalfWarpMasks(float* out, int diverge) {
  // Two half-warps shuffling with their own masks: legal. With diverge the
  // upper half names lane 0 in its mask, which never joins its call.
  const int lane = threadIdx.x % 32;
  const unsigned mask = lane < 16 ? 0x0000ffffu : (diverge ? 0xffff0001u : 0xffff0000u);
  float v = static_cast<float>(lane);
  v += __shfl_down_sync(mask, v, 1, 16);
  out[threadIdx.x] = v;
}

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s shuffle|syncwarp|syncthreads|mask|ok\n", argv[0]);
    return 3;
  }
  const char* c = argv[1];
  const bool ok = std::strcmp(c, "ok") == 0;
  float* d = nullptr;
  cudaMalloc(&d, 256 * sizeof(float) * 2);
  float h[512];
  int bad = 0;
  if (ok || std::strcmp(c, "shuffle") == 0) {
    ShuffleSites<<<2, 128, 128 * sizeof(float)>>>(d, ok ? 0 : 1);
    cudaMemcpy(h, d, 256 * sizeof(float), cudaMemcpyDeviceToHost);
    for (int b = 0; b < 2; ++b)
      for (int t = 0; t < 128; ++t) {
        const int src = 127 - t;  // thread whose value lands at t
        if (h[b * 128 + t] != static_cast<float>(src + (src ^ 1))) ++bad;
      }
  }
  if (ok || std::strcmp(c, "syncwarp") == 0) {
    SyncwarpExited<<<1, 64>>>(d, ok ? 0 : 1);
    cudaMemcpy(h, d, 64 * sizeof(float), cudaMemcpyDeviceToHost);
    for (int t = 0; t < 64; ++t) bad += h[t] != 2.0f;
  }
  if (ok || std::strcmp(c, "syncthreads") == 0) {
    PartialSyncthreads<<<1, 128>>>(d, ok ? 0 : 1);
    cudaMemcpy(h, d, 128 * sizeof(float), cudaMemcpyDeviceToHost);
    for (int t = 0; t < 128; ++t) bad += h[t] != 2.0f;
  }
  if (ok || std::strcmp(c, "mask") == 0) {
    HalfWarpMasks<<<1, 32>>>(d, ok ? 0 : 1);
    cudaMemcpy(h, d, 32 * sizeof(float), cudaMemcpyDeviceToHost);
    for (int t = 0; t < 32; ++t) {
      const int l = t % 16;
      const float want = static_cast<float>(t) + static_cast<float>(l < 15 ? t + 1 : t);
      bad += h[t] != want;
    }
  }
  const cudaError_t err = cudaGetLastError();
  std::printf("%s: %d wrong values, last error %s\n", c, bad, cudaGetErrorName(err));
  cudaFree(d);
  return bad == 0 && err == cudaSuccess ? 0 : 1;
}
