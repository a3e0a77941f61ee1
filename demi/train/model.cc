#include "demi/train/model.h"

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>

#include "demi/autograd/autograd.h"
#include "demi/core/context.h"
#include "demi/data/iterator.h"
#include "demi/nn/call_fusion.h"
#include "demi/train/internal/builtin_hooks.h"
#include "demi/train/internal/train_loop.h"

namespace demi::train {

Model::Model(std::shared_ptr<nn::Cell> network, std::shared_ptr<nn::LossCell> loss_fn,
             std::shared_ptr<optim::Optimizer> optimizer, std::map<std::string, MetricPtr> metrics,
             const ModelOptions& options)
    : network_(std::move(network)),
      loss_fn_(std::move(loss_fn)),
      optimizer_(std::move(optimizer)),
      metrics_(std::move(metrics)),
      options_(options) {
  DEMI_CHECK(network_ && loss_fn_ && optimizer_, "Model: network, loss_fn and optimizer are required");
  amp::TrainOptions t;
  t.low_dtype = options.low_dtype;
  t.loss_scale_manager = options.loss_scale_manager;
  t.keep_batchnorm_fp32 = options.keep_batchnorm_fp32;
  t.low_precision_param_grads = options.low_precision_param_grads;
  t.optimizer_in_backward = options.optimizer_in_backward;
  // Adaptive AMP promotes the layers overflow attribution names, which an update in backward does not run.
  if (options.amp_adapt && !t.optimizer_in_backward.has_value()) t.optimizer_in_backward = false;
  t.no_loss_scale = options.no_loss_scale;
  t.clip_grad_norm = options.clip_grad_norm;
  t.f16_products = options.f16_products;
  DEMI_CHECK(options.accumulate >= 1, "Model: accumulate (batches per update) must be >= 1, got ", options.accumulate);
  DEMI_CHECK(options.max_steps == -1 || options.max_steps >= 1, "Model: max_steps must be >= 1 (-1: no budget), got ",
             options.max_steps);
  train_step_ = amp::build_train_network(network_, optimizer_, loss_fn_, options.amp_level, t);
  train_step_->set_attribute_overflow(options.attribute_overflow);
  train_step_->graphs().set_warning_sink(
      [](const std::string& m) { callback_stream() << "Model.train: " << m << std::endl; });
  eval_graphs_.set_warning_sink([](const std::string& m) { callback_stream() << "Model.eval: " << m << std::endl; });
  eval_graphs_.set_rewrites(amp::make_call_fusions);
  if (options.amp_adapt) {
    DEMI_CHECK(options.optimizer_in_backward != true,
               "Model: amp_adapt promotes the layers overflow attribution names, ",
               "which the optimizer in backward does not run; turn one of them off");
    DEMI_CHECK(options.attribute_overflow, "Model: amp_adapt needs attribute_overflow (it promotes the layers that "
               "overflow attribution names)");
    adapter_ = std::make_shared<amp::AmpAdapter>(network_, options.adapt);
  }
  if (dist::data_parallel()) {
    data_parallel_ = std::make_shared<dist::DataParallel>(optimizer_->parameters(), train_step_->parameter_names(),
                                                          dist::get_auto_parallel_context());
    train_step_->set_grad_reducer(data_parallel_);
  }
}

void Model::train(int epoch, const std::shared_ptr<const data::Dataset>& train_dataset,
                  std::vector<CallbackPtr> callbacks, bool dataset_sink_mode, int64_t sink_size) {
  DEMI_CHECK(epoch >= 1, "Model.train: epoch must be >= 1, got ", epoch);
  DEMI_CHECK(sink_size >= -1, "Model.train: sink_size must be -1 (one sink per epoch), 0 (no sinking: callbacks ",
             "every step) or the batches per sink, got ", sink_size);
  DEMI_CHECK(sink_size <= 0 || dataset_sink_mode, "Model.train: sink_size ", sink_size,
             " needs dataset_sink_mode=true (without sink mode there are no sinks; MindSpore ignores the value, ",
             "demi refuses a setting it would not use)");
  if (!dataset_sink_mode) sink_size = 0;  // the default -1 sinks only in sink mode, as MindSpore's does
  DEMI_CHECK(sink_size <= 0 || sink_size % options_.accumulate == 0, "Model.train: sink_size ", sink_size,
             " must be a multiple of accumulate (", options_.accumulate, " batches per update), so that no update ",
             "straddles two sinks");
  DEMI_CHECK(sink_size <= 0 || data_parallel_ == nullptr, "Model.train: sink_size ", sink_size,
             " (epochs of a fixed number of batches, the data running on across the data set's epochs) is not "
             "supported data-parallel yet; use sink_size -1 (one sink per epoch) or 0");
  DEMI_CHECK(options_.max_steps < 0 || steps_done_ < options_.max_steps, "Model.train: the step budget (max_steps ",
             options_.max_steps, ") is already spent: ", steps_done_, " updates were made");
  DEMI_CHECK(train_dataset != nullptr, "Model.train: no dataset");
  std::vector<TrainHookPtr> hooks = internal::builtin_hooks(*this, std::move(callbacks));
  hooks.insert(hooks.end(), hooks_.begin(), hooks_.end());
  internal::TrainRun(*this, epoch, train_dataset, dataset_sink_mode, sink_size, std::move(hooks)).run();
}

void Model::add_hook(TrainHookPtr hook) {
  DEMI_CHECK(hook != nullptr, "Model.add_hook: the hook is null");
  hooks_.push_back(std::move(hook));
}

void Model::forget_graph_plans() {
  train_step_->graphs().clear();
  eval_graphs_.clear();
}

std::map<std::string, double> Model::eval(const std::shared_ptr<const data::Dataset>& dataset, bool dataset_sink_mode) {
  DEMI_CHECK(dataset != nullptr, "Model.eval: no dataset");
  DEMI_CHECK(!metrics_.empty(), "Model.eval: the model has no metrics (pass {\"Accuracy\", ...} to Model)");
  network_->set_train(false);
  for (auto& [name, m] : metrics_) m->clear();
  data::IteratorOptions io;
  io.prefetch = dataset_sink_mode ? options_.prefetch_depth : 0;
  io.num_epochs = 1;
  // Data parallel with additive metrics: each process evaluates its share of the batches with rank 0's
  // buffers (the running statistics checkpoints keep), and the metrics' sums are added.
  bool split = data_parallel_ != nullptr;
  for (const auto& [name, m] : metrics_) split = split && !m->sums().empty();
  std::shared_ptr<const data::Dataset> ds = dataset;
  if (split) {
    dist::broadcast_state(*network_);
    ds = dataset->shard({.num_shards = dist::get_group_size(), .shard_id = dist::get_rank()});
  }
  auto it = ds->create_iterator(io);
  {
    autograd::NoGradGuard no_grad;
    F16ProductsScope products(train_step_->f16_products());
    MemCategoryScope activations(MemCategory::kActivation);
    while (auto row = it->next()) {
      internal::check_row(*row, "eval");
      const Tensor& data = (*row)[0];
      const Tensor& label = (*row)[1];
      auto batch = [&] {
        Tensor logits = network_->call(data);
        Tensor loss;
        for (auto& [name, m] : metrics_) {
          if (dynamic_cast<Loss*>(m.get()) != nullptr) {
            if (!loss.defined()) loss = (*loss_fn_)(logits, label);
            m->update(loss, label);
          } else {
            m->update(logits, label);
          }
        }
        return true;
      };
      if (get_context().mode == ExecMode::kGraph) {
        eval_graphs_.run(eval_key_.get("eval", &data, &label), batch, [&] {
          if (!nn::CallFusions::could_fuse(*network_)) return;
          MemTuningScope probe;  // (a probe, as TrainStep's: core/memory.h)
          (void)network_->call(nn::CallFusions::learning_batch(data));
        });
      } else {
        batch();
      }
    }
  }
  network_->set_train(true);
  if (split) {
    std::vector<double> all;
    for (const auto& [name, m] : metrics_) {
      std::vector<double> s = m->sums();
      all.insert(all.end(), s.begin(), s.end());
    }
    dist::all_reduce_sum(std::span<double>(all), "the all-reduce of the eval metrics");
    size_t at = 0;
    for (auto& [name, m] : metrics_) {
      const size_t n = m->sums().size();
      m->set_sums(std::vector<double>(all.begin() + static_cast<int64_t>(at), all.begin() + static_cast<int64_t>(at + n)));
      at += n;
    }
  }
  std::map<std::string, double> out;
  for (auto& [name, m] : metrics_) out[name] = m->eval();
  return out;
}

Tensor Model::predict(const Tensor& input) {
  network_->set_train(false);
  Tensor y;
  {
    autograd::NoGradGuard no_grad;
    F16ProductsScope products(train_step_->f16_products());
    y = network_->call(input);
  }
  network_->set_train(true);
  return y.dtype() == DType::kF32 ? y : y.to(DType::kF32);
}

namespace {

// Sees every op of the probe and does nothing: run_observed's observer.
class NullObserver : public ops::OpObserver {
 public:
  void on_op(const ops::OpEvent&) override {}
};

// Names the op call during which the probe's training peak was reached: the last call after which the peak
// had risen (ops report when they finish, so the peak fell inside that call, or between it and the call
// before).
class PeakOp : public ops::OpObserver {
 public:
  explicit PeakOp(const ScopedPeak& peak) : peak_(peak) {}
  void on_op(const ops::OpEvent& e) override {
    const int64_t now = peak_.peak().train_peak;
    if (now <= last_) return;
    last_ = now;
    where_ = str_cat(ops::op_name(e.op), e.backward ? " backward" : " forward",
                     e.layer == nullptr ? std::string(" outside any cell")
                     : *e.layer == '\0' ? std::string(" in the network's own construct")
                                        : str_cat(" in '", e.layer, "'"));
  }
  std::string where(int64_t final_peak) const {
    return final_peak > last_ ? std::string("after the last op (the step's own bookkeeping)") : where_;
  }

 private:
  const ScopedPeak& peak_;
  int64_t last_ = 0;
  std::string where_;
};

}  // namespace

MemForecast Model::forecast(const Tensor& data, const Tensor& label) {
  DEMI_CHECK(data.defined() && label.defined(), "Model::forecast: a batch (data and label) is required");
  NullObserver quiet;
  train_step_->run_observed(data, label, quiet);  // the kernel choices for these shapes, made now
  ScopedPeak peak;
  PeakOp at(peak);
  train_step_->run_observed(data, label, at);
  const MemStats m = peak.peak();
  MemForecast f;
  f.train_peak = m.train_peak;
  f.at_peak = m.at_train_peak;
  f.peak_op = at.where(m.train_peak);
  return f;
}

}  // namespace demi::train
