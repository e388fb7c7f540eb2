// Raw-pointer CUDA entry points of the fused ECOC kernels.
//
// Free of TensorFlow types on purpose: the TensorFlow GPU OpKernels
// (kernels/ecoc_ops_gpu.cc) call these, and so does a stand-alone harness
// built with nvcc alone (kernels/cuda/harness.cu), which is how the kernels
// are checked and timed on GPU machines that have no TensorFlow.
//
// Notation (all row-major, contiguous, device pointers unless noted):
//   z       [batch, code_length]        network outputs, float32/float16/bfloat16
//   codes   [num_classes, code_length]  code matrix M, float32
//   labels  [batch]                     int32 or int64, already checked to lie
//                                       in [0, num_classes) by the caller
//   u_b     = z_b * rsqrt(max(||z_b||^2, epsilon))
//   logit_bi = -0.5 * scale * ||M_i - u_b||^2
//   p_bi    = exp(logit_bi - lse_b),  lse_b = log sum_i exp(logit_bi)
// No function allocates or touches a [batch, num_classes] buffer.
#ifndef KERAS_ECOC_KERNELS_CUDA_ECOC_KERNELS_H_
#define KERAS_ECOC_KERNELS_CUDA_ECOC_KERNELS_H_

#include <cstdint>

#include <cuda_runtime.h>

namespace keras_ecoc {
namespace cuda {

enum class FloatType : int { kFloat32 = 0, kFloat16 = 1, kBFloat16 = 2 };
enum class IndexType : int { kInt32 = 0, kInt64 = 1 };

// Forward pass of the ECOC softmax cross-entropy.
// Outputs (float32):
//   loss            [batch]               lse_b - logit_{b, y_b}
//   lse             [batch]               log-sum-exp of the logits
//   expected_code   [batch, code_length]  sum_i p_bi M_i
//   expected_sqnorm [batch]               sum_i p_bi ||M_i||^2
cudaError_t EcocCrossEntropyForward(
    const void* z, FloatType z_type, const float* codes, const void* labels,
    IndexType label_type, float scale, float epsilon, int64_t batch,
    int64_t num_classes, int64_t code_length, float* loss, float* lse,
    float* expected_code, float* expected_sqnorm, cudaStream_t stream);

// Gradient of sum_b grad_loss_b * loss_b with respect to the codes:
//   grad_codes_i = scale * sum_b grad_loss_b * (p_bi - [i == y_b]) * (u_b - M_i)
// lse is the forward output; grad_codes [num_classes, code_length] float32 is
// fully overwritten.
cudaError_t EcocCrossEntropyCodesGrad(
    const void* z, FloatType z_type, const float* codes, const void* labels,
    IndexType label_type, float scale, float epsilon, const float* lse,
    const float* grad_loss, int64_t batch, int64_t num_classes,
    int64_t code_length, float* grad_codes, cudaStream_t stream);

// rank_b = number of classes i with logit_bi > logit_{b, y_b} (0 = correct
// top-1 prediction); int32 [batch]. The scale is positive and does not change
// the order, so it is not an argument.
cudaError_t EcocLabelRank(const void* z, FloatType z_type, const float* codes,
                          const void* labels, IndexType label_type,
                          float epsilon, int64_t batch, int64_t num_classes,
                          int64_t code_length, int32_t* rank,
                          cudaStream_t stream);

// index_b = argmax_i logit_bi (the nearest codeword to u_b; ties go to the
// smallest i); int64 [batch].
cudaError_t EcocNearestCodeword(const void* z, FloatType z_type,
                                const float* codes, float epsilon,
                                int64_t batch, int64_t num_classes,
                                int64_t code_length, int64_t* index,
                                cudaStream_t stream);

}  // namespace cuda
}  // namespace keras_ecoc

#endif  // KERAS_ECOC_KERNELS_CUDA_ECOC_KERNELS_H_
