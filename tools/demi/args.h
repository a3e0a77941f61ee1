// Command-line parsing for the demi tool: subcommands, each with its own --options, and the help text
// generated from the same declarations, so that a new subcommand (train, eval, compare, bench, inspect)
// is one Command entry. A mistake on the command line is a UsageError (the tool exits 2 with a hint);
// errors from the library stay demi::Error (exit 1).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
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

// What an option's value must be. Numbers are parsed whole and range-checked when the command line is
// read, so `--lr fast`, `--epochs 4294967297` or `--train-samples -5` stop there with exit 2 and a message
// naming the option, the value and the accepted range; no command parses a number itself.
enum class ValueKind : uint8_t { kText, kInt, kReal };

struct Option {
  std::string name{};           // "threads" for --threads
  std::string value_name{};     // "N" when the option takes a value; empty for a flag
  std::string help{};
  std::string default_value{};  // shown in the help; what get() returns when the option is absent
  ValueKind kind = ValueKind::kText;
  double min = 0, max = 0;      // kInt, kReal: the accepted closed range
};

// A numeric option: Option with kind kInt or kReal and its range.
Option int_option(std::string name, std::string value_name, std::string help, std::string default_value,
                  double min, double max);
Option real_option(std::string name, std::string value_name, std::string help, std::string default_value,
                   double min, double max);

// s parsed whole as an integer (decimal or 0x hex) or a finite real number; nullopt when it is not one.
std::optional<int64_t> parse_int(std::string_view s);
std::optional<double> parse_real(std::string_view s);

struct Command;

// The options given to one command, with the declared defaults filled in. Every command also accepts
// --help (and -h), seen as has("help").
class ParsedArgs {
 public:
  bool has(std::string_view name) const;  // given on the command line
  std::string get(std::string_view name) const;
  int64_t get_int(std::string_view name) const;   // a kInt option's value (checked when parsed)
  double get_real(std::string_view name) const;    // a kReal option's value (checked when parsed)
  bool flag(std::string_view name) const { return has(name); }
  const std::vector<std::string>& positional() const { return positional_; }
  // A copy with `name` given as `value` (or, with nullopt, not given).
  ParsedArgs with(std::string_view name, std::optional<std::string> value) const;

 private:
  friend ParsedArgs parse_options(const Command&, std::span<const std::string>);
  // The value of `name` (given or default), checked against its option of kind `kind`.
  std::string checked(std::string_view name, ValueKind kind) const;

  const Command* cmd_ = nullptr;
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
