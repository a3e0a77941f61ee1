#include "demi/train/internal/train_loop.h"

#include <sys/resource.h>

#include <algorithm>
#include <cmath>

#include "demi/distributed/distributed.h"
#include "demi/train/model.h"

namespace demi::train::internal {
namespace {

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

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

}  // namespace

void check_row(const data::Row& row, const char* what) {
  DEMI_CHECK(row.size() >= 2, "Model.", what, ": each batch needs (input, label) columns, got ", row.size(),
             " column(s)");
}

TrainRun::TrainRun(Model& model, int epochs, std::shared_ptr<const data::Dataset> dataset, bool sink_mode,
                   int64_t sink_size, std::vector<TrainHookPtr> hooks)
    : model_(model),
      epochs_(epochs),
      dataset_(std::move(dataset)),
      sink_mode_(sink_mode),
      sink_size_(sink_size),
      fixed_sinks_(sink_size > 0),
      hooks_(std::move(hooks)),
      loop_{.model = model, .context = ctx_, .summary = model.summary_, .step = {}, .sinking = sink_size != 0} {}

void TrainRun::run() {
  Model& m = model_;
  m.summary_ = TrainSummary{};
  ScopedPeak peak;
  const graph::StepGraphs::Stats graph_at_start = m.train_step_->graphs().stats();
  run_start_ = Clock::now();
  ctx_.model = &m;
  ctx_.epochs = static_cast<int>(m.epochs_done_) + epochs_;
  open_data();
  // The train step tells the hooks of each batch's forward and backward while this call runs.
  struct PhaseObserving {
    amp::TrainStep& step;
    ~PhaseObserving() { step.set_phase_observer(nullptr); }
  } observing{*m.train_step_};
  m.train_step_->set_phase_observer([this](amp::TrainStep::Phase phase, float loss) {
    if (phase == amp::TrainStep::Phase::kAfterForward)
      each([&](TrainHook& h) { h.on_after_forward(loop_, loss); });
    else
      each([&](TrainHook& h) { h.on_after_backward(loop_); });
  });
  each([&](TrainHook& h) { h.on_train_begin(loop_); });
  bool stop = false;
  for (int e = 0; e < epochs_ && !stop; ++e) stop = run_epoch(e);
  ctx_.stopped_mid_epoch = mid_epoch_position_ > 0;
  each([&](TrainHook& h) { h.on_train_end(loop_); });
  m.summary_.graph = m.train_step_->graphs().stats().since(graph_at_start);
  finish(peak.peak());
}

void TrainRun::open_data() {
  Model& m = model_;
  dist::DataParallel* dp = m.data_parallel_.get();
  data_batches_ = dataset_->get_dataset_size();
  DEMI_CHECK(dp == nullptr || data_batches_ < 0 || data_batches_ >= dist::get_group_size(),
             "Model.train: the training set has ", data_batches_, " batch(es) per epoch (", dataset_->describe(),
             "), fewer than the ", dist::get_group_size(), " data-parallel processes: each process needs a batch of its "
             "own every step (a process without one would wait for the others forever). Use a smaller batch, more "
             "samples or fewer processes");
  DEMI_CHECK(data_batches_ != 0, "Model.train: the training set yields no batch per epoch (", dataset_->describe(),
             "), so nothing would be trained: the data set is empty, or smaller than one batch with drop_remainder");
  // With sink_size > 0 an epoch of train() is one sink of sink_size batches, and the data runs on across
  // the data set's epochs (MindSpore's sink_size): the data place is kept apart from the epochs.
  ctx_.steps_per_epoch = fixed_sinks_ ? sink_size_ : data_batches_;
  first_data_epoch_ = m.data_epoch_ >= 0 ? m.data_epoch_ : m.epochs_done_;
  first_step_in_epoch_ = m.resume_step_in_epoch_ >= 0 ? m.resume_step_in_epoch_ : m.resume_position_;
  DEMI_CHECK(first_step_in_epoch_ == 0 || m.resume_steps_per_epoch_ <= 0 ||
                 ctx_.steps_per_epoch == m.resume_steps_per_epoch_,
             "Model.train: the checkpoint was taken mid-epoch, after batch ", first_step_in_epoch_, " of ",
             m.resume_steps_per_epoch_, ", but ",
             fixed_sinks_ ? str_cat("this run's sinks have ", ctx_.steps_per_epoch, " batches (sink_size)")
                          : str_cat("this training set has ", ctx_.steps_per_epoch, " batches per epoch (",
                                    dataset_->describe(), ")"),
             ": resuming there would not continue the same run. Resume with the checkpointed run's batch size, ",
             "data and sink_size, or from a checkpoint taken at the end of an epoch");
  data::IteratorOptions io;
  io.prefetch = sink_mode_ ? m.options_.prefetch_depth : 0;
  io.epoch = first_data_epoch_;
  io.position = m.resume_position_;
  io.num_epochs = epochs_;
  if (fixed_sinks_) {  // the data epochs the sinks will reach into
    const int64_t batches = m.resume_position_ + static_cast<int64_t>(epochs_) * sink_size_ - first_step_in_epoch_;
    io.num_epochs = data_batches_ > 0 ? (batches + data_batches_ - 1) / data_batches_ : -1;
  }
  ctx_.cur_step_num = m.steps_done_;
  std::shared_ptr<const data::Dataset> ds = dataset_;
  if (dp != nullptr) {
    // This process's batches; the resumed position is in the unsharded pipeline's batches.
    ds = dataset_->shard({.num_shards = dist::get_group_size(), .shard_id = dist::get_rank(),
                          .start_epoch = first_data_epoch_, .start_offset = m.resume_position_});
    io.position = 0;
    if (dist::get_auto_parallel_context().parameter_broadcast) dist::broadcast_state(*m.network_);
  }
  it_ = ds->create_iterator(io);
  data_epoch_ = first_data_epoch_;
  data_position_ = m.resume_position_;
  set_data_place();
}

// The data place in the RunContext: the data epoch and the batches consumed in it (the place of the next
// batch once an epoch of known size is used up).
void TrainRun::set_data_place() {
  const bool used_up = data_batches_ > 0 && data_position_ >= data_batches_;
  ctx_.data_epoch = used_up ? data_epoch_ + 1 : data_epoch_;
  ctx_.data_position = used_up ? 0 : data_position_;
}

// A request to stop, agreed by every process (one process stopping alone would leave the others waiting in
// the next step's collectives).
bool TrainRun::agreed(bool local) {
  if (model_.data_parallel_ == nullptr) return local;
  int64_t flag = local ? 1 : 0;
  dist::all_reduce_max(std::span<int64_t>(&flag, 1), "the all-reduce of the callbacks' stop requests");
  return flag != 0;
}

bool TrainRun::run_epoch(int e) {
  Model& m = model_;
  ctx_.epoch = static_cast<int>(m.epochs_done_) + 1;
  ctx_.step_in_epoch = e == 0 ? first_step_in_epoch_ : 0;
  ctx_.metrics.clear();
  each([&](TrainHook& h) { h.on_epoch_begin(loop_); });
  const auto epoch_start = Clock::now();
  epoch_samples_ = 0;
  loss_sum_ = 0;
  loss_count_ = 0;
  bool stop = false;
  while (!stop) {
    loop_.step.steady = epochs_ > 1 ? e > 0 : ctx_.cur_step_num - m.steps_done_ >= kWarmupSteps;
    if (loop_.step.steady && !steady_started_) {
      steady_started_ = true;
      steady_since_ = Clock::now();
    }
    const bool steady = loop_.step.steady;
    const int64_t allocs0 = steady ? mem_stats().system_allocs : 0, faults0 = steady ? minor_faults() : 0;
    if (fixed_sink_done() || !read_update()) break;  // the sink (this epoch) is done, or the epoch's data
    stop = run_update(allocs0, faults0);
  }
  if (sink_.open) close_sink();  // the epoch's data ended inside the sink (sink_size -1: one per epoch)
  ctx_.epoch_seconds = seconds_since(epoch_start);
  ctx_.epoch_samples_per_second = ctx_.epoch_seconds > 0 ? static_cast<double>(epoch_samples_) / ctx_.epoch_seconds : 0;
  if (loss_count_ > 0) ctx_.metrics["loss"] = loss_sum_ / static_cast<double>(loss_count_);
  m.summary_.mean_last_epoch_loss = loss_count_ > 0 ? loss_sum_ / static_cast<double>(loss_count_) : 0;
  m.summary_.samples += epoch_samples_;
  if (steady_started_) {
    steady_seconds_ += seconds_since(steady_since_);
    steady_started_ = false;  // the next epoch's steady time starts with its first steady step
  }
  if (stop && !(ctx_.steps_per_epoch > 0 && ctx_.step_in_epoch >= ctx_.steps_per_epoch)) {
    // Stopped inside the epoch: it is not done, and a later train() continues where this one stopped.
    mid_epoch_position_ = ctx_.step_in_epoch;
    return true;
  }
  ++m.epochs_done_;
  if (!fixed_sinks_) {
    data_epoch_ = first_data_epoch_ + e + 1;
    data_position_ = 0;
  }
  set_data_place();
  each([&](TrainHook& h) { h.on_epoch_end(loop_); });
  stop = stop || agreed(ctx_.stop_requested);
  if (!fixed_sinks_) it_->reset();  // fixed sinks: the next epoch's sink continues where this one stopped
  return stop;
}

// One update's batches: `accumulate` of this process's (fewer at the end of the epoch). With one batch per
// update the batch is kept for the train step, which backward-overlaps the gradient reduction; with more,
// each one's forward and backward runs as it is read.
bool TrainRun::read_update() {
  Model& m = model_;
  const int micro = m.options_.accumulate;
  double wait = 0;
  int64_t local_samples = 0, local_batches = 0;
  compute_seconds_ = 0;
  row_.reset();
  for (int k = 0; k < micro; ++k) {
    auto wait_start = Clock::now();
    row_ = it_->next();
    if (!row_ && fixed_sinks_) {  // a sink runs on into the data set's next epoch
      it_->reset();
      ++data_epoch_;
      data_position_ = 0;
      row_ = it_->next();
      DEMI_CHECK(row_.has_value(), "Model.train: the training set (", dataset_->describe(),
                 ") yielded no batch in data epoch ", data_epoch_, ", so the sink cannot be filled");
    }
    wait += seconds_since(wait_start);
    if (!row_) break;
    if (fixed_sinks_) ++data_position_;  // (otherwise the place is the epoch's step, below)
    check_row(*row_, "train");
    if (m.options_.check_input_finite)
      check_finite(*row_, dataset_->column_names(), ctx_.epoch, ctx_.step_in_epoch + local_batches + 1);
    local_samples += (*row_)[0].rank() > 0 ? (*row_)[0].dim(0) : 1;
    ++local_batches;
    if (micro > 1) {
      auto compute_start = Clock::now();
      m.train_step_->accumulate((*row_)[0], (*row_)[1]);
      compute_seconds_ += seconds_since(compute_start);
      row_.reset();
    }
  }
  if (dist::DataParallel* dp = m.data_parallel_.get(); dp != nullptr) {
    // Every process takes part in every update until none has a batch left; one without a batch
    // contributes nothing and applies the update the others computed.
    const dist::StepShare share = dp->begin_step(local_samples, local_batches);
    if (share.samples == 0) return false;
    ctx_.batch_size = share.samples;
    ctx_.step_in_epoch += share.batches;  // batches of the unsharded pipeline done in this epoch
  } else {
    if (local_batches == 0) return false;
    ctx_.batch_size = local_samples;
    ctx_.step_in_epoch += local_batches;
  }
  local_batches_ = local_batches;
  wait_ = wait;
  ++ctx_.cur_step_num;
  ctx_.data_wait_seconds = wait;
  if (!fixed_sinks_) data_position_ = ctx_.step_in_epoch;  // data-parallel: in the unsharded pipeline's batches
  set_data_place();
  return true;
}

bool TrainRun::run_update(int64_t allocs0, int64_t faults0) {
  Model& m = model_;
  TrainSummary& summary = m.summary_;
  if (!sink_.open) {
    sink_.open = true;
    ctx_.warnings.clear();
    ctx_.overflow_op.clear();
    ctx_.promotions.clear();
    each([&](TrainHook& h) { h.on_sink_begin(loop_); });
  }
  StepRecord& rec = loop_.step;
  rec = StepRecord{.result = {}, .samples = ctx_.batch_size, .batches = local_batches_, .seconds = 0,
                   .data_wait_seconds = wait_, .steady = rec.steady, .adapt_acting = false};
  each([&](TrainHook& h) { h.on_step_begin(loop_); });
  const auto step_start = Clock::now();
  rec.result = row_                 ? (*m.train_step_)((*row_)[0], (*row_)[1])
               : local_batches_ > 0 ? m.train_step_->step()
                                    : m.train_step_->step_without_batch();
  rec.seconds = compute_seconds_ + seconds_since(step_start);
  const amp::StepResult& r = rec.result;
  if (rec.steady) {
    ++summary.steady_steps;
    steady_samples_ += ctx_.batch_size;
    steady_allocs_ += mem_stats().system_allocs - allocs0;
    steady_faults_ += minor_faults() - faults0;
    step_times_.push_back(rec.seconds);
  }
  all_step_times_.push_back(rec.seconds);
  ctx_.loss = r.loss;
  ctx_.loss_scale = r.loss_scale;
  ctx_.overflow = r.overflow;
  ctx_.skipped = r.skipped;
  ctx_.step_seconds = rec.seconds;
  ++sink_.steps;
  sink_.skipped += r.skipped;
  sink_.samples += ctx_.batch_size;
  sink_.seconds += rec.seconds;
  sink_.wait += wait_;
  each([&](TrainHook& h) { h.on_after_update(loop_); });
  summary.skipped_steps += r.skipped;
  wait_total_ += wait_;
  busy_total_ += rec.seconds;
  epoch_samples_ += ctx_.batch_size;
  if (std::isfinite(r.loss)) {
    if (std::isnan(summary.first_loss)) summary.first_loss = r.loss;
    loss_sum_ += r.loss;
    ++loss_count_;
  }
  each([&](TrainHook& h) { h.on_step_end(loop_); });
  const bool budget_spent = m.options_.max_steps > 0 && ctx_.cur_step_num >= m.options_.max_steps;
  if (loop_.sinking && !budget_spent && !fixed_sink_done()) return false;
  close_sink();
  return agreed(ctx_.stop_requested) || budget_spent;
}

void TrainRun::close_sink() {
  ctx_.sink_steps = sink_.steps;
  ctx_.sink_skipped = sink_.skipped;
  ctx_.batch_size = sink_.samples;
  ctx_.step_seconds = sink_.seconds;
  ctx_.data_wait_seconds = sink_.wait;
  sink_ = Sink{};
  each([&](TrainHook& h) { h.on_sink_end(loop_); });
}

void TrainRun::finish(const MemStats& peak) {
  Model& m = model_;
  TrainSummary& s = m.summary_;
  m.data_epoch_ = ctx_.data_epoch;
  m.resume_position_ = ctx_.data_position;
  m.resume_step_in_epoch_ = fixed_sinks_ ? mid_epoch_position_ : -1;
  m.resume_steps_per_epoch_ = mid_epoch_position_ > 0 ? ctx_.steps_per_epoch : 0;
  m.steps_done_ = ctx_.cur_step_num;
  s.steps = ctx_.cur_step_num;
  s.seconds = seconds_since(run_start_);
  s.samples_per_second = steady_seconds_ > 0 ? static_cast<double>(steady_samples_) / steady_seconds_
                         : s.seconds > 0    ? static_cast<double>(s.samples) / s.seconds
                                            : 0;
  if (step_times_.empty()) step_times_ = all_step_times_;  // a run too short for a steady state
  if (!step_times_.empty()) {
    std::vector<double> sorted = step_times_;
    std::nth_element(sorted.begin(), sorted.begin() + static_cast<int64_t>(sorted.size() / 2), sorted.end());
    s.median_step_seconds = sorted[sorted.size() / 2];
  }
  s.data_wait_fraction = wait_total_ + busy_total_ > 0 ? wait_total_ / (wait_total_ + busy_total_) : 0;
  s.final_loss = ctx_.loss;
  s.final_loss_scale = m.loss_scale_manager() ? m.loss_scale_manager()->get_loss_scale() : 1.0;
  if (m.adapter_) s.promotions = m.adapter_->promotions();
  s.peak = peak;
  s.peak_rss_bytes = process_peak_rss_bytes();
  s.reserved_end = mem_stats().reserved;
  s.graph_plan = {};
  std::string fallbacks;  // every key's, whichever plan is shown
  for (const auto& [key, plan] : m.train_step_->graphs().plans()) {
    if (plan.arena_bytes >= s.graph_plan.arena_bytes) s.graph_plan = plan;
    if (!plan.fallback.empty()) fallbacks += str_cat(fallbacks.empty() ? "" : "; ", key, ": ", plan.fallback);
  }
  s.graph_plan.fallback = fallbacks;
  if (s.steady_steps > 0) {
    s.system_allocs_per_step = static_cast<double>(steady_allocs_) / static_cast<double>(s.steady_steps);
    s.page_faults_per_step = static_cast<double>(steady_faults_) / static_cast<double>(s.steady_steps);
  }
}

}  // namespace demi::train::internal
