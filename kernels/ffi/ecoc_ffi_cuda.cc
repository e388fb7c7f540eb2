// XLA FFI handlers (platform "CUDA") and C entry points (PyTorch) over the
// CUDA kernels' contract v2 (kernels/cuda/ecoc_kernels.h).
//
// Plain C++ (g++ with the CUDA include directory; no device code here): the
// handlers decode the buffers, take the workspace the contract asks for from
// the FFI scratch allocator and enqueue the pass on the FFI stream. Linked
// into keras_ecoc/_lib/_ecoc_kernels.so only when the CUDA part (nvcc, the
// kernels implementing the v2 contract) is built; the library exports
// KerasEcocHasCuda() then.
//
// Handler signatures are those of the CPU handlers (ecoc_ffi_cpu.cc), except
// that z may be float32, float16 or bfloat16 (the kernels convert), and that
// the scale, a device scalar, goes to the kernels as a device pointer
// (contract field scale_ptr): they read it on the stream, so a loss pass
// makes no device-to-host copy and no stream sync. A scale that is not a
// finite number > 0 gives NaN outputs (the value is never seen on the host).
// The C entry points (PyTorch) still take a host float.
#include <cstddef>
#include <cstdint>
#include <limits>
#include <cstdlib>
#include <string>

#include <cuda_runtime.h>

#include "cuda/ecoc_kernels.h"
#include "ffi/ecoc_ffi_workspace.h"
#include "xla/ffi/api/ffi.h"

namespace keras_ecoc {
namespace {

namespace ffi = ::xla::ffi;
namespace kc = ::keras_ecoc::cuda;

ffi::Error CudaError(const char* what, cudaError_t err) {
  return ffi::Error::Internal(std::string("keras_ecoc: ") + what + ": " +
                              cudaGetErrorName(err) + " (" +
                              cudaGetErrorString(err) + ")");
}

ffi::Error ZType(ffi::AnyBuffer z, kc::FloatType* out) {
  switch (z.element_type()) {
    case ffi::DataType::F32: *out = kc::FloatType::kFloat32; break;
    case ffi::DataType::F16: *out = kc::FloatType::kFloat16; break;
    case ffi::DataType::BF16: *out = kc::FloatType::kBFloat16; break;
    default:
      return ffi::Error::InvalidArgument(
          "keras_ecoc: z must be float32, float16 or bfloat16");
  }
  return ffi::Error::Success();
}

ffi::Error Problem(ffi::AnyBuffer z, ffi::Buffer<ffi::F32> codes, float epsilon,
                   kc::ProblemArgs* p) {
  auto zd = z.dimensions();
  auto cd = codes.dimensions();
  if (zd.size() != 2 || cd.size() != 2 || zd[1] != cd[1] || cd[0] < 1) {
    return ffi::Error::InvalidArgument(
        "keras_ecoc: z must be [batch, code_length] and codes [num_classes >= "
        "1, code_length] with the same code_length");
  }
  if (cd[0] > std::numeric_limits<int32_t>::max()) {
    // Class ids, ranks and nearest indices are int32.
    return ffi::Error::InvalidArgument(
        "keras_ecoc: codes must have fewer than 2^31 rows (class ids are int32)");
  }
  if (auto e = ZType(z, &p->z_type); e.failure()) return e;
  p->z = z.untyped_data();
  p->codes = codes.typed_data();
  p->batch = zd[0];
  p->num_classes = cd[0];
  p->code_length = zd[1];
  p->epsilon = epsilon;
  return ffi::Error::Success();
}

// Workspace of `bytes` from the FFI scratch allocator (null for 0 bytes),
// aligned to the contract's 256 bytes by padding: XLA's allocator refuses
// alignments above 16 (see ecoc_ffi_workspace.h).
ffi::Error Workspace(ffi::ScratchAllocator& scratch, size_t bytes, void** ptr) {
  *ptr = nullptr;
  auto mem = AlignedWorkspace(
      [&scratch](size_t size, size_t alignment) {
        return scratch.Allocate(size, alignment);
      },
      bytes, kc::kWorkspaceAlignment);
  if (!mem.has_value()) {
    return ffi::Error(ffi::ErrorCode::kResourceExhausted,
                      "keras_ecoc: no FFI scratch memory for the CUDA workspace (" +
                          std::to_string(PaddedWorkspaceBytes(bytes, kc::kWorkspaceAlignment)) +
                          " bytes at 16-byte alignment)");
  }
  *ptr = *mem;
  return ffi::Error::Success();
}

// Math mode of the loss passes: $KERAS_ECOC_CUDA_MATH = fp32 | 3xtf32 | tf32
// (default: the contract's default, 3xTF32).
kc::MathMode Math() {
  static const kc::MathMode mode = [] {
    const char* env = std::getenv("KERAS_ECOC_CUDA_MATH");
    std::string v = env ? env : "";
    if (v == "fp32") return kc::MathMode::kFp32;
    if (v == "tf32") return kc::MathMode::kTf32;
    return kc::MathMode::k3xTf32;
  }();
  return mode;
}

template <typename Params, typename SizeFn, typename RunFn>
ffi::Error Launch(const char* what, Params& params, ffi::ScratchAllocator& scratch,
                  cudaStream_t stream, SizeFn size_fn, RunFn run_fn) {
  size_t bytes = 0;
  cudaError_t err = size_fn(params, &bytes);
  if (err != cudaSuccess) return CudaError(what, err);
  if (auto e = Workspace(scratch, bytes, &params.workspace); e.failure()) {
    return e;
  }
  params.workspace_bytes = bytes;
  err = run_fn(params, stream);
  return err == cudaSuccess ? ffi::Error::Success() : CudaError(what, err);
}

ffi::Error ForwardImpl(cudaStream_t stream, ffi::ScratchAllocator scratch,
                       ffi::AnyBuffer z, ffi::Buffer<ffi::F32> codes,
                       ffi::Buffer<ffi::S32> labels,
                       ffi::BufferR0<ffi::F32> scale,
                       ffi::ResultBuffer<ffi::F32> loss,
                       ffi::ResultBuffer<ffi::F32> lse,
                       ffi::ResultBuffer<ffi::F32> expected_code,
                       ffi::ResultBuffer<ffi::F32> expected_sqnorm,
                       float epsilon) {
  kc::ForwardParams p;
  if (auto e = Problem(z, codes, epsilon, &p.problem); e.failure()) return e;
  p.scale_ptr = scale.typed_data();  // read by the kernels on the stream
  p.labels = labels.typed_data();
  p.label_type = kc::IndexType::kInt32;
  p.math = Math();
  p.loss = loss->typed_data();
  p.lse = lse->typed_data();
  p.expected_code = expected_code->typed_data();
  p.expected_sqnorm = expected_sqnorm->typed_data();
  return Launch("EcocCrossEntropyForward", p, scratch, stream,
                kc::EcocForwardWorkspaceSize, kc::EcocCrossEntropyForward);
}

ffi::Error CodesGradImpl(cudaStream_t stream, ffi::ScratchAllocator scratch,
                         ffi::AnyBuffer z, ffi::Buffer<ffi::F32> codes,
                         ffi::Buffer<ffi::S32> labels,
                         ffi::BufferR0<ffi::F32> scale,
                         ffi::Buffer<ffi::F32> lse,
                         ffi::Buffer<ffi::F32> grad_loss,
                         ffi::ResultBuffer<ffi::F32> grad_codes,
                         float epsilon) {
  kc::CodesGradParams p;
  if (auto e = Problem(z, codes, epsilon, &p.problem); e.failure()) return e;
  p.scale_ptr = scale.typed_data();  // read by the kernels on the stream
  p.labels = labels.typed_data();
  p.label_type = kc::IndexType::kInt32;
  p.math = Math();
  p.lse = lse.typed_data();
  p.grad_loss = grad_loss.typed_data();
  p.grad_codes = grad_codes->typed_data();
  return Launch("EcocCrossEntropyCodesGrad", p, scratch, stream,
                kc::EcocCodesGradWorkspaceSize, kc::EcocCrossEntropyCodesGrad);
}

ffi::Error LabelRankImpl(cudaStream_t stream, ffi::ScratchAllocator scratch,
                         ffi::AnyBuffer z, ffi::Buffer<ffi::F32> codes,
                         ffi::Buffer<ffi::S32> labels,
                         ffi::ResultBuffer<ffi::S32> rank, float epsilon) {
  kc::LabelRankParams p;
  if (auto e = Problem(z, codes, epsilon, &p.problem); e.failure()) return e;
  p.labels = labels.typed_data();
  p.label_type = kc::IndexType::kInt32;
  p.rank = rank->typed_data();
  return Launch("EcocLabelRank", p, scratch, stream,
                kc::EcocLabelRankWorkspaceSize, kc::EcocLabelRank);
}

// index [B, 2] int32: the kernel's int64 indices as two words each (see
// ecoc_ffi_cpu.cc), so that 32-bit XLA programs can take them.
ffi::Error NearestImpl(cudaStream_t stream, ffi::ScratchAllocator scratch,
                       ffi::AnyBuffer z, ffi::Buffer<ffi::F32> codes,
                       ffi::ResultBuffer<ffi::S32> index, float epsilon) {
  kc::NearestParams p;
  if (auto e = Problem(z, codes, epsilon, &p.problem); e.failure()) return e;
  if (index->element_count() != static_cast<size_t>(2 * p.problem.batch)) {
    return ffi::Error::InvalidArgument("keras_ecoc: the nearest index must be [batch, 2] int32");
  }
  p.index = reinterpret_cast<int64_t*>(index->typed_data());
  return Launch("EcocNearestCodeword", p, scratch, stream,
                kc::EcocNearestWorkspaceSize, kc::EcocNearestCodeword);
}

}  // namespace
}  // namespace keras_ecoc

namespace ffi = ::xla::ffi;

XLA_FFI_DEFINE_HANDLER_SYMBOL(KerasEcocFfiForwardCuda, keras_ecoc::ForwardImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Ctx<ffi::ScratchAllocator>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::BufferR0<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<float>("epsilon"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(KerasEcocFfiCodesGradCuda,
                              keras_ecoc::CodesGradImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Ctx<ffi::ScratchAllocator>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::BufferR0<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<float>("epsilon"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(KerasEcocFfiLabelRankCuda,
                              keras_ecoc::LabelRankImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Ctx<ffi::ScratchAllocator>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Ret<ffi::Buffer<ffi::S32>>()
                                  .Attr<float>("epsilon"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(KerasEcocFfiNearestCuda, keras_ecoc::NearestImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Ctx<ffi::ScratchAllocator>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::S32>>()
                                  .Attr<float>("epsilon"));

// --- C entry points (PyTorch CUDA tensors, via ctypes) ----------------------
// z_type: 0 float32, 1 float16, 2 bfloat16; labels int64 on the device, in
// [0, n); `stream` is the caller's current stream (torch.cuda's
// current_stream().cuda_stream). The *WorkspaceSize functions write the
// bytes to allocate (with 256-byte alignment, e.g. a torch uint8 tensor);
// every function returns a cudaError_t (0 = success).
#define KERAS_ECOC_EXPORT extern "C" __attribute__((visibility("default")))

namespace {
keras_ecoc::cuda::ProblemArgs CProblem(const void* z, int z_type,
                                       const float* codes, int64_t batch,
                                       int64_t num_classes, int64_t code_length,
                                       float epsilon) {
  keras_ecoc::cuda::ProblemArgs p;
  p.z = z;
  p.z_type = static_cast<keras_ecoc::cuda::FloatType>(z_type);
  p.codes = codes;
  p.batch = batch;
  p.num_classes = num_classes;
  p.code_length = code_length;
  p.epsilon = epsilon;
  return p;
}
}  // namespace

KERAS_ECOC_EXPORT int KerasEcocHasCuda() { return 1; }

KERAS_ECOC_EXPORT int KerasEcocCudaForward(
    const void* z, int z_type, const int64_t* labels, const float* codes,
    float scale, float epsilon, int64_t batch, int64_t num_classes,
    int64_t code_length, float* loss, float* lse, float* expected_code,
    float* expected_sqnorm, void* workspace, size_t workspace_bytes,
    void* stream, size_t* query_bytes) {
  namespace kc = keras_ecoc::cuda;
  kc::ForwardParams p;
  p.problem = CProblem(z, z_type, codes, batch, num_classes, code_length, epsilon);
  p.labels = labels;
  p.label_type = kc::IndexType::kInt64;
  p.scale = scale;
  p.math = keras_ecoc::Math();
  p.loss = loss;
  p.lse = lse;
  p.expected_code = expected_code;
  p.expected_sqnorm = expected_sqnorm;
  if (query_bytes != nullptr) return kc::EcocForwardWorkspaceSize(p, query_bytes);
  p.workspace = workspace;
  p.workspace_bytes = workspace_bytes;
  return kc::EcocCrossEntropyForward(p, static_cast<cudaStream_t>(stream));
}

KERAS_ECOC_EXPORT int KerasEcocCudaCodesGrad(
    const void* z, int z_type, const int64_t* labels, const float* codes,
    float scale, float epsilon, const float* lse, const float* grad_loss,
    int64_t batch, int64_t num_classes, int64_t code_length,
    float* grad_codes, void* workspace, size_t workspace_bytes, void* stream,
    size_t* query_bytes) {
  namespace kc = keras_ecoc::cuda;
  kc::CodesGradParams p;
  p.problem = CProblem(z, z_type, codes, batch, num_classes, code_length, epsilon);
  p.labels = labels;
  p.label_type = kc::IndexType::kInt64;
  p.scale = scale;
  p.math = keras_ecoc::Math();
  p.lse = lse;
  p.grad_loss = grad_loss;
  p.grad_codes = grad_codes;
  if (query_bytes != nullptr) return kc::EcocCodesGradWorkspaceSize(p, query_bytes);
  p.workspace = workspace;
  p.workspace_bytes = workspace_bytes;
  return kc::EcocCrossEntropyCodesGrad(p, static_cast<cudaStream_t>(stream));
}

KERAS_ECOC_EXPORT int KerasEcocCudaLabelRank(
    const void* z, int z_type, const int64_t* labels, const float* codes,
    float epsilon, int64_t batch, int64_t num_classes, int64_t code_length,
    int32_t* rank, void* workspace, size_t workspace_bytes, void* stream,
    size_t* query_bytes) {
  namespace kc = keras_ecoc::cuda;
  kc::LabelRankParams p;
  p.problem = CProblem(z, z_type, codes, batch, num_classes, code_length, epsilon);
  p.labels = labels;
  p.label_type = kc::IndexType::kInt64;
  p.rank = rank;
  if (query_bytes != nullptr) return kc::EcocLabelRankWorkspaceSize(p, query_bytes);
  p.workspace = workspace;
  p.workspace_bytes = workspace_bytes;
  return kc::EcocLabelRank(p, static_cast<cudaStream_t>(stream));
}

KERAS_ECOC_EXPORT int KerasEcocCudaNearest(
    const void* z, int z_type, const float* codes, float epsilon, int64_t batch,
    int64_t num_classes, int64_t code_length, int64_t* index, void* workspace,
    size_t workspace_bytes, void* stream, size_t* query_bytes) {
  namespace kc = keras_ecoc::cuda;
  kc::NearestParams p;
  p.problem = CProblem(z, z_type, codes, batch, num_classes, code_length, epsilon);
  p.index = index;
  if (query_bytes != nullptr) return kc::EcocNearestWorkspaceSize(p, query_bytes);
  p.workspace = workspace;
  p.workspace_bytes = workspace_bytes;
  return kc::EcocNearestCodeword(p, static_cast<cudaStream_t>(stream));
}
