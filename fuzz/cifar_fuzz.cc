// Fuzz target: the CIFAR-10 binary decoder on arbitrary bytes: count the records, then decode them into
// buffers of exactly that size (as Cifar10Dataset does), so a count that disagrees with the decoder's
// writes shows up under AddressSanitizer.
#include <cstdlib>
#include <vector>

#include "demi/data/internal/formats.h"
#include "fuzz_target.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return demi::fuzz::run_one(data, size, [](std::span<const uint8_t> bytes) {
    namespace di = demi::data::internal;
    int64_t n = di::cifar10_record_count(bytes, "fuzz.bin");
    std::vector<uint8_t> images(static_cast<size_t>(n * di::kCifarImageBytes));
    std::vector<int32_t> labels(static_cast<size_t>(n), -1);
    di::decode_cifar10(bytes, "fuzz.bin", images.data(), labels.data());
    for (int32_t l : labels) {
      if (l < 0 || l >= di::kCifarClasses) std::abort();
    }
  });
}
