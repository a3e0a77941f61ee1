// Step hooks (train/hooks.h): the points a hook of one's own sees, in order, in plain and sink mode and
// with accumulation; what it sees (the update's result, its samples and time); its warnings reach the
// summary and the callbacks; it can stop training; and the built-in warnings are hooks too.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <sstream>

#include "demi/data/data.h"
#include "demi/nn/models.h"
#include "demi/train/hooks.h"
#include "demi/train/model.h"

namespace demi::train {
namespace {

// 4 batches of 8 per epoch.
std::shared_ptr<data::Dataset> batches() {
  data::RandomAccessSource src;
  src.size = 32;
  src.get = [](int64_t i) {
    Generator g(77 + static_cast<uint64_t>(i));
    const int32_t label = static_cast<int32_t>(g.next_int(3));
    Tensor x = normal({12}, 0.0, 1.0, g);
    x.data<float>()[label] += 2.0f;
    return data::Row{x, full({}, label, DType::kI32)};
  };
  return std::make_shared<data::GeneratorDataset>(src, std::vector<std::string>{"x", "label"})->batch(8);
}

Model make_model(ModelOptions o = {}) {
  set_seed(3);
  auto net = std::make_shared<nn::SequentialCell>();
  net->append(std::make_shared<nn::Dense>(12, 16));
  net->append(std::make_shared<nn::ReLU>());
  net->append(std::make_shared<nn::Dense>(16, 3));
  auto opt = std::make_shared<optim::Momentum>(net->trainable_params(), 0.05, 0.9);
  return Model(net, std::make_shared<nn::SoftmaxCrossEntropyWithLogits>(true, "mean"), opt, {}, o);
}

// Writes down every point it is called at.
struct Trace : TrainHook {
  std::vector<std::string> points;
  std::vector<StepRecord> records;
  void on_train_begin(TrainLoop&) override { points.push_back("train_begin"); }
  void on_epoch_begin(TrainLoop& l) override { points.push_back(str_cat("epoch_begin ", l.context.epoch)); }
  void on_sink_begin(TrainLoop&) override { points.push_back("sink_begin"); }
  void on_step_begin(TrainLoop& l) override { points.push_back(str_cat("step_begin ", l.context.cur_step_num)); }
  void on_after_forward(TrainLoop&, float loss) override {
    points.push_back(std::isfinite(loss) && loss > 0 ? "forward" : "forward with a bad loss");
  }
  void on_after_backward(TrainLoop&) override { points.push_back("backward"); }
  void on_after_update(TrainLoop& l) override {
    points.push_back("update");
    records.push_back(l.step);
  }
  void on_step_end(TrainLoop&) override { points.push_back("step_end"); }
  void on_sink_end(TrainLoop&) override { points.push_back("sink_end"); }
  void on_epoch_end(TrainLoop& l) override { points.push_back(str_cat("epoch_end ", l.context.epoch)); }
  void on_train_end(TrainLoop&) override { points.push_back("train_end"); }
};

TEST(StepHooks, AHookSeesEveryPointInOrder) {
  Model m = make_model();
  auto t = std::make_shared<Trace>();
  m.add_hook(t);
  m.train(1, batches(), {}, /*dataset_sink_mode=*/false);
  std::vector<std::string> want = {"train_begin", "epoch_begin 1"};
  for (int s = 1; s <= 4; ++s)
    for (const char* p : {"sink_begin", "", "forward", "backward", "update", "step_end", "sink_end"})
      want.push_back(*p ? std::string(p) : str_cat("step_begin ", s));
  want.insert(want.end(), {"epoch_end 1", "train_end"});
  EXPECT_EQ(t->points, want);
  ASSERT_EQ(t->records.size(), 4u);
  for (const StepRecord& r : t->records) {
    EXPECT_EQ(r.samples, 8);
    EXPECT_EQ(r.batches, 1);
    EXPECT_GT(r.seconds, 0);
    EXPECT_TRUE(std::isfinite(r.result.loss));
    EXPECT_FALSE(r.result.skipped);
  }
  EXPECT_FALSE(t->records[0].steady) << "the first updates warm up";
  EXPECT_TRUE(t->records[3].steady);
  EXPECT_FLOAT_EQ(t->records[3].result.loss, m.last_summary().final_loss);
}

// In sink mode a sink encloses its updates; with accumulate 2 each update has two forwards and backwards,
// the first of which ran as its batch was read (before step_begin).
TEST(StepHooks, SinksEncloseUpdatesAndAccumulatedBatchesComeFirst) {
  Model m = make_model({.accumulate = 2});
  auto t = std::make_shared<Trace>();
  m.add_hook(t);
  m.train(1, batches(), {}, /*dataset_sink_mode=*/true, /*sink_size=*/-1);
  const std::vector<std::string> want = {
      "train_begin", "epoch_begin 1",
      "forward", "backward", "forward", "backward", "sink_begin", "step_begin 1", "update", "step_end",
      "forward", "backward", "forward", "backward", "step_begin 2", "update", "step_end", "sink_end",
      "epoch_end 1", "train_end"};
  EXPECT_EQ(t->points, want);
  ASSERT_EQ(t->records.size(), 2u);
  EXPECT_EQ(t->records[0].samples, 16);
  EXPECT_EQ(t->records[0].batches, 2);
  EXPECT_EQ(t->records[0].result.micro_batches, 2);
}

// A hook's warning is the run's (summary, the callbacks' RunContext) and its stop request ends training
// after the update, as a callback's does.
struct StopAtTwo : TrainHook {
  void on_after_update(TrainLoop& l) override {
    if (l.context.cur_step_num == 2) l.warn("enough at step 2");
  }
  void on_step_end(TrainLoop& l) override { l.context.stop_requested = l.context.cur_step_num >= 2; }
};

struct SeesWarnings : Callback {
  std::vector<std::string> seen;
  void on_step_end(RunContext& c) override { seen.insert(seen.end(), c.warnings.begin(), c.warnings.end()); }
};

TEST(StepHooks, AHooksWarningsAndStopAreTheRuns) {
  Model m = make_model();
  m.add_hook(std::make_shared<StopAtTwo>());
  auto cb = std::make_shared<SeesWarnings>();
  std::ostringstream log;
  set_callback_stream(&log);
  m.train(3, batches(), {cb}, /*dataset_sink_mode=*/false);
  set_callback_stream(nullptr);
  EXPECT_EQ(m.steps_done(), 2);
  EXPECT_EQ(m.epochs_done(), 0) << "stopped inside the first epoch";
  EXPECT_EQ(m.last_summary().warnings, std::vector<std::string>{"enough at step 2"});
  EXPECT_EQ(cb->seen, std::vector<std::string>{"enough at step 2"});
  EXPECT_NE(log.str().find("Model.train: warning: enough at step 2"), std::string::npos) << log.str();
  EXPECT_THROW(m.add_hook(nullptr), Error);
}

// The built-in loss stop is a hook, and the built-in hooks run before the model's own: a NaN loss at O0
// (no loss scale) stops training, naming the epoch and step, before a hook of one's own sees the update.
TEST(StepHooks, TheLossStopIsABuiltInHookThatRunsFirst) {
  Model m = make_model({.clip_grad_norm = 0});
  for (Tensor p : m.optimizer().parameters()) p.copy_(full(p.shape(), NAN));
  auto t = std::make_shared<Trace>();
  m.add_hook(t);
  try {
    m.train(1, batches(), {}, false);
    ADD_FAILURE() << "a NaN loss at O0 without a loss scale must stop training";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("the loss became"), std::string::npos) << msg;
    EXPECT_NE(msg.find("nan at epoch 1 step 1 (O0, no loss scale)"), std::string::npos) << msg;
  }
  EXPECT_EQ(std::count(t->points.begin(), t->points.end(), "update"), 0);
  EXPECT_EQ(std::count(t->points.begin(), t->points.end(), "forward with a bad loss"), 1);
}

// SinkProgress speaks inside a sink (here at every update, every_seconds 0), never without sinking.
TEST(StepHooks, SinkProgressSpeaksInsideALongSink) {
  std::ostringstream out;
  Model sunk = make_model();
  sunk.add_hook(std::make_shared<SinkProgress>(out, 0.0));
  sunk.train(1, batches(), {}, /*dataset_sink_mode=*/true, /*sink_size=*/-1);
  const std::string text = out.str();
  EXPECT_NE(text.find("Model.train: sink in progress: update 1 of the sink (step 1 of the run), loss "), std::string::npos)
      << text;
  EXPECT_NE(text.find("update 4 of the sink (step 4 of the run)"), std::string::npos) << text;
  out.str("");
  Model plain = make_model();
  plain.add_hook(std::make_shared<SinkProgress>(out, 0.0));
  plain.train(1, batches(), {}, /*dataset_sink_mode=*/false);
  EXPECT_EQ(out.str(), "");
  EXPECT_THROW(SinkProgress(out, -1), Error);
}

}  // namespace
}  // namespace demi::train
