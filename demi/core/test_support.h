// Helpers shared by the modules' tests (header-only; only *_test.cc and test helpers include it): a
// temporary directory removed on scope exit, whole-file byte reads and writes, checks that a callable
// throws a demi::Error whose message names what it should, and a child process run from an argument
// vector (no shell: a test path with a quote in it is still one argument).
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <iterator>
#include <optional>
#include <string>
#include <vector>

#include "demi/core/error.h"
#include "demi/core/files.h"

namespace demi::test_support {

// A temporary directory removed on scope exit (core/files.h's ScratchDir: made by mkdtemp).
class TempDir : public ScratchDir {
 public:
  explicit TempDir(const std::string& prefix = "demi_test") : ScratchDir(prefix) {}
};

// Sets (or, with nullptr, unsets) an environment variable for a scope, then puts back what was there.
class EnvScope {
 public:
  EnvScope(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    value ? setenv(name, value, 1) : unsetenv(name);
  }
  ~EnvScope() { old_ ? setenv(name_, old_->c_str(), 1) : unsetenv(name_); }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

inline std::vector<uint8_t> read_bytes(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

inline void write_bytes(const std::filesystem::path& p, const std::vector<uint8_t>& bytes) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(f.good()) << "could not write " << p;
}

// Runs f and returns the demi::Error's message; fails the test when f does not throw one.
template <typename F>
std::string error_message(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected a demi::Error, none was thrown";
  return "";
}

// Expects f to throw a demi::Error whose message contains every piece; returns the message.
template <typename F>
std::string expect_error(F&& f, std::initializer_list<std::string> pieces) {
  std::string msg = error_message(std::forward<F>(f));
  for (const auto& p : pieces) EXPECT_NE(msg.find(p), std::string::npos) << "missing \"" << p << "\" in: " << msg;
  return msg;
}

// Runs argv[0] (a path, or a name looked up in PATH) with argv, standard input from /dev/null, and
// returns its exit status (-1: it could not start, or a signal ended it). Its standard output goes to
// `stdout_file` when one is named (created or truncated), else it is inherited; `quiet` discards both
// output streams instead.
inline int run_program(const std::vector<std::string>& argv, const std::string& stdout_file = "", bool quiet = false) {
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  if (quiet) {
    posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0);
    posix_spawn_file_actions_addopen(&actions, 2, "/dev/null", O_WRONLY, 0);
  } else if (!stdout_file.empty()) {
    posix_spawn_file_actions_addopen(&actions, 1, stdout_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  }
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = -1;
  const int err = argv.empty() ? EINVAL : posix_spawnp(&pid, args[0], &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (err != 0) return -1;
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0)
    if (errno != EINTR) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

}  // namespace demi::test_support
