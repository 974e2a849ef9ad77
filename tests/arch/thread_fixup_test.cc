// Write windows and the engine's own sleeping threads: a thread asleep in
// arch::sleep_quietly_until is passed by (no look at it, so not even a listed address under
// it holds the window up), and one woken while a window is open stays in the engine's code
// until the window closes.
#include <gtest/gtest.h>
#include <linux/futex.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <thread>

#include "arch/signals.h"
#include "arch/testing.h"

namespace probefs::arch {
namespace {

using Clock = std::chrono::steady_clock;

// Where thread `tid` sleeps, from /proc/self/task/TID/syscall ("NR ARGS... SP PC"), once it
// sleeps in a futex wait on `word` (nullptr: on any word but `not_word`); 0 if it does not
// within 20 seconds.
uintptr_t futex_sleep_pc(long tid, const void* word, const void* not_word = nullptr) {
  const auto deadline = Clock::now() + std::chrono::seconds(20);
  const std::string path = "/proc/self/task/" + std::to_string(tid) + "/syscall";
  while (Clock::now() < deadline) {
    std::ifstream f(path);
    std::string line;
    std::getline(f, line);
    std::istringstream in(line);
    long nr = -1;
    in >> nr;
    std::string field, last;
    unsigned long arg0 = 0;
    bool first = true;
    while (in >> field) {
      if (first) arg0 = std::stoul(field, nullptr, 16);
      first = false;
      last = field;
    }
    const bool on_word = word ? arg0 == reinterpret_cast<uintptr_t>(word)
                              : arg0 != reinterpret_cast<uintptr_t>(not_word);
    if (nr == SYS_futex && on_word && !last.empty()) return std::stoul(last, nullptr, 16);
    sched_yield();
  }
  return 0;
}

TEST(QuietSleep, AWindowPassesAQuietSleeperByAndItWaitsForTheWindowToClose) {
  uint32_t word = 0;
  std::atomic<long> tid{0};
  std::atomic<bool> returned{false};
  std::thread t([&] {
    tid = syscall(SYS_gettid);
    sleep_quietly_until(&word);
    returned = true;
  });
  bool window = false;
  struct Finally {  // whatever fails: the window closed, the sleeper woken and joined
    std::function<void()> f;
    ~Finally() { f(); }
  } finally{[&] {
    if (window) testing::close_window();
    __atomic_store_n(&word, 1u, __ATOMIC_RELEASE);
    wake_quiet_sleeper(&word);
    t.join();
  }};
  while (tid.load() == 0) sched_yield();
  const uintptr_t pc = futex_sleep_pc(tid, &word);
  ASSERT_NE(pc, 0u);
  // Its very resume point listed: the window opens all the same.
  ASSERT_EQ(testing::open_window_listing(pc), 0);
  window = true;
  // Woken inside the window, it goes to sleep again (on another word) and stays.
  __atomic_store_n(&word, 1u, __ATOMIC_RELEASE);
  wake_quiet_sleeper(&word);
  EXPECT_NE(futex_sleep_pc(tid, nullptr, &word), 0u);
  EXPECT_FALSE(returned.load());
  window = false;
  testing::close_window();
  // Out of the window, it leaves.
  const auto deadline = Clock::now() + std::chrono::seconds(20);
  while (!returned.load() && Clock::now() < deadline) sched_yield();
  EXPECT_TRUE(returned.load());
}

// The same listed address under a thread asleep in a futex of its own: the window waits.
TEST(QuietSleep, AnyOtherSleeperOnAListedAddressHoldsTheWindowUp) {
  std::atomic<uint32_t> word{0};
  std::atomic<long> tid{0};
  std::thread t([&] {
    tid = syscall(SYS_gettid);
    while (word.load() == 0) syscall(SYS_futex, &word, FUTEX_WAIT_PRIVATE, 0, nullptr, nullptr, 0);
  });
  while (tid.load() == 0) sched_yield();
  const uintptr_t pc = futex_sleep_pc(tid, &word);
  ASSERT_NE(pc, 0u);
  EXPECT_EQ(testing::open_window_listing(pc), -EAGAIN);
  // Listing somewhere else, it is checked and left asleep.
  ASSERT_EQ(testing::open_window_listing(pc + 1), 0);
  testing::close_window();
  word = 1;
  syscall(SYS_futex, &word, FUTEX_WAKE_PRIVATE, 1, nullptr, nullptr, 0);
  t.join();
}

}  // namespace
}  // namespace probefs::arch
