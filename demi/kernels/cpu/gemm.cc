#include "demi/kernels/cpu/gemm.h"
#include "demi/core/settings.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "demi/core/convert.h"
#include "demi/core/cpu.h"
#include "demi/core/error.h"
#include "demi/core/parallel.h"
#include "demi/kernels/cpu/internal/dispatch.h"
#include "demi/kernels/cpu/internal/gemm_kernels.h"
#include "demi/kernels/cpu/internal/workspace.h"

namespace demi::kernels {
namespace cpu_internal {
namespace {

// The portable variant: a 4 x 16 tile in plain loops (the compiler vectorizes what it can), packing by
// the scalar conversions. The fallback for CPUs without AVX2, and the reference for the tile logic.
constexpr int kScalarMr = 4, kScalarNr = 16;

float to_float(const void* p, DType t, int64_t i) {
  switch (t) {
    case DType::kBF16: return static_cast<float>(static_cast<const BFloat16*>(p)[i]);
    case DType::kF16: return static_cast<float>(static_cast<const Half*>(p)[i]);
    default: return static_cast<const float*>(p)[i];
  }
}

void store_scalar(const float (&acc)[kScalarMr][kScalarNr], const GemmTile& t) {
  for (int r = 0; r < t.m; ++r)
    for (int j = 0; j < t.n; ++j) {
      const int64_t i = t.transposed ? j * t.ldc + r : r * t.ldc + j;
      float v = acc[r][j];
      if (t.load_c) v += to_float(load_source(t), t.c_dtype, i);
      if (t.bias) v += t.bias[t.bias_rows ? r : j];
      if (t.relu) v = std::max(v, 0.0f);
      switch (t.c_dtype) {
        case DType::kBF16: static_cast<BFloat16*>(t.c)[i] = BFloat16(v); break;
        case DType::kF16: static_cast<Half*>(t.c)[i] = Half(v); break;
        default: static_cast<float*>(t.c)[i] = v; break;
      }
    }
}

void ukr_f32_scalar(int64_t kc, const float* a, int64_t rs, int64_t cs, const float* b, const GemmTile& t) {
  float acc[kScalarMr][kScalarNr] = {};
  for (int64_t k = 0; k < kc; ++k, a += cs, b += kScalarNr)
    for (int r = 0; r < kScalarMr; ++r) {
      const float x = a[std::min(r, t.m - 1) * rs];
      for (int j = 0; j < kScalarNr; ++j) acc[r][j] += x * b[j];
    }
  store_scalar(acc, t);
}

void pack_b_f32_scalar(const void* b, DType t, bool trans, int64_t ld, int64_t k0, int64_t kc, int64_t j0,
                       int64_t nc, float* dst, int64_t stride) {
  for (int64_t pn = 0; pn * kScalarNr < nc; ++pn)
    for (int64_t k = 0; k < kc; ++k)
      for (int64_t jj = 0; jj < kScalarNr; ++jj) {
        const int64_t j = pn * kScalarNr + jj;
        dst[pn * stride + k * kScalarNr + jj] =
            j < nc ? to_float(b, t, trans ? (j0 + j) * ld + k0 + k : (k0 + k) * ld + j0 + j) : 0.0f;
      }
}

void to_f32_scalar(const void* src, DType t, int64_t sld, int64_t rows, int64_t cols, float* dst, int64_t dld) {
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) dst[i * dld + j] = to_float(src, t, i * sld + j);
}

}  // namespace

const GemmKernels& gemm_kernels_scalar() {
  static const GemmKernels k = [] {
    GemmKernels g;
    g.name = "scalar";
    g.mr = kScalarMr;
    g.nr = kScalarNr;
    g.f32 = ukr_f32_scalar;
    g.pack_b_f32 = pack_b_f32_scalar;
    g.to_f32 = to_f32_scalar;
    return g;
  }();
  return k;
}

const GemmKernels& gemm_kernels() {
  static const KernelTable<GemmKernels> table{DEMI_KERNEL_TABLE_ENTRIES(gemm)};
  return table.get();
}

}  // namespace cpu_internal

namespace cpu {
namespace {

using cpu_internal::GemmKernels;
using cpu_internal::GemmTile;
using cpu_internal::element_at;
using cpu_internal::PartScratch;
using cpu_internal::Workspace;
using cpu_internal::bytes64;
using cpu_internal::for_each_part;

const GemmKernels& kernels() { return cpu_internal::gemm_kernels(); }

GemmBlocking blocking_from_env() {
  GemmBlocking b;
  if (const std::optional<std::string> value = env_value("DEMI_GEMM_BLOCKING")) {
    const char* s = value->c_str();
    long long mc = 0, kc = 0, nc = 0;
    int end = 0;
    // (A value that is not three positive integers is an error naming the variable, never silently ignored.)
    DEMI_CHECK(std::sscanf(s, "%lld,%lld,%lld%n", &mc, &kc, &nc, &end) == 3 && s[end] == '\0' && mc > 0 && kc > 0 &&
                   nc > 0 && mc <= (1 << 20) && kc <= (1 << 20) && nc <= (1 << 24),
               "DEMI_GEMM_BLOCKING must be MC,KC,NC (three positive integers, e.g. 144,256,2048), got \"", s, "\"");
    b = {mc, kc, nc};
  }
  return b;
}

std::mutex g_blocking_mutex;
GemmBlocking& blocking_slot() {
  static GemmBlocking b = blocking_from_env();
  return b;
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
int64_t round_up(int64_t a, int64_t b) { return ceil_div(a, b) * b; }

// Below this many multiply-adds a product runs on one thread: fork/join would cost more than it saves.
constexpr int64_t kParallelMacs = int64_t{1} << 18;
constexpr int64_t kLongKc = 1024;
// Rows per thread below which a product's threads split its columns rather than its rows: split by
// rows, every thread multiplies every packed panel, half of them packed on the other core (model B's
// 128-row products came clearly closer to oneDNN's rate split by columns than by rows; at 24 rows a
// thread the break-even was not reached). bench/gemm_bench measures demi against oneDNN per shape.
constexpr int64_t kMinRowsPerThread = 100;
constexpr size_t kMaxPanelBytes = size_t{2} << 20;  // the packed panel of b, at most (see product())

// Relative cost of preparing the operands (elements moved, a transposing pack weighted higher): b is
// packed into panels, a copied block by block into compact rows (or columns).
double prepare_cost(bool trans_b, int64_t m, int64_t n, int64_t k) {
  return static_cast<double>(k) * n * (trans_b ? 1.5 : 1.0) + 0.7 * static_cast<double>(k) * m;
}

// Whether computing c^T = op(b)^T op(a)^T (transposed tiles) moves fewer elements than c = op(a) op(b):
// a Dense layer's forward x w^T with fewer rows than outputs packs x instead of the larger weight.
// Not for short K: then the transposed tile stores (a register transpose per 16 columns) cost more than
// the k loop they end, and packing is cheap anyway (model B's 3136 -> 128 backward products, K = 128, ran
// further below oneDNN's rate swapped than unswapped, in every dtype; bench/gemm_bench measures them).
constexpr int64_t kMinSwapK = 256;

bool swap_operands(const MatmulParams& p) {
  return p.k >= kMinSwapK && prepare_cost(!p.trans_a, p.n, p.m, p.k) < 0.9 * prepare_cost(p.trans_b, p.m, p.n, p.k);
}

// An f32 operand read rounded to a low dtype (MatmulParams::a_round, b_round) is rounded as it is packed, with the
// conversions every cast uses (so bit for bit a product of the cast operand): in place in f32 panels and
// blocks (round_f32), or through kRoundRows rows of k at a time on the stack into the bf16 pair packers
// (the bf16 path rounds only to bf16).
constexpr int64_t kRoundRows = 32;      // even: whole pairs
constexpr int64_t kRoundElems = 16384;  // bf16 values staged at a time (32 KiB of stack)
static_assert(kRoundElems % (64 * 32) == 0, "a transposed panel's k steps are whole blocks of 32");

// n values of an operand stored in t (bf16, f16 or f32; an f32 one read as `round`: f32, bf16 or f16) into
// bf16, for the pair kernel: copied, or rounded to bf16 (an f16 value, or one read as f16, by the variant's
// one-pass kernel: MatmulParams::bf16_products). Called on the threads, a row of a block at a time, so the
// conversion kernel is called directly (the bulk conversion would try to split the row across threads).
void to_bf16(const GemmKernels& g, const void* src, DType t, DType round, BFloat16* dst, int64_t n) {
  if (t == DType::kBF16) return static_cast<void>(std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(BFloat16)));
  if (t == DType::kF32 && round != DType::kF16)
    return internal::convert_kernels(cpu_level()).f32_to_bf16(static_cast<const float*>(src), dst, n);
  g.f16_to_bf16(src, t, dst, n);
}

// MatmulParams::a_row_sums from what the product packs: each sum takes its row's values k ascending, across
// K blocks too (the blocks come in k order), so the sums are the plain f32 sums whatever the blocking.
// rows x kc of a as the f32 micro-kernel reads it: a(r, k) = p[r * rs + k * cs].
void add_row_sums(const float* p, int64_t rs, int64_t cs, int64_t rows, int64_t kc, float* sums) {
  if (rs == 1) {  // columns of k (a transposed a's block): vector adds across the rows
    for (int64_t k = 0; k < kc; ++k)
      for (int64_t r = 0; r < rows; ++r) sums[r] += p[k * cs + r];
    return;
  }
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t k = 0; k < kc; ++k) sums[r] += p[r * rs + k * cs];
}
// The same as the pair kernel reads it: a(r, k) = p[r * rs + (k / 2) * cs + k % 2].
void add_row_sums(const BFloat16* p, int64_t rs, int64_t cs, int64_t rows, int64_t kc, float* sums) {
  for (int64_t k = 0; k < kc; ++k)
    for (int64_t r = 0; r < rows; ++r) sums[r] += static_cast<float>(p[r * rs + (k / 2) * cs + k % 2]);
}
// How one (batch-1) product is computed: which way round, its blocks, and the bytes of scratch it takes,
// all from its parameters and thread count (a product's scratch is taken before it runs, by its caller:
// a batch of products run one per thread takes every thread's at once).
struct Layout {
  bool swapped = false;  // computed as c^T = op(b)^T op(a)^T: tiles stored transposed, bias down their rows
  MatmulParams p;        // as computed (swapped: b's dims and layout as a's and a's as b's); p.a/b_round unused
  // The dtype an f32 operand is read rounded to (kF32: read as stored); swapped, b's is a's.
  DType a_round = DType::kF32, b_round = DType::kF32;
  int threads = 1;
  int64_t kc = 0, kc_pad = 0, nk = 0, nc_max = 0, mc = 0;
  size_t panel_elems = 0, panel_bytes = 0;
  bool staged = false, column_split = false, stage_tiles = false;
  bool a_in_place = false;  // the micro-kernel reads an f32 a's rows where they are (no block of a)
  size_t a_block_bytes = 0, low_bytes = 0;
  // The scratch, one block carved in this order: c staged in f32, the packed panels of b, the block of a
  // the threads share, then each thread's part (its block of a, its staged tiles, its rounding rows).
  size_t stage_bytes = 0, bpack_bytes = 0, ashared_bytes = 0;
  size_t ablock_bytes = 0, cstage_bytes = 0;
  int64_t thread_parts = 1;
  size_t part_bytes() const { return ablock_bytes + cstage_bytes + bytes64(low_bytes); }
  size_t scratch_bytes() const {
    return bytes64(stage_bytes) + bytes64(bpack_bytes) + bytes64(ashared_bytes) +
           static_cast<size_t>(thread_parts) * part_bytes();
  }
};

// `threads`: the threads the product may run on (1 when it runs on one, as one of a batch's).
Layout layout(const MatmulParams& p_in, const GemmKernels& g, bool bf16, int threads_available) {
  Layout L;
  L.swapped = swap_operands(p_in);
  MatmulParams& p = L.p;
  p = p_in;
  L.a_round = p_in.a_round;
  L.b_round = p_in.b_round;
  p.a_round = p.b_round = DType::kF32;
  if (L.swapped) {
    std::swap(p.m, p.n);
    std::swap(p.a_dtype, p.b_dtype);
    std::swap(L.a_round, L.b_round);
    p.trans_a = !p_in.trans_b;
    p.trans_b = !p_in.trans_a;
  }
  const GemmBlocking blk = gemm_blocking();
  const int64_t M = p.m, N = p.n, K = p.k, MR = g.mr, NR = g.nr;
  const int threads = M * N * K >= kParallelMacs ? threads_available : 1;
  L.threads = threads;

  // A bf16|f16 output takes K in one block up to kLongKc, so that it is rounded once without an f32
  // staging buffer (past that it is staged); so does a swapped product, whose transposed tile stores
  // cost more than row stores and are best paid once.
  const int64_t kc_max = p.c_dtype == DType::kF32 && !L.swapped ? blk.kc : std::max(blk.kc, kLongKc);
  L.nk = ceil_div(K, std::max<int64_t>(2, kc_max));
  L.kc = ceil_div(K, L.nk);
  if (bf16 && L.nk > 1) L.kc = round_up(L.kc, 2);  // every block but the last starts at an even k
  // The packed panel of b is workspace, so it is held to kMaxPanelBytes as well as to NC: a product with a
  // long K (a low-precision output takes up to kLongKc in one block) would otherwise pack a whole f32
  // copy of a large b, twice the bytes of the f16|bf16 weight it converts (measured on model C at
  // O2-fp16: a 4 MiB panel was the training peak's largest workspace; 2 MiB ran at the same speed).
  L.kc_pad = round_up(L.kc, 2);
  L.panel_elems = static_cast<size_t>(L.kc_pad * NR);  // per packed panel (bf16 pairs: same count)
  L.panel_bytes = L.panel_elems * (bf16 ? sizeof(BFloat16) : sizeof(float));
  const int64_t nc_cap = std::max<int64_t>(1, static_cast<int64_t>(kMaxPanelBytes / L.panel_bytes)) * NR;
  // A short K packs short panels: NC grows so that a block of b holds about KC x NC elements (fewer
  // column blocks, each a fork and join of the threads: model A's K = 10 and 32 products ran N = 7200 in
  // four blocks), within the panel cap.
  // (Block sizes are positive: set_gemm_blocking checks them; kc_pad >= 2.)
  const int64_t nc_wide = blk.nc * std::max<int64_t>(1, blk.kc / L.kc_pad);
  L.nc_max = std::min(round_up(nc_wide, NR), nc_cap);
  // Row blocks of at most MC, as many as a multiple of the threads (equal shares), each a multiple of MR.
  // Few rows (under kMinRowsPerThread a thread) are not split: the threads split the columns instead,
  // each packing the panels of b it multiplies (see product()).
  const int64_t ic_min = ceil_div(M, std::max<int64_t>(MR, blk.mc));
  const bool split_rows = threads > 1 && M >= threads * kMinRowsPerThread;
  const int64_t ic_target = split_rows ? round_up(ic_min, threads) : ic_min;
  L.mc = round_up(ceil_div(M, ic_target), MR);

  // Several K blocks into a low-precision c: accumulate in f32, round once at the end.
  L.staged = L.nk > 1 && p.c_dtype != DType::kF32;
  L.stage_bytes = L.staged ? static_cast<size_t>(M * N) * sizeof(float) : 0;
  // The packed panels of b: a block's worth, shared by its row blocks; or, where one row block is split by
  // columns, one panel per task, packed just before it is multiplied (each panel is read once: a weight
  // gradient's M = 10 with N = 7200 held a packed copy of all of b, 0.9 MiB at f16 on model A).
  L.column_split = ceil_div(M, L.mc) == 1 && threads > 1;
  L.bpack_bytes =
      static_cast<size_t>(L.column_split ? threads : ceil_div(std::min(N, L.nc_max), NR)) * L.panel_bytes;
  // An f32 a stored by rows and read as stored goes to the micro-kernel in place (rows lda apart); any
  // other a is copied a block at a time into compact rows (or, transposed, columns), converted or rounded
  // on the way. The copy was once kept for every a, since a stride of a multiple of 4 KiB maps a
  // micro-panel's six rows onto one cache set; measured with gemm_bench (demi / oneDNN, three interleaved
  // runs each way), reading in place is as fast or faster on every reference shape, 4 KiB strides included
  // (C's 1024-wide dx, 1024^3), and much faster where a block of a is reused by few panels (B's 128 x 128 x
  // 3136 forward).
  L.a_in_place = !bf16 && !p.trans_a && p.a_dtype == DType::kF32 && L.a_round == DType::kF32;
  L.a_block_bytes = L.a_in_place ? 0
                    : bf16       ? static_cast<size_t>(L.kc_pad * L.mc) * sizeof(BFloat16)
                                 : static_cast<size_t>(L.kc * L.mc) * sizeof(float);
  L.stage_tiles = L.swapped && g.store_f32_transposed != nullptr;
  L.ashared_bytes = L.column_split && N > NR ? L.a_block_bytes : 0;  // the row block the threads share
  // Each thread's part: a block of a (unless the threads share one), the swapped tiles' staging block
  // (cstage), and kRoundRows rows of a transposed f32 a read rounded to bf16. Taken by the workers
  // themselves, the blocks alive at once would depend on whether the threads' parts overlapped in time,
  // and graph mode's recording (the stepping thread's allocations) would miss them.
  L.low_bytes = bf16 && p.trans_a && p.a_dtype != DType::kBF16
                    ? static_cast<size_t>(kRoundRows * L.mc) * sizeof(BFloat16)
                    : 0;
  // (A column block of one panel is not shared: one task multiplies it, with its own block of a.)
  const int64_t last_nc = N - (ceil_div(N, L.nc_max) - 1) * L.nc_max;
  const bool every_block_shared = L.ashared_bytes > 0 && L.nc_max > NR && last_nc > NR;
  L.ablock_bytes = every_block_shared ? 0 : bytes64(L.a_block_bytes);
  L.cstage_bytes = L.stage_tiles ? bytes64(static_cast<size_t>(L.mc * NR) * sizeof(float)) : 0;
  L.thread_parts = in_parallel_region() ? 1 : threads;
  return L;
}

// One (batch-1) product laid out by `L`, in `scratch` (L.scratch_bytes(), 64-byte aligned). bias is f32
// (converted by the caller) or null; c and residual (null, or the matrix added in the store) are p.c_dtype;
// row_sums (null, or the caller's M values): MatmulParams::a_row_sums.
void product(const Layout& L, const GemmKernels& g, bool bf16, const void* a_in, const void* b_in, void* c,
             const void* residual, const float* bias, bool bias_per_row, float* row_sums, char* scratch) {
  const bool swapped = L.swapped;
  const MatmulParams& p = L.p;
  const void* a = swapped ? b_in : a_in;
  const void* b = swapped ? a_in : b_in;
  const DType a_round = L.a_round, b_round = L.b_round;
  const int64_t M = p.m, N = p.n, K = p.k, MR = g.mr, NR = g.nr;
  const int64_t lda = p.trans_a ? M : K, ldb = p.trans_b ? K : N;
  const int64_t ldc = swapped ? M : N;  // c's row stride (c is the caller's (M, N) whichever way it is computed)
  const int threads = L.threads;
  const int64_t kc = L.kc, kc_pad = L.kc_pad, nc_max = L.nc_max, mc = L.mc, thread_parts = L.thread_parts;
  const size_t panel_elems = L.panel_elems, panel_bytes = L.panel_bytes;
  const bool staged = L.staged, stage_tiles = L.stage_tiles;
  // MatmulParams::bf16_products on the f32 path: the f16 values (stored, or an f32 operand read as f16),
  // exact in f32 once converted, are rounded once more, to bf16, in the packed panels and blocks.
  const bool a_to_bf16_f32 = !bf16 && p.bf16_products && (p.a_dtype == DType::kF16 || a_round == DType::kF16);
  const bool b_to_bf16_f32 = !bf16 && p.bf16_products && (p.b_dtype == DType::kF16 || b_round == DType::kF16);

  float* stage = reinterpret_cast<float*>(scratch);
  char* bpack = scratch + bytes64(L.stage_bytes);
  void* ashared = L.ashared_bytes ? bpack + bytes64(L.bpack_bytes) : nullptr;
  char* parts_base = bpack + bytes64(L.bpack_bytes) + bytes64(L.ashared_bytes);
  // Staged, what the sums start from is in the stage: c (accumulate) or the residual, widened. Otherwise the
  // first K block's store reads the residual (GemmTile::src) and the later ones c, which then holds the sums.
  if (staged && (p.accumulate || residual)) convert(residual ? residual : c, p.c_dtype, stage, DType::kF32, M * N);
  void* target = staged ? static_cast<void*>(stage) : c;
  const bool add_residual = residual != nullptr && !staged;
  // The caller's a is this product's a, its row sums taken from the blocks of a (once: in the first column
  // block, by the first task of a row block); swapped, it is b, its sums the packed panels' columns.
  const bool sum_a = row_sums != nullptr && !swapped, sum_b = row_sums != nullptr && swapped;
  if (row_sums != nullptr) std::fill(row_sums, row_sums + (swapped ? N : M), 0.0f);
  const DType target_dtype = staged ? DType::kF32 : p.c_dtype;
  struct PartBuffers {
    void* ablock;
    float* cstage;
    BFloat16* low;
  };
  const auto buffers = [&](int64_t part) {
    char* base = parts_base + static_cast<size_t>(part) * L.part_bytes();
    return PartBuffers{base, reinterpret_cast<float*>(base + L.ablock_bytes),
                       reinterpret_cast<BFloat16*>(base + L.ablock_bytes + L.cstage_bytes)};
  };

  for (int64_t jc = 0; jc < N; jc += nc_max) {
    const int64_t nc = std::min(nc_max, N - jc), panels = ceil_div(nc, NR);
    for (int64_t pc = 0; pc < K; pc += kc) {
      const int64_t kcur = std::min(kc, K - pc);
      const bool first = pc == 0, last = pc + kcur == K;
      char* bp = bpack;
      // Panels [p0, p1) of an f32 b read rounded to b_round.
      const auto pack_rounded = [&](int64_t p0, int64_t p1, char* dst) {
        const int64_t stride = static_cast<int64_t>(panel_elems);
        const auto* src = static_cast<const float*>(b);
        if (!bf16) {  // f32 panels, rounded in place (one pass if their filled parts are contiguous)
          const int64_t j = jc + p0 * NR, w = std::min(N, jc + p1 * NR) - j;
          auto* f = reinterpret_cast<float*>(dst);
          if (b_round == DType::kF16 && g.pack_b_f32_as_f16 != nullptr)
            return g.pack_b_f32_as_f16(src, p.trans_b, ldb, pc, kcur, j, w, f, stride);
          g.pack_b_f32(b, DType::kF32, p.trans_b, ldb, pc, kcur, j, w, f, stride);
          if (kcur * NR == stride) return round_f32(f, f, (p1 - p0) * stride, b_round);
          for (int64_t q = 0; q < p1 - p0; ++q) round_f32(f + q * stride, f + q * stride, kcur * NR, b_round);
          return;
        }
        // bf16 pair panels: rows of k rounded into `low`, then packed into their place (an even k0 starts
        // at pair k0 / 2, element k0 * NR of each panel). Plain b: kRoundRows rows across up to
        // kRoundElems / kRoundRows columns; transposed: one panel's columns, kRoundElems / NR k at a time.
        alignas(64) BFloat16 low[kRoundElems];
        auto* out = reinterpret_cast<BFloat16*>(dst);
        if (!p.trans_b) {
          const int64_t group = std::max<int64_t>(1, kRoundElems / (kRoundRows * NR));  // panels at a time
          for (int64_t q0 = p0; q0 < p1; q0 += group) {
            const int64_t j = jc + q0 * NR, w = std::min(N, jc + std::min(p1, q0 + group) * NR) - j;
            for (int64_t k0 = 0; k0 < kcur; k0 += kRoundRows) {
              const int64_t kk = std::min(kRoundRows, kcur - k0);
              for (int64_t r = 0; r < kk; ++r)
                to_bf16(g, element_at(b, (pc + k0 + r) * ldb + j, p.b_dtype), p.b_dtype, b_round, low + r * w, w);
              g.pack_b_bf16(low, false, w, 0, kk, 0, w, out + (q0 - p0) * stride + k0 * NR, stride);
            }
          }
          return;
        }
        const int64_t kstep = kRoundElems / NR;  // a multiple of 32: whole blocks of the transposing packer
        for (int64_t q = p0; q < p1; ++q) {
          const int64_t j = jc + q * NR, w = std::min(NR, N - j);
          for (int64_t k0 = 0; k0 < kcur; k0 += kstep) {
            const int64_t kk = std::min(kstep, kcur - k0);
            for (int64_t col = 0; col < w; ++col)
              to_bf16(g, element_at(b, (j + col) * ldb + pc + k0, p.b_dtype), p.b_dtype, b_round, low + col * kk, kk);
            g.pack_b_bf16(low, true, kk, 0, kk, 0, w, out + (q - p0) * stride + k0 * NR, stride);
          }
        }
      };
      // Panels [p0, p1) of the block into consecutive panels from dst.
      const auto pack_to = [&](int64_t p0, int64_t p1, char* dst) {
        if (p0 >= p1) return;
        const int64_t stride = static_cast<int64_t>(panel_elems);
        // (An f16 b on the pair kernel, MatmulParams::bf16_products, is rounded to bf16 there too.)
        if (b_round != DType::kF32 || (bf16 && p.b_dtype != DType::kBF16)) {
          pack_rounded(p0, p1, dst);
        } else {
          const int64_t j = jc + p0 * NR, w = std::min(N, jc + p1 * NR) - j;
          if (bf16)
            g.pack_b_bf16(static_cast<const BFloat16*>(b), p.trans_b, ldb, pc, kcur, j, w,
                          reinterpret_cast<BFloat16*>(dst), stride);
          else
            g.pack_b_f32(b, p.b_dtype, p.trans_b, ldb, pc, kcur, j, w, reinterpret_cast<float*>(dst), stride);
        }
        if (sum_b)  // a panel's columns are op(a)'s rows: [k][NR] f32 (rs 1, cs NR) or pairs (rs 2, cs 2 NR)
          for (int64_t q = p0; q < p1; ++q) {
            const int64_t j = jc + q * NR, w = std::min(NR, N - j);
            const char* panel = dst + (q - p0) * static_cast<int64_t>(panel_bytes);
            if (bf16)
              add_row_sums(reinterpret_cast<const BFloat16*>(panel), 2, 2 * NR, w, kcur, row_sums + j);
            else
              add_row_sums(reinterpret_cast<const float*>(panel), 1, NR, w, kcur, row_sums + j);
          }
        if (b_to_bf16_f32)  // f16 values in f32 panels, rounded once more, to bf16
          for (int64_t q = 0; q < p1 - p0; ++q) {
            float* f = reinterpret_cast<float*>(dst) + q * stride;
            round_f32(f, f, kcur * NR, DType::kBF16);
          }
      };
      const auto pack = [&](int64_t p0, int64_t p1) { pack_to(p0, p1, bp + p0 * panel_bytes); };
      const int64_t ic_blocks = ceil_div(M, mc);
      const int64_t n_split = ic_blocks >= threads ? 1 : std::min(panels, ceil_div(threads, ic_blocks));
      const int64_t tasks = ic_blocks * n_split;
      // Rows i0 ... i0 + mcur of a, this K block, into `dst` as the micro-kernel reads them (a_strides):
      // compact rows (or, transposed, columns), converted to f32 or kept bf16 (transposed: in pairs), an f32
      // a read rounded is rounded here. Part `part` of `parts` (rows, or transposed, runs of k) only, so that
      // threads can share one block; `low` holds kRoundRows x mcur bf16 (a transposed a read rounded to bf16).
      const auto prepare_a = [&](int64_t i0, int64_t mcur, void* dst, BFloat16* low, int64_t part, int64_t parts) {
        if (!p.trans_a) {  // rows [r0, r1)
          const int64_t r0 = mcur * part / parts, r1 = mcur * (part + 1) / parts;
          if (bf16) {
            auto* out = static_cast<BFloat16*>(dst);
            for (int64_t i = r0; i < r1; ++i)
              to_bf16(g, element_at(a, (i0 + i) * lda + pc, p.a_dtype), p.a_dtype, a_round, out + i * kc_pad, kcur);
            return;
          }
          float* out = static_cast<float*>(dst) + r0 * kcur;
          g.to_f32(element_at(a, (i0 + r0) * lda + pc, p.a_dtype), p.a_dtype, lda, r1 - r0, kcur, out, kcur);
          if (a_round != DType::kF32) round_f32(out, out, (r1 - r0) * kcur, a_round);
          if (a_to_bf16_f32) round_f32(out, out, (r1 - r0) * kcur, DType::kBF16);
          return;
        }
        // Transposed: runs of k [k0, k1), whole kRoundRows blocks (even: whole pairs) but for the last.
        const int64_t blocks = ceil_div(kcur, kRoundRows);
        const int64_t k0 = blocks * part / parts * kRoundRows;
        const int64_t k1 = std::min(kcur, blocks * (part + 1) / parts * kRoundRows);
        if (k0 >= k1) return;
        if (!bf16) {
          float* out = static_cast<float*>(dst) + k0 * mcur;
          g.to_f32(element_at(a, (pc + k0) * lda + i0, p.a_dtype), p.a_dtype, lda, k1 - k0, mcur, out, mcur);
          if (a_round != DType::kF32) round_f32(out, out, (k1 - k0) * mcur, a_round);
          if (a_to_bf16_f32) round_f32(out, out, (k1 - k0) * mcur, DType::kBF16);
          return;
        }
        auto* out = static_cast<BFloat16*>(dst);  // pairs from an even k: at k * mcur
        if (p.a_dtype == DType::kBF16)
          return g.pack_a_pairs(static_cast<const BFloat16*>(a), lda, pc + k0, k1 - k0, i0, mcur, out + k0 * mcur);
        for (int64_t kb = k0; kb < k1; kb += kRoundRows) {
          const int64_t kk = std::min(kRoundRows, k1 - kb);
          for (int64_t r = 0; r < kk; ++r)
            to_bf16(g, element_at(a, (pc + kb + r) * lda + i0, p.a_dtype), p.a_dtype, a_round, low + r * mcur, mcur);
          g.pack_a_pairs(low, mcur, 0, kk, 0, mcur, out + kb * mcur);
        }
      };
      const auto a_strides = [&](int64_t mcur) -> std::pair<int64_t, int64_t> {
        if (L.a_in_place) return {lda, 1};
        if (bf16) return p.trans_a ? std::pair<int64_t, int64_t>{2, 2 * mcur} : std::pair<int64_t, int64_t>{kc_pad, 2};
        return p.trans_a ? std::pair<int64_t, int64_t>{1, mcur} : std::pair<int64_t, int64_t>{kcur, 1};
      };
      // One row block split by columns: each task packs the panels it alone multiplies, one at a time into
      // its own slot, so a thread reads what it wrote itself while it is in L1 (measured on model A's
      // 7200 -> 10 products: with the threads sharing every packed panel a second thread gained little, far
      // less than oneDNN's did; bench/gemm_bench with --threads 1 and 2 measures the scaling).
      const bool pack_in_task = ic_blocks == 1 && n_split > 1;  // (then column_split: one slot per task)
      if (!pack_in_task) parallel_for(0, panels, threads > 1 ? 1 : panels, pack);
      // Then the tasks share the one row block of a, prepared by all the threads first (each preparing the
      // whole block, the threads did the same work twice: a sizeable share of model B's 128 x 128 x 3136 forward).
      const bool shared_a = pack_in_task && !L.a_in_place;
      if (shared_a)
        for_each_part(thread_parts, thread_parts, [&](int64_t part, int64_t, int64_t) {
          prepare_a(0, M, ashared, buffers(part).low, part, thread_parts);
        });

      for_each_part(std::min(thread_parts, tasks), tasks, [&](int64_t part, int64_t t0, int64_t t1) {
        const PartBuffers own = buffers(part);
        for (int64_t task = t0; task < t1; ++task) {
          const int64_t ib = task / n_split, ns = task % n_split;
          const int64_t i0 = ib * mc, mcur = std::min(mc, M - i0);
          const int64_t pn0 = ns * panels / n_split, pn1 = (ns + 1) * panels / n_split;
          // The block's a: pointer and strides (elements) as the micro-kernel reads it.
          const void* ap = L.a_in_place ? element_at(a, i0 * lda + pc, DType::kF32) : shared_a ? ashared : own.ablock;
          if (!shared_a && !L.a_in_place) prepare_a(i0, mcur, own.ablock, own.low, 0, 1);
          const auto [rs, cs] = a_strides(mcur);
          if (sum_a && jc == 0 && ns == 0) {
            if (bf16)
              add_row_sums(static_cast<const BFloat16*>(ap), rs, cs, mcur, kcur, row_sums + i0);
            else
              add_row_sums(static_cast<const float*>(ap), rs, cs, mcur, kcur, row_sums + i0);
          }
          // The tile of the block's rows ir ... ir + MR against `panel` (set below, per panel).
          const char* panel = nullptr;
          const auto multiply = [&](int64_t ir, const GemmTile& tile) {
            if (bf16)
              g.bf16(kcur, static_cast<const BFloat16*>(ap) + ir * rs, rs, cs,
                     reinterpret_cast<const BFloat16*>(panel), tile);
            else
              g.f32(kcur, static_cast<const float*>(ap) + ir * rs, rs, cs, reinterpret_cast<const float*>(panel),
                    tile);
          };
          for (int64_t pn = pn0; pn < pn1; ++pn) {
            const int64_t j = jc + pn * NR;
            GemmTile t;
            t.ldc = ldc;
            t.c_dtype = target_dtype;
            t.n = static_cast<int>(std::min(NR, N - j));
            t.load_c = p.accumulate || residual != nullptr || !first;
            t.relu = last && p.relu;
            t.transposed = swapped;
            panel = bp + pn * panel_bytes;
            if (pack_in_task) {
              char* slot = bp + ns * static_cast<int64_t>(panel_bytes);
              pack_to(pn, pn + 1, slot);
              panel = slot;
            }
            // Swapped, a panel's tiles are stored as they are (c^T: mc rows, NR columns) into a block, and
            // the block goes to c transposed 16 x 16 in registers, with the epilogue, 16 rows of c at a
            // time. Each tile stored transposed straight into c wrote 6 values into each of NR rows ldc
            // apart (often a multiple of 4 KiB: one cache set), a several times larger share of model C's
            // 256 x 1024 x 1024 forward on one thread than through the block (gemm_bench --threads 1).
            if (stage_tiles) {
              GemmTile s;
              s.ldc = NR;
              s.n = t.n;
              float* block = own.cstage;
              for (int64_t ir = 0; ir < mcur; ir += MR) {
                s.m = static_cast<int>(std::min(MR, mcur - ir));
                s.c = block + ir * NR;
                multiply(ir, s);
              }
              // The block's column r is c's row j + r, its rows c's columns i0 ... i0 + mcur; the bias runs
              // along c's columns (a Dense bias) or down its rows (a row bias).
              GemmTile o = t;
              o.transposed = false;
              o.m = t.n;
              o.n = static_cast<int>(mcur);
              o.bias = last && bias ? bias + (bias_per_row ? j : i0) : nullptr;
              o.bias_rows = bias_per_row;
              o.c = element_at(target, j * ldc + i0, target_dtype);
              o.src = first && add_residual ? element_at(residual, j * ldc + i0, target_dtype) : nullptr;
              g.store_f32_transposed(block, NR, o);
              continue;
            }
            for (int64_t ir = 0; ir < mcur; ir += MR) {
              const int64_t i = i0 + ir;
              t.m = static_cast<int>(std::min(MR, mcur - ir));
              // The bias indexes c's columns (or, per row, c's rows); swapped, c's columns are the rows here.
              const bool along_rows = bias_per_row != swapped;
              t.bias = last && bias ? bias + (along_rows ? i : j) : nullptr;
              t.bias_rows = along_rows;
              const int64_t at = swapped ? j * ldc + i : i * ldc + j;
              t.c = element_at(target, at, target_dtype);
              t.src = first && add_residual ? element_at(residual, at, target_dtype) : nullptr;
              multiply(ir, t);
            }
          }
        }
      });
    }
  }
  if (staged) convert(stage, DType::kF32, c, p.c_dtype, M * N);
}

bool uses_bf16(const MatmulParams& p, const GemmKernels& g, GemmPath path) {
  return path == GemmPath::kBf16Dot && g.bf16 != nullptr && a_product_dtype(p) == DType::kBF16 &&
         b_product_dtype(p) == DType::kBF16;
}

}  // namespace

GemmBlocking gemm_blocking() {
  std::lock_guard<std::mutex> lock(g_blocking_mutex);
  return blocking_slot();
}

void set_gemm_blocking(const GemmBlocking& b) {
  DEMI_CHECK(b.mc >= 1 && b.kc >= 1 && b.nc >= 1, "set_gemm_blocking: block sizes must be positive, got MC=", b.mc,
             " KC=", b.kc, " NC=", b.nc);
  std::lock_guard<std::mutex> lock(g_blocking_mutex);
  blocking_slot() = b;
}

void gemm(const MatmulParams& p, const void* a, const void* b, void* c, GemmPath path) {
  gemm_row_bias(p, a, b, c, nullptr, path);
}

void gemm_row_bias(const MatmulParams& p, const void* a, const void* b, void* c, const float* row_bias,
                   GemmPath path) {
  check_matmul_params(p, "gemm");
  DEMI_CHECK(row_bias == nullptr || p.bias == nullptr, "gemm: a product takes a column bias or a row bias, not both");
  DEMI_CHECK(p.c_dtype != DType::kF64, "gemm: float64 products run the reference kernel, got ", describe(p));
  const GemmKernels& g = kernels();
  const bool bf16 = uses_bf16(p, g, path);
  Workspace bias_ws(p.bias && p.bias_dtype != DType::kF32 ? static_cast<size_t>(p.n) * sizeof(float) : 0);
  const float* bias = static_cast<const float*>(p.bias);
  if (p.bias && p.bias_dtype != DType::kF32) {
    convert(p.bias, p.bias_dtype, bias_ws.f32(), DType::kF32, p.n);
    bias = bias_ws.f32();
  }
  const bool per_row = row_bias != nullptr;
  if (per_row) bias = row_bias;
  const int64_t sa = p.m * p.k, sb = p.k * p.n, sc = p.m * p.n;
  // Many small products: one per thread at a time, each thread with its own scratch (taken here, before
  // the threads start). Few large ones: each across the threads, one after another in one scratch.
  const bool per_item = p.batch > 1 && (p.batch >= 4 * num_threads() || p.m * p.n * p.k < kParallelMacs);
  MatmulParams q = p;
  q.batch = 1;
  const Layout L = layout(q, g, bf16, per_item ? 1 : num_threads());
  const int64_t parts = per_item && !in_parallel_region() ? cpu_internal::parts_for(p.batch) : 1;
  PartScratch scratch(parts, L.scratch_bytes());
  for_each_part(parts, p.batch, [&](int64_t part, int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i)
      product(L, g, bf16, element_at(a, i * sa, p.a_dtype), element_at(b, i * sb, p.b_dtype),
              element_at(c, i * sc, p.c_dtype), p.residual ? element_at(p.residual, i * sc, p.c_dtype) : nullptr,
              bias, per_row, p.a_row_sums, scratch.part(part));
  });
}

std::string gemm_implementation(const MatmulParams& p, GemmPath path) {
  const GemmKernels& g = kernels();
  return str_cat("demi:", g.name, ":", uses_bf16(p, g, path) ? "bf16" : "f32");
}

bool gemm_has_bf16_dot() { return kernels().bf16 != nullptr; }

}  // namespace cpu
}  // namespace demi::kernels
