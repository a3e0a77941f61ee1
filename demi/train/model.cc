#include "demi/train/model.h"

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>

#include "demi/amp/underflow.h"
#include "demi/autograd/autograd.h"
#include "demi/core/context.h"
#include "demi/data/iterator.h"
#include "demi/nn/call_fusion.h"

namespace demi::train {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// Minor page faults of the whole process so far (every thread).
int64_t minor_faults() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_minflt;
}

// The column, element and value of the first non-finite value in a batch's floating columns, if any.
void check_finite(const data::Row& row, const std::vector<std::string>& names, int epoch, int64_t step) {
  for (size_t c = 0; c < row.size(); ++c) {
    const Tensor& t = row[c];
    if (!t.defined() || !is_floating(t.dtype())) continue;
    Tensor f = t.dtype() == DType::kF32 ? t : t.to(DType::kF32);
    const float* p = f.data<float>();
    for (int64_t i = 0; i < f.numel(); ++i) {
      if (std::isfinite(p[i])) continue;
      int64_t per_sample = t.rank() > 0 && t.dim(0) > 0 ? t.numel() / t.dim(0) : 1;
      DEMI_CHECK(false, "input data: column '", c < names.size() ? names[c] : std::to_string(c), "' of the batch at epoch ",
                 epoch, " step ", step, " holds ", p[i], " (sample ", i / per_sample, " of the batch, element ",
                 i % per_sample, ", ", t.describe(), "); training stopped before using it");
    }
  }
}

void check_row(const data::Row& row, const char* what) {
  DEMI_CHECK(row.size() >= 2, "Model.", what, ": each batch needs (input, label) columns, got ", row.size(),
             " column(s)");
}

// The loss scale's early warnings, each said once per train() call at the step it becomes true:
//   - more than 5% of the last 200 steps skipped for overflow (counted from the first applied step, so a
//     dynamic scale's first back-off from 2^24 does not count)
//   - a dynamic scale at its floor that still overflows: the overflow is not a scaling problem
//   - a dynamic scale that has not grown for 10 scale windows: overflows keep it down
class ScaleWatch {
 public:
  static constexpr int kWindow = 200;
  static constexpr int kMaxSkips = 10;  // 5% of kWindow

  // After each step: what the step did and where; returns the warnings it raised (usually none).
  std::vector<std::string> step(const amp::StepResult& r, amp::LossScaleManager* m, const RunContext& ctx) {
    std::vector<std::string> out;
    const auto where = [&] {
      return str_cat("(epoch ", ctx.epoch, ", step ", ctx.cur_step_num, ", loss scale ", r.loss_scale,
                     m ? ", " + m->describe() : std::string(), ")");
    };
    if (!r.skipped) applied_ = true;
    if (applied_) {
      uint8_t& slot = ring_[static_cast<size_t>(seen_++ % kWindow)];
      skips_ += static_cast<int>(r.skipped) - slot;
      slot = r.skipped;
      if (!rate_warned_ && skips_ > kMaxSkips) {
        rate_warned_ = true;
        out.push_back(str_cat(skips_, " of the last ", std::min<int64_t>(seen_, kWindow),
                              " steps were skipped for non-finite gradients, above 5% ", where(),
                              ": each skip is a lost batch. With a fixed scale lower it; with a dynamic one raise "
                              "scale_window or use bfloat16; or check the learning rate and the data."));
      }
    }
    const auto* dyn = dynamic_cast<const amp::DynamicLossScaleManager*>(m);
    if (dyn == nullptr) return out;
    const double now = m->get_loss_scale();
    if (!floor_warned_ && r.overflow && r.loss_scale <= dyn->min_scale()) {
      floor_warned_ = true;
      out.push_back(str_cat("the gradients overflow even at the loss scale's floor (", dyn->min_scale(), ") ", where(),
                            ": scaling cannot fix this — a value overflows float16 by itself (an activation or "
                            "an input beyond 65504, or Inf/NaN in the data). Run `demi train --numerics`, use "
                            "bfloat16, or keep that layer in FP32.",
                            r.overflow_source.found ? " The op: " + r.overflow_source.describe() + "." : std::string()));
    }
    if (first_step_ < 0) first_step_ = ctx.cur_step_num;
    if (now > last_scale_) last_growth_ = ctx.cur_step_num;
    last_scale_ = now;
    const int64_t since = ctx.cur_step_num - std::max(last_growth_, first_step_);
    if (!growth_warned_ && dyn->scale_window() > 0 && since >= 10 * dyn->scale_window()) {
      growth_warned_ = true;
      out.push_back(str_cat("the loss scale has not grown in ", since, " steps (10 scale windows of ",
                            dyn->scale_window(), ") ", where(), ": an overflow in every window keeps it down (",
                            m->state().total_overflows, " overflows so far), so some steps are lost and small "
                            "gradients may underflow. Find the op with `demi train --numerics`, or use bfloat16."));
    }
    return out;
  }

 private:
  std::vector<uint8_t> ring_ = std::vector<uint8_t>(kWindow, 0);
  int64_t seen_ = 0;
  int skips_ = 0;
  bool applied_ = false, rate_warned_ = false, floor_warned_ = false, growth_warned_ = false;
  int64_t first_step_ = -1, last_growth_ = -1;
  double last_scale_ = 0;
};

}  // namespace

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
  summary_ = TrainSummary{};
  ScopedPeak peak;
  const graph::StepGraphs::Stats graph_at_start = train_step_->graphs().stats();
  auto run_start = Clock::now();
  RunContext ctx;
  ctx.model = this;
  ctx.epochs = static_cast<int>(epochs_done_) + epoch;
  const int64_t data_batches = train_dataset->get_dataset_size();  // batches of the unsharded pipeline
  DEMI_CHECK(data_parallel_ == nullptr || data_batches < 0 || data_batches >= dist::get_group_size(),
             "Model.train: the training set has ", data_batches, " batch(es) per epoch (", train_dataset->describe(),
             "), fewer than the ", dist::get_group_size(), " data-parallel processes: each process needs a batch of its "
             "own every step (a process without one would wait for the others forever). Use a smaller batch, more "
             "samples or fewer processes");
  DEMI_CHECK(data_batches != 0, "Model.train: the training set yields no batch per epoch (",
             train_dataset->describe(), "), so nothing would be trained: the data set is empty, or smaller than ",
             "one batch with drop_remainder");
  // With sink_size > 0 an epoch of train() is one sink of sink_size batches, and the data runs on across
  // the data set's epochs (MindSpore's sink_size): the data place is kept apart from the epochs.
  const bool fixed_sinks = sink_size > 0;
  ctx.steps_per_epoch = fixed_sinks ? sink_size : data_batches;
  const int64_t first_data_epoch = data_epoch_ >= 0 ? data_epoch_ : epochs_done_;
  const int64_t first_step_in_epoch = resume_step_in_epoch_ >= 0 ? resume_step_in_epoch_ : resume_position_;
  DEMI_CHECK(first_step_in_epoch == 0 || resume_steps_per_epoch_ <= 0 || ctx.steps_per_epoch == resume_steps_per_epoch_,
             "Model.train: the checkpoint was taken mid-epoch, after batch ", first_step_in_epoch, " of ",
             resume_steps_per_epoch_, ", but ",
             fixed_sinks ? str_cat("this run's sinks have ", ctx.steps_per_epoch, " batches (sink_size)")
                         : str_cat("this training set has ", ctx.steps_per_epoch, " batches per epoch (",
                                   train_dataset->describe(), ")"),
             ": resuming there would not continue the same run. Resume with the checkpointed run's batch size, ",
             "data and sink_size, or from a checkpoint taken at the end of an epoch");
  data::IteratorOptions io;
  io.prefetch = dataset_sink_mode ? options_.prefetch_depth : 0;
  io.epoch = first_data_epoch;
  io.position = resume_position_;
  io.num_epochs = epoch;
  if (fixed_sinks) {  // the data epochs the sinks will reach into
    const int64_t batches = resume_position_ + static_cast<int64_t>(epoch) * sink_size - first_step_in_epoch;
    io.num_epochs = data_batches > 0 ? (batches + data_batches - 1) / data_batches : -1;
  }
  ctx.cur_step_num = steps_done_;
  std::shared_ptr<const data::Dataset> ds = train_dataset;
  dist::DataParallel* dp = data_parallel_.get();
  if (dp != nullptr) {
    // This process's batches; the resumed position is in the unsharded pipeline's batches.
    ds = train_dataset->shard({.num_shards = dist::get_group_size(), .shard_id = dist::get_rank(),
                               .start_epoch = first_data_epoch, .start_offset = resume_position_});
    io.position = 0;
    if (dist::get_auto_parallel_context().parameter_broadcast) dist::broadcast_state(*network_);
  }
  auto it = ds->create_iterator(io);
  // A callback's request to stop, agreed by every process (one process stopping alone would leave the
  // others waiting in the next step's collectives).
  const auto agreed = [dp](bool local) {
    if (dp == nullptr) return local;
    int64_t flag = local ? 1 : 0;
    dist::all_reduce_max(std::span<int64_t>(&flag, 1), "the all-reduce of the callbacks' stop requests");
    return flag != 0;
  };
  for (auto& cb : callbacks) cb->on_train_begin(ctx);
  // Steady state: the steps after the first epoch when there are several, else after the first
  // kWarmupSteps (kernel choices, first allocations, the prefetcher filling up): samples/s, the median
  // step, allocations and page faults are measured over those steps only.
  constexpr int64_t kWarmupSteps = 3;
  std::vector<double> step_times, all_step_times;
  double wait_total = 0, busy_total = 0;
  int64_t steady_samples = 0;
  double steady_seconds = 0;
  bool steady_started = false;
  Clock::time_point steady_since;
  int64_t steady_allocs = 0, steady_faults = 0;
  bool stop = false;
  int64_t mid_epoch_position = 0;  // batches of the epoch done when a stop came inside it
  // The last kSkipWindow steps' overflow skips: when most of them were skipped the run is barely
  // training, and the user hears it then, not from a count at the end (once per epoch).
  constexpr int kSkipWindow = 50, kSkipWarn = 40;
  std::vector<uint8_t> skip_ring(kSkipWindow, 0);
  int skips_in_window = 0;
  int64_t window_steps = 0;
  ScaleWatch watch;
  std::vector<std::string> layer_paths;  // adaptive AMP's candidates travel between processes as indices
  if (adapter_ && dp != nullptr)
    for (auto& [path, cell] : network_->cells_and_names()) layer_paths.push_back(path);
  constexpr int64_t kUnderflowEvery = 100;
  constexpr double kUnderflowWarn = 0.01;
  const bool watch_underflow = options_.amp_level != amp::Level::kO0 && options_.low_dtype == DType::kF16;
  bool underflow_warned = false;
  // Sink mode: the steps of one sink run back to back, and callbacks see each sink once: on_step_begin
  // before its first step, on_step_end after its last, with the last step's loss and the sink's counts.
  const bool sinking = sink_size != 0;
  struct Sink {
    bool open = false;
    int64_t steps = 0, skipped = 0, samples = 0;
    double seconds = 0, wait = 0;
  } sink;
  const auto close_sink = [&] {
    ctx.sink_steps = sink.steps;
    ctx.sink_skipped = sink.skipped;
    ctx.batch_size = sink.samples;
    ctx.step_seconds = sink.seconds;
    ctx.data_wait_seconds = sink.wait;
    sink = Sink{};
    for (auto& cb : callbacks) cb->on_step_end(ctx);
  };
  // Where the data pipeline stands, as a checkpoint resumes it: the data epoch and the batches consumed
  // in it (the place of the next batch once an epoch of known size is used up).
  int64_t data_epoch = first_data_epoch, data_position = resume_position_;
  const auto set_data_place = [&] {
    const bool used_up = data_batches > 0 && data_position >= data_batches;
    ctx.data_epoch = used_up ? data_epoch + 1 : data_epoch;
    ctx.data_position = used_up ? 0 : data_position;
  };
  set_data_place();
  const auto fixed_sink_done = [&] { return fixed_sinks && ctx.step_in_epoch >= sink_size; };
  for (int e = 0; e < epoch && !stop; ++e) {
    bool skip_warned = false;
    ctx.epoch = static_cast<int>(epochs_done_) + 1;
    ctx.step_in_epoch = e == 0 ? first_step_in_epoch : 0;
    ctx.metrics.clear();
    for (auto& cb : callbacks) cb->on_epoch_begin(ctx);
    auto epoch_start = Clock::now();
    int64_t epoch_samples = 0;
    double loss_sum = 0;
    int64_t loss_count = 0;
    while (true) {
      // One update: `accumulate` batches of this process (fewer at the end of the epoch). With one batch
      // per update the batch is kept for the train step, which backward-overlaps the gradient reduction.
      const int micro = options_.accumulate;
      double wait = 0;
      int64_t local_samples = 0, local_batches = 0;
      std::optional<data::Row> row;
      const bool steady = epoch > 1 ? e > 0 : ctx.cur_step_num - steps_done_ >= kWarmupSteps;
      if (steady && !steady_started) {
        steady_started = true;
        steady_since = Clock::now();
      }
      const int64_t allocs0 = steady ? mem_stats().system_allocs : 0, faults0 = steady ? minor_faults() : 0;
      double compute_s = 0;
      if (fixed_sink_done()) break;  // the sink (this epoch) is done
      for (int k = 0; k < micro; ++k) {
        auto wait_start = Clock::now();
        row = it->next();
        if (!row && fixed_sinks) {  // a sink runs on into the data set's next epoch
          it->reset();
          ++data_epoch;
          data_position = 0;
          row = it->next();
          DEMI_CHECK(row.has_value(), "Model.train: the training set (", train_dataset->describe(),
                     ") yielded no batch in data epoch ", data_epoch, ", so the sink cannot be filled");
        }
        wait += seconds_since(wait_start);
        if (!row) break;
        if (fixed_sinks) ++data_position;  // (otherwise the place is the epoch's step, below)
        check_row(*row, "train");
        if (options_.check_input_finite)
          check_finite(*row, train_dataset->column_names(), ctx.epoch, ctx.step_in_epoch + local_batches + 1);
        local_samples += (*row)[0].rank() > 0 ? (*row)[0].dim(0) : 1;
        ++local_batches;
        if (micro > 1) {
          auto compute_start = Clock::now();
          train_step_->accumulate((*row)[0], (*row)[1]);
          compute_s += seconds_since(compute_start);
          row.reset();
        }
      }
      if (dp != nullptr) {
        // Every process takes part in every update until none has a batch left; one without a batch
        // contributes nothing and applies the update the others computed.
        const dist::StepShare share = dp->begin_step(local_samples, local_batches);
        if (share.samples == 0) break;
        ctx.batch_size = share.samples;
        ctx.step_in_epoch += share.batches;  // batches of the unsharded pipeline done in this epoch
      } else {
        if (local_batches == 0) break;
        ctx.batch_size = local_samples;
        ctx.step_in_epoch += local_batches;
      }
      ++ctx.cur_step_num;
      ctx.data_wait_seconds = wait;
      if (!fixed_sinks) data_position = ctx.step_in_epoch;  // data-parallel: in the unsharded pipeline's batches
      set_data_place();
      if (!sink.open) {
        sink.open = true;
        ctx.warnings.clear();
        ctx.overflow_op.clear();
        ctx.promotions.clear();
        for (auto& cb : callbacks) cb->on_step_begin(ctx);
      }
      auto step_start = Clock::now();
      // One step in kUnderflowEvery is watched for float16 gradients in the subnormal range (reading
      // them only: a pass over the backward's float16 outputs).
      std::optional<amp::UnderflowWatch> underflow;
      std::optional<ops::OpObserverScope> watching;
      if (watch_underflow && !underflow_warned && ctx.cur_step_num % kUnderflowEvery == 1) {
        underflow.emplace();
        watching.emplace(&*underflow);
      }
      amp::StepResult r = row                 ? (*train_step_)((*row)[0], (*row)[1])
                          : local_batches > 0 ? train_step_->step()
                                              : train_step_->step_without_batch();
      watching.reset();
      double step_s = compute_s + seconds_since(step_start);
      if (steady) {
        ++summary_.steady_steps;
        steady_samples += ctx.batch_size;
        steady_allocs += mem_stats().system_allocs - allocs0;
        steady_faults += minor_faults() - faults0;
        step_times.push_back(step_s);
      }
      all_step_times.push_back(step_s);
      ctx.loss = r.loss;
      ctx.loss_scale = r.loss_scale;
      ctx.overflow = r.overflow;
      ctx.skipped = r.skipped;
      ctx.step_seconds = step_s;
      ++sink.steps;
      sink.skipped += r.skipped;
      sink.samples += ctx.batch_size;
      sink.seconds += step_s;
      sink.wait += wait;
      if (r.overflow_source.found) {
        const amp::OverflowSource& src = r.overflow_source;
        ctx.overflow_op = src.describe();
        const std::string key = str_cat(ops::op_name(src.op), src.backward ? " bwd" : " fwd", " in ",
                                        src.layer.empty() ? std::string("the network") : "'" + src.layer + "'");
        const bool fresh = summary_.overflow_ops.count(key) == 0;
        if (fresh) summary_.overflow_examples[key] = ctx.overflow_op;
        const int64_t seen = ++summary_.overflow_ops[key];
        if (fresh || (seen & (seen - 1)) == 0)  // each new op, then at its 2nd, 4th, 8th, ... overflow
          callback_stream() << "Model.train: overflow at epoch " << ctx.epoch << " step " << ctx.cur_step_num
                            << " (loss scale " << r.loss_scale << ", " << seen << (seen == 1 ? " time" : " times")
                            << "): " << ctx.overflow_op << std::endl;
      }
      bool adapt_counted = false;  // adaptive AMP is acting on this step's overflow (on some process)
      if (adapter_) {
        std::vector<amp::Promotion> promoted;
        if (dp == nullptr) {
          promoted = adapter_->observe(r, loss_scale_manager(), ctx.cur_step_num);
          adapt_counted = adapter_->last_counted();
        } else {
          // A layer any process would promote is promoted on every process, the same one everywhere (the
          // highest-numbered candidate this step; another process's candidate comes back when it recurs).
          const std::string mine = adapter_->candidate(r, loss_scale_manager(), ctx.cur_step_num);
          int64_t pick = -1;
          for (size_t i = 0; i < layer_paths.size(); ++i)
            if (!mine.empty() && layer_paths[i] == mine) pick = static_cast<int64_t>(i);
          int64_t agreed_values[2] = {pick, adapter_->last_counted() ? 1 : 0};
          dist::all_reduce_max(std::span<int64_t>(agreed_values, 2), "the all-reduce of adaptive AMP's promotion candidates");
          pick = agreed_values[0];
          adapt_counted = agreed_values[1] > 0;
          if (pick >= 0) {
            const std::string& layer = layer_paths[static_cast<size_t>(pick)];
            promoted.push_back(adapter_->promote(layer, ctx.cur_step_num,
                                                 layer == mine ? std::string() : "agreed: another process's overflows"));
          }
        }
        if (!promoted.empty()) {  // the program changed: trace it again
          train_step_->graphs().clear();
          eval_graphs_.clear();
        }
        for (const amp::Promotion& p : promoted) {
          std::string line = str_cat("layer '", p.layer, "' (", p.type, ") now runs in FP32 (", p.reason, ")");
          callback_stream() << "Model.train: amp-adapt: " << line << std::endl;
          ctx.promotions.push_back(p.layer);
        }
      }
      // (Not when adaptive AMP is acting on the overflow: the step was skipped, and the layer is promoted.)
      if (options_.stop_on_nonfinite_loss && loss_scale_manager() == nullptr && !adapt_counted)
        DEMI_CHECK(std::isfinite(r.loss), "the loss became ", r.loss, " at epoch ", ctx.epoch, " step ",
                   ctx.step_in_epoch, " (", amp::level_name(options_.amp_level),
                   ", no loss scale); training stopped instead of continuing on garbage. Lower the learning "
                   "rate, check the input data for NaN/Inf, or use a loss-scale manager.",
                   r.overflow_source.found ? " The first op to produce a non-finite value: " + r.overflow_source.describe() + "." : std::string(),
                   r.overflow_source.found && !adapter_ && options_.amp_level != amp::Level::kO0
                       ? " Adaptive AMP (ModelOptions::amp_adapt, demi train --amp-adapt) would run that layer in FP32." : "");
      summary_.skipped_steps += r.skipped;
      uint8_t& slot = skip_ring[static_cast<size_t>(window_steps++ % kSkipWindow)];
      skips_in_window += static_cast<int>(r.skipped) - slot;
      slot = r.skipped;
      if (!skip_warned && window_steps >= kSkipWindow && skips_in_window >= kSkipWarn) {
        skip_warned = true;
        ++summary_.skip_warnings;
        amp::LossScaleManager* m = loss_scale_manager();
        std::string w = str_cat(skips_in_window, " of the last ", kSkipWindow,
                                " steps were skipped for non-finite gradients (epoch ", ctx.epoch, ", step ",
                                ctx.step_in_epoch, ", loss scale ", r.loss_scale, ", ",
                                m ? m->describe() : std::string("no loss-scale manager"),
                                "): the run is barely training. Lower the (fixed) loss scale or use a "
                                "DynamicLossScaleManager; check the learning rate and the input data.");
        callback_stream() << "Model.train: warning: " << w << std::endl;
        ctx.warnings.push_back(w);
        summary_.warnings.push_back(std::move(w));
      }
      if (underflow && !r.overflow && underflow->nonzero() > 0 && underflow->subnormal_share() >= kUnderflowWarn) {
        underflow_warned = true;
        std::string w = str_cat(
            static_cast<int>(std::lround(100 * underflow->subnormal_share())), "% of the float16 gradient values of step ",
            ctx.cur_step_num, " are subnormal (below 2^-14: they lose precision, and those below 2^-24 become zero) at "
            "loss scale ", r.loss_scale, "; the worst is the ", underflow->worst(), " (",
            static_cast<int>(std::lround(100 * underflow->worst_share())), "%). Gradients are underflowing: use a ",
            "(larger) loss scale — a DynamicLossScaleManager finds one — or bfloat16.");
        ctx.warnings.push_back(w);
        summary_.warnings.push_back(w);
        callback_stream() << "Model.train: warning: " << w << std::endl;
      }
      for (const std::string& w : watch.step(r, loss_scale_manager(), ctx)) {
        ctx.warnings.push_back(w);
        summary_.warnings.push_back(w);
        callback_stream() << "Model.train: warning: " << w << std::endl;
      }
      wait_total += wait;
      busy_total += step_s;
      epoch_samples += ctx.batch_size;
      if (std::isfinite(r.loss)) {
        if (std::isnan(summary_.first_loss)) summary_.first_loss = r.loss;
        loss_sum += r.loss;
        ++loss_count;
      }
      const bool budget_spent = options_.max_steps > 0 && ctx.cur_step_num >= options_.max_steps;
      if (!sinking || budget_spent || fixed_sink_done()) {
        close_sink();
        if (agreed(ctx.stop_requested) || budget_spent) {
          stop = true;
          break;
        }
      }
    }
    if (sink.open) close_sink();  // the epoch's data ended inside the sink (sink_size -1: one per epoch)
    ctx.epoch_seconds = seconds_since(epoch_start);
    ctx.epoch_samples_per_second = ctx.epoch_seconds > 0 ? static_cast<double>(epoch_samples) / ctx.epoch_seconds : 0;
    if (loss_count > 0) ctx.metrics["loss"] = loss_sum / static_cast<double>(loss_count);
    summary_.mean_last_epoch_loss = loss_count > 0 ? loss_sum / static_cast<double>(loss_count) : 0;
    summary_.samples += epoch_samples;
    if (steady_started) {
      steady_seconds += seconds_since(steady_since);
      steady_started = false;  // the next epoch's steady time starts with its first steady step
    }
    if (stop && !(ctx.steps_per_epoch > 0 && ctx.step_in_epoch >= ctx.steps_per_epoch)) {
      // Stopped inside the epoch: it is not done, and a later train() continues where this one stopped.
      mid_epoch_position = ctx.step_in_epoch;
      break;
    }
    ++epochs_done_;
    if (!fixed_sinks) {
      data_epoch = first_data_epoch + e + 1;
      data_position = 0;
    }
    set_data_place();
    for (auto& cb : callbacks) cb->on_epoch_end(ctx);
    stop = stop || agreed(ctx.stop_requested);
    if (!fixed_sinks) it->reset();  // fixed sinks: the next epoch's sink continues where this one stopped
  }
  ctx.stopped_mid_epoch = mid_epoch_position > 0;
  for (auto& cb : callbacks) cb->on_train_end(ctx);
  data_epoch_ = ctx.data_epoch;
  resume_position_ = ctx.data_position;
  resume_step_in_epoch_ = fixed_sinks ? mid_epoch_position : -1;
  resume_steps_per_epoch_ = mid_epoch_position > 0 ? ctx.steps_per_epoch : 0;
  steps_done_ = ctx.cur_step_num;
  summary_.steps = ctx.cur_step_num;
  summary_.seconds = seconds_since(run_start);
  summary_.samples_per_second = steady_seconds > 0 ? static_cast<double>(steady_samples) / steady_seconds
                                : summary_.seconds > 0 ? static_cast<double>(summary_.samples) / summary_.seconds
                                                       : 0;
  if (step_times.empty()) step_times = all_step_times;  // a run too short for a steady state
  if (!step_times.empty()) {
    std::vector<double> sorted = step_times;
    std::nth_element(sorted.begin(), sorted.begin() + static_cast<int64_t>(sorted.size() / 2), sorted.end());
    summary_.median_step_seconds = sorted[sorted.size() / 2];
  }
  summary_.data_wait_fraction = wait_total + busy_total > 0 ? wait_total / (wait_total + busy_total) : 0;
  summary_.final_loss = ctx.loss;
  summary_.final_loss_scale = loss_scale_manager() ? loss_scale_manager()->get_loss_scale() : 1.0;
  if (adapter_) summary_.promotions = adapter_->promotions();
  summary_.peak = peak.peak();
  summary_.peak_rss_bytes = process_peak_rss_bytes();
  summary_.reserved_end = mem_stats().reserved;
  {
    summary_.graph = train_step_->graphs().stats().since(graph_at_start);
    summary_.graph_plan = {};
    std::string fallbacks;  // every key's, whichever plan is shown
    for (const auto& [key, plan] : train_step_->graphs().plans()) {
      if (plan.arena_bytes >= summary_.graph_plan.arena_bytes) summary_.graph_plan = plan;
      if (!plan.fallback.empty()) fallbacks += str_cat(fallbacks.empty() ? "" : "; ", key, ": ", plan.fallback);
    }
    summary_.graph_plan.fallback = fallbacks;
  }
  if (summary_.steady_steps > 0) {
    summary_.system_allocs_per_step = static_cast<double>(steady_allocs) / static_cast<double>(summary_.steady_steps);
    summary_.page_faults_per_step = static_cast<double>(steady_faults) / static_cast<double>(summary_.steady_steps);
  }
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
    MemCategoryScope activations(MemCategory::kActivation);
    while (auto row = it->next()) {
      check_row(*row, "eval");
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
          if (nn::CallFusions::could_fuse(*network_)) (void)network_->call(nn::CallFusions::learning_batch(data));
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
