// Scaled dot-product attention's core on bf16 or f16 operands where the tile unit is (the amx level): the fused
// kernels (cpu/attention_amx.h: per matrix of the batch on one thread, the scores never in memory) or the
// unfused form (batched products around the softmax kernels, the (N, Sq, Sk) f32 scores and their gradient
// in workspace between them), whichever measured faster at a shape's first call (each priced by the memory
// it holds beyond the other's, as every choice is: kernels/internal/choice_cache.h), per direction, kept
// per shape in memory and in "attention-v1-<cpu>.txt". Both give probs = softmax(scale q kᵀ + mask) and
// out = probs v as ../ops' unfused code does (the same softmax rows; each product's f32 sums as the
// kernel that makes it gives them).
//
// DEMI_ATTENTION=auto|tiles|products (or set_attention_policy) forces one of them.
//
// With p.packed_heads (the heads read and written in place, cpu/attention_amx.h) only the fused kernels
// can run: the caller takes that layout where attention_core_kernel says "tiles" for the same shape with
// the heads apart, both directions (ops::attention_heads_fused), and permutes the heads otherwise.
#pragma once

#include <string>

#include "demi/kernels/cpu/attention_amx.h"

namespace demi::kernels {

using cpu::AttentionCoreParams;

// Whether attention_core_forward / _backward take p: cpu::attention_tiles_supported(p) (p.dtype bf16 or f16).
bool attention_core_supported(const AttentionCoreParams& p);

// probs (N, Sq, Sk) and out (N, Sq, dv) in p.dtype, from q, k, v (p.dtype) and mask (f32 in p.softmax's layout, or
// null); out null: the probabilities alone (backward's recomputation). attention_core_supported(p) holds.
void attention_core_forward(const AttentionCoreParams& p, const void* q, const void* k, const void* v,
                            const float* mask, void* probs, void* out);

// dq, dk, dv (p.dtype) from probs and dout (N, Sq, dv).
void attention_core_backward(const AttentionCoreParams& p, const void* q, const void* k, const void* v,
                             const void* probs, const void* dout, void* dq, void* dk, void* dv);

enum class AttentionPolicy { kAuto, kTiles, kProducts };
void set_attention_policy(AttentionPolicy policy);
AttentionPolicy attention_policy();
std::string attention_cache_path();
void set_attention_cache_dir(const std::string& dir);

// "tiles" or "products" for p's forward (backward = false) or backward, measured now on zeroed scratch
// operands if not yet: for `demi info`, benchmarks and tests.
std::string attention_core_kernel(const AttentionCoreParams& p, bool backward);

}  // namespace demi::kernels
