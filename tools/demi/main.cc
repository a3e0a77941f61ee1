// The demi command: a thin layer over the library. Each subcommand is one Command entry (args.h) that
// parses its options and calls the library. Exit codes: 0 success, 1 an error from the library
// ("demi: error: ..."), 2 a mistake on the command line (with a hint), 3 a training run that ran to its end
// and did not learn (its last loss not finite, or most of its updates skipped; "demi: training failed: ...").
//
//   demi info              the machine, the dispatch level, threads, context, oneDNN, memory
//   demi demo              the seed's comparison: models A and B at O0 and O2, side by side
//   demi train / compare   train a reference model at an AMP level; compare settings in one table
//   demi formats           f32 <-> f16 / bf16 conversions and the memory tracker's report
//   demi generate / data   sample text from a GPT checkpoint; prepare the King James Bible
#include <malloc.h>

#include <oneapi/dnnl/dnnl.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <exception>
#include <iostream>
#include <string>
#include <vector>

#include "demi/core/context.h"
#include "demi/core/kernel_registry.h"
#include "demi/core/settings.h"
#include "tools/demi/gpt.h"
#include "tools/demi/training.h"
#include "demi/core/cpu.h"
#include "demi/core/dtype.h"
#include "demi/core/error.h"
#include "demi/core/memory.h"
#include "demi/core/parallel.h"
#include "demi/core/rng.h"
#include "demi/core/tensor.h"
#include "demi/ops/ops.h"
#include "demi/distributed/distributed.h"
#include "tools/demi/args.h"

#ifndef DEMI_VERSION
#define DEMI_VERSION "0.1.0"
#endif

namespace demi::cli {
namespace {

// Options every command that runs kernels accepts.
std::vector<Option> machine_options() {
  return {
      int_option("threads", "N", "threads for demi and oneDNN (0: every core)", "0", 0, 4096),
      {"cpu-level", "LEVEL", "lower the kernel dispatch level: scalar, avx2, avx512, avx512_bf16", ""},
  };
}

void apply_machine_options(const ParsedArgs& args) {
  apply_thread_option(args);
  if (args.has("cpu-level")) set_cpu_level(parse_cpu_level(args.get("cpu-level")));
}

std::string feature_list() {
  const CpuFeatures& f = cpu_features();
  const std::pair<const char*, bool> features[] = {
      {"avx2", f.avx2},         {"fma", f.fma},           {"f16c", f.f16c},
      {"avx512f", f.avx512f},   {"avx512bw", f.avx512bw}, {"avx512vl", f.avx512vl},
      {"avx512dq", f.avx512dq}, {"avx512_bf16", f.avx512_bf16}, {"avx512_fp16", f.avx512_fp16},
      {"amx_bf16", f.amx_bf16},
      {"amx_tile", f.amx_tile && f.os_amx},
  };
  std::string have, missing;
  for (const auto& [name, present] : features) (present ? have : missing) += std::string(" ") + name;
  return (have.empty() ? " none" : have) + (missing.empty() ? "" : "  (not:" + missing + ")");
}

const char* runtime_name(unsigned runtime) {
  switch (runtime) {
    case DNNL_RUNTIME_SEQ: return "sequential";
    case DNNL_RUNTIME_OMP: return "OpenMP";
    case DNNL_RUNTIME_TBB: return "TBB";
    case DNNL_RUNTIME_THREADPOOL: return "threadpool";
    default: return "unknown";
  }
}

void print_info() {
  const dnnl_version_t* dnnl = dnnl_version();
  std::string levels;
  for (CpuLevel l : supported_cpu_levels()) {
    if (!levels.empty()) levels += ", ";
    levels += cpu_level_name(l);
  }
  const ContextOptions& ctx = get_context();
  std::printf("demi %s\n", DEMI_VERSION);
  std::printf("cpu:        %s (family %d, model %d)\n", cpu_id().name.c_str(), cpu_id().family, cpu_id().model);
  std::printf("features:  %s\n", feature_list().c_str());
  std::printf("dispatch:   %s (max %s; supported: %s)\n", std::string(cpu_level_name(cpu_level())).c_str(),
              std::string(cpu_level_name(max_cpu_level())).c_str(), levels.c_str());
  std::printf("threads:    %d (cores available: %d)\n", num_threads(), hardware_threads());
  std::printf("context:    %s, device %s:%d\n", exec_mode_name(ctx.mode), ctx.device_target.c_str(),
              ctx.device_id);
  std::printf("oneDNN:     %d.%d.%d (%s runtime)\n", dnnl->major, dnnl->minor, dnnl->patch,
              runtime_name(dnnl->cpu_runtime));
  const std::optional<F16Products> products = f16_products_override();
  std::printf("f16 products: %s\n", products ? str_cat(f16_products_name(*products),
                                                       " in every run (DEMI_F16_PRODUCTS overrides the runs' options)")
                                                   .c_str()
                                             : "each run's AMP option (demi train --f16-products: exact or bf16)");
  std::printf("\nenvironment settings (overrides for debugging and benchmarks; a run's options choose its numerics):\n");
  for (const EnvSetting& e : env_settings()) {
    const std::optional<std::string> v = env_value(e.name);
    std::printf("  %-18s %s\n  %-18s values: %s; unset: %s; now: %s\n", std::string(e.name).c_str(),
                std::string(e.help).c_str(), "", std::string(e.values).c_str(), std::string(e.unset).c_str(),
                v ? v->c_str() : "unset");
  }
  std::printf("\n%s", mem_report().c_str());
}

// The kernel-variant registry (core/kernel_registry.h) as a family x ISA matrix: "own" (a body of its own),
// "gen" (generated from the family's vector-generic body), "-" (none: the level below runs); the variant
// this CPU runs at its dispatch level is marked with *.
void print_kernel_variants() {
  std::printf("\nkernel variants (family x ISA; * the one this CPU runs):\n%-14s %-8s", "family", "module");
  for (int l = 0; l < kNumCpuLevels; ++l) std::printf(" %-11s", std::string(cpu_level_name(static_cast<CpuLevel>(l))).c_str());
  std::printf("\n");
  const int level = static_cast<int>(cpu_level());
  for (const KernelFamilyInfo& f : kernel_families()) {
    int runs = 0;  // the highest variant at or below the dispatch level
    for (int l = 0; l <= level; ++l)
      if (f.variants[static_cast<size_t>(l)] != nullptr) runs = l;
    std::printf("%-14s %-8s", f.name, f.module);
    for (int l = 0; l < kNumCpuLevels; ++l) {
      const char* how = f.variants[static_cast<size_t>(l)];
      std::printf(" %-11s", (std::string(how != nullptr ? how : "-") + (l == runs ? "*" : "")).c_str());
    }
    std::printf("\n");
  }
}

// Which kernel each reference model's matrix products run on this machine (chosen by measurement at
// first use and cached, kernels/matmul.h): forward (x w^T + bias, ReLU), input gradient (dy w) and weight
// gradient (dy^T x into f32: the product, or oneDNN's inner-product primitive where it measured faster) of
// the reference models' Dense layers, in each dtype.
void print_kernel_choices() {
  struct Layer {
    const char* model;
    int64_t rows, in, out;
  };
  const Layer layers[] = {{"A", 32, 7200, 10},     {"B", 128, 3136, 128},  {"C", 256, 784, 1024},
                          {"C", 256, 1024, 1024}, {"D", 4096, 256, 768},  {"D", 4096, 256, 1024},
                          {"D", 4096, 1024, 256}};
  std::printf("\nmatrix products (kernel chosen on this machine; f32 | bf16 | f16):\n");
  for (const Layer& l : layers) {
    const std::string name = str_cat(l.model, " ", l.in, "->", l.out, " x", l.rows);
    for (int dir = 0; dir < 3; ++dir) {
      std::string line;
      for (DType t : {DType::kF32, DType::kBF16, DType::kF16}) {
        std::string k = dir == 0   ? ops::matmul_kernel(l.rows, l.out, l.in, false, true, t, t, t, true, true)
                        : dir == 1 ? ops::matmul_kernel(l.rows, l.in, l.out, false, false, t, t, t)
                                   : ops::dense_weights_kernel(l.rows, l.in, l.out, t);
        line += (line.empty() ? "" : " | ") + k;
      }
      std::printf("  %-18s %-3s %s\n", dir == 0 ? name.c_str() : "", dir == 0 ? "fwd" : dir == 1 ? "dx" : "dw",
                  line.c_str());
    }
  }
  const std::string cache = ops::matmul_kernel_cache(), dw_cache = ops::dense_weights_kernel_cache();
  std::printf("  (choices kept in %s;\n   dw's between oneDNN's inner product and the product in %s)\n",
              cache.empty() ? "memory only" : cache.c_str(), dw_cache.empty() ? "memory only" : dw_cache.c_str());

  // Model D's attention core (32 sequences x 4 heads, 128 tokens, 64 per head), bf16: fused on the tile
  // unit or the batched products around the softmax.
  std::printf("\nbf16 attention core (fused on the tile unit or not; forward | backward):\n  %-26s %s | %s\n",
              "D 32x4 heads 128 tokens d64", ops::attention_kernel(32, 4, 128, 64, false).c_str(),
              ops::attention_kernel(32, 4, 128, 64, true).c_str());
  const std::string attention_cache = ops::attention_kernel_cache();
  std::printf("  (choices kept in %s)\n", attention_cache.empty() ? "memory only" : attention_cache.c_str());

  // Model A's and B's convolutions at their reference batch: bf16 compute or f32 on widened operands.
  struct Conv {
    const char* name;
    int64_t n, c, hw, oc, pad;
  };
  const Conv convs[] = {{"A 3->32 k3 32x32 b32", 32, 3, 32, 32, 0},
                        {"B 1->32 k3p1 28x28 b128", 128, 1, 28, 32, 1},
                        {"B 32->64 k3p1 14x14 b128", 128, 32, 14, 64, 1}};
  std::printf("\nbf16 convolutions (compute chosen on this machine):\n");
  for (const Conv& c : convs)
    std::printf("  %-26s %s\n", c.name, ops::conv2d_bf16_kernel(c.n, c.c, c.hw, c.hw, c.oc, 3, 3, c.pad).c_str());
  const std::string conv_cache = ops::conv2d_kernel_cache();
  std::printf("  (choices kept in %s)\n", conv_cache.empty() ? "memory only" : conv_cache.c_str());

  // The first layers (few input channels): demi's direct convolution or oneDNN, per dtype and direction.
  std::printf("\nfew-input-channel convolutions (forward | weight gradient; f32, bf16, f16):\n");
  for (const Conv& c : convs) {
    std::string line;
    for (DType t : {DType::kF32, DType::kBF16, DType::kF16}) {
      const ops::ConvKernelChoice k = ops::conv2d_direct_kernels(c.n, c.c, c.hw, c.hw, c.oc, 3, 3, c.pad, t);
      if (k.forward == k.weight_gradient && k.forward.find("not a direct") != std::string::npos) {
        line = k.forward;  // the same for every dtype
        break;
      }
      line += str_cat(line.empty() ? "" : " | ", dtype_name(t), " ", k.forward, ", ", k.weight_gradient);
    }
    std::printf("  %-26s %s\n", c.name, line.c_str());
  }
  const std::string direct_cache = ops::conv2d_direct_cache();
  std::printf("  (choices kept in %s)\n", direct_cache.empty() ? "memory only" : direct_cache.c_str());

  // Every forward: the direct kernel, demi's indirect product (the image gathered in packing) or oneDNN.
  std::printf("\nconvolution forwards (f32 | bf16 | f16):\n");
  for (const Conv& c : convs) {
    std::string line;
    for (DType t : {DType::kF32, DType::kBF16, DType::kF16})
      line += str_cat(line.empty() ? "" : " | ", ops::conv2d_forward_kernel(c.n, c.c, c.hw, c.hw, c.oc, 3, 3, c.pad, t));
    std::printf("  %-26s %s\n", c.name, line.c_str());
  }
  const std::string gemm_cache = ops::conv2d_gemm_cache();
  std::printf("  (choices kept in %s)\n", gemm_cache.empty() ? "memory only" : gemm_cache.c_str());
}

int run_info(const ParsedArgs& args) {
  apply_machine_options(args);
  print_info();
  print_kernel_variants();
  print_kernel_choices();
  return 0;
}

// Largest |x - y|, and largest |x - y| / |x| where |x| >= min_normal (below it, in the subnormals, a
// low-precision type keeps an absolute, not a relative, precision).
std::pair<double, double> max_errors(const std::vector<float>& x, const std::vector<float>& y,
                                     double min_normal) {
  double abs_err = 0, rel_err = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    double d = std::abs(static_cast<double>(x[i]) - y[i]);
    abs_err = std::max(abs_err, d);
    if (std::abs(x[i]) >= min_normal) rel_err = std::max(rel_err, d / std::abs(static_cast<double>(x[i])));
  }
  return {abs_err, rel_err};
}

int run_demo(const ParsedArgs& args) {
  apply_machine_options(args);
  print_info();

  const int64_t n = args.get_int("elements");  // >= 1: checked with the command line
  Generator gen(static_cast<uint64_t>(args.get_int("seed")));
  std::printf("\n== f32 master copy -> f16 / bf16 (as AMP's cast cache holds them) -> f32 ==\n");
  std::printf("%lld values uniform in [-4, 4), seed %llu\n", static_cast<long long>(n),
              static_cast<unsigned long long>(gen.seed()));

  // Tagged as the categories a training step would use: master weights are parameters, their low-precision
  // copies the cast cache, and values computed from them activations.
  Tensor master;
  {
    MemCategoryScope scope(MemCategory::kParameter);
    master = uniform({n}, -4.0, 4.0, gen);
  }
  std::vector<float> reference = master.to_vector();
  std::printf("%-10s %12s %14s %14s %16s\n", "dtype", "bytes", "max abs err", "max rel err", "rel err bound");
  for (DType low : {DType::kF16, DType::kBF16}) {
    Tensor cast;
    {
      MemCategoryScope scope(MemCategory::kCastCache);
      cast = master.to(low);
    }
    Tensor back;
    {
      MemCategoryScope scope(MemCategory::kActivation);
      back = cast.to(DType::kF32);
    }
    // Round to nearest even is off by at most half a unit in the last place: 2^-11 (f16), 2^-8 (bf16),
    // relative to the value, for values in the type's normal range (from 2^-14 and 2^-126).
    bool f16 = low == DType::kF16;
    double bound = std::ldexp(1.0, f16 ? -11 : -8);
    auto [abs_err, rel_err] = max_errors(reference, back.to_vector(), std::ldexp(1.0, f16 ? -14 : -126));
    std::printf("%-10s %12zu %14.3g %14.3g %16.3g\n", std::string(dtype_name(low)).c_str(), cast.nbytes(),
                abs_err, rel_err, bound);
    DEMI_ASSERT(rel_err <= bound, "conversion to ", low, " lost more than half an ulp: ", rel_err);
  }
  std::printf("\n== memory tracker (every tensor byte, by category) ==\n%s", mem_report().c_str());
  return 0;
}

std::vector<Command> commands() {
  std::vector<Command> cmds;
  cmds.push_back({.name = "info",
                  .summary = "Print the CPU features, dispatch level, threads, context, oneDNN and memory.",
                  .options = machine_options(),
                  .run = run_info});
  std::vector<Option> demo_options = machine_options();
  demo_options.push_back(int_option("elements", "N", "values to convert", "1048576", 1, 1 << 30));
  demo_options.push_back(int_option("seed", "S", "random seed", "1", 0, 1e18));
  cmds.push_back({.name = "formats",
                  .summary = "Convert a tensor f32 -> f16/bf16 -> f32 and show the memory tracker's report.",
                  .options = std::move(demo_options),
                  .run = run_demo});
  cmds.push_back({.name = "demo",
                  .summary = "The seed's comparison: models A and B trained at O0 and O2 (fp16, bf16), side by side.",
                  .options = {},
                  .run = run_training_demo});
  add_train_commands(cmds);
  add_eval_command(cmds);
  add_compare_command(cmds);
  add_gpt_commands(cmds);
  return cmds;
}

std::string main_help(const std::vector<Command>& cmds) {
  std::string s = "Usage: demi <command> [options]\n\ndemi " DEMI_VERSION
                  ", a C++ training framework with automatic mixed precision.\n\nCommands:\n";
  size_t width = 0;
  for (const Command& c : cmds) width = std::max(width, c.name.size());
  for (const Command& c : cmds)
    s += "  " + c.name + std::string(width - c.name.size() + 2, ' ') + c.summary + "\n";
  s += "\nOptions:\n  -h, --help     show this help\n  --version      print the version\n\n"
       "Run 'demi <command> --help' for a command's options.\n";
  return s;
}

int run(int argc, char** argv) {
  std::vector<std::string> words(argv + 1, argv + argc);
  std::vector<Command> cmds = commands();
  if (words.empty()) {
    std::fputs(main_help(cmds).c_str(), stderr);
    return 2;
  }
  const std::string& first = words[0];
  if (first == "-h" || first == "--help" || first == "help") {
    if (first == "help" && words.size() > 1) {
      for (const Command& c : cmds) {
        if (c.name == words[1]) {
          std::fputs(command_help(c).c_str(), stdout);
          return 0;
        }
      }
    }
    std::fputs(main_help(cmds).c_str(), stdout);
    return 0;
  }
  if (first == "--version") {
    const dnnl_version_t* dnnl = dnnl_version();
    std::printf("demi %s (oneDNN %d.%d.%d)\n", DEMI_VERSION, dnnl->major, dnnl->minor, dnnl->patch);
    return 0;
  }
  std::vector<std::string> names;
  for (const Command& c : cmds) names.push_back(c.name);
  auto cmd = std::find_if(cmds.begin(), cmds.end(), [&](const Command& c) { return c.name == first; });
  if (cmd == cmds.end()) {
    std::string kind = first.rfind("-", 0) == 0 ? "option" : "command";
    std::string guess = closest(first.rfind("--", 0) == 0 ? first.substr(2) : first, names);
    throw UsageError("demi: unknown " + kind + " '" + first + "'" +
                     (guess.empty() ? "" : " (did you mean '" + guess + "'?)") +
                     "; run 'demi --help' for the commands");
  }
  ParsedArgs args = parse_options(*cmd, std::span<const std::string>(words).subspan(1));
  if (args.has("help")) {
    std::fputs(command_help(*cmd).c_str(), stdout);
    return 0;
  }
  // An environment override (core/settings.h) changes what or how fast the kernels compute: said on
  // stderr when it takes effect, never silently.
  if (const std::vector<std::string> in_force = env_overrides_in_force(); !in_force.empty()) {
    std::string list;
    for (const std::string& s : in_force) list += (list.empty() ? "" : ", ") + s;
    std::fprintf(stderr, "demi: environment overrides in force: %s (demi info lists the settings)\n", list.c_str());
  }
  return cmd->run(args);
}

}  // namespace
}  // namespace demi::cli

int main(int argc, char** argv) {
  // demi's own tensors come from its caching allocator; what still goes through malloc (oneDNN's gemm
  // packing buffers, a few MiB per call) would be mmap'ed and unmapped per call above glibc's default
  // threshold, costing fresh page faults every step (model D at O2: 4.1 per step -> 0). Library users can
  // get the same with MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=1073741824.
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  // In a data-parallel job an error on one process must end the others, which would otherwise wait for
  // it in the next collective: dist::abort prints the message and ends the whole job.
  const auto fail = [](const std::string& message, int status) {
    if (demi::dist::is_initialized() && demi::dist::get_group_size() > 1)
      demi::dist::abort("demi: rank " + std::to_string(demi::dist::get_rank()) + ": " + message, status);
    std::fprintf(stderr, "%s\n", message.c_str());
    return status;
  };
  int status = 0;
  try {
    status = demi::cli::run(argc, argv);
  } catch (const demi::cli::UsageError& e) {
    return fail(e.what(), 2);
  } catch (const std::exception& e) {
    // demi::Error (a mistake the library caught) or anything unexpected: one line, exit 1.
    return fail(std::string("demi: error: ") + e.what(), 1);
  }
  std::fflush(stdout);
  demi::dist::release();
  return status;
}
