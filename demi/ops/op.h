// The op table: every op demi runs, with its name, its AMP class and whether it has a backward rule.
//
// Written as data and checked by static_assert: adding an Op enumerator without its table row fails to
// compile, and tests/op_sweep_test.cc holds one test case per op (also checked against kNumOps), so a new
// op cannot land without its name, its backward rule and its test.
//
// How to add an op — the checklist (an elementwise activation such as GELU, in 8 files):
//   1. here: the Op enumerator (before kRecompute, the last) and its kOpTable row — name, AmpClass (how each
//      AMP level computes it: white, gray, black, fp32 or follow) and whether it is differentiable.
//      Forgotten: does not compile (op_table_in_enum_order).
//   2. demi/ops/ops.h: the function users call, with what it computes and its dtypes.
//   3. demi/ops/<family>.cc (activation.cc): the forward through ops::Dispatch (the AMP cast, the observer
//      event, graph mode's trace come with it) and the backward rule, an autograd node beside it.
//   4. demi/kernels/reference/<family>.{h,cc}: the scalar reference kernel (forward and backward), kept
//      forever as the oracle; for an activation, its Activation enumerator (kNumActivations is derived).
//   5. demi/kernels/cpu/internal/<family>_impl.h: the vector-generic fast kernel, once; every ISA variant is
//      instantiated from it by the registry (demi/core/kernel_registry.h). Forgotten: the static_assert on
//      kNumActivations there fails.
//   6. demi/kernels/cpu/<family>_test.cc: the fast kernel against the reference, per dtype and CPU level.
//   7. tests/op_sweep_test.cc: its sweep row — inputs, which inputs get gradients, per-dtype tolerances.
//      Forgotten: does not compile (the sweep's static_assert against kNumOps); the row runs forward against
//      the f64 reference, backward against f64 finite differences, and low precision against f32.
//   8. a layer, if users call it as one (demi/nn/layers.h: a Cell whose construct calls the op).
// A fused op (Conv2d -> ReLU -> MaxPool2d) also registers its fusion in demi/nn/call_fusion.cc; an op with
// a fast kernel family of its own adds the family to the registry (DEMI_KERNEL_FAMILIES).
#pragma once

#include <array>
#include <cstdint>
#include <string_view>

namespace demi::ops {

enum class Op : uint16_t {
  kCast,
  kReshape,
  kAdd,
  kSub,
  kMul,
  kDiv,
  kNeg,
  kAddScalar,
  kMulScalar,
  kMatmul,
  kBatchMatmul,
  kDense,
  kConv2d,
  kMaxPool2d,
  kAvgPool2d,
  kReluMaxPool2d,
  kRelu,
  kSigmoid,
  kTanh,
  kGelu,
  kSilu,
  kSum,
  kMean,
  kMax,
  kArgmax,
  kSoftmax,
  kLogSoftmax,
  kSoftmaxCrossEntropy,
  kMseLoss,
  kBatchNorm,
  kDropout,
  kEmbedding,
  kLayerNorm,
  kTranspose,
  kSplit,
  kAttention,
  kConv2dReluMaxPool2d,
  kConcat,
  kConv2dTranspose,
  kRecompute,
};
inline constexpr int kNumOps = static_cast<int>(Op::kRecompute) + 1;

// How automatic mixed precision treats an op (demi/amp turns a level into a compute dtype per class).
enum class AmpClass : uint8_t {
  kWhite,   // MindSpore's O1 white list: low precision from O1 up (conv, dense, matmul, relu)
  kGray,    // low precision from O2 up (elementwise, pooling, activations, softmax, dropout)
  kBlack,   // FP32 at O1 and O2, low precision only at O3 (batch norm)
  kFp32,    // always FP32 whatever the level (the losses)
  kFollow,  // no compute of its own: runs in its input's dtype (reshape, cast, argmax)
};

struct OpInfo {
  Op op;
  std::string_view name;
  AmpClass amp;
  bool differentiable;
};

inline constexpr std::array<OpInfo, kNumOps> kOpTable = {{
    {Op::kCast, "Cast", AmpClass::kFollow, true},
    {Op::kReshape, "Reshape", AmpClass::kFollow, true},
    {Op::kAdd, "Add", AmpClass::kGray, true},
    {Op::kSub, "Sub", AmpClass::kGray, true},
    {Op::kMul, "Mul", AmpClass::kGray, true},
    {Op::kDiv, "Div", AmpClass::kGray, true},
    {Op::kNeg, "Neg", AmpClass::kGray, true},
    {Op::kAddScalar, "AddScalar", AmpClass::kGray, true},
    {Op::kMulScalar, "MulScalar", AmpClass::kGray, true},
    {Op::kMatmul, "MatMul", AmpClass::kWhite, true},
    {Op::kBatchMatmul, "BatchMatMul", AmpClass::kWhite, true},
    {Op::kDense, "Dense", AmpClass::kWhite, true},
    {Op::kConv2d, "Conv2d", AmpClass::kWhite, true},
    {Op::kMaxPool2d, "MaxPool2d", AmpClass::kGray, true},
    {Op::kAvgPool2d, "AvgPool2d", AmpClass::kGray, true},
    {Op::kReluMaxPool2d, "ReLUMaxPool2d", AmpClass::kGray, true},
    {Op::kRelu, "ReLU", AmpClass::kWhite, true},
    {Op::kSigmoid, "Sigmoid", AmpClass::kGray, true},
    {Op::kTanh, "Tanh", AmpClass::kGray, true},
    {Op::kGelu, "GELU", AmpClass::kGray, true},
    {Op::kSilu, "SiLU", AmpClass::kGray, true},
    {Op::kSum, "ReduceSum", AmpClass::kGray, true},
    {Op::kMean, "ReduceMean", AmpClass::kGray, true},
    {Op::kMax, "ReduceMax", AmpClass::kGray, true},
    {Op::kArgmax, "Argmax", AmpClass::kFollow, false},
    {Op::kSoftmax, "Softmax", AmpClass::kGray, true},
    {Op::kLogSoftmax, "LogSoftmax", AmpClass::kGray, true},
    {Op::kSoftmaxCrossEntropy, "SoftmaxCrossEntropyWithLogits", AmpClass::kFp32, true},
    {Op::kMseLoss, "MSELoss", AmpClass::kFp32, true},
    {Op::kBatchNorm, "BatchNorm", AmpClass::kBlack, true},
    {Op::kDropout, "Dropout", AmpClass::kGray, true},
    // Transformer ops (demi/ops/transformer_ops.cc). Embedding is gray: the FP32 table (a parameter) is
    // gathered straight into the low dtype from O2 up, so no full-table cast and a low output as every
    // gray op's. LayerNorm is black, as MindSpore's O2 keeps it: statistics and normalisation in FP32.
    // Attention (Q·Kᵀ, masked softmax, ·V) is white like BatchMatMul, which it is made of; its scores and
    // softmax are FP32 inside at every level.
    {Op::kEmbedding, "Embedding", AmpClass::kGray, true},
    {Op::kLayerNorm, "LayerNorm", AmpClass::kBlack, true},
    {Op::kTranspose, "Transpose", AmpClass::kFollow, true},
    {Op::kSplit, "Split", AmpClass::kFollow, true},
    {Op::kAttention, "ScaledDotProductAttention", AmpClass::kWhite, true},
    {Op::kConv2dReluMaxPool2d, "Conv2dReLUMaxPool2d", AmpClass::kWhite, true},
    // Concat joins tensors along an axis in their common (promoted) dtype; its gradient is split back.
    {Op::kConcat, "Concat", AmpClass::kFollow, true},
    // The transposed convolution is the convolution's adjoint (its backward-data): white like Conv2d.
    {Op::kConv2dTranspose, "Conv2dTranspose", AmpClass::kWhite, true},
    // A recomputed cell (autograd::recompute): its forward ran without saving activations and runs again
    // in backward; the ops inside it are the ones AMP classifies.
    {Op::kRecompute, "Recompute", AmpClass::kFollow, true},
}};

constexpr bool op_table_in_enum_order() {
  for (int i = 0; i < kNumOps; ++i)
    if (static_cast<int>(kOpTable[static_cast<size_t>(i)].op) != i) return false;
  return true;
}
static_assert(op_table_in_enum_order(), "kOpTable rows must follow the Op enum, one row per op");

constexpr const OpInfo& op_info(Op op) { return kOpTable[static_cast<size_t>(op)]; }
constexpr std::string_view op_name(Op op) { return op_info(op).name; }

}  // namespace demi::ops
