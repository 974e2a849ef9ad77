// USDT points on a real mount. uprobes with a reference counter (PATH:OFFSET(REF_CTR_OFFSET)):
// the u16 at that file offset (a USDT probe's semaphore) counts the probes enabled in each
// process that maps the file, as the kernel's uprobes keep it, so that the code a
// semaphore guards runs exactly while a probe wants it. And USDT points by name in
// kprobe_events (`[MOD:]%PROVIDER:NAME`, $argN their operands): waiting for the object,
// in a library loaded later, and Python's own points against the kernel's uprobes.
// sdt_prog (tests/tracee) says its semaphore, runs its guarded SDT point, and loads and
// calls sdt_lib (a point without a semaphore) on request.
//
// Nothing here can hang: programs and reads have timeouts, the mount is taken down
// whatever a test did.

#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cinttypes>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

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

using testing::CommandResult;
using testing::run_command;

const std::string kSdtProg = PROBEFS_SDT_PROG;
const std::string kSdtLib = PROBEFS_SDT_LIB;

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

// USDT points by name in kprobe_events.
class SdtPointsTest : public SdtSemaphoreTest {
 protected:
  // The trace's lines of EVENT, from what follows "EVENT: (0x...) ".
  std::vector<std::string> values_of(const std::string& trace, const std::string& event) {
    std::vector<std::string> out;
    for (const std::string& l : trace_body_lines(trace)) {
      const size_t at = l.find(" " + event + ": (");
      if (at == std::string::npos) continue;
      const size_t close = l.find(") ", at);
      out.push_back(close == std::string::npos ? "" : l.substr(close + 2));
    }
    return out;
  }
  std::string last_error() {
    const std::string log = m_.read("error_log");
    const size_t at = log.rfind("\n[");
    return at == std::string::npos ? log : log.substr(at + 1);
  }
};

// Defined before any process maps either object: the program's point counts in its
// semaphore from the start, the library's (no semaphore) is placed when the program
// loads it; $argN are each point's operands, strings through a dereference.
TEST_F(SdtPointsTest, APointByNameWaitsForItsObjectAndBindsItsArguments) {
  const std::string tick = "p:usdt/tick sdt_prog:%sdtprog:tick i=$arg1:s32";
  const std::string fire =
      "p:usdt/fire libsdt_lib:%sdtlib:fire i=$arg1:s32 name=+0($arg2):string";
  ASSERT_EQ(m_.write("kprobe_events", tick + "\n"), 0) << m_.read("error_log");
  ASSERT_EQ(m_.write("kprobe_events", fire + "\n"), 0) << m_.read("error_log");
  EXPECT_EQ(m_.read("kprobe_events"), tick + "\n" + fire + "\n");
  put("events/usdt/enable", "1");
  auto prog = exec_program();
  EXPECT_EQ(prog->ask("sem"), "ok 1");
  EXPECT_EQ(prog->ask("tick 3"), "ok 3");
  EXPECT_EQ(prog->ask("load " + kSdtLib), "ok");
  EXPECT_EQ(prog->ask("lib 4"), "ok 4");
  const std::string trace = m_.read("trace");
  EXPECT_EQ(values_of(trace, "tick"), (std::vector<std::string>{"i=0", "i=1", "i=2"})) << trace;
  EXPECT_EQ(values_of(trace, "fire"),
            (std::vector<std::string>{"i=0 name=\"alpha\"", "i=1 name=\"beta\"",
                                      "i=2 name=\"gamma\"", "i=3 name=\"alpha\""}))
      << trace;
  put("events/usdt/tick/enable", "0");
  EXPECT_EQ(prog->ask("sem"), "ok 0");
  EXPECT_EQ(prog->ask("tick 2"), "ok 0");
  EXPECT_EQ(prog->quit(), 0);
}

// What a point cannot give is refused where the point is placed: at the definition in a
// process that maps the object (the kernel's errno and error_log entry, nothing defined
// lost), and in error_log when a process maps it later.
TEST_F(SdtPointsTest, WhatAPointCannotGiveIsRefusedWhereItIsPlaced) {
  auto prog = exec_program();
  ASSERT_EQ(m_.write("kprobe_events", "p:usdt/tick sdt_prog:%sdtprog:tick\n"), 0);
  EXPECT_EQ(m_.write("kprobe_events", "p:usdt/none sdt_prog:%sdtprog:tock\n"), ENOENT);
  EXPECT_NE(last_error().find("error: Invalid probed address or symbol\n"), std::string::npos)
      << last_error();
  const std::string two = "p:usdt/two sdt_prog:%sdtprog:tick a=$arg1 b=$arg2";
  EXPECT_EQ(m_.write("kprobe_events", two + "\n"), EINVAL);
  EXPECT_NE(last_error().find("error: Invalid argument number\n  Command: " + two + "\n" +
                              std::string(11 + two.find("$arg2"), ' ') + "^\n"),
            std::string::npos)
      << last_error();
  EXPECT_EQ(m_.read("kprobe_events"), "p:usdt/tick sdt_prog:%sdtprog:tick\n");
  // Waiting for the library, which has two operands.
  const std::string late = "p:usdt/late libsdt_lib:%sdtlib:fire c=$arg3";
  ASSERT_EQ(m_.write("kprobe_events", late + "\n"), 0);
  put("events/usdt/late/enable", "1");
  EXPECT_EQ(prog->ask("load " + kSdtLib), "ok");
  EXPECT_EQ(prog->ask("lib 2"), "ok 2");
  EXPECT_TRUE(values_of(m_.read("trace"), "late").empty());
  EXPECT_NE(m_.read("error_log").find("error: Invalid argument number\n  Command: " + late),
            std::string::npos)
      << m_.read("error_log");
  EXPECT_EQ(prog->quit(), 0);
}

// Python's own points (Debian's python3.11, guarded by semaphores in .probes) by name, file,
// function and line fetched as strings, against the kernel's uprobes on the same places
// (perf's definitions of them, as probefs-probe --cache -l -v reads the notes) and the
// same script: the same events, value for value. Its `line` point enabled is what makes
// CPython 3.11 enter every Python call through function__entry (without it, calls between
// Python functions skip the point, for the kernel's uprobes as for probefs).
TEST_F(SdtPointsTest, PythonsCallsAndLinesAsTheKernelsUprobesSeeThem) {
  const std::string python = "/usr/bin/python3.11";
  if (access(python.c_str(), X_OK) != 0) GTEST_SKIP() << "no " << python;
  const testing::TempDir dir;
  ASSERT_TRUE(dir.ok());
  const std::string script = dir.file("calls.py");
  std::ofstream(script) << "def f(n):\n    return n + 1\n\n\ndef g(n):\n    return f(n) * 2\n\n"
                           "for i in range(7):\n    f(i)\nlist(map(g, range(5)))\nprint('done')\n";
  const std::string args[] = {"file", "func", "line"};
  const std::string filter = "file ~ \"" + dir.path() + "/*\"";

  // probefs, by name.
  for (const char* point : {"function__entry", "line"}) {
    const std::string def = std::string("p:py/") + point + " python3.11:%python:" + point +
                            " file=+0($arg1):string func=+0($arg2):string line=$arg3:s32";
    ASSERT_EQ(m_.write("kprobe_events", def + "\n"), 0) << m_.read("error_log");
    put(std::string("events/py/") + point + "/filter", filter);
  }
  put("events/py/enable", "1");
  CommandResult r = run_command({PROBEFS_BIN, "exec", m_.dir(), "--", python, "-S", script}, 60000);
  ASSERT_EQ(r.exit_code(), 0) << r.err;
  EXPECT_EQ(r.out, "done\n");
  const std::string ours = m_.read("trace");
  std::multiset<std::string> entries, lines;
  for (const std::string& v : values_of(ours, "function__entry")) entries.insert(v);
  for (const std::string& v : values_of(ours, "line")) lines.insert(v);
  const std::string f = "file=\"" + script + "\" func=\"f\" line=1";
  const std::string g = "file=\"" + script + "\" func=\"g\" line=5";
  EXPECT_EQ(entries.count(f), 12u) << ours;  // 7 from the loop, 5 from g
  EXPECT_EQ(entries.count(g), 5u) << ours;   // through map, from C
  EXPECT_EQ(lines.count("file=\"" + script + "\" func=\"f\" line=2"), 12u) << ours;

  // The kernel: the same points at their file offsets with their semaphores.
  KernelTracefs k;
  const std::string why = k.start(5000);
  if (!why.empty()) GTEST_SKIP() << why;
  CommandResult listed = run_command({PROBEFS_PROBE_BIN, "--cache", "-l", "-v", "-x", python}, 60000);
  ASSERT_EQ(listed.exit_code(), 0) << listed.err;
  for (const char* point : {"function__entry", "line"}) {
    // "p:sdt_python/POINT PATH:0xOFF(0xSEM) arg1=OP:u64 arg2=OP:u64 arg3=OP:s32"
    const std::string head = std::string("p:sdt_python/") + point + " ";
    const size_t at = listed.out.find(head);
    ASSERT_NE(at, std::string::npos) << listed.out;
    std::istringstream words(listed.out.substr(at, listed.out.find('\n', at) - at));
    std::string word, place;
    words >> word >> place;
    std::string def = "p:" + k.group() + "/" + point + " " + place;
    for (int i = 0; i < 3 && words >> word; ++i) {
      const std::string op = word.substr(word.find('=') + 1, word.rfind(':') - word.find('=') - 1);
      def += " " + args[i] + "=" + (i < 2 ? "+0(" + op + "):string" : op + ":s32");
    }
    KernelTracefs::Step s =
        k.run("echo \"$1\" >> \"$2/uprobe_events\"", {def, k.dir()}, 10000);
    if (!s.answered) GTEST_SKIP() << "the kernel's uprobe_events does not answer";
    ASSERT_EQ(s.exit_code, 0) << def << ": " << s.err;
    k.remember_probe(k.group() + "/" + point);
    s = k.run("echo \"$1\" > \"$2/events/$3/filter\" && echo 1 > \"$2/events/$3/enable\"",
              {filter, k.instance(), k.group() + "/" + point}, 10000);
    ASSERT_TRUE(s.answered && s.exit_code == 0) << s.err;
  }
  r = run_command({python, "-S", script}, 60000);
  ASSERT_EQ(r.exit_code(), 0) << r.err;
  KernelTracefs::Step s = k.run("cat \"$1/trace\"", {k.instance()}, 10000);
  ASSERT_TRUE(s.answered && s.exit_code == 0) << s.err;
  std::multiset<std::string> kernel_entries, kernel_lines;
  for (const std::string& v : values_of(s.out, "function__entry")) kernel_entries.insert(v);
  for (const std::string& v : values_of(s.out, "line")) kernel_lines.insert(v);
  EXPECT_EQ(entries, kernel_entries) << s.out;
  EXPECT_EQ(lines, kernel_lines) << s.out;
}

}  // namespace
}  // namespace probefs::fs
