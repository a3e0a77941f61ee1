// CPU feature detection and the kernel dispatch level.
//
// cpuid is read once. Kernels come in variants — scalar, AVX2+F16C, AVX-512, AVX-512 with BF16 dot
// products — and each dispatch stub picks the best variant not above cpu_level(). The level can be lowered
// (never raised past what the machine supports) through set_cpu_level() or, for debugging only, the
// environment variable DEMI_CPU_LEVEL=scalar|avx2|avx512|avx512_bf16, read once at start-up. Tests lower
// it to run every variant the machine supports.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace demi {

// kAmx: avx512_bf16 and the AMX tile unit (AMX-TILE, AMX-BF16), which Linux lends a process that asks for
// it (arch_prctl ARCH_REQ_XCOMP_PERM, made once at detection): the Xeons from Sapphire Rapids on. A family
// without a kAmx variant runs its avx512_bf16 one there (core/kernel_registry.h).
enum class CpuLevel : int { kScalar = 0, kAvx2 = 1, kAvx512 = 2, kAvx512Bf16 = 3, kAmx = 4, kLast = kAmx };

struct CpuFeatures {
  bool avx2 = false;
  bool fma = false;
  bool f16c = false;
  bool avx512f = false;
  bool avx512bw = false;
  bool avx512vl = false;
  bool avx512dq = false;
  bool avx512_bf16 = false;
  bool avx512_fp16 = false;
  bool amx_bf16 = false;
  bool amx_tile = false;
  bool os_avx512 = false;  // the OS saves the AVX-512 state (XCR0)
  bool os_amx = false;     // the OS saves the tile state (XCR0) and granted this process the tile data
};

const CpuFeatures& cpu_features();

// What the CPU says it is (cpuid): its brand string ("Intel(R) Xeon(R) Processor"; "unknown CPU" where it
// has none), family and model as Linux's /proc/cpuinfo shows them.
struct CpuId {
  std::string name;
  int family = 0;
  int model = 0;
};
const CpuId& cpu_id();
// The best level this machine (and OS) supports.
CpuLevel max_cpu_level();
// The level kernels dispatch to now.
CpuLevel cpu_level();
// Lowers (or restores) the dispatch level; a level above max_cpu_level() is a demi::Error.
void set_cpu_level(CpuLevel level);
// Every level this machine can run, lowest first (what tests iterate over).
std::vector<CpuLevel> supported_cpu_levels();

std::string_view cpu_level_name(CpuLevel level);  // "scalar", "avx2", "avx512", "avx512_bf16", "amx"
CpuLevel parse_cpu_level(std::string_view name);

// Sets the level for a scope and restores the previous one on exit.
class ScopedCpuLevel {
 public:
  explicit ScopedCpuLevel(CpuLevel level) : saved_(cpu_level()) { set_cpu_level(level); }
  ~ScopedCpuLevel() { set_cpu_level(saved_); }
  ScopedCpuLevel(const ScopedCpuLevel&) = delete;
  ScopedCpuLevel& operator=(const ScopedCpuLevel&) = delete;

 private:
  CpuLevel saved_;
};

}  // namespace demi
