#include "capture.h"

#include <atomic>
#include <sstream>

namespace demi::python {
namespace {

thread_local Tape* t_recording = nullptr;
std::atomic<bool> g_capture{true};

std::string describe_shapes(const std::vector<Tensor>& ts) {
  std::ostringstream os;
  for (const Tensor& t : ts) {
    if (t.defined()) os << dtype_name(t.dtype()) << t.shape();
    os << ";";
  }
  return os.str();
}

}  // namespace

Tape::Tape(const Tensor& input) {
  recorded_.push_back(input);
  signature_ = describe_shapes({input});
}

int Tape::input_of(const Tensor& t) {
  for (size_t s = recorded_.size(); s-- > 0;) {
    if (recorded_[s].is_same(t)) return static_cast<int>(s);
  }
  for (size_t c = 0; c < constants_.size(); ++c) {
    if (constants_[c].is_same(t)) return -static_cast<int>(c + 1);
  }
  constants_.push_back(t);
  return -static_cast<int>(constants_.size());
}

void Tape::add(std::string what, Fn fn, const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs) {
  if (!valid_) return;
  Node node{std::move(fn), {}, {}, {}};
  for (const Tensor& t : inputs) {
    if (!t.defined()) {
      refuse(str_cat(what, " was given an undefined tensor"));
      return;
    }
    node.inputs.push_back(input_of(t));
  }
  for (const Tensor& t : outputs) {
    if (!t.defined()) {
      refuse(str_cat(what, " gave an undefined tensor"));
      return;
    }
    node.outputs.push_back(num_slots_++);
    recorded_.push_back(t);
  }
  signature_ += "|" + what + ":" + describe_shapes(inputs) + "->" + describe_shapes(outputs);
  nodes_.push_back(std::move(node));
}

bool Tape::finish(const Tensor& output) {
  std::vector<Tensor> recorded = std::move(recorded_);
  recorded_.clear();
  if (!valid_) return false;
  for (size_t s = recorded.size(); s-- > 0 && output.defined();) {
    if (recorded[s].is_same(output)) {
      output_ = static_cast<int>(s);
      break;
    }
  }
  if (output_ < 0) {
    refuse("construct returned a tensor none of its recorded ops made");
    return false;
  }
  // Each intermediate is released after its last use (the output never), as Python's references would.
  std::vector<int> last(static_cast<size_t>(num_slots_), -1);
  for (size_t n = 0; n < nodes_.size(); ++n) {
    for (int s : nodes_[n].inputs) {
      if (s >= 0) last[static_cast<size_t>(s)] = static_cast<int>(n);
    }
  }
  for (int s = 0; s < num_slots_; ++s) {
    if (s != output_ && last[static_cast<size_t>(s)] >= 0) nodes_[static_cast<size_t>(last[static_cast<size_t>(s)])].release.push_back(s);
  }
  return true;
}

Tensor Tape::replay(const Tensor& input) const {
  std::vector<Tensor> slots(static_cast<size_t>(num_slots_));
  slots[0] = input;
  std::vector<Tensor> args;
  for (const Node& node : nodes_) {
    args.clear();
    for (int s : node.inputs) args.push_back(s >= 0 ? slots[static_cast<size_t>(s)] : constants_[static_cast<size_t>(-s - 1)]);
    std::vector<Tensor> out = node.fn(args);
    DEMI_ASSERT(out.size() == node.outputs.size(), "a replayed op gave ", out.size(), " tensors where its recording gave ",
                node.outputs.size());
    for (size_t i = 0; i < out.size(); ++i) slots[static_cast<size_t>(node.outputs[i])] = std::move(out[i]);
    args.clear();
    for (int s : node.release) slots[static_cast<size_t>(s)] = Tensor();
  }
  return slots[static_cast<size_t>(output_)];
}

Tape* recording_tape() { return t_recording; }
void set_python_capture(bool on) { g_capture.store(on); }
bool python_capture() { return g_capture.load(); }

RecordingScope::RecordingScope(Tape* tape) : saved_(t_recording) { t_recording = tape; }
RecordingScope::~RecordingScope() { t_recording = saved_; }

std::vector<Tensor> record(const char* what, const std::vector<Tensor>& inputs, Tape::Fn fn) {
  Tape* tape = t_recording;
  if (tape == nullptr) return fn(inputs);
  std::vector<Tensor> out;
  {
    RecordingScope inner(nullptr);  // what fn runs is one op of this tape, not several
    out = fn(inputs);
  }
  tape->add(what, std::move(fn), inputs, out);
  return out;
}

Tensor record1(const char* what, const std::vector<Tensor>& inputs, const std::function<Tensor(const std::vector<Tensor>&)>& fn) {
  return record(what, inputs, [fn](const std::vector<Tensor>& in) { return std::vector<Tensor>{fn(in)}; })[0];
}

void not_replayable(const char* why) {
  if (t_recording != nullptr) t_recording->refuse(why);
}

CellCapture::Plan CellCapture::plan(const Tensor& input, uint64_t structure_version, bool training) {
  Plan p;
  if (get_context().mode != ExecMode::kGraph || !python_capture() || !input.defined()) return p;
  std::ostringstream key;
  key << dtype_name(input.dtype()) << input.shape() << (training ? " train" : " eval")
      << (autograd::grad_enabled() ? " grad" : " nograd") << " v" << structure_version << " policy"
      << static_cast<const void*>(ops::current_precision_policy()) << " f16:" << f16_products_name(f16_products());
  p.key = key.str();
  Entry& e = entries_[p.key];
  if (e.eager) return p;
  if (e.tape) {
    p.replay = e.tape.get();
  } else {
    p.record = true;
  }
  return p;
}

std::string CellCapture::recorded(const std::string& key, std::unique_ptr<Tape> tape) {
  Entry& e = entries_[key];
  if (!tape->valid()) {
    e.eager = true;
    e.first.reset();
    return "its ops cannot be replayed without Python: " + tape->why_not();
  }
  if (!e.first) {
    e.first = std::move(tape);
    return "";
  }
  if (e.first->signature() != tape->signature()) {
    e.eager = true;
    e.first.reset();
    return "it issued different ops on two calls with the same input (its ops depend on Python state)";
  }
  e.first.reset();
  e.tape = std::move(tape);
  return "";
}

}  // namespace demi::python
