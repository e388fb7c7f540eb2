// Runs mma.sync.m16n8k8 TF32 on 512 tiles and cvt.rna.tf32 on 65536 values
// of pseudo-random operands (xorshift64, fixed seed: exponents over
// 2^-20..2^20 for the mma and nearly the whole float32 range for cvt, zeros,
// subnormals and exact TF32 rounding ties), and writes inputs and results
// (uint32 words: A, B, C, x, D, y) to the file named by $R.
//
// The same source builds with nvcc on a GPU and under the emulator, so the
// two dumps can be compared byte for byte. On an NVIDIA H100 (driver
// 580.159.04, nvcc 13.0, -arch=sm_90) the dump's D and y parts hash to the
// SHA-256 recorded in tests/test_cuda_emulator.py, which the emulated
// sm_90 run must reproduce.
//   nvcc -O2 -arch=sm_90 -Ikernels/cuda -x cu kernels/cuda/emu/selftest/mma_random.cu -o m
//   R=dump.bin ./m
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "ecoc_ptx.cuh"

using namespace keras_ecoc::cuda;
typedef uint32_t U;

__global__ void Mma(const U* a, const U* b, const float* c, float* d) {
  const int l = threadIdx.x, g = l / 4, t = l % 4, o = blockIdx.x;
  a += o * 128;
  b += o * 64;
  c += o * 128;
  d += o * 128;
  const U af[4] = {a[g * 8 + t], a[g * 8 + 64 + t], a[g * 8 + t + 4], a[g * 8 + 68 + t]};
  const U bf[2] = {b[t * 8 + g], b[t * 8 + 32 + g]};
  const float cf[4] = {c[g * 8 + 2 * t], c[g * 8 + 2 * t + 1], c[g * 8 + 64 + 2 * t],
                       c[g * 8 + 65 + 2 * t]};
  float f[4];
  ptx::mma_m16n8k8_tf32(f, af, bf, cf);
  d[g * 8 + 2 * t] = f[0];
  d[g * 8 + 2 * t + 1] = f[1];
  d[g * 8 + 64 + 2 * t] = f[2];
  d[g * 8 + 65 + 2 * t] = f[3];
}

__global__ void Cvt(const float* x, U* y, int n) {
  const int i = blockIdx.x * 256 + threadIdx.x;
  if (i < n) y[i] = ptx::cvt_rna_tf32(x[i]);
}

int main() {
  const int T = 512, N = T * 320, M = 65536, S = N + M;
  U* h = new U[S + T * 128 + M];
  unsigned long long s = 88172645463325252ull;
  for (int i = 0; i < S; i++) {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    const U r = static_cast<U>(s);
    const int e = i >= N ? static_cast<int>((r >> 24) % 250 + 3)
                         : 127 + static_cast<int>((s >> 40) % 41) - 20;
    U m = (s >> 32) & 0x7fffff;
    if ((s >> 56) % 16 == 0) m = (m & ~0x1fffu) | 0x1000;  // a TF32 rounding tie
    U v = (r & 0x80000000u) | (static_cast<U>(e) << 23) | m;
    if ((s >> 60) == 0) v = 0;
    if ((s >> 52) % 64 == 1) v &= 0x807fffffu;  // subnormal
    h[i] = v;
  }
  U* g = nullptr;
  cudaMalloc(&g, (S + T * 128 + M) * sizeof(U));
  cudaMemcpy(g, h, S * sizeof(U), cudaMemcpyHostToDevice);
  Mma<<<T, 32>>>(g, g + T * 128, reinterpret_cast<float*>(g) + T * 192,
                 reinterpret_cast<float*>(g) + S);
  Cvt<<<M / 256, 256>>>(reinterpret_cast<float*>(g) + N, g + S + T * 128, M);
  cudaMemcpy(h + S, g + S, (T * 128 + M) * sizeof(U), cudaMemcpyDeviceToHost);
  const cudaError_t err = cudaGetLastError();
  std::printf("%s\n", cudaGetErrorString(err));
  const char* path = std::getenv("R");
  if (path == nullptr || err != cudaSuccess) return 1;
  FILE* f = std::fopen(path, "wb");
  if (f == nullptr) return 1;
  std::fwrite(h, sizeof(U), S + T * 128 + M, f);
  std::fclose(f);
  cudaFree(g);
  delete[] h;
  return 0;
}
