// Counter-based random numbers (Philox4x32-10). A Generator is a (seed, offset) pair: the n-th block of
// four 32-bit values is philox(seed, offset + n), so a tensor's values depend only on the seed and the
// generator's position, never on how many threads fill it; the state is two integers, easy to checkpoint.
#pragma once

#include <array>
#include <cstdint>

namespace demi {

// Philox4x32's round multipliers and the Weyl sequence key increments (golden ratio and sqrt(3) - 1 in
// 32-bit fixed point), for the vectorised copies of the rounds (kernels/cpu/dropout_*.cc); changing any
// of them silently changes every stream.
inline constexpr uint32_t kPhiloxM0 = 0xD2511F53;
inline constexpr uint32_t kPhiloxM1 = 0xCD9E8D57;
inline constexpr uint32_t kPhiloxW0 = 0x9E3779B9;
inline constexpr uint32_t kPhiloxW1 = 0xBB67AE85;
inline constexpr int kPhiloxRounds = 10;

// Philox4x32 with 10 rounds: counter (4 words) and key (2 words) -> 4 random words.
std::array<uint32_t, 4> philox4x32(std::array<uint32_t, 4> counter, std::array<uint32_t, 2> key);

class Generator {
 public:
  explicit Generator(uint64_t seed = 0x5eed) : seed_(seed) {}

  uint64_t seed() const { return seed_; }
  uint64_t offset() const { return offset_; }  // counters consumed so far
  void set_state(uint64_t seed, uint64_t offset) {
    seed_ = seed;
    offset_ = offset;
  }

  // Reserves `n` counters (4 words each) and returns the first; fill loops call block(first + i).
  uint64_t reserve(uint64_t n) {
    uint64_t first = offset_;
    offset_ += n;
    return first;
  }
  // The 4 words at counter position `c`.
  std::array<uint32_t, 4> block(uint64_t c) const;

  uint32_t next_u32();          // one word (uses a whole counter block, simple and stateless)
  uint64_t next_u64();
  float next_float();           // uniform in [0, 1), 24 random bits
  double next_double();         // uniform in [0, 1), 53 random bits
  int64_t next_int(int64_t n);  // uniform in [0, n), n > 0, without modulo bias
  float next_normal();          // standard normal (Box–Muller)

 private:
  uint64_t seed_;
  uint64_t offset_ = 0;
};

// Converts random words to floats in [0, 1) the way every fill does (24 bits).
inline float u32_to_unit_float(uint32_t x) { return static_cast<float>(x >> 8) * 0x1.0p-24f; }

// The process-wide default generator (seeded by set_seed; used where a user passes none).
Generator& default_generator();
void set_seed(uint64_t seed);

}  // namespace demi
