// probecore with the process's own ELF resolver (target/self_symbols.h): probes placed by
// SYM, MOD:SYM and SYM+offset, with function bounds found by the resolver.
#include <gtest/gtest.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>

#include "probecore/kprobes.h"
#include "tracee/self_symbols.h"
#include "tests/probecore/probe_test_util.h"
#include "tests/probecore/targets.h"

namespace probefs::probecore {
namespace {

std::atomic<long> g_hits{0};
// Only the calls made by the tests count: the resolver itself parses numbers with libc.
std::atomic<uint64_t> g_marker{0};
int count(Kprobe*, PtRegs* regs) {
  if (g_marker == 0 || regs->di == g_marker) g_hits.fetch_add(1);
  return 0;
}

long (*volatile v_add_o0)(long, long) = add_o0;
long (*volatile v_strtol)(const char*, char**, int) = strtol;

class SelfSymbols : public ::testing::Test {
 protected:
  void SetUp() override {
    set_symbol_resolver(&tracee::self_symbol_resolver());
    g_hits = 0;
  }
  void TearDown() override { EXPECT_EQ(kprobes_list(), ""); }
};

TEST_F(SelfSymbols, ProbesBySymbolInTheExecutableAndInLibc) {
  for (const char* name : {"strtol", "libc:strtol", "libc.so.6:strtol"}) {
    Kprobe k;
    k.symbol_name = name;
    k.pre_handler = count;
    test_util::KprobeGuard g{&k};
    ASSERT_EQ(register_kprobe(&k), 0) << name;
    EXPECT_EQ(k.addr, reinterpret_cast<uintptr_t>(&strtol)) << name;
    static const char text[] = "77";
    g_marker = reinterpret_cast<uintptr_t>(text);
    EXPECT_EQ(v_strtol(text, nullptr, 10), 77);
    g_marker = 0;
  }
  EXPECT_EQ(g_hits, 3);
  Kprobe k;
  k.symbol_name = "add_o0";
  k.pre_handler = count;
  test_util::KprobeGuard g{&k};
  ASSERT_EQ(register_kprobe(&k), 0);
  EXPECT_EQ(v_add_o0(2, 3), 5);
  EXPECT_EQ(g_hits, 4);
}

TEST_F(SelfSymbols, OffsetsAreCheckedAgainstTheResolvedFunction) {
  // add_o0 at -O0 starts with push %rbp (1 byte) then mov %rsp,%rbp (3 bytes).
  Kprobe mid;
  mid.symbol_name = "add_o0";
  mid.offset = 2;
  mid.pre_handler = count;
  EXPECT_EQ(register_kprobe(&mid), -EILSEQ);
  Kprobe ok;
  ok.symbol_name = "add_o0";
  ok.offset = 1;
  ok.pre_handler = count;
  test_util::KprobeGuard g{&ok};
  ASSERT_EQ(register_kprobe(&ok), 0);
  EXPECT_EQ(v_add_o0(1, 1), 2);
  EXPECT_EQ(g_hits, 1);
  const std::string list = kprobes_list();
  EXPECT_NE(list.find("add_o0+0x1"), std::string::npos) << list;
  Kprobe unknown;
  unknown.symbol_name = "libc:no_such_function";
  EXPECT_EQ(register_kprobe(&unknown), -ENOENT);
}

}  // namespace
}  // namespace probefs::probecore
