#include "demi/kernels/onednn/dense.h"

#include <algorithm>
#include <string>
#include <unordered_map>

#include "demi/core/convert.h"
#include "demi/core/cpu.h"
#include "demi/core/error.h"
#include "demi/core/parallel.h"
#include "demi/kernels/internal/choice_cache.h"
#include "demi/kernels/matmul_params.h"
#include "demi/kernels/onednn/internal/onednn_util.h"
#include "demi/kernels/matmul.h"
#include "demi/kernels/onednn/primitive_cache.h"
#include "demi/kernels/reference/matmul.h"

namespace demi::kernels::onednn {

void dense_forward(const DenseParams& p, const void* x, const void* w, const void* bias, void* y,
                   const void* residual) {
  MatmulParams mp;
  mp.m = p.m;
  mp.n = p.n;
  mp.k = p.k;
  mp.trans_b = true;
  mp.a_dtype = p.x_dtype;
  mp.a_round = p.x_round;
  mp.b_dtype = p.w_dtype;
  mp.b_round = p.w_round;
  mp.c_dtype = p.y_dtype;
  mp.bias = bias;
  mp.bias_dtype = p.bias_dtype;
  mp.relu = p.relu;
  mp.residual = residual;
  kernels::matmul(mp, x, w, y);
}

void dense_backward_data(const DenseParams& p, const void* dy, const void* w, void* dx) {
  DEMI_CHECK(p.x_round == DType::kF32, "Dense: an x read as ", dtype_name(p.x_round), " values (", p.m, " x ", p.k,
             ") has no data gradient here");
  MatmulParams mp;
  mp.m = p.m;
  mp.n = p.k;
  mp.k = p.n;
  mp.a_dtype = p.y_dtype;
  mp.b_dtype = p.w_dtype;
  mp.b_round = p.w_round;
  mp.c_dtype = p.x_dtype;
  mp.accumulate = p.accumulate;
  kernels::matmul(mp, dy, w, dx);
}

namespace {

using dnnl::memory;

struct IpWeightsEntry {
  dnnl::inner_product_backward_weights prim;
  memory::desc x_md, dy_md, dw_md, db_md;
  size_t scratch_bytes = 0;
};

// oneDNN's inner-product weight gradient reads x and dy in their plain row-major layouts and writes dw
// (N, K) and db in one primitive (db from the same pass over dy). It is a candidate (ip_weights_chosen,
// measured per shape) for bf16 x and dy, an f32 or bf16 dw, an f32 or bf16 db or none, and no accumulation
// (the primitive has no sum post-op): on a Zen it won with model D's 4096 rows and lost with model C's 256
// (kernels_bench, same process, best of 3). The primitive writes dw and db in FP32; ip_weights rounds them
// for bf16 ones.
bool ip_weights_applies(const DenseParams& p, const void* db) {
  // (bf16 x and dy, so x is not rounded; where oneDNN has bf16 kernels: an AVX2 CPU has none)
  const bool io = p.x_dtype == DType::kBF16 && p.y_dtype == DType::kBF16 && internal::has_bf16_kernels();
  const bool w = p.w_dtype == DType::kF32 || p.w_dtype == DType::kBF16;
  const bool b = db == nullptr || p.bias_dtype == DType::kF32 || p.bias_dtype == DType::kBF16;
  return io && w && b && !p.accumulate;
}

IpWeightsEntry make_ip_weights(const DenseParams& p, bool with_bias) {
  IpWeightsEntry e;
  const auto dt = internal::to_dnnl(p.x_dtype);
  e.x_md = memory::desc({p.m, p.k}, dt, memory::format_tag::nc);
  e.dy_md = memory::desc({p.m, p.n}, dt, memory::format_tag::nc);
  e.dw_md = memory::desc({p.n, p.k}, memory::data_type::f32, memory::format_tag::oi);
  if (with_bias) e.db_md = memory::desc({p.n}, memory::data_type::f32, memory::format_tag::x);
  memory::desc w_fwd({p.n, p.k}, dt, memory::format_tag::oi);
  dnnl::inner_product_forward::primitive_desc hint(
      dnnl::inner_product_forward::desc(dnnl::prop_kind::forward_training, e.x_md, w_fwd, e.db_md, e.dy_md),
      internal::cpu_engine());
  dnnl::inner_product_backward_weights::primitive_desc pd(
      dnnl::inner_product_backward_weights::desc(e.x_md, e.dw_md, e.db_md, e.dy_md),
      internal::user_scratchpad_attr(), internal::cpu_engine(), hint);
  e.scratch_bytes = pd.scratchpad_desc().get_size();
  e.prim = dnnl::inner_product_backward_weights(pd);
  return e;
}

void ip_backward_weights(const DenseParams& p, const void* x, const void* dy, void* dw, void* db) {
  static auto& cache = *new internal::PrimitiveCache<5, IpWeightsEntry>;  // never destroyed, as the engine
  internal::PrimitiveKey<5> key{{p.m, p.n, p.k, static_cast<int64_t>(p.x_dtype), db != nullptr}};
  auto entry = cache.get(key, [&] { return make_ip_weights(p, db != nullptr); });
  internal::CallContext ctx(entry->scratch_bytes);
  std::unordered_map<int, memory> args{{DNNL_ARG_SRC, internal::make_memory(entry->x_md, x)},
                                       {DNNL_ARG_DIFF_DST, internal::make_memory(entry->dy_md, dy)},
                                       {DNNL_ARG_DIFF_WEIGHTS, internal::make_memory(entry->dw_md, dw)}};
  if (db) args.emplace(DNNL_ARG_DIFF_BIAS, internal::make_memory(entry->db_md, db));
  ctx.execute(entry->prim, std::move(args));
}

template <typename T>
void store(const float* acc, T* dst, int64_t n, bool accumulate) {
  for (int64_t j = 0; j < n; ++j) {
    float v = acc[j];
    if (accumulate) v += static_cast<float>(dst[j]);
    dst[j] = T(v);
  }
}

// n f32 sums into db (f32, bf16 or f16), or added to what it holds.
void store_sums(const float* sums, void* db, DType db_dtype, int64_t n, bool accumulate) {
  switch (db_dtype) {
    case DType::kF32: return store(sums, static_cast<float*>(db), n, accumulate);
    case DType::kBF16: return store(sums, static_cast<BFloat16*>(db), n, accumulate);
    default: return store(sums, static_cast<Half*>(db), n, accumulate);
  }
}

}  // namespace

namespace {

// The inner-product primitive's weight gradient: FP32 dW and db; a bf16 one (AMP's low-precision parameter
// gradients) is those sums rounded once, from one layer's workspace (the primitive's own bf16 outputs
// measured slower per call on model D's layers; `demi train --profile` times the layers' backward).
void ip_weights(const DenseParams& p, const void* x, const void* dy, void* dw, void* db) {
  try {
    const bool w32 = p.w_dtype == DType::kF32, b32 = db == nullptr || p.bias_dtype == DType::kF32;
    internal::Workspace dw_ws(w32 ? 0 : static_cast<size_t>(p.n * p.k) * sizeof(float)),
        db_ws(b32 ? 0 : static_cast<size_t>(p.n) * sizeof(float));
    ip_backward_weights(p, x, dy, w32 ? dw : dw_ws.get(), b32 ? db : db_ws.get());
    if (!w32) convert(dw_ws.get(), DType::kF32, dw, p.w_dtype, p.n * p.k);
    if (!b32) convert(db_ws.get(), DType::kF32, db, p.bias_dtype, p.n);
  } catch (const dnnl::error& e) {
    DEMI_ASSERT(false, "oneDNN failed in the Dense weight gradient (", p.m, "x", p.k, " -> ", p.n, ", ",
                dtype_name(p.x_dtype), "): ", e.what());
  }
}

// The weight gradient as the product dy^T x (whichever kernel matmul.h chose for it), db from the product's
// pass over dy (MatmulParams::a_row_sums: demi's GEMM sums the blocks of dy it packs), the same f32 sums
// bias_grad takes, then stored (or accumulated) in db's dtype.
void product_weights(const DenseParams& p, MatmulParams mp, const void* x, const void* dy, void* dw, void* db) {
  if (p.y_dtype == DType::kF64) {  // (the reference kernels)
    kernels::matmul(mp, dy, x, dw);
    if (db) bias_grad(dy, p.y_dtype, p.m, p.n, db, p.bias_dtype, p.accumulate);
    return;
  }
  DEMI_CHECK(db == nullptr || p.bias_dtype == DType::kF32 || p.bias_dtype == DType::kBF16 ||
                 p.bias_dtype == DType::kF16,
             "Dense: a bias gradient in float32, bfloat16 or float16 only, got ", dtype_name(p.bias_dtype));
  internal::Workspace db_sums(db ? static_cast<size_t>(p.n) * sizeof(float) : 0);
  mp.a_row_sums = db ? static_cast<float*>(db_sums.get()) : nullptr;
  kernels::matmul(mp, dy, x, dw);
  if (db) store_sums(static_cast<const float*>(db_sums.get()), db, p.bias_dtype, p.n, p.accumulate);
}

MatmulParams weights_product(const DenseParams& p) {
  MatmulParams mp;
  mp.m = p.n;
  mp.n = p.k;
  mp.k = p.m;
  mp.trans_a = true;  // dy stored (M, N), read as dy^T (N, M)
  mp.a_dtype = p.y_dtype;
  mp.b_dtype = p.x_dtype;
  mp.b_round = p.x_round;
  mp.c_dtype = p.w_dtype;
  mp.accumulate = p.accumulate;
  return mp;
}

kernels::internal::ChoiceCache& weights_choices() {
  static auto& c =  // never destroyed: used until the process ends
      *new kernels::internal::ChoiceCache("dense-weights-v1", {"onednn-inner-product", "product"});
  return c;
}

// Whether oneDNN's inner-product primitive makes p's weight gradient (where it applies) rather than the
// product: measured per shape on the call's own operands (each candidate writes dw and db; the chosen one
// then makes the call), each priced by its workspace as every choice is. It was a rule measured on a Zen
// (bf16 with 1024 rows or more: the primitive); which primitive oneDNN runs, and how fast, depends on the
// CPU: on an AMX Xeon the matmul of D's weight gradients ran 10-20% faster per call than the inner
// product's, which the product's separate pass for db and the rounding then about evened out.
bool ip_weights_chosen(const DenseParams& p, const void* x, const void* dy, void* dw, void* db) {
  if (!ip_weights_applies(p, db)) return false;
  switch (matmul_policy()) {
    case MatmulPolicy::kDemi: return false;
    case MatmulPolicy::kOnednn: return true;
    case MatmulPolicy::kAuto: break;
  }
  const kernels::internal::ChoiceCache::Key key{
      static_cast<int64_t>(cpu_level()) | int64_t{num_threads()} << 8 | static_cast<int64_t>(p.x_dtype) << 24 |
          static_cast<int64_t>(p.y_dtype) << 32 | static_cast<int64_t>(p.w_dtype) << 40 |
          static_cast<int64_t>(db ? p.bias_dtype : DType::kF64) << 48,
      p.m, p.n, p.k};
  auto text = [&] {
    return str_cat(cpu_level_name(cpu_level()), " t", num_threads(), " ", p.m, "x", p.k, "->", p.n, " x ",
                   dtype_name(p.x_dtype), " dy ", dtype_name(p.y_dtype), " dw ", dtype_name(p.w_dtype),
                   db ? str_cat(" db ", dtype_name(p.bias_dtype)) : std::string());
  };
  const int64_t footprint = p.m * (p.k + p.n) * static_cast<int64_t>(dtype_size(p.x_dtype)) +
                            p.n * p.k * static_cast<int64_t>(dtype_size(p.w_dtype));
  return weights_choices().choose(key, text, [&] {
           // (the product's own kernel choice made first, so that its tuning is not timed or priced here)
           product_weights(p, weights_product(p), x, dy, dw, db);
           return internal::demi_measures_faster(
               [&](bool product) {
                 product ? product_weights(p, weights_product(p), x, dy, dw, db) : ip_weights(p, x, dy, dw, db);
               },
               footprint);
         }) == 0;
}

}  // namespace

void dense_backward_weights(const DenseParams& p, const void* x, const void* dy, void* dw, void* db) {
  if (ip_weights_chosen(p, x, dy, dw, db)) return ip_weights(p, x, dy, dw, db);
  product_weights(p, weights_product(p), x, dy, dw, db);
}

std::string dense_backward_weights_kernel(const DenseParams& p, bool with_bias) {
  DEMI_CHECK(p.m >= 1 && p.k >= 1 && p.n >= 1, "Dense weight gradient: sizes must be positive, got ", p.m, "x",
             p.k, " -> ", p.n);
  auto zeroed = [](int64_t n, DType t) { return internal::zeroed(static_cast<size_t>(n) * dtype_size(t)); };
  internal::Workspace x = zeroed(p.m * p.k, p.x_dtype), dy = zeroed(p.m * p.n, p.y_dtype),
                      dw = zeroed(p.n * p.k, p.w_dtype), db = zeroed(p.n, p.bias_dtype);
  if (ip_weights_chosen(p, x.get(), dy.get(), dw.get(), with_bias ? db.get() : nullptr))
    return "onednn-inner-product";
  return str_cat("product (", matmul_kernel(weights_product(p)), ")");
}

std::string dense_weights_cache_path() { return weights_choices().path(); }
void set_dense_weights_cache_dir(const std::string& dir) { weights_choices().set_dir(dir); }

namespace {

constexpr int64_t kColBlock = 256;  // columns per task: a 1 KiB f32 accumulator, whole cache lines of dy

}  // namespace

void bias_grad(const void* dy, DType dy_dtype, int64_t rows, int64_t cols, void* db, DType db_dtype,
               bool accumulate) {
  DEMI_CHECK(rows >= 1 && cols >= 1, "bias_grad: sizes must be positive, got dy(", rows, ", ", cols, ")");
  auto low_or_f32 = [](DType t) { return t == DType::kF32 || t == DType::kBF16 || t == DType::kF16; };
  if (dy_dtype == DType::kF64 || db_dtype == DType::kF64) {
    return ref::bias_grad(dy, dy_dtype, rows, cols, db, db_dtype, accumulate);
  }
  DEMI_CHECK(low_or_f32(dy_dtype) && low_or_f32(db_dtype),
             "bias_grad: expected float32, bfloat16 or float16 ", "for dy and db, got dy ",
             dtype_name(dy_dtype), ", db ", dtype_name(db_dtype));
  const int64_t blocks = (cols + kColBlock - 1) / kColBlock;
  const size_t esize = dtype_size(dy_dtype);
  const demi::internal::ConvertKernels& cvt = demi::internal::convert_kernels(cpu_level());
  // A block is worth a thread when it covers enough elements; grain counts blocks.
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 15) / (rows * kColBlock));
  parallel_for(0, blocks, grain, [&](int64_t b0, int64_t b1) {
    alignas(64) float acc[kColBlock];
    alignas(64) float row[kColBlock];
    for (int64_t blk = b0; blk < b1; ++blk) {
      const int64_t j0 = blk * kColBlock, width = std::min(kColBlock, cols - j0);
      std::fill(acc, acc + width, 0.0f);
      for (int64_t i = 0; i < rows; ++i) {
        const void* src = static_cast<const char*>(dy) + (i * cols + j0) * static_cast<int64_t>(esize);
        const float* r = static_cast<const float*>(src);
        if (dy_dtype == DType::kBF16) {
          cvt.bf16_to_f32(static_cast<const BFloat16*>(src), row, width);
          r = row;
        } else if (dy_dtype == DType::kF16) {
          cvt.f16_to_f32(static_cast<const Half*>(src), row, width);
          r = row;
        }
        for (int64_t j = 0; j < width; ++j) acc[j] += r[j];
      }
      store_sums(acc, static_cast<char*>(db) + j0 * static_cast<int64_t>(dtype_size(db_dtype)), db_dtype, width,
                 accumulate);
    }
  });
}

}  // namespace demi::kernels::onednn
