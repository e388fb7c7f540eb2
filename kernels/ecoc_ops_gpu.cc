// TensorFlow GPU kernels of the ECOC ops (registered with REGISTER_OP in
// kernels/ecoc_ops.cc).  The math lives in kernels/cuda/ (contract v2,
// kernels/cuda/ecoc_kernels.h, free of TensorFlow types); this file checks
// shapes and labels, allocates the outputs and the pass's workspace (from
// OpKernelContext::allocate_temp, i.e. TensorFlow's BFC allocator) and calls
// the entry point on the op's CUDA stream.
//
// The inner products of the loss passes (forward and codes gradient) use the
// math mode of $KERAS_ECOC_CUDA_MATH, read once when the OpKernel is built:
// "3xtf32" (default: TF32 tensor cores with split operands, close to FP32),
// "tf32" (plain TF32, faster, ~1e-3 relative error in the logits) or "fp32"
// (CUDA-core FP32). Label rank and nearest codeword always use FP32.
//
// Compiled by the host compiler, not nvcc:
//   g++ -std=c++17 -fPIC -O2 -DGOOGLE_CUDA=1 -DEIGEN_USE_GPU
//       -Ibuild/shim -I$CUDA_HOME/include $TF_CFLAGS -c kernels/ecoc_ops_gpu.cc
// and linked into the same .so as the CPU kernels together with the nvcc
// object of ecoc_kernels.cu.cc and -l:libcudart_static.a.
#if GOOGLE_CUDA

#include <cstdint>
#include <cstdlib>
#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "cuda/ecoc_kernels.h"
#include "ecoc_validation.h"
#include "tensorflow/core/common_runtime/device/device_event_mgr.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/tensor_reference.h"
#include "tensorflow/core/framework/tensor_shape.h"
#include "tensorflow/core/framework/types.h"

namespace tensorflow {
namespace ecoc_gpu {
namespace {

namespace kc = ::keras_ecoc::cuda;
using ::keras_ecoc::ValidateInputs;

template <typename T>
struct ZType;
template <>
struct ZType<float> {
  static constexpr kc::FloatType value = kc::FloatType::kFloat32;
};
template <>
struct ZType<Eigen::half> {
  static constexpr kc::FloatType value = kc::FloatType::kFloat16;
};
template <>
struct ZType<bfloat16> {
  static constexpr kc::FloatType value = kc::FloatType::kBFloat16;
};

template <typename T>
struct LabelType;
template <>
struct LabelType<int32_t> {
  static constexpr kc::IndexType value = kc::IndexType::kInt32;
};
template <>
struct LabelType<int64_t> {
  static constexpr kc::IndexType value = kc::IndexType::kInt64;
};

// The raw CUDA stream TensorFlow runs this op on (what GetGpuStream() in
// tensorflow/core/util/gpu_kernel_helper.h does, without that header's
// device-code dependencies).
cudaStream_t OpStream(OpKernelContext* context) {
  return reinterpret_cast<cudaStream_t>(
      context->op_device_context()->stream()->platform_specific_handle().stream);
}

absl::Status CudaError(const char* op, cudaError_t err) {
  std::string message =
      absl::StrCat(op, " GPU kernel: ", cudaGetErrorString(err));
  if (err == cudaErrorInvalidValue) {
    absl::StrAppend(&message,
                    " (the kernels take code_length up to 2^24 and a workspace "
                    "of the size their query returns)");
  }
  return absl::InternalError(message);
}

constexpr char kMathEnv[] = "KERAS_ECOC_CUDA_MATH";

// $KERAS_ECOC_CUDA_MATH -> MathMode (unset or empty: the default, 3xtf32).
absl::Status MathModeFromEnv(kc::MathMode* math) {
  const char* value = std::getenv(kMathEnv);
  const std::string v = value == nullptr ? "" : value;
  if (v.empty() || v == "3xtf32") {
    *math = kc::MathMode::k3xTf32;
  } else if (v == "tf32") {
    *math = kc::MathMode::kTf32;
  } else if (v == "fp32") {
    *math = kc::MathMode::kFp32;
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "Environment variable `", kMathEnv,
        "` must be one of 3xtf32 (the default), tf32 or fp32. Received: ",
        kMathEnv, "='", v, "'"));
  }
  return absl::OkStatus();
}

// Asks the pass for its workspace size, takes that much from TensorFlow's
// allocator (allocate_temp; an int8 tensor over-allocated by the alignment
// the contract asks for, since TensorFlow only promises 64 bytes), and runs
// the pass on the op's stream. The temporary is released when Compute
// returns; TensorFlow's stream-ordered allocator keeps it valid for the
// kernels already enqueued (as for every temp of a GPU op).
template <typename Params, typename SizeFn, typename RunFn>
absl::Status RunPass(OpKernelContext* context, const char* op, Params* params,
                     SizeFn size_fn, RunFn run_fn) {
  size_t bytes = 0;
  cudaError_t err = size_fn(*params, &bytes);
  if (err != cudaSuccess) return CudaError(op, err);
  Tensor workspace;
  if (bytes > 0) {
    const size_t padded = bytes + kc::kWorkspaceAlignment;
    TF_RETURN_IF_ERROR(context->allocate_temp(
        DT_INT8, TensorShape({static_cast<int64_t>(padded)}), &workspace));
    const uintptr_t base =
        reinterpret_cast<uintptr_t>(workspace.flat<int8_t>().data());
    const uintptr_t aligned = (base + kc::kWorkspaceAlignment - 1) /
                              kc::kWorkspaceAlignment * kc::kWorkspaceAlignment;
    params->workspace = reinterpret_cast<void*>(aligned);
    params->workspace_bytes = bytes;
  }
  err = run_fn(*params, OpStream(context));
  return err == cudaSuccess ? absl::OkStatus() : CudaError(op, err);
}

template <typename T>
kc::ProblemArgs Problem(const Tensor& z, const Tensor& codes, float epsilon) {
  kc::ProblemArgs p;
  p.z = z.flat<T>().data();
  p.z_type = ZType<T>::value;
  p.codes = codes.flat<float>().data();
  p.batch = z.dim_size(0);
  p.num_classes = codes.dim_size(0);
  p.code_length = z.dim_size(1);
  p.epsilon = epsilon;
  return p;
}


absl::Status CheckBatchVector(const Tensor& t, const char* name,
                              int64_t batch) {
  if (t.dims() != 1 || t.dim_size(0) != batch) {
    return absl::InvalidArgumentError(absl::StrCat(
        name, " must have shape [", batch, "], got ", t.shape().DebugString()));
  }
  return absl::OkStatus();
}

// The scale is a device scalar here: only its shape is checked on the host
// (reading its value would cost a device-to-host copy and a stream sync per
// call, as for a scale tensor in the Python layer); a value that is not a
// finite number > 0 makes the kernels' outputs NaN (ReadScale in
// cuda/ecoc_common.cuh).
absl::Status CheckDeviceScale(const Tensor& scale) {
  if (scale.dims() != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "scale must be a scalar, got shape ", scale.shape().DebugString()));
  }
  return absl::OkStatus();
}

// labels [B] in [0, num_classes), checked on the host (the input is declared
// HostMemory), then copied to a device temporary on the op's stream.
template <typename Tlabels>
absl::Status ValidateAndUploadLabels(OpKernelContext* context,
                                     const Tensor& labels, int64_t batch,
                                     int64_t num_classes,
                                     Tensor* labels_device) {
  // Shapes were checked by ValidateInputs; wording as CheckedLabels on CPU.
  const auto flat = labels.flat<Tlabels>();
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t y = static_cast<int64_t>(flat(b));
    if (y < 0 || y >= num_classes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "labels[", b, "] = ", y, " is outside the valid range [0, ",
          num_classes, ") of class indices (codes has ", num_classes,
          " rows)"));
    }
  }
  TF_RETURN_IF_ERROR(context->allocate_temp(
      DataTypeToEnum<Tlabels>::value, TensorShape({batch}), labels_device));
  if (batch == 0) return absl::OkStatus();
  const cudaError_t err = cudaMemcpyAsync(
      labels_device->flat<Tlabels>().data(), flat.data(),
      batch * sizeof(Tlabels), cudaMemcpyHostToDevice, OpStream(context));
  if (err != cudaSuccess) return CudaError("labels upload", err);
  // The host buffer may be pinned (it often comes from a device-to-host
  // copy), and then the copy is truly asynchronous: keep the buffer alive
  // until the stream has passed it, as TensorFlow's GpuDeviceArrayOnHost does.
  const auto* device_info =
      context->device()->tensorflow_accelerator_device_info();
  if (device_info != nullptr && device_info->event_mgr != nullptr) {
    TensorReference ref(labels);
    device_info->event_mgr->ThenExecute(context->op_device_context()->stream(),
                                        [ref]() { ref.Unref(); });
    return absl::OkStatus();
  }
  const cudaError_t sync_err = cudaStreamSynchronize(OpStream(context));
  if (sync_err != cudaSuccess) return CudaError("labels upload", sync_err);
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------

template <typename T, typename Tlabels>
class EcocCrossEntropyGpuOp : public OpKernel {
 public:
  explicit EcocCrossEntropyGpuOp(OpKernelConstruction* context)
      : OpKernel(context) {
    OP_REQUIRES_OK(context, context->GetAttr("epsilon", &epsilon_));
    OP_REQUIRES_OK(context, MathModeFromEnv(&math_));
  }

  void Compute(OpKernelContext* context) override {
    const Tensor& z = context->input(0);
    const Tensor& codes = context->input(1);
    const Tensor& labels = context->input(2);
    const Tensor& scale = context->input(3);
    OP_REQUIRES_OK(context, ValidateInputs(z, codes, &labels, nullptr));
    OP_REQUIRES_OK(context, CheckDeviceScale(scale));
    const int64_t batch = z.dim_size(0);
    const int64_t code_length = z.dim_size(1);
    const int64_t num_classes = codes.dim_size(0);
    Tensor labels_device;
    OP_REQUIRES_OK(context,
                   ValidateAndUploadLabels<Tlabels>(context, labels, batch,
                                                    num_classes, &labels_device));

    Tensor* loss = nullptr;
    Tensor* lse = nullptr;
    Tensor* expected_code = nullptr;
    Tensor* expected_sqnorm = nullptr;
    OP_REQUIRES_OK(context, context->allocate_output(0, TensorShape({batch}), &loss));
    OP_REQUIRES_OK(context, context->allocate_output(1, TensorShape({batch}), &lse));
    OP_REQUIRES_OK(context, context->allocate_output(
                                2, TensorShape({batch, code_length}), &expected_code));
    OP_REQUIRES_OK(context, context->allocate_output(3, TensorShape({batch}),
                                                     &expected_sqnorm));
    if (batch == 0) return;

    kc::ForwardParams params;
    params.problem = Problem<T>(z, codes, epsilon_);
    params.labels = labels_device.flat<Tlabels>().data();
    params.label_type = LabelType<Tlabels>::value;
    params.scale_ptr = scale.flat<float>().data();  // read on the stream
    params.math = math_;
    params.loss = loss->flat<float>().data();
    params.lse = lse->flat<float>().data();
    params.expected_code = expected_code->flat<float>().data();
    params.expected_sqnorm = expected_sqnorm->flat<float>().data();
    OP_REQUIRES_OK(context, RunPass(context, "EcocCrossEntropy", &params,
                                    kc::EcocForwardWorkspaceSize,
                                    kc::EcocCrossEntropyForward));
  }

 private:
  float epsilon_;
  kc::MathMode math_ = kc::MathMode::k3xTf32;
};

template <typename T, typename Tlabels>
class EcocCrossEntropyCodesGradGpuOp : public OpKernel {
 public:
  explicit EcocCrossEntropyCodesGradGpuOp(OpKernelConstruction* context)
      : OpKernel(context) {
    OP_REQUIRES_OK(context, context->GetAttr("epsilon", &epsilon_));
    OP_REQUIRES_OK(context, MathModeFromEnv(&math_));
  }

  void Compute(OpKernelContext* context) override {
    const Tensor& z = context->input(0);
    const Tensor& codes = context->input(1);
    const Tensor& labels = context->input(2);
    const Tensor& scale = context->input(3);
    const Tensor& lse = context->input(4);
    const Tensor& grad_loss = context->input(5);
    OP_REQUIRES_OK(context, ValidateInputs(z, codes, &labels, nullptr));
    OP_REQUIRES_OK(context, CheckDeviceScale(scale));
    const int64_t batch = z.dim_size(0);
    const int64_t code_length = z.dim_size(1);
    const int64_t num_classes = codes.dim_size(0);
    OP_REQUIRES_OK(context, CheckBatchVector(lse, "lse", batch));
    OP_REQUIRES_OK(context, CheckBatchVector(grad_loss, "grad_loss", batch));
    Tensor labels_device;
    OP_REQUIRES_OK(context,
                   ValidateAndUploadLabels<Tlabels>(context, labels, batch,
                                                    num_classes, &labels_device));

    Tensor* grad_codes = nullptr;
    OP_REQUIRES_OK(context, context->allocate_output(
                                0, TensorShape({num_classes, code_length}),
                                &grad_codes));
    if (grad_codes->NumElements() == 0) return;

    // Runs for batch == 0 too: the pass then writes zeros.
    kc::CodesGradParams params;
    params.problem = Problem<T>(z, codes, epsilon_);
    params.labels = labels_device.flat<Tlabels>().data();
    params.label_type = LabelType<Tlabels>::value;
    params.scale_ptr = scale.flat<float>().data();  // read on the stream
    params.math = math_;
    params.lse = lse.flat<float>().data();
    params.grad_loss = grad_loss.flat<float>().data();
    params.grad_codes = grad_codes->flat<float>().data();
    OP_REQUIRES_OK(context, RunPass(context, "EcocCrossEntropyCodesGrad", &params,
                                    kc::EcocCodesGradWorkspaceSize,
                                    kc::EcocCrossEntropyCodesGrad));
  }

 private:
  float epsilon_;
  kc::MathMode math_ = kc::MathMode::k3xTf32;
};

template <typename T, typename Tlabels>
class EcocLabelRankGpuOp : public OpKernel {
 public:
  explicit EcocLabelRankGpuOp(OpKernelConstruction* context)
      : OpKernel(context) {
    OP_REQUIRES_OK(context, context->GetAttr("epsilon", &epsilon_));
  }

  void Compute(OpKernelContext* context) override {
    const Tensor& z = context->input(0);
    const Tensor& codes = context->input(1);
    const Tensor& labels = context->input(2);
    OP_REQUIRES_OK(context, ValidateInputs(z, codes, &labels, nullptr));
    const int64_t batch = z.dim_size(0);
    const int64_t num_classes = codes.dim_size(0);
    Tensor labels_device;
    OP_REQUIRES_OK(context,
                   ValidateAndUploadLabels<Tlabels>(context, labels, batch,
                                                    num_classes, &labels_device));

    Tensor* rank = nullptr;
    OP_REQUIRES_OK(context, context->allocate_output(0, TensorShape({batch}), &rank));
    if (batch == 0) return;

    kc::LabelRankParams params;
    params.problem = Problem<T>(z, codes, epsilon_);
    params.labels = labels_device.flat<Tlabels>().data();
    params.label_type = LabelType<Tlabels>::value;
    params.rank = rank->flat<int32_t>().data();
    OP_REQUIRES_OK(context, RunPass(context, "EcocLabelRank", &params,
                                    kc::EcocLabelRankWorkspaceSize,
                                    kc::EcocLabelRank));
  }

 private:
  float epsilon_;
};

template <typename T>
class EcocNearestCodewordGpuOp : public OpKernel {
 public:
  explicit EcocNearestCodewordGpuOp(OpKernelConstruction* context)
      : OpKernel(context) {
    OP_REQUIRES_OK(context, context->GetAttr("epsilon", &epsilon_));
  }

  void Compute(OpKernelContext* context) override {
    const Tensor& z = context->input(0);
    const Tensor& codes = context->input(1);
    OP_REQUIRES_OK(context, ValidateInputs(z, codes, nullptr, nullptr));
    const int64_t batch = z.dim_size(0);

    Tensor* index = nullptr;
    OP_REQUIRES_OK(context, context->allocate_output(0, TensorShape({batch}), &index));
    if (batch == 0) return;

    kc::NearestParams params;
    params.problem = Problem<T>(z, codes, epsilon_);
    params.index = index->flat<int64_t>().data();
    OP_REQUIRES_OK(context, RunPass(context, "EcocNearestCodeword", &params,
                                    kc::EcocNearestWorkspaceSize,
                                    kc::EcocNearestCodeword));
  }

 private:
  float epsilon_;
};

// ---------------------------------------------------------------------------
// Registration.  labels stay in host memory (validated on the host, then
// uploaded); scale stays on the device and the kernels read it on the op's
// stream (contract field scale_ptr): no device-to-host copy, no stream sync.

#define ECOC_REGISTER_GPU_LABELED(T, Tlabels)                              \
  REGISTER_KERNEL_BUILDER(Name("EcocCrossEntropy")                         \
                              .Device(DEVICE_GPU)                          \
                              .TypeConstraint<T>("T")                      \
                              .TypeConstraint<Tlabels>("Tlabels")          \
                              .HostMemory("labels"),                       \
                          EcocCrossEntropyGpuOp<T, Tlabels>);              \
  REGISTER_KERNEL_BUILDER(Name("EcocCrossEntropyCodesGrad")                \
                              .Device(DEVICE_GPU)                          \
                              .TypeConstraint<T>("T")                      \
                              .TypeConstraint<Tlabels>("Tlabels")          \
                              .HostMemory("labels"),                       \
                          EcocCrossEntropyCodesGradGpuOp<T, Tlabels>);     \
  REGISTER_KERNEL_BUILDER(Name("EcocLabelRank")                            \
                              .Device(DEVICE_GPU)                          \
                              .TypeConstraint<T>("T")                      \
                              .TypeConstraint<Tlabels>("Tlabels")          \
                              .HostMemory("labels"),                       \
                          EcocLabelRankGpuOp<T, Tlabels>)

#define ECOC_REGISTER_GPU(T)                                               \
  ECOC_REGISTER_GPU_LABELED(T, int32_t);                                   \
  ECOC_REGISTER_GPU_LABELED(T, int64_t);                                   \
  REGISTER_KERNEL_BUILDER(                                                 \
      Name("EcocNearestCodeword").Device(DEVICE_GPU).TypeConstraint<T>("T"), \
      EcocNearestCodewordGpuOp<T>)

ECOC_REGISTER_GPU(float);
ECOC_REGISTER_GPU(Eigen::half);
ECOC_REGISTER_GPU(bfloat16);

#undef ECOC_REGISTER_GPU
#undef ECOC_REGISTER_GPU_LABELED

}  // namespace
}  // namespace ecoc_gpu
}  // namespace tensorflow

#endif  // GOOGLE_CUDA
