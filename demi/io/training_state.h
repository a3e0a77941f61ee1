// The full training state as plain data — named tensors plus a small metadata struct — stored in one
// safetensors file, so that a resumed run continues exactly where the saved one stopped. demi/io knows
// nothing of cells or optimizers (it may use only core); demi/train/checkpoint.h gathers this from a
// Model and puts it back.
//
// The tensors keep their state_dict names ("features.0.weight", buffers such as
// "features.1.moving_mean", optimizer state as "optimizer.<slot>.<index>"), so PyTorch and Hugging Face
// read the weights of a training checkpoint like any other safetensors file. The metadata travels in
// __metadata__ as strings under "demi.*" keys (numbers in decimal; doubles in the shortest form that
// reads back bit-identical):
//
//   demi.kind = "training_state"        demi.amp_level = "O2"          demi.low_dtype = "float16"
//   demi.loss_scale = "65536"           demi.loss_scale.good_steps, .consecutive_overflows, .total_overflows
//   demi.optimizer = "Momentum"         demi.global_step (also the learning-rate schedule's position)
//   demi.epoch, demi.step_in_epoch, demi.step, demi.epochs_done
//   demi.data.epoch, demi.data.position (the data pipeline's IteratorOptions for resuming)
//   demi.rng.<name> = "<seed>:<offset>" (the default generator is "default"; a Dropout cell's "cell:<path>")
//   demi.amp.promotions = the layers adaptive AMP promoted to FP32, one path per line, in order
// Other metadata keys (not "demi.*") are the caller's, kept in `extra`.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "demi/io/safetensors.h"

namespace demi::io {

struct GeneratorState {
  uint64_t seed = 0;
  uint64_t offset = 0;
  bool operator==(const GeneratorState&) const = default;
};

struct LossScaleRecord {
  double scale = 1;
  int64_t good_steps = 0;
  int64_t consecutive_overflows = 0;
  int64_t total_overflows = 0;
  bool operator==(const LossScaleRecord&) const = default;
};

struct TrainingMeta {
  // False when loaded from a file without demi's training metadata (e.g. PyTorch weights); the other
  // fields then keep their defaults.
  bool is_training_state = false;
  std::string amp_level;   // "O0".."O3"; empty when unknown
  std::string low_dtype;   // "float16" or "bfloat16"; empty when unknown
  std::optional<LossScaleRecord> loss_scale;  // absent when the run had no loss-scale manager
  std::string optimizer;   // the optimizer's name ("Momentum", "Adam", ...); empty when none
  int64_t global_step = 0;  // optimizer updates applied (skipped steps excluded)
  int64_t epoch = 0;        // the 1-based epoch the checkpoint was taken in (0: before training)
  int64_t step_in_epoch = 0;
  int64_t step = 0;         // train steps run across epochs, skipped ones included
  int64_t epochs_done = 0;  // epochs completed when the checkpoint was taken
  int64_t data_epoch = 0;   // where the data pipeline resumes: IteratorOptions{.epoch, .position}
  int64_t data_position = 0;
  // Batches per epoch of the training set the run had (0: unknown, or a file from before demi wrote
  // it): a mid-epoch resume on another count would not continue at the same data position.
  int64_t steps_per_epoch = 0;
  std::map<std::string, GeneratorState> generators;
  std::vector<std::string> amp_promotions;  // layer paths (no newline in a path)
  // The run the checkpoint belongs to (train::ModelCheckpoint; a resumed run keeps the id of the one it
  // resumed): "" in files from before demi wrote it.
  std::string run_id;
  Metadata extra;  // the caller's own string pairs; keys must not start with "demi."
};

struct TrainingState {
  NamedTensors tensors;
  TrainingMeta meta;
};

// The metadata as __metadata__ strings, and back. Decoding refuses malformed values (a non-number step,
// a generator state that is not "<seed>:<offset>") with an error naming `file` and the key.
Metadata encode_training_meta(const TrainingMeta& meta);
TrainingMeta decode_training_meta(const Metadata& metadata, const std::string& file);

void save_training_state(const std::filesystem::path& path, const TrainingState& state, const SaveOptions& options = {});
TrainingState load_training_state(const std::filesystem::path& path, const LoadOptions& options = {});

}  // namespace demi::io
