// The AMX tile configuration demi's tile kernels use (include only from *_amx.cc files, compiled for AMX):
// palette 1, all eight tiles 16 rows of 64 bytes — a C tile of 16 x 16 f32, an A tile of 16 rows of 32 bf16,
// a B tile of 16 VNNI-2 rows (32 k x 16 columns). Loaded once per thread per parallel region (LDTILECFG
// costs a few hundred cycles), released at its end so that context switches stop saving the tiles.
#pragma once

#include <immintrin.h>

#include <cstdint>

namespace demi::kernels::cpu_internal {

// LDTILECFG's 64 bytes.
struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};
static_assert(sizeof(TileConfig) == 64);

// The configuration as a constant in memory: built on the stack, GCC 12 may drop or sink the stores that
// LDTILECFG reads (its builtin does not tell it that the memory is read), leaving colsb 0 beside rows 16,
// which faults (#GP, seen as SIGSEGV) in the first tile instruction.
inline constexpr TileConfig kTileConfig = [] {
  TileConfig cfg;
  for (int t = 0; t < 8; ++t) {
    cfg.rows[t] = 16;
    cfg.colsb[t] = 64;
  }
  return cfg;
}();

inline void configure_tiles() { _tile_loadconfig(&kTileConfig); }

}  // namespace demi::kernels::cpu_internal
