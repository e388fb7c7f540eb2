// CPU math core of the fused ECOC ops (see ecoc_cpu_math.h).
//
// Compiled twice: -DECOC_CPU_GETTER=GetKernelsBase (baseline x86-64) and
// -DECOC_CPU_GETTER=GetKernelsAvx2 -mavx2 -mfma. Everything but the getter has
// internal linkage, and no C++ standard library template is instantiated here,
// so the two copies never get merged by the linker.
//
// Layout of the work (cut-cross-entropy style):
//  * rows are grouped in blocks of W = 8 or 16 (one or two 8-lane vectors);
//    each block keeps u transposed ([k][W]) so the logits of a class tile are
//    a small register-blocked GEMM: out[c][rows] += M[c][j] * uT[j][rows];
//  * the forward pass walks class tiles of C classes, keeps per row a running
//    max m, sum l = sum exp(logit - m), sum of p*||M||^2 and the expected-code
//    accumulator (another small GEMM: acc[j][rows] += M[c][j] * p[c][rows]),
//    rescaled by exp(m_old - m_new) when the max moves (online softmax);
//  * when there are few row blocks, the classes are also split among threads
//    and the partial states are merged at the end (flash-decoding style).
// The only scratch is O(B k + n + C W) floats per call/thread.
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ecoc_cpu_math.h"

#ifndef ECOC_CPU_GETTER
#error "compile with -DECOC_CPU_GETTER=GetKernelsBase or GetKernelsAvx2"
#endif
#ifndef ECOC_CPU_ISA_NAME
#error "compile with -DECOC_CPU_ISA_NAME=\"base\" or \"avx2\""
#endif

namespace keras_ecoc {
namespace cpu {
namespace {

constexpr int kLanes = 8;
typedef float vf __attribute__((vector_size(32)));
typedef int32_t vi __attribute__((vector_size(32)));
typedef float vfu __attribute__((vector_size(32), aligned(4), may_alias));

inline vf Load(const float* p) { return *reinterpret_cast<const vfu*>(p); }
inline void Store(float* p, vf v) { *reinterpret_cast<vfu*>(p) = v; }
inline vf Splat(float x) {
  vf v = {x, x, x, x, x, x, x, x};
  return v;
}
inline vi SplatI(int32_t x) {
  vi v = {x, x, x, x, x, x, x, x};
  return v;
}
// max that ignores a NaN in `a` (NaN is propagated through exp instead).
inline vf Max(vf a, vf b) { return a > b ? a : b; }

constexpr float kInf = __builtin_inff();

// exp(x) on 8 lanes, relative error ~1e-7 (Cephes expf polynomial).
// exp(NaN) = NaN, exp(x < -87.33) = 0 (incl. -inf), exp(x > 88) = inf,
// exp(0) = 1 exactly.
inline vf Exp(vf x) {
  const vf hi = Splat(88.0f);
  const vf lo = Splat(-87.33654f);
  vf xc = x > hi ? hi : x;
  xc = xc < lo ? lo : xc;
  vf fx = xc * Splat(1.44269504088896341f);
  vf nf = (fx + Splat(12582912.0f)) - Splat(12582912.0f);  // round
  vf r = xc - nf * Splat(0.693359375f);
  r = r - nf * Splat(-2.12194440e-4f);
  vf r2 = r * r;
  vf p = Splat(1.9875691500e-4f);
  p = p * r + Splat(1.3981999507e-3f);
  p = p * r + Splat(8.3334519073e-3f);
  p = p * r + Splat(4.1665795894e-2f);
  p = p * r + Splat(1.6666665459e-1f);
  p = p * r + Splat(5.0000001201e-1f);
  p = p * r2 + r + Splat(1.0f);
  vi n = __builtin_convertvector(nf, vi);
  vi bits = (n + SplatI(127)) << 23;
  vf res = p * __builtin_bit_cast(vf, bits);
  res = x < lo ? Splat(0.0f) : res;
  res = x > hi ? Splat(kInf) : res;
  res = x != x ? x : res;
  return res;
}

// The one expression for a logit (shared by tiles and label logits so that
// the label's own logit compares equal to itself bit for bit).
inline vf FinishLogit(vf dot, vf s, vf ct, vf rowc) {
  return s * dot + ct + rowc;
}

// sum_j x_j^2 (8-lane partial sums, then the tail).
inline float SumSquares(const float* x, int64_t k) {
  vf acc = Splat(0.0f);
  int64_t j = 0;
  for (; j + kLanes <= k; j += kLanes) {
    const vf v = Load(x + j);
    acc = acc + v * v;
  }
  float s = 0.0f;
  for (int i = 0; i < kLanes; ++i) s += acc[i];
  for (; j < k; ++j) s += x[j] * x[j];
  return s;
}

inline int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }
inline int64_t Min64(int64_t a, int64_t b) { return a < b ? a : b; }
inline int64_t Max64(int64_t a, int64_t b) { return a > b ? a : b; }

// Owning scratch buffer (64-byte aligned, zero-initialised on request).
struct Scratch {
  void* p = nullptr;
  ~Scratch() { free(p); }
  bool Alloc(int64_t bytes, bool zero) {
    int64_t rounded = ((bytes > 0 ? bytes : 1) + 63) / 64 * 64;
    p = aligned_alloc(64, static_cast<size_t>(rounded));
    if (p != nullptr && zero) memset(p, 0, static_cast<size_t>(rounded));
    return p != nullptr;
  }
  float* f() const { return static_cast<float*>(p); }
  int32_t* i32() const { return static_cast<int32_t*>(p); }
  int64_t* i64() const { return static_cast<int64_t*>(p); }
};

// ---------------------------------------------------------------------------
// Problem set-up shared by all ops.
struct Problem {
  const float* z;
  const int64_t* labels;  // may be null
  const float* codes;
  float scale;  // 1 for the scale-free keys of rank / nearest
  float eps;
  int64_t B, n, k;
  int NV, W;
  int64_t nblk, Bp, kp;
  float* u;     // [Bp][kp], zero padded
  float* ut;    // [nblk][k][W]
  float* rowc;  // [Bp]: -0.5 s ||u||^2 (0 for keys)
  float* sqn;   // [n]: ||M_i||^2
  float* ct;    // [n]: -0.5 s ||M_i||^2
  int64_t* lab;  // [Bp], padded with 0
  bool keys;     // rank / nearest: logits without the row term
};

struct ProblemStorage {
  Scratch u, ut, rowc, sqn, ct, lab;
};

void PrepRowsWork(void* arg, int64_t begin, int64_t end) {
  const Problem& P = *static_cast<const Problem*>(arg);
  const int64_t k = P.k, kp = P.kp, W = P.W;
  for (int64_t blk = begin; blk < end; ++blk) {
    float* utb = P.ut + blk * k * W;
    for (int64_t i = 0; i < W; ++i) {
      const int64_t row = blk * W + i;
      float* ur = P.u + row * kp;
      if (row >= P.B) {
        for (int64_t j = 0; j < kp; ++j) ur[j] = 0.0f;
        for (int64_t j = 0; j < k; ++j) utb[j * W + i] = 0.0f;
        P.rowc[row] = 0.0f;
        P.lab[row] = 0;
        continue;
      }
      const float* zr = P.z + row * k;
      const float ss = SumSquares(zr, k);
      // max(ss, eps) that keeps a NaN.
      const float clamped = ss < P.eps ? P.eps : ss;
      const float r = 1.0f / __builtin_sqrtf(clamped);
      for (int64_t j = 0; j < k; ++j) {
        const float v = zr[j] * r;
        ur[j] = v;
        utb[j * W + i] = v;
      }
      for (int64_t j = k; j < kp; ++j) ur[j] = 0.0f;
      const float usq = SumSquares(ur, k);
      P.rowc[row] = P.keys ? 0.0f : -0.5f * P.scale * usq;
      P.lab[row] = P.labels != nullptr ? P.labels[row] : 0;
    }
  }
}

void PrepClassesWork(void* arg, int64_t begin, int64_t end) {
  const Problem& P = *static_cast<const Problem*>(arg);
  const int64_t k = P.k;
  for (int64_t c = begin; c < end; ++c) {
    const float ss = SumSquares(P.codes + c * k, k);
    P.sqn[c] = ss;
    P.ct[c] = -0.5f * P.scale * ss;
  }
}

int SetUp(const Runtime* rt, Problem* P, ProblemStorage* S) {
  P->NV = P->B <= kLanes ? 1 : 2;
  P->W = P->NV * kLanes;
  P->nblk = CeilDiv(P->B, P->W);
  P->Bp = P->nblk * P->W;
  P->kp = CeilDiv(P->k, kLanes) * kLanes;
  if (!S->u.Alloc(P->Bp * P->kp * 4, false) ||
      !S->ut.Alloc(P->Bp * P->k * 4, false) ||
      !S->rowc.Alloc(P->Bp * 4, false) || !S->sqn.Alloc(P->n * 4, false) ||
      !S->ct.Alloc(P->n * 4, false) || !S->lab.Alloc(P->Bp * 8, false)) {
    return 1;
  }
  P->u = S->u.f();
  P->ut = S->ut.f();
  P->rowc = S->rowc.f();
  P->sqn = S->sqn.f();
  P->ct = S->ct.f();
  P->lab = S->lab.i64();
  rt->parallel_for(rt->pool, P->nblk, P->W * P->k * 8, PrepRowsWork, P);
  rt->parallel_for(rt->pool, P->n, P->k * 4, PrepClassesWork, P);
  return 0;
}

// Class tile size: keep a tile of codes (C x k floats) within ~96 KiB (L2).
int64_t ClassTile(int64_t k) {
  int64_t c = 24576 / Max64(k, 1);
  c = Max64(32, Min64(512, c));
  return c / 8 * 8;
}

// ---------------------------------------------------------------------------
// GEMM 1: logits of a class tile for one row block.
//   Lt[c][w] = FinishLogit(sum_j M[c][j] * uT[j][w], s, ct[c], rowc[w])
template <int NC, int NV>
inline void Gemm1Micro(const float* M, int64_t k, const float* utb, vf sv,
                       const float* ct, const vf* rc, float* out) {
  constexpr int W = NV * kLanes;
  vf acc[NC][NV];
  for (int c = 0; c < NC; ++c)
    for (int v = 0; v < NV; ++v) acc[c][v] = Splat(0.0f);
  for (int64_t j = 0; j < k; ++j) {
    vf b[NV];
    for (int v = 0; v < NV; ++v) b[v] = Load(utb + j * W + v * kLanes);
    for (int c = 0; c < NC; ++c) {
      const vf a = Splat(M[c * k + j]);
      for (int v = 0; v < NV; ++v) acc[c][v] = acc[c][v] + a * b[v];
    }
  }
  for (int c = 0; c < NC; ++c) {
    const vf ctv = Splat(ct[c]);
    for (int v = 0; v < NV; ++v)
      Store(out + c * W + v * kLanes, FinishLogit(acc[c][v], sv, ctv, rc[v]));
  }
}

template <int NV>
void Gemm1Tile(const Problem& P, int64_t blk, int64_t c0, int64_t c1,
               float* Lt) {
  constexpr int W = NV * kLanes;
  const int64_t k = P.k;
  const float* utb = P.ut + blk * k * W;
  vf rc[NV];
  for (int v = 0; v < NV; ++v) rc[v] = Load(P.rowc + blk * W + v * kLanes);
  const vf sv = Splat(P.scale);
  int64_t c = c0;
  for (; c + 6 <= c1; c += 6)
    Gemm1Micro<6, NV>(P.codes + c * k, k, utb, sv, P.ct + c, rc,
                      Lt + (c - c0) * W);
  float* out = Lt + (c - c0) * W;
  const float* M = P.codes + c * k;
  switch (c1 - c) {
    case 5: Gemm1Micro<5, NV>(M, k, utb, sv, P.ct + c, rc, out); break;
    case 4: Gemm1Micro<4, NV>(M, k, utb, sv, P.ct + c, rc, out); break;
    case 3: Gemm1Micro<3, NV>(M, k, utb, sv, P.ct + c, rc, out); break;
    case 2: Gemm1Micro<2, NV>(M, k, utb, sv, P.ct + c, rc, out); break;
    case 1: Gemm1Micro<1, NV>(M, k, utb, sv, P.ct + c, rc, out); break;
    default: break;
  }
}

// The label's logit for the W rows of a block, with the same arithmetic as
// Gemm1Micro (so that a class never compares greater than itself).
template <int NV>
void LabelLogits(const Problem& P, int64_t blk, float* out) {
  constexpr int W = NV * kLanes;
  const int64_t k = P.k;
  const float* utb = P.ut + blk * k * W;
  const int64_t* lab = P.lab + blk * W;
  vf acc[NV];
  for (int v = 0; v < NV; ++v) acc[v] = Splat(0.0f);
  float tmp[W] __attribute__((aligned(32)));
  for (int64_t j = 0; j < k; ++j) {
    for (int i = 0; i < W; ++i) tmp[i] = P.codes[lab[i] * k + j];
    for (int v = 0; v < NV; ++v)
      acc[v] = acc[v] + Load(tmp + v * kLanes) * Load(utb + j * W + v * kLanes);
  }
  for (int i = 0; i < W; ++i) tmp[i] = P.ct[lab[i]];
  const vf sv = Splat(P.scale);
  for (int v = 0; v < NV; ++v) {
    const vf rc = Load(P.rowc + blk * W + v * kLanes);
    Store(out + v * kLanes,
          FinishLogit(acc[v], sv, Load(tmp + v * kLanes), rc));
  }
}

// ---------------------------------------------------------------------------
// Forward.
// GEMM 2: accT[j][w] = accT[j][w] * alpha[w] + sum_c M[c][j] * Pt[c][w].
template <int NJ, int NV>
inline void Gemm2Micro(const float* M, int64_t k, int64_t C, const float* Pt,
                       float* accT, const vf* alpha) {
  constexpr int W = NV * kLanes;
  vf acc[NJ][NV];
  for (int j = 0; j < NJ; ++j)
    for (int v = 0; v < NV; ++v) acc[j][v] = Splat(0.0f);
  for (int64_t c = 0; c < C; ++c) {
    vf p[NV];
    for (int v = 0; v < NV; ++v) p[v] = Load(Pt + c * W + v * kLanes);
    for (int j = 0; j < NJ; ++j) {
      const vf a = Splat(M[c * k + j]);
      for (int v = 0; v < NV; ++v) acc[j][v] = acc[j][v] + a * p[v];
    }
  }
  for (int j = 0; j < NJ; ++j)
    for (int v = 0; v < NV; ++v) {
      float* dst = accT + j * W + v * kLanes;
      Store(dst, Load(dst) * alpha[v] + acc[j][v]);
    }
}

template <int NV>
void ForwardTileUpdate(const Problem& P, int64_t c0, int64_t c1, float* Lt,
                       float* m, float* l, float* sq, float* accT) {
  constexpr int W = NV * kLanes;
  const int64_t C = c1 - c0;
  vf mt[NV], mold[NV], mnew[NV], alpha[NV], sp[NV], ssq[NV];
  for (int v = 0; v < NV; ++v) {
    mt[v] = Splat(-kInf);
    sp[v] = Splat(0.0f);
    ssq[v] = Splat(0.0f);
  }
  for (int64_t c = 0; c < C; ++c)
    for (int v = 0; v < NV; ++v) mt[v] = Max(Load(Lt + c * W + v * kLanes), mt[v]);
  for (int v = 0; v < NV; ++v) {
    mold[v] = Load(m + v * kLanes);
    mnew[v] = Max(mt[v], mold[v]);
    alpha[v] = Exp(mold[v] - mnew[v]);
  }
  for (int64_t c = 0; c < C; ++c) {
    const vf sq_c = Splat(P.sqn[c0 + c]);
    for (int v = 0; v < NV; ++v) {
      float* lp = Lt + c * W + v * kLanes;
      const vf p = Exp(Load(lp) - mnew[v]);
      Store(lp, p);
      sp[v] = sp[v] + p;
      ssq[v] = ssq[v] + p * sq_c;
    }
  }
  for (int v = 0; v < NV; ++v) {
    Store(m + v * kLanes, mnew[v]);
    Store(l + v * kLanes, Load(l + v * kLanes) * alpha[v] + sp[v]);
    Store(sq + v * kLanes, Load(sq + v * kLanes) * alpha[v] + ssq[v]);
  }
  const int64_t k = P.k;
  const float* M = P.codes + c0 * k;
  int64_t j = 0;
  for (; j + 6 <= k; j += 6) Gemm2Micro<6, NV>(M + j, k, C, Lt, accT + j * W, alpha);
  switch (k - j) {
    case 5: Gemm2Micro<5, NV>(M + j, k, C, Lt, accT + j * W, alpha); break;
    case 4: Gemm2Micro<4, NV>(M + j, k, C, Lt, accT + j * W, alpha); break;
    case 3: Gemm2Micro<3, NV>(M + j, k, C, Lt, accT + j * W, alpha); break;
    case 2: Gemm2Micro<2, NV>(M + j, k, C, Lt, accT + j * W, alpha); break;
    case 1: Gemm2Micro<1, NV>(M + j, k, C, Lt, accT + j * W, alpha); break;
    default: break;
  }
}

// Work items: (row super-block, class split). Partial states per split.
struct Split {
  int64_t blocks_per_item;  // row blocks per item
  int64_t row_items;
  int64_t C;                // class tile
  int64_t ntiles;
  int64_t tiles_per_split;
  int64_t S;                // class splits
};

Split PlanRowsByClasses(const Runtime* rt, const Problem& P) {
  Split s;
  const int64_t threads = Max64(1, rt->num_threads);
  s.blocks_per_item = Max64(1, Min64(4, P.nblk / threads));
  s.row_items = CeilDiv(P.nblk, s.blocks_per_item);
  s.C = ClassTile(P.k);
  s.ntiles = CeilDiv(P.n, s.C);
  int64_t S = 1;
  if (s.row_items < 2 * threads) {
    S = Min64(s.ntiles, CeilDiv(4 * threads, s.row_items));
  }
  s.tiles_per_split = CeilDiv(s.ntiles, S);
  s.S = CeilDiv(s.ntiles, s.tiles_per_split);
  return s;
}

struct ForwardCtx {
  const Problem* P;
  Split sp;
  float* pm;    // [S][Bp]
  float* pl;    // [S][Bp]
  float* psq;   // [S][Bp]
  float* pacc;  // [S][nblk][k][W]
  float* ly;    // [Bp] label logits
  float* loss;
  float* lse;
  float* ec;
  float* esq;
  volatile int failed;
};

template <int NV>
void ForwardWorkT(ForwardCtx* ctx, int64_t begin, int64_t end) {
  constexpr int W = NV * kLanes;
  const Problem& P = *ctx->P;
  const Split& sp = ctx->sp;
  Scratch lt;
  if (!lt.Alloc(sp.C * W * 4, false)) {
    ctx->failed = 1;
    return;
  }
  const int64_t k = P.k;
  for (int64_t item = begin; item < end; ++item) {
    const int64_t ri = item / sp.S, split = item % sp.S;
    const int64_t b0 = ri * sp.blocks_per_item;
    const int64_t b1 = Min64(P.nblk, b0 + sp.blocks_per_item);
    const int64_t t0 = split * sp.tiles_per_split;
    const int64_t t1 = Min64(sp.ntiles, t0 + sp.tiles_per_split);
    float* pm = ctx->pm + split * P.Bp;
    float* pl = ctx->pl + split * P.Bp;
    float* psq = ctx->psq + split * P.Bp;
    float* pacc = ctx->pacc + split * P.nblk * k * W;
    for (int64_t r = b0 * W; r < b1 * W; ++r) {
      pm[r] = -kInf;
      pl[r] = 0.0f;
      psq[r] = 0.0f;
    }
    memset(pacc + b0 * k * W, 0, static_cast<size_t>((b1 - b0) * k * W * 4));
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t c0 = t * sp.C, c1 = Min64(P.n, c0 + sp.C);
      for (int64_t blk = b0; blk < b1; ++blk) {
        Gemm1Tile<NV>(P, blk, c0, c1, lt.f());
        ForwardTileUpdate<NV>(P, c0, c1, lt.f(), pm + blk * W, pl + blk * W,
                              psq + blk * W, pacc + blk * k * W);
      }
    }
    if (split == 0) {
      for (int64_t blk = b0; blk < b1; ++blk) LabelLogits<NV>(P, blk, ctx->ly + blk * W);
    }
  }
}

void ForwardWork(void* arg, int64_t begin, int64_t end) {
  ForwardCtx* ctx = static_cast<ForwardCtx*>(arg);
  if (ctx->P->NV == 1) {
    ForwardWorkT<1>(ctx, begin, end);
  } else {
    ForwardWorkT<2>(ctx, begin, end);
  }
}

void ForwardMergeWork(void* arg, int64_t begin, int64_t end) {
  ForwardCtx* ctx = static_cast<ForwardCtx*>(arg);
  const Problem& P = *ctx->P;
  const int64_t S = ctx->sp.S, k = P.k, W = P.W;
  float wts[64];
  for (int64_t row = begin; row < end; ++row) {
    const int64_t blk = row / W, i = row % W;
    float mx = -kInf;
    for (int64_t s = 0; s < S; ++s) {
      const float v = ctx->pm[s * P.Bp + row];
      mx = v > mx ? v : mx;
    }
    float l = 0.0f, sq = 0.0f;
    for (int64_t s = 0; s < S; ++s) {
      wts[s] = S == 1 ? 1.0f : __builtin_expf(ctx->pm[s * P.Bp + row] - mx);
      l += wts[s] * ctx->pl[s * P.Bp + row];
      sq += wts[s] * ctx->psq[s * P.Bp + row];
    }
    const float lse = mx + __builtin_logf(l);
    ctx->lse[row] = lse;
    ctx->loss[row] = lse - ctx->ly[row];
    ctx->esq[row] = sq / l;
    float* ec = ctx->ec + row * k;
    for (int64_t j = 0; j < k; ++j) {
      float a = 0.0f;
      for (int64_t s = 0; s < S; ++s)
        a += wts[s] * ctx->pacc[((s * P.nblk + blk) * k + j) * W + i];
      ec[j] = a / l;
    }
  }
}

int Forward(const Runtime* rt, const float* z, const int64_t* labels,
            const float* codes, float scale, float epsilon, int64_t batch,
            int64_t num_classes, int64_t code_length, float* loss, float* lse,
            float* expected_code, float* expected_sqnorm) {
  if (batch == 0) return 0;
  Problem P;
  P.z = z;
  P.labels = labels;
  P.codes = codes;
  P.scale = scale;
  P.eps = epsilon;
  P.B = batch;
  P.n = num_classes;
  P.k = code_length;
  P.keys = false;
  ProblemStorage storage;
  if (SetUp(rt, &P, &storage) != 0) return 1;
  ForwardCtx ctx;
  ctx.P = &P;
  ctx.sp = PlanRowsByClasses(rt, P);
  if (ctx.sp.S > 64) {  // the merge keeps the split weights on the stack
    ctx.sp.tiles_per_split = CeilDiv(ctx.sp.ntiles, 64);
    ctx.sp.S = CeilDiv(ctx.sp.ntiles, ctx.sp.tiles_per_split);
  }
  const int64_t S = ctx.sp.S;
  Scratch pm, pl, psq, pacc, ly;
  if (!pm.Alloc(S * P.Bp * 4, false) || !pl.Alloc(S * P.Bp * 4, false) ||
      !psq.Alloc(S * P.Bp * 4, false) ||
      !pacc.Alloc(S * P.Bp * P.k * 4, false) || !ly.Alloc(P.Bp * 4, false)) {
    return 1;
  }
  ctx.pm = pm.f();
  ctx.pl = pl.f();
  ctx.psq = psq.f();
  ctx.pacc = pacc.f();
  ctx.ly = ly.f();
  ctx.loss = loss;
  ctx.lse = lse;
  ctx.ec = expected_code;
  ctx.esq = expected_sqnorm;
  ctx.failed = 0;
  const int64_t items = ctx.sp.row_items * S;
  const int64_t cost = ctx.sp.blocks_per_item * P.W *
                       ctx.sp.tiles_per_split * ctx.sp.C * P.k * 4;
  rt->parallel_for(rt->pool, items, cost, ForwardWork, &ctx);
  if (ctx.failed) return 1;
  rt->parallel_for(rt->pool, P.B, (S + 2) * P.k * 2, ForwardMergeWork, &ctx);
  return 0;
}

// ---------------------------------------------------------------------------
// Codes gradient: per class tile, stream over the batch.
//   G[c][j] += sum_r w[c][r] u[r][j],  wsum[c] += sum_r w[c][r]
//   w[c][r] = g_r (exp(logit - lse_r) - [c == y_r])
//   grad_c = s (G[c] - wsum[c] M_c)
template <int NC, int NJV>
inline void Gemm3Micro(const float* Wt, int64_t ldw, int64_t rows,
                       const float* u, int64_t kp, float* G) {
  vf acc[NC][NJV];
  for (int c = 0; c < NC; ++c)
    for (int v = 0; v < NJV; ++v) acc[c][v] = Load(G + c * kp + v * kLanes);
  for (int64_t i = 0; i < rows; ++i) {
    vf b[NJV];
    for (int v = 0; v < NJV; ++v) b[v] = Load(u + i * kp + v * kLanes);
    for (int c = 0; c < NC; ++c) {
      const vf a = Splat(Wt[c * ldw + i]);
      for (int v = 0; v < NJV; ++v) acc[c][v] = acc[c][v] + a * b[v];
    }
  }
  for (int c = 0; c < NC; ++c)
    for (int v = 0; v < NJV; ++v) Store(G + c * kp + v * kLanes, acc[c][v]);
}

template <int NC>
inline void Gemm3Row(const float* Wt, int64_t ldw, int64_t rows, const float* u,
                     int64_t kp, float* G) {
  int64_t j = 0;
  for (; j + 2 * kLanes <= kp; j += 2 * kLanes)
    Gemm3Micro<NC, 2>(Wt, ldw, rows, u + j, kp, G + j);
  if (j < kp) Gemm3Micro<NC, 1>(Wt, ldw, rows, u + j, kp, G + j);
}

void Gemm3(const float* Wt, int64_t ldw, int64_t C, int64_t rows,
           const float* u, int64_t kp, float* G) {
  int64_t c = 0;
  for (; c + 4 <= C; c += 4) Gemm3Row<4>(Wt + c * ldw, ldw, rows, u, kp, G + c * kp);
  switch (C - c) {
    case 3: Gemm3Row<3>(Wt + c * ldw, ldw, rows, u, kp, G + c * kp); break;
    case 2: Gemm3Row<2>(Wt + c * ldw, ldw, rows, u, kp, G + c * kp); break;
    case 1: Gemm3Row<1>(Wt + c * ldw, ldw, rows, u, kp, G + c * kp); break;
    default: break;
  }
}

struct CodesGradCtx {
  const Problem* P;
  const float* lse;  // [Bp] padded
  const float* g;    // [Bp] padded (0 on pad rows)
  int64_t C, ntiles, R, blocks_per_split;
  float* grad;  // [n][k] output
  float* pg;    // [R][n][kp] partial (R > 1)
  float* pw;    // [R][n]
  volatile int failed;
};

constexpr int64_t kGroupBlocks = 4;  // row blocks per GEMM-3 group

template <int NV>
void CodesGradWorkT(CodesGradCtx* ctx, int64_t begin, int64_t end) {
  constexpr int W = NV * kLanes;
  const Problem& P = *ctx->P;
  const int64_t C = ctx->C, kp = P.kp, k = P.k;
  const int64_t RG = kGroupBlocks * W;
  Scratch lt, wt, gacc, wsum;
  if (!lt.Alloc(C * W * 4, false) || !wt.Alloc(C * RG * 4, false) ||
      !gacc.Alloc(C * kp * 4, false) || !wsum.Alloc(C * 4, false)) {
    ctx->failed = 1;
    return;
  }
  float* Lt = lt.f();
  float* Wt = wt.f();
  float* G = gacc.f();
  float* ws = wsum.f();
  for (int64_t item = begin; item < end; ++item) {
    const int64_t t = item / ctx->R, r = item % ctx->R;
    const int64_t c0 = t * C, c1 = Min64(P.n, c0 + C), Ct = c1 - c0;
    const int64_t b0 = r * ctx->blocks_per_split;
    const int64_t b1 = Min64(P.nblk, b0 + ctx->blocks_per_split);
    memset(G, 0, static_cast<size_t>(Ct * kp * 4));
    for (int64_t c = 0; c < Ct; ++c) ws[c] = 0.0f;
    for (int64_t g0 = b0; g0 < b1; g0 += kGroupBlocks) {
      const int64_t g1 = Min64(b1, g0 + kGroupBlocks);
      for (int64_t blk = g0; blk < g1; ++blk) {
        const int64_t off = (blk - g0) * W;
        Gemm1Tile<NV>(P, blk, c0, c1, Lt);
        vf lsev[NV], gv[NV];
        for (int v = 0; v < NV; ++v) {
          lsev[v] = Load(ctx->lse + blk * W + v * kLanes);
          gv[v] = Load(ctx->g + blk * W + v * kLanes);
        }
        for (int64_t c = 0; c < Ct; ++c)
          for (int v = 0; v < NV; ++v)
            Store(Wt + c * RG + off + v * kLanes,
                  gv[v] * Exp(Load(Lt + c * W + v * kLanes) - lsev[v]));
        // Padding rows (past the batch) must contribute exactly 0: their
        // g is 0, but their exp() overflows to inf for a negative scale and
        // 0 * inf would turn the whole codes gradient into NaN.
        for (int64_t i = Max64(0, P.B - blk * W); i < W; ++i)
          for (int64_t c = 0; c < Ct; ++c) Wt[c * RG + off + i] = 0.0f;
        for (int64_t i = 0; i < W; ++i) {
          const int64_t row = blk * W + i;
          if (row >= P.B) break;
          const int64_t y = P.lab[row];
          if (y >= c0 && y < c1) Wt[(y - c0) * RG + off + i] -= ctx->g[row];
        }
      }
      const int64_t rows = (g1 - g0) * W;
      for (int64_t c = 0; c < Ct; ++c) {
        float s = 0.0f;
        for (int64_t i = 0; i < rows; ++i) s += Wt[c * RG + i];
        ws[c] += s;
      }
      Gemm3(Wt, RG, Ct, rows, P.u + g0 * W * kp, kp, G);
    }
    if (ctx->R == 1) {
      const float s = P.scale;
      for (int64_t c = 0; c < Ct; ++c) {
        const float* m = P.codes + (c0 + c) * k;
        float* out = ctx->grad + (c0 + c) * k;
        for (int64_t j = 0; j < k; ++j) out[j] = s * (G[c * kp + j] - ws[c] * m[j]);
      }
    } else {
      memcpy(ctx->pg + (r * P.n + c0) * kp, G, static_cast<size_t>(Ct * kp * 4));
      memcpy(ctx->pw + r * P.n + c0, ws, static_cast<size_t>(Ct * 4));
    }
  }
}

void CodesGradWork(void* arg, int64_t begin, int64_t end) {
  CodesGradCtx* ctx = static_cast<CodesGradCtx*>(arg);
  if (ctx->P->NV == 1) {
    CodesGradWorkT<1>(ctx, begin, end);
  } else {
    CodesGradWorkT<2>(ctx, begin, end);
  }
}

void CodesGradMergeWork(void* arg, int64_t begin, int64_t end) {
  CodesGradCtx* ctx = static_cast<CodesGradCtx*>(arg);
  const Problem& P = *ctx->P;
  const int64_t k = P.k, kp = P.kp, n = P.n;
  for (int64_t c = begin; c < end; ++c) {
    float ws = 0.0f;
    for (int64_t r = 0; r < ctx->R; ++r) ws += ctx->pw[r * n + c];
    const float* m = P.codes + c * k;
    for (int64_t j = 0; j < k; ++j) {
      float a = 0.0f;
      for (int64_t r = 0; r < ctx->R; ++r) a += ctx->pg[(r * n + c) * kp + j];
      ctx->grad[c * k + j] = P.scale * (a - ws * m[j]);
    }
  }
}

int CodesGrad(const Runtime* rt, const float* z, const int64_t* labels,
              const float* codes, float scale, float epsilon, const float* lse,
              const float* grad_loss, int64_t batch, int64_t num_classes,
              int64_t code_length, float* grad_codes) {
  if (batch == 0) {
    memset(grad_codes, 0, static_cast<size_t>(num_classes * code_length * 4));
    return 0;
  }
  Problem P;
  P.z = z;
  P.labels = labels;
  P.codes = codes;
  P.scale = scale;
  P.eps = epsilon;
  P.B = batch;
  P.n = num_classes;
  P.k = code_length;
  P.keys = false;
  ProblemStorage storage;
  if (SetUp(rt, &P, &storage) != 0) return 1;
  Scratch lsep, gp;
  if (!lsep.Alloc(P.Bp * 4, true) || !gp.Alloc(P.Bp * 4, true)) return 1;
  memcpy(lsep.f(), lse, static_cast<size_t>(batch * 4));
  memcpy(gp.f(), grad_loss, static_cast<size_t>(batch * 4));
  CodesGradCtx ctx;
  ctx.P = &P;
  ctx.lse = lsep.f();
  ctx.g = gp.f();
  ctx.C = Max64(32, ClassTile(P.k) / 2);
  ctx.ntiles = CeilDiv(P.n, ctx.C);
  const int64_t threads = Max64(1, rt->num_threads);
  int64_t R = 1;
  if (ctx.ntiles < 2 * threads) {
    R = Min64(P.nblk, CeilDiv(4 * threads, ctx.ntiles));
    // Partial sums take R x n x kp floats: keep them under 16M floats.
    R = Max64(1, Min64(R, (int64_t{1} << 24) / Max64(1, P.n * P.kp)));
  }
  ctx.blocks_per_split = CeilDiv(P.nblk, R);
  ctx.R = CeilDiv(P.nblk, ctx.blocks_per_split);
  ctx.grad = grad_codes;
  Scratch pg, pw;
  if (ctx.R > 1) {
    if (!pg.Alloc(ctx.R * P.n * P.kp * 4, false) ||
        !pw.Alloc(ctx.R * P.n * 4, false)) {
      return 1;
    }
  }
  ctx.pg = pg.f();
  ctx.pw = pw.f();
  ctx.failed = 0;
  const int64_t cost = ctx.C * ctx.blocks_per_split * P.W * P.k * 4;
  rt->parallel_for(rt->pool, ctx.ntiles * ctx.R, cost, CodesGradWork, &ctx);
  if (ctx.failed) return 1;
  if (ctx.R > 1) {
    rt->parallel_for(rt->pool, P.n, ctx.R * P.k * 2, CodesGradMergeWork, &ctx);
  }
  return 0;
}

// ---------------------------------------------------------------------------
// Label rank and nearest codeword: scale-free keys M_i.u - 0.5 ||M_i||^2.
struct SearchCtx {
  const Problem* P;
  Split sp;
  float* ky;      // [Bp] label keys (rank)
  int32_t* pc;    // [S][Bp] partial counts (rank)
  float* pb;      // [S][Bp] partial best key (nearest)
  int32_t* pi;    // [S][Bp] partial best index (nearest)
  float* pn;      // [S][Bp] 0, or NaN when a key of the row is not finite
  bool rank;
  volatile int failed;
};

template <int NV>
void SearchWorkT(SearchCtx* ctx, int64_t begin, int64_t end) {
  constexpr int W = NV * kLanes;
  const Problem& P = *ctx->P;
  const Split& sp = ctx->sp;
  // Per-block state of one item (at most 4 blocks; see PlanRowsByClasses).
  constexpr int kMaxBlocks = 4;
  Scratch lt;
  if (sp.blocks_per_item > kMaxBlocks || !lt.Alloc(sp.C * W * 4, false)) {
    ctx->failed = 1;
    return;
  }
  float* Lt = lt.f();
  vf ky[kMaxBlocks][NV], best[kMaxBlocks][NV];
  vi cnt[kMaxBlocks][NV], idx[kMaxBlocks][NV];
  // key * 0 is 0 for a finite key and NaN for NaN or +-inf, so the sum flags
  // rows with a non-finite z or codeword (those never decode to a class).
  vf nonfinite[kMaxBlocks][NV];
  const vf zero = Splat(0.0f);
  for (int64_t item = begin; item < end; ++item) {
    const int64_t ri = item / sp.S, split = item % sp.S;
    const int64_t b0 = ri * sp.blocks_per_item;
    const int64_t b1 = Min64(P.nblk, b0 + sp.blocks_per_item);
    const int64_t t0 = split * sp.tiles_per_split;
    const int64_t t1 = Min64(sp.ntiles, t0 + sp.tiles_per_split);
    for (int64_t blk = b0; blk < b1; ++blk) {
      const int64_t bi = blk - b0;
      float kyb[W] __attribute__((aligned(32))) = {};
      if (ctx->rank) {
        LabelLogits<NV>(P, blk, kyb);
        if (split == 0) memcpy(ctx->ky + blk * W, kyb, sizeof(kyb));
      }
      for (int v = 0; v < NV; ++v) {
        ky[bi][v] = Load(kyb + v * kLanes);
        best[bi][v] = Splat(-kInf);
        cnt[bi][v] = SplatI(0);
        idx[bi][v] = SplatI(0);
        nonfinite[bi][v] = zero;
      }
    }
    // Class tiles outside, row blocks inside: a tile of codes stays in cache
    // while all the item's row blocks use it.
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t c0 = t * sp.C, c1 = Min64(P.n, c0 + sp.C);
      for (int64_t blk = b0; blk < b1; ++blk) {
        const int64_t bi = blk - b0;
        Gemm1Tile<NV>(P, blk, c0, c1, Lt);
        if (ctx->rank) {
          for (int64_t c = 0; c < c1 - c0; ++c)
            for (int v = 0; v < NV; ++v) {
              const vf key = Load(Lt + c * W + v * kLanes);
              cnt[bi][v] -= key > ky[bi][v];
              nonfinite[bi][v] += key * zero;
            }
        } else {
          for (int64_t c = 0; c < c1 - c0; ++c) {
            const vi ci = SplatI(static_cast<int32_t>(c0 + c));
            for (int v = 0; v < NV; ++v) {
              const vf key = Load(Lt + c * W + v * kLanes);
              const vi gt = key > best[bi][v];
              nonfinite[bi][v] += key * zero;
              best[bi][v] = gt ? key : best[bi][v];
              idx[bi][v] = gt ? ci : idx[bi][v];
            }
          }
        }
      }
    }
    for (int64_t blk = b0; blk < b1; ++blk) {
      const int64_t bi = blk - b0;
      for (int v = 0; v < NV; ++v) {
        for (int i = 0; i < kLanes; ++i) {
          const int64_t row = blk * W + v * kLanes + i;
          ctx->pn[split * P.Bp + row] = nonfinite[bi][v][i];
          if (ctx->rank) {
            ctx->pc[split * P.Bp + row] = cnt[bi][v][i];
          } else {
            ctx->pb[split * P.Bp + row] = best[bi][v][i];
            ctx->pi[split * P.Bp + row] = idx[bi][v][i];
          }
        }
      }
    }
  }
}

void SearchWork(void* arg, int64_t begin, int64_t end) {
  SearchCtx* ctx = static_cast<SearchCtx*>(arg);
  if (ctx->P->NV == 1) {
    SearchWorkT<1>(ctx, begin, end);
  } else {
    SearchWorkT<2>(ctx, begin, end);
  }
}

int Search(const Runtime* rt, const float* z, const int64_t* labels,
           const float* codes, float epsilon, int64_t batch,
           int64_t num_classes, int64_t code_length, int32_t* rank,
           int64_t* index) {
  if (batch == 0) return 0;
  Problem P;
  P.z = z;
  P.labels = labels;
  P.codes = codes;
  P.scale = 1.0f;
  P.eps = epsilon;
  P.B = batch;
  P.n = num_classes;
  P.k = code_length;
  P.keys = true;
  ProblemStorage storage;
  if (SetUp(rt, &P, &storage) != 0) return 1;
  SearchCtx ctx;
  ctx.P = &P;
  ctx.sp = PlanRowsByClasses(rt, P);
  ctx.rank = rank != nullptr;
  const int64_t S = ctx.sp.S;
  Scratch ky, pc, pb, pi, pn;
  if (!ky.Alloc(P.Bp * 4, false) || !pc.Alloc(S * P.Bp * 4, false) ||
      !pb.Alloc(S * P.Bp * 4, false) || !pi.Alloc(S * P.Bp * 4, false) ||
      !pn.Alloc(S * P.Bp * 4, false)) {
    return 1;
  }
  ctx.ky = ky.f();
  ctx.pc = pc.i32();
  ctx.pb = pb.f();
  ctx.pi = pi.i32();
  ctx.pn = pn.f();
  ctx.failed = 0;
  const int64_t items = ctx.sp.row_items * S;
  const int64_t cost = ctx.sp.blocks_per_item * P.W *
                       ctx.sp.tiles_per_split * ctx.sp.C * P.k * 2;
  rt->parallel_for(rt->pool, items, cost, SearchWork, &ctx);
  if (ctx.failed) return 1;
  for (int64_t row = 0; row < batch; ++row) {
    float flag = 0.0f;
    for (int64_t s = 0; s < S; ++s) flag += ctx.pn[s * P.Bp + row];
    const bool nonfinite = flag != flag;
    if (rank != nullptr) {
      int64_t total = 0;
      for (int64_t s = 0; s < S; ++s) total += ctx.pc[s * P.Bp + row];
      const float kyv = ctx.ky[row];
      rank[row] = (nonfinite || kyv != kyv) ? static_cast<int32_t>(num_classes)
                             : static_cast<int32_t>(total);
    } else {
      float best = ctx.pb[row];
      int32_t idx = ctx.pi[row];
      for (int64_t s = 1; s < S; ++s) {
        if (ctx.pb[s * P.Bp + row] > best) {
          best = ctx.pb[s * P.Bp + row];
          idx = ctx.pi[s * P.Bp + row];
        }
      }
      // No valid class for a row with a non-finite z or codeword.
      index[row] = nonfinite ? -1 : idx;
    }
  }
  return 0;
}

int LabelRank(const Runtime* rt, const float* z, const int64_t* labels,
              const float* codes, float epsilon, int64_t batch,
              int64_t num_classes, int64_t code_length, int32_t* rank) {
  return Search(rt, z, labels, codes, epsilon, batch, num_classes, code_length,
                rank, nullptr);
}

int Nearest(const Runtime* rt, const float* z, const float* codes,
            float epsilon, int64_t batch, int64_t num_classes,
            int64_t code_length, int64_t* index) {
  return Search(rt, z, nullptr, codes, epsilon, batch, num_classes,
                code_length, nullptr, index);
}

const Kernels kKernels = {ECOC_CPU_ISA_NAME, Forward, CodesGrad, LabelRank,
                          Nearest};

}  // namespace

const Kernels* ECOC_CPU_GETTER() { return &kKernels; }

}  // namespace cpu
}  // namespace keras_ecoc
