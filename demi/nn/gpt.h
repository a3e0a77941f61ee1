// GPT: a decoder-only Transformer language model, nanoGPT's (Karpathy) architecture with its names and
// initialisation, so a PyTorch twin maps parameter for parameter (bench/torch_gpt.py):
//
//   idx (B, T) int32|int64 token ids, T <= block_size
//   x = drop(wte(idx) + wpe[0:T])
//   x = x + attn(ln_1(x)); x = x + mlp(ln_2(x))        for each of h.0 .. h.{n_layer-1} (pre-norm)
//   logits = ln_f(x) · wteᵀ                            (B, T, vocab_size): the output projection is the
//                                                       token embedding itself (weight tying)
//
// attn: c_attn Dense(E -> 3E) packs q, k, v; causal multi-head attention through the fused
// ops::scaled_dot_product_attention(causal = true) — the causal mask is applied inside the softmax kernel,
// no (T, T) mask tensor exists, scores and softmax are FP32 at every AMP level; c_proj Dense(E -> E), then
// dropout. mlp: c_fc Dense(E -> 4E), exact (erf) GELU as nanoGPT's (MindSpore's nn.GELU defaults to the
// tanh form), c_proj Dense(4E -> E), dropout. LayerNorms eps 1e-5.
// Initialisation as nanoGPT: every Dense weight and both embeddings Normal(0, 0.02), the residual
// projections (attn.c_proj, mlp.c_proj) Normal(0, 0.02 / sqrt(2 n_layer)), biases zero. Dropout acts on the
// embeddings and the two residual branches (attention probabilities are not dropped: the fused core keeps
// them in the kernel).
//
// Generation (inference, FP32, no autograd) keeps each layer's keys and values (a KV cache): the prompt is
// run once, then each new token costs one position. Sampling is deterministic per seed.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "demi/core/rng.h"
#include "demi/nn/cell.h"
#include "demi/nn/layers.h"
#include "demi/nn/transformer.h"

namespace demi::nn {

struct GPTOptions {
  int64_t vocab_size = 256;
  int64_t block_size = 128;  // the longest context (positions of wpe)
  int64_t n_layer = 4;
  int64_t n_head = 4;
  int64_t n_embd = 256;
  double dropout = 0.0;
  bool bias = true;  // biases in the Dense layers (LayerNorms always have beta)
};

// Each layer's keys and values of the tokens seen so far, (B * n_head, length, head_dim) in the compute dtype.
struct KVCache {
  struct Layer {
    Tensor k, v;
  };
  std::vector<Layer> layers;
  int64_t batch = 0;
  int64_t length = 0;  // positions cached
};

class CausalSelfAttention : public Cell {
 public:
  CausalSelfAttention(const GPTOptions& o);
  // x (B, T, E) -> (B, T, E)
  Tensor construct(const Tensor& x) override;
  // residual + this(x), the add in c_proj's product where no dropout follows it (Dense::call_add).
  Tensor call_add(const Tensor& x, const Tensor& residual);
  // Inference: x (B, Tn, E) holds the next Tn positions; their keys and values are appended to `layer`
  // (which holds `cached` positions) and the queries attend to every cached position and themselves.
  Tensor forward_cached(const Tensor& x, KVCache::Layer& layer, int64_t cached);

  std::shared_ptr<Dense> c_attn, c_proj;
  std::shared_ptr<Dropout> resid_dropout;  // null when dropout == 0
  int64_t n_head, n_embd;
  // Backward recomputes the attention probabilities instead of keeping them (training; see
  // ops::scaled_dot_product_attention's recompute_probs).
  bool recompute_probabilities = false;

 private:
  Tensor residual_;  // set only during call_add
  // qkv (B*T, 3E) -> q, k, v (B*H, T, Dh)
  std::vector<Tensor> split_heads(const Tensor& qkv, int64_t b, int64_t t) const;
  Tensor merge_heads(const Tensor& o, int64_t b, int64_t t) const;
};

class GPTMLP : public Cell {
 public:
  GPTMLP(const GPTOptions& o);
  Tensor construct(const Tensor& x) override;
  // residual + this(x), the add in c_proj's product where no dropout follows it (Dense::call_add).
  Tensor call_add(const Tensor& x, const Tensor& residual);
  std::shared_ptr<Dense> c_fc, c_proj;
  std::shared_ptr<GELU> gelu;
  std::shared_ptr<Dropout> dropout;  // null when dropout == 0

 private:
  Tensor residual_;  // set only during call_add
};

class GPTBlock : public Cell {
 public:
  GPTBlock(const GPTOptions& o);
  Tensor construct(const Tensor& x) override;
  Tensor forward_cached(const Tensor& x, KVCache::Layer& layer, int64_t cached);
  std::shared_ptr<LayerNorm> ln_1, ln_2;
  std::shared_ptr<CausalSelfAttention> attn;
  std::shared_ptr<GPTMLP> mlp;
};

struct SampleOptions {
  int64_t max_new_tokens = 100;
  double temperature = 1.0;  // > 0; logits are divided by it
  int64_t top_k = 0;         // > 0: sample among the k most likely tokens only
  // When set, each token is handed to it as soon as it is sampled (a caller that prints as it goes), and
  // generate() returns no tokens: a long generation then holds only the last block_size tokens.
  std::function<void(int32_t)> on_token;
};

class GPT : public Cell {
 public:
  explicit GPT(const GPTOptions& o = {});
  // idx (B, T) -> logits (B, T, vocab_size)
  Tensor construct(const Tensor& idx) override;

  // Samples max_new_tokens after `prompt` (ids; non-empty) and returns them (the prompt not included).
  // FP32, eval mode, no autograd, KV-cached; the context is the last block_size tokens (once the text is
  // longer, each new token re-reads that window, as nanoGPT's generate does). Restores training mode.
  std::vector<int32_t> generate(const std::vector<int32_t>& prompt, const SampleOptions& options, Generator& gen);
  // The logits (B, Tn, vocab_size) of the next Tn positions, appending them to `cache` (inference).
  Tensor forward_cached(const Tensor& idx, KVCache& cache);

  GPTOptions options;
  std::shared_ptr<Embedding> wte;
  Tensor wpe;
  std::shared_ptr<Dropout> drop;  // null when dropout == 0
  std::vector<std::shared_ptr<GPTBlock>> h;
  std::shared_ptr<LayerNorm> ln_f;

 private:
  Tensor embed(const Tensor& idx, int64_t first_position);
};

// The next token drawn from `logits` (vocab_size values, FP32): softmax(logits / temperature) restricted to
// the top_k largest (ties at the k-th value kept), sampled with one uniform draw from `gen`. temperature > 0.
int32_t sample_token(const float* logits, int64_t vocab_size, double temperature, int64_t top_k, Generator& gen);

}  // namespace demi::nn
