#include "demi/core/cpu.h"

#include <gtest/gtest.h>

#include <fstream>
#include <string>

namespace demi {
namespace {

// cpuid's identity agrees with what Linux reports in /proc/cpuinfo (the first processor's block).
TEST(CpuId, MatchesProcCpuinfo) {
  std::ifstream in("/proc/cpuinfo");
  if (!in) GTEST_SKIP() << "no /proc/cpuinfo";
  std::string line, name;
  int family = -1, model = -1;
  auto value = [](const std::string& l) { return l.substr(l.find(':') + 2); };
  while (std::getline(in, line) && !line.empty()) {
    if (line.rfind("model name", 0) == 0) name = value(line);
    else if (line.rfind("cpu family", 0) == 0) family = std::stoi(value(line));
    else if (line.rfind("model\t", 0) == 0) model = std::stoi(value(line));
  }
  const CpuId& id = cpu_id();
  EXPECT_EQ(id.family, family);
  EXPECT_EQ(id.model, model);
  if (!name.empty()) {
    EXPECT_EQ(id.name, name);
  }
}

}  // namespace
}  // namespace demi
