// Op registrations (interfaces and shape functions) of the fused ECOC ops.
//
// Notation: z [B, k] network outputs, codes M [n, k], labels y [B], scale s.
//   u_b      = z_b * rsqrt(max(||z_b||^2, epsilon))
//   logit_bi = -0.5 * s * ||M_i - u_b||^2
// The kernels live in ecoc_kernels_cpu.cc (CPU), ecoc_ops_gpu.cc (CUDA) and
// ecoc_xla.cc (XLA lowerings); gradients are registered in Python
// (keras_ecoc/ops/_loader.py).
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace keras_ecoc {
namespace {

using ::tensorflow::shape_inference::DimensionHandle;
using ::tensorflow::shape_inference::InferenceContext;
using ::tensorflow::shape_inference::ShapeHandle;

// Same wording as the kernels' run-time checks (ecoc_kernels_cpu.cc).
absl::Status RequireRank(InferenceContext* c, int index, int rank,
                         const char* name, const char* dims,
                         ShapeHandle* out) {
  if (!c->WithRank(c->input(index), rank, out).ok()) {
    if (rank == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          name, " must be a scalar, got shape ",
          c->DebugString(c->input(index))));
    }
    return absl::InvalidArgumentError(absl::StrCat(
        name, " must be a rank-", rank, " tensor ", dims, ", got shape ",
        c->DebugString(c->input(index))));
  }
  return absl::OkStatus();
}

// Checks z [B, k] and codes [n, k] (and, when `labels_index` >= 0, labels [B]
// and, when `scale_index` >= 0, a scalar scale); returns B, k and n.
absl::Status CheckInputs(InferenceContext* c, int labels_index,
                         int scale_index, DimensionHandle* batch,
                         DimensionHandle* code_length,
                         DimensionHandle* num_classes) {
  ShapeHandle z, codes;
  TF_RETURN_IF_ERROR(RequireRank(c, 0, 2, "z", "[batch, code_length]", &z));
  TF_RETURN_IF_ERROR(
      RequireRank(c, 1, 2, "codes", "[num_classes, code_length]", &codes));
  *batch = c->Dim(z, 0);
  if (!c->Merge(c->Dim(z, 1), c->Dim(codes, 1), code_length).ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "z has code length (last dimension) ", c->DebugString(c->Dim(z, 1)),
        " but codes has code length ", c->DebugString(c->Dim(codes, 1)),
        "; they must be equal"));
  }
  *num_classes = c->Dim(codes, 0);
  if (c->ValueKnown(*num_classes) && c->Value(*num_classes) < 1) {
    return absl::InvalidArgumentError(
        "codes must have at least one row (one class)");
  }
  if (labels_index >= 0) {
    ShapeHandle labels;
    TF_RETURN_IF_ERROR(
        RequireRank(c, labels_index, 1, "labels", "[batch]", &labels));
    DimensionHandle merged;
    absl::Status s = c->Merge(*batch, c->Dim(labels, 0), &merged);
    if (!s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "z has batch size ", c->DebugString(*batch), " but labels has ",
          c->DebugString(c->Dim(labels, 0)), " elements; they must be equal"));
    }
    *batch = merged;
  }
  if (scale_index >= 0) {
    ShapeHandle scale;
    TF_RETURN_IF_ERROR(
        RequireRank(c, scale_index, 0, "scale", "", &scale));
  }
  return absl::OkStatus();
}

}  // namespace

REGISTER_OP("EcocCrossEntropy")
    .Input("z: T")
    .Input("codes: float")
    .Input("labels: Tlabels")
    .Input("scale: float")
    .Output("loss: float")
    .Output("lse: float")
    .Output("expected_code: float")
    .Output("expected_sqnorm: float")
    .Attr("T: {float, half, bfloat16} = DT_FLOAT")
    .Attr("Tlabels: {int32, int64} = DT_INT32")
    .Attr("epsilon: float = 1e-12")
    .SetShapeFn([](InferenceContext* c) {
      DimensionHandle b, k, n;
      TF_RETURN_IF_ERROR(CheckInputs(c, 2, 3, &b, &k, &n));
      c->set_output(0, c->Vector(b));
      c->set_output(1, c->Vector(b));
      c->set_output(2, c->Matrix(b, k));
      c->set_output(3, c->Vector(b));
      return absl::OkStatus();
    })
    .Doc(R"doc(
Fused ECOC softmax cross-entropy, streaming over the classes (never B x n).

loss_b = logsumexp_i(logit_bi) - logit_{b, y_b} with
logit_bi = -0.5 * scale * ||codes_i - u_b||^2, u_b = z_b / max(||z_b||, sqrt(epsilon)).
lse: the log-sum-exp; expected_code_b = sum_i p_bi codes_i and
expected_sqnorm_b = sum_i p_bi ||codes_i||^2 (p = softmax of the logits), used
by the gradient.
)doc");

REGISTER_OP("EcocCrossEntropyCodesGrad")
    .Input("z: T")
    .Input("codes: float")
    .Input("labels: Tlabels")
    .Input("scale: float")
    .Input("lse: float")
    .Input("grad_loss: float")
    .Output("grad_codes: float")
    .Attr("T: {float, half, bfloat16} = DT_FLOAT")
    .Attr("Tlabels: {int32, int64} = DT_INT32")
    .Attr("epsilon: float = 1e-12")
    .SetShapeFn([](InferenceContext* c) {
      DimensionHandle b, k, n;
      TF_RETURN_IF_ERROR(CheckInputs(c, 2, 3, &b, &k, &n));
      ShapeHandle lse, grad;
      TF_RETURN_IF_ERROR(RequireRank(c, 4, 1, "lse", "[batch]", &lse));
      TF_RETURN_IF_ERROR(RequireRank(c, 5, 1, "grad_loss", "[batch]", &grad));
      DimensionHandle merged;
      TF_RETURN_IF_ERROR(c->Merge(b, c->Dim(lse, 0), &merged));
      TF_RETURN_IF_ERROR(c->Merge(merged, c->Dim(grad, 0), &merged));
      c->set_output(0, c->Matrix(n, k));
      return absl::OkStatus();
    })
    .Doc(R"doc(
Gradient of sum_b grad_loss_b * loss_b with respect to the codes:
grad_codes_i = scale * sum_b grad_loss_b * (p_bi - [i == y_b]) * (u_b - codes_i),
streaming over the batch per class tile (p recomputed from lse).
)doc");

REGISTER_OP("EcocLabelRank")
    .Input("z: T")
    .Input("codes: float")
    .Input("labels: Tlabels")
    .Output("rank: int32")
    .Attr("T: {float, half, bfloat16} = DT_FLOAT")
    .Attr("Tlabels: {int32, int64} = DT_INT32")
    .Attr("epsilon: float = 1e-12")
    .SetShapeFn([](InferenceContext* c) {
      DimensionHandle b, k, n;
      TF_RETURN_IF_ERROR(CheckInputs(c, 2, -1, &b, &k, &n));
      c->set_output(0, c->Vector(b));
      return absl::OkStatus();
    })
    .Doc(R"doc(
rank_b = number of classes whose logit is strictly greater than the logit of
the label (0 means a correct top-1 prediction; rank < K means top-K correct).
Rows with a non-finite logit (non-finite z or codeword) get rank n (never
counted as correct).
)doc");

REGISTER_OP("EcocNearestCodeword")
    .Input("z: T")
    .Input("codes: float")
    .Output("index: int64")
    .Attr("T: {float, half, bfloat16} = DT_FLOAT")
    .Attr("epsilon: float = 1e-12")
    .SetShapeFn([](InferenceContext* c) {
      DimensionHandle b, k, n;
      TF_RETURN_IF_ERROR(CheckInputs(c, -1, -1, &b, &k, &n));
      c->set_output(0, c->Vector(b));
      return absl::OkStatus();
    })
    .Doc(R"doc(
index_b = argmax_i logit_bi (the nearest codeword to u_b; ties go to the
smallest index); -1 for rows with a non-finite logit (non-finite z or
codeword), which never decode to a valid class.
)doc");

}  // namespace keras_ecoc
