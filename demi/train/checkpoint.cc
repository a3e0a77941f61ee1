// Checkpoints of a training run and the ModelCheckpoint callback; see checkpoint.h. The glue between the
// live objects (Cell, Optimizer, LossScaleManager, Generators) and demi/io's plain TrainingState.
#include "demi/train/checkpoint.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <random>
#include <limits>
#include <map>
#include <ostream>
#include <set>

#include "demi/core/error.h"
#include "demi/distributed/distributed.h"
#include "demi/io/atomic_file.h"
#include "demi/nn/layers.h"
#include "demi/train/model.h"

namespace demi::train {
namespace {

constexpr std::string_view kOptimizerPrefix = "optimizer.";
constexpr const char* kExtension = ".safetensors";

bool starts_with(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }

std::string join(const std::vector<std::string>& v, size_t max = 20) {
  std::string s;
  for (size_t i = 0; i < v.size() && i < max; ++i) s += (i ? ", " : "") + v[i];
  if (v.size() > max) s += str_cat(" (and ", v.size() - max, " more)");
  return s;
}

// Whether a tensor of dtype `from` may be loaded into one of dtype `to` (converted on the way).
bool convertible(DType from, DType to) { return from == to || (is_floating(from) && is_floating(to)); }

// One planned copy: checked in full before anything is written, so an error changes nothing.
struct Copy {
  Tensor dst;
  Tensor src;
};

// The values of src that are NaN or infinite, or that would be once converted to `to` (an f64 beyond f32's
// range becomes Inf).
int64_t non_finite_values(const Tensor& src, DType to) {
  if (!is_floating(src.dtype()) || !is_floating(to)) return 0;
  const Tensor v = src.to(DType::kF64);
  const double* p = v.data<double>();
  const double max = to == DType::kF16    ? 65504.0
                     : to == DType::kBF16 ? 3.3895313892515355e38
                     : to == DType::kF32  ? static_cast<double>(std::numeric_limits<float>::max())
                                          : std::numeric_limits<double>::max();
  int64_t n = 0;
  for (int64_t i = 0; i < v.numel(); ++i) n += !(std::abs(p[i]) <= max);  // (NaN fails the comparison)
  return n;
}

// Matches `tensors` against `expected` (name -> live tensor). Shape and dtype mismatches go to `errors`
// (always fatal), missing/unexpected names to the report; so do NaN or infinite values unless allowed (ReLU
// and max-pool turn NaN weights into a plausible loss, and a run would train on, saving NaN checkpoints).
std::vector<Copy> match(const std::vector<std::pair<std::string, Tensor>>& expected,
                        const std::vector<std::pair<std::string, const Tensor*>>& tensors, LoadReport& report,
                        std::vector<std::string>& errors, bool allow_non_finite = false) {
  std::map<std::string, Tensor> want;
  for (const auto& [name, t] : expected) want.emplace(name, t);
  std::set<std::string> seen;
  std::vector<Copy> copies;
  for (const auto& [name, src] : tensors) {
    auto it = want.find(name);
    if (it == want.end()) {
      report.unexpected.push_back(name);
      continue;
    }
    if (!seen.insert(name).second) {
      errors.push_back(str_cat(name, ": given twice"));
      continue;
    }
    const Tensor& dst = it->second;
    if (src->shape() != dst.shape()) {
      errors.push_back(str_cat(name, ": shape expected ", dst.shape(), ", got ", src->shape()));
      continue;
    }
    if (!convertible(src->dtype(), dst.dtype())) {
      errors.push_back(str_cat(name, ": dtype expected ", dtype_name(dst.dtype()), ", got ", dtype_name(src->dtype()),
                               " (not convertible)"));
      continue;
    }
    if (!allow_non_finite) {
      if (const int64_t bad = non_finite_values(*src, dst.dtype()); bad > 0) {
        errors.push_back(str_cat(name, ": ", bad, " of ", src->numel(), " values are NaN or infinite",
                                 src->dtype() != dst.dtype() ? str_cat(" as ", dtype_name(dst.dtype())) : "",
                                 " (allow_non_finite loads them for inspection; demi: --allow-non-finite)"));
        continue;
      }
    }
    if (src->dtype() != dst.dtype()) report.converted.push_back(name);
    report.loaded.push_back(name);
    copies.push_back({dst, *src});
  }
  for (const auto& [name, t] : expected) {
    if (!seen.count(name)) report.missing.push_back(name);
  }
  return copies;
}

void apply(const std::vector<Copy>& copies) {
  for (const Copy& c : copies) {
    Tensor dst = c.dst;
    dst.copy_(c.src);
    // The AMP cast cache keys a parameter's low-precision copy on its version: a stale one must not
    // survive the new values.
    if (dst.has_autograd_meta()) ++dst.autograd_meta().version;
  }
}

std::string problems(const std::vector<std::string>& errors, const LoadReport& r, bool strict) {
  std::string s;
  auto add = [&](const std::string& part) { s += (s.empty() ? "" : "; ") + part; };
  if (!errors.empty()) add(str_cat(errors.size(), " mismatched: ", join(errors)));
  if (strict && !r.missing.empty()) add(str_cat(r.missing.size(), " missing: ", join(r.missing)));
  if (strict && !r.unexpected.empty()) add(str_cat(r.unexpected.size(), " unexpected: ", join(r.unexpected)));
  return s;
}

// Splits checkpoint tensors into the network's and the optimizer's (prefix stripped).
void split(const io::NamedTensors& tensors, std::vector<std::pair<std::string, const Tensor*>>& net,
           std::vector<std::pair<std::string, const Tensor*>>& opt) {
  for (const auto& [name, t] : tensors) {
    if (starts_with(name, kOptimizerPrefix)) {
      opt.emplace_back(name.substr(kOptimizerPrefix.size()), &t);
    } else {
      net.emplace_back(name, &t);
    }
  }
}

std::vector<std::pair<std::string, Tensor>> net_tensors(nn::Cell& net) {
  auto all = net.parameters_and_names();
  auto buffers = net.buffers_and_names();
  all.insert(all.end(), buffers.begin(), buffers.end());
  return all;
}

std::string metric_string(double v) {
  char buf[64];
  auto [p, ec] = std::to_chars(buf, buf + sizeof buf, v);
  return ec == std::errc() ? std::string(buf, p) : std::to_string(v);
}

}  // namespace

TrainState train_state_of(Model& model) {
  TrainState s;
  s.network = &model.network();
  s.optimizer = &model.optimizer();
  s.loss_scale_manager = model.loss_scale_manager();
  s.amp_adapter = model.amp_adapter();
  s.amp_level = model.amp_level();
  s.low_dtype = model.low_dtype();
  s.generators = generators_of(model.network());
  return s;
}

Progress progress_of(const RunContext& ctx, bool at_epoch_end) {
  Progress p;
  p.epoch = ctx.epoch;
  p.step_in_epoch = ctx.step_in_epoch;
  p.step = ctx.cur_step_num;
  bool complete = at_epoch_end || (ctx.steps_per_epoch > 0 && ctx.step_in_epoch >= ctx.steps_per_epoch);
  p.epochs_done = complete ? ctx.epoch : ctx.epoch - 1;
  if (ctx.data_epoch >= 0) {  // Model::train says where its data stands (with sinks it is not the epoch's)
    p.data_epoch = ctx.data_epoch;
    p.data_position = ctx.data_position;
  } else {
    // A loop whose epochs are the data set's: its iterator counts epochs from 0, and its epoch k is the
    // (k+1)-th of the run.
    p.data_epoch = p.epochs_done;
    p.data_position = complete ? 0 : ctx.step_in_epoch;
  }
  p.steps_per_epoch = std::max<int64_t>(ctx.steps_per_epoch, 0);  // kInfiniteSize (-1): unknown
  return p;
}

io::TrainingState capture_training_state(const TrainState& state, const Progress& progress) {
  DEMI_CHECK(state.network != nullptr, "save_checkpoint: no network");
  io::TrainingState out;
  for (auto& [name, t] : net_tensors(*state.network)) {
    DEMI_CHECK(!starts_with(name, kOptimizerPrefix), "save_checkpoint: the network's tensor '", name,
               "' starts with \"optimizer.\", which checkpoints reserve for the optimizer's state; rename the cell");
    out.tensors.emplace_back(name, t);
  }
  io::TrainingMeta& m = out.meta;
  m.is_training_state = true;
  m.amp_level = amp::level_name(state.amp_level);
  m.low_dtype = std::string(dtype_name(state.low_dtype));
  if (state.amp_adapter) m.amp_promotions = state.amp_adapter->promoted_layers();
  if (state.optimizer) {
    for (auto& [name, t] : state.optimizer->state()) out.tensors.emplace_back(str_cat(kOptimizerPrefix, name), t);
    m.optimizer = state.optimizer->name();
    m.global_step = state.optimizer->global_step();
  }
  if (state.loss_scale_manager) {
    amp::LossScaleState ls = state.loss_scale_manager->state();
    m.loss_scale = io::LossScaleRecord{ls.scale, ls.good_steps, ls.consecutive_overflows, ls.total_overflows};
  }
  m.epoch = progress.epoch;
  m.step_in_epoch = progress.step_in_epoch;
  m.step = progress.step;
  m.epochs_done = progress.epochs_done;
  m.data_epoch = progress.data_epoch;
  m.steps_per_epoch = progress.steps_per_epoch;
  m.data_position = progress.data_position;
  for (const auto& [name, g] : state.generators) {
    DEMI_CHECK(g != nullptr, "save_checkpoint: generator '", name, "' is null");
    m.generators[name] = io::GeneratorState{g->seed(), g->offset()};
  }
  return out;
}

void save_checkpoint(const std::filesystem::path& path, const TrainState& state, const Progress& progress,
                     const io::SaveOptions& options) {
  io::save_training_state(path, capture_training_state(state, progress), options);
}

void save_checkpoint(const std::filesystem::path& path, Model& model, const Progress& progress,
                     const io::SaveOptions& options) {
  save_checkpoint(path, train_state_of(model), progress, options);
}

io::TrainingState load_checkpoint(const std::filesystem::path& path, const io::LoadOptions& options) {
  return io::load_training_state(path, options);
}

LoadReport load_param_into_net(nn::Cell& net, const io::NamedTensors& tensors, bool strict, bool allow_non_finite) {
  std::vector<std::pair<std::string, const Tensor*>> mine, opt;
  split(tensors, mine, opt);
  LoadReport report;
  std::vector<std::string> errors;
  std::vector<Copy> copies = match(net_tensors(net), mine, report, errors, allow_non_finite);
  std::string p = problems(errors, report, strict);
  DEMI_CHECK(p.empty(), "load_param_into_net: the checkpoint does not match network ", net.describe(), ": ", p,
             strict && errors.empty() ? " (strict=false loads the names that match)" : "");
  apply(copies);
  return report;
}

LoadReport restore_checkpoint(const io::TrainingState& ckpt, const TrainState& state, const RestoreOptions& options) {
  DEMI_CHECK(state.network != nullptr, "restore_checkpoint: no network");
  const io::TrainingMeta& m = ckpt.meta;
  std::vector<std::string> errors;  // fatal whatever `strict` says
  std::vector<std::string> strict_errors;

  if (options.check_amp && !m.amp_level.empty()) {
    std::string level = amp::level_name(state.amp_level);
    if (m.amp_level != level) {
      errors.push_back(str_cat("AMP level: checkpoint ", m.amp_level, ", this run ", level));
    } else if (state.amp_level != amp::Level::kO0 && !m.low_dtype.empty() && m.low_dtype != dtype_name(state.low_dtype)) {
      errors.push_back(str_cat("low dtype: checkpoint ", m.low_dtype, ", this run ", dtype_name(state.low_dtype)));
    }
  }

  std::vector<std::pair<std::string, const Tensor*>> mine, opt;
  split(ckpt.tensors, mine, opt);
  LoadReport report;
  std::vector<Copy> copies = match(net_tensors(*state.network), mine, report, errors, options.allow_non_finite);

  std::vector<Copy> opt_copies;
  if (options.restore_optimizer && state.optimizer) {
    if (!m.optimizer.empty() && m.optimizer != state.optimizer->name()) {
      errors.push_back(str_cat("optimizer: checkpoint ", m.optimizer, ", this run ", state.optimizer->name()));
    }
    LoadReport r;
    opt_copies = match(state.optimizer->state(), opt, r, errors, options.allow_non_finite);
    for (auto& n : r.loaded) report.loaded.push_back(str_cat(kOptimizerPrefix, n));
    for (auto& n : r.missing) report.missing.push_back(str_cat(kOptimizerPrefix, n));
    for (auto& n : r.unexpected) report.unexpected.push_back(str_cat(kOptimizerPrefix, n));
    if (!m.is_training_state) report.missing.push_back("optimizer global step");
  } else {
    for (auto& [n, t] : opt) report.unexpected.push_back(str_cat(kOptimizerPrefix, n));
  }

  if (state.loss_scale_manager && !m.loss_scale) report.missing.push_back("loss-scale state");
  if (!state.loss_scale_manager && m.loss_scale) report.unexpected.push_back("loss-scale state");
  if (!state.amp_adapter && !m.amp_promotions.empty())
    report.unexpected.push_back(str_cat("AMP promotions (", m.amp_promotions.size(), " layers in FP32; resume with amp_adapt)"));

  std::vector<std::pair<Generator*, io::GeneratorState>> gens;
  if (options.restore_rng) {
    for (const auto& [name, g] : state.generators) {
      auto it = m.generators.find(name);
      if (it == m.generators.end()) {
        report.missing.push_back(str_cat("generator ", name));
      } else {
        gens.emplace_back(g, it->second);
      }
    }
  }

  std::string p = problems(errors, report, options.strict);
  DEMI_CHECK(p.empty(), "restore_checkpoint: the checkpoint does not match this run (", state.network->describe(),
             "): ", p);

  apply(copies);
  apply(opt_copies);
  if (options.restore_optimizer && state.optimizer && m.is_training_state) state.optimizer->set_global_step(m.global_step);
  if (state.loss_scale_manager && m.loss_scale) {
    state.loss_scale_manager->set_state(amp::LossScaleState{m.loss_scale->scale, m.loss_scale->good_steps,
                                                            m.loss_scale->consecutive_overflows,
                                                            m.loss_scale->total_overflows});
  }
  for (auto& [g, s] : gens) g->set_state(s.seed, s.offset);
  if (state.amp_adapter && !m.amp_promotions.empty()) state.amp_adapter->restore(m.amp_promotions);
  return report;
}

LoadReport restore_checkpoint(const io::TrainingState& ckpt, Model& model, const RestoreOptions& options) {
  LoadReport r = restore_checkpoint(ckpt, train_state_of(model), options);
  if (ckpt.meta.is_training_state) {
    const io::TrainingMeta& m = ckpt.meta;
    model.set_epochs_done(m.epochs_done);
    model.set_resumed_run_id(m.run_id.empty() ? "-" : m.run_id);
    const bool mid_epoch = m.epoch > m.epochs_done;
    model.set_resume_position(m.data_position, m.step, m.steps_per_epoch, m.data_epoch,
                              mid_epoch ? m.step_in_epoch : 0);
  }
  return r;
}

data::IteratorOptions resume_iterator_options(const io::TrainingMeta& meta) {
  data::IteratorOptions o;
  o.epoch = meta.data_epoch;
  o.position = meta.data_position;
  return o;
}

// ---- file names ----

std::optional<CheckpointName> parse_checkpoint_name(const std::string& filename) {
  std::string_view s = filename;
  std::string_view ext = kExtension;
  if (s.size() <= ext.size() || s.substr(s.size() - ext.size()) != ext) return std::nullopt;
  s.remove_suffix(ext.size());
  size_t dash = s.rfind('-');
  if (dash == std::string_view::npos || dash == 0) return std::nullopt;
  std::string_view rest = s.substr(dash + 1);
  size_t us = rest.find('_');
  if (us == std::string_view::npos) return std::nullopt;
  CheckpointName n;
  n.prefix = std::string(s.substr(0, dash));
  auto parse = [](std::string_view t, int64_t& out) {
    if (t.empty() || t[0] == '-' || t[0] == '+') return false;
    auto [p, ec] = std::from_chars(t.data(), t.data() + t.size(), out);
    return ec == std::errc() && p == t.data() + t.size();
  };
  if (!parse(rest.substr(0, us), n.epoch) || !parse(rest.substr(us + 1), n.step)) return std::nullopt;
  return n;
}

namespace {

// Checkpoints named "<prefix>-<epoch>_<step>.safetensors" in `dir`, oldest first.
// 16 hex digits from the system's entropy source: which run a checkpoint belongs to.
std::string new_run_id() {
  std::random_device rd;
  const uint64_t v = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

std::vector<std::pair<CheckpointName, std::filesystem::path>> list_checkpoints(const std::filesystem::path& dir,
                                                                               const std::string& prefix) {
  std::vector<std::pair<CheckpointName, std::filesystem::path>> out;
  std::error_code ec;
  for (std::filesystem::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    std::string name = it->path().filename().string();
    if (io::is_atomic_temp_name(name)) continue;
    auto n = parse_checkpoint_name(name);
    if (!n || (!prefix.empty() && n->prefix != prefix)) continue;
    out.emplace_back(*n, it->path());
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) {
    return std::tie(a.first.epoch, a.first.step, a.second) < std::tie(b.first.epoch, b.first.step, b.second);
  });
  return out;
}

}  // namespace

std::optional<std::filesystem::path> latest_checkpoint(const std::filesystem::path& dir, const std::string& prefix) {
  auto all = list_checkpoints(dir, prefix);
  if (all.empty()) return std::nullopt;
  return all.back().second;
}

std::optional<LoadedCheckpoint> latest_loadable_checkpoint(const std::filesystem::path& dir, const std::string& prefix,
                                                           std::vector<SkippedCheckpoint>* skipped, bool set_aside) {
  auto all = list_checkpoints(dir, prefix);
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    try {
      return LoadedCheckpoint{it->second, load_checkpoint(it->second)};
    } catch (const Error& e) {
      std::filesystem::path where = it->second;
      if (set_aside) {
        std::filesystem::path aside = where;
        aside += ".damaged";
        std::error_code ec;
        std::filesystem::rename(where, aside, ec);
        DEMI_CHECK(!ec, "cannot set the damaged checkpoint ", where.string(), " aside as ", aside.string(), ": ",
                   ec.message(), " (its error: ", e.what(), ")");
        where = aside;
      }
      if (skipped) skipped->push_back({where, e.what()});
    }
  }
  return std::nullopt;
}

// ---- ModelCheckpoint ----

ModelCheckpoint::ModelCheckpoint(std::string prefix, std::filesystem::path directory, CheckpointConfig config)
    : prefix_(std::move(prefix)), dir_(std::move(directory)), config_(std::move(config)) {
  DEMI_CHECK(!prefix_.empty() && prefix_.find('/') == std::string::npos && prefix_[0] != '.',
             "ModelCheckpoint: the prefix must be a plain, non-hidden file name part, got '", prefix_, "'");
  DEMI_CHECK(config_.save_checkpoint_steps >= 0 && config_.save_checkpoint_epochs >= 0,
             "ModelCheckpoint: save_checkpoint_steps and save_checkpoint_epochs must be >= 0, got ",
             config_.save_checkpoint_steps, " and ", config_.save_checkpoint_epochs);
  DEMI_CHECK(config_.keep_checkpoint_max >= 0, "ModelCheckpoint: keep_checkpoint_max must be >= 0, got ",
             config_.keep_checkpoint_max);
  if (dir_.empty()) dir_ = ".";
}

ModelCheckpoint::~ModelCheckpoint() { unlock(); }

void ModelCheckpoint::lock() {
  if (lock_fd_ >= 0) return;
  std::error_code ec;
  std::filesystem::create_directories(dir_, ec);
  DEMI_CHECK(!ec && std::filesystem::is_directory(dir_), "ModelCheckpoint: cannot create the checkpoint directory '",
             dir_.string(), "': ", ec ? ec.message() : "a file of that name exists");
  const std::filesystem::path path = dir_ / (prefix_ + ".lock");
  // (Creating it also proves the directory writable, before anything is trained.)
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
  DEMI_CHECK(fd >= 0, "ModelCheckpoint: cannot write in the checkpoint directory '", dir_.string(), "' (", path.string(),
             ": ", std::strerror(errno), ")");
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    char owner[32] = {};
    [[maybe_unused]] ssize_t n = ::pread(fd, owner, sizeof owner - 1, 0);
    ::close(fd);
    DEMI_CHECK(false, "ModelCheckpoint: another run is writing checkpoints '", prefix_, "-*' in '", dir_.string(), "'",
               owner[0] ? str_cat(" (process ", std::string(owner).substr(0, std::string(owner).find('\n')), ")") : "",
               err == EWOULDBLOCK ? "" : str_cat(": ", std::strerror(err)),
               ": two runs in one directory would rotate and mix each other's checkpoints. Give this run "
               "another directory, or wait for that one to end");
  }
  const std::string pid = str_cat(::getpid(), "\n");
  if (::ftruncate(fd, 0) == 0) {
    [[maybe_unused]] ssize_t w = ::pwrite(fd, pid.data(), pid.size(), 0);
  }
  lock_fd_ = fd;
}

void ModelCheckpoint::unlock() {
  if (lock_fd_ < 0) return;
  ::close(lock_fd_);  // (the lock goes with the descriptor; the file stays, empty of meaning)
  lock_fd_ = -1;
}

bool ModelCheckpoint::is_ours(const std::filesystem::path& checkpoint) const {
  std::string id;
  try {
    const auto header = io::read_safetensors_header(checkpoint);
    if (auto it = header.metadata.find("demi.run_id"); it != header.metadata.end()) id = it->second;
  } catch (const Error&) {
    return false;  // unreadable: not known to be this run's, so never deleted by it
  }
  return id.empty() ? adopt_unnamed_ : id == run_id_;
}

void ModelCheckpoint::scan_existing() {
  if (scanned_) return;
  scanned_ = true;
  lock();
  io::remove_stale_temp_files(dir_);
  kept_.clear();
  std::vector<std::filesystem::path> others;
  for (auto& [n, p] : list_checkpoints(dir_, prefix_)) (is_ours(p) ? kept_ : others).push_back(p);
  if (!others.empty()) {
    std::string names;
    for (size_t i = 0; i < others.size() && i < 4; ++i) names += str_cat(i ? ", " : "", others[i].filename().string());
    if (others.size() > 4) names += str_cat(" and ", others.size() - 4, " more");
    switch (config_.other_runs) {
      case CheckpointConfig::OtherRuns::kRefuse:
        unlock();
        DEMI_CHECK(false, "ModelCheckpoint: '", dir_.string(), "' holds checkpoints of another run (", names,
                   "): resume that run (demi train --resume), set its checkpoints aside and start over (demi train "
                   "--start-over), or give this run another directory");
        break;
      case CheckpointConfig::OtherRuns::kSetAside: {
        std::filesystem::path aside;
        for (int k = 1;; ++k) {
          aside = dir_ / str_cat(prefix_, "-set-aside-", k);
          std::error_code ec;
          if (std::filesystem::create_directory(aside, ec)) break;
          DEMI_CHECK(!ec || ec == std::errc::file_exists, "ModelCheckpoint: cannot create '", aside.string(),
                     "': ", ec.message());
        }
        for (const auto& p : others) {
          std::error_code ec;
          std::filesystem::rename(p, aside / p.filename(), ec);
          DEMI_CHECK(!ec, "ModelCheckpoint: cannot move ", p.string(), " into ", aside.string(), ": ", ec.message());
        }
        callback_stream() << "ModelCheckpoint: set aside " << others.size() << " checkpoint(s) of another run ("
                          << names << ") in " << aside.string() << std::endl;
        break;
      }
      case CheckpointConfig::OtherRuns::kKeepApart:
        callback_stream() << "ModelCheckpoint: " << dir_.string() << " holds " << others.size()
                          << " checkpoint(s) of another run (" << names
                          << "): left as they are, not counted in keep_checkpoint_max" << std::endl;
        break;
    }
  }
  auto best = dir_ / (prefix_ + "-best" + kExtension);
  if (!config_.monitor.empty() && std::filesystem::exists(best)) {
    // A resumed run keeps competing against the best of the runs before it.
    try {
      auto h = io::read_safetensors_header(best);
      auto m = h.metadata.find("monitor");
      auto v = h.metadata.find("monitor_value");
      if (m != h.metadata.end() && m->second == config_.monitor && v != h.metadata.end()) {
        double d = 0;
        auto [p, e] = std::from_chars(v->second.data(), v->second.data() + v->second.size(), d);
        if (e == std::errc()) {
          best_value_ = d;
          has_best_file_ = true;
        }
      }
    } catch (const Error& e) {
      callback_stream() << "ModelCheckpoint: ignoring the unreadable " << best.string() << ": " << e.what() << std::endl;
    }
  }
}

void ModelCheckpoint::on_train_begin(RunContext& ctx) {
  if (dist::get_rank() != 0) return;  // (rank 0 writes every checkpoint)
  if (!config_.run_id.empty()) {
    run_id_ = config_.run_id;
  } else if (ctx.model != nullptr && !ctx.model->resumed_run_id().empty()) {
    const std::string& id = ctx.model->resumed_run_id();
    adopt_unnamed_ = id == "-";
    run_id_ = adopt_unnamed_ ? new_run_id() : id;
  } else if (run_id_.empty()) {
    run_id_ = new_run_id();
  }
  scanned_ = false;
  scan_existing();
}

TrainState ModelCheckpoint::state(RunContext& ctx) {
  if (source_) return source_();
  DEMI_CHECK(ctx.model != nullptr, "ModelCheckpoint: the run context has no Model; call set_state_source() to ",
             "say what to save in a custom loop");
  return train_state_of(*ctx.model);
}

bool ModelCheckpoint::write(const std::filesystem::path& path, RunContext& ctx, bool at_epoch_end, bool best) {
  try {
    io::TrainingState s = capture_training_state(state(ctx), progress_of(ctx, at_epoch_end));
    if (run_id_.empty()) run_id_ = config_.run_id.empty() ? new_run_id() : config_.run_id;  // (a custom loop)
    s.meta.run_id = run_id_;
    for (const auto& [k, v] : config_.extra) s.meta.extra[k] = v;
    if (best && best_value_) {
      s.meta.extra["monitor"] = config_.monitor;
      s.meta.extra["monitor_value"] = metric_string(*best_value_);
    }
    io::save_training_state(path, s, config_.save);
    ++saves_;
    return true;
  } catch (const Error& e) {
    ++failures_;
    if (!config_.continue_on_error) throw Error(str_cat("ModelCheckpoint: ", e.what()));
    callback_stream() << "ModelCheckpoint: checkpoint not saved (training continues): " << e.what() << std::endl;
    return false;
  }
}

void ModelCheckpoint::save(RunContext& ctx, bool at_epoch_end) {
  scan_existing();
  auto path = dir_ / str_cat(prefix_, "-", ctx.epoch, "_", ctx.step_in_epoch, kExtension);
  if (!write(path, ctx, at_epoch_end, /*best=*/false)) return;
  saved_step_ = ctx.cur_step_num;
  if (std::find(kept_.begin(), kept_.end(), path) == kept_.end()) kept_.push_back(path);
  std::string pointer = path.filename().string() + "\n";
  try {
    io::write_file_atomic(dir_ / (prefix_ + "-latest"),
                          {reinterpret_cast<const uint8_t*>(pointer.data()), pointer.size()}, config_.save.write);
  } catch (const Error& e) {
    // The checkpoint itself is safe; latest_checkpoint() finds it by name without the pointer.
    callback_stream() << "ModelCheckpoint: could not update " << prefix_ << "-latest: " << e.what() << std::endl;
  }
  // Only now, with the new file durable, may older ones go.
  while (config_.keep_checkpoint_max > 0 && kept_.size() > static_cast<size_t>(config_.keep_checkpoint_max)) {
    std::error_code ec;
    std::filesystem::remove(kept_.front(), ec);
    if (ec) callback_stream() << "ModelCheckpoint: could not delete " << kept_.front().string() << ": " << ec.message() << std::endl;
    kept_.erase(kept_.begin());
  }
}

void ModelCheckpoint::on_step_end(RunContext& ctx) {
  if (dist::get_rank() != 0) return;  // in a data-parallel job rank 0 writes (every process holds the same state)
  if (ctx.passes_multiple_of(config_.save_checkpoint_steps)) save(ctx, false);
}

void ModelCheckpoint::on_train_end(RunContext& ctx) {
  if (dist::get_rank() != 0) return;
  if (ctx.cur_step_num != 0 && saved_step_ != ctx.cur_step_num) save(ctx, !ctx.stopped_mid_epoch);
  unlock();
}

void ModelCheckpoint::on_epoch_end(RunContext& ctx) {
  if (dist::get_rank() != 0) return;
  // Re-saved even when a step checkpoint was just written at this step: at the epoch end the progress
  // says "epoch complete" for sure (steps_per_epoch may be unknown) and the metrics exist.
  if (config_.save_checkpoint_epochs > 0 && ctx.epoch % config_.save_checkpoint_epochs == 0) save(ctx, true);
  if (config_.monitor.empty()) return;
  auto it = ctx.metrics.find(config_.monitor);
  if (it == ctx.metrics.end()) {
    std::vector<std::string> names;
    for (const auto& [k, v] : ctx.metrics) names.push_back(k);
    DEMI_CHECK(false, "ModelCheckpoint: no metric '", config_.monitor, "' at the end of epoch ", ctx.epoch,
               " (the epoch has: ", names.empty() ? std::string("none") : join(names), ")");
  }
  double v = it->second;
  bool better = !best_value_ || (config_.maximize ? v > *best_value_ : v < *best_value_);
  if (!better) return;
  std::optional<double> previous = best_value_;
  best_value_ = v;
  if (write(dir_ / (prefix_ + "-best" + kExtension), ctx, /*at_epoch_end=*/true, /*best=*/true)) {
    has_best_file_ = true;
  } else {
    best_value_ = previous;
  }
}

std::optional<std::filesystem::path> ModelCheckpoint::latest() const {
  if (kept_.empty()) return std::nullopt;
  return kept_.back();
}

std::optional<std::filesystem::path> ModelCheckpoint::best() const {
  if (!has_best_file_) return std::nullopt;
  return dir_ / (prefix_ + "-best" + kExtension);
}

}  // namespace demi::train
