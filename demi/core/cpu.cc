#include "demi/core/cpu.h"
#include "demi/core/settings.h"

#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "demi/core/error.h"

namespace demi {
namespace {

uint64_t read_xcr0() {
  uint32_t eax = 0, edx = 0;
  __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
  return (static_cast<uint64_t>(edx) << 32) | eax;
}

CpuFeatures detect() {
  CpuFeatures f;
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return f;
  bool osxsave = (c >> 27) & 1;
  bool avx = (c >> 28) & 1;
  f.fma = (c >> 12) & 1;
  f.f16c = (c >> 29) & 1;
  uint64_t xcr0 = osxsave ? read_xcr0() : 0;
  bool os_avx = (xcr0 & 0x6) == 0x6;            // XMM and YMM state
  f.os_avx512 = os_avx && (xcr0 & 0xe0) == 0xe0;  // opmask, ZMM_Hi256, Hi16_ZMM
  if (__get_cpuid_max(0, nullptr) < 7) return f;
  __cpuid_count(7, 0, a, b, c, d);
  f.avx2 = os_avx && avx && ((b >> 5) & 1);
  f.avx512f = f.os_avx512 && ((b >> 16) & 1);
  f.avx512dq = f.os_avx512 && ((b >> 17) & 1);
  f.avx512bw = f.os_avx512 && ((b >> 30) & 1);
  f.avx512vl = f.os_avx512 && ((b >> 31) & 1);
  f.avx512_fp16 = f.os_avx512 && ((d >> 23) & 1);
  f.amx_bf16 = (d >> 22) & 1;
  f.amx_tile = (d >> 24) & 1;
  // The tile state is an XSAVE feature Linux enables in XCR0 (bits 17, 18) but lends each process only on
  // request: the first tile instruction of a process that has not asked traps.
  constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  f.os_amx = f.amx_bf16 && f.amx_tile && (xcr0 & 0x60000) == 0x60000 &&
             ::syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
  unsigned a1 = 0, b1 = 0, c1 = 0, d1 = 0;
  __cpuid_count(7, 1, a1, b1, c1, d1);
  f.avx512_bf16 = f.os_avx512 && ((a1 >> 5) & 1);
  f.fma = f.fma && os_avx;
  f.f16c = f.f16c && os_avx;
  return f;
}

CpuId identify() {
  CpuId id;
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid(1, &a, &b, &c, &d)) {
    const int base_family = static_cast<int>((a >> 8) & 0xf);
    id.family = base_family + (base_family == 0xf ? static_cast<int>((a >> 20) & 0xff) : 0);
    id.model = static_cast<int>((a >> 4) & 0xf);
    if (base_family == 0x6 || base_family == 0xf) id.model |= static_cast<int>((a >> 16) & 0xf) << 4;
  }
  if (__get_cpuid_max(0x80000000u, nullptr) >= 0x80000004u) {
    unsigned regs[12];
    for (unsigned i = 0; i < 3; ++i) __get_cpuid(0x80000002u + i, &regs[4 * i], &regs[4 * i + 1], &regs[4 * i + 2], &regs[4 * i + 3]);
    std::string brand(reinterpret_cast<const char*>(regs), sizeof regs);
    brand = brand.substr(0, brand.find('\0'));
    const size_t first = brand.find_first_not_of(' '), last = brand.find_last_not_of(' ');
    if (first != std::string::npos) id.name = brand.substr(first, last - first + 1);
  }
  if (id.name.empty()) id.name = "unknown CPU";
  return id;
}

CpuLevel detect_level(const CpuFeatures& f) {
  bool avx2 = f.avx2 && f.fma && f.f16c;
  bool avx512 = avx2 && f.avx512f && f.avx512bw && f.avx512vl && f.avx512dq;
  if (avx512 && f.avx512_bf16 && f.os_amx) return CpuLevel::kAmx;
  if (avx512 && f.avx512_bf16) return CpuLevel::kAvx512Bf16;
  if (avx512) return CpuLevel::kAvx512;
  if (avx2) return CpuLevel::kAvx2;
  return CpuLevel::kScalar;
}

CpuLevel initial_level() {
  CpuLevel best = detect_level(cpu_features());
  const std::optional<std::string> env = env_value("DEMI_CPU_LEVEL");
  if (!env) return best;
  CpuLevel wanted = CpuLevel::kScalar;
  try {
    wanted = parse_cpu_level(*env);
  } catch (const Error& e) {
    throw Error(str_cat("DEMI_CPU_LEVEL: ", e.what()));
  }
  return static_cast<int>(wanted) < static_cast<int>(best) ? wanted : best;
}

std::atomic<int>& level_slot() {
  static std::atomic<int> level{static_cast<int>(initial_level())};
  return level;
}

constexpr std::string_view kLevelNames[] = {"scalar", "avx2", "avx512", "avx512_bf16", "amx"};
static_assert(std::size(kLevelNames) == static_cast<size_t>(CpuLevel::kLast) + 1, "a CPU level needs its name");

}  // namespace

const CpuFeatures& cpu_features() {
  static const CpuFeatures features = detect();
  return features;
}

const CpuId& cpu_id() {
  static const CpuId id = identify();
  return id;
}

CpuLevel max_cpu_level() {
  static const CpuLevel level = detect_level(cpu_features());
  return level;
}

CpuLevel cpu_level() { return static_cast<CpuLevel>(level_slot().load(std::memory_order_relaxed)); }

void set_cpu_level(CpuLevel level) {
  DEMI_CHECK(static_cast<int>(level) <= static_cast<int>(max_cpu_level()), "set_cpu_level: ",
             cpu_level_name(level), " is not supported on this CPU; the best it runs is ",
             cpu_level_name(max_cpu_level()));
  level_slot().store(static_cast<int>(level), std::memory_order_relaxed);
}

std::vector<CpuLevel> supported_cpu_levels() {
  std::vector<CpuLevel> levels;
  for (int l = 0; l <= static_cast<int>(max_cpu_level()); ++l) levels.push_back(static_cast<CpuLevel>(l));
  return levels;
}

std::string_view cpu_level_name(CpuLevel level) {
  auto i = static_cast<size_t>(level);
  DEMI_ASSERT(i < std::size(kLevelNames));
  return kLevelNames[i];
}

CpuLevel parse_cpu_level(std::string_view name) {
  for (size_t i = 0; i < std::size(kLevelNames); ++i)
    if (kLevelNames[i] == name) return static_cast<CpuLevel>(i);
  DEMI_CHECK(false, "unknown CPU level '", name, "'; expected scalar, avx2, avx512, avx512_bf16 or amx");
  return CpuLevel::kScalar;
}

}  // namespace demi
