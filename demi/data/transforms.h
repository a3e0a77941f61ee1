// Per-column transforms for Dataset::map, in MindSpore's vocabulary (TypeCast, Rescale, Normalize,
// RandomCrop, RandomHorizontalFlip, OneHot, plus Lambda for anything else). A transform takes one
// column's tensor of one row and returns a new tensor; it never writes into its input, which may be a
// view of a reader's shared buffer. Images are CHW (demi is NCHW): channels are dimension 0 of a
// rank-3 image, height and width the last two dimensions of any image.
//
// Random transforms draw from the Generator map hands them, keyed by (seed, epoch, row), so a given seed
// gives the same augmentations whatever the thread count. They may be used concurrently (map's workers
// share one instance): apply() is const and keeps no state between rows.
#pragma once

#include <array>
#include <concepts>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "demi/core/rng.h"
#include "demi/core/tensor.h"

namespace demi::data {

class TensorTransform {
 public:
  virtual ~TensorTransform() = default;
  virtual Tensor apply(const Tensor& x, Generator& rng) const = 0;
  virtual std::string name() const = 0;  // "Normalize(mean=[0.5], std=[0.25])", for error messages
};

// A shared, immutable transform; converts implicitly from any TensorTransform, so that
// ds->map({TypeCast(DType::kF32), RandomHorizontalFlip()}, {"image"}) reads as in MindSpore.
class Transform {
 public:
  template <typename T>
    requires std::derived_from<std::decay_t<T>, TensorTransform>
  Transform(T&& t) : impl_(std::make_shared<std::decay_t<T>>(std::forward<T>(t))) {}  // NOLINT: implicit
  explicit Transform(std::shared_ptr<const TensorTransform> impl);

  Tensor operator()(const Tensor& x, Generator& rng) const { return impl_->apply(x, rng); }
  std::string name() const { return impl_->name(); }
  const TensorTransform& impl() const { return *impl_; }  // (map looks for pairs it runs in one pass)

 private:
  std::shared_ptr<const TensorTransform> impl_;
};

// A copy in `dtype` (rounding to nearest even for f16/bf16; integer targets truncate toward zero).
class TypeCast final : public TensorTransform {
 public:
  explicit TypeCast(DType dtype) : dtype_(dtype) {}
  Tensor apply(const Tensor& x, Generator& rng) const override;
  std::string name() const override;

 private:
  DType dtype_;
};

// float32 x * rescale + shift (Rescale(1.0 / 255, 0) maps bytes to [0, 1]).
class Rescale final : public TensorTransform {
 public:
  Rescale(double rescale, double shift);
  Tensor apply(const Tensor& x, Generator& rng) const override;
  std::string name() const override;
  float of(double v) const { return static_cast<float>(v * rescale_ + shift_); }  // one element

 private:
  double rescale_, shift_;
  std::array<float, 256> bytes_;  // of(v) for each uint8 value v: a uint8 (or bool) input is a lookup
};

// float32 (x - mean[c]) / stddev[c] per channel c: dimension 0 of a CHW image (dimension 1 of an NCHW
// batch); a single value applies to every element (and is all a rank-1 or rank-2 input accepts). Mean
// and stddev are in the input's units: for uint8 images either
// Normalize({0.2860 * 255}, {0.3530 * 255}) or Rescale(1/255) then Normalize({0.2860}, {0.3530}).
class Normalize final : public TensorTransform {
 public:
  Normalize(std::vector<double> mean, std::vector<double> stddev);
  Tensor apply(const Tensor& x, Generator& rng) const override;
  std::string name() const override;
  size_t num_values() const { return mean_.size(); }  // 1, or one per channel
  // One element normalized by the k-th mean and stddev (apply's formula).
  float of(double v, size_t k) const { return static_cast<float>((v - mean_[k]) * (1.0 / std_[k])); }

  // Where the channels are in x: `outer` runs of `channels` planes of `plane` elements each.
  struct Layout {
    int64_t outer, channels, plane;
  };
  static Layout layout(const Tensor& x);
  bool accepts(const Layout& l) const {
    return mean_.size() == 1 || static_cast<int64_t>(mean_.size()) == l.channels;
  }

 private:
  std::vector<double> mean_, std_;
};

namespace internal {
// Rescale then Normalize in one pass over a uint8 (or bool) column: each byte value of each channel maps
// to one float, so the pair is a table per channel, built from the two's own formulas (equal bit for bit
// to running them in turn) — one lookup per element and one tensor, where the two in turn make a float32
// tensor and read it again. Dataset::map runs such a pair this way (MNIST-like images normalized per
// sample are the common pipeline). apply() returns nullopt for any other input, or a shape Normalize
// refuses: the caller then runs the two in turn, which raise their own errors.
class RescaleNormalize {
 public:
  RescaleNormalize(const Rescale& rescale, const Normalize& normalize);
  std::optional<Tensor> apply(const Tensor& x) const;

 private:
  const Normalize* normalize_;                // (its layout; map holds it for as long as this)
  std::vector<std::array<float, 256>> tables_;  // one per value Normalize was given
};
}  // namespace internal

// Pads the last two dimensions (height, width) by `padding` filled with `fill_value`, then crops a
// (height, width) window at a random position. Padding is MindSpore's: one value for every side, or
// {left, top, right, bottom}. Any dtype; leading dimensions (channels) are kept.
class RandomCrop final : public TensorTransform {
 public:
  RandomCrop(int64_t height, int64_t width, std::vector<int64_t> padding = {0}, double fill_value = 0);
  Tensor apply(const Tensor& x, Generator& rng) const override;
  std::string name() const override;

 private:
  int64_t height_, width_;
  int64_t left_, top_, right_, bottom_;
  double fill_value_;
};

// Mirrors the last dimension (width) with probability `prob`; otherwise returns the input unchanged.
class RandomHorizontalFlip final : public TensorTransform {
 public:
  explicit RandomHorizontalFlip(double prob = 0.5);
  Tensor apply(const Tensor& x, Generator& rng) const override;
  std::string name() const override;

 private:
  double prob_;
};

// An integer tensor of class indices, shape S, to (S..., num_classes) one-hot vectors in `dtype`
// (float32 by default: what a dense-label loss consumes). An index outside [0, num_classes) is an error.
class OneHot final : public TensorTransform {
 public:
  explicit OneHot(int64_t num_classes, DType dtype = DType::kF32);
  Tensor apply(const Tensor& x, Generator& rng) const override;
  std::string name() const override;

 private:
  int64_t num_classes_;
  DType dtype_;
};

// Any deterministic function of the column (it must not write into its input).
class Lambda final : public TensorTransform {
 public:
  explicit Lambda(std::function<Tensor(const Tensor&)> fn, std::string name = "Lambda");
  Tensor apply(const Tensor& x, Generator& rng) const override;
  std::string name() const override { return name_; }

 private:
  std::function<Tensor(const Tensor&)> fn_;
  std::string name_;
};

// A random function of the column: it draws only from the generator it is given.
class RandomLambda final : public TensorTransform {
 public:
  explicit RandomLambda(std::function<Tensor(const Tensor&, Generator&)> fn, std::string name = "RandomLambda");
  Tensor apply(const Tensor& x, Generator& rng) const override;
  std::string name() const override { return name_; }

 private:
  std::function<Tensor(const Tensor&, Generator&)> fn_;
  std::string name_;
};

}  // namespace demi::data
