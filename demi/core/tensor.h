// Tensor: a handle to a contiguous, row-major block of one dtype, sharing its Storage with views.
//
// Tensors are reference-counted handles: copying a Tensor shares the data (as in PyTorch); clone()
// copies it. reshape/flatten/view are views without a copy. Storage comes from the memory tracker and is
// tagged with the category current when it is created (MemCategoryScope), or an explicit one.
//
// A tensor also carries autograd metadata (requires_grad, grad, the node that produced it); the engine
// in demi/autograd owns what that means, core only stores it.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "demi/core/dtype.h"
#include "demi/core/error.h"
#include "demi/core/memory.h"
#include "demi/core/shape.h"

namespace demi {

namespace autograd {
class Node;
}  // namespace autograd

class Generator;

// Owns one tracked allocation.
class Storage {
 public:
  Storage(size_t bytes, MemCategory cat);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return data_; }
  size_t nbytes() const { return bytes_; }
  MemCategory category() const { return cat_; }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
  MemCategory cat_;
};

class Tensor;

struct AutogradMeta {
  bool requires_grad = false;
  std::shared_ptr<Tensor> grad;               // accumulated gradient (a leaf's .grad)
  std::shared_ptr<autograd::Node> grad_fn;    // the node that produced this tensor (non-leaves)
  int output_nr = 0;                          // which output of grad_fn this is
  int64_t version = 0;                        // bumped by in-place writes; saved tensors check it
  std::weak_ptr<autograd::Node> grad_accumulator;  // a leaf's accumulation node, shared by its uses
  // A parameter's low-precision copy under AMP (O2/O3), valid while low_version == version: made by the
  // first cast of the parameter in a train step, then rewritten by the optimizer in the same pass as each
  // FP32 update (MindSpore's FusedCastAdamWeightDecay idea), so later steps read it instead of casting.
  std::shared_ptr<Tensor> low_copy;
  int64_t low_version = -1;
};

// A value not computed yet. Graph mode's rewrite of a network's calls (nn/call_fusion.h) hands one out as
// the output of a layer whose consumers it runs as one fused op, so that output is never made: its shape and
// dtype are known, and reading it in any other way (its values, its storage, its autograd metadata) computes
// it first, with the same calls eager mode would have made, so the same values and the same autograd graph.
class PendingValue {
 public:
  virtual ~PendingValue() = default;
  // The tensor this one stands for; it must have this one's shape and dtype.
  virtual Tensor compute() = 0;
};

struct TensorImpl {
  std::shared_ptr<Storage> storage;
  int64_t offset = 0;  // in elements
  Shape shape;
  DType dtype = DType::kF32;
  std::shared_ptr<AutogradMeta> autograd;  // null until autograd needs it
  std::string name;                        // parameter path or debug name, may be empty
  std::shared_ptr<PendingValue> pending;   // set while the value is not computed yet (above)
};

class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  bool defined() const { return impl_ != nullptr; }
  // Shape and dtype (a pending value's too, without computing it).
  const Shape& shape() const { return meta().shape; }
  int rank() const { return meta().shape.rank(); }
  int64_t dim(int i) const { return meta().shape[i]; }
  int64_t numel() const { return meta().shape.numel(); }
  DType dtype() const { return meta().dtype; }
  size_t element_size() const { return dtype_size(dtype()); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * element_size(); }
  MemCategory category() const;

  void* raw_data() const;
  // Typed pointer; a dtype that does not match T is a demi::Error.
  template <typename T>
  T* data() const {
    DEMI_CHECK(dtype() == dtype_of_v<T>, "tensor ", describe(), ": data<", dtype_name(dtype_of_v<T>),
               ">() on a tensor of dtype ", dtype());
    return static_cast<T*>(raw_data());
  }
  template <typename T>
  std::span<T> span() const {
    return {data<T>(), static_cast<size_t>(numel())};
  }

  // Views sharing storage. reshape accepts one -1 dimension, inferred from the others.
  Tensor reshape(const Shape& shape) const;
  Tensor view(const Shape& shape) const { return reshape(shape); }
  // Keeps dims [0, start_dim) and flattens the rest into one: (N, C, H, W).flatten(1) -> (N, C*H*W).
  Tensor flatten(int start_dim = 1) const;

  // A copy in `dtype` (rounding to nearest even for f16/bf16; integer targets truncate toward zero).
  // Returns *this, shared, when the dtype already matches and `copy` is false.
  Tensor to(DType dtype, bool copy = false) const;
  Tensor clone() const;
  // Copies src's values into this tensor, converting dtype; shapes must have equal numel.
  void copy_(const Tensor& src);
  void fill_(double value);
  void zero_();

  // Element access for tests and debugging (slow): flat index or full multi-index.
  double item() const;  // a one-element tensor's value
  double get(int64_t flat_index) const;
  double at(std::initializer_list<int64_t> index) const;
  void set(int64_t flat_index, double value);
  std::vector<float> to_vector() const;  // every element as float

  // Autograd metadata (the engine in demi/autograd gives these their meaning).
  bool requires_grad() const { return impl_ && impl().autograd && impl().autograd->requires_grad; }
  Tensor& set_requires_grad(bool requires_grad);
  Tensor grad() const;  // undefined when no gradient was accumulated
  void set_grad(const Tensor& g);
  AutogradMeta& autograd_meta() const;  // creates the metadata on first use
  bool has_autograd_meta() const { return impl_ && impl().autograd != nullptr; }
  const std::string& name() const { return meta().name; }
  // Whether this is a value not computed yet (PendingValue): any access but its shape, dtype and name
  // computes it.
  bool is_pending() const { return impl_ && impl_->pending != nullptr; }
  Tensor& set_name(std::string name);

  // "float32(32, 3, 32, 32)" plus the name when it has one; used in error messages.
  std::string describe() const;
  std::string to_string(int max_elements = 16) const;  // values, for debugging

  // The implementation, computed first when pending.
  TensorImpl& impl() const {
    DEMI_CHECK(impl_ != nullptr, "use of an undefined (empty) tensor");
    if (impl_->pending != nullptr) [[unlikely]] materialize();
    return *impl_;
  }
  const std::shared_ptr<TensorImpl>& impl_ptr() const {
    if (impl_ != nullptr && impl_->pending != nullptr) [[unlikely]] materialize();
    return impl_;
  }
  bool same_storage(const Tensor& o) const;
  bool is_same(const Tensor& o) const { return impl_ == o.impl_; }

 private:
  // Shape, dtype and name, never computing a pending value.
  const TensorImpl& meta() const {
    DEMI_CHECK(impl_ != nullptr, "use of an undefined (empty) tensor");
    return *impl_;
  }
  // Computes a pending value into this implementation (every handle on it sees the result).
  void materialize() const;

  std::shared_ptr<TensorImpl> impl_;
};

// Creation. Storage is tagged with current_mem_category() unless a category is given.
Tensor empty(const Shape& shape, DType dtype = DType::kF32);
Tensor empty(const Shape& shape, DType dtype, MemCategory cat);
Tensor zeros(const Shape& shape, DType dtype = DType::kF32);
Tensor ones(const Shape& shape, DType dtype = DType::kF32);
Tensor full(const Shape& shape, double value, DType dtype = DType::kF32);
Tensor arange(int64_t n, DType dtype = DType::kF32);  // 0, 1, ..., n-1
// Random tensors from a counter-based generator: the values depend on the generator's seed and position
// only, never on the thread count.
Tensor uniform(const Shape& shape, double low, double high, Generator& gen, DType dtype = DType::kF32);
Tensor normal(const Shape& shape, double mean, double stddev, Generator& gen, DType dtype = DType::kF32);
// Copies values (converted to `dtype`, default the C++ type's) into a new tensor of `shape`.
template <typename T>
Tensor from_vector(const std::vector<T>& values, const Shape& shape);
// std::vector<bool> is bit-packed, so bool has its own definition.
template <>
Tensor from_vector<bool>(const std::vector<bool>& values, const Shape& shape);
template <typename T>
Tensor from_vector(const std::vector<T>& values, const Shape& shape, DType dtype) {
  return from_vector(values, shape).to(dtype);
}

}  // namespace demi
