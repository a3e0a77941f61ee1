// Two observers of every op call (demi/ops/observer.h): the op trace, which records what each call ran
// in (tests and users debugging precision), and the profiler, which times every call in every thread.
#pragma once

#include <string>
#include <vector>

#include "demi/ops/observer.h"

namespace demi::ops {

struct OpRecord {
  Op op;
  bool backward = false;
  DType compute_dtype = DType::kF32;
  std::string layer;                 // the innermost cell's path ("" for the root or outside any cell)
  std::vector<DType> input_dtypes;   // as given by the caller, before casting (backward: the incoming gradients')
  std::vector<Shape> input_shapes;
  std::vector<DType> output_dtypes;  // as returned (backward: the gradients of the inputs)
  Shape output_shape;                // the last defined output's
};

// Records every op call in this thread while alive.
class OpTrace : public OpObserver {
 public:
  OpTrace();
  ~OpTrace() override;
  OpTrace(const OpTrace&) = delete;
  OpTrace& operator=(const OpTrace&) = delete;
  const std::vector<OpRecord>& records() const { return records_; }
  // The records of one op, forward only.
  std::vector<OpRecord> of(Op op) const;
  std::string to_string() const;  // one line per call: "  fwd Conv2d  bfloat16 <- [float32, float32] -> ..."
  void on_op(const OpEvent& event) override;

 private:
  std::vector<OpRecord> records_;
  OpObserverScope scope_;
};

struct OpProfileRow {
  Op op;
  bool backward;
  int64_t calls = 0;
  double seconds = 0;
  int64_t bytes = 0;  // bytes of the outputs produced
};
// Times every op call (forward and backward) in every thread while enabled.
void set_profiling(bool enabled);
bool profiling();
void reset_profile();
std::vector<OpProfileRow> profile_rows();  // sorted by time, largest first
std::string profile_report();

}  // namespace demi::ops
