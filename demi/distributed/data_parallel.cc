#include "demi/distributed/data_parallel.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>

#include "demi/core/convert.h"
#include "demi/core/error.h"
#include "demi/distributed/internal/comm.h"

namespace demi::dist {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

}  // namespace

struct DataParallel::Bucket {
  std::vector<int> params;
  std::vector<int64_t> offsets;  // of each parameter in `values`
  int64_t numel = 0;
  Tensor values;                 // FP32, numel
  int pending = 0;               // gradients not yet complete this step
  internal::JobPtr job;          // the reduction in flight (null: not posted this step)
  double seconds = 0;            // the reduction's time on the communication thread
};

// Every process must hold the same network: the count of parameters and buffers, their values and a hash
// of their paths and shapes, compared by one all-reduce of maxima and negated minima (so every process
// sees the same answer and fails together, instead of some waiting in a broadcast of another size).
void check_same_network(nn::Cell& net) {
  std::vector<int64_t> sig(3, 0);
  auto add = [&](const std::vector<std::pair<std::string, Tensor>>& named) {
    for (const auto& [name, t] : named) {
      ++sig[0];
      sig[1] += t.numel();
      uint64_t h = static_cast<uint64_t>(sig[2]) ^ 1469598103934665603ull;
      for (char c : str_cat(name, t.shape(), dtype_name(t.dtype()))) h = (h ^ static_cast<uint8_t>(c)) * 1099511628211ull;
      sig[2] = static_cast<int64_t>(h >> 1);
    }
  };
  add(net.parameters_and_names());
  add(net.buffers_and_names());
  std::vector<int64_t> v = {sig[0], sig[1], sig[2], -sig[0], -sig[1], -sig[2]};
  all_reduce_max(std::span<int64_t>(v), "the all-reduce comparing the processes' networks");
  DEMI_CHECK(v[0] == -v[3] && v[1] == -v[4] && v[2] == -v[5], "data parallel: the processes hold different networks (",
             -v[3] == v[0] ? str_cat(v[0], " tensors each") : str_cat("between ", -v[3], " and ", v[0], " tensors"),
             ", ", -v[4] == v[1] ? str_cat(v[1], " values each") : str_cat("between ", -v[4], " and ", v[1], " values"),
             -v[5] == v[2] ? "" : ", other names, shapes or dtypes", "); this is rank ", get_rank(), " with ", sig[0],
             " tensors of ", sig[1], " values. Build the same model with the same options on every process.");
}

void broadcast_state(nn::Cell& net) {
  if (!is_initialized() || get_group_size() == 1) return;
  check_same_network(net);
  auto broadcast_all = [](const std::vector<std::pair<std::string, Tensor>>& named, const char* kind) {
    for (const auto& [name, t] : named) {
      std::string what = str_cat("the broadcast of ", kind, " '", name, "' from rank 0");
      broadcast(const_cast<void*>(t.raw_data()), t.nbytes(), 0, what.c_str());
    }
  };
  broadcast_all(net.parameters_and_names(), "parameter");
  broadcast_all(net.buffers_and_names(), "buffer");
}

DataParallel::DataParallel(std::vector<Tensor> params, std::vector<std::string> names, const AutoParallelContext& context)
    : params_(std::move(params)), names_(std::move(names)), context_(context) {
  DEMI_CHECK(names_.size() == params_.size(), "DataParallel: ", params_.size(), " parameters but ", names_.size(),
             " names");
  for (size_t i = 0; i < params_.size(); ++i) index_of_[params_[i].impl_ptr().get()] = static_cast<int>(i);
  const double p = get_group_size();
  weight_ = context_.gradients_mean ? 1.0 / p : 1.0;
  loss_weight_ = 1.0 / p;
  std::vector<int> order(params_.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int>(order.size() - 1 - i);
  layout(order);
}

DataParallel::~DataParallel() {
  for (auto& b : buckets_) {
    if (b->job) {
      try {
        internal::wait(b->job);
      } catch (...) {  // the error was the step's to report; nothing is left to do with it here
      }
    }
  }
}

void DataParallel::layout(const std::vector<int>& order) {
  buckets_.clear();
  bucket_of_.assign(params_.size(), -1);
  constexpr double kMiB = 1024.0 * 1024.0;
  double cap = context_.bucket_cap_mb * kMiB;
  if (cap <= 0) {
    double total = 0;
    for (const Tensor& p : params_) total += 4.0 * static_cast<double>(p.numel());
    cap = std::clamp(total / 4, 1 * kMiB, 25 * kMiB);
  }
  const auto cap_bytes = [&](size_t bucket) {
    return static_cast<int64_t>(bucket == 0 ? context_.first_bucket_mb * kMiB : cap);
  };
  for (int i : order) {
    const int64_t n = params_[static_cast<size_t>(i)].numel();
    if (buckets_.empty() || (buckets_.back()->numel > 0 && (buckets_.back()->numel + n) * 4 > cap_bytes(buckets_.size() - 1)))
      buckets_.push_back(std::make_unique<Bucket>());
    Bucket& b = *buckets_.back();
    bucket_of_[static_cast<size_t>(i)] = static_cast<int>(buckets_.size() - 1);
    b.params.push_back(i);
    b.offsets.push_back(b.numel);
    b.numel += n;
  }
  for (auto& b : buckets_) {
    b->values = empty({b->numel}, DType::kF32, MemCategory::kGradient);
    b->pending = static_cast<int>(b->params.size());
  }
}

std::vector<std::vector<int>> DataParallel::bucket_layout() const {
  std::vector<std::vector<int>> out;
  for (const auto& b : buckets_) out.push_back(b->params);
  return out;
}

StepShare DataParallel::begin_step(int64_t local_samples, int64_t local_batches) {
  DEMI_CHECK(local_samples >= 0, "DataParallel::begin_step: a negative batch size ", local_samples);
  if (local_batches < 0) local_batches = local_samples > 0 ? 1 : 0;
  double v[2] = {static_cast<double>(local_samples), static_cast<double>(local_batches)};
  all_reduce_sum(std::span<double>(v, 2), "the all-reduce of the step's batch sizes");
  StepShare s{static_cast<int64_t>(v[0]), static_cast<int64_t>(v[1])};
  const double share = s.samples > 0 ? static_cast<double>(local_samples) / v[0] : 0.0;
  weight_ = context_.gradients_mean ? share : 1.0;
  loss_weight_ = share;
  return s;
}

// This process's gradients, weighted, into the bucket, then its all-reduce queued.
void DataParallel::post(Bucket& b) {
  float* dst = b.values.data<float>();
  for (size_t k = 0; k < b.params.size(); ++k) {
    const Tensor& p = params_[static_cast<size_t>(b.params[k])];
    float* at = dst + b.offsets[k];
    const int64_t n = p.numel();
    Tensor g = p.grad();
    if (!g.defined()) {
      std::fill(at, at + n, 0.0f);
      continue;
    }
    DEMI_CHECK(g.numel() == n, "DataParallel: the gradient of '", names_[static_cast<size_t>(b.params[k])], "' is ",
               g.describe(), ", expected ", n, " values");
    convert(g.raw_data(), g.dtype(), at, DType::kF32, n);
    if (weight_ != micro_) {
      const float w = static_cast<float>(weight_ / micro_);
      for (int64_t i = 0; i < n; ++i) at[i] *= w;
    }
  }
  const bool bf16 = context_.comm_dtype == DType::kBF16;
  stats_.bytes_sent += b.numel * (bf16 ? 2 : 4);
  ++stats_.buckets_reduced;
  Bucket* bp = &b;
  auto run = [bp, bf16] {
    auto start = Clock::now();
    if (bf16) {
      internal::all_reduce_bf16_sum(bp->values.data<float>(), bp->numel);
    } else if (is_initialized()) {
      internal::all_reduce_f32_sum(bp->values.data<float>(), bp->numel);
    }
    bp->seconds = seconds_since(start);
  };
  if (!is_initialized()) {  // a world of one without MPI: nothing to combine (bf16 still rounds, as on the wire)
    run();
    b.job = std::make_shared<internal::Job>();
    b.job->done = true;
    return;
  }
  b.job = internal::submit(run, str_cat("the gradient all-reduce (", b.numel, " values, ", bf16 ? "bfloat16" : "float32", ")"));
}

void DataParallel::gradient_ready(const Tensor& param) {
  auto it = index_of_.find(param.impl_ptr().get());
  if (it == index_of_.end()) return;  // a leaf that is no parameter of this reducer
  if (!relaid_) ready_order_.push_back(it->second);
  if (!context_.overlap) return;
  Bucket& b = *buckets_[static_cast<size_t>(bucket_of_[static_cast<size_t>(it->second)])];
  if (--b.pending == 0 && !b.job) post(b);
}

void DataParallel::reduce(const std::vector<Tensor>& params, int64_t micro_batches) {
  DEMI_CHECK(params.size() == params_.size(), "DataParallel::reduce: ", params.size(), " parameters, the reducer has ",
             params_.size());
  // Buckets packed during backward belong to single-batch updates (micro_ 1); the rest are packed now.
  micro_ = static_cast<double>(std::max<int64_t>(micro_batches, 1));
  for (auto& b : buckets_)
    if (!b->job) post(*b);
  auto wait_start = Clock::now();
  for (auto& b : buckets_) internal::wait(b->job);
  stats_.exposed_seconds += seconds_since(wait_start);
  for (auto& b : buckets_) {
    stats_.reduce_seconds += b->seconds;
    const float* src = b->values.data<float>();
    for (size_t k = 0; k < b->params.size(); ++k) {
      const Tensor& p = params_[static_cast<size_t>(b->params[k])];
      AutogradMeta& meta = p.autograd_meta();
      if (!meta.grad || !meta.grad->defined()) {
        MemCategoryScope cat(MemCategory::kGradient);
        meta.grad = std::make_shared<Tensor>(empty(p.shape(), p.dtype(), MemCategory::kGradient));
      }
      Tensor& g = *meta.grad;
      convert(src + b->offsets[k], DType::kF32, g.raw_data(), g.dtype(), p.numel());
    }
    b->job.reset();
    b->pending = static_cast<int>(b->params.size());
  }
  micro_ = 1;
  ++stats_.steps;
  // Once: the buckets follow the order backward completed the gradients (when it differs).
  if (!relaid_ && !ready_order_.empty() && context_.overlap) {
    relaid_ = true;
    std::vector<int> order = ready_order_;
    std::vector<char> seen(params_.size(), 0);
    for (int i : order) seen[static_cast<size_t>(i)] = 1;
    for (int i = static_cast<int>(params_.size()) - 1; i >= 0; --i)
      if (!seen[static_cast<size_t>(i)]) order.push_back(i);
    std::vector<int> current;
    for (const auto& b : buckets_) current.insert(current.end(), b->params.begin(), b->params.end());
    if (order != current) layout(order);
    ready_order_.clear();
  }
}

void DataParallel::agree(float& loss, bool& overflow) {
  double v[2] = {std::isfinite(loss) || loss_weight_ > 0 ? loss_weight_ * static_cast<double>(loss) : 0.0,
                 overflow ? 1.0 : 0.0};
  all_reduce_sum(std::span<double>(v, 2), "the all-reduce of the step's loss and overflow flag");
  loss = static_cast<float>(v[0]);
  overflow = v[1] > 0;
}

}  // namespace demi::dist
