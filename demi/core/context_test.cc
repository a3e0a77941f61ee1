// Tests of set_context/get_context: validation messages, the CPU target, and the thread count reaching
// both demi's pool and OpenMP (which oneDNN reads).
#include "demi/core/context.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <string>

#include "demi/core/error.h"
#include "demi/core/parallel.h"

namespace demi {
namespace {

// Every test leaves the default context behind, whatever it set.
class Context : public ::testing::Test {
 protected:
  void TearDown() override { set_context({}); }
};

std::string error_of(const ContextOptions& options) {
  try {
    set_context(options);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST_F(Context, DefaultsAreGraphModeOnTheCpuWithEveryCore) {
  set_context({});
  const ContextOptions& ctx = get_context();
  EXPECT_EQ(ctx.mode, ExecMode::kGraph);
  EXPECT_EQ(ctx.device_target, "CPU");
  EXPECT_EQ(ctx.device_id, 0);
  EXPECT_EQ(ctx.num_threads, hardware_threads());
  EXPECT_EQ(num_threads(), hardware_threads());
}

TEST_F(Context, StoresModeAndCanonicalTarget) {
  set_context({.mode = ExecMode::kPyNative, .device_target = "cpu", .device_id = 0});
  EXPECT_EQ(get_context().mode, ExecMode::kPyNative);
  EXPECT_EQ(get_context().device_target, "CPU");
  EXPECT_STREQ(exec_mode_name(get_context().mode), "PYNATIVE_MODE");
  EXPECT_STREQ(exec_mode_name(ExecMode::kGraph), "GRAPH_MODE");
}

TEST_F(Context, UnknownTargetIsAnErrorListingTheAvailableOnes) {
  std::string msg = error_of({.device_target = "GPU"});
  EXPECT_NE(msg.find("\"GPU\""), std::string::npos) << msg;
  EXPECT_NE(msg.find("available targets: \"CPU\""), std::string::npos) << msg;
  EXPECT_NE(error_of({.device_target = "Ascend"}), "");
  EXPECT_NE(error_of({.device_target = ""}), "");
}

TEST_F(Context, RejectedCallLeavesTheContextUnchanged) {
  set_context({.mode = ExecMode::kPyNative, .num_threads = 1});
  EXPECT_THROW(set_context({.mode = ExecMode::kGraph, .device_target = "GPU", .num_threads = 2}), Error);
  EXPECT_EQ(get_context().mode, ExecMode::kPyNative);
  EXPECT_EQ(get_context().num_threads, 1);
  EXPECT_EQ(num_threads(), 1);
}

TEST_F(Context, DeviceIdMustBeZeroOnTheCpu) {
  std::string negative = error_of({.device_id = -1});
  EXPECT_NE(negative.find("expected device_id >= 0, got -1"), std::string::npos) << negative;
  std::string other = error_of({.device_id = 1});
  EXPECT_NE(other.find("expected device_id 0, got 1"), std::string::npos) << other;
}

TEST_F(Context, ThreadCountReachesDemiAndOpenMP) {
  set_context({.num_threads = 1});
  EXPECT_EQ(get_context().num_threads, 1);
  EXPECT_EQ(num_threads(), 1);
  EXPECT_EQ(omp_get_max_threads(), 1);  // what oneDNN's primitives use
  set_context({.num_threads = 0});
  EXPECT_EQ(get_context().num_threads, hardware_threads());
  EXPECT_EQ(omp_get_max_threads(), hardware_threads());
}

TEST_F(Context, MoreThreadsThanCoresIsTheUsersCall) {
  // Only the setting is checked; no parallel region runs here, so the OpenMP pool does not grow (the
  // oversubscription test in parallel_test.cc counts the process's threads).
  int many = hardware_threads() + 3;
  set_context({.num_threads = many});
  EXPECT_EQ(get_context().num_threads, many);
  EXPECT_EQ(num_threads(), many);
}

TEST_F(Context, NegativeThreadCountIsAnError) {
  std::string msg = error_of({.num_threads = -2});
  EXPECT_NE(msg.find("expected num_threads >= 0"), std::string::npos) << msg;
  EXPECT_NE(msg.find("got -2"), std::string::npos) << msg;
}

TEST_F(Context, GetContextReportsADirectSetNumThreads) {
  set_num_threads(1);
  EXPECT_EQ(get_context().num_threads, 1);
}

TEST_F(Context, ExecModeScopeSetsTheModeForAScopeOnly) {
  set_context({.mode = ExecMode::kGraph, .num_threads = 1});
  {
    ExecModeScope eager(ExecMode::kPyNative);
    EXPECT_EQ(get_context().mode, ExecMode::kPyNative);
    EXPECT_EQ(get_context().num_threads, 1);  // the other settings stay
  }
  EXPECT_EQ(get_context().mode, ExecMode::kGraph);
}

}  // namespace
}  // namespace demi
