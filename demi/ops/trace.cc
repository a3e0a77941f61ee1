#include "demi/ops/trace.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <map>
#include <mutex>
#include <sstream>

namespace demi::ops {

// ---- trace ----
OpTrace::OpTrace() : scope_(this) {}
OpTrace::~OpTrace() = default;

void OpTrace::on_op(const OpEvent& e) {
  OpRecord r;
  r.op = e.op;
  r.backward = e.backward;
  r.compute_dtype = e.compute_dtype;
  if (e.layer != nullptr) r.layer = e.layer;
  for (const Tensor* t : e.inputs)
    if (t != nullptr && t->defined()) {
      r.input_dtypes.push_back(t->dtype());
      r.input_shapes.push_back(t->shape());
    }
  for (const Tensor& o : e.outputs)
    if (o.defined()) {
      r.output_dtypes.push_back(o.dtype());
      r.output_shape = o.shape();
    }
  records_.push_back(std::move(r));
}

std::vector<OpRecord> OpTrace::of(Op op) const {
  std::vector<OpRecord> out;
  for (const auto& r : records_)
    if (r.op == op && !r.backward) out.push_back(r);
  return out;
}

std::string OpTrace::to_string() const {
  std::ostringstream os;
  for (const auto& r : records_) {
    os << (r.backward ? "  bwd " : "  fwd ") << op_name(r.op) << "  " << dtype_name(r.compute_dtype) << " <- [";
    for (size_t i = 0; i < r.input_dtypes.size(); ++i) os << (i ? ", " : "") << dtype_name(r.input_dtypes[i]);
    os << "] -> [";
    for (size_t i = 0; i < r.output_dtypes.size(); ++i)
      os << (i ? ", " : "") << dtype_name(r.output_dtypes[i]);
    os << "] " << r.output_shape;
    if (!r.layer.empty()) os << "  in " << r.layer;
    os << "\n";
  }
  return os.str();
}

// ---- profiler ----
namespace {

class Profiler : public OpObserver {
 public:
  bool wants_timing() const override { return true; }
  void on_op(const OpEvent& e) override {
    int64_t bytes = 0;
    for (const Tensor& t : e.outputs)
      if (t.defined()) bytes += static_cast<int64_t>(t.nbytes());
    std::lock_guard<std::mutex> lock(mutex);
    auto& row = rows[{static_cast<int>(e.op), e.backward}];
    row.op = e.op;
    row.backward = e.backward;
    row.calls += 1;
    row.seconds += e.seconds;
    row.bytes += bytes;
  }
  std::mutex mutex;
  std::map<std::pair<int, bool>, OpProfileRow> rows;
};

Profiler& profiler() {
  static auto* p = new Profiler();  // never destroyed: other threads may still report at exit
  return *p;
}
std::atomic<bool> g_profiling{false};

}  // namespace

void set_profiling(bool enabled) {
  if (g_profiling.exchange(enabled) == enabled) return;
  if (enabled) add_global_observer(&profiler());
  else remove_global_observer(&profiler());
}
bool profiling() { return g_profiling.load(std::memory_order_relaxed); }
void reset_profile() {
  std::lock_guard<std::mutex> lock(profiler().mutex);
  profiler().rows.clear();
}

std::vector<OpProfileRow> profile_rows() {
  std::lock_guard<std::mutex> lock(profiler().mutex);
  std::vector<OpProfileRow> rows;
  for (const auto& [k, v] : profiler().rows) rows.push_back(v);
  std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.seconds > b.seconds; });
  return rows;
}

std::string profile_report() {
  auto rows = profile_rows();
  double total = 0;
  for (const auto& r : rows) total += r.seconds;
  std::ostringstream os;
  char line[256];
  std::snprintf(line, sizeof line, "%-32s %4s %9s %11s %8s %7s %11s\n", "op", "dir", "calls", "total ms",
                "us/call", "share", "MB out");
  os << line;
  for (const auto& r : rows) {
    std::snprintf(line, sizeof line, "%-32s %4s %9lld %11.3f %8.1f %6.1f%% %11.2f\n",
                  std::string(op_name(r.op)).c_str(), r.backward ? "bwd" : "fwd",
                  static_cast<long long>(r.calls), r.seconds * 1e3, r.seconds * 1e6 / std::max<int64_t>(r.calls, 1),
                  total > 0 ? 100.0 * r.seconds / total : 0.0, static_cast<double>(r.bytes) / 1e6);
    os << line;
  }
  std::snprintf(line, sizeof line, "%-32s %4s %9s %11.3f\n", "total", "", "", total * 1e3);
  os << line;
  return os.str();
}

}  // namespace demi::ops
