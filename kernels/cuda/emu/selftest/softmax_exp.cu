// Emulator self-test of the softmax's exponential (SoftmaxExp, ecoc_common.cuh):
// reads V float32 values from IN, evaluates SoftmaxExp<kMath3xTf32> (the
// tensor-core modes: ex2.approx.ftz of x log2 e) and SoftmaxExp<kMathFp32>
// (expf) on each, and writes the V fast results, then the V accurate ones,
// to OUT.
// The same source builds with nvcc, so a GPU run shows MUFU's own error too:
//   nvcc -O2 -arch=sm_90 -std=c++17 -Ikernels/cuda -x cu kernels/cuda/emu/selftest/softmax_exp.cu
// Usage: softmax_exp IN OUT V
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "ecoc_common.cuh"

__global__ void Exp(const float* x, float* fast, float* accurate, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) {
    using namespace keras_ecoc::cuda::detail;
    fast[i] = SoftmaxExp<kMath3xTf32>(x[i]);
    accurate[i] = SoftmaxExp<kMathFp32>(x[i]);
  }
}

int main(int argc, char** argv) {
  if (argc != 4) return 3;
  const int V = std::atoi(argv[3]);
  if (V <= 0) return 3;
  std::vector<float> x(V), fast(V), accurate(V);
  FILE* f = std::fopen(argv[1], "rb");
  if (f == nullptr) return 3;
  const size_t got = std::fread(x.data(), 4, V, f);
  std::fclose(f);
  if (got != static_cast<size_t>(V)) return 3;
  float *dx, *df, *da;
  cudaMalloc(&dx, V * 4);
  cudaMalloc(&df, V * 4);
  cudaMalloc(&da, V * 4);
  cudaMemcpy(dx, x.data(), V * 4, cudaMemcpyHostToDevice);
  Exp<<<4, 64>>>(dx, df, da, V);
  if (cudaGetLastError() != cudaSuccess) return 1;
  cudaMemcpy(fast.data(), df, V * 4, cudaMemcpyDeviceToHost);
  cudaMemcpy(accurate.data(), da, V * 4, cudaMemcpyDeviceToHost);
  f = std::fopen(argv[2], "wb");
  if (f == nullptr) return 3;
  std::fwrite(fast.data(), 4, V, f);
  std::fwrite(accurate.data(), 4, V, f);
  std::fclose(f);
  return 0;
}
