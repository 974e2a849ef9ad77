// The probefs command on a real mount: mounting, the files it always has, attach and
// detach through the command, every one-line error, unmount and daemon death leaving
// the targets running.
#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "tests/fs/elf_symbols.h"
#include "tests/fs/mount_fixture.h"
#include "tests/fs/program_process.h"

namespace probefs::fs {
namespace {

using testing::CommandResult;
using testing::Mount;
using testing::run_command;

std::vector<std::string> list_dir(const std::string& dir) {
  std::vector<std::string> names;
  DIR* d = opendir(dir.c_str());
  if (!d) return names;
  while (dirent* e = readdir(d))
    if (std::string(e->d_name) != "." && std::string(e->d_name) != "..") names.push_back(e->d_name);
  closedir(d);
  std::sort(names.begin(), names.end());
  return names;
}

mode_t mode_of(const std::string& path) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) return 0;
  return st.st_mode;
}

// tests/tracee/traced_prog.c started by the test itself (not by probefs).
class Program : public testing::ProgramProcess {
 public:
  Program() : ProgramProcess(plain()) {}
};

TEST(ProbefsCommand, MountsWithTheKernelsModesAndUnmountsCleanly) {
  Mount m;
  ASSERT_TRUE(m.ok()) << m.daemon_stderr();
  for (const char* f : {"README", "targets", "kprobes"})
    EXPECT_NE(mode_of(m.path(f)), 0u) << f;
  EXPECT_EQ(mode_of(m.dir()), S_IFDIR | 0700);  // the kernel's tracefs root
  EXPECT_EQ(mode_of(m.path("README")), S_IFREG | 0440);
  EXPECT_EQ(mode_of(m.path("targets")), S_IFREG | 0640);
  EXPECT_EQ(mode_of(m.path("kprobes")), S_IFDIR | 0755);
  EXPECT_EQ(list_dir(m.path("kprobes")),
            (std::vector<std::string>{"blacklist", "enabled", "list", "optimization"}));
  EXPECT_EQ(mode_of(m.path("kprobes/list")), S_IFREG | 0400);
  EXPECT_EQ(mode_of(m.path("kprobes/enabled")), S_IFREG | 0600);
  struct stat st;
  ASSERT_EQ(stat(m.path("README").c_str(), &st), 0);
  EXPECT_EQ(st.st_size, 0);  // and yet cat shows it: direct I/O
  std::string readme = m.read("README");
  // The lines perf probe looks for to learn what the probe syntax supports.
  for (const char* feature : {"Create/append/", "place (kretprobe): ", "ref_ctr_offset",
                              "u]<offset>", "\\imm-value,", " x8/16/32/64,"})
    EXPECT_NE(readme.find(feature), std::string::npos) << feature;
  EXPECT_EQ(m.unmount(), 0) << "the daemon ends with status 0 after fusermount3 -u";
}

// -o gid=N, as tracefs's: every file and directory belongs to group N, with the same
// modes; a value that is not a number is a usage error (status 2) naming the option.
TEST(ProbefsCommand, GidOptionGivesEveryFileThatGroup) {
  const gid_t group = getgid() == 4242 ? 4243 : 4242;
  Mount m({"-o", "gid=" + std::to_string(group)});
  ASSERT_TRUE(m.ok()) << m.daemon_stderr();
  for (const char* f : {"", "README", "kprobe_events", "events", "events/enable", "kprobes",
                        "kprobes/list", "per_cpu/cpu0/trace_pipe_raw", "trace_pipe"}) {
    struct stat st;
    ASSERT_EQ(stat(m.path(f).c_str(), &st), 0) << f;
    EXPECT_EQ(st.st_gid, group) << f;
    EXPECT_EQ(st.st_uid, getuid()) << f;
  }
  EXPECT_EQ(mode_of(m.dir()), S_IFDIR | 0700);
  EXPECT_EQ(mode_of(m.path("README")), S_IFREG | 0440);
  EXPECT_EQ(mode_of(m.path("kprobe_events")), S_IFREG | 0640);
  EXPECT_EQ(m.unmount(), 0);

  char tmpl[] = "/tmp/probefs-gid-XXXXXX";
  ASSERT_TRUE(mkdtemp(tmpl));
  CommandResult bad = run_command({PROBEFS_BIN, "-o", "allow_other,gid=staff", tmpl}, 30000);
  EXPECT_EQ(bad.exit_code(), 2);
  EXPECT_EQ(bad.err, "probefs: bad option: gid=staff\n");
  EXPECT_FALSE(testing::probefs_mounted(tmpl));
  rmdir(tmpl);
}

TEST(ProbefsCommand, BackgroundModeReturnsOnceTheMountIsReady) {
  char tmpl[] = "/tmp/probefs-bg-XXXXXX";
  ASSERT_TRUE(mkdtemp(tmpl));
  std::string dir = tmpl;
  CommandResult r = run_command({PROBEFS_BIN, dir}, 30000);
  EXPECT_EQ(r.exit_code(), 0) << r.err;
  // Ready when the command returned: no waiting here.
  EXPECT_TRUE(testing::probefs_mounted(dir));
  EXPECT_EQ(access((dir + "/targets").c_str(), R_OK), 0);
  CommandResult again = run_command({PROBEFS_BIN, dir}, 30000);
  EXPECT_EQ(again.exit_code(), 1);
  EXPECT_EQ(again.err, "probefs: " + dir + ": already mounted (probefs)\n");
  CommandResult u = run_command({"fusermount3", "-u", dir}, 30000);
  EXPECT_EQ(u.exit_code(), 0) << u.err;
  EXPECT_TRUE(testing::wait_mounted(dir, false, 20000));
  if (testing::probefs_mounted(dir)) umount2(dir.c_str(), MNT_DETACH);
  rmdir(dir.c_str());
}

TEST(ProbefsCommand, OneLineErrors) {
  CommandResult r = run_command({PROBEFS_BIN, "/nonexistent/dir"});
  EXPECT_EQ(r.exit_code(), 1);
  EXPECT_EQ(r.err, "probefs: /nonexistent/dir: No such file or directory\n");
  r = run_command({PROBEFS_BIN, "/etc/passwd"});
  EXPECT_EQ(r.exit_code(), 1);
  EXPECT_EQ(r.err, "probefs: /etc/passwd: not a directory\n");
  r = run_command({PROBEFS_BIN, "attach", "/tmp", "1"});
  EXPECT_EQ(r.exit_code(), 1);
  EXPECT_EQ(r.err, "probefs: /tmp: not a probefs mount\n");
  r = run_command({PROBEFS_BIN});
  EXPECT_EQ(r.exit_code(), 2);
  EXPECT_NE(r.err.find("usage: probefs"), std::string::npos);
  r = run_command({PROBEFS_BIN, "--help"});
  EXPECT_EQ(r.exit_code(), 0);
  EXPECT_NE(r.out.find("probefs exec [--strict] MOUNTPOINT"), std::string::npos);
  r = run_command({PROBEFS_BIN, "--version"});
  EXPECT_EQ(r.exit_code(), 0);
  EXPECT_EQ(r.out.rfind("probefs ", 0), 0u);

  Mount m;
  ASSERT_TRUE(m.ok()) << m.daemon_stderr();
  r = run_command({PROBEFS_BIN, "attach", m.dir(), "99999999999"});
  EXPECT_EQ(r.exit_code(), 1);
  EXPECT_EQ(r.err, "probefs: attach 99999999999: not a pid: 99999999999\n");
  r = run_command({PROBEFS_BIN, "attach", m.dir(), "4194303"});
  EXPECT_EQ(r.exit_code(), 1);
  EXPECT_EQ(r.err, "probefs: attach 4194303: no such process\n");
  r = run_command({PROBEFS_BIN, "detach", m.dir(), "1"});
  EXPECT_EQ(r.exit_code(), 1);
  EXPECT_EQ(r.err, "probefs: detach 1: pid 1 is not a target\n");
  // Garbage to the command channel: EINVAL, and the reason on the same open file.
  EXPECT_EQ(m.write("targets", "launch the rockets"), EINVAL);
  EXPECT_EQ(m.read("targets"), "");
}

TEST(ProbefsCommand, AttachAndDetachListTheTarget) {
  Mount m;
  ASSERT_TRUE(m.ok()) << m.daemon_stderr();
  Program p;
  ASSERT_EQ(p.ask("call 1").rfind("ok", 0), 0u);
  CommandResult r = run_command({PROBEFS_BIN, "attach", m.dir(), std::to_string(p.pid())});
  ASSERT_EQ(r.exit_code(), 0) << r.err;
  std::string targets = m.read("targets");
  EXPECT_EQ(targets.rfind(std::to_string(p.pid()) + " traced_prog attached ", 0), 0u) << targets;
  r = run_command({PROBEFS_BIN, "attach", m.dir(), std::to_string(p.pid())});
  EXPECT_EQ(r.exit_code(), 1);
  EXPECT_NE(r.err.find("is traced already"), std::string::npos) << r.err;
  r = run_command({PROBEFS_BIN, "detach", m.dir(), std::to_string(p.pid())});
  EXPECT_EQ(r.exit_code(), 0) << r.err;
  EXPECT_EQ(m.read("targets"), "");
  EXPECT_EQ(p.ask("call 10"), "ok 135");
  EXPECT_EQ(p.quit(), 0);
}

TEST(ProbefsCommand, UnmountAndDaemonDeathLeaveTargetsRunning) {
  Program a, b;
  {
    Mount m;
    ASSERT_TRUE(m.ok()) << m.daemon_stderr();
    ASSERT_EQ(run_command({PROBEFS_BIN, "attach", m.dir(), std::to_string(a.pid())}).exit_code(), 0);
    EXPECT_EQ(m.unmount(), 0);
  }
  EXPECT_EQ(a.ask("call 10"), "ok 135");
  {
    Mount m;
    ASSERT_TRUE(m.ok()) << m.daemon_stderr();
    ASSERT_EQ(run_command({PROBEFS_BIN, "attach", m.dir(), std::to_string(b.pid())}).exit_code(), 0);
    kill(m.daemon(), SIGKILL);
    EXPECT_EQ(b.ask("call 10"), "ok 135");
  }  // the dead daemon's mount is taken down by the fixture
  EXPECT_EQ(b.ask("call 10"), "ok 135");
  EXPECT_EQ(a.quit(), 0);
  EXPECT_EQ(b.quit(), 0);
}

}  // namespace
}  // namespace probefs::fs

namespace probefs::fs {
namespace {

// Waits (bounded) until `pid` sits in the read system call: the reader is blocked.
bool blocked_in_read(pid_t pid, int timeout_ms) {
  const auto deadline = testing::Clock::now() + std::chrono::milliseconds(timeout_ms);
  while (testing::ms_left(deadline) > 0) {
    std::ifstream in("/proc/" + std::to_string(pid) + "/syscall");
    std::string nr;
    in >> nr;
    if (nr == "0") return true;  // __NR_read
    pollfd none{-1, 0, 0};
    poll(&none, 0, 5);  // re-check: nothing to wait on but the reader's progress
  }
  return false;
}

TEST(ProbefsCommand, ExecRunsTheProgramInTheForegroundAsATarget) {
  Mount m;
  ASSERT_TRUE(m.ok()) << m.daemon_stderr();
  // Defined before the program exists: MOD:SYM waits for the executable's basename.
  ASSERT_EQ(m.write("kprobe_events", "p:t/add traced_prog:traced_add a=%di b=%si"), 0);
  ASSERT_EQ(m.write("events/t/add/enable", "1"), 0);
  CommandResult r = run_command({PROBEFS_BIN, "exec", m.dir(), "--", PROBEFS_TRACED_PROG}, 60000,
                                "call 3\nquit\n");
  EXPECT_EQ(r.exit_code(), 0) << r.err;
  EXPECT_EQ(r.out, "ready\nok 9\n");
  std::string trace = m.read("trace");
  for (int i = 0; i < 3; ++i) {
    char want[64];
    snprintf(want, sizeof want, " add: (traced_add+0x0/0x");
    EXPECT_NE(trace.find(want), std::string::npos) << trace;
    snprintf(want, sizeof want, ") a=0x%x b=0x%x\n", i, 2 * i);
    EXPECT_NE(trace.find(want), std::string::npos) << want << "\n" << trace;
  }
  // Its exit status is probefs's; a missing command is the shell's 127.
  r = run_command({PROBEFS_BIN, "exec", m.dir(), "sh", "-c", "exit 7"});
  EXPECT_EQ(r.exit_code(), 7) << r.err;
  r = run_command({PROBEFS_BIN, "exec", m.dir(), "--", "/nonexistent/prog"});
  EXPECT_EQ(r.exit_code(), 127);
  EXPECT_EQ(r.err, "probefs: /nonexistent/prog: No such file or directory\n");
}

// What traced_prog's `mix T N` answers: T threads, each summing traced_mix_o0(i, 2i).
std::string mix_answer(long t, long n) {
  long sum = 0;
  for (long i = 0; i < n; ++i) sum += ((i * 3 + 2 * i) ^ (i >> 1)) - (2 * i) / 2 + (i & 7);
  return "ok " + std::to_string(t * sum);
}

// kprobe_profile's hit count of each event whose name starts with `prefix`.
std::map<std::string, long> profile_hits(const Mount& m, const std::string& prefix) {
  std::map<std::string, long> out;
  std::istringstream in(m.read("kprobe_profile"));
  std::string name;
  long hits, missed;
  while (in >> name >> hits >> missed)
    if (name.rfind(prefix, 0) == 0) out[name] = hits;
  return out;
}

// Probes side by side: one on every instruction of a function at -O0 (the mount refuses
// each offset inside an instruction), all enabled while threads call it. A jmp never
// covers another probe: every probe counts every call, and the program computes what it
// computes unprobed. Then the same while probes are removed and defined again under the
// calls: nothing crashes, nothing computes differently.
TEST(ProbefsCommand, AProbeOnEveryInstructionOfAFunctionCountsEveryCall) {
  Mount m;
  ASSERT_TRUE(m.ok()) << m.daemon_stderr();
  testing::ProgramProcess p(testing::ProgramProcess::under_probefs(m.dir()));
  ASSERT_TRUE(p.ready());
  const testing::ElfSymbol fn = testing::find_elf_symbol(PROBEFS_TRACED_PROG, "traced_mix_o0");
  ASSERT_TRUE(fn.found && fn.size > 16) << "traced_mix_o0 in " << PROBEFS_TRACED_PROG;
  std::vector<std::string> names;
  for (uint64_t off = 0; off < fn.size; ++off) {
    const std::string name = "o" + std::to_string(off);
    const std::string def = "p:adj/" + name + " traced_prog:traced_mix_o0+" + std::to_string(off);
    const int rc = m.write("kprobe_events", def);
    if (rc == 0) names.push_back(name);
    else EXPECT_EQ(rc, EILSEQ) << def;
  }
  ASSERT_GT(names.size(), 8u);
  ASSERT_EQ(m.write("events/adj/enable", "1"), 0);
  EXPECT_EQ(p.ask("mix 4 500"), mix_answer(4, 500));
  const std::map<std::string, long> hits = profile_hits(m, "o");
  EXPECT_EQ(hits.size(), names.size());
  for (const std::string& name : names) EXPECT_EQ(hits.count(name) ? hits.at(name) : -1, 2000) << name;

  ASSERT_TRUE(p.send("mix 4 20000"));
  for (int round = 0; round < 3; ++round) {
    for (size_t i = round % 2; i < names.size(); i += 2) {
      const std::string& name = names[i];
      const std::string def = "p:adj/" + name + " traced_prog:traced_mix_o0+" + name.substr(1);
      ASSERT_EQ(m.write("events/adj/" + name + "/enable", "0"), 0) << name;
      ASSERT_EQ(m.write("kprobe_events", "-:adj/" + name), 0) << name;
      ASSERT_EQ(m.write("kprobe_events", def), 0) << def;
      ASSERT_EQ(m.write("events/adj/" + name + "/enable", "1"), 0) << name;
    }
  }
  EXPECT_EQ(p.answer(120000), mix_answer(4, 20000));
  EXPECT_EQ(p.quit(), 0);
}

// Waits (bounded) until process `pid` is in state `want` ('T': stopped) or not in it.
bool wait_state(pid_t pid, bool stopped) {
  for (int i = 0; i < 2000; ++i) {
    std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
    std::string stat;
    std::getline(in, stat);
    const size_t paren = stat.rfind(')');
    if (paren != std::string::npos && paren + 2 < stat.size() &&
        (stat[paren + 2] == 'T') == stopped)
      return true;
    usleep(5000);  // polling a state the kernel sets, with a bound
  }
  return false;
}

// One target stopped (SIGSTOP) beside a running one: defining, enabling, filtering and
// reading every file succeed and hold nobody up; `targets` says what the stopped one has
// pending; the running one's events fire; once continued, the stopped one does what it
// missed before it runs on, and its events fire too. Unmounting with a target stopped
// succeeds.
TEST(ProbefsCommand, AStoppedTargetHoldsUpNobody) {
  Mount m;
  ASSERT_TRUE(m.ok()) << m.daemon_stderr();
  testing::ProgramProcess running(testing::ProgramProcess::under_probefs(m.dir()));
  testing::ProgramProcess stopped(testing::ProgramProcess::under_probefs(m.dir()));
  ASSERT_TRUE(running.ready() && stopped.ready());
  ASSERT_EQ(kill(stopped.pid(), SIGSTOP), 0);
  ASSERT_TRUE(wait_state(stopped.pid(), true));

  ASSERT_EQ(m.write("kprobe_events", "p:st/add traced_prog:traced_add a=%di"), 0);
  ASSERT_EQ(m.write("kprobe_events", "r:st/ret traced_prog:traced_add v=$retval"), 0);
  ASSERT_EQ(m.write("events/st/add/filter", "a < 5"), 0);
  ASSERT_EQ(m.write("events/st/enable", "1"), 0);
  ASSERT_EQ(m.write("events/st/ret/enable", "0"), 0);
  for (const char* f : {"kprobe_events", "uprobe_events", "dynamic_events", "kprobe_profile",
                        "kprobes/list", "kprobes/blacklist", "trace", "targets",
                        "events/st/add/format", "events/st/add/filter", "error_log"})
    EXPECT_EQ(m.read(f).rfind("<errno", 0), std::string::npos) << f;
  const std::string targets = m.read("targets");
  EXPECT_NE(targets.find(std::to_string(stopped.pid()) + " traced_prog launched stopped pending="),
            std::string::npos)
      << targets;

  EXPECT_EQ(running.ask("call 10"), "ok 135");
  std::string trace = m.read("trace");
  const std::string running_tag = "-" + std::to_string(running.pid()) + " ";
  const std::string stopped_tag = "-" + std::to_string(stopped.pid()) + " ";
  size_t lines = 0;
  for (size_t at = trace.find(running_tag); at != std::string::npos;
       at = trace.find(running_tag, at + 1))
    ++lines;
  EXPECT_EQ(lines, 5u) << trace;
  EXPECT_EQ(trace.find(stopped_tag), std::string::npos) << trace;

  ASSERT_EQ(kill(stopped.pid(), SIGCONT), 0);
  ASSERT_TRUE(wait_state(stopped.pid(), false));
  // Its agent does what it missed as soon as it runs: targets stops saying pending.
  bool caught_up = false;
  for (int i = 0; i < 2000 && !caught_up; ++i) {
    caught_up = m.read("targets").find("pending=") == std::string::npos;
    if (!caught_up) usleep(5000);  // polling the daemon's state, with a bound
  }
  ASSERT_TRUE(caught_up) << m.read("targets");
  EXPECT_EQ(stopped.ask("call 10"), "ok 135");
  trace = m.read("trace");
  lines = 0;
  for (size_t at = trace.find(stopped_tag); at != std::string::npos;
       at = trace.find(stopped_tag, at + 1))
    ++lines;
  EXPECT_EQ(lines, 5u) << trace;

  ASSERT_EQ(kill(stopped.pid(), SIGSTOP), 0);
  ASSERT_TRUE(wait_state(stopped.pid(), true));
  EXPECT_EQ(m.write("events/st/enable", "0"), 0);
  EXPECT_EQ(m.unmount(), 0);
  kill(stopped.pid(), SIGCONT);
  EXPECT_EQ(running.quit(), 0);
  EXPECT_EQ(stopped.quit(), 0);
}

// A symbol that is one of several names of its address (libc's fork, also __fork and
// __libc_fork) is named as the definition asked, in the lines of its entry and return
// events (the child's return too, through the labels its symbolizer takes from its
// parent) as in kprobes/list.
TEST(ProbefsCommand, AnAliasIsNamedAsAskedInLinesAndList) {
  Mount m;
  ASSERT_TRUE(m.ok()) << m.daemon_stderr();
  ASSERT_EQ(m.write("kprobe_events", "p:al/f libc:fork"), 0);
  ASSERT_EQ(m.write("kprobe_events", "r:al/fr libc:fork $retval"), 0);
  ASSERT_EQ(m.write("events/al/enable", "1"), 0);
  testing::ProgramProcess prog(testing::ProgramProcess::under_probefs(m.dir()));
  ASSERT_TRUE(prog.ready());
  const std::string forked = prog.ask("fork 1");
  ASSERT_EQ(forked.rfind("ok ", 0), 0u) << forked;
  const std::string list = m.read("kprobes/list");
  EXPECT_NE(list.find("  k  fork+0x0  libc.so.6 "), std::string::npos) << list;
  EXPECT_NE(list.find("  r  fork+0x0  libc.so.6 "), std::string::npos) << list;
  const std::string trace = m.read("trace");
  EXPECT_NE(trace.find(" f: (fork+0x0/0x"), std::string::npos) << trace;
  size_t returns = 0;
  for (size_t at = trace.find(" fr: ("); at != std::string::npos; at = trace.find(" fr: (", at + 1)) {
    const std::string line = trace.substr(at, trace.find('\n', at) - at);
    EXPECT_NE(line.find(" <- fork [libc.so.6]) arg1="), std::string::npos) << line;
    ++returns;
  }
  EXPECT_EQ(returns, 2u) << trace;  // fork returns in the parent and in the child
  EXPECT_EQ(trace.find("__fork"), std::string::npos) << trace;
  EXPECT_EQ(prog.quit(), 0);
}

// uprobe offsets where no symbol or FDE gives a function, as the kernel takes them: the
// first two instructions of the program's .init (run once, by the dynamic linker, after
// the agent's constructor has placed the probes) are placed, defined before the program
// starts, and each counts its one hit; an offset inside the first instruction is refused
// with the kernel's error once the file is mapped.
TEST(ProbefsCommand, UprobesInCodeNoFunctionDescribes) {
  const testing::ElfSymbol init = testing::find_elf_symbol(PROBEFS_TRACED_PROG, "_init");
  ASSERT_TRUE(init.found);
  ASSERT_EQ(init.size, 0u) << "_init has a size: this test wants code no symbol bounds";
  std::ifstream in(PROBEFS_TRACED_PROG, std::ios::binary);
  in.seekg(static_cast<std::streamoff>(init.file_offset));
  unsigned char first[4] = {};
  in.read(reinterpret_cast<char*>(first), sizeof first);
  // sub $8,%rsp or endbr64: a four-byte first instruction either way.
  const bool four = memcmp(first, "\x48\x83\xec\x08", 4) == 0 ||
                    memcmp(first, "\xf3\x0f\x1e\xfa", 4) == 0;
  ASSERT_TRUE(four) << std::hex << int{first[0]} << " " << int{first[1]};
  auto at = [&](uint64_t delta) {
    char hex[32];
    snprintf(hex, sizeof hex, "0x%lx", static_cast<unsigned long>(init.file_offset + delta));
    return std::string(PROBEFS_TRACED_PROG) + ":" + hex;
  };

  Mount m;
  ASSERT_TRUE(m.ok()) << m.daemon_stderr();
  ASSERT_EQ(m.write("uprobe_events", "p:init/first " + at(0)), 0);
  ASSERT_EQ(m.write("uprobe_events", "p:init/second " + at(4)), 0);
  // Inside the first instruction, defined before any process maps the file: accepted (no
  // process to check it in), then refused in the process, and said so in error_log.
  ASSERT_EQ(m.write("uprobe_events", "p:init/early " + at(2)), 0);
  ASSERT_EQ(m.write("events/init/first/enable", "1"), 0);
  ASSERT_EQ(m.write("events/init/second/enable", "1"), 0);
  testing::ProgramProcess prog(testing::ProgramProcess::under_probefs(m.dir()));
  ASSERT_TRUE(prog.ready());
  // The daemon says it as it hands out what happened to its targets (its service thread,
  // right after the process got its probes).
  const std::string early_cmd = "  Command: p:init/early " + at(2) + "\n";
  std::string early_log = m.read("error_log");
  for (int i = 0; i < 2000 && early_log.find(early_cmd) == std::string::npos; ++i) {
    usleep(5000);  // polling the daemon's state, with a bound
    early_log = m.read("error_log");
  }
  const size_t early = early_log.find(early_cmd);
  ASSERT_NE(early, std::string::npos) << early_log;
  EXPECT_NE(early_log.rfind("trace_uprobe: error: Probe point is not an instruction boundary\n",
                            early),
            std::string::npos)
      << early_log;
  EXPECT_NE(m.read("uprobe_events").find("p:init/early "), std::string::npos);  // it stands
  const std::string targets = m.read("targets");
  EXPECT_NE(targets.find(std::to_string(prog.pid()) + " traced_prog launched "),
            std::string::npos)
      << targets;
  EXPECT_NE(targets.find(" not_placed=1\n"), std::string::npos) << targets;
  const std::string list = m.read("kprobes/list");
  size_t placed = 0;
  for (size_t i = list.find("  k  "); i != std::string::npos; i = list.find("  k  ", i + 1))
    ++placed;
  EXPECT_EQ(placed, 2u) << list;
  const std::string profile = m.read("uprobe_profile");
  for (const char* ev : {" first ", " second "}) {
    const size_t line = profile.find(ev);
    ASSERT_NE(line, std::string::npos) << profile;
    std::istringstream fields(profile.substr(line, profile.find('\n', line) - line));
    std::string field, hits;
    while (fields >> field) hits = field;
    EXPECT_EQ(hits, "1") << profile;  // the line's last field
  }
  const std::string trace = m.read("trace");
  EXPECT_NE(trace.find(" first: (0x"), std::string::npos) << trace;
  EXPECT_NE(trace.find(" second: (0x"), std::string::npos) << trace;

  // Inside the first instruction: the kernel's EILSEQ, and its error_log entry.
  EXPECT_EQ(m.write("uprobe_events", "p:init/inside " + at(1)), EILSEQ);
  EXPECT_NE(m.read("error_log").find("Probe point is not an instruction boundary"),
            std::string::npos)
      << m.read("error_log");
  EXPECT_EQ(prog.quit(), 0);
}

// kprobe_profile's misses come from the targets' ring areas, where their agents count
// them as they happen (a return probe with maxactive 1 on a recursive function misses
// every nested return): a stopped target's read at once. kprobes/list shows a stopped
// target as it last was, beside the running one as it is now.
TEST(ProbefsCommand, AStoppedTargetsMissesAndListReadAtOnce) {
  Mount m;
  ASSERT_TRUE(m.ok()) << m.daemon_stderr();
  testing::ProgramProcess running(testing::ProgramProcess::under_probefs(m.dir()));
  testing::ProgramProcess stopped(testing::ProgramProcess::under_probefs(m.dir()));
  ASSERT_TRUE(running.ready() && stopped.ready());
  ASSERT_EQ(m.write("kprobe_events", "r1:st/rec traced_prog:traced_rec v=$retval"), 0);
  ASSERT_EQ(m.write("events/st/rec/enable", "1"), 0);
  EXPECT_EQ(stopped.ask("recurse 4"), "ok 4");  // 5 calls in flight: 4 returns missed
  EXPECT_EQ(running.ask("recurse 2"), "ok 2");  // 3 calls: 2 missed
  auto count = [](const std::string& text, const std::string& what) {
    size_t n = 0;
    for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
    return n;
  };
  std::string list = m.read("kprobes/list");
  EXPECT_EQ(count(list, "  r  traced_rec+0x0"), 2u) << list;
  EXPECT_EQ(count(list, "[DISABLED]"), 0u) << list;

  ASSERT_EQ(kill(stopped.pid(), SIGSTOP), 0);
  ASSERT_TRUE(wait_state(stopped.pid(), true));
  std::istringstream profile(m.read("kprobe_profile"));
  std::string name;
  long hits = -1, missed = -1;
  ASSERT_TRUE(profile >> name >> hits >> missed);
  EXPECT_EQ(name, "rec");
  EXPECT_EQ(hits, 2);
  EXPECT_EQ(missed, 6);

  ASSERT_EQ(m.write("events/st/rec/enable", "0"), 0);
  list = m.read("kprobes/list");
  EXPECT_EQ(count(list, "  r  traced_rec+0x0"), 2u) << list;
  EXPECT_EQ(count(list, "[DISABLED]"), 1u) << list;  // the running one's; the other's is pending
  EXPECT_NE(m.read("targets").find(std::to_string(stopped.pid()) + " traced_prog launched stopped pending="),
            std::string::npos)
      << m.read("targets");

  ASSERT_EQ(kill(stopped.pid(), SIGCONT), 0);
  ASSERT_TRUE(wait_state(stopped.pid(), false));
  list = m.read("kprobes/list");  // it is asked again, and answers once it caught up
  EXPECT_EQ(count(list, "[DISABLED]"), 2u) << list;
  EXPECT_EQ(m.read("targets").find("pending="), std::string::npos) << m.read("targets");
  EXPECT_EQ(running.quit(), 0);
  EXPECT_EQ(stopped.quit(), 0);
}

TEST(ProbefsCommand, ABlockedTracePipeReaderReturnsOnASignalAndOnUnmount) {
  Mount m;
  ASSERT_TRUE(m.ok()) << m.daemon_stderr();
  // Ctrl-C: the reader ends at once.
  pid_t cat = fork();
  if (cat == 0) {
    execlp("cat", "cat", m.path("trace_pipe").c_str(), nullptr);
    _exit(127);
  }
  ASSERT_TRUE(blocked_in_read(cat, 20000));
  kill(cat, SIGINT);
  int st = testing::wait_child(cat, 20000);
  ASSERT_NE(st, -1) << "the reader did not return on SIGINT";
  EXPECT_TRUE(WIFSIGNALED(st) && WTERMSIG(st) == SIGINT);

  // A lazy unmount while the reader waits: it reads end of file, and the daemon ends.
  cat = fork();
  if (cat == 0) {
    execlp("cat", "cat", m.path("trace_pipe").c_str(), nullptr);
    _exit(127);
  }
  ASSERT_TRUE(blocked_in_read(cat, 20000));
  CommandResult u = run_command({"fusermount3", "-u", "-z", m.dir()});
  EXPECT_EQ(u.exit_code(), 0) << u.err;
  st = testing::wait_child(cat, 20000);
  ASSERT_NE(st, -1) << "the reader did not return on unmount";
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << st;
  EXPECT_EQ(testing::wait_child(m.daemon(), 20000), 0) << m.daemon_stderr();
}

}  // namespace
}  // namespace probefs::fs

namespace probefs::fs {
namespace {

// As a user without root: the mount is the user's (root itself is kept out), and only
// the user's own processes can be attached.
TEST(ProbefsCommand, AUserWithoutRootTracesItsOwnProcessesOnly) {
  struct stat dev;
  if (stat("/dev/fuse", &dev) != 0 || (dev.st_mode & 0006) != 0006)
    GTEST_SKIP() << "/dev/fuse is not open to every user here";
  if (geteuid() != 0) GTEST_SKIP() << "needs root to become another user";
  const std::string nobody = "--reuid=65534";
  char tmpl[] = "/tmp/probefs-user-XXXXXX";
  ASSERT_TRUE(mkdtemp(tmpl));
  std::string dir = tmpl;
  chown(dir.c_str(), 65534, 65534);
  auto as_user = [&](std::vector<std::string> argv) {
    std::vector<std::string> full = {"setpriv", nobody, "--regid=65534", "--clear-groups"};
    full.insert(full.end(), argv.begin(), argv.end());
    return full;
  };
  CommandResult r = run_command(as_user({PROBEFS_BIN, dir}));
  ASSERT_EQ(r.exit_code(), 0) << r.err;
  struct Cleanup {
    std::string d;
    ~Cleanup() {
      run_command({"fusermount3", "-u", d});
      if (testing::probefs_mounted(d)) umount2(d.c_str(), MNT_DETACH);
      rmdir(d.c_str());
    }
  } cleanup{dir};
  EXPECT_EQ(access((dir + "/README").c_str(), R_OK), -1) << "root must be kept out";
  EXPECT_EQ(errno, EACCES);
  // The user's own sleeping process: attached. Another user's (pid 1): refused.
  pid_t sleeper = fork();
  if (sleeper == 0) {
    if (setgid(65534) != 0 || setuid(65534) != 0) _exit(1);
    execlp("sleep", "sleep", "60", nullptr);
    _exit(127);
  }
  r = run_command(as_user({PROBEFS_BIN, "attach", dir, std::to_string(sleeper)}));
  EXPECT_EQ(r.exit_code(), 0) << r.err;
  r = run_command(as_user({"cat", dir + "/targets"}));
  EXPECT_EQ(r.out.rfind(std::to_string(sleeper) + " sleep attached ", 0), 0u) << r.out;
  r = run_command(as_user({PROBEFS_BIN, "attach", dir, "1"}));
  EXPECT_EQ(r.exit_code(), 1);
  EXPECT_EQ(r.err, "probefs: attach 1: pid 1 belongs to another user\n");
  r = run_command(as_user({"fusermount3", "-u", dir}));
  EXPECT_EQ(r.exit_code(), 0) << r.err;
  EXPECT_TRUE(testing::wait_mounted(dir, false, 20000));
  kill(sleeper, SIGKILL);
  testing::wait_child(sleeper, 10000);
}

// ---- A program probefs cannot enter is never traced silently -----------------------------

const std::string kStatic = PROBEFS_UNTRACEABLE_STATIC;

// `targets`' line for pid once its state is `state` ("" when that is not so within 30 s:
// the daemon judges a process that exec'd on its next service tick).
std::string listed_as(const Mount& m, pid_t pid, const std::string& state) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  const std::string head = std::to_string(pid) + " ";
  do {
    std::istringstream in(m.read("targets"));
    for (std::string l; std::getline(in, l);)
      if (l.rfind(head, 0) == 0 && l.size() >= state.size() &&
          l.find(" " + state) != std::string::npos)
        return l;
    usleep(5000);  // pacing only: the loop waits for the line itself
  } while (std::chrono::steady_clock::now() < deadline);
  return "";
}

// error_log's entry for pid (the last one), once there is one ("" when none comes within
// 30 s: the daemon writes it from its service thread).
std::string logged_for(const Mount& m, pid_t pid) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  do {
    const std::string log = m.read("error_log");
    const size_t at = log.rfind("  Command: pid " + std::to_string(pid) + ": ");
    if (at != std::string::npos) {
      const size_t start = log.rfind('[', at);
      return log.substr(start, log.find('\n', at) - start);
    }
    usleep(5000);  // pacing only: the loop waits for the entry itself
  } while (std::chrono::steady_clock::now() < deadline);
  return "";
}

// `probefs exec` of a static program says so on stderr, in error_log and in `targets`
// while it runs, and runs it; with --strict it refuses it.
TEST(Untraceable, ExecOfAStaticProgramSaysSoAndRunsItUntraced) {
  Mount m;
  ASSERT_TRUE(m.ok()) << m.daemon_stderr();
  const std::string line = kStatic +
                           " is statically linked: no dynamic loader runs in it to preload the "
                           "agent";
  CommandResult r = run_command({PROBEFS_BIN, "exec", m.dir(), "--", kStatic}, 60000, "ping\nquit\n");
  EXPECT_EQ(r.exit_code(), 0) << r.err;
  EXPECT_EQ(r.out, "ready\npong\n");
  EXPECT_EQ(r.err, "probefs: exec: " + line + "; it runs untraced\n");
  testing::ProgramProcess p({PROBEFS_BIN, "exec", m.dir(), "--", kStatic});
  ASSERT_TRUE(p.ready());
  EXPECT_EQ(listed_as(m, p.pid(), "untraceable:static"),
            std::to_string(p.pid()) + " untraceable_sta launched untraceable:static")
      << m.read("targets");
  const std::string entry = logged_for(m, p.pid());
  EXPECT_NE(entry.find("] probefs: error: A process runs untraced: probefs cannot enter it\n"
                       "  Command: pid " + std::to_string(p.pid()) + ": " + line),
            std::string::npos)
      << m.read("error_log");
  EXPECT_EQ(p.ask("ping"), "pong");
  EXPECT_EQ(p.quit(), 0);
  r = run_command({PROBEFS_BIN, "exec", "--strict", m.dir(), "--", kStatic}, 60000, "quit\n");
  EXPECT_EQ(r.exit_code(), 126);
  EXPECT_EQ(r.out, "");
  EXPECT_EQ(r.err, "probefs: exec: " + line + "; not run (--strict)\n");
  // A dynamic program under --strict is traced as ever.
  r = run_command({PROBEFS_BIN, "exec", "--strict", m.dir(), "--", PROBEFS_TRACED_PROG}, 60000,
                  "quit\n");
  EXPECT_EQ(r.exit_code(), 0) << r.err;
  EXPECT_EQ(r.err, "");
}

// A traced program that execs a static program: its new image is said to be untraceable
// as soon as the daemon sees the exec.
TEST(Untraceable, ATargetThatExecsAStaticProgramIsSaidAtOnce) {
  Mount m;
  ASSERT_TRUE(m.ok()) << m.daemon_stderr();
  testing::ProgramProcess p({PROBEFS_BIN, "exec", m.dir(), "--", PROBEFS_TRACED_PROG});
  ASSERT_TRUE(p.ready());
  ASSERT_NE(listed_as(m, p.pid(), "launched"), "");
  ASSERT_TRUE(p.send("run " + kStatic));
  EXPECT_EQ(p.answer(), "ready");  // the static program, in the same process
  EXPECT_NE(listed_as(m, p.pid(), "untraceable:static"), "") << m.read("targets");
  EXPECT_NE(logged_for(m, p.pid()).find(": " + kStatic + " is statically linked"),
            std::string::npos)
      << m.read("error_log");
  EXPECT_EQ(p.ask("ping"), "pong");
  EXPECT_EQ(p.quit(), 0);
}

// A program started without the agent in its environment (env -u LD_PRELOAD, from a
// target): no-agent, at once.
TEST(Untraceable, AProgramStartedWithoutTheAgentIsNoAgent) {
  Mount m;
  ASSERT_TRUE(m.ok()) << m.daemon_stderr();
  testing::ProgramProcess p({PROBEFS_BIN, "exec", m.dir(), "--", "env", "-u", "LD_PRELOAD",
                             PROBEFS_TRACED_PROG});
  ASSERT_TRUE(p.ready());
  EXPECT_NE(listed_as(m, p.pid(), "untraceable:no-agent"), "") << m.read("targets");
  EXPECT_NE(logged_for(m, p.pid()).find(" started without the agent in its environment"),
            std::string::npos)
      << m.read("error_log");
  EXPECT_EQ(p.quit(), 0);
}

// An agent that cannot reach the daemon it was started for says so on the program's
// stderr, and the program runs on untraced.
TEST(Untraceable, AnAgentThatCannotReachItsDaemonSaysSo) {
  CommandResult r = run_command(
      {"env", std::string("LD_PRELOAD=") + PROBEFS_AGENT_LIB,
       "PROBEFS_AGENT_LINK=/nonexistent/probefs.1.0123456789abcdef0123456789abcdef",
       PROBEFS_TRACED_PROG},
      60000, "call 2\nquit\n");
  EXPECT_EQ(r.exit_code(), 0) << r.err;
  EXPECT_EQ(r.out, "ready\nok 3\n");
  EXPECT_TRUE(r.err.rfind("probefs: agent: cannot reach the daemon (No such file or directory): "
                          "pid ", 0) == 0 &&
              r.err.find(" runs untraced\n") == r.err.size() - 15)
      << r.err;
}

// A set-user-ID program of another user (root runs one owned by nobody): its loader
// ignores the agent. Said by probefs exec, and of a target that execs it.
TEST(Untraceable, ASetUserIdProgramOfAnotherUserIsSecureExec) {
  if (geteuid() != 0) GTEST_SKIP() << "not root: cannot make a program of another user";
  const testing::TempDir dir;
  ASSERT_TRUE(dir.ok());
  struct statvfs vfs;
  ASSERT_EQ(statvfs(dir.path().c_str(), &vfs), 0);
  if (vfs.f_flag & ST_NOSUID) GTEST_SKIP() << "the temporary directory is on a nosuid mount";
  ASSERT_EQ(chmod(dir.path().c_str(), 0755), 0);
  const std::string copy = dir.file("suid_prog");
  std::filesystem::copy_file(PROBEFS_TRACED_PROG, copy);
  ASSERT_EQ(chown(copy.c_str(), 65534, 65534), 0);
  ASSERT_EQ(chmod(copy.c_str(), 04755), 0);
  Mount m;
  ASSERT_TRUE(m.ok()) << m.daemon_stderr();
  CommandResult r = run_command({PROBEFS_BIN, "exec", m.dir(), "--", copy}, 60000, "call 2\nquit\n");
  EXPECT_EQ(r.exit_code(), 0) << r.err;
  EXPECT_EQ(r.out, "ready\nok 3\n");
  EXPECT_EQ(r.err, "probefs: exec: " + copy +
                       " runs with other ids or capabilities than its user's (set-user-ID, "
                       "set-group-ID or file capabilities): its loader ignores the preloaded "
                       "agent; it runs untraced\n");
  // Exec'd by a target: the daemon finds the secure exec in the process.
  testing::ProgramProcess p({PROBEFS_BIN, "exec", m.dir(), "--", PROBEFS_TRACED_PROG});
  ASSERT_TRUE(p.ready());
  ASSERT_NE(listed_as(m, p.pid(), "launched"), "");
  ASSERT_TRUE(p.send("run " + copy));
  EXPECT_EQ(p.answer(), "ready");
  EXPECT_NE(listed_as(m, p.pid(), "untraceable:secure-exec"), "") << m.read("targets");
  EXPECT_EQ(p.quit(), 0);
}

}  // namespace
}  // namespace probefs::fs
