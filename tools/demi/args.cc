// Parsing of one command's options and the help text generated from their declarations (args.h).
#include "tools/demi/args.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <sstream>

#include "demi/core/error.h"

namespace demi::cli {
namespace {

const Option* find_option(const Command& cmd, std::string_view name) {
  for (const Option& o : cmd.options)
    if (o.name == name) return &o;
  return nullptr;
}

std::string unknown_option_message(const Command& cmd, std::string_view name) {
  std::vector<std::string> names{"help"};
  for (const Option& o : cmd.options) names.push_back(o.name);
  std::string guess = closest(name, names);
  std::ostringstream os;
  os << "demi " << cmd.name << ": unknown option '--" << name << "'";
  if (!guess.empty()) os << " (did you mean '--" << guess << "'?)";
  os << "; run 'demi " << cmd.name << " --help' for its options";
  return os.str();
}

size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

}  // namespace

bool ParsedArgs::has(std::string_view name) const { return given_.find(name) != given_.end(); }

ParsedArgs ParsedArgs::with(std::string_view name, std::optional<std::string> value) const {
  ParsedArgs copy = *this;
  if (value)
    copy.given_[std::string(name)] = *value;
  else
    copy.given_.erase(std::string(name));
  return copy;
}

std::string ParsedArgs::get(std::string_view name) const {
  if (auto it = given_.find(name); it != given_.end()) return it->second;
  if (auto it = defaults_.find(name); it != defaults_.end()) return it->second;
  return "";
}

Option int_option(std::string name, std::string value_name, std::string help, std::string default_value,
                  double min, double max) {
  return {std::move(name), std::move(value_name), std::move(help), std::move(default_value), ValueKind::kInt, min, max};
}

Option real_option(std::string name, std::string value_name, std::string help, std::string default_value,
                   double min, double max) {
  return {std::move(name), std::move(value_name), std::move(help), std::move(default_value), ValueKind::kReal, min,
          max};
}

std::optional<int64_t> parse_int(std::string_view s) {
  int base = 10;
  if (s.starts_with("0x")) {
    s.remove_prefix(2);
    base = 16;
  }
  int64_t out = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), out, base);
  if (s.empty() || ec != std::errc() || end != s.data() + s.size()) return std::nullopt;
  return out;
}

std::optional<double> parse_real(std::string_view s) {
  if (s.starts_with('+')) s.remove_prefix(1);  // from_chars takes no sign but '-'
  double out = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  if (s.empty() || ec != std::errc() || end != s.data() + s.size() || !std::isfinite(out)) return std::nullopt;
  return out;
}

namespace {

// 1000000 as "1000000", 1e-12 as "1e-12".
std::string number_text(double v) {
  std::ostringstream os;
  if (v == std::floor(v) && std::fabs(v) < 1e15)
    os << static_cast<int64_t>(v);
  else
    os << v;
  return os.str();
}

// "an integer in [1, 1000000]", "a number in [1e-12, 1000]".
std::string range_text(const Option& o) {
  return std::string(o.kind == ValueKind::kInt ? "an integer" : "a number") + " in [" + number_text(o.min) + ", " +
         number_text(o.max) + "]";
}

// A UsageError unless `value` is what o accepts.
void check_value(const std::string& command, const Option& o, const std::string& value) {
  bool ok = true;
  if (o.kind == ValueKind::kInt) {
    std::optional<int64_t> v = parse_int(value);
    ok = v && static_cast<double>(*v) >= o.min && static_cast<double>(*v) <= o.max;
  } else if (o.kind == ValueKind::kReal) {
    std::optional<double> v = parse_real(value);
    ok = v && *v >= o.min && *v <= o.max;
  }
  if (!ok)
    throw UsageError("demi " + command + ": --" + o.name + " expects " + range_text(o) + ", got '" + value + "'");
}

}  // namespace

std::string ParsedArgs::checked(std::string_view name, ValueKind kind) const {
  const Option* o = cmd_ ? find_option(*cmd_, name) : nullptr;
  DEMI_ASSERT(o && o->kind == kind, "--", name, " is not an option of that kind in this command");
  std::string v = get(name);
  check_value(cmd_->name, *o, v);  // a default is checked too
  return v;
}

int64_t ParsedArgs::get_int(std::string_view name) const { return *parse_int(checked(name, ValueKind::kInt)); }

double ParsedArgs::get_real(std::string_view name) const { return *parse_real(checked(name, ValueKind::kReal)); }

ParsedArgs parse_options(const Command& cmd, std::span<const std::string> args) {
  ParsedArgs out;
  out.cmd_ = &cmd;
  for (const Option& o : cmd.options)
    if (!o.value_name.empty()) out.defaults_[o.name] = o.default_value;
  bool options_done = false;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& word = args[i];
    if (options_done || word.size() < 2 || word[0] != '-') {
      out.positional_.push_back(word);
      continue;
    }
    if (word == "--") {
      options_done = true;
      continue;
    }
    if (word == "-h" || word == "--help") {
      out.given_["help"] = "";
      continue;
    }
    if (word.rfind("--", 0) != 0)
      throw UsageError("demi " + cmd.name + ": unknown option '" + word + "'; run 'demi " + cmd.name +
                       " --help' for its options");
    std::string_view body = std::string_view(word).substr(2);
    size_t eq = body.find('=');
    std::string_view name = body.substr(0, eq);
    const Option* opt = find_option(cmd, name);
    if (opt == nullptr) throw UsageError(unknown_option_message(cmd, name));
    std::string value;
    if (opt->value_name.empty()) {
      if (eq != std::string_view::npos)
        throw UsageError("demi " + cmd.name + ": --" + opt->name + " is a flag and takes no value");
    } else if (eq != std::string_view::npos) {
      value = std::string(body.substr(eq + 1));
    } else if (i + 1 < args.size()) {
      value = args[++i];
    } else {
      throw UsageError("demi " + cmd.name + ": --" + opt->name + " expects a value (" + opt->value_name +
                       ")");
    }
    check_value(cmd.name, *opt, value);
    out.given_[opt->name] = value;
  }
  if (static_cast<int>(out.positional_.size()) > cmd.max_positional && !out.has("help")) {
    const std::string& extra = out.positional_[static_cast<size_t>(cmd.max_positional)];
    throw UsageError("demi " + cmd.name + ": unexpected argument '" + extra + "'; run 'demi " + cmd.name +
                     " --help' for its usage");
  }
  return out;
}

std::string command_help(const Command& cmd) {
  std::ostringstream os;
  os << "Usage: demi " << cmd.name << " [options]";
  if (!cmd.positional_usage.empty()) os << " " << cmd.positional_usage;
  os << "\n\n" << cmd.summary << "\n\nOptions:\n";
  std::vector<std::pair<std::string, std::string>> rows;
  for (const Option& o : cmd.options) {
    std::string left = "--" + o.name + (o.value_name.empty() ? "" : " " + o.value_name);
    std::string right = o.help;
    if (o.kind != ValueKind::kText) right += "; " + range_text(o);
    if (!o.default_value.empty()) right += " (default: " + o.default_value + ")";
    rows.emplace_back(std::move(left), std::move(right));
  }
  rows.emplace_back("-h, --help", "show this help");
  size_t width = 0;
  for (const auto& r : rows) width = std::max(width, r.first.size());
  for (const auto& [left, right] : rows)
    os << "  " << left << std::string(width - left.size() + 2, ' ') << right << "\n";
  return os.str();
}

std::string closest(std::string_view word, std::span<const std::string> candidates) {
  std::string best;
  size_t best_distance = 3;  // farther than 2 edits is no longer a typo
  for (const std::string& c : candidates) {
    size_t d = edit_distance(word, c);
    if (d < best_distance) {
      best_distance = d;
      best = c;
    }
  }
  return best;
}

}  // namespace demi::cli
