// Checkpoints of a training run: everything round-trips bit for bit, a resumed run (O2 fp16 with a
// dynamic loss scale, BatchNorm and Dropout) ends bit-identical to an uninterrupted one, strict and
// non-strict loading report every mismatch by name, ModelCheckpoint keeps the last K and the best, a
// failing save leaves the older checkpoints intact, and PyTorch-written weights load (and PyTorch
// reproduces demi's logits, when /usr/bin/python3 has torch).
#include "demi/train/checkpoint.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <limits>
#include <cstring>
#include <sstream>

#include "demi/amp/train_step.h"
#include "demi/data/synthetic.h"
#include "demi/io/internal/test_util.h"
#include "demi/nn/layers.h"
#include "demi/nn/models.h"
#include "demi/train/model.h"

namespace demi::train {
namespace {

using io::test_util::expect_error;
using io::test_util::list_dir;
using io::test_util::read_bytes;
using io::test_util::TempDir;
using io::test_util::write_bytes;
namespace fs = std::filesystem;

std::shared_ptr<nn::SequentialCell> small_net() {
  auto net = std::make_shared<nn::SequentialCell>();
  net->append(std::make_shared<nn::Dense>(16, 32));
  net->append(std::make_shared<nn::BatchNorm1d>(32));
  net->append(std::make_shared<nn::ReLU>());
  net->append(std::make_shared<nn::Dropout>(0.8));
  net->append(std::make_shared<nn::Dense>(32, 4));
  return net;
}

void expect_same_bits(const Tensor& a, const Tensor& b, const std::string& what) {
  ASSERT_EQ(a.shape(), b.shape()) << what;
  ASSERT_EQ(a.dtype(), b.dtype()) << what;
  EXPECT_EQ(std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()), 0) << what << " differs";
}

// One training run's objects, built from a seed (parameter init and Dropout's generator depend on it).
struct TrainRun {
  std::shared_ptr<nn::SequentialCell> net;
  std::shared_ptr<optim::Optimizer> opt;
  std::shared_ptr<amp::TrainStep> step;

  explicit TrainRun(uint64_t seed) {
    set_seed(seed);
    net = small_net();
    opt = std::make_shared<optim::Momentum>(net->trainable_params(), 0.05, 0.9);
    // Starts far too high for fp16 (overflows, skipped steps, back-off) and grows again every 3 clean
    // steps: the loss-scale state changes all through the run.
    auto lsm = std::make_shared<amp::DynamicLossScaleManager>(16777216.0, 2.0, 3);
    step = amp::build_train_network(net, opt, std::make_shared<nn::SoftmaxCrossEntropyWithLogits>(true, "mean"),
                                    amp::Level::kO2, {.low_dtype = DType::kF16, .loss_scale_manager = lsm});
  }
  TrainState state() {
    return {.network = net.get(), .optimizer = opt.get(), .loss_scale_manager = step->loss_scale_manager(),
            .amp_level = amp::Level::kO2, .low_dtype = DType::kF16, .generators = generators_of(*net)};
  }
  void train_step(int64_t i) {
    Generator g(1000 + static_cast<uint64_t>(i));  // the batch depends only on the step
    Tensor x = normal({8, 16}, 0, 1, g);
    std::vector<int32_t> y(8);
    for (auto& v : y) v = static_cast<int32_t>(g.next_int(4));
    (*step)(x, from_vector(y, {8}));
  }
  // Draws from the default generator, as other code between steps might.
  void disturb() { default_generator().next_u64(); }
};

TEST(Checkpoint, ResumedRunIsBitIdenticalToUninterrupted) {
  constexpr int64_t kSteps = 14, kStopAt = 6;
  TrainRun a(42);
  for (int64_t i = 0; i < kSteps; ++i) {
    a.train_step(i);
    a.disturb();
  }

  TempDir dir;
  {
    TrainRun b(42);
    for (int64_t i = 0; i < kStopAt; ++i) {
      b.train_step(i);
      b.disturb();
    }
    save_checkpoint(dir / "ckpt.safetensors", b.state(), {.epoch = 1, .step_in_epoch = kStopAt, .step = kStopAt});
  }  // the "process" ends here
  TrainRun c(7);  // a fresh process: other initial weights, another Dropout seed, another default generator
  auto ckpt = load_checkpoint(dir / "ckpt.safetensors");
  LoadReport r = restore_checkpoint(ckpt, c.state());
  EXPECT_TRUE(r.missing.empty());
  EXPECT_TRUE(r.unexpected.empty());
  EXPECT_EQ(ckpt.meta.step, kStopAt);
  for (int64_t i = kStopAt; i < kSteps; ++i) {
    c.train_step(i);
    c.disturb();
  }

  EXPECT_GT(a.step->loss_scale_manager()->state().total_overflows, 0) << "the run should exercise overflows";
  auto pa = a.net->parameters_and_names(), pc = c.net->parameters_and_names();
  for (size_t i = 0; i < pa.size(); ++i) expect_same_bits(pa[i].second, pc[i].second, pa[i].first);
  auto ba = a.net->buffers_and_names(), bc = c.net->buffers_and_names();
  for (size_t i = 0; i < ba.size(); ++i) expect_same_bits(ba[i].second, bc[i].second, ba[i].first);
  auto sa = a.opt->state(), sc = c.opt->state();
  for (size_t i = 0; i < sa.size(); ++i) expect_same_bits(sa[i].second, sc[i].second, sa[i].first);
  EXPECT_EQ(a.opt->global_step(), c.opt->global_step());
  amp::LossScaleState la = a.step->loss_scale_manager()->state(), lc = c.step->loss_scale_manager()->state();
  EXPECT_EQ(la.scale, lc.scale);
  EXPECT_EQ(la.good_steps, lc.good_steps);
  EXPECT_EQ(la.total_overflows, lc.total_overflows);
  EXPECT_EQ(default_generator().offset(), default_generator().offset());
}

TEST(Checkpoint, FileHoldsStateDictNamesAndMetadata) {
  TrainRun r(3);
  for (int64_t i = 0; i < 4; ++i) r.train_step(i);
  TempDir dir;
  save_checkpoint(dir / "c.safetensors", r.state(), {.epoch = 2, .step_in_epoch = 3, .step = 9, .epochs_done = 1,
                                                      .data_epoch = 1, .data_position = 3});
  auto s = load_checkpoint(dir / "c.safetensors");
  std::vector<std::string> names;
  for (auto& [n, t] : s.tensors) names.push_back(n);
  EXPECT_EQ(names, (std::vector<std::string>{"0.weight", "0.bias", "1.gamma", "1.beta", "4.weight", "4.bias",
                                             "1.moving_mean", "1.moving_variance", "optimizer.moments.0",
                                             "optimizer.moments.1", "optimizer.moments.2", "optimizer.moments.3",
                                             "optimizer.moments.4", "optimizer.moments.5"}));
  for (auto& [n, t] : s.tensors) EXPECT_EQ(t.dtype(), DType::kF32) << n << ": FP32 masters and state";
  EXPECT_EQ(s.meta.amp_level, "O2");
  EXPECT_EQ(s.meta.low_dtype, "float16");
  EXPECT_EQ(s.meta.optimizer, "Momentum");
  EXPECT_EQ(s.meta.global_step, r.opt->global_step());
  ASSERT_TRUE(s.meta.loss_scale.has_value());
  EXPECT_EQ(s.meta.loss_scale->scale, r.step->loss_scale_manager()->get_loss_scale());
  EXPECT_EQ(s.meta.epoch, 2);
  EXPECT_EQ(s.meta.data_position, 3);
  EXPECT_EQ(s.meta.generators.count("default"), 1u);
  EXPECT_EQ(s.meta.generators.count("cell:3"), 1u) << "the Dropout cell's generator";
  data::IteratorOptions io = resume_iterator_options(s.meta);
  EXPECT_EQ(io.epoch, 1);
  EXPECT_EQ(io.position, 3);
}

TEST(Checkpoint, ProgressFromRunContext) {
  RunContext ctx;
  ctx.epoch = 3;
  ctx.step_in_epoch = 5;
  ctx.cur_step_num = 25;
  ctx.steps_per_epoch = 10;
  Progress p = progress_of(ctx, false);
  EXPECT_EQ(p.epochs_done, 2);
  EXPECT_EQ(p.data_epoch, 2);
  EXPECT_EQ(p.data_position, 5);
  ctx.step_in_epoch = 10;  // the epoch's last step: resume at the start of the next epoch
  p = progress_of(ctx, false);
  EXPECT_EQ(p.epochs_done, 3);
  EXPECT_EQ(p.data_epoch, 3);
  EXPECT_EQ(p.data_position, 0);
  EXPECT_EQ(p.steps_per_epoch, 10);
}

// 64 rows of 16 features and a label in [0, 4), as a data set in memory.
std::shared_ptr<data::Dataset> rows64() {
  Generator g(11);
  Tensor x = normal({64, 16}, 0.0, 1.0, g);
  std::vector<int32_t> y(64);
  for (size_t i = 0; i < y.size(); ++i) y[i] = static_cast<int32_t>(i % 4);
  return std::make_shared<data::NumpySlicesDataset>(std::vector<Tensor>{x, from_vector(y, {64})},
                                                    std::vector<std::string>{"x", "label"});
}

Model small_model() {
  set_seed(3);
  auto net = small_net();
  auto opt = std::make_shared<optim::Momentum>(net->trainable_params(), 0.05, 0.9);
  return Model(net, std::make_shared<nn::SoftmaxCrossEntropyWithLogits>(true, "mean"), opt);
}

TEST(Checkpoint, MidEpochResumeOnAnotherBatchCountIsRefused) {
  TempDir dir;
  Model a = small_model();
  a.train(1, rows64()->batch(16),
          {std::make_shared<ModelCheckpoint>("m", dir.path(), CheckpointConfig{.save_checkpoint_steps = 2})},
          /*dataset_sink_mode=*/false);
  auto mid = load_checkpoint(dir / "m-1_2.safetensors");
  EXPECT_EQ(mid.meta.data_position, 2);
  EXPECT_EQ(mid.meta.steps_per_epoch, 4);

  Model b = small_model();
  restore_checkpoint(mid, b);
  expect_error([&] { b.train(1, rows64()->batch(32)); },
               {"taken mid-epoch, after batch 2 of 4", "this training set has 2 batches per epoch", "batch(32)"});
  restore_checkpoint(mid, b);  // the refusal changed nothing: the same batch size resumes
  b.train(1, rows64()->batch(16));
  EXPECT_EQ(b.last_summary().steps, 4) << "steps 3 and 4 of the epoch, counted from the checkpoint's 2";

  Model c = small_model();  // at an epoch's end the position is 0: another batch size is fine
  restore_checkpoint(load_checkpoint(dir / "m-1_4.safetensors"), c);
  EXPECT_NO_THROW(c.train(2, rows64()->batch(32)));
}

TEST(Checkpoint, LatestLoadableSkipsADamagedNewestAndSetsItAside) {
  TempDir dir;
  Model a = small_model();
  a.train(1, rows64()->batch(16),
          {std::make_shared<ModelCheckpoint>("m", dir.path(), CheckpointConfig{.save_checkpoint_steps = 2})},
          /*dataset_sink_mode=*/false);
  fs::path newest = dir / "m-1_4.safetensors";
  std::vector<uint8_t> bytes = read_bytes(newest);
  bytes[bytes.size() - 5] ^= 0x40;  // one bit of the tensor data
  write_bytes(newest, bytes);

  std::vector<SkippedCheckpoint> skipped;
  auto found = latest_loadable_checkpoint(dir.path(), "m", &skipped);
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(found->path, dir / "m-1_2.safetensors");
  EXPECT_EQ(found->state.meta.data_position, 2);
  ASSERT_EQ(skipped.size(), 1u);
  EXPECT_EQ(skipped[0].path, newest) << "not set aside unless asked";
  EXPECT_NE(skipped[0].error.find("checksum"), std::string::npos) << skipped[0].error;

  skipped.clear();
  found = latest_loadable_checkpoint(dir.path(), "m", &skipped, /*set_aside=*/true);
  ASSERT_TRUE(found.has_value());
  ASSERT_EQ(skipped.size(), 1u);
  fs::path aside = dir / "m-1_4.safetensors.damaged";
  EXPECT_EQ(skipped[0].path, aside);
  EXPECT_FALSE(fs::exists(newest));
  EXPECT_EQ(read_bytes(aside), bytes) << "kept byte for byte";
  EXPECT_EQ(latest_checkpoint(dir.path(), "m"), dir / "m-1_2.safetensors");

  write_bytes(dir / "m-1_2.safetensors", std::vector<uint8_t>(100, 7));  // none loads now
  skipped.clear();
  EXPECT_FALSE(latest_loadable_checkpoint(dir.path(), "m", &skipped).has_value());
  EXPECT_EQ(skipped.size(), 1u);
}

TEST(LoadParamIntoNet, StrictListsEveryProblemByNameAndLoadsNothing) {
  auto net = small_net();
  Tensor before = net->parameters_and_names()[0].second.clone();
  io::NamedTensors ts = {
      {"0.weight", ones({32, 16})},           // fine
      {"0.bias", ones({31})},                 // shape mismatch
      {"1.gamma", ones({32}, DType::kI64)},   // not convertible
      {"head.weight", ones({4, 32})},         // unexpected
      {"optimizer.moments.0", ones({2})},     // the optimizer's: ignored here
  };
  std::string msg = expect_error([&] { load_param_into_net(*net, ts); },
                                 {"load_param_into_net", "0.bias: shape expected (32), got (31)",
                                  "1.gamma: dtype expected float32, got int64 (not convertible)",
                                  "unexpected: head.weight", "missing: 1.beta, 4.weight, 4.bias, 1.moving_mean, "
                                  "1.moving_variance"});
  EXPECT_EQ(msg.find("optimizer.moments"), std::string::npos) << msg;
  expect_same_bits(net->parameters_and_names()[0].second, before, "nothing is loaded on error");
}

TEST(LoadParamIntoNet, NonStrictLoadsWhatMatchesAndReports) {
  auto net = small_net();
  io::NamedTensors ts = {{"0.weight", full({32, 16}, 0.5)}, {"head.weight", ones({4, 32})},
                         {"1.moving_mean", full({32}, 2.0, DType::kBF16)}};
  LoadReport r = load_param_into_net(*net, ts, /*strict=*/false);
  EXPECT_EQ(r.loaded, (std::vector<std::string>{"0.weight", "1.moving_mean"}));
  EXPECT_EQ(r.converted, (std::vector<std::string>{"1.moving_mean"}));
  EXPECT_EQ(r.unexpected, (std::vector<std::string>{"head.weight"}));
  EXPECT_EQ(r.missing.size(), 6u);  // 0.bias, 1.gamma, 1.beta, 4.weight, 4.bias, 1.moving_variance
  EXPECT_EQ(net->parameters_and_names()[0].second.get(7), 0.5);
  EXPECT_EQ(net->buffers_and_names()[0].second.get(3), 2.0);
  // A shape mismatch is an error even when not strict.
  expect_error([&] { load_param_into_net(*net, {{"0.bias", ones({3})}}, false); }, {"0.bias: shape expected (32)"});
}

TEST(LoadParamIntoNet, HalfPrecisionWeightsConvertToFp32Masters) {
  auto net = small_net();
  Tensor w = uniform({32, 16}, -1, 1, default_generator(), DType::kF16);
  load_param_into_net(*net, {{"0.weight", w}}, false);
  Tensor p = net->parameters_and_names()[0].second;
  EXPECT_EQ(p.dtype(), DType::kF32);
  expect_same_bits(p, w.to(DType::kF32), "f16 -> f32 is exact");
}

TEST(RestoreCheckpoint, RefusesAnotherAmpLevelOrOptimizerAndChangesNothing) {
  TrainRun r(1);
  TempDir dir;
  save_checkpoint(dir / "c.safetensors", r.state());
  auto ckpt = load_checkpoint(dir / "c.safetensors");
  TrainRun other(2);
  TrainState s = other.state();
  s.amp_level = amp::Level::kO0;
  Tensor before = other.net->parameters_and_names()[0].second.clone();
  expect_error([&] { restore_checkpoint(ckpt, s); }, {"AMP level: checkpoint O2, this run O0"});
  expect_same_bits(other.net->parameters_and_names()[0].second, before, "untouched after an error");
  EXPECT_NO_THROW(restore_checkpoint(ckpt, s, {.check_amp = false}));

  auto adam = std::make_shared<optim::Adam>(other.net->trainable_params(), 0.001);
  s.amp_level = amp::Level::kO2;
  s.optimizer = adam.get();
  expect_error([&] { restore_checkpoint(ckpt, s); },
               {"optimizer: checkpoint Momentum, this run Adam", "missing: optimizer.moment1.0"});
}

TEST(RestoreCheckpoint, PlainWeightsNeedNonStrict) {
  TempDir dir;
  auto net = small_net();
  io::save_safetensors(dir / "w.safetensors", net->parameters_and_names());
  TrainRun r(5);
  auto ckpt = load_checkpoint(dir / "w.safetensors");
  EXPECT_FALSE(ckpt.meta.is_training_state);
  expect_error([&] { restore_checkpoint(ckpt, r.state()); },
               {"missing:", "1.moving_mean", "optimizer.moments.0", "loss-scale state", "generator default"});
  LoadReport rep = restore_checkpoint(ckpt, r.state(), {.strict = false});
  EXPECT_EQ(rep.loaded.size(), 6u);
}

// ---- ModelCheckpoint ----

struct FakeLoop {
  std::shared_ptr<nn::SequentialCell> net = small_net();
  RunContext ctx;
  ModelCheckpoint* cb = nullptr;

  void run(int epochs, int64_t steps, const std::vector<double>& metric = {}) {
    cb->on_train_begin(ctx);
    for (int e = 1; e <= epochs; ++e) {
      ctx.epoch = e;
      ctx.steps_per_epoch = steps;
      for (ctx.step_in_epoch = 1; ctx.step_in_epoch <= steps; ++ctx.step_in_epoch) {
        ++ctx.cur_step_num;
        cb->on_step_end(ctx);
      }
      ctx.step_in_epoch = steps;
      ctx.metrics.clear();
      if (!metric.empty()) ctx.metrics["Accuracy"] = metric[static_cast<size_t>(e - 1)];
      cb->on_epoch_end(ctx);
    }
  }
};

TEST(ModelCheckpoint, KeepsTheLastKAndPointsAtTheLatest) {
  TempDir dir;
  FakeLoop loop;
  ModelCheckpoint cb("net", dir.path(), {.save_checkpoint_steps = 2, .save_checkpoint_epochs = 1, .keep_checkpoint_max = 3});
  cb.set_state_source([&] { return TrainState{.network = loop.net.get()}; });
  loop.cb = &cb;
  loop.run(2, 5);
  // Saved: 1_2 1_4 1_5(epoch end) 2_1(step 6) 2_3(step 8) 2_5(step 10 and epoch end); the last 3 stay.
  EXPECT_EQ(list_dir(dir.path()), (std::vector<std::string>{"net-2_1.safetensors", "net-2_3.safetensors",
                                                            "net-2_5.safetensors", "net-latest", "net.lock"}));
  auto pointer = read_bytes(dir / "net-latest");
  EXPECT_EQ(std::string(pointer.begin(), pointer.end()), "net-2_5.safetensors\n");
  EXPECT_EQ(latest_checkpoint(dir.path(), "net"), dir / "net-2_5.safetensors");
  EXPECT_EQ(latest_checkpoint(dir.path()), dir / "net-2_5.safetensors");
  EXPECT_EQ(latest_checkpoint(dir.path(), "other"), std::nullopt);
  auto last = load_checkpoint(dir / "net-2_5.safetensors");
  EXPECT_EQ(last.meta.epochs_done, 2) << "the epoch-end save says the epoch is complete";
  EXPECT_EQ(last.meta.step, 10);

  // A resumed run (the same run id: a Model restored from a checkpoint passes it on by itself) counts the
  // files already there towards K, once the first run has let go of the directory.
  const std::string run_id = cb.run_id();
  EXPECT_EQ(run_id.size(), 16u);
  EXPECT_EQ(last.meta.run_id, run_id);
  ModelCheckpoint busy("net", dir.path(), {.run_id = run_id});
  FakeLoop second;
  second.cb = &busy;
  expect_error([&] { second.run(1, 1); }, {"another run is writing checkpoints 'net-*'", "(process "});
  cb.on_train_end(loop.ctx);  // (the step's checkpoint is written: nothing saved again)
  ModelCheckpoint again("net", dir.path(), {.save_checkpoint_steps = 0, .keep_checkpoint_max = 3, .run_id = run_id});
  again.set_state_source([&] { return TrainState{.network = loop.net.get()}; });
  FakeLoop more;
  more.net = loop.net;
  more.cb = &again;
  more.ctx.cur_step_num = 10;
  more.run(3, 5);  // epochs 1..3 again, named 1_5 2_5 3_5
  EXPECT_EQ(again.kept().size(), 3u);
  EXPECT_EQ(latest_checkpoint(dir.path(), "net"), dir / "net-3_5.safetensors");
}

TEST(ModelCheckpoint, KeepsTheBestByMetric) {
  TempDir dir;
  FakeLoop loop;
  auto cb = std::make_unique<ModelCheckpoint>(
      "m", dir.path(), CheckpointConfig{.save_checkpoint_epochs = 0, .monitor = "Accuracy", .maximize = true});
  cb->set_state_source([&] { return TrainState{.network = loop.net.get()}; });
  loop.cb = cb.get();
  loop.run(4, 1, {0.5, 0.8, 0.7, 0.6});
  EXPECT_EQ(cb->best_value(), 0.8);
  EXPECT_EQ(list_dir(dir.path()), (std::vector<std::string>{"m-best.safetensors", "m.lock"}));
  cb.reset();  // (its run is over: the directory's lock goes with it)
  auto best = load_checkpoint(dir / "m-best.safetensors");
  EXPECT_EQ(best.meta.epoch, 2);
  EXPECT_EQ(best.meta.extra.at("monitor_value"), "0.8");

  // A resumed run competes with the stored best.
  ModelCheckpoint again("m", dir.path(), {.save_checkpoint_epochs = 0, .monitor = "Accuracy", .maximize = true});
  again.set_state_source([&] { return TrainState{.network = loop.net.get()}; });
  FakeLoop more;
  more.cb = &again;
  more.run(1, 1, {0.75});
  EXPECT_EQ(load_checkpoint(dir / "m-best.safetensors").meta.epoch, 2) << "0.75 < 0.8: not replaced";

  ModelCheckpoint missing("x", dir.path(), {.monitor = "F1"});
  missing.set_state_source([&] { return TrainState{.network = loop.net.get()}; });
  FakeLoop l3;
  l3.cb = &missing;
  expect_error([&] { l3.run(1, 1, {0.1}); }, {"no metric 'F1'", "the epoch has: Accuracy"});
}

TEST(ModelCheckpoint, AFailedSaveLeavesOlderCheckpointsIntact) {
  TempDir dir;
  FakeLoop loop;
  io::WriteFaults faults;
  auto cb = std::make_unique<ModelCheckpoint>(
      "f", dir.path(), CheckpointConfig{.keep_checkpoint_max = 1, .save = {.write = {.faults = &faults}}});
  cb->set_state_source([&] { return TrainState{.network = loop.net.get()}; });
  loop.cb = cb.get();
  loop.run(1, 2);
  auto good = read_bytes(dir / "f-1_2.safetensors");
  faults.fail_after_bytes = 100;  // the disk fills up
  expect_error([&] { loop.run(1, 2); }, {"ModelCheckpoint: cannot write", "No space left on device",
                                         "the previous file is unchanged"});
  EXPECT_EQ(read_bytes(dir / "f-1_2.safetensors"), good);
  EXPECT_EQ(list_dir(dir.path()), (std::vector<std::string>{"f-1_2.safetensors", "f-latest", "f.lock"}));
  const std::string run_id = cb->run_id();
  cb.reset();  // (the failed run ends; the lenient one below continues it)

  std::ostringstream log;
  set_callback_stream(&log);
  ModelCheckpoint lenient("f", dir.path(), {.keep_checkpoint_max = 1, .continue_on_error = true,
                                            .save = {.write = {.faults = &faults}}, .run_id = run_id});
  lenient.set_state_source([&] { return TrainState{.network = loop.net.get()}; });
  loop.cb = &lenient;
  loop.ctx = {};
  EXPECT_NO_THROW(loop.run(1, 2));
  set_callback_stream(nullptr);
  EXPECT_EQ(lenient.failures(), 1);
  EXPECT_NE(log.str().find("checkpoint not saved (training continues)"), std::string::npos) << log.str();
  EXPECT_EQ(read_bytes(dir / "f-1_2.safetensors"), good);
}

TEST(ModelCheckpoint, WithAModel) {
  TempDir dir;
  set_seed(5);
  auto net = std::make_shared<nn::SequentialCell>();
  net->append(std::make_shared<nn::Flatten>());
  net->append(std::make_shared<nn::Dense>(3 * 4 * 4, 10));
  auto opt = std::make_shared<optim::Momentum>(net->trainable_params(), 0.01, 0.9);
  Model model(net, std::make_shared<nn::SoftmaxCrossEntropyWithLogits>(true, "mean"), opt, {},
              {.amp_level = amp::Level::kO2, .low_dtype = DType::kBF16});
  auto ds = data::make_seed_dataset(40, 8, 3, {.height = 4, .width = 4});
  auto cb = std::make_shared<ModelCheckpoint>("model", dir.path(), CheckpointConfig{.save_checkpoint_steps = 3, .keep_checkpoint_max = 2});
  model.train(2, ds, {cb}, false);
  auto latest = latest_checkpoint(dir.path(), "model");
  ASSERT_TRUE(latest.has_value());
  EXPECT_EQ(latest->filename(), "model-2_5.safetensors");
  auto s = load_checkpoint(*latest);
  EXPECT_EQ(s.meta.amp_level, "O2");
  EXPECT_EQ(s.meta.low_dtype, "bfloat16");
  EXPECT_EQ(s.meta.step, 10);
  EXPECT_EQ(s.meta.global_step, opt->global_step());
  expect_same_bits(s.tensors[0].second, net->parameters_and_names()[0].second, "the final weights");
  Model fresh(small_net(), std::make_shared<nn::SoftmaxCrossEntropyWithLogits>(true, "mean"),
              std::make_shared<optim::Momentum>(small_net()->trainable_params(), 0.01, 0.9), {},
              {.amp_level = amp::Level::kO2, .low_dtype = DType::kBF16});
  expect_error([&] { restore_checkpoint(s, fresh); }, {"missing:", "unexpected:"});
}

TEST(CheckpointName, ParsesMindSporeStyleNames) {
  auto n = parse_checkpoint_name("my-net-12_300.safetensors");
  ASSERT_TRUE(n.has_value());
  EXPECT_EQ(n->prefix, "my-net");
  EXPECT_EQ(n->epoch, 12);
  EXPECT_EQ(n->step, 300);
  for (const char* bad : {"net-best.safetensors", "net-1_2.ckpt", "-1_2.safetensors", "net-1_.safetensors",
                          "net-1_-2.safetensors", "net-a_2.safetensors", "net-1_2x.safetensors"}) {
    EXPECT_FALSE(parse_checkpoint_name(bad).has_value()) << bad;
  }
}

// ---- interoperability with PyTorch ----

std::filesystem::path source_root() {
  for (auto p = std::filesystem::current_path(); !p.empty(); p = p.parent_path()) {
    if (std::filesystem::exists(p / "tests/golden/torch_tiny.safetensors")) return p;
    if (p == p.parent_path()) break;
  }
  return {};
}

// The twin of check_safetensors_interop.py's tiny(): conv 1->4 (3x3, pad 1, bias), BN, ReLU, max-pool, dense.
std::shared_ptr<nn::SequentialCell> tiny_net() {
  auto net = std::make_shared<nn::SequentialCell>();
  net->append(std::make_shared<nn::Conv2d>(1, 4, 3, nn::Conv2dOptions::Make(1, "pad", 1, true)));
  net->append(std::make_shared<nn::BatchNorm2d>(4));
  net->append(std::make_shared<nn::ReLU>());
  net->append(std::make_shared<nn::MaxPool2d>(2, 2));
  net->append(std::make_shared<nn::Flatten>());
  net->append(std::make_shared<nn::Dense>(64, 3));
  return net;
}

void expect_close(const Tensor& got, const Tensor& want, double tol, const std::string& what) {
  ASSERT_EQ(got.shape(), want.shape()) << what;
  auto g = got.to_vector(), w = want.to_vector();
  for (size_t i = 0; i < g.size(); ++i) EXPECT_NEAR(g[i], w[i], tol) << what << " element " << i;
}

Tensor find(const io::NamedTensors& ts, const std::string& name) {
  for (const auto& [n, t] : ts) {
    if (n == name) return t;
  }
  ADD_FAILURE() << "no tensor " << name;
  return zeros({1});
}

TEST(Interop, LoadsWeightsPyTorchWrote) {
  auto root = source_root();
  ASSERT_FALSE(root.empty()) << "tests/golden/torch_tiny.safetensors not found above " << std::filesystem::current_path();
  for (const char* file : {"torch_tiny.safetensors", "torch_tiny_bf16.safetensors"}) {
    SCOPED_TRACE(file);
    auto ckpt = load_checkpoint(root / "tests/golden" / file);
    EXPECT_FALSE(ckpt.meta.is_training_state);
    auto net = tiny_net();
    LoadReport r = load_param_into_net(*net, ckpt.tensors, /*strict=*/false);
    EXPECT_TRUE(r.missing.empty()) << r.missing.size() << " missing";
    EXPECT_EQ(r.loaded.size(), 8u);
    net->set_train(false);
    Tensor logits = net->call(find(ckpt.tensors, "input"));
    // torch computed these from the same (for bf16: the same rounded) weights in FP32.
    expect_close(logits, find(ckpt.tensors, "logits"), 1e-5, "logits");
  }

  // One tensor of every dtype, with the values the script wrote.
  io::SafetensorsFile f = io::load_safetensors(root / "tests/golden/torch_tiny.safetensors");
  for (const char* name : {"sample.f32", "sample.f16", "sample.bf16", "sample.f64"}) {
    const Tensor* t = f.find(name);
    ASSERT_NE(t, nullptr) << name;
    EXPECT_EQ(t->shape(), Shape({3, 4}));
    for (int64_t k = 0; k < 12; ++k) EXPECT_EQ(t->get(k), k * 0.25 - 1) << name;
  }
  EXPECT_EQ(f.find("sample.f16")->dtype(), DType::kF16);
  EXPECT_EQ(f.find("sample.bf16")->dtype(), DType::kBF16);
  for (int64_t k = 0; k < 12; ++k) {
    EXPECT_EQ(f.find("sample.i64")->data<int64_t>()[k], k * (int64_t{1} << 40) - 7);
    EXPECT_EQ(f.find("sample.i32")->data<int32_t>()[k], k * 1000 - 6000);
    EXPECT_EQ(f.find("sample.u8")->data<uint8_t>()[k], k * 21);
    EXPECT_EQ(f.find("sample.bool")->data<bool>()[k], k % 3 == 0);
  }
  EXPECT_EQ(f.find("sample.scalar")->rank(), 0);
  EXPECT_EQ(f.find("sample.scalar")->item(), 3.5);
}

bool python_has_torch() {
  return test_support::run_program({"/usr/bin/python3", "-c", "import torch"}, "", /*quiet=*/true) == 0;
}

// Model B (LeNet with BatchNorm): demi writes a checkpoint and a batch with its logits; PyTorch loads the
// checkpoint into its twin and must reproduce the logits — in FP32 at O0, within bf16 tolerance at O2-bf16.
TEST(Interop, PyTorchReproducesDemisLogitsForModelB) {
  auto root = source_root();
  ASSERT_FALSE(root.empty());
  if (!python_has_torch()) GTEST_SKIP() << "/usr/bin/python3 without torch (scripts/setup --bench installs it)";
  TempDir dir;
  set_seed(77);
  auto net = std::make_shared<nn::LeNet>(/*batch_norm=*/true);
  Generator g(8);
  for (auto& [name, b] : net->buffers_and_names()) {
    b.copy_(name.find("mean") != std::string::npos ? uniform(b.shape(), -0.3, 0.3, g) : uniform(b.shape(), 0.5, 2, g));
  }
  for (auto& [name, p] : net->parameters_and_names()) {
    if (name.find("gamma") != std::string::npos) p.copy_(uniform(p.shape(), 0.5, 1.5, g));
  }
  net->set_train(false);
  Tensor x = normal({4, 1, 28, 28}, 0, 1, g);
  save_checkpoint(dir / "lenet.safetensors", TrainState{.network = net.get(), .generators = generators_of(*net)});
  struct Case {
    amp::Level level;
    double tol;
  };
  for (Case c : {Case{amp::Level::kO0, 1e-4}, Case{amp::Level::kO2, 1e-2}}) {
    SCOPED_TRACE(amp::level_name(c.level));
    amp::auto_mixed_precision(*net, c.level, DType::kBF16);
    Tensor logits = net->call(x);
    io::save_safetensors(dir / "batch.safetensors", {{"input", x}, {"logits", logits}});
    const std::vector<std::string> argv = {"/usr/bin/python3", (root / "scripts/check_safetensors_interop.py").string(),
                                           "check-demi", (dir / "lenet.safetensors").string(),
                                           (dir / "batch.safetensors").string(), "--model", "lenet-bn", "--tol",
                                           str_cat(c.tol)};
    EXPECT_EQ(test_support::run_program(argv), 0) << str_cat(argv[1], " ", argv[2], " ...");
  }
}

}  // namespace
}  // namespace demi::train

namespace demi::train {
namespace {

// NaN or infinite weights, and f64 weights beyond f32's range (Inf once converted), are refused at load,
// naming the tensor and the count, by load_param_into_net and restore_checkpoint alike; allowed only when
// asked (to inspect a diverged run).
TEST(Checkpoint, NonFiniteWeightsAreRefusedAtLoadUnlessAllowed) {
  auto net = small_net();
  io::NamedTensors good;
  for (const auto& [name, t] : net->parameters_and_names()) good.emplace_back(name, t.clone());  // (no buffers: strict=false)
  for (int variant = 0; variant < 3; ++variant) {
    io::NamedTensors bad = good;
    Tensor& w = bad[0].second;  // "0.weight", 16 x 32
    w = variant == 2 ? w.to(DType::kF64) : w.clone();  // (bad shares good's tensors otherwise)
    w.set(3, variant == 0 ? std::numeric_limits<double>::quiet_NaN()
             : variant == 1 ? std::numeric_limits<double>::infinity()
                            : 1e300);  // beyond f32: Inf once converted
    w.set(7, variant == 2 ? -1e39 : std::numeric_limits<double>::quiet_NaN());
    SCOPED_TRACE(variant);
    auto target = small_net();
    expect_error([&] { load_param_into_net(*target, bad); },
                 {bad[0].first, "2 of 512 values are NaN or infinite", "--allow-non-finite"});
    io::TrainingState state;
    state.tensors = bad;
    expect_error([&] { restore_checkpoint(state, TrainState{.network = target.get()}); },
                 {bad[0].first, "2 of 512 values are NaN or infinite"});
    EXPECT_NO_THROW(load_param_into_net(*target, bad, /*strict=*/false, /*allow_non_finite=*/true));
    EXPECT_FALSE(std::isfinite(target->parameters_and_names()[0].second.get(3)));
  }
  auto target = small_net();
  try {
    load_param_into_net(*target, good, /*strict=*/false);
  } catch (const Error& e) {
    ADD_FAILURE() << e.what();
  }
}

}  // namespace
}  // namespace demi::train
