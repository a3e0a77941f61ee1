// AMP end to end: what each level runs in (the op trace), loss scaling against underflow, overflow
// handling, and the seed's configuration training model A as well as O0.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <cstring>
#include <limits>
#include <optional>

#include "demi/amp/numerics.h"
#include "demi/amp/policy.h"
#include "demi/amp/train_step.h"
#include "demi/autograd/autograd.h"
#include "demi/core/parallel.h"
#include "demi/core/rng.h"
#include "demi/core/test_support.h"
#include "demi/data/mnist.h"
#include "demi/kernels/cpu/gemm.h"
#include "demi/kernels/matmul.h"
#include "demi/nn/models.h"
#include "demi/ops/ops.h"

namespace demi {
namespace {

using amp::Level;
using ops::Op;

struct Batch {
  Tensor x, y;
};

std::vector<Batch> seed_batches(int n, int64_t batch, uint64_t seed) {
  Generator g(seed);
  std::vector<Batch> out;
  for (int i = 0; i < n; ++i) {
    Tensor x = normal({batch, 3, 32, 32}, 0, 1, g);
    std::vector<int32_t> l(static_cast<size_t>(batch));
    for (auto& v : l) v = static_cast<int32_t>(g.next_int(10));
    out.push_back({x, from_vector(l, {batch})});
  }
  return out;
}

std::vector<DType> forward_dtypes(const ops::OpTrace& t, Op op) {
  std::vector<DType> out;
  for (const auto& r : t.of(op)) out.push_back(r.compute_dtype);
  return out;
}

class LevelTrace : public ::testing::TestWithParam<DType> {};

// The op trace shows exactly the dtypes each level promises.
TEST_P(LevelTrace, EachLevelRunsEachOpInThePromisedDtype) {
  const DType low = GetParam();
  auto data = seed_batches(1, 4, 1);
  struct Expect {
    Level level;
    DType conv, relu, pool, dense, bn, loss;
  };
  const DType F32 = DType::kF32;
  const Expect table[] = {
      {Level::kO0, F32, F32, F32, F32, F32, F32},
      {Level::kO1, low, low, F32, low, F32, F32},
      {Level::kO2, low, low, low, low, F32, F32},
      {Level::kO3, low, low, low, low, low, F32},
  };
  for (const auto& e : table) {
    set_seed(3);
    auto net = std::make_shared<nn::LeNet>(/*batch_norm=*/true);
    auto loss_fn = std::make_shared<nn::SoftmaxCrossEntropyWithLogits>(true, "mean");
    auto opt = std::make_shared<optim::Momentum>(net->trainable_params(), 0.01, 0.9);
    amp::TrainOptions o;
    o.low_dtype = low;
    auto step = amp::build_train_network(net, opt, loss_fn, e.level, o);
    Tensor x = normal({4, 1, 28, 28}, 0, 1, default_generator());
    ops::OpTrace trace;
    amp::StepResult r = (*step)(x, data[0].y);
    ASSERT_TRUE(std::isfinite(r.loss)) << amp::level_name(e.level);
    std::string where = std::string(amp::level_name(e.level)) + " " + std::string(dtype_name(low)) + "\n" + trace.to_string();
    for (DType d : forward_dtypes(trace, Op::kConv2d)) EXPECT_EQ(d, e.conv) << where;
    for (DType d : forward_dtypes(trace, Op::kRelu)) EXPECT_EQ(d, e.relu) << where;
    for (DType d : forward_dtypes(trace, Op::kMaxPool2d)) EXPECT_EQ(d, e.pool) << where;
    // LeNet's SequentialCell fuses ReLU -> MaxPool2d into one op, a gray-list op like the pool.
    EXPECT_EQ(forward_dtypes(trace, Op::kReluMaxPool2d).size(), 2u) << where;
    for (DType d : forward_dtypes(trace, Op::kReluMaxPool2d)) EXPECT_EQ(d, e.pool) << where;
    for (DType d : forward_dtypes(trace, Op::kDense)) EXPECT_EQ(d, e.dense) << where;
    for (DType d : forward_dtypes(trace, Op::kBatchNorm)) EXPECT_EQ(d, e.bn) << where;
    auto loss_records = trace.of(Op::kSoftmaxCrossEntropy);
    ASSERT_EQ(loss_records.size(), 1u) << where;
    EXPECT_EQ(loss_records[0].compute_dtype, e.loss) << where;
    EXPECT_EQ(loss_records[0].output_dtypes[0], DType::kF32) << where;
    EXPECT_EQ(forward_dtypes(trace, Op::kConv2d).size(), 2u) << where;
    // O1: white-listed ops hand FP32 to the rest of the network.
    if (e.level == Level::kO1) {
      for (const auto& rec : trace.of(Op::kReluMaxPool2d)) EXPECT_EQ(rec.input_dtypes[0], F32) << where;
    }
    // Parameters stay FP32 masters whatever the level.
    for (const auto& [name, p] : net->parameters_and_names()) EXPECT_EQ(p.dtype(), F32) << name;
  }
}

INSTANTIATE_TEST_SUITE_P(LowDtypes, LevelTrace, ::testing::Values(DType::kF16, DType::kBF16),
                         [](const ::testing::TestParamInfo<DType>& p) { return std::string(dtype_name(p.param)); });

// keep_batchnorm_fp32 does what it says at every level that has BatchNorm to keep, and is refused where it
// would change nothing: True at O3 keeps BatchNorm in FP32 (MindSpore's O3 with keep_batchnorm_fp32=True),
// False at O2 lowers it; False at O0 or O1 is an error, not a setting stored and ignored.
TEST(KeepBatchNormFp32, IsHonouredAtO3AndO2AndRefusedWhereItChangesNothing) {
  const auto bn_dtype = [](Level level, std::optional<bool> keep) {
    auto net = std::make_shared<nn::LeNet>(/*batch_norm=*/true);
    amp::TrainOptions o;
    o.keep_batchnorm_fp32 = keep;
    o.low_dtype = DType::kBF16;
    auto step = amp::build_train_network(net, std::make_shared<optim::Momentum>(net->trainable_params(), 0.01, 0.9),
                                         std::make_shared<nn::SoftmaxCrossEntropyWithLogits>(true, "mean"), level, o);
    const ops::PrecisionPolicy* p = net->precision_policy();
    return std::pair{p ? p->compute_dtype(Op::kBatchNorm, DType::kF32) : DType::kF32,
                     p ? p->compute_dtype(Op::kConv2d, DType::kF32) : DType::kF32};
  };
  EXPECT_EQ(bn_dtype(Level::kO3, std::nullopt), std::pair(DType::kBF16, DType::kBF16));
  EXPECT_EQ(bn_dtype(Level::kO3, true), std::pair(DType::kF32, DType::kBF16));
  EXPECT_EQ(bn_dtype(Level::kO2, std::nullopt), std::pair(DType::kF32, DType::kBF16));
  EXPECT_EQ(bn_dtype(Level::kO2, false), std::pair(DType::kBF16, DType::kBF16));
  EXPECT_EQ(bn_dtype(Level::kO1, true), std::pair(DType::kF32, DType::kBF16));
  for (Level level : {Level::kO0, Level::kO1})
    test_support::expect_error([&] { bn_dtype(level, false); },
                               {"keep_batchnorm_fp32=false at", amp::level_name(level), "would change nothing"});
}

// TrainOptions::f16_products is a setting of the run's AMP policy: refused where the run computes no
// float16 product (O0; a bfloat16 run) and where the CPU cannot run it, never stored and ignored.
TEST(F16ProductsOption, IsRefusedWhereItChangesNothingOrCannotRun) {
  const auto build = [](Level level, DType low) {
    auto net = std::make_shared<nn::MLP>();
    amp::TrainOptions o;
    o.low_dtype = low;
    o.f16_products = F16Products::kBf16;
    return amp::build_train_network(net, std::make_shared<optim::Momentum>(net->trainable_params(), 0.01, 0.9),
                                    std::make_shared<nn::SoftmaxCrossEntropyWithLogits>(true, "mean"), level, o);
  };
  test_support::expect_error([&] { build(Level::kO0, DType::kF16); }, {"f16_products=bf16", "O0 computes none"});
  test_support::expect_error([&] { build(Level::kO2, DType::kBF16); },
                             {"f16_products=bf16", "O2 with low_dtype bfloat16 computes none"});
  if (kernels::cpu::gemm_has_bf16_dot()) {
    EXPECT_EQ(build(Level::kO2, DType::kF16)->f16_products(), F16Products::kBf16);
  } else {
    test_support::expect_error([&] { build(Level::kO2, DType::kF16); }, {"need the bfloat16 pair kernel"});
  }
}

TEST(CastCache, EachParameterIsCastOncePerStep) {
  set_seed(4);
  // A network that uses one Dense twice: its weight must be cast once.
  class Twice : public nn::Cell {
   public:
    Twice() : Cell("Twice") { fc = register_cell("fc", std::make_shared<nn::Dense>(8, 8)); }
    Tensor construct(const Tensor& x) override { return fc->call(ops::relu(fc->call(x))); }
    std::shared_ptr<nn::Dense> fc;
  };
  auto net = std::make_shared<Twice>();
  auto opt = std::make_shared<optim::Momentum>(net->trainable_params(), 0.01, 0.9);
  auto step = amp::build_train_network(net, opt, std::make_shared<nn::MSELoss>(), Level::kO2,
                                       {.low_dtype = DType::kBF16});
  Tensor x = normal({4, 8}, 0, 1, default_generator());
  Tensor y = normal({4, 8}, 0, 1, default_generator());
  int64_t misses = ops::cast_cache_misses(), hits = ops::cast_cache_hits();
  ops::OpTrace trace;
  (*step)(x, y);
  // Dense's FP32 weight is never cast (its products read it rounded as they pack it); its bias is.
  EXPECT_EQ(ops::cast_cache_misses() - misses, 1) << "the bias cast once";
  EXPECT_EQ(ops::cast_cache_hits() - hits, 1) << "its second use is served from the cache";
  EXPECT_FALSE(net->fc->weight.impl().autograd->low_copy) << "no low-precision copy of the weight";
}

// At O2 the optimizer rewrites each parameter's low-precision copy in the same pass as its FP32 update, so
// from the second step on no parameter is cast; the weights are bit for bit those of casting every step.
TEST(CastCache, TheOptimizerKeepsTheLowCopiesSoLaterStepsCastNoParameter) {
  class Twice : public nn::Cell {
   public:
    Twice() : Cell("Twice") { fc = register_cell("fc", std::make_shared<nn::Dense>(8, 8)); }
    Tensor construct(const Tensor& x) override { return fc->call(ops::relu(fc->call(x))); }
    std::shared_ptr<nn::Dense> fc;
  };
  for (DType low : {DType::kBF16, DType::kF16}) {
    SCOPED_TRACE(dtype_name(low));
    auto run = [&](bool low_copies, std::vector<int64_t>* misses, std::vector<int64_t>* uses) {
      ops::set_low_copies(low_copies);
      set_seed(4);
      auto net = std::make_shared<Twice>();
      auto opt = std::make_shared<optim::Momentum>(net->trainable_params(), 0.05, 0.9);
      auto step = amp::build_train_network(net, opt, std::make_shared<nn::MSELoss>(), Level::kO2,
                                           {.low_dtype = low});
      step->set_attribute_overflow(false);  // the first fp16 steps overflow at 2^24: count one pass each
      Generator g(11);
      for (int i = 0; i < 4; ++i) {
        Tensor x = normal({4, 8}, 0, 1, g), y = normal({4, 8}, 0, 1, g);
        const int64_t m = ops::cast_cache_misses(), u = ops::low_copy_uses();
        (*step)(x, y);
        misses->push_back(ops::cast_cache_misses() - m);
        uses->push_back(ops::low_copy_uses() - u);
      }
      ops::set_low_copies(true);
      return std::vector<Tensor>{net->fc->weight.clone(), net->fc->bias.clone()};
    };
    std::vector<int64_t> misses_on, uses_on, misses_off, uses_off;
    auto on = run(true, &misses_on, &uses_on);
    auto off = run(false, &misses_off, &uses_off);
    // (Dense's weight is read rounded by its products, never cast: the bias is the parameter cast here.)
    EXPECT_EQ(misses_on, (std::vector<int64_t>{1, 0, 0, 0})) << "the bias cast in the first step only";
    EXPECT_EQ(uses_on, (std::vector<int64_t>{0, 1, 1, 1})) << "later steps read the optimizer-written copy";
    EXPECT_EQ(misses_off, (std::vector<int64_t>{1, 1, 1, 1}));
    EXPECT_EQ(uses_off, (std::vector<int64_t>{0, 0, 0, 0}));
    for (size_t t = 0; t < on.size(); ++t)
      for (int64_t i = 0; i < on[t].numel(); ++i) ASSERT_EQ(on[t].get(i), off[t].get(i)) << "tensor " << t << " [" << i << "]";
  }
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.numel() == b.numel() &&
         std::memcmp(a.raw_data(), b.raw_data(), static_cast<size_t>(a.numel()) * dtype_size(a.dtype())) == 0;
}

// The optimizer writes a parameter's low copy a chunk at a time as it updates it: after every step the copy
// is bit for bit the updated FP32 parameter cast, for a bias of 40000 values (split across two threads into
// chunks, the last of each thread partial), with low-precision gradients (widened a chunk at a time) and with
// FP32 ones. (Dense's weight is read rounded and keeps no copy.)
TEST(CastCache, TheOptimizerWrittenLowCopyIsTheCastParameterAfterEveryStep) {
  const int saved = num_threads();
  set_num_threads(2);
  for (DType low : {DType::kBF16, DType::kF16})
    for (bool low_grads : {true, false}) {
      SCOPED_TRACE(::testing::Message() << dtype_name(low) << (low_grads ? " low" : " FP32") << " gradients");
      set_seed(5);
      auto fc = std::make_shared<nn::Dense>(4, 40000);
      auto opt = std::make_shared<optim::Momentum>(fc->trainable_params(), 0.01, 0.9);
      amp::TrainOptions options;
      options.low_dtype = low;
      options.low_precision_param_grads = low_grads;
      auto step = amp::build_train_network(fc, opt, std::make_shared<nn::MSELoss>(), Level::kO2, options);
      step->set_attribute_overflow(false);
      Generator g(12);
      for (int i = 0; i < 3; ++i) {
        (*step)(normal({2, 4}, 0, 1, g), normal({2, 40000}, 0, 1, g));
        const AutogradMeta& meta = *fc->bias.impl().autograd;
        ASSERT_TRUE(meta.low_copy != nullptr && meta.low_version == meta.version) << "step " << i;
        EXPECT_TRUE(same_bits(*meta.low_copy, fc->bias.to(low))) << "step " << i;
      }
    }
  set_num_threads(saved);
}

// op(x, w) under a `low` dtype pin, given the FP32 weight w0 and given w0 cast to `low` beforehand, each
// followed by backward of sum(y²): the output and x's gradient bit for bit the same, and w's gradient the
// same sums (each stored once in its own dtype).
template <class Op>
void expect_same_as_with_the_cast_weight(DType low, const Tensor& x0, const Tensor& w0, Op&& op) {
  auto run = [&](bool cast_first) {
    Tensor x = x0.clone().set_requires_grad(true);
    Tensor w = (cast_first ? w0.to(low) : w0.clone()).set_requires_grad(true);
    Tensor y;
    {
      ops::DTypePinScope pin(low);
      y = op(x, w);
    }
    const Tensor y32 = ops::cast(y, DType::kF32);
    autograd::backward(ops::sum(ops::mul(y32, y32)));
    return std::vector<Tensor>{y, x.grad(), w.grad()};
  };
  const auto got = run(false), cast = run(true);
  EXPECT_TRUE(same_bits(got[0], cast[0])) << "output";
  EXPECT_TRUE(same_bits(got[1], cast[1])) << "input gradient";
  const Tensor& dw = got[2];
  EXPECT_TRUE(same_bits(dw.dtype() == cast[2].dtype() ? dw : dw.to(cast[2].dtype()), cast[2])) << "weight gradient";
}

// Dense under a low compute dtype reads an FP32 weight rounded by its products (no cast): the output and
// the input gradient are bit for bit those of the same Dense given the weight cast beforehand, and the
// weight gradient is the same sums (stored once in its own dtype). oneDNN runs both (it gets a rounded
// copy for the call), so both take the same kernel; demi's GEMM, which rounds in its packing, is checked
// bit for bit against the cast operand in Gemm.AnF32OperandReadRoundedIsBitForBitTheCastOperand.
TEST(CastCache, DenseRoundingItsFp32WeightIsBitForBitTheCastWeight) {
  const kernels::MatmulPolicy saved = kernels::matmul_policy();
  kernels::set_matmul_policy(kernels::MatmulPolicy::kOnednn);
  for (DType low : {DType::kBF16, DType::kF16})
    for (int64_t rows : {int64_t{64}, int64_t{2048}})
      for (bool relu : {false, true}) {
        SCOPED_TRACE(str_cat(dtype_name(low), " rows ", rows, relu ? " relu" : ""));
        Generator g(21);
        Tensor x0 = normal({rows, 40}, 0, 1, g), w0 = normal({24, 40}, 0, 0.3, g), b0 = normal({24}, 0, 0.1, g);
        w0.set(7, 70000.0);  // past f16's range: inf as the cast gives
        expect_same_as_with_the_cast_weight(low, x0, w0, [&](const Tensor& x, const Tensor& w) {
          return ops::dense(x, w, b0, relu);
        });
      }
  kernels::set_matmul_policy(saved);
}

// A convolution's FP32 weight under a low compute dtype is cast for each call that reads it and never
// kept: conv2d, the fused Conv2d -> ReLU -> MaxPool2d and the transposed convolution give bit for bit the
// outputs and input gradients of the same op given the weight cast beforehand (and the same weight
// gradient sums); a train step leaves no low-precision copy of a convolution weight behind.
TEST(CastCache, ConvolutionsCastTheirFp32WeightPerCallAndKeepNoCopy) {
  for (DType low : {DType::kBF16, DType::kF16})
    for (int op = 0; op < 3; ++op) {
      SCOPED_TRACE(str_cat(dtype_name(low), op == 0 ? " conv2d" : op == 1 ? " conv2d_relu_max_pool2d" : " transpose"));
      Generator g(23);
      Tensor x0 = normal({3, 6, 9, 9}, 0, 1, g), w0 = normal({8, 6, 3, 3}, 0, 0.3, g), b0 = normal({8}, 0, 0.1, g);
      if (op == 2) w0 = normal({6, 8, 3, 3}, 0, 0.3, g);  // (IC, OC, KH, KW)
      expect_same_as_with_the_cast_weight(low, x0, w0, [&](const Tensor& x, const Tensor& w) {
        if (op == 0) return ops::conv2d(x, w, b0, {});
        if (op == 1) return ops::conv2d_relu_max_pool2d(x, w, b0, {}, {.kernel = {2, 2}, .stride = {2, 2}});
        return ops::conv2d_transpose(x, w, Tensor(), {.stride = {2, 2}});
      });
    }
  // In training: no cast cache entry and no low copy for the convolution's weight (its bias has both).
  set_seed(5);
  auto net = std::make_shared<nn::SequentialCell>(std::vector<std::shared_ptr<nn::Cell>>{
      std::make_shared<nn::Conv2d>(3, 4, 3), std::make_shared<nn::ReLU>(), std::make_shared<nn::Flatten>(),
      std::make_shared<nn::Dense>(4 * 6 * 6, 2)});
  auto opt = std::make_shared<optim::Momentum>(net->trainable_params(), 0.01, 0.9);
  auto step = amp::build_train_network(net, opt, std::make_shared<nn::MSELoss>(), Level::kO2,
                                       {.low_dtype = DType::kBF16});
  Generator g(8);
  for (int i = 0; i < 2; ++i) (*step)(normal({5, 3, 6, 6}, 0, 1, g), normal({5, 2}, 0, 1, g));
  for (const auto& [name, param] : net->parameters_and_names()) {
    const bool bias = name.find("bias") != std::string::npos;
    EXPECT_EQ(param.impl().autograd->low_copy != nullptr, bias) << name;
  }
}

// Dense reads its FP32 weight rounded in its products at any number of rows (here 2048): the weight never
// goes through the cast cache, and the gradients — including the input gradient, whose product reads the
// weight rounded again — match O0's within bf16 tolerance.
TEST(CastCache, DenseReadsItsFp32WeightRoundedWithNoCast) {
  class Two : public nn::Cell {
   public:
    Two() : Cell("Two") {
      fc1 = register_cell("fc1", std::make_shared<nn::Dense>(16, 32));
      fc2 = register_cell("fc2", std::make_shared<nn::Dense>(32, 8));
    }
    Tensor construct(const Tensor& x) override { return fc2->call(ops::relu(fc1->call(x))); }
    std::shared_ptr<nn::Dense> fc1, fc2;
  };
  auto run = [](Level level, int64_t* misses) {
    set_seed(6);
    auto net = std::make_shared<Two>();
    auto opt = std::make_shared<optim::SGD>(net->trainable_params(), 0.0);
    // (.grad is read after the step)
    auto step = amp::build_train_network(net, opt, std::make_shared<nn::MSELoss>(), level,
                                         {.low_dtype = DType::kBF16, .optimizer_in_backward = false});
    Generator g(10);
    Tensor x = normal({2048, 16}, 0, 1, g), y = normal({2048, 8}, 0, 1, g);
    int64_t before = ops::cast_cache_misses();
    (*step)(x, y);
    *misses = ops::cast_cache_misses() - before;
    return std::vector<Tensor>{net->fc1->weight.grad().clone(), net->fc2->weight.grad().clone()};
  };
  int64_t misses_o0 = 0, misses_o2 = 0;
  auto ref = run(Level::kO0, &misses_o0);
  auto got = run(Level::kO2, &misses_o2);
  EXPECT_EQ(misses_o2, 2) << "only the two biases go through the cast cache";
  for (size_t t = 0; t < ref.size(); ++t) {
    double max_ref = 0, max_err = 0;
    for (int64_t i = 0; i < ref[t].numel(); ++i) {
      max_ref = std::max(max_ref, std::abs(ref[t].get(i)));
      max_err = std::max(max_err, std::abs(ref[t].get(i) - got[t].get(i)));
    }
    EXPECT_GT(max_ref, 0.0);
    EXPECT_LT(max_err, 0.03 * max_ref) << "weight gradient " << t << " at O2-bf16 against O0";
  }
}

// The fused Conv2d -> ReLU -> MaxPool2d op gives bit for bit the values and gradients of conv2d then
// relu_max_pool2d, at every level and low dtype (x, w and b all differentiated; 16 channels, odd sizes), and
// a custom white list naming only "Conv2d" lowers the fused op too.
TEST(FusedConvPool, MatchesTheTwoOpsBitForBitAtEveryLevel) {
  struct Setting {
    Level level;
    DType low;
    bool bf16_products = false;  // F16Products::kBf16 (where the CPU has the pair kernel)
  };
  for (Setting st : {Setting{Level::kO0, DType::kBF16}, Setting{Level::kO1, DType::kBF16},
                     Setting{Level::kO2, DType::kBF16}, Setting{Level::kO2, DType::kF16},
                     Setting{Level::kO3, DType::kF16}, Setting{Level::kO2, DType::kF16, true}}) {
    if (st.bf16_products && !kernels::cpu::gemm_has_bf16_dot()) continue;
    SCOPED_TRACE(std::string(amp::level_name(st.level)) + " " + std::string(dtype_name(st.low)) +
                 (st.bf16_products ? ", f16 products in bf16" : ""));
    F16ProductsScope products(st.bf16_products ? F16Products::kBf16 : F16Products::kExact);
    amp::AmpPolicy policy(st.level, st.low);
    ops::Conv2dOptions co;
    co.pad_mode = ops::PadMode::kPad;
    co.padding = {1, 1, 1, 1};
    ops::Pool2dOptions po;
    po.kernel = {2, 2};
    po.stride = {2, 2};
    auto run = [&](bool fused) {
      Generator g(77);
      Tensor x = normal({3, 5, 11, 9}, 0, 1, g), w = normal({16, 5, 3, 3}, 0, 0.3, g), b = normal({16}, 0, 0.1, g);
      for (Tensor* t : {&x, &w, &b}) t->set_requires_grad(true);
      Tensor y;
      {
        ops::PrecisionScope scope(st.level == Level::kO0 ? nullptr : &policy);
        y = fused ? ops::conv2d_relu_max_pool2d(x, w, b, co, po) : ops::relu_max_pool2d(ops::conv2d(x, w, b, co), po);
      }
      Tensor r = normal(y.shape(), 0, 1, g).to(y.dtype());
      autograd::backward(y, r);
      return std::vector<Tensor>{y.to(DType::kF32), x.grad(), w.grad(), b.grad()};
    };
    auto fused = run(true), two = run(false);
    const char* names[] = {"y", "dx", "dw", "db"};
    for (size_t i = 0; i < fused.size(); ++i) {
      ASSERT_EQ(fused[i].shape(), two[i].shape()) << names[i];
      ASSERT_EQ(fused[i].dtype(), two[i].dtype()) << names[i];
      EXPECT_EQ(std::memcmp(fused[i].raw_data(), two[i].raw_data(), fused[i].nbytes()), 0) << names[i];
    }
  }
  amp::AmpPolicy conv_only(amp::AmpPolicy::Mode::kWhiteList, amp::ops_from_names({"Conv2d"}), DType::kBF16);
  EXPECT_EQ(conv_only.compute_dtype(ops::Op::kConv2dReluMaxPool2d, DType::kF32), DType::kBF16);
  EXPECT_TRUE(conv_only.outputs_to_fp32(ops::Op::kConv2dReluMaxPool2d));
}

// The data batch (f32, no gradient) of a convolution computed in bf16 or f16 is read by the kernels as the
// low dtype's values (the cast fused into the read): no Cast of it runs, and the output and the weight and
// bias gradients are bit for bit those of the same layer on the batch cast first. Both the convolution and
// the fused Conv2d -> ReLU -> MaxPool2d, on A's first-layer geometry (the direct kernels' choice) and a
// 5-channel one, twice (a geometry's first call measures its kernels).
TEST(DataBatch, IsReadAsTheLowDtypeWithNoCastAndTheCastsValues) {
  ops::Pool2dOptions po;
  po.kernel = {2, 2};
  po.stride = {2, 2};
  for (Level level : {Level::kO1, Level::kO2, Level::kO3})
  for (DType low : {DType::kBF16, DType::kF16})
  for (int64_t c : {3, 5})
  for (bool fused : {true, false}) {
    SCOPED_TRACE(std::string(amp::level_name(level)) + " " + std::string(dtype_name(low)) + " " +
                 std::to_string(c) + " channels" + (fused ? ", fused" : ""));
    amp::AmpPolicy policy(level, low);
    auto run = [&](bool cast_first) {
      Generator g(78);
      Tensor x = normal({4, c, 12, 12}, 0, 1, g), w = normal({8, c, 3, 3}, 0, 0.3, g), b = normal({8}, 0, 0.1, g);
      x.set(0, 1.0 + std::ldexp(1.0, -8));  // a tie in bf16
      x.set(1, 70000.0);                     // past f16's range
      if (cast_first) x = x.to(low);
      for (Tensor* t : {&w, &b}) t->set_requires_grad(true);
      Tensor y;
      {
        ops::PrecisionScope scope(&policy);
        y = fused ? ops::conv2d_relu_max_pool2d(x, w, b, {}, po) : ops::conv2d(x, w, b, {});
      }
      Tensor r = normal(y.shape(), 0, 1, g).to(y.dtype());
      autograd::backward(y, r);
      return std::vector<Tensor>{y.to(DType::kF32), w.grad(), b.grad()};
    };
    for (int call = 0; call < 2; ++call) {
      std::vector<Tensor> fused_read;
      {
        ops::OpTrace trace;
        fused_read = run(false);
        for (const auto& rec : trace.of(Op::kCast))
          EXPECT_NE(rec.input_shapes[0], (Shape{4, c, 12, 12})) << "the batch was cast\n" << trace.to_string();
      }
      const std::vector<Tensor> cast_first = run(true);
      const char* names[] = {"y", "dw", "db"};
      for (size_t i = 0; i < fused_read.size(); ++i) {
        ASSERT_EQ(fused_read[i].dtype(), cast_first[i].dtype()) << names[i];
        EXPECT_EQ(std::memcmp(fused_read[i].raw_data(), cast_first[i].raw_data(), fused_read[i].nbytes()), 0)
            << names[i] << ", call " << call;
      }
    }
  }
}

// The same for a Dense layer reading the batch (model C's first layer): its products read the batch rounded
// as they pack it (DenseParams::x_round) in forward and in the weight gradient, and no Cast of it runs. Its
// products are tuned as what they are (an f32 operand read rounded: oneDNN's candidate pays for a rounded
// copy), so the kernel, and with it the order of the sums, may differ from the cast batch's: on oneDNN's
// kernels (which get the rounded copy) y, dW and db are bit for bit the layer's on the batch cast first; on
// the kernels each shape picks they are the same within the products' tolerance. With and without a fused
// ReLU; many outputs and 10 (demi-dot's shape).
TEST(DataBatch, IsReadByDenseAsTheLowDtypeWithNoCastAndTheCastsValues) {
  for (kernels::MatmulPolicy matmul : {kernels::MatmulPolicy::kOnednn, kernels::MatmulPolicy::kAuto})
  for (Level level : {Level::kO1, Level::kO2})
  for (DType low : {DType::kBF16, DType::kF16})
  for (int64_t out : {64, 10})
  for (bool relu : {false, true}) {
    SCOPED_TRACE(std::string(amp::level_name(level)) + " " + std::string(dtype_name(low)) + " " +
                 std::to_string(out) + " outputs" + (relu ? ", relu" : "") +
                 (matmul == kernels::MatmulPolicy::kOnednn ? ", oneDNN's kernels" : ""));
    kernels::set_matmul_policy(matmul);
    amp::AmpPolicy policy(level, low);
    auto run = [&](bool cast_first) {
      Generator g(79);
      Tensor x = normal({48, 100}, 0, 1, g), w = normal({out, 100}, 0, 0.1, g), b = normal({out}, 0, 0.1, g);
      x.set(0, 1.0 + std::ldexp(1.0, -8));  // a tie in bf16
      if (cast_first) x = x.to(low);
      for (Tensor* t : {&w, &b}) t->set_requires_grad(true);
      Tensor y;
      {
        ops::PrecisionScope scope(&policy);
        y = ops::dense(x, w, b, relu);
      }
      Tensor r = normal(y.shape(), 0, 1, g).to(y.dtype());
      autograd::backward(y, r);
      return std::vector<Tensor>{y.to(DType::kF32), w.grad().to(DType::kF32), b.grad().to(DType::kF32)};
    };
    for (int call = 0; call < 2; ++call) {
      std::vector<Tensor> fused_read;
      {
        ops::OpTrace trace;
        fused_read = run(false);
        for (const auto& rec : trace.of(Op::kCast))
          EXPECT_NE(rec.input_shapes[0], (Shape{48, 100})) << "the batch was cast\n" << trace.to_string();
      }
      const std::vector<Tensor> cast_first = run(true);
      const char* names[] = {"y", "dw", "db"};
      for (size_t i = 0; i < fused_read.size(); ++i) {
        if (matmul == kernels::MatmulPolicy::kOnednn) {
          EXPECT_EQ(std::memcmp(fused_read[i].raw_data(), cast_first[i].raw_data(), fused_read[i].nbytes()), 0)
              << names[i] << ", call " << call;
          continue;
        }
        // Other sums of the same products: apart by an ulp of the stored dtype at most (bf16: 2^-8 relative).
        for (int64_t j = 0; j < fused_read[i].numel(); ++j)
          ASSERT_NEAR(fused_read[i].get(j), cast_first[i].get(j), 1e-2 * std::abs(cast_first[i].get(j)) + 1e-3)
              << names[i] << "[" << j << "], call " << call;
      }
    }
  }
  kernels::set_matmul_policy(kernels::MatmulPolicy::kAuto);
}

// A network whose true gradients are ~1e-8: below FP16's smallest subnormal (6e-8) they flush to zero
// without loss scaling; with it, O2-fp16 matches O0.
class Tiny : public nn::Cell {
 public:
  Tiny() : Cell("Tiny") {
    fc = register_cell("fc", std::make_shared<nn::Dense>(16, 4, nn::DenseOptions{.has_bias = false}));
  }
  Tensor construct(const Tensor& x) override { return fc->call(x); }
  std::shared_ptr<nn::Dense> fc;
};

// loss = 1e-8 * sum(logits): every logit's gradient is 1e-8, which FP16 flushes to zero.
class TinySumLoss : public nn::LossCell {
 public:
  explicit TinySumLoss(double scale = 1e-8) : LossCell("TinySumLoss"), scale_(scale) {}
  Tensor construct(const Tensor& logits, const Tensor&) override { return ops::mul_scalar(ops::sum(logits), scale_); }

 private:
  double scale_;
};

struct TinyRun {
  Tensor weight_before, weight_after;
  bool any_grad_nonzero;
};

TinyRun run_tiny(Level level, std::shared_ptr<amp::LossScaleManager> manager, bool no_scale) {
  set_seed(5);
  auto net = std::make_shared<Tiny>();
  Tensor w0 = net->fc->weight.clone();
  auto opt = std::make_shared<optim::SGD>(net->trainable_params(), 1e6);
  amp::TrainOptions o;
  o.low_dtype = DType::kF16;
  o.loss_scale_manager = manager;
  o.no_loss_scale = no_scale;
  o.optimizer_in_backward = false;  // .grad is read after the step
  auto step = amp::build_train_network(net, opt, std::make_shared<TinySumLoss>(), level, o);
  Generator g(9);
  Tensor x = uniform({8, 16}, 0.5, 1.0, g);
  amp::StepResult r = (*step)(x, zeros({8, 4}));
  EXPECT_FALSE(r.overflow);
  Tensor g_w = net->fc->weight.grad();
  bool nonzero = false;
  for (int64_t i = 0; i < g_w.numel(); ++i) nonzero = nonzero || g_w.get(i) != 0;
  return {w0, net->fc->weight.clone(), nonzero};
}

TEST(LossScaling, TinyGradientsUnderflowWithoutScalingAndTrainWithIt) {
  TinyRun o0 = run_tiny(Level::kO0, nullptr, true);
  TinyRun unscaled = run_tiny(Level::kO3, nullptr, true);
  TinyRun scaled = run_tiny(Level::kO3, std::make_shared<amp::FixedLossScaleManager>(65536.0, true), false);
  ASSERT_TRUE(o0.any_grad_nonzero);
  EXPECT_FALSE(unscaled.any_grad_nonzero) << "fp16 gradients of ~1e-8 must flush to zero without a loss scale";
  for (int64_t i = 0; i < o0.weight_after.numel(); ++i)
    EXPECT_EQ(unscaled.weight_after.get(i), unscaled.weight_before.get(i)) << "weights must not move";
  ASSERT_TRUE(scaled.any_grad_nonzero);
  double max_rel = 0;
  for (int64_t i = 0; i < o0.weight_after.numel(); ++i) {
    double d0 = o0.weight_after.get(i) - o0.weight_before.get(i);
    double ds = scaled.weight_after.get(i) - scaled.weight_before.get(i);
    max_rel = std::max(max_rel, std::abs(ds - d0) / std::max(std::abs(d0), 1e-3));
  }
  EXPECT_LT(max_rel, 0.05) << "the scaled fp16 update must match O0's closely";
}

// Overflow: an injected Inf gradient skips exactly that step and halves a dynamic scale.
TEST(LossScaling, InjectedOverflowSkipsTheStepAndBacksOff) {
  set_seed(6);
  auto net = std::make_shared<Tiny>();
  auto opt = std::make_shared<optim::Momentum>(net->trainable_params(), 0.1, 0.9);
  auto manager = std::make_shared<amp::DynamicLossScaleManager>(1024.0, 2.0, 3);
  auto step = amp::build_train_network(net, opt, std::make_shared<nn::MSELoss>(), Level::kO2,
                                       {.low_dtype = DType::kF16, .loss_scale_manager = manager});
  Generator g(1);
  Tensor x = uniform({4, 16}, -1, 1, g), y = uniform({4, 4}, -1, 1, g);
  (*step)(x, y);  // one clean step, so the optimizer has state
  EXPECT_EQ(opt->global_step(), 1);
  Tensor w = net->fc->weight.clone();
  Tensor moments = opt->state()[0].second.clone();
  Tensor bad = x.clone();
  bad.set(0, std::numeric_limits<float>::infinity());
  amp::StepResult r = (*step)(bad, y);
  EXPECT_TRUE(r.overflow);
  EXPECT_TRUE(r.skipped);
  EXPECT_EQ(r.loss_scale, 1024.0);
  EXPECT_EQ(r.first_nonfinite, "fc.weight");
  EXPECT_EQ(manager->get_loss_scale(), 512.0) << "an overflow halves the scale";
  EXPECT_EQ(opt->global_step(), 1) << "the step counter is untouched";
  for (int64_t i = 0; i < w.numel(); ++i) ASSERT_EQ(net->fc->weight.get(i), w.get(i)) << "weights untouched";
  for (int64_t i = 0; i < moments.numel(); ++i) ASSERT_EQ(opt->state()[0].second.get(i), moments.get(i));
  // The scale grows back after scale_window (3) clean steps.
  for (int i = 0; i < 3; ++i) EXPECT_FALSE((*step)(x, y).overflow);
  EXPECT_EQ(manager->get_loss_scale(), 1024.0);
  EXPECT_EQ(opt->global_step(), 4);
}

TEST(LossScaling, ConsecutiveOverflowsRaiseNamingTheParameter) {
  set_seed(7);
  auto net = std::make_shared<Tiny>();
  auto opt = std::make_shared<optim::SGD>(net->trainable_params(), 0.1);
  auto manager = std::make_shared<amp::DynamicLossScaleManager>(8.0, 2.0, 100);
  manager->set_max_consecutive_overflows(5);
  auto step = amp::build_train_network(net, opt, std::make_shared<nn::MSELoss>(), Level::kO2,
                                       {.low_dtype = DType::kF16, .loss_scale_manager = manager});
  Tensor x = full({2, 16}, std::numeric_limits<float>::quiet_NaN()), y = zeros({2, 4});
  try {
    for (int i = 0; i < 10; ++i) (*step)(x, y);
    FAIL() << "expected an error after 5 overflowing steps";
  } catch (const Error& e) {
    std::string what = e.what();
    EXPECT_NE(what.find("5 steps in a row"), std::string::npos) << what;
    EXPECT_NE(what.find("fc.weight"), std::string::npos) << what;
  }
  EXPECT_EQ(manager->get_loss_scale(), 1.0) << "the floor (min_scale 1) holds";
}

// The seed's configuration: O2, FixedLossScaleManager(1024, drop_overflow_update=false), Momentum(0.01,
// 0.9) trains model A as O0 does, step for step (the gradients are unscaled before the update, unlike
// MindSpore). On N(0, 1) images this learning rate makes the loss swing (PyTorch's twin does the same),
// so the comparison is over the first steps; a lower rate shows the loss falling at both levels.
std::vector<float> train_model_a(amp::Level level, double lr, int epochs, const std::vector<Batch>& data) {
  set_seed(12);
  auto net = std::make_shared<nn::SimpleCNN>();
  auto opt = std::make_shared<optim::Momentum>(net->trainable_params(), lr, 0.9);
  amp::TrainOptions o;
  o.low_dtype = DType::kF16;
  if (level != Level::kO0) o.loss_scale_manager = std::make_shared<amp::FixedLossScaleManager>(1024.0, false);
  auto step = amp::build_train_network(net, opt, std::make_shared<nn::SoftmaxCrossEntropyWithLogits>(true, "mean"),
                                       level, o);
  std::vector<float> losses;
  for (int epoch = 0; epoch < epochs; ++epoch)
    for (const auto& b : data) losses.push_back((*step)(b.x, b.y).loss);
  return losses;
}

TEST(SeedConfiguration, O2WithFixedScaleTrainsModelALikeO0) {
  auto data = seed_batches(6, 32, 11);
  auto o0 = train_model_a(Level::kO0, 0.01, 1, data);
  auto o2 = train_model_a(Level::kO2, 0.01, 1, data);
  for (size_t i = 0; i < o0.size(); ++i) EXPECT_NEAR(o2[i], o0[i], 0.02 + 0.02 * o0[i]) << "step " << i;
}

TEST(SeedConfiguration, ModelALossFallsAtO0AndO2) {
  auto data = seed_batches(4, 32, 13);
  for (Level level : {Level::kO0, Level::kO2}) {
    auto losses = train_model_a(level, 0.001, 5, data);
    float first = (losses[0] + losses[1] + losses[2] + losses[3]) / 4;
    size_t n = losses.size();
    float last = (losses[n - 1] + losses[n - 2] + losses[n - 3] + losses[n - 4]) / 4;
    EXPECT_LT(last, 0.75f * first) << amp::level_name(level) << ": first epoch " << first << ", last " << last;
  }
}

// F16Products::kBf16, end to end on real data: model C (the MLP) and model B (LeNet: its fused
// convolution layers) trained at O2-fp16 with their dynamic loss scale on Fashion-MNIST, from one seed on
// the same batches, once with exact f16 products and once with them rounded to bf16. The option is real
// (the losses differ from the first step on), training still works with it (the loss falls as far, within
// a margin, and the held-out accuracy is no more than two points worse), and setting it back gives the exact
// run again, bit for bit.
class F16ProductsTraining : public testing::TestWithParam<const char*> {};

TEST_P(F16ProductsTraining, TrainsOnFashionMnistWithItsProductsInBf16) {
  if (!kernels::cpu::gemm_has_bf16_dot()) GTEST_SKIP() << "no AVX512-BF16: the setting is refused (kernels test)";
  const char* dir = "/usr/share/datasets/fashion-mnist";
  ASSERT_TRUE(std::filesystem::exists(dir)) << "Fashion-MNIST missing: scripts/setup installs dataset-fashion-mnist";
  data::MnistDataset train(dir, "train");
  constexpr int64_t kBatch = 64, kSteps = 60, kTest = 1000, kPer = 28 * 28;
  auto images = [&](int64_t first, int64_t n) {
    Tensor x = empty({n, 1, 28, 28});
    Tensor y = empty({n}, DType::kI32);
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t k = 0; k < kPer; ++k)
        x.data<float>()[i * kPer + k] = train.images().data<uint8_t>()[(first + i) * kPer + k] / 255.0f;
      y.data<int32_t>()[i] = train.labels().data<int32_t>()[first + i];
    }
    return std::make_pair(x, y);
  };
  const auto [test_x, test_y] = images(kBatch * kSteps, kTest);  // held out: after the training batches
  struct Run {
    std::vector<float> losses;
    double accuracy = 0;
  };
  auto run = [&](F16Products products) {
    set_seed(21);
    std::shared_ptr<nn::Cell> net;
    if (std::string(GetParam()) == "C")
      net = std::make_shared<nn::MLP>();
    else
      net = std::make_shared<nn::LeNet>();
    auto opt = std::make_shared<optim::Momentum>(net->trainable_params(), 0.05, 0.9);
    amp::TrainOptions o;
    o.low_dtype = DType::kF16;
    o.f16_products = products;  // the AMP option: in force in each step's forward and backward
    auto step = amp::build_train_network(net, opt, std::make_shared<nn::SoftmaxCrossEntropyWithLogits>(true, "mean"),
                                         Level::kO2, o);
    EXPECT_EQ(f16_products(), F16Products::kExact) << "the option must not leak out of the steps";
    Run r;
    for (int64_t s = 0; s < kSteps; ++s) {
      const auto [x, y] = images(s * kBatch, kBatch);
      r.losses.push_back((*step)(x, y).loss);
    }
    F16ProductsScope scope(products);  // the evaluation multiplies as the training did
    Tensor logits = net->construct(test_x).to(DType::kF32);
    int64_t right = 0;
    for (int64_t i = 0; i < kTest; ++i) {
      const float* row = logits.data<float>() + i * 10;
      right += std::max_element(row, row + 10) - row == test_y.data<int32_t>()[i];
    }
    r.accuracy = static_cast<double>(right) / kTest;
    return r;
  };
  const Run exact = run(F16Products::kExact);
  const Run bf16 = run(F16Products::kBf16);
  const Run again = run(F16Products::kExact);
  EXPECT_EQ(again.losses, exact.losses);
  EXPECT_NE(bf16.losses[0], exact.losses[0]);
  auto mean = [](const std::vector<float>& v, size_t b, size_t e) {
    double t = 0;
    for (size_t i = b; i < e; ++i) t += v[i];
    return t / static_cast<double>(e - b);
  };
  const double first = mean(exact.losses, 0, 5), last_exact = mean(exact.losses, kSteps - 10, kSteps),
               last_bf16 = mean(bf16.losses, kSteps - 10, kSteps);
  EXPECT_LT(last_exact, 0.5 * first);
  EXPECT_NEAR(last_bf16, last_exact, 0.1 * last_exact) << "first " << first;
  EXPECT_GT(exact.accuracy, 0.6);
  EXPECT_GT(bf16.accuracy, exact.accuracy - 0.02);  // (model B's bf16 run, 60 steps in, is 6 points ahead)
}

INSTANTIATE_TEST_SUITE_P(Models, F16ProductsTraining, testing::Values("C", "B"),
                         [](const testing::TestParamInfo<const char*>& model) {
                           return std::string("Model") + model.param;
                         });

// F16Products::kBf16 reaches the convolution layers: at O2-fp16, conv2d (with and without its fused ReLU)
// and conv2d_transpose give the outputs and gradients of the same layers run in FP32 on their f16 operands
// rounded to bf16 (x, w and the output's gradient; the bias as it is), up to the summation order: f16
// outputs (y, dx) at most an f16 step from the reference rounded to f16, FP32 ones (dw, db) within it too.
// The exact setting misses that reference (its products see 11 bits), so the comparison can fail. The
// data batch (x needing no gradient, recast for the weight gradient) takes the same f32 -> f16 -> bf16
// rounding. (The fused Conv2d -> ReLU -> MaxPool2d is these layers' values bit for bit: FusedConvPool.)
TEST(F16Products, ConvolutionsMultiplyTheirF16ValuesAsBf16) {
  if (!kernels::cpu::gemm_has_bf16_dot()) GTEST_SKIP() << "no AVX512-BF16: the setting is refused (kernels test)";
  enum class Kind { kConv, kConvRelu, kTranspose };
  struct Case {
    Kind kind;
    int64_t c;    // input channels (5: the direct kernels' geometry, 8: the products')
    bool x_grad;  // whether x (an FP32 leaf) needs its gradient
  };
  struct Out {
    Tensor y, dx, dw, db;
  };
  amp::AmpPolicy policy(Level::kO2, DType::kF16);
  auto layer = [](Kind kind, const Tensor& x, const Tensor& w, const Tensor& b) {
    ops::Conv2dOptions co;
    co.pad_mode = ops::PadMode::kPad;
    co.padding = {1, 1, 1, 1};
    co.relu = kind == Kind::kConvRelu;
    if (kind == Kind::kTranspose) return ops::conv2d_transpose(x, w, Tensor(), {.stride = {2, 2}});
    return ops::conv2d(x, w, b, co);
  };
  // One run from seed 91: at O2-fp16 under `products`, or (reference) in FP32 on the rounded operands.
  auto run = [&](const Case& k, std::optional<F16Products> products) {
    const bool reference = !products.has_value();
    auto rounded = [&](const Tensor& t) { return reference ? t.to(DType::kF16).to(DType::kBF16).to(DType::kF32) : t; };
    Generator g(91);
    const bool t = k.kind == Kind::kTranspose;
    Tensor x = rounded(normal({3, k.c, 12, 10}, 0, 1, g));
    Tensor w = rounded(normal(t ? Shape{k.c, 16, 3, 3} : Shape{16, k.c, 3, 3}, 0, 0.3, g));
    Tensor b = normal({16}, 0, 0.1, g);
    if (reference) b = b.to(DType::kF16).to(DType::kF32);
    x.set_requires_grad(k.x_grad);
    w.set_requires_grad(true);
    b.set_requires_grad(!t);
    Tensor y;
    std::optional<F16ProductsScope> in_force;
    if (products) in_force.emplace(*products);
    {
      ops::PrecisionScope scope(reference ? nullptr : &policy);
      y = layer(k.kind, x, w, b);
    }
    Tensor r = normal(y.shape(), 0, 1, g).to(DType::kF16);
    autograd::backward(y, reference ? r.to(DType::kBF16).to(DType::kF32) : r);
    in_force.reset();
    auto f16_of = [&](const Tensor& v) { return reference ? v.to(DType::kF16).to(DType::kF32) : v.to(DType::kF32); };
    return Out{f16_of(y), k.x_grad ? f16_of(x.grad()) : Tensor(), w.grad(), t ? Tensor() : b.grad()};
  };
  // Elements of got further from want than one step of got's dtype (2^-10 relative for f16, 2^-7 for bf16:
  // O2 keeps the parameters' gradients in bf16) plus 1e-5 of the largest magnitude (summation order).
  auto misses = [](const Tensor& got, const Tensor& want) {
    const int step = got.dtype() == DType::kBF16 ? -7 : -10;
    double largest = 0;
    for (int64_t i = 0; i < want.numel(); ++i) largest = std::max(largest, std::abs(want.get(i)));
    int64_t n = 0;
    for (int64_t i = 0; i < want.numel(); ++i)
      n += std::abs(got.get(i) - want.get(i)) > std::ldexp(std::abs(want.get(i)), step) + 1e-5 * largest;
    return n;
  };
  for (const Case& k : {Case{Kind::kConv, 5, true}, Case{Kind::kConv, 8, true}, Case{Kind::kConv, 5, false},
                        Case{Kind::kConvRelu, 8, true}, Case{Kind::kConvRelu, 5, false},
                        Case{Kind::kTranspose, 8, true}}) {
    SCOPED_TRACE(std::string(k.kind == Kind::kConv ? "conv2d" : k.kind == Kind::kConvRelu ? "conv2d+relu" : "conv2d_transpose") +
                 " c=" + std::to_string(k.c) + (k.x_grad ? "" : ", x needs no gradient"));
    const Out want = run(k, std::nullopt), got = run(k, F16Products::kBf16),
              exact = run(k, F16Products::kExact);
    EXPECT_EQ(misses(got.y, want.y), 0) << "y";
    EXPECT_EQ(misses(got.dw, want.dw), 0) << "dw";
    if (got.db.defined()) {
      EXPECT_EQ(misses(got.db, want.db), 0) << "db";
    }
    if (k.x_grad) {
      EXPECT_EQ(misses(got.dx, want.dx), 0) << "dx";
      EXPECT_GT(misses(exact.dx, want.dx), 0) << "the exact products are not the reference's";
    }
    EXPECT_GT(misses(exact.y, want.y), want.y.numel() / 10) << "the exact products are not the reference's";
  }
}

// The numerics report names the layer whose activations leave FP16's range and the gradients that
// underflow at a given scale.
TEST(Numerics, ReportFindsTheOverflowingLayerAndTheUnderflowingGradients) {
  set_seed(21);
  auto net = std::make_shared<nn::SimpleCNN>();
  amp::auto_mixed_precision(*net, Level::kO2, DType::kF16);
  Generator g(3);
  Tensor x = ops::mul_scalar(normal({4, 3, 32, 32}, 0, 1, g), 3e4);  // conv outputs far beyond 65504
  std::vector<int32_t> l = {1, 2, 3, 4};
  nn::SoftmaxCrossEntropyWithLogits loss(true, "mean");
  amp::NumericsReport r = amp::analyze_numerics(*net, loss, x, from_vector(l, {4}), 1.0);
  std::string text = r.to_string();
  bool conv_flagged = false;
  for (const auto& a : r.activations)
    if (a.path == "conv1") conv_flagged = a.exceeds_fp16;
  EXPECT_TRUE(conv_flagged) << text;
  EXPECT_NE(text.find("overflows in FP16"), std::string::npos) << text;
  ASSERT_EQ(r.gradients.size(), 3u);
  EXPECT_EQ(net->fc->weight.grad().defined(), false) << "the analysis leaves the gradients as they were";

  // Weight gradients of ~6e-10 (below FP16's 6e-8): all underflow at scale 1, none at 65536.
  auto tiny = std::make_shared<Tiny>();
  TinySumLoss tl(1e-10);
  Tensor xs = uniform({8, 16}, 0.5, 1.0, g);
  auto r1 = amp::analyze_numerics(*tiny, tl, xs, zeros({8, 4}), 1.0);
  auto r2 = amp::analyze_numerics(*tiny, tl, xs, zeros({8, 4}), 65536.0);
  EXPECT_GT(r1.gradients[0].underflow_fraction, 0.99) << r1.to_string();
  EXPECT_EQ(r2.gradients[0].underflow_fraction, 0.0) << r2.to_string();
}

// Fused layers report their own outputs: LeNet's Conv2d -> ReLU -> MaxPool2d runs as one fused op in
// training, but the report runs them one by one, so the ReLU and the pool are not 0 and the conv's value
// is its own output (which, before ReLU, holds negative values the pool's output cannot).
TEST(Numerics, FusedLayersReportTheirOwnOutputs) {
  set_seed(5);
  auto net = std::make_shared<nn::LeNet>();
  Generator g(8);
  Tensor x = normal({4, 1, 28, 28}, 0, 1, g);
  nn::SoftmaxCrossEntropyWithLogits loss(true, "mean");
  amp::NumericsReport r = amp::analyze_numerics(*net, loss, x, from_vector(std::vector<int32_t>{1, 2, 3, 4}, {4}), 1.0);
  std::map<std::string, double> m;
  for (const auto& a : r.activations) m[a.path] = a.max_abs;
  ASSERT_TRUE(m.count("features.0") && m.count("features.1") && m.count("features.2")) << r.to_string();
  EXPECT_GT(m["features.1"], 0) << "ReLU inside the fused conv" << r.to_string();
  EXPECT_GT(m["features.2"], 0) << "MaxPool2d inside the fused conv" << r.to_string();
  // The conv's own largest |output| is at least the ReLU's (ReLU only zeroes negatives).
  EXPECT_GE(m["features.0"], m["features.1"]);
  // And the conv's value is its own output: the cell called alone (unfused) gives the same largest |y|.
  nn::Cell* conv = nullptr;
  for (auto& [path, cell] : net->cells_and_names())
    if (path == "features.0") conv = cell;
  ASSERT_NE(conv, nullptr);
  autograd::NoGradGuard no_grad;
  Tensor y = conv->call(x);
  double expect = 0;
  for (float v : y.to_vector()) expect = std::max(expect, static_cast<double>(std::fabs(v)));
  EXPECT_NEAR(m["features.0"], expect, 1e-6 * expect);
}

// O2 keeps BatchNorm in FP32 without casting its input and output: a float16/bfloat16 input is read as
// is and the output written in it, with exactly the values (forward and backward) of the cast → FP32
// BatchNorm → cast chain it replaces, and no full-size FP32 tensor.
TEST(MixedBatchNorm, O2ReadsAndWritesTheLowDtypeWithTheValuesOfTheCastChain) {
  for (DType low : {DType::kBF16, DType::kF16}) {
    SCOPED_TRACE(dtype_name(low));
    Generator g(17);
    Tensor x32 = normal({4, 6, 5, 5}, 0.5, 2.0, g);
    Tensor gy32 = normal({4, 6, 5, 5}, 0, 1, g);
    Tensor gamma = uniform({6}, 0.5, 1.5, g), beta = normal({6}, 0, 1, g);
    auto run = [&](bool mixed, Tensor* dx) {
      Tensor x = x32.to(low);
      x.set_requires_grad(true);
      Tensor rm = zeros({6}), rv = ones({6});
      Tensor y;
      ops::OpTrace trace;
      if (mixed) {
        amp::AmpPolicy o2(Level::kO2, low);
        ops::PrecisionScope scope(&o2);
        y = ops::batch_norm(x, gamma, beta, rm, rv, {});
      } else {
        y = ops::cast(ops::batch_norm(ops::cast(x, DType::kF32), gamma, beta, rm, rv, {}), low);
      }
      int64_t full_casts = 0;
      for (const auto& r : trace.records())
        if (r.op == Op::kCast && r.output_shape == x.shape()) ++full_casts;
      EXPECT_EQ(full_casts, mixed ? 0 : 2);
      EXPECT_EQ(y.dtype(), low);
      autograd::backward(y, gy32.to(low));
      *dx = x.grad();
      return std::vector<Tensor>{y, rm, rv};
    };
    Tensor dx_mixed, dx_chain;
    auto a = run(true, &dx_mixed);
    auto b = run(false, &dx_chain);
    for (size_t i = 0; i < a.size(); ++i)
      EXPECT_EQ(std::memcmp(a[i].raw_data(), b[i].raw_data(), a[i].nbytes()), 0) << "output " << i;
    ASSERT_EQ(dx_mixed.dtype(), dx_chain.dtype());
    EXPECT_EQ(std::memcmp(dx_mixed.raw_data(), dx_chain.raw_data(), dx_mixed.nbytes()), 0) << "dx";
  }
}

// The profiler is a process-wide observer: it times forward and backward calls while enabled and
// sees nothing once disabled. Convolutions report their FLOPs to observers.
TEST(Observers, TheProfilerTimesBothDirectionsOnlyWhileEnabledAndConvsReportTheirFlops) {
  struct Flops : ops::OpObserver {
    void on_op(const ops::OpEvent& e) override {
      if (e.op == Op::kConv2d && !e.backward) conv_flops = e.flops;
    }
    int64_t conv_flops = -1;
  } flops;
  Generator g(9);
  Tensor w = normal({4, 3, 3, 3}, 0, 0.1, g);
  w.set_requires_grad(true);
  Tensor x = normal({2, 3, 8, 8}, 0, 1, g);
  auto run = [&] {
    Tensor y = ops::conv2d(x, w, Tensor(), {});
    autograd::backward(ops::sum(y));
  };
  ops::reset_profile();
  ops::set_profiling(true);
  {
    ops::OpObserverScope observe(&flops);
    run();
  }
  ops::set_profiling(false);
  auto calls = [](bool backward) {
    for (const auto& r : ops::profile_rows())
      if (r.op == Op::kConv2d && r.backward == backward) return r.calls;
    return int64_t{0};
  };
  EXPECT_EQ(calls(false), 1);
  EXPECT_EQ(calls(true), 1);
  // 2 x (N·OC·OH·OW) x (C·KH·KW): a 3x3 convolution with the default 'same' padding keeps 8x8.
  EXPECT_EQ(flops.conv_flops, 2 * (2 * 4 * 8 * 8) * (3 * 3 * 3));
  run();
  EXPECT_EQ(calls(false), 1) << "nothing is recorded once profiling is off";
  EXPECT_NE(ops::profile_report().find("Conv2d"), std::string::npos);
}

}  // namespace
}  // namespace demi
