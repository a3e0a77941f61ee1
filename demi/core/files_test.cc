// cache_dir's order of places, and ScratchDir: a folder of its own, never one that was there, gone at the end.
#include "demi/core/files.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "demi/core/test_support.h"

namespace demi {
namespace {

TEST(CacheDir, DemiCacheDirThenXdgThenHome) {
  test_support::EnvScope home("HOME", "/home/someone");
  {
    test_support::EnvScope demi("DEMI_CACHE_DIR", "/somewhere/demi-cache");
    test_support::EnvScope xdg("XDG_CACHE_HOME", "/xdg");
    EXPECT_EQ(cache_dir(), "/somewhere/demi-cache");
  }
  test_support::EnvScope demi("DEMI_CACHE_DIR", nullptr);
  {
    test_support::EnvScope xdg("XDG_CACHE_HOME", "/xdg");
    EXPECT_EQ(cache_dir(), "/xdg/demi");
  }
  test_support::EnvScope xdg("XDG_CACHE_HOME", "");
  EXPECT_EQ(cache_dir(), "/home/someone/.cache/demi");
}

TEST(ScratchDir, IsANewFolderOfItsOwnRemovedWithItsFilesAtTheEnd) {
  std::filesystem::path kept;
  {
    ScratchDir a("demi-files-test"), b("demi-files-test");
    EXPECT_NE(a.path(), b.path());
    EXPECT_TRUE(std::filesystem::is_directory(a.path()));
    EXPECT_EQ(a.path().parent_path(), std::filesystem::temp_directory_path());
    EXPECT_EQ(a.path().filename().string().rfind("demi-files-test-", 0), 0u) << a.str();
    std::filesystem::create_directories(a / "sub");
    std::ofstream(a / "sub" / "f.txt") << "x";
    kept = a.path();
  }
  EXPECT_FALSE(std::filesystem::exists(kept));
}

TEST(ScratchDir, ThatCannotBeMadeIsAnErrorNamingWhy) {
  {
    test_support::EnvScope tmp("TMPDIR", "/proc");  // a folder no one can create folders in
    test_support::expect_error([] { ScratchDir d("demi-files-test"); },
                               {"cannot create a scratch folder like", "/proc/demi-files-test-XXXXXX"});
  }
  test_support::EnvScope tmp("TMPDIR", "/proc/no-such-folder");
  test_support::expect_error([] { ScratchDir d("demi-files-test"); },
                             {"cannot create a scratch folder: no temporary directory", "TMPDIR"});
}

}  // namespace
}  // namespace demi
