#include "demi/kernels/attention.h"

#include <algorithm>
#include <atomic>
#include <cstring>
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

namespace demi::kernels {
namespace {

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

// One of the batched products, as ops' bmm asks for it (operands in p.dtype, N matrices).
MatmulParams batched(const AttentionCoreParams& p, int64_t m, int64_t n, int64_t k, bool ta, bool tb, DType c) {
  MatmulParams mp;
  mp.batch = p.softmax.batch;
  mp.m = m;
  mp.n = n;
  mp.k = k;
  mp.trans_a = ta;
  mp.trans_b = tb;
  mp.a_dtype = mp.b_dtype = p.dtype;
  mp.c_dtype = c;
  return mp;
}

size_t cells(const AttentionCoreParams& p) { return static_cast<size_t>(p.softmax.numel()); }

// The unfused forward: scores = q kᵀ (f32, workspace), probs = their softmax, out = probs v (none where out
// is null).
void products_forward(const AttentionCoreParams& p, const void* q, const void* k, const void* v, const float* mask,
                      void* probs, void* out) {
  const int64_t sq = p.softmax.rows, sk = p.softmax.cols;
  Workspace scores(cells(p) * sizeof(float));
  matmul(batched(p, sq, sk, p.dk, false, true, DType::kF32), q, k, scores.f32());
  attention_softmax_forward(scores.f32(), DType::kF32, mask, p.softmax, probs, p.dtype);
  if (out != nullptr) matmul(batched(p, sq, p.dv, sk, false, false, p.dtype), probs, v, out);
}

// The unfused backward: dv = pᵀ dO, dp = dO vᵀ (f32), ds (p.dtype), dq = ds k, dk = dsᵀ q.
void products_backward(const AttentionCoreParams& p, const void* q, const void* k, const void* v, const void* probs,
                       const void* dout, void* dq, void* dk, void* dv) {
  const int64_t sq = p.softmax.rows, sk = p.softmax.cols;
  const DType t = p.dtype;
  matmul(batched(p, sk, p.dv, sq, true, false, t), probs, dout, dv);
  Workspace ds(cells(p) * dtype_size(t));
  {
    Workspace dp(cells(p) * sizeof(float));
    matmul(batched(p, sq, sk, p.dv, false, true, DType::kF32), dout, v, dp.f32());
    attention_softmax_backward(probs, t, dp.f32(), DType::kF32, p.softmax, ds.f32());
  }
  matmul(batched(p, sq, p.dk, sk, false, false, t), ds.f32(), k, dq);
  matmul(batched(p, sk, p.dk, sq, true, false, t), ds.f32(), q, dk);
}

// 1 where run(true) (the fused kernels) is faster than run(false) once each is priced by the memory it
// holds at its peak beyond the other's (all of it: the unfused form's scores are its workspace), against
// the bytes the call's operands and results occupy.
int tiles_measure_faster(const std::function<void(bool)>& run, int64_t footprint) {
  double warm = 0;
  int64_t held[2] = {0, 0};
  for (int i = 0; i < 2; ++i) {
    const int64_t before = mem_stats().total_current;
    ScopedPeak peak;
    warm += internal::seconds_of([&] { run(i == 1); });
    held[i] = peak.peak().total_peak - before;
  }
  const int reps = std::clamp(static_cast<int>(2e-3 / std::max(warm, 1e-9)), 1, 20);
  double best[2] = {1e30, 1e30};
  for (int r = 0; r < 5; ++r)
    for (int i = 0; i < 2; ++i) best[i] = std::min(best[i], internal::seconds_of([&] { run(i == 1); }, reps));
  const int64_t least = std::min(held[0], held[1]);
  const double priced[2] = {internal::priced_seconds(best[0], held[0] - least, footprint, 0.0),
                            internal::priced_seconds(best[1], held[1] - least, footprint, 0.0)};
  return priced[1] < priced[0] ? 1 : 0;
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

// Whether the fused kernels make p's forward or backward: the policy, else the measured choice (run(tiles)
// makes the call one way or the other on its own operands, which the chosen run then overwrites).
bool tiles_chosen(const AttentionCoreParams& p, bool backward, const std::function<void(bool)>& run) {
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
  if (p.packed_heads) return cpu::attention_tiles_forward(p, q, k, v, mask, probs, out);  // (the caller chose)
  auto run = [&](bool tiles) {
    tiles ? cpu::attention_tiles_forward(p, q, k, v, mask, probs, out)
          : products_forward(p, q, k, v, mask, probs, out);
  };
  run(tiles_chosen(p, false, run));
}

void attention_core_backward(const AttentionCoreParams& p, const void* q, const void* k, const void* v,
                             const void* probs, const void* dout, void* dq, void* dk, void* dv) {
  DEMI_ASSERT(attention_core_supported(p), "attention_core_backward: not supported here");
  if (p.packed_heads) return cpu::attention_tiles_backward(p, q, k, v, probs, dout, dq, dk, dv);
  auto run = [&](bool tiles) {
    tiles ? cpu::attention_tiles_backward(p, q, k, v, probs, dout, dq, dk, dv)
          : products_backward(p, q, k, v, probs, dout, dq, dk, dv);
  };
  run(tiles_chosen(p, true, run));
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
  const size_t qk = static_cast<size_t>(s.batch * (s.rows + s.cols) * p.dk),
               vo = static_cast<size_t>(s.batch * (s.cols + s.rows) * p.dv), bytes = (2 * (qk + vo) + 2 * cells(p)) * sizeof(BFloat16);
  Workspace ops(bytes);  // q, k, v, dout, probs and every output
  std::memset(ops.f32(), 0, bytes);
  auto* base = reinterpret_cast<BFloat16*>(ops.f32());
  BFloat16 *q = base, *k = q + s.batch * s.rows * p.dk, *v = k + s.batch * s.cols * p.dk,
           *dout = v + s.batch * s.cols * p.dv, *probs = dout + s.batch * s.rows * p.dv, *out = probs + cells(p),
           *dq = out + cells(p), *dk = dq + s.batch * s.rows * p.dk, *dv = dk + s.batch * s.cols * p.dk;
  // a zeroed mask in p's layout (its layout is part of the choice's key)
  const bool masked = s.mask_batch_stride != 0 || s.mask_row_stride != 0;
  const int64_t mask_elems = (s.batch / s.heads - 1) * s.mask_batch_stride + (s.rows - 1) * s.mask_row_stride + s.cols;
  Workspace mask(masked ? static_cast<size_t>(mask_elems) * sizeof(float) : 0);
  if (masked) std::memset(mask.f32(), 0, static_cast<size_t>(mask_elems) * sizeof(float));
  bool tiles = false;
  if (!backward) {
    auto run = [&](bool t) {
      t ? cpu::attention_tiles_forward(p, q, k, v, mask.f32(), probs, out)
        : products_forward(p, q, k, v, mask.f32(), probs, out);
    };
    tiles = tiles_chosen(p, false, run);
  } else {
    auto run = [&](bool t) {
      t ? cpu::attention_tiles_backward(p, q, k, v, probs, dout, dq, dk, dv)
        : products_backward(p, q, k, v, probs, dout, dq, dk, dv);
    };
    tiles = tiles_chosen(p, true, run);
  }
  return tiles ? "tiles" : "products";
}

}  // namespace demi::kernels
