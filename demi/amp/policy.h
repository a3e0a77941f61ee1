// AMP precision policy: MindSpore's levels O0–O3 turned into a compute dtype for every op call.
//
// | level | low-precision ops                          | kept FP32                              |
// |-------|--------------------------------------------|----------------------------------------|
// | O0    | none                                       | everything                             |
// | O1    | white list (Conv2d, Dense, MatMul,         | everything else; white-listed ops'     |
// |       | BatchMatMul, ReLU)                         | outputs are cast back to FP32          |
// | O2    | everything except the black list           | black list (BatchNorm) and the losses  |
// | O3    | everything                                 | the losses                             |
//
// The low dtype is a run-time choice: float16 (the seed's) or bfloat16. The lists are data: read them
// with get_white_list()/get_black_list() and build a policy from edited lists with
// custom_mixed_precision(). Parameters stay FP32 (master weights); ops cast them on the fly through the
// cast cache. A network output is always cast back to FP32.
#pragma once

#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "demi/core/dtype.h"
#include "demi/ops/dispatch.h"
#include "demi/ops/op.h"

namespace demi::nn {
class Cell;
}

namespace demi::amp {

enum class Level { kO0, kO1, kO2, kO3 };
Level parse_level(std::string_view s);  // "O0".."O3" (also "o2")
const char* level_name(Level l);

class AmpPolicy : public ops::PrecisionPolicy {
 public:
  enum class Mode { kNone, kWhiteList, kBlackList, kAll };

  // A level's policy with the default lists.
  AmpPolicy(Level level, DType low_dtype);
  // A custom policy: kWhiteList runs only `ops` low (outputs to FP32, as O1); kBlackList runs all but `ops`
  // low (as O2).
  AmpPolicy(Mode mode, std::set<ops::Op> ops, DType low_dtype);

  DType compute_dtype(ops::Op op, DType natural) const override;
  bool outputs_to_fp32(ops::Op op) const override;
  // Low-precision parameter gradients: an FP32 parameter cast to the low dtype gets its .grad in bfloat16
  // (ops::CastGrad::kKeepBf16), written by the weight-gradient product from its FP32 sums (rounded once),
  // instead of an FP32 gradient: 2 bytes per value less. bfloat16 in float16 runs too: a weight gradient is
  // a sum over the batch, and at the scales dynamic loss scaling uses it leaves FP16's 65504 long before the
  // activation gradients do (stored in float16 it overflowed and skipped 2-4x as many steps at the start,
  // and an unscaled O3 run no longer trained: measured), while bfloat16 has FP32's range, so the overflow
  // decisions stay those of FP32 gradients. The optimizer reads them widened, chunk by chunk, into its FP32
  // update of the FP32 master weights; micro-batches accumulate in FP32.
  // Default: on where the level runs everything but a black list low (O2, O3, custom black lists); off
  // for O1, whose white-listed ops hand FP32 back.
  static bool default_low_precision_param_grads(Mode mode);
  bool low_precision_param_grads() const override { return low_grads_; }
  void set_low_precision_param_grads(bool on) { low_grads_ = on; }

  DType low_dtype() const { return low_; }
  Mode mode() const { return mode_; }
  const std::set<ops::Op>& list() const { return list_; }
  std::string describe() const;

 private:
  Mode mode_;
  std::set<ops::Op> list_;
  DType low_;
  bool low_grads_ = false;
};

// MindSpore's default lists, as op names ("Conv2d", "Dense", ...).
std::vector<std::string> get_white_list();
std::vector<std::string> get_black_list();
// Op names -> ops; an unknown name is a demi::Error listing the known ones.
std::set<ops::Op> ops_from_names(const std::vector<std::string>& names);

// Attaches a level's policy to `net` (MindSpore's auto_mixed_precision); O0 removes any policy.
// keep_batchnorm_fp32=false at O2 also runs BatchNorm in low precision; true at O3 keeps BatchNorm in FP32
// (everything else low, as MindSpore's O3 with keep_batchnorm_fp32=True). low_precision_param_grads: the
// policy's setting (default: the level's, see AmpPolicy::low_precision_param_grads).
void auto_mixed_precision(nn::Cell& net, Level level, DType low_dtype = DType::kF16,
                          bool keep_batchnorm_fp32 = true, std::optional<bool> low_precision_param_grads = {});
// Exactly one of the lists may be non-empty: a white list runs only those ops low; a black list runs
// everything else low.
void custom_mixed_precision(nn::Cell& net, const std::vector<std::string>& white_list,
                            const std::vector<std::string>& black_list, DType low_dtype = DType::kF16);

}  // namespace demi::amp
