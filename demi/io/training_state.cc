// Training-state metadata to and from safetensors __metadata__ strings; see training_state.h.
#include "demi/io/training_state.h"

#include <charconv>
#include <cmath>

#include "demi/core/error.h"

namespace demi::io {
namespace {

constexpr std::string_view kPrefix = "demi.";
constexpr std::string_view kRngPrefix = "demi.rng.";

std::string double_string(double v) {
  char buf[64];
  auto [p, ec] = std::to_chars(buf, buf + sizeof buf, v);  // shortest form that reads back exactly
  DEMI_ASSERT(ec == std::errc(), "to_chars failed for a double");
  return std::string(buf, p);
}

template <typename T>
T parse_number(const std::string& file, const std::string& key, const std::string& text) {
  T v{};
  auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  DEMI_CHECK(ec == std::errc() && p == text.data() + text.size() && !text.empty(), file, ": metadata '", key,
             "' should be a number, got \"", text, "\"");
  return v;
}

}  // namespace

Metadata encode_training_meta(const TrainingMeta& m) {
  Metadata md;
  for (const auto& [k, v] : m.extra) {
    DEMI_CHECK(k.rfind(kPrefix, 0) != 0, "training state: extra metadata key '", k,
               "' starts with \"demi.\", which is reserved for demi's own keys");
    md[k] = v;
  }
  md["demi.kind"] = "training_state";
  if (!m.amp_level.empty()) md["demi.amp_level"] = m.amp_level;
  if (!m.low_dtype.empty()) md["demi.low_dtype"] = m.low_dtype;
  if (m.loss_scale) {
    md["demi.loss_scale"] = double_string(m.loss_scale->scale);
    md["demi.loss_scale.good_steps"] = std::to_string(m.loss_scale->good_steps);
    md["demi.loss_scale.consecutive_overflows"] = std::to_string(m.loss_scale->consecutive_overflows);
    md["demi.loss_scale.total_overflows"] = std::to_string(m.loss_scale->total_overflows);
  }
  if (!m.optimizer.empty()) md["demi.optimizer"] = m.optimizer;
  if (!m.amp_promotions.empty()) {
    std::string lines;
    for (const std::string& l : m.amp_promotions) {
      DEMI_CHECK(!l.empty() && l.find('\n') == std::string::npos, "training state: AMP promotion '", l,
                 "' is not a layer path (empty, or holds a newline)");
      lines += (lines.empty() ? "" : "\n") + l;
    }
    md["demi.amp.promotions"] = lines;
  }
  md["demi.global_step"] = std::to_string(m.global_step);
  md["demi.epoch"] = std::to_string(m.epoch);
  md["demi.step_in_epoch"] = std::to_string(m.step_in_epoch);
  md["demi.step"] = std::to_string(m.step);
  md["demi.epochs_done"] = std::to_string(m.epochs_done);
  md["demi.data.epoch"] = std::to_string(m.data_epoch);
  md["demi.data.position"] = std::to_string(m.data_position);
  if (m.steps_per_epoch > 0) md["demi.data.steps_per_epoch"] = std::to_string(m.steps_per_epoch);
  if (!m.run_id.empty()) md["demi.run_id"] = m.run_id;
  for (const auto& [name, g] : m.generators) {
    DEMI_CHECK(!name.empty(), "training state: a generator has an empty name");
    md[str_cat(kRngPrefix, name)] = str_cat(g.seed, ":", g.offset);
  }
  return md;
}

TrainingMeta decode_training_meta(const Metadata& md, const std::string& file) {
  TrainingMeta m;
  auto kind = md.find("demi.kind");
  m.is_training_state = kind != md.end() && kind->second == "training_state";
  auto get = [&](std::string_view key) -> const std::string* {
    auto it = md.find(std::string(key));
    return it == md.end() ? nullptr : &it->second;
  };
  auto get_int = [&](std::string_view key, int64_t& out) {
    if (const std::string* v = get(key)) out = parse_number<int64_t>(file, std::string(key), *v);
  };
  if (const std::string* v = get("demi.amp_level")) m.amp_level = *v;
  if (const std::string* v = get("demi.low_dtype")) m.low_dtype = *v;
  if (const std::string* v = get("demi.optimizer")) m.optimizer = *v;
  if (const std::string* v = get("demi.amp.promotions")) {
    size_t at = 0;
    while (at <= v->size()) {
      size_t nl = v->find('\n', at);
      if (nl == std::string::npos) nl = v->size();
      std::string l = v->substr(at, nl - at);
      DEMI_CHECK(!l.empty(), "training state ", file, ": demi.amp.promotions holds an empty layer path");
      m.amp_promotions.push_back(std::move(l));
      at = nl + 1;
    }
  }
  if (const std::string* v = get("demi.loss_scale")) {
    LossScaleRecord r;
    r.scale = parse_number<double>(file, "demi.loss_scale", *v);
    DEMI_CHECK(std::isfinite(r.scale) && r.scale > 0, file, ": metadata 'demi.loss_scale' must be a finite positive ",
               "number, got ", *v);
    get_int("demi.loss_scale.good_steps", r.good_steps);
    get_int("demi.loss_scale.consecutive_overflows", r.consecutive_overflows);
    get_int("demi.loss_scale.total_overflows", r.total_overflows);
    m.loss_scale = r;
  }
  get_int("demi.global_step", m.global_step);
  get_int("demi.epoch", m.epoch);
  get_int("demi.step_in_epoch", m.step_in_epoch);
  get_int("demi.step", m.step);
  get_int("demi.epochs_done", m.epochs_done);
  get_int("demi.data.epoch", m.data_epoch);
  get_int("demi.data.position", m.data_position);
  get_int("demi.data.steps_per_epoch", m.steps_per_epoch);
  if (auto it = md.find("demi.run_id"); it != md.end()) m.run_id = it->second;
  for (const auto& [k, v] : md) {
    if (k.rfind(kRngPrefix, 0) == 0) {
      std::string name = k.substr(kRngPrefix.size());
      size_t colon = v.find(':');
      DEMI_CHECK(!name.empty() && colon != std::string::npos, file, ": metadata '", k,
                 "' should be \"<seed>:<offset>\", got \"", v, "\"");
      GeneratorState g;
      g.seed = parse_number<uint64_t>(file, k, v.substr(0, colon));
      g.offset = parse_number<uint64_t>(file, k, v.substr(colon + 1));
      m.generators[name] = g;
    } else if (k.rfind(kPrefix, 0) != 0 && k != "format") {
      m.extra[k] = v;
    }
  }
  return m;
}

void save_training_state(const std::filesystem::path& path, const TrainingState& state, const SaveOptions& options) {
  save_safetensors(path, state.tensors, encode_training_meta(state.meta), options);
}

TrainingState load_training_state(const std::filesystem::path& path, const LoadOptions& options) {
  SafetensorsFile f = load_safetensors(path, options);
  TrainingState s;
  s.meta = decode_training_meta(f.metadata, path.string());
  s.tensors = std::move(f.tensors);
  return s;
}

}  // namespace demi::io
