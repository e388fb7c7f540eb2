// CPU versions of the PTX wrappers of kernels/cuda/ecoc_ptx.cuh, with the
// same names and signatures (plus defaulted call-site arguments), included
// by that header under -DKERAS_ECOC_EMULATOR. Architecture rules as there:
// below __CUDA_ARCH__ 800 cvt_rna_tf32 returns its input bits, cp_async_16
// copies at once and mma_m16n8k8_tf32 traps.
//
// mma.sync.m16n8k8 TF32 follows the tensor-core arithmetic measured by
// mmasim (PyPI; Xie et al.), bit for bit: operands truncated to TF32 (low 13
// bits ignored); per output, the K products are taken in chunks of L (4 on
// Ampere/Ada, 8 on Hopper) together with the accumulator: each product and
// the accumulator are aligned to the largest exponent among them (a zero
// counts as exponent e_zero), truncated toward zero to F fraction bits
// (F = 24 Ampere/Ada, 25 Hopper; e_zero = -132 / -133), summed exactly, and
// the sum is rounded toward zero to float32 (-0 becomes +0, NaN is
// 0x7fffffff). The chunk's result is the next chunk's accumulator.
#ifndef KERAS_ECOC_KERNELS_CUDA_EMU_PTX_EMU_H_
#define KERAS_ECOC_KERNELS_CUDA_EMU_PTX_EMU_H_

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include <cuda_runtime.h>

namespace keras_ecoc_emu {
namespace tf32 {

struct MmaModel {
  int F;       // fraction bits kept after alignment
  int L;       // products per fused chunk
  int e_zero;  // exponent given to a zero term
};

inline MmaModel ModelForArch(int arch) {
  return arch >= 900 ? MmaModel{25, 8, -133} : MmaModel{24, 4, -132};
}

inline uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float FromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// cvt.rna.tf32.f32: round to nearest, ties away from zero, to 10 fraction
// bits; NaN gives the canonical 0x7fffffff. A finite value may round to inf.
inline uint32_t CvtRna(float x) {
  const uint32_t u = Bits(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fffffffu;
  if ((u & 0x7f800000u) == 0x7f800000u) return u;  // +-inf
  return (u + 0x1000u) & 0xffffe000u;
}

// value = sig * 2^(exp - frac_bits), sig >= 0; is_zero when the value is 0.
struct Term {
  bool neg;
  uint64_t sig;
  int exp;        // exponent of the leading bit position (normalised, or -126 for subnormals)
  int frac_bits;  // sig has frac_bits bits below the binary point
  bool zero;
  bool special;  // inf or NaN (after dropping the low bits)
  double value;  // the value itself, for the IEEE path of inf and NaN
};

// Decomposes a float32 whose low `drop` mantissa bits are ignored.
inline __attribute__((no_sanitize("address", "undefined"))) Term Decompose(uint32_t u, int drop) {
  u &= ~((1u << drop) - 1u);
  Term t;
  t.neg = (u >> 31) != 0;
  const int e = static_cast<int>((u >> 23) & 0xffu);
  const uint32_t m = (u & 0x7fffffu) >> drop;
  t.frac_bits = 23 - drop;
  if (e == 0) {
    t.sig = m;
    t.exp = -126;
  } else {
    t.sig = m | (1u << (23 - drop));
    t.exp = e - 127;
  }
  t.zero = t.sig == 0;
  t.special = e == 0xff;
  t.value = static_cast<double>(FromBits(u));
  return t;
}

// The model's pure arithmetic is not instrumented: it touches only its own
// locals, and it is most of the emulator's time in the TF32 kernels.
#define KERAS_ECOC_EMU_MODEL_FN \
  inline __attribute__((no_sanitize("address", "undefined"), optimize("O2")))

// One fused chunk: c + sum_i a_i * b_i for n TF32 operand pairs given
// decomposed (significand 11 bits with 10 fraction bits, exponent, sign).
KERAS_ECOC_EMU_MODEL_FN float FusedChunk(const Term* a, const Term* b, int n, float c,
                                         const MmaModel& m) {
  // Inf and NaN follow IEEE arithmetic (the products of TF32 values are exact
  // in double, and finite terms cannot overflow it).
  bool special = !std::isfinite(c);
  for (int i = 0; i < n; ++i) special |= a[i].special || b[i].special;
  if (special) {
    double s = static_cast<double>(c);
    for (int i = 0; i < n; ++i) s += a[i].value * b[i].value;
    if (std::isnan(s)) return FromBits(0x7fffffffu);
    return static_cast<float>(s);
  }
  // Terms as (sign, integer significand, exponent): products have 20
  // fraction bits, c has 23.
  int exps[17];
  bool negs[17];
  uint64_t sigs[17];
  int fracs[17];
  int count = 0;
  for (int i = 0; i < n; ++i) {
    negs[count] = a[i].neg != b[i].neg;
    sigs[count] = a[i].sig * b[i].sig;
    exps[count] = sigs[count] == 0 ? m.e_zero : a[i].exp + b[i].exp;
    fracs[count] = 20;
    ++count;
  }
  {
    const Term tc = Decompose(Bits(c), 0);
    negs[count] = tc.neg;
    sigs[count] = tc.sig;
    exps[count] = tc.zero ? m.e_zero : tc.exp;
    fracs[count] = 23;
    ++count;
  }
  int e_max = exps[0];
  for (int i = 1; i < count; ++i) e_max = exps[i] > e_max ? exps[i] : e_max;
  // Each term in units of 2^(e_max - F), truncated toward zero.
  int64_t sum = 0;
  for (int i = 0; i < count; ++i) {
    if (sigs[i] == 0) continue;
    const int shift = exps[i] - e_max + m.F - fracs[i];  // left shift of sig
    uint64_t v;
    if (shift >= 0) {
      v = sigs[i] << shift;  // shift <= F - 20 <= 5, sig < 2^24: no overflow
    } else if (-shift >= 64) {
      v = 0;
    } else {
      v = sigs[i] >> (-shift);
    }
    sum += negs[i] ? -static_cast<int64_t>(v) : static_cast<int64_t>(v);
  }
  if (sum == 0) return 0.0f;
  const bool neg = sum < 0;
  uint64_t mag = neg ? static_cast<uint64_t>(-sum) : static_cast<uint64_t>(sum);
  // Round toward zero to float32: value = mag * 2^(e_max - F).
  int scale = e_max - m.F;
  const int msb = 63 - __builtin_clzll(mag);
  const int lead_exp = msb + scale;
  int keep_from;  // lowest bit position of mag that survives
  if (lead_exp >= -126) {
    keep_from = msb - 23;  // 24 significant bits
  } else {
    keep_from = -149 - scale;  // subnormal: quantum 2^-149
  }
  if (keep_from > 0) {
    mag = keep_from >= 64 ? 0 : (mag >> keep_from);
    scale += keep_from;
  }
  const double r = std::ldexp(static_cast<double>(mag), scale);  // exact
  const float f = static_cast<float>(r);                           // inf past FLT_MAX
  return neg ? -f : f;
}

// d = a * b + c for one output element; a and b hold K = 8 decomposed TF32
// operands.
KERAS_ECOC_EMU_MODEL_FN float MmaDot8(const Term a[8], const Term b[8], float c,
                                      const MmaModel& m) {
  for (int k0 = 0; k0 < 8; k0 += m.L) c = FusedChunk(a + k0, b + k0, m.L, c, m);
  return c;
}

// The same on raw bit patterns (for tests and single products).
KERAS_ECOC_EMU_MODEL_FN float MmaDot8Bits(const uint32_t a[8], const uint32_t b[8], float c,
                                          const MmaModel& m) {
  Term ta[8], tb[8];
  for (int k = 0; k < 8; ++k) {
    ta[k] = Decompose(a[k], 13);
    tb[k] = Decompose(b[k], 13);
  }
  return MmaDot8(ta, tb, c, m);
}

struct MmaLaneIn {
  uint32_t a[4];
  uint32_t b[2];
  float c[4];
};
struct MmaLaneOut {
  float d[4];
};

// The warp-collective step: gathers the fragments of the 32 lanes (layout
// of ecoc_ptx.cuh, g = lane / 4, t = lane % 4), multiplies, scatters.
KERAS_ECOC_EMU_MODEL_FN void MmaM16N8K8Collective(const void* const* in, void* const* out) {
  Term A[16][8], Bt[8][8];  // Bt[j][k] = B[k][j]
  float C[16][8];
  for (int lane = 0; lane < 32; ++lane) {
    const MmaLaneIn& f = *static_cast<const MmaLaneIn*>(in[lane]);
    const int g = lane / 4, t = lane % 4;
    A[g][t] = Decompose(f.a[0], 13);
    A[g + 8][t] = Decompose(f.a[1], 13);
    A[g][t + 4] = Decompose(f.a[2], 13);
    A[g + 8][t + 4] = Decompose(f.a[3], 13);
    Bt[g][t] = Decompose(f.b[0], 13);
    Bt[g][t + 4] = Decompose(f.b[1], 13);
    C[g][2 * t] = f.c[0];
    C[g][2 * t + 1] = f.c[1];
    C[g + 8][2 * t] = f.c[2];
    C[g + 8][2 * t + 1] = f.c[3];
  }
  const MmaModel m = ModelForArch(DeviceArch());
  float D[16][8];
  for (int i = 0; i < 16; ++i)
    for (int j = 0; j < 8; ++j) D[i][j] = MmaDot8(A[i], Bt[j], C[i][j], m);
  for (int lane = 0; lane < 32; ++lane) {
    MmaLaneOut& o = *static_cast<MmaLaneOut*>(out[lane]);
    const int g = lane / 4, t = lane % 4;
    o.d[0] = D[g][2 * t];
    o.d[1] = D[g][2 * t + 1];
    o.d[2] = D[g + 8][2 * t];
    o.d[3] = D[g + 8][2 * t + 1];
  }
}

// wgmma.mma_async.m64nNk8.f32.tf32.tf32 (N = 32, 64, 128) with A from
// registers, one warp's share: its 16 rows of the warpgroup's 64 (the
// product of a row depends on that row of A and on B only, so each warp's
// rows are computed at its own rendezvous). B (N rows x 8 columns K) comes
// in the lanes' inputs, each lane having read its N / 32 rows through the
// descriptor at the wait that retires the product (RetireWgmma). The
// arithmetic per output is
// mma.m16n8k8's (MmaDot8 over the 8 products and the accumulator), which
// the tensor cores' wgmma is assumed to share: not measured (issue 16's
// device run is the test).
template <int N>
struct WgmmaLaneIn {
  uint32_t a[4];
  float d[N / 2];
  uint32_t b[N / 32][8];  // B rows (N index) (N / 32) lane + r, columns 0-7 (K)
  uint64_t desc;          // B's descriptor: the same in every lane of the warp
};
template <int N>
struct WgmmaLaneOut {
  float d[N / 2];
};

template <int N>
void WgmmaM64K8Collective(const void* const* in, void* const* out) {
  namespace wg = ::keras_ecoc::cuda::wgmma;
  constexpr int R = N / 32;
  Term A[16][8], Bt[N][8];  // Bt[n][k] = B[k][n]
  float C[16][N];
  const auto* first = static_cast<const WgmmaLaneIn<N>*>(in[0]);
  for (int lane = 0; lane < 32; ++lane) {
    const WgmmaLaneIn<N>& f = *static_cast<const WgmmaLaneIn<N>*>(in[lane]);
    if (f.desc != first->desc)
      Fatal("wgmma.mma_async: lane %d's B descriptor %#llx differs from lane 0's %#llx", lane,
            static_cast<unsigned long long>(f.desc),
            static_cast<unsigned long long>(first->desc));
    // The warp's 16 rows: warp 0's coordinates (ecoc_wgmma_desc.h).
    for (int r = 0; r < 4; ++r) {
      const wg::RowCol e = wg::AFragmentElement(0, lane, r);
      A[e.row][e.col] = Decompose(f.a[r], 13);
    }
    for (int r = 0; r < R; ++r)
      for (int k = 0; k < 8; ++k) Bt[R * lane + r][k] = Decompose(f.b[r][k], 13);
    for (int r = 0; r < N / 2; ++r) {
      const wg::RowCol e = wg::DFragmentElement(0, lane, r);
      C[e.row][e.col] = f.d[r];
    }
  }
  const MmaModel m = ModelForArch(DeviceArch());
  for (int lane = 0; lane < 32; ++lane) {
    WgmmaLaneOut<N>& o = *static_cast<WgmmaLaneOut<N>*>(out[lane]);
    for (int r = 0; r < N / 2; ++r) {
      const wg::RowCol e = wg::DFragmentElement(0, lane, r);
      o.d[r] = MmaDot8(A[e.row], Bt[e.col], C[e.row][e.col], m);
    }
  }
}

}  // namespace tf32

// ldmatrix.sync.aligned.m8n8.{x2,x4}.shared.b16 on 32-bit words: lane l
// gives the address of row l % 8 of matrix l / 8 (checked by the lane:
// 16-byte aligned, inside the block's dynamic shared memory) and receives
// word l % 4 of row l / 4 of each matrix. Each lane reads its own row when
// it arrives, before the rendezvous, as a scalar load would: reading at the
// rendezvous instead saw other warps' copies that landed while this warp
// waited for its last lane, and hid a missing barrier (the emulator test
// that deletes each marked barrier caught that).
struct LdMatrixLaneIn {
  uint32_t words[4];
};
struct LdMatrixLaneOut {
  uint32_t r[4];
};
template <int kMatrices>
void LdMatrixCollective(const void* const* in, void* const* out) {
  namespace lm = ::keras_ecoc::cuda::ldmatrix;  // ecoc_ldmatrix_layout.h
  for (int lane = 0; lane < 32; ++lane) {
    LdMatrixLaneOut& o = *static_cast<LdMatrixLaneOut*>(out[lane]);
    for (int j = 0; j < kMatrices; ++j) {
      const lm::Word w = lm::Received(lane, j);
      const auto& src = *static_cast<const LdMatrixLaneIn*>(in[lm::AddressLane(w.matrix, w.row)]);
      o.r[j] = src.words[w.word];
    }
  }
}

}  // namespace keras_ecoc_emu

namespace keras_ecoc {
namespace cuda {
namespace ptx {

// ex2.approx.ftz.f32: the correctly rounded 2^x (exp2f) with the card's
// flushes (a subnormal x counts as 0, a subnormal result is +0); the
// card's own approximation error, about 2 ulp, is not modelled.
__device__ __forceinline__ float ex2_approx_ftz(float x) {
  if (std::fabs(x) < FLT_MIN) x = 0.0f;
  const float y = exp2f(x);
  return y < FLT_MIN ? 0.0f : y;
}

template <int kMatrices>
__device__ __forceinline__ void LdMatrix(uint32_t* r, const void* row, const char* what,
                                         const char* file, int line) {
  const int lane = static_cast<int>(threadIdx.x % 32);
  ::keras_ecoc_emu::LdMatrixLaneIn in{};
  // Lanes past the matrices' rows (x2: 16-31) supply no address.
  if (lane < 8 * kMatrices) {
    ::keras_ecoc_emu::CheckSharedAccess(row, 16, what, file, line);
    std::memcpy(in.words, row, 16);
  }
  ::keras_ecoc_emu::LdMatrixLaneOut out;
  ::keras_ecoc_emu::WarpCollective(what, &::keras_ecoc_emu::LdMatrixCollective<kMatrices>,
                                   &in, &out, file, line);
  for (int j = 0; j < kMatrices; ++j) r[j] = out.r[j];
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t r[4], const void* row,
                                            const char* file = __builtin_FILE(),
                                            int line = __builtin_LINE()) {
  LdMatrix<4>(r, row, "ldmatrix.x4", file, line);
}

__device__ __forceinline__ void ldmatrix_x2(uint32_t r[2], const void* row,
                                            const char* file = __builtin_FILE(),
                                            int line = __builtin_LINE()) {
  LdMatrix<2>(r, row, "ldmatrix.x2", file, line);
}

__device__ __forceinline__ uint32_t cvt_rna_tf32(float x) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  return ::keras_ecoc_emu::tf32::CvtRna(x);
#else
  return __float_as_uint(x);
#endif
}

__device__ __forceinline__ void mma_m16n8k8_tf32(float d[4], const uint32_t a[4],
                                                 const uint32_t b[2], const float c[4],
                                                 const char* file = __builtin_FILE(),
                                                 int line = __builtin_LINE()) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  ::keras_ecoc_emu::tf32::MmaLaneIn in;
  for (int i = 0; i < 4; ++i) in.a[i] = a[i];
  in.b[0] = b[0];
  in.b[1] = b[1];
  for (int i = 0; i < 4; ++i) in.c[i] = c[i];
  ::keras_ecoc_emu::tf32::MmaLaneOut out;
  ::keras_ecoc_emu::WarpCollective("mma.sync.m16n8k8.tf32",
                                   &::keras_ecoc_emu::tf32::MmaM16N8K8Collective, &in, &out, file,
                                   line);
  for (int i = 0; i < 4; ++i) d[i] = out.d[i];
#else
  (void)d, (void)a, (void)b, (void)c;
  ::keras_ecoc_emu::Fatal("mma_m16n8k8_tf32 (%s:%d) reached below sm_80 (__trap on a GPU)", file,
                          line);
#endif
}

// Hopper's wgmma (ecoc_ptx.cuh): compiled for __CUDA_ARCH__ 900 (the
// emulator's sm_90 build stands for sm_90a) and run only on a simulated
// compute capability 9.0 card, else an abort where the card would trap or
// refuse the image. Asynchronous as on the card, at its latest: a product
// is queued when issued (its A registers taken then, its accumulator
// poisoned with NaN), and runs when the wgmma_wait that retires its commit
// group does, reading B through the descriptor then (emu_device.h,
// WgmmaQueue). So an accumulator read before its wait, a shared operand
// overwritten before it, a product never committed or never waited for,
// all show. Not modelled: the fences (wgmma.fence, fence.proxy.async) and
// the A registers' own lifetime (they are copied at the issue).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define KERAS_ECOC_EMU_WGMMA 1
#endif

__device__ __forceinline__ void RequireWgmma(const char* what, const char* file, int line) {
#ifdef KERAS_ECOC_EMU_WGMMA
  if (::keras_ecoc_emu::DeviceArch() != 900)
    ::keras_ecoc_emu::Fatal("%s (%s:%d) on a card of compute capability %d.%d: sm_90a code runs "
                            "on 9.0 only",
                            what, file, line, ::keras_ecoc_emu::DeviceArch() / 100,
                            ::keras_ecoc_emu::DeviceArch() / 10 % 10);
#else
  ::keras_ecoc_emu::Fatal("%s (%s:%d) reached below sm_90 (__trap on a GPU)", what, file, line);
#endif
}

__device__ __forceinline__ uint32_t shared_address(const void* p,
                                                   const char* file = __builtin_FILE(),
                                                   int line = __builtin_LINE()) {
  return ::keras_ecoc_emu::SharedAddress(p, "shared_address", file, line);
}

__device__ __forceinline__ void fence_proxy_async_shared(const char* file = __builtin_FILE(),
                                                         int line = __builtin_LINE()) {
  RequireWgmma("fence.proxy.async.shared::cta", file, line);
}

__device__ __forceinline__ void wgmma_fence(const char* file = __builtin_FILE(),
                                            int line = __builtin_LINE()) {
  RequireWgmma("wgmma.fence", file, line);
}

// Pins registers for the compiler (ecoc_ptx.cuh): nothing to do here.
template <int M>
__device__ __forceinline__ void wgmma_pin(uint32_t (&)[M]) {}

__device__ __forceinline__ void wgmma_commit(const char* file = __builtin_FILE(),
                                             int line = __builtin_LINE()) {
  RequireWgmma("wgmma.commit_group", file, line);
  ::keras_ecoc_emu::WgmmaQueue& q = ::keras_ecoc_emu::CurrentWgmmaQueue("wgmma.commit_group");
  q.committed.push_back(std::move(q.open));
  q.open.clear();
}

// One queued product, run by the warp together: each lane reads its N / 32
// rows of B through the descriptor now, and C from op.c (its snapshot at
// the issue, or the result of the product before it on the same
// accumulator, which the retirement of that one filled in). The result goes
// to `result`.
template <int N>
__device__ __forceinline__ void RetireWgmma(const ::keras_ecoc_emu::WgmmaOp& op, float* result) {
  namespace wg = ::keras_ecoc::cuda::wgmma;
  if (op.chained)
    ::keras_ecoc_emu::Fatal("%s (%s:%d): retired before the product it accumulates on", op.what,
                            op.file, op.line);
  const wg::Decoded b = wg::Decode(op.desc);
  constexpr int R = N / 32;
  const int lane = static_cast<int>(threadIdx.x % 32);
  ::keras_ecoc_emu::tf32::WgmmaLaneIn<N> in;
  for (int i = 0; i < 4; ++i) in.a[i] = op.a[i];
  for (int i = 0; i < N / 2; ++i) in.d[i] = op.c[i];
  in.desc = op.desc;
  for (int r = 0; r < R; ++r) {
    for (int k0 = 0; k0 < 8; k0 += 4) {
      // 4 consecutive K elements of one row: 16 contiguous bytes of a core matrix.
      const void* p = ::keras_ecoc_emu::SharedPointer(
          b.start + wg::ElementOffset(b, R * lane + r, k0), 16, op.what, op.file, op.line);
      std::memcpy(&in.b[r][k0], p, 16);
    }
  }
  ::keras_ecoc_emu::tf32::WgmmaLaneOut<N> out;
  ::keras_ecoc_emu::WarpCollective(op.what, &::keras_ecoc_emu::tf32::WgmmaM64K8Collective<N>, &in,
                                   &out, op.file, op.line);
  for (int i = 0; i < N / 2; ++i) result[i] = out.d[i];
}

template <int N>
__device__ __forceinline__ void wgmma_wait(const char* file = __builtin_FILE(),
                                           int line = __builtin_LINE()) {
  static_assert(N >= 0 && N <= 7, "wgmma.wait_group takes 0 .. 7");
  RequireWgmma("wgmma.wait_group", file, line);
  ::keras_ecoc_emu::WgmmaQueue& q = ::keras_ecoc_emu::CurrentWgmmaQueue("wgmma.wait_group");
  if (!q.open.empty())
    ::keras_ecoc_emu::Fatal("wgmma.wait_group (%s:%d) with %zu product(s) issued and not "
                            "committed (the first: %s:%d)",
                            file, line, q.open.size(), q.open.front().file, q.open.front().line);
  while (q.committed.size() > static_cast<size_t>(N)) {
    std::vector<::keras_ecoc_emu::WgmmaOp>& group = q.committed.front();
    for (size_t i = 0; i < group.size(); ++i) {
      const ::keras_ecoc_emu::WgmmaOp& op = group[i];
      float result[64];
      if (op.n == 32) {
        RetireWgmma<32>(op, result);
      } else if (op.n == 64) {
        RetireWgmma<64>(op, result);
      } else {
        RetireWgmma<128>(op, result);
      }
      // The next product in flight on this accumulator takes the result as
      // its C; with none, the accumulator does.
      ::keras_ecoc_emu::WgmmaOp* next = nullptr;
      for (size_t j = i + 1; j < group.size() && next == nullptr; ++j)
        if (group[j].d == op.d) next = &group[j];
      for (size_t gi = 1; gi < q.committed.size() && next == nullptr; ++gi)
        for (auto& o : q.committed[gi])
          if (next == nullptr && o.d == op.d) next = &o;
      if (next != nullptr) {
        std::memcpy(next->c, result, sizeof(float) * static_cast<size_t>(op.n / 2));
        next->chained = false;
      } else {
        std::memcpy(op.d, result, sizeof(float) * static_cast<size_t>(op.n / 2));
      }
    }
    q.committed.pop_front();
  }
}

// Queues d += A . B (N = 32, 64 or 128; the accumulator d[N / 8][4]).
template <int N>
__device__ __forceinline__ void WgmmaM64K8(float (&d)[N / 8][4], const uint32_t a[4],
                                           uint64_t desc_b, const char* file, int line) {
  static_assert(N == 32 || N == 64 || N == 128, "N: 32, 64 or 128");
  constexpr const char* what = N == 32   ? "wgmma.mma_async.m64n32k8.f32.tf32.tf32"
                               : N == 64 ? "wgmma.mma_async.m64n64k8.f32.tf32.tf32"
                                         : "wgmma.mma_async.m64n128k8.f32.tf32.tf32";
  RequireWgmma(what, file, line);
  namespace wg = ::keras_ecoc::cuda::wgmma;
  if (wg::Decode(desc_b).swizzle != 0)
    ::keras_ecoc_emu::Fatal("%s (%s:%d): B descriptor with swizzle mode %d (only 0 is emulated)",
                            what, file, line, wg::Decode(desc_b).swizzle);
  ::keras_ecoc_emu::WgmmaQueue& q = ::keras_ecoc_emu::CurrentWgmmaQueue(what);
  ::keras_ecoc_emu::WgmmaOp op{};
  for (int i = 0; i < 4; ++i) op.a[i] = a[i];
  op.desc = desc_b;
  op.n = N;
  op.d = &d[0][0];
  op.what = what;
  op.file = file;
  op.line = line;
  auto on_d = [&](const ::keras_ecoc_emu::WgmmaOp& o) {
    if (o.d != op.d && o.d < op.d + N / 2 && op.d < o.d + o.n / 2)
      ::keras_ecoc_emu::Fatal("%s (%s:%d): its accumulator overlaps that of a product in flight "
                              "(%s:%d) without being it",
                              what, file, line, o.file, o.line);
    return o.d == op.d;
  };
  op.chained = false;
  for (const auto& g : q.committed)
    for (const auto& o : g) op.chained = on_d(o) || op.chained;
  for (const auto& o : q.open) op.chained = on_d(o) || op.chained;
  if (!op.chained) {
    for (int i = 0; i < N / 2; ++i) op.c[i] = d[i / 4][i % 4];
  }
  // Undefined until the wait: NaN, so that a read before it shows.
  for (int i = 0; i < N / 2; ++i) d[i / 4][i % 4] = std::numeric_limits<float>::quiet_NaN();
  q.open.push_back(op);
}

__device__ __forceinline__ void wgmma_m64n32k8_tf32(float (&d)[4][4], const uint32_t a[4],
                                                    uint64_t desc_b,
                                                    const char* file = __builtin_FILE(),
                                                    int line = __builtin_LINE()) {
  WgmmaM64K8<32>(d, a, desc_b, file, line);
}

__device__ __forceinline__ void wgmma_m64n64k8_tf32(float (&d)[8][4], const uint32_t a[4],
                                                    uint64_t desc_b,
                                                    const char* file = __builtin_FILE(),
                                                    int line = __builtin_LINE()) {
  WgmmaM64K8<64>(d, a, desc_b, file, line);
}

__device__ __forceinline__ void wgmma_m64n128k8_tf32(float (&d)[16][4], const uint32_t a[4],
                                                     uint64_t desc_b,
                                                     const char* file = __builtin_FILE(),
                                                     int line = __builtin_LINE()) {
  WgmmaM64K8<128>(d, a, desc_b, file, line);
}

template <int N>
__device__ __forceinline__ void wgmma_tf32(float (&d)[N / 8][4], const uint32_t a[4],
                                           uint64_t desc_b, const char* file = __builtin_FILE(),
                                           int line = __builtin_LINE()) {
  WgmmaM64K8<N>(d, a, desc_b, file, line);
}

// Both cp.async wrappers: on sm_80+ a copy of N bytes deferred until its
// wait (emu_runtime.cc checks size, alignment and bounds), below sm_80 the
// real header's plain load and store (zeros past src_bytes).
template <int N>
__device__ __forceinline__ void CpAsyncBytes(void* smem_dst, const void* gmem_src, int src_bytes,
                                             const char* file, int line) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  ::keras_ecoc_emu::CpAsync(smem_dst, gmem_src, N, src_bytes, file, line);
#else
  (void)file, (void)line;
  char buf[N] = {0};
  if (src_bytes > 0) std::memcpy(buf, gmem_src, static_cast<size_t>(src_bytes < N ? src_bytes : N));
  std::memcpy(smem_dst, buf, N);
#endif
}

__device__ __forceinline__ void cp_async_16(void* smem_dst, const void* gmem_src,
                                            int src_bytes = 16,
                                            const char* file = __builtin_FILE(),
                                            int line = __builtin_LINE()) {
  CpAsyncBytes<16>(smem_dst, gmem_src, src_bytes, file, line);
}

__device__ __forceinline__ void cp_async_4(void* smem_dst, const void* gmem_src,
                                           int src_bytes = 4,
                                           const char* file = __builtin_FILE(),
                                           int line = __builtin_LINE()) {
  CpAsyncBytes<4>(smem_dst, gmem_src, src_bytes, file, line);
}

__device__ __forceinline__ void cp_async_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  ::keras_ecoc_emu::CpAsyncCommit();
#endif
}

template <int N>
__device__ __forceinline__ void cp_async_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  ::keras_ecoc_emu::CpAsyncWait(N);
#endif
}

}  // namespace ptx
}  // namespace cuda
}  // namespace keras_ecoc

#endif  // KERAS_ECOC_KERNELS_CUDA_EMU_PTX_EMU_H_
