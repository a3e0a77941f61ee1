// The execution context: validates and stores the options of set_context, and applies the thread count
// to demi's one thread pool (and so to oneDNN, which shares it).
#include "demi/core/context.h"

#include <algorithm>
#include <cctype>
#include <string_view>

#include "demi/core/cpu.h"
#include "demi/core/error.h"
#include "demi/core/settings.h"
#include "demi/core/parallel.h"

namespace demi {
namespace {

// Device targets this build can run on; error messages list them.
constexpr std::string_view kDeviceTargets[] = {"CPU"};

bool iequals(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::toupper(static_cast<unsigned char>(x)) == std::toupper(static_cast<unsigned char>(y));
         });
}

std::string available_targets() {
  std::string s;
  for (std::string_view t : kDeviceTargets) s += str_cat(s.empty() ? "" : ", ", "\"", t, "\"");
  return s;
}

void check_f16_products(F16Products mode) {
  DEMI_CHECK(mode == F16Products::kExact || cpu_level() >= CpuLevel::kAvx512Bf16,
             "f16 products in bf16 need the bfloat16 pair kernel (AVX512-BF16); this CPU runs demi's ",
             cpu_level_name(cpu_level()), " kernels: use exact f16 products, or bfloat16 as the low dtype");
}

std::optional<F16Products> f16_products_from_env() {
  if (!env_value("DEMI_F16_PRODUCTS")) return std::nullopt;
  const F16Products mode = env_choice("DEMI_F16_PRODUCTS") == "bf16" ? F16Products::kBf16 : F16Products::kExact;
  check_f16_products(mode);
  return mode;
}

thread_local F16Products t_f16_products = F16Products::kExact;

ContextOptions& context_slot() {
  static ContextOptions options;
  return options;
}

}  // namespace

void set_context(const ContextOptions& options) {
  // Everything is checked before anything changes, so a rejected call leaves the context as it was.
  DEMI_CHECK(options.mode == ExecMode::kGraph || options.mode == ExecMode::kPyNative,
             "set_context: expected mode GRAPH_MODE or PYNATIVE_MODE, got ExecMode(",
             static_cast<int>(options.mode), ")");
  const std::string_view* target = std::find_if(
      std::begin(kDeviceTargets), std::end(kDeviceTargets),
      [&](std::string_view t) { return iequals(t, options.device_target); });
  DEMI_CHECK(target != std::end(kDeviceTargets), "set_context: device_target \"", options.device_target,
             "\" is not available; available targets: ", available_targets());
  DEMI_CHECK(options.device_id >= 0, "set_context: expected device_id >= 0, got ", options.device_id);
  // One CPU device: the cores are its threads, chosen by num_threads, not separate device ids.
  DEMI_CHECK(options.device_id == 0, "set_context: device_target \"CPU\" has one device, ",
             "expected device_id 0, got ", options.device_id);
  DEMI_CHECK(options.num_threads >= 0, "set_context: expected num_threads >= 0 (0: every core), got ",
             options.num_threads);

  // More threads than cores is allowed: the user may know better (e.g. a cgroup quota is not an
  // affinity mask), and it is the user's call.
  set_num_threads(options.num_threads == 0 ? hardware_threads() : options.num_threads);
  ContextOptions& ctx = context_slot();
  ctx = options;
  ctx.device_target = std::string(*target);  // canonical spelling, whatever case was passed
  ctx.num_threads = num_threads();
}

const ContextOptions& get_context() {
  ContextOptions& ctx = context_slot();
  // set_num_threads may also be called directly; report the count actually in force.
  ctx.num_threads = num_threads();
  return ctx;
}

namespace {

void set_mode(ExecMode mode) {
  ContextOptions options = get_context();
  options.mode = mode;
  set_context(options);
}

}  // namespace

ExecModeScope::ExecModeScope(ExecMode mode) : saved_(get_context().mode) { set_mode(mode); }
ExecModeScope::~ExecModeScope() { set_mode(saved_); }

const char* exec_mode_name(ExecMode m) {
  switch (m) {
    case ExecMode::kGraph: return "GRAPH_MODE";
    case ExecMode::kPyNative: return "PYNATIVE_MODE";
  }
  return "UNKNOWN_MODE";  // only for a value cast from an out-of-range integer
}

F16ProductsScope::F16ProductsScope(F16Products mode) : saved_(t_f16_products) {
  check_f16_products(mode);
  t_f16_products = mode;
}
F16ProductsScope::~F16ProductsScope() { t_f16_products = saved_; }
std::optional<F16Products> f16_products_override() {
  static const std::optional<F16Products> mode = f16_products_from_env();
  return mode;
}
F16Products f16_products() { return f16_products_override().value_or(t_f16_products); }
const char* f16_products_name(F16Products mode) { return mode == F16Products::kBf16 ? "bf16" : "exact"; }

}  // namespace demi
