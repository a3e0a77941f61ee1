#include "demi/kernels/onednn/matmul.h"

#include <algorithm>
#include <atomic>
#include <memory>
#include <string>
#include <unordered_map>

#include "demi/core/convert.h"
#include "demi/core/error.h"
#include "demi/kernels/cpu/f16_split.h"
#include "demi/kernels/onednn/internal/onednn_util.h"
#include "demi/kernels/onednn/primitive_cache.h"
#include "demi/kernels/reference/matmul.h"

namespace demi::kernels::onednn {
namespace {

using dnnl::memory;
using internal::CallContext;

struct MatmulEntry {
  dnnl::matmul prim;
  memory::desc a_md, b_md, c_md, bias_md;
  size_t scratch_bytes = 0;
  std::string impl;
};

// Batch 1 runs as a 2-D product (oneDNN's most tuned path); otherwise 3-D with a leading batch dim.
memory::desc plain_md(const MatmulParams& p, int64_t rows, int64_t cols, bool transposed, DType t) {
  memory::dims dims, strides;
  if (p.batch == 1) {
    dims = {rows, cols};
    strides = transposed ? memory::dims{1, rows} : memory::dims{cols, 1};
  } else {
    dims = {p.batch, rows, cols};
    strides = transposed ? memory::dims{rows * cols, 1, rows} : memory::dims{rows * cols, cols, 1};
  }
  return memory::desc(dims, internal::to_dnnl(t), strides);
}

MatmulEntry make_entry(const MatmulParams& p) {
  MatmulEntry e;
  e.a_md = plain_md(p, p.m, p.k, p.trans_a, p.a_dtype);
  e.b_md = plain_md(p, p.k, p.n, p.trans_b, p.b_dtype);
  e.c_md = plain_md(p, p.m, p.n, false, p.c_dtype);
  if (p.bias) {
    memory::dims dims = p.batch == 1 ? memory::dims{1, p.n} : memory::dims{1, 1, p.n};
    e.bias_md = memory::desc(dims, internal::to_dnnl(p.bias_dtype),
                             p.batch == 1 ? memory::format_tag::ab : memory::format_tag::abc);
  }
  dnnl::primitive_attr attr = internal::user_scratchpad_attr();
  dnnl::post_ops ops;
  if (p.accumulate) ops.append_sum(1.0f);
  if (p.relu) ops.append_eltwise(1.0f, dnnl::algorithm::eltwise_relu, 0.0f, 0.0f);
  attr.set_post_ops(ops);
  dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(e.a_md, e.b_md, e.bias_md, e.c_md), attr,
                                  internal::cpu_engine());
  e.scratch_bytes = pd.scratchpad_desc().get_size();
  e.impl = pd.impl_info_str();
  e.prim = dnnl::matmul(pd);
  return e;
}

// q's dtypes are what the primitive sees: a and b equal (f32 or bf16), bias f32 or bf16 (from bf16 only),
// c f32 or bf16 (from bf16 only).
std::shared_ptr<const MatmulEntry> entry_for(const MatmulParams& q) {
  static auto& cache = *new internal::PrimitiveCache<16, MatmulEntry>;  // never destroyed, as the engine
  internal::PrimitiveKey<16> key{{q.batch, q.m, q.n, q.k, q.trans_a, q.trans_b,
                                  static_cast<int64_t>(q.a_dtype), static_cast<int64_t>(q.b_dtype),
                                  static_cast<int64_t>(q.c_dtype), q.accumulate, q.bias != nullptr,
                                  q.bias ? static_cast<int64_t>(q.bias_dtype) : -1, q.relu}};
  return cache.get(key, [&] { return make_entry(q); });
}

// The product as the primitive runs it: operand, bias and output dtypes after conversion (pointers unset).
MatmulParams primitive_params(const MatmulParams& p) {
  MatmulParams q = p;
  auto f16_to_f32 = [](DType t) { return t == DType::kF16 ? DType::kF32 : t; };
  const DType compute = internal::compute_dtype(f16_to_f32(p.a_dtype), f16_to_f32(p.b_dtype));
  q.a_dtype = q.b_dtype = compute;
  if (!(p.bias_dtype == DType::kF32 || (p.bias_dtype == DType::kBF16 && compute == DType::kBF16)))
    q.bias_dtype = DType::kF32;
  q.c_dtype = internal::primitive_out_dtype(compute, p.c_dtype);
  return q;
}

// Runs one product whose operands are f32 or bf16 (equal, or both converted to f32 by the caller) and
// whose output is any of f32|bf16|f16: oneDNN writes f32 or (from bf16) bf16 straight into c, with a sum
// post-op to accumulate; any other output goes through an f32 workspace (pre-filled from c to accumulate).
void matmul_f32_bf16(const MatmulParams& p, const void* a, const void* b, void* c) {
  const int64_t a_numel = p.batch * p.m * p.k, b_numel = p.batch * p.k * p.n, c_numel = p.batch * p.m * p.n;
  const MatmulParams q = primitive_params(p);
  auto entry = entry_for(q);
  CallContext ctx(entry->scratch_bytes);
  // Mixed operands (f32 with bf16) meet in f32.
  if (p.a_dtype != q.a_dtype) a = internal::to_f32(ctx, a, p.a_dtype, a_numel);
  if (p.b_dtype != q.b_dtype) b = internal::to_f32(ctx, b, p.b_dtype, b_numel);
  const void* bias =
      p.bias && p.bias_dtype != q.bias_dtype ? internal::to_f32(ctx, p.bias, p.bias_dtype, p.n) : p.bias;
  void* out = c;
  if (q.c_dtype != p.c_dtype) {
    out = ctx.scratch_buffer(static_cast<size_t>(c_numel) * sizeof(float));
    if (p.accumulate) convert(c, p.c_dtype, out, DType::kF32, c_numel);
  }

  std::unordered_map<int, memory> args{{DNNL_ARG_SRC, internal::make_memory(entry->a_md, a)},
                                       {DNNL_ARG_WEIGHTS, internal::make_memory(entry->b_md, b)},
                                       {DNNL_ARG_DST, internal::make_memory(entry->c_md, out)}};
  if (bias) args.emplace(DNNL_ARG_BIAS, internal::make_memory(entry->bias_md, bias));
  ctx.execute(entry->prim, std::move(args));
  if (out != c) convert(out, DType::kF32, c, p.c_dtype, c_numel);
}

std::atomic<F16Matmul> g_f16_mode{F16Matmul::kAuto};

bool onednn_has_amx() {
  static const bool amx = internal::effective_isa() == dnnl::cpu_isa::avx512_core_amx;
  return amx;
}

// Writes the operand's four segments along K (f16_split.h): a (M, K) or a^T stored (K, M), b (K, N) or
// b^T stored (N, K). K along a stored row: the segments sit side by side in each row (rows of 4K);
// K down the stored rows: the four split copies are stacked (4K rows).
void split_operand(const Half* src, int64_t batch, int64_t stored_rows, int64_t stored_cols, bool k_along_row,
                   unsigned pattern, BFloat16* dst) {
  const int64_t per = stored_rows * stored_cols;
  for (int64_t i = 0; i < batch; ++i) {
    if (k_along_row)
      split_f16_bf16(src + i * per, stored_rows, stored_cols, dst + 4 * i * per, 4 * stored_cols, stored_cols,
                     pattern);
    else
      split_f16_bf16(src + i * per, stored_rows, stored_cols, dst + 4 * i * per, stored_cols, per, pattern);
  }
}

// Rows of an f16 operand prepared at a time: about 2^20 elements (4 MiB of f32), at least 256 rows (fewer
// make the product's own blocking inefficient), so that the workspace stays bounded (model D's 4096 x 1024
// activations: 16 MiB of f32 in one piece otherwise).
std::atomic<int64_t> g_chunk_min_rows{256}, g_chunk_elements{int64_t{1} << 20};

int64_t chunk_rows(int64_t row_len) {
  return std::max<int64_t>(g_chunk_min_rows.load(std::memory_order_relaxed),
                           g_chunk_elements.load(std::memory_order_relaxed) / std::max<int64_t>(1, row_len));
}

// Which operands a product widens to f32: f16 always (oneDNN has no f16 kernels), bf16 too when asked.
struct Widening {
  bool bf16 = false;
  bool operator()(DType t) const { return t == DType::kF16 || (bf16 && t == DType::kBF16); }
  DType as(DType t) const { return (*this)(t) ? DType::kF32 : t; }
};

// An operand as the primitive reads it: passed through, or widened to f32 (into `buf`, reused across
// chunks, or into fresh workspace).
const void* widen(CallContext& ctx, const Widening& wide, const void* src, DType t, int64_t n, float* buf = nullptr) {
  if (!wide(t)) return src;
  if (buf == nullptr) return internal::to_f32(ctx, src, t, n);
  convert(src, t, buf, DType::kF32, n);
  return buf;
}

// a plain (M, K), batch 1: b prepared once (split into [bh; bl; bh; bl], or widened), then a in row chunks,
// each split into [ah ah al al] (four times K) or widened, and multiplied into its rows of c.
void matmul_row_chunks(const MatmulParams& p, const Widening& wide, const void* a, const void* b, void* c, bool split) {
  CallContext ctx(0);
  const int64_t k4 = split ? 4 * p.k : p.k;
  const void* bp = nullptr;
  if (split) {
    auto* b4 = static_cast<BFloat16*>(ctx.scratch_buffer(static_cast<size_t>(4 * p.k * p.n) * sizeof(BFloat16)));
    split_operand(static_cast<const Half*>(b), 1, p.trans_b ? p.n : p.k, p.trans_b ? p.k : p.n, p.trans_b,
                  kSplitRhs, b4);
    bp = b4;
  } else {
    bp = widen(ctx, wide, b, p.b_dtype, p.k * p.n);
  }
  // A low-precision c goes through an f32 chunk of rows too: its width counts (model D's 4096 x 1024
  // data gradient from K = 256 took 16 MiB of f32 output at once).
  const int64_t rows = std::min(p.m, chunk_rows(k4 + (p.c_dtype != DType::kF32 ? p.n : 0)));
  const size_t a_elem = dtype_size(p.a_dtype), c_elem = dtype_size(p.c_dtype);
  void* abuf = split || wide(p.a_dtype)
                   ? ctx.scratch_buffer(static_cast<size_t>(rows * k4) * (split ? sizeof(BFloat16) : sizeof(float)))
                   : nullptr;
  MatmulParams q = p;
  q.k = k4;
  q.a_dtype = split ? DType::kBF16 : wide.as(p.a_dtype);
  q.b_dtype = split ? DType::kBF16 : wide.as(p.b_dtype);
  for (int64_t m0 = 0; m0 < p.m; m0 += rows) {
    q.m = std::min(rows, p.m - m0);
    const void* a_rows = static_cast<const char*>(a) + static_cast<size_t>(m0 * p.k) * a_elem;
    const void* ap = a_rows;
    if (split) {
      split_f16_bf16(static_cast<const Half*>(a_rows), q.m, p.k, static_cast<BFloat16*>(abuf), 4 * p.k, p.k,
                     kSplitLhs);
      ap = abuf;
    } else {
      ap = widen(ctx, wide, a_rows, p.a_dtype, q.m * p.k, static_cast<float*>(abuf));
    }
    matmul_f32_bf16(q, ap, bp, static_cast<char*>(c) + static_cast<size_t>(m0 * p.n) * c_elem);
  }
}

// a^T b with a stored (K, M) and b (K, N), batch 1, f32 c, no bias or ReLU (a weight gradient, K = the
// batch's rows): K in chunks, each pair of row blocks widened and the partial products summed into c by
// the primitive's sum post-op.
void matmul_k_chunks(const MatmulParams& p, const Widening& wide, const void* a, const void* b, void* c) {
  CallContext ctx(0);
  const int64_t rows = std::min(p.k, chunk_rows(std::max(p.m, p.n)));
  float* abuf = wide(p.a_dtype)
                    ? static_cast<float*>(ctx.scratch_buffer(static_cast<size_t>(rows * p.m) * sizeof(float)))
                    : nullptr;
  float* bbuf = wide(p.b_dtype)
                    ? static_cast<float*>(ctx.scratch_buffer(static_cast<size_t>(rows * p.n) * sizeof(float)))
                    : nullptr;
  MatmulParams q = p;
  q.a_dtype = wide.as(p.a_dtype);
  q.b_dtype = wide.as(p.b_dtype);
  for (int64_t k0 = 0; k0 < p.k; k0 += rows) {
    q.k = std::min(rows, p.k - k0);
    q.accumulate = p.accumulate || k0 > 0;
    const void* ap = widen(ctx, wide, static_cast<const char*>(a) + static_cast<size_t>(k0 * p.m) * dtype_size(p.a_dtype),
                           p.a_dtype, q.k * p.m, abuf);
    const void* bp = widen(ctx, wide, static_cast<const char*>(b) + static_cast<size_t>(k0 * p.n) * dtype_size(p.b_dtype),
                           p.b_dtype, q.k * p.n, bbuf);
    matmul_f32_bf16(q, ap, bp, c);
  }
}

// The widening path (f16 operands, and bf16 ones for matmul_widened). Both operands f16 and a product
// worth it: the exact bf16 split on AMX; otherwise the operands widened to f32 and the f32 product. A
// plain a runs in row chunks, a weight gradient (a^T b into f32) in K chunks, anything else (batched, a^T
// with a low-precision output) widened whole. A low-precision output is converted back by matmul_f32_bf16.
void matmul_widening(const MatmulParams& p, const Widening& wide, const void* a, const void* b, void* c) {
  const bool split = f16_matmul_splits(p);
  // A batched product runs in chunks of whole batch entries, each within the chunk target of widened
  // operands (and f32 output): widened whole, the attention's probabilities (model D's backward, pᵀ·dO and
  // dsᵀ·q) took 16 MiB of f32 copies at once, the largest workspace of its O2-bf16 training peak.
  if (p.batch > 1) {
    const int64_t per = (split ? 4 : 1) * (p.m * p.k + p.k * p.n) + (p.c_dtype != DType::kF32 ? p.m * p.n : 0);
    const int64_t target = g_chunk_elements.load(std::memory_order_relaxed);
    const int64_t chunk = std::clamp<int64_t>(target / std::max<int64_t>(1, per), 1, p.batch);
    if (chunk < p.batch) {
      const size_t a_bytes = static_cast<size_t>(p.m * p.k) * dtype_size(p.a_dtype),
                   b_bytes = static_cast<size_t>(p.k * p.n) * dtype_size(p.b_dtype),
                   c_bytes = static_cast<size_t>(p.m * p.n) * dtype_size(p.c_dtype);
      for (int64_t b0 = 0; b0 < p.batch; b0 += chunk) {
        MatmulParams q = p;
        q.batch = std::min(chunk, p.batch - b0);
        matmul_widening(q, wide, static_cast<const char*>(a) + static_cast<size_t>(b0) * a_bytes,
                        static_cast<const char*>(b) + static_cast<size_t>(b0) * b_bytes,
                        static_cast<char*>(c) + static_cast<size_t>(b0) * c_bytes);
      }
      return;
    }
  }
  if (p.batch == 1 && !p.trans_a) return matmul_row_chunks(p, wide, a, b, c, split);
  if (p.batch == 1 && p.trans_a && !p.trans_b && !split && p.c_dtype == DType::kF32 && p.bias == nullptr && !p.relu)
    return matmul_k_chunks(p, wide, a, b, c);
  CallContext ctx(0);
  if (split) {
    const int64_t a_numel = p.batch * p.m * p.k, b_numel = p.batch * p.k * p.n;
    auto* a4 = static_cast<BFloat16*>(ctx.scratch_buffer(static_cast<size_t>(4 * a_numel) * sizeof(BFloat16)));
    auto* b4 = static_cast<BFloat16*>(ctx.scratch_buffer(static_cast<size_t>(4 * b_numel) * sizeof(BFloat16)));
    // a stored (M, K) has K along its rows; a^T stored (K, M) has K down them. b: the other way round.
    split_operand(static_cast<const Half*>(a), p.batch, p.trans_a ? p.k : p.m, p.trans_a ? p.m : p.k, !p.trans_a,
                  kSplitLhs, a4);
    split_operand(static_cast<const Half*>(b), p.batch, p.trans_b ? p.n : p.k, p.trans_b ? p.k : p.n, p.trans_b,
                  kSplitRhs, b4);
    MatmulParams q = p;
    q.k = 4 * p.k;
    q.a_dtype = q.b_dtype = DType::kBF16;
    return matmul_f32_bf16(q, a4, b4, c);
  }
  MatmulParams q = p;
  a = widen(ctx, wide, a, p.a_dtype, p.batch * p.m * p.k);
  b = widen(ctx, wide, b, p.b_dtype, p.batch * p.k * p.n);
  q.a_dtype = wide.as(p.a_dtype);
  q.b_dtype = wide.as(p.b_dtype);
  matmul_f32_bf16(q, a, b, c);
}

}  // namespace

void set_f16_matmul(F16Matmul mode) { g_f16_mode.store(mode); }
void set_f16_matmul_chunking(int64_t min_rows, int64_t target_elements) {
  g_chunk_min_rows.store(std::max<int64_t>(1, min_rows));
  g_chunk_elements.store(std::max<int64_t>(1, target_elements));
}
F16Matmul f16_matmul() { return g_f16_mode.load(); }

bool f16_matmul_splits(const MatmulParams& p) {
  if (p.a_dtype != DType::kF16 || p.b_dtype != DType::kF16) return false;
  switch (g_f16_mode.load(std::memory_order_relaxed)) {
    case F16Matmul::kSplitBf16: return true;
    case F16Matmul::kConvertF32: return false;
    case F16Matmul::kAuto: break;
  }
  // The 4K bf16 product itself runs faster than the f32 one on AMX (model C's and D's shapes), but the
  // split operands are 4x the f16 bytes, written and packed again: end to end (kernels_bench's Dense rows,
  // f16 against f32) it wins only with many rows, a plain a and a short K (model D's K = 256 products),
  // while K = 768-1024 lose, as do model C's 256 rows and weight gradients (a^T). A convert-while-packing
  // GEMM would not pay the 4x traffic.
  return onednn_has_amx() && p.m >= 1024 && p.n >= 32 && p.k <= 512 && !p.trans_a;
}

// oneDNN multiplies f16 values exactly (widened to f32): a product whose f16 values are to be multiplied as
// bf16 (MatmulParams::bf16_products) is demi's pair kernel's, never silently computed the other way.
namespace {
void check_exact(const MatmulParams& p) {
  DEMI_CHECK(!p.bf16_products, "oneDNN's matmul multiplies float16 values exactly; ", describe(p),
             " runs on demi's bfloat16 pair kernel (kernels::matmul)");
  DEMI_CHECK(p.a_round == DType::kF32 && p.b_round == DType::kF32, "oneDNN's matmul reads its operands as stored; ",
             describe(p), " gets rounded copies from kernels::matmul");
  DEMI_CHECK(p.residual == nullptr, "oneDNN's matmul adds no residual; ", describe(p),
             " is accumulated onto a copy of it by kernels::matmul");
}
}  // namespace

void matmul(const MatmulParams& p, const void* a, const void* b, void* c) {
  check_matmul_params(p, "matmul");
  check_exact(p);
  try {
    if (p.c_dtype == DType::kF64) return ref::matmul(p, a, b, c);
    if (p.a_dtype == DType::kF16 || p.b_dtype == DType::kF16) return matmul_widening(p, Widening{}, a, b, c);
    matmul_f32_bf16(p, a, b, c);
  } catch (const dnnl::error& e) {
    DEMI_ASSERT(false, "oneDNN failed in matmul ", describe(p), ": ", e.what());
  }
}

void matmul_widened(const MatmulParams& p, const void* a, const void* b, void* c) {
  check_matmul_params(p, "matmul");
  check_exact(p);
  try {
    if (p.c_dtype == DType::kF64) return ref::matmul(p, a, b, c);
    matmul_widening(p, Widening{.bf16 = true}, a, b, c);
  } catch (const dnnl::error& e) {
    DEMI_ASSERT(false, "oneDNN failed in matmul ", describe(p), ": ", e.what());
  }
}

std::string matmul_implementation(const MatmulParams& p) {
  check_matmul_params(p, "matmul");
  if (p.c_dtype == DType::kF64) return "reference";
  return entry_for(primitive_params(p))->impl;
}

}  // namespace demi::kernels::onednn
