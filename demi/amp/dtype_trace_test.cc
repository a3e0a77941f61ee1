#include "demi/amp/dtype_trace.h"

#include <gtest/gtest.h>

#include <cstring>

#include "demi/nn/layers.h"
#include "demi/optim/optimizer.h"

namespace demi::amp {
namespace {

TEST(DTypeTrace, ShowsWhatEachLevelRanAndCountsFlopsPerDtype) {
  set_seed(1);
  auto fc1 = std::make_shared<nn::Dense>(8, 16);
  auto net = std::make_shared<nn::SequentialCell>(std::vector<nn::CellPtr>{
      fc1, std::make_shared<nn::BatchNorm1d>(16), std::make_shared<nn::ReLU>(), std::make_shared<nn::Dense>(16, 4)});
  auto step = build_train_network(net, std::make_shared<optim::SGD>(net->trainable_params(), 0.1),
                                  std::make_shared<nn::SoftmaxCrossEntropyWithLogits>(true, "mean"), Level::kO2,
                                  {.low_dtype = DType::kBF16});
  Generator g(3);
  Tensor x = normal({32, 8}, 0, 1, g);
  Tensor y = zeros({32}, DType::kI32);
  Tensor w_before = fc1->weight.clone();
  DTypeTrace t = trace_dtypes(*step, x, y);

  auto find = [&](const std::string& layer, ops::Op op, bool backward) -> const DTypeTraceRow* {
    for (const auto& r : t.rows)
      if (r.layer == layer && r.op == op && r.backward == backward) return &r;
    return nullptr;
  };
  const DTypeTraceRow* dense = find("0", ops::Op::kDense, false);
  ASSERT_NE(dense, nullptr) << t.to_string();
  EXPECT_EQ(dense->type, "Dense");
  EXPECT_EQ(dense->compute, DType::kBF16);
  EXPECT_EQ(dense->flops, 2 * 32 * 16 * 8);
  const DTypeTraceRow* bn = find("1", ops::Op::kBatchNorm, false);
  ASSERT_NE(bn, nullptr);
  EXPECT_EQ(bn->compute, DType::kF32) << "O2 keeps BatchNorm in FP32";
  const DTypeTraceRow* dense_bwd = find("0", ops::Op::kDense, true);
  ASSERT_NE(dense_bwd, nullptr) << "backward ops are traced with their layer";
  EXPECT_EQ(dense_bwd->flops, 2 * dense->flops);

  int64_t ops = 0, flops = 0;
  for (const auto& r : t.rows) flops += r.flops;
  for (const auto* m : {&t.forward, &t.backward})
    for (const auto& [d, tot] : *m) {
      ops += tot.ops;
      flops -= tot.flops;
    }
  EXPECT_EQ(ops, static_cast<int64_t>(t.rows.size()));
  EXPECT_EQ(flops, 0);
  EXPECT_GT(t.forward.at(DType::kBF16).flops, t.forward.at(DType::kF32).flops);
  EXPECT_NE(t.to_string().find("summary by compute dtype"), std::string::npos);
  // Tracing is not training: the weights and their gradients are as they were.
  EXPECT_EQ(std::memcmp(w_before.raw_data(), fc1->weight.raw_data(), w_before.nbytes()), 0);
  EXPECT_FALSE(fc1->weight.grad().defined());
}

}  // namespace
}  // namespace demi::amp
