// GRAPH_MODE's capture of a Python construct: the ops a Python cell's construct issues, recorded once into a
// tape (op, inputs, outputs) and replayed by later calls in C++ without calling Python or taking the GIL —
// what MindSpore's GRAPH_MODE exists for, as TinyJit and torch.jit.trace do it. Guarded:
//
// - A tape belongs to one key: the input's shape and dtype, training or not, grad mode, the cell tree's
//   structure_version (a sub-cell, policy or pin changed), the precision policy in force and the
//   float16-products mode. Another key records its own tape.
// - Two calls with the same key record; the tape is used only when both issued the same ops on the same
//   shapes (a construct whose ops depend on Python state — a step counter, time — stays eager).
// - A recording that reads tensor values into Python (item, asnumpy, bool, indexing, printing), calls ops
//   that are not recorded (backward, an optimizer) or passes several arguments to a Python sub-cell cannot be
//   replayed: that key stays eager, and the cell says so once (a RuntimeWarning naming why).
// - Tensors a construct makes from Python values (a constant, a Parameter it reads) are captured as they
//   are: a construct that draws random numbers in Python, or reads Python state into a new tensor each call,
//   gets the first call's values. As torch.jit.trace, that is the one thing capture cannot see; such a
//   network runs in PYNATIVE_MODE (set_context(mode=PYNATIVE_MODE)), where nothing is captured.
//
// Replays run the same C++ calls the recording made (layer calls through Cell::operator(), so paths in
// errors, precision policies, pins and graph mode's fusions are the same), releasing each intermediate after
// its last use as Python's reference counting would: results are bit for bit the Python construct's.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "bind.h"

namespace demi::python {

class Tape {
 public:
  using Fn = std::function<std::vector<Tensor>(const std::vector<Tensor>&)>;

  explicit Tape(const Tensor& input);
  // Appends an op that ran on `inputs` and gave `outputs`.
  void add(std::string what, Fn fn, const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs);
  // This recording cannot be replayed (the first reason is kept).
  void refuse(std::string why) {
    if (valid_) why_not_ = std::move(why);
    valid_ = false;
  }
  // Ends the recording with construct's result; false (and why_not) when it cannot be replayed.
  bool finish(const Tensor& output);
  bool valid() const { return valid_; }
  const std::string& why_not() const { return why_not_; }
  // The ops and shapes, for comparing two recordings.
  const std::string& signature() const { return signature_; }
  // Runs the recorded ops on a new input (no Python, no GIL).
  Tensor replay(const Tensor& input) const;

 private:
  struct Node {
    Fn fn;
    std::vector<int> inputs;   // >= 0: a slot; < 0: constant -(i + 1)
    std::vector<int> outputs;  // slots
    std::vector<int> release;  // slots whose last use this node is
  };
  int input_of(const Tensor& t);
  std::vector<Node> nodes_;
  std::vector<Tensor> constants_;
  // While recording: the tensor of each slot (found by handle identity, Tensor::is_same, which never
  // computes a pending value: graph mode's fusions leave a layer's output pending until the next call).
  std::vector<Tensor> recorded_;
  int num_slots_ = 1;          // slot 0: the input
  int output_ = -1;
  bool valid_ = true;
  std::string why_not_;
  std::string signature_;
};

// Whether GRAPH_MODE captures Python constructs (on by default; demi.set_context(python_capture=False)).
void set_python_capture(bool on);
bool python_capture();

// The tape being recorded on this thread (the innermost Python construct recording), or null.
Tape* recording_tape();

// Runs an op from a binding: fn(inputs), recorded into the tape being recorded, if any.
std::vector<Tensor> record(const char* what, const std::vector<Tensor>& inputs, Tape::Fn fn);
Tensor record1(const char* what, const std::vector<Tensor>& inputs, const std::function<Tensor(const std::vector<Tensor>&)>& fn);
// A binding that reads values into Python or does what a tape cannot replay: the recording is refused.
void not_replayable(const char* why);

// A Python cell's tapes, by key (see the top of the file).
class CellCapture {
 public:
  // What construct should do for this call: replay a tape, record, or just run Python.
  struct Plan {
    const Tape* replay = nullptr;
    bool record = false;
    std::string key;
  };
  Plan plan(const Tensor& input, uint64_t structure_version, bool training);
  // Called after a recording: keeps it, compares it with the previous one, or gives up on the key. Returns a
  // warning to say once ("" when none).
  std::string recorded(const std::string& key, std::unique_ptr<Tape> tape);
  int64_t python_calls = 0;  // construct ran Python
  int64_t replays = 0;       // construct ran a tape

 private:
  struct Entry {
    std::unique_ptr<Tape> first;  // the first recording, until the second confirms it
    std::unique_ptr<Tape> tape;   // confirmed: replayed
    bool eager = false;           // this key is never captured
  };
  std::map<std::string, Entry> entries_;
};

// Pushes a tape as this thread's recording for a scope.
class RecordingScope {
 public:
  explicit RecordingScope(Tape* tape);
  ~RecordingScope();
  RecordingScope(const RecordingScope&) = delete;
  RecordingScope& operator=(const RecordingScope&) = delete;

 private:
  Tape* saved_;
};

}  // namespace demi::python
