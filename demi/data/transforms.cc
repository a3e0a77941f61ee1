// The per-column transforms of Dataset::map; see transforms.h. Each returns a new tensor (created in the
// caller's memory category, kData inside a pipeline) and leaves its input untouched.
#include "demi/data/transforms.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <sstream>

#include "demi/core/error.h"
#include "demi/data/internal/util.h"

namespace demi::data {
namespace {

// One element as a double: Half and BFloat16 convert through float, integers exactly.
template <typename T>
double as_double(T v) {
  if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>) {
    return static_cast<double>(static_cast<float>(v));
  } else {
    return static_cast<double>(v);
  }
}

// Asks for the first bytes at p at once (an image's: up to 4 KiB), before a pass that looks each one up in a
// table. A shuffled data set's rows are read in no order, each a few cache lines far from the last one,
// which the hardware prefetchers do not run ahead of; the lookups' loads alone keep only about a line's
// misses in flight. (A batch of bytes was just written by `batch`: its lines are in cache.)
void prefetch_bytes(const uint8_t* p, int64_t n) {
  for (int64_t i = 0; i < std::min<int64_t>(n, 4096); i += 64) __builtin_prefetch(p + i);
}

std::string list(const std::vector<double>& v) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < v.size(); ++i) os << (i ? ", " : "") << v[i];
  os << "]";
  return os.str();
}

// Calls f(U{}) with U an unsigned integer type as wide as one element, for transforms that only move
// elements around and so need not know their dtype.
template <typename F>
void visit_element_width(size_t bytes, F&& f) {
  switch (bytes) {
    case 1: f(uint8_t{}); return;
    case 2: f(uint16_t{}); return;
    case 4: f(uint32_t{}); return;
    case 8: f(uint64_t{}); return;
  }
  DEMI_ASSERT(false, "element size ", bytes);
}

}  // namespace

Transform::Transform(std::shared_ptr<const TensorTransform> impl) : impl_(std::move(impl)) {
  DEMI_CHECK(impl_ != nullptr, "Transform: null transform");
}

// ---- TypeCast ----

Tensor TypeCast::apply(const Tensor& x, Generator&) const { return x.to(dtype_); }
std::string TypeCast::name() const { return str_cat("TypeCast(", dtype_name(dtype_), ")"); }

// ---- Rescale ----

Rescale::Rescale(double rescale, double shift) : rescale_(rescale), shift_(shift) {
  DEMI_CHECK(std::isfinite(rescale) && std::isfinite(shift), "Rescale: expected finite rescale and shift, got ",
             rescale, " and ", shift);
  for (int v = 0; v < 256; ++v) bytes_[static_cast<size_t>(v)] = of(v);
}

Tensor Rescale::apply(const Tensor& x, Generator&) const {
  Tensor out = empty(x.shape(), DType::kF32);
  float* o = out.data<float>();
  int64_t n = x.numel();
  if (x.dtype() == DType::kU8 || x.dtype() == DType::kBool) {  // (a bool is stored as the byte 0 or 1)
    const auto* p = static_cast<const uint8_t*>(x.raw_data());
    prefetch_bytes(p, n);
    for (int64_t i = 0; i < n; ++i) o[i] = bytes_[p[i]];
    return out;
  }
  visit_dtype(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* p = static_cast<const T*>(x.raw_data());
    for (int64_t i = 0; i < n; ++i) o[i] = of(as_double(p[i]));
  });
  return out;
}

std::string Rescale::name() const { return str_cat("Rescale(", rescale_, ", ", shift_, ")"); }

// ---- Normalize ----

Normalize::Normalize(std::vector<double> mean, std::vector<double> stddev)
    : mean_(std::move(mean)), std_(std::move(stddev)) {
  DEMI_CHECK(!mean_.empty() && mean_.size() == std_.size(), "Normalize: expected as many means as stddevs (at least one), got ",
             mean_.size(), " and ", std_.size());
  for (size_t c = 0; c < std_.size(); ++c) {
    DEMI_CHECK(std::isfinite(mean_[c]) && std::isfinite(std_[c]) && std_[c] > 0, "Normalize: channel ", c,
               " has mean ", mean_[c], " and stddev ", std_[c], "; expected finite values and stddev > 0");
  }
}

Normalize::Layout Normalize::layout(const Tensor& x) {
  // Channels are dimension 0 of a CHW image and dimension 1 of an NCHW batch.
  Layout l{.outer = 1, .channels = 1, .plane = 0};
  if (x.rank() == 3) {
    l.channels = x.dim(0);
  } else if (x.rank() == 4) {
    l.outer = x.dim(0);
    l.channels = x.dim(1);
  }
  l.plane = l.channels * l.outer == 0 ? 0 : x.numel() / (l.channels * l.outer);
  return l;
}

Tensor Normalize::apply(const Tensor& x, Generator&) const {
  const Layout l = layout(x);
  DEMI_CHECK(accepts(l), name(), ": input ", x.describe(), " has ", l.channels, " channel(s) but ", mean_.size(),
             " means and stddevs were given (give one, or one per channel)");
  Tensor out = empty(x.shape(), DType::kF32);
  float* o = out.data<float>();
  visit_dtype(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* p = static_cast<const T*>(x.raw_data());
    for (int64_t b = 0; b < l.outer; ++b) {
      for (int64_t c = 0; c < l.channels; ++c) {
        size_t k = mean_.size() == 1 ? 0 : static_cast<size_t>(c);
        double m = mean_[k], inv = 1.0 / std_[k];  // (of()'s formula, the constants hoisted)
        int64_t base = (b * l.channels + c) * l.plane;
        for (int64_t i = base; i < base + l.plane; ++i) o[i] = static_cast<float>((as_double(p[i]) - m) * inv);
      }
    }
  });
  return out;
}

std::string Normalize::name() const { return str_cat("Normalize(mean=", list(mean_), ", std=", list(std_), ")"); }

// ---- Rescale then Normalize, on bytes ----

internal::RescaleNormalize::RescaleNormalize(const Rescale& rescale, const Normalize& normalize)
    : normalize_(&normalize), tables_(normalize.num_values()) {
  for (size_t k = 0; k < tables_.size(); ++k) {
    for (int v = 0; v < 256; ++v) tables_[k][static_cast<size_t>(v)] = normalize.of(rescale.of(v), k);
  }
}

std::optional<Tensor> internal::RescaleNormalize::apply(const Tensor& x) const {
  if (x.dtype() != DType::kU8 && x.dtype() != DType::kBool) return std::nullopt;
  const Normalize::Layout l = Normalize::layout(x);
  if (!normalize_->accepts(l)) return std::nullopt;
  Tensor out = empty(x.shape(), DType::kF32);
  float* o = out.data<float>();
  const auto* p = static_cast<const uint8_t*>(x.raw_data());
  prefetch_bytes(p, x.numel());
  for (int64_t b = 0; b < l.outer; ++b) {
    for (int64_t c = 0; c < l.channels; ++c) {
      const float* table = tables_[tables_.size() == 1 ? 0 : static_cast<size_t>(c)].data();
      const int64_t base = (b * l.channels + c) * l.plane;
      const uint8_t* src = p + base;
      float* dst = o + base;
      for (int64_t i = 0; i < l.plane; ++i) dst[i] = table[src[i]];
    }
  }
  return out;
}

// ---- RandomCrop ----

RandomCrop::RandomCrop(int64_t height, int64_t width, std::vector<int64_t> padding, double fill_value)
    : height_(height), width_(width), fill_value_(fill_value) {
  DEMI_CHECK(height > 0 && width > 0, "RandomCrop: expected a positive size, got ", height, " x ", width);
  DEMI_CHECK(padding.size() == 1 || padding.size() == 4,
             "RandomCrop: padding is one value for every side or four (left, top, right, bottom), got ",
             padding.size(), " values");
  if (padding.size() == 1) padding.assign(4, padding[0]);
  left_ = padding[0];
  top_ = padding[1];
  right_ = padding[2];
  bottom_ = padding[3];
  DEMI_CHECK(left_ >= 0 && top_ >= 0 && right_ >= 0 && bottom_ >= 0, "RandomCrop: padding must be >= 0, got (",
             left_, ", ", top_, ", ", right_, ", ", bottom_, ")");
}

Tensor RandomCrop::apply(const Tensor& x, Generator& rng) const {
  DEMI_CHECK(x.rank() >= 2, name(), ": expected an image of rank >= 2 (..., height, width), got ", x.describe());
  const int64_t h = x.dim(-2), w = x.dim(-1);
  const int64_t ph = h + top_ + bottom_, pw = w + left_ + right_;
  DEMI_CHECK(ph >= height_ && pw >= width_, name(), ": the padded input is ", ph, " x ", pw,
             ", smaller than the crop (input ", x.describe(), ")");
  // The window's top-left corner in padded coordinates, drawn row first.
  const int64_t y0 = rng.next_int(ph - height_ + 1);
  const int64_t x0 = rng.next_int(pw - width_ + 1);

  Shape out_shape = x.shape();
  out_shape[-2] = height_;
  out_shape[-1] = width_;
  Tensor out = empty(out_shape, x.dtype());
  const bool touches_padding = y0 < top_ || x0 < left_ || y0 + height_ > top_ + h || x0 + width_ > left_ + w;
  if (touches_padding) out.fill_(fill_value_);
  const int64_t planes = h * w == 0 ? 0 : x.numel() / (h * w);
  const size_t es = x.element_size();
  const auto* src = static_cast<const uint8_t*>(x.raw_data());
  auto* dst = static_cast<uint8_t*>(out.raw_data());
  // Output columns whose source column lies inside the image.
  const int64_t j0 = std::max<int64_t>(0, left_ - x0);
  const int64_t j1 = std::min<int64_t>(width_, w + left_ - x0);
  if (j0 >= j1) return out;
  for (int64_t p = 0; p < planes; ++p) {
    for (int64_t i = 0; i < height_; ++i) {
      int64_t r = y0 + i - top_;
      if (r < 0 || r >= h) continue;
      int64_t c = x0 + j0 - left_;
      std::memcpy(dst + static_cast<size_t>((p * height_ + i) * width_ + j0) * es,
                  src + static_cast<size_t>((p * h + r) * w + c) * es, static_cast<size_t>(j1 - j0) * es);
    }
  }
  return out;
}

std::string RandomCrop::name() const {
  return str_cat("RandomCrop(", height_, ", ", width_, ", padding=(", left_, ", ", top_, ", ", right_, ", ",
                 bottom_, "))");
}

// ---- RandomHorizontalFlip ----

RandomHorizontalFlip::RandomHorizontalFlip(double prob) : prob_(prob) {
  DEMI_CHECK(prob >= 0 && prob <= 1, "RandomHorizontalFlip: expected a probability in [0, 1], got ", prob);
}

Tensor RandomHorizontalFlip::apply(const Tensor& x, Generator& rng) const {
  // Always one draw, flipped or not, so that later transforms see the same generator position.
  if (rng.next_float() >= prob_) return x;
  DEMI_CHECK(x.rank() >= 1, name(), ": expected a tensor of rank >= 1, got ", x.describe());
  Tensor out = empty(x.shape(), x.dtype());
  const int64_t w = x.dim(-1);
  const int64_t rows = w == 0 ? 0 : x.numel() / w;
  visit_element_width(x.element_size(), [&](auto tag) {
    using U = decltype(tag);
    const U* s = static_cast<const U*>(x.raw_data());
    U* d = static_cast<U*>(out.raw_data());
    for (int64_t r = 0; r < rows; ++r) std::reverse_copy(s + r * w, s + (r + 1) * w, d + r * w);
  });
  return out;
}

std::string RandomHorizontalFlip::name() const { return str_cat("RandomHorizontalFlip(", prob_, ")"); }

// ---- OneHot ----

OneHot::OneHot(int64_t num_classes, DType dtype) : num_classes_(num_classes), dtype_(dtype) {
  DEMI_CHECK(num_classes > 0, "OneHot: expected num_classes > 0, got ", num_classes);
}

Tensor OneHot::apply(const Tensor& x, Generator&) const {
  DEMI_CHECK(!is_floating(x.dtype()) && x.dtype() != DType::kBool, name(),
             ": expected integer class indices, got ", x.describe());
  DEMI_CHECK(x.rank() < Shape::kMaxRank, name(), ": input ", x.describe(), " has the maximum rank already");
  Shape out_shape = x.shape();
  out_shape.push_back(num_classes_);
  Tensor out = zeros(out_shape, DType::kF32);
  float* o = out.data<float>();
  visit_dtype(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* p = static_cast<const T*>(x.raw_data());
    for (int64_t i = 0; i < x.numel(); ++i) {
      int64_t k = static_cast<int64_t>(as_double(p[i]));
      DEMI_CHECK(k >= 0 && k < num_classes_, name(), ": class index ", k, " at position ", i, " of ",
                 x.describe(), " is outside [0, ", num_classes_, ")");
      o[i * num_classes_ + k] = 1.0f;
    }
  });
  return dtype_ == DType::kF32 ? out : out.to(dtype_);
}

std::string OneHot::name() const { return str_cat("OneHot(", num_classes_, ", ", dtype_name(dtype_), ")"); }

// ---- Lambda, RandomLambda ----

Lambda::Lambda(std::function<Tensor(const Tensor&)> fn, std::string name) : fn_(std::move(fn)), name_(std::move(name)) {
  DEMI_CHECK(fn_ != nullptr, "Lambda '", name_, "': empty function");
}

Tensor Lambda::apply(const Tensor& x, Generator&) const {
  Tensor y = fn_(x);
  DEMI_CHECK(y.defined(), name_, ": returned an undefined tensor for input ", x.describe());
  return y;
}

RandomLambda::RandomLambda(std::function<Tensor(const Tensor&, Generator&)> fn, std::string name)
    : fn_(std::move(fn)), name_(std::move(name)) {
  DEMI_CHECK(fn_ != nullptr, "RandomLambda '", name_, "': empty function");
}

Tensor RandomLambda::apply(const Tensor& x, Generator& rng) const {
  Tensor y = fn_(x, rng);
  DEMI_CHECK(y.defined(), name_, ": returned an undefined tensor for input ", x.describe());
  return y;
}

}  // namespace demi::data
