// What the tracer holds per target, and for how long (DESIGN.md §8): thousands of
// short-lived traced processes with nobody reading cost no descriptor each and leave
// nothing behind once their records are read; the target limit refuses a process with a
// reason and lets it run on untraced.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <malloc.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <dirent.h>
#include <fstream>
#include <mutex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "events/link.h"
#include "tests/tracee/traced_prog_driver.h"
#include "tests/tracee/tracer_test_util.h"
#include "tracee/probe_places.h"
#include "tracee/tracer.h"

namespace probefs::tracee {
namespace {

using testing::eventually;
using testing::KillGuard;
using testing::make_tracer;
using testing::ProgPipes;

const std::string kProg = PROBEFS_TRACED_PROG;

struct Launched {
  ProgPipes pipes;
  KillGuard guard;
  pid_t pid = 0;

  int start(Tracer& t, std::string* err) {
    Tracer::LaunchSpec s;
    s.argv = {kProg};
    s.stdin_fd = pipes.child_stdin();
    s.stdout_fd = pipes.child_stdout();
    const int rc = t.launch(s, &pid, err);
    if (rc != 0) return rc;
    guard.set(pid);
    pipes.parent_side();
    return pipes.line() == "ready" ? 0 : -EPROTO;
  }
};

std::string add_probe() {
  uint64_t off = 0;
  EXPECT_EQ(symbol_file_offset(kProg, "traced_add", &off), 0);
  char buf[64];
  snprintf(buf, sizeof buf, ":0x%llx a=%%di", static_cast<unsigned long long>(off));
  return "p:t/add " + kProg + buf;
}

size_t open_descriptors() {
  size_t n = 0;
  DIR* d = opendir("/proc/self/fd");
  if (!d) return 0;
  while (dirent* e = readdir(d))
    if (e->d_name[0] != '.') ++n;
  closedir(d);
  return n;
}

// The ring areas this process maps (the daemon's side of each target's area).
size_t mappings() {
  std::ifstream in("/proc/self/maps");
  std::string l;
  size_t n = 0;
  while (std::getline(in, l))
    if (l.find("probefs-ring") != std::string::npos) ++n;
  return n;
}

size_t heap_in_use() { return mallinfo2().uordblks; }

// Records of all targets, consumed: how many of pids other than `except`.
size_t consume_all(Tracer& t, pid_t except) {
  size_t others = 0;
  while (t.consume_records(
             [&](const TraceRecord& r) {
               if (r.pid != except) ++others;
               return true;
             },
             SIZE_MAX) > 0) {
  }
  return others;
}

TEST(TargetLimitsTest, ThousandsOfShortLivedTargetsLeaveNothingBehindOnceRead) {
  auto t = make_tracer(64);
  ASSERT_NE(t, nullptr);
  std::atomic<int> forked{0}, execed{0}, exited{0};
  std::mutex mu;
  std::string unexpected;  // notices of other kinds, for a failure's message
  t->on_target_notice([&](const TargetNotice& n) {
    if (n.kind == TargetNotice::Kind::kForked) ++forked;
    else if (n.kind == TargetNotice::Kind::kExeced) ++execed;
    else if (n.kind == TargetNotice::Kind::kExited) ++exited;
    else if (n.kind != TargetNotice::Kind::kJoined) {
      std::lock_guard l(mu);
      unexpected += " kind " + std::to_string(static_cast<int>(n.kind)) + " pid " +
                    std::to_string(n.pid) + ";";
    }
  });
  auto counts = [&] {
    std::lock_guard l(mu);
    return std::to_string(forked.load()) + " forked, " + std::to_string(execed.load()) +
           " exec'd, " + std::to_string(exited.load()) + " exited, " +
           std::to_string(t->refused_links()) + " connections refused;" + unexpected;
  };
  testing::define(*t, add_probe(), 0xF001);
  Launched prog;
  std::string err;
  ASSERT_EQ(prog.start(*t, &err), 0) << err;
  // Warm: one child's round trip has set up whatever the first one allocates.
  ASSERT_EQ(prog.pipes.ask("forks 1 1"), "ok 1");
  ASSERT_TRUE(eventually([&] { return exited.load() >= 1; }, 20000));
  consume_all(*t, prog.pid);
  ASSERT_TRUE(eventually([&] { return t->targets().size() == 1; }, 20000));
  const size_t fds0 = open_descriptors(), maps0 = mappings(), heap0 = heap_in_use();

  constexpr int kForks = 2000, kExecs = 40;
  ASSERT_EQ(prog.pipes.ask("forks " + std::to_string(kForks) + " 1", 300000),
            "ok " + std::to_string(kForks));
  ASSERT_EQ(prog.pipes.ask("spawns " + std::to_string(kExecs) + " /bin/true", 300000),
            "ok " + std::to_string(kExecs));
  // Every child was a target: none was refused for want of a descriptor.
  ASSERT_TRUE(eventually([&] { return exited.load() >= 1 + kForks + kExecs; }, 60000))
      << counts();
  EXPECT_EQ(forked.load(), 1 + kForks + kExecs) << counts();
  EXPECT_EQ(execed.load(), kExecs) << counts();
  // Nobody read: their areas wait, with their records, and cost no descriptor each.
  EXPECT_GE(mappings(), maps0 + kForks);
  EXPECT_LT(open_descriptors(), fds0 + 16);

  EXPECT_EQ(consume_all(*t, prog.pid), static_cast<size_t>(kForks));
  // Read: the areas go (the service thread frees drained ones each second). What stays
  // is the daemon's own, the program's, and the spares the program holds for its next
  // fork children: one after its first fork (when maps0 was counted), up to
  // kMaxHeldSpares once it forks again, handed to it whenever the daemon gets to it.
  const size_t live = 2 + events::link::kMaxHeldSpares;
  EXPECT_TRUE(eventually([&] { return mappings() <= live; }, 20000))
      << mappings() << " ring areas mapped, " << maps0 << " before";
  EXPECT_LT(open_descriptors(), fds0 + 16);
  // The daemon keeps a bounded few things of departed targets (their names, the last
  // symbolizers, their exit statuses): a few MiB at most, not a share per target.
  EXPECT_LT(heap_in_use(), heap0 + (16u << 20)) << heap_in_use() - heap0 << " bytes more";
  EXPECT_EQ(prog.pipes.ask("call 3"), "ok 9");
}

// "Max open files" soft limit of process `pid`, from /proc/PID/limits.
std::string soft_nofile(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/limits");
  std::string l;
  while (std::getline(in, l))
    if (l.rfind("Max open files", 0) == 0) {
      std::istringstream f(l.substr(14));
      std::string soft;
      f >> soft;
      return soft;
    }
  return "";
}

TEST(TargetLimitsTest, TheLimitRefusesWithAReasonAndTheProcessRunsOn) {
  rlimit before;
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &before), 0);
  Tracer::Options o;
  o.agent_path = PROBEFS_AGENT_PATH;
  o.max_targets = 2;
  std::string err;
  auto t = Tracer::create(o, &err);
  ASSERT_NE(t, nullptr) << err;
  std::mutex mu;
  std::vector<TargetNotice> refused;
  t->on_target_notice([&](const TargetNotice& n) {
    if (n.kind != TargetNotice::Kind::kRefused) return;
    std::lock_guard l(mu);
    refused.push_back(n);
  });
  testing::define(*t, add_probe(), 0xF001);
  Launched a, b, c;
  ASSERT_EQ(a.start(*t, &err), 0) << err;
  ASSERT_EQ(b.start(*t, &err), 0) << err;
  // The tracer raised its own descriptor limit; its programs start with the one it had.
  rlimit now;
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &now), 0);
  EXPECT_EQ(now.rlim_cur, now.rlim_max);
  EXPECT_EQ(soft_nofile(a.pid), std::to_string(before.rlim_cur));
  // A third program is not started at all.
  err.clear();
  EXPECT_EQ(c.start(*t, &err), -ENOSPC);
  EXPECT_NE(err.find("target limit (2 traced processes)"), std::string::npos) << err;

  // A fork child beyond the limit runs on untraced, and says so.
  const std::string held = a.pipes.ask("hold");
  ASSERT_EQ(held.rfind("ok ", 0), 0u) << held;
  const pid_t child = std::stoi(held.substr(3));
  KillGuard child_guard(child);
  ASSERT_TRUE(eventually(
      [&] {
        std::lock_guard l(mu);
        return !refused.empty();
      },
      20000));
  {
    std::lock_guard l(mu);
    EXPECT_EQ(refused[0].pid, child);
    EXPECT_EQ(refused[0].parent, a.pid);
    EXPECT_NE(refused[0].reason.find("target limit"), std::string::npos) << refused[0].reason;
  }
  bool listed = false;
  for (const TargetInfo& i : t->targets())
    if (i.pid == child) listed = i.untraced == "target-limit" && i.origin == TargetOrigin::kForked;
  EXPECT_TRUE(listed);
  EXPECT_EQ(a.pipes.ask("call 3"), "ok 9");

  // A departed target's unread records make room for a new one: they are what goes.
  ASSERT_EQ(b.pipes.ask("call 2"), "ok 3");
  kill(b.pid, SIGKILL);
  int st = 0;
  ASSERT_EQ(t->wait_exit(b.pid, 20000, &st), 0);
  Launched d;
  EXPECT_EQ(d.start(*t, &err), 0) << err;
  EXPECT_EQ(d.pipes.ask("call 2"), "ok 3");
}

}  // namespace
}  // namespace probefs::tracee
