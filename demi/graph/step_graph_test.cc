// Graph mode's step runner: warm-up, trace, replay from the arena; a step that leaves its plan runs on
// the caching allocator and is traced again; one that never repeats itself runs eagerly with a warning;
// too many input signatures; an exception inside a step.
#include "demi/graph/step_graph.h"

#include <gtest/gtest.h>

#include <cstring>
#include <stdexcept>
#include <thread>

#include "demi/core/error.h"
#include "demi/core/tensor.h"

namespace demi::graph {
namespace {

// A step-like program: temporaries that die within it, one result kept until the next step.
struct FakeStep {
  Tensor kept;
  int extra = 0;  // extra allocations this step (a program that changes)
  bool typical = true;
  bool operator()() {
    Tensor a = full({256}, 1.0);
    Tensor b = full({512}, 2.0);
    a = Tensor();
    Tensor c = full({256}, 3.0);  // fits where a was
    for (int i = 0; i < extra; ++i) Tensor t = full({64 + i}, 4.0);
    kept = full({16}, static_cast<double>(c.get(0) + b.get(0)));
    return typical;
  }
};

TEST(StepGraphs, WarmsUpTracesThenReplaysFromTheArena) {
  StepGraphs graphs("test step");
  FakeStep step;
  for (int i = 0; i < 5; ++i) graphs.run("k", std::ref(step));
  const StepGraphs::Stats& s = graphs.stats();
  EXPECT_EQ(s.eager_steps, 1);
  EXPECT_EQ(s.traced_steps, 1);
  EXPECT_EQ(s.replayed_steps, 3);
  EXPECT_EQ(s.diverged_steps, 0);
  EXPECT_EQ(s.arena_allocations, 3 * 3);  // a, b, c each replayed step; `kept` outlives it
  EXPECT_FLOAT_EQ(step.kept.get(0), 5.0f);
  auto plans = graphs.plans();
  ASSERT_EQ(plans.size(), 1u);
  EXPECT_EQ(plans[0].first, "k");
  EXPECT_EQ(plans[0].second.planned, 3);
  EXPECT_EQ(plans[0].second.arena_bytes, plans[0].second.lower_bound);
}

TEST(StepGraphs, AStepThatKeepsChangingRunsEagerlyWithOneWarning) {
  std::vector<std::string> warnings;
  StepGraphs graphs("test step");
  graphs.set_warning_sink([&](const std::string& m) { warnings.push_back(m); });
  FakeStep step;
  for (int i = 0; i < 20; ++i) {
    step.extra = i;  // another allocation every step
    graphs.run("k", std::ref(step));
    EXPECT_FLOAT_EQ(step.kept.get(0), 5.0f);
  }
  const StepGraphs::Stats& s = graphs.stats();
  EXPECT_EQ(s.traced_steps, StepGraphs::kMaxRetraces + 1);
  EXPECT_GT(s.diverged_steps, 0);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("allocate differently"), std::string::npos) << warnings[0];
  EXPECT_NE(warnings[0].find("PYNATIVE"), std::string::npos) << warnings[0];
  // From then on: eager steps, no further warnings.
  const int64_t eager = s.eager_steps;
  graphs.run("k", std::ref(step));
  EXPECT_EQ(graphs.stats().eager_steps, eager + 1);
  EXPECT_EQ(warnings.size(), 1u);
}

TEST(StepGraphs, OneOddStepDoesNotRetrace) {
  StepGraphs graphs("test step");
  FakeStep step;
  for (int i = 0; i < 4; ++i) graphs.run("k", std::ref(step));
  step.extra = 1;  // an overflow step, say: it leaves the plan once
  graphs.run("k", std::ref(step));
  step.extra = 0;
  for (int i = 0; i < 3; ++i) graphs.run("k", std::ref(step));
  EXPECT_EQ(graphs.stats().traced_steps, 1);
  EXPECT_EQ(graphs.stats().diverged_steps, 1);
  EXPECT_EQ(graphs.stats().replayed_steps, 6);
}

TEST(StepGraphs, AnAtypicalStepIsNotTracedAndItsDetourDoesNotRetrace) {
  StepGraphs graphs("test step");
  FakeStep step;
  graphs.run("k", std::ref(step));  // warm-up
  step.typical = false;             // an overflow step, say, that re-ran its batch
  step.extra = 3;
  graphs.run("k", std::ref(step));
  EXPECT_EQ(graphs.stats().traced_steps, 0);
  EXPECT_TRUE(graphs.plans().empty());
  step.typical = true;
  step.extra = 0;
  graphs.run("k", std::ref(step));  // traced
  EXPECT_EQ(graphs.stats().traced_steps, 1);
  EXPECT_EQ(graphs.plans()[0].second.allocations, 4);
  step.typical = false;             // two atypical steps in a row leave the plan: no retrace
  step.extra = 2;
  graphs.run("k", std::ref(step));
  graphs.run("k", std::ref(step));
  step.typical = true;
  step.extra = 0;
  graphs.run("k", std::ref(step));
  EXPECT_EQ(graphs.stats().traced_steps, 1);
  EXPECT_EQ(graphs.stats().diverged_steps, 2);
  EXPECT_EQ(graphs.stats().replayed_steps, 3);
}

TEST(StepGraphs, TwoThreadsTrainingAtOnceShareTheArenaSafely) {
  // Each thread its own step runner; one recording and one replay at a time in the process, the other
  // thread's calls run on the caching allocator meanwhile. Every result stays right.
  auto work = [](int64_t& replayed, int& wrong) {
    StepGraphs graphs("test step");
    graphs.set_warning_sink([](const std::string&) {});
    FakeStep step;
    for (int i = 0; i < 200; ++i) {
      graphs.run("k", std::ref(step));
      if (step.kept.get(0) != 5.0f) ++wrong;
    }
    replayed = graphs.stats().replayed_steps;
  };
  int64_t r1 = 0, r2 = 0;
  int wrong1 = 0, wrong2 = 0;
  std::thread t1([&] { work(r1, wrong1); });
  std::thread t2([&] { work(r2, wrong2); });
  t1.join();
  t2.join();
  EXPECT_EQ(wrong1 + wrong2, 0);
  EXPECT_GT(r1 + r2, 0);
}

TEST(StepGraphs, TooManySignaturesRunEagerlyWithOneWarning) {
  std::vector<std::string> warnings;
  StepGraphs graphs("test step", 2);
  graphs.set_warning_sink([&](const std::string& m) { warnings.push_back(m); });
  FakeStep step;
  for (const char* key : {"a", "b", "c", "d"})
    for (int i = 0; i < 3; ++i) graphs.run(key, std::ref(step));
  EXPECT_EQ(graphs.plans().size(), 2u);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("the 2 plans kept"), std::string::npos) << warnings[0];
  EXPECT_EQ(graphs.stats().eager_steps, 2 + 6);
  EXPECT_THROW(StepGraphs("x", 0), Error);
}

TEST(StepGraphs, AnExceptionInsideAStepEndsItsRecordingAndReplay) {
  StepGraphs graphs("test step");
  FakeStep step;
  auto failing = [&]() -> bool {
    step();
    throw std::runtime_error("bad batch");
  };
  graphs.run("k", std::ref(step));                                // warm-up
  EXPECT_THROW(graphs.run("k", failing), std::runtime_error);    // during the trace
  graphs.run("k", std::ref(step));                                // traced now
  EXPECT_THROW(graphs.run("k", failing), std::runtime_error);    // during a replay
  graphs.run("k", std::ref(step));
  EXPECT_EQ(graphs.stats().traced_steps, 1);
  EXPECT_GE(graphs.stats().replayed_steps, 2);
  EXPECT_FLOAT_EQ(step.kept.get(0), 5.0f);
}

}  // namespace
}  // namespace demi::graph
