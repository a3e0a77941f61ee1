#include "demi/nn/transformer.h"

#include <cmath>
#include <limits>
#include <utility>

namespace demi::nn {
namespace {

// Sets a cell's pending extra arguments for one call through Cell::operator() (which takes one tensor, and
// gives errors the cell's path and applies its pinned dtype), and restores the previous ones afterwards.
template <typename T>
class PendingScope {
 public:
  PendingScope(T& slot, T value) : slot_(slot), saved_(std::move(slot)) { slot_ = std::move(value); }
  ~PendingScope() { slot_ = std::move(saved_); }
  PendingScope(const PendingScope&) = delete;
  PendingScope& operator=(const PendingScope&) = delete;

 private:
  T& slot_;
  T saved_;
};

bool is_boolean_mask(DType t) { return t == DType::kBool || t == DType::kU8; }

// The mask as FP32 additive values: a boolean true (masked) becomes -inf, false 0; floating values are kept.
std::vector<float> additive_values(const Tensor& m) {
  std::vector<float> v = m.to_vector();
  if (is_boolean_mask(m.dtype()))
    for (float& x : v) x = x != 0.0f ? -std::numeric_limits<float>::infinity() : 0.0f;
  return v;
}

}  // namespace

// ---- Embedding ----
Embedding::Embedding(int64_t vocab, int64_t dim, std::optional<Initializer> init)
    : Cell("Embedding"), vocab_size(vocab), embedding_size(dim) {
  DEMI_CHECK(vocab >= 1 && dim >= 1, "Embedding: vocab_size and embedding_size must be >= 1, got ", vocab, " and ",
             dim);
  embedding_table = register_parameter(
      "embedding_table", initialize({vocab, dim}, init.value_or(Initializer::Normal(0.01)), default_generator()));
}

Tensor Embedding::construct(const Tensor& ids) {
  DEMI_CHECK(ids.dtype() == DType::kI32 || ids.dtype() == DType::kI64, "expected int32 or int64 token ids, got ",
             ids.describe());
  return ops::embedding(ids, embedding_table);
}

// ---- LayerNorm ----
LayerNorm::LayerNorm(std::vector<int64_t> shape, double eps)
    : Cell("LayerNorm"), normalized_shape(std::move(shape)), epsilon(eps) {
  DEMI_CHECK(!normalized_shape.empty(), "LayerNorm: normalized_shape must name at least one axis");
  Shape s;
  for (int64_t d : normalized_shape) {
    DEMI_CHECK(d >= 1, "LayerNorm: normalized_shape must be positive, got ", d);
    s.push_back(d);
  }
  DEMI_CHECK(eps > 0, "LayerNorm: epsilon must be positive, got ", eps);
  gamma = register_parameter("gamma", ones(s));
  beta = register_parameter("beta", zeros(s));
}

Tensor LayerNorm::construct(const Tensor& x) {
  const int k = static_cast<int>(normalized_shape.size());
  bool ok = x.rank() >= k;
  for (int i = 0; ok && i < k; ++i) ok = x.dim(x.rank() - k + i) == normalized_shape[static_cast<size_t>(i)];
  DEMI_CHECK(ok, "expected an input whose trailing axes are the normalized_shape ", gamma.shape(), ", got ",
             x.describe());
  if (k == 1) return ops::layer_norm(x, gamma, beta, epsilon);
  // Several normalised axes: flatten them into one (a view), normalise, restore.
  const int64_t d = gamma.numel();
  Tensor y = ops::layer_norm(ops::reshape(x, {-1, d}), ops::reshape(gamma, {d}), ops::reshape(beta, {d}), epsilon);
  return ops::reshape(y, x.shape());
}

// ---- MultiheadAttention ----
MultiheadAttention::MultiheadAttention(int64_t e, int64_t h, double p, bool has_bias)
    : Cell("MultiheadAttention"), embed_dim(e), num_heads(h), head_dim(h >= 1 ? e / h : 0), dropout(p),
      gen_(default_generator().next_u64()) {
  DEMI_CHECK(e >= 1 && h >= 1 && e % h == 0, "MultiheadAttention: embed_dim (", e, ") must be divisible by num_heads (",
             h, ")");
  DEMI_CHECK(p >= 0 && p < 1, "MultiheadAttention: dropout must be in [0, 1), got ", p);
  Generator& gen = default_generator();
  in_proj_weight = register_parameter("in_proj_weight", initialize({3 * e, e}, Initializer::XavierUniform(), gen));
  if (has_bias) in_proj_bias = register_parameter("in_proj_bias", zeros({3 * e}));
  DenseOptions o;
  o.has_bias = has_bias;
  o.bias_init = Initializer::Zero();
  out_proj = register_cell("out_proj", std::make_shared<Dense>(e, e, o));
}

Tensor MultiheadAttention::operator()(const Tensor& query, const Tensor& key, const Tensor& value,
                                      const Tensor& attn_mask, const Tensor& key_padding_mask) {
  DEMI_CHECK(!recomputing_now(), "recompute(): ", describe(), " takes key and value besides the query, whose ",
             "gradients a recomputed cell cannot return; recompute the layer that encloses it instead");
  PendingScope<Pending> scope(pending_, Pending{key, value, attn_mask, key_padding_mask, Tensor()});
  return Cell::operator()(query);
}

Tensor MultiheadAttention::call_add(const Tensor& query, const Tensor& key, const Tensor& value,
                                   const Tensor& attn_mask, const Tensor& key_padding_mask, const Tensor& residual) {
  DEMI_CHECK(!recomputing_now(), "recompute(): ", describe(), " takes key and value besides the query, whose ",
             "gradients a recomputed cell cannot return; recompute the layer that encloses it instead");
  DEMI_CHECK(residual.defined() && residual.shape() == query.shape(), describe(),
             ": expected a residual of the query's shape ", query.shape(), ", got ", residual.describe());
  PendingScope<Pending> scope(pending_, Pending{key, value, attn_mask, key_padding_mask, residual});
  return Cell::operator()(query);
}

Tensor MultiheadAttention::construct(const Tensor& x) {
  const Tensor& key = pending_.key.defined() ? pending_.key : x;
  const Tensor& value = pending_.value.defined() ? pending_.value : x;
  return attend(x, key, value);
}

Tensor MultiheadAttention::attend(const Tensor& query, const Tensor& key, const Tensor& value) {
  const int64_t e = embed_dim, h = num_heads, dh = head_dim;
  DEMI_CHECK(query.rank() == 3 && query.dim(2) == e, "expected query (B, Sq, ", e, ") (batch first), got ",
             query.describe());
  DEMI_CHECK(key.rank() == 3 && value.rank() == 3 && key.dim(0) == query.dim(0) && value.dim(0) == query.dim(0) &&
                 key.dim(2) == e && value.dim(2) == e && key.dim(1) == value.dim(1),
             "expected key and value (B, Sk, ", e, ") for query ", query.describe(), ", got key ", key.describe(),
             " and value ", value.describe());
  const int64_t b = query.dim(0), sq = query.dim(1), sk = key.dim(1);
  // (B*S, E) -> (B*H, S, Dh): heads become batch entries of the attention products.
  auto split_heads = [&](const Tensor& t, int64_t s) {
    return ops::reshape(ops::transpose(ops::reshape(t, {b, s, h, dh}), {0, 2, 1, 3}), {b * h, s, dh});
  };
  Tensor mask = additive_attention_mask(pending_.attn_mask, pending_.key_padding_mask, b, sq, sk);
  const bool drop = dropout > 0 && training();
  DEMI_CHECK(!recompute_probabilities || (!drop && !force_composed), "MultiheadAttention: recompute_probabilities "
             "takes the fused core; attention dropout (", dropout, ") in training runs the composed one");
  Tensor q, k, v;
  if (key.is_same(query) && value.is_same(query)) {
    // Self-attention: one product against the packed (3E, E) weight; then, where the fused bf16 kernels take
    // it, the heads read and merged in place (ops::attention_heads: the same bits, no permutations),
    // else one permutation (B, S, 3, H, Dh) -> (3, B, H, S, Dh), whose three parts are views.
    Tensor qkv = ops::dense(ops::reshape(query, {b * sq, e}), in_proj_weight, in_proj_bias);
    Tensor packed = ops::reshape(qkv, {b, sq, 3 * e});
    if (!drop && !force_composed && ops::attention_heads_fused(packed, h, mask))
      return project_out(ops::reshape(ops::attention_heads(packed, h, mask, false, recompute_probabilities),
                                      {b * sq, e}),
                         b, sq);
    std::vector<Tensor> parts = ops::split(ops::transpose(ops::reshape(qkv, {b, sq, 3, h, dh}), {2, 0, 3, 1, 4}), 0, 3);
    q = ops::reshape(parts[0], {b * h, sq, dh});
    k = ops::reshape(parts[1], {b * h, sq, dh});
    v = ops::reshape(parts[2], {b * h, sq, dh});
  } else {
    std::vector<Tensor> w = ops::split(in_proj_weight, 0, 3);
    std::vector<Tensor> bias = in_proj_bias.defined() ? ops::split(in_proj_bias, 0, 3) : std::vector<Tensor>(3);
    q = split_heads(ops::dense(ops::reshape(query, {b * sq, e}), w[0], bias[0]), sq);
    k = split_heads(ops::dense(ops::reshape(key, {b * sk, e}), w[1], bias[1]), sk);
    v = split_heads(ops::dense(ops::reshape(value, {b * sk, e}), w[2], bias[2]), sk);
  }
  Tensor o;
  if (!drop && !force_composed) {
    o = ops::scaled_dot_product_attention(q, k, v, mask, 0, h, false, recompute_probabilities);
  } else {
    Tensor s = ops::mul_scalar(ops::batch_matmul(q, k, false, true), 1.0 / std::sqrt(static_cast<double>(dh)));
    if (mask.defined()) {
      Tensor m = mask.rank() == 2 ? mask : ops::reshape(mask, {b, 1, mask.dim(1), sk});
      s = ops::reshape(ops::add(ops::reshape(s, {b, h, sq, sk}), m), {b * h, sq, sk});
    }
    Tensor p = ops::softmax(s, -1);
    if (drop) p = ops::dropout(p, 1.0 - dropout, gen_, true);
    o = ops::batch_matmul(p, v);
  }
  return project_out(ops::reshape(ops::transpose(ops::reshape(o, {b, h, sq, dh}), {0, 2, 1, 3}), {b * sq, e}), b, sq);
}

Tensor MultiheadAttention::project_out(const Tensor& o, int64_t b, int64_t sq) {
  const int64_t e = embed_dim;
  if (pending_.residual.defined())
    return ops::reshape(out_proj->call_add(o, ops::reshape(pending_.residual, {b * sq, e})), {b, sq, e});
  return ops::reshape((*out_proj)(o), {b, sq, e});
}

Tensor additive_attention_mask(const Tensor& attn_mask, const Tensor& key_padding_mask, int64_t batch, int64_t sq,
                               int64_t sk) {
  const Tensor& am = attn_mask;
  const Tensor& kpm = key_padding_mask;
  if (am.defined())
    DEMI_CHECK((am.rank() == 2 && am.dim(0) == sq && am.dim(1) == sk) ||
                   (am.rank() == 3 && am.dim(0) == batch && am.dim(1) == sq && am.dim(2) == sk),
               "expected attn_mask (", sq, ", ", sk, ") or (", batch, ", ", sq, ", ", sk, "), got ", am.describe(),
               " (a per-head (B * heads, Sq, Sk) mask is not supported)");
  if (kpm.defined())
    DEMI_CHECK(kpm.rank() == 2 && kpm.dim(0) == batch && kpm.dim(1) == sk, "expected key_padding_mask (", batch, ", ",
               sk, "), got ", kpm.describe());
  if (!am.defined() && !kpm.defined()) return Tensor();
  if (!kpm.defined()) return from_vector(additive_values(am), am.shape());
  std::vector<float> pad = additive_values(kpm);
  if (!am.defined()) return from_vector(pad, {batch, 1, sk});
  std::vector<float> a = additive_values(am), out(static_cast<size_t>(batch * sq * sk));
  const int64_t per_batch = am.rank() == 3 ? sq * sk : 0;
  for (int64_t n = 0; n < batch; ++n)
    for (int64_t i = 0; i < sq; ++i)
      for (int64_t j = 0; j < sk; ++j)
        out[static_cast<size_t>((n * sq + i) * sk + j)] =
            a[static_cast<size_t>(n * per_batch + i * sk + j)] + pad[static_cast<size_t>(n * sk + j)];
  return from_vector(out, {batch, sq, sk});
}

// ---- TransformerEncoderLayer ----
TransformerEncoderLayer::TransformerEncoderLayer(int64_t d_model, int64_t nhead, int64_t dim_feedforward, double p,
                                                 const std::string& activation, double layer_norm_eps, bool pre_norm)
    : Cell("TransformerEncoderLayer"), norm_first(pre_norm), gelu_(activation == "gelu") {
  DEMI_CHECK(activation == "relu" || activation == "gelu",
             "TransformerEncoderLayer: activation must be \"relu\" or \"gelu\", got \"", activation, "\"");
  DEMI_CHECK(dim_feedforward >= 1, "TransformerEncoderLayer: dim_feedforward must be >= 1, got ", dim_feedforward);
  DEMI_CHECK(p >= 0 && p < 1, "TransformerEncoderLayer: dropout must be in [0, 1), got ", p);
  self_attn = register_cell("self_attn", std::make_shared<MultiheadAttention>(d_model, nhead, p));
  DenseOptions first;
  if (!gelu_) first.activation = "relu";  // fused into the product
  linear1 = register_cell("linear1", std::make_shared<Dense>(d_model, dim_feedforward, first));
  if (p > 0) dropout = register_cell("dropout", std::make_shared<Dropout>(1.0 - p));
  linear2 = register_cell("linear2", std::make_shared<Dense>(dim_feedforward, d_model));
  norm1 = register_cell("norm1", std::make_shared<LayerNorm>(d_model, layer_norm_eps));
  norm2 = register_cell("norm2", std::make_shared<LayerNorm>(d_model, layer_norm_eps));
  if (p > 0) {
    dropout1 = register_cell("dropout1", std::make_shared<Dropout>(1.0 - p));
    dropout2 = register_cell("dropout2", std::make_shared<Dropout>(1.0 - p));
  }
}

namespace {

// Masks are recomputation's captured inputs: they take no gradient.
void check_no_grad_masks(const Cell& cell, const Tensor& mask, const Tensor& padding) {
  DEMI_CHECK(!(mask.defined() && mask.requires_grad()) && !(padding.defined() && padding.requires_grad()),
             "recompute(): ", cell.describe(), "'s masks must not require gradients");
}

}  // namespace

Tensor TransformerEncoderLayer::operator()(const Tensor& src, const Tensor& src_mask,
                                           const Tensor& src_key_padding_mask) {
  if (recomputing_now()) {  // the re-run sees the same masks
    check_no_grad_masks(*this, src_mask, src_key_padding_mask);
    return run_recomputed(src, [this, src_mask, src_key_padding_mask](const Tensor& in) {
      PendingScope<Tensor> mask(pending_mask_, src_mask);
      PendingScope<Tensor> padding(pending_padding_, src_key_padding_mask);
      return run(in);
    });
  }
  PendingScope<Tensor> mask(pending_mask_, src_mask);
  PendingScope<Tensor> padding(pending_padding_, src_key_padding_mask);
  return Cell::operator()(src);
}

// residual + the block's branch: without the branch's dropout, the add is in its last product's store
// (Dense::call_add), one op instead of two.
Tensor TransformerEncoderLayer::self_attention_add(const Tensor& x, const Tensor& residual) {
  if (!dropout1) return self_attn->call_add(x, x, x, pending_mask_, pending_padding_, residual);
  return ops::add(residual, (*dropout1)((*self_attn)(x, x, x, pending_mask_, pending_padding_)));
}

Tensor TransformerEncoderLayer::feed_forward_add(const Tensor& x, const Tensor& residual) {
  Tensor hidden = (*linear1)(x);
  if (gelu_) hidden = ops::gelu(hidden, /*approximate=*/false);
  if (dropout) hidden = (*dropout)(hidden);
  if (!dropout2) return linear2->call_add(hidden, residual);
  return ops::add(residual, (*dropout2)((*linear2)(hidden)));
}

Tensor TransformerEncoderLayer::construct(const Tensor& src) {
  Tensor x = src;
  if (norm_first) {
    x = self_attention_add((*norm1)(x), x);
    return feed_forward_add((*norm2)(x), x);
  }
  x = (*norm1)(self_attention_add(x, x));
  return (*norm2)(feed_forward_add(x, x));
}

// ---- TransformerEncoder ----
TransformerEncoder::TransformerEncoder(const std::function<std::shared_ptr<TransformerEncoderLayer>()>& make_layer,
                                       int64_t num_layers, std::shared_ptr<LayerNorm> final_norm)
    : Cell("TransformerEncoder") {
  DEMI_CHECK(num_layers >= 1, "TransformerEncoder: num_layers must be >= 1, got ", num_layers);
  auto list = register_cell("layers", std::make_shared<SequentialCell>());
  for (int64_t i = 0; i < num_layers; ++i) {
    std::shared_ptr<TransformerEncoderLayer> layer = make_layer();
    DEMI_CHECK(layer != nullptr, "TransformerEncoder: the layer factory returned null for layer ", i);
    list->append(layer);
    layers.push_back(std::move(layer));
  }
  if (final_norm) norm = register_cell("norm", std::move(final_norm));
}

Tensor TransformerEncoder::operator()(const Tensor& src, const Tensor& mask, const Tensor& src_key_padding_mask) {
  if (recomputing_now()) {
    check_no_grad_masks(*this, mask, src_key_padding_mask);
    return run_recomputed(src, [this, mask, src_key_padding_mask](const Tensor& in) {
      PendingScope<Tensor> m(pending_mask_, mask);
      PendingScope<Tensor> padding(pending_padding_, src_key_padding_mask);
      return run(in);
    });
  }
  PendingScope<Tensor> m(pending_mask_, mask);
  PendingScope<Tensor> padding(pending_padding_, src_key_padding_mask);
  return Cell::operator()(src);
}

Tensor TransformerEncoder::construct(const Tensor& src) {
  Tensor x = src;
  for (auto& layer : layers) x = (*layer)(x, pending_mask_, pending_padding_);
  return norm ? (*norm)(x) : x;
}

}  // namespace demi::nn
