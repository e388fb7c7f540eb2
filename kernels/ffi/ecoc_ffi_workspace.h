// The CUDA kernels' workspace carved out of an allocator that promises less
// alignment than the kernels' contract asks for (header-only, no CUDA, no
// XLA: tests/test_ffi_workspace.py compiles it with g++ against a mock).
//
// XLA's FFI scratch allocator refuses any alignment above 16 bytes
// (`kMaxAlignment` in XLA_FFI_DeviceMemory_Allocate, xla/ffi/ffi_api.cc: it
// returns "Unsupported alignment"), while the contract wants every workspace
// region on kWorkspaceAlignment (256) bytes. Asking for 256 made every JAX
// (and TensorFlow-under-XLA) call of the CUDA handlers fail with
// RESOURCE_EXHAUSTED on an H100 (docs/device_runs/2026-11-26-h100-variants).
// So: ask for `bytes + alignment - 16` at the 16 bytes XLA accepts and round
// the pointer up, as the TensorFlow op does with allocate_temp.
#ifndef KERAS_ECOC_FFI_WORKSPACE_H_
#define KERAS_ECOC_FFI_WORKSPACE_H_

#include <cstddef>
#include <cstdint>
#include <optional>

namespace keras_ecoc {

// The largest alignment XLA's FFI device allocator accepts.
constexpr size_t kFfiMaxAlignment = 16;

// Bytes to ask the allocator for so that an `alignment`-aligned block of
// `bytes` fits whatever kFfiMaxAlignment-aligned pointer comes back.
// `alignment` is a power of two >= kFfiMaxAlignment.
constexpr size_t PaddedWorkspaceBytes(size_t bytes, size_t alignment) {
  return bytes == 0 ? 0 : bytes + alignment - kFfiMaxAlignment;
}

// allocate(size, alignment) -> std::optional<void*> (the FFI
// ScratchAllocator's Allocate, or a mock). Returns the `alignment`-aligned
// start of a block of at least `bytes` inside the allocation; nullptr for 0
// bytes; std::nullopt when the allocator fails. The allocation itself is
// owned (and freed) by the allocator.
template <typename Allocate>
std::optional<void*> AlignedWorkspace(Allocate&& allocate, size_t bytes,
                                      size_t alignment) {
  if (bytes == 0) return static_cast<void*>(nullptr);
  std::optional<void*> raw =
      allocate(PaddedWorkspaceBytes(bytes, alignment), kFfiMaxAlignment);
  if (!raw.has_value() || *raw == nullptr) return std::nullopt;
  const uintptr_t base = reinterpret_cast<uintptr_t>(*raw);
  // A pointer below kFfiMaxAlignment would not leave room in the padding.
  if (base % kFfiMaxAlignment != 0) return std::nullopt;
  const uintptr_t aligned = (base + alignment - 1) / alignment * alignment;
  return reinterpret_cast<void*>(aligned);
}

}  // namespace keras_ecoc

#endif  // KERAS_ECOC_FFI_WORKSPACE_H_
