// Data parallelism: every process holds the whole model, trains on its own batches, and the processes
// combine their gradients before each update, so they all apply the same update and stay equal.
//
//   auto dp = std::make_shared<dist::DataParallel>(optimizer->parameters(), names, dist::get_auto_parallel_context());
//   train_step->set_grad_reducer(dp);           // train::Model does this itself in data-parallel mode
//   dist::broadcast_state(*net);                // start equal
//   for (...) { dp->begin_step(batch_size); train_step(data, label); }
//
// Gradients are copied into flat FP32 buckets (reverse registration order: the order backward completes
// them; a small first bucket, then bucket_cap_mb), each weighted by this process's share of the global
// batch; a bucket whose last gradient backward has completed is all-reduced on the communication thread
// while backward goes on; reduce() waits for the rest and copies the sums back into .grad. The buckets
// are laid out again once, after the first overlapped step, in the order backward actually completed the
// gradients (as PyTorch's DDP does).
//
// The update's decision is agreed: agree() sums the weighted losses and ORs the overflow flags in one
// small all-reduce, so with a dynamic loss scale every process skips the same steps and keeps the same
// scale even if only one process's gradients overflowed.
//
// BatchNorm statistics are per process (each normalizes its own batch; running statistics are each
// process's own, rank 0's are the ones checkpoints keep) — PyTorch DDP's default, not SyncBatchNorm.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "demi/amp/train_step.h"
#include "demi/distributed/distributed.h"
#include "demi/nn/cell.h"

namespace demi::dist {

// Copies every parameter and buffer of `net` from rank 0 (no-op in a world of one).
void broadcast_state(nn::Cell& net);

// What the reducer did, summed since construction.
struct DataParallelStats {
  int64_t steps = 0;
  int64_t buckets_reduced = 0;
  int64_t bytes_sent = 0;        // payload of the all-reduces (per process)
  double reduce_seconds = 0;     // time the communication thread spent reducing buckets
  double exposed_seconds = 0;    // time reduce() waited for them after backward (what overlap did not hide)
};

// One update's global batch: samples and batches over every process.
struct StepShare {
  int64_t samples = 0;
  int64_t batches = 0;
};

class DataParallel final : public amp::GradReducer {
 public:
  // `params` in registration order (an optimizer's parameters()), `names` their paths for messages.
  DataParallel(std::vector<Tensor> params, std::vector<std::string> names, const AutoParallelContext& context);
  ~DataParallel() override;

  // Before each update: this process's batch size this step (0 when it has none); returns the global
  // batch (samples 0: no process has a batch left). Sets this process's weight: its share of the global
  // batch (gradients_mean) or 1 (sum).
  StepShare begin_step(int64_t local_samples, int64_t local_batches = -1);  // -1: 1 if local_samples > 0

  void gradient_ready(const Tensor& param) override;
  void reduce(const std::vector<Tensor>& params, int64_t micro_batches) override;
  void agree(float& loss, bool& overflow) override;

  int num_buckets() const { return static_cast<int>(buckets_.size()); }
  // The parameter indices of each bucket, in reduction order.
  std::vector<std::vector<int>> bucket_layout() const;
  const DataParallelStats& stats() const { return stats_; }

 private:
  struct Bucket;
  void layout(const std::vector<int>& order);
  void post(Bucket& b);

  std::vector<Tensor> params_;
  std::vector<std::string> names_;
  AutoParallelContext context_;
  std::vector<std::unique_ptr<Bucket>> buckets_;
  std::vector<int> bucket_of_;                     // per parameter
  std::unordered_map<const void*, int> index_of_;  // TensorImpl -> parameter
  std::vector<int> ready_order_;                   // observed in the first overlapped step
  bool relaid_ = false;
  double weight_ = 1;       // this process's gradients are multiplied by it before the sum
  double micro_ = 1;        // and divided by its micro-batch count (set by reduce)
  double loss_weight_ = 1;  // and its loss (the share of the global batch)
  DataParallelStats stats_;
};

}  // namespace demi::dist
