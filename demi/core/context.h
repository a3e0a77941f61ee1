// The execution context, as in MindSpore's set_context: mode, device target, device id, thread count.
//
//   demi::set_context({.mode = demi::ExecMode::kGraph, .device_target = "CPU", .device_id = 0});
//
// Graph mode arrives with demi/graph; until then the setting is stored and reported, and train steps run
// eagerly. "CPU" is the only device target today; any other is a demi::Error that lists the available ones.
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

}  // namespace demi
