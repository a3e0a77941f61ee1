// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC 2011), bit-exact with
// the Random123 reference, and the Generator built on it. The generator's state is (seed, offset): the key
// is the seed's low and high 32-bit halves, the counter is the offset's halves in words 0 and 1.
#include "demi/core/rng.h"

#include <cmath>
#include <numbers>

#include "demi/core/error.h"

namespace demi {
namespace {

inline void mulhilo(uint32_t a, uint32_t b, uint32_t& hi, uint32_t& lo) {
  uint64_t p = static_cast<uint64_t>(a) * b;
  hi = static_cast<uint32_t>(p >> 32);
  lo = static_cast<uint32_t>(p);
}

inline std::array<uint32_t, 4> philox_round(const std::array<uint32_t, 4>& c,
                                            const std::array<uint32_t, 2>& k) {
  uint32_t hi0, lo0, hi1, lo1;
  mulhilo(kPhiloxM0, c[0], hi0, lo0);
  mulhilo(kPhiloxM1, c[2], hi1, lo1);
  return {hi1 ^ c[1] ^ k[0], lo1, hi0 ^ c[3] ^ k[1], lo0};
}

}  // namespace

std::array<uint32_t, 4> philox4x32(std::array<uint32_t, 4> counter, std::array<uint32_t, 2> key) {
  // Round r uses the key bumped r times (the reference bumps between rounds, not before the first).
  for (int r = 0; r < kPhiloxRounds; ++r) {
    if (r > 0) {
      key[0] += kPhiloxW0;
      key[1] += kPhiloxW1;
    }
    counter = philox_round(counter, key);
  }
  return counter;
}

std::array<uint32_t, 4> Generator::block(uint64_t c) const {
  return philox4x32({static_cast<uint32_t>(c), static_cast<uint32_t>(c >> 32), 0, 0},
                    {static_cast<uint32_t>(seed_), static_cast<uint32_t>(seed_ >> 32)});
}

uint32_t Generator::next_u32() { return block(reserve(1))[0]; }

uint64_t Generator::next_u64() {
  auto w = block(reserve(1));
  return (static_cast<uint64_t>(w[1]) << 32) | w[0];
}

float Generator::next_float() { return u32_to_unit_float(next_u32()); }

double Generator::next_double() {
  // 27 + 26 bits, the standard 53-bit construction (as in MT19937's genrand_res53).
  auto w = block(reserve(1));
  uint64_t a = w[0] >> 5, b = w[1] >> 6;
  return static_cast<double>((a << 26) | b) * 0x1.0p-53;
}

int64_t Generator::next_int(int64_t n) {
  DEMI_CHECK(n > 0, "Generator::next_int: expected a positive bound n, got ", n);
  // Rejection sampling: accept only draws at or above 2^64 mod n, so the accepted range is a whole
  // multiple of n and `x % n` is exactly uniform. At most half of the draws are rejected.
  uint64_t un = static_cast<uint64_t>(n);
  uint64_t threshold = (0 - un) % un;  // == 2^64 mod n
  for (;;) {
    uint64_t x = next_u64();
    if (x >= threshold) return static_cast<int64_t>(x % un);
  }
}

float Generator::next_normal() {
  // Box–Muller on one block, in double so that the tails are right; the second normal of the pair is
  // dropped to keep the generator stateless beyond (seed, offset).
  auto w = block(reserve(1));
  uint64_t a = (static_cast<uint64_t>(w[0]) << 21) | (w[1] >> 11);  // 53 bits
  double u1 = (static_cast<double>(a) + 1.0) * 0x1.0p-53;  // in (0, 1], so log(u1) is finite
  double u2 = static_cast<double>(w[2]) * 0x1.0p-32;
  double r = std::sqrt(-2.0 * std::log(u1));
  return static_cast<float>(r * std::cos(2.0 * std::numbers::pi * u2));
}

Generator& default_generator() {
  // Not synchronised, like the rest of the global configuration: seed and draw from the main thread.
  static Generator gen;
  return gen;
}

void set_seed(uint64_t seed) { default_generator().set_state(seed, 0); }

}  // namespace demi
