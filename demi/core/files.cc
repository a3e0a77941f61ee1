#include "demi/core/files.h"

#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <system_error>

#include "demi/core/error.h"
#include "demi/core/settings.h"

namespace demi {

std::string cache_dir() {
  if (const std::optional<std::string> d = env_value("DEMI_CACHE_DIR")) return *d;
  if (const char* d = std::getenv("XDG_CACHE_HOME"); d && *d) return std::string(d) + "/demi";
  if (const char* d = std::getenv("HOME"); d && *d) return std::string(d) + "/.cache/demi";
  return str_cat("/tmp/demi-", ::getuid());
}

ScratchDir::ScratchDir(const std::string& prefix) {
  std::error_code ec;
  const std::filesystem::path tmp = std::filesystem::temp_directory_path(ec);
  DEMI_CHECK(!ec, "cannot create a scratch folder: no temporary directory (", ec.message(), "; TMPDIR names it)");
  const std::string like = (tmp / (prefix + "-XXXXXX")).string();
  std::string made = like;
  DEMI_CHECK(::mkdtemp(made.data()) != nullptr, "cannot create a scratch folder like '", like, "': ",
             std::strerror(errno));
  path_ = made;
}

ScratchDir::~ScratchDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

}  // namespace demi
