#include "demi/nn/gpt.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "demi/autograd/autograd.h"

namespace demi::nn {
namespace {

DenseOptions dense_options(const GPTOptions& o, double sigma) {
  DenseOptions d;
  d.has_bias = o.bias;
  d.weight_init = Initializer::Normal(sigma);
  d.bias_init = Initializer::Zero();
  return d;
}

double residual_sigma(const GPTOptions& o) { return 0.02 / std::sqrt(2.0 * static_cast<double>(o.n_layer)); }

std::shared_ptr<Dropout> maybe_dropout(double p) { return p > 0 ? std::make_shared<Dropout>(1.0 - p) : nullptr; }

// positions first, first + 1, ..., first + t - 1 as int32 (t)
Tensor positions(int64_t first, int64_t t) {
  std::vector<int32_t> p(static_cast<size_t>(t));
  std::iota(p.begin(), p.end(), static_cast<int32_t>(first));
  return from_vector(p, {t});
}

}  // namespace

// ---- CausalSelfAttention ----
CausalSelfAttention::CausalSelfAttention(const GPTOptions& o)
    : Cell("CausalSelfAttention"), n_head(o.n_head), n_embd(o.n_embd) {
  DEMI_CHECK(o.n_head >= 1 && o.n_embd >= 1 && o.n_embd % o.n_head == 0, "GPT: n_embd (", o.n_embd,
             ") must be a positive multiple of n_head (", o.n_head, ")");
  c_attn = register_cell("c_attn", std::make_shared<Dense>(o.n_embd, 3 * o.n_embd, dense_options(o, 0.02)));
  c_proj = register_cell("c_proj", std::make_shared<Dense>(o.n_embd, o.n_embd, dense_options(o, residual_sigma(o))));
  if (auto d = maybe_dropout(o.dropout)) resid_dropout = register_cell("resid_dropout", d);
}

std::vector<Tensor> CausalSelfAttention::split_heads(const Tensor& qkv, int64_t b, int64_t t) const {
  const int64_t h = n_head, dh = n_embd / n_head;
  // (B, T, 3, H, Dh) -> (3, B, H, T, Dh): one permutation; q, k and v are views of its three parts.
  std::vector<Tensor> parts = ops::split(ops::transpose(ops::reshape(qkv, {b, t, 3, h, dh}), {2, 0, 3, 1, 4}), 0, 3);
  for (Tensor& p : parts) p = ops::reshape(p, {b * h, t, dh});
  return parts;
}

Tensor CausalSelfAttention::merge_heads(const Tensor& o, int64_t b, int64_t t) const {
  const int64_t h = n_head, dh = n_embd / n_head;
  return ops::reshape(ops::transpose(ops::reshape(o, {b, h, t, dh}), {0, 2, 1, 3}), {b, t, n_embd});
}

Tensor CausalSelfAttention::construct(const Tensor& x) {
  DEMI_CHECK(x.rank() == 3 && x.dim(2) == n_embd, "expected x (B, T, ", n_embd, "), got ", x.describe());
  const int64_t b = x.dim(0), t = x.dim(1);
  Tensor projected = c_attn->call(x);  // (B, T, 3 E)
  Tensor merged;
  if (ops::attention_heads_fused(projected, n_head, Tensor(), /*causal=*/true)) {
    // the heads read and merged in place (the same bits, no permutations: ops::attention_heads)
    merged = ops::attention_heads(projected, n_head, Tensor(), /*causal=*/true, recompute_probabilities);
  } else {
    std::vector<Tensor> qkv = split_heads(projected, b, t);
    merged = merge_heads(ops::scaled_dot_product_attention(qkv[0], qkv[1], qkv[2], Tensor(), 0, n_head,
                                                           /*causal=*/true, recompute_probabilities),
                         b, t);
  }
  if (residual_.defined() && !resid_dropout) return c_proj->call_add(merged, residual_);
  Tensor y = c_proj->call(merged);
  y = resid_dropout ? resid_dropout->call(y) : y;
  return residual_.defined() ? ops::add(residual_, y) : y;
}

Tensor CausalSelfAttention::call_add(const Tensor& x, const Tensor& residual) {
  return call_adding(residual_, residual, x);
}

Tensor CausalSelfAttention::forward_cached(const Tensor& x, KVCache::Layer& layer, int64_t cached) {
  const int64_t b = x.dim(0), t = x.dim(1);
  std::vector<Tensor> qkv = split_heads(c_attn->call(x), b, t);
  // The new positions' keys and values join the cached ones along the sequence axis.
  layer.k = cached == 0 ? qkv[1] : ops::concat(std::vector<Tensor>{layer.k, qkv[1]}, 1);
  layer.v = cached == 0 ? qkv[2] : ops::concat(std::vector<Tensor>{layer.v, qkv[2]}, 1);
  Tensor o = ops::scaled_dot_product_attention(qkv[0], layer.k, layer.v, Tensor(), 0, n_head, /*causal=*/true);
  return c_proj->call(merge_heads(o, b, t));
}

// ---- GPTMLP ----
GPTMLP::GPTMLP(const GPTOptions& o) : Cell("GPTMLP") {
  c_fc = register_cell("c_fc", std::make_shared<Dense>(o.n_embd, 4 * o.n_embd, dense_options(o, 0.02)));
  gelu = register_cell("gelu", std::make_shared<GELU>(/*approximate=*/false));  // exact, as nanoGPT
  c_proj = register_cell("c_proj", std::make_shared<Dense>(4 * o.n_embd, o.n_embd, dense_options(o, residual_sigma(o))));
  if (auto d = maybe_dropout(o.dropout)) dropout = register_cell("dropout", d);
}

Tensor GPTMLP::construct(const Tensor& x) {
  Tensor h = gelu->call(c_fc->call(x));
  if (residual_.defined() && !dropout) return c_proj->call_add(h, residual_);
  Tensor y = c_proj->call(h);
  y = dropout ? dropout->call(y) : y;
  return residual_.defined() ? ops::add(residual_, y) : y;
}

Tensor GPTMLP::call_add(const Tensor& x, const Tensor& residual) { return call_adding(residual_, residual, x); }

// ---- GPTBlock ----
GPTBlock::GPTBlock(const GPTOptions& o) : Cell("GPTBlock") {
  ln_1 = register_cell("ln_1", std::make_shared<LayerNorm>(o.n_embd, 1e-5));
  attn = register_cell("attn", std::make_shared<CausalSelfAttention>(o));
  ln_2 = register_cell("ln_2", std::make_shared<LayerNorm>(o.n_embd, 1e-5));
  mlp = register_cell("mlp", std::make_shared<GPTMLP>(o));
}

Tensor GPTBlock::construct(const Tensor& x) {
  Tensor y = attn->call_add(ln_1->call(x), x);
  return mlp->call_add(ln_2->call(y), y);
}

Tensor GPTBlock::forward_cached(const Tensor& x, KVCache::Layer& layer, int64_t cached) {
  Tensor y = ops::add(x, attn->forward_cached(ln_1->call(x), layer, cached));
  return ops::add(y, mlp->call(ln_2->call(y)));
}

// ---- GPT ----
GPT::GPT(const GPTOptions& o) : Cell("GPT"), options(o) {
  DEMI_CHECK(o.vocab_size >= 1 && o.block_size >= 1 && o.n_layer >= 1, "GPT: vocab_size (", o.vocab_size,
             "), block_size (", o.block_size, ") and n_layer (", o.n_layer, ") must be >= 1");
  DEMI_CHECK(o.dropout >= 0 && o.dropout < 1, "GPT: dropout must be in [0, 1), got ", o.dropout);
  wte = register_cell("wte", std::make_shared<Embedding>(o.vocab_size, o.n_embd, Initializer::Normal(0.02)));
  wpe = register_parameter("wpe", initialize({o.block_size, o.n_embd}, Initializer::Normal(0.02), default_generator()));
  if (auto d = maybe_dropout(o.dropout)) drop = register_cell("drop", d);
  for (int64_t i = 0; i < o.n_layer; ++i)
    h.push_back(register_cell("h." + std::to_string(i), std::make_shared<GPTBlock>(o)));
  ln_f = register_cell("ln_f", std::make_shared<LayerNorm>(o.n_embd, 1e-5));
}

Tensor GPT::embed(const Tensor& idx, int64_t first_position) {
  DEMI_CHECK(idx.rank() == 2 && (idx.dtype() == DType::kI32 || idx.dtype() == DType::kI64),
             "expected token ids (B, T) int32 or int64, got ", idx.describe());
  const int64_t t = idx.dim(1);
  DEMI_CHECK(t >= 1 && first_position + t <= options.block_size, "a sequence of ", first_position + t,
             " positions is longer than block_size (", options.block_size, ") (ids ", idx.describe(), ")");
  Tensor x = ops::add(wte->call(idx), ops::embedding(positions(first_position, t), wpe));  // (B, T, E) + (T, E)
  return drop ? drop->call(x) : x;
}

Tensor GPT::construct(const Tensor& idx) {
  Tensor x = embed(idx, 0);
  for (auto& block : h) x = block->call(x);
  x = ln_f->call(x);
  const int64_t b = x.dim(0), t = x.dim(1), e = options.n_embd;
  // The output projection is the token embedding (tied): x · wteᵀ.
  Tensor logits = ops::dense(ops::reshape(x, {b * t, e}), wte->embedding_table);
  return ops::reshape(logits, {b, t, options.vocab_size});
}

Tensor GPT::forward_cached(const Tensor& idx, KVCache& cache) {
  if (cache.layers.empty()) {
    cache.layers.resize(h.size());
    cache.batch = idx.dim(0);
    cache.length = 0;
  }
  DEMI_CHECK(idx.rank() == 2 && idx.dim(0) == cache.batch && cache.layers.size() == h.size(),
             "forward_cached: expected ids (", cache.batch, ", T) for a cache of ", cache.layers.size(),
             " layers, got ", idx.describe());
  Tensor x = embed(idx, cache.length);
  for (size_t i = 0; i < h.size(); ++i) x = h[i]->forward_cached(x, cache.layers[i], cache.length);
  cache.length += idx.dim(1);
  x = ln_f->call(x);
  const int64_t b = x.dim(0), t = x.dim(1), e = options.n_embd;
  return ops::reshape(ops::dense(ops::reshape(x, {b * t, e}), wte->embedding_table), {b, t, options.vocab_size});
}

std::vector<int32_t> GPT::generate(const std::vector<int32_t>& prompt, const SampleOptions& so, Generator& gen) {
  DEMI_CHECK(!prompt.empty(), "GPT::generate: the prompt must hold at least one token");
  DEMI_CHECK(so.temperature > 0 && std::isfinite(so.temperature), "GPT::generate: temperature must be > 0, got ",
             so.temperature);
  DEMI_CHECK(so.max_new_tokens >= 0, "GPT::generate: max_new_tokens must be >= 0, got ", so.max_new_tokens);
  for (int32_t id : prompt)
    DEMI_CHECK(id >= 0 && id < options.vocab_size, "GPT::generate: prompt token ", id, " is outside the vocabulary (",
               options.vocab_size, " tokens)");
  const bool was_training = training();
  set_train(false);
  autograd::NoGradGuard no_grad;
  const int64_t block = options.block_size, v = options.vocab_size;
  std::vector<int32_t> text = prompt, out;
  KVCache cache;
  auto last_logits = [&](const Tensor& logits) {
    std::vector<float> all = logits.to(DType::kF32).to_vector();
    return std::vector<float>(all.end() - v, all.end());
  };
  // The prompt's last block_size tokens at once, then one position per token while the context fits.
  auto prefill = [&] {
    cache = KVCache();
    const int64_t from = std::max<int64_t>(0, static_cast<int64_t>(text.size()) - block);
    std::vector<int32_t> window(text.begin() + from, text.end());
    return last_logits(forward_cached(from_vector(window, {1, static_cast<int64_t>(window.size())}), cache));
  };
  std::vector<float> logits = prefill();
  try {
    for (int64_t i = 0; i < so.max_new_tokens; ++i) {
      const int32_t next = sample_token(logits.data(), v, so.temperature, so.top_k, gen);
      if (so.on_token)
        so.on_token(next);
      else
        out.push_back(next);
      text.push_back(next);
      // Only the last block_size tokens are ever read again (prefill's window).
      if (static_cast<int64_t>(text.size()) > 2 * block) text.erase(text.begin(), text.end() - block);
      if (i + 1 == so.max_new_tokens) break;
      if (cache.length < block)
        logits = last_logits(forward_cached(from_vector(std::vector<int32_t>{next}, {1, 1}), cache));
      else
        logits = prefill();  // the window slides: positions shift, so the cache starts again
    }
  } catch (...) {
    set_train(was_training);
    throw;
  }
  set_train(was_training);
  return out;
}

int32_t sample_token(const float* logits, int64_t vocab_size, double temperature, int64_t top_k, Generator& gen) {
  DEMI_CHECK(vocab_size >= 1 && temperature > 0, "sample_token: vocab_size ", vocab_size, ", temperature ",
             temperature);
  std::vector<double> z(static_cast<size_t>(vocab_size));
  for (int64_t i = 0; i < vocab_size; ++i) {
    DEMI_CHECK(!std::isnan(logits[i]), "sample_token: logit ", i, " is NaN");
    z[static_cast<size_t>(i)] = static_cast<double>(logits[i]) / temperature;
  }
  double cut = -INFINITY;
  if (top_k > 0 && top_k < vocab_size) {
    std::vector<double> sorted = z;
    std::nth_element(sorted.begin(), sorted.begin() + (top_k - 1), sorted.end(), std::greater<>());
    cut = sorted[static_cast<size_t>(top_k - 1)];
  }
  const double m = *std::max_element(z.begin(), z.end());
  double sum = 0;
  for (double& x : z) {
    x = x >= cut ? std::exp(x - m) : 0.0;
    sum += x;
  }
  double u = gen.next_double() * sum;
  for (int64_t i = 0; i < vocab_size; ++i) {
    u -= z[static_cast<size_t>(i)];
    if (u < 0) return static_cast<int32_t>(i);
  }
  for (int64_t i = vocab_size - 1; i >= 0; --i)  // rounding left u >= 0: the last token with mass
    if (z[static_cast<size_t>(i)] > 0) return static_cast<int32_t>(i);
  return 0;
}

}  // namespace demi::nn
