// What AMP actually did: every op of one train step — forward and backward — by layer, with the dtype
// it computed in and the dtypes it wrote, and a summary of how many ops and FLOPs ran in each dtype.
// `demi train --trace-dtypes` prints it for the first batch, for any level and any custom list.
//
// FLOPs: convolutions report their own (2 x multiply-adds); Dense, MatMul, BatchMatMul and attention are
// counted from their shapes; a backward of those counts twice its forward (the input and the weight
// gradients); every other op counts one FLOP per output element.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "demi/amp/train_step.h"
#include "demi/ops/trace.h"

namespace demi::amp {

struct DTypeTraceRow {
  std::string layer;  // "features.0" ("" for the root network)
  std::string type;   // the layer's cell type ("Conv2d")
  ops::Op op;
  bool backward = false;
  DType compute = DType::kF32;
  std::vector<DType> outputs;
  Shape output_shape;  // the first output's (backward: the first input gradient's)
  int64_t flops = 0;
};

struct DTypeTrace {
  std::vector<DTypeTraceRow> rows;  // in execution order
  struct Totals {
    int64_t ops = 0;
    int64_t flops = 0;
  };
  std::map<DType, Totals> forward, backward;  // by compute dtype
  std::string to_string() const;
};

// Traces one step of `step` on (data, label) (TrainStep::run_observed: nothing changes).
DTypeTrace trace_dtypes(TrainStep& step, const Tensor& data, const Tensor& label);

}  // namespace demi::amp
