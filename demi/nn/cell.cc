#include "demi/nn/cell.h"

#include <algorithm>
#include <atomic>
#include <cstdint>

#include "demi/autograd/autograd.h"
#include "demi/nn/call_fusion.h"
#include "demi/ops/dispatch.h"
#include "demi/ops/ops.h"

namespace demi::nn {
namespace {

// Errors raised inside a cell get the innermost cell's path prepended once; outer cells leave it.
class CellError : public Error {
 public:
  explicit CellError(const std::string& what) : Error(what) {}
};

}  // namespace

Cell::Cell(std::string type_name) : type_name_(std::move(type_name)) { autograd::install(); }

Tensor Cell::operator()(const Tensor& x) {
  if (internal::call_fusions_active()) [[unlikely]] return internal::call_through_fusions(*this, x);
  return call_as_written(x);
}

Tensor Cell::call_as_written(const Tensor& x) {
  if (recomputing_now()) return run_recomputed(x, [this](const Tensor& in) { return run(in); });
  return run(x);
}

Cell& Cell::recompute(bool on) {
  recompute_ = on;
  return *this;
}

bool Cell::recomputing_now() const { return recompute_ && training_ && autograd::grad_enabled(); }

Tensor Cell::call_adding(Tensor& slot, const Tensor& residual, const Tensor& x) {
  if (recomputing_now()) return ops::add(residual, (*this)(x));
  return call_with(slot, residual, x);
}

Tensor Cell::run_recomputed(const Tensor& x, std::function<Tensor(const Tensor&)> fn) {
  autograd::RecomputeState state;
  for (auto& [name, g] : generators_of(*this)) state.generators.push_back(g);
  for (auto& [name, b] : buffers_and_names()) state.buffers.push_back(b);
  return autograd::recompute(fn, x, std::move(state));
}

Tensor Cell::run(const Tensor& x) {
  std::optional<ops::PrecisionScope> policy;
  if (policy_) policy.emplace(policy_.get());
  ops::DTypePinScope pin(pinned_);
  ops::LayerScope layer(layer_id());
  try {
    Tensor y = construct(x);
    if (policy_ && y.defined() && is_low_precision(y.dtype())) y = ops::cast(y, DType::kF32);
    return y;
  } catch (const CellError&) {
    throw;
  } catch (const InternalError&) {
    throw;
  } catch (const ForeignError&) {
    throw;
  } catch (const Error& e) {
    throw CellError(str_cat("in ", describe(), ": ", e.what()));
  }
}

std::string Cell::path() const {
  if (parent_ == nullptr) return "";
  std::string p = parent_->path();
  return p.empty() ? name_ : p + "." + name_;
}

const char* Cell::layer_id() {
  if (layer_id_ == nullptr) layer_id_ = ops::intern_layer_path(path());
  return layer_id_;
}

void Cell::reset_layer_ids() {
  layer_id_ = nullptr;
  for (auto& [n, c] : cells_) c->reset_layer_ids();
}

std::vector<std::pair<std::string, Generator*>> generators_of(Cell& net) {
  std::vector<std::pair<std::string, Generator*>> gens{{"default", &default_generator()}};
  for (auto& [path, cell] : net.cells_and_names())
    if (Generator* g = cell->own_generator()) gens.emplace_back("cell:" + path, g);
  return gens;
}

std::string Cell::describe() const {
  if (parent_ == nullptr) return type_name_;
  const Cell* root = this;
  while (root->parent_ != nullptr) root = root->parent_;
  return str_cat(root->type_name_, " layer '", path(), "' (", type_name_, ")");
}

Tensor Cell::register_parameter(const std::string& name, Tensor value, bool requires_grad) {
  DEMI_CHECK(value.defined(), type_name_, ": parameter '", name, "' is undefined");
  Tensor p = value;
  if (value.category() != MemCategory::kParameter) {
    p = empty(value.shape(), value.dtype(), MemCategory::kParameter);
    p.copy_(value);
  }
  p.set_requires_grad(requires_grad);
  p.set_name(name);
  auto same = std::find_if(params_.begin(), params_.end(), [&](const auto& q) { return q.first == name; });
  if (same != params_.end()) {
    same->second = p;  // a name given again replaces its parameter
  } else {
    params_.emplace_back(name, p);
  }
  return p;
}

Tensor Cell::register_buffer(const std::string& name, Tensor value) {
  Tensor b = value;
  if (value.category() != MemCategory::kParameter) {
    b = empty(value.shape(), value.dtype(), MemCategory::kParameter);
    b.copy_(value);
  }
  b.set_name(name);
  buffers_.emplace_back(name, b);
  return b;
}

namespace {
std::atomic<uint64_t> g_structure_version{0};
}  // namespace

uint64_t Cell::structure_version() { return g_structure_version.load(std::memory_order_acquire); }

void Cell::set_precision_policy(std::shared_ptr<const ops::PrecisionPolicy> policy) {
  policy_ = std::move(policy);
  g_structure_version.fetch_add(1, std::memory_order_acq_rel);
}

void Cell::add_cell(const std::string& name, std::shared_ptr<Cell> cell) {
  DEMI_CHECK(cell != nullptr, type_name_, ": sub-cell '", name, "' is null");
  for (const auto& [n, c] : cells_) {
    if (n == name && c == cell) return;  // the same cell under the same name again
  }
  DEMI_CHECK(cell->parent_ == nullptr, type_name_, ": cell '", name, "' (", cell->type_name_,
             ") already belongs to another cell");
  cell->parent_ = this;
  cell->name_ = name;
  cell->reset_layer_ids();
  // A name given again replaces its cell (Python's `self.fc = nn.Dense(...)` a second time).
  auto same = std::find_if(cells_.begin(), cells_.end(), [&](const auto& c) { return c.first == name; });
  if (same != cells_.end()) {
    same->second->parent_ = nullptr;
    same->second->name_.clear();
    same->second->reset_layer_ids();
    same->second = std::move(cell);
  } else {
    cells_.emplace_back(name, std::move(cell));
  }
  g_structure_version.fetch_add(1, std::memory_order_acq_rel);
}

void Cell::collect_parameters(const std::string& prefix,
                              std::vector<std::pair<std::string, Tensor>>& out) const {
  for (const auto& [n, p] : params_) out.emplace_back(prefix + n, p);
  for (const auto& [n, c] : cells_) c->collect_parameters(prefix + n + ".", out);
}

void Cell::collect_buffers(const std::string& prefix, std::vector<std::pair<std::string, Tensor>>& out) const {
  for (const auto& [n, b] : buffers_) out.emplace_back(prefix + n, b);
  for (const auto& [n, c] : cells_) c->collect_buffers(prefix + n + ".", out);
}

void Cell::collect_cells(const std::string& prefix, std::vector<std::pair<std::string, Cell*>>& out) {
  out.emplace_back(prefix.empty() ? "" : prefix.substr(0, prefix.size() - 1), this);
  for (const auto& [n, c] : cells_) c->collect_cells(prefix + n + ".", out);
}

std::vector<std::pair<std::string, Tensor>> Cell::parameters_and_names() const {
  std::vector<std::pair<std::string, Tensor>> out;
  collect_parameters("", out);
  return out;
}

std::vector<Tensor> Cell::trainable_params() const {
  std::vector<Tensor> out;
  for (auto& [n, p] : parameters_and_names())
    if (p.requires_grad()) out.push_back(p);
  return out;
}

std::vector<std::pair<std::string, Tensor>> Cell::buffers_and_names() const {
  std::vector<std::pair<std::string, Tensor>> out;
  collect_buffers("", out);
  return out;
}

std::vector<std::pair<std::string, Cell*>> Cell::cells_and_names() {
  std::vector<std::pair<std::string, Cell*>> out;
  collect_cells("", out);
  return out;
}

void Cell::set_train(bool mode) {
  training_ = mode;
  for (auto& [n, c] : cells_) c->set_train(mode);
}

Cell& Cell::to_float(std::optional<DType> dtype) {
  if (dtype) DEMI_CHECK(is_floating(*dtype), type_name_, ".to_float: expected a floating dtype, got ", *dtype);
  pinned_ = dtype;
  g_structure_version.fetch_add(1, std::memory_order_acq_rel);
  return *this;
}

int64_t Cell::num_parameters() const {
  int64_t n = 0;
  for (const auto& [name, p] : parameters_and_names()) n += p.numel();
  return n;
}

Tensor LossCell::operator()(const Tensor& logits, const Tensor& labels) {
  try {
    return construct(logits, labels);
  } catch (const InternalError&) {
    throw;
  } catch (const ForeignError&) {
    throw;
  } catch (const Error& e) {
    throw Error(str_cat("in loss ", type_name_, ": ", e.what()));
  }
}

}  // namespace demi::nn
