// Shape checks shared by the CPU and GPU OpKernels of the fused ECOC ops, so
// that both devices reject the same inputs with the same words.
#ifndef KERAS_ECOC_KERNELS_ECOC_VALIDATION_H_
#define KERAS_ECOC_KERNELS_ECOC_VALIDATION_H_

#include <cmath>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/tensor_shape.h"

namespace keras_ecoc {

// Checks z [B, k], codes [n, k], labels [B] and a scalar scale (the latter two
// when given).
inline absl::Status ValidateInputs(const tensorflow::Tensor& z,
                                   const tensorflow::Tensor& codes,
                                   const tensorflow::Tensor* labels,
                                   const tensorflow::Tensor* scale) {
  if (z.dims() != 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "z must be a rank-2 tensor [batch, code_length], got shape ",
        z.shape().DebugString()));
  }
  if (codes.dims() != 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "codes must be a rank-2 tensor [num_classes, code_length], got shape ",
        codes.shape().DebugString()));
  }
  if (codes.dim_size(1) != z.dim_size(1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "z has code length (last dimension) ", z.dim_size(1),
        " but codes has code length ", codes.dim_size(1),
        "; they must be equal"));
  }
  if (codes.dim_size(0) < 1) {
    return absl::InvalidArgumentError(
        "codes must have at least one row (one class), got shape " +
        codes.shape().DebugString());
  }
  if (codes.dim_size(0) > INT32_MAX) {
    return absl::InvalidArgumentError(
        absl::StrCat("at most 2^31 - 1 classes are supported, got ",
                     codes.dim_size(0)));
  }
  if (labels != nullptr) {
    if (labels->dims() != 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "labels must be a rank-1 tensor [batch], got shape ",
          labels->shape().DebugString()));
    }
    if (labels->dim_size(0) != z.dim_size(0)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "z has batch size ", z.dim_size(0), " but labels has ",
          labels->dim_size(0), " elements; they must be equal"));
    }
  }
  if (scale != nullptr) {
    if (scale->dims() != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "scale must be a scalar, got shape ", scale->shape().DebugString()));
    }
    // Only the CPU kernels pass the scale here (host memory); the GPU kernels
    // check its shape alone and read it on the device (ecoc_ops_gpu.cc).
    // A non-positive scale flips the order of the logits (and overflows
    // exp() in the codes gradient); a non-finite one gives NaN everywhere.
    const float s = scale->scalar<float>()();
    if (!std::isfinite(s) || !(s > 0.0f)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "scale must be a finite number > 0, got ", s));
    }
  }
  return absl::OkStatus();
}

}  // namespace keras_ecoc

#endif  // KERAS_ECOC_KERNELS_ECOC_VALIDATION_H_
