// Fuzz target: the IDX decoder (MNIST, Fashion-MNIST; plain or gzip) on arbitrary bytes. Each input is
// decoded as a rank-1 (labels) and a rank-3 (images) array, the two ranks the datasets ask for; a decoded
// array must hold exactly the elements its dimensions claim.
#include <cstdlib>

#include "demi/data/internal/formats.h"
#include "fuzz_target.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  for (int rank : {1, 3}) {
    demi::fuzz::run_one(data, size, [rank](std::span<const uint8_t> bytes) {
      auto a = demi::data::internal::decode_idx_u8(bytes, rank, "fuzz.idx");
      int64_t n = 1;
      for (int64_t d : a.dims) n *= d;
      if (a.data.numel() != n || static_cast<int>(a.dims.size()) != rank) std::abort();
    });
  }
  return 0;
}
