// Metrics, as MindSpore's nn.Metric: clear(), update(logits, labels), eval().
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "demi/core/tensor.h"

namespace demi::train {

class Metric {
 public:
  virtual ~Metric() = default;
  virtual void clear() = 0;
  // logits (N, C) of any floating dtype; labels (N) integer class ids or (N, C) one-hot/probabilities.
  // For Loss, `logits` is the batch's loss value (a scalar) and labels is ignored.
  virtual void update(const Tensor& logits, const Tensor& labels) = 0;
  virtual double eval() const = 0;
  virtual std::string name() const = 0;
  // The metric's state as sums that add across processes (counts, totals), so data-parallel eval can
  // split the data set and add the parts; empty (the default): not additive, and every process then
  // evaluates the whole data set. set_sums restores what sums() gave (after the all-reduce).
  virtual std::vector<double> sums() const { return {}; }
  virtual void set_sums(const std::vector<double>& sums) { (void)sums; }
};
using MetricPtr = std::shared_ptr<Metric>;

// Fraction of samples whose arg-max class equals the label.
class Accuracy : public Metric {
 public:
  void clear() override { correct_ = total_ = 0; }
  void update(const Tensor& logits, const Tensor& labels) override;
  double eval() const override;
  std::string name() const override { return "Accuracy"; }
  std::vector<double> sums() const override { return {static_cast<double>(correct_), static_cast<double>(total_)}; }
  void set_sums(const std::vector<double>& s) override;

 private:
  int64_t correct_ = 0, total_ = 0;
};

// Fraction of samples whose label is among the k highest logits.
class TopKCategoricalAccuracy : public Metric {
 public:
  explicit TopKCategoricalAccuracy(int k);
  void clear() override { correct_ = total_ = 0; }
  void update(const Tensor& logits, const Tensor& labels) override;
  double eval() const override;
  std::string name() const override { return "Top" + std::to_string(k_) + "Accuracy"; }
  std::vector<double> sums() const override { return {static_cast<double>(correct_), static_cast<double>(total_)}; }
  void set_sums(const std::vector<double>& s) override;

 private:
  int k_;
  int64_t correct_ = 0, total_ = 0;
};

// Mean of the batch losses seen (weighted equally per batch, as MindSpore's nn.Loss).
class Loss : public Metric {
 public:
  void clear() override { sum_ = 0, count_ = 0; }
  void update(const Tensor& loss, const Tensor& labels) override;
  double eval() const override;
  std::string name() const override { return "Loss"; }
  std::vector<double> sums() const override { return {sum_, static_cast<double>(count_)}; }
  void set_sums(const std::vector<double>& s) override;

 private:
  double sum_ = 0;
  int64_t count_ = 0;
};

// The class id of each row: labels (N) as is, or the arg-max of (N, C) one-hot labels.
std::vector<int64_t> label_ids(const Tensor& labels);

}  // namespace demi::train
