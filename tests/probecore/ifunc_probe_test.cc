// The engine in this process with its own ELF resolver (tracee/self_symbols.h) on libc's
// IFUNC symbols: a probe on `libc:memcpy`, `strlen`, `strcmp` or `memset` sits on
// the implementation the program calls and fires exactly as often as the program calls
// it; `libc:memcpy@resolver` sits on the resolver, which nothing calls; kprobes/list names
// the implementation, then what was asked for.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "probecore/kprobes.h"
#include "tests/probecore/probe_test_util.h"
#include "tracee/self_symbols.h"

namespace probefs::probecore {
namespace {

// Counts only inside the window: the engine's control operations and the test's own
// assertions call the same functions, outside it.
std::atomic<bool> g_window{false};

struct Counter : Kprobe {
  std::atomic<unsigned long> hits{0};
};

int count_hit(Kprobe* p, PtRegs*) {
  if (g_window.load(std::memory_order_relaxed))
    static_cast<Counter*>(p)->hits.fetch_add(1, std::memory_order_relaxed);
  return 0;
}

// The calls go through volatile pointers, so that the compiler inlines none of them, and
// through wrappers that count them.
void* (*volatile v_memcpy)(void*, const void*, size_t) = memcpy;
size_t (*volatile v_strlen)(const char*) = strlen;
int (*volatile v_strcmp)(const char*, const char*) = strcmp;
void* (*volatile v_memset)(void*, int, size_t) = memset;

struct Calls {
  unsigned long memcpy = 0, strlen = 0, strcmp = 0, memset = 0;
};

// N rounds of calls, in which nothing but the wrappers calls these functions: no stdio, no
// assertion, no allocation. Returns what the wrappers counted.
__attribute__((noinline)) Calls window(unsigned long rounds) {
  static char src[128] = "the quick brown fox jumps over the lazy dog";
  static char dst[128];
  static const char* const words[] = {"", "a", "memcpy", "a longer string, past 32 bytes of it"};
  Calls n;
  unsigned long sum = 0;
  g_window.store(true);
  for (unsigned long i = 0; i < rounds; ++i) {
    ++n.memcpy;
    v_memcpy(dst, src, 1 + i % 100);
    n.strlen += 2;
    sum += v_strlen(words[i % 4]) + v_strlen(dst + i % 8);
    n.strcmp += 3;
    sum += v_strcmp(words[i % 4], words[(i + 1) % 4]) > 0;
    sum += (v_strcmp(dst, src) == 0) + (v_strcmp("x", "x") == 0);
    for (int k = 0; k < 4; ++k) {
      ++n.memset;
      v_memset(dst + 100, static_cast<int>(i + k), 1 + (i * 7 + k) % 28);
    }
  }
  g_window.store(false);
  if (sum == 0 && rounds != 0) n.memcpy = 0;  // the calls did nothing: a broken probe
  return n;
}

uintptr_t libc_dlsym(const char* name) {
  void* libc = dlopen("libc.so.6", RTLD_NOW | RTLD_NOLOAD);
  if (libc == nullptr) return 0;
  const auto a = reinterpret_cast<uintptr_t>(dlsym(libc, name));
  dlclose(libc);
  return a;
}

class IfuncProbes : public ::testing::Test {
 protected:
  void SetUp() override { set_symbol_resolver(&tracee::self_symbol_resolver()); }
  void TearDown() override { EXPECT_EQ(kprobes_list(), ""); }
};

TEST_F(IfuncProbes, FireExactlyAsOftenAsTheProgramCalls) {
  const char* const names[] = {"libc:memcpy", "strlen", "strcmp", "libc.so.6:memset",
                               "libc:memcpy@resolver"};
  const char* const impls[] = {"memcpy", "strlen", "strcmp", "memset"};
  Counter probes[5];
  std::vector<std::unique_ptr<test_util::KprobeGuard>> guards;
  for (int i = 0; i < 5; ++i) {
    probes[i].symbol_name = names[i];
    probes[i].pre_handler = count_hit;
    ASSERT_EQ(register_kprobe(&probes[i]), 0) << names[i];
    guards.emplace_back(new test_util::KprobeGuard{&probes[i]});
  }
  for (int i = 0; i < 4; ++i) EXPECT_EQ(probes[i].addr, libc_dlsym(impls[i])) << names[i];
  EXPECT_NE(probes[4].addr, probes[0].addr);

  const Calls n = window(1000);
  EXPECT_EQ(n.memcpy, 1000u);
  EXPECT_EQ(probes[0].hits.load(), n.memcpy);
  EXPECT_EQ(probes[1].hits.load(), n.strlen);
  EXPECT_EQ(probes[2].hits.load(), n.strcmp);
  EXPECT_EQ(probes[3].hits.load(), n.memset);
  EXPECT_EQ(probes[4].hits.load(), 0u);
  for (const Counter& p : probes) EXPECT_EQ(p.nmissed.load(), 0u);

  // kprobes/list: the kernel's columns for the implementation, then the name asked for.
  const std::string list = kprobes_list();
  std::istringstream in(list);
  std::vector<std::string> lines;
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  ASSERT_EQ(lines.size(), 5u) << list;
  for (int i = 0; i < 4; ++i) {
    SymbolLocation impl;
    ASSERT_EQ(tracee::self_symbol_resolver().describe(probes[i].addr, &impl), 0);
    char head[64];
    snprintf(head, sizeof head, "%016lx  k  ", static_cast<unsigned long>(probes[i].addr));
    const std::string asked = std::string(names[i]).substr(std::string(names[i]).find(':') + 1);
    bool found = false;
    for (const std::string& l : lines) {
      if (!l.starts_with(head) || !l.ends_with(" (" + asked + ")")) continue;
      found = true;
      if (!impl.name.empty()) {
        EXPECT_TRUE(l.starts_with(head + impl.name + "+0x0  libc.so.6 ")) << l;
      }
    }
    EXPECT_TRUE(found) << names[i] << "\n" << list;
  }
  bool resolver_line = false;
  for (const std::string& l : lines)
    resolver_line |= l.find("  memcpy+0x0  libc.so.6 ") != std::string::npos &&
                     l.ends_with(" (memcpy@resolver)");
  EXPECT_TRUE(resolver_line) << list;

  // A second window: exact again.
  for (auto& p : probes) p.hits = 0;
  const Calls again = window(33);
  EXPECT_EQ(probes[0].hits.load(), again.memcpy);
  EXPECT_EQ(probes[1].hits.load(), again.strlen);
  EXPECT_EQ(probes[2].hits.load(), again.strcmp);
  EXPECT_EQ(probes[3].hits.load(), again.memset);
  EXPECT_EQ(probes[4].hits.load(), 0u);
}

// memcpy and memmove resolve to one implementation here (glibc's x86-64 memmove serves
// both): the probes aggregate on it, and each line of kprobes/list keeps its own name.
TEST_F(IfuncProbes, ProbesAskedByDifferentNamesOnOneImplementationKeepTheirNames) {
  if (libc_dlsym("memcpy") != libc_dlsym("memmove")) GTEST_SKIP() << "two implementations here";
  Counter a, b;
  a.symbol_name = "libc:memcpy";
  b.symbol_name = "libc:memmove";
  a.pre_handler = b.pre_handler = count_hit;
  ASSERT_EQ(register_kprobe(&a), 0);
  test_util::KprobeGuard ga{&a};
  ASSERT_EQ(register_kprobe(&b), 0);
  test_util::KprobeGuard gb{&b};
  EXPECT_EQ(a.addr, b.addr);
  const std::string list = kprobes_list();
  EXPECT_NE(list.find(" (memcpy)\n"), std::string::npos) << list;
  EXPECT_NE(list.find(" (memmove)\n"), std::string::npos) << list;
  const size_t first = list.find('\n');
  ASSERT_NE(first, std::string::npos);
  EXPECT_TRUE(list.substr(0, first).ends_with(" (memcpy)")) << list;  // the order registered
}

}  // namespace
}  // namespace probefs::probecore
