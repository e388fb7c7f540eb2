// TensorFlow GPU kernels of the ECOC ops (registered with REGISTER_OP in
// kernels/ecoc_ops.cc).  The math lives in kernels/cuda/ecoc_kernels.cu.cc,
// behind the TensorFlow-free interface of kernels/cuda/ecoc_kernels.h; this
// file only checks shapes and labels, allocates outputs and calls it on the
// op's CUDA stream.
//
// Compiled by the host compiler, not nvcc:
//   g++ -std=c++17 -fPIC -O2 -DGOOGLE_CUDA=1 -DEIGEN_USE_GPU
//       -Ibuild/shim -I$CUDA_HOME/include $TF_CFLAGS -c kernels/ecoc_ops_gpu.cc
// and linked into the same .so as the CPU kernels together with the nvcc
// object of ecoc_kernels.cu.cc and -l:libcudart_static.a.
#if GOOGLE_CUDA

#include <cstdint>
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
                    " (a code_length this large may not fit the device's "
                    "shared memory)");
  }
  return absl::InternalError(message);
}


absl::Status CheckBatchVector(const Tensor& t, const char* name,
                              int64_t batch) {
  if (t.dims() != 1 || t.dim_size(0) != batch) {
    return absl::InvalidArgumentError(absl::StrCat(
        name, " must have shape [", batch, "], got ", t.shape().DebugString()));
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
  }

  void Compute(OpKernelContext* context) override {
    const Tensor& z = context->input(0);
    const Tensor& codes = context->input(1);
    const Tensor& labels = context->input(2);
    const Tensor& scale = context->input(3);
    OP_REQUIRES_OK(context, ValidateInputs(z, codes, &labels, &scale));
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

    const cudaError_t err = kc::EcocCrossEntropyForward(
        z.flat<T>().data(), ZType<T>::value, codes.flat<float>().data(),
        labels_device.flat<Tlabels>().data(), LabelType<Tlabels>::value,
        scale.scalar<float>()(), epsilon_, batch, num_classes, code_length,
        loss->flat<float>().data(), lse->flat<float>().data(),
        expected_code->flat<float>().data(),
        expected_sqnorm->flat<float>().data(), OpStream(context));
    OP_REQUIRES_OK(context, err == cudaSuccess ? absl::OkStatus() : CudaError("EcocCrossEntropy", err));
  }

 private:
  float epsilon_;
};

template <typename T, typename Tlabels>
class EcocCrossEntropyCodesGradGpuOp : public OpKernel {
 public:
  explicit EcocCrossEntropyCodesGradGpuOp(OpKernelConstruction* context)
      : OpKernel(context) {
    OP_REQUIRES_OK(context, context->GetAttr("epsilon", &epsilon_));
  }

  void Compute(OpKernelContext* context) override {
    const Tensor& z = context->input(0);
    const Tensor& codes = context->input(1);
    const Tensor& labels = context->input(2);
    const Tensor& scale = context->input(3);
    const Tensor& lse = context->input(4);
    const Tensor& grad_loss = context->input(5);
    OP_REQUIRES_OK(context, ValidateInputs(z, codes, &labels, &scale));
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

    // Runs for batch == 0 too: the kernel then writes zeros.
    const cudaError_t err = kc::EcocCrossEntropyCodesGrad(
        z.flat<T>().data(), ZType<T>::value, codes.flat<float>().data(),
        labels_device.flat<Tlabels>().data(), LabelType<Tlabels>::value,
        scale.scalar<float>()(), epsilon_, lse.flat<float>().data(),
        grad_loss.flat<float>().data(), batch, num_classes, code_length,
        grad_codes->flat<float>().data(), OpStream(context));
    OP_REQUIRES_OK(context, err == cudaSuccess ? absl::OkStatus() : CudaError("EcocCrossEntropyCodesGrad", err));
  }

 private:
  float epsilon_;
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
    const int64_t code_length = z.dim_size(1);
    const int64_t num_classes = codes.dim_size(0);
    Tensor labels_device;
    OP_REQUIRES_OK(context,
                   ValidateAndUploadLabels<Tlabels>(context, labels, batch,
                                                    num_classes, &labels_device));

    Tensor* rank = nullptr;
    OP_REQUIRES_OK(context, context->allocate_output(0, TensorShape({batch}), &rank));
    if (batch == 0) return;

    const cudaError_t err = kc::EcocLabelRank(
        z.flat<T>().data(), ZType<T>::value, codes.flat<float>().data(),
        labels_device.flat<Tlabels>().data(), LabelType<Tlabels>::value,
        epsilon_, batch, num_classes, code_length, rank->flat<int32_t>().data(),
        OpStream(context));
    OP_REQUIRES_OK(context, err == cudaSuccess ? absl::OkStatus() : CudaError("EcocLabelRank", err));
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
    const int64_t code_length = z.dim_size(1);
    const int64_t num_classes = codes.dim_size(0);

    Tensor* index = nullptr;
    OP_REQUIRES_OK(context, context->allocate_output(0, TensorShape({batch}), &index));
    if (batch == 0) return;

    const cudaError_t err = kc::EcocNearestCodeword(
        z.flat<T>().data(), ZType<T>::value, codes.flat<float>().data(),
        epsilon_, batch, num_classes, code_length,
        index->flat<int64_t>().data(), OpStream(context));
    OP_REQUIRES_OK(context, err == cudaSuccess ? absl::OkStatus() : CudaError("EcocNearestCodeword", err));
  }

 private:
  float epsilon_;
};

// ---------------------------------------------------------------------------
// Registration.  labels and scale stay in host memory: labels are validated
// on the host, scale is passed by value.

#define ECOC_REGISTER_GPU_LABELED(T, Tlabels)                              \
  REGISTER_KERNEL_BUILDER(Name("EcocCrossEntropy")                         \
                              .Device(DEVICE_GPU)                          \
                              .TypeConstraint<T>("T")                      \
                              .TypeConstraint<Tlabels>("Tlabels")          \
                              .HostMemory("labels")                        \
                              .HostMemory("scale"),                        \
                          EcocCrossEntropyGpuOp<T, Tlabels>);              \
  REGISTER_KERNEL_BUILDER(Name("EcocCrossEntropyCodesGrad")                \
                              .Device(DEVICE_GPU)                          \
                              .TypeConstraint<T>("T")                      \
                              .TypeConstraint<Tlabels>("Tlabels")          \
                              .HostMemory("labels")                        \
                              .HostMemory("scale"),                        \
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
