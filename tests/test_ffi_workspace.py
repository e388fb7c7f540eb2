"""The CUDA FFI handlers' workspace under XLA's allocator rules.

XLA's FFI scratch allocator (``XLA_FFI_DeviceMemory_Allocate``) refuses any
alignment above 16 bytes; the kernels want 256. Asking for 256 made every
JAX call of the CUDA handlers fail on an H100 (RESOURCE_EXHAUSTED, "no FFI
scratch memory"; docs/device_runs/2026-11-26-h100-variants). There is no GPU
here, so these tests compile kernels/ffi/ecoc_ffi_workspace.h with the host
compiler against a mock allocator that enforces XLA's rule and hands out
pointers at every 16-byte offset from a 256-byte boundary.
"""
import os
import shutil
import subprocess

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KERNELS = os.path.join(REPO, "kernels")
CXX = shutil.which("g++") or shutil.which("c++")

_PROGRAM = r"""
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <vector>
#include "ffi/ecoc_ffi_workspace.h"

// XLA's rule: alignment a power of two <= 16, else an error (nullopt here).
// Hands out `base + offset`, base 256-aligned, offset a multiple of 16.
struct MockXlaAllocator {
  size_t offset;
  std::vector<unsigned char*> blocks;
  size_t last_size = 0, last_alignment = 0;
  std::optional<void*> operator()(size_t size, size_t alignment) {
    last_size = size; last_alignment = alignment;
    if (alignment == 0 || (alignment & (alignment - 1)) != 0 || alignment > 16) return std::nullopt;
    unsigned char* raw = static_cast<unsigned char*>(std::aligned_alloc(256, size + 512));
    blocks.push_back(raw);
    return static_cast<void*>(raw + offset);
  }
  ~MockXlaAllocator() { for (auto* b : blocks) std::free(b); }
};

int main() {
  using keras_ecoc::AlignedWorkspace;
  int failures = 0;
  const size_t sizes[] = {1, 15, 16, 255, 256, 257, 657408, 8577024};
  for (size_t offset = 0; offset < 256; offset += 16) {
    for (size_t bytes : sizes) {
      MockXlaAllocator alloc{offset};
      auto ws = AlignedWorkspace(alloc, bytes, 256);
      if (!ws.has_value()) { std::printf("FAIL offset %zu bytes %zu: no workspace\n", offset, bytes); ++failures; continue; }
      uintptr_t p = reinterpret_cast<uintptr_t>(*ws);
      uintptr_t base = reinterpret_cast<uintptr_t>(alloc.blocks.back()) + offset;
      if (alloc.last_alignment > 16) { std::printf("FAIL asked alignment %zu\n", alloc.last_alignment); ++failures; }
      if (p % 256 != 0) { std::printf("FAIL offset %zu bytes %zu: %zu mod 256\n", offset, bytes, (size_t)(p % 256)); ++failures; }
      if (p < base || p + bytes > base + alloc.last_size) {
        std::printf("FAIL offset %zu bytes %zu: block outside the allocation\n", offset, bytes); ++failures;
      }
      // The whole block is writable (AddressSanitizer-free check: touch both ends).
      std::memset(*ws, 0x5a, bytes);
    }
  }
  // Zero bytes: nullptr, no allocation.
  { MockXlaAllocator alloc{0}; auto ws = AlignedWorkspace(alloc, 0, 256);
    if (!ws.has_value() || *ws != nullptr || !alloc.blocks.empty()) { std::printf("FAIL zero bytes\n"); ++failures; } }
  // An allocator failure is reported, not papered over.
  { auto refuse = [](size_t, size_t) -> std::optional<void*> { return std::nullopt; };
    if (AlignedWorkspace(refuse, 64, 256).has_value()) { std::printf("FAIL refused allocation\n"); ++failures; } }
  std::printf("%d failures\n", failures);
  return failures == 0 ? 0 : 1;
}
"""


@pytest.mark.skipif(CXX is None, reason="no C++ compiler on the PATH")
def test_workspace_is_256_aligned_from_an_allocator_that_accepts_at_most_16(tmp_path):
    src = tmp_path / "ws.cc"
    src.write_text(_PROGRAM)
    exe = tmp_path / "ws"
    build = subprocess.run([CXX, "-std=c++17", "-O1", "-Wall", "-Werror", f"-I{KERNELS}",
                            str(src), "-o", str(exe)], capture_output=True, text=True)
    assert build.returncode == 0, build.stderr
    run = subprocess.run([str(exe)], capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "0 failures" in run.stdout


def test_cuda_ffi_handlers_take_their_workspace_through_the_aligned_helper():
    # The handler file must not ask XLA for the contract's alignment directly.
    with open(os.path.join(KERNELS, "ffi", "ecoc_ffi_cuda.cc"), encoding="utf-8") as f:
        text = f.read()
    assert "AlignedWorkspace(" in text
    assert "scratch.Allocate(bytes, kc::kWorkspaceAlignment)" not in text
