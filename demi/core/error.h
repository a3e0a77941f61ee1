// Errors. Two channels, as in PyTorch's c10:
//   DEMI_CHECK(cond, ...)  — the user's mistake: throws demi::Error with a message built from the
//                            arguments (what was expected, what was found, where). Never exits.
//   DEMI_ASSERT(cond, ...) — an invariant of demi's own: throws demi::InternalError ("bug in demi").
#pragma once

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
