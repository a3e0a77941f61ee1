// Shape: dimensions outermost-first (NCHW for images), stored inline (no heap allocation per op).
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <ostream>
#include <span>
#include <string>

namespace demi {

class Shape {
 public:
  static constexpr int kMaxRank = 8;

  Shape() = default;
  Shape(std::initializer_list<int64_t> dims);
  explicit Shape(std::span<const int64_t> dims);

  int rank() const { return rank_; }
  // Dimension i; negative i counts from the end (-1 is the last). Out of range is a demi::Error.
  int64_t operator[](int i) const { return dims_[static_cast<size_t>(wrap(i))]; }
  int64_t& operator[](int i) { return dims_[static_cast<size_t>(wrap(i))]; }
  int64_t numel() const;
  std::span<const int64_t> dims() const { return {dims_.data(), static_cast<size_t>(rank_)}; }
  void push_back(int64_t d);
  // Turns a possibly negative axis into 0..rank-1, or throws naming the axis and the shape.
  int wrap(int axis) const;
  // Row-major (contiguous) strides, in elements.
  std::array<int64_t, kMaxRank> strides() const;

  std::string to_string() const;  // "(32, 3, 32, 32)"
  bool operator==(const Shape& o) const;
  bool operator!=(const Shape& o) const { return !(*this == o); }

 private:
  std::array<int64_t, kMaxRank> dims_{};
  int rank_ = 0;
};

std::ostream& operator<<(std::ostream& os, const Shape& s);

}  // namespace demi
