// The settings demi reads from the environment, each declared once here with the values it takes, what
// applies when it is unset, and its help: one registry, one parser, and one list of those in force, which
// `demi info` prints and every run record (demi train's summary, --json, the report) carries. They are
// overrides for debugging and benchmarks — a run's numerics are chosen by its options (the AMP policy,
// ModelOptions, the command's flags) — and a command says when one takes effect.
//
//   const std::string policy = env_choice("DEMI_MATMUL");   // "auto" when unset; an error naming the
//                                                           // variable when it is not auto, demi or onednn
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace demi {

struct EnvSetting {
  std::string_view name;      // "DEMI_MATMUL"
  std::string_view values;    // "auto, demi or onednn"; "MC,KC,NC"; "seconds > 0"
  std::string_view unset;     // what applies when it is unset or empty
  std::string_view help;
  std::vector<std::string_view> choices;  // a choice setting's values (the first is the unset one); else empty
  bool overrides = true;      // changes what the kernels compute or how fast (not where files go)
};

// Every setting, in the order `demi info` lists them.
const std::vector<EnvSetting>& env_settings();
// The value of the declared variable `name`, or nullopt when it is unset or empty. Reading a variable the
// registry does not declare is an InternalError: every variable demi reads is listed.
std::optional<std::string> env_value(std::string_view name);
// A choice setting's value: one of its choices (the first when unset), else a demi::Error naming the
// variable, the value and the choices. A setting that only overrides a run's own option (DEMI_F16_PRODUCTS:
// its `unset` names no choice) is read with env_value first; env_choice of it unset is an InternalError.
std::string env_choice(std::string_view name);
// The overrides set in this process's environment, "NAME=value", in registry order (where files go is not
// listed: it changes nothing a run computes).
std::vector<std::string> env_overrides_in_force();

}  // namespace demi
