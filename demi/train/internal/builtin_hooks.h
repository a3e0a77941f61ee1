// The step hooks Model::train runs by itself (train/hooks.h), in this order at every point. Each is one
// concern of the training loop; a new adaptation or diagnostic is a hook here (and its switch in
// ModelOptions), not a change to the loop.
#pragma once

#include <vector>

#include "demi/train/hooks.h"

namespace demi::train::internal {

// The built-in hooks for `model`'s options, then the callbacks' hook (their on_step_* at sink ends):
//   - overflow log: names the op behind each overflowing update ("Model.train: overflow at epoch 1 step 3
//     (loss scale 65536, 1 time): ..."), each new op and then its 2nd, 4th, 8th, ...; counts them in
//     TrainSummary::overflow_ops and sets RunContext::overflow_op;
//   - adaptive AMP (ModelOptions::amp_adapt): promotes a layer that keeps overflowing to FP32, agreed by
//     every data-parallel process, and forgets graph mode's plans (the program changed);
//   - the loss stop (ModelOptions::stop_on_nonfinite_loss, without a loss scale): a non-finite loss is an
//     error naming the op, instead of training on garbage;
//   - the skip watch: most of the last 50 updates skipped for non-finite gradients (once per epoch);
//   - the underflow watch (float16 below O0): one update in 100 reads the float16 gradients, and warns once
//     when 1% or more are subnormal;
//   - the loss-scale watch: skips above 5% of 200 updates, a dynamic scale at its floor still overflowing,
//     a dynamic scale that has not grown in 10 windows (each said once);
//   - the callbacks (MindSpore's Callback): train, epoch and sink (their "step") begin and end.
std::vector<TrainHookPtr> builtin_hooks(Model& model, std::vector<CallbackPtr> callbacks);

}  // namespace demi::train::internal
