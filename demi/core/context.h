// The execution context, as in MindSpore's set_context: mode, device target, device id, thread count.
//
//   demi::set_context({.mode = demi::ExecMode::kGraph, .device_target = "CPU", .device_id = 0});
//
// GRAPH_MODE (the default): a TrainStep's updates (build_train_network, Model::train) run under static
// memory plans, one arena planned from a traced step and replayed every later step (demi/graph/
// step_graph.h), with the eager fusions applied to any network's layer calls (graph_fusion below); the
// results are bit for bit PYNATIVE_MODE's, which runs every op as it comes, except where graph mode fused
// calls that PYNATIVE runs one by one. The mode is read at each update. "CPU" is the only device target
// today; any other is a demi::Error that lists the available ones.
#pragma once

#include <optional>
#include <string>

namespace demi {

enum class ExecMode { kGraph, kPyNative };

struct ContextOptions {
  ExecMode mode = ExecMode::kGraph;
  std::string device_target = "CPU";
  int device_id = 0;
  int num_threads = 0;  // 0: every core available to the process
  // GRAPH_MODE runs the eager fusions (Conv2d -> ReLU -> MaxPool2d, Dense -> ReLU, ReLU -> MaxPool2d) on any
  // network's layer calls, not only inside a SequentialCell (nn/call_fusion.h): the results are then those
  // of the network written with SequentialCells, which may differ from PYNATIVE's calls in a gradient's last
  // bits (the fused kernel sums in its own order). false: GRAPH_MODE gives PYNATIVE's bits on every network.
  bool graph_fusion = true;
};

void set_context(const ContextOptions& options);
const ContextOptions& get_context();  // the options in force (num_threads resolved to the real count)
const char* exec_mode_name(ExecMode m);  // "GRAPH_MODE", "PYNATIVE_MODE"

// Runs a scope in `mode` and puts the mode in force before it back at its end; the other settings are
// left as they are (a block that must run eagerly, a test comparing the two modes).
class ExecModeScope {
 public:
  explicit ExecModeScope(ExecMode mode);
  ~ExecModeScope();
  ExecModeScope(const ExecModeScope&) = delete;
  ExecModeScope& operator=(const ExecModeScope&) = delete;

 private:
  ExecMode saved_;
};

// How products of float16 values multiply (kernels/matmul.h says how each kernel honours it): kExact, the
// f16 values themselves; kBf16, rounded to bfloat16 on the bf16 kernels (faster where the CPU has
// AVX512-BF16, other numbers; refused elsewhere). A part of the AMP policy, not of the process:
// amp::TrainOptions::f16_products (train::ModelOptions'), which amp::TrainStep and train::Model put in force
// on their thread for each step, evaluation and prediction with an F16ProductsScope. Outside every scope
// products are exact. DEMI_F16_PRODUCTS=exact|bf16, where set, overrides every scope (for debugging and
// benchmarks; core/settings.h lists it in force).
enum class F16Products { kExact, kBf16 };
class F16ProductsScope {
 public:
  explicit F16ProductsScope(F16Products mode);  // a demi::Error for kBf16 on a CPU without AVX512-BF16
  ~F16ProductsScope();
  F16ProductsScope(const F16ProductsScope&) = delete;
  F16ProductsScope& operator=(const F16ProductsScope&) = delete;

 private:
  F16Products saved_;
};
// The choice in force on this thread: DEMI_F16_PRODUCTS where set, else the innermost scope's, else kExact.
F16Products f16_products();
// The DEMI_F16_PRODUCTS override, where set (checked against the CPU at its first read).
std::optional<F16Products> f16_products_override();
const char* f16_products_name(F16Products mode);  // "exact", "bf16"

}  // namespace demi
