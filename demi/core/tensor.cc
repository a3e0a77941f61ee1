// Tensor, Storage and the creation functions: shared contiguous storage from the memory tracker, views
// without copies, dtype conversion through demi::convert, slow element access for tests, and random
// fills whose values depend only on the generator's seed and position (never on the thread count).
#include "demi/core/tensor.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numbers>
#include <sstream>
#include <type_traits>

#include "demi/core/convert.h"
#include "demi/core/parallel.h"
#include "demi/core/rng.h"

namespace demi {
namespace {

// Elements per parallel chunk for fills; below this a loop is not worth waking the pool for.
constexpr int64_t kFillGrain = 1 << 16;
// Counter blocks (4 values each) per parallel chunk for random fills (Box–Muller costs far more than a store).
constexpr int64_t kRandomGrain = 1 << 12;

// One element's value as a double, and back (float -> integer truncates toward zero, -> bool is != 0,
// exactly as demi::convert does, so element access agrees with to()).
template <typename T>
double to_double(T x) {
  if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>) {
    return static_cast<double>(static_cast<float>(x));
  } else {
    return static_cast<double>(x);
  }
}

template <typename T>
T from_double(double v) {
  if constexpr (std::is_same_v<T, bool>) {
    return v != 0.0;
  } else if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>) {
    return T(static_cast<float>(v));
  } else {
    return static_cast<T>(v);
  }
}

}  // namespace

// ---- Storage ----

Storage::Storage(size_t bytes, MemCategory cat) : data_(mem_allocate(bytes, cat)), bytes_(bytes), cat_(cat) {}

Storage::~Storage() { mem_free(data_, bytes_, cat_); }

// ---- Tensor ----

void Tensor::materialize() const {
  // Taken out first, so that a second read while it computes cannot compute it again; put back if it throws.
  std::shared_ptr<PendingValue> pending = std::move(impl_->pending);
  impl_->pending = nullptr;
  Tensor value;
  try {
    value = pending->compute();
  } catch (...) {
    impl_->pending = std::move(pending);
    throw;
  }
  const TensorImpl& v = value.impl();
  DEMI_ASSERT(v.shape == impl_->shape && v.dtype == impl_->dtype, "a pending ", dtype_name(impl_->dtype),
              impl_->shape, " computed as ", dtype_name(v.dtype), v.shape);
  impl_->storage = v.storage;
  impl_->offset = v.offset;
  impl_->autograd = v.autograd;  // its node and version counter, shared with the computed handle
}

MemCategory Tensor::category() const {
  const TensorImpl& t = impl();
  return t.storage ? t.storage->category() : MemCategory::kOther;
}

void* Tensor::raw_data() const {
  const TensorImpl& t = impl();
  if (!t.storage || !t.storage->data()) return nullptr;
  return static_cast<char*>(t.storage->data()) + t.offset * static_cast<int64_t>(dtype_size(t.dtype));
}

Tensor Tensor::reshape(const Shape& target) const {
  const TensorImpl& t = impl();
  Shape out = target;
  int infer = -1;
  int64_t known = 1;
  for (int i = 0; i < out.rank(); ++i) {
    if (out[i] == -1) {
      DEMI_CHECK(infer < 0, "reshape of ", describe(), " to ", target, ": at most one dimension may be -1");
      infer = i;
    } else {
      DEMI_CHECK(out[i] >= 0, "reshape of ", describe(), " to ", target, ": dimension ", i,
                 " is negative (only -1, inferred, is allowed)");
      known *= out[i];
    }
  }
  if (infer >= 0) {
    DEMI_CHECK(known != 0 && t.shape.numel() % known == 0, "reshape of ", describe(), " to ", target,
               ": cannot infer the -1 dimension (", t.shape.numel(), " elements are not a multiple of ",
               known, ")");
    out[infer] = t.shape.numel() / known;
  }
  DEMI_CHECK(out.numel() == t.shape.numel(), "reshape of ", describe(), " to ", target, ": ",
             t.shape.numel(), " elements cannot be viewed as ", out.numel());
  auto v = std::make_shared<TensorImpl>();
  v->storage = t.storage;
  v->offset = t.offset;
  v->shape = out;
  v->dtype = t.dtype;
  return Tensor(std::move(v));
}

Tensor Tensor::flatten(int start_dim) const {
  const Shape& s = shape();
  if (s.rank() == 0) return reshape({1});
  int start = s.wrap(start_dim);
  Shape out;
  for (int i = 0; i < start; ++i) out.push_back(s[i]);
  int64_t rest = 1;
  for (int i = start; i < s.rank(); ++i) rest *= s[i];
  out.push_back(rest);
  return reshape(out);
}

Tensor Tensor::to(DType target, bool copy) const {
  if (target == dtype() && !copy) return *this;
  Tensor out = empty(shape(), target);
  convert(raw_data(), dtype(), out.raw_data(), target, numel());
  return out;
}

Tensor Tensor::clone() const { return to(dtype(), /*copy=*/true); }

void Tensor::copy_(const Tensor& src) {
  DEMI_CHECK(src.defined(), "copy_ into ", describe(), " from an undefined tensor");
  DEMI_CHECK(src.numel() == numel(), "copy_ into ", describe(), " from ", src.describe(),
             ": element counts differ (", numel(), " vs ", src.numel(), ")");
  if (numel() == 0) return;
  if (same_storage(src)) {
    if (raw_data() == src.raw_data() && dtype() == src.dtype()) return;
    // Overlapping views of one storage: convert from a private copy, never from memory being written.
    Tensor tmp = src.clone();
    convert(tmp.raw_data(), tmp.dtype(), raw_data(), dtype(), numel());
    return;
  }
  convert(src.raw_data(), src.dtype(), raw_data(), dtype(), numel());
}

void Tensor::fill_(double value) {
  int64_t n = numel();
  visit_dtype(dtype(), [&](auto tag) {
    using T = decltype(tag);
    T v = from_double<T>(value);
    T* p = static_cast<T*>(raw_data());
    parallel_for(0, n, kFillGrain, [&](int64_t b, int64_t e) { std::fill(p + b, p + e, v); });
  });
}

void Tensor::zero_() {
  // Zero is all-zero bits in every dtype.
  if (numel() > 0) std::memset(raw_data(), 0, nbytes());
}

double Tensor::item() const {
  DEMI_CHECK(numel() == 1, "item() of ", describe(), ": expected a tensor with one element, found ", numel());
  return get(0);
}

double Tensor::get(int64_t flat_index) const {
  DEMI_CHECK(flat_index >= 0 && flat_index < numel(), "index ", flat_index, " is out of range for ",
             describe(), " (", numel(), " elements)");
  return visit_dtype(dtype(), [&](auto tag) {
    using T = decltype(tag);
    return to_double(static_cast<const T*>(raw_data())[flat_index]);
  });
}

double Tensor::at(std::initializer_list<int64_t> index) const {
  const Shape& s = shape();
  DEMI_CHECK(static_cast<int>(index.size()) == s.rank(), "at() of ", describe(), ": expected ", s.rank(),
             " indices, got ", index.size());
  auto strides = s.strides();
  int64_t flat = 0;
  int i = 0;
  for (int64_t x : index) {
    DEMI_CHECK(x >= 0 && x < s[i], "at() of ", describe(), ": index ", x, " is out of range for dimension ", i,
               " of size ", s[i]);
    flat += x * strides[static_cast<size_t>(i)];
    ++i;
  }
  return get(flat);
}

void Tensor::set(int64_t flat_index, double value) {
  DEMI_CHECK(flat_index >= 0 && flat_index < numel(), "index ", flat_index, " is out of range for ",
             describe(), " (", numel(), " elements)");
  visit_dtype(dtype(), [&](auto tag) {
    using T = decltype(tag);
    static_cast<T*>(raw_data())[flat_index] = from_double<T>(value);
  });
}

std::vector<float> Tensor::to_vector() const {
  std::vector<float> out(static_cast<size_t>(numel()));
  convert(raw_data(), dtype(), out.data(), DType::kF32, numel());
  return out;
}

Tensor& Tensor::set_requires_grad(bool requires_grad) {
  DEMI_CHECK(!requires_grad || is_floating(dtype()), "set_requires_grad on ", describe(),
             ": only floating-point tensors can require gradients");
  if (requires_grad || has_autograd_meta()) autograd_meta().requires_grad = requires_grad;
  return *this;
}

Tensor Tensor::grad() const {
  if (!has_autograd_meta() || !impl().autograd->grad) return Tensor();
  return *impl().autograd->grad;
}

void Tensor::set_grad(const Tensor& g) {
  if (!g.defined()) {
    if (has_autograd_meta()) impl().autograd->grad.reset();
    return;
  }
  DEMI_CHECK(g.shape() == shape(), "set_grad on ", describe(), ": the gradient ", g.describe(),
             " has a different shape");
  autograd_meta().grad = std::make_shared<Tensor>(g);
}

AutogradMeta& Tensor::autograd_meta() const {
  TensorImpl& t = impl();
  if (!t.autograd) t.autograd = std::make_shared<AutogradMeta>();
  return *t.autograd;
}

Tensor& Tensor::set_name(std::string name) {
  impl().name = std::move(name);
  return *this;
}

std::string Tensor::describe() const {
  if (!defined()) return "undefined tensor";
  std::string s = str_cat(dtype_name(dtype()), shape().to_string());
  if (!name().empty()) s += str_cat(" '", name(), "'");
  return s;
}

std::string Tensor::to_string(int max_elements) const {
  if (!defined()) return "undefined tensor";
  std::ostringstream os;
  os << describe() << " [";
  int64_t n = numel();
  int64_t shown = std::min<int64_t>(n, std::max(max_elements, 0));
  for (int64_t i = 0; i < shown; ++i) os << (i ? ", " : "") << get(i);
  if (shown < n) os << (shown ? ", " : "") << "... (" << n - shown << " more)";
  os << "]";
  return os.str();
}

bool Tensor::same_storage(const Tensor& o) const {
  return defined() && o.defined() && impl().storage != nullptr && impl().storage == o.impl().storage;
}

// ---- Creation ----

Tensor empty(const Shape& shape, DType dtype) { return empty(shape, dtype, current_mem_category()); }

Tensor empty(const Shape& shape, DType dtype, MemCategory cat) {
  for (int i = 0; i < shape.rank(); ++i) {
    DEMI_CHECK(shape[i] >= 0, "cannot create a tensor of shape ", shape, ": dimension ", i, " is negative");
  }
  auto t = std::make_shared<TensorImpl>();
  t->storage = std::make_shared<Storage>(static_cast<size_t>(shape.numel()) * dtype_size(dtype), cat);
  t->shape = shape;
  t->dtype = dtype;
  return Tensor(std::move(t));
}

Tensor zeros(const Shape& shape, DType dtype) {
  Tensor t = empty(shape, dtype);
  t.zero_();
  return t;
}

Tensor ones(const Shape& shape, DType dtype) { return full(shape, 1.0, dtype); }

Tensor full(const Shape& shape, double value, DType dtype) {
  Tensor t = empty(shape, dtype);
  t.fill_(value);
  return t;
}

Tensor arange(int64_t n, DType dtype) {
  DEMI_CHECK(n >= 0, "arange: expected a non-negative length, got ", n);
  Tensor t = empty({n}, dtype);
  visit_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    T* p = static_cast<T*>(t.raw_data());
    parallel_for(0, n, kFillGrain, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) p[i] = from_double<T>(static_cast<double>(i));
    });
  });
  return t;
}

namespace {

// Fills `t` from counter blocks first, first+1, ...: block i yields elements 4i..4i+3 through
// `values(words, out[4])`. Chunks of blocks run in parallel; a value depends only on its block's counter.
template <typename F>
void fill_from_blocks(Tensor& t, const Generator& gen, uint64_t first, F&& values) {
  int64_t n = t.numel();
  int64_t nblocks = (n + 3) / 4;
  visit_dtype(t.dtype(), [&](auto tag) {
    using T = decltype(tag);
    T* p = static_cast<T*>(t.raw_data());
    parallel_for(0, nblocks, kRandomGrain, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        double v[4];
        values(gen.block(first + static_cast<uint64_t>(i)), v);
        int64_t base = 4 * i;
        int64_t m = std::min<int64_t>(4, n - base);
        for (int64_t j = 0; j < m; ++j) p[base + j] = from_double<T>(v[j]);
      }
    });
  });
}

}  // namespace

Tensor uniform(const Shape& shape, double low, double high, Generator& gen, DType dtype) {
  DEMI_CHECK(std::isfinite(low) && std::isfinite(high) && low <= high,
             "uniform: expected finite bounds with low <= high, got [", low, ", ", high, ")");
  Tensor t = empty(shape, dtype);
  uint64_t first = gen.reserve(static_cast<uint64_t>((t.numel() + 3) / 4));
  double scale = high - low;
  fill_from_blocks(t, gen, first, [&](const std::array<uint32_t, 4>& w, double* v) {
    for (size_t j = 0; j < 4; ++j) v[j] = low + scale * static_cast<double>(u32_to_unit_float(w[j]));
  });
  return t;
}

Tensor normal(const Shape& shape, double mean, double stddev, Generator& gen, DType dtype) {
  DEMI_CHECK(std::isfinite(mean) && std::isfinite(stddev) && stddev >= 0,
             "normal: expected a finite mean and a finite stddev >= 0, got mean ", mean, ", stddev ", stddev);
  Tensor t = empty(shape, dtype);
  uint64_t first = gen.reserve(static_cast<uint64_t>((t.numel() + 3) / 4));
  fill_from_blocks(t, gen, first, [&](const std::array<uint32_t, 4>& w, double* v) {
    // Box–Muller on the pairs (w0, w1) and (w2, w3); u1 in (0, 1] so the log is finite, and all 32 bits
    // are used so the tails reach ~6.7 sigma.
    for (int k = 0; k < 2; ++k) {
      double u1 = (static_cast<double>(w[static_cast<size_t>(2 * k)]) + 1.0) * 0x1.0p-32;
      double u2 = static_cast<double>(w[static_cast<size_t>(2 * k + 1)]) * 0x1.0p-32;
      double r = std::sqrt(-2.0 * std::log(u1));
      double a = 2.0 * std::numbers::pi * u2;
      v[2 * k] = mean + stddev * r * std::cos(a);
      v[2 * k + 1] = mean + stddev * r * std::sin(a);
    }
  });
  return t;
}

template <typename T>
Tensor from_vector(const std::vector<T>& values, const Shape& shape) {
  DEMI_CHECK(static_cast<int64_t>(values.size()) == shape.numel(), "from_vector: ", values.size(),
             " values do not fill shape ", shape, " (", shape.numel(), " elements)");
  Tensor t = empty(shape, dtype_of_v<T>);
  if (!values.empty()) std::memcpy(t.raw_data(), values.data(), values.size() * sizeof(T));
  return t;
}

template <>
Tensor from_vector<bool>(const std::vector<bool>& values, const Shape& shape) {
  // std::vector<bool> is bit-packed: copy element by element.
  DEMI_CHECK(static_cast<int64_t>(values.size()) == shape.numel(), "from_vector: ", values.size(),
             " values do not fill shape ", shape, " (", shape.numel(), " elements)");
  Tensor t = empty(shape, DType::kBool);
  bool* p = static_cast<bool*>(t.raw_data());
  for (size_t i = 0; i < values.size(); ++i) p[i] = values[i];
  return t;
}

template Tensor from_vector<float>(const std::vector<float>&, const Shape&);
template Tensor from_vector<double>(const std::vector<double>&, const Shape&);
template Tensor from_vector<int32_t>(const std::vector<int32_t>&, const Shape&);
template Tensor from_vector<int64_t>(const std::vector<int64_t>&, const Shape&);
template Tensor from_vector<uint8_t>(const std::vector<uint8_t>&, const Shape&);
template Tensor from_vector<Half>(const std::vector<Half>&, const Shape&);
template Tensor from_vector<BFloat16>(const std::vector<BFloat16>&, const Shape&);

}  // namespace demi
