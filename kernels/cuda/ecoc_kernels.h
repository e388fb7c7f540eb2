// Contract v2 of the fused ECOC CUDA kernels: one params struct per pass, a
// workspace-size query and a caller-provided workspace.
//
// Free of framework types on purpose (flash-attention's flash.h is the
// model): the TensorFlow GPU OpKernels (kernels/ecoc_ops_gpu.cc) take the
// workspace from OpKernelContext::allocate_temp, the XLA FFI handlers from the
// FFI scratch allocator, and the stand-alone harness (kernels/cuda/harness.cu)
// from cudaMalloc. The kernels themselves never allocate.
//
// Notation (row-major, contiguous, device pointers unless noted):
//   z       [batch, code_length]        network outputs, float32/float16/bfloat16
//   codes   [num_classes, code_length]  code matrix M, float32
//   labels  [batch]                     int32 or int64, already checked to lie
//                                       in [0, num_classes) by the caller
//   u_b      = z_b * rsqrt(max(||z_b||^2, epsilon))
//   logit_bi = scale * (u_b . M_i) - scale/2 ||M_i||^2 - scale/2 ||u_b||^2
//            = -scale/2 ||M_i - u_b||^2
//   p_bi     = exp(logit_bi - lse_b),  lse_b = log sum_i exp(logit_bi)
// No pass touches a [batch, num_classes] buffer; the workspace of every pass
// is O(batch * splits * code_length + num_classes * code_length) bytes at most.
//
// Usage, for each pass P in {Forward, CodesGrad, LabelRank, Nearest}:
//   EcocPParams params{...};              // all fields but the workspace
//   size_t bytes = 0;
//   EcocPWorkspaceSize(params, &bytes);    // for the current device
//   params.workspace = <bytes of device memory, 256-byte aligned>;
//   params.workspace_bytes = bytes;
//   EcocP(params, stream);
// The size depends only on the shape fields, math mode and the current
// device; a workspace larger than asked for is fine. workspace may be null
// when the query returned 0.
#ifndef KERAS_ECOC_KERNELS_CUDA_ECOC_KERNELS_H_
#define KERAS_ECOC_KERNELS_CUDA_ECOC_KERNELS_H_

#include <cstddef>
#include <cstdint>

#include <cuda_runtime.h>

namespace keras_ecoc {
namespace cuda {

enum class FloatType : int { kFloat32 = 0, kFloat16 = 1, kBFloat16 = 2 };
enum class IndexType : int { kInt32 = 0, kInt64 = 1 };

// How the inner products u_b . M_i are computed.
//   kFp32:   register-blocked FP32 FMAs (every architecture). The default of
//            label rank and nearest codeword.
//   k3xTf32: TF32 mma.sync with split operands (hi + lo), close to FP32
//            accuracy; sm_80 and later, kFp32 elsewhere. The default of the
//            loss passes (Forward, CodesGrad). Label rank and nearest
//            codeword run it when asked (LabelRankParams::math), on the
//            register kernel of ecoc_decode_reg.cuh: two keys within an
//            FP32 chain's error of each other may then be ordered
//            differently from kFp32's order; identical codewords still tie.
//   kTf32:   plain TF32 mma.sync (only when the user asks for it); sm_80 and
//            later, kFp32 elsewhere. Never for an order decision: label rank
//            and nearest codeword run a kTf32 request as k3xTf32.
enum class MathMode : int { kFp32 = 0, k3xTf32 = 1, kTf32 = 2 };

// Launch variants of the forward, label-rank and nearest-codeword passes,
// kept side by side so that one device run can time them against each other
// (harness --bench-only --variant all). Bit flags; every variant computes
// the same function (checked against float64 by the harness), only the
// launch shape and the order of work differ.
//   kV2:        16-row batch tiles, ||M_i||^2 from a prep
//               kernel (PrepClasses).
//   kRows64:    64-row batch tiles (4 warps x 16 rows share each staged
//               class tile) where the batch has more than 16 rows, so the
//               codes are staged ceil(B/64) instead of ceil(B/16) times;
//               in the codes gradient, 64 batch rows per staged tile (a
//               64-term sum per class and column instead of 16).
//   kFoldNorms: the forward computes ||M_i||^2 from its staged code tile
//               (the prep kernel's chain, so the same bits) and launches no
//               pass over the codes before the split kernel.
//   kRegSoftmax: the forward's logits stay in the mma accumulator registers
//               (FlashAttention-2 style: online softmax on the fragments,
//               quad shuffles for the row max, 64-class tiles, the expected
//               code accumulated by mma from the p fragments). Applies in
//               the TF32 math modes on sm_80+ with k <= 128; elsewhere the
//               forward runs as kV2 (or kRows64). Rank and nearest in a
//               TF32 math mode (LabelRankParams::math) run their register
//               kernel with it (its keys in the accumulators, 64-class
//               tiles, 4 warps; ecoc_decode_reg.cuh), on sm_80+ with
//               k <= 128, and as kV2 (or kRows64) elsewhere; its other bits
//               (kWarps8, kRows128, kWgmma) have no effect there. Does not
//               combine with kFoldNorms (values 6 and 7 are invalid): with
//               4 warps it folds ||M_i||^2 itself where the batch is one
//               row tile (B <= 16; B <= 64 with kRows64), from the code
//               fragments its logits load (the prep kernel's chain, the
//               same bits).
//   kWarps8:    with kRegSoftmax only (12, 13; 8 to 11 are invalid): the
//               register-softmax forward with 8 warps (256 threads) per
//               block on the same staged tiles (16-row tiles: 8 classes of
//               each 64-class tile per warp; 64-row tiles: 4 x 16 rows x 2 x
//               32 classes), the warps' states merged in the block. Where
//               kRegSoftmax does not apply, the same fallback as without it.
//   kGradMma:   the codes gradient only (16; with kRows64 17; other
//               combinations are invalid): its second product G += W^T U
//               on mma.m16n8k8 (3xTF32 split in 3xTF32 mode, one TF32
//               product in TF32 mode) with G in registers, G -= colsum(W) M
//               per batch tile in FP32. Applies in the TF32 math modes on
//               sm_80+ with k <= 128 (one column stage); elsewhere the
//               gradient runs as kV2 (or kRows64). The forward, rank and
//               nearest passes run kGradMma as kV2 (17 as kRows64).
//               kAuto's codes gradient wherever it applies (H200, 2026-11-27).
//   kGradPersistent: the codes gradient only (32; with kRows64 33; other
//               combinations are invalid): where the batch is one row tile
//               (B <= 16; B <= 64 with kRows64) and one stage holds the
//               padded code row, one wave of persistent blocks, each with
//               the u tile resident, streaming class tiles through
//               double-buffered code tiles and writing s * G directly
//               (ecoc_codes_grad_persistent.cuh); the same bits as the
//               split kernel. Every math mode and architecture; elsewhere
//               the gradient runs as kV2 (or kRows64). The forward, rank
//               and nearest passes run it as kV2 (33 as kRows64).
//               kAuto's codes gradient at B <= 16 where kGradMma does not
//               apply (the FP32 engine, k > 128).
//   kRows128:   with kRows64 | kRegSoftmax | kWarps8 only (77; 64 to 76 are
//               invalid): the register-softmax forward on 128-row batch
//               tiles, 8 row warps x 16 rows x all 64 classes of each code
//               tile, which the block loads through registers and stores
//               split into its TF32 halves once, by rows for the logits and
//               transposed for the expected code, which runs transposed
//               (200 KiB of shared memory at k = 128 in 3xTF32; one block of
//               8 warps per SM). Applies where kRows64RegSoftmaxWarps8's
//               register softmax does, with B > 64, within the device's
//               opt-in shared memory (an H100 at every k <= 128; an A100 in
//               TF32, in 3xTF32 up to k = 48); elsewhere the call runs as
//               13. Not (yet) chosen by kAuto: untimed.
//   kWgmma:     with kRows128RegSoftmaxWarps8 (205) or kRows64GradMma
//               (145) only (every other value from 128 on is invalid): products on
//               Hopper's wgmma (each warpgroup's 64 rows per product, the
//               code tile's TF32 halves read by the tensor cores from shared
//               memory). 205: the 128-row forward with both products on
//               wgmma. 145: the 64-row kGradMma codes gradient with both
//               products on wgmma (the logits m64n32k8, G^T += U^T W
//               m64n32k8; ecoc_codes_grad_wgmma.cuh); its other passes run
//               as 17. Each applies where 77 (17) does, on a device of
//               compute capability 9.0 (H100, H200), in a build whose
//               fatbinary holds sm_90a code (KERAS_ECOC_SM90A_IMAGE: the
//               harness's sm_90 build; not yet the library's); elsewhere
//               the call runs as 77 (17). Not chosen by kAuto: untimed.
//   kAuto:      the default of every params struct: the pass picks one of
//               the variants above from its shape, math mode and the
//               device's compute capability (ResolveVariant below), by a
//               rule fitted to H200 timings of every variant (README.md,
//               "Launch variant choice").
enum class KernelVariant : int {
  kAuto = -1,
  kV2 = 0,
  kRows64 = 1,
  kFoldNorms = 2,
  kRows64FoldNorms = 3,
  kRegSoftmax = 4,
  kRows64RegSoftmax = 5,
  kWarps8 = 8,
  kRegSoftmaxWarps8 = 12,
  kRows64RegSoftmaxWarps8 = 13,
  kGradMma = 16,
  kRows64GradMma = 17,
  kGradPersistent = 32,
  kRows64GradPersistent = 33,
  kRows128 = 64,
  kRows128RegSoftmaxWarps8 = 77,
  kWgmma = 128,
  kRows64GradMmaWgmma = 145,
  kRows128WgmmaRegSoftmaxWarps8 = 205,
};

// The passes, for ResolveVariant.
enum class KernelPass : int { kForward = 0, kCodesGrad = 1, kLabelRank = 2, kNearest = 3 };

// The concrete variant (never kAuto) that kAuto runs for one call of `pass`
// on `batch` x `num_classes` x `code_length`, in the requested `math` mode,
// on a device of compute capability `cc` (10 * major + minor, 90 for an
// H100). A pure host function: the same answer on every call, no device
// query (the passes pass the current device's cc). Shapes past the measured
// ones get the nearest measured cell's choice.
KernelVariant ResolveVariant(KernelPass pass, int64_t batch, int64_t num_classes,
                             int64_t code_length, MathMode math, int cc);

// Every workspace pointer is aligned to this many bytes.
constexpr size_t kWorkspaceAlignment = 256;

// The inputs every pass reads.
struct ProblemArgs {
  const void* z = nullptr;
  FloatType z_type = FloatType::kFloat32;
  const float* codes = nullptr;
  int64_t batch = 0;
  int64_t num_classes = 0;
  int64_t code_length = 0;
  float epsilon = 1e-12f;
};

// Forward pass of the ECOC softmax cross-entropy.
struct ForwardParams {
  ProblemArgs problem;
  const void* labels = nullptr;
  IndexType label_type = IndexType::kInt32;
  // The scale s: *scale_ptr (a device float, read by the kernels on the
  // stream: no host copy, no stream sync) when scale_ptr is non-null, else
  // `scale`. A scale that is not a finite number > 0 makes every output of
  // the pass NaN (the pointer form cannot be checked on the host).
  float scale = 1.0f;
  const float* scale_ptr = nullptr;
  MathMode math = MathMode::k3xTf32;
  KernelVariant variant = KernelVariant::kAuto;
  // Outputs (float32):
  float* loss = nullptr;             // [batch]  lse_b - logit_{b, y_b}
  float* lse = nullptr;              // [batch]  log-sum-exp of the logits
  float* expected_code = nullptr;    // [batch, code_length]  sum_i p_bi M_i
  float* expected_sqnorm = nullptr;  // [batch]  sum_i p_bi ||M_i||^2
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
};

// Gradient of sum_b grad_loss_b * loss_b with respect to the codes:
//   grad_codes_i = scale * sum_b grad_loss_b * (p_bi - [i == y_b]) * (u_b - M_i)
// lse is the forward output; grad_codes [num_classes, code_length] float32 is
// fully overwritten (zeros when batch == 0). Deterministic: no float atomics.
struct CodesGradParams {
  ProblemArgs problem;
  const void* labels = nullptr;
  IndexType label_type = IndexType::kInt32;
  float scale = 1.0f;
  const float* scale_ptr = nullptr;  // as in ForwardParams
  MathMode math = MathMode::k3xTf32;
  // kRows64 (and kRows64RegSoftmax): 64-row batch tiles where the batch has
  // more than 16 rows; kGradMma: the second product on the mma engine;
  // kGradPersistent: persistent blocks where the batch is one row tile
  // (see KernelVariant); the other bits have no effect here.
  KernelVariant variant = KernelVariant::kAuto;
  const float* lse = nullptr;        // [batch]
  const float* grad_loss = nullptr;  // [batch]
  float* grad_codes = nullptr;       // [num_classes, code_length]
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
};

// rank_b = number of classes i with logit_bi > logit_{b, y_b} (0 = correct
// top-1 prediction); num_classes when a logit of the row is not finite.
// The scale is positive and does not change the order, so it is not a field.
struct LabelRankParams {
  ProblemArgs problem;
  const void* labels = nullptr;
  IndexType label_type = IndexType::kInt32;
  // kFp32 (the default: the FP32 engine's sequential chain per key) or
  // k3xTf32 (see MathMode; kTf32 runs as k3xTf32).
  MathMode math = MathMode::kFp32;
  // kRows64: 64-row batch tiles; kRegSoftmax: in the TF32 modes on sm_80+
  // with k <= 128, the register kernel (ecoc_decode_reg.cuh), else the
  // split kernel; the other bits have no effect here.
  KernelVariant variant = KernelVariant::kAuto;
  int32_t* rank = nullptr;  // [batch]
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
};

// index_b = argmax_i logit_bi (the nearest codeword to u_b; ties go to the
// smallest i); -1 when a logit of the row is not finite.
struct NearestParams {
  ProblemArgs problem;
  MathMode math = MathMode::kFp32;               // as in LabelRankParams
  KernelVariant variant = KernelVariant::kAuto;  // as in LabelRankParams
  int64_t* index = nullptr;  // [batch]
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
};

// A diagnostic hook for timing each launch of a pass (harness --bench-only's
// per-launch table): while set, every pass calls observer(launch, stream,
// context) right after it enqueues each of its kernels (or its memset) on
// `stream`, with `launch` a static string naming the step: "forward prep",
// "forward split", "forward combine", "codes-grad prep", "codes-grad split",
// "codes-grad combine", "codes-grad zero", "rank prep", "rank split",
// "rank combine", "nearest prep", "nearest split", "nearest combine". Not
// called for a launch that failed. Null (the default) turns it off; a pass
// then pays one atomic load per launch. Process-wide: set and clear it only
// while no other thread runs a pass.
using LaunchObserver = void (*)(const char* launch, cudaStream_t stream, void* context);
void SetLaunchObserver(LaunchObserver observer, void* context);

// Workspace queries, for the current device. cudaErrorInvalidValue for
// shapes the kernels cannot take (negative sizes, code_length > 2^24, ...).
cudaError_t EcocForwardWorkspaceSize(const ForwardParams& params, size_t* bytes);
cudaError_t EcocCodesGradWorkspaceSize(const CodesGradParams& params, size_t* bytes);
cudaError_t EcocLabelRankWorkspaceSize(const LabelRankParams& params, size_t* bytes);
cudaError_t EcocNearestWorkspaceSize(const NearestParams& params, size_t* bytes);

// The passes, enqueued on `stream`. cudaErrorInvalidValue when a required
// pointer is null, the shapes are invalid, or workspace_bytes is smaller
// than the query's answer.
cudaError_t EcocCrossEntropyForward(const ForwardParams& params, cudaStream_t stream);
cudaError_t EcocCrossEntropyCodesGrad(const CodesGradParams& params, cudaStream_t stream);
cudaError_t EcocLabelRank(const LabelRankParams& params, cudaStream_t stream);
cudaError_t EcocNearestCodeword(const NearestParams& params, cudaStream_t stream);

}  // namespace cuda
}  // namespace keras_ecoc

#endif  // KERAS_ECOC_KERNELS_CUDA_ECOC_KERNELS_H_
