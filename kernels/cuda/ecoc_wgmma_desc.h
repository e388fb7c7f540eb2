// The shared-memory matrix descriptor of Hopper's wgmma.mma_async (PTX ISA,
// "Matrix Descriptor Format"), for the one layout the kernels use (K-major,
// no swizzle), and the register fragments of its TF32 m64nNk8 form.
// Encoding and decoding in one place, so that the kernels (which build
// descriptors) and the CUDA emulator (which reads the operand through them,
// kernels/cuda/emu/ptx_emu.h) cannot disagree with each other. Whether they
// agree with the hardware: tests/test_ptx_layouts.py compares every
// layout here with CUTLASS's (its GPU-tested CuTe layouts of the same
// instruction); the device selftest emu/selftest/wgmma.cu checks them on a
// card. No CUDA types: the emulator and host-side tests include it too.
//
// The layout in units of "core matrices" of 8 rows x 16 bytes (4 TF32
// values), each 128 contiguous bytes, row r of the 8 at byte 16 r. For a
// K-major operand (rows = M or N, columns = K):
//   element (row, col) at start + (row / 8) * SBO + (col / 4) * LBO
//                                + (row % 8) * 16 + (col % 4) * 4 bytes,
// the leading-dimension byte offset LBO between core matrices adjacent in K
// and the stride-dimension byte offset SBO between those adjacent in M or N
// (PTX ISA, "Leading Dimension Byte Offset" / "Stride Dimension Byte Offset",
// K-major, no swizzling: canonical layout ((8, m), (T, 2k)) : ((1T, SBO),
// (1, LBO)), T = 4 for tf32). One m64nNk8 TF32 product reads 2 core
// matrices along K.
#ifndef KERAS_ECOC_KERNELS_CUDA_ECOC_WGMMA_DESC_H_
#define KERAS_ECOC_KERNELS_CUDA_ECOC_WGMMA_DESC_H_

#include <cstdint>

#if defined(__CUDACC__)
#define KERAS_ECOC_WGMMA_HD __host__ __device__
#else
#define KERAS_ECOC_WGMMA_HD
#endif

namespace keras_ecoc {
namespace cuda {
namespace wgmma {

// Bits 0-13: start address >> 4; 16-29: LBO >> 4; 32-45: SBO >> 4; 49-51:
// base offset (0: unused without swizzle); 62-63: swizzle mode (0: none).
// Each field keeps bits 4-17 of its byte value ((x & 0x3FFFF) >> 4), so
// addresses and offsets are multiples of 16 below 256 KiB.
KERAS_ECOC_WGMMA_HD constexpr uint64_t EncodeField(uint32_t bytes) {
  return static_cast<uint64_t>((bytes & 0x3FFFFu) >> 4);
}

// The descriptor of a K-major, unswizzled operand at shared address
// `start` (the shared window's byte address, __cvta_generic_to_shared).
KERAS_ECOC_WGMMA_HD constexpr uint64_t Descriptor(uint32_t start, uint32_t lbo, uint32_t sbo) {
  return EncodeField(start) | (EncodeField(lbo) << 16) | (EncodeField(sbo) << 32);
}

// The same operand `bytes` further on (a multiple of 16): the start field
// only, which the kernels' k-steps advance (no carry out of its 14 bits
// while the address stays below 256 KiB).
KERAS_ECOC_WGMMA_HD constexpr uint64_t Advance(uint64_t desc, uint32_t bytes) {
  return desc + (bytes >> 4);
}

struct Decoded {
  uint32_t start, lbo, sbo;  // bytes
  int swizzle;               // 0: none
};

KERAS_ECOC_WGMMA_HD constexpr Decoded Decode(uint64_t desc) {
  return Decoded{static_cast<uint32_t>(desc & 0x3FFFu) << 4,
                 static_cast<uint32_t>((desc >> 16) & 0x3FFFu) << 4,
                 static_cast<uint32_t>((desc >> 32) & 0x3FFFu) << 4,
                 static_cast<int>((desc >> 62) & 0x3u)};
}

// Byte offset of element (row, col) of a K-major unswizzled operand from
// its start (the layout above).
KERAS_ECOC_WGMMA_HD constexpr uint32_t ElementOffset(const Decoded& d, int row, int col) {
  return static_cast<uint32_t>(row / 8) * d.sbo + static_cast<uint32_t>(col / 4) * d.lbo +
         static_cast<uint32_t>(row % 8) * 16u + static_cast<uint32_t>(col % 4) * 4u;
}

// The register fragments of wgmma.mma_async.m64nNk8 with a TF32 A operand in
// registers and an F32 accumulator (PTX ISA, "Register Fragments and Shared
// Memory Matrix Layouts"): warp w (0-3) of the warpgroup holds rows 16 w ..
// 16 w + 15, laid out as mma.m16n8k8's A and C fragments are, which is what
// lets the kernels hand wgmma the fragments their mma.sync paths load. With
// g = lane / 4 and t = lane % 4:
//   A register r (0-3):        row 16 w + g + 8 (r % 2), column t + 4 (r / 2);
//   accumulator r (0 .. N/2):  row 16 w + g + 8 ((r % 4) / 2),
//                              column 8 (r / 4) + 2 t + r % 2,
// the kernels' d[r / 4][r % 4]. The emulator places the operands and the
// device selftest (emu/selftest/wgmma.cu) its inputs by these, and
// tests/test_ptx_layouts.py compares them with CUTLASS's CuTe layouts of
// the same instruction (ALayout_64x8, CLayout_64xN).
struct RowCol {
  int row, col;
};

KERAS_ECOC_WGMMA_HD constexpr RowCol AFragmentElement(int warp, int lane, int reg) {
  return RowCol{16 * warp + lane / 4 + 8 * (reg % 2), lane % 4 + 4 * (reg / 2)};
}

KERAS_ECOC_WGMMA_HD constexpr RowCol DFragmentElement(int warp, int lane, int reg) {
  return RowCol{16 * warp + lane / 4 + 8 * ((reg % 4) / 2),
                8 * (reg / 4) + 2 * (lane % 4) + reg % 2};
}

}  // namespace wgmma
}  // namespace cuda
}  // namespace keras_ecoc

#undef KERAS_ECOC_WGMMA_HD
#endif  // KERAS_ECOC_KERNELS_CUDA_ECOC_WGMMA_DESC_H_
