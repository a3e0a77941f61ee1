// How a loss reduces its per-row values: none (one per row), mean (over the rows) or sum. Part of the
// kernels' parameter vocabulary that ops' public interface shares (with conv_params.h and pool_params.h).
#pragma once

#include <cstdint>
#include <string_view>

namespace demi::kernels {

enum class Reduction : uint8_t { kNone, kMean, kSum };
std::string_view reduction_name(Reduction r);  // "none", "mean", "sum"

}  // namespace demi::kernels
