#include "demi/amp/policy.h"

#include <sstream>

#include "demi/nn/cell.h"

namespace demi::amp {
namespace {

std::set<ops::Op> ops_of_class(ops::AmpClass c) {
  std::set<ops::Op> out;
  for (const auto& info : ops::kOpTable)
    if (info.amp == c) out.insert(info.op);
  return out;
}

void check_low(DType low) {
  DEMI_CHECK(is_low_precision(low), "AMP: the low-precision dtype must be float16 or bfloat16, got ", low);
}

}  // namespace

Level parse_level(std::string_view s) {
  if (s == "O0" || s == "o0") return Level::kO0;
  if (s == "O1" || s == "o1") return Level::kO1;
  if (s == "O2" || s == "o2") return Level::kO2;
  if (s == "O3" || s == "o3") return Level::kO3;
  DEMI_CHECK(false, "unknown AMP level '", s, "'; expected O0, O1, O2 or O3");
  return Level::kO0;
}

const char* level_name(Level l) {
  switch (l) {
    case Level::kO0: return "O0";
    case Level::kO1: return "O1";
    case Level::kO2: return "O2";
    case Level::kO3: return "O3";
  }
  return "?";
}

AmpPolicy::AmpPolicy(Level level, DType low_dtype) : low_(low_dtype) {
  check_low(low_dtype);
  switch (level) {
    case Level::kO0: mode_ = Mode::kNone; break;
    case Level::kO1:
      mode_ = Mode::kWhiteList;
      list_ = ops_of_class(ops::AmpClass::kWhite);
      break;
    case Level::kO2:
      mode_ = Mode::kBlackList;
      list_ = ops_of_class(ops::AmpClass::kBlack);
      break;
    case Level::kO3: mode_ = Mode::kAll; break;
  }
  low_grads_ = default_low_precision_param_grads(mode_);
}

AmpPolicy::AmpPolicy(Mode mode, std::set<ops::Op> op_list, DType low_dtype)
    : mode_(mode), list_(std::move(op_list)), low_(low_dtype) {
  check_low(low_dtype);
  low_grads_ = default_low_precision_param_grads(mode_);
}

bool AmpPolicy::default_low_precision_param_grads(Mode mode) {
  return mode == Mode::kBlackList || mode == Mode::kAll;
}

namespace {
// The fused Conv2d -> ReLU -> MaxPool2d is listed (and so lowered or kept) as its convolution is, so that a
// custom list naming "Conv2d" means the same whether SequentialCell fuses the layers or not.
ops::Op listed_as(ops::Op op) { return op == ops::Op::kConv2dReluMaxPool2d ? ops::Op::kConv2d : op; }
}  // namespace

DType AmpPolicy::compute_dtype(ops::Op op_in, DType natural) const {
  const ops::Op op = listed_as(op_in);
  // Only FP32 work is lowered: f64 (gradient checks) and integers are left as they are.
  if (natural == DType::kF64 || !is_floating(natural)) return natural;
  switch (mode_) {
    case Mode::kNone: return natural;
    case Mode::kWhiteList: return list_.count(op) ? low_ : DType::kF32;
    case Mode::kBlackList: return list_.count(op) ? DType::kF32 : low_;
    case Mode::kAll: return low_;
  }
  return natural;
}

bool AmpPolicy::outputs_to_fp32(ops::Op op) const {
  return mode_ == Mode::kWhiteList && list_.count(listed_as(op)) > 0;
}

std::string AmpPolicy::describe() const {
  std::ostringstream os;
  const char* m = mode_ == Mode::kNone        ? "none"
                  : mode_ == Mode::kWhiteList ? "white list"
                  : mode_ == Mode::kBlackList ? "black list"
                                              : "all";
  os << "AMP(" << dtype_name(low_) << ", " << m;
  if (!list_.empty()) {
    os << ":";
    for (ops::Op op : list_) os << " " << ops::op_name(op);
  }
  if (low_grads_) os << ", bfloat16 parameter gradients";
  os << ")";
  return os.str();
}

std::vector<std::string> get_white_list() {
  std::vector<std::string> out;
  for (ops::Op op : ops_of_class(ops::AmpClass::kWhite)) out.emplace_back(ops::op_name(op));
  return out;
}

std::vector<std::string> get_black_list() {
  std::vector<std::string> out;
  for (ops::Op op : ops_of_class(ops::AmpClass::kBlack)) out.emplace_back(ops::op_name(op));
  return out;
}

std::set<ops::Op> ops_from_names(const std::vector<std::string>& names) {
  std::set<ops::Op> out;
  for (const auto& n : names) {
    bool found = false;
    for (const auto& info : ops::kOpTable)
      if (info.name == n) {
        out.insert(info.op);
        found = true;
      }
    if (!found) {
      std::string known;
      for (const auto& info : ops::kOpTable) known += str_cat(known.empty() ? "" : ", ", info.name);
      DEMI_CHECK(false, "AMP: unknown op name '", n, "'; known ops: ", known);
    }
  }
  return out;
}

void auto_mixed_precision(nn::Cell& net, Level level, DType low_dtype, bool keep_batchnorm_fp32,
                          std::optional<bool> low_precision_param_grads) {
  if (level == Level::kO0) {
    net.set_precision_policy(nullptr);
    return;
  }
  auto policy = std::make_shared<AmpPolicy>(level, low_dtype);
  if (level == Level::kO2 && !keep_batchnorm_fp32)
    policy = std::make_shared<AmpPolicy>(AmpPolicy::Mode::kAll, std::set<ops::Op>{}, low_dtype);
  if (level == Level::kO3 && keep_batchnorm_fp32)  // MindSpore's O3 with keep_batchnorm_fp32=True
    policy = std::make_shared<AmpPolicy>(AmpPolicy::Mode::kBlackList, std::set<ops::Op>{ops::Op::kBatchNorm}, low_dtype);
  if (low_precision_param_grads) policy->set_low_precision_param_grads(*low_precision_param_grads);
  net.set_precision_policy(policy);
}

void custom_mixed_precision(nn::Cell& net, const std::vector<std::string>& white_list,
                            const std::vector<std::string>& black_list, DType low_dtype) {
  DEMI_CHECK(white_list.empty() != black_list.empty(),
             "custom_mixed_precision: give exactly one of white_list and black_list");
  if (!white_list.empty())
    net.set_precision_policy(
        std::make_shared<AmpPolicy>(AmpPolicy::Mode::kWhiteList, ops_from_names(white_list), low_dtype));
  else
    net.set_precision_policy(
        std::make_shared<AmpPolicy>(AmpPolicy::Mode::kBlackList, ops_from_names(black_list), low_dtype));
}

}  // namespace demi::amp
