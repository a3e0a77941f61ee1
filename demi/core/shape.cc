// Shape: rank-checked construction, axis wrapping, row-major strides and printing.
#include "demi/core/shape.h"

#include "demi/core/error.h"

namespace demi {

Shape::Shape(std::initializer_list<int64_t> dims)
    : Shape(std::span<const int64_t>(dims.begin(), dims.size())) {}

Shape::Shape(std::span<const int64_t> dims) {
  DEMI_CHECK(dims.size() <= static_cast<size_t>(kMaxRank), "a shape has at most ", kMaxRank,
             " dimensions, got ", dims.size());
  for (int64_t d : dims) dims_[static_cast<size_t>(rank_++)] = d;
}

int64_t Shape::numel() const {
  int64_t n = 1;
  for (int i = 0; i < rank_; ++i) n *= dims_[static_cast<size_t>(i)];
  return n;
}

void Shape::push_back(int64_t d) {
  DEMI_CHECK(rank_ < kMaxRank, "a shape has at most ", kMaxRank, " dimensions; cannot append to ",
             to_string());
  dims_[static_cast<size_t>(rank_++)] = d;
}

int Shape::wrap(int axis) const {
  DEMI_CHECK(axis >= -rank_ && axis < rank_, "axis ", axis, " is out of range for shape ", to_string(),
             " of rank ", rank_, " (expected ", -rank_, " <= axis < ", rank_, ")");
  return axis < 0 ? axis + rank_ : axis;
}

std::array<int64_t, Shape::kMaxRank> Shape::strides() const {
  std::array<int64_t, kMaxRank> s{};
  int64_t stride = 1;
  for (int i = rank_ - 1; i >= 0; --i) {
    s[static_cast<size_t>(i)] = stride;
    stride *= dims_[static_cast<size_t>(i)];
  }
  return s;
}

std::string Shape::to_string() const {
  std::string s = "(";
  for (int i = 0; i < rank_; ++i) {
    if (i) s += ", ";
    s += std::to_string(dims_[static_cast<size_t>(i)]);
  }
  return s + ")";
}

bool Shape::operator==(const Shape& o) const {
  if (rank_ != o.rank_) return false;
  for (int i = 0; i < rank_; ++i) {
    if (dims_[static_cast<size_t>(i)] != o.dims_[static_cast<size_t>(i)]) return false;
  }
  return true;
}

std::ostream& operator<<(std::ostream& os, const Shape& s) { return os << s.to_string(); }

}  // namespace demi
