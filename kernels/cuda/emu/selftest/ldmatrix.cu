// Emulator self-test of ptx::ldmatrix_x4 / ldmatrix_x2 on 32-bit words, the
// property the mma kernels rely on: lane l's register j holds what a plain
// shared load of word l % 4 of row l / 4 of matrix j gives, where lane
// 8j + r supplied the address of that matrix's row r.
// Shared word i holds i. One warp runs T trials; trial t uses the pitch
// PITCHES[t % 4] floats, matrix j's rows start at word base_j (a multiple of
// 4, different per matrix and trial) and rows step by the pitch. For each
// trial and lane the program compares the x4 and x2 registers with the
// plain loads and counts mismatches; it writes the mismatch count and the
// number of registers compared to OUT (two uint32), and exits 1 if any
// register differs.
// MODE "ok" runs the trials; "misaligned" gives lane 5 an address 4 bytes
// off a 16-byte boundary and "outside" gives lane 9 one past the end of the
// block's shared memory: both must abort the emulated launch.
// The same source builds with nvcc (a GPU run checks the layout on the card):
//   nvcc -O2 -arch=sm_90 -std=c++17 -Ikernels/cuda -x cu kernels/cuda/emu/selftest/ldmatrix.cu
// Usage: ldmatrix OUT MODE
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstring>

#include "ecoc_ptx.cuh"

namespace ptx = keras_ecoc::cuda::ptx;
namespace lm = keras_ecoc::cuda::ldmatrix;

constexpr int kWords = 8192;
constexpr int kTrials = 64;

__global__ void Trials(uint32_t* result, int mode) {
  extern __shared__ __align__(16) uint32_t words[];
  const int lane = threadIdx.x;
  for (int i = lane; i < kWords; i += 32) words[i] = static_cast<uint32_t>(i);
  __syncwarp();
  const int pitches[4] = {36, 132, 12, 20};
  uint32_t bad = 0, compared = 0;
  for (int trial = 0; trial < kTrials; ++trial) {
    const int pitch = pitches[trial % 4];
    int base[4];
    for (int j = 0; j < 4; ++j) base[j] = 4 * ((trial * 37 + j * 101) % 64) + j * 8 * pitch;
    const lm::Row mine = lm::AddressedRow(lane);
    const uint32_t* row = words + base[mine.matrix] + mine.row * pitch;
    if (mode == 1 && lane == 5) row += 1;                // 4 bytes off
    if (mode == 2 && lane == 9) row = words + kWords;    // past the end
    uint32_t r4[4], r2[2];
    ptx::ldmatrix_x4(r4, row);
    ptx::ldmatrix_x2(r2, row);
    for (int j = 0; j < 4; ++j) {
      const lm::Word w = lm::Received(lane, j);
      const uint32_t want = words[base[w.matrix] + w.row * pitch + w.word];
      bad += r4[j] != want;
      if (j < 2) bad += r2[j] != want;
      compared += j < 2 ? 2 : 1;
    }
  }
  atomicAdd(&result[0], bad);
  atomicAdd(&result[1], compared);
}

int main(int argc, char** argv) {
  if (argc != 3) return 3;
  const int mode = std::strcmp(argv[2], "ok") == 0           ? 0
                   : std::strcmp(argv[2], "misaligned") == 0 ? 1
                   : std::strcmp(argv[2], "outside") == 0    ? 2
                                                             : -1;
  if (mode < 0) return 3;
  uint32_t* d;
  cudaMalloc(&d, 8);
  cudaMemset(d, 0, 8);
  Trials<<<1, 32, kWords * 4>>>(d, mode);
  if (cudaDeviceSynchronize() != cudaSuccess) return 4;
  uint32_t h[2];
  cudaMemcpy(h, d, 8, cudaMemcpyDeviceToHost);
  cudaFree(d);
  FILE* f = std::fopen(argv[1], "wb");
  if (f == nullptr) return 3;
  std::fwrite(h, 4, 2, f);
  std::fclose(f);
  std::printf("ldmatrix: %u of %u registers differ from plain loads\n", h[0], h[1]);
  return h[0] == 0 && h[1] > 0 ? 0 : 1;
}
