#include "demi/core/error.h"

namespace demi::internal {

void throw_error(const char* /*file*/, int /*line*/, const std::string& msg) { throw Error(msg); }

void throw_internal(const char* file, int line, const char* cond, const std::string& msg) {
  throw InternalError(str_cat("internal error (a bug in demi, please report it): ", cond, " failed at ",
                              file, ":", line, msg.empty() ? "" : ": ", msg));
}

}  // namespace demi::internal
