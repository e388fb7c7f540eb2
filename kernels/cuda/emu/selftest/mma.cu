// Emulator self-test of the emulated PTX: reads T tiles of
// mma.m16n8k8 TF32 operands (A 16x8, B 8x8 as uint32 bit patterns, C 16x8
// float32, row-major, one tile after another) and V float32 values from
// IN, runs one warp per tile through ptx::mma_m16n8k8_tf32 (fragments in the
// PTX ISA layout of ecoc_ptx.cuh), ptx::cvt_rna_tf32 and the kernels' finite
// 3xTF32 split (SplitTf32Finite, ecoc_tf32.cuh) on the values, and writes
// D (T x 16x8 float32), the V converted patterns, then V (big, small) pairs
// to OUT.
// Usage: mma IN OUT T V
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "ecoc_ptx.cuh"
#include "ecoc_tf32.cuh"

namespace ptx = keras_ecoc::cuda::ptx;

__global__ void MmaTiles(const uint32_t* a, const uint32_t* b, const float* c, float* d) {
  const int lane = threadIdx.x, g = lane / 4, t = lane % 4;
  const uint32_t* A = a + blockIdx.x * 128;
  const uint32_t* B = b + blockIdx.x * 64;
  const float* C = c + blockIdx.x * 128;
  float* D = d + blockIdx.x * 128;
  const uint32_t af[4] = {A[g * 8 + t], A[(g + 8) * 8 + t], A[g * 8 + t + 4], A[(g + 8) * 8 + t + 4]};
  const uint32_t bf[2] = {B[t * 8 + g], B[(t + 4) * 8 + g]};
  const float cf[4] = {C[g * 8 + 2 * t], C[g * 8 + 2 * t + 1], C[(g + 8) * 8 + 2 * t],
                       C[(g + 8) * 8 + 2 * t + 1]};
  float df[4];
  ptx::mma_m16n8k8_tf32(df, af, bf, cf);
  D[g * 8 + 2 * t] = df[0];
  D[g * 8 + 2 * t + 1] = df[1];
  D[(g + 8) * 8 + 2 * t] = df[2];
  D[(g + 8) * 8 + 2 * t + 1] = df[3];
}

__global__ void Cvt(const float* x, uint32_t* y, uint32_t* split, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) {
    y[i] = ptx::cvt_rna_tf32(x[i]);
    keras_ecoc::cuda::detail::SplitTf32Finite(x[i], &split[2 * i], &split[2 * i + 1]);
  }
}

int main(int argc, char** argv) {
  if (argc != 5) return 3;
  const int T = std::atoi(argv[3]), V = std::atoi(argv[4]);
  std::vector<uint32_t> a(T * 128), b(T * 64);
  std::vector<float> c(T * 128), x(V);
  FILE* f = std::fopen(argv[1], "rb");
  if (f == nullptr) return 3;
  auto read = [f](void* p, size_t n) { return n == 0 ? 0 : std::fread(p, 4, n, f); };
  const size_t got = read(a.data(), a.size()) + read(b.data(), b.size()) +
                     read(c.data(), c.size()) + read(x.data(), x.size());
  std::fclose(f);
  if (got != a.size() + b.size() + c.size() + x.size()) return 3;
  uint32_t *da, *db, *dy, *ds;
  float *dc, *dd, *dx;
  cudaMalloc(&da, a.size() * 4);
  cudaMalloc(&db, b.size() * 4);
  cudaMalloc(&dc, c.size() * 4);
  cudaMalloc(&dd, c.size() * 4);
  cudaMalloc(&dx, (V > 0 ? V : 1) * 4);
  cudaMalloc(&dy, (V > 0 ? V : 1) * 4);
  cudaMalloc(&ds, (V > 0 ? V : 1) * 8);
  cudaMemcpy(da, a.data(), a.size() * 4, cudaMemcpyHostToDevice);
  cudaMemcpy(db, b.data(), b.size() * 4, cudaMemcpyHostToDevice);
  cudaMemcpy(dc, c.data(), c.size() * 4, cudaMemcpyHostToDevice);
  if (V > 0) cudaMemcpy(dx, x.data(), V * 4, cudaMemcpyHostToDevice);
  MmaTiles<<<T, 32>>>(da, db, dc, dd);
  Cvt<<<4, 64>>>(dx, dy, ds, V);
  if (cudaGetLastError() != cudaSuccess) return 1;
  std::vector<float> d(c.size());
  std::vector<uint32_t> y(V), split(2 * V);
  cudaMemcpy(d.data(), dd, d.size() * 4, cudaMemcpyDeviceToHost);
  if (V > 0) cudaMemcpy(y.data(), dy, V * 4, cudaMemcpyDeviceToHost);
  if (V > 0) cudaMemcpy(split.data(), ds, V * 8, cudaMemcpyDeviceToHost);
  f = std::fopen(argv[2], "wb");
  if (f == nullptr) return 3;
  std::fwrite(d.data(), 4, d.size(), f);
  if (V > 0) std::fwrite(y.data(), 4, y.size(), f);
  if (V > 0) std::fwrite(split.data(), 4, split.size(), f);
  std::fclose(f);
  return 0;
}
