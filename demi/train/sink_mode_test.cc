// Sink mode (Model::train's sink_size): callbacks once per sink, MindSpore's epochs of sink_size batches
// with the data running on across the data set's epochs, and resume from a checkpoint taken inside them.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <sstream>

#include "demi/core/context.h"
#include "demi/core/test_support.h"
#include "demi/data/data.h"
#include "demi/nn/models.h"
#include "demi/train/internal/test_util.h"
#include "demi/train/checkpoint.h"
#include "demi/train/model.h"

namespace demi::train {
namespace {

using test::Captured;
using test::weights_of;

using test_support::expect_error;
using test_support::TempDir;

// 10 batches of 16 per epoch, shuffled anew every epoch (so the data epoch a batch comes from matters).
std::shared_ptr<data::Dataset> rows_dataset() {
  data::RandomAccessSource src;
  src.size = 160;
  src.get = [](int64_t i) {
    Generator g(1000003 + static_cast<uint64_t>(i));
    int32_t label = static_cast<int32_t>(g.next_int(3));
    Tensor x = normal({3, 8, 8}, 0.0, 1.0, g);
    float* p = x.data<float>();
    for (int64_t k = 0; k < 64; ++k) p[label * 64 + k] += 1.0f;
    return data::Row{x, full({}, label, DType::kI32)};
  };
  return std::make_shared<data::GeneratorDataset>(src, std::vector<std::string>{"image", "label"})
      ->shuffle(160, 11)
      ->batch(16);
}

// With Dropout, so the generators' states matter too.
Model make_model(ModelOptions o = {}, DType low = DType::kBF16) {
  set_seed(9);
  auto net = std::make_shared<nn::SequentialCell>();
  net->append(std::make_shared<nn::Flatten>());
  net->append(std::make_shared<nn::Dense>(3 * 8 * 8, 32));
  net->append(std::make_shared<nn::ReLU>());
  net->append(std::make_shared<nn::Dropout>(0.2));
  net->append(std::make_shared<nn::Dense>(32, 3));
  auto opt = std::make_shared<optim::Momentum>(net->trainable_params(), 0.01, 0.9);
  o.amp_level = amp::Level::kO2;
  o.low_dtype = low;
  return Model(net, std::make_shared<nn::SoftmaxCrossEntropyWithLogits>(true, "mean"), opt, {}, o);
}

struct Recorder : Callback {
  std::vector<std::string> events;
  void on_epoch_begin(RunContext& c) override { events.push_back(str_cat("epoch_begin ", c.epoch)); }
  void on_step_begin(RunContext& c) override { events.push_back(str_cat("step_begin ", c.cur_step_num)); }
  void on_step_end(RunContext& c) override {
    events.push_back(str_cat("step_end ", c.epoch, " ", c.step_in_epoch, "/", c.steps_per_epoch, " step ",
                             c.cur_step_num, " covers ", c.sink_steps, " samples ", c.batch_size, " data ",
                             c.data_epoch, ":", c.data_position));
  }
  void on_epoch_end(RunContext& c) override { events.push_back(str_cat("epoch_end ", c.epoch)); }
};

// MindSpore's defaults: dataset_sink_mode=True with sink_size -1 sinks each epoch whole (callbacks see one
// step per epoch, covering its 10 batches); without sink mode the default sinks nothing.
TEST(SinkMode, TheDefaultSinkSizeIsMindSporesOneSinkPerEpoch) {
  Model sunk = make_model();
  auto rec = std::make_shared<Recorder>();
  sunk.train(2, rows_dataset(), {rec});
  EXPECT_EQ(rec->events, (std::vector<std::string>{
                             "epoch_begin 1", "step_begin 1", "step_end 1 10/10 step 10 covers 10 samples 160 data 1:0",
                             "epoch_end 1", "epoch_begin 2", "step_begin 11",
                             "step_end 2 10/10 step 20 covers 10 samples 160 data 2:0", "epoch_end 2"}));
  Model plain = make_model();
  auto each = std::make_shared<Recorder>();
  plain.train(1, rows_dataset(), {each}, /*dataset_sink_mode=*/false);
  EXPECT_EQ(std::count_if(each->events.begin(), each->events.end(),
                          [](const std::string& e) { return e.rfind("step_end", 0) == 0; }),
            10);
  expect_error([&] { plain.train(1, rows_dataset(), {}, /*dataset_sink_mode=*/false, 4); },
               {"sink_size 4", "needs dataset_sink_mode=true"});
}

TEST(SinkMode, FixedSinksAreEpochsOfSinkSizeBatchesOverTheRunningData) {
  // 3 sinks of 4 batches: 12 batches, the last two from the data set's second epoch.
  Model sunk = make_model();
  auto rec = std::make_shared<Recorder>();
  sunk.train(3, rows_dataset(), {rec}, true, 4);
  EXPECT_EQ(rec->events, (std::vector<std::string>{
                             "epoch_begin 1", "step_begin 1", "step_end 1 4/4 step 4 covers 4 samples 64 data 0:4",
                             "epoch_end 1", "epoch_begin 2", "step_begin 5",
                             "step_end 2 4/4 step 8 covers 4 samples 64 data 0:8", "epoch_end 2", "epoch_begin 3",
                             "step_begin 9", "step_end 3 4/4 step 12 covers 4 samples 64 data 1:2", "epoch_end 3"}));
  EXPECT_EQ(sunk.last_summary().steps, 12);
  EXPECT_EQ(sunk.epochs_done(), 3);
  // The same 12 batches in plain steps: one epoch of 10, then 2 of the next.
  Model plain = make_model({.max_steps = 12});
  plain.train(2, rows_dataset(), {}, true);
  EXPECT_EQ(plain.last_summary().steps, 12);
  EXPECT_EQ(weights_of(sunk), weights_of(plain));
  // A further train() continues the data where the sinks stopped: 8 more batches end data epoch 1.
  sunk.train(2, rows_dataset(), {}, true, 4);
  Model plain20 = make_model();
  plain20.train(2, rows_dataset(), {}, true);
  EXPECT_EQ(weights_of(sunk), weights_of(plain20));
  // Graph mode replayed the sinks' steps from its plan.
  if (get_context().mode == ExecMode::kGraph) {
    EXPECT_GT(sunk.train_graphs().stats().replayed_steps, 0);
  }
}

TEST(SinkMode, MinusOneIsOneSinkPerEpochOfTheDataSet) {
  Model sunk = make_model(), plain = make_model();
  auto rec = std::make_shared<Recorder>();
  sunk.train(2, rows_dataset(), {rec}, true, -1);
  EXPECT_EQ(rec->events, (std::vector<std::string>{
                             "epoch_begin 1", "step_begin 1", "step_end 1 10/10 step 10 covers 10 samples 160 data 1:0",
                             "epoch_end 1", "epoch_begin 2", "step_begin 11",
                             "step_end 2 10/10 step 20 covers 10 samples 160 data 2:0", "epoch_end 2"}));
  plain.train(2, rows_dataset(), {}, true);
  EXPECT_EQ(weights_of(sunk), weights_of(plain));
}

TEST(SinkMode, PrintingCallbacksCountTheSinksSteps) {
  Captured out;
  // float16 with a loss scale far too large: the first steps overflow and are skipped, the scale halving.
  Model m = make_model(
      {.loss_scale_manager = std::make_shared<amp::DynamicLossScaleManager>(std::ldexp(1.0, 24), 2, 1000)},
      DType::kF16);
  auto scale = std::make_shared<LossScaleMonitor>();
  m.train(2, rows_dataset(), {std::make_shared<LossMonitor>(6), scale}, true, 4);
  // Steps 4 and 8 end the sinks; LossMonitor(6) prints at the sink that passes step 6 only.
  const std::string text = out.os.str();
  EXPECT_EQ(text.find("epoch: 1 step: 4, loss is"), std::string::npos) << text;
  EXPECT_NE(text.find("epoch: 2 step: 4, loss is"), std::string::npos) << text;
  // The monitor counts every skipped step of a sink, and says how many of the sink's were.
  EXPECT_EQ(scale->skipped_steps(), m.last_summary().skipped_steps);
  EXPECT_GT(scale->skipped_steps(), 1) << text;
  EXPECT_NE(text.find("of the sink's 4 updates skipped"), std::string::npos) << text;
}

TEST(SinkMode, AResumedRunTakesTheSameBatchesAsAnUninterruptedOne) {
  // Uninterrupted: 3 sinks of 6 batches (18 batches: data epoch 0 and 8 of epoch 1).
  Model whole = make_model();
  whole.train(3, rows_dataset(), {}, true, 6);
  // Stopped by the step budget inside the second sink (after 9 batches), checkpointed at train end,
  // resumed in a fresh model that trains the 2 epochs left.
  TempDir dir;
  {
    Model first = make_model({.max_steps = 9});
    auto ckpt = std::make_shared<ModelCheckpoint>("model", dir.path(), CheckpointConfig{});
    first.train(3, rows_dataset(), {ckpt}, true, 6);
    EXPECT_EQ(first.last_summary().steps, 9);
    EXPECT_EQ(first.epochs_done(), 1);
  }
  auto latest = latest_checkpoint(dir.path(), "model");
  ASSERT_TRUE(latest.has_value());
  io::TrainingState state = load_checkpoint(*latest);
  EXPECT_EQ(state.meta.epochs_done, 1);
  EXPECT_EQ(state.meta.step_in_epoch, 3);
  EXPECT_EQ(state.meta.data_epoch, 0);
  EXPECT_EQ(state.meta.data_position, 9);
  set_seed(123);  // another process: its own default generator
  Model resumed = make_model();
  for (auto& [name, t] : resumed.network().parameters_and_names()) t.fill_(0.5);
  restore_checkpoint(state, resumed);
  resumed.train(3 - static_cast<int>(resumed.epochs_done()), rows_dataset(), {}, true, 6);
  EXPECT_EQ(resumed.last_summary().steps, 18);
  EXPECT_EQ(resumed.epochs_done(), 3);
  EXPECT_EQ(weights_of(resumed), weights_of(whole));

  // A checkpoint at the end of a sink that ends inside a data epoch: resumes at the data place, not
  // at a data epoch's start.
  TempDir dir2;
  {
    Model first = make_model();
    auto ckpt = std::make_shared<ModelCheckpoint>("model", dir2.path(), CheckpointConfig{});
    first.train(2, rows_dataset(), {ckpt}, true, 6);
  }
  io::TrainingState at_end = load_checkpoint(*latest_checkpoint(dir2.path(), "model"));
  EXPECT_EQ(at_end.meta.data_epoch, 1);
  EXPECT_EQ(at_end.meta.data_position, 2);
  Model resumed2 = make_model();
  restore_checkpoint(at_end, resumed2);
  resumed2.train(1, rows_dataset(), {}, true, 6);
  EXPECT_EQ(weights_of(resumed2), weights_of(whole));
  // Resuming inside a sink with another sink_size would not continue the run.
  Model other = make_model();
  restore_checkpoint(state, other);
  expect_error([&] { other.train(2, rows_dataset(), {}, true, 4); },
               {"mid-epoch, after batch 3 of 6", "this run's sinks have 4 batches (sink_size)"});
}

TEST(SinkMode, BadSettingsAreErrors) {
  Model m = make_model();
  expect_error([&] { m.train(1, rows_dataset(), {}, true, -2); }, {"sink_size must be -1", "got -2"});
  expect_error([&] { m.train(1, rows_dataset(), {}, false, 4); }, {"sink_size 4 needs dataset_sink_mode=true"});
  Model accumulating = make_model({.accumulate = 3});
  expect_error([&] { accumulating.train(1, rows_dataset(), {}, true, 4); },
               {"sink_size 4 must be a multiple of accumulate (3"});
  EXPECT_EQ(m.steps_done(), 0);
  EXPECT_EQ(accumulating.steps_done(), 0);
}

}  // namespace
}  // namespace demi::train
