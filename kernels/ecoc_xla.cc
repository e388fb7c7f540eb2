// XLA lowerings of the fused ECOC ops, so that tf.function(jit_compile=True)
// and Keras model.fit(jit_compile=True) work with the ops in play (on CPU and
// on GPU, where Keras turns XLA on by default).
//
// The lowerings are tiled over the classes: when B x n exceeds kTileElems
// (4M logits, 16 MiB), the classes are processed in tiles of C classes by an
// xla::While loop (xla::ForEachIndex) that carries the online log-sum-exp
// state (running max, sum, expected code, expected squared norm), exactly like
// the CPU and CUDA kernels; otherwise a single tile (the dense computation)
// is emitted. Peak memory is thus O(B * min(n, C)) instead of O(B * n).
//
// XLA has no run-time errors: an out-of-range label gives a NaN loss (and a
// rank of n), never a silent number.
//
// Custom calls: when the framework-free kernel library's XLA FFI handlers
// (kernels/ffi/ecoc_ffi_cpu.cc, keras_ecoc/_lib/_ecoc_kernels.so) have been
// registered with TensorFlow's XLA through KerasEcocRegisterFfiTargets()
// below (the Python loader does so right after loading both libraries), the
// kernels emit a typed-FFI custom call to them instead of the HLO lowering,
// for the platform of the device they compile for ("Host" for XLA_CPU_JIT,
// "CUDA" for XLA_GPU_JIT); the HLO lowering remains where no handler is
// registered for that platform. Labels are made safe (invalid ones -> 0)
// before the call and the result masked after it, as above.
//
// Registration caveat: TensorFlow turns the REGISTER_XLA_OP registrations into
// kernels for the XLA_*_JIT devices once per process, when its device context
// is first created. A library loaded after that (the usual case: the fused op
// is loaded lazily, on first use) would have no XLA kernels, so the loader
// calls KerasEcocEnsureXlaKernels() below right after tf.load_op_library; it
// registers the kernels itself when they are missing.
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/types/span.h"
#include "tensorflow/compiler/tf2xla/xla_op_kernel.h"
#include "tensorflow/compiler/tf2xla/xla_op_registry.h"
#include "tensorflow/core/framework/kernel_def.pb.h"
#include "tensorflow/core/framework/kernel_def_builder.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor_shape.h"
#include "xla/hlo/builder/lib/arithmetic.h"
#include "xla/hlo/builder/lib/constants.h"
#include "xla/hlo/builder/lib/loops.h"
#include "xla/hlo/builder/lib/slicing.h"
#include "xla/hlo/builder/xla_builder.h"
#include "xla/shape_util.h"
#include "xla/xla_data.pb.h"
#include "xla/ffi/api/c_api.h"

// Exported by libtensorflow_framework.so.2 (declared here: xla/ffi/ffi_api.h
// pulls in MLIR headers that TensorFlow's wheel does not ship).
namespace xla::ffi {
const XLA_FFI_Api* GetXlaFfiApi();
}  // namespace xla::ffi

namespace keras_ecoc {
namespace {

using ::tensorflow::DT_BFLOAT16;
using ::tensorflow::DT_FLOAT;
using ::tensorflow::DT_HALF;
using ::tensorflow::DT_INT32;
using ::tensorflow::DT_INT64;
using ::tensorflow::TensorShape;
using ::tensorflow::XlaOpKernel;
using ::tensorflow::XlaOpKernelContext;

// Largest number of logits materialised at once.
constexpr int64_t kTileElems = int64_t{1} << 22;

struct Plan {
  int64_t B, k, n, C, ntiles, npad;
};

Plan MakePlan(int64_t B, int64_t k, int64_t n) {
  Plan p{B, k, n, n, 1, n};
  if (B * n > kTileElems && n > 1024) {
    int64_t c = kTileElems / (B > 0 ? B : 1);
    c = c < 1024 ? 1024 : c / 128 * 128;
    if (c < n) {
      p.C = c;
      p.ntiles = (n + c - 1) / c;
      p.npad = p.ntiles * c;
    }
  }
  return p;
}

xla::XlaOp F32(xla::XlaBuilder* b, float v) {
  return xla::ConstantR0<float>(b, v);
}
xla::XlaOp I32(xla::XlaBuilder* b, int32_t v) {
  return xla::ConstantR0<int32_t>(b, v);
}

// Dot contracting lhs dim `cl` with rhs dim `cr`, in full float32 precision
// (no TF32 / bf16 passes on GPUs).
xla::XlaOp Dot(xla::XlaOp lhs, xla::XlaOp rhs, int64_t cl, int64_t cr) {
  xla::DotDimensionNumbers dn;
  dn.add_lhs_contracting_dimensions(cl);
  dn.add_rhs_contracting_dimensions(cr);
  xla::PrecisionConfig pc;
  pc.add_operand_precision(xla::PrecisionConfig::HIGHEST);
  pc.add_operand_precision(xla::PrecisionConfig::HIGHEST);
  return xla::DotGeneral(lhs, rhs, dn, &pc, xla::F32);
}

xla::XlaOp SumLast(xla::XlaBuilder* b, xla::XlaOp x, int64_t dim) {
  return xla::Reduce(x, F32(b, 0.0f), xla::CreateScalarAddComputation(xla::F32, b),
                     {dim});
}

xla::XlaOp MaxLast(xla::XlaBuilder* b, xla::XlaOp x, int64_t dim) {
  return xla::Reduce(x, F32(b, -std::numeric_limits<float>::infinity()),
                     xla::CreateScalarMaxComputation(xla::F32, b), {dim});
}

// u = z * rsqrt(max(||z||^2, eps)) and ||u||^2.
void Normalize(xla::XlaBuilder* b, xla::XlaOp z, float eps, xla::XlaOp* u,
               xla::XlaOp* usq) {
  xla::XlaOp ss = SumLast(b, z * z, 1);
  xla::XlaOp r = xla::Rsqrt(xla::Max(ss, F32(b, eps)));
  *u = xla::Mul(z, r, {0});
  *usq = SumLast(b, *u * *u, 1);
}

// Logits (or, with scale 1 and rowc 0, the scale-free keys) of one class tile:
// s * (u . M_c) - 0.5 s ||M_c||^2 + rowc_b.    [B, C]
xla::XlaOp TileLogits(xla::XlaBuilder* b, xla::XlaOp u, xla::XlaOp tile,
                      xla::XlaOp sqn_tile, xla::XlaOp s, xla::XlaOp rowc) {
  xla::XlaOp ct = xla::Mul(sqn_tile, xla::Mul(s, F32(b, -0.5f)));
  xla::XlaOp logits = xla::Mul(Dot(u, tile, 1, 1), s);
  logits = xla::Add(logits, ct, {1});
  return xla::Add(logits, rowc, {0});
}

// Class index of each entry of a [B, C] tile starting at class c0.
xla::XlaOp ClassIds(xla::XlaBuilder* b, const Plan& p, xla::XlaOp c0) {
  xla::XlaOp iota =
      xla::Iota(b, xla::ShapeUtil::MakeShape(xla::S32, {p.B, p.C}), 1);
  return xla::Add(iota, c0);
}

// codes [n, k] and sqn [n] padded to npad rows with zeros.
void PadClasses(xla::XlaBuilder* b, const Plan& p, xla::XlaOp* codes,
                xla::XlaOp* sqn) {
  if (p.npad == p.n) return;
  *codes = xla::PadInDim(*codes, F32(b, 0.0f), 0, 0, p.npad - p.n);
  *sqn = xla::PadInDim(*sqn, F32(b, 0.0f), 0, 0, p.npad - p.n);
}

// Runs body(tile, sqn_tile, c0, state, builder) -> new state over all class
// tiles; `invariants` are loop-invariant values passed through the loop.
// Inside `body`, invariants are available as the first entries of `vals`.
using TileBody = std::function<std::vector<xla::XlaOp>(
    xla::XlaBuilder*, absl::Span<const xla::XlaOp> inv, xla::XlaOp tile,
    xla::XlaOp sqn_tile, xla::XlaOp c0, absl::Span<const xla::XlaOp> state)>;

absl::StatusOr<std::vector<xla::XlaOp>> ForEachTile(
    xla::XlaBuilder* b, const Plan& p, xla::XlaOp codes_p, xla::XlaOp sqn_p,
    std::vector<xla::XlaOp> invariants, std::vector<xla::XlaOp> state,
    const TileBody& body, const char* name) {
  if (p.ntiles == 1) {
    return body(b, invariants, codes_p, sqn_p, I32(b, 0), state);
  }
  const size_t ninv = invariants.size() + 2;
  std::vector<xla::XlaOp> init = {codes_p, sqn_p};
  init.insert(init.end(), invariants.begin(), invariants.end());
  init.insert(init.end(), state.begin(), state.end());
  auto loop_body = [&](xla::XlaOp i, absl::Span<const xla::XlaOp> vals,
                       xla::XlaBuilder* bb)
      -> absl::StatusOr<std::vector<xla::XlaOp>> {
    xla::XlaOp c0 = xla::Mul(i, I32(bb, static_cast<int32_t>(p.C)));
    xla::XlaOp tile = xla::DynamicSlice(vals[0], {c0, I32(bb, 0)}, {p.C, p.k});
    xla::XlaOp sqn_tile = xla::DynamicSlice(vals[1], {c0}, {p.C});
    std::vector<xla::XlaOp> out(vals.begin(), vals.begin() + ninv);
    std::vector<xla::XlaOp> next =
        body(bb, vals.subspan(2, ninv - 2), tile, sqn_tile, c0,
             vals.subspan(ninv));
    out.insert(out.end(), next.begin(), next.end());
    return out;
  };
  TF_ASSIGN_OR_RETURN(std::vector<xla::XlaOp> res,
                      xla::ForEachIndex(p.ntiles, xla::S32, loop_body, init,
                                        name, b));
  return std::vector<xla::XlaOp>(res.begin() + ninv, res.end());
}

#define ECOC_XLA_CHECK(ctx, cond, status)        \
  do {                                           \
    if (!(cond)) {                               \
      (ctx)->CtxFailure(__FILE__, __LINE__, (status)); \
      return false;                              \
    }                                            \
  } while (0)

// Shared input validation (ranks, k and B agreement); mirrors the kernels.
bool CheckShapes(XlaOpKernelContext* ctx, bool has_labels, bool has_scale,
                 Plan* plan) {
  const TensorShape z = ctx->InputShape(0), codes = ctx->InputShape(1);
  ECOC_XLA_CHECK(ctx, z.dims() == 2,
                    absl::InvalidArgumentError(absl::StrCat(
                        "z must be a rank-2 tensor [batch, code_length], got shape ",
                        z.DebugString())));
  ECOC_XLA_CHECK(ctx, codes.dims() == 2,
                    absl::InvalidArgumentError(absl::StrCat(
                        "codes must be a rank-2 tensor [num_classes, "
                        "code_length], got shape ",
                        codes.DebugString())));
  ECOC_XLA_CHECK(ctx, z.dim_size(1) == codes.dim_size(1),
                    absl::InvalidArgumentError(absl::StrCat(
                        "z has code length (last dimension) ", z.dim_size(1),
                        " but codes has code length ", codes.dim_size(1),
                        "; they must be equal")));
  ECOC_XLA_CHECK(ctx, codes.dim_size(0) >= 1,
                    absl::InvalidArgumentError(
                        "codes must have at least one row (one class)"));
  ECOC_XLA_CHECK(ctx, codes.dim_size(0) < (int64_t{1} << 31),
                    absl::InvalidArgumentError("at most 2^31 - 1 classes"));
  if (has_labels) {
    const TensorShape labels = ctx->InputShape(2);
    ECOC_XLA_CHECK(ctx, labels.dims() == 1,
                      absl::InvalidArgumentError(absl::StrCat(
                          "labels must be a rank-1 tensor [batch], got shape ",
                          labels.DebugString())));
    ECOC_XLA_CHECK(ctx, labels.dim_size(0) == z.dim_size(0),
                      absl::InvalidArgumentError(absl::StrCat(
                          "z has batch size ", z.dim_size(0), " but labels has ",
                          labels.dim_size(0),
                          " elements; they must be equal")));
  }
  if (has_scale) {
    ECOC_XLA_CHECK(ctx, ctx->InputShape(3).dims() == 0,
                      absl::InvalidArgumentError(absl::StrCat(
                          "scale must be a scalar, got shape ",
                          ctx->InputShape(3).DebugString())));
  }
  *plan = MakePlan(z.dim_size(0), z.dim_size(1), codes.dim_size(0));
  // Class ids of the padded last tile are S32 (ClassIds): past 2^31 - 1 they
  // would wrap negative and count as real classes.
  ECOC_XLA_CHECK(ctx, plan->npad < (int64_t{1} << 31),
                    absl::InvalidArgumentError(absl::StrCat(
                        "codes has ", codes.dim_size(0), " rows; with the padding of "
                        "its last class tile (", plan->npad, " ids) the class ids "
                        "would pass 2^31 - 1: use fewer classes")));
  return true;
}

// [B] PRED: whether a key of the row among the real classes (not the padding
// of the last tile) is NaN or +-inf, i.e. the row's z or a codeword is not
// finite. Such rows never decode to a valid class.
xla::XlaOp RowNonFinite(xla::XlaBuilder* b, const Plan& plan, xla::XlaOp c0,
                        xla::XlaOp keys) {
  xla::XlaOp bad = xla::Not(xla::IsFinite(keys));
  if (plan.npad != plan.n) {
    bad = xla::And(bad, xla::Lt(ClassIds(b, plan, c0),
                                I32(b, static_cast<int32_t>(plan.n))));
  }
  return xla::Reduce(bad, xla::ConstantR0<bool>(b, false),
                     xla::CreateScalarOrComputation(xla::PRED, b), {1});
}


// --- Custom calls to the kernel library's FFI handlers ----------------------

// Which platforms have the four handlers registered (bit 0: Host, bit 1: CUDA).
std::atomic<int> g_ffi_platforms{0};

bool FfiRegistered(const tensorflow::DeviceType& device) {
  const int bits = g_ffi_platforms.load();
  if (device.type_string() == tensorflow::DEVICE_CPU_XLA_JIT) return bits & 1;
  if (device.type_string() == tensorflow::DEVICE_GPU_XLA_JIT) return bits & 2;
  return false;
}

// The typed-FFI attribute dictionary (an MLIR attribute, in backend_config).
std::string EpsilonAttr(float eps) {
  return absl::StrCat("{epsilon = ", absl::StrFormat("%.9e", eps), " : f32}");
}

xla::XlaOp FfiCall(xla::XlaBuilder* b, const char* target,
                   absl::Span<const xla::XlaOp> operands, const xla::Shape& shape,
                   float eps) {
  return xla::CustomCall(b, target, operands, shape, EpsilonAttr(eps),
                         /*has_side_effect=*/false, {}, nullptr,
                         xla::CustomCallSchedule::SCHEDULE_NONE,
                         xla::CustomCallApiVersion::API_VERSION_TYPED_FFI);
}

// The labels input (S32 or S64) as S32, with every label outside [0, n)
// replaced by -1. The range is tested in the input's own type: converting an
// int64 (or uint64) 2^32 + 1 to S32 first would make it class 1.
xla::XlaOp S32Labels(XlaOpKernelContext* ctx, int input, int64_t n, int64_t batch) {
  xla::XlaBuilder* b = ctx->builder();
  const xla::PrimitiveType type = ctx->input_xla_type(input);
  xla::XlaOp raw = ctx->Input(input);
  xla::XlaOp in_range = xla::And(xla::Ge(raw, xla::ConstantR0WithType(b, type, 0)),
                                 xla::Lt(raw, xla::ConstantR0WithType(b, type, n)));
  return xla::Select(in_range, xla::ConvertElementType(raw, xla::S32),
                     xla::Broadcast(I32(b, -1), {batch}));
}

// Labels as S32 with invalid ones replaced by 0, and their validity.
void SafeLabels(xla::XlaBuilder* b, xla::XlaOp labels, int64_t n,
                xla::XlaOp* safe, xla::XlaOp* valid) {
  *valid = xla::And(xla::Ge(labels, I32(b, 0)),
                    xla::Lt(labels, I32(b, static_cast<int32_t>(n))));
  *safe = xla::Select(*valid, labels, xla::ZerosLike(labels));
}

xla::Shape F32Shape(std::initializer_list<int64_t> dims) {
  return xla::ShapeUtil::MakeShape(xla::F32, dims);
}

class EcocCrossEntropyXla : public XlaOpKernel {
 public:
  explicit EcocCrossEntropyXla(tensorflow::OpKernelConstruction* ctx)
      : XlaOpKernel(ctx), device_(ctx->device_type()) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("epsilon", &epsilon_));
  }

  void Compile(XlaOpKernelContext* ctx) override {
    Plan p;
    if (!CheckShapes(ctx, true, true, &p)) return;
    xla::XlaBuilder* b = ctx->builder();
    xla::XlaOp z = xla::ConvertElementType(ctx->Input(0), xla::F32);
    xla::XlaOp codes = ctx->Input(1);
    xla::XlaOp labels = S32Labels(ctx, 2, p.n, p.B);
    xla::XlaOp s = ctx->Input(3);
    if (FfiRegistered(device_)) {
      xla::XlaOp safe, valid;
      SafeLabels(b, labels, p.n, &safe, &valid);
      xla::XlaOp out = FfiCall(
          b, "keras_ecoc_forward", {z, codes, safe, s},
          xla::ShapeUtil::MakeTupleShape({F32Shape({p.B}), F32Shape({p.B}),
                                          F32Shape({p.B, p.k}), F32Shape({p.B})}),
          epsilon_);
      ctx->SetOutput(0, xla::Select(valid, xla::GetTupleElement(out, 0),
                                    xla::Broadcast(F32(b, std::numeric_limits<float>::quiet_NaN()),
                                                   {p.B})));
      for (int i = 1; i < 4; ++i) ctx->SetOutput(i, xla::GetTupleElement(out, i));
      return;
    }
    xla::XlaOp u, usq;
    Normalize(b, z, epsilon_, &u, &usq);
    xla::XlaOp rowc = xla::Mul(usq, xla::Mul(s, F32(b, -0.5f)));
    xla::XlaOp sqn = SumLast(b, codes * codes, 1);
    PadClasses(b, p, &codes, &sqn);
    const float inf = std::numeric_limits<float>::infinity();
    std::vector<xla::XlaOp> state = {
        xla::Broadcast(F32(b, -inf), {p.B}), xla::Broadcast(F32(b, 0.0f), {p.B}),
        xla::Broadcast(F32(b, 0.0f), {p.B, p.k}),
        xla::Broadcast(F32(b, 0.0f), {p.B}), xla::Broadcast(F32(b, 0.0f), {p.B})};
    const Plan plan = p;
    TileBody body = [plan](xla::XlaBuilder* bb, absl::Span<const xla::XlaOp> inv,
                           xla::XlaOp tile, xla::XlaOp sqn_tile, xla::XlaOp c0,
                           absl::Span<const xla::XlaOp> st) {
      xla::XlaOp u = inv[0], labels = inv[1], s = inv[2], rowc = inv[3];
      xla::XlaOp logits = TileLogits(bb, u, tile, sqn_tile, s, rowc);
      xla::XlaOp cls = ClassIds(bb, plan, c0);
      if (plan.npad != plan.n) {
        logits = xla::Select(xla::Lt(cls, I32(bb, static_cast<int32_t>(plan.n))),
                             logits,
                             xla::Broadcast(F32(bb, -std::numeric_limits<float>::infinity()),
                                            {plan.B, plan.C}));
      }
      xla::XlaOp onehot = xla::Eq(cls, labels, {0});
      xla::XlaOp ly = st[4] + SumLast(bb, xla::Select(onehot, logits,
                                                      xla::ZerosLike(logits)), 1);
      xla::XlaOp m_new = xla::Max(st[0], MaxLast(bb, logits, 1));
      xla::XlaOp alpha = xla::Exp(st[0] - m_new);
      xla::XlaOp prob = xla::Exp(xla::Sub(logits, m_new, {0}));
      xla::XlaOp l = st[1] * alpha + SumLast(bb, prob, 1);
      xla::XlaOp acc = xla::Mul(st[2], alpha, {0}) + Dot(prob, tile, 1, 0);
      xla::XlaOp sq = st[3] * alpha + Dot(prob, sqn_tile, 1, 0);
      return std::vector<xla::XlaOp>{m_new, l, acc, sq, ly};
    };
    auto res = ForEachTile(b, p, codes, sqn, {u, labels, s, rowc}, state, body,
                           "ecoc_cross_entropy_tiles");
    OP_REQUIRES_OK(ctx, res.status());
    const std::vector<xla::XlaOp>& r = *res;
    xla::XlaOp lse = r[0] + xla::Log(r[1]);
    xla::XlaOp valid = xla::And(xla::Ge(labels, I32(b, 0)),
                                xla::Lt(labels, I32(b, static_cast<int32_t>(p.n))));
    xla::XlaOp loss = xla::Select(valid, lse - r[4],
                                  xla::Broadcast(F32(b, std::numeric_limits<float>::quiet_NaN()),
                                                 {p.B}));
    ctx->SetOutput(0, loss);
    ctx->SetOutput(1, lse);
    ctx->SetOutput(2, xla::Div(r[2], r[1], {0}));
    ctx->SetOutput(3, r[3] / r[1]);
  }

 private:
  float epsilon_;
  tensorflow::DeviceType device_;
};

class EcocCrossEntropyCodesGradXla : public XlaOpKernel {
 public:
  explicit EcocCrossEntropyCodesGradXla(tensorflow::OpKernelConstruction* ctx)
      : XlaOpKernel(ctx), device_(ctx->device_type()) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("epsilon", &epsilon_));
  }

  void Compile(XlaOpKernelContext* ctx) override {
    Plan p;
    if (!CheckShapes(ctx, true, true, &p)) return;
    xla::XlaBuilder* b = ctx->builder();
    xla::XlaOp z = xla::ConvertElementType(ctx->Input(0), xla::F32);
    xla::XlaOp codes = ctx->Input(1);
    xla::XlaOp labels = S32Labels(ctx, 2, p.n, p.B);
    xla::XlaOp s = ctx->Input(3);
    xla::XlaOp lse = ctx->Input(4);
    xla::XlaOp g = ctx->Input(5);
    // A row whose label is outside [0, n) has a NaN loss and must contribute
    // no gradient (as on the pure-Keras path), whatever g says.
    xla::XlaOp label_ok = xla::And(
        xla::Ge(labels, I32(b, 0)),
        xla::Lt(labels, I32(b, static_cast<int32_t>(p.n))));
    g = xla::Select(label_ok, g, xla::ZerosLike(g));
    if (FfiRegistered(device_)) {
      xla::XlaOp safe, valid;
      SafeLabels(b, labels, p.n, &safe, &valid);
      ctx->SetOutput(0, FfiCall(b, "keras_ecoc_codes_grad", {z, codes, safe, s, lse, g},
                                F32Shape({p.n, p.k}), epsilon_));
      return;
    }
    xla::XlaOp u, usq;
    Normalize(b, z, epsilon_, &u, &usq);
    xla::XlaOp rowc = xla::Mul(usq, xla::Mul(s, F32(b, -0.5f)));
    xla::XlaOp sqn = SumLast(b, codes * codes, 1);
    PadClasses(b, p, &codes, &sqn);
    const Plan plan = p;
    TileBody body = [plan](xla::XlaBuilder* bb, absl::Span<const xla::XlaOp> inv,
                           xla::XlaOp tile, xla::XlaOp sqn_tile, xla::XlaOp c0,
                           absl::Span<const xla::XlaOp> st) {
      xla::XlaOp u = inv[0], labels = inv[1], s = inv[2], rowc = inv[3],
                 lse = inv[4], g = inv[5];
      xla::XlaOp logits = TileLogits(bb, u, tile, sqn_tile, s, rowc);
      xla::XlaOp prob = xla::Exp(xla::Sub(logits, lse, {0}));
      xla::XlaOp onehot = xla::ConvertElementType(
          xla::Eq(ClassIds(bb, plan, c0), labels, {0}), xla::F32);
      xla::XlaOp w = xla::Mul(prob - onehot, g, {0});  // [B, C]
      xla::XlaOp gt = xla::Mul(
          Dot(w, u, 0, 0) - xla::Mul(tile, SumLast(bb, w, 0), {0}), s);
      if (plan.ntiles == 1) return std::vector<xla::XlaOp>{gt};
      return std::vector<xla::XlaOp>{
          xla::DynamicUpdateSlice(st[0], gt, {c0, I32(bb, 0)})};
    };
    std::vector<xla::XlaOp> state = {
        xla::Broadcast(F32(b, 0.0f), {p.npad, p.k})};
    auto res = ForEachTile(b, p, codes, sqn, {u, labels, s, rowc, lse, g}, state,
                           body, "ecoc_codes_grad_tiles");
    OP_REQUIRES_OK(ctx, res.status());
    xla::XlaOp grad = (*res)[0];
    if (p.npad != p.n) grad = xla::SliceInDim(grad, 0, p.n, 1, 0);
    ctx->SetOutput(0, grad);
  }

 private:
  float epsilon_;
  tensorflow::DeviceType device_;
};

class EcocLabelRankXla : public XlaOpKernel {
 public:
  explicit EcocLabelRankXla(tensorflow::OpKernelConstruction* ctx)
      : XlaOpKernel(ctx), device_(ctx->device_type()) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("epsilon", &epsilon_));
  }

  void Compile(XlaOpKernelContext* ctx) override {
    Plan p;
    if (!CheckShapes(ctx, true, false, &p)) return;
    xla::XlaBuilder* b = ctx->builder();
    xla::XlaOp z = xla::ConvertElementType(ctx->Input(0), xla::F32);
    xla::XlaOp codes = ctx->Input(1);
    xla::XlaOp labels = S32Labels(ctx, 2, p.n, p.B);
    const int32_t n32 = static_cast<int32_t>(p.n);
    if (FfiRegistered(device_)) {
      xla::XlaOp safe, valid;
      SafeLabels(b, labels, p.n, &safe, &valid);
      xla::XlaOp rank = FfiCall(b, "keras_ecoc_label_rank", {z, codes, safe},
                                xla::ShapeUtil::MakeShape(xla::S32, {p.B}), epsilon_);
      ctx->SetOutput(0, xla::Select(valid, rank, xla::Broadcast(I32(b, n32), {p.B})));
      return;
    }
    xla::XlaOp u, usq;
    Normalize(b, z, epsilon_, &u, &usq);
    xla::XlaOp sqn = SumLast(b, codes * codes, 1);
    xla::XlaOp valid =
        xla::And(xla::Ge(labels, I32(b, 0)), xla::Lt(labels, I32(b, n32)));
    xla::XlaOp safe = xla::Select(valid, labels, xla::ZerosLike(labels));
    // The label's key; the label itself is excluded from the count below,
    // so rounding differences between the two computations do not matter.
    xla::XlaOp my = xla::TorchIndexSelect(codes, safe, 0);
    xla::XlaOp ky = SumLast(b, u * my, 1) -
                    xla::TorchIndexSelect(sqn, safe, 0) * F32(b, 0.5f);
    PadClasses(b, p, &codes, &sqn);
    const Plan plan = p;
    TileBody body = [plan](xla::XlaBuilder* bb, absl::Span<const xla::XlaOp> inv,
                           xla::XlaOp tile, xla::XlaOp sqn_tile, xla::XlaOp c0,
                           absl::Span<const xla::XlaOp> st) {
      xla::XlaOp u = inv[0], labels = inv[1], ky = inv[2];
      xla::XlaOp keys =
          TileLogits(bb, u, tile, sqn_tile, F32(bb, 1.0f),
                     xla::Broadcast(F32(bb, 0.0f), {plan.B}));
      xla::XlaOp cls = ClassIds(bb, plan, c0);
      xla::XlaOp counted = xla::And(
          xla::Gt(keys, ky, {0}),
          xla::And(xla::Ne(cls, labels, {0}),
                   xla::Lt(cls, I32(bb, static_cast<int32_t>(plan.n)))));
      xla::XlaOp ones = xla::ConvertElementType(counted, xla::S32);
      xla::XlaOp cnt = st[0] + xla::Reduce(ones, I32(bb, 0),
                                           xla::CreateScalarAddComputation(xla::S32, bb),
                                           {1});
      return std::vector<xla::XlaOp>{cnt, xla::Or(st[1], RowNonFinite(bb, plan, c0, keys))};
    };
    auto res = ForEachTile(b, p, codes, sqn, {u, labels, ky},
                           {xla::Broadcast(I32(b, 0), {p.B}),
                            xla::Broadcast(xla::ConstantR0<bool>(b, false), {p.B})},
                           body, "ecoc_label_rank_tiles");
    OP_REQUIRES_OK(ctx, res.status());
    // Non-finite z or codeword: never a hit (rank n).
    xla::XlaOp bad = xla::Or(xla::Or(xla::Not(valid), xla::Ne(ky, ky)), (*res)[1]);
    ctx->SetOutput(0, xla::Select(bad, xla::Broadcast(I32(b, n32), {p.B}),
                                  (*res)[0]));
  }

 private:
  float epsilon_;
  tensorflow::DeviceType device_;
};

class EcocNearestCodewordXla : public XlaOpKernel {
 public:
  explicit EcocNearestCodewordXla(tensorflow::OpKernelConstruction* ctx)
      : XlaOpKernel(ctx), device_(ctx->device_type()) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("epsilon", &epsilon_));
  }

  void Compile(XlaOpKernelContext* ctx) override {
    Plan p;
    if (!CheckShapes(ctx, false, false, &p)) return;
    xla::XlaBuilder* b = ctx->builder();
    xla::XlaOp z = xla::ConvertElementType(ctx->Input(0), xla::F32);
    xla::XlaOp codes = ctx->Input(1);
    if (FfiRegistered(device_)) {
      // [B, 2] int32: the int64 index as (low, high) words (see the handler).
      xla::XlaOp words = FfiCall(b, "keras_ecoc_nearest", {z, codes},
                                 xla::ShapeUtil::MakeShape(xla::S32, {p.B, 2}), epsilon_);
      xla::XlaOp low = xla::Reshape(xla::SliceInDim(words, 0, 1, 1, 1), {p.B});
      ctx->SetOutput(0, xla::ConvertElementType(low, xla::S64));
      return;
    }
    xla::XlaOp u, usq;
    Normalize(b, z, epsilon_, &u, &usq);
    xla::XlaOp sqn = SumLast(b, codes * codes, 1);
    PadClasses(b, p, &codes, &sqn);
    const Plan plan = p;
    const float inf = std::numeric_limits<float>::infinity();
    TileBody body = [plan](xla::XlaBuilder* bb, absl::Span<const xla::XlaOp> inv,
                           xla::XlaOp tile, xla::XlaOp sqn_tile, xla::XlaOp c0,
                           absl::Span<const xla::XlaOp> st) {
      xla::XlaOp u = inv[0];
      xla::XlaOp keys =
          TileLogits(bb, u, tile, sqn_tile, F32(bb, 1.0f),
                     xla::Broadcast(F32(bb, 0.0f), {plan.B}));
      xla::XlaOp nonfinite = xla::Or(st[2], RowNonFinite(bb, plan, c0, keys));
      if (plan.npad != plan.n) {
        keys = xla::Select(
            xla::Lt(ClassIds(bb, plan, c0), I32(bb, static_cast<int32_t>(plan.n))),
            keys,
            xla::Broadcast(F32(bb, -std::numeric_limits<float>::infinity()),
                           {plan.B, plan.C}));
      }
      xla::XlaOp tmax = MaxLast(bb, keys, 1);
      xla::XlaOp targ = xla::Add(xla::ArgMax(keys, xla::S32, 1), c0);
      xla::XlaOp better = xla::Gt(tmax, st[0]);
      return std::vector<xla::XlaOp>{xla::Select(better, tmax, st[0]),
                                     xla::Select(better, targ, st[1]), nonfinite};
    };
    auto res = ForEachTile(
        b, p, codes, sqn, {u},
        {xla::Broadcast(F32(b, -inf), {p.B}), xla::Broadcast(I32(b, 0), {p.B}),
         xla::Broadcast(xla::ConstantR0<bool>(b, false), {p.B})},
        body, "ecoc_nearest_codeword_tiles");
    OP_REQUIRES_OK(ctx, res.status());
    // Non-finite z or codeword: no valid class (-1).
    xla::XlaOp index = xla::Select((*res)[2], xla::Broadcast(I32(b, -1), {p.B}),
                                   (*res)[1]);
    ctx->SetOutput(0, xla::ConvertElementType(index, xla::S64));
  }

 private:
  float epsilon_;
  tensorflow::DeviceType device_;
};

REGISTER_XLA_OP(Name("EcocCrossEntropy")
                    .TypeConstraint("T", {DT_FLOAT, DT_HALF, DT_BFLOAT16})
                    .TypeConstraint("Tlabels", {DT_INT32, DT_INT64}),
                EcocCrossEntropyXla);
REGISTER_XLA_OP(Name("EcocCrossEntropyCodesGrad")
                    .TypeConstraint("T", {DT_FLOAT, DT_HALF, DT_BFLOAT16})
                    .TypeConstraint("Tlabels", {DT_INT32, DT_INT64}),
                EcocCrossEntropyCodesGradXla);
REGISTER_XLA_OP(Name("EcocLabelRank")
                    .TypeConstraint("T", {DT_FLOAT, DT_HALF, DT_BFLOAT16})
                    .TypeConstraint("Tlabels", {DT_INT32, DT_INT64}),
                EcocLabelRankXla);
REGISTER_XLA_OP(Name("EcocNearestCodeword")
                    .TypeConstraint("T", {DT_FLOAT, DT_HALF, DT_BFLOAT16}),
                EcocNearestCodewordXla);

template <class K>
tensorflow::OpKernel* MakeKernel(tensorflow::OpKernelConstruction* ctx) {
  return new K(ctx);
}

int EnsureXlaKernels() {
  struct Spec {
    const char* op;
    bool has_labels;
    tensorflow::OpKernel* (*factory)(tensorflow::OpKernelConstruction*);
  };
  const Spec specs[] = {
      {"EcocCrossEntropy", true, MakeKernel<EcocCrossEntropyXla>},
      {"EcocCrossEntropyCodesGrad", true, MakeKernel<EcocCrossEntropyCodesGradXla>},
      {"EcocLabelRank", true, MakeKernel<EcocLabelRankXla>},
      {"EcocNearestCodeword", false, MakeKernel<EcocNearestCodewordXla>},
  };
  int added = 0;
  for (const char* device :
       {tensorflow::DEVICE_CPU_XLA_JIT, tensorflow::DEVICE_GPU_XLA_JIT}) {
    if (!tensorflow::XlaOpRegistry::IsBackendRegistered(device)) continue;
    // DeviceKernels() first makes TensorFlow register the JIT kernels of all
    // XLA ops it knows, if it has not done so yet (then ours are included).
    bool present = false;
    for (const tensorflow::KernelDef* kd :
         tensorflow::XlaOpRegistry::DeviceKernels(device, true)) {
      if (kd->op() == "EcocCrossEntropy") {
        present = true;
        break;
      }
    }
    if (present) continue;
    for (const Spec& spec : specs) {
      tensorflow::KernelDefBuilder builder(spec.op);
      builder.Device(device).TypeConstraint("T", {DT_FLOAT, DT_HALF, DT_BFLOAT16});
      if (spec.has_labels) builder.TypeConstraint("Tlabels", {DT_INT32, DT_INT64});
      // Registrars live for the whole process, like static registrations.
      new tensorflow::kernel_factory::OpKernelRegistrar(builder.Build(),
                                                        "XlaJitOp", spec.factory);
      ++added;
    }
  }
  return added;
}

}  // namespace
}  // namespace keras_ecoc

// Registers the kernel library's four XLA FFI handlers (their addresses, e.g.
// from ctypes: KerasEcocFfiForward, ...CodesGrad, ...LabelRank, ...Nearest)
// with TensorFlow's XLA for `platform` ("Host" or "CUDA"), under the targets
// keras_ecoc_forward, _codes_grad, _label_rank and _nearest. From then on the
// XLA kernels compiled for that platform emit custom calls. Returns 0, or -1
// when XLA refused a registration (the message goes to `error`, of
// `error_len` bytes); the HLO lowering is then kept for that platform.
extern "C" __attribute__((visibility("default"))) int KerasEcocRegisterFfiTargets(
    const char* platform, void* forward, void* codes_grad, void* label_rank,
    void* nearest, char* error, int error_len) {
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  const bool cuda = std::strcmp(platform, "CUDA") == 0;
  const int bit = cuda ? 2 : 1;
  if (keras_ecoc::g_ffi_platforms.load() & bit) return 0;
  const XLA_FFI_Api* api = xla::ffi::GetXlaFfiApi();
  const std::pair<const char*, void*> targets[] = {
      {"keras_ecoc_forward", forward},
      {"keras_ecoc_codes_grad", codes_grad},
      {"keras_ecoc_label_rank", label_rank},
      {"keras_ecoc_nearest", nearest}};
  for (const auto& [name, fn] : targets) {
    XLA_FFI_Handler_Register_Args args;
    std::memset(&args, 0, sizeof(args));
    args.struct_size = XLA_FFI_Handler_Register_Args_STRUCT_SIZE;
    args.name = XLA_FFI_ByteSpan{name, std::strlen(name)};
    args.platform = XLA_FFI_ByteSpan{platform, std::strlen(platform)};
    args.bundle.execute = reinterpret_cast<XLA_FFI_Handler*>(fn);
    args.traits = 0;
    if (XLA_FFI_Error* err = api->XLA_FFI_Handler_Register(&args)) {
      XLA_FFI_Error_GetMessage_Args m;
      std::memset(&m, 0, sizeof(m));
      m.struct_size = XLA_FFI_Error_GetMessage_Args_STRUCT_SIZE;
      m.error = err;
      api->XLA_FFI_Error_GetMessage(&m);
      if (error != nullptr && error_len > 0) {
        std::snprintf(error, error_len, "%s: %s", name, m.message ? m.message : "?");
      }
      XLA_FFI_Error_Destroy_Args d;
      std::memset(&d, 0, sizeof(d));
      d.struct_size = XLA_FFI_Error_Destroy_Args_STRUCT_SIZE;
      d.error = err;
      api->XLA_FFI_Error_Destroy(&d);
      return -1;
    }
  }
  keras_ecoc::g_ffi_platforms.fetch_or(bit);
  return 0;
}

// 1 (Host), 2 (CUDA), 3 (both), 0: where the custom calls are emitted.
extern "C" __attribute__((visibility("default"))) int KerasEcocFfiPlatforms() {
  return keras_ecoc::g_ffi_platforms.load();
}

// Makes sure the XLA kernels of the four ops are registered for the XLA JIT
// devices (see the registration caveat at the top). Idempotent; returns the
// number of kernels it had to register itself.
extern "C" __attribute__((visibility("default"))) int KerasEcocEnsureXlaKernels() {
  static std::mutex mu;
  static int result = -1;
  std::lock_guard<std::mutex> lock(mu);
  if (result < 0) result = keras_ecoc::EnsureXlaKernels();
  return result;
}
