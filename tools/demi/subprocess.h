// Child processes of the command line (compare's per-setting runs, the demo's comparisons), started from
// an argument vector: no shell ever reads a string built from what the user typed, so a quote or a `;`
// in a path or a --data value is just a character of that argument.
#pragma once

#include <string>
#include <vector>

namespace demi::cli {

// The child's standard output (when captured) and how it ended.
struct ChildResult {
  std::string out;
  int exit_code = -1;    // its exit status, or -1 when a signal ended it
  int signal = 0;        // the signal that ended it, or 0
  bool ok() const { return exit_code == 0; }
  std::string describe() const;  // "exit status 3", "killed by signal 9"
};

// Runs argv[0] (a path, or a name looked up in PATH) with argv and standard input inherited; with
// capture_stdout its standard output is returned, else inherited; standard error is inherited unless
// discarded. A child that cannot be started is a demi::Error naming it.
ChildResult run_child(const std::vector<std::string>& argv, bool capture_stdout, bool discard_stderr = false);

// argv as one line for a message, each argument quoted where a shell would need it (for the user to copy;
// nothing runs it).
std::string command_line(const std::vector<std::string>& argv);

}  // namespace demi::cli
