// Checkpoints of a whole training run, and the ModelCheckpoint callback that writes them.
//
// A checkpoint is one safetensors file (demi/io/training_state.h) holding the network's parameters
// (FP32 master weights, under their parameter paths, as PyTorch's state_dict would name them), its
// buffers ("features.1.moving_mean"), the optimizer's state ("optimizer.<slot>.<index>") and, as
// metadata, the AMP level and low dtype, the loss-scale manager's state, the optimizer's global step
// (which is also the learning-rate schedule's position), epoch and step, the random generators (the
// default one and each Dropout cell's) and the data pipeline's position. Restoring all of it makes a
// resumed run continue exactly as the uninterrupted one would have.
//
//   train::save_checkpoint("run/ckpt.safetensors", model, progress);
//   auto state = train::load_checkpoint("run/ckpt.safetensors");
//   train::restore_checkpoint(state, model);            // weights, optimizer, loss scale, RNG, epochs
//   auto io = train::resume_iterator_options(state.meta); // where the data pipeline picks up
//
//   model.train(10, ds, {std::make_shared<train::ModelCheckpoint>("lenet", "run",
//                          train::CheckpointConfig{.save_checkpoint_steps = 500, .keep_checkpoint_max = 3})});
//   auto last = train::latest_checkpoint("run", "lenet");  // run/lenet-4_120.safetensors
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "demi/amp/loss_scale.h"
#include "demi/amp/policy.h"
#include "demi/core/rng.h"
#include "demi/data/dataset.h"
#include "demi/io/training_state.h"
#include "demi/nn/cell.h"
#include "demi/optim/optimizer.h"
#include "demi/amp/adapt.h"
#include "demi/train/callback.h"

namespace demi::train {

class Model;

// What a checkpoint captures, by pointer: from a Model (train_state_of) or filled by hand for a custom
// training loop. Only `network` is required.
struct TrainState {
  nn::Cell* network = nullptr;
  optim::Optimizer* optimizer = nullptr;
  amp::LossScaleManager* loss_scale_manager = nullptr;
  amp::AmpAdapter* amp_adapter = nullptr;  // adaptive AMP's promotions (ModelOptions::amp_adapt)
  amp::Level amp_level = amp::Level::kO0;
  DType low_dtype = DType::kF16;
  // Random generators by name. train_state_of adds "default" (demi::default_generator()) and
  // "cell:<path>" for each cell with its own generator (Dropout, MultiheadAttention): nn::generators_of.
  std::vector<std::pair<std::string, Generator*>> generators;
};
TrainState train_state_of(Model& model);
using nn::generators_of;  // the generators a checkpoint records

// Where training stands when the checkpoint is taken (ModelCheckpoint fills it from its RunContext).
struct Progress {
  int64_t epoch = 0;            // 1-based epoch running (0: before training)
  int64_t step_in_epoch = 0;    // steps done in that epoch
  int64_t step = 0;             // steps done across epochs
  int64_t epochs_done = 0;      // epochs completed
  int64_t data_epoch = 0;       // the data iterator's epoch and rows consumed in it (IteratorOptions)
  int64_t data_position = 0;
  int64_t steps_per_epoch = 0;  // batches per epoch of the training set (0: unknown)
};
// The progress after a step or at the end of an epoch, as a Model's train loop reports it: a checkpoint
// taken after the last step of an epoch resumes at the start of the next one.
Progress progress_of(const RunContext& ctx, bool at_epoch_end);

// The tensors and metadata of a checkpoint (shared with the live tensors, not copied).
io::TrainingState capture_training_state(const TrainState& state, const Progress& progress = {});
void save_checkpoint(const std::filesystem::path& path, const TrainState& state, const Progress& progress = {},
                     const io::SaveOptions& options = {});
void save_checkpoint(const std::filesystem::path& path, Model& model, const Progress& progress = {},
                     const io::SaveOptions& options = {});
// Reads any safetensors file (a demi checkpoint or weights from PyTorch / Hugging Face).
io::TrainingState load_checkpoint(const std::filesystem::path& path, const io::LoadOptions& options = {});

// What a load matched, by name.
struct LoadReport {
  std::vector<std::string> loaded;      // names copied into the network (or optimizer)
  std::vector<std::string> converted;   // of those, the ones converted to the parameter's dtype
  std::vector<std::string> missing;     // expected by the network but absent from the checkpoint
  std::vector<std::string> unexpected;  // in the checkpoint but not in the network
};

// Copies `tensors` into the network's parameters and buffers, by path. Tensors named "optimizer.*" are
// the optimizer's and are skipped. A floating tensor of another floating dtype is converted (a PyTorch
// half-precision save loads into FP32 master weights: f16/bf16 -> f32 is exact; f64 rounds to nearest
// even); a shape mismatch, or a dtype that cannot be converted (integer <-> floating, between integer
// types), is always an error. strict=true: every missing name, unexpected name and mismatch is listed, by
// name, in one error, and nothing is loaded. strict=false: what matches is loaded, missing and unexpected
// names are returned in the report.
// A NaN or infinite value (or an f64 beyond the parameter's dtype's range) is refused, naming the tensor
// and the count, unless allow_non_finite (to inspect a diverged run's weights).
LoadReport load_param_into_net(nn::Cell& net, const io::NamedTensors& tensors, bool strict = true,
                               bool allow_non_finite = false);

struct RestoreOptions {
  bool strict = true;     // as load_param_into_net, for the optimizer state and generators too
  // Refuse a checkpoint written at another AMP level or low dtype (resuming would not continue the same
  // run); off to fine-tune at another precision.
  bool check_amp = true;
  bool restore_optimizer = true;
  bool restore_rng = true;
  bool allow_non_finite = false;  // as load_param_into_net's: NaN/Inf weights or state refused by default
};
// Puts a loaded checkpoint back: weights and buffers, optimizer state and global step, loss-scale state,
// generator states. Checks everything before changing anything: an error leaves the run untouched.
LoadReport restore_checkpoint(const io::TrainingState& checkpoint, const TrainState& state,
                              const RestoreOptions& options = {});
// The same for a Model; also sets its epochs_done and resume position (Model::set_resume_position), so
// that train() continues where the checkpoint was taken.
LoadReport restore_checkpoint(const io::TrainingState& checkpoint, Model& model, const RestoreOptions& options = {});
// The iterator options that resume the data pipeline where the checkpoint was taken.
data::IteratorOptions resume_iterator_options(const io::TrainingMeta& meta);

// ---- the callback ----

// MindSpore's CheckpointConfig, with demi's additions.
struct CheckpointConfig {
  int64_t save_checkpoint_steps = 0;   // save every N train steps (0: not by steps)
  int64_t save_checkpoint_epochs = 1;  // save at the end of every N-th epoch (0: not by epochs)
  int keep_checkpoint_max = 5;         // keep the last K step/epoch checkpoints (0: keep all)
  // Also keep the best checkpoint by this metric ("" off): a name in the epoch's metrics ("loss" is the
  // epoch's mean train loss; eval metrics such as "Accuracy" when the loop provides them).
  std::string monitor;
  bool maximize = false;               // mode max (accuracy) instead of min (loss)
  // A failed save (disk full, unwritable directory) stops training with the error by default; true
  // reports it on the callback stream and trains on (the previous checkpoints are intact either way).
  bool continue_on_error = false;
  io::SaveOptions save;                // checksum, fsync, fault injection for tests
  // The caller's own string pairs, written into every checkpoint (TrainingMeta::extra): e.g. the run's
  // settings, so that a resume can check them. Keys must not start with "demi.".
  io::Metadata extra;
  // The run the checkpoints belong to (TrainingMeta::run_id). "": the run the Model was restored from
  // (Model::resumed_run_id), else a new id made at the start of training.
  std::string run_id;
  // Checkpoints of another run under the same prefix in the directory (another run id, or none) are never
  // counted in keep_checkpoint_max nor deleted. At the start of training they are kept apart (left as they
  // are, said once on the callback stream), refused (an error naming them, before anything is trained:
  // `demi train` without --resume or --start-over), or set aside (moved into "<dir>/<prefix>-set-aside-<n>/",
  // never deleted: `demi train --start-over`).
  enum class OtherRuns { kKeepApart, kRefuse, kSetAside };
  OtherRuns other_runs = OtherRuns::kKeepApart;
};

// Saves "<directory>/<prefix>-<epoch>_<step>.safetensors" (MindSpore's naming; step is the step within
// the epoch), rewrites "<prefix>-latest" (a one-line text file naming the newest checkpoint, for shell
// tools), and deletes the oldest beyond keep_checkpoint_max — only after the new file is safely written.
// With a monitor, "<prefix>-best.safetensors" holds the best epoch so far. Checkpoints already in the
// directory under the same prefix and of the same run (a resumed run) count towards the K kept, another
// run's never (CheckpointConfig::other_runs); temporary files left by a killed writer are removed at the
// start of training. One run at a time writes a prefix in a directory: training takes an exclusive lock on
// "<prefix>.lock" there (flock: released when the process ends, however it ends), and a second run is
// refused at its start, as is a directory that cannot be written.
class ModelCheckpoint : public Callback {
 public:
  explicit ModelCheckpoint(std::string prefix = "demi", std::filesystem::path directory = ".",
                           CheckpointConfig config = {});
  ~ModelCheckpoint() override;
  ModelCheckpoint(const ModelCheckpoint&) = delete;
  ModelCheckpoint& operator=(const ModelCheckpoint&) = delete;

  // For custom loops: where the state comes from when the RunContext has no Model.
  void set_state_source(std::function<TrainState()> source) { source_ = std::move(source); }

  void on_train_begin(RunContext& ctx) override;
  void on_step_end(RunContext& ctx) override;
  void on_epoch_end(RunContext& ctx) override;
  // The state at the end of training, unless this step's checkpoint was just written (a run stopped by a
  // step budget or a callback, or one whose last step no saving interval hit, still leaves its end).
  void on_train_end(RunContext& ctx) override;

  // The step/epoch checkpoints kept, oldest first.
  const std::vector<std::filesystem::path>& kept() const { return kept_; }
  std::optional<std::filesystem::path> latest() const;
  std::optional<std::filesystem::path> best() const;
  std::optional<double> best_value() const { return best_value_; }
  int64_t saves() const { return saves_; }
  // This run's id, written into its checkpoints (set when training starts, or at the first save).
  const std::string& run_id() const { return run_id_; }
  int64_t failures() const { return failures_; }

 private:
  void save(RunContext& ctx, bool at_epoch_end);
  bool write(const std::filesystem::path& path, RunContext& ctx, bool at_epoch_end, bool best);
  TrainState state(RunContext& ctx);
  void scan_existing();

  std::string prefix_;
  std::filesystem::path dir_;
  CheckpointConfig config_;
  std::function<TrainState()> source_;
  std::vector<std::filesystem::path> kept_;
  std::optional<double> best_value_;
  bool has_best_file_ = false;
  int64_t saved_step_ = -1;  // cur_step_num of the last checkpoint written
  int64_t saves_ = 0;
  int64_t failures_ = 0;
  bool scanned_ = false;
  std::string run_id_;   // this run's (decided at the start of training)
  bool adopt_unnamed_ = false;  // resumed from a file without a run id: such files are this run's too
  int lock_fd_ = -1;     // "<prefix>.lock", held from the start of training to its end
  void lock();
  void unlock();
  bool is_ours(const std::filesystem::path& checkpoint) const;
};

// The newest "<prefix>-<epoch>_<step>.safetensors" in `dir` by (epoch, step), or nullopt. An empty
// prefix matches any prefix. Only complete files are ever visible under these names (atomic writes), so
// the newest one is always loadable unless the disk itself corrupted it (the checksum tells).
std::optional<std::filesystem::path> latest_checkpoint(const std::filesystem::path& dir, const std::string& prefix = "");

// The newest checkpoint in `dir` (as latest_checkpoint) that loads and verifies, loaded; nullopt when none
// does. Each newer one that fails (a damaged file: bad checksum, truncated, malformed) is skipped, with its
// error, into `skipped`. With set_aside, each skipped file is renamed to "<name>.damaged" — kept, never
// deleted, and out of reach of the run's checkpoint names (a resumed run would otherwise write over it,
// or rotate it away as one of its last K).
struct LoadedCheckpoint {
  std::filesystem::path path;
  io::TrainingState state;
};
struct SkippedCheckpoint {
  std::filesystem::path path;  // where it is now ("<name>.damaged" when set aside)
  std::string error;
};
std::optional<LoadedCheckpoint> latest_loadable_checkpoint(const std::filesystem::path& dir, const std::string& prefix,
                                                           std::vector<SkippedCheckpoint>* skipped = nullptr,
                                                           bool set_aside = false);

// Parses "<prefix>-<epoch>_<step>.safetensors": the prefix, epoch and step, or nullopt.
struct CheckpointName {
  std::string prefix;
  int64_t epoch = 0;
  int64_t step = 0;
};
std::optional<CheckpointName> parse_checkpoint_name(const std::string& filename);

}  // namespace demi::train
