// Device built-ins of the CUDA emulator: thread/block indices, barriers,
// warp shuffles and votes (real rendezvous of the lanes' fibers), math
// intrinsics, and the hooks ptx_emu.h uses. Included by the emulator's
// cuda_runtime.h; the implementation is emu_runtime.cc.
#ifndef KERAS_ECOC_EMU_DEVICE_H_
#define KERAS_ECOC_EMU_DEVICE_H_

#include <cmath>
#include <cstdint>
#include <cstring>
#include <deque>
#include <vector>
#include <tuple>
#include <type_traits>
#include <utility>

// Set by the scheduler before each switch into a thread's fiber.
extern uint3 threadIdx;
extern uint3 blockIdx;
extern dim3 blockDim;
extern dim3 gridDim;
constexpr int warpSize = 32;

namespace keras_ecoc_emu {

enum class WarpOpKind : int {
  kSyncwarp,
  kShfl,
  kShflUp,
  kShflDown,
  kShflXor,
  kBallot,
  kAny,
  kAll,
  kCollective,
};

// Lane-collective operation: fn runs once when every lane of the full warp
// has arrived, with each lane's in/out pointer (index = lane).
using CollectiveFn = void (*)(const void* const* in, void* const* out);

[[noreturn]] void Fatal(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
void SyncThreads(const char* file, int line);
uint64_t WarpOp(WarpOpKind kind, unsigned mask, uint64_t value, int arg, int width,
                const char* what, const char* file, int line);
void WarpCollective(const char* what, CollectiveFn fn, const void* in, void* out,
                    const char* file, int line);
void* DynamicSharedMemory();
// wgmma.mma_async products a thread has issued and not yet retired
// (ptx_emu.h): the open group, then the committed groups, oldest first.
// Each product runs when a wgmma_wait retires its group, so that reading an
// accumulator before the wait (ptx_emu.h poisons it with NaN at the issue),
// or storing into a shared operand before it, changes the results. A thread
// that exits with products in flight is an error.
struct WgmmaOp {
  uint32_t a[4];
  uint64_t desc;
  int n;             // N: 32, 64 or 128
  float* d;          // the accumulator, N / 2 floats of the issuing thread
  bool chained;      // C is the result of an earlier product in flight on d
  float c[64];       // else C, as d held it at the issue
  const char* what;
  const char* file;
  int line;
};
struct WgmmaQueue {
  std::vector<WgmmaOp> open;
  std::deque<std::vector<WgmmaOp>> committed;
  bool empty() const { return open.empty() && committed.empty(); }
};
WgmmaQueue& CurrentWgmmaQueue(const char* what);

// The shared window: p's byte address there (__cvta_generic_to_shared; the
// block's dynamic shared memory starts at kSharedWindowBase, as on a card
// it does not start at 0), and back. Both abort outside the block's dynamic
// shared memory (what, file, line: the caller, for the message).
constexpr uint32_t kSharedWindowBase = 1024;
uint32_t SharedAddress(const void* p, const char* what, const char* file, int line);
const void* SharedPointer(uint32_t address, int bytes, const char* what, const char* file,
                          int line);
// cp.async: copies are deferred until the cp_async_wait that retires their
// group (or the thread's exit), so that data read before the wait is stale;
// with KERAS_ECOC_EMU_CP_ASYNC=eager they land when issued instead, so that a
// staging into a buffer other threads still read shows.
// size: the copy's bytes (16 for cp_async_16, 4 for cp_async_4); src_bytes in
// [0, size] are read and the rest zero-filled.
void CpAsync(void* dst, const void* src, int size, int src_bytes, const char* file, int line);
void CpAsyncCommit();
// A shared-memory access of `bytes` bytes at p by the calling thread (an
// ldmatrix row): aborts unless p is `bytes`-aligned and inside the block's
// dynamic shared memory.
void CheckSharedAccess(const void* p, int bytes, const char* what, const char* file, int line);
void CpAsyncWait(int pending);
// Compute capability the emulated device reports, times 10 (e.g. 900).
int DeviceArch();

// Launch machinery used by the rewritten `kernel<<<...>>>(args)` statements.
struct KernelBody {
  void (*invoke)(void* ctx);
  void* ctx;
};
cudaError_t LaunchKernel(const void* func, const char* name, const char* file, int line,
                         dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                         KernelBody body);

struct Launcher {
  const char* file;
  int line;
  const char* name;
  dim3 grid, block;
  size_t smem;
  cudaStream_t stream;

  template <typename... P, typename... A>
  void Run(void (*kernel)(P...), A&&... args) const {
    static_assert(sizeof...(P) == sizeof...(A), "kernel launched with the wrong number of arguments");
    // Kernel parameters are passed by value, as through CUDA's parameter
    // space: one copy per launch, each thread gets its own copy of it.
    struct Ctx {
      void (*kernel)(P...);
      std::tuple<std::decay_t<P>...> params;
    } ctx{kernel, std::tuple<std::decay_t<P>...>(std::forward<A>(args)...)};
    KernelBody body{[](void* p) {
                      Ctx* c = static_cast<Ctx*>(p);
                      std::tuple<std::decay_t<P>...> mine = c->params;
                      std::apply(c->kernel, mine);
                    },
                    &ctx};
    LaunchKernel(reinterpret_cast<const void*>(kernel), name, file, line, grid, block, smem,
                 stream, body);
  }
};

inline Launcher MakeLaunch(const char* file, int line, const char* name, dim3 grid, dim3 block,
                           size_t smem = 0, cudaStream_t stream = nullptr) {
  return Launcher{file, line, name, grid, block, smem, stream};
}

template <typename T>
inline uint64_t ToBits(T v) {
  static_assert(std::is_trivially_copyable<T>::value && sizeof(T) <= 8,
                "warp shuffles take scalars of at most 8 bytes");
  uint64_t b = 0;
  std::memcpy(&b, &v, sizeof(T));
  return b;
}
template <typename T>
inline T FromBits(uint64_t b) {
  T v;
  std::memcpy(&v, &b, sizeof(T));
  return v;
}

}  // namespace keras_ecoc_emu

// ---------------------------------------------------------------------------
// Barriers, shuffles and votes. The file/line default arguments name the
// call site in the emulator's divergence and deadlock messages.
inline void __syncthreads(const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  keras_ecoc_emu::SyncThreads(file, line);
}
// The barrier-deletion test's switch (run.py --delete-marked-barrier I
// builds each marked barrier as `(keras_ecoc_emu_barrier_kept(J) ? CALL :
// (void)0)`): false only for J = $KERAS_ECOC_EMU_DELETE_BARRIER.
bool keras_ecoc_emu_barrier_kept(int index);
inline void __syncwarp(unsigned mask = 0xffffffffu, const char* file = __builtin_FILE(),
                       int line = __builtin_LINE()) {
  keras_ecoc_emu::WarpOp(keras_ecoc_emu::WarpOpKind::kSyncwarp, mask, 0, 0, 32, "__syncwarp",
                         file, line);
}
template <typename T>
inline T __shfl_sync(unsigned mask, T var, int src_lane, int width = 32,
                     const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  return keras_ecoc_emu::FromBits<T>(keras_ecoc_emu::WarpOp(
      keras_ecoc_emu::WarpOpKind::kShfl, mask, keras_ecoc_emu::ToBits(var), src_lane, width,
      "__shfl_sync", file, line));
}
template <typename T>
inline T __shfl_up_sync(unsigned mask, T var, unsigned delta, int width = 32,
                        const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  return keras_ecoc_emu::FromBits<T>(keras_ecoc_emu::WarpOp(
      keras_ecoc_emu::WarpOpKind::kShflUp, mask, keras_ecoc_emu::ToBits(var),
      static_cast<int>(delta), width, "__shfl_up_sync", file, line));
}
template <typename T>
inline T __shfl_down_sync(unsigned mask, T var, unsigned delta, int width = 32,
                          const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  return keras_ecoc_emu::FromBits<T>(keras_ecoc_emu::WarpOp(
      keras_ecoc_emu::WarpOpKind::kShflDown, mask, keras_ecoc_emu::ToBits(var),
      static_cast<int>(delta), width, "__shfl_down_sync", file, line));
}
template <typename T>
inline T __shfl_xor_sync(unsigned mask, T var, int lane_mask, int width = 32,
                         const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  return keras_ecoc_emu::FromBits<T>(keras_ecoc_emu::WarpOp(
      keras_ecoc_emu::WarpOpKind::kShflXor, mask, keras_ecoc_emu::ToBits(var), lane_mask, width,
      "__shfl_xor_sync", file, line));
}
inline unsigned __ballot_sync(unsigned mask, int pred, const char* file = __builtin_FILE(),
                              int line = __builtin_LINE()) {
  return static_cast<unsigned>(keras_ecoc_emu::WarpOp(keras_ecoc_emu::WarpOpKind::kBallot, mask,
                                                      pred != 0, 0, 32, "__ballot_sync", file,
                                                      line));
}
inline int __any_sync(unsigned mask, int pred, const char* file = __builtin_FILE(),
                      int line = __builtin_LINE()) {
  return static_cast<int>(keras_ecoc_emu::WarpOp(keras_ecoc_emu::WarpOpKind::kAny, mask,
                                                 pred != 0, 0, 32, "__any_sync", file, line));
}
inline int __all_sync(unsigned mask, int pred, const char* file = __builtin_FILE(),
                      int line = __builtin_LINE()) {
  return static_cast<int>(keras_ecoc_emu::WarpOp(keras_ecoc_emu::WarpOpKind::kAll, mask,
                                                 pred != 0, 0, 32, "__all_sync", file, line));
}
[[noreturn]] inline void __trap() { keras_ecoc_emu::Fatal("__trap() called"); }

// ---------------------------------------------------------------------------
// Math. The _rn intrinsics are exactly rounded IEEE operations; g++ is run
// with -ffp-contract=off so that a*b+c stays two roundings, as the kernels
// assume wherever they spell out __fmaf_rn. The fast-math intrinsics
// (__expf, __logf) and rsqrtf are the accurate libm functions here: the
// emulator does not model their approximation error on the GPU.
inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __frcp_rn(float a) { return 1.0f / a; }
inline float __fsqrt_rn(float a) { return std::sqrt(a); }
inline double __fma_rn(double a, double b, double c) { return std::fma(a, b, c); }
inline double __dadd_rn(double a, double b) { return a + b; }
inline double __dmul_rn(double a, double b) { return a * b; }
inline float __expf(float x) { return expf(x); }
inline float __logf(float x) { return logf(x); }
inline float __log2f(float x) { return log2f(x); }
inline float __powf(float x, float y) { return powf(x, y); }
inline float __saturatef(float x) { return x != x ? 0.0f : (x < 0.0f ? 0.0f : (x > 1.0f ? 1.0f : x)); }
inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
inline double rsqrt(double x) { return 1.0 / std::sqrt(x); }
inline float __int_as_float(int v) { float f; std::memcpy(&f, &v, 4); return f; }
inline int __float_as_int(float f) { int v; std::memcpy(&v, &f, 4); return v; }
inline float __uint_as_float(unsigned v) { float f; std::memcpy(&f, &v, 4); return f; }
inline unsigned __float_as_uint(float f) { unsigned v; std::memcpy(&v, &f, 4); return v; }
inline double __longlong_as_double(long long v) { double d; std::memcpy(&d, &v, 8); return d; }
inline long long __double_as_longlong(double d) { long long v; std::memcpy(&v, &d, 8); return v; }
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz(static_cast<unsigned>(x)); }
inline int __clzll(long long x) { return x == 0 ? 64 : __builtin_clzll(static_cast<unsigned long long>(x)); }
inline int __ffs(int x) { return __builtin_ffs(x); }
inline int __ffsll(long long x) { return __builtin_ffsll(x); }
inline unsigned __brev(unsigned x) {
  unsigned r = 0;
  for (int i = 0; i < 32; ++i) r |= ((x >> i) & 1u) << (31 - i);
  return r;
}
template <typename T>
inline T __ldg(const T* p) { return *p; }

// CUDA's global min/max overloads (device code calls them unqualified).
#define KERAS_ECOC_EMU_MINMAX(T)                            \
  inline T min(T a, T b) { return b < a ? b : a; }          \
  inline T max(T a, T b) { return a < b ? b : a; }
KERAS_ECOC_EMU_MINMAX(int)
KERAS_ECOC_EMU_MINMAX(unsigned int)
KERAS_ECOC_EMU_MINMAX(long)
KERAS_ECOC_EMU_MINMAX(unsigned long)
KERAS_ECOC_EMU_MINMAX(long long)
KERAS_ECOC_EMU_MINMAX(unsigned long long)
#undef KERAS_ECOC_EMU_MINMAX
inline float min(float a, float b) { return fminf(a, b); }
inline float max(float a, float b) { return fmaxf(a, b); }
inline double min(double a, double b) { return fmin(a, b); }
inline double max(double a, double b) { return fmax(a, b); }
inline unsigned int min(int a, unsigned int b) { return min(static_cast<unsigned int>(a), b); }
inline unsigned int min(unsigned int a, int b) { return min(a, static_cast<unsigned int>(b)); }
inline unsigned int max(int a, unsigned int b) { return max(static_cast<unsigned int>(a), b); }
inline unsigned int max(unsigned int a, int b) { return max(a, static_cast<unsigned int>(b)); }
inline long long min(int a, long long b) { return min(static_cast<long long>(a), b); }
inline long long min(long long a, int b) { return min(a, static_cast<long long>(b)); }
inline long long max(int a, long long b) { return max(static_cast<long long>(a), b); }
inline long long max(long long a, int b) { return max(a, static_cast<long long>(b)); }

// Integer atomics only (there are no float atomics in the kernels, by the
// determinism rule). Fibers are never preempted, so a plain update is atomic.
inline int atomicAdd(int* p, int v) { int o = *p; *p = o + v; return o; }
inline unsigned atomicAdd(unsigned* p, unsigned v) { unsigned o = *p; *p = o + v; return o; }
inline unsigned long long atomicAdd(unsigned long long* p, unsigned long long v) {
  unsigned long long o = *p; *p = o + v; return o;
}

#endif  // KERAS_ECOC_EMU_DEVICE_H_
