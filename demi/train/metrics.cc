#include "demi/train/metrics.h"

#include <algorithm>
#include <vector>

namespace demi::train {
namespace {

void check_logits(const Tensor& logits, const Tensor& labels, const char* metric) {
  DEMI_CHECK(logits.rank() == 2 && is_floating(logits.dtype()), metric, ": expected logits (N, C), got ",
             logits.describe());
  DEMI_CHECK(labels.dim(0) == logits.dim(0), metric, ": ", logits.dim(0), " rows of logits but ", labels.dim(0),
             " labels (", labels.describe(), ")");
}

}  // namespace

std::vector<int64_t> label_ids(const Tensor& labels) {
  std::vector<int64_t> ids(static_cast<size_t>(labels.dim(0)));
  if (labels.rank() == 1) {
    for (int64_t i = 0; i < labels.dim(0); ++i) ids[static_cast<size_t>(i)] = static_cast<int64_t>(labels.get(i));
    return ids;
  }
  DEMI_CHECK(labels.rank() == 2, "labels must be (N) class ids or (N, C) one-hot, got ", labels.describe());
  Tensor l = labels.to(DType::kF32);
  const float* p = l.data<float>();
  int64_t c = labels.dim(1);
  for (int64_t i = 0; i < labels.dim(0); ++i)
    ids[static_cast<size_t>(i)] = std::max_element(p + i * c, p + (i + 1) * c) - (p + i * c);
  return ids;
}

void Accuracy::update(const Tensor& logits, const Tensor& labels) {
  check_logits(logits, labels, "Accuracy");
  Tensor l = logits.to(DType::kF32);
  const float* p = l.data<float>();
  int64_t n = logits.dim(0), c = logits.dim(1);
  auto ids = label_ids(labels);
  for (int64_t i = 0; i < n; ++i) {
    int64_t pred = std::max_element(p + i * c, p + (i + 1) * c) - (p + i * c);
    correct_ += pred == ids[static_cast<size_t>(i)];
  }
  total_ += n;
}

double Accuracy::eval() const {
  DEMI_CHECK(total_ > 0, "Accuracy.eval(): no samples (call update() first)");
  return static_cast<double>(correct_) / static_cast<double>(total_);
}

TopKCategoricalAccuracy::TopKCategoricalAccuracy(int k) : k_(k) {
  DEMI_CHECK(k >= 1, "TopKCategoricalAccuracy: k must be >= 1, got ", k);
}

void TopKCategoricalAccuracy::update(const Tensor& logits, const Tensor& labels) {
  check_logits(logits, labels, "TopKCategoricalAccuracy");
  Tensor l = logits.to(DType::kF32);
  const float* p = l.data<float>();
  int64_t n = logits.dim(0), c = logits.dim(1);
  auto ids = label_ids(labels);
  for (int64_t i = 0; i < n; ++i) {
    float target = p[i * c + ids[static_cast<size_t>(i)]];
    int64_t higher = 0;  // classes strictly above the label's logit
    for (int64_t j = 0; j < c; ++j) higher += p[i * c + j] > target;
    correct_ += higher < k_;
  }
  total_ += n;
}

double TopKCategoricalAccuracy::eval() const {
  DEMI_CHECK(total_ > 0, name(), ".eval(): no samples (call update() first)");
  return static_cast<double>(correct_) / static_cast<double>(total_);
}

void Loss::update(const Tensor& loss, const Tensor&) {
  DEMI_CHECK(loss.numel() == 1, "Loss metric: expected a scalar loss, got ", loss.describe());
  sum_ += loss.item();
  ++count_;
}

double Loss::eval() const {
  DEMI_CHECK(count_ > 0, "Loss.eval(): no batches (call update() first)");
  return sum_ / static_cast<double>(count_);
}

namespace {
void check_sums(const std::vector<double>& s, const char* metric) {
  DEMI_CHECK(s.size() == 2, metric, "::set_sums: expected 2 sums, got ", s.size());
}
}  // namespace

void Accuracy::set_sums(const std::vector<double>& s) {
  check_sums(s, "Accuracy");
  correct_ = static_cast<int64_t>(s[0]);
  total_ = static_cast<int64_t>(s[1]);
}

void TopKCategoricalAccuracy::set_sums(const std::vector<double>& s) {
  check_sums(s, "TopKCategoricalAccuracy");
  correct_ = static_cast<int64_t>(s[0]);
  total_ = static_cast<int64_t>(s[1]);
}

void Loss::set_sums(const std::vector<double>& s) {
  check_sums(s, "Loss");
  sum_ = s[0];
  count_ = static_cast<int64_t>(s[1]);
}

}  // namespace demi::train
