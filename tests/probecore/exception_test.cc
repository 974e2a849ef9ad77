// Exceptions thrown through probed functions: a probe at every instruction boundary of C++
// functions built at -O0 and -O2 (exceptions.inc), as an int3 and as a jump-optimized
// probe, must leave every exception caught where it is caught unprobed, with the same
// destructors run and the same results. The unwinder enters a function at its landing
// pads, which no branch in it shows: a jmp written over one kills the first exception.
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <string>
#include <vector>

#include "probecore/kprobes.h"
#include "tracee/self_symbols.h"
#include "tests/probecore/exceptions.h"
#include "tests/probecore/probe_test_util.h"

namespace probefs::probecore {
namespace {

using namespace exc;

std::atomic<long> g_hits{0};

int count_hit(Kprobe*, PtRegs*) {
  g_hits.fetch_add(1, std::memory_order_relaxed);
  return 0;
}

using Fn = int (*)(int);

// The functions of one build, the outermost first.
struct Level {
  const char* name;
  Fn outer;
  std::vector<std::pair<const char*, Fn>> fns;
};

Level level_o0() {
  return {"-O0", exc_outer_o0,
          {{"exc_exact_o0", exc_exact_o0}, {"exc_foo_o0", exc_foo_o0},
           {"exc_thrower_o0", exc_thrower_o0}, {"exc_catch_o0", exc_catch_o0},
           {"exc_nested_o0", exc_nested_o0}, {"exc_outer_o0", exc_outer_o0}}};
}

Level level_o2() {
  return {"-O2", exc_outer_o2,
          {{"exc_exact_o2", exc_exact_o2}, {"exc_foo_o2", exc_foo_o2},
           {"exc_thrower_o2", exc_thrower_o2}, {"exc_catch_o2", exc_catch_o2},
           {"exc_nested_o2", exc_nested_o2}, {"exc_outer_o2", exc_outer_o2}}};
}

// Runs the outermost function over inputs that take every path: no throw, a throw caught
// in exc_catch, in exc_nested, rethrown to exc_outer, thrown by exc_thrower. What each
// call returned and which destructors and catches ran, in order.
std::string scenario(Fn outer) {
  log().clear();
  std::string out;
  for (int x = 0; x < 12; ++x) {
    int r;
    try {
      r = outer(x);
    } catch (const Thrown& t) {  // nothing should get this far
      r = -999999;
      note('E', t.code);
    }
    out += std::to_string(r) + ": " + log() + "\n";
    log().clear();
  }
  return out;
}

// A child process probes every instruction boundary of every function of `level` in turn
// and runs the scenario under each probe. It reports on `fd`, one line each:
//   "at NAME+OFF" before each run (so that a crash names the probe that caused it),
//   "BAD NAME+OFF" when the outcome differed, "OPT n" / "SITES n" at the end.
[[noreturn]] void child_sweep(const Level& level, bool optimize, int fd) {
  alarm(120);  // never outlive a hang
  set_symbol_resolver(&tracee::self_symbol_resolver());
  set_kprobes_optimization(optimize);
  const std::string expected = scenario(level.outer);
  auto say = [fd](const std::string& line) {
    const std::string l = line + "\n";
    if (write(fd, l.data(), l.size()) != static_cast<ssize_t>(l.size())) _exit(3);
  };
  size_t sites = 0, optimized = 0;
  for (const auto& [name, fn] : level.fns) {
    SymbolLocation loc;
    if (tracee::self_symbol_resolver().describe(reinterpret_cast<uintptr_t>(fn), &loc) != 0 ||
        !loc.bounds.known()) {
      say(std::string("BAD no bounds for ") + name);
      _exit(2);
    }
    for (uintptr_t a = loc.bounds.start; a < loc.bounds.end; ++a) {
      Kprobe k;
      k.addr = a;
      k.pre_handler = count_hit;
      const int rc = register_kprobe(&k);
      if (rc == -EILSEQ || rc == -EINVAL) continue;  // not a boundary, or never probed
      const std::string where = std::string(name) + "+" + std::to_string(a - loc.bounds.start);
      if (rc != 0) {
        say("BAD " + where + " register " + std::to_string(rc));
        continue;
      }
      ++sites;
      if (optimize) {
        wait_for_kprobe_optimizer();
        if (k.flags & KPROBE_FLAG_OPTIMIZED) ++optimized;
      }
      say("at " + where + ((k.flags & KPROBE_FLAG_OPTIMIZED) ? " jmp" : " int3"));
      const std::string got = scenario(level.outer);
      if (got != expected) say("BAD " + where + "\n" + got + "expected:\n" + expected);
      if (const int urc = unregister_kprobe(&k); urc != 0)
        say("BAD " + where + " unregister " + std::to_string(urc));
    }
  }
  say("SITES " + std::to_string(sites));
  say("OPT " + std::to_string(optimized));
  _exit(0);
}

struct SweepResult {
  std::string report;  // the child's lines
  int status = 0;
};

SweepResult sweep(const Level& level, bool optimize) {
  SweepResult res;
  int fds[2];
  if (pipe(fds) != 0) return res;
  const pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    child_sweep(level, optimize, fds[1]);
  }
  close(fds[1]);
  char buf[4096];
  ssize_t n;
  while ((n = read(fds[0], buf, sizeof buf)) > 0) res.report.append(buf, static_cast<size_t>(n));
  close(fds[0]);
  if (pid > 0) waitpid(pid, &res.status, 0);
  return res;
}

size_t count_of(const std::string& report, const std::string& key) {
  const size_t at = report.rfind("\n" + key + " ");
  return at == std::string::npos ? 0 : std::stoul(report.substr(at + key.size() + 2));
}

std::string last_probe(const std::string& report) {
  const size_t at = report.rfind("at ");
  return at == std::string::npos ? "(none)" : report.substr(at, report.find('\n', at) - at);
}

std::string bad_lines(const std::string& report) {
  std::string out;
  for (size_t at = report.find("BAD "); at != std::string::npos; at = report.find("BAD ", at + 1))
    out += report.substr(at, std::min<size_t>(400, report.size() - at)) + "\n...\n";
  return out;
}

class Exceptions : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override { set_symbol_resolver(&tracee::self_symbol_resolver()); }
  void TearDown() override { EXPECT_EQ(kprobes_list(), ""); }

  void check(const Level& level) {
    // Unprobed, the scenario catches everything and runs the destructors.
    const std::string plain = scenario(level.outer);
    ASSERT_EQ(plain.find('E'), std::string::npos) << plain;
    ASSERT_NE(plain.find("c"), std::string::npos) << plain;
    ASSERT_NE(plain.find("o"), std::string::npos) << plain;
    const bool optimize = GetParam();
    const SweepResult r = sweep(level, optimize);
    ASSERT_TRUE(WIFEXITED(r.status) && WEXITSTATUS(r.status) == 0)
        << level.name << ": the child died (status " << r.status << ") under the probe "
        << last_probe(r.report) << "\n" << bad_lines(r.report);
    EXPECT_EQ(bad_lines(r.report), "") << level.name;
    const size_t sites = count_of(r.report, "SITES");
    EXPECT_GT(sites, 40u) << r.report;
    if (optimize) {
      // The checks must not refuse everything: most boundaries of straight-line code are
      // fine places for a jmp.
      EXPECT_GT(count_of(r.report, "OPT"), sites / 5) << r.report;
    }
    RecordProperty("sites", static_cast<int>(sites));
    RecordProperty("optimized", static_cast<int>(count_of(r.report, "OPT")));
  }
};

TEST_P(Exceptions, CaughtWhereTheyWereWithAProbeAtEveryBoundaryO2) { check(level_o2()); }
TEST_P(Exceptions, CaughtWhereTheyWereWithAProbeAtEveryBoundaryO0) { check(level_o0()); }

class ExceptionEntries : public ::testing::Test {
 protected:
  void SetUp() override { set_symbol_resolver(&tracee::self_symbol_resolver()); }
  void TearDown() override {
    set_kprobes_optimization(true);
    EXPECT_EQ(kprobes_list(), "");
  }
};

// The shape at -O2: pop, ret, then the landing pad. A probe on the pop comes with
// the pad from the symbol side, and the optimizer names the pad as the reason it keeps the
// int3. A caller that gives bounds without entries gets the checks on the function's own
// code, where the bytes after the ret refuse all the same.
TEST_F(ExceptionEntries, TheLandingPadAfterTheRetReachesTheOptimizer) {
  SymbolLocation loc;
  ASSERT_EQ(tracee::self_symbol_resolver().describe(
                reinterpret_cast<uintptr_t>(exc_exact_o2), &loc), 0);
  ASSERT_EQ(loc.bounds.landing_pads.size(), 1u);
  const uintptr_t pad = loc.bounds.landing_pads[0];
  const auto* code = reinterpret_cast<const uint8_t*>(pad - 2);
  ASSERT_EQ(code[0], 0x5b) << "not GCC 12's shape: pop %rbx";
  ASSERT_EQ(code[1], 0xc3) << "not GCC 12's shape: ret";

  Kprobe k;
  k.addr = pad - 2;
  k.pre_handler = count_hit;
  test_util::KprobeGuard guard{&k};
  ASSERT_EQ(register_kprobe(&k), 0);
  wait_for_kprobe_optimizer();
  EXPECT_FALSE(k.flags & KPROBE_FLAG_OPTIMIZED);
  EXPECT_EQ(kprobe_optimization_status(&k), "jump into the region");
  const long before = g_hits.load();
  EXPECT_EQ(scenario(exc_outer_o2), scenario(exc_outer_o2));
  EXPECT_GT(g_hits.load(), before);
  ASSERT_EQ(unregister_kprobe(&k), 0);

  Kprobe own;
  own.addr = pad - 2;
  own.bounds = {loc.bounds.start, loc.bounds.end};
  own.pre_handler = count_hit;
  test_util::KprobeGuard own_guard{&own};
  ASSERT_EQ(register_kprobe(&own), 0);
  wait_for_kprobe_optimizer();
  EXPECT_FALSE(own.flags & KPROBE_FLAG_OPTIMIZED);
  EXPECT_EQ(kprobe_optimization_status(&own), "code after a jump or return in the region");
}

extern "C" long pf_split(long x);
extern "C" char pf_split_join[];
long (*volatile v_split)(long) = pf_split;

// pf_split.cold jumps back to pf_split+3 (split_targets.S). The symbol side names the cold
// part with pf_split's bounds, and the function's own check sees the branch. Given bounds
// without it, only the engine's sweep of the whole mapping catches the branch.
TEST_F(ExceptionEntries, ABranchBackFromTheColdPartReachesTheOptimizer) {
  const auto start = reinterpret_cast<uintptr_t>(pf_split);
  ASSERT_EQ(reinterpret_cast<uintptr_t>(pf_split_join), start + 3);
  SymbolLocation loc;
  ASSERT_EQ(tracee::self_symbol_resolver().describe(start, &loc), 0);
  ASSERT_EQ(loc.bounds.related.size(), 1u);
  EXPECT_FALSE(loc.bounds.contains(loc.bounds.related[0].start));

  Kprobe k;
  k.addr = start;
  k.pre_handler = count_hit;
  test_util::KprobeGuard guard{&k};
  ASSERT_EQ(register_kprobe(&k), 0);
  wait_for_kprobe_optimizer();
  EXPECT_FALSE(k.flags & KPROBE_FLAG_OPTIMIZED);
  EXPECT_EQ(kprobe_optimization_status(&k), "jump into the region");
  const long before = g_hits.load();
  EXPECT_EQ(v_split(-5), 6);
  EXPECT_EQ(v_split(5), 6);
  EXPECT_EQ(g_hits.load(), before + 2);
  ASSERT_EQ(unregister_kprobe(&k), 0);

  Kprobe own;
  own.addr = start;
  own.bounds = {loc.bounds.start, loc.bounds.end};
  own.pre_handler = count_hit;
  test_util::KprobeGuard own_guard{&own};
  ASSERT_EQ(register_kprobe(&own), 0);
  wait_for_kprobe_optimizer();
  EXPECT_FALSE(own.flags & KPROBE_FLAG_OPTIMIZED);
  EXPECT_NE(kprobe_optimization_status(&own), "jump into the region");
  EXPECT_EQ(v_split(-5), 6);
}

INSTANTIATE_TEST_SUITE_P(Probes, Exceptions, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& i) {
                           return i.param ? std::string("Optimized") : std::string("Int3");
                         });

}  // namespace
}  // namespace probefs::probecore
