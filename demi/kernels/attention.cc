#include "demi/kernels/attention.h"

#include <algorithm>
#include <atomic>
#include <functional>
#include <optional>

#include "demi/core/cpu.h"
#include "demi/core/error.h"
#include "demi/core/memory.h"
#include "demi/core/parallel.h"
#include "demi/core/settings.h"
#include "demi/kernels/cpu/attention.h"
#include "demi/kernels/cpu/internal/workspace.h"
#include "demi/kernels/internal/choice_cache.h"
#include "demi/kernels/matmul.h"
#include "demi/kernels/onednn/internal/onednn_util.h"

namespace demi::kernels {
namespace {

using cpu::AttentionProducts;
using cpu_internal::Workspace;

std::atomic<AttentionPolicy>& policy_slot() {
  static std::atomic<AttentionPolicy> p{[] {
    const std::string s = env_choice("DEMI_ATTENTION");
    return s == "tiles" ? AttentionPolicy::kTiles : s == "products" ? AttentionPolicy::kProducts : AttentionPolicy::kAuto;
  }()};
  return p;
}

internal::ChoiceCache& choices() {
  static auto& c = *new internal::ChoiceCache("attention-v1", {"products", "tiles"});  // never destroyed
  return c;
}

size_t cells(const AttentionCoreParams& p) { return static_cast<size_t>(p.softmax.numel()); }

// A call's operands: forward q, k, v, mask -> probs, out; backward q, k, v, probs, dout -> dq, dk, dv.
struct Operands {
  const void *q, *k, *v;
  const float* mask;
  void* probs;  // (written by forward, read by backward)
  void* out;
  const void* dout;
  void *dq, *dk, *dv;
};

// The unfused forward: scores = q kᵀ (f32, workspace), probs = their softmax, out = probs v (none where out
// is null).
void products_forward(const AttentionCoreParams& p, const Operands& o) {
  const AttentionProducts pr(p, p.softmax.batch);
  Workspace scores(cells(p) * sizeof(float));
  matmul(pr.scores, o.q, o.k, scores.f32());
  attention_softmax_forward(scores.f32(), DType::kF32, o.mask, p.softmax, o.probs, p.dtype);
  if (o.out != nullptr) matmul(pr.out, o.probs, o.v, o.out);
}

// The unfused backward: dv = pᵀ dO, dp = dO vᵀ (f32), ds (p.dtype), dq = ds k, dk = dsᵀ q.
void products_backward(const AttentionCoreParams& p, const Operands& o) {
  const AttentionProducts pr(p, p.softmax.batch);
  matmul(pr.dv, o.probs, o.dout, o.dv);
  Workspace ds(cells(p) * dtype_size(p.dtype));
  {
    Workspace dp(cells(p) * sizeof(float));
    matmul(pr.dp, o.dout, o.v, dp.f32());
    attention_softmax_backward(o.probs, p.dtype, dp.f32(), DType::kF32, p.softmax, ds.f32());
  }
  matmul(pr.dq, ds.f32(), o.k, o.dq);
  matmul(pr.dk, ds.f32(), o.q, o.dk);
}

// p's forward or backward made one way: the fused kernels (tiles) or the batched products.
void run_way(const AttentionCoreParams& p, bool backward, bool tiles, const Operands& o) {
  if (!backward)
    return tiles ? cpu::attention_tiles_forward(p, o.q, o.k, o.v, o.mask, o.probs, o.out) : products_forward(p, o);
  tiles ? cpu::attention_tiles_backward(p, o.q, o.k, o.v, o.probs, o.dout, o.dq, o.dk, o.dv) : products_backward(p, o);
}

// 1 where run(true) (the fused kernels) is faster than run(false) once each is priced by the memory it
// holds at its peak beyond the other's (all of it: the unfused form's scores are its workspace), against
// the bytes the call's operands and results occupy.
int tiles_measure_faster(const std::function<void(bool)>& run, int64_t footprint) {
  const internal::TwoWays t = internal::time_two_ways(run, std::nullopt);
  const int64_t least = std::min(t.held[0], t.held[1]);
  return internal::priced_seconds(t.seconds[1], t.held[1] - least, footprint, 0.0) <
                 internal::priced_seconds(t.seconds[0], t.held[0] - least, footprint, 0.0)
             ? 1
             : 0;
}

// A choice's key and its line in the file: the shape, the direction and the mask's layout.
internal::ChoiceCache::Key key_of(const AttentionCoreParams& p, bool backward) {
  const AttentionSoftmaxParams& s = p.softmax;
  return {static_cast<int64_t>(cpu_level()) | int64_t{num_threads()} << 8 | int64_t{backward} << 24 |
              int64_t{s.causal} << 25 | int64_t{s.mask_batch_stride != 0} << 26 | int64_t{s.mask_row_stride != 0} << 27 |
              static_cast<int64_t>(p.dtype) << 32,
          s.batch, s.heads, s.rows, s.cols, p.dk, p.dv};
}
std::string text_of(const AttentionCoreParams& p, bool backward) {
  const AttentionSoftmaxParams& s = p.softmax;
  return str_cat(cpu_level_name(cpu_level()), " t", num_threads(), backward ? " bwd" : " fwd", " ", dtype_name(p.dtype), " n", s.batch, " h",
                 s.heads, " ", s.rows, "x", s.cols, " dk", p.dk, " dv", p.dv, s.causal ? " causal" : "",
                 s.mask_batch_stride != 0 ? " mask-batch" : "", s.mask_row_stride != 0 ? " mask-rows" : "");
}

// The policy's word, if it forces one way.
std::optional<bool> forced() {
  switch (policy_slot().load()) {
    case AttentionPolicy::kTiles: return true;
    case AttentionPolicy::kProducts: return false;
    case AttentionPolicy::kAuto: break;
  }
  return std::nullopt;
}

// Whether the fused kernels make p's forward or backward: the policy, else the measured choice (each way
// makes the call on its operands o, which the chosen run then overwrites).
bool tiles_chosen(const AttentionCoreParams& p, bool backward, const Operands& o) {
  auto run = [&](bool tiles) { run_way(p, backward, tiles, o); };
  if (const std::optional<bool> f = forced()) return *f;
  const AttentionSoftmaxParams& s = p.softmax;
  const int64_t footprint =
      static_cast<int64_t>(sizeof(BFloat16)) *
      (s.batch * (s.rows * p.dk + s.cols * p.dk + s.cols * p.dv + s.rows * p.dv) * (backward ? 2 : 1) +
       s.numel());
  return choices().choose(key_of(p, backward), [&] { return text_of(p, backward); }, [&] {
           run(false);  // (the products' own kernel choices made first: not timed or priced here)
           return tiles_measure_faster(run, footprint);
         }) == 1;
}

}  // namespace

bool attention_core_supported(const AttentionCoreParams& p) { return cpu::attention_tiles_supported(p); }

void attention_core_forward(const AttentionCoreParams& p, const void* q, const void* k, const void* v,
                            const float* mask, void* probs, void* out) {
  DEMI_ASSERT(attention_core_supported(p), "attention_core_forward: not supported here");
  const Operands o{q, k, v, mask, probs, out, nullptr, nullptr, nullptr, nullptr};
  run_way(p, false, p.packed_heads || tiles_chosen(p, false, o), o);  // (in place: the caller chose)
}

void attention_core_backward(const AttentionCoreParams& p, const void* q, const void* k, const void* v,
                             const void* probs, const void* dout, void* dq, void* dk, void* dv) {
  DEMI_ASSERT(attention_core_supported(p), "attention_core_backward: not supported here");
  const Operands o{q, k, v, nullptr, const_cast<void*>(probs), nullptr, dout, dq, dk, dv};
  run_way(p, true, p.packed_heads || tiles_chosen(p, true, o), o);
}

void set_attention_policy(AttentionPolicy policy) { policy_slot().store(policy); }
AttentionPolicy attention_policy() { return policy_slot().load(); }
std::string attention_cache_path() { return choices().path(); }
void set_attention_cache_dir(const std::string& dir) { choices().set_dir(dir); }

std::string attention_core_kernel(const AttentionCoreParams& p, bool backward) {
  DEMI_CHECK(attention_core_supported(p) && !p.packed_heads,
             "attention_core_kernel: not a fused attention shape here (or heads in place: ask for them apart)");
  if (const std::optional<bool> f = forced()) return *f ? "tiles" : "products";
  if (const std::optional<int> known = choices().find(key_of(p, backward), [&] { return text_of(p, backward); }))
    return choices().name(*known);
  // Not chosen yet: measured now on zeroed scratch operands — a trial run, counted in no peak (a layer asks
  // in its first forward, inside the training step).
  MemTuningScope trials;
  const AttentionSoftmaxParams& s = p.softmax;
  const int64_t qs = s.batch * s.rows, ks = s.batch * s.cols, c = s.numel();
  // q, k, v, dout, probs, out and the gradients, in p.dtype
  onednn::internal::Workspace ops = onednn::internal::zeroed(
      static_cast<size_t>(2 * (qs + ks) * (p.dk + p.dv) + 2 * c) * dtype_size(p.dtype));
  auto* q = static_cast<BFloat16*>(ops.get());  // (2-byte elements: bf16 or f16)
  BFloat16 *k = q + qs * p.dk, *v = k + ks * p.dk, *dout = v + ks * p.dv, *probs = dout + qs * p.dv, *out = probs + c,
           *dq = out + c, *dk = dq + qs * p.dk, *dv = dk + ks * p.dk;
  // a zeroed mask in p's layout (its layout is part of the choice's key)
  const bool masked = s.mask_batch_stride != 0 || s.mask_row_stride != 0;
  const int64_t mask_elems = (s.batch / s.heads - 1) * s.mask_batch_stride + (s.rows - 1) * s.mask_row_stride + s.cols;
  onednn::internal::Workspace mask = onednn::internal::zeroed(masked ? static_cast<size_t>(mask_elems) * sizeof(float) : 0);
  const bool tiles = tiles_chosen(p, backward,
                                  Operands{q, k, v, static_cast<const float*>(mask.get()), probs, out, dout, dq, dk, dv});
  return tiles ? "tiles" : "products";
}

}  // namespace demi::kernels
