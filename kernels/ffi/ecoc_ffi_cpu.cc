// Framework-free entry points of the fused ECOC CPU kernels: XLA FFI handlers
// (for JAX's jax.ffi.ffi_call and TensorFlow's XLA custom call) and plain C
// functions (for PyTorch, called through ctypes on data pointers).
//
// Built with g++ alone against the vendored XLA FFI headers
// (kernels/third_party/xla), into keras_ecoc/_lib/_ecoc_kernels.so together
// with the two ISA copies of ecoc_cpu_math.cc. No TensorFlow, JAX or PyTorch
// symbol is referenced.
//
// FFI handlers (platform "Host"; every array row-major float32 unless noted):
//   KerasEcocFfiForward    (z [B, k], codes [n, k], labels [B] s32, scale [])
//                          -> loss [B], lse [B], expected_code [B, k],
//                             expected_sqnorm [B]                 attr epsilon
//   KerasEcocFfiCodesGrad  (z, codes, labels, scale, lse [B], grad_loss [B])
//                          -> grad_codes [n, k]                   attr epsilon
//   KerasEcocFfiLabelRank  (z, codes, labels) -> rank [B] s32     attr epsilon
//   KerasEcocFfiNearest    (z, codes) -> index [B, 2] s32         attr epsilon
//                          (the int64 index of each row as two int32 words,
//                          low word first: XLA programs without 64-bit types
//                          take [:, 0], which is the index since -1 <= index
//                          < n < 2^31; the CUDA kernels write int64 too)
// Labels must lie in [0, n): the callers replace invalid ones by 0 and mask
// the result themselves (XLA has no run-time errors to raise); a label
// outside that range makes the handler fail rather than read out of bounds.
// The int64 copy of the labels that the math core takes (8 B bytes) is a heap
// buffer: XLA's CPU runtime under JAX 0.10 has no
// FFI scratch allocator for the host ("no FFI scratch memory" when asked), and
// the math core allocates its own per-thread scratch anyway.
//
// Threads: the handlers run the math core's parallel_for on XLA's intra-op
// thread pool (ffi::ThreadPool). The C entry points run it on the caller's
// OpenMP team when the caller registered its runtime's GOMP_parallel with
// KerasEcocCpuSetOpenMP (PyTorch does: its intra-op pool is that team, so the
// kernel's work goes to the workers that would otherwise spin against it);
// else on a per-call set of std::threads. Either way num_threads (<= 1: the
// calling thread only) sets the work split, so the results are the same bits.
#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <limits>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "ecoc_cpu_math.h"
#include "xla/ffi/api/ffi.h"

namespace keras_ecoc {
namespace {

namespace ffi = ::xla::ffi;

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

// Ranges of [0, num_items) handed out one chunk at a time. The calling thread
// takes chunks too, so it never waits for a helper that has not started (a
// saturated or single-thread pool cannot deadlock); helpers that start after
// the last chunk was taken return at once. Shared ownership, because a helper
// may start after the call has returned.
struct Chunks {
  Chunks(int64_t n, int64_t chunk, cpu::WorkFn f, void* a)
      : num_items(n), chunk_size(chunk), work(f), arg(a) {}
  const int64_t num_items, chunk_size;
  const cpu::WorkFn work;
  void* const arg;
  std::atomic<int64_t> next{0};
  std::atomic<int64_t> done{0};
  std::mutex mu;
  std::condition_variable cv;

  void Drain() {
    for (;;) {
      const int64_t begin = next.fetch_add(chunk_size);
      if (begin >= num_items) return;
      const int64_t end = std::min(num_items, begin + chunk_size);
      work(arg, begin, end);
      if (done.fetch_add(end - begin) + (end - begin) == num_items) {
        std::lock_guard<std::mutex> lock(mu);
        cv.notify_all();
      }
    }
  }
  void Wait() {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [this] { return done.load() == num_items; });
  }
};

// About four chunks per thread (load balance) of at least ~64k cost units
// (scheduling a chunk costs a few microseconds).
int64_t ChunkSize(int64_t num_items, int64_t cost_per_item, int threads) {
  const int64_t by_balance = (num_items + 4 * threads - 1) / (4 * threads);
  const int64_t by_cost = (int64_t{1} << 16) / std::max<int64_t>(1, cost_per_item);
  return std::max<int64_t>(1, std::max(by_balance, by_cost));
}

// --- XLA's intra-op thread pool --------------------------------------------

struct FfiPool {
  ffi::ThreadPool* pool;
  int threads;
};

void FfiParallelFor(void* p, int64_t num_items, int64_t cost_per_item,
                    cpu::WorkFn work, void* arg) {
  if (num_items <= 0) return;
  auto* pool = static_cast<FfiPool*>(p);
  const int64_t chunk = ChunkSize(num_items, cost_per_item, pool->threads);
  const int64_t nchunks = (num_items + chunk - 1) / chunk;
  if (pool->threads <= 1 || nchunks <= 1) {
    work(arg, 0, num_items);
    return;
  }
  auto chunks = std::make_shared<Chunks>(num_items, chunk, work, arg);
  const int64_t helpers = std::min<int64_t>(pool->threads, nchunks) - 1;
  for (int64_t i = 0; i < helpers; ++i) {
    pool->pool->Schedule([chunks] { chunks->Drain(); });
  }
  chunks->Drain();
  chunks->Wait();
}

// --- std::threads, for the C entry points ----------------------------------

void ThreadParallelFor(void* p, int64_t num_items, int64_t cost_per_item,
                       cpu::WorkFn work, void* arg) {
  if (num_items <= 0) return;
  const int threads = *static_cast<int*>(p);
  const int64_t chunk = ChunkSize(num_items, cost_per_item, threads);
  const int64_t nchunks = (num_items + chunk - 1) / chunk;
  if (threads <= 1 || nchunks <= 1) {
    work(arg, 0, num_items);
    return;
  }
  Chunks chunks(num_items, chunk, work, arg);
  std::vector<std::thread> helpers;
  const int64_t count = std::min<int64_t>(threads, nchunks) - 1;
  helpers.reserve(count);
  for (int64_t i = 0; i < count; ++i) {
    helpers.emplace_back([&chunks] { chunks.Drain(); });
  }
  chunks.Drain();
  for (std::thread& t : helpers) t.join();
}

// --- the caller's OpenMP team, for the C entry points ----------------------
// libgomp's GOMP_parallel(fn, data, num_threads, flags): runs fn(data) on a
// team of num_threads threads (the calling thread among them, a nested call
// gets a team of one) and returns after all of them. Taken as a pointer from
// the caller rather than linked: the team must be the one of the OpenMP
// runtime the framework already loaded (PyTorch's wheel ships its own
// libgomp), and a second copy of libgomp would bring a second pool of
// spinning workers, the very contention this avoids.
typedef void (*GompParallelFn)(void (*fn)(void*), void* data,
                               unsigned num_threads, unsigned flags);
std::atomic<GompParallelFn> g_gomp_parallel{nullptr};

void DrainChunks(void* chunks) { static_cast<Chunks*>(chunks)->Drain(); }

void OpenMPParallelFor(void* p, int64_t num_items, int64_t cost_per_item,
                       cpu::WorkFn work, void* arg) {
  if (num_items <= 0) return;
  const int threads = *static_cast<int*>(p);
  const int64_t chunk = ChunkSize(num_items, cost_per_item, threads);
  const int64_t nchunks = (num_items + chunk - 1) / chunk;
  const GompParallelFn parallel = g_gomp_parallel.load(std::memory_order_acquire);
  if (threads <= 1 || nchunks <= 1 || parallel == nullptr) {
    work(arg, 0, num_items);
    return;
  }
  // Every team member drains the same chunk counter, so a team smaller than
  // asked for (nested region, OMP_THREAD_LIMIT) still covers every item.
  Chunks chunks(num_items, chunk, work, arg);
  parallel(DrainChunks, &chunks,
           static_cast<unsigned>(std::min<int64_t>(threads, nchunks)), 0);
}

cpu::Runtime ThreadRuntime(int* threads) {
  if (*threads <= 0) {
    *threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  }
  if (g_gomp_parallel.load(std::memory_order_acquire) != nullptr) {
    return cpu::Runtime{OpenMPParallelFor, threads, *threads};
  }
  return cpu::Runtime{ThreadParallelFor, threads, *threads};
}

// --- FFI handlers ------------------------------------------------------------

// Threads to use: $KERAS_ECOC_FFI_THREADS (1 = serial, the calling thread)
// when set, else the size of XLA's pool.
int FfiThreads(ffi::ThreadPool& pool) {
  if (const char* env = std::getenv("KERAS_ECOC_FFI_THREADS")) {
    const int v = std::atoi(env);
    if (v >= 1) return v;
  }
  return static_cast<int>(std::max<int64_t>(1, pool.num_threads()));
}

struct Shape {
  int64_t B, k, n;
};

ffi::Error CheckShape(ffi::Buffer<ffi::F32> z, ffi::Buffer<ffi::F32> codes,
                      Shape* s) {
  auto zd = z.dimensions();
  auto cd = codes.dimensions();
  if (zd.size() != 2 || cd.size() != 2 || zd[1] != cd[1]) {
    return ffi::Error::InvalidArgument(
        "keras_ecoc: z must be [batch, code_length] and codes [num_classes, "
        "code_length] with the same code_length");
  }
  if (cd[0] < 1) {
    return ffi::Error::InvalidArgument("keras_ecoc: codes needs at least one row");
  }
  if (cd[0] > std::numeric_limits<int32_t>::max()) {
    // Class ids, ranks and nearest indices are int32.
    return ffi::Error::InvalidArgument(
        "keras_ecoc: codes must have fewer than 2^31 rows (class ids are int32)");
  }
  *s = Shape{zd[0], zd[1], cd[0]};
  return ffi::Error::Success();
}

// Copies labels to int64, checking that each lies in [0, n).
ffi::Error Labels64(ffi::Buffer<ffi::S32> labels, const Shape& s,
                    std::vector<int64_t>* out) {
  if (labels.dimensions().size() != 1 || labels.dimensions()[0] != s.B) {
    return ffi::Error::InvalidArgument("keras_ecoc: labels must be [batch]");
  }
  out->resize(s.B);
  int64_t* y = out->data();
  const int32_t* src = labels.typed_data();
  for (int64_t b = 0; b < s.B; ++b) {
    if (src[b] < 0 || src[b] >= s.n) {
      return ffi::Error::InvalidArgument(
          "keras_ecoc: labels[" + std::to_string(b) + "] = " +
          std::to_string(src[b]) + " is outside [0, " + std::to_string(s.n) +
          ")");
    }
    y[b] = src[b];
  }
  return ffi::Error::Success();
}

ffi::Error ScratchFailed(const char* op) {
  return ffi::Error(ffi::ErrorCode::kResourceExhausted,
                    std::string("keras_ecoc: ") + op +
                        ": failed to allocate CPU scratch memory");
}

ffi::Error ForwardImpl(ffi::ThreadPool pool,
                       ffi::Buffer<ffi::F32> z, ffi::Buffer<ffi::F32> codes,
                       ffi::Buffer<ffi::S32> labels,
                       ffi::BufferR0<ffi::F32> scale,
                       ffi::ResultBuffer<ffi::F32> loss,
                       ffi::ResultBuffer<ffi::F32> lse,
                       ffi::ResultBuffer<ffi::F32> expected_code,
                       ffi::ResultBuffer<ffi::F32> expected_sqnorm,
                       float epsilon) {
  Shape s;
  if (auto e = CheckShape(z, codes, &s); e.failure()) return e;
  std::vector<int64_t> y;
  if (auto e = Labels64(labels, s, &y); e.failure()) return e;
  FfiPool fp{&pool, FfiThreads(pool)};
  const cpu::Runtime rt{FfiParallelFor, &fp, fp.threads};
  if (SelectKernels()->forward(&rt, z.typed_data(), y.data(), codes.typed_data(),
                               scale.typed_data()[0], epsilon, s.B, s.n, s.k,
                               loss->typed_data(), lse->typed_data(),
                               expected_code->typed_data(),
                               expected_sqnorm->typed_data()) != 0) {
    return ScratchFailed("forward");
  }
  return ffi::Error::Success();
}

ffi::Error CodesGradImpl(ffi::ThreadPool pool,
                         ffi::Buffer<ffi::F32> z, ffi::Buffer<ffi::F32> codes,
                         ffi::Buffer<ffi::S32> labels,
                         ffi::BufferR0<ffi::F32> scale,
                         ffi::Buffer<ffi::F32> lse,
                         ffi::Buffer<ffi::F32> grad_loss,
                         ffi::ResultBuffer<ffi::F32> grad_codes,
                         float epsilon) {
  Shape s;
  if (auto e = CheckShape(z, codes, &s); e.failure()) return e;
  if (lse.element_count() != static_cast<size_t>(s.B) ||
      grad_loss.element_count() != static_cast<size_t>(s.B)) {
    return ffi::Error::InvalidArgument("keras_ecoc: lse and grad_loss must be [batch]");
  }
  std::vector<int64_t> y;
  if (auto e = Labels64(labels, s, &y); e.failure()) return e;
  FfiPool fp{&pool, FfiThreads(pool)};
  const cpu::Runtime rt{FfiParallelFor, &fp, fp.threads};
  if (SelectKernels()->codes_grad(&rt, z.typed_data(), y.data(), codes.typed_data(),
                                  scale.typed_data()[0], epsilon,
                                  lse.typed_data(), grad_loss.typed_data(),
                                  s.B, s.n, s.k,
                                  grad_codes->typed_data()) != 0) {
    return ScratchFailed("codes_grad");
  }
  return ffi::Error::Success();
}

ffi::Error LabelRankImpl(ffi::ThreadPool pool,
                         ffi::Buffer<ffi::F32> z, ffi::Buffer<ffi::F32> codes,
                         ffi::Buffer<ffi::S32> labels,
                         ffi::ResultBuffer<ffi::S32> rank, float epsilon) {
  Shape s;
  if (auto e = CheckShape(z, codes, &s); e.failure()) return e;
  std::vector<int64_t> y;
  if (auto e = Labels64(labels, s, &y); e.failure()) return e;
  FfiPool fp{&pool, FfiThreads(pool)};
  const cpu::Runtime rt{FfiParallelFor, &fp, fp.threads};
  if (SelectKernels()->label_rank(&rt, z.typed_data(), y.data(), codes.typed_data(),
                                  epsilon, s.B, s.n, s.k,
                                  rank->typed_data()) != 0) {
    return ScratchFailed("label_rank");
  }
  return ffi::Error::Success();
}

ffi::Error NearestImpl(ffi::ThreadPool pool,
                       ffi::Buffer<ffi::F32> z, ffi::Buffer<ffi::F32> codes,
                       ffi::ResultBuffer<ffi::S32> index, float epsilon) {
  Shape s;
  if (auto e = CheckShape(z, codes, &s); e.failure()) return e;
  if (index->element_count() != static_cast<size_t>(2 * s.B)) {
    return ffi::Error::InvalidArgument("keras_ecoc: the nearest index must be [batch, 2] int32");
  }
  int64_t* idx = reinterpret_cast<int64_t*>(index->typed_data());
  FfiPool fp{&pool, FfiThreads(pool)};
  const cpu::Runtime rt{FfiParallelFor, &fp, fp.threads};
  if (SelectKernels()->nearest(&rt, z.typed_data(), codes.typed_data(),
                               epsilon, s.B, s.n, s.k, idx) != 0) {
    return ScratchFailed("nearest");
  }
  return ffi::Error::Success();
}

}  // namespace
}  // namespace keras_ecoc

namespace ffi = ::xla::ffi;

XLA_FFI_DEFINE_HANDLER_SYMBOL(KerasEcocFfiForward, keras_ecoc::ForwardImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::BufferR0<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<float>("epsilon"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(KerasEcocFfiCodesGrad, keras_ecoc::CodesGradImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::BufferR0<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<float>("epsilon"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(KerasEcocFfiLabelRank, keras_ecoc::LabelRankImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Ret<ffi::Buffer<ffi::S32>>()
                                  .Attr<float>("epsilon"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(KerasEcocFfiNearest, keras_ecoc::NearestImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::S32>>()
                                  .Attr<float>("epsilon"));

// --- C entry points (PyTorch, via ctypes) -----------------------------------
// Same contracts as cpu::Kernels (labels int64 in [0, n), checked by the
// caller); num_threads <= 0 means std::thread::hardware_concurrency(). Return
// 0 on success, nonzero when scratch memory could not be allocated.
#define KERAS_ECOC_EXPORT extern "C" __attribute__((visibility("default")))

KERAS_ECOC_EXPORT int KerasEcocCpuForward(
    const float* z, const int64_t* labels, const float* codes, float scale,
    float epsilon, int64_t batch, int64_t num_classes, int64_t code_length,
    int num_threads, float* loss, float* lse, float* expected_code,
    float* expected_sqnorm) {
  const keras_ecoc::cpu::Runtime rt = keras_ecoc::ThreadRuntime(&num_threads);
  return keras_ecoc::SelectKernels()->forward(
      &rt, z, labels, codes, scale, epsilon, batch, num_classes, code_length,
      loss, lse, expected_code, expected_sqnorm);
}

KERAS_ECOC_EXPORT int KerasEcocCpuCodesGrad(
    const float* z, const int64_t* labels, const float* codes, float scale,
    float epsilon, const float* lse, const float* grad_loss, int64_t batch,
    int64_t num_classes, int64_t code_length, int num_threads,
    float* grad_codes) {
  const keras_ecoc::cpu::Runtime rt = keras_ecoc::ThreadRuntime(&num_threads);
  return keras_ecoc::SelectKernels()->codes_grad(
      &rt, z, labels, codes, scale, epsilon, lse, grad_loss, batch,
      num_classes, code_length, grad_codes);
}

KERAS_ECOC_EXPORT int KerasEcocCpuLabelRank(
    const float* z, const int64_t* labels, const float* codes, float epsilon,
    int64_t batch, int64_t num_classes, int64_t code_length, int num_threads,
    int32_t* rank) {
  const keras_ecoc::cpu::Runtime rt = keras_ecoc::ThreadRuntime(&num_threads);
  return keras_ecoc::SelectKernels()->label_rank(
      &rt, z, labels, codes, epsilon, batch, num_classes, code_length, rank);
}

KERAS_ECOC_EXPORT int KerasEcocCpuNearest(
    const float* z, const float* codes, float epsilon, int64_t batch,
    int64_t num_classes, int64_t code_length, int num_threads,
    int64_t* index) {
  const keras_ecoc::cpu::Runtime rt = keras_ecoc::ThreadRuntime(&num_threads);
  return keras_ecoc::SelectKernels()->nearest(
      &rt, z, codes, epsilon, batch, num_classes, code_length, index);
}

// Runs the C entry points' parallel loops on the caller's OpenMP team:
// gomp_parallel is the address of GOMP_parallel in the libgomp the caller's
// framework loaded; NULL goes back to per-call std::threads. Process-wide;
// takes effect from the next call.
KERAS_ECOC_EXPORT void KerasEcocCpuSetOpenMP(void* gomp_parallel) {
  keras_ecoc::g_gomp_parallel.store(
      reinterpret_cast<keras_ecoc::GompParallelFn>(gomp_parallel),
      std::memory_order_release);
}

// Which ISA copy of the math core runs ("avx2" or "base").
KERAS_ECOC_EXPORT const char* KerasEcocCpuIsa() {
  return keras_ecoc::SelectKernels()->isa;
}
