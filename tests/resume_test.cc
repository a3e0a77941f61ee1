// Nothing is lost when a run is killed: a training process killed with SIGKILL at several points and
// resumed from its last checkpoint ends with weights bit-identical to an uninterrupted run (O2-fp16
// with a dynamic loss scale, which overflows and skips steps early on, and O0).
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fcntl.h>

#include <chrono>
#include <cstring>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "demi/core/rng.h"
#include "demi/core/test_support.h"
#include "demi/train/checkpoint.h"

extern char** environ;

namespace demi {
namespace {

namespace fs = std::filesystem;

std::vector<std::string> train_args(const std::string& level, const fs::path& dir, bool resume) {
  std::vector<std::string> a = {DEMI_TOOL_PATH, "train",     "--model",      "A",       "--data",  "synthetic",
                                "--train-samples", "320",   "--epochs",     "3",       "--amp",   level,
                                "--dtype",        "fp16",   "--seed",       "5",       "--threads", "2",
                                "--ckpt-dir",     dir.string(), "--ckpt-every", "1",   "--keep-ckpt", "0", "--json"};
  if (resume) a.push_back("--resume");
  return a;
}

pid_t spawn(const std::vector<std::string>& args) {
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
  pid_t pid = 0;
  int rc = posix_spawn(&pid, argv[0], &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  EXPECT_EQ(rc, 0) << "cannot start " << argv[0];
  return pid;
}

int wait_for(pid_t pid) {
  int status = 0;
  waitpid(pid, &status, 0);
  return status;
}

int count_checkpoints(const fs::path& dir) {
  int n = 0;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.path().extension() == ".safetensors") ++n;
  return n;
}

io::NamedTensors final_weights(const fs::path& dir) {
  auto last = train::latest_checkpoint(dir, "modelA");
  EXPECT_TRUE(last.has_value()) << "no checkpoint in " << dir;
  io::NamedTensors out;
  for (auto& [name, t] : train::load_checkpoint(*last).tensors)
    if (name.rfind("optimizer.", 0) != 0) out.emplace_back(name, t);
  return out;
}

void expect_bit_identical(const io::NamedTensors& a, const io::NamedTensors& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a[i].first, b[i].first);
    ASSERT_EQ(a[i].second.nbytes(), b[i].second.nbytes());
    EXPECT_EQ(std::memcmp(a[i].second.raw_data(), b[i].second.raw_data(), a[i].second.nbytes()), 0)
        << a[i].first << " differs after the resumed run";
  }
}

class KillAndResume : public ::testing::TestWithParam<std::string> {};

TEST_P(KillAndResume, ResumedRunEndsBitIdenticalToAnUninterruptedOne) {
  const std::string level = GetParam();
  const test_support::TempDir tmp("demi_resume_" + level);
  const fs::path& root = tmp.path();
  fs::path whole = root / "whole", killed = root / "killed";
  fs::create_directories(whole);
  fs::create_directories(killed);

  ASSERT_EQ(wait_for(spawn(train_args(level, whole, false))), 0);
  io::NamedTensors reference = final_weights(whole);

  // Kill the run at several points (after a random number of checkpoints), resume, repeat.
  Generator g(static_cast<uint64_t>(getpid()));
  int kills = 0;
  for (int attempt = 0; attempt < 3; ++attempt) {
    pid_t pid = spawn(train_args(level, killed, true));
    int target = count_checkpoints(killed) + 1 + static_cast<int>(g.next_int(6));
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
    bool exited = false;
    while (std::chrono::steady_clock::now() < deadline) {
      int status = 0;
      if (waitpid(pid, &status, WNOHANG) == pid) {
        exited = true;
        break;
      }
      if (count_checkpoints(killed) >= target) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(1 + g.next_int(20)));
    }
    if (exited) break;  // it finished before the kill point: nothing left to interrupt
    kill(pid, SIGKILL);
    wait_for(pid);
    ++kills;
  }
  ASSERT_EQ(wait_for(spawn(train_args(level, killed, true))), 0) << "the final resume failed";
  EXPECT_GE(kills, 1) << "the run was never interrupted";
  expect_bit_identical(reference, final_weights(killed));
}

INSTANTIATE_TEST_SUITE_P(Levels, KillAndResume, ::testing::Values("O0", "O2"));

}  // namespace
}  // namespace demi
