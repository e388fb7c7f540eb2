// The layout of ldmatrix.sync.aligned.m8n8.{x2,x4}.shared.b16 (PTX ISA,
// "Warp-level matrix load instruction: ldmatrix") as the kernels use it, on
// 32-bit words: a "matrix" is 8 rows of 16 contiguous bytes (4 floats).
// Lane l supplies the address of row l % 8 of matrix l / 8 (x2: lanes 0-15
// only) and receives in register j the word l % 4 of row l / 4 of matrix j
// (the instruction copies bits; its b16 element type only names the
// layout). That register is what mma.m16n8k8.tf32's fragment layout wants
// from an operand stored K-contiguous (ecoc_ptx.cuh, ldmatrix_x4).
// One statement of it for the CUDA emulator (emu/ptx_emu.h) and the device
// selftest (emu/selftest/ldmatrix.cu); tests/test_ptx_layouts.py compares
// it with CUTLASS's SM75_U32x4_LDSM_N and SM75_U32x2_LDSM_N. No CUDA types:
// host-side tests include it too.
#ifndef KERAS_ECOC_KERNELS_CUDA_ECOC_LDMATRIX_LAYOUT_H_
#define KERAS_ECOC_KERNELS_CUDA_ECOC_LDMATRIX_LAYOUT_H_

#if defined(__CUDACC__)
#define KERAS_ECOC_LDMATRIX_HD __host__ __device__
#else
#define KERAS_ECOC_LDMATRIX_HD
#endif

namespace keras_ecoc {
namespace cuda {
namespace ldmatrix {

struct Row {
  int matrix, row;
};

// The row whose address lane `lane` supplies, and the lane that supplies
// row `row` (0-7) of matrix `matrix`.
KERAS_ECOC_LDMATRIX_HD constexpr Row AddressedRow(int lane) { return Row{lane / 8, lane % 8}; }
KERAS_ECOC_LDMATRIX_HD constexpr int AddressLane(int matrix, int row) { return 8 * matrix + row; }

struct Word {
  int matrix, row, word;  // word 0-3 of the row's 16 bytes
};

// What register `reg` of lane `lane` receives.
KERAS_ECOC_LDMATRIX_HD constexpr Word Received(int lane, int reg) {
  return Word{reg, lane / 4, lane % 4};
}

}  // namespace ldmatrix
}  // namespace cuda
}  // namespace keras_ecoc

#undef KERAS_ECOC_LDMATRIX_HD
#endif  // KERAS_ECOC_KERNELS_CUDA_ECOC_LDMATRIX_LAYOUT_H_
