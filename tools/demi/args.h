// Command-line parsing for the demi tool: subcommands, each with its own --options, and the help text
// generated from the same declarations, so that a new subcommand (train, eval, compare, bench, inspect)
// is one Command entry. A mistake on the command line is a UsageError (the tool exits 2 with a hint);
// errors from the library stay demi::Error (exit 1).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace demi::cli {

class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct Option {
  std::string name{};           // "threads" for --threads
  std::string value_name{};     // "N" when the option takes a value; empty for a flag
  std::string help{};
  std::string default_value{};  // shown in the help; what get() returns when the option is absent
};

struct Command;

// The options given to one command, with the declared defaults filled in. Every command also accepts
// --help (and -h), seen as has("help").
class ParsedArgs {
 public:
  bool has(std::string_view name) const;  // given on the command line
  std::string get(std::string_view name) const;
  int64_t get_int(std::string_view name) const;  // a UsageError when the value is not an integer
  bool flag(std::string_view name) const { return has(name); }
  const std::vector<std::string>& positional() const { return positional_; }

 private:
  friend ParsedArgs parse_options(const Command&, std::span<const std::string>);
  std::string command_;
  std::map<std::string, std::string, std::less<>> given_;
  std::map<std::string, std::string, std::less<>> defaults_;
  std::vector<std::string> positional_;
};

struct Command {
  std::string name{};
  std::string summary{};  // one line, for `demi --help`
  std::vector<Option> options{};
  std::function<int(const ParsedArgs&)> run{};
  int max_positional = 0;          // positional arguments allowed
  std::string positional_usage{};  // e.g. "[CHECKPOINT]", for the usage line
};

// Parses `args` (the words after the command name) against cmd's options: `--name value`,
// `--name=value`, `--flag`; `--` ends the options. Unknown options name the closest known one.
ParsedArgs parse_options(const Command& cmd, std::span<const std::string> args);

// "Usage: demi info [options]" and one line per option.
std::string command_help(const Command& cmd);
// The candidate within edit distance 2 of `word` (the closest), or "" when none is that close.
std::string closest(std::string_view word, std::span<const std::string> candidates);

}  // namespace demi::cli
