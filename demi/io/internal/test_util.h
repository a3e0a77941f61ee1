// Helpers for the io (and train checkpoint) tests, header-only: the shared ones of
// demi/core/test_support.h and a sorted directory listing.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <iterator>
#include <string>
#include <vector>

#include "demi/core/test_support.h"

namespace demi::io::test_util {

using test_support::error_message;
using test_support::expect_error;
using test_support::read_bytes;
using test_support::TempDir;
using test_support::write_bytes;

// Files in `dir`, sorted by name (hidden ones included: temporaries must not be left behind).
inline std::vector<std::string> list_dir(const std::filesystem::path& dir) {
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace demi::io::test_util
