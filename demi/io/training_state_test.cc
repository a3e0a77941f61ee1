// Training-state metadata: every field round-trips exactly (doubles bit for bit), the caller's keys are
// kept, and malformed values are errors naming the file and the key.
#include "demi/io/training_state.h"

#include <gtest/gtest.h>

#include <cmath>

#include "demi/io/internal/test_util.h"

namespace demi::io {
namespace {

using test_util::expect_error;
using test_util::TempDir;

TrainingMeta full_meta() {
  TrainingMeta m;
  m.amp_level = "O2";
  m.low_dtype = "float16";
  m.loss_scale = LossScaleRecord{.scale = std::ldexp(1.0, 17) * 0.1, .good_steps = 1999, .consecutive_overflows = 2,
                                 .total_overflows = 40};
  m.optimizer = "Momentum";
  m.global_step = 123456789012;
  m.epoch = 3;
  m.step_in_epoch = 17;
  m.step = 217;
  m.epochs_done = 2;
  m.data_epoch = 2;
  m.data_position = 17;
  m.generators["default"] = {.seed = 0xFFFFFFFFFFFFFFFFull, .offset = 42};
  m.generators["cell:features.3"] = {.seed = 7, .offset = 1ull << 40};
  m.extra["run"] = "baseline";
  return m;
}

TEST(TrainingState, MetadataRoundTripsExactly) {
  TrainingMeta m = full_meta();
  TrainingMeta back = decode_training_meta(encode_training_meta(m), "x");
  EXPECT_TRUE(back.is_training_state);
  EXPECT_EQ(back.amp_level, m.amp_level);
  EXPECT_EQ(back.low_dtype, m.low_dtype);
  ASSERT_TRUE(back.loss_scale.has_value());
  EXPECT_EQ(*back.loss_scale, *m.loss_scale);  // the scale bit for bit
  EXPECT_EQ(back.optimizer, m.optimizer);
  EXPECT_EQ(back.global_step, m.global_step);
  EXPECT_EQ(back.epoch, m.epoch);
  EXPECT_EQ(back.step_in_epoch, m.step_in_epoch);
  EXPECT_EQ(back.step, m.step);
  EXPECT_EQ(back.epochs_done, m.epochs_done);
  EXPECT_EQ(back.data_epoch, m.data_epoch);
  EXPECT_EQ(back.data_position, m.data_position);
  EXPECT_EQ(back.generators, m.generators);
  EXPECT_EQ(back.extra, m.extra);
}

TEST(TrainingState, FileRoundTrip) {
  TempDir dir;
  TrainingState s;
  s.tensors = {{"fc.weight", from_vector<float>({1, 2, 3, 4}, {2, 2})}, {"optimizer.moments.0", zeros({2, 2})}};
  s.meta = full_meta();
  save_training_state(dir / "s.safetensors", s);
  TrainingState back = load_training_state(dir / "s.safetensors");
  ASSERT_EQ(back.tensors.size(), 2u);
  EXPECT_EQ(back.tensors[0].second.to_vector(), (std::vector<float>{1, 2, 3, 4}));
  EXPECT_EQ(back.meta.generators, s.meta.generators);
  EXPECT_EQ(*back.meta.loss_scale, *s.meta.loss_scale);
}

TEST(TrainingState, PlainWeightsFileHasNoTrainingState) {
  TrainingMeta m = decode_training_meta({{"format", "pt"}, {"author", "torch"}}, "w.safetensors");
  EXPECT_FALSE(m.is_training_state);
  EXPECT_FALSE(m.loss_scale.has_value());
  EXPECT_EQ(m.extra.at("author"), "torch");
  EXPECT_EQ(m.extra.count("format"), 0u);
}

TEST(TrainingState, MalformedValuesNameFileAndKey) {
  expect_error([] { decode_training_meta({{"demi.global_step", "12x"}}, "c.safetensors"); },
               {"c.safetensors", "'demi.global_step'", "12x"});
  expect_error([] { decode_training_meta({{"demi.epoch", ""}}, "c.safetensors"); }, {"'demi.epoch'"});
  expect_error([] { decode_training_meta({{"demi.rng.default", "5"}}, "c.safetensors"); },
               {"'demi.rng.default'", "<seed>:<offset>"});
  expect_error([] { decode_training_meta({{"demi.rng.default", "-1:0"}}, "c.safetensors"); }, {"'demi.rng.default'"});
  expect_error([] { decode_training_meta({{"demi.loss_scale", "inf"}}, "c.safetensors"); },
               {"'demi.loss_scale' must be a finite positive"});
  TrainingMeta m;
  m.extra["demi.mine"] = "x";
  expect_error([&] { encode_training_meta(m); }, {"'demi.mine'", "reserved"});
}

}  // namespace
}  // namespace demi::io
