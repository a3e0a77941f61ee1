// Atomic writes: a save that fails at any step — a full disk (injected, and a real kernel refusal via
// RLIMIT_FSIZE), a failed fsync or rename, an unwritable directory — leaves the previous file
// byte-identical and no temporary file behind, and says what failed and where.
#include "demi/io/atomic_file.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>

#include "demi/core/rng.h"
#include "demi/io/internal/test_util.h"
#include "demi/io/safetensors.h"

namespace demi::io {
namespace {

using test_util::expect_error;
using test_util::list_dir;
using test_util::read_bytes;
using test_util::write_bytes;
using test_util::TempDir;

TEST(AtomicFile, WritesReadsAndReplaces) {
  TempDir dir;
  std::vector<uint8_t> a{1, 2, 3}, b(100000, 7);
  write_file_atomic(dir / "f", a);
  EXPECT_EQ(read_file(dir / "f"), a);
  write_file_atomic(dir / "f", b);
  EXPECT_EQ(read_file(dir / "f"), b);
  EXPECT_EQ(list_dir(dir.path()), std::vector<std::string>{"f"});
  expect_error([&] { read_file(dir / "f", 10); }, {"100000 bytes, more than the 10 allowed"});
  expect_error([&] { read_file(dir / "nope"); }, {"cannot read", "nope", "No such file"});
  expect_error([&] { read_file(dir.path()); }, {"is a directory"});
  {
    AtomicFile f(dir / "g");
    f.write("xy", 2);
    EXPECT_TRUE(std::filesystem::exists(f.temp_path()));
  }  // never committed: nothing appears, the temporary file is gone
  EXPECT_EQ(list_dir(dir.path()), std::vector<std::string>{"f"});
}

class AtomicSave : public ::testing::Test {
 protected:
  void SetUp() override {
    Generator gen(9);
    old_ = {{"w", uniform({100}, -1, 1, gen)}};
    new_ = {{"w", uniform({100}, -1, 1, gen)}, {"v", uniform({50}, -1, 1, gen, DType::kF16)}};
    save_safetensors(path(), old_);
    old_bytes_ = read_bytes(path());
  }
  std::filesystem::path path() const { return dir_ / "model.safetensors"; }
  void expect_old_intact() {
    EXPECT_EQ(read_bytes(path()), old_bytes_) << "the previous checkpoint must stay byte-identical";
    EXPECT_EQ(list_dir(dir_.path()), std::vector<std::string>{"model.safetensors"}) << "no temporary file left";
  }

  TempDir dir_;
  NamedTensors old_, new_;
  std::vector<uint8_t> old_bytes_;
};

TEST_F(AtomicSave, DiskFullLeavesThePreviousFileIntact) {
  for (int64_t after : {0, 5, 100, 300}) {
    SCOPED_TRACE(after);
    WriteFaults faults{.fail_after_bytes = after};
    expect_error([&] { save_safetensors(path(), new_, {}, {.write = {.faults = &faults}}); },
                 {"cannot write '" + path().string() + "'", "No space left on device", "temporary file",
                  "the previous file is unchanged"});
    expect_old_intact();
  }
}

TEST_F(AtomicSave, FsyncAndRenameFailuresLeaveThePreviousFileIntact) {
  WriteFaults fsync{.fail_fsync = true};
  expect_error([&] { save_safetensors(path(), new_, {}, {.write = {.faults = &fsync}}); },
               {"fsync of the temporary file failed", "Input/output error"});
  expect_old_intact();
  WriteFaults rename{.fail_rename = true};
  expect_error([&] { save_safetensors(path(), new_, {}, {.write = {.faults = &rename}}); },
               {"renaming the temporary file over", "Invalid cross-device link"});
  expect_old_intact();
}

TEST_F(AtomicSave, DirectoryFsyncFailureIsReportedAfterTheRename) {
  WriteFaults dirsync{.fail_dir_fsync = true};
  expect_error([&] { save_safetensors(path(), new_, {}, {.write = {.faults = &dirsync}}); },
               {"fsync of its directory", "may not be durable"});
  EXPECT_EQ(load_safetensors(path()).tensors.size(), 2u) << "the new file is complete";
}

TEST_F(AtomicSave, RealFileSizeLimitFailureLeavesThePreviousFileIntact) {
  // The kernel refuses the write (EFBIG) once the file would exceed RLIMIT_FSIZE: a real OS failure in
  // the middle of a write, as a full disk gives, without needing root to mount a tiny file system.
  struct rlimit old {};
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &old), 0);
  auto old_handler = signal(SIGXFSZ, SIG_IGN);
  struct rlimit small = old;
  small.rlim_cur = 200;
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &small), 0);
  std::string msg;
  try {
    save_safetensors(path(), new_);
  } catch (const Error& e) {
    msg = e.what();
  }
  setrlimit(RLIMIT_FSIZE, &old);
  signal(SIGXFSZ, old_handler);
  EXPECT_NE(msg.find("File too large"), std::string::npos) << msg;
  EXPECT_NE(msg.find("writing byte 200"), std::string::npos) << msg;
  expect_old_intact();
}

TEST_F(AtomicSave, UnwritableDirectoryIsAClearError) {
  expect_error([&] { save_safetensors(dir_ / "no/such/dir/x.safetensors", new_); },
               {"creating the temporary file", "no/such/dir", "No such file or directory"});
  // A regular file where a directory should be (root ignores permission bits, so this is the portable way).
  expect_error([&] { save_safetensors(path() / "x.safetensors", new_); }, {"Not a directory"});
  expect_old_intact();
}

TEST_F(AtomicSave, OverwriteReplacesTheFileAndStaleTempsAreCleaned) {
  save_safetensors(path(), new_);
  EXPECT_EQ(load_safetensors(path()).tensors.size(), 2u);
  // A temporary file left by a dead process (pid 0x7ffffffe cannot be running) and one of ours.
  write_bytes(dir_ / ".model.safetensors.tmp-2147483646-0", {1, 2, 3});
  write_bytes(dir_ / str_cat(".model.safetensors.tmp-", getpid(), "-99"), {1});
  EXPECT_TRUE(is_atomic_temp_name(".model.safetensors.tmp-1-0"));
  EXPECT_FALSE(is_atomic_temp_name("model.safetensors"));
  EXPECT_EQ(remove_stale_temp_files(dir_.path()), 1);
  EXPECT_EQ(list_dir(dir_.path()).size(), 2u);
}

}  // namespace
}  // namespace demi::io
