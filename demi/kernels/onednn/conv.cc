// What a call decides, and on what grounds:
//   - Layout (ConvLayout::kAuto): oneDNN's blocked layouts, reordered to and from NCHW within the call,
//     except backward-data in f32 with fewer than 16 input channels, which runs plain NCHW (the blocked
//     f32 kernels pad the channels to 16). A rule, not a measurement: where it was measured (one machine
//     with AMX, models A and B and a 64-channel layer; kernels_bench's Conv2d rows time the blocked path)
//     blocked won by a wide margin everywhere else; depthwise runs blocked too. A layout that measures
//     differently on another CPU would be a candidate for the per-geometry choice below.
//   - Compute dtype of bf16 x bf16: measured per geometry on this machine (widens(), below).
//   - Chunks of images: from the geometry and the compute dtype alone (chunk_images(), below), so that
//     bits never depend on timing.
#include "demi/kernels/onednn/conv.h"
#include "demi/core/settings.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <functional>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>

#include "demi/core/convert.h"
#include "demi/core/cpu.h"
#include "demi/core/error.h"
#include "demi/core/parallel.h"
#include "demi/kernels/cpu/conv.h"
#include "demi/kernels/cpu/conv_direct.h"
#include "demi/kernels/cpu/internal/workspace.h"
#include "demi/kernels/cpu/pool.h"
#include "demi/kernels/internal/choice_cache.h"
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
using cpu_internal::element_at;

struct ConvEntry {
  dnnl::primitive prim;
  InputPlan in0, in1;  // forward: x, w; backward-data: dy, w; backward-weights: x, dy
  OutputPlan out;      // forward: y; backward-data: dx; backward-weights: dw
  OutputPlan db;       // backward-weights with a bias
  memory::desc bias_md;
  size_t scratch_bytes = 0;
  std::string impl;
};

// The dtype a primitive computes in: bf16 when both inputs are bf16 and the call does not widen them.
DType compute_dtype(DType a, DType b, bool widen) {
  return widen ? DType::kF32 : internal::compute_dtype(a, b);
}

bool use_blocked(const Conv2dParams& p, ConvDirection dir, bool widen) {
  switch (p.layout) {
    case ConvLayout::kPlain: return false;
    case ConvLayout::kBlocked: return true;
    case ConvLayout::kAuto: break;
  }
  const bool f32 = compute_dtype(p.y_dtype, p.w_dtype, widen) == DType::kF32;
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
ConvEntry make_entry(const Conv2dParams& p, ConvDirection dir, bool with_bias, DType out_dtype, bool widen) {
  const Geometry g = geometry(p);
  const bool blocked = use_blocked(p, dir, widen);
  const Tag act = blocked ? Tag::any : Tag::nchw;
  const Tag wt = blocked ? Tag::any : g.w_tag;
  const memory::desc x_plain = md(g.x, DType::kF32, Tag::nchw), y_plain = md(g.y, DType::kF32, Tag::nchw);
  const memory::desc w_plain = md(g.w, DType::kF32, g.w_tag);
  const memory::desc bias_plain = md({p.oc}, DType::kF32, Tag::a);
  dnnl::primitive_attr attr = internal::user_scratchpad_attr();
  ConvEntry e;
  if (dir == ConvDirection::kForward) {
    const DType ct = compute_dtype(p.x_dtype, p.w_dtype, widen);
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
    const DType ct = compute_dtype(p.y_dtype, p.w_dtype, widen);
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
    const DType ct = compute_dtype(p.x_dtype, p.y_dtype, widen);
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

std::shared_ptr<const ConvEntry> entry_for(const Conv2dParams& p, ConvDirection dir, bool with_bias, bool widen) {
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
                                  use_blocked(p, dir, widen),
                                  widen}};
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
                    : internal::primitive_out_dtype(compute_dtype(in_a, in_b, widen), want);
    try {
      return make_entry(p, dir, with_bias, out, widen);
    } catch (const dnnl::error&) {
      if (out == DType::kF32) throw;
      return make_entry(p, dir, with_bias, DType::kF32, widen);  // no direct bf16 output here: write f32, convert
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

// ---- Chunks of images ----
// Every reorder (NCHW <-> a blocked layout) and every f16 conversion copies a call's activations into
// workspace. A call runs its batch in chunks of images, so those copies are a chunk's size, not the
// batch's: the f16 path (widened to f32 here) then costs about what the bf16 one does, and no call's
// workspace grows with the batch. The weights (and bias) are prepared once per call, not per chunk.
// kChunkBytes bounds a chunk's input and output together (two copies each at most) in the dtype the
// primitive computes in: bf16 where it computes bf16, f32 on every other path (f16 and f32 data, widened
// bf16). Measured on model B: 2 MiB of f32 copies took 1.4-2.1 MiB off the training peak at O0 and
// O2-fp16 at the same speed, while bf16 chunks of half the images ran slower, so bf16 keeps the images per
// chunk it had (bench/memory.py measures the peaks, bench/ab.py the speed). At least one image runs per
// primitive call. The chunk size depends on the geometry and the compute dtype (itself a choice kept on
// disk) only, so every process computes the same bits.
constexpr int64_t kChunkBytes = int64_t{2} << 20;
// demi's fused Conv2d -> ReLU -> MaxPool2d forward on its indirect product computes the convolution's output
// of this many bytes of images at a time, then pools it while it is in L2. At kChunkBytes it held 2.2-2.7
// MiB on model B's second layer (the f32 output of 41 images, and for f16 storage their pooled f32 values),
// the O2 training peak's largest part wherever that kernel is chosen (a choice by time: B's O2-fp16 peak
// read 9.84 or 8.77 MB with the same build by the choice file); at 512 KiB the peaks are 8.70 MB at
// O2-bf16 and 8.77 at O2-fp16 either way, at the same speed (bench/ab.py's pairs split between the two
// sizes). The per-image products are the same whatever the chunk, so the bits are.
constexpr int64_t kDemiChunkBytes = int64_t{512} << 10;

// A chunk's copies of one image (input and output, two each at most) in the compute dtype.
int64_t chunk_image_bytes(const Conv2dParams& p, bool widen) {
  const int64_t elem = p.x_dtype == DType::kBF16 && !widen ? 2 : 4;
  return std::max<int64_t>((p.c * p.h * p.w + p.oc * p.out_h() * p.out_w()) * 2 * elem, 1);
}

int64_t chunk_images(const Conv2dParams& p, bool widen) {
  return std::clamp<int64_t>(kChunkBytes / chunk_image_bytes(p, widen), 1, std::max<int64_t>(p.n, 1));
}

// Images per chunk of a weight gradient. A bf16 dw over several chunks is summed in an f32 buffer of the
// weights' size beside the primitive's own f32 dw; as one chunk, the primitive's dw is reordered straight
// into bf16. So it runs as one chunk where that sum buffer is at least the whole batch's copies (large
// weights on small images, ResNet-18's 512-channel 4x4 layers at O2: chunks would hold more, not less).
// An f16 dw is staged through a plain f32 buffer either way (OutputPlan), so chunking costs it nothing.
int64_t weight_grad_chunk_images(const Conv2dParams& p, bool widen) {
  const int64_t n = std::max<int64_t>(p.n, 1);
  if (p.w_dtype == DType::kBF16 && p.w_numel() * int64_t{sizeof(float)} >= chunk_image_bytes(p, widen) * n) return n;
  return chunk_images(p, widen);
}

// f(q, n0) for each chunk of nb images: q is p with q.n the chunk's images, n0 its first image.
template <class F>
void for_each_chunk(const Conv2dParams& p, int64_t nb, F&& f) {
  for (int64_t n0 = 0; n0 < p.n; n0 += nb) {
    Conv2dParams q = p;
    q.n = std::min(nb, p.n - n0);
    f(q, n0);
  }
}

// The weights in a chunk's primitive layout, prepared once per call: again only when a chunk's primitive
// (the last, smaller one) wants another layout.
class PreparedWeights {
 public:
  const void* get(CallContext& ctx, const InputPlan& plan, const void* w, int64_t numel) {
    if (data_ == nullptr || !(plan.prim_md == md_)) {
      data_ = ctx.input(plan, w, numel);
      md_ = plan.prim_md;
    }
    return data_;
  }

 private:
  const void* data_ = nullptr;
  memory::desc md_;
};

// Each direction's execution for one chunk, shared by the plain calls and the fused Conv2d -> ReLU ->
// MaxPool2d: the caller brings the operands a call prepares once or differently (the weights, the f32
// bias, y's or dy's buffer in the primitive's layout); the rest goes through the entry's plans.

// x through its plan; the output into `dst`, laid out as e.out.prim_md.
void run_forward(CallContext& ctx, const ConvEntry& e, const Conv2dParams& p, const void* x, const void* ws,
                 const float* bias32, void* dst) {
  const void* xs = ctx.input(e.in0, x, p.x_numel());
  std::unordered_map<int, memory> args{{DNNL_ARG_SRC, internal::make_memory(e.in0.prim_md, xs)},
                                       {DNNL_ARG_WEIGHTS, internal::make_memory(e.in1.prim_md, ws)},
                                       {DNNL_ARG_DST, internal::make_memory(e.out.prim_md, dst)}};
  if (bias32) args.emplace(DNNL_ARG_BIAS, internal::make_memory(e.bias_md, bias32));
  ctx.execute(e.prim, std::move(args));
}

// dys already laid out as e.in0.prim_md, ws as e.in1.prim_md; dx (and its conversion) through e.out.
void run_backward_data(CallContext& ctx, const ConvEntry& e, const Conv2dParams& p, const void* dys, const void* ws,
                       void* dx) {
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

// The weight (and bias) gradient summed over chunks: the first chunk writes (or adds, p.accumulate), later
// ones add, through the primitive's own accumulating reorder. Into the caller's memory when it is f32;
// a bf16|f16 gradient sums in f32 workspace and is rounded once at the end (finish()).
class WeightGradSum {
 public:
  WeightGradSum(CallContext& ctx, const Conv2dParams& p, bool widen, void* dw, void* db)
      : p_(p), dw_(dw), db_(db), images_(weight_grad_chunk_images(p, widen)) {
    direct_ = images_ >= p.n || (p.w_dtype == DType::kF32 && (!db || p.bias_dtype == DType::kF32));
    if (!direct_) {
      dw32_ = static_cast<float*>(ctx.scratch_buffer(static_cast<size_t>(p.w_numel()) * sizeof(float)));
      if (db) db32_ = static_cast<float*>(ctx.scratch_buffer(static_cast<size_t>(p.oc) * sizeof(float)));
    }
  }
  // The chunk's parameters (its dtypes and accumulate flag) and destinations.
  Conv2dParams chunk(const Conv2dParams& q, int64_t n0) const {
    Conv2dParams c = q;
    if (direct_) {
      c.accumulate = p_.accumulate || n0 > 0;
    } else {
      c.w_dtype = DType::kF32;
      c.bias_dtype = DType::kF32;
      c.accumulate = n0 > 0;
    }
    return c;
  }
  int64_t images() const { return images_; }  // per chunk
  void* dw() const { return direct_ ? dw_ : dw32_; }
  void* db() const { return direct_ ? db_ : db32_; }
  void finish(CallContext& ctx) const {
    if (direct_) return;
    store(ctx, dw32_, dw_, p_.w_dtype, p_.w_numel());
    if (db_) store(ctx, db32_, db_, p_.bias_dtype, p_.oc);
  }

 private:
  void store(CallContext& ctx, float* sum, void* dst, DType t, int64_t n) const {
    if (p_.accumulate) {
      const float* old = internal::to_f32(ctx, dst, t, n);
      for (int64_t i = 0; i < n; ++i) sum[i] += old[i];
    }
    convert(sum, DType::kF32, dst, t, n);
  }
  const Conv2dParams& p_;
  void *dw_, *db_;
  int64_t images_;
  bool direct_ = true;
  float *dw32_ = nullptr, *db32_ = nullptr;
};

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
// dz_dtype: the values' dtype (fused_dense_gradient_dtype): dy rounded to bf16 where it is bf16 and dy is not,
// in the conversion to a bf16 layout or after the one to f32.
const void* pooled_gradient(CallContext& ctx, const InputPlan& plan, const Pool2dParams& pool, DType dy_dtype,
                            DType dz_dtype, const void* dy, const uint8_t* argmax) {
  const bool round = dz_dtype == DType::kBF16 && dy_dtype != DType::kBF16;
  auto rounded = [&](void* buf, DType t, int64_t bytes) {
    if (round && t == DType::kF32)
      round_f32(static_cast<float*>(buf), static_cast<float*>(buf), bytes / 4, DType::kBF16);
  };
  const memory::desc& md = plan.prim_md;
  const DType ct = md_dtype(md);
  if (auto l = strided_layout(md)) {
    void* buf = ctx.scratch_buffer(md.get_size());
    max_pool2d_backward_strided(pool, dy_dtype, dy, argmax, ct, buf, *l, static_cast<int64_t>(md.get_size()));
    rounded(buf, ct, static_cast<int64_t>(md.get_size()));
    return buf;
  }
  // (NCHW in the caller's dtype, which the plan reorders: bf16 where a widened primitive reads f32)
  const DType ut = md_dtype(plan.user_md);
  const int64_t bytes = pool.x_numel() * static_cast<int64_t>(dtype_size(ut));
  void* buf = ctx.scratch_buffer(static_cast<size_t>(bytes));
  max_pool2d_backward_strided(pool, dy_dtype, dy, argmax, ut, buf, StridedLayout4::nchw(pool.c, pool.h, pool.w),
                              bytes);
  rounded(buf, ut, bytes);
  return ctx.input(plan, buf, pool.x_numel());
}

// ---- Each call's body, for a given choice of bf16 compute (widen = false) or f32 on widened operands ----

void forward_impl(const Conv2dParams& p, bool widen, const void* x, const void* w, const void* bias, void* y) {
  CallContext ctx(0);
  PreparedWeights ws;
  const float* bias32 = bias ? internal::to_f32(ctx, bias, p.bias_dtype, p.oc) : nullptr;
  for_each_chunk(p, chunk_images(p, widen), [&](const Conv2dParams& q, int64_t n0) {
    auto e = entry_for(q, ConvDirection::kForward, bias != nullptr, widen);
    ctx.ensure_scratch(e->scratch_bytes);
    const void* w_prim = ws.get(ctx, e->in1, w, p.w_numel());
    const size_t mark = ctx.mark();
    void* yc = element_at(y, n0 * p.oc * p.out_h() * p.out_w(), p.y_dtype);
    void* dst = ctx.output(e->out, yc, q.y_numel());
    run_forward(ctx, *e, q, element_at(x, n0 * p.c * p.h * p.w, p.x_dtype), w_prim, bias32, dst);
    ctx.finish_output(e->out, dst, yc, q.y_numel());
    ctx.release_to(mark);
  });
}

// The data gradient a chunk of images at a time; dy_of(ctx, plan, q, n0) gives the chunk's dy (images n0 ...
// n0 + q.n) as plan.prim_md lays it out.
using ChunkInput = std::function<const void*(CallContext&, const InputPlan&, const Conv2dParams&, int64_t)>;

void backward_data_chunks(const Conv2dParams& p, bool widen, const void* w, void* dx, const ChunkInput& dy_of) {
  CallContext ctx(0);
  PreparedWeights ws;
  for_each_chunk(p, chunk_images(p, widen), [&](const Conv2dParams& q, int64_t n0) {
    auto e = entry_for(q, ConvDirection::kBackwardData, false, widen);
    ctx.ensure_scratch(e->scratch_bytes);
    const void* w_prim = ws.get(ctx, e->in1, w, p.w_numel());
    const size_t mark = ctx.mark();
    const void* dys = dy_of(ctx, e->in0, q, n0);
    run_backward_data(ctx, *e, q, dys, w_prim, element_at(dx, n0 * p.c * p.h * p.w, p.x_dtype));
    ctx.release_to(mark);
  });
}

void backward_data_impl(const Conv2dParams& p, bool widen, const void* dy, const void* w, void* dx) {
  backward_data_chunks(p, widen, w, dx, [&](CallContext& ctx, const InputPlan& plan, const Conv2dParams& q,
                                            int64_t n0) {
    return ctx.input(plan, element_at(dy, n0 * p.oc * p.out_h() * p.out_w(), p.y_dtype), q.y_numel());
  });
}

void backward_weights_impl(const Conv2dParams& p, bool widen, const void* x, const void* dy, void* dw, void* db) {
  CallContext ctx(0);
  WeightGradSum sum(ctx, p, widen, dw, db);
  for_each_chunk(p, sum.images(), [&](const Conv2dParams& q0, int64_t n0) {
    const Conv2dParams q = sum.chunk(q0, n0);
    auto e = entry_for(q, ConvDirection::kBackwardWeights, db != nullptr, widen);
    ctx.ensure_scratch(e->scratch_bytes);
    const size_t mark = ctx.mark();
    const void* dys = ctx.input(e->in1, element_at(dy, n0 * p.oc * p.out_h() * p.out_w(), p.y_dtype), q.y_numel());
    run_backward_weights(ctx, *e, q, element_at(x, n0 * p.c * p.h * p.w, p.x_dtype), dys, sum.dw(), sum.db());
    ctx.release_to(mark);
  });
  sum.finish(ctx);
}

void fused_forward_impl(const Conv2dParams& p, bool widen, const Pool2dParams& pool, const void* x, const void* w,
                        const void* bias, DType y_dtype, void* y, uint8_t* argmax) {
  CallContext ctx(0);
  PreparedWeights ws;
  const float* bias32 = bias ? internal::to_f32(ctx, bias, p.bias_dtype, p.oc) : nullptr;
  const int64_t pooled = pool.c * pool.oh * pool.ow;  // per image
  for_each_chunk(p, chunk_images(p, widen), [&](const Conv2dParams& q, int64_t n0) {
    auto e = entry_for(q, ConvDirection::kForward, bias != nullptr, widen);
    ctx.ensure_scratch(e->scratch_bytes);
    const void* w_prim = ws.get(ctx, e->in1, w, p.w_numel());
    const size_t mark = ctx.mark();
    Pool2dParams qp = pool;
    qp.n = q.n;
    void* yc = element_at(y, n0 * pooled, y_dtype);
    uint8_t* am = argmax ? argmax + n0 * pooled : nullptr;
    const memory::desc& ymd = e->out.prim_md;
    void* conv_out = ctx.scratch_buffer(ymd.get_size());
    run_forward(ctx, *e, q, element_at(x, n0 * p.c * p.h * p.w, p.x_dtype), w_prim, bias32, conv_out);
    if (auto l = strided_layout(ymd)) {
      DType conv_dtype = md_dtype(ymd);
      if (conv_dtype != p.y_dtype) {  // widened bf16: pool the bf16 values conv2d_forward writes (same ties)
        const int64_t count = static_cast<int64_t>(ymd.get_size() / sizeof(float));
        void* rounded = ctx.scratch_buffer(static_cast<size_t>(count) * dtype_size(p.y_dtype));
        convert(conv_out, conv_dtype, rounded, p.y_dtype, count);
        conv_out = rounded;
        conv_dtype = p.y_dtype;
      }
      relu_max_pool2d_forward_strided(qp, conv_dtype, conv_out, *l, y_dtype, yc, am);
    } else {  // a layout the strided kernels cannot address: NCHW first, as conv2d_forward would
      void* plain = ctx.scratch_buffer(static_cast<size_t>(q.y_numel()) * dtype_size(p.y_dtype));
      ctx.finish_output(e->out, conv_out, plain, q.y_numel());
      relu_max_pool2d_forward_strided(qp, p.y_dtype, plain, StridedLayout4::nchw(pool.c, pool.h, pool.w), y_dtype,
                                      yc, am);
    }
    ctx.release_to(mark);
  });
}

void fused_backward_impl(const Conv2dParams& p, bool widen, const Pool2dParams& pool, const void* x, const void* w,
                         DType dy_dtype, const void* dy, const uint8_t* argmax, void* dx, void* dw, DType dw_dtype,
                         void* db, DType db_dtype) {
  Conv2dParams pw = p;
  pw.w_dtype = dw_dtype;
  pw.bias_dtype = db ? db_dtype : p.bias_dtype;
  CallContext ctx(0);
  WeightGradSum sum(ctx, pw, widen, dw, db);
  PreparedWeights ws;
  const DType dz_dtype = fused_dense_gradient_dtype(p, dy_dtype);
  const int64_t pooled = pool.c * pool.oh * pool.ow;  // per image
  for_each_chunk(pw, sum.images(), [&](const Conv2dParams& q, int64_t n0) {
    const Conv2dParams qw = sum.chunk(q, n0);
    Conv2dParams qd = q;  // the data gradient reads the forward's weights
    qd.w_dtype = p.w_dtype;
    qd.bias_dtype = p.bias_dtype;
    Pool2dParams qp = pool;
    qp.n = q.n;
    const void* dyc = element_at(dy, n0 * pooled, dy_dtype);
    const uint8_t* am = argmax + n0 * pooled;
    const void* xc = element_at(x, n0 * p.c * p.h * p.w, p.x_dtype);
    auto e = entry_for(qw, ConvDirection::kBackwardWeights, db != nullptr, widen);
    auto d = dx ? entry_for(qd, ConvDirection::kBackwardData, false, widen) : nullptr;
    ctx.ensure_scratch(std::max(e->scratch_bytes, d ? d->scratch_bytes : 0));
    const void* w_prim = d ? ws.get(ctx, d->in1, w, p.w_numel()) : nullptr;
    const size_t mark = ctx.mark();
    const void* dys = pooled_gradient(ctx, e->in1, qp, dy_dtype, dz_dtype, dyc, am);
    run_backward_weights(ctx, *e, qw, xc, dys, sum.dw(), sum.db());
    if (d) {
      const void* ddy =
          d->in0.prim_md == e->in1.prim_md ? dys : pooled_gradient(ctx, d->in0, qp, dy_dtype, dz_dtype, dyc, am);
      run_backward_data(ctx, *d, qd, ddy, w_prim, element_at(dx, n0 * p.c * p.h * p.w, p.x_dtype));
    }
    ctx.release_to(mark);
  });
  sum.finish(ctx);
}

// The fused layer's data gradient on oneDNN without the whole batch's dense gradient: a chunk of images at
// a time (the chunks backward_data_impl takes), the pool's gradient written per chunk into the layout the
// primitive reads. p is the fused call's (its output f32 or bf16, as the pooled gradient's layout wants);
// the primitive is the separate call's, whose f16 gradient it would widen to the same f32 values.
void pooled_backward_data_impl(const Conv2dParams& p, bool widen, const Pool2dParams& pool, const void* w,
                               DType dy_dtype, const void* dy, const uint8_t* argmax, void* dx) {
  const int64_t pooled = pool.c * pool.oh * pool.ow;  // per image
  backward_data_chunks(p, widen, w, dx, [&](CallContext& ctx, const InputPlan& plan, const Conv2dParams& q,
                                            int64_t n0) {
    Pool2dParams qp = pool;
    qp.n = q.n;
    return pooled_gradient(ctx, plan, qp, dy_dtype, fused_dense_gradient_dtype(p, dy_dtype),
                           element_at(dy, n0 * pooled, dy_dtype), argmax + n0 * pooled);
  });
}

// ---- bf16 compute or f32 on widened operands, chosen per call shape by measurement ----
// oneDNN's bf16 kernels run AMX tiles or vdpbf16ps; on a CPU whose vdpbf16ps issues at half the FMA rate
// (Intel Xeons without AMX) its f32 kernels on operands widened within the call (a chunk at a time) are
// faster. Both accumulate in f32 and round the output once: they differ in summation order only. The
// faster is measured at a shape's first call on the call's own operands and kept in memory and in
// "conv-v1-<cpu>.txt" (internal/choice_cache.h), so every process on the machine computes the same bits.

std::atomic<ConvBf16Policy>& bf16_policy_slot() {
  static std::atomic<ConvBf16Policy> p{[] {
    const std::string s = env_choice("DEMI_CONV_BF16");
    return s == "bf16" ? ConvBf16Policy::kBf16 : s == "f32" ? ConvBf16Policy::kWidenF32 : ConvBf16Policy::kAuto;
  }()};
  return p;
}

kernels::internal::ChoiceCache& bf16_choices() {
  static auto& c = *new kernels::internal::ChoiceCache("conv-v1", {"onednn-bf16", "onednn-f32"});  // never destroyed
  return c;
}

// Whether a convolution whose two inputs are bf16 computes in f32 on widened operands; run(widen) is the
// call. One choice per geometry (every direction and the fused calls follow it, so that the fused layer
// computes exactly what the separate calls do): the first call of the geometry measures it on its own
// operands.
bool widens(const Conv2dParams& p, DType in_a, DType in_b, const std::function<void(bool)>& run) {
  if (internal::compute_dtype(in_a, in_b) != DType::kBF16) return false;
  switch (bf16_policy_slot().load()) {
    case ConvBf16Policy::kBf16: return false;
    case ConvBf16Policy::kWidenF32: return true;
    case ConvBf16Policy::kAuto: break;
  }
  kernels::internal::ChoiceCache::Key key{static_cast<int64_t>(cpu_level()) | int64_t{num_threads()} << 8,
                                          p.n, p.c, p.h, p.w, p.oc, p.kh, p.kw, p.stride_h, p.stride_w,
                                          p.pad_top, p.pad_bottom, p.pad_left, p.pad_right, p.dilation_h,
                                          p.dilation_w, p.groups};
  auto text = [&] {
    return str_cat(cpu_level_name(cpu_level()), " t", num_threads(), " n", p.n, " c", p.c, " ", p.h, "x", p.w,
                   " oc", p.oc, " k", p.kh, "x", p.kw, " s", p.stride_h, ",", p.stride_w, " p", p.pad_top, ",",
                   p.pad_bottom, ",", p.pad_left, ",", p.pad_right, " d", p.dilation_h, ",", p.dilation_w, " g",
                   p.groups);
  };
  auto tune = [&] {
    // Each once to warm up (primitives are created), then three alternating rounds; the best time decides.
    auto seconds = [&](bool widen) { return kernels::internal::seconds_of([&] { run(widen); }); };
    seconds(false);
    seconds(true);
    double best[2] = {1e30, 1e30};
    for (int r = 0; r < 3; ++r)
      for (int i = 0; i < 2; ++i) best[i] = std::min(best[i], seconds(i == 1));
    return best[1] < best[0] ? 1 : 0;
  };
  return bf16_choices().choose(key, text, tune) == 1;
}

}  // namespace

void set_conv_bf16_policy(ConvBf16Policy policy) { bf16_policy_slot().store(policy); }
ConvBf16Policy conv_bf16_policy() { return bf16_policy_slot().load(); }
void set_conv_cache_dir(const std::string& dir) { bf16_choices().set_dir(dir); }
std::string conv_cache_path() { return bf16_choices().path(); }

namespace {

// oneDNN's forward and weight gradient, bf16 compute chosen as for any call (the direct choice measures these).
void onednn_forward(const Conv2dParams& p, const void* x, const void* w, const void* bias, void* y) {
  const ConvDirection dir = ConvDirection::kForward;
  try {
    // Tuning writes y, which the chosen run then overwrites.
    const bool widen = widens(p, p.x_dtype, p.w_dtype,
                              [&](bool wd) { forward_impl(p, wd, x, w, bias, y); });
    forward_impl(p, widen, x, w, bias, y);
  } catch (const dnnl::error& err) {
    rethrow_dnnl(err, p, dir);
  }
}

void onednn_backward_weights(const Conv2dParams& p, const void* x, const void* dy, void* dw, void* db);
void onednn_backward_data(const Conv2dParams& p, const void* dy, const void* w, void* dx);

// ---- demi's direct convolution (cpu/conv_direct.h) or oneDNN, chosen per geometry by measurement ----
// For the few-input-channel geometries the direct kernels take (a network's first layers): one choice per
// geometry, input dtype and direction (forward or weight gradient), which the separate calls and the fused
// Conv2d -> ReLU -> MaxPool2d both follow, so that the fused layer computes exactly what the separate calls
// do (the data gradient stays on oneDNN either way). The first call of a geometry and direction (in a network,
// the fused layer's) measures both on its own operands, each warmed up, then five alternating rounds; the best
// time decides.
// An auto|on|off policy from the environment variable `var` (core/settings.h; unset or empty: auto).
template <typename Policy>
Policy policy_from_env(const char* var) {
  const std::string s = env_choice(var);
  return s == "on" ? Policy::kOn : s == "off" ? Policy::kOff : Policy::kAuto;
}

std::atomic<ConvDirectPolicy>& direct_policy_slot() {
  static std::atomic<ConvDirectPolicy> p{policy_from_env<ConvDirectPolicy>("DEMI_CONV_DIRECT")};
  return p;
}


kernels::internal::ChoiceCache& direct_choices() {
  static auto& c = *new kernels::internal::ChoiceCache("conv-direct-v5", {"onednn", "demi-direct"});  // never destroyed
  return c;
}

// How much faster oneDNN must measure than demi's convolution kernels, beyond what its workspace costs (it
// holds reordered, converted or unpooled chunks by design; theirs is little or none).
constexpr double kOnednnMargin = 0.1;

// The bytes a call of p touches as stored (x, w, y; dy and dx are y's and x's sizes): what its workspace
// is weighed against (internal::priced_seconds).
int64_t footprint_of(const Conv2dParams& p) {
  return p.x_numel() * static_cast<int64_t>(dtype_size(p.x_dtype)) +
         p.w_numel() * static_cast<int64_t>(dtype_size(p.w_dtype)) +
         p.y_numel() * static_cast<int64_t>(dtype_size(p.y_dtype));
}

// run(direct) makes the call with the direct kernel or with oneDNN's; the choice is measured on the call's
// own operands (its outputs are written by each candidate, then by the chosen one).
kernels::internal::ChoiceCache::Key direct_key(const Conv2dParams& p, ConvDirection dir) {
  const bool forward = dir == ConvDirection::kForward;
  return {static_cast<int64_t>(cpu_level()) | int64_t{num_threads()} << 8 | static_cast<int64_t>(p.x_dtype) << 24 |
              int64_t{forward} << 32,
          p.n, p.c, p.h, p.w, p.oc, p.kh, p.kw, p.pad_top, p.pad_bottom, p.pad_left, p.pad_right};
}

// std::nullopt where the policy leaves it to measurement; else whether the direct kernels run p.
std::optional<bool> direct_by_policy(const Conv2dParams& p, ConvDirection dir) {
  if (dir == ConvDirection::kBackwardData || p.x_dtype == DType::kF64 || !cpu::direct_conv_supported(p)) return false;
  switch (direct_policy_slot().load()) {
    case ConvDirectPolicy::kOff: return false;
    case ConvDirectPolicy::kOn: return true;
    case ConvDirectPolicy::kAuto: break;
  }
  return std::nullopt;
}

// The choice file's text key of direct_key(p, dir).
std::string direct_text(const Conv2dParams& p, ConvDirection dir) {
  return str_cat(cpu_level_name(cpu_level()), " t", num_threads(), dir == ConvDirection::kForward ? " fwd " : " dw ",
                 dtype_name(p.x_dtype), " n", p.n, " c", p.c, " ", p.h, "x", p.w, " oc", p.oc, " k", p.kh, "x", p.kw,
                 " p", p.pad_top, ",", p.pad_bottom, ",", p.pad_left, ",", p.pad_right);
}

bool direct_chosen(const Conv2dParams& p, ConvDirection dir, const std::function<void(bool)>& run) {
  if (const std::optional<bool> by_policy = direct_by_policy(p, dir)) return *by_policy;
  return direct_choices().choose(direct_key(p, dir), [&] { return direct_text(p, dir); },
                                 [&] { return internal::demi_measures_faster(run, footprint_of(p)); }) == 1;
}

// Whether the direct kernels run p (for dir) by the policy or by a choice already made, in this process or
// in the choice file (no measuring). (This process's only: a process's first call of a geometry with a
// warm file went through the rounded copy of x below, 0.19 MiB of model A's batch at its O2 training peak.)
bool direct_chosen_already(const Conv2dParams& p, ConvDirection dir) {
  if (const std::optional<bool> by_policy = direct_by_policy(p, dir)) return *by_policy;
  return direct_choices().find(direct_key(p, dir), [&] { return direct_text(p, dir); }) == 1;
}

// ---- an f32 x read as bf16 or f16 values (Conv2dParams::x_round: AMP's cast of the data batch) ----
// The direct kernels round x as they pad each image, so where they run the call (their choice for the call
// on a rounded x made already) nothing else is done; anywhere else, and at a geometry's first call (which
// measures that choice), the call runs on a rounded copy of x, as it would after a separate cast.
// direct() runs the direct kernel on p and x; logical(q, xr) the entry point on the rounded copy.
template <class Direct, class Logical>
void with_rounded_x(const Conv2dParams& p, ConvDirection dir, const void* x, Direct&& direct, Logical&& logical) {
  Conv2dParams q = p;
  q.x_dtype = p.x_round;
  q.x_round = DType::kF32;
  if (direct_chosen_already(q, dir)) return direct();
  internal::Workspace xr(static_cast<size_t>(p.x_numel()) * dtype_size(p.x_round));
  convert(x, DType::kF32, xr.get(), p.x_round, p.x_numel());
  logical(q, static_cast<const void*>(xr.get()));
}

// ---- demi's indirect convolution forward (cpu/conv.h) or oneDNN, chosen per geometry by measurement ----
// For the geometries the direct kernels do not take (or where oneDNN beat them): the forward, plain or fused
// with ReLU -> MaxPool2d, measured as the direct choice is; one choice per geometry and input dtype.
std::atomic<ConvGemmPolicy>& gemm_policy_slot() {
  static std::atomic<ConvGemmPolicy> p{policy_from_env<ConvGemmPolicy>("DEMI_CONV_GEMM")};
  return p;
}

kernels::internal::ChoiceCache& gemm_choices() {
  static auto& c = *new kernels::internal::ChoiceCache("conv-gemm-v6", {"onednn", "demi-gemm"});  // never destroyed
  return c;
}

bool gemm_chosen(const Conv2dParams& p, ConvDirection dir, const std::function<void(bool)>& run) {
  const bool forward = dir == ConvDirection::kForward, weights = dir == ConvDirection::kBackwardWeights;
  if (p.x_dtype == DType::kF64 || !(forward ? cpu::conv2d_indirect_supported(p)
                                    : weights ? cpu::conv2d_backward_weights_indirect_supported(p)
                                              : cpu::conv2d_backward_data_indirect_supported(p)))
    return false;
  switch (gemm_policy_slot().load()) {
    case ConvGemmPolicy::kOff: return false;
    case ConvGemmPolicy::kOn: return true;
    case ConvGemmPolicy::kAuto: break;
  }
  // (The data gradient's dtype is its input's, dy: y_dtype; the weight gradient reads both.)
  const DType in = forward ? p.x_dtype : p.y_dtype;
  kernels::internal::ChoiceCache::Key key{static_cast<int64_t>(cpu_level()) | int64_t{num_threads()} << 8 |
                                              static_cast<int64_t>(in) << 24 | static_cast<int64_t>(dir) << 32 |
                                              static_cast<int64_t>(p.x_dtype) << 40 |
                                              static_cast<int64_t>(p.w_dtype) << 48,
                                          p.n, p.c, p.h, p.w, p.oc, p.kh, p.kw,
                                          p.pad_top, p.pad_bottom, p.pad_left, p.pad_right,
                                          p.stride_h, p.stride_w, p.dilation_h, p.dilation_w};
  auto text = [&] {
    return str_cat(cpu_level_name(cpu_level()), " t", num_threads(),
                   forward ? " fwd " : weights ? str_cat(" dw ", dtype_name(p.x_dtype), " dy ") : std::string(" dx "),
                   dtype_name(in), " w ", dtype_name(p.w_dtype), " n", p.n, " c",
                   p.c, " ", p.h, "x", p.w, " oc", p.oc, " k", p.kh, "x", p.kw, " p", p.pad_top, ",", p.pad_bottom, ",",
                   p.pad_left, ",", p.pad_right, " s", p.stride_h, ",", p.stride_w, " d", p.dilation_h, ",",
                   p.dilation_w);
  };
  return gemm_choices().choose(key, text, [&] { return internal::demi_measures_faster(run, footprint_of(p)); }) == 1;
}

}  // namespace

bool demi_kernel_preferred(double demi_seconds, double onednn_seconds, int64_t demi_workspace,
                           int64_t onednn_workspace, int64_t footprint) {
  const int64_t lightest = std::min(demi_workspace, onednn_workspace);
  return kernels::internal::priced_seconds(demi_seconds, demi_workspace - lightest, footprint, 0) <=
         kernels::internal::priced_seconds(onednn_seconds, onednn_workspace - lightest, footprint, kOnednnMargin);
}

void set_conv_gemm_policy(ConvGemmPolicy policy) { gemm_policy_slot().store(policy); }
ConvGemmPolicy conv_gemm_policy() { return gemm_policy_slot().load(); }
std::string conv_gemm_cache_path() { return gemm_choices().path(); }
void set_conv_gemm_cache_dir(const std::string& dir) { gemm_choices().set_dir(dir); }

void set_conv_direct_policy(ConvDirectPolicy policy) { direct_policy_slot().store(policy); }
ConvDirectPolicy conv_direct_policy() { return direct_policy_slot().load(); }
std::string conv_direct_cache_path() { return direct_choices().path(); }
void set_conv_direct_cache_dir(const std::string& dir) { direct_choices().set_dir(dir); }

std::string conv2d_direct_kernel(const Conv2dParams& p_in, ConvDirection dir) {
  Conv2dParams p = p_in;  // as a conv layer runs it: weights in x's dtype, output in the compute dtype
  p.w_dtype = p.bias_dtype = p.x_dtype;
  p.y_dtype = p.x_dtype == DType::kBF16 ? DType::kBF16 : DType::kF32;
  p.relu = p.accumulate = false;
  check_conv2d_params(p, op_name(dir));
  if (p.x_dtype == DType::kF64 || !cpu::direct_conv_supported(p)) return "onednn (not a direct geometry)";
  if (dir == ConvDirection::kBackwardData) return "onednn";
  Conv2dParams pw = p;  // the weight gradient into FP32 masters
  pw.w_dtype = pw.bias_dtype = DType::kF32;
  internal::Workspace x = internal::zeroed(static_cast<size_t>(p.x_numel()) * dtype_size(p.x_dtype)),
                      w = internal::zeroed(static_cast<size_t>(p.w_numel()) * dtype_size(p.w_dtype)),
                      y = internal::zeroed(static_cast<size_t>(p.y_numel()) * dtype_size(p.y_dtype)),
                      dw = internal::zeroed(static_cast<size_t>(p.w_numel()) * sizeof(float)),
                      db = internal::zeroed(static_cast<size_t>(p.oc) * sizeof(float));
  const bool direct = direct_chosen(p, dir, [&](bool d) {
    if (dir == ConvDirection::kForward)
      return d ? cpu::direct_conv2d_forward(p, x.get(), w.get(), nullptr, y.get())
               : onednn_forward(p, x.get(), w.get(), nullptr, y.get());
    d ? cpu::direct_conv2d_backward_weights(pw, x.get(), y.get(), dw.get(), db.get())
      : onednn_backward_weights(pw, x.get(), y.get(), dw.get(), db.get());
  });
  if (!direct) return "onednn";
  if (p.x_dtype == DType::kF32) return "demi-direct";
  // A bf16 layer's taps or dot products, an f16 layer's dot products (its dz f16, as the fused Conv2d -> ReLU
  // -> MaxPool2d takes its f16 gradient): in f32, vdpbf16ps pairs or on the tile unit, whichever measured
  // fastest here.
  Conv2dParams pd = pw;
  if (p.x_dtype == DType::kF16) pd.y_dtype = DType::kF16;
  return str_cat("demi-direct (",
                 dir == ConvDirection::kForward ? cpu::direct_conv_forward_products(p)
                                                : cpu::direct_conv_dots_products(pd),
                 ")");
}

std::string conv2d_forward_kernel(const Conv2dParams& p_in) {
  Conv2dParams p = p_in;  // as a conv layer runs it: weights in x's dtype, output in the compute dtype
  p.w_dtype = p.bias_dtype = p.x_dtype;
  p.y_dtype = p.x_dtype == DType::kBF16 ? DType::kBF16 : DType::kF32;
  p.relu = p.accumulate = false;
  check_conv2d_params(p, op_name(ConvDirection::kForward));
  if (p.x_dtype == DType::kF64) return "reference";
  internal::Workspace x = internal::zeroed(static_cast<size_t>(p.x_numel()) * dtype_size(p.x_dtype)),
                      w = internal::zeroed(static_cast<size_t>(p.w_numel()) * dtype_size(p.w_dtype)),
                      y = internal::zeroed(static_cast<size_t>(p.y_numel()) * dtype_size(p.y_dtype));
  if (direct_chosen(p, ConvDirection::kForward, [&](bool d) {
        d ? cpu::direct_conv2d_forward(p, x.get(), w.get(), nullptr, y.get())
          : onednn_forward(p, x.get(), w.get(), nullptr, y.get());
      }))
    return "demi-direct";
  if (!cpu::conv2d_indirect_supported(p)) return "onednn (not an indirect geometry)";
  const bool gemm = gemm_chosen(p, ConvDirection::kForward, [&](bool d) {
    d ? cpu::conv2d_forward(p, x.get(), w.get(), nullptr, y.get())
      : onednn_forward(p, x.get(), w.get(), nullptr, y.get());
  });
  if (!gemm) return "onednn";
  return cpu::conv2d_forward_on_tiles(p) ? "demi-gemm (tiles)" : "demi-gemm";
}

void conv2d_forward(const Conv2dParams& p, const void* x, const void* w, const void* bias, void* y) {
  check_conv2d_params(p, op_name(ConvDirection::kForward));
  if (p.x_round != DType::kF32)
    return with_rounded_x(
        p, ConvDirection::kForward, x, [&] { cpu::direct_conv2d_forward(p, x, w, bias, y); },
        [&](const Conv2dParams& q, const void* xr) { conv2d_forward(q, xr, w, bias, y); });
  if (p.x_dtype == DType::kF64) return ref::conv2d_forward(p, x, w, bias, y);
  // Tuning writes y, which the chosen run then overwrites.
  const bool direct = direct_chosen(p, ConvDirection::kForward, [&](bool d) {
    d ? cpu::direct_conv2d_forward(p, x, w, bias, y) : onednn_forward(p, x, w, bias, y);
  });
  if (direct) return cpu::direct_conv2d_forward(p, x, w, bias, y);
  auto run = [&](bool demi) { demi ? cpu::conv2d_forward(p, x, w, bias, y) : onednn_forward(p, x, w, bias, y); };
  run(gemm_chosen(p, ConvDirection::kForward, run));
}

void conv2d_backward_data(const Conv2dParams& p, const void* dy, const void* w, void* dx) {
  const ConvDirection dir = ConvDirection::kBackwardData;
  check_conv2d_params(p, op_name(dir));
  DEMI_CHECK(p.x_round == DType::kF32, op_name(dir), ": an x read as ", dtype_name(p.x_round),
             " values has no data gradient here (", describe(p), ")");
  if (p.x_dtype == DType::kF64) return ref::conv2d_backward_data(p, dy, w, dx);
  // demi's indirect product (stride 1) or oneDNN's, measured per geometry; an accumulating call is measured
  // into scratch, so that dx takes the sum once.
  const bool demi = gemm_chosen(p, dir, [&](bool d) {
    if (!p.accumulate) return d ? cpu::conv2d_backward_data(p, dy, w, dx) : onednn_backward_data(p, dy, w, dx);
    internal::Workspace out(static_cast<size_t>(p.x_numel()) * dtype_size(p.x_dtype));
    Conv2dParams q = p;
    q.accumulate = false;
    d ? cpu::conv2d_backward_data(q, dy, w, out.get()) : onednn_backward_data(q, dy, w, out.get());
  });
  demi ? cpu::conv2d_backward_data(p, dy, w, dx) : onednn_backward_data(p, dy, w, dx);
}

namespace {

void onednn_backward_data(const Conv2dParams& p, const void* dy, const void* w, void* dx) {
  const ConvDirection dir = ConvDirection::kBackwardData;
  try {
    const bool widen = widens(p, p.y_dtype, p.w_dtype, [&](bool wd) {
      if (!p.accumulate) return backward_data_impl(p, wd, dy, w, dx);
      internal::Workspace out(static_cast<size_t>(p.x_numel()) * dtype_size(p.x_dtype));  // dx is read
      Conv2dParams q = p;
      q.accumulate = false;
      backward_data_impl(q, wd, dy, w, out.get());
    });
    backward_data_impl(p, widen, dy, w, dx);
  } catch (const dnnl::error& err) {
    rethrow_dnnl(err, p, dir);
  }
}

}  // namespace

void conv2d_backward_weights(const Conv2dParams& p, const void* x, const void* dy, void* dw, void* db) {
  check_conv2d_params(p, op_name(ConvDirection::kBackwardWeights));
  if (p.x_round != DType::kF32)
    return with_rounded_x(
        p, ConvDirection::kBackwardWeights, x, [&] { cpu::direct_conv2d_backward_weights(p, x, dy, dw, db); },
        [&](const Conv2dParams& q, const void* xr) { conv2d_backward_weights(q, xr, dy, dw, db); });
  if (p.x_dtype == DType::kF64) return ref::conv2d_backward_weights(p, x, dy, dw, db);
  auto call = [&](bool direct, const Conv2dParams& q, void* gw, void* gb) {
    direct ? cpu::direct_conv2d_backward_weights(q, x, dy, gw, gb) : onednn_backward_weights(q, x, dy, gw, gb);
  };
  const bool direct = direct_chosen(p, ConvDirection::kBackwardWeights, [&](bool d) {
    if (!p.accumulate) return call(d, p, dw, db);
    internal::Workspace w_out(static_cast<size_t>(p.w_numel()) * dtype_size(p.w_dtype)),  // dw, db are read
        b_out(db ? static_cast<size_t>(p.oc) * dtype_size(p.bias_dtype) : 0);
    Conv2dParams q = p;
    q.accumulate = false;
    call(d, q, w_out.get(), db ? b_out.get() : nullptr);
  });
  if (direct) return call(true, p, dw, db);
  // demi's indirect product or oneDNN's, measured per geometry (into scratch when accumulating).
  auto gemm_call = [&](bool demi, const Conv2dParams& q, void* gw, void* gb) {
    demi ? cpu::conv2d_backward_weights(q, x, dy, gw, gb) : onednn_backward_weights(q, x, dy, gw, gb);
  };
  const bool demi = gemm_chosen(p, ConvDirection::kBackwardWeights, [&](bool d) {
    if (!p.accumulate) return gemm_call(d, p, dw, db);
    internal::Workspace w_out(static_cast<size_t>(p.w_numel()) * dtype_size(p.w_dtype)),
        b_out(db ? static_cast<size_t>(p.oc) * dtype_size(p.bias_dtype) : 0);
    Conv2dParams q = p;
    q.accumulate = false;
    gemm_call(d, q, w_out.get(), db ? b_out.get() : nullptr);
  });
  gemm_call(demi, p, dw, db);
}

namespace {

void onednn_backward_weights(const Conv2dParams& p, const void* x, const void* dy, void* dw, void* db) {
  const ConvDirection dir = ConvDirection::kBackwardWeights;
  try {
    const bool widen = widens(p, p.x_dtype, p.y_dtype, [&](bool wd) {
      if (!p.accumulate) return backward_weights_impl(p, wd, x, dy, dw, db);
      internal::Workspace w_out(static_cast<size_t>(p.w_numel()) * dtype_size(p.w_dtype)),  // dw, db are read
          b_out(db ? static_cast<size_t>(p.oc) * dtype_size(p.bias_dtype) : 0);
      Conv2dParams q = p;
      q.accumulate = false;
      backward_weights_impl(q, wd, x, dy, w_out.get(), db ? b_out.get() : nullptr);
    });
    backward_weights_impl(p, widen, x, dy, dw, db);
  } catch (const dnnl::error& err) {
    rethrow_dnnl(err, p, dir);
  }
}

}  // namespace

void conv2d_relu_max_pool2d_forward(const Conv2dParams& p, const Pool2dParams& pool, const void* x, const void* w,
                                    const void* bias, DType y_dtype, void* y, uint8_t* argmax) {
  check_fused(p, pool, "conv2d + relu + max_pool2d forward");
  if (p.x_round != DType::kF32)
    return with_rounded_x(
        p, ConvDirection::kForward, x,
        [&] { cpu::direct_conv2d_relu_max_pool2d_forward(p, pool, x, w, bias, y_dtype, y, argmax); },
        [&](const Conv2dParams& q, const void* xr) {
          conv2d_relu_max_pool2d_forward(q, pool, xr, w, bias, y_dtype, y, argmax);
        });
  auto onednn_run = [&](bool wd) { fused_forward_impl(p, wd, pool, x, w, bias, y_dtype, y, argmax); };
  // Tuning writes y and argmax, which the chosen run then overwrites.
  auto run_onednn = [&] {
    try {
      onednn_run(widens(p, p.x_dtype, p.w_dtype, onednn_run));
    } catch (const dnnl::error& err) {
      rethrow_dnnl(err, p, ConvDirection::kForward);
    }
  };
  auto run = [&](bool direct) {
    if (direct) return cpu::direct_conv2d_relu_max_pool2d_forward(p, pool, x, w, bias, y_dtype, y, argmax);
    run_onednn();
  };
  if (direct_chosen(p, ConvDirection::kForward, run)) return run(true);
  // As the separate calls: demi's convolution into p.y_dtype a chunk of images at a time (kChunkBytes of
  // output), then ReLU -> MaxPool2d from it (NCHW's vector kernel; an f16 output pooled in f32 and rounded
  // once, as the f16 layers' separate calls compute: max and ReLU commute with the rounding).
  auto run_demi = [&] {
    const int64_t per_image = p.oc * p.out_h() * p.out_w(), pooled = pool.c * pool.oh * pool.ow;
    const int64_t chunk = std::clamp<int64_t>(
        kDemiChunkBytes / (per_image * static_cast<int64_t>(dtype_size(p.y_dtype))), 1, p.n);
    const bool round = y_dtype != p.y_dtype;
    internal::Workspace z(static_cast<size_t>(chunk * per_image) * dtype_size(p.y_dtype)),
        zp(round ? static_cast<size_t>(chunk * pooled) * dtype_size(p.y_dtype) : 0);
    for (int64_t n0 = 0; n0 < p.n; n0 += chunk) {
      Conv2dParams q = p;
      q.n = std::min(chunk, p.n - n0);
      cpu::conv2d_forward(q, element_at(x, n0 * p.c * p.h * p.w, p.x_dtype), w, bias, z.get());
      Pool2dParams qp = pool;
      qp.n = q.n;
      void* yc = element_at(y, n0 * pooled, y_dtype);
      relu_max_pool2d_forward(qp, p.y_dtype, z.get(), round ? zp.get() : yc, argmax ? argmax + n0 * pooled : nullptr);
      if (round) convert(zp.get(), p.y_dtype, yc, y_dtype, q.n * pooled);
    }
  };
  gemm_chosen(p, ConvDirection::kForward, [&](bool demi) { demi ? run_demi() : run_onednn(); }) ? run_demi()
                                                                                             : run_onednn();
}

void conv2d_relu_max_pool2d_backward(const Conv2dParams& p, const Pool2dParams& pool, const void* x, const void* w,
                                     DType dy_dtype, const void* dy, const uint8_t* argmax, void* dx, void* dw,
                                     DType dw_dtype, void* db, DType db_dtype, std::optional<DType> dx_dtype) {
  check_fused(p, pool, "conv2d + relu + max_pool2d backward");
  if (p.x_round != DType::kF32) {
    DEMI_CHECK(dx == nullptr && dw != nullptr, "conv2d + relu + max_pool2d backward: an x read as ",
               dtype_name(p.x_round), " values has no data gradient here (", describe(p), ")");
    return with_rounded_x(
        p, ConvDirection::kBackwardWeights, x,
        [&] {
          cpu::direct_conv2d_relu_max_pool2d_backward_weights(p, pool, x, dy_dtype, dy, argmax, dw, dw_dtype, db,
                                                              db_dtype);
        },
        [&](const Conv2dParams& q, const void* xr) {
          conv2d_relu_max_pool2d_backward(q, pool, xr, w, dy_dtype, dy, argmax, dx, dw, dw_dtype, db, db_dtype,
                                          dx_dtype);
        });
  }
  // The gradients are computed as the separate calls compute them: from the pool's dense gradient in dy's
  // dtype (the separate convolution's output dtype; for f16 storage the fused forward kept its output in
  // f32, but the gradient's values are dy's, exact in f16) or rounded to bf16 (fused_dense_gradient_dtype),
  // with the separate calls' choices, keyed by it.
  const DType dz_dtype = fused_dense_gradient_dtype(p, dy_dtype);
  Conv2dParams pd = p;  // the data gradient's call
  pd.y_dtype = dz_dtype;
  pd.x_dtype = dx_dtype.value_or(p.x_dtype);
  // A dx in another dtype than x is computed apart from the weight gradient (oneDNN's fused primitive
  // writes dx in x's).
  const bool dx_apart = pd.x_dtype != p.x_dtype;
  Conv2dParams px = p;  // the fused call's, writing dx in its dtype
  px.x_dtype = pd.x_dtype;
  Conv2dParams pw = pd;  // the weight gradient's call
  pw.x_dtype = p.x_dtype;
  pw.w_dtype = dw_dtype;
  pw.bias_dtype = db ? db_dtype : DType::kF32;
  // The dense gradient of images [n0, n0 + count): their pool's gradient unpooled into dst, then rounded (in
  // place) or converted there (`wide`: count images' room in dy's dtype, where the sizes differ).
  const int64_t dz_image = p.y_numel() / p.n, dy_image = pool.y_numel() / pool.n;
  const bool dz_wider = dtype_size(dy_dtype) != dtype_size(dz_dtype);
  auto unpool = [&](int64_t n0, int64_t count, void* dst, void* wide) {
    Pool2dParams q = pool;
    q.n = count;
    void* unpooled = dz_wider ? wide : dst;
    max_pool2d_backward(q, dy_dtype, element_at(dy, n0 * dy_image, dy_dtype), argmax + n0 * dy_image, unpooled);
    if (dz_dtype != dy_dtype) convert(unpooled, dy_dtype, dst, dz_dtype, count * dz_image);
  };
  // The same an image at a time, for demi's kernels to read as they go (cpu::Images), into each thread's
  // buffer: so their runs hold no batch-sized dense gradient (model B's second layer: 3 MiB in bf16, 6 MiB
  // in f32).
  const size_t dz_bytes = cpu_internal::bytes64(static_cast<size_t>(dz_image) * dtype_size(dz_dtype));
  const cpu::Images dense_images{
      .make = [&](int64_t n, void* dst) { unpool(n, 1, dst, static_cast<char*>(dst) + dz_bytes); },
      .make_bytes = dz_bytes + (dz_wider ? static_cast<size_t>(dz_image) * dtype_size(dy_dtype) : 0)};
  // The whole batch's, made only for oneDNN's separate calls when a choice between them and demi's kernels
  // is measured (oneDNN's fused calls pool a chunk at a time).
  std::optional<internal::Workspace> dz;
  auto dense = [&] {
    if (!dz) {
      dz.emplace(static_cast<size_t>(p.y_numel()) * dtype_size(dz_dtype));
      internal::Workspace wide(dz_wider ? static_cast<size_t>(pool.x_numel()) * dtype_size(dy_dtype) : 0);
      unpool(0, p.n, dz->get(), wide.get());
    }
    return dz->get();
  };
  // Whether the separate data gradient would be demi's indirect product.
  auto demi_data_gradient = [&] {
    return dx && gemm_chosen(pd, ConvDirection::kBackwardData, [&](bool d) {
             d ? cpu::conv2d_backward_data(pd, dense_images, w, dx) : onednn_backward_data(pd, dense(), w, dx);
           });
  };
  // oneDNN's data gradient, as the separate call's, from dy a chunk at a time.
  auto onednn_data_gradient = [&] {
    try {
      auto call = [&](bool wd) { pooled_backward_data_impl(px, wd, pool, w, dy_dtype, dy, argmax, dx); };
      call(widens(pd, pd.y_dtype, pd.w_dtype, call));
    } catch (const dnnl::error& err) {
      rethrow_dnnl(err, pd, ConvDirection::kBackwardData);
    }
  };
  void* dx_fused = dx;  // the data gradient the fused primitive computes (nullptr: computed apart, below)
  auto onednn_run = [&](bool wd) {
    fused_backward_impl(p, wd, pool, x, w, dy_dtype, dy, argmax, dx_fused, dw, dw_dtype, db, db_dtype);
  };
  if (dw == nullptr) {  // the data gradient alone, as the whole call computes it
    DEMI_CHECK(dx != nullptr, "conv2d + relu + max_pool2d backward: neither dx nor dw asked for");
    if (demi_data_gradient())
      cpu::conv2d_backward_data(pd, dense_images, w, dx);
    else
      onednn_data_gradient();
    return;
  }
  // Nothing accumulates here (check_fused): tuning writes dx, dw and db, which the chosen run overwrites.
  auto run = [&](bool direct) {
    const bool demi_dx = demi_data_gradient();
    dz.reset();  // (made only if oneDNN's data gradient was measured now)
    if (demi_dx) cpu::conv2d_backward_data(pd, dense_images, w, dx);
    dx_fused = demi_dx || dx_apart ? nullptr : dx;
    // The weight gradient: the direct kernel (from dy, unpooled as it goes), demi's indirect product on
    // the gradient unpooled image by image, or oneDNN's fused primitive (the data gradient with it, unless
    // demi's is chosen).
    const bool demi_dw =
        !direct && gemm_chosen(pw, ConvDirection::kBackwardWeights, [&](bool d) {
          d ? cpu::conv2d_backward_weights(pw, x, dense_images, dw, db)
            : onednn_backward_weights(pw, x, dense(), dw, db);
        });
    if (demi_dw) cpu::conv2d_backward_weights(pw, x, dense_images, dw, db);
    dz.reset();
    const bool onednn_dx = dx != nullptr && !demi_dx;  // oneDNN's data gradient, fused or apart
    if (direct || demi_dw) {
      if (onednn_dx) onednn_data_gradient();
      if (direct)
        cpu::direct_conv2d_relu_max_pool2d_backward_weights(p, pool, x, dy_dtype, dy, argmax, dw, dw_dtype, db,
                                                            db_dtype);
      return;
    }
    try {
      onednn_run(widens(p, p.x_dtype,
                        dz_dtype == DType::kBF16 ? DType::kBF16 : DType::kF32,
                        onednn_run));
    } catch (const dnnl::error& err) {
      rethrow_dnnl(err, p, ConvDirection::kBackwardWeights);
    }
    if (onednn_dx && dx_apart) onednn_data_gradient();
  };
  run(direct_chosen(p, ConvDirection::kBackwardWeights, run));
}

namespace {

// The bf16 choice for p's geometry, measured (if not made yet) by a forward on zeroed bf16 scratch
// operands: for diagnostics, which have no operands of their own.
bool widens_on_scratch(const Conv2dParams& p_in) {
  Conv2dParams p = p_in;
  p.x_dtype = p.w_dtype = p.y_dtype = p.bias_dtype = DType::kBF16;
  p.relu = p.accumulate = false;
  auto zeros = [](int64_t n) { return internal::zeroed(static_cast<size_t>(n) * sizeof(BFloat16)); };
  internal::Workspace x = zeros(p.x_numel()), w = zeros(p.w_numel()), y = zeros(p.y_numel());
  return widens(p, p.x_dtype, p.w_dtype, [&](bool wd) { forward_impl(p, wd, x.get(), w.get(), nullptr, y.get()); });
}

}  // namespace

std::string conv2d_bf16_kernel(const Conv2dParams& p_in) {
  Conv2dParams p = p_in;
  p.x_dtype = p.w_dtype = p.y_dtype = p.bias_dtype = DType::kBF16;
  p.relu = p.accumulate = false;
  check_conv2d_params(p, op_name(ConvDirection::kForward));
  try {
    const bool widen = widens_on_scratch(p);
    return str_cat(widen ? "onednn-f32 (" : "onednn-bf16 (",
                   entry_for(p, ConvDirection::kForward, false, widen)->impl, ")");
  } catch (const dnnl::error& err) {
    rethrow_dnnl(err, p, ConvDirection::kForward);
  }
}

std::string conv2d_implementation(const Conv2dParams& p, ConvDirection dir, bool with_bias) {
  check_conv2d_params(p, op_name(dir));
  if (p.x_dtype == DType::kF64) return "reference";
  const DType in_a = dir == ConvDirection::kBackwardData ? p.y_dtype : p.x_dtype;
  const DType in_b = dir == ConvDirection::kBackwardWeights ? p.y_dtype : p.w_dtype;
  const bool bf16 = internal::compute_dtype(in_a, in_b) == DType::kBF16;
  try {
    return entry_for(p, dir, with_bias, bf16 && widens_on_scratch(p))->impl;
  } catch (const dnnl::error& err) {
    rethrow_dnnl(err, p, dir);
  }
}

}  // namespace demi::kernels::onednn
