// Errors. Two channels, as in PyTorch's c10:
//   DEMI_CHECK(cond, ...)  — the user's mistake: throws demi::Error with a message built from the
//                            arguments (what was expected, what was found, where). Never exits.
//   DEMI_ASSERT(cond, ...) — an invariant of demi's own: throws demi::InternalError ("bug in demi").
#pragma once

#include <exception>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace demi {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

class InternalError : public Error {
 public:
  explicit InternalError(const std::string& what) : Error(what) {}
};

// An exception raised by user code in another language (a Python exception in a data source, a map
// function or a callback), carried through demi unchanged to the caller that can raise it again as itself,
// with its type and traceback (the Python package does). what() is its text; original() the exception
// itself. Code that adds context to demi's errors (a cell's path, a map's column) rethrows it as it is.
class ForeignError : public Error {
 public:
  ForeignError(const std::string& what, std::exception_ptr original) : Error(what), original_(std::move(original)) {}
  const std::exception_ptr& original() const { return original_; }

 private:
  std::exception_ptr original_;
};

namespace internal {

template <typename... Args>
std::string str_cat(Args&&... args) {
  std::ostringstream os;
  (os << ... << std::forward<Args>(args));
  return os.str();
}

[[noreturn]] void throw_error(const char* file, int line, const std::string& msg);
[[noreturn]] void throw_internal(const char* file, int line, const char* cond, const std::string& msg);

}  // namespace internal

// Builds a message from any streamable values: str_cat("expected ", a, ", got ", b).
using internal::str_cat;

}  // namespace demi

#define DEMI_CHECK(cond, ...)                                                                \
  do {                                                                                       \
    if (!(cond)) [[unlikely]]                                                                \
      ::demi::internal::throw_error(__FILE__, __LINE__, ::demi::str_cat(__VA_ARGS__));       \
  } while (0)

#define DEMI_ASSERT(cond, ...)                                                               \
  do {                                                                                       \
    if (!(cond)) [[unlikely]]                                                                \
      ::demi::internal::throw_internal(__FILE__, __LINE__, #cond,                           \
                                       ::demi::str_cat("" __VA_OPT__(, ) __VA_ARGS__));    \
  } while (0)
