// Per-CPU stacks on real CPUs: the owner's restartable sequences, stealing, and a stress
// run in which no value is ever lost or handed out twice.
#include "arch/percpu.h"

#include <pthread.h>
#include <sched.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace probefs::arch {
namespace {

bool pin_to(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  return pthread_setaffinity_np(pthread_self(), sizeof set, &set) == 0 && sched_getcpu() == cpu;
}

// Two CPUs this process may run on, or fewer.
std::vector<int> usable_cpus() {
  cpu_set_t set;
  std::vector<int> cpus;
  if (sched_getaffinity(0, sizeof set, &set) != 0) return cpus;
  for (int c = 0; c < CPU_SETSIZE && cpus.size() < 2; ++c)
    if (CPU_ISSET(c, &set)) cpus.push_back(c);
  return cpus;
}

class Percpu : public ::testing::Test {
 protected:
  void SetUp() override {
    // glibc 2.35+ registers rseq for every thread; the kernel has membarrier's rseq command
    // since 5.10. Both hold wherever probefs is supported.
    ASSERT_TRUE(percpu_init());
    n_ = percpu_count();
    ASSERT_GT(n_, 0u);
    stacks_.reset(new PercpuStack[n_]());
  }
  uint32_t n_ = 0;
  std::unique_ptr<PercpuStack[]> stacks_;
};

TEST_F(Percpu, PushAndPopOnTheCurrentCpuAreLastInFirstOut) {
  const std::vector<int> cpus = usable_cpus();
  ASSERT_FALSE(cpus.empty());
  std::thread([&] {
    ASSERT_TRUE(pin_to(cpus[0]));
    uint32_t v = 0;
    EXPECT_FALSE(percpu_pop(stacks_.get(), n_, &v));  // empty
    for (uint32_t i = 1; i <= kPercpuSlots; ++i) EXPECT_TRUE(percpu_push(stacks_.get(), n_, i));
    EXPECT_FALSE(percpu_push(stacks_.get(), n_, 99));  // full
    EXPECT_EQ(stacks_[cpus[0]].count, kPercpuSlots);
    for (uint32_t i = kPercpuSlots; i >= 1; --i) {
      ASSERT_TRUE(percpu_pop(stacks_.get(), n_, &v));
      EXPECT_EQ(v, i);
    }
    EXPECT_FALSE(percpu_pop(stacks_.get(), n_, &v));
  }).join();
}

TEST_F(Percpu, AnotherCpusValuesAreReachedOnlyByStealing) {
  const std::vector<int> cpus = usable_cpus();
  if (cpus.size() < 2) GTEST_SKIP() << "needs two CPUs";
  std::thread([&] {
    ASSERT_TRUE(pin_to(cpus[0]));
    for (uint32_t i = 1; i <= 3; ++i) ASSERT_TRUE(percpu_push(stacks_.get(), n_, i));
  }).join();
  std::thread([&] {
    ASSERT_TRUE(pin_to(cpus[1]));
    uint32_t v = 0;
    EXPECT_FALSE(percpu_pop(stacks_.get(), n_, &v));  // its own CPU's stack is empty
    for (uint32_t want = 3; want >= 1; --want) {
      ASSERT_TRUE(percpu_steal(stacks_.get(), static_cast<uint32_t>(cpus[0]), &v));
      EXPECT_EQ(v, want);
    }
    EXPECT_FALSE(percpu_steal(stacks_.get(), static_cast<uint32_t>(cpus[0]), &v));
  }).join();
  EXPECT_EQ(stacks_[cpus[0]].count, 0u);
  EXPECT_EQ(stacks_[cpus[0]].lock, 0u);
}

TEST_F(Percpu, LockedStackRefusesItsOwnerUntilTheThiefLeaves) {
  const std::vector<int> cpus = usable_cpus();
  ASSERT_FALSE(cpus.empty());
  std::thread([&] {
    ASSERT_TRUE(pin_to(cpus[0]));
    ASSERT_TRUE(percpu_push(stacks_.get(), n_, 7));
    stacks_[cpus[0]].lock = 1;  // as a thief holds it
    uint32_t v = 0;
    EXPECT_FALSE(percpu_pop(stacks_.get(), n_, &v));
    EXPECT_FALSE(percpu_push(stacks_.get(), n_, 8));
    EXPECT_FALSE(percpu_steal(stacks_.get(), static_cast<uint32_t>(cpus[0]), &v));
    stacks_[cpus[0]].lock = 0;
    ASSERT_TRUE(percpu_pop(stacks_.get(), n_, &v));
    EXPECT_EQ(v, 7u);
  }).join();
}

// Workers move values between their CPU's stack and a shared pool while a thief keeps
// stealing from every CPU; threads outnumber CPUs, so sequences are preempted, migrated
// and restarted. Every value must come out exactly once.
TEST_F(Percpu, NoValueIsLostOrDuplicatedUnderPreemptionAndStealing) {
  constexpr uint32_t kValues = 64;
  std::mutex mu;
  std::vector<uint32_t> shared;
  for (uint32_t i = 0; i < kValues; ++i) shared.push_back(i);
  std::atomic<bool> stop{false};
  auto take_shared = [&](uint32_t* v) {
    std::lock_guard lock(mu);
    if (shared.empty()) return false;
    *v = shared.back();
    shared.pop_back();
    return true;
  };
  auto give_shared = [&](uint32_t v) {
    std::lock_guard lock(mu);
    shared.push_back(v);
  };
  auto worker = [&] {
    for (int round = 0; round < 200000; ++round) {
      uint32_t v;
      if (!percpu_pop(stacks_.get(), n_, &v) && !take_shared(&v)) continue;
      if (!percpu_push(stacks_.get(), n_, v)) give_shared(v);
    }
  };
  std::thread thief([&] {
    while (!stop.load()) {
      for (uint32_t c = 0; c < n_; ++c) {
        uint32_t v;
        if (percpu_steal(stacks_.get(), c, &v)) give_shared(v);
      }
    }
  });
  std::vector<std::thread> workers;
  for (int i = 0; i < 4; ++i) workers.emplace_back(worker);
  for (std::thread& t : workers) t.join();
  stop = true;
  thief.join();

  std::vector<uint32_t> all = shared;
  for (uint32_t c = 0; c < n_; ++c) {
    EXPECT_EQ(stacks_[c].lock, 0u);
    for (uint32_t i = 0; i < stacks_[c].count; ++i) all.push_back(stacks_[c].slots[i]);
  }
  std::sort(all.begin(), all.end());
  ASSERT_EQ(all.size(), kValues);
  for (uint32_t i = 0; i < kValues; ++i) EXPECT_EQ(all[i], i);
}

}  // namespace
}  // namespace probefs::arch
