// Self-test of the wgmma wrappers (ecoc_ptx.cuh) and of the layouts the kWgmma
// forward assumes, on the emulator and, built with nvcc for sm_90a, on a card:
//  * the A fragment of m64nNk8 TF32 is mma.m16n8k8's, per warp of the
//    warpgroup (warp w: rows 16 w .. 16 w + 15; AFragmentElement);
//  * d[j][e] holds column 8 j + 2t + (e & 1) of row 16 w + g + 8 (e / 2)
//    (DFragmentElement);
//  * a K-major unswizzled descriptor reads element (row, col) of B at
//    (row / 8) SBO + (col / 4) LBO + (row % 8) 16 + (col % 4) 4 bytes
//    (ecoc_wgmma_desc.h), and Advance() by 2 LBO is the next k-step.
// One warpgroup computes D = C + A . B^T over K = 16 (two products, the
// second through the advanced descriptor) for each layout the kernels use:
// N = 64 at LBO 128 / SBO 4096 bytes (the forward logits' code tile; the
// codes gradient's code tile at kp = 128 has these strides at N = 32),
// N = 128 and N = 32 at LBO 144 / SBO 2304 (the forward's transposed tile),
// N = 32 at LBO 128 / SBO 2048 (the codes gradient's w tile). The
// entries are small integers, so every product and sum is exact in TF32 and
// FP32 whatever the tensor cores' rounding: the result must equal the
// reference exactly. Where it does not, the program says which of a few
// wrong readings of the layouts the card's result matches instead (LBO and
// SBO exchanged; the A fragment's registers 1 and 2 exchanged; D's column
// pairs the other way round), so that a failing GPU run names the mistake.
// MODE "ok" runs the cases; "read-before-wait" reads the accumulators
// before wgmma_wait and "store-before-wait" stores into B after the issue
// and before the wait: on the emulator both must give wrong results (on a
// card they are undefined behaviour).
// Build for a card (device_check.sh's step "wgmma"):
//   nvcc -O2 -gencode=arch=compute_90a,code=sm_90a -std=c++17 -Ikernels/cuda \
//     -x cu kernels/cuda/emu/selftest/wgmma.cu
// Usage: wgmma OUT MODE. OUT receives the mismatch count and the number of
// outputs compared (two uint32); exit 0 when all match, 1 otherwise.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "ecoc_ptx.cuh"

namespace ptx = keras_ecoc::cuda::ptx;
namespace wg = keras_ecoc::cuda::wgmma;

constexpr int kK = 16;             // two k-steps
constexpr int kSmemBytes = 48 * 1024;  // zeroed, so that a wrong reading reads zeros

__host__ __device__ inline float AVal(int r, int k) {
  return static_cast<float>((r * 37 + k * 11 + r * k) % 13 - 6);
}
__host__ __device__ inline float BVal(int c, int k) {
  return static_cast<float>((c * 29 + k * 7 + c * k * 3) % 11 - 5);
}
__host__ __device__ inline float CVal(int r, int c) {
  return static_cast<float>((r * 5 + c * 3) % 17 - 8);
}

struct Case {
  int n;
  uint32_t lbo, sbo;
};
constexpr Case kCases[4] = {{64, 128, 4096}, {128, 144, 2304}, {32, 144, 2304}, {32, 128, 2048}};

// out[r * N + c] = D[r][c]; mode 0 ok, 1 read-before-wait, 2 store-before-wait.
template <int N>
__global__ void Run(float* out, uint32_t lbo, uint32_t sbo, int mode) {
  extern __shared__ __align__(128) float smem[];
  for (int i = threadIdx.x; i < kSmemBytes / 4; i += blockDim.x) smem[i] = 0.0f;
  __syncthreads();
  const wg::Decoded lay{0, lbo, sbo, 0};
  for (int e = threadIdx.x; e < N * kK; e += blockDim.x) {
    const int c = e / kK, k = e % kK;
    smem[wg::ElementOffset(lay, c, k) / 4] = BVal(c, k);
  }
  ptx::fence_proxy_async_shared();
  __syncthreads();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  float d[N / 8][4];
  for (int r = 0; r < N / 2; ++r) {
    const wg::RowCol e = wg::DFragmentElement(warp, lane, r);
    d[r / 4][r % 4] = CVal(e.row, e.col);
  }
  uint32_t a[2][4];
  for (int s = 0; s < 2; ++s) {
    for (int r = 0; r < 4; ++r) {
      const wg::RowCol e = wg::AFragmentElement(warp, lane, r);
      a[s][r] = __float_as_uint(AVal(e.row, 8 * s + e.col));
    }
  }
  const uint64_t desc = wg::Descriptor(ptx::shared_address(smem), lbo, sbo);
  ptx::wgmma_fence();
  ptx::wgmma_tf32<N>(d, a[0], desc);
  ptx::wgmma_tf32<N>(d, a[1], wg::Advance(desc, 2 * lbo));
  ptx::wgmma_commit();
  if (mode == 2) {
    // Every B element of row 0 zeroed while the products may still read it.
    if (threadIdx.x < kK) smem[wg::ElementOffset(lay, 0, threadIdx.x) / 4] = 0.0f;
  }
  if (mode != 1) ptx::wgmma_wait<0>();
  for (int r = 0; r < N / 2; ++r) {
    const wg::RowCol e = wg::DFragmentElement(warp, lane, r);
    out[e.row * N + e.col] = d[r / 4][r % 4];
  }
  if (mode == 1) ptx::wgmma_wait<0>();
}

// The reference under a reading of the layouts: swap_strides reads B with
// LBO and SBO exchanged, swap_a12 takes the A fragment's registers 1 and 2
// in each other's places, swap_cols exchanges columns 2t and 2t + 1 of D.
std::vector<float> Reference(const Case& cs, bool swap_strides, bool swap_a12, bool swap_cols) {
  std::vector<float> image(kSmemBytes / 4, 0.0f);
  const wg::Decoded lay{0, cs.lbo, cs.sbo, 0};
  for (int c = 0; c < cs.n; ++c)
    for (int k = 0; k < kK; ++k) image[wg::ElementOffset(lay, c, k) / 4] = BVal(c, k);
  const wg::Decoded read{0, swap_strides ? cs.sbo : cs.lbo, swap_strides ? cs.lbo : cs.sbo, 0};
  // The second k-step's descriptor starts 2 LBO on (Advance), whatever
  // the card makes of the strides within a k-step.
  auto b = [&](int c, int k) {
    const uint32_t off = ((k / 8) * 2 * cs.lbo + wg::ElementOffset(read, c, k % 8)) / 4;
    return off < image.size() ? image[off] : 0.0f;
  };
  auto a = [&](int r, int k) {
    // Registers 1 and 2 of a lane hold (g + 8, t) and (g, t + 4); swapped,
    // the card would take A[g + 8][t] as column t + 4 of row g and so on.
    if (!swap_a12) return AVal(r, k);
    const int rg = r % 16, kk = k % 8, base_r = r - rg, base_k = k - kk;
    const int g = rg % 8, hi = rg / 8, t = kk % 4, hk = kk / 4;
    if (hi != hk) return AVal(base_r + g + 8 * hk, base_k + t + 4 * hi);
    return AVal(r, k);
  };
  std::vector<float> d(64 * cs.n);
  for (int r = 0; r < 64; ++r) {
    for (int c = 0; c < cs.n; ++c) {
      double acc = CVal(r, c);
      for (int k = 0; k < kK; ++k) acc += static_cast<double>(a(r, k)) * b(c, k);
      const int cc = swap_cols ? (c ^ 1) : c;
      d[r * cs.n + cc] = static_cast<float>(acc);
    }
  }
  return d;
}

int main(int argc, char** argv) {
  if (argc != 3) return 3;
  const int mode = std::strcmp(argv[2], "ok") == 0                  ? 0
                   : std::strcmp(argv[2], "read-before-wait") == 0  ? 1
                   : std::strcmp(argv[2], "store-before-wait") == 0 ? 2
                                                                    : -1;
  if (mode < 0) return 3;
  uint32_t bad = 0, compared = 0;
  float* dev = nullptr;
  if (cudaMalloc(&dev, 64 * 128 * sizeof(float)) != cudaSuccess) return 4;
  for (const Case& cs : kCases) {
    if (cs.n == 32) Run<32><<<1, 128, kSmemBytes>>>(dev, cs.lbo, cs.sbo, mode);
    if (cs.n == 64) Run<64><<<1, 128, kSmemBytes>>>(dev, cs.lbo, cs.sbo, mode);
    if (cs.n == 128) Run<128><<<1, 128, kSmemBytes>>>(dev, cs.lbo, cs.sbo, mode);
    if (cudaDeviceSynchronize() != cudaSuccess) return 4;
    std::vector<float> got(64 * cs.n);
    cudaMemcpy(got.data(), dev, got.size() * sizeof(float), cudaMemcpyDeviceToHost);
    auto count = [&](const std::vector<float>& want) {
      uint32_t n = 0;
      for (size_t i = 0; i < want.size(); ++i) n += !(got[i] == want[i]);
      return n;
    };
    const uint32_t wrong = count(Reference(cs, false, false, false));
    bad += wrong;
    compared += static_cast<uint32_t>(got.size());
    std::printf("wgmma m64n%dk8 (LBO %u, SBO %u): %u of %zu outputs differ", cs.n, cs.lbo, cs.sbo,
                wrong, got.size());
    if (wrong != 0) {
      const char* names[] = {"LBO and SBO exchanged", "A registers 1 and 2 exchanged",
                             "D column pairs exchanged"};
      const char* match = nullptr;
      for (int h = 0; h < 3 && match == nullptr; ++h) {
        if (count(Reference(cs, h == 0, h == 1, h == 2)) == 0) match = names[h];
      }
      std::printf("; the card's result %s%s", match ? "is the reference with " : "matches none of "
                  "the readings tried", match ? match : "");
    }
    std::printf("\n");
  }
  cudaFree(dev);
  FILE* f = std::fopen(argv[1], "wb");
  if (f == nullptr) return 3;
  const uint32_t h[2] = {bad, compared};
  std::fwrite(h, 4, 2, f);
  std::fclose(f);
  std::printf("wgmma: %u of %u outputs differ from the exact reference\n", bad, compared);
  return bad == 0 && compared > 0 ? 0 : 1;
}
