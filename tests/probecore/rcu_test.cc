// The hit path's RCU on real threads: a writer's grace period never ends while a
// read-side section that began before it is still open, nested sections (a signal handler
// inside a section) included.
#include "probecore/rcu.h"

#include <signal.h>
#include <sched.h>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

namespace probefs::probecore {
namespace {

// How long a reader keeps its section open while the writer runs. A writer that ends its
// grace period early is caught within it; one that waits correctly simply waits that
// long. A span of time rather than a number of yields: on a loaded machine each yield may
// give the CPU away for a whole time slice, and 200,000 of them took minutes.
constexpr std::chrono::milliseconds kHold{200};

struct Scenario {
  std::atomic<bool> inside{false};
  std::atomic<bool> writer_started{false};
  std::atomic<bool> writer_done{false};
  std::atomic<bool> reader_left{false};
  std::atomic<bool> returned_early{false};
  std::thread writer;

  void run_writer() {
    synchronize_rcu();  // the first one registers with membarrier, which takes a while
    writer = std::thread([this] {
      while (!inside.load()) std::this_thread::yield();
      writer_started = true;
      synchronize_rcu();
      if (!reader_left.load()) returned_early = true;
      writer_done = true;
    });
  }
  void hold_then_leave() {
    while (!writer_started.load()) std::this_thread::yield();
    const auto until = std::chrono::steady_clock::now() + kHold;
    while (!writer_done.load() && std::chrono::steady_clock::now() < until) sched_yield();
    reader_left = true;
    rcu_read_unlock();
    writer.join();
  }
};

TEST(Rcu, GracePeriodWaitsForASectionThatBeganBefore) {
  Scenario s;
  s.run_writer();
  rcu_read_lock();
  s.inside = true;
  s.hold_then_leave();
  EXPECT_FALSE(s.returned_early.load());
}

void nested_section(int) {
  rcu_read_lock();
  rcu_read_unlock();
}

// The nested section's end is not the end of the outer one.
TEST(Rcu, ANestedSectionEndingDoesNotEndTheOuterOne) {
  struct sigaction sa {}, old {};
  sa.sa_handler = nested_section;
  sigemptyset(&sa.sa_mask);
  ASSERT_EQ(sigaction(SIGUSR2, &sa, &old), 0);
  Scenario s;
  s.run_writer();
  rcu_read_lock();
  s.inside = true;
  while (!s.writer_started.load()) std::this_thread::yield();
  for (int i = 0; i < 100; ++i) raise(SIGUSR2);  // sections that open and close inside ours
  s.hold_then_leave();
  EXPECT_FALSE(s.returned_early.load());
  sigaction(SIGUSR2, &old, nullptr);
}

}  // namespace
}  // namespace probefs::probecore
