// Cell: the building block of networks, in MindSpore's vocabulary. A cell owns named parameters
// (trainable FP32 master weights), buffers (running statistics) and sub-cells; construct() says what it
// computes. Calling a cell runs construct() with the cell's path attached to any error raised inside it
// ("in net 'fc' (Dense): ...") and with its pinned dtype (to_float) in force.
//
//   class SimpleCNN : public nn::Cell {
//    public:
//     SimpleCNN() : Cell("SimpleCNN") {
//       conv1 = register_cell("conv1", std::make_shared<nn::Conv2d>(3, 32, 3, nn::Conv2dOptions{...}));
//       ...
//     }
//     Tensor construct(const Tensor& x) override { return fc->call(flatten->call(...)); }
//   };
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "demi/core/rng.h"
#include "demi/core/tensor.h"
#include "demi/ops/dispatch.h"

namespace demi::nn {

class Cell {
 public:
  explicit Cell(std::string type_name);
  virtual ~Cell() = default;
  Cell(const Cell&) = delete;
  Cell& operator=(const Cell&) = delete;

  // Runs construct(x) with this cell's path in errors and its pinned dtype in force (recomputed in
  // backward when recompute() is on and grad mode is).
  Tensor operator()(const Tensor& x);
  Tensor call(const Tensor& x) { return (*this)(x); }
  // operator() without graph mode's rewrite of the calls (nn/call_fusion.h): what it runs for a call it
  // does not rewrite, and how a pending output of this cell is computed.
  Tensor call_as_written(const Tensor& x);
  virtual Tensor construct(const Tensor& x) = 0;

  // Named parameters of this cell and all sub-cells, with dotted paths ("features.0.weight").
  std::vector<std::pair<std::string, Tensor>> parameters_and_names() const;
  // The parameters that require grad (what an optimizer updates).
  std::vector<Tensor> trainable_params() const;
  // Buffers (e.g. BatchNorm's moving mean and variance), with dotted paths.
  std::vector<std::pair<std::string, Tensor>> buffers_and_names() const;
  // Every cell below this one (this one first, with path ""), with dotted paths.
  std::vector<std::pair<std::string, Cell*>> cells_and_names();

  void set_train(bool mode = true);
  bool training() const { return training_; }

  // Pins this cell (and its sub-cells) to compute in `dtype`, whatever the AMP level (MindSpore's
  // to_float). std::nullopt removes the pin.
  Cell& to_float(std::optional<DType> dtype);
  std::optional<DType> pinned_dtype() const { return pinned_; }

  // Recomputation (MindSpore's Cell.recompute()): while training, this cell's forward keeps none of its
  // activations (only its input), and backward runs it again to get them (autograd::recompute): less
  // memory for one more forward of the cell. Dropout draws the same masks, running statistics are updated
  // once, gradients are bit for bit those without it. A cell whose extra inputs need gradients
  // (MultiheadAttention's key and value) cannot be recomputed on its own: recompute its enclosing layer.
  Cell& recompute(bool on = true);
  bool recomputed() const { return recompute_; }

  // The mixed-precision policy in force while this cell runs (demi/amp attaches one for a level); a
  // cell with a policy casts its floating output back to FP32, as MindSpore's O2 network output is.
  void set_precision_policy(std::shared_ptr<const ops::PrecisionPolicy> policy);
  const ops::PrecisionPolicy* precision_policy() const { return policy_.get(); }
  const std::shared_ptr<const ops::PrecisionPolicy>& precision_policy_ptr() const { return policy_; }

  const std::string& type_name() const { return type_name_; }
  // Dotted path from the root cell ("" for the root).
  std::string path() const;
  // "'fc' (Dense)" or "SimpleCNN" for the root: how errors name this cell.
  std::string describe() const;
  Cell* parent() const { return parent_; }

  int64_t num_parameters() const;  // total elements of all parameters

  // The random generator this cell draws from while training (Dropout's masks), or null.
  virtual Generator* own_generator() { return nullptr; }
  // This cell's path, interned (ops::intern_layer_path): what op events and graph nodes name it by.
  const char* layer_id();
  // A number that changes whenever any cell of the process gains a sub-cell, a precision policy or a
  // pinned dtype: what a caller that derives something from a network's cells and policies (the train
  // step's float16 check, per step) compares to know its answer still holds.
  static uint64_t structure_version();

 protected:
  // For a cell whose type is known only after construction (a Python subclass: its class's name).
  void set_type_name(std::string type_name) { type_name_ = std::move(type_name); }
  // Registers a parameter: tagged MemCategory::kParameter, requires grad, named with its path.
  Tensor register_parameter(const std::string& name, Tensor value, bool requires_grad = true);
  Tensor register_buffer(const std::string& name, Tensor value);
  template <typename C>
  std::shared_ptr<C> register_cell(const std::string& name, std::shared_ptr<C> cell) {
    add_cell(name, cell);
    return cell;
  }
  void add_cell(const std::string& name, std::shared_ptr<Cell> cell);
  // construct(x) in this cell's scopes: what operator() runs, without recomputation.
  Tensor run(const Tensor& x);
  // fn(x) through autograd::recompute with this cell's generators and buffers (for a cell whose
  // operator() takes more than x: fn captures the rest and calls run).
  Tensor run_recomputed(const Tensor& x, std::function<Tensor(const Tensor&)> fn);
  // Whether operator() recomputes this call.
  bool recomputing_now() const;
  // operator()(x) with `slot` set to `value` for each run of construct, the one a recomputing backward
  // makes included, and reset to T{} after it (a fusion SequentialCell asks of its cell for one call).
  // residual + operator()(x), with `slot` holding the residual while construct runs, for construct to add
  // it in its last product's store (Dense::call_add). A cell recomputed on its own runs the two ops: its
  // backward could return no gradient for the residual.
  Tensor call_adding(Tensor& slot, const Tensor& residual, const Tensor& x);
  template <typename T>
  Tensor call_with(T& slot, T value, const Tensor& x) {
    auto with = [this, &slot, value](const Tensor& in) {
      struct Reset {
        T& slot;
        ~Reset() { slot = T{}; }
      } reset{slot};
      slot = value;
      return run(in);
    };
    return recomputing_now() ? run_recomputed(x, with) : with(x);
  }

 private:
  void collect_parameters(const std::string& prefix, std::vector<std::pair<std::string, Tensor>>& out) const;
  void collect_buffers(const std::string& prefix, std::vector<std::pair<std::string, Tensor>>& out) const;
  void collect_cells(const std::string& prefix, std::vector<std::pair<std::string, Cell*>>& out);

  std::string type_name_;
  std::string name_;  // name within the parent
  Cell* parent_ = nullptr;
  bool training_ = true;
  std::optional<DType> pinned_;
  bool recompute_ = false;
  std::shared_ptr<const ops::PrecisionPolicy> policy_;
  std::vector<std::pair<std::string, Tensor>> params_;
  std::vector<std::pair<std::string, Tensor>> buffers_;
  std::vector<std::pair<std::string, std::shared_ptr<Cell>>> cells_;
  const char* layer_id_ = nullptr;  // cached; reset when this cell or an ancestor is re-parented
  void reset_layer_ids();
};

// Every random generator a train step of `net` draws from: the default generator ("default") and each
// cell's own ("cell:<path>").
std::vector<std::pair<std::string, Generator*>> generators_of(Cell& net);

using CellPtr = std::shared_ptr<Cell>;

// A loss: construct(logits, labels) -> an FP32 scalar (or per-sample losses with reduction "none").
class LossCell {
 public:
  explicit LossCell(std::string type_name) : type_name_(std::move(type_name)) {}
  virtual ~LossCell() = default;
  Tensor operator()(const Tensor& logits, const Tensor& labels);
  virtual Tensor construct(const Tensor& logits, const Tensor& labels) = 0;
  const std::string& type_name() const { return type_name_; }

 private:
  std::string type_name_;
};

}  // namespace demi::nn
