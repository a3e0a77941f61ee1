// Layout choice (ConvLayout::kAuto), measured on 2 cores of the Xeon this was written on (AMX-BF16): time
// per call including the reorders from and to NCHW, plain NCHW (oneDNN's gemm:jit) / blocked (jit,
// brgconv), min over repetitions; forward with bias (no ReLU), backward-weights with db (f32 dw):
//
//   shape (N, C, H -> OC, k3)        dtype   forward        backward-data   backward-weights
//   8, 64, 56 -> 64, pad 1           f32     9.5 / 5.0 ms   25 / 6.3 ms     12.9 / 5.5 ms
//                                    bf16    6.5 / 1.7      11 / 1.1        9.1 / 1.4
//   32, 3, 32 -> 32, valid (A)       f32     0.39 / 0.27    0.41 / 1.16     1.16 / 0.32
//                                    bf16    0.45 / 0.27    0.47 / 0.28     1.48 / 0.38
//   128, 1, 28 -> 32, pad 1 (B1)     f32     0.74 / 0.77    0.67 / 3.59     2.45 / 0.72
//                                    bf16    0.86 / 1.01    0.85 / 0.94     4.03 / 1.08
//   128, 32, 14 -> 64, pad 1 (B2)    f32     4.9 / 2.9      6.7 / 3.7       5.4 / 3.0
//                                    bf16    3.6 / 0.62     5.6 / 0.95      4.7 / 1.1
//   32, 32, 28 depthwise, pad 1      f32     15x slower     22x slower      30x slower
//
// Blocked wins except backward-data in f32 with few input channels (oneDNN's blocked f32 kernels pad
// them to 16), which runs plain. Forward is always blocked: where plain ties (B1), the gemm path applies
// a fused ReLU in a slow separate pass (B1 f32 under load: plain 1.2 ms bare, 5.5 ms with bias + ReLU;
// blocked 1.5 ms either way). The machine is shared and noisy; a later run under heavy load gave 2-10x
// longer times but the same winners, and the depthwise row comes from it.
#include "demi/kernels/onednn/conv.h"

#include <algorithm>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>

#include "demi/core/error.h"
#include "demi/kernels/cpu/pool.h"
#include "demi/kernels/onednn/internal/onednn_util.h"
#include "demi/kernels/onednn/primitive_cache.h"
#include "demi/kernels/reference/conv.h"

namespace demi::kernels::onednn {
namespace {

using dnnl::memory;
using internal::CallContext;
using internal::InputPlan;
using internal::OutputPlan;
using Tag = memory::format_tag;

struct ConvEntry {
  dnnl::primitive prim;
  InputPlan in0, in1;  // forward: x, w; backward-data: dy, w; backward-weights: x, dy
  OutputPlan out;      // forward: y; backward-data: dx; backward-weights: dw
  OutputPlan db;       // backward-weights with a bias
  memory::desc bias_md;
  size_t scratch_bytes = 0;
  std::string impl;
};

bool use_blocked(const Conv2dParams& p, ConvDirection dir) {
  switch (p.layout) {
    case ConvLayout::kPlain: return false;
    case ConvLayout::kBlocked: return true;
    case ConvLayout::kAuto: break;
  }
  const bool f32 = internal::compute_dtype(p.y_dtype, p.w_dtype) == DType::kF32;
  return !(dir == ConvDirection::kBackwardData && f32 && p.groups == 1 && p.c < 16);
}

struct Geometry {
  memory::dims x, w, y, strides, dilates, pad_l, pad_r;
  Tag w_tag;
};

Geometry geometry(const Conv2dParams& p) {
  Geometry g;
  g.x = {p.n, p.c, p.h, p.w};
  g.y = {p.n, p.oc, p.out_h(), p.out_w()};
  if (p.groups == 1) {
    g.w = {p.oc, p.c, p.kh, p.kw};
    g.w_tag = Tag::oihw;
  } else {
    g.w = {p.groups, p.oc / p.groups, p.c / p.groups, p.kh, p.kw};
    g.w_tag = Tag::goihw;
  }
  g.strides = {p.stride_h, p.stride_w};
  g.dilates = {p.dilation_h - 1, p.dilation_w - 1};  // oneDNN counts the gaps between taps
  g.pad_l = {p.pad_top, p.pad_left};
  g.pad_r = {p.pad_bottom, p.pad_right};
  return g;
}

memory::desc md(const memory::dims& dims, DType t, Tag tag) {
  return memory::desc(dims, internal::to_dnnl(t), tag);
}

dnnl::convolution_forward::primitive_desc forward_pd(const Geometry& g, const memory::desc& src,
                                                     const memory::desc& wei, const memory::desc& bias,
                                                     const memory::desc& dst,
                                                     const dnnl::primitive_attr& attr) {
  dnnl::convolution_forward::desc d(dnnl::prop_kind::forward_training, dnnl::algorithm::convolution_direct,
                                    src, wei, bias, dst, g.strides, g.dilates, g.pad_l, g.pad_r);
  return dnnl::convolution_forward::primitive_desc(d, attr, internal::cpu_engine());
}

size_t max_scratch(size_t prim, std::initializer_list<size_t> others) {
  for (size_t s : others) prim = std::max(prim, s);
  return prim;
}

// Builds the entry with the primitive writing `out_dtype` (f32, or bf16 from bf16 compute).
ConvEntry make_entry(const Conv2dParams& p, ConvDirection dir, bool with_bias, DType out_dtype) {
  const Geometry g = geometry(p);
  const bool blocked = use_blocked(p, dir);
  const Tag act = blocked ? Tag::any : Tag::nchw;
  const Tag wt = blocked ? Tag::any : g.w_tag;
  const memory::desc x_plain = md(g.x, DType::kF32, Tag::nchw), y_plain = md(g.y, DType::kF32, Tag::nchw);
  const memory::desc w_plain = md(g.w, DType::kF32, g.w_tag);
  const memory::desc bias_plain = md({p.oc}, DType::kF32, Tag::a);
  dnnl::primitive_attr attr = internal::user_scratchpad_attr();
  ConvEntry e;
  if (dir == ConvDirection::kForward) {
    const DType ct = internal::compute_dtype(p.x_dtype, p.w_dtype);
    if (p.relu) {
      dnnl::post_ops ops;
      ops.append_eltwise(1.0f, dnnl::algorithm::eltwise_relu, 0.0f, 0.0f);
      attr.set_post_ops(ops);
    }
    e.bias_md = with_bias ? bias_plain : memory::desc();
    auto pd = forward_pd(g, md(g.x, ct, act), md(g.w, ct, wt), e.bias_md, md(g.y, out_dtype, act), attr);
    e.in0 = internal::plan_input(x_plain, p.x_dtype, pd.src_desc());
    e.in1 = internal::plan_input(w_plain, p.w_dtype, pd.weights_desc());
    e.out = internal::plan_output(y_plain, p.y_dtype, pd.dst_desc(), false);
    e.scratch_bytes = pd.scratchpad_desc().get_size();
    e.impl = pd.impl_info_str();
    e.prim = dnnl::convolution_forward(pd);
  } else if (dir == ConvDirection::kBackwardData) {
    const DType ct = internal::compute_dtype(p.y_dtype, p.w_dtype);
    const memory::desc dx = md(g.x, out_dtype, act), w = md(g.w, ct, wt), dy = md(g.y, ct, act);
    auto hint = forward_pd(g, md(g.x, ct, act), w, memory::desc(), dy, internal::user_scratchpad_attr());
    dnnl::convolution_backward_data::desc d(dnnl::algorithm::convolution_direct, dx, w, dy, g.strides,
                                            g.dilates, g.pad_l, g.pad_r);
    dnnl::convolution_backward_data::primitive_desc pd(d, attr, internal::cpu_engine(), hint);
    e.in0 = internal::plan_input(y_plain, p.y_dtype, pd.diff_dst_desc());
    e.in1 = internal::plan_input(w_plain, p.w_dtype, pd.weights_desc());
    e.out = internal::plan_output(x_plain, p.x_dtype, pd.diff_src_desc(), p.accumulate);
    e.scratch_bytes = pd.scratchpad_desc().get_size();
    e.impl = pd.impl_info_str();
    e.prim = dnnl::convolution_backward_data(pd);
  } else {
    const DType ct = internal::compute_dtype(p.x_dtype, p.y_dtype);
    const memory::desc x = md(g.x, ct, act), dw = md(g.w, out_dtype, wt), dy = md(g.y, ct, act);
    const memory::desc db = with_bias ? bias_plain : memory::desc();
    auto hint = forward_pd(g, x, md(g.w, ct, wt), db, dy, internal::user_scratchpad_attr());
    dnnl::convolution_backward_weights::desc d(dnnl::algorithm::convolution_direct, x, dw, db, dy, g.strides,
                                               g.dilates, g.pad_l, g.pad_r);
    dnnl::convolution_backward_weights::primitive_desc pd(d, attr, internal::cpu_engine(), hint);
    e.in0 = internal::plan_input(x_plain, p.x_dtype, pd.src_desc());
    e.in1 = internal::plan_input(y_plain, p.y_dtype, pd.diff_dst_desc());
    e.out = internal::plan_output(w_plain, p.w_dtype, pd.diff_weights_desc(), p.accumulate);
    if (with_bias) e.db = internal::plan_output(bias_plain, p.bias_dtype, pd.diff_bias_desc(), p.accumulate);
    e.scratch_bytes = pd.scratchpad_desc().get_size();
    e.impl = pd.impl_info_str();
    e.prim = dnnl::convolution_backward_weights(pd);
  }
  e.scratch_bytes = max_scratch(
      e.scratch_bytes, {e.in0.scratch_bytes, e.in1.scratch_bytes, e.out.scratch_bytes, e.db.scratch_bytes});
  return e;
}

std::shared_ptr<const ConvEntry> entry_for(const Conv2dParams& p, ConvDirection dir, bool with_bias) {
  static auto& cache = *new internal::PrimitiveCache<28, ConvEntry>;  // never destroyed, as the engine
  const bool fwd = dir == ConvDirection::kForward;
  internal::PrimitiveKey<28> key{{static_cast<int64_t>(dir),
                                  p.n,
                                  p.c,
                                  p.h,
                                  p.w,
                                  p.oc,
                                  p.kh,
                                  p.kw,
                                  p.stride_h,
                                  p.stride_w,
                                  p.pad_top,
                                  p.pad_bottom,
                                  p.pad_left,
                                  p.pad_right,
                                  p.dilation_h,
                                  p.dilation_w,
                                  p.groups,
                                  static_cast<int64_t>(p.x_dtype),
                                  static_cast<int64_t>(p.w_dtype),
                                  static_cast<int64_t>(p.y_dtype),
                                  with_bias,
                                  with_bias && !fwd ? static_cast<int64_t>(p.bias_dtype) : -1,
                                  fwd && p.relu,
                                  !fwd && p.accumulate,
                                  use_blocked(p, dir)}};
  return cache.get(key, [&] {
    DType in_a = dir == ConvDirection::kBackwardData ? p.y_dtype : p.x_dtype;
    DType in_b = dir == ConvDirection::kForward        ? p.w_dtype
                 : dir == ConvDirection::kBackwardData ? p.w_dtype
                                                       : p.y_dtype;
    DType want = dir == ConvDirection::kForward        ? p.y_dtype
                 : dir == ConvDirection::kBackwardData ? p.x_dtype
                                                       : p.w_dtype;
    // Accumulating writes f32 and lets the reorder add and round once (a bf16 intermediate would round
    // twice, which cancellation between old and new values makes visible).
    DType out = !fwd && p.accumulate
                    ? DType::kF32
                    : internal::primitive_out_dtype(internal::compute_dtype(in_a, in_b), want);
    try {
      return make_entry(p, dir, with_bias, out);
    } catch (const dnnl::error&) {
      if (out == DType::kF32) throw;
      return make_entry(p, dir, with_bias, DType::kF32);  // no direct bf16 output here: write f32, convert
    }
  });
}

const char* op_name(ConvDirection dir) {
  switch (dir) {
    case ConvDirection::kForward: return "conv2d forward";
    case ConvDirection::kBackwardData: return "conv2d backward-data";
    case ConvDirection::kBackwardWeights: return "conv2d backward-weights";
  }
  return "conv2d";
}

[[noreturn]] void rethrow_dnnl(const dnnl::error& e, const Conv2dParams& p, ConvDirection dir) {
  DEMI_ASSERT(false, "oneDNN failed in ", op_name(dir), " ", describe(p), ": ", e.what());
  throw;  // unreachable: DEMI_ASSERT(false) throws
}

// Each direction's execution, shared by the plain calls and the fused Conv2d -> ReLU -> MaxPool2d: the
// caller brings the operand a call prepares differently (y's or dy's buffer, in the primitive's layout);
// the rest goes through the entry's plans.

// x, w (and bias) through their plans; the output into `dst`, laid out as e.out.prim_md.
void run_forward(CallContext& ctx, const ConvEntry& e, const Conv2dParams& p, const void* x, const void* w,
                 const void* bias, void* dst) {
  const void* xs = ctx.input(e.in0, x, p.x_numel());
  const void* ws = ctx.input(e.in1, w, p.w_numel());
  std::unordered_map<int, memory> args{{DNNL_ARG_SRC, internal::make_memory(e.in0.prim_md, xs)},
                                       {DNNL_ARG_WEIGHTS, internal::make_memory(e.in1.prim_md, ws)},
                                       {DNNL_ARG_DST, internal::make_memory(e.out.prim_md, dst)}};
  if (bias)
    args.emplace(DNNL_ARG_BIAS, internal::make_memory(e.bias_md, internal::to_f32(ctx, bias, p.bias_dtype, p.oc)));
  ctx.execute(e.prim, std::move(args));
}

// dys already laid out as e.in0.prim_md; w through its plan; dx (and its conversion) through e.out.
void run_backward_data(CallContext& ctx, const ConvEntry& e, const Conv2dParams& p, const void* dys, const void* w,
                       void* dx) {
  const void* ws = ctx.input(e.in1, w, p.w_numel());
  void* dst = ctx.output(e.out, dx, p.x_numel());
  ctx.execute(e.prim, {{DNNL_ARG_DIFF_DST, internal::make_memory(e.in0.prim_md, dys)},
                       {DNNL_ARG_WEIGHTS, internal::make_memory(e.in1.prim_md, ws)},
                       {DNNL_ARG_DIFF_SRC, internal::make_memory(e.out.prim_md, dst)}});
  ctx.finish_output(e.out, dst, dx, p.x_numel());
}

// x through its plan, dys already laid out as e.in1.prim_md; dw and db through e.out and e.db.
void run_backward_weights(CallContext& ctx, const ConvEntry& e, const Conv2dParams& p, const void* x,
                          const void* dys, void* dw, void* db) {
  const void* xs = ctx.input(e.in0, x, p.x_numel());
  void* dw_dst = ctx.output(e.out, dw, p.w_numel());
  std::unordered_map<int, memory> args{{DNNL_ARG_SRC, internal::make_memory(e.in0.prim_md, xs)},
                                       {DNNL_ARG_DIFF_DST, internal::make_memory(e.in1.prim_md, dys)},
                                       {DNNL_ARG_DIFF_WEIGHTS, internal::make_memory(e.out.prim_md, dw_dst)}};
  void* db_dst = nullptr;
  if (db) {
    db_dst = ctx.output(e.db, db, p.oc);
    args.emplace(DNNL_ARG_DIFF_BIAS, internal::make_memory(e.db.prim_md, db_dst));
  }
  ctx.execute(e.prim, std::move(args));
  ctx.finish_output(e.out, dw_dst, dw, p.w_numel());
  if (db) ctx.finish_output(e.db, db_dst, db, p.oc);
}

}  // namespace

void conv2d_forward(const Conv2dParams& p, const void* x, const void* w, const void* bias, void* y) {
  const ConvDirection dir = ConvDirection::kForward;
  check_conv2d_params(p, op_name(dir));
  if (p.x_dtype == DType::kF64) return ref::conv2d_forward(p, x, w, bias, y);
  try {
    auto e = entry_for(p, dir, bias != nullptr);
    CallContext ctx(e->scratch_bytes);
    void* dst = ctx.output(e->out, y, p.y_numel());
    run_forward(ctx, *e, p, x, w, bias, dst);
    ctx.finish_output(e->out, dst, y, p.y_numel());
  } catch (const dnnl::error& err) {
    rethrow_dnnl(err, p, dir);
  }
}

void conv2d_backward_data(const Conv2dParams& p, const void* dy, const void* w, void* dx) {
  const ConvDirection dir = ConvDirection::kBackwardData;
  check_conv2d_params(p, op_name(dir));
  if (p.x_dtype == DType::kF64) return ref::conv2d_backward_data(p, dy, w, dx);
  try {
    auto e = entry_for(p, dir, false);
    CallContext ctx(e->scratch_bytes);
    run_backward_data(ctx, *e, p, ctx.input(e->in0, dy, p.y_numel()), w, dx);
  } catch (const dnnl::error& err) {
    rethrow_dnnl(err, p, dir);
  }
}

void conv2d_backward_weights(const Conv2dParams& p, const void* x, const void* dy, void* dw, void* db) {
  const ConvDirection dir = ConvDirection::kBackwardWeights;
  check_conv2d_params(p, op_name(dir));
  if (p.x_dtype == DType::kF64) return ref::conv2d_backward_weights(p, x, dy, dw, db);
  try {
    auto e = entry_for(p, dir, db != nullptr);
    CallContext ctx(e->scratch_bytes);
    run_backward_weights(ctx, *e, p, x, ctx.input(e->in1, dy, p.y_numel()), dw, db);
  } catch (const dnnl::error& err) {
    rethrow_dnnl(err, p, dir);
  }
}

namespace {

// The primitive's layout of a 4-D tensor as a StridedLayout4: plain strides, or one block of channels.
std::optional<StridedLayout4> strided_layout(const memory::desc& md) {
  const dnnl_memory_desc_t& d = md.data;
  if (d.ndims != 4 || d.format_kind != dnnl_blocked || d.offset0 != 0) return std::nullopt;
  const auto& b = d.format_desc.blocking;
  StridedLayout4 l;
  l.sn = b.strides[0];
  l.sh = b.strides[2];
  l.sw = b.strides[3];
  if (b.inner_nblks == 0) {
    l.sc = b.strides[1];
    l.cb = d.dims[1];
    return l;
  }
  if (b.inner_nblks == 1 && b.inner_idxs[0] == 1) {
    l.scb = b.strides[1];
    l.sc = 1;
    l.cb = b.inner_blks[0];
    return l;
  }
  return std::nullopt;
}

DType md_dtype(const memory::desc& md) {
  return md.data_type() == memory::data_type::bf16 ? DType::kBF16 : DType::kF32;
}

void check_fused(const Conv2dParams& p, const Pool2dParams& pool, const char* what) {
  check_conv2d_params(p, what);
  DEMI_CHECK(p.y_dtype == DType::kF32 || p.y_dtype == DType::kBF16, what, ": the convolution's output dtype must ",
             "be float32 or bfloat16, got ", dtype_name(p.y_dtype), " (", describe(p), ")");
  DEMI_CHECK(!p.relu && !p.accumulate, what, ": ReLU is the pooling's and nothing accumulates (", describe(p), ")");
  DEMI_CHECK(pool.n == p.n && pool.c == p.oc && pool.h == p.out_h() && pool.w == p.out_w() &&
                 strided_pool_supported(pool),
             what, ": the pooling ", describe(pool), " does not fit the convolution's output (", p.n, ", ", p.oc, ", ",
             p.out_h(), ", ", p.out_w(), ") or its windows overlap or reach padding");
}

// The pooling's gradient in the layout a primitive reads as diff_dst (plan.prim_md), in workspace: written
// there directly, or, for a layout the strided kernels cannot address, written as NCHW and reordered by plan.
const void* pooled_gradient(CallContext& ctx, const InputPlan& plan, const Pool2dParams& pool, DType dy_dtype,
                            const void* dy, const uint8_t* argmax) {
  const memory::desc& md = plan.prim_md;
  const DType ct = md_dtype(md);
  if (auto l = strided_layout(md)) {
    void* buf = ctx.scratch_buffer(md.get_size());
    max_pool2d_backward_strided(pool, dy_dtype, dy, argmax, ct, buf, *l, static_cast<int64_t>(md.get_size()));
    return buf;
  }
  const int64_t bytes = pool.x_numel() * static_cast<int64_t>(dtype_size(ct));
  void* buf = ctx.scratch_buffer(static_cast<size_t>(bytes));
  max_pool2d_backward_strided(pool, dy_dtype, dy, argmax, ct, buf, StridedLayout4::nchw(pool.c, pool.h, pool.w),
                              bytes);
  return ctx.input(plan, buf, pool.x_numel());
}

}  // namespace

void conv2d_relu_max_pool2d_forward(const Conv2dParams& p, const Pool2dParams& pool, const void* x, const void* w,
                                    const void* bias, DType y_dtype, void* y, uint8_t* argmax) {
  const char* what = "conv2d + relu + max_pool2d forward";
  check_fused(p, pool, what);
  try {
    auto e = entry_for(p, ConvDirection::kForward, bias != nullptr);
    CallContext ctx(e->scratch_bytes);
    const memory::desc& ymd = e->out.prim_md;
    void* conv_out = ctx.scratch_buffer(ymd.get_size());
    run_forward(ctx, *e, p, x, w, bias, conv_out);
    if (auto l = strided_layout(ymd)) {
      relu_max_pool2d_forward_strided(pool, md_dtype(ymd), conv_out, *l, y_dtype, y, argmax);
      return;
    }
    // A layout the strided kernels cannot address: NCHW first, as conv2d_forward would.
    void* plain = ctx.scratch_buffer(static_cast<size_t>(p.y_numel()) * dtype_size(p.y_dtype));
    ctx.finish_output(e->out, conv_out, plain, p.y_numel());
    relu_max_pool2d_forward_strided(pool, p.y_dtype, plain, StridedLayout4::nchw(pool.c, pool.h, pool.w), y_dtype, y,
                                    argmax);
  } catch (const dnnl::error& err) {
    rethrow_dnnl(err, p, ConvDirection::kForward);
  }
}

void conv2d_relu_max_pool2d_backward(const Conv2dParams& p, const Pool2dParams& pool, const void* x, const void* w,
                                     DType dy_dtype, const void* dy, const uint8_t* argmax, void* dx, void* dw,
                                     DType dw_dtype, void* db, DType db_dtype) {
  const char* what = "conv2d + relu + max_pool2d backward";
  check_fused(p, pool, what);
  try {
    Conv2dParams q = p;
    q.w_dtype = dw_dtype;
    q.bias_dtype = db ? db_dtype : p.bias_dtype;
    auto e = entry_for(q, ConvDirection::kBackwardWeights, db != nullptr);
    CallContext ctx(e->scratch_bytes);
    const void* dys = pooled_gradient(ctx, e->in1, pool, dy_dtype, dy, argmax);
    run_backward_weights(ctx, *e, q, x, dys, dw, db);
    if (dx == nullptr) return;
    auto d = entry_for(p, ConvDirection::kBackwardData, false);
    CallContext dctx(d->scratch_bytes);
    const void* ddy =
        d->in0.prim_md == e->in1.prim_md ? dys : pooled_gradient(dctx, d->in0, pool, dy_dtype, dy, argmax);
    run_backward_data(dctx, *d, p, ddy, w, dx);
  } catch (const dnnl::error& err) {
    rethrow_dnnl(err, p, ConvDirection::kBackwardWeights);
  }
}

std::string conv2d_implementation(const Conv2dParams& p, ConvDirection dir, bool with_bias) {
  check_conv2d_params(p, op_name(dir));
  if (p.x_dtype == DType::kF64) return "reference";
  return entry_for(p, dir, with_bias)->impl;
}

}  // namespace demi::kernels::onednn
