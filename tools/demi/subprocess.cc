#include "tools/demi/subprocess.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "demi/core/error.h"

extern char** environ;

namespace demi::cli {

std::string ChildResult::describe() const {
  return signal != 0 ? str_cat("killed by signal ", signal) : str_cat("exit status ", exit_code);
}

ChildResult run_child(const std::vector<std::string>& argv, bool capture_stdout, bool discard_stderr) {
  DEMI_CHECK(!argv.empty(), "run_child: no program");
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  int pipe_fds[2] = {-1, -1};
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  struct Cleanup {
    posix_spawn_file_actions_t* actions;
    int* fds;
    ~Cleanup() {
      posix_spawn_file_actions_destroy(actions);
      for (int i = 0; i < 2; ++i)
        if (fds[i] >= 0) ::close(fds[i]);
    }
  } cleanup{&actions, pipe_fds};
  if (capture_stdout) {
    DEMI_CHECK(::pipe2(pipe_fds, O_CLOEXEC) == 0, "cannot make a pipe for ", command_line(argv), ": ",
               std::strerror(errno));
    posix_spawn_file_actions_adddup2(&actions, pipe_fds[1], STDOUT_FILENO);
  }
  if (discard_stderr) posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, "/dev/null", O_WRONLY, 0);
  pid_t pid = 0;
  const int err = posix_spawnp(&pid, args[0], &actions, nullptr, args.data(), environ);
  DEMI_CHECK(err == 0, "cannot start ", command_line(argv), ": ", std::strerror(err));
  ChildResult r;
  if (capture_stdout) {
    ::close(pipe_fds[1]);
    pipe_fds[1] = -1;
    char buf[4096];
    for (ssize_t n; (n = ::read(pipe_fds[0], buf, sizeof buf)) != 0;) {
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) break;
      r.out.append(buf, static_cast<size_t>(n));
    }
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0)
    DEMI_CHECK(errno == EINTR, "waiting for ", command_line(argv), ": ", std::strerror(errno));
  if (WIFEXITED(status)) r.exit_code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) r.signal = WTERMSIG(status);
  return r;
}

std::string command_line(const std::vector<std::string>& argv) {
  std::string line;
  for (const std::string& a : argv) {
    if (!line.empty()) line += ' ';
    const bool plain = !a.empty() && a.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                                         "0123456789-_./:=,+@%") == std::string::npos;
    if (plain) {
      line += a;
      continue;
    }
    line += '\'';
    for (char c : a) line += c == '\'' ? std::string("'\\''") : std::string(1, c);
    line += '\'';
  }
  return line;
}

}  // namespace demi::cli
