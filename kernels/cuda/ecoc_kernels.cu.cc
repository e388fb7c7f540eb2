// Launchers, workspace queries and entry points of the fused ECOC kernels
// (contract: ecoc_kernels.h). The kernels themselves live in one
// framework-free header per pass:
//   ecoc_common.cuh      helpers, the logit expression, the prep kernels
//   ecoc_engine.cuh      tile staging and the FP32 / TF32 mma engines
//   ecoc_forward.cuh     forward split kernel (flash-decoding)
//   ecoc_codes_grad.cuh  codes gradient split kernel + its combine
//   ecoc_decode.cuh      label rank / nearest codeword split kernel
//   ecoc_combine.cuh     forward and decode combines
// Compiled by nvcc alone (no TensorFlow headers); see README.md for the
// design, the launch-shape rules and the workspace formula.
//
// Every pass of a call runs on `stream` as:
//   1-2. PrepKernel, one launch: the classes' ||M_i||^2 and logit term (not
//      where the split kernel folds the same chain: MakePlan) and the rows'
//      u_b, -s/2 ||u_b||^2 (label keys)                    -> workspace
//   3. the split kernel on a (tiles x splits) grid           -> partial states
//   4. a combine kernel merging the splits in a fixed order  -> outputs
// Nothing allocates: the workspace is the caller's, sized by the query, which
// runs the same Plan() as the entry point.
#include "ecoc_kernels.h"

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdint>
#include <map>
#include <mutex>
#include <tuple>
#include <type_traits>

#include "ecoc_codes_grad.cuh"
#include "ecoc_codes_grad_mma.cuh"
#include "ecoc_codes_grad_persistent.cuh"
#include "ecoc_codes_grad_wgmma.cuh"
#include "ecoc_combine.cuh"
#include "ecoc_common.cuh"
#include "ecoc_decode.cuh"
#include "ecoc_decode_reg.cuh"
#include "ecoc_engine.cuh"
#include "ecoc_forward.cuh"
#include "ecoc_forward_reg.cuh"
#include "ecoc_launch_shape.h"

namespace keras_ecoc {
namespace cuda {
namespace {

using detail::kClassTile;
using detail::kThreads;

// Rows per batch tile of the split kernels: one 16-row mma tile (v2), or 64
// rows (variant kRows64: 4 warps x 16 rows share each staged class tile)
// when the batch has more than 16 rows, in every pass.
constexpr int kRowTile = 16;
constexpr int kRowTile64 = 64;
constexpr int kRowTile128 = detail::kRegRows128;  // kRows128's forward only
// Upper bound on the class (or batch) splits: bounds the combine's shared
// memory (4 bytes per split) and the grid's y dimension.
constexpr int kMaxSplits = 1024;
// Shared memory a split kernel aims to stay under, so that two blocks fit on
// an SM of sm_80 / sm_90 (164 / 228 KiB); the device's opt-in limit caps it.
constexpr int64_t kSmemTarget = 100 * 1024;
// The same for the 64-row tile: 112 KiB still lets two blocks share an SM
// of sm_90 (228 KiB, 1 KiB reserved per block) and keeps k <= 128 in one
// column stage (forward: 111,104 bytes at k = 128 with the expected-code
// accumulators in global memory); sm_80 / sm_86 / sm_89 then run one block
// per SM where a launch needs more than half of the SM's shared memory.
constexpr int64_t kSmemTarget64 = 112 * 1024;
constexpr int64_t kDefaultSmem = 48 * 1024;

enum class Pass { kForward, kCodesGrad, kRank, kNearest };  // as KernelPass

struct DeviceInfo {
  int device = 0;
  int num_sms = 1;
  int smem_optin = 48 * 1024;
  int cc = 0;  // 10 * major + minor
};

// What MakePlan asks the runtime, remembered per process: a device's
// attributes and a kernel's occupancy never change while the process runs,
// and every call plans twice (the workspace query and the entry point), so
// that only the first call of a shape pays for the queries; later ones make
// no runtime call but cudaGetDevice. One lock for both tables: an entry is
// written once, read on every call, and the tables stay small (devices x
// kernels x shared-memory sizes that occurred).
std::mutex& PlanCacheMutex() {
  static std::mutex* mu = new std::mutex;  // never destroyed: safe at exit
  return *mu;
}

struct OccupancyKey {
  int device;
  const void* fn;
  int threads;
  int64_t smem_bytes;
  bool operator<(const OccupancyKey& o) const {
    return std::tie(device, fn, threads, smem_bytes) <
           std::tie(o.device, o.fn, o.threads, o.smem_bytes);
  }
};

// An unbounded workload of distinct code lengths stops adding entries here
// (it then queries per call, as before the cache).
constexpr size_t kMaxCachedOccupancies = 4096;

std::map<int, DeviceInfo>& DeviceInfoCache() {
  static auto* cache = new std::map<int, DeviceInfo>;
  return *cache;
}

std::map<OccupancyKey, int>& OccupancyCache() {
  static auto* cache = new std::map<OccupancyKey, int>;
  return *cache;
}

cudaError_t ReadDeviceInfo(int device, DeviceInfo* info) {
  int major = 0, minor = 0;
  cudaError_t err = cudaSuccess;
  if ((err = cudaDeviceGetAttribute(&info->num_sms, cudaDevAttrMultiProcessorCount,
                                    device)) != cudaSuccess ||
      (err = cudaDeviceGetAttribute(&info->smem_optin,
                                    cudaDevAttrMaxSharedMemoryPerBlockOptin, device)) !=
          cudaSuccess ||
      (err = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device)) !=
          cudaSuccess ||
      (err = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device)) !=
          cudaSuccess) {
    return err;
  }
  info->cc = 10 * major + minor;
  return cudaSuccess;
}

// The current device and its attributes (read once per device).
cudaError_t GetDeviceInfo(DeviceInfo* info) {
  cudaError_t err = cudaGetDevice(&info->device);
  if (err != cudaSuccess) return err;
  {
    std::lock_guard<std::mutex> lock(PlanCacheMutex());
    const auto it = DeviceInfoCache().find(info->device);
    if (it != DeviceInfoCache().end()) {
      *info = it->second;
      return cudaSuccess;
    }
  }
  // Outside the lock: a runtime call may take long (the first one creates
  // the context). Two threads may both read; they store the same values.
  if ((err = ReadDeviceInfo(info->device, info)) != cudaSuccess) return err;
  std::lock_guard<std::mutex> lock(PlanCacheMutex());
  DeviceInfoCache().emplace(info->device, *info);
  return cudaSuccess;
}

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }
size_t AlignUp(size_t x) {
  return (x + kWorkspaceAlignment - 1) / kWorkspaceAlignment * kWorkspaceAlignment;
}

// The launch shape and workspace layout of one call. Computed identically by
// the workspace query and the entry point.
struct Plan {
  int math = detail::kMathFp32;  // effective engine
  int row_tile = kRowTile;       // rows per batch tile (16, 64; 128: kRows128's forward)
  bool fold = false;             // forward: ||M||^2 from the staged tiles
  bool prep_classes = true;      // PrepClasses fills ||M||^2, ct in the workspace
  bool reg = false;              // forward: ForwardRegKernel (kRegSoftmax);
                                 // rank, nearest: DecodeRegKernel
  int reg_warps = 4;             // its warps per block (8: kWarps8)
  bool reg_fold = false;         // its ||M||^2 from the logits' code fragments
  bool reg_wgmma = false;        // kRows128's products on wgmma (kWgmma, sm_90a)
  int reg_kmax = detail::kRegMaxK;  // its KMAX (4 warps: kRegShortK where kp <= 32)
  bool grad_mma = false;         // codes gradient: CodesGradMmaKernel (kGradMma)
  bool grad_wgmma = false;       // ... as CodesGradWgmmaKernel (kGradMma | kWgmma, sm_90a)
  bool grad_persistent = false;  // codes gradient: CodesGradPersistentKernel
  int grad_stages = 2;           // codes gradient: stage buffers (CodesGradArgs::stages)
  int warp_splits = 1;           // partial states per (row, split) (reg: WC)
  int64_t kp = 8;                // row stride of u: k rounded up to 8 (>= 8)
  int kc = 8;                    // columns per stage
  int nchunks = 1;               // stages per tile (kp / kc, rounded up)
  bool acc_in_smem = false;      // forward acc / gradient G in shared memory
  int splits = 1;                // class splits (grad: batch splits)
  int64_t tiles = 0;             // class tiles (grad: batch tiles) to split
  int64_t grid_x = 0;            // batch tiles (grad: class tiles)
  int64_t smem_bytes = 0;        // of the split kernel
  int smem_optin = 0;            // the device's opt-in limit (RaiseSmemLimit)
  // Forward combine (ForwardCombineKernel; its columns per block follow
  // from k): threads per block, column-tile blocks per row.
  int combine_threads = kThreads;
  unsigned combine_grid_y = 1;
  // Workspace byte offsets.
  size_t u = 0, rowc = 0, sqn = 0, ct = 0;
  size_t a = 0, b = 0, c = 0, d = 0;  // pass-specific regions
  size_t total = 0;
};

// The split kernel a plan launches and its block size, chosen here once:
// MakePlan sizes the grid with its occupancy, the launchers launch it.
template <typename Args>
struct SplitKernel {
  void (*fn)(Args) = nullptr;
  int threads = kThreads;
};

template <int kMath>
SplitKernel<detail::ForwardSplitArgs> ForwardKernelFor(const Plan& p) {
  using detail::ForwardSplitKernel;
  const bool rows64 = p.row_tile == kRowTile64;
  if constexpr (kMath != detail::kMathFp32) {
    using detail::ForwardRegKernel;
    if (p.reg && p.reg_warps == 8) {
      if (p.row_tile == kRowTile128) {
        return {p.reg_wgmma
                    ? ForwardRegKernel<kMath, kRowTile128, 8, false, detail::kRegMaxK, true>
                    : ForwardRegKernel<kMath, kRowTile128, 8>,
                8 * detail::kWarpSize};
      }
      return {rows64 ? ForwardRegKernel<kMath, kRowTile64, 8> : ForwardRegKernel<kMath, kRowTile, 8>,
              8 * detail::kWarpSize};
    }
    constexpr int kW = detail::kWarps;
    constexpr int kShort = detail::kRegShortK;
    const bool short_row = p.reg_kmax == kShort;  // MakePlan's choice
    if (p.reg && p.reg_fold) {
      if (short_row) {
        return {rows64 ? ForwardRegKernel<kMath, kRowTile64, kW, true, kShort>
                       : ForwardRegKernel<kMath, kRowTile, kW, true, kShort>};
      }
      return {rows64 ? ForwardRegKernel<kMath, kRowTile64, kW, true>
                     : ForwardRegKernel<kMath, kRowTile, kW, true>};
    }
    if (p.reg) {
      if (short_row) {
        return {rows64 ? ForwardRegKernel<kMath, kRowTile64, kW, false, kShort>
                       : ForwardRegKernel<kMath, kRowTile, kW, false, kShort>};
      }
      return {rows64 ? ForwardRegKernel<kMath, kRowTile64> : ForwardRegKernel<kMath, kRowTile>};
    }
  }
  if (rows64) {
    return {p.fold ? ForwardSplitKernel<kMath, kRowTile64, true>
                   : ForwardSplitKernel<kMath, kRowTile64, false>};
  }
  return {p.fold ? ForwardSplitKernel<kMath, kRowTile, true>
                 : ForwardSplitKernel<kMath, kRowTile, false>};
}

template <int kMath>
SplitKernel<detail::CodesGradArgs> CodesGradKernelFor(const Plan& p) {
  const bool rows64 = p.row_tile == kRowTile64;
  if (p.grad_persistent) {
    return {rows64 ? detail::CodesGradPersistentKernel<kMath, kRowTile64>
                   : detail::CodesGradPersistentKernel<kMath, kRowTile>};
  }
  if constexpr (kMath != detail::kMathFp32) {
    if (p.grad_mma) {
      // The instantiation for the row: one column tile of G per warp at
      // kp <= 32, two at kp <= 64, four above (the wgmma kernel: one m-tile
      // of G^T up to kp = 64, two above).
      using detail::CodesGradMmaKernel;
      constexpr int kShort = detail::kRegShortK, kMid = detail::kGradMmaMidK;
      if (p.grad_wgmma) {
        using detail::CodesGradWgmmaKernel;
        if (p.kp <= kShort) return {CodesGradWgmmaKernel<kMath, kShort>};
        if (p.kp <= kMid) return {CodesGradWgmmaKernel<kMath, kMid>};
        return {CodesGradWgmmaKernel<kMath>};
      }
      if (p.kp <= kShort) {
        return {rows64 ? CodesGradMmaKernel<kMath, kRowTile64, kShort>
                       : CodesGradMmaKernel<kMath, kRowTile, kShort>};
      }
      if (p.kp <= kMid) {
        return {rows64 ? CodesGradMmaKernel<kMath, kRowTile64, kMid>
                       : CodesGradMmaKernel<kMath, kRowTile, kMid>};
      }
      return {rows64 ? CodesGradMmaKernel<kMath, kRowTile64> : CodesGradMmaKernel<kMath, kRowTile>};
    }
  }
  return {rows64 ? detail::CodesGradSplitKernel<kMath, kRowTile64>
                 : detail::CodesGradSplitKernel<kMath, kRowTile>};
}

// f(std::integral_constant<int, kMath>) for the plan's engine.
template <typename F>
auto WithMath(int math, F&& f) {
  switch (math) {
    case detail::kMath3xTf32:
      return f(std::integral_constant<int, detail::kMath3xTf32>{});
    case detail::kMathTf32:
      return f(std::integral_constant<int, detail::kMathTf32>{});
    default:
      return f(std::integral_constant<int, detail::kMathFp32>{});
  }
}

SplitKernel<detail::ForwardSplitArgs> ForwardKernelFor(const Plan& p) {
  return WithMath(p.math, [&p](auto m) { return ForwardKernelFor<decltype(m)::value>(p); });
}

SplitKernel<detail::CodesGradArgs> CodesGradKernelFor(const Plan& p) {
  return WithMath(p.math, [&p](auto m) { return CodesGradKernelFor<decltype(m)::value>(p); });
}

// Label rank (rank = true) or nearest codeword: the FP32 split kernel, or
// the 3xTF32 register kernel (p.reg).
SplitKernel<detail::DecodeSplitArgs> DecodeKernelFor(bool rank, const Plan& p) {
  const bool rows64 = p.row_tile == kRowTile64;
  if (p.reg) {
    if (rank) {
      return {rows64 ? detail::DecodeRegKernel<true, kRowTile64>
                     : detail::DecodeRegKernel<true, kRowTile>};
    }
    return {rows64 ? detail::DecodeRegKernel<false, kRowTile64>
                   : detail::DecodeRegKernel<false, kRowTile>};
  }
  if (rank) {
    return {rows64 ? detail::DecodeSplitKernel<true, kRowTile64>
                   : detail::DecodeSplitKernel<true, kRowTile>};
  }
  return {rows64 ? detail::DecodeSplitKernel<false, kRowTile64>
                 : detail::DecodeSplitKernel<false, kRowTile>};
}

// A launch above the default 48 KiB of dynamic shared memory first raises
// the kernel's limit, to the device's opt-in maximum rather than to this
// launch's size: every caller then sets the same value, so a concurrent call
// of another shape cannot lower the limit between this call's plan and its
// launch. LaunchSplit sets it before every such launch, not once per
// process: a cudaDeviceReset elsewhere in the process would drop it.
template <typename Args>
cudaError_t RaiseSmemLimit(const SplitKernel<Args>& kernel, int64_t smem_bytes, int smem_optin) {
  if (smem_bytes <= kDefaultSmem) return cudaSuccess;
  return cudaFuncSetAttribute(reinterpret_cast<const void*>(kernel.fn),
                              cudaFuncAttributeMaxDynamicSharedMemorySize, smem_optin);
}

// Blocks of a split kernel that one SM holds at once, as the runtime's
// occupancy calculator counts them (registers, shared memory, threads, the
// per-SM block limit); at least 1, so that a launch that cannot be resident
// still reports its own error. Asked once per (device, kernel, block size,
// shared memory) and remembered (PlanCacheMutex).
template <typename Args>
cudaError_t BlocksPerSm(const SplitKernel<Args>& kernel, const Plan& p, const DeviceInfo& info,
                        int* blocks) {
  const void* fn = reinterpret_cast<const void*>(kernel.fn);
  const OccupancyKey key{info.device, fn, kernel.threads, p.smem_bytes};
  {
    std::lock_guard<std::mutex> lock(PlanCacheMutex());
    const auto it = OccupancyCache().find(key);
    if (it != OccupancyCache().end()) {
      *blocks = it->second;
      return cudaSuccess;
    }
  }
  // The calculator counts a launch above the kernel's current limit as not
  // resident: raise it first.
  cudaError_t err = RaiseSmemLimit(kernel, p.smem_bytes, info.smem_optin);
  if (err != cudaSuccess) return err;
  err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(blocks, fn, kernel.threads,
                                                      static_cast<size_t>(p.smem_bytes));
  if (err != cudaSuccess) return err;
  *blocks = std::max(*blocks, 1);
  std::lock_guard<std::mutex> lock(PlanCacheMutex());
  if (OccupancyCache().size() < kMaxCachedOccupancies) OccupancyCache().emplace(key, *blocks);
  return cudaSuccess;
}

cudaError_t SplitBlocksPerSm(Pass pass, const Plan& p, const DeviceInfo& info, int* blocks) {
  switch (pass) {
    case Pass::kForward:
      return BlocksPerSm(ForwardKernelFor(p), p, info, blocks);
    case Pass::kCodesGrad:
      return BlocksPerSm(CodesGradKernelFor(p), p, info, blocks);
    default:
      return BlocksPerSm(DecodeKernelFor(pass == Pass::kRank, p), p, info, blocks);
  }
}

int64_t SplitSmemFloats(Pass pass, int bt, bool fold, int kc, int64_t k, bool resident) {
  switch (pass) {
    case Pass::kForward:
      return detail::ForwardSmemFloats(bt, kc, k, resident, fold);
    case Pass::kCodesGrad:
      return detail::CodesGradSmemFloats(bt, kc, k, resident);
    default:
      return detail::DecodeSmemFloats(bt, kc);
  }
}

// Column chunking: the whole (padded) code row in one stage with the
// accumulators in shared memory when that fits the target, else the whole
// row with the accumulators in global memory, else the widest multiple of 8
// that fits (a code length of any size runs, in several stages per tile).
bool ChooseChunks(Pass pass, int64_t k, int64_t budget, Plan* p) {
  const bool has_acc = pass == Pass::kForward || pass == Pass::kCodesGrad;
  const int bt = p->row_tile;
  const bool fold = p->fold;
  p->kp = std::max<int64_t>(8, CeilDiv(k, 8) * 8);
  if (p->kp <= INT_MAX / 2) {
    const int full = static_cast<int>(p->kp);
    if (has_acc && SplitSmemFloats(pass, bt, fold, full, k, true) * 4 <= budget) {
      p->kc = full;
      p->nchunks = 1;
      p->acc_in_smem = true;
      return true;
    }
    if (SplitSmemFloats(pass, bt, fold, full, k, false) * 4 <= budget) {
      p->kc = full;
      p->nchunks = 1;
      p->acc_in_smem = false;
      return true;
    }
  }
  // Widest kc (multiple of 8) with SplitSmemFloats(kc, no acc) <= budget:
  // the stage term is linear in kc.
  const int64_t fixed = SplitSmemFloats(pass, bt, fold, 0, k, false) * 4;
  const int64_t per_col = 2 * int64_t{bt + kClassTile} * 4;
  const int64_t kc = (budget - fixed) / per_col / 8 * 8;
  if (kc < 8) return false;
  p->kc = static_cast<int>(std::min<int64_t>(kc, p->kp));
  p->nchunks = static_cast<int>(CeilDiv(p->kp, p->kc));
  p->acc_in_smem = false;
  return true;
}

// The plan of a kernel that takes the whole padded row (kp columns) in one
// stage with its accumulators out of shared memory (ForwardRegKernel,
// CodesGradMmaKernel, CodesGradPersistentKernel), and its shared memory.
void UseOneStage(Plan* p, int64_t kp, int64_t smem_floats) {
  p->kp = kp;
  p->kc = static_cast<int>(kp);
  p->nchunks = 1;
  p->acc_in_smem = false;
  p->smem_bytes = smem_floats * 4;
}

bool BadSizes(const ProblemArgs& pr) {
  return pr.batch < 0 || pr.num_classes < 0 || pr.code_length < 0 ||
         // Class ids, ranks and nearest indices are int32 (ecoc_combine.cuh).
         pr.code_length > (int64_t{1} << 24) || pr.num_classes > INT32_MAX ||
         pr.batch > (int64_t{1} << 40);
}

bool BadTypes(const ProblemArgs& pr) {
  return pr.z_type != FloatType::kFloat32 && pr.z_type != FloatType::kFloat16 &&
         pr.z_type != FloatType::kBFloat16;
}

bool BadLabelType(IndexType t) {
  return t != IndexType::kInt32 && t != IndexType::kInt64;
}

bool BadVariant(KernelVariant v) {
  const int i = static_cast<int>(v);
  // kAuto (-1); 0-5; kWarps8 only with kRegSoftmax (12, 13); kGradMma
  // alone or with kRows64 (16, 17); kGradPersistent the same (32, 33);
  // kRows128 only with kRows64RegSoftmaxWarps8 (77); kWgmma only with 77
  // (205) or with kRows64GradMma (145).
  return i != 77 && i != 145 && i != 205 &&
         (i < -1 || i > 33 || (i > 5 && i < 12) || (i > 13 && i < 16) || (i > 17 && i < 32));
}

cudaError_t MakePlan(Pass pass, const ProblemArgs& pr, MathMode math, KernelVariant variant,
                     Plan* p) {
  if (BadVariant(variant)) return cudaErrorInvalidValue;
  DeviceInfo info;
  cudaError_t err = GetDeviceInfo(&info);
  if (err != cudaSuccess) return err;
  p->smem_optin = info.smem_optin;
  const int64_t B = pr.batch, n = pr.num_classes, k = pr.code_length;
  if (variant == KernelVariant::kAuto) {
    variant = ResolveVariant(static_cast<KernelPass>(pass), B, n, k, math, info.cc);
  }
  const bool loss_pass = pass == Pass::kForward || pass == Pass::kCodesGrad;
  p->math = detail::kMathFp32;
  if (info.cc >= 80) {
    if (math == MathMode::k3xTf32) p->math = detail::kMath3xTf32;
    // An order decision never rests on a plain TF32 product.
    if (math == MathMode::kTf32) p->math = loss_pass ? detail::kMathTf32 : detail::kMath3xTf32;
  }
  const int v = static_cast<int>(variant);
  const bool rows64 = (v & static_cast<int>(KernelVariant::kRows64)) != 0;
  p->row_tile = rows64 && B > kRowTile ? kRowTile64 : kRowTile;
  p->fold = pass == Pass::kForward && (v & static_cast<int>(KernelVariant::kFoldNorms)) != 0;
  // kRegSoftmax: the register-softmax forward where it applies (a TF32
  // engine, the whole padded row in registers, the launch within the opt-in
  // shared memory); otherwise the same call runs the v2 split kernel.
  const bool reg_wanted = pass == Pass::kForward &&
                          (v & static_cast<int>(KernelVariant::kRegSoftmax)) != 0;
  const int64_t kp_reg = std::max<int64_t>(8, CeilDiv(k, 8) * 8);
  // kRows128: the 128-row 8-warp kernel with pre-split code tiles where the
  // batch has more than one 64-row tile and its shared memory fits the
  // device (3xTF32: 200 KiB at kp = 128, an H100 or H200; an A100's 163 KiB
  // up to kp = 48); otherwise the same call runs as kRows64RegSoftmaxWarps8.
  // kWgmma: that kernel with its products on wgmma, on a compute capability
  // 9.0 device, where the fatbinary holds sm_90a code (its wrappers trap in
  // any other image); otherwise as kRows128.
  const bool rows128_wanted = (v & static_cast<int>(KernelVariant::kRows128)) != 0;
  const bool wgmma_wanted = (v & static_cast<int>(KernelVariant::kWgmma)) != 0;
#ifdef KERAS_ECOC_SM90A_IMAGE
  const bool wgmma_image = info.cc == 90;
#else
  const bool wgmma_image = false;
#endif
  if (reg_wanted && rows128_wanted && p->math != detail::kMathFp32 &&
      kp_reg <= detail::kRegMaxK && B > kRowTile64) {
    const bool wg = wgmma_wanted && wgmma_image;
    const int64_t smem_floats = detail::ForwardRows128SmemFloats(
        static_cast<int>(kp_reg), p->math == detail::kMath3xTf32, wg);
    if (smem_floats * 4 <= info.smem_optin) {
      p->row_tile = kRowTile128;
      p->reg = true;
      p->reg_wgmma = wg;
      p->reg_warps = 8;
      // Its warps' class groups (one: 8 row warps of 16 rows), no merge.
      p->warp_splits = detail::RegWarpSplits(kRowTile128, 8);
      p->reg_kmax = detail::kRegMaxK;
      UseOneStage(p, kp_reg, smem_floats);
    }
  }
  if (reg_wanted && !p->reg && p->math != detail::kMathFp32 && kp_reg <= detail::kRegMaxK) {
    // kWarps8: the block merges its warps' states, one state per split.
    const int reg_warps = (v & static_cast<int>(KernelVariant::kWarps8)) != 0 ? 8 : 4;
    // One row tile: the forward would read the codes twice, once in
    // PrepClasses and once here; the kernel folds the norms from the
    // fragments it loads instead (ecoc_forward_reg.cuh, kFold: the same
    // bits). With more row tiles the fold's work repeats per tile while the
    // prep pass stays one read, so those keep the prep.
    const bool reg_fold = reg_warps == 4 && B <= p->row_tile;
    // The instantiation ForwardKernelFor launches (its KMAX), and whether
    // it keeps the small halves of its pre-split code tiles.
    const int kmax =
        reg_warps == 4 && kp_reg <= detail::kRegShortK ? detail::kRegShortK : detail::kRegMaxK;
    const bool small_halves = p->math == detail::kMath3xTf32 &&
                              detail::RegPreSplitsCodes(p->row_tile, reg_warps, reg_fold, kmax);
    const int64_t smem_floats =
        detail::ForwardRegSmemFloats(p->row_tile, static_cast<int>(kp_reg), small_halves);
    if (smem_floats * 4 <= info.smem_optin) {
      p->reg = true;
      p->reg_warps = reg_warps;
      p->warp_splits = reg_warps == 8 ? 1 : detail::RegWarpSplits(p->row_tile);
      p->reg_fold = reg_fold;
      p->reg_kmax = kmax;
      UseOneStage(p, kp_reg, smem_floats);
    }
  }
  // Rank and nearest with kRegSoftmax in 3xTF32: the register kernel where
  // the padded row fits one stage within the opt-in shared memory (4 warps,
  // one state per (row, split) after its in-block merge); otherwise the
  // FP32 split kernel.
  if (!loss_pass && (v & static_cast<int>(KernelVariant::kRegSoftmax)) != 0 &&
      p->math != detail::kMathFp32 && kp_reg <= detail::kRegMaxK &&
      detail::DecodeRegSmemFloats(p->row_tile, static_cast<int>(kp_reg)) * 4 <=
          info.smem_optin) {
    p->reg = true;
    UseOneStage(p, kp_reg, detail::DecodeRegSmemFloats(p->row_tile, static_cast<int>(kp_reg)));
  }
  if (!loss_pass && !p->reg) p->math = detail::kMathFp32;
  const int64_t budget = std::min<int64_t>(
      info.smem_optin, p->row_tile == kRowTile64 ? kSmemTarget64 : kSmemTarget);
  // kGradMma: the codes gradient's second product on the mma engine where
  // it applies (a TF32 engine, kp <= kRegMaxK so that G fits the registers,
  // one column stage with one u buffer within the budget); otherwise the
  // same call runs the v2 split kernel. G is not in shared memory: the
  // smaller formula. Two u buffers to begin with; the stage count is
  // settled below, with the batch tiles and the occupancy.
  const bool grad_mma_wanted = pass == Pass::kCodesGrad &&
                               (v & static_cast<int>(KernelVariant::kGradMma)) != 0;
  const bool split_w = p->math == detail::kMath3xTf32;
  // With kWgmma (145): both of its products on wgmma where the batch tile
  // has 64 rows, on a compute capability 9.0 device with sm_90a code, within
  // the budget (CodesGradWgmmaKernel); otherwise as kGradMma.
  auto grad_mma_floats = [&](bool wg, int64_t kp, int stages) {
    return wg ? detail::CodesGradWgSmemFloats(static_cast<int>(kp), stages, split_w)
              : detail::CodesGradMmaSmemFloats(p->row_tile, static_cast<int>(kp), stages, split_w);
  };
  if (grad_mma_wanted && p->math != detail::kMathFp32 && kp_reg <= detail::kRegMaxK &&
      grad_mma_floats(false, kp_reg, 1) * 4 <= budget) {
    p->grad_mma = true;
    p->grad_wgmma = wgmma_wanted && wgmma_image && p->row_tile == kRowTile64 &&
                    grad_mma_floats(true, kp_reg, 1) * 4 <= budget;
    UseOneStage(p, kp_reg, grad_mma_floats(p->grad_wgmma, kp_reg, 2));
  }
  // kGradPersistent: persistent blocks where the batch is one row tile and
  // one stage holds the padded row within the budget; otherwise the same
  // call runs the split kernel.
  const bool grad_persistent_wanted =
      pass == Pass::kCodesGrad &&
      (v & static_cast<int>(KernelVariant::kGradPersistent)) != 0;
  if (grad_persistent_wanted && B > 0 && B <= p->row_tile && kp_reg <= INT_MAX / 2 &&
      detail::CodesGradPersistentSmemFloats(p->row_tile, static_cast<int>(kp_reg)) * 4 <=
          budget) {
    p->grad_persistent = true;
    UseOneStage(p, kp_reg,
                detail::CodesGradPersistentSmemFloats(p->row_tile, static_cast<int>(kp_reg)));
  }
  const bool fixed_stage = p->reg || p->grad_mma || p->grad_persistent;
  if (!fixed_stage && !ChooseChunks(pass, k, budget, p)) {
    // A long code that leaves no room for 8 columns of the 64-row tile
    // still runs on the 16-row tile.
    if (p->row_tile == kRowTile) return cudaErrorInvalidValue;
    p->row_tile = kRowTile;
    if (!ChooseChunks(pass, k, std::min<int64_t>(info.smem_optin, kSmemTarget), p)) {
      return cudaErrorInvalidValue;
    }
  }
  if (!fixed_stage) {
    p->smem_bytes = SplitSmemFloats(pass, p->row_tile, p->fold, p->kc, k, p->acc_in_smem) * 4;
  }
  // Stage buffers of a codes gradient whose row is one stage (every
  // kGradMma launch): one where the batch is one row tile, since its second
  // buffer would never be filled (the 16-row kGradMma launch of B = 16,
  // k = 128 held 53.6 KiB, 4 blocks by shared memory on the H100 of
  // 2026-11-27, with DRAM at 50 % of its peak; the column chunks were chosen
  // for two stages and stay: the same bits). kGradMma over several batch
  // tiles keeps a second u buffer only where it fits the budget and costs no
  // block per SM: the 64-row launch at k = 128 held 111 KB, 2 blocks (2
  // warps per scheduler) per SM on that H100, with about half its issue
  // slots empty and its warps stalled mostly on fixed-latency dependencies;
  // a u tile's copy from L2 is short beside the tile's products (about
  // 14 µs per tile and block there), so a block waiting for it hides behind
  // the other resident blocks. The occupancy calculator counts registers on
  // a GPU (not in the emulator, which counts shared memory, threads and
  // blocks only).
  if (pass == Pass::kCodesGrad && !p->grad_persistent && p->nchunks == 1) {
    Plan one = *p;
    one.grad_stages = 1;
    one.smem_bytes =
        4 * (p->grad_mma
                 ? grad_mma_floats(p->grad_wgmma, p->kc, 1)
                 : detail::CodesGradSmemFloats(p->row_tile, p->kc, k, p->acc_in_smem, 1));
    bool use_one = B <= p->row_tile || (p->grad_mma && p->smem_bytes > budget);
    if (!use_one && p->grad_mma) {
      const auto kernel = CodesGradKernelFor(*p);
      int two_blocks = 0, one_blocks = 0;
      if ((err = BlocksPerSm(kernel, *p, info, &two_blocks)) != cudaSuccess) return err;
      if ((err = BlocksPerSm(kernel, one, info, &one_blocks)) != cudaSuccess) return err;
      use_one = one_blocks > two_blocks;
    }
    if (use_one) {
      p->grad_stages = 1;
      p->smem_bytes = one.smem_bytes;
    }
  }
  // The folded forward, and the codes gradient where one stage holds the
  // whole code row, compute ||M||^2 of their class tiles from the staged
  // tiles (AccumulateFoldedNorms; the codes-gradient kernels decide the same
  // way, on nchunks == 1).
  p->prep_classes =
      !p->fold && !p->reg_fold && !(pass == Pass::kCodesGrad && p->nchunks == 1);

  // Splits: launch_shape::ChooseSplits has the rule and the reason; the
  // codes gradient keeps to one wave, since each of its splits takes a
  // 4·n·k-byte buffer and a combine pass over it.
  int blocks_per_sm = 1;
  if ((err = SplitBlocksPerSm(pass, *p, info, &blocks_per_sm)) != cudaSuccess) return err;
  const int64_t slots = int64_t{info.num_sms} * blocks_per_sm;
  const int64_t row_tiles = CeilDiv(B, p->row_tile);
  const int64_t class_tiles = CeilDiv(n, p->reg ? detail::kRegClassTile : kClassTile);
  int64_t other = 0;
  if (pass == Pass::kCodesGrad) {
    p->grid_x = class_tiles;
    p->tiles = row_tiles;
    other = class_tiles;
  } else {
    p->grid_x = row_tiles;
    p->tiles = class_tiles;
    other = row_tiles;
  }
  const int64_t splits = launch_shape::ChooseSplits(
      other, p->tiles, slots, kMaxSplits,
      pass == Pass::kCodesGrad ? 1 : launch_shape::kMaxSplitWaves);
  p->splits = static_cast<int>(splits);
  // Persistent blocks (one batch tile, so one split): one wave of them, each
  // looping over every gridDim.x-th class tile.
  if (p->grad_persistent) p->grid_x = std::min(class_tiles, slots);
  if (p->grid_x > INT_MAX) return cudaErrorInvalidValue;
  if (pass == Pass::kForward) {
    // The combine: a block per row and column tile (ForwardCombineKernel),
    // column tiles only while the rows alone leave SMs idle: at least two
    // blocks per SM where the columns allow (B = 16, k = 128 on an H100:
    // 16 x 4 blocks), one block per row where the batch fills the card.
    const int64_t states = int64_t{p->splits} * p->warp_splits;
    const int cols = detail::ForwardCombineColumns(k);
    p->combine_threads = detail::ForwardCombineThreads(states, cols);
    const int64_t col_tiles = CeilDiv(k, cols);
    const int64_t per_row = B > 0 ? CeilDiv(2 * int64_t{info.num_sms}, B) : 1;
    p->combine_grid_y =
        static_cast<unsigned>(std::max<int64_t>(1, std::min({col_tiles, per_row, int64_t{65535}})));
  }

  // Workspace: u [B, kp], rowc [B], sqn [n], ct [n], then per pass.
  size_t off = 0;
  auto take = [&off](size_t bytes) {
    const size_t at = off;
    off += AlignUp(bytes);
    return at;
  };
  const size_t Bs = static_cast<size_t>(B), ns = static_cast<size_t>(n),
               ks = static_cast<size_t>(k),
               S = static_cast<size_t>(splits) * static_cast<size_t>(p->warp_splits);
  p->u = take(Bs * static_cast<size_t>(p->kp) * 4);
  p->rowc = take(Bs * 4);
  p->sqn = take(ns * 4);
  p->ct = take(ns * 4);
  switch (pass) {
    case Pass::kForward:
      p->a = take(Bs * 4);           // label_logit
      p->b = take(Bs * S * 4);       // part_lse
      p->c = take(Bs * S * 4);       // part_sqn
      p->d = take(Bs * S * ks * 4);  // part_acc
      break;
    case Pass::kCodesGrad:
      p->a = take(S > 1 ? S * ns * ks * 4 : 0);  // per-split G
      break;
    case Pass::kRank:
      p->a = take(Bs * 4);      // label_key
      p->b = take(Bs * S * 8);  // part_count
      p->c = take(Bs * S * 4);  // part_bad
      break;
    case Pass::kNearest:
      p->a = take(Bs * S * 4);  // part_key
      p->b = take(Bs * S * 8);  // part_index
      p->c = take(Bs * S * 4);  // part_bad
      break;
  }
  p->total = off;
  return cudaSuccess;
}

template <typename T>
T* At(void* base, size_t offset) {
  return reinterpret_cast<T*>(static_cast<char*>(base) + offset);
}

unsigned GridFor(int64_t items, int64_t per_block, int64_t cap) {
  return static_cast<unsigned>(std::max<int64_t>(1, std::min(CeilDiv(items, per_block), cap)));
}

// SetLaunchObserver's hook: off (null) unless the harness times launches.
std::atomic<LaunchObserver> g_launch_observer{nullptr};
std::atomic<void*> g_launch_context{nullptr};

// After each enqueue: the launch's error, and the observer's call (only for
// a launch that was enqueued).
cudaError_t Launched(const char* launch, cudaError_t err, cudaStream_t stream) {
  if (err != cudaSuccess) return err;
  if (const LaunchObserver observer = g_launch_observer.load(std::memory_order_acquire)) {
    observer(launch, stream, g_launch_context.load(std::memory_order_acquire));
  }
  return cudaSuccess;
}

template <typename Args>
cudaError_t LaunchSplit(const char* launch, const SplitKernel<Args>& kernel, const Plan& p,
                        const Args& args, cudaStream_t stream) {
  const cudaError_t err = RaiseSmemLimit(kernel, p.smem_bytes, p.smem_optin);
  if (err != cudaSuccess) return err;
  const dim3 grid(static_cast<unsigned>(p.grid_x), static_cast<unsigned>(p.splits));
  void (*const fn)(Args) = kernel.fn;  // a plain name: the emulator rewrites `name<<<`
  fn<<<grid, kernel.threads, static_cast<size_t>(p.smem_bytes), stream>>>(args);
  return Launched(launch, cudaGetLastError(), stream);
}

// Steps 1 and 2 of every pass.
cudaError_t LaunchPrep(const char* launch, const ProblemArgs& pr, const Plan& p, void* ws,
                       float scale, const float* scale_ptr, bool keys, const void* labels,
                       IndexType label_type, bool label_keys, cudaStream_t stream) {
  detail::PrepArgs a{};
  a.z = pr.z;
  a.codes = pr.codes;
  a.labels = labels;
  a.labels_int64 = label_type == IndexType::kInt64;
  a.scale = scale;
  a.scale_ptr = keys ? nullptr : scale_ptr;
  a.keys = keys;
  a.epsilon = pr.epsilon;
  a.batch = pr.batch;
  a.num_classes = pr.num_classes;
  a.code_length = pr.code_length;
  a.kp = p.kp;
  a.u = At<float>(ws, p.u);
  a.rowc = At<float>(ws, p.rowc);
  a.sqn = At<float>(ws, p.sqn);
  a.ct = At<float>(ws, p.ct);
  a.label_key = label_keys ? At<float>(ws, p.a) : nullptr;
  // One launch: the rows' blocks first, then the classes' (PrepKernel).
  const unsigned cap = 65535;
  const unsigned row_blocks = pr.batch > 0 ? GridFor(pr.batch, detail::kWarps, cap) : 0;
  const unsigned class_blocks =
      pr.num_classes > 0 && p.prep_classes
          ? GridFor(pr.num_classes, detail::kWarps * detail::kPrepClassesPerWarp, cap)
          : 0;
  const unsigned grid = row_blocks + class_blocks;
  if (grid == 0) return cudaSuccess;
  switch (pr.z_type) {
    case FloatType::kFloat32:
      detail::PrepKernel<float><<<grid, kThreads, 0, stream>>>(a, row_blocks);
      break;
    case FloatType::kFloat16:
      detail::PrepKernel<__half><<<grid, kThreads, 0, stream>>>(a, row_blocks);
      break;
    case FloatType::kBFloat16:
      detail::PrepKernel<__nv_bfloat16><<<grid, kThreads, 0, stream>>>(a, row_blocks);
      break;
  }
  return Launched(launch, cudaGetLastError(), stream);
}

// z and codes may be null only when they have no elements (k = 0).
bool NullInputs(const ProblemArgs& pr) {
  return pr.code_length > 0 && (pr.z == nullptr || pr.codes == nullptr);
}

bool CodesVec(const ProblemArgs& pr) {
  return pr.code_length % 4 == 0 && reinterpret_cast<uintptr_t>(pr.codes) % 16 == 0;
}

cudaError_t CheckWorkspace(const Plan& p, void* ws, size_t bytes) {
  if (bytes < p.total) return cudaErrorInvalidValue;
  if (p.total > 0 && (ws == nullptr ||
                      reinterpret_cast<uintptr_t>(ws) % kWorkspaceAlignment != 0)) {
    return cudaErrorInvalidValue;
  }
  return cudaSuccess;
}

cudaError_t ForwardPlan(const ForwardParams& params, Plan* p) {
  const ProblemArgs& pr = params.problem;
  if (BadSizes(pr) || BadTypes(pr) || BadLabelType(params.label_type)) {
    return cudaErrorInvalidValue;
  }
  if (pr.batch > 0 && pr.num_classes == 0) return cudaErrorInvalidValue;
  return MakePlan(Pass::kForward, pr, params.math, params.variant, p);
}

cudaError_t CodesGradPlan(const CodesGradParams& params, Plan* p) {
  const ProblemArgs& pr = params.problem;
  if (BadSizes(pr) || BadTypes(pr) || BadLabelType(params.label_type)) {
    return cudaErrorInvalidValue;
  }
  return MakePlan(Pass::kCodesGrad, pr, params.math, params.variant, p);
}

cudaError_t RankPlan(const LabelRankParams& params, Plan* p) {
  const ProblemArgs& pr = params.problem;
  if (BadSizes(pr) || BadTypes(pr) || BadLabelType(params.label_type)) {
    return cudaErrorInvalidValue;
  }
  if (pr.batch > 0 && pr.num_classes == 0) return cudaErrorInvalidValue;
  return MakePlan(Pass::kRank, pr, params.math, params.variant, p);
}

cudaError_t NearestPlan(const NearestParams& params, Plan* p) {
  const ProblemArgs& pr = params.problem;
  if (BadSizes(pr) || BadTypes(pr)) return cudaErrorInvalidValue;
  if (pr.batch > 0 && pr.num_classes == 0) return cudaErrorInvalidValue;
  return MakePlan(Pass::kNearest, pr, params.math, params.variant, p);
}

}  // namespace

void SetLaunchObserver(LaunchObserver observer, void* context) {
  // The context first: a pass that sees the new observer sees its context.
  g_launch_context.store(context, std::memory_order_release);
  g_launch_observer.store(observer, std::memory_order_release);
}

// kAuto's rule, fitted to the H200 timings of every variant in every math
// mode (docs/device_runs/2026-11-27-h200/run2_harness_timing.json, tree
// fc87b08, B in {16, 256, 4096}, k in {32, 128}, n in {1e4, 1e5, 1e6}; the
// tables and the gain per cell are in README.md, "Launch variant choice").
// Where the TF32 engines do not apply (FP32 math, sm_75, k > 128) it keeps
// the choices of the H100 fit of 2026-11-26 (docs/device_runs/
// 2026-11-26-h100-variants), but for the forward's row tile above k = 64
// (three runs since: below). Thresholds inside the gaps of the grids were
// NOT measured: B = 64 (a full 64-row tile; the grids have 16 and 256),
// B = 1024 (between 256 and 4096), n = 300,000 (between 1e5 and 1e6); nor
// were code lengths other than 32 and 128. Other cards run the same rule
// untimed.
KernelVariant ResolveVariant(KernelPass pass, int64_t batch, int64_t num_classes,
                             int64_t code_length, MathMode math, int cc) {
  // 64-row tiles stage the codes 4 times less often: faster from B = 256 in
  // the codes gradient (every mode and engine) and in the register-softmax
  // forward, the same launch as 16-row tiles at B = 16.
  const bool rows64 = batch >= 64;
  // The engine: FP32 below sm_80 whatever was asked (MakePlan).
  const MathMode engine = cc >= 80 ? math : MathMode::kFp32;
  // Both mma paths hold a whole padded code row (kp <= kRegMaxK).
  const bool mma = engine != MathMode::kFp32 && code_length <= detail::kRegMaxK;
  // Order decisions (rank, nearest) were not timed per variant: the FP32
  // split kernel's v2 as before; asked for in a TF32 mode, the register
  // kernel (3xTF32), with the forward's row tile. Not timed either.
  if (pass == KernelPass::kLabelRank || pass == KernelPass::kNearest) {
    if (!mma) return KernelVariant::kV2;
    return rows64 ? KernelVariant::kRows64RegSoftmax : KernelVariant::kRegSoftmax;
  }
  if (pass == KernelPass::kCodesGrad) {
    // The second product on the mma engine: 1.1-2.6x (3xTF32) and 1.3-4.2x
    // (TF32) faster than the FP32 second product of the same row tile.
    if (mma) return rows64 ? KernelVariant::kRows64GradMma : KernelVariant::kGradMma;
    // FP32 engine, one 16-row tile: the persistent kernel (the split
    // kernel's bits) is 1.1-1.4x faster than the split kernel in every
    // FP32 cell at B = 16.
    if (batch <= 16) return KernelVariant::kGradPersistent;
    return rows64 ? KernelVariant::kRows64 : KernelVariant::kV2;
  }
  if (mma) {
    // Register softmax: 1.1-7.7x faster than the best split-kernel forward
    // in every timed cell of both TF32 modes; 64-row tiles from B = 256 (at
    // B = 4096 too: 1.25-1.6x the 16-row tiles since the k <= 32
    // instantiations of 2026-11-27).
    if (rows64) return KernelVariant::kRows64RegSoftmax;
    // 8 warps on the one 16-row tile: 1.2x faster at k = 32, n = 1e5, within
    // 5 % at 1e4, 1.3-1.5x slower at 1e6; at k = 128 1.1-1.8x slower.
    const bool warps8 = code_length <= 32 && num_classes < 300000;
    return warps8 ? KernelVariant::kRegSoftmaxWarps8 : KernelVariant::kRegSoftmax;
  }
  // The split kernel. One 16-row tile (B <= 16): folding ||M||^2 into the
  // tile saves the prep pass: 3-19 % in FP32 and TF32 (H100), mixed in 3xTF32.
  if (batch <= 16) {
    return engine == MathMode::k3xTf32 ? KernelVariant::kV2 : KernelVariant::kFoldNorms;
  }
  // 64-row tiles: up to 1.5x faster at B = 256, up to 2x slower at 4096
  // (H100, 2026-11-26), but at k = 128 1.05-1.25x slower than 16-row tiles
  // at B = 256 in the three runs since (H200 and H100 of 2026-11-27, H200 of
  // 2026-11-28; n = 1e4 to 1e6), within 11 % either way at k = 32; k = 33-127
  // was not timed: up to 64 (the geometric middle) takes k = 32's choice.
  return rows64 && batch < 1024 && code_length <= 64 ? KernelVariant::kRows64
                                                      : KernelVariant::kV2;
}

cudaError_t EcocForwardWorkspaceSize(const ForwardParams& params, size_t* bytes) {
  if (bytes == nullptr) return cudaErrorInvalidValue;
  Plan p;
  const cudaError_t err = ForwardPlan(params, &p);
  *bytes = err == cudaSuccess && params.problem.batch > 0 ? p.total : 0;
  return err;
}

cudaError_t EcocCodesGradWorkspaceSize(const CodesGradParams& params, size_t* bytes) {
  if (bytes == nullptr) return cudaErrorInvalidValue;
  Plan p;
  const cudaError_t err = CodesGradPlan(params, &p);
  const ProblemArgs& pr = params.problem;
  *bytes = err == cudaSuccess && pr.batch > 0 && pr.num_classes > 0 && pr.code_length > 0
               ? p.total
               : 0;
  return err;
}

cudaError_t EcocLabelRankWorkspaceSize(const LabelRankParams& params, size_t* bytes) {
  if (bytes == nullptr) return cudaErrorInvalidValue;
  Plan p;
  const cudaError_t err = RankPlan(params, &p);
  *bytes = err == cudaSuccess && params.problem.batch > 0 ? p.total : 0;
  return err;
}

cudaError_t EcocNearestWorkspaceSize(const NearestParams& params, size_t* bytes) {
  if (bytes == nullptr) return cudaErrorInvalidValue;
  Plan p;
  const cudaError_t err = NearestPlan(params, &p);
  *bytes = err == cudaSuccess && params.problem.batch > 0 ? p.total : 0;
  return err;
}

cudaError_t EcocCrossEntropyForward(const ForwardParams& params, cudaStream_t stream) {
  const ProblemArgs& pr = params.problem;
  Plan p;
  cudaError_t err = ForwardPlan(params, &p);
  if (err != cudaSuccess) return err;
  if (pr.batch == 0) return cudaSuccess;
  if (NullInputs(pr) || params.labels == nullptr ||
      params.loss == nullptr || params.lse == nullptr || params.expected_sqnorm == nullptr ||
      (pr.code_length > 0 && params.expected_code == nullptr)) {
    return cudaErrorInvalidValue;
  }
  void* ws = params.workspace;
  if ((err = CheckWorkspace(p, ws, params.workspace_bytes)) != cudaSuccess) return err;
  if ((err = LaunchPrep("forward prep", pr, p, ws, params.scale, params.scale_ptr, false,
                        nullptr, params.label_type, false, stream)) != cudaSuccess) {
    return err;
  }
  detail::ForwardSplitArgs a{};
  a.u = At<float>(ws, p.u);
  a.rowc = At<float>(ws, p.rowc);
  a.sqn = At<float>(ws, p.sqn);
  a.ct = At<float>(ws, p.ct);
  a.codes = pr.codes;
  a.labels = params.labels;
  a.labels_int64 = params.label_type == IndexType::kInt64;
  a.codes_vec = CodesVec(pr);
  a.acc_in_smem = p.acc_in_smem;
  a.scale = params.scale;
  a.scale_ptr = params.scale_ptr;
  a.batch = pr.batch;
  a.num_classes = pr.num_classes;
  a.code_length = pr.code_length;
  a.kp = p.kp;
  a.kc = p.kc;
  a.nchunks = p.nchunks;
  a.splits = p.splits;
  a.class_tiles = p.tiles;
  a.label_logit = At<float>(ws, p.a);
  a.part_lse = At<float>(ws, p.b);
  a.part_sqn = At<float>(ws, p.c);
  a.part_acc = At<float>(ws, p.d);
  if ((err = LaunchSplit("forward split", ForwardKernelFor(p), p, a, stream)) != cudaSuccess) return err;
  detail::ForwardCombineArgs c{};
  c.part_lse = a.part_lse;
  c.part_sqn = a.part_sqn;
  c.part_acc = a.part_acc;
  c.label_logit = a.label_logit;
  c.labels = params.labels;
  c.labels_int64 = a.labels_int64;
  c.batch = pr.batch;
  c.num_classes = pr.num_classes;
  c.code_length = pr.code_length;
  c.splits = p.splits * p.warp_splits;  // each warp's state in the reg kernel
  c.loss = params.loss;
  c.lse = params.lse;
  c.expected_code = params.expected_code;
  c.expected_sqnorm = params.expected_sqnorm;
  const dim3 combine_grid(GridFor(pr.batch, 1, INT_MAX), p.combine_grid_y);
  const size_t combine_smem = static_cast<size_t>(
      detail::ForwardCombineSmemFloats(c.splits, p.combine_threads) * 4);
  detail::ForwardCombineKernel<<<combine_grid, p.combine_threads, combine_smem, stream>>>(c);
  return Launched("forward combine", cudaGetLastError(), stream);
}

cudaError_t EcocCrossEntropyCodesGrad(const CodesGradParams& params, cudaStream_t stream) {
  const ProblemArgs& pr = params.problem;
  Plan p;
  cudaError_t err = CodesGradPlan(params, &p);
  if (err != cudaSuccess) return err;
  if (pr.num_classes == 0 || pr.code_length == 0) return cudaSuccess;
  if (params.grad_codes == nullptr) return cudaErrorInvalidValue;
  if (pr.batch == 0) {
    // Fully overwritten, with zeros.
    return Launched("codes-grad zero",
                    cudaMemsetAsync(params.grad_codes, 0,
                                    static_cast<size_t>(pr.num_classes * pr.code_length) * 4,
                                    stream),
                    stream);
  }
  if (NullInputs(pr) || params.labels == nullptr ||
      params.lse == nullptr || params.grad_loss == nullptr) {
    return cudaErrorInvalidValue;
  }
  void* ws = params.workspace;
  if ((err = CheckWorkspace(p, ws, params.workspace_bytes)) != cudaSuccess) return err;
  if ((err = LaunchPrep("codes-grad prep", pr, p, ws, params.scale, params.scale_ptr, false,
                        nullptr, params.label_type, false, stream)) != cudaSuccess) {
    return err;
  }
  detail::CodesGradArgs a{};
  a.u = At<float>(ws, p.u);
  a.rowc = At<float>(ws, p.rowc);
  a.ct = At<float>(ws, p.ct);
  a.codes = pr.codes;
  a.labels = params.labels;
  a.labels_int64 = params.label_type == IndexType::kInt64;
  a.codes_vec = CodesVec(pr);
  a.g_in_smem = p.acc_in_smem;
  a.scale = params.scale;
  a.scale_ptr = params.scale_ptr;
  a.lse = params.lse;
  a.grad_loss = params.grad_loss;
  a.batch = pr.batch;
  a.num_classes = pr.num_classes;
  a.code_length = pr.code_length;
  a.kp = p.kp;
  a.kc = p.kc;
  a.nchunks = p.nchunks;
  a.stages = p.grad_stages;
  a.splits = p.splits;
  a.batch_tiles = p.tiles;
  a.out = p.splits > 1 ? At<float>(ws, p.a) : params.grad_codes;
  err = LaunchSplit("codes-grad split", CodesGradKernelFor(p), p, a, stream);
  if (err != cudaSuccess || p.splits == 1) return err;
  const int64_t elems = pr.num_classes * pr.code_length;
  detail::CodesGradCombineKernel<<<GridFor(elems, kThreads, 65535), kThreads, 0, stream>>>(
      a.out, p.splits, elems, params.scale, params.scale_ptr, params.grad_codes);
  return Launched("codes-grad combine", cudaGetLastError(), stream);
}

namespace {

cudaError_t LaunchDecode(bool rank, const ProblemArgs& pr, const Plan& p, void* ws,
                         const void* labels, IndexType label_type, int32_t* rank_out,
                         int64_t* index_out, cudaStream_t stream) {
  // The register kernel computes the label keys itself, on the tensor
  // cores (ecoc_decode_reg.cuh); the split kernel reads the prep's.
  cudaError_t err = LaunchPrep(rank ? "rank prep" : "nearest prep", pr, p, ws, 1.0f, nullptr,
                               true, labels, label_type, rank && !p.reg, stream);
  if (err != cudaSuccess) return err;
  detail::DecodeSplitArgs a{};
  a.u = At<float>(ws, p.u);
  a.ct = At<float>(ws, p.ct);
  a.codes = pr.codes;
  a.label_key = rank && !p.reg ? At<float>(ws, p.a) : nullptr;
  a.labels = rank ? labels : nullptr;
  a.labels_int64 = label_type == IndexType::kInt64;
  a.codes_vec = CodesVec(pr);
  a.batch = pr.batch;
  a.num_classes = pr.num_classes;
  a.code_length = pr.code_length;
  a.kp = p.kp;
  a.kc = p.kc;
  a.nchunks = p.nchunks;
  a.splits = p.splits;
  a.class_tiles = p.tiles;
  if (rank) {
    a.part_count = At<long long>(ws, p.b);
    a.part_bad = At<int>(ws, p.c);
    err = LaunchSplit("rank split", DecodeKernelFor(true, p), p, a, stream);
  } else {
    a.part_key = At<float>(ws, p.a);
    a.part_index = At<long long>(ws, p.b);
    a.part_bad = At<int>(ws, p.c);
    err = LaunchSplit("nearest split", DecodeKernelFor(false, p), p, a, stream);
  }
  if (err != cudaSuccess) return err;
  detail::DecodeCombineArgs c{};
  c.labels = labels;
  c.labels_int64 = label_type == IndexType::kInt64;
  c.batch = pr.batch;
  c.num_classes = pr.num_classes;
  c.splits = p.splits;
  c.part_count = a.part_count;
  c.part_key = a.part_key;
  c.part_index = a.part_index;
  c.part_bad = a.part_bad;
  c.rank = rank_out;
  c.index = index_out;
  // A warp per row.
  detail::DecodeCombineKernel<<<GridFor(pr.batch, detail::kWarps, 65535), kThreads, 0, stream>>>(
      c);
  return Launched(rank ? "rank combine" : "nearest combine", cudaGetLastError(), stream);
}

}  // namespace

cudaError_t EcocLabelRank(const LabelRankParams& params, cudaStream_t stream) {
  const ProblemArgs& pr = params.problem;
  Plan p;
  cudaError_t err = RankPlan(params, &p);
  if (err != cudaSuccess) return err;
  if (pr.batch == 0) return cudaSuccess;
  if (NullInputs(pr) || params.labels == nullptr ||
      params.rank == nullptr) {
    return cudaErrorInvalidValue;
  }
  if ((err = CheckWorkspace(p, params.workspace, params.workspace_bytes)) != cudaSuccess) {
    return err;
  }
  return LaunchDecode(true, pr, p, params.workspace, params.labels, params.label_type,
                      params.rank, nullptr, stream);
}

cudaError_t EcocNearestCodeword(const NearestParams& params, cudaStream_t stream) {
  const ProblemArgs& pr = params.problem;
  Plan p;
  cudaError_t err = NearestPlan(params, &p);
  if (err != cudaSuccess) return err;
  if (pr.batch == 0) return cudaSuccess;
  if (NullInputs(pr) || params.index == nullptr) {
    return cudaErrorInvalidValue;
  }
  if ((err = CheckWorkspace(p, params.workspace, params.workspace_bytes)) != cudaSuccess) {
    return err;
  }
  return LaunchDecode(false, pr, p, params.workspace, nullptr, IndexType::kInt32, nullptr,
                      params.index, stream);
}

}  // namespace cuda
}  // namespace keras_ecoc
