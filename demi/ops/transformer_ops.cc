// The Transformer ops: Embedding (gather, dense FP32 scatter-add gradient), LayerNorm (statistics in FP32,
// on the AMP black list), Transpose and Split (the head split and merge of attention), and fused scaled
// dot-product attention (FP32 scores and softmax between two low-precision batched products).
#include <cmath>
#include <numeric>

#include "demi/kernels/attention.h"
#include "demi/kernels/cpu/attention.h"
#include "demi/kernels/cpu/embedding.h"
#include "demi/kernels/cpu/layernorm.h"
#include "demi/kernels/cpu/transpose.h"
#include "demi/kernels/matmul.h"
#include "demi/ops/internal/helpers.h"
#include "demi/ops/ops.h"

namespace demi::ops {
namespace {

using internal::grad_as;

std::string describe_or_none(const Tensor& t) { return t.defined() ? t.describe() : std::string("undefined"); }

// The dtype statistics and accumulations use for data computed in `t`: f64 for f64, else f32.
DType acc_dtype(DType t) { return t == DType::kF64 ? DType::kF64 : DType::kF32; }

// op(a) · op(b) per batch for 3-D a, b (transposed as stored when ta/tb), written in `out`.
Tensor bmm(const Tensor& a, const Tensor& b, bool ta, bool tb, DType out) {
  kernels::MatmulParams p;
  p.batch = a.dim(0);
  p.m = ta ? a.dim(2) : a.dim(1);
  p.k = ta ? a.dim(1) : a.dim(2);
  p.n = tb ? b.dim(1) : b.dim(2);
  p.trans_a = ta;
  p.trans_b = tb;
  p.a_dtype = a.dtype();
  p.b_dtype = b.dtype();
  p.c_dtype = out;
  Tensor c = empty({p.batch, p.m, p.n}, out);
  kernels::matmul(p, a.raw_data(), b.raw_data(), c.raw_data());
  return c;
}

// softmax(scale · q kᵀ + mask) in dt: the scores in acc (FP32, or f64), straight out of the product, never
// rounded to fp16, and freed once the probabilities are written.
Tensor attention_probabilities(const Tensor& q, const Tensor& k, const Tensor& mask,
                               const kernels::AttentionSoftmaxParams& p, DType dt, DType acc) {
  Tensor scores = bmm(q, k, false, true, acc);
  Tensor probs = empty(scores.shape(), dt);
  kernels::attention_softmax_forward(scores.raw_data(), acc, mask.defined() ? mask.raw_data() : nullptr, p,
                                     probs.raw_data(), dt);
  return probs;
}

// A view of `count` elements of x's storage starting `offset` elements after x's first, with `shape`.
Tensor view_at(const Tensor& x, int64_t offset, const Shape& shape) {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = x.impl().storage;
  impl->offset = x.impl().offset + offset;
  impl->shape = shape;
  impl->dtype = x.dtype();
  return Tensor(std::move(impl));
}

std::vector<int> normalise_perm(const Shape& s, const std::vector<int>& perm_in) {
  DEMI_CHECK(static_cast<int>(perm_in.size()) == s.rank(), "Transpose: the permutation has ", perm_in.size(),
             " axes for an input of rank ", s.rank(), " ", s);
  std::vector<int> perm;
  std::vector<bool> seen(perm_in.size(), false);
  for (int a : perm_in) {
    DEMI_CHECK(a >= -s.rank() && a < s.rank(), "Transpose: axis ", a, " is out of range for an input ", s);
    int w = s.wrap(a);
    DEMI_CHECK(!seen[static_cast<size_t>(w)], "Transpose: axis ", w, " appears twice in the permutation for ", s);
    seen[static_cast<size_t>(w)] = true;
    perm.push_back(w);
  }
  return perm;
}

Tensor permute_copy(const Tensor& x, const std::vector<int>& perm) {
  Shape out;
  for (int a : perm) out.push_back(x.dim(a));
  Tensor y = empty(out, x.dtype());
  kernels::permute(x.raw_data(), x.element_size(), x.shape().dims(), perm, y.raw_data());
  return y;
}

}  // namespace

// ---- Embedding ----
Tensor embedding(const Tensor& ids, const Tensor& table_in) {
  const Op op = Op::kEmbedding;
  DEMI_CHECK(ids.defined() && (ids.dtype() == DType::kI32 || ids.dtype() == DType::kI64), op_name(op),
             ": expected int32 or int64 ids, got ", describe_or_none(ids));
  internal::check_floating(op, table_in, "table");
  internal::check_rank(op, table_in, 2, "table", "(vocab, dim)");
  Dispatch d(op, {&ids, &table_in});
  const DType out_dtype = d.compute_dtype();
  // An FP32 table gathers straight into any compute dtype (no cast of the whole table); otherwise the
  // table is cast first (a low table read in FP32, say).
  const bool direct = table_in.dtype() == out_dtype ||
                      (table_in.dtype() == DType::kF32 && out_dtype != DType::kF64);
  Tensor table = direct ? d.input_as(1, table_in.dtype()) : d.input(1);
  const int64_t vocab = table.dim(0), dim = table.dim(1), n = ids.numel();
  Shape out_shape = ids.shape();
  out_shape.push_back(dim);
  Tensor y = empty(out_shape, out_dtype);
  kernels::embedding_forward(ids.raw_data(), ids.dtype(), n, table.raw_data(), table.dtype(), vocab, dim,
                             y.raw_data(), out_dtype);
  return d.finish(y, [ids, vocab, dim, n, out_dtype](const TensorList& g) {
    Tensor gy = grad_as(g[0], out_dtype);
    const DType master = acc_dtype(out_dtype);  // the dense gradient of the (FP32 master) table
    Tensor dtable = empty({vocab, dim}, master);
    kernels::embedding_backward(ids.raw_data(), ids.dtype(), n, gy.raw_data(), gy.dtype(), vocab, dim,
                                dtable.raw_data(), master);
    return TensorList{Tensor(), dtable};
  });
}

// ---- LayerNorm ----
Tensor layer_norm(const Tensor& x_in, const Tensor& gamma_in, const Tensor& beta_in, double eps) {
  const Op op = Op::kLayerNorm;
  internal::check_floating(op, x_in, "x");
  DEMI_CHECK(x_in.rank() >= 1, op_name(op), ": expected x (*, D), got ", x_in.describe());
  const int64_t dim = x_in.dim(-1);
  for (const Tensor* t : {&gamma_in, &beta_in})
    DEMI_CHECK(!t->defined() || (t->rank() == 1 && t->dim(0) == dim && is_floating(t->dtype())), op_name(op),
               ": expected gamma and beta of shape (", dim, ") for x ", x_in.describe(), ", got ", t->describe());
  DEMI_CHECK(eps > 0, op_name(op), ": eps must be positive, got ", eps);
  Dispatch d(op, {&x_in, &gamma_in, &beta_in});
  // A low-precision x under an FP32 compute dtype (O2's black list) is read as it is: the kernel widens
  // each value exactly, so casting first would only cost a pass and a copy. y keeps x's dtype.
  const bool read_low = d.compute_dtype() == DType::kF32 && is_low_precision(x_in.dtype());
  Tensor x = read_low ? d.input_as(0, x_in.dtype()) : d.input(0);
  const bool f64 = x.dtype() == DType::kF64;
  const DType stat = acc_dtype(x.dtype());
  Tensor gamma = d.input_as(1, stat), beta = d.input_as(2, stat);
  kernels::LayerNormParams p;
  p.dim = dim;
  p.rows = dim == 0 ? 0 : x.numel() / dim;
  p.eps = static_cast<float>(eps);
  Tensor y = empty(x.shape(), x.dtype());
  Tensor mean = empty({p.rows}, stat), rstd = empty({p.rows}, stat);
  if (f64)
    kernels::layer_norm_forward(x.raw_data(), x.dtype(), gamma.defined() ? gamma.data<double>() : nullptr,
                                beta.defined() ? beta.data<double>() : nullptr, p, y.raw_data(), mean.data<double>(),
                                rstd.data<double>());
  else
    kernels::layer_norm_forward(x.raw_data(), x.dtype(), gamma.defined() ? gamma.data<float>() : nullptr,
                                beta.defined() ? beta.data<float>() : nullptr, p, y.raw_data(), mean.data<float>(),
                                rstd.data<float>());
  const bool has_gamma = gamma.defined(), has_beta = beta.defined();
  return d.finish(y, [x, gamma, mean, rstd, p, f64, has_gamma, has_beta](const TensorList& g) {
    Tensor gy = grad_as(g[0], x.dtype());
    Tensor dx = empty(x.shape(), x.dtype());
    const DType stat_dt = f64 ? DType::kF64 : DType::kF32;
    Tensor dgamma = has_gamma ? empty({p.dim}, stat_dt) : Tensor();
    Tensor dbeta = has_beta ? empty({p.dim}, stat_dt) : Tensor();
    if (f64)
      kernels::layer_norm_backward(x.raw_data(), gy.raw_data(), x.dtype(), has_gamma ? gamma.data<double>() : nullptr,
                                   mean.data<double>(), rstd.data<double>(), p, dx.raw_data(),
                                   has_gamma ? dgamma.data<double>() : nullptr,
                                   has_beta ? dbeta.data<double>() : nullptr);
    else
      kernels::layer_norm_backward(x.raw_data(), gy.raw_data(), x.dtype(), has_gamma ? gamma.data<float>() : nullptr,
                                   mean.data<float>(), rstd.data<float>(), p, dx.raw_data(),
                                   has_gamma ? dgamma.data<float>() : nullptr, has_beta ? dbeta.data<float>() : nullptr);
    return TensorList{dx, dgamma, dbeta};
  });
}

// ---- Transpose ----
Tensor transpose(const Tensor& x, const std::vector<int>& perm_in) {
  DEMI_CHECK(x.defined(), op_name(Op::kTranspose), ": input x is undefined");
  std::vector<int> perm = normalise_perm(x.shape(), perm_in);
  std::vector<int> identity(perm.size());
  std::iota(identity.begin(), identity.end(), 0);
  if (perm == identity) return x;
  Dispatch d(Op::kTranspose, {&x});
  Tensor y = permute_copy(d.input(0), perm);
  std::vector<int> inverse(perm.size());
  for (size_t j = 0; j < perm.size(); ++j) inverse[static_cast<size_t>(perm[j])] = static_cast<int>(j);
  return d.finish(y, [inverse](const TensorList& g) { return TensorList{permute_copy(g[0], inverse)}; });
}

// ---- Split ----
std::vector<Tensor> split(const Tensor& x_in, int axis_in, int64_t sections) {
  const Op op = Op::kSplit;
  DEMI_CHECK(x_in.defined() && x_in.rank() >= 1, op_name(op), ": expected an input of rank >= 1, got ",
             describe_or_none(x_in));
  DEMI_CHECK(axis_in >= -x_in.rank() && axis_in < x_in.rank(), op_name(op), ": axis ", axis_in,
             " is out of range for ", x_in.describe());
  const int axis = x_in.shape().wrap(axis_in);
  DEMI_CHECK(sections >= 1 && x_in.dim(axis) % sections == 0, op_name(op), ": cannot cut axis ", axis, " of ",
             x_in.describe(), " into ", sections, " equal parts");
  Dispatch d(op, {&x_in});
  Tensor x = d.input(0);
  int64_t outer = 1, inner = 1;
  for (int i = 0; i < axis; ++i) outer *= x.dim(i);
  for (int i = axis + 1; i < x.rank(); ++i) inner *= x.dim(i);
  const int64_t part = x.dim(axis) / sections * inner;  // elements of one part per outer index
  Shape part_shape = x.shape();
  part_shape[axis] = x.dim(axis) / sections;
  TensorList parts;
  for (int64_t i = 0; i < sections; ++i) {
    if (outer == 1) {  // each part is contiguous in x: a view, no copy
      parts.push_back(view_at(x, i * part, part_shape));
    } else {
      Tensor y = empty(part_shape, x.dtype());
      kernels::copy_strided(static_cast<const char*>(x.raw_data()) + i * part * static_cast<int64_t>(x.element_size()),
                            sections * part, y.raw_data(), part, outer, part, x.element_size());
      parts.push_back(y);
    }
  }
  Shape xs = x.shape();
  DType dt = x.dtype();
  return d.finish(parts, [xs, dt, outer, part, sections](const TensorList& g) {
    Tensor dx = empty(xs, dt);
    const size_t elem = dtype_size(dt);
    for (int64_t i = 0; i < sections; ++i) {
      char* dst = static_cast<char*>(dx.raw_data()) + i * part * static_cast<int64_t>(elem);
      const Tensor& gi = g[static_cast<size_t>(i)];
      if (gi.defined()) {
        Tensor gg = grad_as(gi, dt);
        kernels::copy_strided(gg.raw_data(), part, dst, sections * part, outer, part, elem);
      } else {
        Tensor z = zeros({part}, dt);
        kernels::copy_strided(z.raw_data(), 0, dst, sections * part, outer, part, elem);
      }
    }
    return TensorList{dx};
  });
}

// ---- Concat ----
Tensor concat(std::span<const Tensor> xs, int axis_in) {
  const Op op = Op::kConcat;
  DEMI_CHECK(!xs.empty(), op_name(op), ": needs at least one tensor");
  const Tensor& first = xs[0];
  DEMI_CHECK(first.defined() && first.rank() >= 1, op_name(op), ": expected tensors of rank >= 1, got ",
             describe_or_none(first));
  DEMI_CHECK(axis_in >= -first.rank() && axis_in < first.rank(), op_name(op), ": axis ", axis_in,
             " is out of range for ", first.describe());
  const int axis = first.shape().wrap(axis_in);
  int64_t total = 0;
  for (size_t i = 0; i < xs.size(); ++i) {
    const Tensor& t = xs[i];
    bool ok = t.defined() && t.rank() == first.rank();
    for (int d = 0; ok && d < t.rank(); ++d) ok = d == axis || t.dim(d) == first.dim(d);
    DEMI_CHECK(ok, op_name(op), ": tensor ", i, " is ", describe_or_none(t), "; every tensor must match ",
               first.describe(), " except along axis ", axis);
    total += t.dim(axis);
  }
  std::vector<const Tensor*> ptrs;
  for (const Tensor& t : xs) ptrs.push_back(&t);
  Dispatch d(op, std::span<const Tensor* const>(ptrs));
  int64_t outer = 1, inner = 1;
  for (int i = 0; i < axis; ++i) outer *= first.dim(i);
  for (int i = axis + 1; i < first.rank(); ++i) inner *= first.dim(i);
  Shape out_shape = first.shape();
  out_shape[axis] = total;
  const DType dt = d.compute_dtype();
  Tensor y = empty(out_shape, dt);
  const size_t elem = dtype_size(dt);
  std::vector<int64_t> widths;  // elements of each part per outer index
  int64_t offset = 0;
  for (size_t i = 0; i < xs.size(); ++i) {
    Tensor x = d.input(i);
    const int64_t w = x.dim(axis) * inner;
    kernels::copy_strided(x.raw_data(), w, static_cast<char*>(y.raw_data()) + offset * static_cast<int64_t>(elem),
                          total * inner, outer, w, elem);
    widths.push_back(w);
    offset += w;
  }
  std::vector<Shape> shapes;
  std::vector<DType> dtypes;
  for (const Tensor& t : xs) shapes.push_back(t.shape()), dtypes.push_back(t.dtype());
  return d.finish(y, [widths, shapes, dtypes, outer, total, inner, dt](const TensorList& g) {
    Tensor go = grad_as(g[0], dt);
    const size_t e = dtype_size(dt);
    TensorList dx;
    int64_t off = 0;
    for (size_t i = 0; i < widths.size(); ++i) {
      Tensor part = empty(shapes[i], dt);
      kernels::copy_strided(static_cast<const char*>(go.raw_data()) + off * static_cast<int64_t>(e), total * inner,
                            part.raw_data(), widths[i], outer, widths[i], e);
      dx.push_back(dtypes[i] == dt ? part : part.to(dtypes[i]));
      off += widths[i];
    }
    return dx;
  });
}

// ---- Scaled dot-product attention ----
namespace {

// p's mask layout from mask_in (undefined: none): (Sq, Sk) shared, (B, Sq, Sk) per sequence or (B, 1, Sk) a
// key-padding row, B = p.batch / p.heads; anything else is an error naming `operands`.
void set_mask_layout(kernels::AttentionSoftmaxParams& p, const Tensor& mask_in, const std::string& operands) {
  if (!mask_in.defined()) return;
  const Op op = Op::kAttention;
  const int64_t b = p.batch / p.heads, sq = p.rows, sk = p.cols;
  DEMI_CHECK(is_floating(mask_in.dtype()), op_name(op), ": expected an additive floating mask, got ",
             mask_in.describe(), " (a boolean mask becomes 0 / -inf first; nn::MultiheadAttention does that)");
  const Shape& ms = mask_in.shape();
  const bool shared = ms.rank() == 2 && ms[0] == sq && ms[1] == sk;
  const bool batched = ms.rank() == 3 && ms[0] == b && (ms[1] == sq || ms[1] == 1) && ms[2] == sk;
  DEMI_CHECK(shared || batched, op_name(op), ": expected a mask (", sq, ", ", sk, "), (", b, ", ", sq, ", ", sk,
             ") or (", b, ", 1, ", sk, ") for ", operands, " with ", p.heads, " heads, got ", mask_in.describe());
  p.mask_batch_stride = shared ? 0 : ms[1] * sk;
  p.mask_row_stride = (shared || ms[1] == sq) ? sk : 0;
}

// attention_heads' kernel parameters for qkv (B, S, 3 E) with `heads` heads (no mask layout yet).
kernels::AttentionCoreParams heads_params(int64_t batch, int64_t tokens, int64_t heads, int64_t head_dim,
                                          bool causal, bool packed) {
  kernels::AttentionCoreParams p;
  p.softmax.batch = batch * heads;
  p.softmax.heads = heads;
  p.softmax.rows = p.softmax.cols = tokens;
  p.softmax.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(head_dim)));
  p.softmax.causal = causal;
  p.dk = p.dv = head_dim;
  p.packed_heads = packed;
  return p;
}

// The core's probabilities (N, Sq, Sk) in dt from q, k, v (k, v undefined: the heads in place in q) and
// the f32 mask, and its output into `out` where given (backward's recomputation gives none): the forward's
// way, so a recomputation has the forward's bits.
Tensor core_probabilities(const kernels::AttentionCoreParams& core, const Tensor& q, const Tensor& k, const Tensor& v,
                          const Tensor& mask, DType dt, Tensor* out = nullptr) {
  auto data = [](const Tensor& t) { return t.defined() ? t.raw_data() : nullptr; };
  Tensor probs = empty({core.softmax.batch, core.softmax.rows, core.softmax.cols}, dt);
  kernels::attention_core_forward(core, q.raw_data(), data(k), data(v), mask.defined() ? mask.data<float>() : nullptr,
                                  probs.raw_data(), out != nullptr ? out->raw_data() : nullptr);
  return probs;
}

}  // namespace

bool attention_heads_fused(const Tensor& qkv, int64_t heads, const Tensor& mask, bool causal) {
  if (!qkv.defined() || qkv.rank() != 3 || heads < 1 || qkv.dim(2) % (3 * heads) != 0 || qkv.dim(0) < 1 ||
      qkv.dim(1) < 1 || qkv.dim(2) < 3 * heads)
    return false;
  DType natural = qkv.dtype();  // (the dtype Dispatch resolves from: the inputs' floating dtypes promoted)
  if (mask.defined() && is_floating(mask.dtype())) natural = promote_types(natural, mask.dtype());
  // bf16 only: f16's products split into four read the strided rows twice in their packing, and in place
  // its backward ran slower than its heads apart (D's layers, O2-fp16: 5.7 against 5.0 ms per call).
  const DType dt = resolve_compute_dtype(Op::kAttention, natural);
  if (dt != DType::kBF16 || qkv.dtype() != dt) return false;
  kernels::AttentionCoreParams p =
      heads_params(qkv.dim(0), qkv.dim(1), heads, qkv.dim(2) / (3 * heads), causal, false);
  p.dtype = dt;
  try {
    set_mask_layout(p.softmax, mask, str_cat("qkv ", qkv.describe()));
  } catch (const Error&) {
    return false;  // (attention_heads' caller reports a bad mask through the op that takes it apart)
  }
  if (!kernels::attention_core_supported(p)) return false;
  return kernels::attention_core_kernel(p, false) == "tiles" && kernels::attention_core_kernel(p, true) == "tiles";
}

Tensor attention_heads(const Tensor& qkv_in, int64_t heads, const Tensor& mask_in, bool causal, bool recompute_probs) {
  const Op op = Op::kAttention;
  DEMI_CHECK(attention_heads_fused(qkv_in, heads, mask_in, causal), op_name(op), ": attention_heads takes qkv ",
             describe_or_none(qkv_in), " with ", heads, " heads and mask ", describe_or_none(mask_in),
             " only where attention_heads_fused holds (bf16 on the fused kernels); split the heads apart otherwise");
  const int64_t b = qkv_in.dim(0), s = qkv_in.dim(1), e = qkv_in.dim(2) / 3, dh = e / heads;
  kernels::AttentionCoreParams core = heads_params(b, s, heads, dh, causal, true);
  set_mask_layout(core.softmax, mask_in, str_cat("qkv ", qkv_in.describe()));
  Dispatch d(op, {&qkv_in, &mask_in});
  d.set_flops(4 * b * heads * s * s * dh);
  Tensor qkv = d.input(0);
  const DType dt = qkv.dtype();
  DEMI_ASSERT(dt == qkv_in.dtype(), "attention_heads: compute dtype ", dtype_name(dt), " for qkv ", qkv_in.describe());
  core.dtype = dt;
  Tensor mask = d.input_as(1, DType::kF32);
  Tensor out = empty({b, s, e}, dt);
  Tensor probs = core_probabilities(core, qkv, Tensor(), Tensor(), mask, dt, &out);
  if (recompute_probs) probs = Tensor();  // (recomputed in backward, as scaled_dot_product_attention does)
  Tensor mask_kept = recompute_probs ? mask : Tensor();
  return d.finish(out, [qkv, mask = mask_kept, probs, core, dt](const TensorList& g) {
    Tensor pr = probs.defined() ? probs : core_probabilities(core, qkv, Tensor(), Tensor(), mask, dt);
    Tensor go = grad_as(g[0], dt);
    Tensor dqkv = empty(qkv.shape(), dt);
    kernels::attention_core_backward(core, qkv.raw_data(), nullptr, nullptr, pr.raw_data(), go.raw_data(),
                                     dqkv.raw_data(), nullptr, nullptr);
    return TensorList{dqkv, Tensor()};
  });
}

std::string attention_kernel(int64_t sequences, int64_t heads, int64_t tokens, int64_t head_dim, bool backward) {
  DEMI_CHECK(sequences >= 1 && heads >= 1 && tokens >= 1 && head_dim >= 1,
             "attention_kernel: sizes must be positive, got ", sequences, " x ", heads, " heads, ", tokens,
             " tokens, ", head_dim, " per head");
  kernels::AttentionCoreParams p;
  p.softmax.batch = sequences * heads;
  p.softmax.heads = heads;
  p.softmax.rows = p.softmax.cols = tokens;
  p.softmax.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(head_dim)));
  p.dk = p.dv = head_dim;
  if (!kernels::attention_core_supported(p)) return "products (no tile unit)";
  return kernels::attention_core_kernel(p, backward);
}

std::string attention_kernel_cache() { return kernels::attention_cache_path(); }

Tensor scaled_dot_product_attention(const Tensor& q_in, const Tensor& k_in, const Tensor& v_in, const Tensor& mask_in,
                                    double scale, int64_t heads, bool causal, bool recompute_probs) {
  const Op op = Op::kAttention;
  internal::check_floating(op, q_in, "q");
  internal::check_floating(op, k_in, "k");
  internal::check_floating(op, v_in, "v");
  DEMI_CHECK(q_in.rank() == 3 && k_in.rank() == 3 && v_in.rank() == 3 && k_in.dim(0) == q_in.dim(0) &&
                 v_in.dim(0) == q_in.dim(0) && k_in.dim(2) == q_in.dim(2) && v_in.dim(1) == k_in.dim(1),
             op_name(op), ": expected q (N, Sq, Dk), k (N, Sk, Dk), v (N, Sk, Dv), got q ", q_in.describe(), ", k ",
             k_in.describe(), ", v ", v_in.describe());
  const int64_t n = q_in.dim(0), sq = q_in.dim(1), sk = k_in.dim(1), dim_k = q_in.dim(2);
  DEMI_CHECK(heads >= 1 && n % heads == 0, op_name(op), ": heads (", heads, ") must divide N = ", n, " (q ",
             q_in.describe(), ")");
  DEMI_CHECK(sk >= 1, op_name(op), ": no keys (k ", k_in.describe(), ")");
  kernels::AttentionSoftmaxParams p;
  p.batch = n;
  p.heads = heads;
  p.rows = sq;
  p.cols = sk;
  p.causal = causal;
  p.scale = static_cast<float>(scale == 0 ? 1.0 / std::sqrt(static_cast<double>(dim_k)) : scale);
  DEMI_CHECK(p.scale > 0, op_name(op), ": scale must be positive, got ", scale);
  set_mask_layout(p, mask_in, str_cat("q ", q_in.describe(), " and k ", k_in.describe()));
  Dispatch d(op, {&q_in, &k_in, &v_in, &mask_in});
  Tensor q = d.input(0), k = d.input(1), v = d.input(2);
  const DType dt = q.dtype(), acc = acc_dtype(dt);
  Tensor mask = d.input_as(3, acc);
  // bf16 or f16 operands where the tile unit is: the fused kernels or the batched products, a measured
  // choice (kernels/attention.h); else the products here.
  kernels::AttentionCoreParams core{p, dim_k, v.dim(2)};
  core.dtype = dt;
  const bool on_core = is_low_precision(dt) && k.dtype() == dt && v.dtype() == dt && kernels::attention_core_supported(core);
  Tensor probs, out;
  if (on_core) {
    out = empty({n, sq, v.dim(2)}, dt);
    probs = core_probabilities(core, q, k, v, mask, dt, &out);
  } else {
    probs = attention_probabilities(q, k, mask, p, dt, acc);
    out = bmm(probs, v, false, false, dt);
  }
  // Recomputed, each layer's (N·H, Sq, Sk) probabilities are held only during its own backward (model D:
  // 4 MiB per layer at O2, 8 at O0, where every layer's were held at the training peak).
  if (recompute_probs) probs = Tensor();
  Tensor mask_kept = recompute_probs ? mask : Tensor();  // the mask only where backward reads it
  return d.finish(out, [q, k, v, mask = mask_kept, probs, p, core, on_core, dt, acc](const TensorList& g) {
    Tensor pr = probs.defined() ? probs
                : on_core       ? core_probabilities(core, q, k, v, mask, dt)  // (the forward's way and bits)
                                : attention_probabilities(q, k, mask, p, dt, acc);
    Tensor go = grad_as(g[0], dt);
    if (on_core) {
      Tensor dq = empty(q.shape(), dt), dk = empty(k.shape(), dt), dv = empty(v.shape(), dt);
      kernels::attention_core_backward(core, q.raw_data(), k.raw_data(), v.raw_data(), pr.raw_data(), go.raw_data(),
                                       dq.raw_data(), dk.raw_data(), dv.raw_data());
      return TensorList{dq, dk, dv, Tensor()};
    }
    Tensor dv = bmm(pr, go, true, false, dt);      // pᵀ · dO
    Tensor dp = bmm(go, v, false, true, acc);      // dO · vᵀ, FP32 like the scores
    Tensor ds = empty(pr.shape(), dt);
    kernels::attention_softmax_backward(pr.raw_data(), dt, dp.raw_data(), acc, p, ds.raw_data());
    dp = Tensor();
    Tensor dq = bmm(ds, k, false, false, dt);      // ds · k
    Tensor dk = bmm(ds, q, true, false, dt);       // dsᵀ · q
    return TensorList{dq, dk, dv, Tensor()};
  });
}

}  // namespace demi::ops
