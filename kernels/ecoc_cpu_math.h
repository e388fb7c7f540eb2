// CPU math core of the fused ECOC ops, free of TensorFlow types.
//
// ecoc_cpu_math.cc is compiled twice into the same library: once for
// baseline x86-64 (SSE2) and once with -mavx2 -mfma. Each copy exports one
// table of entry points (GetKernelsBase / GetKernelsAvx2);
// ecoc_kernels_cpu.cc picks one at run time with __builtin_cpu_supports, so
// the library loads and runs on any x86-64 machine. Everything else in the
// math file has internal linkage and uses no C++ standard library templates,
// so the two copies cannot be merged by the linker (no ODR hazard).
//
// Notation (row-major float32 arrays):
//   z [B, k], codes M [n, k], labels y [B] (int64, already checked to lie in
//   [0, n)), scale s, epsilon eps.
//   u_b = z_b * rsqrt(max(||z_b||^2, eps)),
//   logit_bi = s * (M_i . u_b) - 0.5 s ||M_i||^2 - 0.5 s ||u_b||^2.
// No function allocates anything of size B x n: they stream over the classes
// in tiles with an online log-sum-exp (forward) or over the batch per class
// tile (codes gradient). All return 0 on success and nonzero when a scratch
// allocation failed.
#ifndef KERAS_ECOC_KERNELS_ECOC_CPU_MATH_H_
#define KERAS_ECOC_KERNELS_ECOC_CPU_MATH_H_

#include <cstdint>

namespace keras_ecoc {
namespace cpu {

// Runs work(arg, begin, end) over disjoint ranges covering [0, num_items),
// possibly in parallel; returns when all are done.
typedef void (*WorkFn)(void* arg, int64_t begin, int64_t end);
struct Runtime {
  void (*parallel_for)(void* pool, int64_t num_items, int64_t cost_per_item,
                       WorkFn work, void* arg);
  void* pool;
  int num_threads;
};

struct Kernels {
  const char* isa;  // "avx2" or "base"
  // loss, lse, expected_sqnorm [B]; expected_code [B, k].
  int (*forward)(const Runtime* rt, const float* z, const int64_t* labels,
                 const float* codes, float scale, float epsilon, int64_t batch,
                 int64_t num_classes, int64_t code_length, float* loss,
                 float* lse, float* expected_code, float* expected_sqnorm);
  // grad_codes [n, k] = s * sum_b g_b (p_bi - [i == y_b]) (u_b - M_i).
  int (*codes_grad)(const Runtime* rt, const float* z, const int64_t* labels,
                    const float* codes, float scale, float epsilon,
                    const float* lse, const float* grad_loss, int64_t batch,
                    int64_t num_classes, int64_t code_length,
                    float* grad_codes);
  // rank [B]: classes with logit strictly greater than the label's (n when
  // a logit of the row is not finite: non-finite z or codeword).
  int (*label_rank)(const Runtime* rt, const float* z, const int64_t* labels,
                    const float* codes, float epsilon, int64_t batch,
                    int64_t num_classes, int64_t code_length, int32_t* rank);
  // index [B]: argmax_i logit_bi, ties to the smallest i; -1 when a logit of
  // the row is not finite (non-finite z or codeword): never a valid class.
  int (*nearest)(const Runtime* rt, const float* z, const float* codes,
                 float epsilon, int64_t batch, int64_t num_classes,
                 int64_t code_length, int64_t* index);
};

const Kernels* GetKernelsBase();
const Kernels* GetKernelsAvx2();

}  // namespace cpu
}  // namespace keras_ecoc

#endif  // KERAS_ECOC_KERNELS_ECOC_CPU_MATH_H_
