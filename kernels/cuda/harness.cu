// Stand-alone check and benchmark of the ECOC CUDA kernels (no TensorFlow).
//
//   nvcc -O2 -std=c++17 --expt-relaxed-constexpr
//       -gencode=arch=compute_80,code=sm_80
//       -gencode=arch=compute_90,code=[sm_90,compute_90]
//       -Ikernels -x cu kernels/cuda/harness.cu kernels/cuda/ecoc_kernels.cu.cc
//       -o build/ecoc_harness
//   build/ecoc_harness [--check-only | --bench-only | --grid | --small |
//                       --smem-limit | --profile] [--quick] [--math fp32|3xtf32|tf32]
//                      [--variant NAME|all] [--auto-table] [--fail-fast]
//                      [--only SECTION[,SECTION...]]
// (NAME: a launch variant of kVariants below, auto among them; the usage
// text lists them)
// (add -Xcompiler -fopenmp to spread the host reference of --grid over cores)
// (one command; "-x cu" is needed because nvcc would hand a .cc file to the
// host compiler.)
//
// Exit codes: 0 all checks passed, 1 a check or a CUDA call failed, 2 no
// CUDA device (so CI without a GPU can still build it and run this path),
// 3 bad command line.
//
// Checks compare every output of the four entry points against a float64 CPU
// reference computed from the same inputs (fp16/bf16 z are rounded on the
// host first, so the reference sees exactly the values the kernels load), in
// each math mode of the loss passes, and print the largest error per mode.
// The kernels run on contract v2: each call's workspace comes from one
// cudaMalloc'd buffer sized by the pass's query (see Forward() below).
// Also runs on the CPU under the CUDA emulator (kernels/cuda/emu/run.py).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <tuple>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "ecoc_kernels.h"
#include "ecoc_tf32.cuh"

namespace {

using keras_ecoc::cuda::FloatType;
using keras_ecoc::cuda::IndexType;

constexpr float kEpsilon = 1e-12f;

// ---------------------------------------------------------------------------
// Utilities.

#define CUDA_OK(expr)                                                       \
  do {                                                                      \
    const cudaError_t err_ = (expr);                                        \
    if (err_ != cudaSuccess) {                                              \
      std::fprintf(stderr, "CUDA error %s at %s:%d: %s\n",                  \
                   cudaGetErrorName(err_), __FILE__, __LINE__,              \
                   cudaGetErrorString(err_));                               \
      std::exit(1);                                                         \
    }                                                                       \
  } while (0)

// Deterministic generator (splitmix64), independent of the C++ library.
struct Rng {
  uint64_t state;
  explicit Rng(uint64_t seed) : state(seed) {}
  uint64_t Next() {
    uint64_t x = (state += 0x9E3779B97F4A7C15ull);
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
  }
  double Uniform() { return (Next() >> 11) * (1.0 / 9007199254740992.0); }
  double Normal() {
    const double u1 = std::max(Uniform(), 1e-300), u2 = Uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }
  int64_t Below(int64_t n) { return static_cast<int64_t>(Next() % n); }
};

template <typename T>
struct DeviceBuffer {
  T* ptr = nullptr;
  size_t count = 0;
  explicit DeviceBuffer(size_t n) : count(n) {
    if (n > 0) CUDA_OK(cudaMalloc(&ptr, n * sizeof(T)));
  }
  ~DeviceBuffer() {
    if (ptr != nullptr) cudaFree(ptr);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void Upload(const std::vector<T>& host) {
    if (count > 0) {
      CUDA_OK(cudaMemcpy(ptr, host.data(), count * sizeof(T),
                         cudaMemcpyHostToDevice));
    }
  }
  std::vector<T> Download() const {
    std::vector<T> host(count);
    if (count > 0) {
      CUDA_OK(cudaMemcpy(host.data(), ptr, count * sizeof(T),
                         cudaMemcpyDeviceToHost));
    }
    return host;
  }
  void Fill(unsigned char byte) {
    if (count > 0) CUDA_OK(cudaMemset(ptr, byte, count * sizeof(T)));
  }
};

// ---------------------------------------------------------------------------
// Contract v2 behind the harness's calls: each wrapper fills the params
// struct, asks the pass for its workspace size and hands it a slice of one
// cudaMalloc'd buffer that only grows (outside the kernels: a check that
// measures free device memory runs every call once before measuring).

using keras_ecoc::cuda::KernelVariant;
using keras_ecoc::cuda::MathMode;

MathMode g_math = MathMode::k3xTf32;  // loss passes; rank / nearest are FP32
// Launch variant of the forward, rank and nearest passes (--variant).
KernelVariant g_variant = KernelVariant::kV2;
// When non-null, the loss passes get the scale as this device float
// (contract field scale_ptr) instead of the host value.
const float* g_scale_ptr = nullptr;

struct VariantName {
  KernelVariant variant;
  const char* name;
};
constexpr VariantName kVariants[] = {
    {KernelVariant::kV2, "v2"},
    {KernelVariant::kRows64, "rows64"},
    {KernelVariant::kFoldNorms, "foldnorms"},
    {KernelVariant::kRows64FoldNorms, "rows64+foldnorms"},
    {KernelVariant::kRegSoftmax, "regsoftmax"},
    {KernelVariant::kRows64RegSoftmax, "rows64+regsoftmax"},
    {KernelVariant::kRegSoftmaxWarps8, "regsoftmax+warps8"},
    {KernelVariant::kRows64RegSoftmaxWarps8, "rows64+regsoftmax+warps8"},
    {KernelVariant::kGradMma, "gradmma"},
    {KernelVariant::kRows64GradMma, "rows64+gradmma"},
    {KernelVariant::kGradPersistent, "gradpersistent"},
    {KernelVariant::kRows64GradPersistent, "rows64+gradpersistent"},
    // The default of the params structs: each pass resolves it
    // (keras_ecoc::cuda::ResolveVariant) from its shape, math mode and the
    // device's compute capability.
    {KernelVariant::kAuto, "auto"},
    // Last, so that the checks of RunVariants before it keep their seeds.
    {KernelVariant::kRows128RegSoftmaxWarps8, "rows128+regsoftmax+warps8"},
    {KernelVariant::kRows128WgmmaRegSoftmaxWarps8, "rows128+regsoftmax+warps8+wgmma"},
    {KernelVariant::kRows64GradMmaWgmma, "rows64+gradmma+wgmma"},
};

// The names of a table's entries in order (kVariants, kCheckSections),
// joined by `sep`, for the --variant and --only errors: they come from the
// table, as PrintUsage's lists do, so that a new entry is named once.
template <typename Entry, size_t N>
std::string TableNames(const Entry (&table)[N], const char* sep) {
  std::string out;
  for (const Entry& e : table) {
    if (!out.empty()) out += sep;
    out += e.name;
  }
  return out;
}

const char* VariantString(KernelVariant v) {
  for (const VariantName& e : kVariants) {
    if (e.variant == v) return e.name;
  }
  return "?";
}

const char* MathName(MathMode m) {
  switch (m) {
    case MathMode::kFp32: return "fp32";
    case MathMode::k3xTf32: return "3xtf32";
    case MathMode::kTf32: return "tf32";
  }
  return "?";
}

// What kAuto runs for the forward and the codes gradient of one call on a
// device of compute capability cc: "forward rows64+regsoftmax, codes grad
// rows64".
std::string AutoChoice(MathMode m, int64_t B, int64_t n, int64_t k, int cc) {
  using keras_ecoc::cuda::KernelPass;
  using keras_ecoc::cuda::ResolveVariant;
  return std::string("forward ") +
         VariantString(ResolveVariant(KernelPass::kForward, B, n, k, m, cc)) +
         ", codes grad " + VariantString(ResolveVariant(KernelPass::kCodesGrad, B, n, k, m, cc));
}

int DeviceCc() {
  int device = 0, major = 0, minor = 0;
  CUDA_OK(cudaGetDevice(&device));
  CUDA_OK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  CUDA_OK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  return 10 * major + minor;
}

struct Workspace {
  void* ptr = nullptr;
  size_t bytes = 0;
  cudaError_t Ensure(size_t want) {
    if (want <= bytes) return cudaSuccess;
    if (ptr != nullptr) {
      const cudaError_t err = cudaFree(ptr);
      if (err != cudaSuccess) return err;
      ptr = nullptr;
      bytes = 0;
    }
    const cudaError_t err = cudaMalloc(&ptr, want);  // 256-byte aligned
    if (err == cudaSuccess) bytes = want;
    return err;
  }
};
Workspace g_ws;
size_t g_ws_largest = 0;  // the largest size any query asked for
size_t g_ws_cell = 0;     // the same, since the timing loop last reset it
size_t g_ws_last = 0;     // the size the last query asked for

keras_ecoc::cuda::ProblemArgs Problem(const void* z, FloatType z_type, const float* codes,
                                      float epsilon, int64_t B, int64_t n, int64_t k) {
  keras_ecoc::cuda::ProblemArgs pr;
  pr.z = z;
  pr.z_type = z_type;
  pr.codes = codes;
  pr.batch = B;
  pr.num_classes = n;
  pr.code_length = k;
  pr.epsilon = epsilon;
  return pr;
}

template <typename Params, typename SizeFn, typename RunFn>
cudaError_t RunWithWorkspace(Params* params, SizeFn size_fn, RunFn run_fn,
                             cudaStream_t stream) {
  size_t bytes = 0;
  cudaError_t err = size_fn(*params, &bytes);
  if (err != cudaSuccess) return err;
  g_ws_largest = std::max(g_ws_largest, bytes);
  g_ws_cell = std::max(g_ws_cell, bytes);
  g_ws_last = bytes;
  if ((err = g_ws.Ensure(bytes)) != cudaSuccess) return err;
  params->workspace = bytes > 0 ? g_ws.ptr : nullptr;
  params->workspace_bytes = bytes > 0 ? g_ws.bytes : 0;
  return run_fn(*params, stream);
}

cudaError_t Forward(const void* z, FloatType z_type, const float* codes, const void* labels,
                    IndexType label_type, float scale, float epsilon, int64_t B, int64_t n,
                    int64_t k, float* loss, float* lse, float* expected_code,
                    float* expected_sqnorm, cudaStream_t stream) {
  keras_ecoc::cuda::ForwardParams p;
  p.problem = Problem(z, z_type, codes, epsilon, B, n, k);
  p.labels = labels;
  p.label_type = label_type;
  p.scale = scale;
  p.scale_ptr = g_scale_ptr;
  p.math = g_math;
  p.variant = g_variant;
  p.loss = loss;
  p.lse = lse;
  p.expected_code = expected_code;
  p.expected_sqnorm = expected_sqnorm;
  return RunWithWorkspace(&p, keras_ecoc::cuda::EcocForwardWorkspaceSize,
                          keras_ecoc::cuda::EcocCrossEntropyForward, stream);
}

cudaError_t CodesGrad(const void* z, FloatType z_type, const float* codes, const void* labels,
                      IndexType label_type, float scale, float epsilon, const float* lse,
                      const float* grad_loss, int64_t B, int64_t n, int64_t k,
                      float* grad_codes, cudaStream_t stream) {
  keras_ecoc::cuda::CodesGradParams p;
  p.problem = Problem(z, z_type, codes, epsilon, B, n, k);
  p.labels = labels;
  p.label_type = label_type;
  p.scale = scale;
  p.scale_ptr = g_scale_ptr;
  p.math = g_math;
  p.variant = g_variant;
  p.lse = lse;
  p.grad_loss = grad_loss;
  p.grad_codes = grad_codes;
  return RunWithWorkspace(&p, keras_ecoc::cuda::EcocCodesGradWorkspaceSize,
                          keras_ecoc::cuda::EcocCrossEntropyCodesGrad, stream);
}

cudaError_t LabelRank(const void* z, FloatType z_type, const float* codes, const void* labels,
                      IndexType label_type, float epsilon, int64_t B, int64_t n, int64_t k,
                      int32_t* rank, cudaStream_t stream) {
  keras_ecoc::cuda::LabelRankParams p;
  p.problem = Problem(z, z_type, codes, epsilon, B, n, k);
  p.labels = labels;
  p.label_type = label_type;
  p.math = g_math;
  p.variant = g_variant;
  p.rank = rank;
  return RunWithWorkspace(&p, keras_ecoc::cuda::EcocLabelRankWorkspaceSize,
                          keras_ecoc::cuda::EcocLabelRank, stream);
}

cudaError_t Nearest(const void* z, FloatType z_type, const float* codes, float epsilon,
                    int64_t B, int64_t n, int64_t k, int64_t* index, cudaStream_t stream) {
  keras_ecoc::cuda::NearestParams p;
  p.problem = Problem(z, z_type, codes, epsilon, B, n, k);
  p.math = g_math;
  p.variant = g_variant;
  p.index = index;
  return RunWithWorkspace(&p, keras_ecoc::cuda::EcocNearestWorkspaceSize,
                          keras_ecoc::cuda::EcocNearestCodeword, stream);
}

const char* TypeName(FloatType t) {
  switch (t) {
    case FloatType::kFloat32: return "float32";
    case FloatType::kFloat16: return "float16";
    case FloatType::kBFloat16: return "bfloat16";
  }
  return "?";
}

// z in the requested storage type, plus the float values the kernel will see.
struct ZData {
  std::vector<float> as_float;  // exactly representable in the storage type
  std::vector<unsigned char> bytes;
};

ZData MakeZ(const std::vector<float>& values, FloatType type) {
  ZData out;
  out.as_float.resize(values.size());
  switch (type) {
    case FloatType::kFloat32:
      out.as_float = values;
      out.bytes.resize(values.size() * sizeof(float));
      if (!values.empty()) std::memcpy(out.bytes.data(), values.data(), out.bytes.size());
      break;
    case FloatType::kFloat16: {
      std::vector<__half> h(values.size());
      for (size_t i = 0; i < values.size(); ++i) {
        h[i] = __float2half(values[i]);
        out.as_float[i] = __half2float(h[i]);
      }
      out.bytes.resize(h.size() * sizeof(__half));
      if (!h.empty()) std::memcpy(out.bytes.data(), h.data(), out.bytes.size());
      break;
    }
    case FloatType::kBFloat16: {
      std::vector<__nv_bfloat16> h(values.size());
      for (size_t i = 0; i < values.size(); ++i) {
        h[i] = __float2bfloat16(values[i]);
        out.as_float[i] = __bfloat162float(h[i]);
      }
      out.bytes.resize(h.size() * sizeof(__nv_bfloat16));
      if (!h.empty()) std::memcpy(out.bytes.data(), h.data(), out.bytes.size());
      break;
    }
  }
  return out;
}

// ---------------------------------------------------------------------------
// float64 reference.

struct Reference {
  std::vector<double> loss, lse, expected_code, expected_sqnorm, grad_codes;
  std::vector<std::vector<double>> dist;  // [B][n] squared distances
};

Reference ComputeReference(const std::vector<float>& z, const std::vector<float>& codes,
                           const std::vector<int64_t>& labels,
                           const std::vector<float>& grad_loss, double scale,
                           int64_t B, int64_t n, int64_t k) {
  Reference ref;
  ref.loss.assign(B, 0.0);
  ref.lse.assign(B, 0.0);
  ref.expected_code.assign(B * k, 0.0);
  ref.expected_sqnorm.assign(B, 0.0);
  ref.grad_codes.assign(n * k, 0.0);
  ref.dist.assign(B, std::vector<double>(n, 0.0));
  std::vector<double> msq(n, 0.0);
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < k; ++j) msq[i] += double(codes[i * k + j]) * codes[i * k + j];
  }
  std::vector<double> u(k), logit(n);
  bool any_nan_row = false;
  for (int64_t b = 0; b < B; ++b) {
    double ss = 0.0;
    for (int64_t j = 0; j < k; ++j) ss += double(z[b * k + j]) * z[b * k + j];
    const double inv = 1.0 / std::sqrt(std::max(ss, double(kEpsilon)));
    for (int64_t j = 0; j < k; ++j) u[j] = z[b * k + j] * inv;
    double mx = -std::numeric_limits<double>::infinity();
    bool has_nan = false;
    for (int64_t i = 0; i < n; ++i) {
      double d = 0.0;
      for (int64_t j = 0; j < k; ++j) {
        const double diff = codes[i * k + j] - u[j];
        d += diff * diff;
      }
      ref.dist[b][i] = d;
      logit[i] = -0.5 * scale * d;
      if (std::isnan(logit[i])) has_nan = true;
      mx = std::max(mx, logit[i]);
    }
    if (has_nan) {
      const double nan = std::numeric_limits<double>::quiet_NaN();
      ref.loss[b] = ref.lse[b] = ref.expected_sqnorm[b] = nan;
      for (int64_t j = 0; j < k; ++j) ref.expected_code[b * k + j] = nan;
      any_nan_row = true;
      continue;
    }
    double sum = 0.0;
    for (int64_t i = 0; i < n; ++i) sum += std::exp(logit[i] - mx);
    const double lse = mx + std::log(sum);
    ref.lse[b] = lse;
    ref.loss[b] = lse - logit[labels[b]];
    for (int64_t i = 0; i < n; ++i) {
      const double p = std::exp(logit[i] - lse);
      ref.expected_sqnorm[b] += p * msq[i];
      for (int64_t j = 0; j < k; ++j) ref.expected_code[b * k + j] += p * codes[i * k + j];
      const double w = grad_loss[b] * (p - (labels[b] == i ? 1.0 : 0.0));
      for (int64_t j = 0; j < k; ++j) {
        ref.grad_codes[i * k + j] += scale * w * (u[j] - codes[i * k + j]);
      }
    }
  }
  // A NaN row has NaN p_bi for every class, and g_b * NaN is NaN even for
  // g_b = 0: the whole codes gradient is NaN.
  if (any_nan_row) {
    std::fill(ref.grad_codes.begin(), ref.grad_codes.end(),
              std::numeric_limits<double>::quiet_NaN());
  }
  return ref;
}

// ---------------------------------------------------------------------------
// Checks.

int g_failures = 0;
int g_checks = 0;

// Largest relative error per (math mode, output) over every check, printed
// at the end: the measured error of each precision mode against float64.
struct ModeError {
  std::string mode, output;
  double rel = 0.0;
};
std::vector<ModeError> g_mode_errors;

void RecordError(const std::string& name, double rel) {
  const size_t space = name.rfind(' ');
  const std::string output = space == std::string::npos ? name : name.substr(space + 1);
  // Keyed by math mode and launch variant ("3xtf32", "tf32+regsoftmax").
  std::string mode = MathName(g_math);
  if (g_variant != KernelVariant::kV2) mode += std::string("+") + VariantString(g_variant);
  for (ModeError& e : g_mode_errors) {
    if (e.mode == mode && e.output == output) {
      e.rel = std::max(e.rel, rel);
      return;
    }
  }
  g_mode_errors.push_back({mode, output, rel});
}

void PrintModeErrors() {
  if (g_mode_errors.empty()) return;
  std::printf("\n## Largest error against float64 per math mode (max abs err / max(1, max |ref|))\n\n");
  std::printf("| math mode | output | max rel err |\n|---|---|---:|\n");
  for (const ModeError& e : g_mode_errors) {
    std::printf("| %s | %s | %.3e |\n", e.mode.c_str(), e.output.c_str(), e.rel);
  }
}

// Tolerance of the loss passes' outputs: FP32 and 3xTF32 are held to the
// FP32 bound; plain TF32 (10-bit mantissa products) to a looser one.
double LossTol() { return g_math == MathMode::kTf32 ? 2e-2 : 2e-4; }

// --fail-fast: stop at the first failed check (exit 1). The emulator's
// barrier-deletion test only needs to see that a check fails.
bool g_fail_fast = false;

// --only SECTION[,SECTION...]: run only these sections of --check-only (the
// names of kCheckSections below). A mutant of the barrier-deletion test runs
// the section that exercises its barrier instead of the whole quick set: a
// failing subset fails the set. Empty: every section.
std::vector<std::string> g_only_sections;

void Report(const std::string& name, bool pass, const std::string& detail) {
  ++g_checks;
  if (!pass) ++g_failures;
  std::printf("%s %s: %s\n", pass ? "PASS" : "FAIL", name.c_str(), detail.c_str());
  if (!pass && g_fail_fast) {
    std::printf("\n%lld checks, %lld failed (--fail-fast: stopped at the first failure)\nFAILED\n",
                static_cast<long long>(g_checks), static_cast<long long>(g_failures));
    std::fflush(stdout);
    std::exit(1);
  }
}

// $ECOC_HARNESS_DIGEST: one line per float check, "<check name>\t<FNV-1a
// 64 of the output's bits>\t<elements>", every NaN counted as one pattern
// (its payload is not part of the contract). Two builds whose digest files
// are equal produced the same bits in every check: how a change that must
// not move a result (a faster schedule of the same operations) is shown to
// keep them, e.g. by running the emulator on both source trees
// (kernels/cuda/README.md, "Bit-identical rewrites").
void DigestOutput(const std::string& name, const std::vector<float>& got) {
  static FILE* file = [] {
    const char* path = std::getenv("ECOC_HARNESS_DIGEST");
    return path != nullptr && *path ? std::fopen(path, "w") : nullptr;
  }();
  if (file == nullptr) return;
  uint64_t h = 14695981039346656037ull;
  for (const float v : got) {
    uint32_t bits = 0x7fc00000u;
    if (!std::isnan(v)) std::memcpy(&bits, &v, sizeof(bits));
    for (int i = 0; i < 4; ++i) {
      h ^= (bits >> (8 * i)) & 0xffu;
      h *= 1099511628211ull;
    }
  }
  std::fprintf(file, "%s\t%016llx\t%zu\n", name.c_str(), static_cast<unsigned long long>(h),
               got.size());
  std::fflush(file);
}

// Max abs error, normalized by max(1, max |reference|) for the pass test:
// the outputs are sums of many terms, so relative error per element is
// meaningless where terms cancel.  NaN must match NaN exactly.
void CompareFloat(const std::string& name, const std::vector<float>& got,
                  const std::vector<double>& want, double tol) {
  DigestOutput(name, got);
  double max_abs = 0.0, max_ref = 0.0;
  int64_t nan_mismatch = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const bool want_nan = std::isnan(want[i]);
    const bool got_nan = std::isnan(got[i]);
    if (want_nan || got_nan) {
      if (want_nan != got_nan) ++nan_mismatch;
      continue;
    }
    if (std::isinf(got[i])) {
      ++nan_mismatch;
      continue;
    }
    max_abs = std::max(max_abs, std::fabs(double(got[i]) - want[i]));
    max_ref = std::max(max_ref, std::fabs(want[i]));
  }
  const double rel = max_abs / std::max(1.0, max_ref);
  RecordError(name, rel);
  char buf[256];
  std::snprintf(buf, sizeof(buf),
                "max abs err %.3e, max rel err %.3e (tol %.1e), %lld NaN/inf mismatches",
                max_abs, rel, tol, static_cast<long long>(nan_mismatch));
  Report(name, rel <= tol && nan_mismatch == 0, buf);
}

struct Case {
  std::string name;
  int64_t B, n, k;
  float scale;
  bool nan_row = false;   // row 1 of z gets a NaN
  bool zero_row = false;  // row 2 of z is all zeros (norm below epsilon)
  bool tie = false;       // codes row 7 duplicates row 3, z row 0 = 2 * M_3
  // Unit-norm codes and every z row within ~1e-3 of its label's codeword
  // (late training: u_b ~ M_{y_b}, p_{b, y_b} ~ 1 at a large scale), where
  // the codes gradient's terms w (u - M) cancel.
  bool near = false;
};

void RunCase(const Case& c, FloatType z_type, IndexType label_type, uint64_t seed) {
  const int64_t B = c.B, n = c.n, k = c.k;
  Rng rng(seed);
  std::vector<float> z_values(B * k), codes(n * k), grad_loss(B);
  std::vector<int64_t> labels(B);
  for (auto& v : codes) v = static_cast<float>(rng.Normal() / std::sqrt(double(std::max<int64_t>(k, 1))));
  for (auto& v : z_values) v = static_cast<float>(rng.Normal());
  for (auto& y : labels) y = rng.Below(n);
  for (auto& g : grad_loss) g = static_cast<float>(2.0 * rng.Uniform() - 1.0);
  // Codeword i scaled to unit norm (a zero codeword stays zero).
  auto unit_norm = [&codes, k](int64_t i) {
    double sq = 0.0;
    for (int64_t j = 0; j < k; ++j) sq += double(codes[i * k + j]) * codes[i * k + j];
    const double inv = sq > 0.0 ? 1.0 / std::sqrt(sq) : 0.0;
    for (int64_t j = 0; j < k; ++j) codes[i * k + j] = static_cast<float>(codes[i * k + j] * inv);
  };
  if (c.near && k > 0) {
    for (int64_t i = 0; i < n; ++i) unit_norm(i);
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t j = 0; j < k; ++j) {
        z_values[b * k + j] = static_cast<float>(codes[labels[b] * k + j] +
                                                 1e-3 / std::sqrt(double(k)) * rng.Normal());
      }
    }
  }
  if (c.tie && n > 7 && B > 0) {
    // Codeword 3 at unit norm, so that u (row 0, along it) sits on it and no
    // other codeword can be nearer: with the 1/sqrt(k) Gaussian codes a
    // longer or shorter one often was at small k and large n (k = 8,
    // n = 300,000 on the H100 of 2026-11-27: 150 classes outranked it).
    unit_norm(3);
    for (int64_t j = 0; j < k; ++j) codes[7 * k + j] = codes[3 * k + j];
    for (int64_t j = 0; j < k; ++j) z_values[j] = 2.0f * codes[3 * k + j];
    labels[0] = 7;
  }
  if (c.zero_row && B > 2) {
    for (int64_t j = 0; j < k; ++j) z_values[2 * k + j] = 0.0f;
  }
  if (c.nan_row && B > 1 && k > 0) z_values[1 * k + k / 2] = std::nanf("");

  const ZData zd = MakeZ(z_values, z_type);
  Reference ref = ComputeReference(zd.as_float, codes, labels, grad_loss,
                                   c.scale, B, n, k);

  DeviceBuffer<unsigned char> d_z(zd.bytes.size());
  DeviceBuffer<float> d_codes(n * k), d_loss(B), d_lse(B), d_ecode(B * k),
      d_esq(B), d_grad_loss(B), d_grad(n * k);
  DeviceBuffer<int32_t> d_rank(B), d_labels32(B);
  DeviceBuffer<int64_t> d_index(B), d_labels64(B);
  d_z.Upload(zd.bytes);
  d_codes.Upload(codes);
  d_grad_loss.Upload(grad_loss);
  std::vector<int32_t> labels32(labels.begin(), labels.end());
  d_labels32.Upload(labels32);
  d_labels64.Upload(labels);
  const void* d_lab = label_type == IndexType::kInt32
                          ? static_cast<const void*>(d_labels32.ptr)
                          : static_cast<const void*>(d_labels64.ptr);
  // Poison the outputs so that anything left unwritten shows up.
  for (auto* buf : {&d_loss, &d_lse, &d_ecode, &d_esq, &d_grad}) buf->Fill(0xFF);
  d_rank.Fill(0xFF);
  d_index.Fill(0xFF);

  using namespace keras_ecoc::cuda;
  CUDA_OK(Forward(d_z.ptr, z_type, d_codes.ptr, d_lab, label_type,
                                  c.scale, kEpsilon, B, n, k, d_loss.ptr,
                                  d_lse.ptr, d_ecode.ptr, d_esq.ptr, 0));
  CUDA_OK(CodesGrad(d_z.ptr, z_type, d_codes.ptr, d_lab,
                                    label_type, c.scale, kEpsilon, d_lse.ptr,
                                    d_grad_loss.ptr, B, n, k, d_grad.ptr, 0));
  CUDA_OK(LabelRank(d_z.ptr, z_type, d_codes.ptr, d_lab, label_type,
                        kEpsilon, B, n, k, d_rank.ptr, 0));
  CUDA_OK(Nearest(d_z.ptr, z_type, d_codes.ptr, kEpsilon, B, n, k,
                              d_index.ptr, 0));
  CUDA_OK(cudaDeviceSynchronize());

  char prefix[200];
  std::snprintf(prefix, sizeof(prefix),
                "%s [math=%s%s%s z=%s labels=%s B=%lld n=%lld k=%lld s=%g]", c.name.c_str(),
                MathName(g_math), g_variant == KernelVariant::kV2 ? "" : " variant=",
                g_variant == KernelVariant::kV2 ? "" : VariantString(g_variant),
                TypeName(z_type),
                label_type == IndexType::kInt32 ? "int32" : "int64",
                static_cast<long long>(B), static_cast<long long>(n),
                static_cast<long long>(k), c.scale);
  const std::string p(prefix);
  const double tol = LossTol();
  CompareFloat(p + " loss", d_loss.Download(), ref.loss, tol);
  CompareFloat(p + " lse", d_lse.Download(), ref.lse, tol);
  CompareFloat(p + " expected_code", d_ecode.Download(), ref.expected_code, tol);
  CompareFloat(p + " expected_sqnorm", d_esq.Download(), ref.expected_sqnorm, tol);
  const std::vector<float> grad = d_grad.Download();
  CompareFloat(p + " grad_codes", grad, ref.grad_codes, tol);
  if (c.near) {
    // The gradient is small here (p ~ 1): the checks' error, relative to
    // max(1, max |ref|), says little; this one is relative to max |ref|.
    double max_abs = 0.0, max_ref = 0.0;
    for (size_t i = 0; i < grad.size(); ++i) {
      max_abs = std::max(max_abs, std::fabs(double(grad[i]) - ref.grad_codes[i]));
      max_ref = std::max(max_ref, std::fabs(ref.grad_codes[i]));
    }
    std::printf("NEAR %s grad_codes: max |ref| %.3e, max abs err %.3e, err / max |ref| %.3e\n",
                p.c_str(), max_ref, max_abs, max_ref > 0.0 ? max_abs / max_ref : 0.0);
  }

  // rank / index: exact where the float64 ordering is unambiguous; classes
  // whose distance is within float32 rounding of the reference boundary may
  // go either way.
  const std::vector<int32_t> rank = d_rank.Download();
  const std::vector<int64_t> index = d_index.Download();
  int64_t rank_bad = 0, index_bad = 0;
  for (int64_t b = 0; b < B; ++b) {
    const std::vector<double>& d = ref.dist[b];
    const bool nan_row = std::isnan(ref.loss[b]);
    if (nan_row) {
      // Same as the CPU kernel: a NaN row ranks last (rank = n) and has no
      // nearest codeword (-1: never a valid class).
      if (rank[b] != n) ++rank_bad;
      if (index[b] != -1) ++index_bad;
      continue;
    }
    const double dy = d[labels[b]];
    const double slack = 1e-5 * (1.0 + dy);
    int64_t lo = 0, hi = 0;
    for (int64_t i = 0; i < n; ++i) {
      if (i == labels[b]) continue;
      if (d[i] < dy - slack) ++lo;
      if (d[i] < dy + slack) ++hi;
    }
    if (rank[b] < lo || rank[b] > hi) ++rank_bad;
    const double dmin = *std::min_element(d.begin(), d.end());
    const int64_t g = index[b];
    if (g < 0 || g >= n || d[g] > dmin + 1e-5 * (1.0 + dmin)) ++index_bad;
  }
  char buf[160];
  std::snprintf(buf, sizeof(buf), "%lld of %lld rows outside the reference range",
                static_cast<long long>(rank_bad), static_cast<long long>(B));
  Report(p + " rank", rank_bad == 0, buf);
  std::snprintf(buf, sizeof(buf), "%lld of %lld rows not a nearest codeword",
                static_cast<long long>(index_bad), static_cast<long long>(B));
  Report(p + " index", index_bad == 0, buf);
  if (c.tie && n > 7 && B > 0) {
    // Classes 3 and 7 are bit-identical: the tie must go to 3, and the label
    // 7 must not be outranked by its twin.
    std::snprintf(buf, sizeof(buf), "index[0] = %lld (want 3), rank[0] = %d (want 0)",
                  static_cast<long long>(index[0]), rank[0]);
    Report(p + " tie-break", index[0] == 3 && rank[0] == 0, buf);
  }
}

// SplitTf32Finite (ecoc_tf32.cuh), the split the kernels use for u and the
// codes, against the card's cvt.rna.tf32 (SplitTf32) on every finite
// float32 pattern: out = {finite patterns compared, mismatches, first
// mismatching pattern}. built = 0 where the device code is not compiled
// for sm_80+ (the emulator compiles the harness as host code; its
// self-test checks the split against an independent reference instead).
__global__ void Tf32SplitCheckKernel(unsigned long long* out, int* built) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  using keras_ecoc::cuda::detail::SplitTf32;
  using keras_ecoc::cuda::detail::SplitTf32Finite;
  if (blockIdx.x == 0 && threadIdx.x == 0) *built = 1;
  unsigned long long compared = 0, mismatches = 0;
  const uint64_t step = uint64_t{gridDim.x} * blockDim.x;
  for (uint64_t i = uint64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < (uint64_t{1} << 32);
       i += step) {
    const float x = __uint_as_float(static_cast<uint32_t>(i));
    if (!isfinite(x)) continue;
    uint32_t big, small, fbig, fsmall;
    SplitTf32(x, &big, &small);
    SplitTf32Finite(x, &fbig, &fsmall);
    ++compared;
    if (big != fbig || small != fsmall) {
      ++mismatches;
      atomicMin(&out[2], static_cast<unsigned long long>(i));
    }
  }
  atomicAdd(&out[0], compared);
  atomicAdd(&out[1], mismatches);
#else
  if (blockIdx.x == 0 && threadIdx.x == 0) *built = 0;
  (void)out;
#endif
}

void RunTf32Split(int sms) {
  DeviceBuffer<unsigned long long> d_out(3);
  DeviceBuffer<int> d_built(1);
  d_built.Fill(0);
  const std::vector<unsigned long long> init = {0, 0, ~0ull};
  d_out.Upload(init);
  Tf32SplitCheckKernel<<<sms * 8, 256>>>(d_out.ptr, d_built.ptr);
  CUDA_OK(cudaGetLastError());
  CUDA_OK(cudaDeviceSynchronize());
  const std::vector<unsigned long long> out = d_out.Download();
  if (d_built.Download()[0] == 0) {
    std::printf("SKIP tf32 split [every finite float32]: device code not built for sm_80+\n");
    return;
  }
  char detail[160];
  int len = std::snprintf(detail, sizeof(detail), "%llu finite patterns, %llu differ from cvt.rna.tf32",
                          out[0], out[1]);
  if (out[1] > 0 && len > 0 && len < static_cast<int>(sizeof(detail))) {
    std::snprintf(detail + len, sizeof(detail) - len, ", first 0x%08llx", out[2]);
  }
  // 2^32 patterns less the 2 x 2^23 with an all-ones exponent.
  Report("tf32 split [every finite float32]", out[1] == 0 && out[0] == 4278190080ull, detail);
}

// B = 0: every entry point must succeed, and the codes gradient must still
// be overwritten with zeros.
void RunEmptyBatch() {
  using namespace keras_ecoc::cuda;
  const int64_t n = 10, k = 8;
  DeviceBuffer<float> d_codes(n * k), d_grad(n * k);
  d_codes.Fill(0);
  d_grad.Fill(0xFF);
  CUDA_OK(Forward(nullptr, FloatType::kFloat32, d_codes.ptr, nullptr,
                                  IndexType::kInt32, 5.0f, kEpsilon, 0, n, k,
                                  nullptr, nullptr, nullptr, nullptr, 0));
  CUDA_OK(CodesGrad(nullptr, FloatType::kFloat32, d_codes.ptr,
                                    nullptr, IndexType::kInt64, 5.0f, kEpsilon,
                                    nullptr, nullptr, 0, n, k, d_grad.ptr, 0));
  CUDA_OK(LabelRank(nullptr, FloatType::kFloat16, d_codes.ptr, nullptr,
                        IndexType::kInt32, kEpsilon, 0, n, k, nullptr, 0));
  CUDA_OK(Nearest(nullptr, FloatType::kBFloat16, d_codes.ptr, kEpsilon,
                              0, n, k, nullptr, 0));
  CUDA_OK(cudaDeviceSynchronize());
  const std::vector<float> g = d_grad.Download();
  const bool zeros = std::all_of(g.begin(), g.end(), [](float v) { return v == 0.0f; });
  Report("empty batch [B=0 n=10 k=8]", zeros, zeros ? "all calls succeeded, grad_codes zeroed"
                                                    : "grad_codes not zeroed");
}

// A random loss problem on the device, drawn from one seed in this order:
// z ~ N(0, 1) [B, k], codes ~ N(0, 1/k) [n, k], grad_loss ~ U(-1, 1) [B],
// labels uniform in [0, n) [B].
struct DeviceProblem {
  DeviceBuffer<float> z, codes, g;
  DeviceBuffer<int32_t> labels;
  DeviceProblem(int64_t B, int64_t n, int64_t k, uint64_t seed)
      : z(B * k), codes(n * k), g(B), labels(B) {
    std::vector<float> hz(B * k), hcodes(n * k), hg(B);
    std::vector<int32_t> hlabels(B);
    Rng rng(seed);
    for (auto& v : hz) v = static_cast<float>(rng.Normal());
    for (auto& v : hcodes) v = static_cast<float>(rng.Normal() / std::sqrt(double(k)));
    for (auto& v : hg) v = static_cast<float>(2.0 * rng.Uniform() - 1.0);
    for (auto& y : hlabels) y = static_cast<int32_t>(rng.Below(n));
    z.Upload(hz);
    codes.Upload(hcodes);
    g.Upload(hg);
    labels.Upload(hlabels);
  }
};

// The four forward outputs (loss, lse, expected code, expected squared norm)
// of one float32 / int32 call with s = 6 in the current g_math / g_variant.
std::array<std::vector<float>, 4> ForwardOutputs(const float* z, const float* codes,
                                                 const int32_t* labels, int64_t B, int64_t n,
                                                 int64_t k) {
  DeviceBuffer<float> d_loss(B), d_lse(B), d_ecode(B * k), d_esq(B);
  CUDA_OK(Forward(z, FloatType::kFloat32, codes, labels, IndexType::kInt32, 6.0f, kEpsilon, B,
                  n, k, d_loss.ptr, d_lse.ptr, d_ecode.ptr, d_esq.ptr, 0));
  CUDA_OK(cudaDeviceSynchronize());
  return {d_loss.Download(), d_lse.Download(), d_ecode.Download(), d_esq.Download()};
}

// How many of the four outputs of `a` differ in their bits from the same
// leading entries of `b` (b may hold more rows).
int DifferingOutputs(const std::array<std::vector<float>, 4>& a,
                     const std::array<std::vector<float>, 4>& b) {
  int differ = 0;
  for (int o = 0; o < 4; ++o) {
    differ += a[o].size() > b[o].size() ||
              std::memcmp(a[o].data(), b[o].data(), a[o].size() * sizeof(float)) != 0;
  }
  return differ;
}

// A repeated call asks the runtime nothing but cudaGetDevice and, where a
// split kernel takes more than the default 48 KiB of shared memory, one
// cudaFuncSetAttribute before its launch: the device's attributes and each
// kernel's occupancy are read by the first call of a shape and remembered
// (ecoc_kernels.cu.cc, PlanCacheMutex), although every call plans twice (its
// workspace query and its entry point). The repeat's outputs have the first
// call's bits. Counted by the CPU emulator only (on a GPU: SKIP).
void RunPlanQueries() {
#ifdef KERAS_ECOC_EMULATOR
  struct Shape {
    const char* name;
    int64_t B, n, k;
    KernelVariant variant;
    bool big_smem;  // a split kernel above 48 KiB where the device allows it (k = 130:
                    // accumulators in shared memory)
  };
  const Shape shapes[] = {{"B=16 n=70 k=32 v2", 16, 70, 32, KernelVariant::kV2, false},
                          {"B=3 n=33 k=130 v2", 3, 33, 130, KernelVariant::kV2, true},
                          {"B=5 n=70 k=32 auto", 5, 70, 32, KernelVariant::kAuto, false}};
  const char* kQueries[] = {"cudaDeviceGetAttribute",
                            "cudaOccupancyMaxActiveBlocksPerMultiprocessor",
                            "cudaFuncSetAttribute"};
  // Where the device opts in to no more than the default 48 KiB (the
  // emulator's --smem-optin 49152), the k = 130 plan fits 48 KiB in column
  // stages and nothing is raised.
  int device = 0, optin = 0;
  CUDA_OK(cudaGetDevice(&device));
  CUDA_OK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  const KernelVariant saved = g_variant;
  for (const Shape& sh : shapes) {
    g_variant = sh.variant;
    const bool raises = sh.big_smem && optin > 48 * 1024;
    DeviceProblem pb(sh.B, sh.n, sh.k, 4242 + sh.k);
    DeviceBuffer<float> loss(sh.B), lse(sh.B), ecode(sh.B * sh.k), esq(sh.B),
        grad(sh.n * sh.k);
    auto call = [&]() {
      CUDA_OK(Forward(pb.z.ptr, FloatType::kFloat32, pb.codes.ptr, pb.labels.ptr,
                      IndexType::kInt32, 6.0f, kEpsilon, sh.B, sh.n, sh.k, loss.ptr, lse.ptr,
                      ecode.ptr, esq.ptr, 0));
      CUDA_OK(CodesGrad(pb.z.ptr, FloatType::kFloat32, pb.codes.ptr, pb.labels.ptr,
                        IndexType::kInt32, 6.0f, kEpsilon, lse.ptr, pb.g.ptr, sh.B, sh.n, sh.k,
                        grad.ptr, 0));
      CUDA_OK(cudaDeviceSynchronize());
      return std::make_pair(ecode.Download(), grad.Download());
    };
    const auto first = call();
    long before[3];
    for (int i = 0; i < 3; ++i) before[i] = keras_ecoc_emu_runtime_calls(kQueries[i]);
    const auto again = call();
    long delta[3];
    for (int i = 0; i < 3; ++i) delta[i] = keras_ecoc_emu_runtime_calls(kQueries[i]) - before[i];
    const bool same =
        first.first.size() == again.first.size() && first.second.size() == again.second.size() &&
        std::memcmp(first.first.data(), again.first.data(), first.first.size() * 4) == 0 &&
        std::memcmp(first.second.data(), again.second.data(), first.second.size() * 4) == 0;
    // Two split launches (forward, codes gradient): at most one raise each.
    const bool set_ok = raises ? delta[2] >= 1 && delta[2] <= 2 : delta[2] == 0;
    char detail[200];
    std::snprintf(detail, sizeof(detail),
                  "repeat of forward + codes gradient: %ld attribute, %ld occupancy, %ld "
                  "set-attribute calls (want 0, 0, %s); outputs %s",
                  delta[0], delta[1], delta[2], raises ? "1-2" : "0",
                  same ? "bit-identical" : "DIFFER");
    Report(std::string("plan queries once [") + sh.name + "]",
           delta[0] == 0 && delta[1] == 0 && set_ok && same, detail);
  }
  g_variant = saved;
#else
  std::printf("SKIP plan queries once: counted by the CPU emulator only\n");
#endif
}

// The SetLaunchObserver hook of the harness: the names of a call's launches
// and, while the event pool lasts, a CUDA event recorded right after each
// (TimeLaunches); with no events, only the names (RunLaunchObserver).
struct LaunchTrace {
  std::vector<cudaEvent_t> events;  // a pool: one per launch of a call
  std::vector<std::string> names;   // the launches of the current call
};

void RecordLaunch(const char* launch, cudaStream_t stream, void* context) {
  auto* trace = static_cast<LaunchTrace*>(context);
  const size_t i = trace->names.size();
  trace->names.emplace_back(launch);
  if (i < trace->events.size()) CUDA_OK(cudaEventRecord(trace->events[i], stream));
}

// SetLaunchObserver: every pass reports each launch it enqueued, named by
// pass and step, in order, and nothing else; a failed call none; a cleared
// observer is not called. Under the CPU emulator the reports are also
// counted against the launches and memsets the runtime accepted.
void RunLaunchObserver() {
  const int64_t B = 16, n = 70, k = 32;
  DeviceProblem pb(B, n, k, 5150);
  DeviceBuffer<float> loss(B), lse(B), ecode(B * k), esq(B), grad(n * k);
  DeviceBuffer<int32_t> rank(B);
  DeviceBuffer<int64_t> index(B);
  auto forward = [&](const int32_t* labels) {
    return Forward(pb.z.ptr, FloatType::kFloat32, pb.codes.ptr, labels, IndexType::kInt32, 6.0f,
                   kEpsilon, B, n, k, loss.ptr, lse.ptr, ecode.ptr, esq.ptr, 0);
  };
  auto codes_grad = [&](int64_t batch) {
    return CodesGrad(pb.z.ptr, FloatType::kFloat32, pb.codes.ptr, pb.labels.ptr,
                     IndexType::kInt32, 6.0f, kEpsilon, lse.ptr, pb.g.ptr, batch, n, k, grad.ptr,
                     0);
  };
  using Names = std::vector<std::string>;
  struct Case {
    const char* name;
    std::function<cudaError_t()> call;
    std::vector<Names> want;  // any of these sequences
    bool fails;
  };
  const std::vector<Case> cases = {
      {"forward", [&] { return forward(pb.labels.ptr); },
       {{"forward prep", "forward split", "forward combine"}}, false},
      {"codes gradient", [&] { return codes_grad(B); },
       {{"codes-grad prep", "codes-grad split"},
        {"codes-grad prep", "codes-grad split", "codes-grad combine"}},
       false},
      {"codes gradient, empty batch", [&] { return codes_grad(0); }, {{"codes-grad zero"}},
       false},
      {"label rank",
       [&] {
         return LabelRank(pb.z.ptr, FloatType::kFloat32, pb.codes.ptr, pb.labels.ptr,
                          IndexType::kInt32, kEpsilon, B, n, k, rank.ptr, 0);
       },
       {{"rank prep", "rank split", "rank combine"}}, false},
      {"nearest codeword",
       [&] {
         return Nearest(pb.z.ptr, FloatType::kFloat32, pb.codes.ptr, kEpsilon, B, n, k,
                        index.ptr, 0);
       },
       {{"nearest prep", "nearest split", "nearest combine"}}, false},
      {"forward without labels (refused)", [&] { return forward(nullptr); }, {Names{}}, true},
  };
  auto counted = [] {
#ifdef KERAS_ECOC_EMULATOR
    return keras_ecoc_emu_runtime_calls("kernel launch") +
           keras_ecoc_emu_runtime_calls("cudaMemsetAsync");
#else
    return 0L;
#endif
  };
  for (const Case& c : cases) {
    // Plans, workspace, modules: the observed call repeats this one.
    if (!c.fails) CUDA_OK(c.call());
    CUDA_OK(cudaDeviceSynchronize());
    LaunchTrace seen;
    const long before = counted();
    keras_ecoc::cuda::SetLaunchObserver(RecordLaunch, &seen);
    const cudaError_t err = c.call();
    keras_ecoc::cuda::SetLaunchObserver(nullptr, nullptr);
    (void)cudaGetLastError();
    const long runtime = counted() - before;
    CUDA_OK(cudaDeviceSynchronize());
    // Set, then cleared: the same call again reports nothing.
    LaunchTrace after;
    keras_ecoc::cuda::SetLaunchObserver(RecordLaunch, &after);
    keras_ecoc::cuda::SetLaunchObserver(nullptr, nullptr);
    if (!c.fails) CUDA_OK(c.call());
    CUDA_OK(cudaDeviceSynchronize());
    bool ok = (err != cudaSuccess) == c.fails && after.names.empty() &&
              std::find(c.want.begin(), c.want.end(), seen.names) != c.want.end();
    std::string got;
    for (const std::string& s : seen.names) got += (got.empty() ? "" : ", ") + s;
#ifdef KERAS_ECOC_EMULATOR
    ok = ok && runtime == static_cast<long>(seen.names.size());
#endif
    char detail[320];
    std::snprintf(detail, sizeof(detail), "%s; observed [%s]; runtime launches %ld",
                  err == cudaSuccess ? "ran" : cudaGetErrorName(err), got.c_str(), runtime);
    Report(std::string("launch observer [") + c.name + "]", ok, detail);
  }
}

// The variant field of every params struct: each workspace query accepts
// the variants of kVariants and refuses every other value with
// cudaErrorInvalidValue (the bit combinations ecoc_kernels.h calls invalid,
// among them kGradMma with kGradPersistent, and values past the last bit).
void RunVariantValidation() {
  using namespace keras_ecoc::cuda;
  const int64_t B = 4, n = 10, k = 8;
  int accepted = 0, refused = 0, wrong = 0;
  std::string first_wrong;
  // Up to 260: past 255, the last value kWgmma (128) combines into.
  for (int i = -3; i <= 260; ++i) {
    const KernelVariant v = static_cast<KernelVariant>(i);
    const bool valid = std::any_of(std::begin(kVariants), std::end(kVariants),
                                   [v](const VariantName& e) { return e.variant == v; });
    // The workspace query of a params struct (defaults elsewhere) with
    // this problem and variant.
    auto query = [v](auto params, auto size_fn) {
      params.problem = Problem(nullptr, FloatType::kFloat32, nullptr, kEpsilon, B, n, k);
      params.variant = v;
      size_t bytes = 0;
      return size_fn(params, &bytes);
    };
    const cudaError_t errs[4] = {query(ForwardParams{}, EcocForwardWorkspaceSize),
                                 query(CodesGradParams{}, EcocCodesGradWorkspaceSize),
                                 query(LabelRankParams{}, EcocLabelRankWorkspaceSize),
                                 query(NearestParams{}, EcocNearestWorkspaceSize)};
    for (const cudaError_t err : errs) {
      const bool ok = valid ? err == cudaSuccess : err == cudaErrorInvalidValue;
      (valid ? accepted : refused) += ok;
      if (!ok && wrong++ == 0) first_wrong = "variant " + std::to_string(i);
    }
  }
  char detail[160];
  std::snprintf(detail, sizeof(detail), "%d accepted, %d refused, %d wrong%s%s", accepted,
                refused, wrong, wrong > 0 ? ", first: " : "", first_wrong.c_str());
  Report("variant validation [-3 .. 260, four workspace queries]", wrong == 0, detail);
}

// The scale as a device pointer (contract field scale_ptr) gives the same
// bits as the host value, in every math mode, with one batch split of the
// codes gradient (the split kernel scales) and with several (the combine
// scales); a device scale that is not a finite number > 0 makes the loss
// passes' outputs NaN.
void RunScalePointer(int sms) {
  using namespace keras_ecoc::cuda;
  struct Shape {
    int64_t B, n, k;
  };
  const Shape shapes[] = {{37, 100, 32}, {2LL * sms * 16 + 37, 40, 24}};
  DeviceBuffer<float> d_scale(1);
  for (const Shape& sh : shapes) {
    const int64_t B = sh.B, n = sh.n, k = sh.k;
    const DeviceProblem pb(B, n, k, 777 + B);
    for (MathMode math : {MathMode::k3xTf32, MathMode::kFp32, MathMode::kTf32}) {
      g_math = math;
      std::vector<float> out[2][5];
      for (int form = 0; form < 3; ++form) {
        const float scale = 7.5f;
        d_scale.Upload({form == 2 ? -1.0f : scale});
        g_scale_ptr = form == 0 ? nullptr : d_scale.ptr;
        DeviceBuffer<float> d_loss(B), d_lse(B), d_ecode(B * k), d_esq(B), d_grad(n * k);
        // The host value is a decoy in the pointer forms: the pointer wins.
        const float host = form == 0 ? scale : 1.0f;
        CUDA_OK(Forward(pb.z.ptr, FloatType::kFloat32, pb.codes.ptr, pb.labels.ptr,
                        IndexType::kInt32, host, kEpsilon, B, n, k, d_loss.ptr, d_lse.ptr,
                        d_ecode.ptr, d_esq.ptr, 0));
        CUDA_OK(CodesGrad(pb.z.ptr, FloatType::kFloat32, pb.codes.ptr, pb.labels.ptr,
                          IndexType::kInt32, host, kEpsilon, d_lse.ptr, pb.g.ptr, B, n, k,
                          d_grad.ptr, 0));
        CUDA_OK(cudaDeviceSynchronize());
        g_scale_ptr = nullptr;
        char prefix[160];
        std::snprintf(prefix, sizeof(prefix), "scale pointer [math=%s B=%lld n=%lld k=%lld]",
                      MathName(math), static_cast<long long>(B), static_cast<long long>(n),
                      static_cast<long long>(k));
        if (form == 2) {
          const std::vector<float> loss = d_loss.Download(), grad = d_grad.Download();
          const bool nan = std::all_of(loss.begin(), loss.end(),
                                       [](float v) { return std::isnan(v); }) &&
                           std::all_of(grad.begin(), grad.end(),
                                       [](float v) { return std::isnan(v); });
          Report(std::string(prefix) + " scale -1", nan,
                 nan ? "loss and grad_codes all NaN" : "a finite output for scale -1");
          continue;
        }
        out[form][0] = d_loss.Download();
        out[form][1] = d_lse.Download();
        out[form][2] = d_ecode.Download();
        out[form][3] = d_esq.Download();
        out[form][4] = d_grad.Download();
        if (form == 1) {
          int64_t differ = 0;
          for (int o = 0; o < 5; ++o) {
            differ += std::memcmp(out[0][o].data(), out[1][o].data(),
                                  out[0][o].size() * sizeof(float)) != 0;
          }
          char buf[96];
          std::snprintf(buf, sizeof(buf), "%lld of 5 outputs differ in their bits",
                        static_cast<long long>(differ));
          Report(std::string(prefix) + " same bits as the host scale", differ == 0, buf);
        }
      }
    }
  }
  g_math = MathMode::k3xTf32;
}

// Every launch variant against float64 at batch sizes around the row tiles
// (16 and 64), for every output of the four entry points; the default-mode
// loss passes and FP32 rank / nearest. n spans several class tiles and
// splits; k = 130 exercises the 64-row tile's column stages.
void RunVariants(bool quick) {
  // --quick keeps one B below the 64-row tile's threshold (16), one partial
  // 64-row tile and one full tile plus a partial one.
  const std::vector<int64_t> batches =
      quick ? std::vector<int64_t>{7, 17, 65} : std::vector<int64_t>{1, 7, 16, 17, 63, 64, 65, 256};
  uint64_t seed = 4242;
  for (const VariantName& v : kVariants) {
    if (v.variant == KernelVariant::kV2) continue;
    g_variant = v.variant;
    for (int64_t B : batches) {
      RunCase({"variant", B, 301, 32, 8.0f, B > 1, B > 2, B > 0}, FloatType::kFloat32,
              IndexType::kInt32, seed++);
    }
    // kWarps8 changes nothing where kRegSoftmax does not apply (k > 128,
    // FP32): --quick leaves those two fallback cases to the variants without it.
    if (quick && (static_cast<int>(v.variant) & static_cast<int>(KernelVariant::kWarps8))) {
      continue;
    }
    RunCase({"variant k=130", 70, 77, 130, 5.0f, true, true, true}, FloatType::kBFloat16,
            IndexType::kInt64, seed++);
    g_math = MathMode::kFp32;
    RunCase({"variant", 65, 301, 32, 8.0f}, FloatType::kFloat32, IndexType::kInt32, seed++);
    g_math = MathMode::k3xTf32;
  }
  g_variant = KernelVariant::kV2;
  // Folding ||M||^2 into the forward's split kernel keeps PrepClasses'
  // chain: with the same row tile and the same splits, every forward output
  // has the bits of the unfolded launch; k = 300 and 1000 run in several
  // column stages (the partial sums carried across stages). The splits
  // follow each kernel's occupancy, and the folded tile's 256 more bytes
  // can cost a block per SM (rows64 at k = 32 on the emulated 2-SM H100:
  // 5 -> 4), so n keeps every pair at one class tile per split on any
  // device with 2 SMs or more (6 tiles); the equal workspace sizes (which
  // grow with the splits) show that the pair did get the same splits.
  using namespace keras_ecoc::cuda;
  struct Shape {
    int64_t B, n, k;
  };
  const Shape shapes[] = {{37, 161, 32}, {70, 77, 300}, {5, 40, 1000}};
  for (const Shape& sh : shapes) {
    const int64_t B = sh.B, n = sh.n, k = sh.k;
    std::vector<float> z(B * k), codes(n * k);
    std::vector<int32_t> labels(B);
    Rng rng(99 + k);
    for (auto& v : z) v = static_cast<float>(rng.Normal());
    for (auto& v : codes) v = static_cast<float>(rng.Normal() / std::sqrt(double(k)));
    for (auto& y : labels) y = static_cast<int32_t>(rng.Below(n));
    DeviceBuffer<float> d_z(B * k), d_codes(n * k);
    DeviceBuffer<int32_t> d_labels(B);
    d_z.Upload(z);
    d_codes.Upload(codes);
    d_labels.Upload(labels);
    const KernelVariant pairs[2][2] = {{KernelVariant::kV2, KernelVariant::kFoldNorms},
                                       {KernelVariant::kRows64, KernelVariant::kRows64FoldNorms}};
    for (MathMode math : {MathMode::k3xTf32, MathMode::kFp32}) {
      g_math = math;
      for (const auto& pair : pairs) {
        std::array<std::vector<float>, 4> out[2];
        size_t ws[2] = {0, 0};
        for (int f = 0; f < 2; ++f) {
          g_variant = pair[f];
          out[f] = ForwardOutputs(d_z.ptr, d_codes.ptr, d_labels.ptr, B, n, k);
          ws[f] = g_ws_last;
        }
        const int differ = DifferingOutputs(out[0], out[1]);
        char name[160], buf[96];
        std::snprintf(name, sizeof(name), "folded norms [math=%s %s vs %s B=%lld n=%lld k=%lld]",
                      MathName(math), VariantString(pair[1]), VariantString(pair[0]),
                      static_cast<long long>(B), static_cast<long long>(n),
                      static_cast<long long>(k));
        if (ws[0] != ws[1]) {
          std::snprintf(buf, sizeof(buf), "different splits (workspace %zu vs %zu bytes)", ws[1],
                        ws[0]);
        } else {
          std::snprintf(buf, sizeof(buf), "%d of 4 forward outputs differ in their bits", differ);
        }
        Report(name, differ == 0 && ws[0] == ws[1], buf);
      }
    }
  }
  g_math = MathMode::k3xTf32;
  g_variant = KernelVariant::kV2;
}

// The register-softmax forward folds ||M||^2 from its code fragments where
// the batch is one row tile (B <= 16; B <= 64 with kRows64) and takes
// PrepClasses' values otherwise: the same chain, so the first R rows
// of a batch of 2R rows (prep) have the bits of a batch of R rows (fold).
// Rows are independent given the splits, so both calls must get the same
// splits: n = 61 is one partial class tile of 64, one split on any card.
// (n = 119, two tiles, gave the two batches different splits on a 1-SM
// card, and so different bits.) k = 100 leaves 4 zero padding columns in
// the chain.
void RunRegFold() {
  if (DeviceCc() < 80) {
    std::printf("SKIP register-softmax folded norms: the register softmax needs sm_80+\n");
    return;
  }
  const KernelVariant variants[2] = {KernelVariant::kRegSoftmax,
                                     KernelVariant::kRows64RegSoftmax};
  const int64_t tiles[2] = {16, 64};
  for (int vi = 0; vi < 2; ++vi) {
    const int64_t R = tiles[vi];
    for (int64_t k : {32, 100}) {
      const int64_t n = 61;
      DeviceProblem pb(2 * R, n, k, 5150 + R + k);
      for (MathMode math : {MathMode::k3xTf32, MathMode::kTf32}) {
        g_math = math;
        g_variant = variants[vi];
        // The first R rows of the 2R-row problem's z and labels: the R-row call.
        const auto fold = ForwardOutputs(pb.z.ptr, pb.codes.ptr, pb.labels.ptr, R, n, k);
        const auto prep = ForwardOutputs(pb.z.ptr, pb.codes.ptr, pb.labels.ptr, 2 * R, n, k);
        const int differ = DifferingOutputs(fold, prep);
        char name[160], detail[120];
        std::snprintf(name, sizeof(name),
                      "register-softmax folded norms [math=%s variant=%s B=%lld vs %lld n=%lld "
                      "k=%lld]",
                      MathName(math), VariantString(variants[vi]), static_cast<long long>(R),
                      static_cast<long long>(2 * R), static_cast<long long>(n),
                      static_cast<long long>(k));
        std::snprintf(detail, sizeof(detail),
                      "%d of 4 forward outputs of the first %lld rows differ in their bits",
                      differ, static_cast<long long>(R));
        Report(name, differ == 0, detail);
      }
    }
  }
  g_math = MathMode::k3xTf32;
  g_variant = KernelVariant::kV2;
}

// kAuto, the params structs' default, against float64 where its rule picks
// the branches RunVariants' shapes (B in {7, 17, 65}, k = 32, n = 301, where
// auto runs as one more variant in 3xTF32: 8-warp register softmax and
// kGradMma, then both on 64-row tiles) do not reach on sm_80+: FP32 at
// B = 7 (folded norms, the persistent codes gradient), FP32 at B = 1024 (the
// v2 forward, 64-row codes gradient), 3xTF32 at B = 7 with k = 64 (the
// 4-warp register softmax below n = 300,000), 3xTF32 at B = 5 with k = 130
// (past the mma paths: the v2 forward, the persistent codes gradient), TF32
// at B = 2048 (64-row tiles, both mma paths). The full set adds B = 5 with
// n = 300,000 (the 4-warp register softmax at k = 8; minutes in the CPU
// emulator, so not in --quick). Each check's name says what auto ran on
// this device.
void RunAuto(bool quick) {
  struct AutoCase {
    MathMode math;
    int64_t B, n, k;
  };
  std::vector<AutoCase> cases = {{MathMode::kFp32, 7, 301, 32},
                                 {MathMode::kFp32, 1024, 33, 16},
                                 {MathMode::k3xTf32, 7, 301, 64},
                                 {MathMode::k3xTf32, 5, 33, 130},
                                 {MathMode::kTf32, 2048, 33, 16}};
  if (!quick) cases.push_back({MathMode::k3xTf32, 5, 300000, 8});
  const int cc = DeviceCc();
  g_variant = KernelVariant::kAuto;
  uint64_t seed = 5151;
  for (const AutoCase& c : cases) {
    g_math = c.math;
    const std::string name = "auto (" + AutoChoice(c.math, c.B, c.n, c.k, cc) + ")";
    RunCase({name, c.B, c.n, c.k, 8.0f, true, true, true}, FloatType::kFloat32, IndexType::kInt32,
            seed++);
  }
  g_math = MathMode::k3xTf32;
  g_variant = KernelVariant::kV2;
}

// The register-softmax forward (kRegSoftmax, 16- and 64-row tiles) in both
// TF32 modes, where it runs, and in FP32, where the call falls back to the
// v2 kernel, against float64 at odd shapes around its tiles (16 / 64 rows,
// 64 classes, 8-column fragments, k = 128 the widest row it keeps in
// registers, k = 129 past it: the v2 kernel again). The full set runs
// every B x k x n of the lists in 3xTF32 (192 shapes per variant) and a
// covering subset in TF32 and FP32; --quick (the CPU emulator's) the subset,
// with NaN / zero rows and ties.
void RunRegSoftmax(bool quick) {
  struct Shape {
    int64_t B, k, n;
  };
  // A covering subset: every B, k and n of the lists occurs.
  const std::vector<Shape> subset = {{1, 1, 1},      {7, 31, 33},  {16, 32, 100},
                                     {17, 33, 1000}, {63, 128, 33}, {64, 1, 100},
                                     {65, 128, 100}, {256, 32, 33}, {17, 129, 33}};
  std::vector<Shape> all;
  for (int64_t B : {1, 7, 16, 17, 63, 64, 65, 256}) {
    for (int64_t k : {1, 31, 32, 33, 128, 129}) {
      for (int64_t n : {1, 33, 100, 1000}) all.push_back({B, k, n});
    }
  }
  uint64_t seed = 777000;
  for (KernelVariant v : {KernelVariant::kRegSoftmax, KernelVariant::kRows64RegSoftmax}) {
    g_variant = v;
    for (MathMode math : {MathMode::k3xTf32, MathMode::kTf32, MathMode::kFp32}) {
      g_math = math;
      // The default mode on every shape (the subset with --quick); plain TF32
      // and the FP32 fallback on the subset (--quick: TF32 on every other
      // shape of it, FP32 only through RunVariants' B = 65, k = 32 case).
      const std::vector<Shape>& shapes = math == MathMode::k3xTf32 && !quick ? all : subset;
      for (size_t i = 0; i < shapes.size(); ++i) {
        const Shape& sh = shapes[i];
        if (quick && (math == MathMode::kFp32 || (math == MathMode::kTf32 && i % 2 == 1))) {
          continue;
        }
        const bool rules = sh.B > 2;
        // A NaN row makes grad_codes NaN everywhere (nothing left to compare),
        // so only every third shape has one. The tie case needs u close to
        // M_3 (z row 0 = 2 M_3): k >= 16.
        RunCase({"regsoftmax", sh.B, sh.n, sh.k, 8.0f, rules && i % 3 == 0, rules,
                 rules && sh.k >= 16},
                math == MathMode::k3xTf32 && sh.B == 17 ? FloatType::kBFloat16
                                                        : FloatType::kFloat32,
                math == MathMode::k3xTf32 && sh.B == 17 ? IndexType::kInt64 : IndexType::kInt32,
                seed++);
      }
    }
  }
  g_math = MathMode::k3xTf32;
  g_variant = KernelVariant::kV2;
}

// The forward combine with many partial states per row, whatever the
// simulated SM count: B = 1-3 rows over thousands of classes give tens of
// class splits (times 4 warp states with the register softmax), so that
// the combine runs blocks of up to 1024 threads, several column tiles (a
// partial one at k = 40 and 100) and, with one row, a grid of column-tile
// blocks; k = 1 puts every thread of a block on the states of one column.
void RunCombine() {
  struct Shape {
    const char* name;
    int64_t B, n, k;
    KernelVariant variant;
  };
  const Shape shapes[] = {{"combine, many states", 2, 12807, 40, KernelVariant::kRegSoftmax},
                          {"combine, many states", 3, 12807, 1, KernelVariant::kRegSoftmax},
                          {"combine, many states", 1, 6401, 100, KernelVariant::kV2}};
  uint64_t seed = 919000;
  for (const Shape& sh : shapes) {
    g_variant = sh.variant;
    RunCase({sh.name, sh.B, sh.n, sh.k, 8.0f, false, false, false}, FloatType::kFloat32,
            IndexType::kInt32, seed++);
  }
  g_variant = KernelVariant::kV2;
}

struct SweepShape {
  int64_t B, k, n;
};

// The checks of one or two launch variants in every math mode against
// float64: B = 1, 7, 16, 33, 129, 256 x k = 1, 31, 32, 128 x n = 1, 33, 1000,
// ties and NaN rules on B > 2 (NaN rows on the shapes of index parity
// `nan_parity`), bfloat16 z and int64 labels on every fourth 3xTF32 shape.
// --quick (the CPU emulator's): the shapes `few` in 3xTF32 and the first of
// them in TF32, no FP32. Case names are `name`; seeds count up from `seed`.
template <size_t N>
void RunVariantSweep(const char* name, const KernelVariant (&variants)[N],
                     const std::vector<SweepShape>& few, int nan_parity, uint64_t seed,
                     bool quick) {
  std::vector<SweepShape> all;
  for (int64_t B : {1, 7, 16, 33, 129, 256}) {
    for (int64_t k : {1, 31, 32, 128}) {
      for (int64_t n : {1, 33, 1000}) all.push_back({B, k, n});
    }
  }
  for (KernelVariant v : variants) {
    g_variant = v;
    for (MathMode math : {MathMode::k3xTf32, MathMode::kTf32, MathMode::kFp32}) {
      g_math = math;
      if (quick && math == MathMode::kFp32) continue;
      const std::vector<SweepShape>& shapes = quick ? few : all;
      for (size_t i = 0; i < shapes.size(); ++i) {
        if (quick && math == MathMode::kTf32 && i > 0) continue;
        const SweepShape& sh = shapes[i];
        const bool rules = sh.B > 2;
        const bool alt = math == MathMode::k3xTf32 && i % 4 == 1;
        RunCase({name, sh.B, sh.n, sh.k, 8.0f, rules && static_cast<int>(i % 2) == nan_parity,
                 rules, rules && sh.k >= 16},
                alt ? FloatType::kBFloat16 : FloatType::kFloat32,
                alt ? IndexType::kInt64 : IndexType::kInt32, seed++);
      }
    }
  }
  g_math = MathMode::k3xTf32;
  g_variant = KernelVariant::kV2;
}

// The 8-warp register-softmax forward (kWarps8, 16- and 64-row tiles): the
// sweep above (one or several 16-row tiles; 64-row tiles from B = 33 on,
// partial ones at 33 and 129; one warp's 8 classes, a partial 64-class
// tile, many class tiles and splits), NaN rows on the even shapes. The quick
// RunVariants adds B = 7, 17, 65 at k = 32.
void RunRegSoftmaxWarps8(bool quick) {
  RunVariantSweep("regsoftmax+warps8",
                  {KernelVariant::kRegSoftmaxWarps8, KernelVariant::kRows64RegSoftmaxWarps8},
                  {{33, 128, 70}, {129, 31, 33}, {1, 1, 1}}, 0, 888000, quick);
}

// The 128-row register-softmax forward (kRows128: code tiles staged through
// registers, split once, the expected code transposed): the sweep above
// (B = 129 and 256: one full 128-row tile and a partial one, two full
// ones; B <= 64 and FP32 run kRows64RegSoftmaxWarps8's launches), NaN rows
// on the odd shapes. --quick: a full tile and a one-row one at k = 128
// (every thread's share of a code tile in use) over a partial class tile;
// a partial tile at k = 40 over 5 class tiles, with column tiles past kp;
// two full tiles at k = 1 (kp = 8).
const std::vector<SweepShape> kRows128Quick = {{129, 128, 33}, {200, 40, 301}, {256, 1, 70}};
constexpr uint64_t kRows128Seed = 889000;
void RunRows128(bool quick) {
  RunVariantSweep("rows128", {KernelVariant::kRows128RegSoftmaxWarps8}, kRows128Quick, 1,
                  kRows128Seed, quick);
}

// The 128-row forward with both products on wgmma (kWgmma, sm_90a): the
// same shapes and seeds as RunRows128, so that each check's inputs are that
// sweep's and the emulator's digests of the two can be compared check by
// check (the emulated wgmma takes mma.m16n8k8's arithmetic and the products
// keep MmaMode's order: the same bits). Where kWgmma does not apply (not a
// compute capability 9.0 card, no sm_90a image) the launches are
// kRows128's, and where that does not (B <= 64, FP32) its fallback's.
void RunRows128Wgmma(bool quick) {
  RunVariantSweep("rows128+wgmma", {KernelVariant::kRows128WgmmaRegSoftmaxWarps8}, kRows128Quick,
                  1, kRows128Seed, quick);
}

// The codes gradient's mma second product (kGradMma, 16- and 64-row tiles;
// FP32 runs the fallback): the sweep above (one or several batch tiles per
// split, partial ones; 1 to 4 column tiles per warp, a partial 8-column tile;
// a partial class tile; many class tiles, or many batch splits and the combine
// at small n), then rows of 33-64 columns. NaN rows on the odd shapes only: a
// NaN row makes every entry of grad_codes NaN, and the first shape is the one
// --quick times. Then the near-codeword case (Case::near: rows on their
// codewords, s = 30, where W^T U - colsum M cancels) with and without the bit,
// so that the per-mode error table compares the expanded form with the
// difference form of CodesGradSplitKernel (--quick: s = 8 only).
// The sweep's --quick shapes and its seeds: one variant takes
// GradMmaSweepSeeds of them (RunVariantSweep counts one per case), so the
// wgmma sweep below can run rows64+gradmma's cases with its seeds.
const std::vector<SweepShape> kGradMmaQuick = {{129, 128, 40}, {33, 31, 33}, {1, 1, 1}};
constexpr uint64_t kGradMmaSeed = 161600;
uint64_t GradMmaSweepSeeds(bool quick) {
  return quick ? kGradMmaQuick.size() + 1 : 6 * 4 * 3 * 3;  // RunVariantSweep's cases
}
// The rows of 33-64 padded columns: kp = 48 and 64 (below).
constexpr SweepShape kGradMmaMidShapes[] = {{33, 48, 40}, {129, 61, 33}};
constexpr uint64_t kGradMmaMidSeed = 161800;
constexpr uint64_t kGradMmaMidCases = 2 * std::size(kGradMmaMidShapes);  // per variant
constexpr uint64_t kGradMmaNearSeed = 161699;

// The rows of 33-64 padded columns under one variant, in both TF32 modes,
// seeds counting up from `seed` (kGradMmaMidCases of them).
void RunGradMmaMid(const char* name, KernelVariant variant, uint64_t seed) {
  g_variant = variant;
  for (MathMode math : {MathMode::k3xTf32, MathMode::kTf32}) {
    g_math = math;
    for (const SweepShape& sh : kGradMmaMidShapes) {
      RunCase({name, sh.B, sh.n, sh.k, 8.0f, false, true, true}, FloatType::kFloat32,
              IndexType::kInt32, seed++);
    }
  }
}

// Near codewords: the same inputs (same seed) under each variant and both
// TF32 modes, at s = 8 (p_y ~ 0.99: the own-class terms w (u - M_y) still
// count) and s = 30 (p_y ~ 1 - 1e-12: everything is small). The NEAR lines
// give the error relative to the gradient's own size. --quick: s = 8 only
// (s = 30 measured the same error for both forms; README).
void RunGradMmaNear(const char* name, std::initializer_list<KernelVariant> variants,
                    bool quick) {
  for (float s : {8.0f, 30.0f}) {
    if (quick && s != 8.0f) continue;
    Case near{name, quick ? 129 : 1024, 40, 128, s};
    near.near = true;
    for (KernelVariant v : variants) {
      g_variant = v;
      for (MathMode math : {MathMode::k3xTf32, MathMode::kTf32}) {
        g_math = math;
        RunCase(near, FloatType::kFloat32, IndexType::kInt32, kGradMmaNearSeed);
      }
    }
  }
}

void RunGradMma(bool quick) {
  RunVariantSweep("gradmma", {KernelVariant::kGradMma, KernelVariant::kRows64GradMma},
                  kGradMmaQuick, 1, kGradMmaSeed, quick);
  // Rows of 33-64 padded columns, the instantiation with two column tiles of
  // G per warp (KMAX = 64), which the sweep's k = 1, 31, 32, 128 never
  // reach: kp = 48 (warps 0 and 1 hold two column tiles, warps 2 and 3 one)
  // and kp = 64 with a partial last column tile, over one partial and
  // several batch tiles, in both TF32 modes and both row tiles (--quick
  // too).
  RunGradMmaMid("gradmma kp <= 64", KernelVariant::kGradMma, kGradMmaMidSeed);
  RunGradMmaMid("gradmma kp <= 64", KernelVariant::kRows64GradMma,
                kGradMmaMidSeed + kGradMmaMidCases);
  // The split kernel's difference form against the expanded one of kGradMma.
  RunGradMmaNear("gradmma near",
                 {KernelVariant::kV2, KernelVariant::kRows64, KernelVariant::kGradMma,
                  KernelVariant::kRows64GradMma},
                 quick);
  g_math = MathMode::k3xTf32;
  g_variant = KernelVariant::kV2;
}

// The 64-row kGradMma codes gradient with both products on wgmma
// (kRows64GradMmaWgmma, sm_90a): rows64+gradmma's cases of RunGradMma with
// their seeds (the sweep, the rows of 33-64 padded columns, the near
// codewords at s = 8 and, without --quick, 30), so that the emulator's
// digests of the two can be compared check by check: the emulated wgmma
// takes mma.m16n8k8's arithmetic and each logit and G entry keeps
// kGradMma's products in their order, so the bits are the same. The
// shapes cover one m-tile of G^T (kp = 8, 32, 48, 64) and two (kp = 128),
// one partial batch tile and several, batch splits, a partial class tile;
// one more case, TF32 at kp = 32, runs under both variants here.
// Where it does not apply (not a compute capability 9.0 card, no sm_90a
// image) the launches are rows64+gradmma's, and where that does not (B <=
// 16: 16-row tiles; FP32) its fallback's.
void RunGradMmaWgmma(bool quick) {
  RunVariantSweep("rows64+gradmma+wgmma", {KernelVariant::kRows64GradMmaWgmma}, kGradMmaQuick, 1,
                  kGradMmaSeed + GradMmaSweepSeeds(quick), quick);
  RunGradMmaMid("rows64+gradmma+wgmma kp <= 64", KernelVariant::kRows64GradMmaWgmma,
                kGradMmaMidSeed + kGradMmaMidCases);
  // TF32 at kp = 32 (the KMAX = 32 instantiation, which the quick sweep
  // reaches in 3xTF32 only), under both variants with one seed.
  for (KernelVariant v : {KernelVariant::kRows64GradMma, KernelVariant::kRows64GradMmaWgmma}) {
    g_variant = v;
    g_math = MathMode::kTf32;
    const bool wg = v == KernelVariant::kRows64GradMmaWgmma;
    RunCase({wg ? "rows64+gradmma+wgmma kp <= 32" : "gradmma kp <= 32", 100, 70, 29, 8.0f, false,
             true, true},
            FloatType::kFloat32, IndexType::kInt32, kGradMmaMidSeed + 2 * kGradMmaMidCases);
  }
  RunGradMmaNear("rows64+gradmma+wgmma near", {KernelVariant::kRows64GradMmaWgmma}, quick);
  g_math = MathMode::k3xTf32;
  g_variant = KernelVariant::kV2;
}

// The codes gradient's persistent blocks (kGradPersistent, 16- and 64-row
// tiles): the sweep (B = 1, 7, 16: one 16-row tile; 33: one 64-row tile
// under rows64+gradpersistent, the split kernel's fallback under
// gradpersistent, as at 129 and 256; k = 1 to 128; n = 1, 33, 1000: a
// partial class tile, and on an emulated 2-SM card several class tiles per
// block), NaN rows on the odd shapes. Then the claim of its header: the same
// bits as the split kernel (kV2 / kRows64 with one batch split), in every
// math mode, at shapes where each block streams several class tiles (n up
// to 40 tiles per SM of a 132-SM card), with a partial last class tile, k
// not a multiple of 4 (element copies) and k = 1, and k = 200 (two passes
// of the G update's columns).
void RunGradPersistent(bool quick) {
  RunVariantSweep("gradpersistent",
                  {KernelVariant::kGradPersistent, KernelVariant::kRows64GradPersistent},
                  {{16, 128, 1000}, {7, 31, 33}, {33, 32, 70}}, 1, 171700, quick);
  struct Shape {
    int64_t B, n, k;
    KernelVariant base, variant;
  };
  const KernelVariant v2 = KernelVariant::kV2, p16 = KernelVariant::kGradPersistent,
                      r64 = KernelVariant::kRows64, p64 = KernelVariant::kRows64GradPersistent;
  std::vector<Shape> shapes = {{16, 1000, 128, v2, p16}, {7, 1001, 31, v2, p16},
                               {1, 70, 1, v2, p16},      {33, 300, 32, r64, p64},
                               {5, 97, 200, v2, p16}};
  if (!quick) {
    shapes.push_back({16, 132 * 32 * 40 + 5, 32, v2, p16});
    shapes.push_back({64, 5000, 128, r64, p64});
  }
  uint64_t seed = 171900;
  for (const Shape& sh : shapes) {
    const int64_t B = sh.B, n = sh.n, k = sh.k;
    const DeviceProblem pb(B, n, k, seed++);
    DeviceBuffer<float> d_loss(B), d_lse(B), d_ecode(B * k), d_esq(B), d_grad(n * k);
    for (MathMode math : {MathMode::k3xTf32, MathMode::kFp32, MathMode::kTf32}) {
      // --quick: TF32 at one shape of each row tile.
      if (quick && math == MathMode::kTf32 && B != 16 && B != 33) continue;
      g_math = math;
      g_variant = sh.base;
      CUDA_OK(Forward(pb.z.ptr, FloatType::kFloat32, pb.codes.ptr, pb.labels.ptr,
                      IndexType::kInt32, 8.0f, kEpsilon, B, n, k, d_loss.ptr, d_lse.ptr,
                      d_ecode.ptr, d_esq.ptr, 0));
      std::vector<float> grads[2];
      for (int i = 0; i < 2; ++i) {
        g_variant = i == 0 ? sh.base : sh.variant;
        CUDA_OK(CodesGrad(pb.z.ptr, FloatType::kFloat32, pb.codes.ptr, pb.labels.ptr,
                          IndexType::kInt32, 8.0f, kEpsilon, d_lse.ptr, pb.g.ptr, B, n, k,
                          d_grad.ptr, 0));
        CUDA_OK(cudaDeviceSynchronize());
        grads[i] = d_grad.Download();
      }
      int64_t differ = 0;
      for (size_t e = 0; e < grads[0].size(); ++e) {
        differ += std::memcmp(&grads[0][e], &grads[1][e], sizeof(float)) != 0;
      }
      char name[160], detail[96];
      std::snprintf(name, sizeof(name),
                    "gradpersistent bits [math=%s variant=%s B=%lld n=%lld k=%lld] same as %s",
                    MathName(math), VariantString(sh.variant), static_cast<long long>(B),
                    static_cast<long long>(n), static_cast<long long>(k),
                    VariantString(sh.base));
      std::snprintf(detail, sizeof(detail), "%lld of %lld grad_codes entries differ in their bits",
                    static_cast<long long>(differ), static_cast<long long>(n * k));
      Report(name, differ == 0, detail);
    }
  }
  g_math = MathMode::k3xTf32;
  g_variant = KernelVariant::kV2;
}

void RunCases(int sms, bool quick) {
  // Shapes chosen to hit every launch variant of the split kernels on this
  // device: B and n not multiples of the tiles (16 rows, 32 classes); k = 0
  // and 1; k = 130 (one stage per tile, accumulators in shared memory),
  // k = 224 (one stage, accumulators in global memory on a 100 KiB budget),
  // k = 300 and 1000 (several column stages per tile); many class splits at
  // small B, one split at large B; many batch splits of the codes gradient
  // (its combine) at small n, one at large n.
  const int64_t many_tiles = 2LL * sms * 16 + 37;  // rows > 2 blocks per SM
  const int64_t many_classes = 2LL * sms * 32 + 5;
  std::vector<Case> cases = {
      {"basic", 37, 100, 32, 8.0f, true, true, true},
      {"k=1", 5, 3, 1, 4.0f},
      {"k=0", 4, 5, 0, 4.0f},
      {"n=1", 9, 1, 16, 6.0f},
      {"k=130", 21, 45, 130, 5.0f, false, false, true},
      {"k=224", 18, 70, 224, 5.0f, true, false, false},
      {"k=300", 19, 77, 300, 3.0f, true, true, false},
      {"k=1000", 5, 40, 1000, 3.0f},
      {"large n, many class splits", 3, many_classes, 64, 10.0f, false, false, true},
      {"large B, one class split, many batch splits", many_tiles, 40, 24, 7.0f},
      {"large B and n", 70, 5003, 64, 10.0f},
  };
  if (quick) {
    // --check-only --quick (the CPU emulator's set): the same launch variants
    // and rules at the smallest sizes that reach them. Two row tiles and two
    // class tiles, both partial, in "basic"; k = 1, 21, 31, 130 and 1001
    // take the scalar code-row loads (k % 4 != 0), k = 16, 24, 224 and 300
    // the 16-byte ones; k = 130 keeps the accumulators in more than 48 KiB of
    // shared memory, k = 224 in global memory, k = 300 and 1001 run 2 and 4
    // column stages (256-column stages on the 100 KiB budget); B = 1 and
    // n = 1 alone. The many-split cases keep their sizes, which follow the SM
    // count (many class splits at k = 16 instead of 64).
    cases = {
        {"basic", 19, 37, 21, 8.0f, true, true, true},
        {"k=1", 5, 3, 1, 4.0f},
        {"k=0", 4, 5, 0, 4.0f},
        {"n=1", 9, 1, 16, 6.0f},
        {"B=1", 1, 33, 31, 6.0f},
        {"k=130", 3, 33, 130, 5.0f, false, false, true},
        {"k=224", 3, 33, 224, 5.0f, true, false, false},
        {"k=300", 3, 33, 300, 3.0f, true, true, false},
        {"k=1001", 2, 9, 1001, 3.0f},
        {"large n, many class splits", 3, many_classes, 16, 10.0f, false, false, true},
        {"large B, one class split, many batch splits", many_tiles, 40, 24, 7.0f},
    };
  }
  const FloatType z_types[] = {FloatType::kFloat32, FloatType::kFloat16, FloatType::kBFloat16};
  const IndexType l_types[] = {IndexType::kInt32, IndexType::kInt64};
  uint64_t seed = 20240611;
  for (MathMode math : {MathMode::k3xTf32, MathMode::kFp32, MathMode::kTf32}) {
    g_math = math;
    for (const Case& c : cases) {
      // Every z / label type in the default mode for two cases; otherwise
      // float32 / int32 and bfloat16 / int64 (default mode) or float32 /
      // int32 only (the other modes).
      const bool all_combos =
          math == MathMode::k3xTf32 && (c.name == "basic" || c.name == "k=300");
      for (FloatType zt : z_types) {
        for (IndexType lt : l_types) {
          const bool first = zt == FloatType::kFloat32 && lt == IndexType::kInt32;
          const bool second = math == MathMode::k3xTf32 && zt == FloatType::kBFloat16 &&
                              lt == IndexType::kInt64;
          if (!all_combos && !first && !second) continue;
          RunCase(c, zt, lt, seed++);
        }
      }
    }
  }
  g_math = MathMode::k3xTf32;
}

// The 3xTF32 register decode (DecodeRegKernel, kRegSoftmax with a TF32 math
// mode) against the FP32 split kernel on the same inputs: both must give the
// same rank and nearest codeword in every row, except where the float64 keys
// put another class within float32 rounding (1e-5 (1 + |key|)) of the
// label's key (rank) or of the best key (nearest): there the two roundings
// may order them either way (counted and printed, never failed). Each
// shape also carries twins across class tiles and splits: codeword n - 2
// duplicates codeword 1 (first and last class tile); row 0 is labelled
// n - 2 with u on M_1 (its twin, 1, must neither outrank it nor lose the
// nearest-codeword tie), row 1, also on M_1, is labelled 1 (its twin n - 2
// must not outrank it). Many class splits at B = 3; several row tiles at
// B = 70 and 130, and at B = 130, n = 700 one split of 11 class tiles per
// block on a small card (the buffer reuse of the tile loop); k = 21 stages
// the label tile by elements, the others by vectors; k = 129 falls back to
// the FP32 split kernel.
void RunDecodeReg(bool quick) {
  struct Shape {
    int64_t B, n, k;
  };
  std::vector<Shape> shapes = {{3, 1001, 32},  {70, 700, 21}, {16, 129, 128},
                               {130, 300, 64}, {130, 700, 16}, {5, 200, 129}};
  if (quick) {
    shapes = {{3, 1001, 32}, {70, 300, 21}, {16, 129, 128}, {130, 700, 16}, {5, 70, 129}};
  }
  uint64_t seed = 880000;
  for (KernelVariant v : {KernelVariant::kRegSoftmax, KernelVariant::kRows64RegSoftmax}) {
    for (MathMode math : {MathMode::k3xTf32, MathMode::kTf32}) {
      for (const Shape& sh : shapes) {
        const int64_t B = sh.B, n = sh.n, k = sh.k;
        Rng rng(seed++);
        std::vector<float> codes(n * k), z(B * k);
        std::vector<int32_t> labels(B);
        for (auto& x : codes) x = static_cast<float>(rng.Normal() / std::sqrt(double(k)));
        for (auto& x : z) x = static_cast<float>(rng.Normal());
        for (auto& y : labels) y = static_cast<int32_t>(rng.Below(n));
        double sq = 0.0;
        for (int64_t j = 0; j < k; ++j) sq += double(codes[k + j]) * codes[k + j];
        for (int64_t j = 0; j < k; ++j) {
          codes[k + j] = static_cast<float>(codes[k + j] / std::sqrt(sq));
          codes[(n - 2) * k + j] = codes[k + j];
          z[j] = 2.0f * codes[k + j];
          z[k + j] = 3.0f * codes[k + j];
        }
        labels[0] = static_cast<int32_t>(n - 2);
        labels[1] = 1;
        DeviceBuffer<float> d_codes(n * k), d_z(B * k);
        DeviceBuffer<int32_t> d_labels(B), d_rank(B), d_rank_ref(B);
        DeviceBuffer<int64_t> d_index(B), d_index_ref(B);
        d_codes.Upload(codes);
        d_z.Upload(z);
        d_labels.Upload(labels);
        for (auto* buf : {&d_rank, &d_rank_ref}) buf->Fill(0xFF);
        for (auto* buf : {&d_index, &d_index_ref}) buf->Fill(0xFF);
        g_variant = v;
        g_math = math;
        CUDA_OK(LabelRank(d_z.ptr, FloatType::kFloat32, d_codes.ptr, d_labels.ptr,
                          IndexType::kInt32, kEpsilon, B, n, k, d_rank.ptr, 0));
        CUDA_OK(Nearest(d_z.ptr, FloatType::kFloat32, d_codes.ptr, kEpsilon, B, n, k,
                        d_index.ptr, 0));
        g_variant = KernelVariant::kV2;
        g_math = MathMode::kFp32;
        CUDA_OK(LabelRank(d_z.ptr, FloatType::kFloat32, d_codes.ptr, d_labels.ptr,
                          IndexType::kInt32, kEpsilon, B, n, k, d_rank_ref.ptr, 0));
        CUDA_OK(Nearest(d_z.ptr, FloatType::kFloat32, d_codes.ptr, kEpsilon, B, n, k,
                        d_index_ref.ptr, 0));
        CUDA_OK(cudaDeviceSynchronize());
        const std::vector<int32_t> rank = d_rank.Download(), rank_ref = d_rank_ref.Download();
        const std::vector<int64_t> index = d_index.Download(), index_ref = d_index_ref.Download();
        // The float64 reference's squared distances (ComputeReference, as
        // RunCase's checks), as keys u.M - 1/2 ||M||^2 = (1 - dist) / 2 of
        // the unit u (no row of z is zero here), and whether another class
        // lies within rounding of class `self`'s key (the label's or the best).
        const Reference ref =
            ComputeReference(z, codes, std::vector<int64_t>(labels.begin(), labels.end()),
                             std::vector<float>(B, 0.0f), 1.0, B, n, k);
        auto key = [&](int64_t b, int64_t i) { return 0.5 * (1.0 - ref.dist[b][i]); };
        auto near_tie = [&](int64_t b, int64_t self) {
          const double at = key(b, self);
          const double slack = 1e-5 * (1.0 + std::fabs(at));
          for (int64_t i = 0; i < n; ++i) {
            if (i != self && std::fabs(key(b, i) - at) <= slack) return true;
          }
          return false;
        };
        int64_t rank_differ = 0, index_differ = 0, near_ties = 0;
        for (int64_t b = 0; b < B; ++b) {
          if (rank[b] == rank_ref[b] && index[b] == index_ref[b]) continue;
          const bool rank_tie = rank[b] != rank_ref[b] && near_tie(b, labels[b]);
          const bool index_tie =
              index[b] != index_ref[b] && index_ref[b] >= 0 && near_tie(b, index_ref[b]);
          rank_differ += rank[b] != rank_ref[b] && !rank_tie;
          index_differ += index[b] != index_ref[b] && !index_tie;
          near_ties += rank_tie || index_tie;
        }
        char name[200], detail[200];
        std::snprintf(name, sizeof(name), "decodereg [math=%s variant=%s B=%lld n=%lld k=%lld]",
                      MathName(math), VariantString(v), static_cast<long long>(B),
                      static_cast<long long>(n), static_cast<long long>(k));
        std::snprintf(detail, sizeof(detail),
                      "%lld rank and %lld nearest of %lld rows differ from the FP32 kernel's "
                      "outside a float64 near-tie (%lld rows differ at one)",
                      static_cast<long long>(rank_differ), static_cast<long long>(index_differ),
                      static_cast<long long>(B), static_cast<long long>(near_ties));
        Report(std::string(name) + " against fp32", rank_differ == 0 && index_differ == 0,
               detail);
        std::snprintf(detail, sizeof(detail),
                      "rank[0] = %d (want 0), rank[1] = %d (want 0), index[0] = %lld (want 1)",
                      rank[0], rank[1], static_cast<long long>(index[0]));
        Report(std::string(name) + " twins across tiles",
               rank[0] == 0 && rank[1] == 0 && index[0] == 1, detail);
      }
    }
  }
  g_math = MathMode::k3xTf32;
  g_variant = KernelVariant::kV2;
}

// The sections of --check-only, in their fixed order. Each seeds its own
// inputs and leaves the math mode, launch variant and scale pointer as it
// found them, so one section run alone (--only) gives the same checks as in
// the whole set.
struct CheckSection {
  const char* name;
  void (*run)(int sms, bool quick);
};
constexpr CheckSection kCheckSections[] = {
    {"cases", RunCases},
    {"empty", [](int, bool) { RunEmptyBatch(); }},
    {"tf32split", [](int sms, bool) { RunTf32Split(sms); }},
    {"plans", [](int, bool) { RunPlanQueries(); }},
    {"observer", [](int, bool) { RunLaunchObserver(); }},
    {"validation", [](int, bool) { RunVariantValidation(); }},
    {"scale", [](int sms, bool) { RunScalePointer(sms); }},
    {"variants", [](int, bool quick) { RunVariants(quick); }},
    {"regsoftmax", [](int, bool quick) { RunRegSoftmax(quick); }},
    {"regfold", [](int, bool) { RunRegFold(); }},
    {"combine", [](int, bool) { RunCombine(); }},
    {"warps8", [](int, bool quick) { RunRegSoftmaxWarps8(quick); }},
    {"rows128", [](int, bool quick) { RunRows128(quick); }},
    {"gradmma", [](int, bool quick) { RunGradMma(quick); }},
    {"gradpersistent", [](int, bool quick) { RunGradPersistent(quick); }},
    {"auto", [](int, bool quick) { RunAuto(quick); }},
    // Late: the checks before them keep their order.
    {"rows128+wgmma", [](int, bool quick) { RunRows128Wgmma(quick); }},
    {"gradmma+wgmma", [](int, bool quick) { RunGradMmaWgmma(quick); }},
    {"decodereg", [](int, bool quick) { RunDecodeReg(quick); }},
};

void RunChecks(int sms, bool quick) {
  for (const CheckSection& section : kCheckSections) {
    if (!g_only_sections.empty() &&
        std::find(g_only_sections.begin(), g_only_sections.end(), section.name) ==
            g_only_sections.end()) {
      continue;
    }
    section.run(sms, quick);
    if (g_math != MathMode::k3xTf32 || g_variant != KernelVariant::kV2 || g_scale_ptr != nullptr) {
      // What --only relies on; a harness bug, not a kernel's.
      std::fprintf(stderr, "harness: check section %s left the math mode, launch variant or "
                           "scale pointer changed\n", section.name);
      std::exit(3);
    }
  }
}


// ---------------------------------------------------------------------------
// Grid of odd shapes (--grid, or --small for the sanitizers): every output
// against the float64 reference, over B x k x n.  Where B * n * k is too large
// for a host reference of every row, the check uses a sample S of at most 8
// rows: the forward outputs, rank and index are compared on S, and grad_loss
// is zero outside S, so the codes gradient (all n x k entries) is exactly
// the sum over S.  The host work is spread over OpenMP threads when the
// harness is built with -Xcompiler -fopenmp.

constexpr double kFullReferenceWork = 5e8;  // B * n * k

void FillNormal(std::vector<float>* v, uint64_t seed, double stddev) {
  const int64_t size = static_cast<int64_t>(v->size());
  const int64_t block = 1 << 16;
#pragma omp parallel for schedule(static)
  for (int64_t start = 0; start < size; start += block) {
    Rng rng(seed * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(start));
    const int64_t end = std::min(size, start + block);
    for (int64_t i = start; i < end; ++i) (*v)[i] = static_cast<float>(rng.Normal() * stddev);
  }
}

struct GridRef {
  std::vector<double> loss, lse, esq, ecode;  // per sampled row (ecode: [S][k])
  std::vector<int64_t> rank_lo, rank_hi;       // accepted rank range per row
  std::vector<double> dmin;                    // nearest distance per row
  std::vector<double> grad;                    // [n][k]
  std::vector<std::vector<double>> dist;       // [S][n] (to check the index)
};

GridRef GridReference(const std::vector<float>& z, const std::vector<float>& codes,
                      const std::vector<int32_t>& labels, const std::vector<float>& g,
                      const std::vector<int64_t>& rows, double scale, int64_t n, int64_t k) {
  const int64_t S = static_cast<int64_t>(rows.size());
  GridRef r;
  r.loss.assign(S, 0.0);
  r.lse.assign(S, 0.0);
  r.esq.assign(S, 0.0);
  r.ecode.assign(S * k, 0.0);
  r.rank_lo.assign(S, 0);
  r.rank_hi.assign(S, 0);
  r.dmin.assign(S, 0.0);
  r.dist.assign(S, std::vector<double>(n, 0.0));
  std::vector<std::vector<double>> u(S, std::vector<double>(k, 0.0));
  for (int64_t s = 0; s < S; ++s) {
    const float* zr = z.data() + rows[s] * k;
    double ss = 0.0;
    for (int64_t j = 0; j < k; ++j) ss += double(zr[j]) * zr[j];
    const double inv = 1.0 / std::sqrt(std::max(ss, double(kEpsilon)));
    for (int64_t j = 0; j < k; ++j) u[s][j] = zr[j] * inv;
  }
  // Distances, parallel over classes.
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const float* m = codes.data() + i * k;
    for (int64_t s = 0; s < S; ++s) {
      double d = 0.0;
      for (int64_t j = 0; j < k; ++j) {
        const double diff = m[j] - u[s][j];
        d += diff * diff;
      }
      r.dist[s][i] = d;
    }
  }
  // Per-row softmax statistics, parallel over the rows.
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t s = 0; s < S; ++s) {
    const std::vector<double>& d = r.dist[s];
    double mx = -std::numeric_limits<double>::infinity();
    for (int64_t i = 0; i < n; ++i) mx = std::max(mx, -0.5 * scale * d[i]);
    double sum = 0.0;
    for (int64_t i = 0; i < n; ++i) sum += std::exp(-0.5 * scale * d[i] - mx);
    r.lse[s] = mx + std::log(sum);
    const int64_t y = labels[rows[s]];
    r.loss[s] = r.lse[s] + 0.5 * scale * d[y];
    const double dy = d[y], slack = 1e-5 * (1.0 + dy);
    r.dmin[s] = *std::min_element(d.begin(), d.end());
    for (int64_t i = 0; i < n; ++i) {
      const double p = std::exp(-0.5 * scale * d[i] - r.lse[s]);
      const float* m = codes.data() + i * k;
      double msq = 0.0;
      for (int64_t j = 0; j < k; ++j) {
        msq += double(m[j]) * m[j];
        r.ecode[s * k + j] += p * m[j];
      }
      r.esq[s] += p * msq;
      if (i != y) {
        if (d[i] < dy - slack) ++r.rank_lo[s];
        if (d[i] < dy + slack) ++r.rank_hi[s];
      }
    }
  }
  // Codes gradient: grad_loss is zero outside the sampled rows.
  r.grad.assign(n * k, 0.0);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const float* m = codes.data() + i * k;
    double* out = r.grad.data() + i * k;
    for (int64_t s = 0; s < S; ++s) {
      const double gb = g[rows[s]];
      if (gb == 0.0) continue;
      const double p = std::exp(-0.5 * scale * r.dist[s][i] - r.lse[s]);
      const double w = scale * gb * (p - (labels[rows[s]] == i ? 1.0 : 0.0));
      for (int64_t j = 0; j < k; ++j) out[j] += w * (u[s][j] - m[j]);
    }
  }
  return r;
}

// check_memory: compare cudaMemGetInfo before and after the kernels (off in
// --small, which runs under compute-sanitizer, whose own allocations would
// show up there).
void RunGridCase(int64_t B, int64_t n, int64_t k, const std::vector<float>& codes,
                 const DeviceBuffer<float>& d_codes, uint64_t seed, bool check_memory) {
  using namespace keras_ecoc::cuda;
  Rng rng(seed);
  const float scale = 6.0f;
  std::vector<float> z(B * k), g(B, 0.0f);
  std::vector<int32_t> labels(B);
  for (auto& v : z) v = static_cast<float>(rng.Normal());
  for (auto& y : labels) y = static_cast<int32_t>(rng.Below(n));
  const bool full = double(B) * n * k <= kFullReferenceWork;
  std::vector<int64_t> rows;
  if (full || B <= 8) {
    for (int64_t b = 0; b < B; ++b) rows.push_back(b);
  } else {
    for (int64_t s = 0; s < 8; ++s) rows.push_back(s * (B - 1) / 7);
  }
  for (int64_t b : rows) g[b] = static_cast<float>(2.0 * rng.Uniform() - 1.0);

  DeviceBuffer<float> d_z(B * k), d_loss(B), d_lse(B), d_ecode(B * k), d_esq(B), d_g(B),
      d_grad(n * k);
  DeviceBuffer<int32_t> d_labels(B), d_rank(B);
  DeviceBuffer<int64_t> d_index(B);
  d_z.Upload(z);
  d_g.Upload(g);
  d_labels.Upload(labels);
  for (auto* buf : {&d_loss, &d_lse, &d_ecode, &d_esq, &d_grad}) buf->Fill(0xFF);
  d_rank.Fill(0xFF);
  d_index.Fill(0xFF);
  auto run_all = [&]() {
    CUDA_OK(Forward(d_z.ptr, FloatType::kFloat32, d_codes.ptr, d_labels.ptr,
                                  IndexType::kInt32, scale, kEpsilon, B, n, k, d_loss.ptr,
                                  d_lse.ptr, d_ecode.ptr, d_esq.ptr, 0));
  CUDA_OK(CodesGrad(d_z.ptr, FloatType::kFloat32, d_codes.ptr, d_labels.ptr,
                                    IndexType::kInt32, scale, kEpsilon, d_lse.ptr, d_g.ptr, B,
                                    n, k, d_grad.ptr, 0));
  CUDA_OK(LabelRank(d_z.ptr, FloatType::kFloat32, d_codes.ptr, d_labels.ptr,
                        IndexType::kInt32, kEpsilon, B, n, k, d_rank.ptr, 0));
    CUDA_OK(Nearest(d_z.ptr, FloatType::kFloat32, d_codes.ptr, kEpsilon, B, n, k,
                              d_index.ptr, 0));
    CUDA_OK(cudaDeviceSynchronize());
  };
  // The first run sizes the workspace (cudaMalloc, outside the kernels) and
  // loads the modules; the measured second run must not lower free memory.
  run_all();
  for (auto* buf : {&d_loss, &d_lse, &d_ecode, &d_esq, &d_grad}) buf->Fill(0xFF);
  d_rank.Fill(0xFF);
  d_index.Fill(0xFF);
  CUDA_OK(cudaDeviceSynchronize());
  size_t free_before = 0, free_after = 0, total = 0;
  CUDA_OK(cudaMemGetInfo(&free_before, &total));
  run_all();
  CUDA_OK(cudaMemGetInfo(&free_after, &total));

  const GridRef ref = GridReference(z, codes, labels, g, rows, scale, n, k);
  const std::vector<float> loss = d_loss.Download(), lse = d_lse.Download(),
                           ecode = d_ecode.Download(), esq = d_esq.Download();
  const std::vector<int32_t> rank = d_rank.Download();
  const std::vector<int64_t> index = d_index.Download();
  const int64_t S = static_cast<int64_t>(rows.size());
  std::vector<float> got_loss(S), got_lse(S), got_esq(S), got_ecode(S * k);
  int64_t rank_bad = 0, index_bad = 0;
  for (int64_t s = 0; s < S; ++s) {
    const int64_t b = rows[s];
    got_loss[s] = loss[b];
    got_lse[s] = lse[b];
    got_esq[s] = esq[b];
    for (int64_t j = 0; j < k; ++j) got_ecode[s * k + j] = ecode[b * k + j];
    if (rank[b] < ref.rank_lo[s] || rank[b] > ref.rank_hi[s]) ++rank_bad;
    const int64_t gi = index[b];
    if (gi < 0 || gi >= n || ref.dist[s][gi] > ref.dmin[s] + 1e-5 * (1.0 + ref.dmin[s])) ++index_bad;
  }
  char prefix[160];
  std::snprintf(prefix, sizeof(prefix), "grid [math=%s%s%s B=%lld n=%lld k=%lld, %s]",
                MathName(g_math), g_variant == KernelVariant::kV2 ? "" : " variant=",
                g_variant == KernelVariant::kV2 ? "" : VariantString(g_variant),
                static_cast<long long>(B), static_cast<long long>(n), static_cast<long long>(k),
                full ? "all rows" : "8 sampled rows");
  const std::string p(prefix);
  const double tol = LossTol();
  CompareFloat(p + " loss", got_loss, ref.loss, tol);
  CompareFloat(p + " lse", got_lse, ref.lse, tol);
  CompareFloat(p + " expected_code", got_ecode, ref.ecode, tol);
  CompareFloat(p + " expected_sqnorm", got_esq, ref.esq, tol);
  CompareFloat(p + " grad_codes", d_grad.Download(), ref.grad, tol);
  char buf[200];
  std::snprintf(buf, sizeof(buf), "%lld of %lld rows outside the reference range",
                static_cast<long long>(rank_bad), static_cast<long long>(S));
  Report(p + " rank", rank_bad == 0, buf);
  std::snprintf(buf, sizeof(buf), "%lld of %lld rows not a nearest codeword",
                static_cast<long long>(index_bad), static_cast<long long>(S));
  Report(p + " index", index_bad == 0, buf);
  if (check_memory) {
    const long long drop =
        static_cast<long long>(free_before) - static_cast<long long>(free_after);
    std::snprintf(buf, sizeof(buf), "free device memory dropped by %lld bytes during the kernels",
                  drop);
    Report(p + " memory", drop <= 0, buf);
  }
}

void RunGrid(bool small, int sms) {
  std::vector<int64_t> Bs = {1, 7, 16, 256}, ks = {1, 31, 128, 1000},
                       ns = {1, 33, 10000, 1000000};
  if (small) {
    Bs = {1, 7};
    ks = {1, 31};
    ns = {1, 33};
  }
  // --small (the sanitizers' run) covers every launch variant, with B = 65
  // for a partial 64-row tile; --grid the one of --variant. auto is left
  // out of --small: it only picks among the others, and the device check's
  // sanitizer steps have fixed time limits.
  std::vector<KernelVariant> variants = {g_variant};
  if (small) {
    Bs.push_back(65);
    variants.clear();
    for (const VariantName& e : kVariants) {
      if (e.variant != KernelVariant::kAuto) variants.push_back(e.variant);
    }
  }
  const KernelVariant given = g_variant;
  uint64_t seed = 777;
  for (int64_t n : ns) {
    for (int64_t k : ks) {
      std::vector<float> codes(n * k);
      FillNormal(&codes, seed++, 1.0 / std::sqrt(double(k)));
      DeviceBuffer<float> d_codes(n * k);
      d_codes.Upload(codes);
      for (KernelVariant v : variants) {
        g_variant = v;
        for (int64_t B : Bs) RunGridCase(B, n, k, codes, d_codes, seed++, !small);
      }
      std::fflush(stdout);
    }
  }
  if (small) {
    // kGradPersistent's blocks loop over class tiles (and reuse their two
    // code buffers) only where the tiles outnumber its one wave of blocks,
    // at most 16 blocks of 128 threads per SM on any card: one case with at
    // least two tiles per block, for the sanitizers.
    const int64_t n = 2 * int64_t{sms} * 16 * 32 + 33, k = 8;
    std::vector<float> codes(n * k);
    FillNormal(&codes, seed++, 1.0 / std::sqrt(double(k)));
    DeviceBuffer<float> d_codes(n * k);
    d_codes.Upload(codes);
    g_variant = KernelVariant::kGradPersistent;
    RunGridCase(7, n, k, codes, d_codes, seed++, false);
    std::fflush(stdout);
  }
  g_variant = given;
}

// --smem-limit: the Python guard (keras_ecoc/ops/_gpu_guard.py) predicts
// that the kernels run every code length up to 2^24 on a card with at least
// GuardSmemBytes() of opt-in shared memory per block (the smallest launch:
// one 8-column stage of 16 rows + 32 classes, double-buffered, plus the
// 16 x 36 logit tile and 2 x 16 row scalars; kernels/cuda/ecoc_kernels.cu.cc
// ChooseChunks), and refuses k > 2^24 (the contract's limit). Checked here:
// a long code (several column stages) runs, and k = 2^24 + 1 is refused.
// The long code is k = 2^16 (--quick, for the CPU emulator: 2^12, still 16
// or more stages per tile on any budget).
int64_t GuardSmemBytes(bool cross_entropy) {
  const int64_t stage = 2 * (16 + 32) * (8 + 4);
  return 4 * (stage + 16 * 36 + (cross_entropy ? 2 * 16 : 0));
}

void RunSmemLimit(int smem_optin, bool quick) {
  using namespace keras_ecoc::cuda;
  const int64_t kLimit = int64_t{1} << 24;
  const int64_t long_k = int64_t{1} << (quick ? 12 : 16);
  for (bool ce : {true, false}) {
    const bool guard_fits = GuardSmemBytes(ce) <= smem_optin;
    for (int64_t k : {long_k, kLimit + 1}) {
      const int64_t B = 1, n = 1;
      const bool want_ok = guard_fits && k <= kLimit;
      const int64_t alloc_k = k <= kLimit ? k : 1;  // the refused call reads nothing
      DeviceBuffer<float> d_z(B * alloc_k), d_codes(n * alloc_k), d_loss(B), d_lse(B),
          d_ecode(B * alloc_k), d_esq(B), d_g(B), d_grad(n * alloc_k);
      DeviceBuffer<int32_t> d_labels(B), d_rank(B);
      for (auto* buf : {&d_z, &d_codes, &d_g}) buf->Fill(0);
      d_labels.Fill(0);
      cudaError_t err;
      if (ce) {
        err = Forward(d_z.ptr, FloatType::kFloat32, d_codes.ptr, d_labels.ptr,
                      IndexType::kInt32, 1.0f, kEpsilon, B, n, k, d_loss.ptr, d_lse.ptr,
                      d_ecode.ptr, d_esq.ptr, 0);
        if (err == cudaSuccess) {
          err = CodesGrad(d_z.ptr, FloatType::kFloat32, d_codes.ptr, d_labels.ptr,
                          IndexType::kInt32, 1.0f, kEpsilon, d_lse.ptr, d_g.ptr, B, n, k,
                          d_grad.ptr, 0);
        }
      } else {
        err = LabelRank(d_z.ptr, FloatType::kFloat32, d_codes.ptr, d_labels.ptr,
                        IndexType::kInt32, kEpsilon, B, n, k, d_rank.ptr, 0);
      }
      if (err == cudaSuccess) err = cudaDeviceSynchronize();
      (void)cudaGetLastError();
      char name[160], detail[200];
      std::snprintf(name, sizeof(name), "shared-memory limit [%s, optin=%d bytes, k=%lld]",
                    ce ? "cross_entropy" : "decode", smem_optin, static_cast<long long>(k));
      std::snprintf(detail, sizeof(detail), "%s (guard: needs %lld bytes, predicts %s)",
                    cudaGetErrorName(err), static_cast<long long>(GuardSmemBytes(ce)),
                    want_ok ? "it runs" : "refused");
      Report(name, want_ok ? err == cudaSuccess : err == cudaErrorInvalidValue, detail);
    }
  }
}

// ---------------------------------------------------------------------------
// Timing (--bench-only): one Markdown table per math mode from CUDA events.

float MedianMs(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// One call's time: `ms` between CUDA events around it, and `host_us`, the
// host's wall-clock time to make the call (planning, workspace, launches;
// the call returns once its kernels are queued). Medians over the repeats.
// Where host_us is close to ms x 1000 the GPU waited on the host: the call
// is bound by its host-side cost (the launches and the plan), not by its
// kernels.
struct CallTime {
  float ms = 0.0f;
  float host_us = 0.0f;
};

template <typename F>
CallTime TimeMs(F&& launch, int warmup, int repeats) {
  cudaEvent_t start, stop;
  CUDA_OK(cudaEventCreate(&start));
  CUDA_OK(cudaEventCreate(&stop));
  for (int i = 0; i < warmup; ++i) CUDA_OK(launch());
  CUDA_OK(cudaDeviceSynchronize());
  std::vector<float> times, host;
  for (int i = 0; i < repeats; ++i) {
    CUDA_OK(cudaEventRecord(start));
    const auto t0 = std::chrono::steady_clock::now();
    CUDA_OK(launch());
    const auto t1 = std::chrono::steady_clock::now();
    CUDA_OK(cudaEventRecord(stop));
    CUDA_OK(cudaEventSynchronize(stop));
    float ms = 0.0f;
    CUDA_OK(cudaEventElapsedTime(&ms, start, stop));
    times.push_back(ms);
    host.push_back(std::chrono::duration<float, std::micro>(t1 - t0).count());
  }
  CUDA_OK(cudaEventDestroy(start));
  CUDA_OK(cudaEventDestroy(stop));
  return {MedianMs(times), MedianMs(host)};
}

// Per-call time the way benchmarks/bench_gpu_loss.py times every other
// method: CUDA events around R back-to-back calls, R from one call so that a
// block lasts about `block_ms` (1 to kMaxBlockCalls), the median over
// `blocks` blocks of block ms / R. A call's host-side cost (plan, launches)
// overlaps the previous call's kernels here, as in a training loop; TimeMs's
// single calls carry it whenever the GPU waits on the host. block_ms <= 0:
// R = 1 (the CPU emulator, whose clock means nothing).
struct BlockTime {
  float ms = 0.0f;
  int calls = 0;  // R
};

template <typename F>
BlockTime TimeBlocks(F&& call, float block_ms, int blocks) {
  constexpr int kMaxBlockCalls = 100;  // bench_gpu_loss.py's --max-calls
  cudaEvent_t start, stop;
  CUDA_OK(cudaEventCreate(&start));
  CUDA_OK(cudaEventCreate(&stop));
  auto block = [&](int calls) {
    CUDA_OK(cudaEventRecord(start));
    for (int i = 0; i < calls; ++i) CUDA_OK(call());
    CUDA_OK(cudaEventRecord(stop));
    CUDA_OK(cudaEventSynchronize(stop));
    float ms = 0.0f;
    CUDA_OK(cudaEventElapsedTime(&ms, start, stop));
    return ms;
  };
  BlockTime out;
  const float one = block(1);  // also the warm-up
  out.calls = block_ms <= 0.0f ? 1
                               : static_cast<int>(std::clamp(block_ms / std::max(one, 1e-3f),
                                                             1.0f, float(kMaxBlockCalls)));
  std::vector<float> per_call;
  for (int b = 0; b < blocks; ++b) per_call.push_back(block(out.calls) / out.calls);
  out.ms = MedianMs(per_call);
  CUDA_OK(cudaEventDestroy(start));
  CUDA_OK(cudaEventDestroy(stop));
  return out;
}

// One call split into its launches (--bench-only's per-launch table): the
// kernels report each launch to an observer (SetLaunchObserver), which
// records a CUDA event on the stream right after it. Launch i's time runs
// from the event before it (the call's start event for the first launch) to
// its own; medians over the repeats. The first launch's time therefore also
// holds the host's time to plan and enqueue it whenever the GPU was idle,
// and the events themselves add a little to the call (compare `traced ms`
// with the untimed column's ms).
struct LaunchTimes {
  std::vector<std::string> names;  // in launch order ("forward prep", ...)
  std::vector<float> ms;           // median per launch
  float total_ms = 0.0f;           // start event to the last launch's, median
  bool stable = true;              // the same launches, in order, every repeat
};

template <typename F>
LaunchTimes TimeLaunches(F&& call, int warmup, int repeats) {
  constexpr size_t kMaxLaunches = 16;  // a forward + codes gradient makes at most 6
  LaunchTrace trace;
  trace.events.resize(kMaxLaunches);
  for (cudaEvent_t& e : trace.events) CUDA_OK(cudaEventCreate(&e));
  cudaEvent_t start;
  CUDA_OK(cudaEventCreate(&start));
  for (int i = 0; i < warmup; ++i) CUDA_OK(call());
  CUDA_OK(cudaDeviceSynchronize());
  LaunchTimes out;
  std::vector<std::vector<float>> per_launch;
  std::vector<float> totals;
  for (int r = 0; r < repeats; ++r) {
    trace.names.clear();
    CUDA_OK(cudaEventRecord(start));
    keras_ecoc::cuda::SetLaunchObserver(RecordLaunch, &trace);
    const cudaError_t err = call();
    keras_ecoc::cuda::SetLaunchObserver(nullptr, nullptr);
    CUDA_OK(err);
    if (trace.names.size() > kMaxLaunches) {
      trace.names.resize(kMaxLaunches);
      out.stable = false;
    }
    if (r == 0) {
      out.names = trace.names;
      per_launch.resize(out.names.size());
    } else if (trace.names != out.names) {
      out.stable = false;
      continue;
    }
    if (out.names.empty()) continue;
    const cudaEvent_t last = trace.events[out.names.size() - 1];
    CUDA_OK(cudaEventSynchronize(last));
    cudaEvent_t prev = start;
    for (size_t i = 0; i < out.names.size(); ++i) {
      float ms = 0.0f;
      CUDA_OK(cudaEventElapsedTime(&ms, prev, trace.events[i]));
      per_launch[i].push_back(ms);
      prev = trace.events[i];
    }
    float total = 0.0f;
    CUDA_OK(cudaEventElapsedTime(&total, start, last));
    totals.push_back(total);
  }
  CUDA_OK(cudaDeviceSynchronize());
  for (const std::vector<float>& v : per_launch) out.ms.push_back(MedianMs(v));
  if (!totals.empty()) out.total_ms = MedianMs(totals);
  for (cudaEvent_t e : trace.events) CUDA_OK(cudaEventDestroy(e));
  CUDA_OK(cudaEventDestroy(start));
  return out;
}

// Dense peaks of the card from its SM count and clock: FP32 FMA lanes and
// TF32 tensor-core rate per SM per clock (datacenter parts: A100 1024, A10 /
// L40 512, H100 2048 TF32 flops; GeForce parts have half the TF32 rate, so
// the % of TF32 peak is understated there). 0 = unknown / none (sm_75).
struct Peaks {
  double fp32 = 0.0, tf32 = 0.0;  // TFLOP/s
};

Peaks CardPeaks(const cudaDeviceProp& prop) {
  Peaks p;
#ifdef KERAS_ECOC_EMULATOR
  // The CPU emulator has no clock to report (and its timings mean nothing).
  (void)prop;
  return p;
#else
  int khz = 0;
  if (cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, 0) != cudaSuccess || khz <= 0) {
    (void)cudaGetLastError();
    return p;
  }
  const int cc = prop.major * 10 + prop.minor;
  const double fp32_per_clk = (cc == 75 || cc == 80) ? 128 : 256;
  const double tf32_per_clk = cc >= 90 ? 2048 : cc == 80 ? 1024 : cc >= 86 ? 512 : 0;
  const double sm_ghz = prop.multiProcessorCount * (khz * 1e-6);
  p.fp32 = sm_ghz * fp32_per_clk * 1e-3;
  p.tf32 = sm_ghz * tf32_per_clk * 1e-3;
  return p;
#endif
}

// The bits that reach the codes gradient only (kGradMma, kGradPersistent):
// the other passes run a variant with them as the variant without them.
constexpr int kCodesGradBits = static_cast<int>(KernelVariant::kGradMma) |
                               static_cast<int>(KernelVariant::kGradPersistent);

// The launch variants --bench-only times (--variant NAME or all); v2 alone
// by default.
std::vector<KernelVariant> g_bench_variants = {KernelVariant::kV2};

// "fp32" for v2 (the rows of earlier runs), "fp32+rows64" for a variant.
std::string ModeLabel(MathMode m, KernelVariant v) {
  std::string label = MathName(m);
  if (v != KernelVariant::kV2) label += std::string("+") + VariantString(v);
  return label;
}

// The bench column (variant-major over `variants`, then the math modes fp32,
// 3xtf32, tf32) whose forward launch column c runs at one cell, on a device
// of compute capability cc: c itself, or the column of the same math mode
// with the variant c's forward resolves to (kCodesGradBits reach the codes
// gradient only, so gradmma and gradpersistent run v2's forward, their
// rows64 forms and rows64+gradmma+wgmma rows64's; auto runs ResolveVariant's
// forward variant), where that column
// is in the list.
int BenchForwardSource(const std::vector<KernelVariant>& variants, int c, int64_t B, int64_t n,
                       int64_t k, int cc) {
  const MathMode modes[3] = {MathMode::kFp32, MathMode::k3xTf32, MathMode::kTf32};
  const MathMode mode = modes[c % 3];
  const KernelVariant v = variants[c / 3];
  int fwd = static_cast<int>(v);
  if (v == KernelVariant::kAuto) {
    fwd = static_cast<int>(keras_ecoc::cuda::ResolveVariant(keras_ecoc::cuda::KernelPass::kForward,
                                                            B, n, k, mode, cc));
  }
  fwd &= ~kCodesGradBits;
  // kWgmma reaches the forward with kRows128 only (205): rows64+gradmma+wgmma
  // (145) runs rows64's forward.
  if ((fwd & static_cast<int>(KernelVariant::kRows128)) == 0) {
    fwd &= ~static_cast<int>(KernelVariant::kWgmma);
  }
  if (fwd == static_cast<int>(v)) return c;
  for (size_t i = 0; i < variants.size(); ++i) {
    if (static_cast<int>(variants[i]) == fwd) return static_cast<int>(i) * 3 + c % 3;
  }
  return c;
}

// --bench-only's table of the decode passes: label rank, the pass of the
// accuracy metrics (ECOCAccuracy, ECOCTopKAccuracy), runs in every training
// and evaluation step that reports accuracy, next to the loss's forward;
// nearest codeword is predict_classes'. Each in FP32 (the default of their
// params: what the library runs) and in 3xTF32 (DecodeRegKernel, on
// sm_80+ with k <= 128). `forward` gives a row's loss forward ms in the
// default math mode and that column's label. FLOPs counted: 2Bnk (the
// keys' inner products).
template <typename RowT, typename ForwardOf>
void PrintDecodeTable(const std::vector<RowT>& rows, ForwardOf forward, const Peaks& peaks,
                      int cc) {
  using keras_ecoc::cuda::KernelPass;
  using keras_ecoc::cuda::ResolveVariant;
  if (rows.empty()) return;
  const std::string fwd_label = forward(rows[0]).second;
  std::printf("\n### Decode passes, variant auto: FP32 (the library's) and 3xTF32\n\n");
  std::printf("label rank: the pass of ECOCAccuracy / ECOCTopKAccuracy, once per training and "
              "evaluation step next to the loss; nearest: predict_classes'. forward: the loss "
              "forward of the %s column. A training step with the accuracy metric runs forward "
              "+ label rank on the codes (the z gradient is elementwise on the forward's "
              "outputs; the codes gradient runs only for trainable codes). TFLOP/s from 2Bnk; "
              "host us: the rank call's.\n\n",
              fwd_label.c_str());
  std::printf("| B | k | n | forward ms | rank fp32 ms | rank 3xtf32 ms | nearest fp32 ms | "
              "nearest 3xtf32 ms | rank fp32 / forward | rank 3xtf32 / forward | "
              "rank fp32 / 3xtf32 | rank fp32 TFLOP/s | rank 3xtf32 TFLOP/s | "
              "rank fp32 %% of FP32 peak | rank fp32 host us | rank 3xtf32 host us | auto ran |\n"
              "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
              "---|\n");
  for (const RowT& r : rows) {
    const float fwd = forward(r).first;
    const double flops = 2.0 * r.B * r.n * r.k;
    const double tf[2] = {flops / (r.rank[0].ms * 1e-3) * 1e-12,
                          flops / (r.rank[1].ms * 1e-3) * 1e-12};
    char fp32[32] = "n/a";
    if (peaks.fp32 > 0) std::snprintf(fp32, sizeof(fp32), "%.1f", 100 * tf[0] / peaks.fp32);
    const std::string ran =
        std::string("fp32 ") +
        VariantString(ResolveVariant(KernelPass::kLabelRank, r.B, r.n, r.k, MathMode::kFp32, cc)) +
        ", 3xtf32 " +
        VariantString(ResolveVariant(KernelPass::kLabelRank, r.B, r.n, r.k, MathMode::k3xTf32,
                                     cc));
    std::printf("| %lld | %lld | %lld | %.4f | %.4f | %.4f | %.4f | %.4f | %.2f | %.2f | %.2f | "
                "%.2f | %.2f | %s | %.1f | %.1f | %s |\n",
                static_cast<long long>(r.B), static_cast<long long>(r.k),
                static_cast<long long>(r.n), fwd, r.rank[0].ms, r.rank[1].ms, r.nearest[0].ms,
                r.nearest[1].ms, r.rank[0].ms / fwd, r.rank[1].ms / fwd,
                r.rank[0].ms / r.rank[1].ms, tf[0], tf[1], fp32, r.rank[0].host_us,
                r.rank[1].host_us, ran.c_str());
  }
}

void RunBench(bool quick, bool tiny, const cudaDeviceProp& prop) {
  using namespace keras_ecoc::cuda;
  const int warmup = tiny ? 0 : quick ? 1 : 3;
  const int repeats = tiny ? 1 : quick ? 3 : 10;
  // The traced columns are timed in blocks of back-to-back calls too
  // (TimeBlocks), as bench_gpu_loss.py times the methods they are compared
  // with; blocks of about 20 ms (the script's are 40 ms: the harness has
  // more columns to time in its step limit).
  const float block_ms = tiny ? 0.0f : 20.0f;
  std::vector<int64_t> Bs = {1, 7, 16, 256, 4096}, ks = {1, 31, 32, 128, 1000},
                       ns = {1, 33, 10000, 100000, 1000000};
  if (quick) {
    // The cells of benchmarks/bench_gpu_loss.py (issue 16's targets).
    Bs = {16, 256, 4096};
    ks = {32, 128};
    ns = {10000, 100000, 1000000};
  }
  if (tiny) {
    // Two cells on which auto runs different forward variants (foldnorms or
    // regsoftmax+warps8 at B = 7, rows64 or rows64+regsoftmax at B = 65):
    // the columns and the JSON under the CPU emulator, no speed.
    Bs = {7, 65};
    ks = {8};
    ns = {33};
  }
  // Skipped: codes above 2^28 floats (1 GiB), or B n k above 3e11 (seconds
  // per call; the float64 grid covers correctness there).
  const double kMaxWork = 3e11;
  const int64_t kMaxCodes = int64_t{1} << 28;
  const Peaks peaks = CardPeaks(prop);
  std::printf("\n## Timings on %s (float32 z, int32 labels, s = 10; median of %d after %d "
              "warm-up; CUDA events)\n\n",
              prop.name, repeats, warmup);
  std::printf("FLOPs counted: forward 4Bnk (logits + expected code), codes gradient 4Bnk. "
              "Peaks: FP32 %.1f TFLOP/s, TF32 %.1f TFLOP/s (SM count x clock x per-SM rate).\n",
              peaks.fp32, peaks.tf32);
  std::printf("host us: the host's wall-clock time to make the call (plan, workspace, "
              "launches), median; near ms x 1000 the GPU waited on the host.\n");
  long long worst_delta = 0;
  const MathMode modes[3] = {MathMode::kFp32, MathMode::k3xTf32, MathMode::kTf32};
  // One column per (variant, math mode), variant-major.
  const int ncols = static_cast<int>(g_bench_variants.size()) * 3;
  auto col_mode = [&](int c) { return modes[c % 3]; };
  auto col_variant = [&](int c) { return g_bench_variants[c / 3]; };
  const int cc = 10 * prop.major + prop.minor;
  struct Row {
    int64_t B, k, n;
    std::vector<float> fwd, both;
    std::vector<float> fwd_host, both_host;  // host microseconds per call (CallTime)
    // The forward of column c at one cell is timed once: a column whose
    // forward is another column's launch (kGradMma and kGradPersistent run
    // their forward as v2, their rows64 forms as rows64, auto as the variant ResolveVariant names, in
    // the same math mode) takes the forward ms of column fwd_src[c]; its
    // forward + codes gradient is still measured as a whole.
    std::vector<int> fwd_src;
    std::vector<size_t> peak;  // workspace + outputs, bytes
    // The traced columns' forward + codes gradient split into its launches
    // (TimeLaunches); empty for the others.
    std::vector<LaunchTimes> launches;
    // The traced columns' forward and forward + codes gradient timed in
    // blocks of back-to-back calls (TimeBlocks); calls == 0 for the others.
    std::vector<BlockTime> fwd_block, both_block;
    // The decode passes once per cell, variant kAuto: label rank
    // (ECOCAccuracy's pass) and nearest codeword (predict_classes'), [0] in
    // FP32 (the default of their params, what the library runs), [1] in
    // 3xTF32 (the register kernel, DecodeRegKernel).
    CallTime rank[2], nearest[2];
  };
  // The columns split into launches: auto's (what a caller gets) where the
  // list has it, else the first variant's; one per math mode.
  const bool have_auto = std::find(g_bench_variants.begin(), g_bench_variants.end(),
                                   KernelVariant::kAuto) != g_bench_variants.end();
  auto traced = [&](int c) {
    return have_auto ? col_variant(c) == KernelVariant::kAuto : c < 3;
  };
  // "" where column m timed its own forward at this row, else the label of
  // the column it took it from ("3xtf32", "tf32+rows64+regsoftmax").
  auto fwd_from = [&](int m, const Row& r) {
    const int src = r.fwd_src[m];
    return src == m ? std::string() : ModeLabel(col_mode(src), col_variant(src));
  };
  // The loss forward the decode passes are set beside, the one a caller
  // gets by default: auto's 3xTF32 column where the list has auto, else the
  // first variant's 3xTF32 column.
  int decode_col = 1;
  for (int m = 1; m < ncols; m += 3) {
    if (col_variant(m) == KernelVariant::kAuto) decode_col = m;
  }
  std::vector<Row> rows;
  // $ECOC_HARNESS_JSON: the rows so far for benchmarks/bench_gpu_loss.py
  // --harness-json (format in its docstring; fwdbwd_ms is forward + codes
  // gradient: the z gradient is elementwise on the forward's outputs),
  // rewritten after every cell (through a temporary file and a rename), so
  // that a run stopped by the device run's step limit keeps the cells it
  // finished. `final`: the last write, which says so on stdout.
  auto write_json = [&](bool final) {
    const char* path = std::getenv("ECOC_HARNESS_JSON");
    if (path == nullptr || !*path) return;
    const std::string tmp = std::string(path) + ".partial";
    FILE* f = std::fopen(tmp.c_str(), "w");
    if (f == nullptr) {
      if (final) std::printf("\nCould not write ECOC_HARNESS_JSON=%s\n", path);
      return;
    }
    std::fprintf(f, "[");
    bool first = true;
    for (const Row& r : rows) {
      for (int m = 0; m < ncols; ++m) {
        // "3xtf32+auto" rows carry what auto ran in the optional "note".
        std::string note =
            col_variant(m) == KernelVariant::kAuto
                ? ", \"note\": \"auto ran " + AutoChoice(col_mode(m), r.B, r.n, r.k, cc) + "\""
                : std::string();
        // "fwd_from": the mode label of the row whose fwd_ms this one
        // repeats (the same forward launch, timed once).
        if (const std::string src = fwd_from(m, r); !src.empty()) {
          note += ", \"fwd_from\": \"" + src + "\"";
        }
        // "launch_ms": the traced columns' call split into its launches,
        // {"forward prep": ms, ...} in launch order.
        if (const LaunchTimes& lt = r.launches[m]; traced(m)) {
          note += ", \"launch_ms\": {";
          for (size_t i = 0; i < lt.names.size(); ++i) {
            char buf[96];
            std::snprintf(buf, sizeof(buf), "%s\"%s\": %.6g", i ? ", " : "",
                          lt.names[i].c_str(), lt.ms[i]);
            note += buf;
          }
          note += "}";
          if (!lt.stable) note += ", \"launch_ms_unstable\": true";
          // "fwd_block_ms", "fwdbwd_block_ms": the same calls timed in
          // blocks of back-to-back calls (TimeBlocks), with the calls per
          // block: what bench_gpu_loss.py compares with its other methods.
          char buf[200];
          std::snprintf(buf, sizeof(buf),
                        ", \"fwd_block_ms\": %.6g, \"fwdbwd_block_ms\": %.6g, "
                        "\"fwd_block_calls\": %d, \"fwdbwd_block_calls\": %d",
                        r.fwd_block[m].ms, r.both_block[m].ms, r.fwd_block[m].calls,
                        r.both_block[m].calls);
          note += buf;
        }
        // "decode_ms": the cell's decode passes (the decode table's row) on
        // the row of the forward they are set beside.
        if (m == decode_col) {
          char buf[200];
          std::snprintf(buf, sizeof(buf),
                        ", \"decode_ms\": {\"rank fp32\": %.6g, \"rank 3xtf32\": %.6g, "
                        "\"nearest fp32\": %.6g, \"nearest 3xtf32\": %.6g}",
                        r.rank[0].ms, r.rank[1].ms, r.nearest[0].ms, r.nearest[1].ms);
          note += buf;
        }
        std::fprintf(f, "%s\n {\"B\": %lld, \"k\": %lld, \"n\": %lld, \"mode\": \"%s\", "
                     "\"fwd_ms\": %.6g, \"fwdbwd_ms\": %.6g, \"peak_bytes\": %zu, "
                     "\"fwd_host_us\": %.6g, \"fwdbwd_host_us\": %.6g%s}",
                     first ? "" : ",", static_cast<long long>(r.B),
                     static_cast<long long>(r.k), static_cast<long long>(r.n),
                     ModeLabel(col_mode(m), col_variant(m)).c_str(), r.fwd[m], r.both[m],
                     r.peak[m], r.fwd_host[m], r.both_host[m], note.c_str());
        first = false;
      }
    }
    std::fprintf(f, "\n]\n");
    const bool ok = std::fclose(f) == 0 && std::rename(tmp.c_str(), path) == 0;
    if (final) {
      if (ok) {
        std::printf("\nTiming rows written to %s (ECOC_HARNESS_JSON).\n", path);
      } else {
        std::printf("\nCould not write ECOC_HARNESS_JSON=%s\n", path);
      }
    }
  };
  // The cells in the order of benchmarks/bench_gpu_loss.py's cell_priority:
  // those issue 16's targets name first (n >= 1e5 with B <= 256), then the
  // other cells with B <= 256, then B > 256, so that the device run's step
  // limit cuts the least useful ones (in (n, k, B) order the n = 1e6 target
  // cells came last). The tables below list the rows in (n, k, B) order.
  auto pass_of = [](int64_t B, int64_t n) { return B > 256 ? 2 : (n >= 100000 ? 0 : 1); };
  auto runs = [&](int64_t B, int64_t k, int64_t n, int pass) {
    return pass_of(B, n) == pass && n * k <= kMaxCodes && double(B) * n * k <= kMaxWork;
  };
  for (int pass = 0; pass < 3; ++pass)
  for (int64_t n : ns) {
    for (int64_t k : ks) {
      if (std::none_of(Bs.begin(), Bs.end(), [&](int64_t B) { return runs(B, k, n, pass); })) {
        continue;
      }
      std::vector<float> codes(n * k);
      FillNormal(&codes, 99 + n + k, 1.0 / std::sqrt(double(k)));
      DeviceBuffer<float> d_codes(n * k);
      d_codes.Upload(codes);
      for (int64_t B : Bs) {
        if (!runs(B, k, n, pass)) continue;
        Rng rng(1234 + B + k + n);
        std::vector<float> z(B * k), g(B, 1.0f / B);
        std::vector<int32_t> labels(B);
        for (auto& v : z) v = static_cast<float>(rng.Normal());
        for (auto& y : labels) y = static_cast<int32_t>(rng.Below(n));
        DeviceBuffer<float> d_z(B * k), d_loss(B), d_lse(B), d_ecode(B * k), d_esq(B), d_g(B),
            d_grad(n * k);
        DeviceBuffer<int32_t> d_labels(B), d_rank(B);
        DeviceBuffer<int64_t> d_index(B);
        d_z.Upload(z);
        d_g.Upload(g);
        d_labels.Upload(labels);
        auto forward = [&]() {
          return Forward(d_z.ptr, FloatType::kFloat32, d_codes.ptr, d_labels.ptr,
                         IndexType::kInt32, 10.0f, kEpsilon, B, n, k, d_loss.ptr, d_lse.ptr,
                         d_ecode.ptr, d_esq.ptr, 0);
        };
        auto both = [&]() {
          cudaError_t err = forward();
          if (err != cudaSuccess) return err;
          return CodesGrad(d_z.ptr, FloatType::kFloat32, d_codes.ptr, d_labels.ptr,
                           IndexType::kInt32, 10.0f, kEpsilon, d_lse.ptr, d_g.ptr, B, n, k,
                           d_grad.ptr, 0);
        };
        Row row{B, k, n, std::vector<float>(ncols), std::vector<float>(ncols),
                std::vector<float>(ncols), std::vector<float>(ncols), std::vector<int>(ncols),
                std::vector<size_t>(ncols), std::vector<LaunchTimes>(ncols),
                std::vector<BlockTime>(ncols), std::vector<BlockTime>(ncols), {}, {}};
        for (int m = 0; m < ncols; ++m) {
          row.fwd_src[m] = BenchForwardSource(g_bench_variants, m, B, n, k, cc);
        }
        for (int m = 0; m < ncols; ++m) {
          const bool own_forward = row.fwd_src[m] == m;
          g_math = col_mode(m);
          g_variant = col_variant(m);
          g_ws_cell = 0;
          CUDA_OK(both());  // sizes the workspace, loads the modules
          // Device bytes beyond the inputs: the larger workspace of the two
          // passes plus the outputs (loss, lse, expected code and squared
          // norm, codes gradient).
          row.peak[m] = g_ws_cell + sizeof(float) * size_t(B * (k + 3) + n * k);
          CUDA_OK(cudaDeviceSynchronize());
          size_t free_before = 0, free_after = 0, total = 0;
          CUDA_OK(cudaMemGetInfo(&free_before, &total));
          if (own_forward) {
            const CallTime t = TimeMs(forward, warmup, repeats);
            row.fwd[m] = t.ms;
            row.fwd_host[m] = t.host_us;
          }
          const CallTime t = TimeMs(both, warmup, repeats);
          row.both[m] = t.ms;
          row.both_host[m] = t.host_us;
          if (traced(m)) {
            row.launches[m] = TimeLaunches(both, warmup, repeats);
            row.fwd_block[m] = TimeBlocks(forward, block_ms, repeats);
            row.both_block[m] = TimeBlocks(both, block_ms, repeats);
          }
          CUDA_OK(cudaMemGetInfo(&free_after, &total));
          worst_delta = std::max(worst_delta, static_cast<long long>(free_before) -
                                                  static_cast<long long>(free_after));
        }
        // After every column: a source column may come later in the list.
        for (int m = 0; m < ncols; ++m) {
          row.fwd[m] = row.fwd[row.fwd_src[m]];
          row.fwd_host[m] = row.fwd_host[row.fwd_src[m]];
        }
        g_variant = KernelVariant::kAuto;
        for (int i = 0; i < 2; ++i) {
          g_math = i == 0 ? MathMode::kFp32 : MathMode::k3xTf32;
          row.rank[i] = TimeMs([&]() {
            return LabelRank(d_z.ptr, FloatType::kFloat32, d_codes.ptr, d_labels.ptr,
                             IndexType::kInt32, kEpsilon, B, n, k, d_rank.ptr, 0);
          }, warmup, repeats);
          row.nearest[i] = TimeMs([&]() {
            return Nearest(d_z.ptr, FloatType::kFloat32, d_codes.ptr, kEpsilon, B, n, k,
                           d_index.ptr, 0);
          }, warmup, repeats);
        }
        rows.push_back(row);
        write_json(false);
      }
    }
  }
  std::stable_sort(rows.begin(), rows.end(), [](const Row& a, const Row& b) {
    return std::tie(a.n, a.k, a.B) < std::tie(b.n, b.k, b.B);
  });
  g_math = MathMode::k3xTf32;
  g_variant = KernelVariant::kV2;
  for (int m = 0; m < ncols; ++m) {
    // auto's table names what each cell ran.
    const bool is_auto = col_variant(m) == KernelVariant::kAuto;
    std::printf("\n### math mode %s, variant %s\n\n", MathName(col_mode(m)),
                VariantString(col_variant(m)));
    // Where this column's forward ms come from: its own launches (""), one
    // other column (its variant name) or, for auto, a column per row ("*").
    std::string from;
    for (size_t i = 0; i < rows.size(); ++i) {
      const int src = rows[i].fwd_src[m];
      const std::string f = src == m ? "" : VariantString(col_variant(src));
      from = i == 0 || f == from ? f : "*";
    }
    if (from == "*") {
      std::printf("forward ms: per row, the column of the forward variant auto ran (the same "
                  "launch, timed once there); forward + codes grad ms measured here.\n\n");
    } else if (!from.empty()) {
      std::printf("forward ms: the %s column's (the same launch, timed once there); forward + "
                  "codes grad ms measured here.\n\n",
                  from.c_str());
    }
    std::printf("| B | k | n | forward ms | forward + codes grad ms | TFLOP/s | %% of FP32 peak "
                "| %% of TF32 peak | forward host us | fwd + grad host us |%s\n"
                "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|%s\n",
                is_auto ? " auto ran |" : "", is_auto ? "---|" : "");
    for (const Row& r : rows) {
      const double tflops = 8.0 * r.B * r.n * r.k / (r.both[m] * 1e-3) * 1e-12;
      char fp32[32] = "n/a", tf32[32] = "n/a";
      if (peaks.fp32 > 0) std::snprintf(fp32, sizeof(fp32), "%.1f", 100 * tflops / peaks.fp32);
      if (peaks.tf32 > 0) std::snprintf(tf32, sizeof(tf32), "%.1f", 100 * tflops / peaks.tf32);
      std::printf("| %lld | %lld | %lld | %.4f | %.4f | %.2f | %s | %s | %.1f | %.1f |%s%s\n",
                  static_cast<long long>(r.B), static_cast<long long>(r.k),
                  static_cast<long long>(r.n), r.fwd[m], r.both[m], tflops, fp32, tf32,
                  r.fwd_host[m], r.both_host[m], is_auto ? AutoChoice(col_mode(m), r.B, r.n, r.k, cc).c_str() : "",
                  is_auto ? " |" : "");
    }
  }
  for (int m = 0; m < ncols; ++m) {
    if (!traced(m)) continue;
    const bool is_auto = col_variant(m) == KernelVariant::kAuto;
    std::printf("\n### Per launch: math mode %s, variant %s\n\n", MathName(col_mode(m)),
                VariantString(col_variant(m)));
    std::printf("One forward + codes gradient call, a CUDA event after each launch; median ms "
                "per launch. The first launch's ms include the host's planning and enqueueing "
                "where the GPU was idle. traced ms: start to the last launch's event; "
                "untraced ms: the same call in the table above. blocks: ms per call in "
                "blocks of back-to-back calls (R calls of about %.0f ms in all, median of %d "
                "blocks), the way bench_gpu_loss.py times its other methods.\n\n",
                block_ms, repeats);
    std::printf("| B | k | n |%s traced ms | untraced ms | fwd ms, blocks | fwd + grad ms, "
                "blocks | R (fwd, fwd + grad) | launches (ms) |\n"
                "|---:|---:|---:|%s---:|---:|---:|---:|---|---|\n",
                is_auto ? " auto ran |" : "", is_auto ? "---|" : "");
    for (const Row& r : rows) {
      const LaunchTimes& lt = r.launches[m];
      std::string parts;
      for (size_t i = 0; i < lt.names.size(); ++i) {
        char buf[96];
        std::snprintf(buf, sizeof(buf), "%s%s %.4f", i ? " · " : "", lt.names[i].c_str(),
                      lt.ms[i]);
        parts += buf;
      }
      if (!lt.stable) parts += " (the launches changed between repeats: first repeat's)";
      std::printf("| %lld | %lld | %lld |%s%s %.4f | %.4f | %.4f | %.4f | %d, %d | %s |\n",
                  static_cast<long long>(r.B), static_cast<long long>(r.k),
                  static_cast<long long>(r.n),
                  is_auto ? (" " + AutoChoice(col_mode(m), r.B, r.n, r.k, cc)).c_str() : "",
                  is_auto ? " |" : "", lt.total_ms, r.both[m], r.fwd_block[m].ms,
                  r.both_block[m].ms, r.fwd_block[m].calls, r.both_block[m].calls,
                  parts.c_str());
    }
  }
  PrintDecodeTable(rows, [&](const Row& r) {
    return std::make_pair(r.fwd[decode_col], ModeLabel(col_mode(decode_col),
                                                       col_variant(decode_col)));
  }, peaks, cc);
  write_json(true);
  std::printf("\nSkipped: codes above %lld floats or B n k above %.0e. Largest workspace "
              "asked for: %zu bytes.\n",
              static_cast<long long>(kMaxCodes), kMaxWork, g_ws_largest);
  std::printf("Largest drop in free device memory while the kernels ran: %lld bytes "
              "(cudaMemGetInfo before/after; the kernels allocate nothing).\n",
              worst_delta);
  std::fflush(stdout);
}

// --profile: the forward alone, once per launch variant of --variant (default
// every variant) in the --math mode (default 3xtf32), at the two cells the
// device run profiles with Nsight Compute (B = 256, n = 1e5, k = 128 and
// B = 16, n = 1e6, k = 128). No warm-up and no timing: ncu replays each
// kernel itself (device_check.sh filters on ForwardSplitKernel).
void RunProfile() {
  using namespace keras_ecoc::cuda;
  struct Cell {
    int64_t B, n, k;
  };
  const Cell cells[] = {{256, 100000, 128}, {16, 1000000, 128}};
  for (const Cell& c : cells) {
    std::vector<float> codes(c.n * c.k), z(c.B * c.k);
    FillNormal(&codes, 5 + c.n, 1.0 / std::sqrt(double(c.k)));
    FillNormal(&z, 6 + c.B, 1.0);
    std::vector<int32_t> labels(c.B);
    Rng rng(7);
    for (auto& y : labels) y = static_cast<int32_t>(rng.Below(c.n));
    DeviceBuffer<float> d_codes(c.n * c.k), d_z(c.B * c.k), d_loss(c.B), d_lse(c.B),
        d_ecode(c.B * c.k), d_esq(c.B);
    DeviceBuffer<int32_t> d_labels(c.B);
    d_codes.Upload(codes);
    d_z.Upload(z);
    d_labels.Upload(labels);
    for (KernelVariant v : g_bench_variants) {
      // kCodesGradBits change the codes gradient only: such a variant's
      // forward is v2's (or rows64's), profiled already.
      if (v != KernelVariant::kAuto && (static_cast<int>(v) & kCodesGradBits) != 0) {
        continue;
      }
      g_variant = v;
      CUDA_OK(Forward(d_z.ptr, FloatType::kFloat32, d_codes.ptr, d_labels.ptr,
                      IndexType::kInt32, 10.0f, kEpsilon, c.B, c.n, c.k, d_loss.ptr,
                      d_lse.ptr, d_ecode.ptr, d_esq.ptr, 0));
      CUDA_OK(cudaDeviceSynchronize());
      std::printf("profiled forward: B=%lld n=%lld k=%lld math=%s variant=%s\n",
                  static_cast<long long>(c.B), static_cast<long long>(c.n),
                  static_cast<long long>(c.k), MathName(g_math), VariantString(v));
    }
    // The codes gradient (2/3 of forward + backward at both cells on the
    // H100 of 2026-11-26) with the row tile kAuto gives it (16 rows at
    // B = 16, 64 at B = 256), without and with kGradMma, and at B = 16 with
    // kGradPersistent (one batch tile; at B = 256 it would run rows64's
    // launch), on the lse of the last forward: device_check.sh's
    // ncu-codes-grad step profiles these five launches (the forward step
    // skips them by kernel name).
    const std::vector<KernelVariant> grad_variants[2] = {
        {KernelVariant::kV2, KernelVariant::kGradMma, KernelVariant::kGradPersistent},
        {KernelVariant::kRows64, KernelVariant::kRows64GradMma}};
    DeviceBuffer<float> d_grad_loss(c.B), d_grad_codes(c.n * c.k);
    d_grad_loss.Upload(std::vector<float>(c.B, 1.0f / static_cast<float>(c.B)));
    for (KernelVariant v : grad_variants[c.B >= 64 ? 1 : 0]) {
      if (std::find(g_bench_variants.begin(), g_bench_variants.end(), v) ==
          g_bench_variants.end()) {
        continue;
      }
      g_variant = v;
      CUDA_OK(CodesGrad(d_z.ptr, FloatType::kFloat32, d_codes.ptr, d_labels.ptr,
                        IndexType::kInt32, 10.0f, kEpsilon, d_lse.ptr, d_grad_loss.ptr, c.B, c.n,
                        c.k, d_grad_codes.ptr, 0));
      CUDA_OK(cudaDeviceSynchronize());
      std::printf("profiled codes gradient: B=%lld n=%lld k=%lld math=%s variant=%s\n",
                  static_cast<long long>(c.B), static_cast<long long>(c.n),
                  static_cast<long long>(c.k), MathName(g_math), VariantString(v));
    }
  }
  g_variant = KernelVariant::kV2;
  std::fflush(stdout);
}

// --auto-table: one line per pass, math mode and shape with what kAuto
// resolves to on a device of compute capability cc, around every threshold
// of the rule (tests/test_cuda_emulator.py compares it with its own copy).
void PrintAutoTable(int cc) {
  using keras_ecoc::cuda::KernelPass;
  const std::pair<KernelPass, const char*> passes[] = {{KernelPass::kForward, "forward"},
                                                       {KernelPass::kCodesGrad, "codes_grad"},
                                                       {KernelPass::kLabelRank, "label_rank"},
                                                       {KernelPass::kNearest, "nearest"}};
  for (const auto& pass : passes) {
    for (MathMode m : {MathMode::kFp32, MathMode::k3xTf32, MathMode::kTf32}) {
      for (int64_t B : {1, 16, 17, 63, 64, 256, 1023, 1024, 2047, 2048, 4096}) {
        for (int64_t n : {10000, 299999, 300000, 1000000}) {
          for (int64_t k : {8, 32, 64, 65, 128, 129}) {
            std::printf("auto cc=%d pass=%s math=%s B=%lld n=%lld k=%lld -> %s\n", cc,
                        pass.second, MathName(m), static_cast<long long>(B),
                        static_cast<long long>(n), static_cast<long long>(k),
                        VariantString(keras_ecoc::cuda::ResolveVariant(pass.first, B, n, k, m,
                                                                       cc)));
          }
        }
      }
    }
  }
}

}  // namespace

const char kUsage[] =
    "usage: %s [--check-only | --bench-only | --grid | --small | --smem-limit | --profile]\n"
    "          [--quick] [--tiny]\n"
    "          [--math fp32|3xtf32|tf32] [--variant V] [--auto-table] [--fail-fast]\n"
    "          [--only S[,S...]]\n"
    "  (default)      the checks, then the benchmark table\n"
    "  --check-only   the checks over odd shapes and dtypes (--quick: the smallest shapes\n"
    "                 that reach every launch variant, for the CPU emulator)\n"
    "  --bench-only   timing tables per math mode (--quick: fewer shapes and repeats;\n"
    "                 --tiny: two small cells, one repeat, for the CPU emulator)\n"
    "  --grid         B in {1,7,16,256} x k in {1,31,128,1000} x n in {1,33,1e4,1e6}\n"
    "  --math MODE    fp32 | 3xtf32 | tf32: the loss passes' mode in --grid / --small\n"
    "                 (default 3xtf32; the checks run every mode, the timings all three)\n"
    "  --variant V    launch variant of the four passes in --grid (gradmma,\n"
    "                 gradpersistent: the codes gradient's; the others run them as\n"
    "                 v2 / rows64),\n"
    "                 --small and --bench-only (default v2; `auto`: what the params\n"
    "                 structs default to, resolved per pass and shape; `all`: --bench-only\n"
    "                 times every variant side by side (but rows64+gradpersistent, the\n"
    "                 launch of gradpersistent or rows64 there), auto's table naming what\n"
    "                 it ran;\n"
    "                 the checks always run every variant)\n"
    "  --auto-table   what auto resolves to on this device, per pass, math mode and shape\n"
    "                 (no kernels run)\n"
    "  --small        a small grid (for compute-sanitizer)\n"
    "  --smem-limit   the Python guard's shared-memory need and code-length limit hold\n"
    "                 (--quick: a long code of 2^12 instead of 2^16)\n"
    "  --profile      one forward per --variant (default: all but auto) at\n"
    "                 B=256,n=1e5,k=128 and B=16,n=1e6,k=128, then the codes\n"
    "                 gradient of each cell's row tile without and with gradmma\n"
    "                 (and gradpersistent at B=16),\n"
    "                 for Nsight Compute (no checks, no timing)\n"
    "  --fail-fast    stop at the first failed check (exit 1)\n"
    "  V              all, or one of\n";

// The usage text, then the names of kVariants and of kCheckSections wrapped
// under it.
void PrintUsage(const char* argv0) {
  std::fprintf(stderr, kUsage, argv0);
  const std::string indent(16, ' ');
  auto print_wrapped = [&](const auto& table) {
    std::string line = indent;
    for (const auto& entry : table) {
      const std::string item = std::string(" ") + entry.name;
      if (line.size() + item.size() > 90) {
        std::fprintf(stderr, "%s\n", line.c_str());
        line = indent;
      }
      line += item;
    }
    std::fprintf(stderr, "%s\n", line.c_str());
  };
  print_wrapped(kVariants);
  std::fprintf(stderr, "  --only S[,S]   --check-only runs only these sections of its checks, in "
                       "their fixed\n                 order; S one of\n");
  print_wrapped(kCheckSections);
}

int main(int argc, char** argv) {
  bool check = true, bench = true, quick = false, grid = false, small = false, smem = false,
       profile = false, variant_given = false, auto_table = false, tiny = false;
  int modes = 0;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--check-only") == 0) {
      bench = false;
      ++modes;
    } else if (std::strcmp(argv[i], "--bench-only") == 0) {
      check = false;
      ++modes;
    } else if (std::strcmp(argv[i], "--grid") == 0) {
      grid = true;
      ++modes;
    } else if (std::strcmp(argv[i], "--small") == 0) {
      small = true;
      ++modes;
    } else if (std::strcmp(argv[i], "--smem-limit") == 0) {
      smem = true;
      ++modes;
    } else if (std::strcmp(argv[i], "--profile") == 0) {
      profile = true;
      ++modes;
    } else if (std::strcmp(argv[i], "--auto-table") == 0) {
      auto_table = true;
      ++modes;
    } else if (std::strcmp(argv[i], "--quick") == 0) {
      quick = true;
    } else if (std::strcmp(argv[i], "--tiny") == 0) {
      tiny = true;
    } else if (std::strcmp(argv[i], "--fail-fast") == 0) {
      g_fail_fast = true;
    } else if (std::strcmp(argv[i], "--only") == 0 && i + 1 < argc) {
      const std::string list = argv[++i];
      size_t start = 0;
      while (start <= list.size()) {
        const size_t end = std::min(list.find(',', start), list.size());
        const std::string name = list.substr(start, end - start);
        const bool known = std::any_of(std::begin(kCheckSections), std::end(kCheckSections),
                                       [&](const CheckSection& s) { return name == s.name; });
        if (!known) {
          std::fprintf(stderr, "--only must be a comma-separated list of check sections (%s); "
                               "got %s\n", TableNames(kCheckSections, ", ").c_str(), list.c_str());
          return 3;
        }
        g_only_sections.push_back(name);
        start = end + 1;
      }
    } else if (std::strcmp(argv[i], "--variant") == 0 && i + 1 < argc) {
      const char* v = argv[++i];
      g_bench_variants.clear();
      for (const VariantName& e : kVariants) {
        // `all` leaves out rows64+gradpersistent: at the timed batch sizes
        // (16, 256, 4096; 64-row tiles from B = 17) it runs gradpersistent's
        // launch (B = 16) or rows64's (one batch tile only up to B = 64), so
        // its column would repeat two others at the device run's expense.
        const bool in_all = e.variant != KernelVariant::kRows64GradPersistent;
        if ((std::strcmp(v, "all") == 0 && in_all) || std::strcmp(v, e.name) == 0) {
          g_bench_variants.push_back(e.variant);
        }
      }
      if (g_bench_variants.empty()) {
        std::fprintf(stderr, "--variant must be one of %s, or all; got %s\n",
                     TableNames(kVariants, ", ").c_str(), v);
        return 3;
      }
      g_variant = g_bench_variants.size() == 1 ? g_bench_variants[0] : KernelVariant::kV2;
      variant_given = true;
    } else if (std::strcmp(argv[i], "--math") == 0 && i + 1 < argc) {
      const char* m = argv[++i];
      if (std::strcmp(m, "fp32") == 0) {
        g_math = MathMode::kFp32;
      } else if (std::strcmp(m, "3xtf32") == 0) {
        g_math = MathMode::k3xTf32;
      } else if (std::strcmp(m, "tf32") == 0) {
        g_math = MathMode::kTf32;
      } else {
        std::fprintf(stderr, "--math must be fp32, 3xtf32 or tf32; got %s\n", m);
        return 3;
      }
    } else {
      PrintUsage(argv[0]);
      return 3;
    }
  }
  if (modes > 1) {
    std::fprintf(stderr, "at most one of --check-only, --bench-only, --grid, --small, "
                         "--smem-limit, --profile, --auto-table\n");
    PrintUsage(argv[0]);
    return 3;
  }
  if (grid || small || smem || profile || auto_table) check = bench = false;
  if (!g_only_sections.empty() && (!check || bench)) {
    std::fprintf(stderr, "--only selects sections of --check-only; use it with --check-only\n");
    PrintUsage(argv[0]);
    return 3;
  }
  if (profile && !variant_given) {
    // Every concrete variant (auto would profile one of them again).
    g_bench_variants.clear();
    for (const VariantName& e : kVariants) {
      if (e.variant != KernelVariant::kAuto) g_bench_variants.push_back(e.variant);
    }
  }

  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0) {
    std::printf("ecoc_harness: no CUDA device available (%s); nothing was run.\n",
                err != cudaSuccess ? cudaGetErrorString(err) : "device count is 0");
    return 2;
  }
  cudaDeviceProp prop;
  CUDA_OK(cudaGetDeviceProperties(&prop, 0));
  int runtime = 0, driver = 0;
  CUDA_OK(cudaRuntimeGetVersion(&runtime));
  CUDA_OK(cudaDriverGetVersion(&driver));
  std::printf("Device 0: %s, compute capability %d.%d, %d SMs, %.1f GiB, %zu bytes opt-in shared "
              "memory per block; runtime %d, driver %d\n",
              prop.name, prop.major, prop.minor, prop.multiProcessorCount,
              prop.totalGlobalMem / double(1 << 30), prop.sharedMemPerBlockOptin, runtime, driver);

  if (check) RunChecks(prop.multiProcessorCount, quick);
  if (grid || small) RunGrid(small, prop.multiProcessorCount);
  if (smem) RunSmemLimit(static_cast<int>(prop.sharedMemPerBlockOptin), quick);
  if (profile) RunProfile();
  if (auto_table) PrintAutoTable(10 * prop.major + prop.minor);
  PrintModeErrors();
  if (check || grid || small || smem) std::printf("\n%d checks, %d failed\n", g_checks, g_failures);
  if (bench) RunBench(quick, tiny, prop);
  if (g_failures > 0) {
    std::printf("FAILED\n");
    return 1;
  }
  std::printf("OK\n");
  return 0;
}
