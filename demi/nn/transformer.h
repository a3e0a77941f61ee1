// The Transformer layers, with MindSpore's names and defaults (mindspore.nn 2.x, which follows PyTorch's
// layouts, so checkpoints map name for name): Embedding, LayerNorm, MultiheadAttention,
// TransformerEncoderLayer and TransformerEncoder. Sequences are batch-first, (B, S, E), always (MindSpore and
// PyTorch default to batch_first=False; demi has no sequence-first layout).
//
//   auto layer = [] { return std::make_shared<nn::TransformerEncoderLayer>(256, 4, 1024, 0.0); };
//   nn::TransformerEncoder encoder(layer, 4);
//   Tensor y = encoder(x);                          // x (B, S, 256)
//   Tensor y2 = encoder(x, {}, key_padding_mask);   // (B, S) bool, true = padding
//
// Masks (attn_mask, key_padding_mask) follow PyTorch's meaning: a boolean mask marks with true what may
// NOT be attended to; a floating mask is added to the scores. attn_mask is (Sq, Sk) for every sequence or
// (B, Sq, Sk) per sequence (shared by the heads, unlike PyTorch's per-head (B * H, Sq, Sk));
// key_padding_mask is (B, Sk).
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "demi/core/rng.h"
#include "demi/nn/cell.h"
#include "demi/nn/init.h"
#include "demi/nn/layers.h"

namespace demi::nn {

// MindSpore: nn.Embedding(vocab_size, embedding_size, use_one_hot=False, embedding_table='normal'):
// embedding_table (vocab_size, embedding_size) drawn from Normal(0.01). ids (*) int32|int64 ->
// (*, embedding_size); the table's gradient is dense, summed in FP32.
class Embedding : public Cell {
 public:
  Embedding(int64_t vocab_size, int64_t embedding_size, std::optional<Initializer> embedding_table_init = {});
  Tensor construct(const Tensor& ids) override;
  Tensor embedding_table;
  int64_t vocab_size, embedding_size;
};

// MindSpore: nn.LayerNorm(normalized_shape, begin_norm_axis=-1, begin_params_axis=-1, gamma_init='ones',
// beta_init='zeros', epsilon=1e-7): normalises over the trailing normalized_shape axes; gamma, beta have
// that shape. MindSpore's epsilon default is 1e-7 (PyTorch's 1e-5, which the Transformer layers below pass,
// as MindSpore's own layer_norm_eps does). Statistics are FP32 and LayerNorm is on the AMP black list.
class LayerNorm : public Cell {
 public:
  explicit LayerNorm(std::vector<int64_t> shape, double eps = 1e-7);
  explicit LayerNorm(int64_t normalized_size, double eps = 1e-7)
      : LayerNorm(std::vector<int64_t>{normalized_size}, eps) {}
  Tensor construct(const Tensor& x) override;
  Tensor gamma, beta;
  std::vector<int64_t> normalized_shape;
  double epsilon;
};

// MindSpore: nn.MultiheadAttention(embed_dim, num_heads, dropout=0.0, has_bias=True), PyTorch's layout:
// in_proj_weight (3E, E) packs the q, k, v projections (XavierUniform), in_proj_bias (3E) (zeros),
// out_proj a Dense(E, E) (bias zeros). Returns the attention output only (PyTorch's need_weights=False).
//
// Self-attention (query, key and value the same tensor) runs one (B*S, E) x (E, 3E) product and one
// permutation to split heads; the core is ops::scaled_dot_product_attention: scores and softmax in FP32,
// probabilities and the products in the compute dtype. With dropout > 0 in training the core is composed
// of batch_matmul, softmax and dropout instead (scores then live in the compute dtype).
class MultiheadAttention : public Cell {
 public:
  MultiheadAttention(int64_t embed_dim, int64_t num_heads, double dropout = 0.0, bool has_bias = true);

  using Cell::operator();
  // query (B, Sq, E), key and value (B, Sk, E) -> (B, Sq, E); masks as described at the top of this file.
  Tensor operator()(const Tensor& query, const Tensor& key, const Tensor& value, const Tensor& attn_mask = Tensor(),
                    const Tensor& key_padding_mask = Tensor());
  // residual (B, Sq, E) + operator()(query, key, value, masks), the add in out_proj's product
  // (Dense::call_add: one op, no tensor for the attention's output alone).
  Tensor call_add(const Tensor& query, const Tensor& key, const Tensor& value, const Tensor& attn_mask,
                  const Tensor& key_padding_mask, const Tensor& residual);
  // Self-attention without masks (the Cell interface).
  Tensor construct(const Tensor& x) override;

  Tensor in_proj_weight, in_proj_bias;
  std::shared_ptr<Dense> out_proj;
  int64_t embed_dim, num_heads, head_dim;
  double dropout;
  // Tests: run the composed core (batch_matmul + softmax) even without dropout.
  bool force_composed = false;
  // Backward recomputes the attention probabilities instead of keeping them from the forward
  // (ops::scaled_dot_product_attention's recompute_probs: the same gradients, less memory, more time). The
  // fused core only: with attention dropout in training it is an error.
  bool recompute_probabilities = false;
  Generator& generator() { return gen_; }
  Generator* own_generator() override { return &gen_; }

 private:
  Tensor attend(const Tensor& query, const Tensor& key, const Tensor& value);
  // o (B·Sq, E), the heads merged, through out_proj (adding the pending residual): (B, Sq, E)
  Tensor project_out(const Tensor& o, int64_t b, int64_t sq);
  struct Pending {
    Tensor key, value, attn_mask, key_padding_mask, residual;
  };
  Pending pending_;
  Generator gen_;
};
using MultiHeadAttention = MultiheadAttention;

// The (B, Sq|1, Sk) or (Sq, Sk) additive FP32 mask that ops::scaled_dot_product_attention takes, from the
// layer masks (either may be undefined; both undefined gives undefined). Booleans: true -> -inf.
Tensor additive_attention_mask(const Tensor& attn_mask, const Tensor& key_padding_mask, int64_t batch, int64_t sq,
                               int64_t sk);

// MindSpore: nn.TransformerEncoderLayer(d_model, nhead, dim_feedforward=2048, dropout=0.1, activation='relu',
// layer_norm_eps=1e-5, batch_first=False, norm_first=False); PyTorch's names: self_attn, linear1, linear2,
// norm1, norm2 (dropout cells hold no parameters and exist only when dropout > 0).
//   post-norm: x = norm1(x + sa(x));  x = norm2(x + ff(x))
//   pre-norm:  x = x + sa(norm1(x));  x = x + ff(norm2(x))       ff(x) = linear2(dropout(act(linear1(x))))
// activation "relu" (fused into linear1's product) or "gelu" (exact, erf).
class TransformerEncoderLayer : public Cell {
 public:
  TransformerEncoderLayer(int64_t d_model, int64_t nhead, int64_t dim_feedforward = 2048, double dropout = 0.1,
                          const std::string& activation = "relu", double layer_norm_eps = 1e-5,
                          bool norm_first = false);

  using Cell::operator();
  // src (B, S, d_model) -> (B, S, d_model)
  Tensor operator()(const Tensor& src, const Tensor& src_mask, const Tensor& src_key_padding_mask = Tensor());
  Tensor construct(const Tensor& src) override;

  std::shared_ptr<MultiheadAttention> self_attn;
  std::shared_ptr<Dense> linear1, linear2;
  std::shared_ptr<LayerNorm> norm1, norm2;
  std::shared_ptr<Dropout> dropout, dropout1, dropout2;  // null when dropout == 0
  bool norm_first;

 private:
  // residual + the branch (of x): the add fused into the branch's last product where no dropout follows it.
  Tensor feed_forward_add(const Tensor& x, const Tensor& residual);
  Tensor self_attention_add(const Tensor& x, const Tensor& residual);
  bool gelu_;
  Tensor pending_mask_, pending_padding_;
};

// MindSpore: nn.TransformerEncoder(encoder_layer, num_layers, norm=None). MindSpore and PyTorch deep-copy
// one layer; demi cells are not copyable, so a factory makes each of the num_layers layers ("layers.0",
// ...), followed by the optional final norm ("norm").
class TransformerEncoder : public Cell {
 public:
  TransformerEncoder(const std::function<std::shared_ptr<TransformerEncoderLayer>()>& make_layer, int64_t num_layers,
                     std::shared_ptr<LayerNorm> norm = nullptr);

  using Cell::operator();
  Tensor operator()(const Tensor& src, const Tensor& mask, const Tensor& src_key_padding_mask = Tensor());
  Tensor construct(const Tensor& src) override;

  std::vector<std::shared_ptr<TransformerEncoderLayer>> layers;
  std::shared_ptr<LayerNorm> norm;

 private:
  Tensor pending_mask_, pending_padding_;
};

}  // namespace demi::nn
