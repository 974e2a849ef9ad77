// A traced program that forges records in its own ring area (tests/fs/hostile_prog.cc)
// beside a well-behaved one (traced_prog): the daemon stays up, prints the well-behaved
// target's lines, the hostile target's own events under its own pid, nothing else, and
// per_cpu/cpuN/stats counts what it dropped (DESIGN.md §8).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "events/compile.h"
#include "fs/tracefs.h"
#include "tests/fs/trace_files_test_util.h"
#include "tracee/probe_places.h"
#include "tracee/tracer.h"

namespace probefs::fs {
namespace {

using testing::KillOnExit;
using testing::ProgramPipes;

const std::string kVictim = PROBEFS_TRACED_PROG;
const std::string kHostile = PROBEFS_HOSTILE_PROG;

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  size_t at = 0;
  while (at < text.size()) {
    size_t nl = text.find('\n', at);
    if (nl == std::string::npos) nl = text.size();
    if (nl > at && text[at] != '#') out.push_back(text.substr(at, nl - at));
    at = nl + 1;
  }
  return out;
}

// Lines as a failure shows them: a forged record may make one tens of KiB long.
std::string shown(const std::vector<std::string>& lines) {
  std::string s;
  for (const std::string& l : lines) s += l.substr(0, 160) + (l.size() > 160 ? "...\n" : "\n");
  return s;
}

// The TASK-PID column's pid and the flags column of a trace line.
bool line_pid(const std::string& l, int* pid, std::string* flags) {
  if (l.size() < 40 || l[16] != '-') return false;
  char f[8] = {};
  unsigned cpu = 0;
  if (sscanf(l.c_str() + 17, "%d [%u] %5c", pid, &cpu, f) != 3) return false;
  *flags = f;
  return true;
}

class HostileTargetTest : public ::testing::Test {
 protected:
  void SetUp() override {
    tracee::Tracer::Options o;
    o.agent_path = PROBEFS_AGENT_PATH;
    std::string err;
    tracer_ = tracee::Tracer::create(o, &err);
    ASSERT_NE(tracer_, nullptr) << err;
    Tracefs::Options fo;
    fo.agent_path = PROBEFS_AGENT_PATH;
    fs_ = std::make_unique<Tracefs>(*tracer_, fo);
  }

  void TearDown() override {
    for (pid_t p : {victim_, hostile_}) {
      if (p <= 0) continue;
      kill(p, SIGKILL);
      int st;
      (void)tracer_->wait_exit(p, 10000, &st);
    }
    fs_.reset();
    tracer_.reset();
  }

  uint16_t define(const std::string& line, events::CompiledEvent* out = nullptr) {
    return testing::define_event(*fs_, *tracer_, line, out);
  }

  std::string uprobe(const std::string& name, const std::string& path, const char* sym,
                     const std::string& args) {
    uint64_t off = 0;
    EXPECT_EQ(tracee::symbol_file_offset(path, sym, &off), 0) << sym;
    char buf[64];
    snprintf(buf, sizeof buf, ":0x%llx ", static_cast<unsigned long long>(off));
    return "p:" + name + " " + path + buf + args;
  }

  bool launch(const std::string& prog, ProgramPipes& pipes, KillOnExit& guard, pid_t* pid) {
    tracee::Tracer::LaunchSpec s;
    s.argv = {prog};
    s.stdin_fd = pipes.child_stdin();
    s.stdout_fd = pipes.child_stdout();
    std::string err;
    int rc = tracer_->launch(s, pid, &err);
    EXPECT_EQ(rc, 0) << err;
    if (rc != 0) return false;
    guard.set(*pid);
    pipes.parent_side();
    return pipes.line() == "ready";
  }

  std::string read_file(const std::string& path, int flags = O_RDONLY) {
    std::unique_ptr<Handle> h;
    Request rq;
    rq.flags = flags;
    if (fs_->tree().open(path, rq, flags, &h) != 0) return "";
    std::string all, part;
    for (uint64_t off = 0;; off += part.size()) {
      if (h->read(rq, off, 1 << 20, &part) != 0 || part.empty()) return all;
      all += part;
    }
  }

  int64_t write_file(const std::string& path, const std::string& data) {
    std::unique_ptr<Handle> h;
    Request rq;
    rq.flags = O_WRONLY;
    if (int rc = fs_->tree().open(path, rq, rq.flags, &h); rc != 0) return rc;
    return h->write(rq, 0, data);
  }

  // trace_pipe, read without blocking until it has nothing more.
  std::string drain() {
    std::unique_ptr<Handle> h;
    Request rq;
    rq.flags = O_RDONLY | O_NONBLOCK;
    if (fs_->tree().open("trace_pipe", rq, rq.flags, &h) != 0) return "";
    std::string all;
    for (;;) {
      std::string part;
      if (h->read(rq, 0, 1 << 20, &part) != 0 || part.empty()) return all;
      all += part;
    }
  }

  uint64_t dropped_events() {
    uint64_t sum = 0;
    for (int cpu = 0; cpu < fs_->cpus(); ++cpu) {
      const std::string s = read_file("per_cpu/cpu" + std::to_string(cpu) + "/stats");
      const size_t at = s.find("dropped events: ");
      if (at != std::string::npos) sum += std::strtoull(s.c_str() + at + 16, nullptr, 10);
    }
    return sum;
  }

  std::unique_ptr<tracee::Tracer> tracer_;
  std::unique_ptr<Tracefs> fs_;
  ProgramPipes victim_pipes_, hostile_pipes_;
  KillOnExit victim_guard_, hostile_guard_;
  pid_t victim_ = 0, hostile_ = 0;
};

TEST_F(HostileTargetTest, ForgedRecordsAreDroppedAndCountedWhileHonestOnesPrint) {
  const uint16_t add_id = define(uprobe("t/add", kVictim, "traced_add", "a=%di b=%si"));
  events::CompiledEvent legit;
  const uint16_t legit_id = define(
      uprobe("h/legit", kHostile, "legit", "n=%di:s32 s=+0(%si):string t=+0(%si):string"),
      &legit);
  ASSERT_EQ(legit.fields.size(), 3u);
  ASSERT_TRUE(launch(kVictim, victim_pipes_, victim_guard_, &victim_));
  ASSERT_TRUE(launch(kHostile, hostile_pipes_, hostile_guard_, &hostile_));

  ASSERT_EQ(victim_pipes_.ask("call 2"), "ok 3");
  ASSERT_EQ(hostile_pipes_.ask("legit 1"), "ok 1");
  char cmd[160];
  snprintf(cmd, sizeof cmd, "forge %d %u %u %u %u %u", victim_, add_id, legit_id,
           legit.program.fixed_size, legit.fields[1].offset, legit.fields[2].offset);
  ASSERT_EQ(hostile_pipes_.ask(cmd), "forged 7");
  ASSERT_EQ(hostile_pipes_.ask("legit 2"), "ok 2");
  ASSERT_EQ(victim_pipes_.ask("call 1"), "ok 0");

  const std::vector<std::string> lines = lines_of(drain());
  int adds = 0;
  std::vector<std::string> legits;
  for (const std::string& l : lines) {
    int pid = 0;
    std::string flags;
    const std::string head = l.substr(0, 160);
    ASSERT_TRUE(line_pid(l, &pid, &flags)) << head;
    EXPECT_EQ(flags, ".....") << head;
    EXPECT_EQ(l.find("tracing_mark_write"), std::string::npos) << head;
    if (l.find(" add: ") != std::string::npos) {
      EXPECT_EQ(pid, victim_) << head;
      ++adds;
    } else if (l.find(" legit: ") != std::string::npos) {
      EXPECT_EQ(pid, hostile_) << head;
      legits.push_back(l.substr(l.find(" legit: "), 160));
    } else {
      ADD_FAILURE() << "a line of no event here: " << l.substr(0, 160);
    }
  }
  EXPECT_EQ(adds, 3);
  // Its two calls and the one forged record that fits its own event: under its own pid.
  ASSERT_EQ(legits.size(), 3u) << shown(lines);
  EXPECT_NE(legits[0].find("n=1 s=\"hostile\" t=\"hostile\""), std::string::npos) << legits[0];
  EXPECT_NE(legits[1].find("(0x1234) n=0 s=\"fake\" t=\"fake\""), std::string::npos)
      << legits[1];
  EXPECT_NE(legits[2].find("n=2 s=\"hostile\""), std::string::npos) << legits[2];
  // The victim's ring, a marker, another target's event, and three records that do not
  // fit the event's layout.
  EXPECT_EQ(dropped_events(), 6u);
  EXPECT_EQ(tracer_->rejected_records(), 3u);

  // Both go on being traced.
  ASSERT_EQ(hostile_pipes_.ask("legit 3"), "ok 3");
  ASSERT_EQ(victim_pipes_.ask("call 1"), "ok 0");
  const std::string after = drain();
  EXPECT_NE(after.find("n=3 s=\"hostile\""), std::string::npos) << shown(lines_of(after));
  EXPECT_NE(after.find(" add: "), std::string::npos) << shown(lines_of(after));
}

// Every target maps the mount's control page read-write: one that writes garbage over it
// can switch tracing and events of the mount, no more. The daemon reads the words as
// numbers, every file still answers, and a user's writes take it all back.
TEST_F(HostileTargetTest, AScribbledControlPageSwitchesTracingAndNothingElse) {
  const std::string line = uprobe("t/add", kVictim, "traced_add", "a=%di b=%si") + "\n";
  ASSERT_EQ(write_file("uprobe_events", line), static_cast<int64_t>(line.size()));
  ASSERT_EQ(write_file("events/t/add/trigger", "traceoff:3 if a == 100\n"), 23);
  ASSERT_EQ(write_file("events/t/add/enable", "1\n"), 2);
  ASSERT_TRUE(launch(kVictim, victim_pipes_, victim_guard_, &victim_));
  ASSERT_TRUE(launch(kHostile, hostile_pipes_, hostile_guard_, &hostile_));
  ASSERT_EQ(victim_pipes_.ask("call 1"), "ok 0");
  ASSERT_EQ(lines_of(drain()).size(), 1u);

  ASSERT_EQ(hostile_pipes_.ask("scribble"), "scribbled");
  EXPECT_EQ(read_file("tracing_on"), "0\n");
  EXPECT_EQ(read_file("events/t/add/enable"), "0*\n");
  EXPECT_EQ(read_file("events/t/add/trigger"), "traceoff:count=0 if a == 100\n");
  ASSERT_EQ(victim_pipes_.ask("call 2"), "ok 3");
  EXPECT_EQ(drain(), "");

  ASSERT_EQ(write_file("tracing_on", "1\n"), 2);
  ASSERT_EQ(write_file("events/t/add/enable", "1\n"), 2);
  EXPECT_EQ(read_file("events/t/add/enable"), "1*\n");
  ASSERT_EQ(victim_pipes_.ask("call 2"), "ok 3");
  EXPECT_EQ(lines_of(drain()).size(), 2u);
}

}  // namespace
}  // namespace probefs::fs
