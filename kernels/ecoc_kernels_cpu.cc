// CPU OpKernels of the fused ECOC ops: input validation, dtype conversion and
// threading; the math is in ecoc_cpu_math.cc (one copy per ISA, picked at run
// time). Set KERAS_ECOC_CPU_ISA=base to force the baseline (SSE2) copy.
#define EIGEN_USE_THREADS

#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "ecoc_cpu_math.h"
#include "ecoc_validation.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/register_types.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/tensor_shape.h"
#include "tensorflow/core/framework/types.h"
#include "tensorflow/core/platform/threadpool.h"

namespace keras_ecoc {
namespace {

using ::tensorflow::DEVICE_CPU;
using ::tensorflow::OpKernel;
using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::Tensor;
using ::tensorflow::TensorShape;

const cpu::Kernels* SelectKernels() {
#if defined(ECOC_HAVE_AVX2_VARIANT) && (defined(__x86_64__) || defined(__i386__))
  const char* env = std::getenv("KERAS_ECOC_CPU_ISA");
  if (env != nullptr && std::strcmp(env, "base") == 0) {
    return cpu::GetKernelsBase();
  }
  static const bool has_avx2 = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  }();
  return has_avx2 ? cpu::GetKernelsAvx2() : cpu::GetKernelsBase();
#else
  return cpu::GetKernelsBase();
#endif
}

void TfParallelFor(void* pool, int64_t num_items, int64_t cost_per_item,
                   cpu::WorkFn work, void* arg) {
  if (num_items <= 0) return;
  if (num_items == 1 || pool == nullptr) {
    work(arg, 0, num_items);
    return;
  }
  auto* workers = static_cast<tensorflow::thread::ThreadPool*>(pool);
  workers->ParallelFor(num_items, cost_per_item,
                       [work, arg](int64_t b, int64_t e) { work(arg, b, e); });
}

cpu::Runtime MakeRuntime(OpKernelContext* ctx) {
  cpu::Runtime rt;
  rt.parallel_for = TfParallelFor;
  auto* threads = ctx->device()->tensorflow_cpu_worker_threads();
  rt.pool = threads != nullptr ? threads->workers : nullptr;
  rt.num_threads = threads != nullptr ? threads->num_threads : 1;
  return rt;
}


// Copies labels to int64, checking that each lies in [0, n).
template <typename L>
absl::Status CheckedLabels(const Tensor& labels, int64_t n, int64_t* out) {
  auto flat = labels.flat<L>();
  for (int64_t i = 0; i < flat.size(); ++i) {
    const int64_t y = static_cast<int64_t>(flat(i));
    if (y < 0 || y >= n) {
      return absl::InvalidArgumentError(absl::StrCat(
          "labels[", i, "] = ", y, " is outside the valid range [0, ", n,
          ") of class indices (codes has ", n, " rows)"));
    }
    out[i] = y;
  }
  return absl::OkStatus();
}

// z as float32 (converted from half / bfloat16 into a temporary).
template <typename T>
absl::Status FloatZ(OpKernelContext* ctx, const Tensor& z, Tensor* tmp,
                    const float** out) {
  if constexpr (std::is_same_v<T, float>) {
    *out = z.flat<float>().data();
    return absl::OkStatus();
  } else {
    TF_RETURN_IF_ERROR(
        ctx->allocate_temp(tensorflow::DT_FLOAT, z.shape(), tmp));
    tmp->flat<float>().device(ctx->eigen_cpu_device()) =
        z.flat<T>().template cast<float>();
    *out = tmp->flat<float>().data();
    return absl::OkStatus();
  }
}

absl::Status ScratchFailure(const char* op) {
  return absl::ResourceExhaustedError(
      absl::StrCat(op, ": failed to allocate CPU scratch memory"));
}

template <typename T, typename L>
class EcocCrossEntropyOp : public OpKernel {
 public:
  explicit EcocCrossEntropyOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("epsilon", &epsilon_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& z = ctx->input(0);
    const Tensor& codes = ctx->input(1);
    const Tensor& labels = ctx->input(2);
    const Tensor& scale = ctx->input(3);
    OP_REQUIRES_OK(ctx, ValidateInputs(z, codes, &labels, &scale));
    const int64_t B = z.dim_size(0), k = z.dim_size(1), n = codes.dim_size(0);
    Tensor labels64;
    OP_REQUIRES_OK(ctx, ctx->allocate_temp(tensorflow::DT_INT64,
                                           TensorShape({B}), &labels64));
    OP_REQUIRES_OK(ctx, CheckedLabels<L>(labels, n,
                                         labels64.flat<int64_t>().data()));
    Tensor zf_tmp;
    const float* zf = nullptr;
    OP_REQUIRES_OK(ctx, FloatZ<T>(ctx, z, &zf_tmp, &zf));
    Tensor *loss, *lse, *ec, *esq;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({B}), &loss));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({B}), &lse));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, TensorShape({B, k}), &ec));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(3, TensorShape({B}), &esq));
    const cpu::Runtime rt = MakeRuntime(ctx);
    const int status = SelectKernels()->forward(
        &rt, zf, labels64.flat<int64_t>().data(), codes.flat<float>().data(),
        scale.scalar<float>()(), epsilon_, B, n, k, loss->flat<float>().data(),
        lse->flat<float>().data(), ec->flat<float>().data(),
        esq->flat<float>().data());
    OP_REQUIRES(ctx, status == 0, ScratchFailure("EcocCrossEntropy"));
  }

 private:
  float epsilon_;
};

template <typename T, typename L>
class EcocCrossEntropyCodesGradOp : public OpKernel {
 public:
  explicit EcocCrossEntropyCodesGradOp(OpKernelConstruction* ctx)
      : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("epsilon", &epsilon_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& z = ctx->input(0);
    const Tensor& codes = ctx->input(1);
    const Tensor& labels = ctx->input(2);
    const Tensor& scale = ctx->input(3);
    const Tensor& lse = ctx->input(4);
    const Tensor& grad = ctx->input(5);
    OP_REQUIRES_OK(ctx, ValidateInputs(z, codes, &labels, &scale));
    const int64_t B = z.dim_size(0), k = z.dim_size(1), n = codes.dim_size(0);
    OP_REQUIRES(ctx, lse.dims() == 1 && lse.dim_size(0) == B,
                absl::InvalidArgumentError(absl::StrCat(
                    "lse must have shape [", B, "], got ",
                    lse.shape().DebugString())));
    OP_REQUIRES(ctx, grad.dims() == 1 && grad.dim_size(0) == B,
                absl::InvalidArgumentError(absl::StrCat(
                    "grad_loss must have shape [", B, "], got ",
                    grad.shape().DebugString())));
    Tensor labels64;
    OP_REQUIRES_OK(ctx, ctx->allocate_temp(tensorflow::DT_INT64,
                                           TensorShape({B}), &labels64));
    OP_REQUIRES_OK(ctx, CheckedLabels<L>(labels, n,
                                         labels64.flat<int64_t>().data()));
    Tensor zf_tmp;
    const float* zf = nullptr;
    OP_REQUIRES_OK(ctx, FloatZ<T>(ctx, z, &zf_tmp, &zf));
    Tensor* out;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({n, k}), &out));
    const cpu::Runtime rt = MakeRuntime(ctx);
    const int status = SelectKernels()->codes_grad(
        &rt, zf, labels64.flat<int64_t>().data(), codes.flat<float>().data(),
        scale.scalar<float>()(), epsilon_, lse.flat<float>().data(),
        grad.flat<float>().data(), B, n, k, out->flat<float>().data());
    OP_REQUIRES(ctx, status == 0, ScratchFailure("EcocCrossEntropyCodesGrad"));
  }

 private:
  float epsilon_;
};

template <typename T, typename L>
class EcocLabelRankOp : public OpKernel {
 public:
  explicit EcocLabelRankOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("epsilon", &epsilon_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& z = ctx->input(0);
    const Tensor& codes = ctx->input(1);
    const Tensor& labels = ctx->input(2);
    OP_REQUIRES_OK(ctx, ValidateInputs(z, codes, &labels, nullptr));
    const int64_t B = z.dim_size(0), k = z.dim_size(1), n = codes.dim_size(0);
    Tensor labels64;
    OP_REQUIRES_OK(ctx, ctx->allocate_temp(tensorflow::DT_INT64,
                                           TensorShape({B}), &labels64));
    OP_REQUIRES_OK(ctx, CheckedLabels<L>(labels, n,
                                         labels64.flat<int64_t>().data()));
    Tensor zf_tmp;
    const float* zf = nullptr;
    OP_REQUIRES_OK(ctx, FloatZ<T>(ctx, z, &zf_tmp, &zf));
    Tensor* out;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({B}), &out));
    const cpu::Runtime rt = MakeRuntime(ctx);
    const int status = SelectKernels()->label_rank(
        &rt, zf, labels64.flat<int64_t>().data(), codes.flat<float>().data(),
        epsilon_, B, n, k, out->flat<int32_t>().data());
    OP_REQUIRES(ctx, status == 0, ScratchFailure("EcocLabelRank"));
  }

 private:
  float epsilon_;
};

template <typename T>
class EcocNearestCodewordOp : public OpKernel {
 public:
  explicit EcocNearestCodewordOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("epsilon", &epsilon_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& z = ctx->input(0);
    const Tensor& codes = ctx->input(1);
    OP_REQUIRES_OK(ctx, ValidateInputs(z, codes, nullptr, nullptr));
    const int64_t B = z.dim_size(0), k = z.dim_size(1), n = codes.dim_size(0);
    Tensor zf_tmp;
    const float* zf = nullptr;
    OP_REQUIRES_OK(ctx, FloatZ<T>(ctx, z, &zf_tmp, &zf));
    Tensor* out;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({B}), &out));
    const cpu::Runtime rt = MakeRuntime(ctx);
    const int status = SelectKernels()->nearest(
        &rt, zf, codes.flat<float>().data(), epsilon_, B, n, k,
        out->flat<int64_t>().data());
    OP_REQUIRES(ctx, status == 0, ScratchFailure("EcocNearestCodeword"));
  }

 private:
  float epsilon_;
};

#define ECOC_REGISTER_CPU_TL(T, L)                                     \
  REGISTER_KERNEL_BUILDER(Name("EcocCrossEntropy")                     \
                              .Device(DEVICE_CPU)                      \
                              .TypeConstraint<T>("T")                  \
                              .TypeConstraint<L>("Tlabels"),           \
                          EcocCrossEntropyOp<T, L>);                   \
  REGISTER_KERNEL_BUILDER(Name("EcocCrossEntropyCodesGrad")            \
                              .Device(DEVICE_CPU)                      \
                              .TypeConstraint<T>("T")                  \
                              .TypeConstraint<L>("Tlabels"),           \
                          EcocCrossEntropyCodesGradOp<T, L>);          \
  REGISTER_KERNEL_BUILDER(Name("EcocLabelRank")                        \
                              .Device(DEVICE_CPU)                      \
                              .TypeConstraint<T>("T")                  \
                              .TypeConstraint<L>("Tlabels"),           \
                          EcocLabelRankOp<T, L>);

#define ECOC_REGISTER_CPU(T)                                           \
  ECOC_REGISTER_CPU_TL(T, int32_t)                                     \
  ECOC_REGISTER_CPU_TL(T, int64_t)                                     \
  REGISTER_KERNEL_BUILDER(                                             \
      Name("EcocNearestCodeword").Device(DEVICE_CPU).TypeConstraint<T>("T"), \
      EcocNearestCodewordOp<T>);

ECOC_REGISTER_CPU(float)
ECOC_REGISTER_CPU(Eigen::half)
ECOC_REGISTER_CPU(tensorflow::bfloat16)

#undef ECOC_REGISTER_CPU
#undef ECOC_REGISTER_CPU_TL

}  // namespace
}  // namespace keras_ecoc
