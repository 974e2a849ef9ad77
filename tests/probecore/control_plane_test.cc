// The engine's control plane under load: many probes registered, optimized, disabled,
// enabled, switched between forms, listed and unregistered, one at a time and in batches,
// kprobes and kretprobes on the same functions. Built in both builds; in the sanitizer
// build the control plane (registry, optimizer, object tracking, blacklist) runs with
// ASan+UBSan, while the probed code (many_targets.S) and the hit path are not
// instrumented.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <string>
#include <utility>
#include <vector>

#include <unistd.h>

#include <cstdio>
#include <cstring>

#include "arch/branch_targets.h"
#include "probecore/kprobes.h"

extern "C" char pf_many[], pf_many_end[];
extern "C" char pf_cross_short[], pf_cross_short_end[], pf_cross_short_src[];
extern "C" char pf_cross_long[], pf_cross_long_end[], pf_cross_long_src[];
extern "C" char pf_cross_decoy[], pf_cross_decoy_end[], pf_cross_decoy_src[];

namespace probefs::probecore {
namespace {

constexpr size_t kStride = 16;
std::atomic<long> g_hits{0}, g_returns{0};
int count_hit(Kprobe*, PtRegs*) {
  g_hits.fetch_add(1, std::memory_order_relaxed);
  return 0;
}
int count_return(KretprobeInstance*, PtRegs*) {
  g_returns.fetch_add(1, std::memory_order_relaxed);
  return 0;
}

size_t count() { return static_cast<size_t>(pf_many_end - pf_many) / kStride; }
uintptr_t target(size_t i) { return reinterpret_cast<uintptr_t>(pf_many) + i * kStride; }
long call(size_t i, long x) {
  auto* volatile fn = reinterpret_cast<long (*)(long)>(target(i));
  return fn(x);
}

void place(Kprobe* k, size_t i) {
  k->addr = target(i);
  k->bounds = {k->addr, k->addr + kStride};
}

// Calls every target once; true when each returned x + 1.
bool call_all() {
  for (size_t i = 0; i < count(); ++i)
    if (call(i, static_cast<long>(i)) != static_cast<long>(i) + 1) return false;
  return true;
}

class ControlPlane : public ::testing::TestWithParam<bool> {  // the optimization switch
 protected:
  void SetUp() override { set_kprobes_optimization(GetParam()); }
  void TearDown() override {
    set_kprobes_optimization(true);
    EXPECT_EQ(kprobes_list(), "") << "a test left probes registered";
  }
};

TEST_P(ControlPlane, OneAtATimeThenInBatches) {
  const bool optimize = GetParam();
  const size_t n = count();
  std::vector<Kprobe> probes(n);
  for (size_t i = 0; i < n; ++i) {
    place(&probes[i], i);
    probes[i].pre_handler = count_hit;
    probes[i].flags = KPROBE_FLAG_GPR_ONLY;
    ASSERT_EQ(register_kprobe(&probes[i]), 0) << i;
  }
  wait_for_kprobe_optimizer();
  for (const Kprobe& k : probes)
    ASSERT_EQ((k.flags & KPROBE_FLAG_OPTIMIZED) != 0, optimize) << kprobe_optimization_status(&k);
  g_hits = 0;
  ASSERT_TRUE(call_all());
  EXPECT_EQ(g_hits.load(), static_cast<long>(n));

  // Every other one disabled, then enabled again.
  for (size_t i = 0; i < n; i += 2) ASSERT_EQ(disable_kprobe(&probes[i]), 0);
  g_hits = 0;
  ASSERT_TRUE(call_all());
  EXPECT_EQ(g_hits.load(), static_cast<long>(n / 2));
  for (size_t i = 0; i < n; i += 2) ASSERT_EQ(enable_kprobe(&probes[i]), 0);

  // The global switch.
  ASSERT_EQ(disarm_all_kprobes(), 0);
  g_hits = 0;
  ASSERT_TRUE(call_all());
  EXPECT_EQ(g_hits.load(), 0);
  ASSERT_EQ(arm_all_kprobes(), 0);
  g_hits = 0;
  ASSERT_TRUE(call_all());
  EXPECT_EQ(g_hits.load(), static_cast<long>(n));

  const std::string list = kprobes_list();
  EXPECT_EQ(static_cast<size_t>(std::count(list.begin(), list.end(), '\n')), n);
  for (Kprobe& k : probes) ASSERT_EQ(unregister_kprobe(&k), 0);

  // The batch forms, twice over the same probes.
  std::vector<Kprobe*> ptrs;
  for (Kprobe& k : probes) ptrs.push_back(&k);
  for (int round = 0; round < 2; ++round) {
    ASSERT_EQ(register_kprobes(ptrs.data(), static_cast<int>(n)), 0);
    wait_for_kprobe_optimizer();
    g_hits = 0;
    ASSERT_TRUE(call_all());
    EXPECT_EQ(g_hits.load(), static_cast<long>(n));
    unregister_kprobes(ptrs.data(), static_cast<int>(n));
  }
  g_hits = 0;
  ASSERT_TRUE(call_all());
  EXPECT_EQ(g_hits.load(), 0);
}

// kretprobes join the kprobes on the same entries (the detour changes kind), leave again,
// and a batch that fails halfway rolls back.
TEST_P(ControlPlane, ReturnProbesJoinAndLeaveAndBatchesRollBack) {
  const size_t n = count() / 4;
  std::vector<Kprobe> probes(n);
  std::vector<Kretprobe> rps(n);
  for (size_t i = 0; i < n; ++i) {
    place(&probes[i], i);
    probes[i].pre_handler = count_hit;
    ASSERT_EQ(register_kprobe(&probes[i]), 0);
    place(&rps[i].kp, i);
    rps[i].handler = count_return;
    ASSERT_EQ(register_kretprobe(&rps[i]), 0);
  }
  wait_for_kprobe_optimizer();
  g_hits = 0;
  g_returns = 0;
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(call(i, 1), 2);
  EXPECT_EQ(g_hits.load(), static_cast<long>(n));
  EXPECT_EQ(g_returns.load(), static_cast<long>(n));
  for (Kretprobe& rp : rps) ASSERT_EQ(unregister_kretprobe(&rp), 0);
  for (Kprobe& k : probes) ASSERT_EQ(unregister_kprobe(&k), 0);

  // The last one is not an instruction boundary: nothing stays registered.
  std::vector<Kprobe> batch(n);
  std::vector<Kprobe*> ptrs;
  for (size_t i = 0; i < n; ++i) {
    place(&batch[i], i);
    batch[i].pre_handler = count_hit;
    ptrs.push_back(&batch[i]);
  }
  batch.back().addr += 2;  // inside the first instruction
  EXPECT_EQ(register_kprobes(ptrs.data(), static_cast<int>(n)), -EILSEQ);
  for (const Kprobe& k : batch) EXPECT_EQ(k.aggr_, nullptr);
}

// A jump from another function into the bytes a jmp would replace keeps the probe an int3
// probe, whether short or long; bytes inside another instruction that merely read as such
// a jump do not.
TEST(CrossFunctionJumps, RefuseTheJmpOnlyForRealJumps) {
  set_kprobes_optimization(true);
  struct Case {
    const char* name;
    char* start;
    char* end;
    char* src;
    bool optimizable;
  } cases[] = {
      {"short", pf_cross_short, pf_cross_short_end, pf_cross_short_src, false},
      {"long", pf_cross_long, pf_cross_long_end, pf_cross_long_src, false},
      {"decoy", pf_cross_decoy, pf_cross_decoy_end, pf_cross_decoy_src, true},
  };
  for (const Case& c : cases) {
    Kprobe k;
    k.addr = reinterpret_cast<uintptr_t>(c.start);
    k.bounds = {k.addr, reinterpret_cast<uintptr_t>(c.end)};
    k.pre_handler = count_hit;
    ASSERT_EQ(register_kprobe(&k), 0) << c.name;
    wait_for_kprobe_optimizer();
    const std::string status = kprobe_optimization_status(&k);
    EXPECT_EQ((k.flags & KPROBE_FLAG_OPTIMIZED) != 0, c.optimizable) << c.name << ": " << status;
    if (!c.optimizable) {
      EXPECT_EQ(status, "a jump from other code lands in the replaced instructions") << c.name;
    }
    g_hits = 0;
    auto* volatile fn = reinterpret_cast<long (*)(long)>(c.start);
    auto* volatile src = reinterpret_cast<long (*)(long)>(c.src);
    EXPECT_EQ(fn(1), 2) << c.name;
    EXPECT_EQ(src(1), 102) << c.name;
    EXPECT_EQ(g_hits.load(), 1) << c.name;  // the source jumps past the probe
    ASSERT_EQ(unregister_kprobe(&k), 0);
  }
  EXPECT_EQ(kprobes_list(), "");
}

// The executable mapping around addr, as /proc/self/maps names it.
bool mapping_of(uintptr_t addr, uintptr_t* start, arch::MappingKey* key) {
  FILE* f = std::fopen("/proc/self/maps", "re");
  if (!f) return false;
  char line[512];
  bool found = false;
  while (!found && std::fgets(line, sizeof line, f)) {
    unsigned long lo, hi, off, inode;
    unsigned maj, min;
    char perms[8];
    if (std::sscanf(line, "%lx-%lx %7s %lx %x:%x %lu", &lo, &hi, perms, &off, &maj, &min,
                    &inode) == 7 &&
        lo <= addr && addr < hi && perms[2] == 'x') {
      *start = lo;
      *key = {maj, min, inode, off, hi - lo};
      found = true;
    }
  }
  std::fclose(f);
  return found;
}

// With the daemon's table of the mapping (arch/branch_targets.h) the engine does not sweep
// the mapping: its answers are the table's. In a process of its own (the engine keeps what
// it swept once): the table built from the mapping's bytes refuses the real jumps as the
// sweep does, and a candidate the table adds (a real jmp's source, said to land in the
// decoy's region) refuses the decoy, which only the table can say.
int given_table_child() {
  uintptr_t start = 0;
  arch::MappingKey key;
  if (!mapping_of(reinterpret_cast<uintptr_t>(pf_cross_long), &start, &key)) return 10;
  std::vector<uint64_t> table =
      arch::build_branch_table(reinterpret_cast<const uint8_t*>(start), key.length);
  const size_t words = arch::branch_table_words(key.length);
  // The long jmp's own candidate: source is the jmp (its last instruction, 5 bytes).
  const uint64_t jmp_source = reinterpret_cast<uintptr_t>(pf_cross_long_src) + 7 - start;
  bool long_seen = false;
  for (size_t i = words + 1; i < table.size(); ++i)
    long_seen |= (table[i] & 0xffffffffu) == jmp_source;
  if (!long_seen) return 11;
  const uint64_t decoy_in = reinterpret_cast<uintptr_t>(pf_cross_decoy) + 3 - start;
  table.push_back(decoy_in << 32 | jmp_source);
  std::sort(table.begin() + static_cast<ptrdiff_t>(words) + 1, table.end());
  table[words] = table.size() - words - 1;
  table[decoy_in >> 6] |= uint64_t{1} << (decoy_in & 63);
  // A table whose count does not match its size is refused.
  if (arch::provide_branch_table(key, table.data(), table.size() - 1)) return 12;
  if (!arch::provide_branch_table(key, table.data(), table.size())) return 13;
  set_kprobes_optimization(true);
  int code = 0;
  const std::pair<char*, char*> fns[] = {{pf_cross_long, pf_cross_long_end},
                                         {pf_cross_short, pf_cross_short_end},
                                         {pf_cross_decoy, pf_cross_decoy_end}};
  for (auto [fn, end] : fns) {
    Kprobe k;
    k.addr = reinterpret_cast<uintptr_t>(fn);
    k.bounds = {k.addr, reinterpret_cast<uintptr_t>(end)};
    k.pre_handler = count_hit;
    if (register_kprobe(&k) != 0) return 14;
    wait_for_kprobe_optimizer();
    if (kprobe_optimization_status(&k) !=
        "a jump from other code lands in the replaced instructions")
      code = 20 + static_cast<int>(fn == pf_cross_short) + 2 * (fn == pf_cross_decoy);
    if (unregister_kprobe(&k) != 0) return 15;
  }
  return code;
}

TEST(CrossFunctionJumps, TheDaemonsTableStandsForTheSweep) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(_exit(given_table_child()), ::testing::ExitedWithCode(0), "");
}

INSTANTIATE_TEST_SUITE_P(Modes, ControlPlane, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& i) {
                           return i.param ? "Optimizing" : "OptimizationOff";
                         });

}  // namespace
}  // namespace probefs::probecore
