#include "demi/kernels/onednn/internal/onednn_util.h"
#include "demi/core/settings.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "demi/core/convert.h"
#include "demi/core/cpu.h"
#include "demi/core/error.h"
#include "demi/core/memory.h"
#include "demi/kernels/internal/choice_cache.h"
#include "demi/kernels/onednn/conv.h"

namespace demi::kernels::onednn::internal {
namespace {

// The oneDNN ISA a CPU of each dispatch level has at most (a Zen 4 or 5: avx512_core_bf16; no AMX).
dnnl::cpu_isa isa_of(CpuLevel level) {
  switch (level) {
    case CpuLevel::kScalar: return dnnl::cpu_isa::sse41;
    case CpuLevel::kAvx2: return dnnl::cpu_isa::avx2;
    case CpuLevel::kAvx512: return dnnl::cpu_isa::avx512_core;
    case CpuLevel::kAvx512Bf16: return dnnl::cpu_isa::avx512_core_bf16;
    case CpuLevel::kAmx: return dnnl::cpu_isa::avx512_core_amx;
  }
  return dnnl::cpu_isa::all;
}

// DEMI_CPU_LEVEL caps oneDNN's ISA too (before its first use: oneDNN takes the cap once), so that the process
// runs what a CPU of that level runs, oneDNN's kernels included: the suite run at each level on one machine
// then catches what another CPU family would (an AMX Xeon at avx512_bf16 runs oneDNN as a Zen 4 does, no
// AMX). oneDNN's own ONEDNN_MAX_CPU_ISA, where set, wins; set_cpu_level() later in the process changes
// demi's kernels only.
void cap_isa_once() {
  static const bool capped = [] {
    const char* own = std::getenv("ONEDNN_MAX_CPU_ISA");  // (oneDNN's own variables, not demi's settings)
    const char* old_own = std::getenv("DNNL_MAX_CPU_ISA");
    if (!env_value("DEMI_CPU_LEVEL") || (own && *own) || (old_own && *old_own)) return false;
    return dnnl::set_max_cpu_isa(isa_of(cpu_level())) == dnnl::status::success;
  }();
  (void)capped;
}

}  // namespace

// Never destroyed: cached primitives refer to the engine and may outlive any static destruction order.
dnnl::engine& cpu_engine() {
  static dnnl::engine* engine = [] {
    cap_isa_once();
    return new dnnl::engine(dnnl::engine::kind::cpu, 0);
  }();
  return *engine;
}

dnnl::cpu_isa effective_isa() {
  static const dnnl::cpu_isa isa = [] {
    cap_isa_once();
    return dnnl::get_effective_cpu_isa();
  }();
  return isa;
}

bool has_bf16_kernels() {
  const auto isa = static_cast<unsigned>(effective_isa()), core = static_cast<unsigned>(dnnl::cpu_isa::avx512_core);
  return (isa & core) == core;
}

dnnl::stream& thread_stream() {
  thread_local dnnl::stream stream(cpu_engine());
  return stream;
}

dnnl::memory::data_type to_dnnl(DType t) {
  switch (t) {
    case DType::kF32: return dnnl::memory::data_type::f32;
    case DType::kBF16: return dnnl::memory::data_type::bf16;
    default: break;
  }
  DEMI_ASSERT(false, "no oneDNN primitive runs in ", dtype_name(t), " here");
  return dnnl::memory::data_type::undef;
}

DType compute_dtype(DType a, DType b) {
  return a == DType::kBF16 && b == DType::kBF16 && has_bf16_kernels() ? DType::kBF16 : DType::kF32;
}

DType primitive_out_dtype(DType compute, DType want) {
  return want == DType::kBF16 && compute == DType::kBF16 ? DType::kBF16 : DType::kF32;
}

dnnl::primitive_attr user_scratchpad_attr() {
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  return attr;
}

dnnl::memory::desc with_dtype(const dnnl::memory::desc& md, dnnl::memory::data_type t) {
  dnnl::memory::desc out = md;
  out.data.data_type = static_cast<dnnl_data_type_t>(t);
  return out;
}

namespace {

dnnl::memory::data_type plain_dtype(DType user) {
  return user == DType::kF16 ? dnnl::memory::data_type::f32 : to_dnnl(user);
}

dnnl::reorder make_reorder(const dnnl::memory::desc& from, const dnnl::memory::desc& to, bool accumulate,
                           size_t& scratch_bytes) {
  dnnl::primitive_attr attr = user_scratchpad_attr();
  if (accumulate) {
    dnnl::post_ops ops;
    ops.append_sum(1.0f);
    attr.set_post_ops(ops);
  }
  dnnl::reorder::primitive_desc pd(cpu_engine(), from, cpu_engine(), to, attr);
  scratch_bytes = pd.scratchpad_desc().get_size();
  return dnnl::reorder(pd);
}

}  // namespace

InputPlan plan_input(const dnnl::memory::desc& plain_md, DType user, const dnnl::memory::desc& prim_md) {
  InputPlan plan;
  plan.user_md = with_dtype(plain_md, plain_dtype(user));
  plan.prim_md = prim_md;
  plan.from_f16 = user == DType::kF16;
  if (plan.user_md != prim_md) plan.reorder = make_reorder(plan.user_md, prim_md, false, plan.scratch_bytes);
  return plan;
}

OutputPlan plan_output(const dnnl::memory::desc& plain_md, DType user, const dnnl::memory::desc& prim_md,
                       bool accumulate) {
  OutputPlan plan;
  plan.plain_md = with_dtype(plain_md, plain_dtype(user));
  plan.prim_md = prim_md;
  plan.to_f16 = user == DType::kF16;
  plan.accumulate = accumulate;
  if (plan.plain_md != prim_md || accumulate)
    plan.reorder = make_reorder(prim_md, plan.plain_md, accumulate, plan.scratch_bytes);
  return plan;
}

void* CallContext::scratch_buffer(size_t bytes) {
  buffers_.emplace_back(bytes);
  return buffers_.back().get();
}

const float* to_f32(CallContext& ctx, const void* src, DType t, int64_t n) {
  if (t == DType::kF32) return static_cast<const float*>(src);
  auto* dst = static_cast<float*>(ctx.scratch_buffer(static_cast<size_t>(n) * sizeof(float)));
  convert(src, t, dst, DType::kF32, n);
  return dst;
}

void CallContext::execute(const dnnl::primitive& prim, std::unordered_map<int, dnnl::memory> args) {
  if (scratch_.bytes() > 0) {
    dnnl::memory::desc md({static_cast<dnnl::memory::dim>(scratch_.bytes())}, dnnl::memory::data_type::u8,
                          dnnl::memory::format_tag::a);
    args.emplace(DNNL_ARG_SCRATCHPAD, make_memory(md, scratch_.get()));
  }
  prim.execute(thread_stream(), args);
}

const void* CallContext::input(const InputPlan& plan, const void* user, int64_t numel) {
  if (!plan.reorder) return plan.from_f16 ? to_f32(*this, user, DType::kF16, numel) : user;
  // An f16 input that is also reordered is widened into a buffer that lives only until the reorder has
  // read it: the call keeps the reordered copy, not both (a convolution's weights are prepared once per
  // call; on ResNet-18's 512-channel layers at O2-fp16 the widened copy was 9 MiB of the training peak).
  Workspace widened(plan.from_f16 ? static_cast<size_t>(numel) * sizeof(float) : 0);
  const void* cur = user;
  if (plan.from_f16) {
    convert(user, DType::kF16, widened.get(), DType::kF32, numel);
    cur = widened.get();
  }
  void* dst = scratch_buffer(plan.prim_md.get_size());
  execute(*plan.reorder,
          {{DNNL_ARG_FROM, make_memory(plan.user_md, cur)}, {DNNL_ARG_TO, make_memory(plan.prim_md, dst)}});
  return dst;
}

void* CallContext::output(const OutputPlan& plan, void* user, int64_t /*numel*/) {
  return plan.direct() ? user : scratch_buffer(plan.prim_md.get_size());
}

void CallContext::finish_output(const OutputPlan& plan, void* prim_dst, void* user, int64_t numel) {
  if (plan.direct()) return;
  if (!plan.to_f16) {
    execute(*plan.reorder, {{DNNL_ARG_FROM, make_memory(plan.prim_md, prim_dst)},
                            {DNNL_ARG_TO, make_memory(plan.plain_md, user)}});
    return;
  }
  float* f32 = static_cast<float*>(prim_dst);
  if (plan.reorder) {
    f32 = static_cast<float*>(scratch_buffer(static_cast<size_t>(numel) * sizeof(float)));
    if (plan.accumulate) convert(user, DType::kF16, f32, DType::kF32, numel);
    execute(*plan.reorder, {{DNNL_ARG_FROM, make_memory(plan.prim_md, prim_dst)},
                            {DNNL_ARG_TO, make_memory(plan.plain_md, f32)}});
  }
  convert(f32, DType::kF32, user, DType::kF16, numel);
}

Workspace zeroed(size_t bytes) {
  Workspace w(bytes);
  if (w.bytes() != 0) std::memset(w.get(), 0, w.bytes());  // (none held for 0 bytes: memset of null is undefined)
  return w;
}

// Model A's f16 first-layer weight gradient on oneDNN widened copies (4.39 MiB, 74% of its O2-fp16 training
// peak) for no measurable speed: why the workspace is priced.
int demi_measures_faster(const std::function<void(bool)>& run, int64_t footprint) {
  // The two are often close, within what timing noise on a shared machine can amount to: each
  // measurement repeats the call to about a millisecond, and five alternating rounds keep the best.
  const kernels::internal::TwoWays t = kernels::internal::time_two_ways(run, MemCategory::kWorkspace);
  // oneDNN holds a chunk of images' reordered, converted or unpooled activations in workspace (up to
  // kChunkBytes: on model A at O2-bf16 the training peak's largest part), demi's kernels little or none;
  // like the matmul's widening paths, it has to be clearly faster to be worth that memory.
  return demi_kernel_preferred(t.seconds[1], t.seconds[0], t.held[1], t.held[0], footprint) ? 1 : 0;
}

}  // namespace demi::kernels::onednn::internal
