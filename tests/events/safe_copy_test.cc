// The fault-tolerant reader: with a SIGSEGV/SIGBUS handler that calls arch::safe_copy_fixup(),
// bad pointers come back as failed reads and the process goes on.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <string>

#include "events/compile.h"
#include "events/fetch.h"
#include "events/output.h"
#include "events/parse.h"
#include "events/memory_reader.h"
#include "arch/safe_copy.h"

namespace probefs::events {
namespace {

// What the agent's handler does first; the test has no program handler to chain to.
void on_fault(int sig, siginfo_t*, void* uc) {
  if (arch::safe_copy_fixup(uc)) return;
  signal(sig, SIG_DFL);
  raise(sig);
}

class SafeCopy : public ::testing::Test {
 protected:
  void SetUp() override {
    struct sigaction sa {};
    sa.sa_sigaction = on_fault;
    sa.sa_flags = SA_SIGINFO | SA_NODEFER;
    sigemptyset(&sa.sa_mask);
    ASSERT_EQ(sigaction(SIGSEGV, &sa, &old_segv_), 0);
    ASSERT_EQ(sigaction(SIGBUS, &sa, &old_bus_), 0);
    page_ = sysconf(_SC_PAGESIZE);
    map_ = static_cast<char*>(
        mmap(nullptr, 2 * page_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
    ASSERT_NE(map_, MAP_FAILED);
    ASSERT_EQ(mprotect(map_ + page_, page_, PROT_NONE), 0);
  }
  void TearDown() override {
    munmap(map_, 2 * page_);
    sigaction(SIGSEGV, &old_segv_, nullptr);
    sigaction(SIGBUS, &old_bus_, nullptr);
  }
  struct sigaction old_segv_ {}, old_bus_ {};
  long page_ = 0;
  char* map_ = nullptr;
};

TEST_F(SafeCopy, ReadsAndFaults) {
  FaultTolerantReader rd;
  uint64_t v = 0x1122334455667788, got = 0;
  EXPECT_TRUE(rd.read(reinterpret_cast<uint64_t>(&v), &got, 8));
  EXPECT_EQ(got, v);
  uint32_t small = 0;
  EXPECT_TRUE(rd.read(reinterpret_cast<uint64_t>(&v), &small, 4));
  EXPECT_EQ(small, 0x55667788u);
  EXPECT_FALSE(rd.read(0, &got, 8));
  EXPECT_FALSE(rd.read(8, &got, 4));
  EXPECT_FALSE(rd.read(~0ull - 3, &got, 8));
  EXPECT_FALSE(rd.read(reinterpret_cast<uint64_t>(map_ + page_), &got, 8));
  EXPECT_FALSE(rd.read(reinterpret_cast<uint64_t>(map_ + page_ - 4), &got, 8));
  char buf[64];
  std::memcpy(map_ + page_ - 4, "abc", 4);
  EXPECT_EQ(rd.read_string(reinterpret_cast<uint64_t>(map_ + page_ - 4), buf, sizeof buf), 4);
  EXPECT_STREQ(buf, "abc");
  std::memcpy(map_ + page_ - 3, "xyz", 3);
  EXPECT_EQ(rd.read_string(reinterpret_cast<uint64_t>(map_ + page_ - 3), buf, sizeof buf), -1);
  EXPECT_EQ(rd.read_string(0, buf, sizeof buf), -1);
  std::memset(map_, 'q', 200);
  map_[200] = 0;
  EXPECT_EQ(rd.read_string(reinterpret_cast<uint64_t>(map_), buf, sizeof buf), 64);
  EXPECT_EQ(std::strlen(buf), 63u);
  // Many faults in a row leave the process in good shape.
  for (int i = 0; i < 1000; ++i) EXPECT_FALSE(rd.read(16 + i, &got, 8));
}

TEST_F(SafeCopy, WholeRecord) {
  ParseResult r = parse_uprobe_command(
      "p:uprobes/x /bin/prog:0x1370 s=+0(%di):string n=+8(%si):u64 ok=+0(%dx):string "
      "c=+0(%dx):char[3]");
  ASSERT_EQ(r.status, ParseStatus::kDefine);
  CompiledEvent ev;
  Diagnostic err;
  ASSERT_TRUE(compile(r.def, nullptr, &ev, &err));
  PtRegs regs{};
  regs.di = 8;
  regs.si = reinterpret_cast<uint64_t>(map_ + page_);
  const char* hello = "live";
  regs.dx = reinterpret_cast<uint64_t>(hello);
  HitContext ctx;
  ctx.regs = &regs;
  ctx.ip = 0x1370;
  FaultTolerantReader rd;
  uint8_t rec[512];
  uint32_t n = write_record(view_of(ev.program), ctx, rd, rec, sizeof rec);
  std::string out;
  ASSERT_TRUE(format_trace_line(out, ev, LineContext{"t", 1, 0, 0}, rec, n));
  EXPECT_NE(out.find("s=(fault) n=0 ok=\"live\" c={'l','i','v'}"), std::string::npos) << out;
}

// A fault outside the routines is not ours: the fix-up says so.
TEST(SafeCopyFixup, ForeignFault) {
  ucontext_t uc{};
  uc.uc_mcontext.gregs[REG_RIP] = reinterpret_cast<greg_t>(&on_fault);
  EXPECT_FALSE(arch::safe_copy_fixup(&uc));
  uc.uc_mcontext.gregs[REG_RIP] = reinterpret_cast<greg_t>(&probefs_arch_safe_copy) + 3;
  EXPECT_TRUE(arch::safe_copy_fixup(&uc));
}

}  // namespace
}  // namespace probefs::events
