// uprobes with a reference counter (PATH:OFFSET(REF_CTR_OFFSET)) on a real mount: the
// u16 at that file offset (a USDT probe's semaphore) counts the probes enabled in each
// process that maps the file, as the kernel's uprobes keep it, so that the code a
// semaphore guards runs exactly while a probe wants it. sdt_prog (tests/tracee) says its
// semaphore and runs its guarded SDT point on request.
//
// Nothing here can hang: programs and reads have timeouts, the mount is taken down
// whatever a test did.

#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cinttypes>
#include <memory>
#include <string>

#include <gtest/gtest.h>

#include "tests/fs/elf_symbols.h"
#include "tests/fs/kernel_tracefs.h"
#include "tests/fs/mount_fixture.h"
#include "tests/fs/program_process.h"
#include "tests/fs/trace_lines.h"

namespace probefs::fs {
namespace {

using testing::find_elf_symbol;
using testing::KernelTracefs;
using testing::Mount;
using testing::ProgramProcess;
using testing::trace_body_lines;

const std::string kSdtProg = PROBEFS_SDT_PROG;

std::string hex(uint64_t v) {
  char b[32];
  snprintf(b, sizeof b, "0x%" PRIx64, v);
  return b;
}

// The file offset of the SDT point's semaphore.
uint64_t semaphore_offset() {
  const testing::ElfSymbol sem = find_elf_symbol(kSdtProg, "sdtprog_tick_semaphore");
  EXPECT_TRUE(sem.found);
  return sem.file_offset;
}

// "PATH:0xOFFSET(0xSEMAPHORE)": sdt_tick's entry, counted in the SDT point's semaphore.
std::string guarded_place() {
  const testing::ElfSymbol fn = find_elf_symbol(kSdtProg, "sdt_tick");
  EXPECT_TRUE(fn.found);
  return kSdtProg + ":" + hex(fn.file_offset) + "(" + hex(semaphore_offset()) + ")";
}

class SdtSemaphoreTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(m_.ok()) << m_.daemon_stderr(); }
  void TearDown() override {
    if (!unmounted_) {
      EXPECT_EQ(m_.unmount(), 0) << m_.daemon_stderr();
    }
  }
  void unmount() {
    unmounted_ = true;
    EXPECT_EQ(m_.unmount(), 0) << m_.daemon_stderr();
  }

  void put(const std::string& rel, const std::string& text) {
    EXPECT_EQ(m_.write(rel, text, O_WRONLY | O_TRUNC), 0) << rel << " < " << text;
  }
  std::unique_ptr<ProgramProcess> exec_program() {
    auto p = std::make_unique<ProgramProcess>(ProgramProcess::under_probefs(m_.dir(), kSdtProg));
    EXPECT_TRUE(p->ready()) << m_.daemon_stderr();
    return p;
  }
  size_t ticks() const {
    size_t n = 0;
    for (const std::string& l : trace_body_lines(m_.read("trace")))
      n += l.find(" tick: (") != std::string::npos;
    return n;
  }

  Mount m_;
  bool unmounted_ = false;
};

TEST_F(SdtSemaphoreTest, EachEnabledProbeCountsInTheSemaphore) {
  const std::string place = guarded_place();
  ASSERT_EQ(m_.write("uprobe_events", "p:sdt/tick " + place + "\n"), 0);
  ASSERT_EQ(m_.write("uprobe_events", "p:sdt/tock " + place + "\n"), 0);
  EXPECT_NE(m_.read("uprobe_events").find("(" + hex(semaphore_offset()) + ")\n"), std::string::npos)
      << m_.read("uprobe_events");
  auto prog = exec_program();
  // Defined, not enabled: the guarded code does not run.
  EXPECT_EQ(prog->ask("sem"), "ok 0");
  EXPECT_EQ(prog->ask("tick 5"), "ok 0");
  put("events/sdt/tick/enable", "1");
  EXPECT_EQ(prog->ask("sem"), "ok 1");
  EXPECT_EQ(prog->ask("tick 5"), "ok 5");
  EXPECT_EQ(ticks(), 5u);
  // Two probes on one semaphore: two counts, each let go with its probe.
  put("events/sdt/tock/enable", "1");
  EXPECT_EQ(prog->ask("sem"), "ok 2");
  put("events/sdt/tick/enable", "0");
  EXPECT_EQ(prog->ask("sem"), "ok 1");
  put("events/sdt/tock/enable", "0");
  EXPECT_EQ(prog->ask("sem"), "ok 0");
  EXPECT_EQ(prog->ask("tick 3"), "ok 0");
  // Removed while disabled: nothing held.
  ASSERT_EQ(m_.write("uprobe_events", "-:sdt/tock\n"), 0);
  EXPECT_EQ(prog->ask("sem"), "ok 0");
  EXPECT_EQ(prog->quit(), 0);
}

// A probe enabled before the program starts holds its count from the program's first
// instruction; the mount going (the daemon with it) lets it go in the running program.
TEST_F(SdtSemaphoreTest, HeldFromTheStartAndLetGoWhenTheDaemonGoes) {
  ASSERT_EQ(m_.write("uprobe_events", "p:sdt/tick " + guarded_place() + "\n"), 0);
  put("events/sdt/tick/enable", "1");
  auto prog = exec_program();
  EXPECT_EQ(prog->ask("sem"), "ok 1");
  EXPECT_EQ(prog->ask("tick 4"), "ok 4");
  EXPECT_EQ(ticks(), 4u);
  unmount();
  // The agent lets go when it sees its link end, on its own thread: asked until it has
  // (each answer comes after the program's round trip), within a bound.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  std::string sem;
  while ((sem = prog->ask("sem")) != "ok 0" && std::chrono::steady_clock::now() < deadline) {
  }
  EXPECT_EQ(sem, "ok 0");
  EXPECT_EQ(prog->ask("tick 2"), "ok 0");
  EXPECT_EQ(prog->quit(), 0);
}

// A fork child has its parent's probes, and its count with them: the count it inherited
// goes when they are disabled, and comes back when they are enabled again. (The child
// joins the daemon on its own: asked until its answer changes, within a bound.)
TEST_F(SdtSemaphoreTest, AForkChildCountsWithTheProbesItInherited) {
  ASSERT_EQ(m_.write("uprobe_events", "p:sdt/tick " + guarded_place() + "\n"), 0);
  put("events/sdt/tick/enable", "1");
  auto prog = exec_program();
  EXPECT_EQ(prog->ask("sem"), "ok 1");
  ASSERT_EQ(prog->ask("fork").rfind("ok ", 0), 0u);
  EXPECT_EQ(prog->ask("child sem"), "ok 1");
  auto child_sem_becomes = [&](const std::string& want) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    std::string sem;
    while ((sem = prog->ask("child sem")) != want && std::chrono::steady_clock::now() < deadline) {
    }
    return sem;
  };
  put("events/sdt/tick/enable", "0");
  EXPECT_EQ(prog->ask("sem"), "ok 0");
  EXPECT_EQ(child_sem_becomes("ok 0"), "ok 0");
  put("events/sdt/tick/enable", "1");
  EXPECT_EQ(prog->ask("sem"), "ok 1");
  EXPECT_EQ(child_sem_becomes("ok 1"), "ok 1");
  EXPECT_EQ(prog->ask("child tick 3"), "ok 3");
  EXPECT_EQ(prog->quit(), 0);
}

// The oracle: the same definition in the kernel's uprobe_events (a private mount of the
// kernel's tracefs, enabled in an instance of its own), the same program run plainly:
// the kernel counts the probe in the same u16, and the guarded code runs as it does on
// a mount.
TEST_F(SdtSemaphoreTest, TheKernelsUprobesCountTheSameSemaphore) {
  const std::string place = guarded_place();
  KernelTracefs k;
  const std::string why = k.start(5000);
  if (!why.empty()) GTEST_SKIP() << why;
  const std::string ev = k.group() + "/tick";
  KernelTracefs::Step s =
      k.run("echo \"$1\" >> \"$2/uprobe_events\"", {"p:" + ev + " " + place, k.dir()}, 10000);
  if (!s.answered) GTEST_SKIP() << "the kernel's uprobe_events does not answer";
  ASSERT_EQ(s.exit_code, 0) << s.err;
  k.remember_probe(ev);
  s = k.run("cat \"$1/uprobe_events\"", {k.dir()}, 10000);
  EXPECT_NE(s.out.find("(" + hex(semaphore_offset()) + ")\n"), std::string::npos) << s.out;
  ProgramProcess plain(ProgramProcess::plain(kSdtProg));
  ASSERT_TRUE(plain.ready());
  EXPECT_EQ(plain.ask("sem"), "ok 0");
  s = k.run("echo 1 > \"$1/events/$2/enable\"", {k.instance(), ev}, 10000);
  ASSERT_TRUE(s.answered && s.exit_code == 0) << s.err;
  EXPECT_EQ(plain.ask("sem"), "ok 1");
  EXPECT_EQ(plain.ask("tick 3"), "ok 3");
  s = k.run("echo 0 > \"$1/events/$2/enable\"", {k.instance(), ev}, 10000);
  ASSERT_TRUE(s.answered && s.exit_code == 0) << s.err;
  EXPECT_EQ(plain.ask("sem"), "ok 0");
  EXPECT_EQ(plain.quit(), 0);
  // probefs, the same line: the same answers.
  ASSERT_EQ(m_.write("uprobe_events", "p:sdt/tick " + place + "\n"), 0);
  auto prog = exec_program();
  EXPECT_EQ(prog->ask("sem"), "ok 0");
  put("events/sdt/tick/enable", "1");
  EXPECT_EQ(prog->ask("sem"), "ok 1");
  EXPECT_EQ(prog->ask("tick 3"), "ok 3");
  put("events/sdt/tick/enable", "0");
  EXPECT_EQ(prog->ask("sem"), "ok 0");
  EXPECT_EQ(prog->quit(), 0);
}

}  // namespace
}  // namespace probefs::fs
