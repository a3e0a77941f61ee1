#include "demi/core/settings.h"

#include <cstdlib>

#include "demi/core/error.h"

namespace demi {

const std::vector<EnvSetting>& env_settings() {
  static const std::vector<EnvSetting> settings = {
      {"DEMI_CPU_LEVEL", "scalar, avx2, avx512, avx512_bf16 or amx", "the CPU's best level",
       "caps the CPU level demi's kernels and oneDNN dispatch to (to run, compare or test a lower level)",
       {}},
      {"DEMI_MATMUL", "auto, demi or onednn", "auto",
       "the matrix-product kernels: measured per shape (auto), demi's own, or oneDNN's",
       {"auto", "demi", "onednn"}},
      {"DEMI_F16_PRODUCTS", "exact or bf16", "each run's AMP option (exact unless it says bf16)",
       "how float16 products multiply, overriding every run's AMP option (amp::TrainOptions::f16_products, "
       "demi train --f16-products): exact, or rounded to bfloat16 on the bf16 kernels",
       {"exact", "bf16"}},
      {"DEMI_GEMM_BLOCKING", "MC,KC,NC (three positive integers)", "the blocking derived from the caches",
       "demi's GEMM cache blocking, for tuning experiments",
       {}},
      {"DEMI_CONV_BF16", "auto, bf16 or f32", "auto",
       "how a bfloat16 convolution computes: measured per geometry (auto), oneDNN's bf16 kernels, or f32 on "
       "widened operands",
       {"auto", "bf16", "f32"}},
      {"DEMI_CONV_DIRECT", "auto, on or off", "auto",
       "demi's direct convolution kernels against oneDNN's: measured per geometry (auto), always, or never",
       {"auto", "on", "off"}},
      {"DEMI_CONV_GEMM", "auto, on or off", "auto",
       "demi's GEMM-based convolution forward against oneDNN's: measured per geometry (auto), always, or never",
       {"auto", "on", "off"}},
      {"DEMI_ATTENTION", "auto, tiles or products", "auto",
       "scaled dot-product attention's bf16 core on the tile unit: measured per shape (auto), the fused kernels, "
       "or the batched products around the softmax",
       {"auto", "tiles", "products"}},
      {"DEMI_DIST_TIMEOUT", "seconds > 0", "300",
       "how long a collective of data-parallel training may wait before the job is aborted",
       {}},
      {"DEMI_CACHE_DIR", "a folder", "$XDG_CACHE_HOME/demi, else ~/.cache/demi",
       "where kernel choices and prepared data sets are kept",
       {}, /*overrides=*/false},
  };
  return settings;
}

namespace {

const EnvSetting& declared(std::string_view name) {
  for (const EnvSetting& s : env_settings())
    if (s.name == name) return s;
  throw InternalError(str_cat("environment variable ", name, " is read but not declared in core/settings.cc"));
}

}  // namespace

std::optional<std::string> env_value(std::string_view name) {
  const EnvSetting& s = declared(name);
  const char* v = std::getenv(std::string(s.name).c_str());
  if (v == nullptr || *v == '\0') return std::nullopt;
  return std::string(v);
}

std::string env_choice(std::string_view name) {
  const EnvSetting& s = declared(name);
  DEMI_CHECK(!s.choices.empty(), "env_choice: ", name, " is not a choice setting");
  const std::optional<std::string> v = env_value(name);
  if (!v) {
    if (s.unset != s.choices.front())  // unset, it overrides nothing: the caller reads env_value first
      throw InternalError(str_cat("env_choice: ", name, " is unset and then means ", s.unset, ", not a choice"));
    return std::string(s.choices.front());
  }
  for (std::string_view c : s.choices)
    if (*v == c) return *v;
  throw Error(str_cat(s.name, " must be ", s.values, ", got \"", *v, "\""));
}

std::vector<std::string> env_overrides_in_force() {
  std::vector<std::string> out;
  for (const EnvSetting& s : env_settings())
    if (s.overrides)
      if (std::optional<std::string> v = env_value(s.name)) out.push_back(str_cat(s.name, "=", *v));
  return out;
}

}  // namespace demi
