// The tracefs of a real probefs mount, end to end, through ordinary system calls and shell
// tools only (cat, bash's echo with >> and >, printf): the tree with the kernel's modes,
// the kernel's captured answers replayed (error table, read-back, truncation, trace_pipe
// reads and blocking), trace lines of a program run with `probefs exec`, perf probe
// unchanged against the mount, and the same uprobe on the kernel's own tracefs and on
// ours giving the same values in the same layout. The expected texts, errno values and
// error_log entries are the kernel's, as the tracefs reference captured them.
//
// Nothing here can hang: every read that may block is non-blocking behind poll with a
// deadline, or made by a child process that is killed at the end; every command runs with
// a timeout; mounts, programs and probes are taken down whatever a test did.
#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/select.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cinttypes>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/fs/bounded_reads.h"
#include "tests/fs/elf_symbols.h"
#include "tests/fs/error_log_text.h"
#include "tests/fs/kernel_tracefs.h"
#include "tests/fs/mount_fixture.h"
#include "tests/fs/program_process.h"
#include "tests/fs/shell_commands.h"
#include "tests/fs/trace_lines.h"

namespace probefs::fs {
namespace {

using testing::bash;
using testing::cat;
using testing::ChildReader;
using testing::CommandResult;
using testing::echo_append;
using testing::echo_truncate;
using testing::echo_write_error;
using testing::ElfSymbol;
using testing::error_log_entry;
using testing::error_log_without_stamps;
using testing::find_elf_symbol;
using testing::KernelTracefs;
using testing::Mount;
using testing::parse_trace_line;
using testing::printf_append;
using testing::ProgramProcess;
using testing::redirect_error;
using testing::render_trace_line;
using testing::run_command;
using testing::trace_body_lines;
using testing::TraceLine;

const std::string kProg = PROBEFS_TRACED_PROG;
const std::string kProgDir = kProg.substr(0, kProg.rfind('/'));
const std::string kProgName = kProg.substr(kProg.rfind('/') + 1);

std::string replace_all(std::string s, std::string_view from, std::string_view to) {
  for (size_t i = s.find(from); i != std::string::npos; i = s.find(from, i + to.size()))
    s.replace(i, from.size(), to);
  return s;
}

std::string hex(uint64_t v) {
  char b[32];
  snprintf(b, sizeof b, "0x%" PRIx64, v);
  return b;
}

// The kernel's read-back form of a uprobe offset.
std::string padded(uint64_t offset) {
  char b[32];
  snprintf(b, sizeof b, "0x%016" PRIx64, offset);
  return b;
}

std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  return lines;
}

const ElfSymbol& symbol(const char* name) {
  static std::map<std::string, ElfSymbol> cache;
  auto it = cache.find(name);
  if (it == cache.end()) it = cache.emplace(name, find_elf_symbol(kProg, name)).first;
  EXPECT_TRUE(it->second.found) << name;
  return it->second;
}

// Where the image of `program` starts in process `pid` (its mapping at file offset 0).
uint64_t load_base(pid_t pid, const std::string& program = kProg) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/maps");
  const std::string real = std::filesystem::canonical(program).string();
  for (std::string line; std::getline(in, line);) {
    uint64_t lo = 0, off = 1;
    char perms[8];
    int path_at = 0;
    if (sscanf(line.c_str(), "%" SCNx64 "-%*x %7s %" SCNx64 " %*s %*u %n", &lo, perms, &off,
               &path_at) < 3 || path_at == 0)
      continue;
    if (off == 0 && line.substr(static_cast<size_t>(path_at)) == real) return lo;
  }
  return 0;
}

// `perf probe`'s definition of an offset: "PATH:0xOFF".
std::string place(const char* sym) { return kProg + ":" + hex(symbol(sym).file_offset); }

class TracefsMountTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = m_.dir();
    ASSERT_TRUE(m_.ok()) << m_.daemon_stderr();
  }
  // The daemon ends cleanly at the unmount, having said nothing. (One line is let pass:
  // libfuse's own complaint when the daemon unmounts a mount already gone, a race of its
  // shutdown with fusermount3 that says nothing about the tests.)
  void TearDown() override {
    EXPECT_EQ(m_.unmount(), 0) << m_.daemon_stderr();
    std::string said = m_.daemon_stderr();
    const std::string gone = "fuse: failed to unmount " + dir_ + ": Invalid argument\n";
    if (size_t at = said.find(gone); at != std::string::npos) said.erase(at, gone.size());
    EXPECT_EQ(said, "");
  }

  std::string path(const std::string& rel) const { return m_.path(rel); }
  std::string read(const std::string& rel) const { return m_.read(rel); }
  // echo LINE >> FILE, which must succeed.
  void echo(const std::string& rel, const std::string& line) {
    CommandResult r = echo_append(path(rel), line);
    EXPECT_EQ(r.exit_code(), 0) << rel << " << " << line << ": " << r.err;
  }
  void clear_error_log() { ASSERT_EQ(m_.write("error_log", "", O_WRONLY | O_TRUNC), 0); }
  std::string error_log() const { return error_log_without_stamps(read("error_log")); }
  // The body lines of `trace` (no header).
  std::vector<std::string> trace_lines() const { return trace_body_lines(read("trace")); }
  // A program under `probefs exec` on this mount.
  std::unique_ptr<ProgramProcess> exec_program() {
    auto p = std::make_unique<ProgramProcess>(ProgramProcess::under_probefs(m_.dir()));
    EXPECT_TRUE(p->ready()) << m_.daemon_stderr();
    return p;
  }

  Mount m_;
  std::string dir_;  // the mount point (Mount forgets it at the unmount)
};

// ---- 1. the tree ------------------------------------------------------------------------

struct Found {
  mode_t mode;
  off_t size;
};

void walk(const std::string& root, const std::string& rel, std::map<std::string, Found>* out) {
  DIR* d = opendir((root + (rel.empty() ? "" : "/" + rel)).c_str());
  if (!d) return;
  std::vector<std::string> names;
  while (dirent* e = readdir(d)) {
    std::string n = e->d_name;
    if (n != "." && n != "..") names.push_back(n);
  }
  closedir(d);
  for (const std::string& n : names) {
    const std::string r = rel.empty() ? n : rel + "/" + n;
    struct stat st;
    if (lstat((root + "/" + r).c_str(), &st) != 0) continue;
    (*out)[r] = {st.st_mode, st.st_size};
    if (S_ISDIR(st.st_mode)) walk(root, r, out);
  }
}

// The kernel's mode of a path of the tree (with one uprobe-style event grp/ev and one
// kprobe-style kgrp/kev defined), or 0 when the kernel has no such file.
mode_t kernel_mode(const std::string& p) {
  static const std::map<std::string, mode_t> fixed = {
      {"README", S_IFREG | 0440},
      {"available_events", S_IFREG | 0440},
      {"available_tracers", S_IFREG | 0440},
      {"buffer_percent", S_IFREG | 0640},
      {"buffer_size_kb", S_IFREG | 0640},
      {"buffer_subbuf_size_kb", S_IFREG | 0640},
      {"buffer_total_size_kb", S_IFREG | 0440},
      {"current_tracer", S_IFREG | 0640},
      {"dynamic_events", S_IFREG | 0640},
      {"error_log", S_IFREG | 0640},
      {"free_buffer", S_IFREG | 0200},
      {"instances", S_IFDIR | 0750},
      {"kprobe_events", S_IFREG | 0640},
      {"kprobe_profile", S_IFREG | 0440},
      {"printk_formats", S_IFREG | 0440},
      {"saved_cmdlines", S_IFREG | 0440},
      {"saved_cmdlines_size", S_IFREG | 0640},
      {"saved_tgids", S_IFREG | 0440},
      {"set_event", S_IFREG | 0640},
      {"snapshot", S_IFREG | 0640},
      {"set_event_notrace_pid", S_IFREG | 0640},
      {"set_event_pid", S_IFREG | 0640},
      {"synthetic_events", S_IFREG | 0640},
      {"targets", S_IFREG | 0640},  // probefs's own, as writable as the definition files
      {"trace", S_IFREG | 0640},
      {"trace_clock", S_IFREG | 0640},
      {"timestamp_mode", S_IFREG | 0440},
      {"trace_marker", S_IFREG | 0220},
      {"trace_marker_raw", S_IFREG | 0220},
      {"trace_options", S_IFREG | 0640},
      {"trace_pipe", S_IFREG | 0440},
      {"tracing_cpumask", S_IFREG | 0640},
      {"tracing_on", S_IFREG | 0640},
      {"tracing_thresh", S_IFREG | 0640},
      {"uprobe_events", S_IFREG | 0640},
      {"uprobe_profile", S_IFREG | 0440},
      {"events", S_IFDIR | 0755},
      {"events/enable", S_IFREG | 0640},
      {"events/header_event", S_IFREG | 0440},
      {"events/header_page", S_IFREG | 0440},
      {"events/ftrace", S_IFDIR | 0755},
      {"events/ftrace/print/trigger", S_IFREG | 0640},
      {"options", S_IFDIR | 0750},
      {"per_cpu", S_IFDIR | 0750},
      // debugfs's kprobes/ and the debug.kprobes-optimization sysctl
      {"kprobes", S_IFDIR | 0755},
      {"kprobes/list", S_IFREG | 0400},
      {"kprobes/enabled", S_IFREG | 0600},
      {"kprobes/blacklist", S_IFREG | 0400},
      {"kprobes/optimization", S_IFREG | 0644},
  };
  if (auto it = fixed.find(p); it != fixed.end()) return it->second;
  std::vector<std::string> part;
  for (size_t s = 0, e; s <= p.size(); s = e + 1) {
    e = p.find('/', s);
    if (e == std::string::npos) e = p.size();
    part.push_back(p.substr(s, e - s));
  }
  if (part[0] == "options" && part.size() == 2) return S_IFREG | 0640;
  if (part[0] == "per_cpu" && part[1].rfind("cpu", 0) == 0) {
    if (part.size() == 2) return S_IFDIR | 0750;
    if (part.size() == 3 && part[2] == "stats") return S_IFREG | 0440;
    if (part.size() == 3 && part[2] == "trace") return S_IFREG | 0640;
    if (part.size() == 3 && part[2] == "trace_pipe") return S_IFREG | 0440;
    if (part.size() == 3 && part[2] == "trace_pipe_raw") return S_IFREG | 0440;
    if (part.size() == 3 && part[2] == "buffer_size_kb") return S_IFREG | 0640;
  }
  if (part[0] == "events" && part[1] == "ftrace") {  // print, bprint, bputs, function
    if (part.size() == 3) return S_IFDIR | 0755;
    if (part.size() == 4 && (part[3] == "format" || part[3] == "id" || part[3] == "hist"))
      return S_IFREG | 0440;
  }
  if (part[0] == "events" && (part[1] == "grp" || part[1] == "kgrp")) {
    if (part.size() == 2) return S_IFDIR | 0755;
    if (part.size() == 3 && (part[2] == "enable" || part[2] == "filter")) return S_IFREG | 0640;
    if (part.size() == 3 && (part[2] == "ev" || part[2] == "kev")) return S_IFDIR | 0755;
    if (part.size() == 4 && (part[3] == "enable" || part[3] == "filter" || part[3] == "trigger"))
      return S_IFREG | 0640;
    if (part.size() == 4 && (part[3] == "format" || part[3] == "id" || part[3] == "hist"))
      return S_IFREG | 0440;
  }
  return 0;
}

TEST_F(TracefsMountTest, EveryFileHasTheKernelsModeSizeZeroAndCatShowsIt) {
  echo("uprobe_events", "p:grp/ev " + place("traced_add") + " a=%di");
  echo("kprobe_events", "p:kgrp/kev " + kProgName + ":traced_add a=%di");
  std::map<std::string, Found> found;
  walk(m_.dir(), "", &found);
  // Everything the kernel has in these places is there.
  for (const char* must : {"README", "trace", "trace_pipe", "uprobe_events", "kprobe_events",
                           "dynamic_events", "events/grp/ev/format", "events/kgrp/kev/id",
                           "per_cpu/cpu0/trace_pipe", "kprobes/list", "options"})
    EXPECT_TRUE(found.count(must)) << must;
  const long cpus = sysconf(_SC_NPROCESSORS_CONF);
  for (long c = 0; c < cpus; ++c)
    EXPECT_TRUE(found.count("per_cpu/cpu" + std::to_string(c) + "/trace")) << c;
  // The files a fresh mount may show empty; every other readable file has text.
  const std::set<std::string> may_be_empty = {
      "error_log",      "set_event",   "saved_cmdlines", "targets",
      "kprobes/list",   "kprobes/blacklist",
      "printk_formats", "saved_tgids", "set_event_pid",  "set_event_notrace_pid",
      "synthetic_events"};
  for (const auto& [p, f] : found) {
    SCOPED_TRACE(p);
    EXPECT_EQ(f.mode, kernel_mode(p)) << std::oct << f.mode << " vs " << kernel_mode(p);
    if (!S_ISREG(f.mode)) continue;
    EXPECT_EQ(f.size, 0);
    const std::string name = p.substr(p.rfind('/') + 1);
    if (name == "trace_pipe" || name == "trace_pipe_raw") continue;  // block when empty
    if (name == "trace_marker" || name == "trace_marker_raw" || name == "free_buffer") {
      EXPECT_EQ(cat(path(p)), "<exit 1: cat: " + path(p) + ": Invalid argument\n>");
      continue;
    }
    // Direct I/O: cat (which trusts no size) sees the text read() sees.
    std::string text = cat(path(p)), direct = read(p);
    if (name == "stats") {  // its "now ts:" line moves on between the two reads
      text = text.substr(0, text.find("now ts:"));
      direct = direct.substr(0, direct.find("now ts:"));
    }
    EXPECT_EQ(text, direct);
    if (!may_be_empty.count(p) && name != "hist") {  // no histogram: nothing to show
      EXPECT_NE(text, "");
    }
  }
  // trace_pipe with something in it: cat shows it (and would block for more: the reader
  // is non-blocking here).
  ASSERT_EQ(m_.write("trace_marker", "tree-check"), 0);
  int fd = open(path("trace_pipe").c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  std::string pipe_text = testing::read_lines(fd, 1, 20000);
  close(fd);
  EXPECT_NE(pipe_text.find(": tracing_mark_write: tree-check\n"), std::string::npos) << pipe_text;
}

// ---- 2. the kernel's captured cases ---------------------------------------------------------

struct ErrorRow {
  const char* title;
  const char* def;
  int err;
  const char* message;  // nullptr: nothing is logged
  const char* command;
  int pos;
};

const ErrorRow kErrorRows[] = {
#include "tests/fs/dynamic_events_error_table.inc"
};

// Every captured malformed line written with `echo LINE >> uprobe_events`, the traced
// program for the captured binary: the shell's exit status and message (the write's
// errno), and error_log's text with its caret, byte for byte.
TEST_F(TracefsMountTest, ErrorTableThroughTheShellMatchesTheKernel) {
  const std::string b = kProg;
  const int shift = static_cast<int>(b.size()) - 3;
  echo("uprobe_events", "p:uprobes/ref_add3 " + b +
                            ":0x1370 a=%di b=%si:u32 c=%dx:s32 cx=%dx:x16 c64=%dx:s64 imm=\\123 "
                            "imms=\\\"hi\"");
  echo("uprobe_events", "p:uprobes/ref_negs " + b + ":0x13c0 v=%di:s64");
  echo("uprobe_events", "r " + b + ":0x13c0");
  // sched/sched_switch is the kernel's own event; here an event of the other kind holds it.
  echo("kprobe_events", "p:sched/sched_switch " + kProgName + ":traced_add");

  auto run = [&](const std::string& title, const std::string& def, int err,
                 const std::string& expected_log) {
    clear_error_log();
    CommandResult r = echo_append(path("uprobe_events"), def);
    EXPECT_EQ(r.exit_code(), err ? 1 : 0) << title;
    EXPECT_EQ(r.err, err ? echo_write_error(err) : "") << title;
    EXPECT_EQ(error_log(), expected_log) << title;
  };
  for (const ErrorRow& row : kErrorRows) {
    std::string expected;
    if (row.message) {
      std::string command = row.command;
      size_t at = command.find("@B@");
      int pos = row.pos + (at != std::string::npos && row.pos > static_cast<int>(at) ? shift : 0);
      expected = error_log_entry("trace_uprobe", row.message, replace_all(command, "@B@", b), pos);
    }
    run(row.title, replace_all(row.def, "@B@", b), row.err, expected);
    const std::string longest(63, 'g');
    if (read("uprobe_events").find("uprobes/" + longest + " ") != std::string::npos)
      echo("uprobe_events", "-:uprobes/" + longest);
  }
  std::string args129, args128;
  for (int i = 0; i < 129; ++i) {
    if (i < 128) args128 += (i ? " a" : "a") + std::to_string(i) + "=%di";
    args129 += (i ? " a" : "a") + std::to_string(i) + "=%di";
  }
  const std::string many = "p:uprobes/e11 " + b + ":0x1370 " + args129;
  run("too many args (129)", many, E2BIG,
      error_log_entry("trace_uprobe", "Too many arguments are specified", many,
                      static_cast<int>(many.find(" a0=") + 1)));
  run("128 args (limit ok?)", "p:uprobes/e24 " + b + ":0x1370 " + args128, 0, "");
  run("line too long (5000 chars)", "p:uprobes/e25 " + b + ":0x1370 " + std::string(5000, 'x'),
      EINVAL, "");
  // The log keeps 8 entries; writes without O_TRUNC leave it; `echo > error_log` clears.
  clear_error_log();
  std::string expected;
  for (int i = 1; i <= 10; ++i) {
    const std::string def = "p:uprobes/ring" + std::to_string(i) + " " + b + ":0x1370 a=%bad";
    EXPECT_EQ(echo_append(path("uprobe_events"), def).exit_code(), 1);
    if (i > 2)
      expected += error_log_entry("trace_uprobe", "Invalid register name", def,
                                  static_cast<int>(def.find("%bad")));
  }
  EXPECT_EQ(error_log(), expected);
  echo("error_log", "x");
  EXPECT_EQ(error_log(), expected);
  ASSERT_EQ(echo_truncate(path("error_log"), "").exit_code(), 0);
  EXPECT_EQ(read("error_log"), "");
}

// The reference's read-back normalization capture, written with the shell.
TEST_F(TracefsMountTest, ReadBackIsNormalizedAsTheKernelDoes) {
  const std::string b = kProg;
  const std::string p1370 = b + ":" + padded(0x1370);
  for (const std::string& d : std::vector<std::string>{
           "p " + b + ":0x1370", "r " + b + ":0x13c0", "p " + b + ":0x13b0%return",
        "p:mygrp/ " + b + ":0x1370", "p:ev_only " + b + ":0x1370", "p:grp1/ev2 " + b + ":4976",
        "p:grp1/ev7   " + b + ":0x1370    a=%di\t b=%si  ", "p:grp1/multi " + b + ":0x1370 a=%di",
        "p:grp1/multi " + b + ":0x13c0 a=%di", "p:grp1/ev8 " + b + ":0x1370 a=%di # trailing comment",
        "# a comment line", "p:grp1/ev11 " + b + ":0x01370", "   "})
    echo("uprobe_events", d);
  // A relative path is the writer's: written from the program's directory.
  CommandResult r = bash("cd \"$3\" && echo \"$1\" >> \"$2\"",
                         {"p:grp1/ev6 ./" + kProgName + ":0x1370", path("uprobe_events"), kProgDir});
  EXPECT_EQ(r.exit_code(), 0) << r.err;
  // Two lines in one write().
  r = printf_append(path("uprobe_events"), "p:grp1/ev9 " + b + ":0x1370 %di +0(%si):u8 $comm\np:grp1/ev10 " +
                                               b + ":0X1370 a=%di");
  EXPECT_EQ(r.exit_code(), 0) << r.err;
  const std::string expected =
      "p:uprobes/p_traced_0x1370 " + p1370 + "\n"
      "r:uprobes/p_traced_0x13c0 " + b + ":" + padded(0x13c0) + "\n"
      "r:uprobes/p_traced_0x13b0 " + b + ":" + padded(0x13b0) + "\n"
      "p:mygrp/p_traced_0x1370 " + p1370 + "\n"
      "p:uprobes/ev_only " + p1370 + "\n"
      "p:grp1/ev2 " + p1370 + "\n"
      "p:grp1/ev7 " + p1370 + " a=%di b=%si\n"
      "p:grp1/multi " + p1370 + " a=%di\n"
      "p:grp1/multi " + b + ":" + padded(0x13c0) + " a=%di\n"
      "p:grp1/ev8 " + p1370 + " a=%di\n"
      "p:grp1/ev11 " + p1370 + "\n"
      "p:grp1/ev6 ./" + kProgName + ":" + padded(0x1370) + "\n"
      "p:grp1/ev9 " + p1370 + " arg1=%di arg2=+0(%si):u8 arg3=$comm\n"
      "p:grp1/ev10 " + p1370 + " a=%di\n";
  EXPECT_EQ(cat(path("uprobe_events")), expected);
  EXPECT_EQ(cat(path("dynamic_events")), expected);
  EXPECT_EQ(cat(path("kprobe_events")), "");
  // Removal forms: an exact probe needs the padded offset.
  r = echo_append(path("uprobe_events"), "-:grp1/multi " + b + ":0x13c0 a=%di");
  EXPECT_EQ(r.err, echo_write_error(ENOENT));
  echo("uprobe_events", "-:grp1/multi " + b + ":" + padded(0x13c0) + " a=%di");
  echo("uprobe_events", "-:ev2");
  EXPECT_EQ(echo_append(path("uprobe_events"), "-:grp1/ev2").err, echo_write_error(ENOENT));
  echo("dynamic_events", "-:mygrp/");
  EXPECT_EQ(access(path("events/mygrp").c_str(), F_OK), -1);
  const std::string back = read("uprobe_events");
  EXPECT_EQ(back.find("grp1/ev2 "), std::string::npos);
  EXPECT_NE(back.find("p:grp1/multi " + p1370 + " a=%di\n"), std::string::npos);
  EXPECT_EQ(back.find("p:grp1/multi " + b + ":" + padded(0x13c0)), std::string::npos);
}

// 04b and 07: each write() is parsed by itself (lines split on newlines, processing stops
// at the first bad line, the lines before it stay), dynamic_events takes what
// uprobe_events takes and logs its errors the same way, and each file removes what the
// other defined.
TEST_F(TracefsMountTest, EachWriteIsParsedByItselfInEitherFile) {
  const std::string b = kProg;
  clear_error_log();
  const std::string bad = "p:uprobes/ml2 " + b + ":0x1370 a=%bad";
  CommandResult r = printf_append(path("uprobe_events"), "p:uprobes/ml1 " + b + ":0x1370\n" + bad +
                                                             "\np:uprobes/ml3 " + b + ":0x1370");
  EXPECT_EQ(r.err, "bash: line 1: printf: write error: " + std::string(strerror(EINVAL)) + "\n");
  EXPECT_EQ(read("uprobe_events"), "p:uprobes/ml1 " + b + ":" + padded(0x1370) + "\n");
  EXPECT_EQ(error_log(), error_log_entry("trace_uprobe", "Invalid register name", bad,
                                         static_cast<int>(bad.find("%bad"))));
  // A definition split across two write() calls on one open file: two definitions.
  r = bash("{ printf %s \"$1\"; printf %s \"$2\"; } >> \"$3\"",
           {"p:uprobes/split1 " + b + ":0x1370", " a=%di\n", path("uprobe_events")});
  EXPECT_EQ(r.exit_code(), 1);
  EXPECT_NE(read("uprobe_events").find("p:uprobes/split1 " + b + ":" + padded(0x1370) + "\n"),
            std::string::npos);
  // dynamic_events: the same definitions, errors logged as trace_uprobe, other types'
  // syntax refused without a log (a synthetic event outside its group with one).
  clear_error_log();
  echo("dynamic_events", "p:dyn/d1 " + b + ":0x1370 a=%di b=+0(%si):string");
  echo("dynamic_events", "r:dyn/d2 " + b + ":0x13c0 rv=$retval:s64");
  echo("dynamic_events", "p:d4 " + b + ":0x1380");
  const std::string zz = "p:dyn/d6 " + b + ":0x1370 a=%zz";
  EXPECT_EQ(echo_append(path("dynamic_events"), zz).err, echo_write_error(EINVAL));
  for (const std::string& other : {std::string("e:dyn/ep sched.sched_switch"),
                                   std::string("s:dyn/synth u64 lat"),
                                   "x:dyn/bad " + b + ":0x1370"})
    EXPECT_EQ(echo_append(path("dynamic_events"), other).err, echo_write_error(EINVAL)) << other;
  EXPECT_EQ(error_log(),
            error_log_entry("trace_uprobe", "Invalid register name", zz,
                            static_cast<int>(zz.find("%zz"))) +
                error_log_entry("synthetic_events",
                                "Command must be of the form: s or -:[synthetic/]<name> "
                                "field[;field] ...",
                                "s:dyn/synth u64 lat", 0));
  EXPECT_EQ(read("dynamic_events"), read("uprobe_events"));
  EXPECT_NE(read("uprobe_events").find("p:uprobes/d4 " + b + ":" + padded(0x1380) + "\n"),
            std::string::npos);
  // Removal through the other file, and of everything in a group.
  echo("uprobe_events", "-:dyn/d2");
  echo("dynamic_events", "-:d4");
  EXPECT_EQ(echo_append(path("dynamic_events"), "-:nonexistent").err, echo_write_error(ENOENT));
  echo("uprobe_events", "p:dyn/u2 " + b + ":0x1370");
  echo("dynamic_events", "-:dyn/");
  EXPECT_EQ(read("dynamic_events").find("dyn/"), std::string::npos);
  EXPECT_EQ(access(path("events/dyn").c_str(), F_OK), -1);
}

// O_TRUNC (`echo > FILE`) on the definition files, error_log and trace (05c, 05).
TEST_F(TracefsMountTest, TruncationAsTheKernelTruncates) {
  const std::string b = kProg;
  echo("uprobe_events", "p:uprobes/keep " + b + ":0x1370");
  echo("uprobe_events", "p:uprobes/t0 " + b + ":0x13c0");
  ASSERT_EQ(echo_truncate(path("events/uprobes/t0/enable"), "1").exit_code(), 0);
  const std::string before = read("uprobe_events");
  // Any enabled event: the open itself fails, nothing goes.
  for (const char* f : {"uprobe_events", "dynamic_events"}) {
    CommandResult r = echo_truncate(path(f), "");
    EXPECT_EQ(r.exit_code(), 1) << f;
    EXPECT_EQ(r.err, redirect_error(path(f), EBUSY)) << f;
    EXPECT_EQ(read("uprobe_events"), before) << f;
  }
  int fd = open(path("uprobe_events").c_str(), O_WRONLY | O_TRUNC | O_CLOEXEC);
  EXPECT_EQ(fd, -1);
  EXPECT_EQ(errno, EBUSY);
  if (fd >= 0) close(fd);
  // Removing the enabled event: the write fails.
  EXPECT_EQ(echo_append(path("uprobe_events"), "-:uprobes/t0").err, echo_write_error(EBUSY));
  EXPECT_EQ(echo_append(path("dynamic_events"), "-:uprobes/t0").err, echo_write_error(EBUSY));
  // Appending a probe to an enabled event works.
  echo("uprobe_events", "p:uprobes/t0 " + b + ":0x1380");
  ASSERT_EQ(echo_truncate(path("events/uprobes/t0/enable"), "0").exit_code(), 0);
  // Nothing enabled: `echo 'p:...' > uprobe_events` replaces everything.
  ASSERT_EQ(echo_truncate(path("uprobe_events"), "p:uprobes/t1 " + b + ":0x1370").exit_code(), 0);
  ASSERT_EQ(echo_truncate(path("uprobe_events"), "p:uprobes/t2 " + b + ":0x1380").exit_code(), 0);
  EXPECT_EQ(read("uprobe_events"), "p:uprobes/t2 " + b + ":" + padded(0x1380) + "\n");
  EXPECT_EQ(read("available_events"), "uprobes:t2\n");
  ASSERT_EQ(echo_truncate(path("dynamic_events"), "").exit_code(), 0);
  EXPECT_EQ(read("dynamic_events"), "");
  EXPECT_EQ(read("uprobe_profile"), "");
  EXPECT_EQ(read("available_events"), "");
  EXPECT_EQ(access(path("events/uprobes").c_str(), F_OK), -1);
  // trace: `echo x >> trace` does nothing, `echo > trace` empties it.
  ASSERT_EQ(m_.write("trace_marker", "one"), 0);
  echo("trace", "x");
  EXPECT_EQ(trace_lines().size(), 1u);
  ASSERT_EQ(echo_truncate(path("trace"), "").exit_code(), 0);
  EXPECT_EQ(trace_lines().size(), 0u);
  EXPECT_NE(read("trace").find("# entries-in-buffer/entries-written: 0/0   #P:"), std::string::npos);
}

// Definitions written by two shells at once, a reader beside them: every line whole,
// every event its own id.
TEST_F(TracefsMountTest, TwoWritersAtOnceNeverCorruptTheDefinitions) {
  const std::string script =
      "for i in $(seq 0 59); do echo \"p:$1/e$i $2:0x1370 a=%di\" >> \"$3\" || exit 1; "
      "if [ $((i % 3)) -eq 0 ]; then echo \"-:$1/e$i\" >> \"$3\" || exit 1; fi; done";
  CommandResult ra, rb;
  std::atomic<bool> stop{false};
  std::thread reader([&] {
    while (!stop) (void)read("uprobe_events");
  });
  std::thread a([&] { ra = bash(script, {"ta", kProg, path("uprobe_events")}, 60000); });
  std::thread b([&] { rb = bash(script, {"tb", kProg, path("dynamic_events")}, 60000); });
  a.join();
  b.join();
  stop = true;
  reader.join();
  EXPECT_EQ(ra.exit_code(), 0) << ra.err;
  EXPECT_EQ(rb.exit_code(), 0) << rb.err;
  std::set<std::string> expected, ids;
  for (const char* g : {"ta", "tb"})
    for (int i = 0; i < 60; ++i)
      if (i % 3 != 0) {
        expected.insert(std::string("p:") + g + "/e" + std::to_string(i) + " " + kProg + ":" +
                        padded(0x1370) + " a=%di");
        ids.insert(read(std::string("events/") + g + "/e" + std::to_string(i) + "/id"));
      }
  const std::vector<std::string> lines = split_lines(read("uprobe_events"));
  EXPECT_EQ(std::set<std::string>(lines.begin(), lines.end()), expected);
  EXPECT_EQ(lines.size(), expected.size());
  EXPECT_EQ(ids.size(), expected.size());
}

// The enable and tracing_on files take the kernel's numbers (kstrtoul, base 10, a
// trailing newline only); a probe past the end of its file cannot be enabled, one at
// offset 0 or inside an instruction can (and never fires).
TEST_F(TracefsMountTest, EnableAndTracingOnTakeTheKernelsNumbers) {
  echo("uprobe_events", "p:en/a " + place("traced_add") + " a=%di");
  echo("uprobe_events", "p:en/b " + place("traced_str"));
  const std::string f = path("events/en/a/enable");
  struct Step {
    const char* text;
    bool ok;
    const char* after;
  } steps[] = {{"1", true, "1\n"},     {"1", true, "1\n"},    {"0", true, "0\n"},
               {"0", true, "0\n"},     {"2", false, "0\n"},   {"-1", false, "0\n"},
               {"abc", false, "0\n"},  {" 1", false, "0\n"},  {"1 ", false, "0\n"},
               {"0x1", false, "0\n"},  {"01", true, "1\n"},   {"10", false, "1\n"},
               {"1abc", false, "1\n"}, {"0\n", true, "0\n"}, {"+1", true, "1\n"}};
  for (const Step& s : steps) {
    CommandResult r = printf_append(f, s.text);
    EXPECT_EQ(r.exit_code(), s.ok ? 0 : 1) << s.text;
    EXPECT_EQ(read("events/en/a/enable"), s.after) << s.text;
  }
  // Mixed: the group and the top level read X; the group takes only 0 and 1.
  EXPECT_EQ(read("events/en/enable"), "X\n");
  EXPECT_EQ(read("events/enable"), "X\n");
  EXPECT_EQ(read("set_event"), "en:a\n");
  EXPECT_EQ(printf_append(path("events/en/enable"), "X").exit_code(), 1);
  ASSERT_EQ(echo_truncate(path("events/en/enable"), "1").exit_code(), 0);
  EXPECT_EQ(read("events/en/enable"), "1\n");
  EXPECT_EQ(read("set_event"), "en:b\nen:a\n");
  ASSERT_EQ(echo_truncate(path("set_event"), "").exit_code(), 0);
  EXPECT_EQ(read("events/enable"), "0\n");
  // tracing_on: any unsigned number (2 reads back 1), nothing else.
  for (const char* bad : {"abc", "-1", "0x1"})
    EXPECT_EQ(printf_append(path("tracing_on"), bad).err, "bash: line 1: printf: write error: " +
                                                              std::string(strerror(EINVAL)) + "\n")
        << bad;
  EXPECT_EQ(read("tracing_on"), "1\n");
  ASSERT_EQ(echo_truncate(path("tracing_on"), "0").exit_code(), 0);
  EXPECT_EQ(read("tracing_on"), "0\n");
  ASSERT_EQ(echo_truncate(path("tracing_on"), "2").exit_code(), 0);
  EXPECT_EQ(read("tracing_on"), "1\n");
  // Past the end of the file: EINVAL, still off. At 0 and mid-instruction: enabled.
  struct stat st;
  ASSERT_EQ(stat(kProg.c_str(), &st), 0);
  echo("uprobe_events", "p:en/far " + kProg + ":" + hex(static_cast<uint64_t>(st.st_size) + 0x1000));
  echo("uprobe_events", "p:en/zero " + kProg + ":0x0");
  echo("uprobe_events", "p:en/mid " + kProg + ":" + hex(symbol("traced_add").file_offset + 1));
  EXPECT_EQ(echo_truncate(path("events/en/far/enable"), "1").err, echo_write_error(EINVAL));
  EXPECT_EQ(read("events/en/far/enable"), "0\n");
  for (const char* e : {"zero", "mid"}) {
    EXPECT_EQ(echo_truncate(path(std::string("events/en/") + e + "/enable"), "1").exit_code(), 0) << e;
    EXPECT_EQ(read(std::string("events/en/") + e + "/enable"), "1\n") << e;
  }
  // Enabling the group stops at the event that cannot be enabled (the others stay as the
  // kernel leaves them: enabled in order until the failure).
  EXPECT_EQ(echo_truncate(path("events/en/enable"), "1").err, echo_write_error(EINVAL));
  auto prog = exec_program();
  ASSERT_TRUE(prog->call(3));
  for (const std::string& l : trace_lines())
    EXPECT_TRUE(l.find(" zero: ") == std::string::npos && l.find(" mid: ") == std::string::npos) << l;
}

// ---- trace_pipe: partial reads and the blocking rules ---------------------------------------

class TracePipeTest : public TracefsMountTest {
 protected:
  void SetUp() override {
    TracefsMountTest::SetUp();
    echo("uprobe_events", "p:pp/add " + place("traced_add") + " v=%di:s64");
    ASSERT_EQ(echo_truncate(path("events/pp/add/enable"), "1").exit_code(), 0);
    prog_ = exec_program();
    ASSERT_TRUE(prog_->ready());
  }
  int open_pipe(int flags = O_NONBLOCK) {
    return open(path("trace_pipe").c_str(), O_RDONLY | O_CLOEXEC | flags);
  }
  std::unique_ptr<ProgramProcess> prog_;
};

// 05d: a read shorter than the line keeps the rest for the next read on the same open
// file (which returns it alone); closing the file loses it.
TEST_F(TracePipeTest, PartialReadsKeepTheRestOfTheLineForTheSameFile) {
  ASSERT_TRUE(prog_->call(3));
  std::vector<std::string> lines = trace_lines();
  ASSERT_EQ(lines.size(), 3u);
  const std::string all = lines[0] + "\n" + lines[1] + "\n" + lines[2] + "\n";
  int fd = open_pipe();
  ASSERT_GE(fd, 0);
  char b[4096];
  ASSERT_EQ(::read(fd, b, 10), 10);
  EXPECT_EQ(std::string(b, 10), all.substr(0, 10));
  ASSERT_EQ(::read(fd, b, 10), 10);
  EXPECT_EQ(std::string(b, 10), all.substr(10, 10));
  ssize_t n = ::read(fd, b, sizeof b);
  EXPECT_EQ(std::string(b, static_cast<size_t>(std::max<ssize_t>(n, 0))), lines[0].substr(20) + "\n");
  n = ::read(fd, b, sizeof b);
  EXPECT_EQ(std::string(b, static_cast<size_t>(std::max<ssize_t>(n, 0))),
            lines[1] + "\n" + lines[2] + "\n");
  EXPECT_EQ(::read(fd, b, sizeof b), -1);
  EXPECT_EQ(errno, EAGAIN);
  close(fd);
  // A new open file each time: the rest of a partly read line is gone with its file.
  ASSERT_TRUE(prog_->call(3));
  lines = trace_lines();
  ASSERT_EQ(lines.size(), 3u);
  fd = open_pipe();
  ASSERT_EQ(::read(fd, b, 10), 10);
  EXPECT_EQ(std::string(b, 10), lines[0].substr(0, 10));
  close(fd);
  fd = open_pipe();
  n = ::read(fd, b, sizeof b);
  EXPECT_EQ(std::string(b, static_cast<size_t>(std::max<ssize_t>(n, 0))),
            lines[1] + "\n" + lines[2] + "\n");
  EXPECT_EQ(::read(fd, b, sizeof b), -1);
  EXPECT_EQ(errno, EAGAIN);
  close(fd);
}

// Lines read through trace_pipe are the lines of trace, byte for byte, and are consumed.
TEST_F(TracePipeTest, PipeLinesAreTraceLinesAndAreConsumed) {
  ASSERT_TRUE(prog_->call(5));
  const std::string trace = read("trace");
  const std::vector<std::string> lines = trace_body_lines(trace);
  ASSERT_EQ(lines.size(), 5u);
  EXPECT_NE(trace.find("# entries-in-buffer/entries-written: 5/5   #P:"), std::string::npos);
  int fd = open_pipe();
  ASSERT_GE(fd, 0);
  std::string text = testing::read_lines(fd, 5, 20000);
  close(fd);
  EXPECT_EQ(split_lines(text), lines);
  EXPECT_EQ(trace_lines().size(), 0u);
  EXPECT_NE(read("trace").find("# entries-in-buffer/entries-written: 0/0   #P:"), std::string::npos);
}

TEST_F(TracePipeTest, EmptyPipeBlocksAndWakesWhenARecordArrives) {
  // O_NONBLOCK: EAGAIN at once.
  int fd = open_pipe();
  ASSERT_GE(fd, 0);
  char b[256];
  EXPECT_EQ(::read(fd, b, sizeof b), -1);
  EXPECT_EQ(errno, EAGAIN);
  close(fd);
  // A blocking reader (a child, killed at the end whatever happens) waits in read()...
  ChildReader reader(path("trace_pipe"));
  ASSERT_EQ(reader.opened().err, 0);
  reader.read();
  ASSERT_TRUE(testing::blocked_in(std::to_string(reader.pid()), {SYS_read}, 20000));
  // ...until a record arrives.
  ASSERT_TRUE(prog_->call(1));
  ChildReader::Outcome o = reader.outcome(30000);
  ASSERT_TRUE(o.answered) << "the blocked reader did not wake";
  EXPECT_EQ(o.err, 0);
  EXPECT_NE(o.data.find(" add: ("), std::string::npos) << o.data;
  EXPECT_NE(o.data.find(") v=0\n"), std::string::npos) << o.data;
}

// poll() and select() on trace_pipe sleep while it is empty and wake when a record comes.
TEST_F(TracePipeTest, PollAndSelectWakeWhenARecordArrives) {
  int fd = open_pipe();
  ASSERT_GE(fd, 0);
  pollfd p{fd, POLLIN, 0};
  EXPECT_EQ(poll(&p, 1, 0), 0);
  for (const char* how : {"poll", "select"}) {
    SCOPED_TRACE(how);
    std::atomic<int> ready{-1};
    std::atomic<pid_t> tid{0};
    std::thread waiter([&] {
      tid = static_cast<pid_t>(syscall(SYS_gettid));
      if (std::string(how) == "poll") {
        pollfd q{fd, POLLIN, 0};
        ready = poll(&q, 1, 30000) == 1 && (q.revents & POLLIN) ? 1 : 0;
      } else {
        fd_set set;
        FD_ZERO(&set);
        FD_SET(fd, &set);
        timeval tv{30, 0};
        ready = select(fd + 1, &set, nullptr, nullptr, &tv) == 1 && FD_ISSET(fd, &set) ? 1 : 0;
      }
    });
    while (tid == 0) std::this_thread::yield();
    const std::string task = "self/task/" + std::to_string(tid.load());
    EXPECT_TRUE(std::string(how) == "poll"
                    ? testing::blocked_in(task, {SYS_poll, SYS_ppoll}, 20000)
                    : testing::blocked_in(task, {SYS_select, SYS_pselect6}, 20000));
    EXPECT_TRUE(prog_->call(1));
    waiter.join();
    EXPECT_EQ(ready, 1);
    std::string text = testing::read_available(fd);
    EXPECT_EQ(split_lines(text).size(), 1u) << text;
    EXPECT_EQ(poll(&p, 1, 0), 0);
  }
  close(fd);
}

// Once a file returned data, tracing_on 0 makes its empty read end of file; a file that
// never returned data still blocks.
TEST_F(TracePipeTest, EndOfFileOnceDataWasReadAndTracingIsOff) {
  ChildReader reader(path("trace_pipe"));
  ASSERT_EQ(reader.opened().err, 0);
  ASSERT_TRUE(prog_->call(1));
  reader.read();
  ChildReader::Outcome o = reader.outcome(30000);
  ASSERT_TRUE(o.answered);
  EXPECT_NE(o.data.find(" add: ("), std::string::npos) << o.data;
  ASSERT_EQ(echo_truncate(path("tracing_on"), "0").exit_code(), 0);
  reader.read();
  o = reader.outcome(30000);
  ASSERT_TRUE(o.answered) << "the read blocked instead of returning end of file";
  EXPECT_EQ(o.err, 0);
  EXPECT_EQ(o.data, "");
  {
    // A new file: blocks, tracing on or off.
    ChildReader fresh(path("trace_pipe"));
    ASSERT_EQ(fresh.opened().err, 0);
    fresh.read();
    EXPECT_TRUE(testing::blocked_in(std::to_string(fresh.pid()), {SYS_read}, 20000));
  }
  // A blocked reader that has read before sees tracing go off at once.
  ASSERT_EQ(echo_truncate(path("tracing_on"), "1").exit_code(), 0);
  ASSERT_TRUE(prog_->call(1));
  ChildReader second(path("trace_pipe"));
  second.read();
  o = second.outcome(30000);
  ASSERT_TRUE(o.answered);
  second.read();
  ASSERT_TRUE(testing::blocked_in(std::to_string(second.pid()), {SYS_read}, 20000));
  ASSERT_EQ(echo_truncate(path("tracing_on"), "0").exit_code(), 0);
  o = second.outcome(30000);
  ASSERT_TRUE(o.answered) << "tracing off did not end the blocked read";
  EXPECT_EQ(o.data, "");
}

// ---- 3. trace lines end to end ---------------------------------------------------------------

// The kernel's trace header (trace's first 12 lines) for `entries` entries.
std::string trace_header(size_t entries, size_t written) {
  return "# tracer: nop\n"
         "#\n"
         "# entries-in-buffer/entries-written: " + std::to_string(entries) + "/" +
         std::to_string(written) + "   #P:" + std::to_string(sysconf(_SC_NPROCESSORS_CONF)) +
         "\n"
         "#\n"
         "#                                _-----=> irqs-off/BH-disabled\n"
         "#                               / _----=> need-resched\n"
         "#                              | / _---=> hardirq/softirq\n"
         "#                              || / _--=> preempt-depth\n"
         "#                              ||| / _-=> migrate-disable\n"
         "#                              |||| /     delay\n"
         "#           TASK-PID     CPU#  |||||  TIMESTAMP  FUNCTION\n"
         "#              | |         |   |||||     |         |\n";
}

// Parses every line, checks the kernel's layout byte for byte (and the program's name and
// pid, and that stamps never go back), and returns the lines taken apart.
std::vector<TraceLine> parse_all(const std::vector<std::string>& lines, pid_t pid,
                                 const std::string& comm) {
  std::vector<TraceLine> out;
  unsigned long last = 0;
  for (const std::string& l : lines) {
    TraceLine t;
    EXPECT_TRUE(parse_trace_line(l, &t)) << l;
    EXPECT_EQ(render_trace_line(t), l);
    EXPECT_EQ(t.comm, comm) << l;
    if (pid > 0) {
      EXPECT_EQ(t.pid, pid) << l;
    }
    EXPECT_EQ(t.flags.size(), 5u) << l;
    EXPECT_LT(t.cpu, sysconf(_SC_NPROCESSORS_CONF)) << l;
    const unsigned long ts = t.sec * 1000000 + t.usec;
    EXPECT_GE(ts, last) << l;
    last = ts;
    out.push_back(t);
  }
  return out;
}

std::vector<std::string> bodies_of(const std::vector<TraceLine>& lines, const std::string& event) {
  std::vector<std::string> b;
  for (const TraceLine& t : lines)
    if (t.event == event) b.push_back(t.body);
  return b;
}

std::string profile_line(const std::string& path, const std::string& event, unsigned long hits) {
  char b[512];
  snprintf(b, sizeof b, "  %s %-44s %15lu\n", path.c_str(), event.c_str(), hits);
  return b;
}

std::string kprobe_profile_line(const std::string& event, unsigned long hits, unsigned long missed) {
  char b[256];
  snprintf(b, sizeof b, "  %-44s %15lu %15lu\n", event.c_str(), hits, missed);
  return b;
}

// Return addresses of a uprobe-style return line "(0xRET <- 0xFUNC) ...": RET.
uint64_t return_address(const std::string& body) {
  uint64_t ret = 0;
  sscanf(body.c_str(), "(0x%" SCNx64, &ret);
  return ret;
}

// uprobe-style and kprobe-style events with every kind of argument, entry and return, on a
// program run with `probefs exec`: lines in the kernel's layout with the program's values,
// the profiles counting the hits, kprobes/list showing the probes.
TEST_F(TracefsMountTest, TraceLinesOfAProgramUnderExecAreTheKernels) {
  const ElfSymbol& add = symbol("traced_add");
  const ElfSymbol& str = symbol("traced_str");
  const ElfSymbol& main_fn = symbol("main");
  echo("uprobe_events", "p:ut/add " + place("traced_add") +
                            " a=%di b=%si:s32 bx=%si:x16 comm=$comm g=@+" +
                            hex(symbol("traced_global").vaddr) + ":s64");
  echo("uprobe_events", "r:ut/addret " + place("traced_add") + " rv=$retval:s64");
  echo("uprobe_events", "p:ut/str " + place("traced_str") +
                            " s=+0(%di):string n=%si:u64 c=+0(%di):char c3=+0(%di):char[3] "
                            "u=+0(%di):ustring");
  echo("kprobe_events", "p:kt/kadd " + kProgName + ":traced_add a=%di b=%si");
  echo("kprobe_events", "r:kt/kstr " + kProgName + ":traced_str rv=$retval");
  ASSERT_EQ(echo_truncate(path("events/enable"), "1").exit_code(), 0);
  EXPECT_EQ(read("events/enable"), "1\n");
  auto prog = exec_program();
  ASSERT_TRUE(prog->call(3));
  ASSERT_TRUE(prog->str(2));
  const uint64_t base = load_base(prog->pid());
  ASSERT_NE(base, 0u);

  const std::string trace = read("trace");
  const std::vector<std::string> raw = trace_body_lines(trace);
  ASSERT_EQ(raw.size(), 3u * 3 + 2u * 2) << trace;
  EXPECT_EQ(trace.substr(0, trace_header(13, 13).size()), trace_header(13, 13));
  const std::vector<TraceLine> lines = parse_all(raw, prog->pid(), "traced_prog");
  std::vector<std::string> want_add, want_kadd, want_str, want_kstr;
  for (int i = 0; i < 3; ++i) {
    want_add.push_back("(" + hex(base + add.vaddr) + ") a=" + hex(i) + " b=" + std::to_string(2 * i) +
                       " bx=" + hex(2 * i) + " comm=\"traced_prog\" g=4242");
    want_kadd.push_back("(traced_add+0x0/" + hex(add.size) + ") a=" + hex(i) + " b=" + hex(2 * i));
  }
  for (int i = 0; i < 2; ++i)
    want_str.push_back("(" + hex(base + str.vaddr) + ") s=\"name-" + std::to_string(i) +
                       "\" n=" + std::to_string(i) + " c='n' c3={'n','a','m'} u=\"name-" +
                       std::to_string(i) + "\"");
  EXPECT_EQ(bodies_of(lines, "add"), want_add);
  EXPECT_EQ(bodies_of(lines, "kadd"), want_kadd);
  EXPECT_EQ(bodies_of(lines, "str"), want_str);
  // Return probes: back in main, which called the function.
  const std::vector<std::string> addret = bodies_of(lines, "addret");
  ASSERT_EQ(addret.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    const uint64_t ret = return_address(addret[i]);
    EXPECT_GT(ret, base + main_fn.vaddr) << addret[i];
    EXPECT_LT(ret, base + main_fn.vaddr + main_fn.size) << addret[i];
    EXPECT_EQ(addret[i], "(" + hex(ret) + " <- " + hex(base + add.vaddr) + ") rv=" +
                             std::to_string(3 * i));
  }
  const std::vector<std::string> kstr = bodies_of(lines, "kstr");
  ASSERT_EQ(kstr.size(), 2u);
  for (int i = 0; i < 2; ++i) {
    unsigned off = 0, size = 0;
    EXPECT_EQ(sscanf(kstr[i].c_str(), "(main+0x%x/0x%x <- ", &off, &size), 2) << kstr[i];
    EXPECT_EQ(size, main_fn.size);
    EXPECT_LT(off, main_fn.size);
    EXPECT_EQ(kstr[i], "(main+" + hex(off) + "/" + hex(main_fn.size) +
                           " <- traced_str) rv=" + hex(6 + i));
  }
  // The order of a call's lines: entry before return.
  std::string order;
  for (const TraceLine& t : lines)
    if (t.event == "add" || t.event == "addret" || t.event == "str" || t.event == "kstr")
      order += t.event + " ";
  EXPECT_EQ(order, "add addret add addret add addret str kstr str kstr ");

  EXPECT_EQ(read("uprobe_profile"), profile_line(kProg, "add", 3) +
                                        profile_line(kProg, "addret", 3) +
                                        profile_line(kProg, "str", 2));
  EXPECT_EQ(read("kprobe_profile"), kprobe_profile_line("kadd", 3, 0) +
                                        kprobe_profile_line("kstr", 2, 0));
  // kprobes/list: the probes in the program, traced_add's jump-optimized.
  const std::string list = read("kprobes/list");
  char want[128];
  snprintf(want, sizeof want, "%016" PRIx64 "  k  traced_add+0x0    [OPTIMIZED]\n",
           base + add.vaddr);
  EXPECT_NE(list.find(want), std::string::npos) << list;
  snprintf(want, sizeof want, "%016" PRIx64 "  r  traced_add+0x0    [OPTIMIZED]\n",
           base + add.vaddr);
  EXPECT_NE(list.find(want), std::string::npos) << list;
  snprintf(want, sizeof want, "%016" PRIx64 "  r  traced_str+0x0    ", base + str.vaddr);
  EXPECT_NE(list.find(want), std::string::npos) << list;
  // trace_pipe gives the same lines.
  int fd = open(path("trace_pipe").c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  EXPECT_EQ(split_lines(testing::read_lines(fd, raw.size(), 20000)), raw);
  close(fd);
  EXPECT_EQ(prog->quit(), 0);
}

// 01b: fetches through a bad pointer print the kernel's fault values (0, (fault) unquoted,
// a NUL byte for a char), and the program runs on unharmed.
TEST_F(TracefsMountTest, FetchFaultsPrintTheKernelsValues) {
  echo("uprobe_events", "p:fl/f " + place("traced_add") +
                            " a=%di badu32=+0(%di):u32 badx64=+0(%di) bads=+0(%di):string "
                            "badus=+0(%di):ustring badarr=+0(%di):u8[2] badbf=+0(%di):b4@2/32 "
                            "badchr=+0(%di):char good=%si:s32");
  ASSERT_EQ(echo_truncate(path("events/fl/f/enable"), "1").exit_code(), 0);
  auto prog = exec_program();
  ASSERT_TRUE(prog->call(2));
  const std::vector<TraceLine> lines = parse_all(trace_lines(), prog->pid(), "traced_prog");
  ASSERT_EQ(lines.size(), 2u);
  for (int i = 0; i < 2; ++i)
    EXPECT_EQ(lines[i].body.substr(lines[i].body.find(')') + 1),
              " a=" + hex(i) + " badu32=0 badx64=0x0 bads=(fault) badus=(fault) badarr={0,0} "
              "badbf=0 badchr='" + std::string(1, '\0') + "' good=" + std::to_string(2 * i));
  EXPECT_EQ(prog->quit(), 0);
}

// Two return probes on one function (one of each style): both see the caller's address, as
// the kernel's chained return probes do, never the return trampoline.
TEST_F(TracefsMountTest, TwoReturnProbesOnOneFunctionBothSeeTheCaller) {
  const ElfSymbol& main_fn = symbol("main");
  echo("uprobe_events", "r:ut/uret " + place("traced_add") + " rv=$retval");
  echo("kprobe_events", "r:kt/kret " + kProgName + ":traced_add rv=$retval");
  ASSERT_EQ(echo_truncate(path("events/enable"), "1").exit_code(), 0);
  auto prog = exec_program();
  ASSERT_TRUE(prog->call(2));
  const uint64_t base = load_base(prog->pid());
  const std::vector<TraceLine> lines = parse_all(trace_lines(), prog->pid(), "traced_prog");
  const std::vector<std::string> uret = bodies_of(lines, "uret"), kret = bodies_of(lines, "kret");
  ASSERT_EQ(uret.size(), 2u);
  ASSERT_EQ(kret.size(), 2u);
  for (int i = 0; i < 2; ++i) {
    const uint64_t ret = return_address(uret[i]);
    EXPECT_GT(ret, base + main_fn.vaddr) << uret[i];
    EXPECT_LT(ret, base + main_fn.vaddr + main_fn.size) << uret[i];
    EXPECT_EQ(kret[i].rfind("(main+" + hex(ret - base - main_fn.vaddr) + "/" +
                                hex(main_fn.size) + " <- traced_add) rv=" + hex(3 * i),
                            0),
              0u)
        << kret[i];
  }
}

// Filters and triggers written with echo act on the records of a real program.
TEST_F(TracefsMountTest, FiltersAndTriggersActOnTheProgramsRecords) {
  echo("uprobe_events", "p:ft/add " + place("traced_add") + " a=%di");
  echo("uprobe_events", "p:ft/str " + place("traced_str") + " s=+0(%di):string");
  echo("uprobe_events", "r:ft/ret " + place("traced_add") + " rv=$retval");
  for (const char* e : {"add", "str"})
    ASSERT_EQ(echo_truncate(path(std::string("events/ft/") + e + "/enable"), "1").exit_code(), 0);
  ASSERT_EQ(echo_truncate(path("events/ft/add/filter"), "a == 2 || a == 4").exit_code(), 0);
  ASSERT_EQ(echo_truncate(path("events/ft/str/filter"), "s ~ \"*-3\"").exit_code(), 0);
  EXPECT_EQ(read("events/ft/add/filter"), "a == 2 || a == 4\n");
  auto prog = exec_program();
  ASSERT_TRUE(prog->call(6));
  ASSERT_TRUE(prog->str(5));
  std::vector<TraceLine> lines = parse_all(trace_lines(), prog->pid(), "traced_prog");
  std::string seen;
  for (const TraceLine& t : lines) seen += t.event + ":" + t.body.substr(t.body.find(')') + 1) + "\n";
  EXPECT_EQ(seen, "add: a=0x2\nadd: a=0x4\nstr: s=\"name-3\"\n");
  // An invalid filter: EINVAL, the text with its caret in the file, the event unfiltered.
  CommandResult r = echo_truncate(path("events/ft/add/filter"), "zzz == 1");
  EXPECT_EQ(r.err, echo_write_error(EINVAL));
  EXPECT_EQ(read("events/ft/add/filter"), "zzz == 1\n    ^\nparse_error: Field not found\n\n");
  EXPECT_EQ(error_log(), error_log_entry("event filter parse error", "Field not found", "zzz == 1", 4));
  ASSERT_EQ(echo_truncate(path("events/ft/str/filter"), "0").exit_code(), 0);
  EXPECT_EQ(read("events/ft/str/filter"), "none\n");
  ASSERT_EQ(echo_truncate(path("trace"), "").exit_code(), 0);
  // Triggers: ret comes on in soft mode once add sees a == 1; tracing goes off after a == 3.
  ASSERT_EQ(echo_truncate(path("events/ft/add/trigger"), "enable_event:ft:ret:1 if a == 1").exit_code(), 0);
  EXPECT_EQ(read("events/ft/ret/enable"), "0*\n");
  echo("events/ft/add/trigger", "traceoff:1 if a == 3");
  // Newest first.
  EXPECT_EQ(read("events/ft/add/trigger"),
            "traceoff:count=1 if a == 3\nenable_event:ft:ret:count=1 if a == 1\n");
  ASSERT_TRUE(prog->call(6));
  seen.clear();
  for (const TraceLine& t : parse_all(trace_lines(), prog->pid(), "traced_prog"))
    seen += t.event + ":" + t.body.substr(t.body.find(')') + 1) + "\n";
  EXPECT_EQ(seen, "add: a=0x0\nadd: a=0x1\nret: rv=0x3\nadd: a=0x2\nret: rv=0x6\nadd: a=0x3\n");
  EXPECT_EQ(read("tracing_on"), "0\n");
  EXPECT_EQ(read("events/ft/ret/enable"), "1*\n");
  EXPECT_EQ(read("events/ft/add/trigger"),
            "traceoff:count=0 if a == 3\nenable_event:ft:ret:count=0 if a == 1\n");
  // Hits are counted while tracing is off; nothing is recorded.
  const std::string before = read("uprobe_profile");
  ASSERT_TRUE(prog->call(2));
  EXPECT_EQ(trace_lines().size(), 6u);
  EXPECT_NE(read("uprobe_profile"), before);
  EXPECT_NE(read("uprobe_profile").find(profile_line(kProg, "add", 14)), std::string::npos)
      << read("uprobe_profile");
}

// trace_marker's lines, between a program's lines, with the writer's name and pid.
TEST_F(TracefsMountTest, TraceMarkerLines) {
  echo("uprobe_events", "p:mk/add " + place("traced_add") + " a=%di");
  ASSERT_EQ(echo_truncate(path("events/mk/add/enable"), "1").exit_code(), 0);
  auto prog = exec_program();
  ASSERT_TRUE(prog->call(1));
  CommandResult r = bash("echo \"$1\" > \"$2\"; echo $$", {"hello marker", path("trace_marker")});
  ASSERT_EQ(r.exit_code(), 0) << r.err;
  const long shell = std::stol(r.out);
  ASSERT_TRUE(prog->call(1));
  // Without a newline: one is added; with O_TRUNC or not, the same.
  ASSERT_EQ(m_.write("trace_marker", "no newline", O_WRONLY), 0);
  const std::vector<std::string> raw = trace_lines();
  ASSERT_EQ(raw.size(), 4u);
  TraceLine t;
  ASSERT_TRUE(parse_trace_line(raw[1], &t)) << raw[1];
  EXPECT_EQ(render_trace_line(t), raw[1]);
  EXPECT_EQ(t.comm, "bash");
  EXPECT_EQ(t.pid, shell);
  EXPECT_EQ(t.event, "tracing_mark_write");
  EXPECT_EQ(t.body, "hello marker");
  EXPECT_NE(raw[0].find(" add: ("), std::string::npos);
  EXPECT_NE(raw[2].find(" add: ("), std::string::npos);
  ASSERT_TRUE(parse_trace_line(raw[3], &t)) << raw[3];
  EXPECT_EQ(t.pid, static_cast<long>(syscall(SYS_gettid)));
  EXPECT_EQ(t.body, "no newline");
  // trace_marker cannot be read (root may open it for reading); with tracing off a
  // write is EBADF.
  int fd = open(path("trace_marker").c_str(), O_RDWR | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  char b[16];
  EXPECT_EQ(::read(fd, b, sizeof b), -1);
  EXPECT_EQ(errno, EINVAL);
  close(fd);
  ASSERT_EQ(echo_truncate(path("tracing_on"), "0").exit_code(), 0);
  r = echo_append(path("trace_marker"), "off");
  EXPECT_EQ(r.err, echo_write_error(EBADF));
}

// A burst into a tiny buffer: what does not fit is lost, and trace_pipe says so with the
// kernel's "CPU:N [LOST M EVENTS]" line before the next record that got in; what was
// kept plus what was lost is everything.
TEST_F(TracefsMountTest, ATinyBufferLosesEventsAndSaysSo) {
  ASSERT_EQ(echo_truncate(path("buffer_size_kb"), "4").exit_code(), 0);
  EXPECT_EQ(read("buffer_size_kb"), "7\n");
  echo("uprobe_events", "p:lost/add " + place("traced_add") + " a=%di");
  ASSERT_EQ(echo_truncate(path("events/lost/add/enable"), "1").exit_code(), 0);
  auto prog = exec_program();
  int fd = open(path("trace_pipe").c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  auto drain = [&] {
    std::string text;
    for (std::string more; !(more = testing::read_available(fd)).empty();) text += more;
    return split_lines(text);
  };
  ASSERT_TRUE(prog->call(2000));
  std::vector<std::string> lines = drain();
  ASSERT_TRUE(prog->call(1));
  for (const std::string& l : drain()) lines.push_back(l);
  close(fd);
  size_t kept = 0, lost = 0, lost_lines = 0;
  for (size_t i = 0; i < lines.size(); ++i) {
    const std::string& l = lines[i];
    unsigned long m = 0;
    int c = -1;
    if (sscanf(l.c_str(), "CPU:%d [LOST %lu EVENTS]", &c, &m) == 2) {
      EXPECT_EQ(l, "CPU:" + std::to_string(c) + " [LOST " + std::to_string(m) + " EVENTS]");
      lost += m;
      ++lost_lines;
      // The next line is a record of that CPU.
      TraceLine t;
      ASSERT_LT(i + 1, lines.size());
      ASSERT_TRUE(parse_trace_line(lines[i + 1], &t)) << lines[i + 1];
      EXPECT_EQ(t.cpu, c);
      continue;
    }
    TraceLine t;
    EXPECT_TRUE(parse_trace_line(l, &t)) << l;
    ++kept;
  }
  EXPECT_GE(lost_lines, 1u);
  EXPECT_GT(kept, 1u);
  EXPECT_EQ(kept + lost, 2001u);
  // The last record is the single call's.
  EXPECT_NE(lines.back().find(") a=0x0"), std::string::npos) << lines.back();
}

// A program started by the test and attached with `probefs attach`: its lines while it is
// attached; once detached, nothing more, and the lines already there still name the
// function (the kernel keeps what it printed).
TEST_F(TracefsMountTest, AnAttachedProgramHitsTheEvents) {
  ProgramProcess prog(ProgramProcess::plain());
  ASSERT_TRUE(prog.ready());
  ASSERT_TRUE(prog.call(1));
  CommandResult r = run_command({PROBEFS_BIN, "attach", m_.dir(), std::to_string(prog.pid())});
  ASSERT_EQ(r.exit_code(), 0) << r.err;
  echo("kprobe_events", "p:at/k " + kProgName + ":traced_add a=%di");
  echo("uprobe_events", "r:at/u " + place("traced_add") + " rv=$retval");
  ASSERT_EQ(echo_truncate(path("events/at/enable"), "1").exit_code(), 0);
  ASSERT_TRUE(prog.call(2));
  const uint64_t base = load_base(prog.pid());
  std::vector<std::string> attached = trace_lines();
  std::vector<TraceLine> lines = parse_all(attached, prog.pid(), "traced_prog");
  ASSERT_EQ(lines.size(), 4u);
  EXPECT_EQ(lines[0].body, "(traced_add+0x0/" + hex(symbol("traced_add").size) + ") a=0x0");
  EXPECT_EQ(lines[1].event, "u");
  EXPECT_NE(lines[1].body.find(" <- " + hex(base + symbol("traced_add").vaddr) + ") rv=0x0"),
            std::string::npos)
      << lines[1].body;
  EXPECT_EQ(lines[2].body, "(traced_add+0x0/" + hex(symbol("traced_add").size) + ") a=0x1");
  r = run_command({PROBEFS_BIN, "detach", m_.dir(), std::to_string(prog.pid())});
  ASSERT_EQ(r.exit_code(), 0) << r.err;
  ASSERT_TRUE(prog.call(2));
  EXPECT_EQ(trace_lines(), attached);
  EXPECT_EQ(prog.quit(), 0);
}

// ---- 4. perf probe, unchanged --------------------------------------------------------------

// perf probe run against the mount only: TRACEFS_PATH names it (checked to be a probefs
// mount before every run), HOME is a scratch directory of the test (perf keeps its build-id
// cache and config there), and no debuginfod is asked.
class PerfProbeTest : public TracefsMountTest {
 protected:
  void SetUp() override {
    TracefsMountTest::SetUp();
    if (HasFatalFailure()) return;
    if (access("/usr/bin/perf", X_OK) != 0) GTEST_SKIP() << "no /usr/bin/perf (linux-perf)";
    std::string tmpl = (std::filesystem::temp_directory_path() / "probefs-perf-XXXXXX").string();
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    home_ = tmpl;
  }
  void TearDown() override {
    TracefsMountTest::TearDown();
    if (!home_.empty()) std::filesystem::remove_all(home_);
  }
  // `perf ARGS...` against the mount.
  CommandResult perf(const std::vector<std::string>& args) {
    CommandResult r;
    if (!testing::probefs_mounted(m_.dir())) {
      ADD_FAILURE() << m_.dir() << " is not a probefs mount: perf is not run";
      return r;
    }
    std::vector<std::string> argv = {"env", "-u", "DEBUGINFOD_URLS", "TRACEFS_PATH=" + m_.dir(),
                                     "HOME=" + home_, "/usr/bin/perf"};
    argv.insert(argv.end(), args.begin(), args.end());
    return run_command(argv, 60000);
  }

  std::string home_;
};

TEST_F(PerfProbeTest, AddsListsAndDeletesEventsOnTheMount) {
  const std::string add_off = padded(symbol("traced_add").file_offset);
  CommandResult r = perf({"probe", "-x", kProg, "traced_add", "a=%di", "b=%si"});
  ASSERT_EQ(r.exit_code(), 0) << r.out << r.err;
  EXPECT_NE((r.out + r.err).find("probe_traced_prog:traced_add (on traced_add in " + kProg +
                                 " with a=%di b=%si)"),
            std::string::npos)
      << r.out << r.err;
  r = perf({"probe", "-x", kProg, "traced_add%return", "$retval"});
  ASSERT_EQ(r.exit_code(), 0) << r.out << r.err;
  r = perf({"probe", "-x", kProg, "traced_str", "s=+0(%di):string"});
  ASSERT_EQ(r.exit_code(), 0) << r.out << r.err;
  EXPECT_EQ(read("uprobe_events"),
            "p:probe_traced_prog/traced_add " + kProg + ":" + add_off + " a=%di b=%si\n"
            "r:probe_traced_prog/traced_add__return " + kProg + ":" + add_off + " arg1=$retval\n"
            "p:probe_traced_prog/traced_str " + kProg + ":" +
                padded(symbol("traced_str").file_offset) + " s=+0(%di):string\n");
  // perf probe -l reads them back.
  r = perf({"probe", "-l"});
  ASSERT_EQ(r.exit_code(), 0) << r.err;
  for (const char* ev : {"probe_traced_prog:traced_add ", "probe_traced_prog:traced_add__return ",
                         "probe_traced_prog:traced_str "})
    EXPECT_NE(r.out.find(ev), std::string::npos) << ev << "\n" << r.out;
  EXPECT_NE(r.out.find("(on traced_add%return"), std::string::npos) << r.out;
  // A duplicate: perf's EEXIST.
  r = perf({"probe", "-x", kProg, "traced_add", "a=%di"});
  EXPECT_NE(r.exit_code(), 0);
  EXPECT_NE(r.err.find("Error: event \"traced_add\" already exists."), std::string::npos) << r.err;
  // The events work: a program run on the mount hits them.
  ASSERT_EQ(echo_truncate(path("events/probe_traced_prog/enable"), "1").exit_code(), 0);
  auto prog = exec_program();
  ASSERT_TRUE(prog->call(2));
  ASSERT_TRUE(prog->str(1));
  std::string seen;
  for (const TraceLine& t : parse_all(trace_lines(), prog->pid(), "traced_prog"))
    seen += t.event + ":" + t.body.substr(t.body.find(')') + 1) + "\n";
  EXPECT_EQ(seen,
            "traced_add: a=0x0 b=0x0\ntraced_add__return: arg1=0x0\n"
            "traced_add: a=0x1 b=0x2\ntraced_add__return: arg1=0x3\n"
            "traced_str: s=\"name-0\"\n");
  ASSERT_EQ(echo_truncate(path("events/probe_traced_prog/enable"), "0").exit_code(), 0);
  // Deleting one, and one that is not there.
  r = perf({"probe", "-d", "probe_traced_prog:traced_str"});
  EXPECT_EQ(r.exit_code(), 0) << r.err;
  EXPECT_NE((r.out + r.err).find("Removed event: probe_traced_prog:traced_str"), std::string::npos)
      << r.out << r.err;
  EXPECT_EQ(read("uprobe_events").find("traced_str"), std::string::npos);
  r = perf({"probe", "-d", "probe_traced_prog:nonexist"});
  EXPECT_NE(r.exit_code(), 0);
  EXPECT_NE(r.err.find("\"probe_traced_prog:nonexist\" does not hit any event."), std::string::npos)
      << r.err;
  r = perf({"probe", "-d", "probe_traced_prog:*"});
  EXPECT_EQ(r.exit_code(), 0) << r.err;
  EXPECT_EQ(read("uprobe_events"), "");
  EXPECT_EQ(access(path("events/probe_traced_prog").c_str(), F_OK), -1);
}

// `perf record -e` on one of our events fails: its id is in a range the kernel's own
// events never use, so the kernel has no such tracepoint. Only run where the kernel's
// tracefs answers (perf_event_open takes the kernel's event lock); nothing is recorded.
TEST_F(PerfProbeTest, PerfRecordOnOurEventFails) {
  CommandResult r = perf({"probe", "-x", kProg, "traced_add", "a=%di"});
  ASSERT_EQ(r.exit_code(), 0) << r.out << r.err;
  const long id = std::stol(read("events/probe_traced_prog/traced_add/id"));
  EXPECT_GE(id, 0x7000);
  EXPECT_LE(id, 0x7FFD);
  KernelTracefs k;
  const std::string why = k.start(5000);
  if (!why.empty()) GTEST_SKIP() << why;
  ASSERT_TRUE(testing::probefs_mounted(m_.dir()));
  KernelTracefs::Step s = k.run(
      "cd \"$1\" && exec env -u DEBUGINFOD_URLS TRACEFS_PATH=\"$2\" HOME=\"$1\" /usr/bin/perf "
      "record -e probe_traced_prog:traced_add -o \"$1/perf.data\" -- true",
      {home_, m_.dir()}, 20000);
  if (!s.answered) GTEST_SKIP() << "perf record did not end: the kernel does not answer";
  EXPECT_NE(s.exit_code, 0) << s.out << s.err;
}

// ---- 5. the kernel's uprobe and ours, side by side ------------------------------------------

// A line's body with every address inside the program's image written as its offset from
// the image's start ("B+0x1ad0"), so that two runs of the program compare.
std::string normalized(const std::string& body, uint64_t base) {
  std::string out;
  for (size_t i = 0; i < body.size();) {
    if (body.compare(i, 2, "0x") == 0) {
      size_t j = i + 2;
      while (j < body.size() && isxdigit(static_cast<unsigned char>(body[j]))) ++j;
      const uint64_t v = j > i + 2 ? std::stoull(body.substr(i + 2, j - i - 2), nullptr, 16) : 0;
      if (v >= base && v - base < (1u << 20)) {
        out += "B+" + hex(v - base);
        i = j;
        continue;
      }
    }
    out += body[i++];
  }
  return out;
}

// The same uprobe definitions written to the kernel's uprobe_events (a private mount of the
// kernel's tracefs, an instance of its own) and to ours, the same program run under each:
// the same argument values, the same line layout. The probefs half always runs; the kernel
// half is skipped when the kernel's tracefs does not answer.
// A copy of a program in a directory of its own under the temporary directory (the
// kernel's probes on it reach no other process), removed at the end.
struct ProgramCopy {
  std::filesystem::path dir;
  std::string path;
  ProgramCopy(const std::string& program, const std::string& tag) {
    std::error_code ec;
    dir = std::filesystem::temp_directory_path() /
          ("probefs-" + tag + "-" + std::to_string(getpid()));
    std::filesystem::create_directories(dir / "copy", ec);
    path = (dir / "copy" / std::filesystem::path(program).filename()).string();
    std::filesystem::copy_file(program, path, std::filesystem::copy_options::overwrite_existing,
                               ec);
    if (ec) path.clear();
  }
  ~ProgramCopy() {
    std::error_code e;
    std::filesystem::remove_all(dir, e);
  }
  ProgramCopy(const ProgramCopy&) = delete;
  ProgramCopy& operator=(const ProgramCopy&) = delete;
  bool ok() const { return !path.empty(); }
};

TEST_F(TracefsMountTest, TheKernelsUprobeAndOursPrintTheSame) {
  // A copy of the program of its own: the kernel's probes reach no other process.
  ProgramCopy copy(kProg, "cmp");
  ASSERT_TRUE(copy.ok());
  const std::string& prog = copy.path;
  auto place_in_copy = [&](const char* sym) { return prog + ":" + hex(symbol(sym).file_offset); };

  KernelTracefs k;
  const std::string g = k.group();
  const std::vector<std::pair<std::string, std::string>> defs = {
      {"cmp_add", "p:" + g + "/cmp_add " + place_in_copy("traced_add") +
                      " a=%di b=%si:s32 bx=%si:x16 b8=%si:s8 comm=$comm g=@+" +
                      hex(symbol("traced_global").vaddr) +
                      ":s64 fs=+0(%di):string fu=+0(%di):u32 fc=+0(%di):char"},
      {"cmp_ret", "r:" + g + "/cmp_ret " + place_in_copy("traced_add") +
                      " rv=$retval rvs=$retval:s32"},
      {"cmp_str", "p:" + g + "/cmp_str " + place_in_copy("traced_str") +
                      " s=+0(%di):string n=%si:u64 c=+0(%di):char c3=+0(%di):char[3] "
                      "by=+0(%di):x8[2] u=+0(%di):ustring"},
  };
  auto run_program = [&](ProgramProcess& p, uint64_t* base) {
    EXPECT_TRUE(p.ready());
    EXPECT_TRUE(p.call(3));
    EXPECT_TRUE(p.str(2));
    *base = load_base(p.pid(), prog);
  };
  auto compared = [](const std::vector<std::string>& raw, pid_t pid, uint64_t base) {
    std::vector<std::string> out;
    for (const TraceLine& t : parse_all(raw, pid, "traced_prog"))
      out.push_back(t.event + ": " + normalized(t.body, base));
    return out;
  };

  // probefs.
  for (const auto& [name, def] : defs) {
    echo("uprobe_events", def);
    ASSERT_EQ(echo_truncate(path("events/" + g + "/" + name + "/enable"), "1").exit_code(), 0);
  }
  std::vector<std::string> ours;
  {
    ProgramProcess p(ProgramProcess::under_probefs(m_.dir(), prog));
    uint64_t base = 0;
    run_program(p, &base);
    ours = compared(trace_lines(), p.pid(), base);
    EXPECT_EQ(p.quit(), 0);
  }
  ASSERT_EQ(ours.size(), 3u * 2 + 2u);
  EXPECT_EQ(ours[0], "cmp_add: (B+" + hex(symbol("traced_add").vaddr) +
                         ") a=0x0 b=0 bx=0x0 b8=0 comm=\"traced_prog\" g=4242 fs=(fault) fu=0 fc='" +
                         std::string(1, '\0') + "'");
  EXPECT_EQ(ours[7], "cmp_str: (B+" + hex(symbol("traced_str").vaddr) +
                         ") s=\"name-1\" n=1 c='n' c3={'n','a','m'} by={0x6e,0x61} u=\"name-1\"");

  // The kernel, each step a child with a deadline.
  const std::string why = k.start(5000);
  if (!why.empty()) GTEST_SKIP() << why << "; the probefs half ran";
  for (const auto& [name, def] : defs) {
    KernelTracefs::Step s = k.run("echo \"$1\" >> \"$2/uprobe_events\"", {def, k.dir()}, 10000);
    if (!s.answered) GTEST_SKIP() << "the kernel's uprobe_events did not answer";
    ASSERT_EQ(s.exit_code, 0) << def << ": " << s.err;
    k.remember_probe(g + "/" + name);
    s = k.run("echo 1 > \"$1/events/$2/enable\"", {k.instance(), g + "/" + name}, 10000);
    if (!s.answered) GTEST_SKIP() << "the kernel's enable file did not answer";
    ASSERT_EQ(s.exit_code, 0) << s.err;
  }
  std::vector<std::string> kernels;
  {
    ProgramProcess p(ProgramProcess::plain(prog));
    uint64_t base = 0;
    run_program(p, &base);
    KernelTracefs::Step s = k.run("cat \"$1/trace\"", {k.instance()}, 10000);
    if (!s.answered) GTEST_SKIP() << "the kernel's trace did not answer";
    ASSERT_EQ(s.exit_code, 0) << s.err;
    EXPECT_EQ(s.out.substr(0, 2), "# ");
    kernels = compared(trace_body_lines(s.out), p.pid(), base);
    EXPECT_EQ(p.quit(), 0);
  }
  EXPECT_EQ(ours, kernels);
}

// The stack blocks of trace lines: the " => " lines after each "<user stack trace>" (or
// "<stack trace>"), in order.
std::vector<std::string> stack_lines(const std::vector<std::string>& lines, bool user) {
  std::vector<std::string> out;
  const std::string head = user ? ": <user stack trace>" : ": <stack trace>";
  bool in = false;
  for (const std::string& l : lines) {
    if (l.compare(0, 4, " => ") == 0) {
      if (in) out.push_back(l);
      continue;
    }
    in = l.size() >= head.size() && l.compare(l.size() - head.size(), head.size(), head) == 0;
  }
  return out;
}

// options/userstacktrace with sym-userobj on a program built with frame pointers: each
// event's `<user stack trace>` is the kernel's uprobe's for the same calls, file and offset
// for file and offset (the addresses of a mapping differ between two processes, offsets in
// it do not). options/stacktrace adds the `<stack trace>` of the same stack, named.
TEST_F(TracefsMountTest, UserStacksAreTheKernelsUprobeUserStacks) {
  ProgramCopy copy(PROBEFS_STACK_PROG_FP, "ust");
  ASSERT_TRUE(copy.ok());
  const std::string& prog = copy.path;
  const ElfSymbol inner = find_elf_symbol(prog, "inner");
  ASSERT_TRUE(inner.found);
  KernelTracefs k;
  const std::string g = k.group();
  const std::string def = "p:" + g + "/ust " + prog + ":" + hex(inner.file_offset);
  // via_a(0) + via_a(1) + via_b(0): 3 + 6 + 8.
  auto run_program = [&](ProgramProcess& p) {
    EXPECT_TRUE(p.ready());
    EXPECT_EQ(p.ask("run 2 1"), "ok 17");
  };

  echo("uprobe_events", def);
  ASSERT_EQ(echo_truncate(path("events/" + g + "/ust/enable"), "1").exit_code(), 0);
  for (const char* o : {"userstacktrace", "sym-userobj", "stacktrace", "sym-offset"})
    ASSERT_EQ(echo_truncate(path(std::string("options/") + o), "1").exit_code(), 0);
  std::vector<std::string> ours, named;
  {
    ProgramProcess p(ProgramProcess::under_probefs(m_.dir(), prog));
    run_program(p);
    const std::vector<std::string> lines = trace_lines();  // while it lives: sym-userobj
    ours = stack_lines(lines, true);
    named = stack_lines(lines, false);
    EXPECT_EQ(p.quit(), 0);
  }
  ASSERT_EQ(ours.size(), 3u * 4) << ::testing::PrintToString(ours);
  EXPECT_EQ(ours[0], " => " + prog + "[+" + hex(inner.file_offset % 4096) + "]");
  // The named stack starts at the function and its caller, then the callers' callers.
  ASSERT_GE(named.size(), 3u * 5) << ::testing::PrintToString(named);
  EXPECT_EQ(named[0].substr(0, 14), " => inner+0x0/");
  EXPECT_EQ(named[1].substr(0, 13), " => middle+0x");
  EXPECT_EQ(named[2].substr(0, 12), " => via_a+0x");
  EXPECT_EQ(named[3].substr(0, 11), " => main+0x");
  // An event record the daemon holds back (set_event_pid names another process) takes its
  // stacks with it.
  ASSERT_EQ(echo_truncate(path("trace"), "").exit_code(), 0);
  ASSERT_EQ(echo_truncate(path("set_event_pid"), "1").exit_code(), 0);
  {
    ProgramProcess p(ProgramProcess::under_probefs(m_.dir(), prog));
    run_program(p);
    const std::vector<std::string> lines = trace_lines();
    EXPECT_TRUE(lines.empty()) << ::testing::PrintToString(lines);
    EXPECT_EQ(p.quit(), 0);
  }
  ASSERT_EQ(echo_truncate(path("set_event_pid"), "").exit_code(), 0);

  // The kernel, each step a child with a deadline.
  const std::string why = k.start(5000);
  if (!why.empty()) GTEST_SKIP() << why << "; the probefs half ran";
  KernelTracefs::Step s = k.run("echo \"$1\" >> \"$2/uprobe_events\"", {def, k.dir()}, 10000);
  if (!s.answered) GTEST_SKIP() << "the kernel's uprobe_events did not answer";
  ASSERT_EQ(s.exit_code, 0) << def << ": " << s.err;
  k.remember_probe(g + "/ust");
  s = k.run("echo 1 > \"$1/events/$2/enable\" && echo 1 > \"$1/options/userstacktrace\" && "
            "echo 1 > \"$1/options/sym-userobj\"",
            {k.instance(), g + "/ust"}, 10000);
  if (!s.answered) GTEST_SKIP() << "the kernel's enable file did not answer";
  ASSERT_EQ(s.exit_code, 0) << s.err;
  std::vector<std::string> kernels;
  {
    ProgramProcess p(ProgramProcess::plain(prog));
    run_program(p);
    s = k.run("cat \"$1/trace\"", {k.instance()}, 10000);
    if (!s.answered) GTEST_SKIP() << "the kernel's trace did not answer";
    ASSERT_EQ(s.exit_code, 0) << s.err;
    kernels = stack_lines(trace_body_lines(s.out), true);
    EXPECT_EQ(p.quit(), 0);
  }
  EXPECT_EQ(ours, kernels);
}

// The stacktrace trigger: a `<stack trace>` after each record of the event whose filter
// matched, while its count lasts; the count left in the trigger file as the kernel shows
// it. The names, without sym-offset, are the functions' alone.
TEST_F(TracefsMountTest, StacktraceTriggerFollowsItsFilterAndCount) {
  const std::string prog = PROBEFS_STACK_PROG_FP;
  const std::string name = prog.substr(prog.rfind('/') + 1);
  echo("kprobe_events", "p:st/inner " + name + ":inner x=%di:u64");
  ASSERT_EQ(echo_truncate(path("events/st/inner/trigger"), "stacktrace:2 if x > 1").exit_code(), 0);
  EXPECT_EQ(read("events/st/inner/trigger"), "stacktrace:count=2 if x > 1\n");
  EXPECT_NE(echo_truncate(path("events/st/inner/trigger"), "stacktrace").exit_code(), 0);  // taken
  ASSERT_EQ(echo_truncate(path("events/st/inner/enable"), "1").exit_code(), 0);
  std::vector<std::string> lines;
  {
    ProgramProcess p(ProgramProcess::under_probefs(m_.dir(), prog));
    ASSERT_TRUE(p.ready());
    // inner(1), inner(2), inner(3); then inner(1) and inner(2) again, the count spent.
    EXPECT_EQ(p.ask("run 3 0"), "ok 18");
    EXPECT_EQ(p.ask("run 2 0"), "ok 9");
    lines = trace_lines();
    EXPECT_EQ(p.quit(), 0);
  }
  std::vector<std::string> shape;  // "x=N" per event, "stack" per block, its first frames
  for (const std::string& l : lines) {
    if (const size_t at = l.find(" x="); at != std::string::npos) shape.push_back(l.substr(at + 1));
    else if (l.size() > 15 && l.compare(l.size() - 15, 15, ": <stack trace>") == 0) shape.push_back("stack");
    else if (l == " => inner" || l == " => middle" || l == " => via_a" || l == " => main") shape.push_back(l);
  }
  EXPECT_EQ(shape, (std::vector<std::string>{"x=1", "x=2", "stack", " => inner", " => middle",
                                             " => via_a", " => main", "x=3", "stack", " => inner",
                                             " => middle", " => via_a", " => main", "x=1", "x=2"}))
      << ::testing::PrintToString(lines);
  EXPECT_EQ(read("events/st/inner/trigger"), "stacktrace:count=0 if x > 1\n");
  ASSERT_EQ(echo_truncate(path("events/st/inner/trigger"), "!stacktrace").exit_code(), 0);
  EXPECT_EQ(read("events/st/inner/trigger"),
            "# Available triggers:\n# traceon traceoff snapshot stacktrace enable_event disable_event hist\n");
}

}  // namespace
}  // namespace probefs::fs
