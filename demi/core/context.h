// The execution context, as in MindSpore's set_context: mode, device target, device id, thread count.
//
//   demi::set_context({.mode = demi::ExecMode::kGraph, .device_target = "CPU", .device_id = 0});
//
// GRAPH_MODE (the default): a TrainStep's updates (build_train_network, Model::train) run under static
// memory plans, one arena planned from a traced step and replayed every later step (demi/graph/
// step_graph.h); the results are bit for bit PYNATIVE_MODE's, which runs every op as it comes. The mode
// is read at each update. "CPU" is the only device target today; any other is a demi::Error that lists
// the available ones.
#pragma once

#include <string>

namespace demi {

enum class ExecMode { kGraph, kPyNative };

struct ContextOptions {
  ExecMode mode = ExecMode::kGraph;
  std::string device_target = "CPU";
  int device_id = 0;
  int num_threads = 0;  // 0: every core available to the process
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

}  // namespace demi
