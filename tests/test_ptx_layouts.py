"""The PTX layouts the CUDA kernels assume, against CUTLASS's.

Two headers state them once for the kernels, the CUDA emulator and the
device selftests: kernels/cuda/ecoc_wgmma_desc.h (Hopper's TF32 m64nNk8
`wgmma`: the A fragment in registers, the F32 accumulator, the K-major
unswizzled shared-memory operand and its 64-bit descriptor) and
kernels/cuda/ecoc_ldmatrix_layout.h (`ldmatrix.m8n8.{x2,x4}` on 32-bit
words, which every mma kernel's fragment loads use). The emulator runs the
kernels with these readings of the PTX ISA, so a misreading would pass every
emulated check and fail only on a card. The second source here is CUTLASS,
whose CuTe layouts of the same instructions run on the hardware in NVIDIA's
own GEMMs (NVIDIA/cutlass at 6433f99, 1beab64 and ee9dd81, BSD-3-Clause):

- include/cute/atom/mma_traits_sm90_gmma.hpp: `ALayout_64x8` (the register
  A of `SM90_64xNx8_F32TF32TF32_RS_TN`), `CLayout_64xN`, and
  `make_gmma_desc<Major::K>`, whose unswizzled ("INTERLEAVE") operand is, in
  16-byte units, ((8, n), 2) : ((1, SBO), LBO), SBO the 8-row stride and LBO
  the stride between the two 16-byte columns of a k-step;
- include/cute/arch/mma_sm90_desc.hpp: `GmmaDescriptor`'s bit fields
  (start address bits 0-13, LBO 16-29, SBO 32-45, base offset 49-51, layout
  type 62-63, INTERLEAVE = 0; addresses and offsets in 16-byte units);
- include/cute/atom/copy_traits_sm75.hpp: `SM75_U32x4_LDSM_N` and
  `SM75_U32x2_LDSM_N`, whose source and destination layouts map (thread,
  bit) to the bits of the 4 (2) matrices of 8 rows x 128 bits.

The layouts are evaluated here from their (shape, stride) pairs as CuTe
defines a layout (the first mode varies fastest), and the headers'
functions, compiled by g++ into a small program, must agree everywhere.
What this cannot show is the tensor cores' rounding, which the emulator
assumes to be mma.sync's: the device selftest's exact integers do not test
it, the harness's float64 checks on a card do.
"""

from __future__ import annotations

import itertools
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CUDA_DIR = REPO / "kernels" / "cuda"

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")

# (shape, stride) of CUTLASS's thread-value layouts: (thread, value) ->
# index into the M x K (A) or M x N (C) tile, M varying fastest.
A_LAYOUT_64X8 = (((4, 8, 4), (2, 2)), ((64, 1, 16), (8, 256)))


def c_layout_64xn(n: int):
    return (((4, 8, 4), (2, 2, n // 8)), ((128, 1, 16), (64, 8, 512)))


# (shape, stride) of CUTLASS's ldmatrix copy traits: (thread, bit) -> bit of
# the concatenated matrices (matrix j at bits 1024 j, its row r at 128 r).
LDSM_SRC = {4: ((32, 128), (128, 1)), 2: (((16, 2), 128), ((128, 0), 1))}
LDSM_DST = {4: ((32, (32, 4)), (32, (1, 1024))), 2: ((32, (32, 2)), (32, (1, 1024)))}


# The (N, LBO, SBO) the kernels use (emu/selftest/wgmma.cu's kCases): the
# forward's code tile by rows and its transposed copy, the codes gradient's w tile.
KERNEL_OPERANDS = ((64, 128, 4096), (128, 144, 2304), (32, 144, 2304), (32, 128, 2048))
# Shared-window start addresses of those operands: 0, an odd multiple of 16,
# and 169 KiB (within the 228 KiB window, high bits of the 14-bit field set).
START_ADDRESSES = (0, 0x1230, 0x2A400)

_MAIN = r"""
#include <cstdio>
#include "ecoc_ldmatrix_layout.h"
#include "ecoc_wgmma_desc.h"
namespace lm = keras_ecoc::cuda::ldmatrix;
namespace wg = keras_ecoc::cuda::wgmma;
int main() {
  for (int lane = 0; lane < 32; ++lane) {
    const lm::Row row = lm::AddressedRow(lane);
    std::printf("L %d %d %d %d\n", lane, row.matrix, row.row,
                lm::AddressLane(row.matrix, row.row));
    for (int r = 0; r < 4; ++r) {
      const lm::Word w = lm::Received(lane, r);
      std::printf("R %d %d %d %d %d\n", lane, r, w.matrix, w.row, w.word);
    }
  }
  for (int warp = 0; warp < 4; ++warp)
    for (int lane = 0; lane < 32; ++lane) {
      for (int r = 0; r < 4; ++r) {
        const wg::RowCol e = wg::AFragmentElement(warp, lane, r);
        std::printf("A %d %d %d %d\n", 32 * warp + lane, r, e.row, e.col);
      }
      for (int r = 0; r < 64; ++r) {  // N = 128: the widest accumulator
        const wg::RowCol e = wg::DFragmentElement(warp, lane, r);
        std::printf("D %d %d %d %d\n", 32 * warp + lane, r, e.row, e.col);
      }
    }
  unsigned lbo, sbo, start, rows;
  while (std::scanf("%u %u %u %u", &start, &lbo, &sbo, &rows) == 4) {
    const unsigned long long desc = wg::Descriptor(start, lbo, sbo);
    const wg::Decoded d = wg::Decode(desc);
    std::printf("desc %u %u %u %llu %u %u %u %d %llu\n", start, lbo, sbo, desc, d.start, d.lbo,
                d.sbo, d.swizzle, static_cast<unsigned long long>(wg::Advance(desc, 2 * lbo)));
    for (unsigned row = 0; row < rows; ++row)
      for (int col = 0; col < 8; ++col)
        std::printf("B %u %u %u %u %d %u\n", start, lbo, sbo, row, col,
                    wg::ElementOffset(d, static_cast<int>(row), col));
  }
  return 0;
}
"""


def cute_offset(shape, stride, index: int) -> int:
    """CuTe's layout function at a 1-D index: the index split over the
    flattened shape with the first mode fastest, dotted with the strides."""
    def flat(t):
        return [x for s in t for x in flat(s)] if isinstance(t, tuple) else [t]
    offset = 0
    for extent, step in zip(flat(shape), flat(stride), strict=True):
        offset += (index % extent) * step
        index //= extent
    return offset


def tv_element(layout, thread: int, value: int, rows: int = 64) -> tuple[int, int]:
    """(row, column) of value `value` of warpgroup thread `thread`."""
    (t_shape, v_shape), (t_stride, v_stride) = layout
    index = cute_offset(t_shape, t_stride, thread) + cute_offset(v_shape, v_stride, value)
    return index % rows, index // rows


def k_major_interleave_offset(n: int, row: int, col: int, lbo: int, sbo: int) -> int:
    """Byte offset of TF32 element (row, col) of an n x 8 K-major unswizzled
    operand: make_gmma_desc's ((8, n / 8), 2) : ((1, SBO), LBO) in 16-byte
    units at (row, col / 4), and 4 TF32 values within each 16 bytes."""
    unit = (cute_offset((8, n // 8), (1, sbo // 16), row)
            + cute_offset((2,), (lbo // 16,), col // 4))
    return 16 * unit + 4 * (col % 4)


def gmma_descriptor(start: int, lbo: int, sbo: int, base_offset: int = 0, layout_type: int = 0):
    """GmmaDescriptor's bit fields packed as CUTLASS declares them."""
    def field(x, bits):
        assert 0 <= x < (1 << bits)
        return x
    return (field(start >> 4, 14) | field(lbo >> 4, 14) << 16 | field(sbo >> 4, 14) << 32
            | field(base_offset, 3) << 49 | field(layout_type, 2) << 62)


@pytest.fixture(scope="module")
def header_tables(tmp_path_factory):
    work = tmp_path_factory.mktemp("wgmma_layouts")
    (work / "main.cc").write_text(_MAIN)
    binary = work / "main"
    subprocess.run(["g++", "-std=c++17", "-O1", f"-I{CUDA_DIR}", str(work / "main.cc"), "-o",
                    str(binary)], check=True, capture_output=True, text=True)
    queries = "".join(f"{s} {lbo} {sbo} {n}\n" for s in START_ADDRESSES
                      for n, lbo, sbo in KERNEL_OPERANDS)
    out = subprocess.run([str(binary)], input=queries, check=True, capture_output=True,
                         text=True).stdout
    tables = {"A": {}, "D": {}, "desc": {}, "B": {}, "L": {}, "R": {}}
    for line in out.splitlines():
        kind, *numbers = line.split()
        numbers = [int(x) for x in numbers]
        if kind == "L":
            tables["L"][numbers[0]] = tuple(numbers[1:])
        elif kind == "R":
            tables["R"][numbers[0], numbers[1]] = tuple(numbers[2:])
        elif kind in ("A", "D"):
            thread, reg, row, col = numbers
            tables[kind][thread, reg] = (row, col)
        elif kind == "desc":
            tables["desc"][tuple(numbers[:3])] = tuple(numbers[3:])
        else:
            start, lbo, sbo, row, col, offset = numbers
            tables["B"][start, lbo, sbo, row, col] = offset
    return tables


def test_a_fragment_is_cutlass_alayout_64x8(header_tables):
    for thread, reg in itertools.product(range(128), range(4)):
        assert header_tables["A"][thread, reg] == tv_element(A_LAYOUT_64X8, thread, reg), (thread,
                                                                                            reg)


@pytest.mark.parametrize("n", [32, 64, 128])
def test_accumulator_fragment_is_cutlass_clayout_64xn(header_tables, n):
    # The header's accumulator r is the kernels' d[r / 4][r % 4]: the same
    # registers for every N, the wider tiles only adding n8 blocks.
    seen = set()
    for thread, reg in itertools.product(range(128), range(n // 2)):
        got = header_tables["D"][thread, reg]
        assert got == tv_element(c_layout_64xn(n), thread, reg), (n, thread, reg)
        seen.add(got)
    assert seen == set(itertools.product(range(64), range(n)))  # every output once


@pytest.mark.parametrize("n,lbo,sbo", KERNEL_OPERANDS)
def test_shared_operand_offsets_are_cutlass_k_major_interleave(header_tables, n, lbo, sbo):
    for start in START_ADDRESSES:
        offsets = set()
        for row, col in itertools.product(range(n), range(8)):
            got = header_tables["B"][start, lbo, sbo, row, col]
            assert got == k_major_interleave_offset(n, row, col, lbo, sbo), (row, col)
            offsets.add(got)
        assert len(offsets) == 8 * n  # no two elements share a word


@pytest.mark.parametrize("n,lbo,sbo", KERNEL_OPERANDS)
def test_descriptor_bits_are_cutlass_gmma_descriptor_unswizzled(header_tables, n, lbo, sbo):
    for start in START_ADDRESSES:
        desc, d_start, d_lbo, d_sbo, swizzle, advanced = header_tables["desc"][start, lbo, sbo]
        assert desc == gmma_descriptor(start, lbo, sbo)
        assert (d_start, d_lbo, d_sbo, swizzle) == (start, lbo, sbo, 0)
        # CUTLASS's DescriptorIterator moves to the next k-step by adding the
        # offset in 16-byte units to the descriptor; two 16-byte columns of
        # LBO each make one k8 step of TF32.
        assert advanced == gmma_descriptor(start + 2 * lbo, lbo, sbo) == desc + 2 * lbo // 16


@pytest.mark.parametrize("matrices", [4, 2])
def test_ldmatrix_addresses_are_cutlass_ldsm_source_layout(header_tables, matrices):
    (t_shape, _), (t_stride, _) = LDSM_SRC[matrices]
    for lane in range(32):
        bit = cute_offset(t_shape, t_stride, lane)  # where this lane's 128 bits start
        want = (bit // 1024, bit % 1024 // 128)
        matrix, row, back = header_tables["L"][lane]
        if lane < 8 * matrices:
            assert (matrix, row) == want and back == lane, lane
        else:
            # x2: lanes 16-31 alias lanes 0-15 in CUTLASS (stride 0); the
            # hardware reads no address from them, and the header's reading
            # is only used for lanes below 8 x matrices.
            assert want == header_tables["L"][lane - 16][:2], lane


@pytest.mark.parametrize("matrices", [4, 2])
def test_ldmatrix_registers_are_cutlass_ldsm_destination_layout(header_tables, matrices):
    (t_shape, v_shape), (t_stride, v_stride) = LDSM_DST[matrices]
    for lane, reg in itertools.product(range(32), range(matrices)):
        # Register reg of a lane is its values 32 reg .. 32 reg + 31 (bits).
        bits = {cute_offset(t_shape, t_stride, lane) + cute_offset(v_shape, v_stride, 32 * reg + b)
                for b in range(32)}
        first = min(bits)
        assert bits == set(range(first, first + 32)) and first % 32 == 0  # one whole word
        want = (first // 1024, first % 1024 // 128, first % 128 // 32)
        assert header_tables["R"][lane, reg] == want, (lane, reg)
