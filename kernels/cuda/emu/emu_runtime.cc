// The CUDA emulator's runtime: simulated devices, the host API subset of
// kernels/cuda (memory, copies, streams and events as synchronous no-ops),
// and the block scheduler that runs every CUDA thread as a fiber.
//
// Scheduling: the blocks of a launch run one after another (optionally in a
// shuffled order). Inside a block each round runs every runnable fiber until
// it blocks on a barrier, a warp intrinsic or exits, in a seeded random order
// per round (so that a missing barrier shows up whichever side runs first).
// Schedule `warps` (`warps-reverse`) runs only the first (last) warp with a
// runnable fiber in each round instead: that warp gets through its own warp
// intrinsics up to the next block barrier before another warp starts, as
// warps that are not in lockstep may on a GPU.
// Then the warp intrinsics whose lanes have all arrived are completed and the
// block barrier is released when every thread is at it. Lanes of a warp that
// meet at different intrinsics, call sites or masks, a barrier reached by
// only part of the block, a mask naming an exited lane, and deadlocks abort
// with a message naming the kernel, block, threads and call sites.
#include "cuda_runtime.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

// run.py compiles this file without ASan instrumentation (the scheduler's
// own bookkeeping needs no checking, and instrumenting it cost an eighth of
// the emulator's time) but links it with the ASan runtime and defines
// KERAS_ECOC_EMU_ASAN, so that the fiber-switch annotations, the shared
// memory poisoning and the explicit checks of cp.async copies still work.
#if defined(KERAS_ECOC_EMU_ASAN)
#elif defined(__SANITIZE_ADDRESS__)
#define KERAS_ECOC_EMU_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define KERAS_ECOC_EMU_ASAN 1
#endif
#endif

#ifdef KERAS_ECOC_EMU_ASAN
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
// asan_interface.h makes these macros no-ops in code compiled without
// -fsanitize=address; call the runtime directly.
#undef ASAN_POISON_MEMORY_REGION
#undef ASAN_UNPOISON_MEMORY_REGION
#define ASAN_POISON_MEMORY_REGION(addr, size) __asan_poison_memory_region((addr), (size))
#define ASAN_UNPOISON_MEMORY_REGION(addr, size) __asan_unpoison_memory_region((addr), (size))
// The checks instrumented code calls for an access of n bytes (libasan).
extern "C" void __asan_loadN(void* addr, size_t size);
extern "C" void __asan_storeN(void* addr, size_t size);
#define KERAS_ECOC_EMU_CHECK_LOAD(p, n) __asan_loadN(const_cast<void*>(static_cast<const void*>(p)), n)
#define KERAS_ECOC_EMU_CHECK_STORE(p, n) __asan_storeN(p, n)
#else
#define KERAS_ECOC_EMU_CHECK_LOAD(p, n) ((void)(p), (void)(n))
#define KERAS_ECOC_EMU_CHECK_STORE(p, n) ((void)(p), (void)(n))
#define ASAN_POISON_MEMORY_REGION(addr, size) ((void)(addr), (void)(size))
#define ASAN_UNPOISON_MEMORY_REGION(addr, size) ((void)(addr), (void)(size))
static inline void __sanitizer_start_switch_fiber(void**, const void*, size_t) {}
static inline void __sanitizer_finish_switch_fiber(void*, const void**, size_t*) {}
#endif

uint3 threadIdx = {0, 0, 0};
uint3 blockIdx = {0, 0, 0};
dim3 blockDim = dim3(1, 1, 1);
dim3 gridDim = dim3(1, 1, 1);

// Linked in by run.py: the __CUDA_ARCH__ the kernels were compiled for, the
// default compute capability of the simulated device.
extern "C" int keras_ecoc_emu_compiled_arch __attribute__((weak));
extern "C" char __executable_start;  // defined by the GNU linker

namespace keras_ecoc_emu {
namespace {

// ---------------------------------------------------------------------------
// Simulated devices (real cards of each architecture).
struct DeviceModel {
  int arch;  // compute capability x 100, as __CUDA_ARCH__
  const char* name;
  int sms;
  size_t smem_optin;
  size_t smem_per_sm;
  size_t memory;
  int l2;
  int max_threads_per_sm;
  int bus_width;
  int max_blocks_per_sm;
  int clock_khz;      // boost clock
  int mem_clock_khz;  // memory clock
};

constexpr size_t kKiB = 1024, kMiB = 1024 * kKiB, kGiB = 1024 * kMiB;
const DeviceModel kModels[] = {
    {750, "Tesla T4 (emulated)", 40, 64 * kKiB, 64 * kKiB, 15 * kGiB, 4 * int(kMiB), 1024, 256, 16, 1590000, 5001000},
    {800, "NVIDIA A100-SXM4-80GB (emulated)", 108, 163 * kKiB, 164 * kKiB, 80 * kGiB,
     40 * int(kMiB), 2048, 5120, 32, 1410000, 1593000},
    {860, "NVIDIA A10 (emulated)", 72, 99 * kKiB, 100 * kKiB, 24 * kGiB, 6 * int(kMiB), 1536, 384,
     16, 1695000, 6251000},
    {890, "NVIDIA L4 (emulated)", 58, 99 * kKiB, 100 * kKiB, 24 * kGiB, 48 * int(kMiB), 1536, 192,
     24, 2040000, 6251000},
    {900, "NVIDIA H100 80GB HBM3 (emulated)", 132, 227 * kKiB, 228 * kKiB, 80 * kGiB,
     50 * int(kMiB), 2048, 5120, 32, 1980000, 2619000},
};
constexpr size_t kDefaultSmem = 48 * kKiB;

[[noreturn]] void VFatal(const char* fmt, va_list ap) {
  std::fflush(stdout);
  std::fprintf(stderr, "keras-ecoc CUDA emulator: ");
  std::vfprintf(stderr, fmt, ap);
  std::fprintf(stderr, "\n");
  std::fflush(stderr);
  std::abort();
}

[[noreturn]] void FatalNoLaunch(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  VFatal(fmt, ap);
}

long EnvLong(const char* name, long fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  char* end = nullptr;
  const long r = std::strtol(v, &end, 0);
  if (end == v || *end != '\0') FatalNoLaunch("%s=%s is not an integer", name, v);
  return r;
}

struct Device {
  DeviceModel model;
  size_t allocated = 0;
  size_t reserved = 512 * kMiB;  // what a real context takes before the first allocation
  std::map<uintptr_t, size_t> allocations;
  std::map<const void*, size_t> func_smem_limit;
  cudaError_t last_error = cudaSuccess;
  std::set<CUstream_st*> streams;
  std::set<CUevent_st*> events;
  FILE* launch_log = nullptr;
  long shuffle_blocks = -1;
  unsigned schedule_seed = 1;
  std::string schedule = "random";
  bool random_schedule = true;
  bool warp_major = false;  // schedule warps / warps-reverse
  // KERAS_ECOC_EMU_CP_ASYNC=eager: a cp.async copies when it is issued
  // instead of at the wait that retires it (both are what a GPU may do).
  bool eager_cp_async = false;
  size_t stack_bytes = 256 * kKiB;
};

Device& Dev() {
  static Device* dev = [] {
    Device* d = new Device;
    long arch = EnvLong("KERAS_ECOC_EMU_ARCH", 0);
    if (arch == 0) arch = &keras_ecoc_emu_compiled_arch != nullptr ? keras_ecoc_emu_compiled_arch : 900;
    if (arch < 100) arch *= 10;  // "90" -> 900
    const DeviceModel* m = nullptr;
    for (const DeviceModel& c : kModels)
      if (c.arch == arch) m = &c;
    if (m == nullptr)
      FatalNoLaunch("KERAS_ECOC_EMU_ARCH=%ld: simulated devices are 75, 80, 86, 89 and 90", arch);
    d->model = *m;
    d->model.sms = static_cast<int>(EnvLong("KERAS_ECOC_EMU_SMS", m->sms));
    if (d->model.sms < 1) FatalNoLaunch("KERAS_ECOC_EMU_SMS must be >= 1");
    d->model.smem_optin =
        static_cast<size_t>(EnvLong("KERAS_ECOC_EMU_SMEM_OPTIN", static_cast<long>(m->smem_optin)));
    if (d->model.smem_optin < kDefaultSmem)
      FatalNoLaunch("KERAS_ECOC_EMU_SMEM_OPTIN must be >= 49152 (the default limit)");
    d->model.memory = static_cast<size_t>(
                          EnvLong("KERAS_ECOC_EMU_MEM_MB", static_cast<long>(m->memory / kMiB))) *
                      kMiB;
    d->shuffle_blocks = EnvLong("KERAS_ECOC_EMU_SHUFFLE_BLOCKS", -1);
    d->stack_bytes = static_cast<size_t>(EnvLong("KERAS_ECOC_EMU_STACK_KB", 256)) * kKiB;
    if (const char* s = std::getenv("KERAS_ECOC_EMU_SCHEDULE")) {
      // forward | reverse | random[:seed] | warps | warps-reverse
      std::string v = s;
      if (v == "forward" || v == "reverse" || v == "random" || v == "warps" ||
          v == "warps-reverse") {
        d->schedule = v;
      } else if (v.rfind("random:", 0) == 0) {
        d->schedule = "random";
        d->schedule_seed = static_cast<unsigned>(std::strtoul(v.c_str() + 7, nullptr, 0));
      } else {
        FatalNoLaunch("KERAS_ECOC_EMU_SCHEDULE=%s: expected forward, reverse, random, "
                      "random:SEED, warps or warps-reverse",
                      s);
      }
    }
    d->random_schedule = d->schedule == "random";
    d->warp_major = d->schedule == "warps" || d->schedule == "warps-reverse";
    if (const char* c = std::getenv("KERAS_ECOC_EMU_CP_ASYNC")) {
      const std::string v = c;
      if (v != "deferred" && v != "eager")
        FatalNoLaunch("KERAS_ECOC_EMU_CP_ASYNC=%s: expected deferred or eager", c);
      d->eager_cp_async = v == "eager";
    }
    if (const char* p = std::getenv("KERAS_ECOC_EMU_LAUNCH_LOG")) {
      d->launch_log = std::fopen(p, "a");
      if (d->launch_log == nullptr) FatalNoLaunch("cannot open KERAS_ECOC_EMU_LAUNCH_LOG=%s", p);
    }
    return d;
  }();
  return *dev;
}

cudaError_t SetError(cudaError_t e) {
  if (e != cudaSuccess) Dev().last_error = e;
  return e;
}

// Whether [p, p + bytes) lies inside one device allocation.
bool IsDeviceRange(const void* p, size_t bytes) {
  const Device& d = Dev();
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  auto it = d.allocations.upper_bound(a);
  if (it == d.allocations.begin()) return false;
  --it;
  return a >= it->first && a + bytes <= it->first + it->second && a + bytes >= a;
}

// ---------------------------------------------------------------------------
// Fibers.
#if defined(__x86_64__)
// keras_ecoc_emu_switch(&save_sp, new_sp): saves the callee-saved registers,
// MXCSR and the x87 control word on the current stack, stores the stack
// pointer in *save_sp and resumes the context whose stack pointer is new_sp.
asm(R"(
.pushsection .text
.globl keras_ecoc_emu_switch
.type keras_ecoc_emu_switch,@function
keras_ecoc_emu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
.size keras_ecoc_emu_switch, .-keras_ecoc_emu_switch
.popsection
)");
extern "C" void keras_ecoc_emu_switch(void** save_sp, void* new_sp);
#else
#include <ucontext.h>
#endif

struct Copy {
  void* dst;
  const void* src;
  int bytes;  // read from src
  int size;   // written to dst: the bytes read, then zeros
};

enum class State { kRunnable, kWarp, kBlock, kDone };

struct Fiber {
  char* stack_lo = nullptr;  // usable stack, above the guard page
  size_t stack_size = 0;
#if defined(__x86_64__)
  void* sp = nullptr;
#else
  ucontext_t ctx;
#endif
  void* fake_stack = nullptr;
  State state = State::kDone;
  unsigned tid = 0;
  uint3 idx{0, 0, 0};
  // The warp intrinsic or barrier this fiber waits at.
  WarpOpKind kind = WarpOpKind::kSyncwarp;
  unsigned mask = 0;
  uint64_t value = 0;
  int arg = 0;
  int width = 32;
  const char* what = "";
  const char* file = "";
  int line = 0;
  CollectiveFn fn = nullptr;
  const void* cin = nullptr;
  void* cout = nullptr;
  uint64_t result = 0;
  // cp.async copies not yet performed: the open group and committed groups.
  std::vector<Copy> open;
  std::deque<std::vector<Copy>> committed;
  // wgmma products not yet retired (emu_device.h).
  WgmmaQueue wgmma;
};

struct LaunchState {
  const char* name = "";
  const char* file = "";
  int line = 0;
  dim3 grid, block;
  unsigned nthreads = 0;
  char* smem = nullptr;
  size_t smem_size = 0;
  KernelBody body{};
};

Fiber* g_current = nullptr;
LaunchState* g_launch = nullptr;
std::vector<Fiber*> g_fibers;  // one per thread of the block, stacks reused
#if defined(__x86_64__)
void* g_sched_sp = nullptr;
#else
ucontext_t g_sched_ctx;
#endif
void* g_sched_fake_stack = nullptr;
const void* g_sched_stack_bottom = nullptr;
size_t g_sched_stack_size = 0;

[[noreturn]] void FatalInBlock(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
void FatalInBlock(const char* fmt, ...) {
  char msg[4096];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  if (g_launch != nullptr) {
    Fatal("%s\n  in kernel %s launched at %s:%d, block (%u,%u,%u) of grid (%u,%u,%u), block (%u,%u,%u)",
          msg, g_launch->name, g_launch->file, g_launch->line, blockIdx.x, blockIdx.y, blockIdx.z,
          g_launch->grid.x, g_launch->grid.y, g_launch->grid.z, g_launch->block.x,
          g_launch->block.y, g_launch->block.z);
  }
  Fatal("%s", msg);
}

// Fills [p, p + bytes) with the float NaN 0x7fc00000 (whole words).
void FillNaN(char* p, size_t bytes) {
  const uint32_t nan_bits = 0x7fc00000u;
  const size_t words = bytes / 4;
  if (words == 0) return;
  std::memcpy(p, &nan_bits, 4);
  size_t done = 1;
  while (done < words) {
    const size_t n = std::min(done, words - done);
    std::memcpy(p + 4 * done, p, 4 * n);
    done += n;
  }
}

void RunCopies(std::vector<Copy>& copies) {
  for (const Copy& c : copies) {
    // A cp.async reads global and writes shared memory on the thread's
    // behalf: check both as the kernel's own accesses would be.
    if (c.bytes > 0) KERAS_ECOC_EMU_CHECK_LOAD(c.src, static_cast<size_t>(c.bytes));
    KERAS_ECOC_EMU_CHECK_STORE(c.dst, static_cast<size_t>(c.size));
    char buf[16] = {0};
    if (c.bytes > 0) std::memcpy(buf, c.src, static_cast<size_t>(c.bytes));
    std::memcpy(c.dst, buf, static_cast<size_t>(c.size));
  }
  copies.clear();
}

// Back to the scheduler; returns when the scheduler resumes this fiber.
void YieldToScheduler() {
  Fiber* f = g_current;
  __sanitizer_start_switch_fiber(f->state == State::kDone ? nullptr : &f->fake_stack,
                                 g_sched_stack_bottom, g_sched_stack_size);
#if defined(__x86_64__)
  keras_ecoc_emu_switch(&f->sp, g_sched_sp);
#else
  swapcontext(&f->ctx, &g_sched_ctx);
#endif
  __sanitizer_finish_switch_fiber(f->fake_stack, nullptr, nullptr);
}

[[noreturn]] void FiberMain() {
  __sanitizer_finish_switch_fiber(nullptr, &g_sched_stack_bottom, &g_sched_stack_size);
  Fiber* f = g_current;
  g_launch->body.invoke(g_launch->body.ctx);
  // A thread's outstanding cp.async copies complete even if it never waits.
  for (auto& g : f->committed) RunCopies(g);
  f->committed.clear();
  RunCopies(f->open);
  if (!f->wgmma.empty()) {
    const WgmmaOp& op =
        f->wgmma.committed.empty() ? f->wgmma.open.front() : f->wgmma.committed.front().front();
    FatalInBlock("thread %u exits with %zu wgmma group(s) and %zu uncommitted product(s) in "
                 "flight (the first: %s at %s:%d): no wgmma_wait retired them",
                 f->tid, f->wgmma.committed.size(), f->wgmma.open.size(), op.what, op.file,
                 op.line);
  }
  f->state = State::kDone;
  YieldToScheduler();
  std::abort();  // never resumed
}

#if !defined(__x86_64__)
void FiberMainTrampoline() { FiberMain(); }
#endif

void InitFiber(Fiber* f, size_t stack_bytes) {
  if (f->stack_lo == nullptr || f->stack_size != stack_bytes) {
    const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    void* mem = mmap(nullptr, stack_bytes + page, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (mem == MAP_FAILED) FatalInBlock("cannot map a fiber stack of %zu bytes", stack_bytes);
    mprotect(mem, page, PROT_NONE);  // guard page: a stack overflow faults
    f->stack_lo = static_cast<char*>(mem) + page;
    f->stack_size = stack_bytes;
  }
  // A finished fiber leaves the poisoned redzones of the frames that were
  // live at its last switch (FiberMain's and the switch's own) behind; every
  // other frame unpoisoned itself on return. So only the stack above its
  // last stack pointer needs clearing (clearing all of it was a tenth of the
  // emulator's time).
  char* const top = f->stack_lo + f->stack_size;
#if defined(__x86_64__)
  char* low = f->sp != nullptr ? static_cast<char*>(f->sp) - 4096 : top;
  if (low < f->stack_lo) low = f->stack_lo;
#else
  char* low = f->stack_lo;
#endif
  ASAN_UNPOISON_MEMORY_REGION(low, static_cast<size_t>(top - low));
  f->fake_stack = nullptr;
#if defined(__x86_64__)
  const uintptr_t aligned_top = reinterpret_cast<uintptr_t>(top) & ~uintptr_t{15};
  uint64_t* sp = reinterpret_cast<uint64_t*>(aligned_top);
  *--sp = 0;                                            // fake return address of FiberMain
  *--sp = reinterpret_cast<uint64_t>(&FiberMain);       // ret target
  for (int i = 0; i < 6; ++i) *--sp = 0;                // rbp rbx r12 r13 r14 r15
  uint32_t csr[2];
  asm volatile("stmxcsr %0" : "=m"(csr[0]));
  asm volatile("fnstcw %0" : "=m"(csr[1]));
  *--sp = (uint64_t{csr[1]} << 32) | csr[0];
  f->sp = sp;
#else
  getcontext(&f->ctx);
  f->ctx.uc_stack.ss_sp = f->stack_lo;
  f->ctx.uc_stack.ss_size = f->stack_size;
  f->ctx.uc_link = nullptr;
  makecontext(&f->ctx, FiberMainTrampoline, 0);
#endif
  f->state = State::kRunnable;
  f->open.clear();
  f->committed.clear();
  f->wgmma.open.clear();
  f->wgmma.committed.clear();
}

void SwitchTo(Fiber* f) {
  g_current = f;
  threadIdx = f->idx;
  __sanitizer_start_switch_fiber(&g_sched_fake_stack, f->stack_lo, f->stack_size);
#if defined(__x86_64__)
  keras_ecoc_emu_switch(&g_sched_sp, f->sp);
#else
  swapcontext(&g_sched_ctx, &f->ctx);
#endif
  __sanitizer_finish_switch_fiber(g_sched_fake_stack, nullptr, nullptr);
  g_current = nullptr;
}

Fiber* Current(const char* what) {
  if (g_current == nullptr) Fatal("%s called outside a kernel", what);
  return g_current;
}

const char* Where(const Fiber* f, char* buf, size_t n) {
  switch (f->state) {
    case State::kDone:
      std::snprintf(buf, n, "has exited");
      break;
    case State::kBlock:
      std::snprintf(buf, n, "waits at __syncthreads() (%s:%d)", f->file, f->line);
      break;
    case State::kWarp:
      std::snprintf(buf, n, "waits at %s (%s:%d) with mask 0x%08x", f->what, f->file, f->line,
                    f->mask);
      break;
    case State::kRunnable:
      std::snprintf(buf, n, "is runnable");
      break;
  }
  return buf;
}

bool SameOp(const Fiber* a, const Fiber* b) {
  return a->kind == b->kind && a->mask == b->mask && a->width == b->width && a->line == b->line &&
         (a->file == b->file || std::strcmp(a->file, b->file) == 0) && a->fn == b->fn &&
         (a->kind != WarpOpKind::kShflXor || a->arg == b->arg) &&
         ((a->kind != WarpOpKind::kShflUp && a->kind != WarpOpKind::kShflDown) || a->arg == b->arg);
}

// Completes the warp intrinsic of the lanes in `mask` of warp `w`.
void CompleteWarpOp(Fiber** lanes, unsigned mask) {
  Fiber* first = nullptr;
  for (int l = 0; l < 32; ++l)
    if (mask & (1u << l)) {
      first = lanes[l];
      break;
    }
  const int width = first->width;
  if (first->kind == WarpOpKind::kShfl || first->kind == WarpOpKind::kShflUp ||
      first->kind == WarpOpKind::kShflDown || first->kind == WarpOpKind::kShflXor) {
    if (width < 1 || width > 32 || (width & (width - 1)) != 0)
      FatalInBlock("%s (%s:%d): width %d is not a power of two in [1, 32]", first->what,
                   first->file, first->line, width);
  }
  uint64_t ballot = 0;
  for (int l = 0; l < 32; ++l)
    if ((mask & (1u << l)) && lanes[l]->value != 0) ballot |= 1u << l;
  if (first->kind == WarpOpKind::kCollective) {
    const void* in[32];
    void* out[32];
    for (int l = 0; l < 32; ++l) {
      in[l] = lanes[l]->cin;
      out[l] = lanes[l]->cout;
    }
    first->fn(in, out);
  }
  for (int l = 0; l < 32; ++l) {
    if (!(mask & (1u << l))) continue;
    Fiber* f = lanes[l];
    const int seg = l & ~(width - 1);
    int src = l;
    switch (f->kind) {
      case WarpOpKind::kShfl:
        src = seg + (f->arg & (width - 1));
        break;
      case WarpOpKind::kShflUp:
        src = (l - seg) >= f->arg ? l - f->arg : l;
        break;
      case WarpOpKind::kShflDown:
        src = (l - seg) + f->arg < width ? l + f->arg : l;
        break;
      case WarpOpKind::kShflXor: {
        const int s = l ^ f->arg;
        src = (s >= seg && s < seg + width && s < 32) ? s : l;
        break;
      }
      default:
        break;
    }
    switch (f->kind) {
      case WarpOpKind::kShfl:
      case WarpOpKind::kShflUp:
      case WarpOpKind::kShflDown:
      case WarpOpKind::kShflXor:
        if (!(mask & (1u << src)))
          FatalInBlock("%s (%s:%d): lane %d reads lane %d, which is not in the mask 0x%08x "
                       "(undefined on a GPU)",
                       f->what, f->file, f->line, l, src, mask);
        f->result = lanes[src]->value;
        break;
      case WarpOpKind::kBallot:
        f->result = ballot;
        break;
      case WarpOpKind::kAny:
        f->result = ballot != 0;
        break;
      case WarpOpKind::kAll:
        f->result = ballot == mask;
        break;
      default:
        f->result = 0;
        break;
    }
  }
  for (int l = 0; l < 32; ++l)
    if (mask & (1u << l)) lanes[l]->state = State::kRunnable;
}

// Completes every warp intrinsic whose lanes have all arrived at the same
// call. Returns whether any completed; aborts on a lane that can never
// arrive (exited, or waiting at __syncthreads). `mismatch` receives a lane
// waiting with lanes at a different intrinsic, for the deadlock report.
bool ResolveWarps(const LaunchState& L, std::string* mismatch) {
  bool progressed = false;
  const unsigned nwarps = (L.nthreads + 31) / 32;
  char b1[512], b2[512];
  for (unsigned w = 0; w < nwarps; ++w) {
    Fiber* lanes[32] = {nullptr};
    const unsigned base = w * 32;
    const unsigned count = std::min(32u, L.nthreads - base);
    for (unsigned l = 0; l < count; ++l) lanes[l] = g_fibers[base + l];
    unsigned handled = 0;
    for (unsigned l = 0; l < count; ++l) {
      Fiber* f = lanes[l];
      if (f->state != State::kWarp || (handled & (1u << l))) continue;
      const unsigned mask = f->mask;
      if (!(mask & (1u << l)))
        FatalInBlock("%s (%s:%d): thread %u (lane %u) calls it with mask 0x%08x, which does not "
                     "include its own lane",
                     f->what, f->file, f->line, f->tid, l, mask);
      if (f->kind == WarpOpKind::kCollective && mask != 0xffffffffu)
        FatalInBlock("%s (%s:%d) is warp-collective: all 32 lanes must call it", f->what, f->file,
                     f->line);
      bool ready = true;
      for (unsigned o = 0; o < 32; ++o) {
        if (!(mask & (1u << o))) continue;
        if (o >= count)
          FatalInBlock("%s (%s:%d): the mask 0x%08x names lane %u, but the block has only %u "
                       "threads (warp %u has %u lanes)",
                       f->what, f->file, f->line, mask, o, L.nthreads, w, count);
        Fiber* g = lanes[o];
        if (g->state == State::kDone || g->state == State::kBlock)
          FatalInBlock("warp divergence: thread %u (lane %u) %s, but thread %u (lane %u) of the "
                       "same warp %s",
                       f->tid, l, Where(f, b1, sizeof(b1)), g->tid, o, Where(g, b2, sizeof(b2)));
        if (g->state != State::kWarp || !SameOp(f, g)) {
          ready = false;
          if (mismatch->empty()) {
            char msg[1200];
            std::snprintf(msg, sizeof(msg),
                          "warp divergence: thread %u (lane %u) %s, but thread %u (lane %u) of "
                          "the same warp %s",
                          f->tid, l, Where(f, b1, sizeof(b1)), g->tid, o,
                          Where(g, b2, sizeof(b2)));
            *mismatch = msg;
          }
        }
      }
      if (!ready) continue;
      CompleteWarpOp(lanes, mask);
      handled |= mask;
      progressed = true;
    }
  }
  return progressed;
}

void RunBlock(LaunchState& L, const std::vector<unsigned>& order_base, std::mt19937& rng) {
  std::vector<unsigned> order = order_base;
  const Device& d = Dev();
  for (;;) {
    if (d.random_schedule) std::shuffle(order.begin(), order.end(), rng);
    // Warp-major: the threads of one warp only (the first in `order` with a
    // runnable fiber); every thread otherwise.
    unsigned only_warp = UINT_MAX;
    if (d.warp_major) {
      for (unsigned t : order) {
        if (g_fibers[t]->state == State::kRunnable) {
          only_warp = t / 32;
          break;
        }
      }
    }
    for (unsigned t : order) {
      Fiber* f = g_fibers[t];
      if (f->state == State::kRunnable && (only_warp == UINT_MAX || t / 32 == only_warp)) {
        SwitchTo(f);
      }
    }
    std::string mismatch;
    if (ResolveWarps(L, &mismatch)) continue;
    // Warp-major: the other warps' turns come before any barrier verdict.
    if (only_warp != UINT_MAX &&
        std::any_of(g_fibers.begin(), g_fibers.begin() + L.nthreads,
                    [](const Fiber* f) { return f->state == State::kRunnable; })) {
      continue;
    }
    unsigned done = 0, at_block = 0;
    const Fiber* first_block = nullptr;
    for (unsigned t = 0; t < L.nthreads; ++t) {
      const Fiber* f = g_fibers[t];
      if (f->state == State::kDone) ++done;
      if (f->state == State::kBlock) {
        ++at_block;
        if (first_block == nullptr) first_block = f;
      }
    }
    if (done == L.nthreads) return;
    if (at_block + done == L.nthreads) {
      if (done > 0) {
        unsigned exited = 0;
        for (unsigned t = 0; t < L.nthreads; ++t)
          if (g_fibers[t]->state == State::kDone) {
            exited = t;
            break;
          }
        FatalInBlock("__syncthreads() (%s:%d) is reached by only %u of the block's %u threads; "
                     "the other %u have exited (first: thread %u)",
                     first_block->file, first_block->line, at_block, L.nthreads, done, exited);
      }
      for (unsigned t = 0; t < L.nthreads; ++t) {
        const Fiber* f = g_fibers[t];
        if (f->line != first_block->line ||
            (f->file != first_block->file && std::strcmp(f->file, first_block->file) != 0))
          FatalInBlock("threads of the block meet at different __syncthreads(): thread %u at "
                       "%s:%d, thread %u at %s:%d",
                       first_block->tid, first_block->file, first_block->line, f->tid, f->file,
                       f->line);
      }
      for (unsigned t = 0; t < L.nthreads; ++t) g_fibers[t]->state = State::kRunnable;
      continue;
    }
    if (!mismatch.empty()) FatalInBlock("%s", mismatch.c_str());
    // Every thread is blocked and nothing can complete.
    std::string who;
    char buf[512];
    for (unsigned t = 0; t < L.nthreads && who.size() < 2000; t += 1) {
      const Fiber* f = g_fibers[t];
      if (f->state == State::kDone) continue;
      who += "\n    thread " + std::to_string(t) + " " + Where(f, buf, sizeof(buf));
    }
    FatalInBlock("deadlock: every thread waits and none can proceed:%s", who.c_str());
  }
}

// The dynamic shared memory a launch of `func` may use: the default 48 KiB
// unless cudaFuncSetAttribute raised it.
size_t FuncSmemLimit(const Device& d, const void* func) {
  const auto lim = d.func_smem_limit.find(func);
  return lim == d.func_smem_limit.end() ? kDefaultSmem : lim->second;
}

// Blocks of `threads` threads and `smem` bytes of dynamic shared memory that
// one simulated SM holds: limited by threads, blocks and shared memory per
// SM (1 KiB reserved per block from sm_80 on, as on the real cards), not by
// registers (device code runs as host code here). What
// cudaOccupancyMaxActiveBlocksPerMultiprocessor reports and the launch log
// records as `resident`.
int ResidentBlocks(const DeviceModel& m, int threads, size_t smem) {
  const int warps = (threads + 31) / 32;
  int blocks = std::min(m.max_blocks_per_sm, m.max_threads_per_sm / (32 * warps));
  const size_t per_block = smem + (m.arch >= 800 ? kKiB : 0);
  if (per_block > 0) blocks = std::min<int>(blocks, static_cast<int>(m.smem_per_sm / per_block));
  return blocks;
}

// The runtime queries a test may count (keras_ecoc_emu_runtime_calls).
// "kernel launch" counts the launches that were accepted (ran), and
// "cudaMemsetAsync" the stream memsets: the references of the harness's
// launch-observer check.
enum class CountedCall {
  kDeviceGetAttribute,
  kFuncSetAttribute,
  kOccupancy,
  kLaunch,
  kMemsetAsync,
  kCount
};
constexpr const char* kCountedNames[] = {"cudaDeviceGetAttribute", "cudaFuncSetAttribute",
                                         "cudaOccupancyMaxActiveBlocksPerMultiprocessor",
                                         "kernel launch", "cudaMemsetAsync"};
std::atomic<long> g_calls[static_cast<int>(CountedCall::kCount)];

void CountCall(CountedCall c) { g_calls[static_cast<int>(c)].fetch_add(1); }

}  // namespace

// ---------------------------------------------------------------------------
// Device-side entry points.
void Fatal(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  VFatal(fmt, ap);
}

void SyncThreads(const char* file, int line) {
  Fiber* f = Current("__syncthreads");
  f->state = State::kBlock;
  f->file = file;
  f->line = line;
  f->what = "__syncthreads()";
  YieldToScheduler();
}

uint64_t WarpOp(WarpOpKind kind, unsigned mask, uint64_t value, int arg, int width,
                const char* what, const char* file, int line) {
  Fiber* f = Current(what);
  f->state = State::kWarp;
  f->kind = kind;
  f->mask = mask;
  f->value = value;
  f->arg = arg;
  f->width = width;
  f->what = what;
  f->file = file;
  f->line = line;
  f->fn = nullptr;
  YieldToScheduler();
  return f->result;
}

void WarpCollective(const char* what, CollectiveFn fn, const void* in, void* out,
                    const char* file, int line) {
  Fiber* f = Current(what);
  f->state = State::kWarp;
  f->kind = WarpOpKind::kCollective;
  f->mask = 0xffffffffu;
  f->value = 0;
  f->arg = 0;
  f->width = 32;
  f->what = what;
  f->file = file;
  f->line = line;
  f->fn = fn;
  f->cin = in;
  f->cout = out;
  YieldToScheduler();
}

void* DynamicSharedMemory() {
  Current("extern __shared__ (dynamic shared memory)");
  return g_launch->smem;
}

// Whether [p, p + bytes) lies inside the current block's dynamic shared memory.
static bool InBlockSharedMemory(const void* p, size_t bytes) {
  const char* c = static_cast<const char*>(p);
  return c >= g_launch->smem && c + bytes <= g_launch->smem + g_launch->smem_size;
}

WgmmaQueue& CurrentWgmmaQueue(const char* what) { return Current(what)->wgmma; }

uint32_t SharedAddress(const void* p, const char* what, const char* file, int line) {
  Fiber* f = Current(what);
  if (!InBlockSharedMemory(p, 1))
    FatalInBlock("%s (%s:%d): thread %u takes the shared address of %p, outside the block's %zu "
                 "bytes of dynamic shared memory",
                 what, file, line, f->tid, p, g_launch->smem_size);
  return kSharedWindowBase +
         static_cast<uint32_t>(static_cast<const char*>(p) - g_launch->smem);
}

const void* SharedPointer(uint32_t address, int bytes, const char* what, const char* file,
                          int line) {
  Fiber* f = Current(what);
  const int64_t offset = static_cast<int64_t>(address) - kSharedWindowBase;
  if (offset < 0 || offset + bytes > static_cast<int64_t>(g_launch->smem_size) ||
      (address & static_cast<uint32_t>(bytes - 1)) != 0)
    FatalInBlock("%s (%s:%d): thread %u reads %d bytes at shared address %#x, outside the "
                 "block's %zu bytes of dynamic shared memory (from %#x) or not %d-byte aligned",
                 what, file, line, f->tid, bytes, address, g_launch->smem_size,
                 kSharedWindowBase, bytes);
  return g_launch->smem + offset;
}

void CpAsync(void* dst, const void* src, int size, int src_bytes, const char* file, int line) {
  const char* what = size == 16 ? "cp_async_16" : "cp_async_4";
  Fiber* f = Current(what);
  if (size != 16 && size != 4) FatalInBlock("%s (%s:%d): copy size %d", what, file, line, size);
  if (src_bytes < 0 || src_bytes > size)
    FatalInBlock("%s (%s:%d): src_bytes %d outside [0, %d]", what, file, line, src_bytes, size);
  const uintptr_t align = static_cast<uintptr_t>(size) - 1;
  if ((reinterpret_cast<uintptr_t>(dst) & align) != 0 ||
      (reinterpret_cast<uintptr_t>(src) & align) != 0)
    FatalInBlock("%s (%s:%d): thread %u copies %p -> %p; both must be %d-byte aligned", what,
                 file, line, f->tid, src, dst, size);
  if (!InBlockSharedMemory(dst, static_cast<size_t>(size)))
    FatalInBlock("%s (%s:%d): thread %u writes %p, outside the block's %zu bytes of "
                 "dynamic shared memory",
                 what, file, line, f->tid, dst, g_launch->smem_size);
  if (Dev().eager_cp_async) {
    // The copy lands now; its group still counts for the waits (empty).
    std::vector<Copy> now{Copy{dst, src, src_bytes, size}};
    RunCopies(now);
    return;
  }
  f->open.push_back(Copy{dst, src, src_bytes, size});
}

void CheckSharedAccess(const void* p, int bytes, const char* what, const char* file, int line) {
  Fiber* f = Current(what);
  if ((reinterpret_cast<uintptr_t>(p) & static_cast<uintptr_t>(bytes - 1)) != 0)
    FatalInBlock("%s (%s:%d): thread %u reads %p, which is not %d-byte aligned", what, file, line,
                 f->tid, p, bytes);
  if (!InBlockSharedMemory(p, static_cast<size_t>(bytes)))
    FatalInBlock("%s (%s:%d): thread %u reads %p, outside the block's %zu bytes of dynamic "
                 "shared memory",
                 what, file, line, f->tid, p, g_launch->smem_size);
}

void CpAsyncCommit() {
  Fiber* f = Current("cp_async_commit");
  f->committed.push_back(std::move(f->open));
  f->open.clear();
}

void CpAsyncWait(int pending) {
  Fiber* f = Current("cp_async_wait");
  while (f->committed.size() > static_cast<size_t>(std::max(pending, 0))) {
    RunCopies(f->committed.front());
    f->committed.pop_front();
  }
}

int DeviceArch() { return Dev().model.arch; }

cudaError_t LaunchKernel(const void* func, const char* name, const char* file, int line,
                         dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                         KernelBody body) {
  Device& d = Dev();
  if (g_current != nullptr) Fatal("kernel %s launched from device code (%s:%d)", name, file, line);
  if (stream != nullptr && d.streams.count(stream) == 0)
    return SetError(cudaErrorInvalidResourceHandle);
  const unsigned long long threads =
      static_cast<unsigned long long>(block.x) * block.y * block.z;
  if (threads == 0 || threads > 1024 || block.x > 1024 || block.y > 1024 || block.z > 64 ||
      grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.x > 2147483647u || grid.y > 65535 ||
      grid.z > 65535)
    return SetError(cudaErrorInvalidConfiguration);
  const size_t limit = FuncSmemLimit(d, func);
  if (d.launch_log != nullptr) {
    // func: the kernel's address relative to the executable's start, which
    // `nm` of the binary maps to the template instantiation.
    const unsigned long offset = static_cast<unsigned long>(
        reinterpret_cast<uintptr_t>(func) - reinterpret_cast<uintptr_t>(&__executable_start));
    std::fprintf(d.launch_log,
                 "%s\tgrid=%u,%u,%u\tblock=%u,%u,%u\tsmem=%zu\tlimit=%zu\tarch=%d\tsms=%d\t"
                 "resident=%d\tfunc=%#lx\t%s\n",
                 name, grid.x, grid.y, grid.z, block.x, block.y, block.z, smem, limit,
                 d.model.arch, d.model.sms, ResidentBlocks(d.model, static_cast<int>(threads), smem),
                 offset, smem > limit ? "refused" : "ok");
    std::fflush(d.launch_log);
  }
  if (smem > limit) return SetError(cudaErrorInvalidValue);
  keras_ecoc_emu::CountCall(keras_ecoc_emu::CountedCall::kLaunch);

  LaunchState L;
  L.name = name;
  L.file = file;
  L.line = line;
  L.grid = grid;
  L.block = block;
  L.nthreads = static_cast<unsigned>(threads);
  L.smem_size = smem;
  L.body = body;
  // Shared memory between poisoned redzones; the base is 128-byte aligned
  // as on the GPU (the dynamic shared memory window starts at offset 0).
  constexpr size_t kRedzone = 256;
  const size_t total = kRedzone + ((smem + 127) & ~size_t{127}) + kRedzone;
  char* raw = static_cast<char*>(std::aligned_alloc(128, total));
  if (raw == nullptr) Fatal("out of host memory for %zu bytes of shared memory", smem);
  ASAN_POISON_MEMORY_REGION(raw, total);
  L.smem = raw + kRedzone;
  ASAN_UNPOISON_MEMORY_REGION(L.smem, smem);

  while (g_fibers.size() < L.nthreads) g_fibers.push_back(new Fiber);
  const unsigned long long nblocks = static_cast<unsigned long long>(grid.x) * grid.y * grid.z;
  std::vector<unsigned long long> blocks(nblocks);
  for (unsigned long long i = 0; i < nblocks; ++i) blocks[i] = i;
  if (d.shuffle_blocks >= 0) {
    std::mt19937_64 brng(static_cast<uint64_t>(d.shuffle_blocks));
    std::shuffle(blocks.begin(), blocks.end(), brng);
  }
  std::vector<unsigned> order(L.nthreads);
  const bool reversed = d.schedule == "reverse" || d.schedule == "warps-reverse";
  for (unsigned t = 0; t < L.nthreads; ++t) order[t] = reversed ? L.nthreads - 1 - t : t;
  std::mt19937 rng(d.schedule_seed);

  LaunchState* saved = g_launch;
  g_launch = &L;
  const dim3 saved_grid = gridDim, saved_block = blockDim;
  gridDim = grid;
  blockDim = block;
  for (unsigned long long b : blocks) {
    blockIdx = uint3{static_cast<unsigned>(b % grid.x), static_cast<unsigned>((b / grid.x) % grid.y),
                     static_cast<unsigned>(b / (static_cast<unsigned long long>(grid.x) * grid.y))};
    // Fresh shared memory is garbage on a GPU: NaN makes a read before a
    // write visible in any float result.
    FillNaN(L.smem, smem);
    for (unsigned t = 0; t < L.nthreads; ++t) {
      Fiber* f = g_fibers[t];
      InitFiber(f, d.stack_bytes);
      f->tid = t;
      f->idx = uint3{t % block.x, (t / block.x) % block.y, t / (block.x * block.y)};
    }
    RunBlock(L, order, rng);
  }
  gridDim = saved_grid;
  blockDim = saved_block;
  g_launch = saved;
  ASAN_UNPOISON_MEMORY_REGION(raw, total);
  std::free(raw);
  return cudaSuccess;
}

}  // namespace keras_ecoc_emu

// ---------------------------------------------------------------------------
// Host runtime API.
using keras_ecoc_emu::Dev;
using keras_ecoc_emu::IsDeviceRange;
using keras_ecoc_emu::SetError;

namespace {
cudaError_t CheckDevice(int device) {
  return device == 0 ? cudaSuccess : SetError(cudaErrorInvalidDevice);
}
double NowMs() {
  using namespace std::chrono;
  return duration<double, std::milli>(steady_clock::now().time_since_epoch()).count();
}
}  // namespace

struct CUstream_st {
  unsigned flags;
};
struct CUevent_st {
  double ms = 0;
  bool recorded = false;
};

long keras_ecoc_emu_runtime_calls(const char* name) {
  using keras_ecoc_emu::CountedCall;
  for (int i = 0; i < static_cast<int>(CountedCall::kCount); ++i) {
    if (name != nullptr && std::strcmp(name, keras_ecoc_emu::kCountedNames[i]) == 0) {
      return keras_ecoc_emu::g_calls[i].load();
    }
  }
  return 0;
}

bool keras_ecoc_emu_barrier_kept(int index) {
  // Read once: a mutant deletes one barrier for the whole run. The count of
  // skipped calls goes to stderr at exit, so that a mutant the checks did not
  // notice says whether its barrier ran at all.
  static std::atomic<long> skipped{0};
  static const long deleted = [] {
    const long i = keras_ecoc_emu::EnvLong("KERAS_ECOC_EMU_DELETE_BARRIER", -1);
    if (i >= 0) {
      std::atexit([] {
        std::fprintf(stderr, "[emu] mutant: marked barrier %ld deleted, skipped %ld times\n",
                     deleted, skipped.load());
      });
    }
    return i;
  }();
  if (index != deleted) return true;
  ++skipped;
  return false;
}

cudaError_t cudaGetDeviceCount(int* count) {
  if (count == nullptr) return SetError(cudaErrorInvalidValue);
  Dev();
  *count = 1;
  return cudaSuccess;
}
cudaError_t cudaGetDevice(int* device) {
  if (device == nullptr) return SetError(cudaErrorInvalidValue);
  *device = 0;
  return cudaSuccess;
}
cudaError_t cudaSetDevice(int device) { return CheckDevice(device); }

cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  if (prop == nullptr) return SetError(cudaErrorInvalidValue);
  if (CheckDevice(device) != cudaSuccess) return cudaErrorInvalidDevice;
  const auto& m = Dev().model;
  std::memset(prop, 0, sizeof(*prop));
  std::snprintf(prop->name, sizeof(prop->name), "%s", m.name);
  prop->totalGlobalMem = m.memory;
  prop->sharedMemPerBlock = keras_ecoc_emu::kDefaultSmem;
  prop->regsPerBlock = 65536;
  prop->warpSize = 32;
  prop->maxThreadsPerBlock = 1024;
  prop->maxThreadsDim[0] = 1024;
  prop->maxThreadsDim[1] = 1024;
  prop->maxThreadsDim[2] = 64;
  prop->maxGridSize[0] = 2147483647;
  prop->maxGridSize[1] = 65535;
  prop->maxGridSize[2] = 65535;
  prop->totalConstMem = 65536;
  prop->major = m.arch / 100;
  prop->minor = (m.arch / 10) % 10;
  prop->multiProcessorCount = m.sms;
  prop->l2CacheSize = m.l2;
  prop->maxThreadsPerMultiProcessor = m.max_threads_per_sm;
  prop->sharedMemPerMultiprocessor = m.smem_per_sm;
  prop->regsPerMultiprocessor = 65536;
  prop->sharedMemPerBlockOptin = m.smem_optin;
  prop->memoryBusWidth = m.bus_width;
  prop->maxBlocksPerMultiProcessor = m.max_blocks_per_sm;
  return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
  keras_ecoc_emu::CountCall(keras_ecoc_emu::CountedCall::kDeviceGetAttribute);
  if (value == nullptr) return SetError(cudaErrorInvalidValue);
  if (CheckDevice(device) != cudaSuccess) return cudaErrorInvalidDevice;
  cudaDeviceProp p;
  cudaGetDeviceProperties(&p, 0);
  switch (attr) {
    case cudaDevAttrMaxThreadsPerBlock: *value = p.maxThreadsPerBlock; break;
    case cudaDevAttrMaxBlockDimX: *value = p.maxThreadsDim[0]; break;
    case cudaDevAttrMaxBlockDimY: *value = p.maxThreadsDim[1]; break;
    case cudaDevAttrMaxBlockDimZ: *value = p.maxThreadsDim[2]; break;
    case cudaDevAttrMaxGridDimX: *value = p.maxGridSize[0]; break;
    case cudaDevAttrMaxGridDimY: *value = p.maxGridSize[1]; break;
    case cudaDevAttrMaxGridDimZ: *value = p.maxGridSize[2]; break;
    case cudaDevAttrMaxSharedMemoryPerBlock: *value = static_cast<int>(p.sharedMemPerBlock); break;
    case cudaDevAttrWarpSize: *value = 32; break;
    case cudaDevAttrMaxRegistersPerBlock: *value = p.regsPerBlock; break;
    case cudaDevAttrMultiProcessorCount: *value = p.multiProcessorCount; break;
    case cudaDevAttrL2CacheSize: *value = p.l2CacheSize; break;
    case cudaDevAttrClockRate: *value = Dev().model.clock_khz; break;
    case cudaDevAttrMemoryClockRate: *value = Dev().model.mem_clock_khz; break;
    case cudaDevAttrGlobalMemoryBusWidth: *value = p.memoryBusWidth; break;
    case cudaDevAttrMaxThreadsPerMultiProcessor: *value = p.maxThreadsPerMultiProcessor; break;
    case cudaDevAttrComputeCapabilityMajor: *value = p.major; break;
    case cudaDevAttrComputeCapabilityMinor: *value = p.minor; break;
    case cudaDevAttrMaxSharedMemoryPerMultiprocessor:
      *value = static_cast<int>(p.sharedMemPerMultiprocessor);
      break;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin:
      *value = static_cast<int>(p.sharedMemPerBlockOptin);
      break;
    default:
      return SetError(cudaErrorInvalidValue);
  }
  return cudaSuccess;
}

cudaError_t cudaRuntimeGetVersion(int* version) {
  if (version == nullptr) return SetError(cudaErrorInvalidValue);
  *version = CUDART_VERSION;
  return cudaSuccess;
}
cudaError_t cudaDriverGetVersion(int* version) {
  if (version == nullptr) return SetError(cudaErrorInvalidValue);
  *version = CUDART_VERSION;
  return cudaSuccess;
}
cudaError_t cudaDeviceSynchronize() { return cudaSuccess; }
cudaError_t cudaDeviceReset() { return cudaSuccess; }
cudaError_t cudaGetLastError() {
  const cudaError_t e = Dev().last_error;
  Dev().last_error = cudaSuccess;
  return e;
}
cudaError_t cudaPeekAtLastError() { return Dev().last_error; }

const char* cudaGetErrorName(cudaError_t e) {
  switch (e) {
#define KERAS_ECOC_EMU_CASE(x) \
  case x:                      \
    return #x;
    KERAS_ECOC_EMU_CASE(cudaSuccess)
    KERAS_ECOC_EMU_CASE(cudaErrorInvalidValue)
    KERAS_ECOC_EMU_CASE(cudaErrorMemoryAllocation)
    KERAS_ECOC_EMU_CASE(cudaErrorInitializationError)
    KERAS_ECOC_EMU_CASE(cudaErrorInvalidConfiguration)
    KERAS_ECOC_EMU_CASE(cudaErrorInvalidMemcpyDirection)
    KERAS_ECOC_EMU_CASE(cudaErrorInsufficientDriver)
    KERAS_ECOC_EMU_CASE(cudaErrorInvalidDeviceFunction)
    KERAS_ECOC_EMU_CASE(cudaErrorNoDevice)
    KERAS_ECOC_EMU_CASE(cudaErrorInvalidDevice)
    KERAS_ECOC_EMU_CASE(cudaErrorNoKernelImageForDevice)
    KERAS_ECOC_EMU_CASE(cudaErrorInvalidResourceHandle)
    KERAS_ECOC_EMU_CASE(cudaErrorNotReady)
    KERAS_ECOC_EMU_CASE(cudaErrorIllegalAddress)
    KERAS_ECOC_EMU_CASE(cudaErrorLaunchOutOfResources)
    KERAS_ECOC_EMU_CASE(cudaErrorLaunchFailure)
    KERAS_ECOC_EMU_CASE(cudaErrorNotSupported)
    KERAS_ECOC_EMU_CASE(cudaErrorUnknown)
#undef KERAS_ECOC_EMU_CASE
  }
  return "cudaErrorUnknown";
}

const char* cudaGetErrorString(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInitializationError: return "initialization error";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorInvalidMemcpyDirection: return "invalid copy direction for memcpy";
    case cudaErrorInsufficientDriver:
      return "CUDA driver version is insufficient for CUDA runtime version";
    case cudaErrorInvalidDeviceFunction: return "invalid device function";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorNoKernelImageForDevice: return "no kernel image is available for execution on the device";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorNotReady: return "device not ready";
    case cudaErrorIllegalAddress: return "an illegal memory access was encountered";
    case cudaErrorLaunchOutOfResources: return "too many resources requested for launch";
    case cudaErrorLaunchFailure: return "unspecified launch failure";
    case cudaErrorNotSupported: return "operation not supported";
    default: return "unknown error";
  }
}

cudaError_t cudaMalloc(void** ptr, size_t bytes) {
  if (ptr == nullptr) return SetError(cudaErrorInvalidValue);
  auto& d = Dev();
  *ptr = nullptr;
  if (bytes == 0) return cudaSuccess;
  if (bytes > d.model.memory - d.reserved - d.allocated) return SetError(cudaErrorMemoryAllocation);
  void* p = nullptr;
  // Exact size (no rounding) so that ASan's redzone starts right after it.
  if (posix_memalign(&p, 256, bytes) != 0) return SetError(cudaErrorMemoryAllocation);
  // cudaMalloc returns garbage: 0xff bytes are NaN floats and -1 integers.
  std::memset(p, 0xff, bytes);
  d.allocations[reinterpret_cast<uintptr_t>(p)] = bytes;
  d.allocated += bytes;
  *ptr = p;
  return cudaSuccess;
}

cudaError_t cudaFree(void* ptr) {
  if (ptr == nullptr) return cudaSuccess;
  auto& d = Dev();
  auto it = d.allocations.find(reinterpret_cast<uintptr_t>(ptr));
  if (it == d.allocations.end()) return SetError(cudaErrorInvalidValue);
  d.allocated -= it->second;
  d.allocations.erase(it);
  std::free(ptr);
  return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
  if (free_bytes == nullptr || total_bytes == nullptr) return SetError(cudaErrorInvalidValue);
  const auto& d = Dev();
  *total_bytes = d.model.memory;
  *free_bytes = d.model.memory - d.reserved - d.allocated;
  return cudaSuccess;
}

cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
  if (bytes == 0) return cudaSuccess;
  if (dst == nullptr || src == nullptr) return SetError(cudaErrorInvalidValue);
  const bool dst_dev = IsDeviceRange(dst, bytes), src_dev = IsDeviceRange(src, bytes);
  bool ok = true;
  switch (kind) {
    case cudaMemcpyHostToDevice: ok = dst_dev && !src_dev; break;
    case cudaMemcpyDeviceToHost: ok = src_dev && !dst_dev; break;
    case cudaMemcpyDeviceToDevice: ok = src_dev && dst_dev; break;
    case cudaMemcpyHostToHost: ok = !src_dev && !dst_dev; break;
    case cudaMemcpyDefault: ok = true; break;
    default: return SetError(cudaErrorInvalidMemcpyDirection);
  }
  if (!ok) return SetError(cudaErrorInvalidValue);
  std::memmove(dst, src, bytes);
  return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t stream) {
  if (stream != nullptr && Dev().streams.count(stream) == 0)
    return SetError(cudaErrorInvalidResourceHandle);
  return cudaMemcpy(dst, src, bytes, kind);
}

cudaError_t cudaMemset(void* ptr, int value, size_t bytes) {
  if (bytes == 0) return cudaSuccess;
  if (!IsDeviceRange(ptr, bytes)) return SetError(cudaErrorInvalidValue);
  std::memset(ptr, value, bytes);
  return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void* ptr, int value, size_t bytes, cudaStream_t stream) {
  if (stream != nullptr && Dev().streams.count(stream) == 0)
    return SetError(cudaErrorInvalidResourceHandle);
  keras_ecoc_emu::CountCall(keras_ecoc_emu::CountedCall::kMemsetAsync);
  return cudaMemset(ptr, value, bytes);
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int flags) {
  if (stream == nullptr) return SetError(cudaErrorInvalidValue);
  *stream = new CUstream_st{flags};
  Dev().streams.insert(*stream);
  return cudaSuccess;
}
cudaError_t cudaStreamCreate(cudaStream_t* stream) { return cudaStreamCreateWithFlags(stream, 0); }
cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  if (Dev().streams.erase(stream) == 0) return SetError(cudaErrorInvalidResourceHandle);
  delete stream;
  return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  if (stream != nullptr && Dev().streams.count(stream) == 0)
    return SetError(cudaErrorInvalidResourceHandle);
  return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int) {
  if (event == nullptr) return SetError(cudaErrorInvalidValue);
  *event = new CUevent_st;
  Dev().events.insert(*event);
  return cudaSuccess;
}
cudaError_t cudaEventCreate(cudaEvent_t* event) { return cudaEventCreateWithFlags(event, 0); }
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  if (Dev().events.count(event) == 0) return SetError(cudaErrorInvalidResourceHandle);
  if (stream != nullptr && Dev().streams.count(stream) == 0)
    return SetError(cudaErrorInvalidResourceHandle);
  event->ms = NowMs();
  event->recorded = true;
  return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  if (Dev().events.count(event) == 0) return SetError(cudaErrorInvalidResourceHandle);
  return cudaSuccess;
}
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  if (ms == nullptr) return SetError(cudaErrorInvalidValue);
  if (Dev().events.count(start) == 0 || Dev().events.count(end) == 0)
    return SetError(cudaErrorInvalidResourceHandle);
  if (!start->recorded || !end->recorded) return SetError(cudaErrorInvalidResourceHandle);
  *ms = static_cast<float>(end->ms - start->ms);
  return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t event) {
  if (Dev().events.erase(event) == 0) return SetError(cudaErrorInvalidResourceHandle);
  delete event;
  return cudaSuccess;
}

cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int* num_blocks, const void* func,
                                                          int block_size, size_t dynamic_smem) {
  keras_ecoc_emu::CountCall(keras_ecoc_emu::CountedCall::kOccupancy);
  if (num_blocks == nullptr) return SetError(cudaErrorInvalidValue);
  if (func == nullptr) return SetError(cudaErrorInvalidDeviceFunction);
  if (block_size < 1 || block_size > 1024) return SetError(cudaErrorInvalidValue);
  const auto& d = Dev();
  // A launch above the kernel's limit would be refused: none resident.
  *num_blocks = dynamic_smem > keras_ecoc_emu::FuncSmemLimit(d, func)
                    ? 0
                    : keras_ecoc_emu::ResidentBlocks(d.model, block_size, dynamic_smem);
  return cudaSuccess;
}

cudaError_t cudaFuncSetAttribute(const void* func, cudaFuncAttribute attr, int value) {
  keras_ecoc_emu::CountCall(keras_ecoc_emu::CountedCall::kFuncSetAttribute);
  if (func == nullptr) return SetError(cudaErrorInvalidDeviceFunction);
  auto& d = Dev();
  switch (attr) {
    case cudaFuncAttributeMaxDynamicSharedMemorySize:
      if (value < 0 || static_cast<size_t>(value) > d.model.smem_optin)
        return SetError(cudaErrorInvalidValue);
      d.func_smem_limit[func] = static_cast<size_t>(value);
      return cudaSuccess;
    case cudaFuncAttributePreferredSharedMemoryCarveout:
      if (value < -1 || value > 100) return SetError(cudaErrorInvalidValue);
      return cudaSuccess;
  }
  return SetError(cudaErrorInvalidValue);
}
