// The daemon-side API end to end, on real processes: the bundled traced_prog launched and
// attached, events defined through the tracer as the filesystem will, records read back
// from the rings. Every count is exact and every value is the program's real one.
#include "events/link.h"
#include "link/socket.h"
#include "tracee/tracer.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sched.h>
#include <signal.h>
#include <sys/ptrace.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <climits>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "events/compile.h"
#include "events/filter.h"
#include "events/parse.h"
#include "tests/tracee/traced_prog_driver.h"
#include "tests/tracee/tracer_test_util.h"
#include "tracee/launch.h"
#include "tracee/probe_places.h"
#include "tracee/proc_maps.h"

namespace probefs::tracee {
namespace {

namespace lk = events::link;
using testing::define;
using testing::Event;
using testing::KillGuard;
using testing::make_tracer;
using testing::ProgPipes;

const std::string kProg = PROBEFS_TRACED_PROG;
const std::string kProgName = kProg.substr(kProg.rfind('/') + 1);

uint64_t field(const Event& e, const TraceRecord& r, const std::string& name) {
  for (const auto& f : e.spec.compiled.fields) {
    if (f.name != name) continue;
    uint64_t v = 0;
    if (f.offset + f.size <= r.len) memcpy(&v, r.data + f.offset, std::min<uint32_t>(f.size, 8));
    return v;
  }
  ADD_FAILURE() << "no field " << name;
  return 0;
}

uint16_t event_id_of(const TraceRecord& r) {
  uint16_t id = 0;
  if (r.len >= 2) memcpy(&id, r.data, 2);
  return id;
}

int32_t tid_of(const TraceRecord& r) {
  int32_t tid = 0;
  if (r.len >= 8) memcpy(&tid, r.data + 4, 4);
  return tid;
}

// A record with its own copy of the bytes (moving it keeps `r.data` valid).
struct Rec {
  TraceRecord r;
  std::vector<uint8_t> bytes;
};

// A fork child that took its parent's spare area runs on before the daemon has read its
// HELLO; its hits count and its records can be read from then on. Waits (bounded) until
// probe `id` counts `n` hits.
bool hits_reach(Tracer& t, ProbeId id, uint64_t n) {
  return testing::eventually([&] { return t.profile(id).hits >= n; }, 20000);
}

// Every record now in the rings, consumed.
std::vector<Rec> drain(Tracer& t) {
  std::vector<Rec> out;
  TraceRecord r;
  while (t.next_record(&r)) {
    Rec x{r, std::vector<uint8_t>(r.data, r.data + r.len)};
    x.r.data = x.bytes.data();
    out.push_back(std::move(x));
  }
  return out;
}

// traced_prog as a plain child of the test, for attach; the pipes keep the parent's side.
pid_t start_untraced(ProgPipes& pipes) {
  pid_t pid = fork();
  if (pid == 0) {
    dup2(pipes.child_stdin(), 0);
    dup2(pipes.child_stdout(), 1);
    execl(kProg.c_str(), kProg.c_str(), nullptr);
    _exit(127);
  }
  pipes.parent_side();
  return pid;
}

// Ends a program started with start_untraced through its own "quit", and checks that it
// exited cleanly: every computation it checked itself was right.
void expect_quits_cleanly(ProgPipes& pipes, KillGuard& guard, pid_t pid) {
  EXPECT_EQ(pipes.ask("quit", 10000), "");
  guard.release();
  int st = -1;
  waitpid(pid, &st, 0);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << "wait status " << st;
}

// A launched traced_prog with pipes, killed at the end.
struct Launched {
  ProgPipes pipes;
  KillGuard guard;
  pid_t pid = 0;

  bool start(Tracer& t, const std::vector<std::string>& extra_args = {}) {
    Tracer::LaunchSpec s;
    s.argv = {kProg};
    s.argv.insert(s.argv.end(), extra_args.begin(), extra_args.end());
    s.stdin_fd = pipes.child_stdin();
    s.stdout_fd = pipes.child_stdout();
    std::string err;
    int rc = t.launch(s, &pid, &err);
    EXPECT_EQ(rc, 0) << err;
    if (rc != 0) return false;
    guard.set(pid);
    pipes.parent_side();
    return pipes.line() == "ready";
  }
};

long sum_calls(long n) { return 3 * (n * (n - 1) / 2); }

// n bytes of another process's memory, through /proc/PID/mem.
bool read_code(pid_t pid, uintptr_t addr, unsigned char* out, size_t n) {
  std::string path = "/proc/" + std::to_string(pid) + "/mem";
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  bool ok = pread(fd, out, n, static_cast<off_t>(addr)) == static_cast<ssize_t>(n);
  close(fd);
  return ok;
}

TEST(Tracer, LaunchedProgramGivesExactRecordsWithRealValues) {
  auto t = make_tracer();
  ASSERT_NE(t, nullptr);
  Event entry = define(*t, "p:t/add " + kProgName + ":traced_add a=%di b=%si:s64", 10);
  Event ret = define(*t, "r:t/addret " + kProgName + ":traced_add rv=$retval:s64", 11);
  Launched p;
  ASSERT_TRUE(p.start(*t));
  EXPECT_EQ(p.pipes.ask("call 1000"), "ok " + std::to_string(sum_calls(1000)));
  std::vector<Rec> recs = drain(*t);
  long next_a = 0, next_rv = 0;
  uint64_t last_ts = 0;
  for (const Rec& x : recs) {
    const TraceRecord& r = x.r;
    EXPECT_EQ(r.pid, p.pid);
    EXPECT_EQ(tid_of(r), p.pid);
    EXPECT_GE(r.ts_ns, last_ts);
    last_ts = r.ts_ns;
    if (event_id_of(r) == 10) {
      EXPECT_EQ(field(entry, r, "a"), static_cast<uint64_t>(next_a));
      EXPECT_EQ(field(entry, r, "b"), static_cast<uint64_t>(2 * next_a));
      ++next_a;
    } else {
      ASSERT_EQ(event_id_of(r), 11);
      EXPECT_EQ(field(ret, r, "rv"), static_cast<uint64_t>(3 * next_rv));
      ++next_rv;
    }
  }
  EXPECT_EQ(next_a, 1000);
  EXPECT_EQ(next_rv, 1000);
  EXPECT_EQ(t->profile(entry.id).hits, 1000u);
  EXPECT_EQ(t->profile(ret.id).hits, 1000u);
  EXPECT_EQ(t->profile(entry.id).misses, 0u);
  EXPECT_EQ(p.pipes.ask("quit", 10000), "");
  int st = -1;
  EXPECT_EQ(t->wait_exit(p.pid, 10000, &st), 0);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << st;
  p.guard.release();
}

TEST(Tracer, UprobeSyntaxFilterDisableAndRemove) {
  auto t = make_tracer();
  ASSERT_NE(t, nullptr);
  uint64_t off = 0;
  ASSERT_EQ(symbol_file_offset(kProg, "traced_add", &off), 0);
  char line[1024];
  snprintf(line, sizeof line, "p:u/add %s:0x%llx a=%%di", kProg.c_str(),
           static_cast<unsigned long long>(off));
  Event e = define(*t, line, 20);
  Launched p;
  ASSERT_TRUE(p.start(*t));

  events::CompiledFilter f;
  events::Diagnostic d;
  ASSERT_TRUE(events::compile_filter("a < 10", e.spec.compiled, &f, &d));
  ASSERT_EQ(t->set_filter(e.id, std::make_shared<events::CompiledFilter>(f)), 0);
  EXPECT_EQ(p.pipes.ask("call 100"), "ok " + std::to_string(sum_calls(100)));
  EXPECT_EQ(drain(*t).size(), 10u);
  EXPECT_EQ(t->profile(e.id).hits, 100u);  // hits count before the filter, as the kernel's

  ASSERT_EQ(t->set_filter(e.id, nullptr), 0);
  ASSERT_EQ(t->disable_probe(e.id), 0);
  EXPECT_EQ(p.pipes.ask("call 50"), "ok " + std::to_string(sum_calls(50)));
  EXPECT_EQ(drain(*t).size(), 0u);
  ASSERT_EQ(t->enable_probe(e.id), 0);
  EXPECT_EQ(p.pipes.ask("call 50"), "ok " + std::to_string(sum_calls(50)));
  EXPECT_EQ(drain(*t).size(), 50u);
  ASSERT_EQ(t->remove_probe(e.id), 0);
  EXPECT_EQ(p.pipes.ask("call 50"), "ok " + std::to_string(sum_calls(50)));
  EXPECT_EQ(drain(*t).size(), 0u);
}

TEST(Tracer, ThreadsForkAndExec) {
  // Before the tracer: its notices may come until it is gone.
  std::vector<TargetNotice> notices;
  std::mutex nm;
  std::condition_variable ncv;
  auto t = make_tracer();
  ASSERT_NE(t, nullptr);
  t->on_target_notice([&](const TargetNotice& n) {
    std::lock_guard l(nm);
    notices.push_back(n);
    ncv.notify_all();
  });
  Event e = define(*t, "p:t/add " + kProgName + ":traced_add a=%di", 30);
  Launched p;
  ASSERT_TRUE(p.start(*t));

  // Threads started after the definition.
  EXPECT_EQ(p.pipes.ask("threads 4 500"), "ok " + std::to_string(4 * sum_calls(500)));
  std::vector<Rec> recs = drain(*t);
  EXPECT_EQ(recs.size(), 2000u);
  std::set<int32_t> tids;
  for (const auto& x : recs) tids.insert(tid_of(x.r));
  EXPECT_EQ(tids.size(), 4u);

  // A fork child: a target of its own, with the same events.
  const uint64_t hits = t->profile(e.id).hits;
  std::string ans = p.pipes.ask("fork 300");
  int child = 0, st = -1;
  ASSERT_EQ(sscanf(ans.c_str(), "ok %d %d", &child, &st), 2) << ans;
  EXPECT_EQ(st, 0);
  ASSERT_TRUE(hits_reach(*t, e.id, hits + 300));
  recs = drain(*t);
  size_t from_child = 0;
  for (const auto& x : recs) from_child += x.r.pid == child;
  EXPECT_EQ(from_child, 300u);
  EXPECT_EQ(recs.size(), 300u);

  // exec: the new image is traced too.
  ASSERT_TRUE(p.pipes.send("exec"));
  EXPECT_EQ(p.pipes.line(), "exec'd");
  EXPECT_EQ(p.pipes.ask("call 100"), "ok " + std::to_string(sum_calls(100)));
  recs = drain(*t);
  EXPECT_EQ(recs.size(), 100u);
  for (const auto& x : recs) EXPECT_EQ(x.r.pid, p.pid);
  // Notices come from the tracer's thread, in the order things happened.
  std::unique_lock l(nm);
  bool forked = false, execed = false;
  ncv.wait_for(l, std::chrono::seconds(10), [&] {
    forked = execed = false;
    for (const auto& n : notices) {
      forked |= n.kind == TargetNotice::Kind::kForked && n.pid == child && n.parent == p.pid;
      execed |= n.kind == TargetNotice::Kind::kExeced && n.pid == p.pid;
    }
    return forked && execed;
  });
  EXPECT_TRUE(forked);
  EXPECT_TRUE(execed);
}

// The inodes of the ring areas (memfd "probefs-ring") process `pid` maps.
std::set<unsigned long> ring_inodes(pid_t pid) {
  std::set<unsigned long> out;
  std::ifstream in("/proc/" + std::to_string(pid) + "/maps");
  std::string line;
  while (std::getline(in, line)) {
    if (line.find("/memfd:probefs-ring") == std::string::npos) continue;
    std::istringstream f(line);
    std::string range, perms, off, dev;
    unsigned long inode = 0;
    f >> range >> perms >> off >> dev >> inode;
    out.insert(inode);
  }
  return out;
}

// A process that forked once is handed a spare ring area; its next fork child records
// into it from its first instruction, as itself, and the parent, which forks again, is
// handed two (lk::kMaxHeldSpares) in its place (its view of the taken one goes then).
// Children forked back to back each record as themselves, and a probe defined between two
// forks is the next child's too.
TEST(Tracer, AForkChildTakesItsParentsSpareArea) {
  auto t = make_tracer();
  ASSERT_NE(t, nullptr);
  Event e = define(*t, "p:t/add " + kProgName + ":traced_add a=%di", 30);
  Launched p;
  ASSERT_TRUE(p.start(*t));
  EXPECT_EQ(p.pipes.ask("call 1"), "ok " + std::to_string(sum_calls(1)));
  const std::set<unsigned long> own = ring_inodes(p.pid);
  ASSERT_EQ(own.size(), 1u);
  (void)drain(*t);
  auto spares_of_parent = [&] {
    std::set<unsigned long> out;
    for (unsigned long i : ring_inodes(p.pid))
      if (!own.count(i)) out.insert(i);
    return out;
  };

  std::string ans = p.pipes.ask("fork 5");
  int child = 0, st = -1;
  ASSERT_EQ(sscanf(ans.c_str(), "ok %d %d", &child, &st), 2) << ans;
  EXPECT_EQ(drain(*t).size(), 5u);
  std::set<unsigned long> spare;
  ASSERT_TRUE(testing::eventually([&] {
    spare = spares_of_parent();
    return spare.size() == 1;
  }, 20000)) << "no spare area was handed to the process that forked";

  const std::string held = p.pipes.ask("hold");
  ASSERT_EQ(held.rfind("ok ", 0), 0u) << held;
  const pid_t holder = std::stoi(held.substr(3));
  KillGuard holder_guard(holder);
  std::vector<Rec> recs;
  ASSERT_TRUE(testing::eventually([&] {
    for (Rec& r : drain(*t)) recs.push_back(std::move(r));
    return !recs.empty();
  }, 20000));
  ASSERT_EQ(recs.size(), 1u);
  EXPECT_EQ(recs[0].r.pid, holder);
  // The parent, which forked again, gets two in place of the one its child took; the
  // child maps that one.
  const unsigned long taken = *spare.begin();
  ASSERT_TRUE(testing::eventually([&] {
    const std::set<unsigned long> now = spares_of_parent();
    return now.size() == lk::kMaxHeldSpares && !now.count(taken);
  }, 20000));
  EXPECT_TRUE(ring_inodes(holder).count(taken)) << "the child does not map the spare it took";

  for (int round = 0; round < 4; ++round) {
    if (round == 2) define(*t, "p:t/add2 " + kProgName + ":traced_add b=%si", 31);
    const uint64_t hits = t->profile(e.id).hits;
    ans = p.pipes.ask("fork 40");
    ASSERT_EQ(sscanf(ans.c_str(), "ok %d %d", &child, &st), 2) << ans;
    EXPECT_EQ(st, 0);
    ASSERT_TRUE(hits_reach(*t, e.id, hits + 40)) << "round " << round;
    recs = drain(*t);
    EXPECT_EQ(recs.size(), round >= 2 ? 80u : 40u) << "round " << round;
    for (const auto& x : recs) EXPECT_EQ(x.r.pid, child) << "round " << round;
  }
  EXPECT_EQ(p.pipes.ask("call 3"), "ok " + std::to_string(sum_calls(3)));
  EXPECT_EQ(drain(*t).size(), 6u);
}

// A vfork child runs on its parent thread's memory and TLS until it exits: its hits are
// never its parent's records (the kernel would record them as the child's; here the child
// is no target before it execs, so they are not recorded at all).
TEST(Tracer, AVforkChildNeverRecordsAsItsParent) {
  auto t = make_tracer();
  ASSERT_NE(t, nullptr);
  Event e = define(*t, "p:t/add " + kProgName + ":traced_add a=%di", 30);
  Launched p;
  ASSERT_TRUE(p.start(*t));
  for (int round = 0; round < 3; ++round) {
    std::string ans = p.pipes.ask("vfork 50");
    int child = 0, st = -1;
    ASSERT_EQ(sscanf(ans.c_str(), "ok %d %d", &child, &st), 2) << ans;
    EXPECT_EQ(st, 0);
    // The parent records as before, from the same thread.
    EXPECT_EQ(p.pipes.ask("call 3"), "ok " + std::to_string(sum_calls(3)));
    std::vector<Rec> recs = drain(*t);
    ASSERT_EQ(recs.size(), 3u) << "round " << round;
    for (size_t i = 0; i < recs.size(); ++i) {
      EXPECT_EQ(recs[i].r.pid, p.pid);
      EXPECT_EQ(field(e, recs[i].r, "a"), i);
    }
  }
}

// posix_spawn's child (a clone that shares memory until it execs) runs libc's code on the
// parent thread's TLS: its execve is not the parent's. The parent's own execve is.
TEST(Tracer, APosixSpawnChildNeverRecordsAsItsParent) {
  auto t = make_tracer();
  ASSERT_NE(t, nullptr);
  define(*t, "p:t/add " + kProgName + ":traced_add a=%di", 30);
  define(*t, "p:t/execve libc:execve", 31);
  Launched p;
  ASSERT_TRUE(p.start(*t));
  for (int round = 0; round < 3; ++round) {
    // The thread has its ring when the child runs on its TLS.
    EXPECT_EQ(p.pipes.ask("call 1"), "ok " + std::to_string(sum_calls(1)));
    std::string ans = p.pipes.ask("pspawn /bin/true");
    int child = 0, st = -1;
    ASSERT_EQ(sscanf(ans.c_str(), "ok %d %d", &child, &st), 2) << ans;
    EXPECT_EQ(st, 0);
    size_t adds = 0;
    for (const auto& x : drain(*t)) {
      EXPECT_FALSE(x.r.pid == p.pid && event_id_of(x.r) == 31) << "round " << round;
      adds += x.r.pid == p.pid && event_id_of(x.r) == 30;
    }
    EXPECT_EQ(adds, 1u);
  }
  ASSERT_TRUE(p.pipes.send("exec"));
  EXPECT_EQ(p.pipes.line(), "exec'd");
  EXPECT_EQ(p.pipes.ask("pid"), "ok " + std::to_string(p.pid));
  size_t execs = 0;
  for (const auto& x : drain(*t)) execs += x.r.pid == p.pid && event_id_of(x.r) == 31;
  EXPECT_EQ(execs, 1u);  // the parent's own exec
}

// A thousand threads alive at once, a hundred hits each: each has a ring of its own, and
// every hit is a record.
TEST(Tracer, AThousandThreadsAtOnceEachRecord) {
  auto t = make_tracer(16);  // 16 KiB per thread: a hundred records fit
  ASSERT_NE(t, nullptr);
  Event e = define(*t, "p:t/add " + kProgName + ":traced_add a=%di", 30);
  Launched p;
  ASSERT_TRUE(p.start(*t));
  EXPECT_EQ(p.pipes.ask("crowd 1000 100", 120000), "ok " + std::to_string(1000 * sum_calls(100)));
  std::vector<Rec> recs = drain(*t);
  uint64_t lost = 0;
  std::set<int32_t> tids;
  for (const auto& x : recs) {
    lost += x.r.lost_before;
    tids.insert(static_cast<int32_t>(x.r.tid));
  }
  EXPECT_EQ(lost, 0u);
  EXPECT_EQ(recs.size(), 100000u);
  EXPECT_EQ(tids.size(), 1000u);
  EXPECT_EQ(t->profile(e.id).hits, 100000u);
}

// More threads at once than a target has rings: those without one record nothing, and
// what they lose is counted, shown before the target's next record.
TEST(Tracer, ThreadsBeyondTheRingsAreCountedLost) {
  Tracer::Options o;
  o.agent_path = PROBEFS_AGENT_PATH;
  o.buffer_size_kb = 16;
  o.rings_per_target = 8;
  std::string err;
  auto t = Tracer::create(o, &err);
  ASSERT_NE(t, nullptr) << err;
  Event e = define(*t, "p:t/add " + kProgName + ":traced_add a=%di", 30);
  Launched p;
  ASSERT_TRUE(p.start(*t));
  EXPECT_EQ(p.pipes.ask("crowd 40 100", 60000), "ok " + std::to_string(40 * sum_calls(100)));
  // One more record, of a thread that has a ring, carries what was lost after the last.
  EXPECT_EQ(p.pipes.ask("call 1"), "ok 0");
  std::vector<Rec> recs = drain(*t);
  uint64_t lost = 0;
  for (const auto& x : recs) lost += x.r.lost_before;
  EXPECT_LT(recs.size(), 4001u);
  EXPECT_GT(lost, 0u);
  EXPECT_EQ(recs.size() + lost, 4001u);
  EXPECT_EQ(t->profile(e.id).hits, 4001u);
}

// A hundred thousand short-lived threads one after another, with nobody reading until
// they are all done: every hit is a line, each of the thread that made it, and the rings
// stay bounded. A new thread takes over the ring of one that is gone, read or not (its
// owner record says whose records follow); the reader falls behind by more than a
// target's rings without a loss.
TEST(Tracer, AHundredThousandShortLivedThreadsAllRecordWithNobodyReading) {
  auto t = make_tracer(16);
  ASSERT_NE(t, nullptr);
  Event e = define(*t, "p:t/add " + kProgName + ":traced_add a=%di", 30);
  Launched p;
  ASSERT_TRUE(p.start(*t));
  const long kThreads = 100000;
  ASSERT_TRUE(p.pipes.send("waves " + std::to_string(kThreads) + " 1"));
  EXPECT_EQ(p.pipes.line(240000), "ok 0");
  EXPECT_LE(t->rings_in_use(), 1024u);
  EXPECT_EQ(p.pipes.ask("call 1"), "ok 0");  // the main thread's, last
  uint64_t records = 0, lost = 0, of_main = 0;
  std::set<int32_t> writers;
  for (const Rec& x : drain(*t)) {
    ++records;
    lost += x.r.lost_before;
    if (x.r.tid == p.pid) ++of_main;
    else writers.insert(x.r.tid);
  }
  EXPECT_EQ(lost, 0u);
  EXPECT_EQ(records, static_cast<uint64_t>(kThreads) + 1);
  EXPECT_EQ(of_main, 1u);
  // Thread ids come back only after pid_max others: as many writers as threads, or as
  // many as pid_max lets there be.
  EXPECT_GE(writers.size(), std::min<size_t>(kThreads, 30000));
  EXPECT_EQ(t->profile(e.id).hits, static_cast<uint64_t>(kThreads) + 1);
}

// With nobody reading, a thread's number may come round to another process before its
// records are read (pid_max is 32768 on many machines). The records stay the thread's: the
// process that holds the number now began after they were written.
TEST(Tracer, AGoneThreadsRecordsStayItsOwnWhenAnotherProcessTakesItsNumber) {
  if (access("/proc/sys/kernel/ns_last_pid", W_OK) != 0) GTEST_SKIP() << "ns_last_pid not writable";
  auto t = make_tracer();
  ASSERT_NE(t, nullptr);
  Event e = define(*t, "p:t/add " + kProgName + ":traced_add a=%di", 30);
  Launched p;
  ASSERT_TRUE(p.start(*t));
  const std::string ans = p.pipes.ask("onethread 3");
  long sum = -1, tid = 0;
  ASSERT_EQ(sscanf(ans.c_str(), "ok %ld %ld", &sum, &tid), 2) << ans;
  ASSERT_GT(tid, 1);
  // A process of its own with the thread's number, once the number is free (its thread's
  // end is seen shortly after the join) and the boot clock is two ticks past the records
  // (a thread's start is kept in ticks of 1/USER_HZ: the holder must begin in a later one).
  ASSERT_TRUE(testing::eventually([&] { return kill(static_cast<pid_t>(tid), 0) != 0; }, 20000));
  auto boot_ns = [] {
    timespec ts;
    clock_gettime(CLOCK_BOOTTIME, &ts);
    return static_cast<int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
  };
  const int64_t two_ticks = 2 * 1'000'000'000 / sysconf(_SC_CLK_TCK);
  for (const int64_t until = boot_ns() + two_ticks; boot_ns() < until;) sched_yield();
  pid_t holder = -1;
  for (int attempt = 0; attempt < 200 && holder != tid; ++attempt) {
    if (holder > 0) {
      kill(holder, SIGKILL);
      waitpid(holder, nullptr, 0);
    }
    FILE* f = fopen("/proc/sys/kernel/ns_last_pid", "w");
    ASSERT_NE(f, nullptr);
    fprintf(f, "%ld", tid - 1);
    fclose(f);
    holder = fork();
    if (holder == 0) {
      pause();
      _exit(0);
    }
    ASSERT_GT(holder, 0);
  }
  struct Reap {
    pid_t pid;
    ~Reap() {
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
  } reap{holder};
  ASSERT_EQ(holder, tid) << "another process took the number first, 200 times";
  std::vector<Rec> recs = drain(*t);
  ASSERT_EQ(recs.size(), 3u);
  for (const Rec& x : recs) EXPECT_EQ(x.r.tid, tid);
  EXPECT_EQ(t->rejected_records(), 0u);
  EXPECT_EQ(t->profile(e.id).hits, 3u);
}

// A thread's ring is retired when the thread ends (a pthread key's destructor in the
// agent): the daemon frees it as retired, without asking the kernel whether its owner
// lives.
TEST(Tracer, AThreadsRingIsRetiredWhenTheThreadEnds) {
  auto t = make_tracer();
  ASSERT_NE(t, nullptr);
  Event e = define(*t, "p:t/add " + kProgName + ":traced_add a=%di", 30);
  Launched p;
  ASSERT_TRUE(p.start(*t));
  EXPECT_EQ(p.pipes.ask("waves 20 1"), "ok 0");
  EXPECT_EQ(drain(*t).size(), 20u);
  // The daemon frees drained rings once a second.
  EXPECT_TRUE(testing::eventually([&] { return t->rings_freed_retired() >= 20; }, 20000))
      << t->rings_freed_retired();
  EXPECT_EQ(t->profile(e.id).hits, 20u);
}

// Detach sticks: after it the program, its later images and its children are not traced
// (unless attached again), and its environment no longer carries the agent.
TEST(Tracer, DetachSticksAcrossExecAndFork) {
  auto t = make_tracer();
  ASSERT_NE(t, nullptr);
  Event e = define(*t, "p:t/add " + kProgName + ":traced_add a=%di", 30);
  Launched p;
  ASSERT_TRUE(p.start(*t));
  EXPECT_EQ(p.pipes.ask("env LD_PRELOAD").rfind("ok " PROBEFS_AGENT_PATH, 0), 0u);
  EXPECT_EQ(p.pipes.ask("call 10"), "ok 135");
  EXPECT_EQ(drain(*t).size(), 10u);
  ASSERT_EQ(t->detach(p.pid), 0);
  EXPECT_EQ(p.pipes.ask("env LD_PRELOAD"), "ok -");
  EXPECT_EQ(p.pipes.ask("env " + std::string(link::kLinkEnv)), "ok -");
  EXPECT_EQ(p.pipes.ask("call 10"), "ok 135");
  // A child, and a new image: no agent, no target, no record.
  std::string ans = p.pipes.ask("fork 10");
  int child = 0, st = -1;
  ASSERT_EQ(sscanf(ans.c_str(), "ok %d %d", &child, &st), 2) << ans;
  EXPECT_EQ(st, 0);
  ASSERT_TRUE(p.pipes.send("exec"));
  EXPECT_EQ(p.pipes.line(), "exec'd");
  EXPECT_EQ(p.pipes.ask("call 10"), "ok 135");
  EXPECT_EQ(p.pipes.ask("env LD_PRELOAD"), "ok -");
  EXPECT_TRUE(drain(*t).empty());
  EXPECT_TRUE(t->targets().empty());
  EXPECT_EQ(t->profile(e.id).hits, 10u);
}

TEST(Tracer, LibraryOpenedLaterIsProbedBeforeItsCodeRuns) {
  auto t = make_tracer();
  ASSERT_NE(t, nullptr);
  const std::string lib = PROBEFS_CTOR_LIB;
  const std::string mod = lib.substr(lib.rfind('/') + 1);
  // kprobe syntax: waits for the module; uprobe syntax: the file, not mapped yet.
  Event k = define(*t, "p:t/ctor " + mod + ":ctor_lib_fn x=%di", 40);
  uint64_t off = 0;
  ASSERT_EQ(symbol_file_offset(lib, "ctor_lib_fn", &off), 0);
  char line[1024];
  snprintf(line, sizeof line, "p:u/ctor %s:0x%llx x=%%di", lib.c_str(),
           static_cast<unsigned long long>(off));
  Event u = define(*t, line, 41);
  Launched p;
  ASSERT_TRUE(p.start(*t));
  // ctor_lib_entry(7) = ctor_lib_fn(21) from the constructor + ctor_lib_fn(7).
  EXPECT_EQ(p.pipes.ask("dlopen " + lib + " ctor_lib_entry"), "ok 56");
  std::vector<Rec> recs = drain(*t);
  std::map<uint16_t, std::vector<uint64_t>> xs;
  for (const auto& x : recs)
    xs[event_id_of(x.r)].push_back(field(event_id_of(x.r) == 40 ? k : u, x.r, "x"));
  EXPECT_EQ(xs[40], (std::vector<uint64_t>{21, 7}));
  EXPECT_EQ(xs[41], (std::vector<uint64_t>{21, 7}));
}

TEST(Tracer, BadPlacesGetTheKernelsErrors) {
  auto t = make_tracer();
  ASSERT_NE(t, nullptr);
  Launched p;
  ASSERT_TRUE(p.start(*t));
  int err = 0;
  events::Diagnostic d;
  define(*t, "p:t/nosuch probefs_no_such_function", 50, true, &err, &d);
  EXPECT_EQ(err, -ENOENT);
  EXPECT_EQ(d.code, events::ErrorCode::kBadProbeAddr);
  EXPECT_EQ(d.pos, static_cast<int>(std::string("p:t/nosuch ").size()));
  // One byte into traced_add: not an instruction boundary.
  define(*t, "p:t/mid " + kProgName + ":traced_add+1", 51, true, &err, &d);
  EXPECT_EQ(err, -EILSEQ);
  EXPECT_EQ(d.code, events::ErrorCode::kBadInsnBndry);
  // Nothing was left behind: the program runs, and a good definition still works.
  Event e = define(*t, "p:t/add " + kProgName + ":traced_add", 52);
  EXPECT_EQ(p.pipes.ask("call 10"), "ok " + std::to_string(sum_calls(10)));
  EXPECT_EQ(drain(*t).size(), 10u);
}

TEST(Tracer, FullRingReportsExactLostCounts) {
  auto t = make_tracer(4);  // 4 KiB per thread
  ASSERT_NE(t, nullptr);
  Event e = define(*t, "p:t/add " + kProgName + ":traced_add a=%di b=%si", 60);
  Launched p;
  ASSERT_TRUE(p.start(*t));
  EXPECT_EQ(p.pipes.ask("call 1000"), "ok " + std::to_string(sum_calls(1000)));
  std::vector<Rec> recs = drain(*t);
  // One more record carries the count of those dropped after the last one kept.
  EXPECT_EQ(p.pipes.ask("call 1"), "ok 0");
  std::vector<Rec> more = drain(*t);
  ASSERT_EQ(more.size(), 1u);
  uint64_t lost = 0;
  for (const auto& x : recs) lost += x.r.lost_before;
  lost += more[0].r.lost_before;
  EXPECT_GT(lost, 0u);
  EXPECT_LT(recs.size(), 1000u);
  EXPECT_EQ(recs.size() + 1 + lost, 1001u);
  EXPECT_EQ(t->profile(e.id).hits, 1001u);
}

TEST(Tracer, AttachToARunningProgramAndDetach) {
  auto t = make_tracer();
  ASSERT_NE(t, nullptr);
  ProgPipes pipes;
  const pid_t pid = start_untraced(pipes);
  KillGuard guard(pid);
  ASSERT_EQ(pipes.line(), "ready");
  Event e = define(*t, "p:t/add " + kProgName + ":traced_add a=%di", 70);
  std::string err;
  ASSERT_EQ(t->attach(pid, &err), 0) << err;
  EXPECT_EQ(pipes.ask("call 100"), "ok " + std::to_string(sum_calls(100)));
  EXPECT_EQ(drain(*t).size(), 100u);
  ASSERT_EQ(t->detach(pid), 0);
  EXPECT_EQ(pipes.ask("call 100"), "ok " + std::to_string(sum_calls(100)));
  EXPECT_EQ(drain(*t).size(), 0u);
  // And again: the idle agent takes a second attach.
  ASSERT_EQ(t->attach(pid, &err), 0) << err;
  EXPECT_EQ(pipes.ask("call 10"), "ok " + std::to_string(sum_calls(10)));
  EXPECT_EQ(drain(*t).size(), 10u);
  expect_quits_cleanly(pipes, guard, pid);
}

}  // namespace
}  // namespace probefs::tracee

namespace probefs::tracee {
namespace {

// The daemon dies (SIGKILL) while two threads of the program run probed code, 20 times
// over: each time the agent takes every probe out within a second, the program computes
// on correctly, and the next daemon attaches again.
TEST(Tracer, DaemonKilledTwentyTimesLeavesTheProgramWhole) {
  ProgPipes pipes;
  const pid_t pid = start_untraced(pipes);
  KillGuard guard(pid);
  ASSERT_EQ(pipes.line(), "ready");
  ASSERT_EQ(pipes.ask("hot 2"), "ok");

  int err = 0;
  auto syms = ProcessSymbols::load(pid, &err);
  ASSERT_NE(syms, nullptr);
  ResolvedSymbol hot;
  ASSERT_EQ(syms->resolve("traced_hot", &hot), 0);
  uint64_t off = 0;
  ASSERT_EQ(symbol_file_offset(kProg, "traced_hot", &off), 0);
  unsigned char original[5];
  {
    FILE* f = fopen(kProg.c_str(), "rb");
    ASSERT_NE(f, nullptr);
    ASSERT_EQ(fseek(f, static_cast<long>(off), SEEK_SET), 0);
    ASSERT_EQ(fread(original, 1, 5, f), 5u);
    fclose(f);
  }
  auto code_now = [&](unsigned char* out) {
    return read_code(pid, hot.addr, out, 5);
  };
  for (int trial = 0; trial < 20; ++trial) {
    SCOPED_TRACE("trial " + std::to_string(trial));
    ProgPipes stub_pipes;
    pid_t stub = fork();
    if (stub == 0) {
      dup2(stub_pipes.child_stdin(), 0);
      dup2(stub_pipes.child_stdout(), 1);
      std::string p = std::to_string(pid);
      execl(PROBEFS_TRACER_STUB, PROBEFS_TRACER_STUB, PROBEFS_AGENT_PATH, p.c_str(),
            ("p:t/hot " + kProgName + ":traced_hot who=%di i=%si").c_str(),
            ("r:t/hotret " + kProgName + ":traced_hot rv=$retval").c_str(), nullptr);
      _exit(127);
    }
    KillGuard stub_guard(stub);
    stub_pipes.parent_side();
    ASSERT_EQ(stub_pipes.line(), "ready");
    unsigned char now[5];
    ASSERT_TRUE(code_now(now));
    EXPECT_NE(memcmp(now, original, 5), 0) << "the probe is not in the code";
    kill(stub, SIGKILL);
    int st;
    waitpid(stub, &st, 0);
    stub_guard.release();
    // Within one second the original bytes are back.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(1);
    bool restored = false;
    while (!restored && std::chrono::steady_clock::now() < deadline) {
      restored = code_now(now) && memcmp(now, original, 5) == 0;
      if (!restored) {
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, nullptr);  // polling a deadline, not synchronising
      }
    }
    ASSERT_TRUE(restored) << "probes still in the code a second after the daemon died";
  }
  std::string ans = pipes.ask("cool");
  EXPECT_EQ(ans.rfind("ok ", 0), 0u) << ans;
  EXPECT_EQ(pipes.ask("call 10"), "ok " + std::to_string(sum_calls(10)));
  EXPECT_EQ(pipes.ask("quit", 10000), "");
  guard.release();
  int st;
  waitpid(pid, &st, 0);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << st;
}

}  // namespace
}  // namespace probefs::tracee

namespace probefs::tracee {
namespace {

// Two threads of the program run probed code at full speed while another event on the
// same functions is changed 10,000 times: 2,000 rounds of define, enable, filter, disable
// and remove. The program computes right throughout, and an event that stays enabled
// counts exactly. Each round drains what the churning event recorded meanwhile: rings of
// 256 KiB keep that to what a round needs (the sanitizer build drains at a few hundred
// ns a record, and the rest of a full ring is dropped, not counted).
TEST(Tracer, TenThousandChangesUnderAHotLoop) {
  auto t = make_tracer(256);
  ASSERT_NE(t, nullptr);
  Event stable = define(*t, "p:t/stable " + kProgName + ":traced_add a=%di", 80);
  Launched p;
  ASSERT_TRUE(p.start(*t));
  ASSERT_EQ(p.pipes.ask("hot 2"), "ok");
  events::CompiledFilter f;
  uint64_t stable_records = 0, expected = 0;
  for (int cycle = 0; cycle < 2000; ++cycle) {
    const bool on_hot = cycle % 2 == 0;
    int err = 0;
    Event churn = define(*t,
                         on_hot ? "p:t/churn " + kProgName + ":traced_hot who=%di i=%si"
                                : "r:t/churn " + kProgName + ":traced_add rv=$retval",
                         81, false, &err);
    ASSERT_EQ(err, 0) << "cycle " << cycle;
    ASSERT_EQ(t->enable_probe(churn.id), 0);
    {
      events::Diagnostic d;
      ASSERT_TRUE(events::compile_filter(on_hot ? "who == 1" : "rv > 100", churn.spec.compiled,
                                         &f, &d));
      ASSERT_EQ(t->set_filter(churn.id, std::make_shared<events::CompiledFilter>(f)), 0);
    }
    if (cycle % 200 == 0) {
      // A phase in which `stable` stays enabled: exactly one record per call.
      ASSERT_EQ(p.pipes.ask("call 100"), "ok " + std::to_string(sum_calls(100)));
      expected += 100;
    }
    ASSERT_EQ(t->disable_probe(churn.id), 0);
    ASSERT_EQ(t->remove_probe(churn.id), 0);
    TraceRecord r;
    while (t->next_record(&r)) stable_records += event_id_of(r) == 80;
  }
  std::string ans = p.pipes.ask("cool");
  EXPECT_EQ(ans.rfind("ok ", 0), 0u) << ans;
  TraceRecord r;
  while (t->next_record(&r)) stable_records += event_id_of(r) == 80;
  EXPECT_EQ(stable_records, expected);
  EXPECT_EQ(t->profile(stable.id).hits, expected);
  EXPECT_EQ(p.pipes.ask("call 10"), "ok " + std::to_string(sum_calls(10)));
}

}  // namespace
}  // namespace probefs::tracee

namespace probefs::tracee {
namespace {

// An attached program that execs leaves the trace: the new image has no agent (nothing
// preloads it there), the tracer says so (kLeft), and the program runs on untouched.
TEST(Tracer, AttachedProgramThatExecsLeavesTheTrace) {
  std::vector<TargetNotice> notices;
  std::mutex nm;
  std::condition_variable ncv;
  auto t = make_tracer();
  ASSERT_NE(t, nullptr);
  t->on_target_notice([&](const TargetNotice& n) {
    std::lock_guard l(nm);
    notices.push_back(n);
    ncv.notify_all();
  });
  ProgPipes pipes;
  const pid_t pid = start_untraced(pipes);
  KillGuard guard(pid);
  ASSERT_EQ(pipes.line(), "ready");
  Event e = define(*t, "p:t/add " + kProgName + ":traced_add a=%di", 90);
  std::string err;
  ASSERT_EQ(t->attach(pid, &err), 0) << err;
  EXPECT_EQ(pipes.ask("call 5"), "ok " + std::to_string(sum_calls(5)));
  EXPECT_EQ(drain(*t).size(), 5u);
  ASSERT_TRUE(pipes.send("exec"));
  EXPECT_EQ(pipes.line(), "exec'd");
  {
    std::unique_lock l(nm);
    EXPECT_TRUE(ncv.wait_for(l, std::chrono::seconds(10), [&] {
      for (const auto& n : notices)
        if (n.kind == TargetNotice::Kind::kLeft && n.pid == pid) return true;
      return false;
    }));
  }
  EXPECT_TRUE(t->targets().empty());
  EXPECT_EQ(pipes.ask("call 100"), "ok " + std::to_string(sum_calls(100)));
  EXPECT_EQ(drain(*t).size(), 0u);
  expect_quits_cleanly(pipes, guard, pid);
}

}  // namespace
}  // namespace probefs::tracee

namespace probefs::tracee {
namespace {

// A user who is not root traces a program of their own: attach as the same uid needs no
// privilege (Yama permitting). The whole daemon runs as uid 65534 in a child of the test.
TEST(Tracer, SameUserAttachWithoutRoot) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to become another user";
  pid_t daemon = fork();
  if (daemon == 0) {
    if (setgid(65534) != 0 || setuid(65534) != 0) _exit(10);
    ProgPipes pipes;
    const pid_t pid = start_untraced(pipes);
    KillGuard guard(pid);
    if (pipes.line() != "ready") _exit(11);
    Tracer::Options o;
    o.agent_path = PROBEFS_AGENT_PATH;
    std::string err;
    auto t = Tracer::create(o, &err);
    if (!t) _exit(12);
    events::ParseResult r = events::parse_dynamic_command("p:t/add " + kProgName + ":traced_add");
    ProbeSpec spec;
    spec.def = r.def;
    events::Diagnostic d;
    if (!events::compile(spec.def, {}, &spec.compiled, &d)) _exit(13);
    spec.event_id = 95;
    spec.enabled = true;
    ProbeId id;
    if (t->define_probe(spec, &id, &d) != 0) _exit(14);
    if (t->attach(pid, &err) != 0) {
      fprintf(stderr, "attach as uid 65534: %s\n", err.c_str());
      _exit(15);
    }
    if (pipes.ask("call 10") != "ok " + std::to_string(sum_calls(10))) _exit(16);
    size_t n = 0;
    TraceRecord rec;
    while (t->next_record(&rec)) ++n;
    _exit(n == 10 ? 0 : 17);
  }
  ASSERT_GT(daemon, 0);
  KillGuard guard(daemon);
  ASSERT_TRUE(testing::wait_gone(daemon, 60000));
  int st = -1;
  ASSERT_EQ(waitpid(daemon, &st, 0), daemon);
  guard.release();
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << "exit status " << st;
}

}  // namespace
}  // namespace probefs::tracee

namespace probefs::tracee {
namespace {

// `@SYM` in kprobe syntax names a variable of the traced program, resolved in each target.
TEST(Tracer, DataSymbolArgumentsReadTheProgramsVariable) {
  auto t = make_tracer();
  ASSERT_NE(t, nullptr);
  Launched p;
  ASSERT_TRUE(p.start(*t));
  Event e = define(*t, "p:t/g " + kProgName + ":traced_add g=@traced_global:s64", 96);
  EXPECT_EQ(p.pipes.ask("call 3"), "ok " + std::to_string(sum_calls(3)));
  std::vector<Rec> recs = drain(*t);
  ASSERT_EQ(recs.size(), 3u);
  for (const auto& x : recs) EXPECT_EQ(field(e, x.r, "g"), 4242u);
}

}  // namespace
}  // namespace probefs::tracee

namespace probefs::tracee {
namespace {

// A plain SYM must resolve in a target that exists now; MOD:SYM waits for MOD.
TEST(Tracer, PlainSymbolWithNoTargetIsRefusedModuleSymbolWaits) {
  auto t = make_tracer();
  ASSERT_NE(t, nullptr);
  int err = 0;
  events::Diagnostic d;
  define(*t, "p:t/plain traced_add", 97, true, &err, &d);
  EXPECT_EQ(err, -ENOENT);
  EXPECT_EQ(d.code, events::ErrorCode::kBadProbeAddr);
  Event e = define(*t, "p:t/mod " + kProgName + ":traced_add", 98);
  Launched p;
  ASSERT_TRUE(p.start(*t));
  EXPECT_EQ(p.pipes.ask("call 4"), "ok " + std::to_string(sum_calls(4)));
  EXPECT_EQ(drain(*t).size(), 4u);
}

}  // namespace
}  // namespace probefs::tracee

namespace probefs::tracee {
namespace {

// tracing_on 0: every hit is counted (kprobe_profile) and nothing is recorded, nor counted
// as lost, in every target, those that join while it is off included; 1 records again.
TEST(Tracer, TracingOffCountsHitsAndRecordsNothing) {
  auto t = make_tracer();
  ASSERT_NE(t, nullptr);
  EXPECT_TRUE(t->tracing_on());
  Event e = define(*t, "p:t/add " + kProgName + ":traced_add a=%di", 100);
  ASSERT_EQ(t->set_tracing_on(false), 0);
  EXPECT_FALSE(t->tracing_on());
  Launched p;
  ASSERT_TRUE(p.start(*t));  // joins while recording is off
  EXPECT_EQ(p.pipes.ask("call 100"), "ok " + std::to_string(sum_calls(100)));
  // A fork child joins later still, with an area of its own.
  std::string ans = p.pipes.ask("fork 20");
  int child = 0, st = -1;
  ASSERT_EQ(sscanf(ans.c_str(), "ok %d %d", &child, &st), 2) << ans;
  EXPECT_EQ(st, 0);
  ASSERT_TRUE(hits_reach(*t, e.id, 120));
  EXPECT_EQ(drain(*t).size(), 0u);
  EXPECT_EQ(t->profile(e.id).hits, 120u);
  uint64_t entries = 0, written = 0;
  t->record_counts(&entries, &written);
  EXPECT_EQ(entries, 0u);
  EXPECT_EQ(written, 0u);  // nothing was dropped either

  ASSERT_EQ(t->set_tracing_on(true), 0);
  EXPECT_TRUE(t->tracing_on());
  EXPECT_EQ(p.pipes.ask("call 10"), "ok " + std::to_string(sum_calls(10)));
  std::vector<Rec> recs = drain(*t);
  ASSERT_EQ(recs.size(), 10u);
  for (size_t i = 0; i < recs.size(); ++i) {
    EXPECT_EQ(field(e, recs[i].r, "a"), i);
    EXPECT_EQ(recs[i].r.lost_before, 0u);
  }
  EXPECT_EQ(t->profile(e.id).hits, 130u);
}

}  // namespace
}  // namespace probefs::tracee

namespace probefs::tracee {
namespace {

extern "C" char** environ;

// A stand-in for `probefs exec`: a child of the test that waits for its environment on a
// pipe and then execs traced_prog with it itself. The test reaps it (the tracer does not:
// it is not the tracer's child).
struct PreparedChild {
  ProgPipes pipes;
  KillGuard guard;
  pid_t pid = -1;
  int env_fd = -1;

  ~PreparedChild() {
    if (env_fd >= 0) close(env_fd);
  }

  bool start() {
    int p[2];
    if (pipe2(p, O_CLOEXEC) != 0) return false;
    pid = fork();
    if (pid == 0) {
      // Async-signal-safe calls only: the test has threads.
      static char buf[1 << 16];
      static char* envp[1024];
      close(p[1]);
      size_t n = 0;
      for (;;) {
        ssize_t r = read(p[0], buf + n, sizeof buf - 1 - n);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0 || n + static_cast<size_t>(r) >= sizeof buf - 1) break;
        n += static_cast<size_t>(r);
      }
      buf[n] = 0;
      size_t k = 0;
      for (size_t i = 0; i < n && k + 1 < std::size(envp); i += strlen(buf + i) + 1)
        envp[k++] = buf + i;
      envp[k] = nullptr;
      dup2(pipes.child_stdin(), 0);
      dup2(pipes.child_stdout(), 1);
      char* argv[] = {const_cast<char*>(kProg.c_str()), nullptr};
      execve(kProg.c_str(), argv, envp);
      _exit(127);
    }
    close(p[0]);
    if (pid < 0) {
      close(p[1]);
      return false;
    }
    env_fd = p[1];
    guard.set(pid);
    pipes.parent_side();
    return true;
  }

  // Lets the child exec with this process's environment and the agent's entries.
  bool exec(const Tracer& t, const std::string& link_name) {
    std::string block;
    const char* preload = getenv("LD_PRELOAD");
    for (char** e = environ; *e; ++e)
      if (strncmp(*e, "LD_PRELOAD=", 11) != 0) block.append(*e).push_back('\0');
    for (const std::string& e : agent_environment(t.agent_path(), link_name, preload))
      block.append(e).push_back('\0');
    bool ok = write(env_fd, block.data(), block.size()) == static_cast<ssize_t>(block.size());
    close(env_fd);
    env_fd = -1;
    return ok;
  }

  // Ends the program through its "quit" and reaps it: 0 exit status expected.
  void quit_and_reap() {
    EXPECT_EQ(pipes.ask("quit", 10000), "");
    guard.release();
    int st = -1;
    EXPECT_EQ(waitpid(pid, &st, 0), pid);
    EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << "wait status " << st;
  }
};

// `probefs exec`: a process the tracer did not start execs the program itself with the
// agent preloaded; probes defined before (MOD:SYM waiting for the executable's name, and
// PATH:OFFSET) fire from main on, and its exit is a kExited notice with status -1.
TEST(Tracer, PreparedExecIsTracedFromMain) {
  std::vector<TargetNotice> notices;
  std::mutex nm;
  std::condition_variable ncv;
  auto t = make_tracer();
  ASSERT_NE(t, nullptr);
  t->on_target_notice([&](const TargetNotice& n) {
    std::lock_guard l(nm);
    notices.push_back(n);
    ncv.notify_all();
  });
  Event m = define(*t, "p:t/main " + kProgName + ":main", 110);
  uint64_t off = 0;
  ASSERT_EQ(symbol_file_offset(kProg, "traced_add", &off), 0);
  char line[1024];
  snprintf(line, sizeof line, "p:u/add %s:0x%llx a=%%di", kProg.c_str(),
           static_cast<unsigned long long>(off));
  Event u = define(*t, line, 111);

  PreparedChild c;
  ASSERT_TRUE(c.start());
  std::string name;
  ASSERT_EQ(t->prepare_exec(c.pid, getuid(), 10000, &name), 0);
  EXPECT_FALSE(name.empty());
  ASSERT_TRUE(c.exec(*t, name));
  ASSERT_EQ(c.pipes.line(10000), "ready");
  EXPECT_EQ(c.pipes.ask("call 5"), "ok " + std::to_string(sum_calls(5)));
  std::vector<Rec> recs = drain(*t);
  ASSERT_EQ(recs.size(), 6u);
  EXPECT_EQ(event_id_of(recs[0].r), 110);  // main's first instruction
  for (size_t i = 1; i < recs.size(); ++i) {
    EXPECT_EQ(event_id_of(recs[i].r), 111);
    EXPECT_EQ(field(u, recs[i].r, "a"), i - 1);
  }
  for (const Rec& x : recs) EXPECT_EQ(x.r.pid, c.pid);
  std::vector<TargetInfo> ts = t->targets();
  ASSERT_EQ(ts.size(), 1u);
  EXPECT_EQ(ts[0].pid, c.pid);
  EXPECT_EQ(ts[0].origin, TargetOrigin::kLaunched);
  EXPECT_EQ(ts[0].exe, kProg);
  EXPECT_EQ(t->prepare_exec(c.pid, getuid(), 10000, &name), -EEXIST);

  EXPECT_EQ(c.pipes.ask("quit", 10000), "");
  int st = 0;
  EXPECT_EQ(t->wait_exit(c.pid, 10000, &st), 0);
  EXPECT_EQ(st, -1);  // not the tracer's child: the test reaps it
  c.guard.release();
  int real = -1;
  EXPECT_EQ(waitpid(c.pid, &real, 0), c.pid);
  EXPECT_TRUE(WIFEXITED(real) && WEXITSTATUS(real) == 0) << "wait status " << real;
  std::unique_lock l(nm);
  EXPECT_TRUE(ncv.wait_for(l, std::chrono::seconds(10), [&] {
    bool joined = false;
    for (const auto& n : notices) {
      joined |= n.kind == TargetNotice::Kind::kJoined && n.pid == c.pid;
      if (joined && n.kind == TargetNotice::Kind::kExited && n.pid == c.pid)
        return n.status == -1;
    }
    return false;
  }));
  (void)m;
}

// `probefs exec` of a program whose agent never comes (here: started without the agent in
// its environment): when the expectation lapses, the process is noted as untraceable
// (no-agent), listed so while it runs and said once as a kRefused notice.
TEST(Tracer, APreparedExecWhoseAgentNeverComesIsNotedUntraceable) {
  auto t = make_tracer();
  ASSERT_NE(t, nullptr);
  testing::NoticeLog notices;
  notices.listen(*t);
  PreparedChild c;
  ASSERT_TRUE(c.start());
  std::string name;
  ASSERT_EQ(t->prepare_exec(c.pid, getuid(), 200, &name), 0);
  std::string block;  // this process's environment, without the agent's entries
  for (char** e = environ; *e; ++e)
    if (strncmp(*e, "LD_PRELOAD=", 11) != 0) block.append(*e).push_back('\0');
  ASSERT_EQ(write(c.env_fd, block.data(), block.size()), static_cast<ssize_t>(block.size()));
  close(c.env_fd);
  c.env_fd = -1;
  ASSERT_EQ(c.pipes.line(10000), "ready");
  std::unique_lock l(notices.mu);
  ASSERT_TRUE(notices.cv.wait_for(l, std::chrono::seconds(30), [&] {
    for (const auto& n : notices.list)
      if (n.kind == TargetNotice::Kind::kRefused && n.pid == c.pid) return true;
    return false;
  }));
  for (const auto& n : notices.list) {
    if (n.kind != TargetNotice::Kind::kRefused || n.pid != c.pid) continue;
    EXPECT_TRUE(n.untraceable);
    EXPECT_NE(n.reason.find(" started without the agent in its environment"), std::string::npos)
        << n.reason;
  }
  l.unlock();
  bool listed = false;
  for (const TargetInfo& i : t->targets())
    if (i.pid == c.pid) listed = i.untraceable && i.untraced == "no-agent";
  EXPECT_TRUE(listed);
  c.quit_and_reap();
}

// An expectation that lapsed, or a process of another uid, is refused: the agent lets the
// program run on untraced at once (it does not wait for GO).
TEST(Tracer, PreparedExecLapsedOrOfAnotherUserRunsUntraced) {
  auto t = make_tracer();
  ASSERT_NE(t, nullptr);
  Event e = define(*t, "p:t/add " + kProgName + ":traced_add a=%di", 112);
  std::string name;
  EXPECT_EQ(t->prepare_exec(0, getuid(), 1000, &name), -EINVAL);
  EXPECT_EQ(t->prepare_exec(getpid(), getuid(), -1, &name), -EINVAL);

  // Lapsed: 0 ms, so the connection comes after the deadline whatever the machine's load.
  PreparedChild late;
  ASSERT_TRUE(late.start());
  ASSERT_EQ(t->prepare_exec(late.pid, getuid(), 0, &name), 0);
  ASSERT_TRUE(late.exec(*t, name));
  ASSERT_EQ(late.pipes.line(10000), "ready");
  EXPECT_EQ(late.pipes.ask("call 10"), "ok " + std::to_string(sum_calls(10)));

  // Another user's expectation: the daemon (root here) is asked for uid+1, the process
  // connects as the test's uid.
  PreparedChild other;
  ASSERT_TRUE(other.start());
  if (geteuid() == 0) {
    ASSERT_EQ(t->prepare_exec(other.pid, getuid() + 1, 10000, &name), 0);
  } else {
    EXPECT_EQ(t->prepare_exec(other.pid, getuid() + 1, 10000, &name), -EPERM);
  }
  ASSERT_TRUE(other.exec(*t, name));
  ASSERT_EQ(other.pipes.line(10000), "ready");
  EXPECT_EQ(other.pipes.ask("call 10"), "ok " + std::to_string(sum_calls(10)));

  // No target: the late one may be listed, as a process that runs untraced (its
  // expectation lapsed with no agent joined).
  for (const TargetInfo& i : t->targets()) {
    EXPECT_EQ(i.pid, late.pid);
    EXPECT_TRUE(i.untraceable && i.untraced == "no-agent") << i.untraced;
  }
  EXPECT_EQ(drain(*t).size(), 0u);
  EXPECT_EQ(t->profile(e.id).hits, 0u);
  late.quit_and_reap();
  other.quit_and_reap();
  // A pid that is gone.
  EXPECT_EQ(t->prepare_exec(late.pid, getuid(), 1000, &name), -ESRCH);
}

}  // namespace
}  // namespace probefs::tracee

namespace probefs::tracee {
namespace {

// A record as trace_marker's would start: common_type, flags, preempt count, pid 0, then
// the text.
std::vector<uint8_t> marker_record(uint16_t type, const std::string& text) {
  std::vector<uint8_t> r(8 + text.size());
  memcpy(r.data(), &type, 2);
  memcpy(r.data() + 8, text.data(), text.size());
  return r;
}

std::string marker_text(const TraceRecord& r) {
  return r.len > 8 ? std::string(reinterpret_cast<const char*>(r.data) + 8, r.len - 8) : "";
}

int write_marker(Tracer& t, uint16_t type, const std::string& text) {
  std::vector<uint8_t> r = marker_record(type, text);
  return t.write_record(r.data(), static_cast<uint32_t>(r.size()));
}

// The daemon's records (trace_marker) come out between the target's records in the order
// they were written, with pid 0, the writer's CPU and the target's clock.
TEST(Tracer, MarkersInterleaveWithATargetsRecordsInTimestampOrder) {
  auto t = make_tracer();
  ASSERT_NE(t, nullptr);
  Event e = define(*t, "p:t/add " + kProgName + ":traced_add a=%di", 120);
  Launched p;
  ASSERT_TRUE(p.start(*t));
  for (int round = 0; round < 3; ++round) {
    EXPECT_EQ(p.pipes.ask("call 3"), "ok " + std::to_string(sum_calls(3)));
    ASSERT_EQ(write_marker(*t, 5, "mark " + std::to_string(round)), 0);
  }
  std::vector<Rec> recs = drain(*t);
  ASSERT_EQ(recs.size(), 12u);
  const long cpus = sysconf(_SC_NPROCESSORS_CONF);
  uint64_t last = 0;
  for (size_t i = 0; i < recs.size(); ++i) {
    const TraceRecord& r = recs[i].r;
    EXPECT_GE(r.ts_ns, last) << i;
    last = r.ts_ns;
    if (i % 4 == 3) {
      EXPECT_EQ(event_id_of(r), 5) << i;
      EXPECT_EQ(marker_text(r), "mark " + std::to_string(i / 4));
      EXPECT_EQ(r.pid, 0);
      EXPECT_LT(r.cpu, static_cast<uint32_t>(cpus));
    } else {
      EXPECT_EQ(event_id_of(r), 120) << i;
      EXPECT_EQ(field(e, r, "a"), i % 4);
      EXPECT_EQ(r.pid, p.pid);
    }
  }
  // The counter clock: the daemon's records count as the targets' do (raw values, no
  // conversion), each after the last.
  ASSERT_EQ(t->set_trace_clock("counter"), 0);
  EXPECT_EQ(p.pipes.ask("call 2"), "ok " + std::to_string(sum_calls(2)));
  ASSERT_EQ(write_marker(*t, 5, "c0"), 0);
  ASSERT_EQ(write_marker(*t, 5, "c1"), 0);
  recs = drain(*t);
  ASSERT_EQ(recs.size(), 4u);
  std::vector<uint64_t> marks, targets;
  for (const Rec& x : recs) (x.r.pid == 0 ? marks : targets).push_back(x.r.ts_ns);
  ASSERT_EQ(marks.size(), 2u);
  ASSERT_EQ(targets.size(), 2u);
  EXPECT_EQ(marks[1], marks[0] + 1);
  EXPECT_EQ(targets[1], targets[0] + 1);
  EXPECT_LT(marks[1], 1000000u);  // counts, not nanoseconds
  EXPECT_LT(targets[1], 1000000u);
}

// A ReadPass takes what one look at the rings found, over as many calls as its reader
// makes: records written after that look wait for the next pass, in order, none lost.
TEST(Tracer, ReadPassTakesOneLook) {
  auto t = make_tracer();
  ASSERT_NE(t, nullptr);
  for (int i = 0; i < 5; ++i) ASSERT_EQ(write_marker(*t, 5, "m" + std::to_string(i)), 0);
  std::vector<std::string> got;
  auto take = [&](std::span<const TraceRecord> recs) {
    for (const TraceRecord& r : recs) got.push_back(marker_text(r));
    return true;
  };
  Tracer::ReadPass pass;
  EXPECT_EQ(t->consume_records_in_place(take, 2, -1, 0, &pass), 2u);
  for (int i = 5; i < 10; ++i) ASSERT_EQ(write_marker(*t, 5, "m" + std::to_string(i)), 0);
  EXPECT_EQ(t->consume_records_in_place(take, 100, -1, 0, &pass), 3u);
  EXPECT_EQ(t->consume_records_in_place(take, 100, -1, 0, &pass), 0u);
  Tracer::ReadPass next;
  EXPECT_EQ(t->consume_records_in_place(take, 100, -1, 0, &next), 5u);
  std::vector<std::string> want;
  for (int i = 0; i < 10; ++i) want.push_back("m" + std::to_string(i));
  EXPECT_EQ(got, want);
  // A pass that begins inside an earlier call's look takes the rest of it, then one
  // fresh look.
  for (int i = 0; i < 3; ++i) ASSERT_EQ(write_marker(*t, 5, "a" + std::to_string(i)), 0);
  got.clear();
  EXPECT_EQ(t->consume_records_in_place(take, 1, -1, 0), 1u);  // a look at a0..a2
  ASSERT_EQ(write_marker(*t, 5, "b0"), 0);
  Tracer::ReadPass inside;
  EXPECT_EQ(t->consume_records_in_place(take, 100, -1, 0, &inside), 3u);
  ASSERT_EQ(write_marker(*t, 5, "c0"), 0);
  EXPECT_EQ(t->consume_records_in_place(take, 100, -1, 0, &inside), 0u);
  EXPECT_EQ(got, (std::vector<std::string>{"a0", "a1", "a2", "b0"}));
  Tracer::ReadPass last;
  EXPECT_EQ(t->consume_records_in_place(take, 100, -1, 0, &last), 1u);
  // Without a pass, a call takes what comes while it reads too.
  for (int i = 0; i < 3; ++i) ASSERT_EQ(write_marker(*t, 5, "n" + std::to_string(i)), 0);
  got.clear();
  EXPECT_EQ(t->consume_records_in_place(take, 1, -1, 0), 1u);
  ASSERT_EQ(write_marker(*t, 5, "n3"), 0);
  EXPECT_EQ(t->consume_records_in_place(take, 100, -1, 0), 3u);
  EXPECT_EQ(got, (std::vector<std::string>{"n0", "n1", "n2", "n3"}));
}

// The daemon's buffer: full is -ENOSPC and the next record reports the loss; tracing_on
// 0 is -EBADF and no loss; clear drops the records; several threads at once lose nothing.
TEST(Tracer, MarkerBufferFullOffClearedAndShared) {
  auto t = make_tracer(4);  // one 4 KiB ring
  ASSERT_NE(t, nullptr);
  const std::string text(100, 'x');
  int ok = 0, full = 0;
  while (full < 3 && ok < 1000) {
    const int rc = write_marker(*t, 6, text);
    if (rc == 0) ++ok;
    else if (rc == -ENOSPC) ++full;
    else FAIL() << rc;
  }
  EXPECT_EQ(full, 3);
  EXPECT_GT(ok, 10);
  EXPECT_LT(ok, 40);
  std::vector<Rec> recs = drain(*t);
  EXPECT_EQ(recs.size(), static_cast<size_t>(ok));
  for (const Rec& x : recs) EXPECT_EQ(x.r.lost_before, 0u);
  ASSERT_EQ(write_marker(*t, 6, "after"), 0);
  recs = drain(*t);
  ASSERT_EQ(recs.size(), 1u);
  EXPECT_EQ(recs[0].r.lost_before, 3u);
  EXPECT_EQ(marker_text(recs[0].r), "after");
  EXPECT_EQ(t->write_record(nullptr, 0), -EINVAL);
  std::vector<uint8_t> huge(8192);
  EXPECT_EQ(t->write_record(huge.data(), static_cast<uint32_t>(huge.size())), -EINVAL);

  ASSERT_EQ(t->set_tracing_on(false), 0);
  EXPECT_EQ(write_marker(*t, 6, "off"), -EBADF);
  ASSERT_EQ(t->set_tracing_on(true), 0);
  ASSERT_EQ(write_marker(*t, 6, "on"), 0);
  recs = drain(*t);
  ASSERT_EQ(recs.size(), 1u);
  EXPECT_EQ(recs[0].r.lost_before, 0u);

  ASSERT_EQ(write_marker(*t, 6, "gone"), 0);
  t->clear_records();
  EXPECT_EQ(drain(*t).size(), 0u);

  // A reader asleep in wait_for_records wakes for the daemon's record (a missed wake
  // would show as the timeout: false).
  std::atomic<bool> woken{false};
  std::thread waiter([&] { woken = t->wait_for_records(20000); });
  ASSERT_EQ(write_marker(*t, 6, "wake"), 0);
  waiter.join();
  EXPECT_TRUE(woken.load());
  EXPECT_EQ(drain(*t).size(), 1u);

  // Four threads at once, into a buffer large enough for all of them.
  ASSERT_EQ(t->set_buffer_size_kb(256), 0);
  constexpr int kThreads = 4, kEach = 500;
  std::vector<std::thread> ths;
  std::atomic<int> failures{0};
  for (int w = 0; w < kThreads; ++w) {
    ths.emplace_back([&, w] {
      for (int i = 0; i < kEach; ++i)
        if (write_marker(*t, static_cast<uint16_t>(10 + w), std::to_string(i)) != 0) ++failures;
    });
  }
  for (auto& th : ths) th.join();
  EXPECT_EQ(failures.load(), 0);
  recs = drain(*t);
  ASSERT_EQ(recs.size(), static_cast<size_t>(kThreads * kEach));
  std::map<uint16_t, int> next;
  uint64_t last = 0;
  for (const Rec& x : recs) {
    const uint16_t w = event_id_of(x.r);
    EXPECT_EQ(marker_text(x.r), std::to_string(next[w]++));
    EXPECT_GE(x.r.ts_ns, last);
    last = x.r.ts_ns;
  }
  for (int w = 0; w < kThreads; ++w) EXPECT_EQ(next[static_cast<uint16_t>(10 + w)], kEach);
}

}  // namespace
}  // namespace probefs::tracee

namespace probefs::tracee {
namespace {

// Records of CPU `cpu` consumed (per_cpu/cpuN/trace_pipe), each checked to be of it.
std::vector<Rec> consume_cpu(Tracer& t, int cpu, size_t max = 100000) {
  std::vector<Rec> out;
  t.consume_records(
      [&](const TraceRecord& r) {
        EXPECT_EQ(r.cpu, static_cast<uint32_t>(cpu));
        Rec x{r, std::vector<uint8_t>(r.data, r.data + r.len)};
        x.r.data = x.bytes.data();
        out.push_back(std::move(x));
        return true;
      },
      max, cpu);
  return out;
}

// Per-CPU consumption on real threads pinned to CPU 0 and CPU 1: each CPU's records alone,
// and a thread that moved from one CPU to the other holds back its later records until
// the earlier ones of the other CPU are consumed. Nothing lost, nothing twice.
TEST(Tracer, PerCpuConsumptionOfPinnedThreads) {
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  ASSERT_EQ(sched_getaffinity(0, sizeof allowed, &allowed), 0);
  if (sysconf(_SC_NPROCESSORS_ONLN) < 2 || !CPU_ISSET(0, &allowed) || !CPU_ISSET(1, &allowed))
    GTEST_SKIP() << "needs CPUs 0 and 1";
  auto t = make_tracer();
  ASSERT_NE(t, nullptr);
  Event e = define(*t, "p:t/add " + kProgName + ":traced_add a=%di", 130);
  Launched p;
  ASSERT_TRUE(p.start(*t));

  // Two threads at once, one on each CPU.
  EXPECT_EQ(p.pipes.ask("pinned 200"), "ok " + std::to_string(2 * sum_calls(200)));
  for (int cpu : {1, 0}) {
    std::vector<Rec> recs = consume_cpu(*t, cpu);
    ASSERT_EQ(recs.size(), 200u) << "cpu " << cpu;
    const int32_t tid = tid_of(recs[0].r);
    for (size_t i = 0; i < recs.size(); ++i) {
      EXPECT_EQ(tid_of(recs[i].r), tid);  // one thread: it stayed on its CPU
      EXPECT_EQ(field(e, recs[i].r, "a"), i);
    }
  }
  EXPECT_EQ(drain(*t).size(), 0u);

  // One thread on CPU 0, then 1, then 0 again: one ring, three runs.
  EXPECT_EQ(p.pipes.ask("cpuseq 50 0 1 0"), "ok " + std::to_string(3 * sum_calls(50)));
  EXPECT_EQ(consume_cpu(*t, 0).size(), 50u);  // the first run; the rest waits behind CPU 1
  EXPECT_EQ(consume_cpu(*t, 0).size(), 0u);
  EXPECT_EQ(consume_cpu(*t, 1, 20).size(), 20u);  // max respected
  EXPECT_EQ(consume_cpu(*t, 1).size(), 30u);
  std::vector<Rec> last = consume_cpu(*t, 0);
  ASSERT_EQ(last.size(), 50u);
  for (size_t i = 0; i < last.size(); ++i) EXPECT_EQ(field(e, last[i].r, "a"), i);
  EXPECT_EQ(drain(*t).size(), 0u);
  EXPECT_EQ(t->profile(e.id).hits, 550u);
}

}  // namespace
}  // namespace probefs::tracee

namespace probefs::tracee {
namespace {

// kprobes/blacklist lists the agent's own text in each target, and a probe there is
// refused as the kernel refuses one on its blacklist.
TEST(Tracer, BlacklistListsTheAgentsTextAndProbesThereFail) {
  auto t = make_tracer();
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->kprobes_blacklist(), "");  // no target: nothing to list
  Launched p;
  ASSERT_TRUE(p.start(*t));
  const std::string text = t->kprobes_blacklist();
  std::vector<Mapping> maps;
  ASSERT_EQ(read_maps(p.pid, &maps), 0);
  char real[PATH_MAX];
  ASSERT_NE(realpath(PROBEFS_AGENT_PATH, real), nullptr);
  const std::string agent = real;
  const std::string agent_name = agent.substr(agent.rfind('/') + 1);
  size_t lines = 0, in_agent = 0;
  uintptr_t agent_start = 0;
  size_t at = 0;
  while (at < text.size()) {
    const size_t nl = text.find('\n', at);
    ASSERT_NE(nl, std::string::npos) << text;
    const std::string line = text.substr(at, nl - at);
    at = nl + 1;
    ++lines;
    unsigned long start = 0, end = 0;
    char name[256] = {};
    ASSERT_EQ(sscanf(line.c_str(), "0x%16lx-0x%16lx\t%255[^\n]", &start, &end, name), 3) << line;
    EXPECT_EQ(line.substr(0, 2), "0x");
    EXPECT_EQ(line[18], '-') << line;  // 16 hex digits each
    EXPECT_EQ(line[37], '\t') << line;
    EXPECT_LT(start, end);
    for (const Mapping& m : maps) {
      if (!m.exec || m.path != agent || start < m.start || end > m.end) continue;
      ++in_agent;
      agent_start = start;
      // The symbol there in the agent, or the agent alone where none covers the start.
      const std::string n = name;
      const std::string tag = "[" + agent_name + "]";
      EXPECT_TRUE(n == tag || (n.size() > tag.size() + 1 &&
                               n.substr(n.size() - tag.size() - 1) == " " + tag))
          << line;
    }
  }
  EXPECT_GE(in_agent, 1u) << text;
  EXPECT_GE(lines, in_agent);
  ASSERT_NE(agent_start, 0u);

  // A probe on the agent's code: refused where it would go.
  char def[128];
  snprintf(def, sizeof def, "p:t/bl 0x%lx", static_cast<unsigned long>(agent_start + 16));
  int err = 0;
  events::Diagnostic d;
  define(*t, def, 140, true, &err, &d);
  EXPECT_EQ(err, -EINVAL);
  EXPECT_EQ(d.code, events::ErrorCode::kFailRegProbe);
  EXPECT_EQ(p.pipes.ask("call 3"), "ok " + std::to_string(sum_calls(3)));
  EXPECT_EQ(drain(*t).size(), 0u);
}

}  // namespace
}  // namespace probefs::tracee

namespace probefs::tracee {
namespace {

// Waits (bounded) until at most `n` rings are in use: the tracer's service thread frees
// the drained rings of threads that are gone, and the drained areas of targets that are,
// about once a second.
bool rings_down_to(Tracer& t, uint64_t n, int timeout_ms = 30000) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (t.rings_in_use() > n) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));  // polled: no notice for it
  }
  return true;
}

// The threads of every record now in the buffer, with their record counts (not consumed).
std::map<int32_t, uint64_t> threads_in_buffer(Tracer& t) {
  std::map<int32_t, uint64_t> out;
  t.for_each_record([&](const TraceRecord& r) { ++out[tid_of(r)]; });
  return out;
}

// Thread names as the kernel's saved_cmdlines gives them: a thread's name now while it
// lives, and once it is gone the name it had at its first record, for as long as its
// records can be read; a program that ran and ended before anyone read the trace keeps
// its names.
TEST(Tracer, ThreadNamesOutliveTheThreads) {
  auto t = make_tracer();
  ASSERT_NE(t, nullptr);
  Event e = define(*t, "p:t/add " + kProgName + ":traced_add a=%di", 150);
  Launched p;
  ASSERT_TRUE(p.start(*t));
  EXPECT_EQ(p.pipes.ask("call 5"), "ok " + std::to_string(sum_calls(5)));
  EXPECT_EQ(p.pipes.ask("named 2 50 worker"), "ok " + std::to_string(2 * sum_calls(50)));
  std::map<int32_t, uint64_t> threads = threads_in_buffer(*t);
  ASSERT_EQ(threads.size(), 3u);
  EXPECT_EQ(threads[p.pid], 5u);
  std::set<std::string> workers;
  for (const auto& [tid, n] : threads) {
    if (tid == p.pid) continue;
    EXPECT_EQ(n, 50u);
    workers.insert(t->comm_of(p.pid, tid));
  }
  EXPECT_EQ(workers, (std::set<std::string>{"worker-0", "worker-1"}));
  EXPECT_EQ(t->comm_of(p.pid, p.pid), kProgName);
  // Renamed after its first record: the new name while it lives.
  EXPECT_EQ(p.pipes.ask("rename renamed"), "ok");
  EXPECT_EQ(t->comm_of(p.pid, p.pid), "renamed");

  // The program ends (and is reaped) before anything is read: its records keep names,
  // the main thread the one it had at its first record.
  ASSERT_TRUE(p.pipes.send("quit"));
  int st = -1;
  ASSERT_EQ(t->wait_exit(p.pid, 20000, &st), 0);
  p.guard.release();
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << st;
  EXPECT_EQ(threads_in_buffer(*t), threads);
  EXPECT_EQ(t->comm_of(p.pid, p.pid), kProgName);
  workers.clear();
  for (const auto& [tid, n] : threads)
    if (tid != p.pid) workers.insert(t->comm_of(p.pid, tid));
  EXPECT_EQ(workers, (std::set<std::string>{"worker-0", "worker-1"}));
  // A thread that never recorded has no name.
  EXPECT_EQ(t->comm_of(p.pid, 1), "<...>");
  EXPECT_EQ(drain(*t).size(), 105u);
  EXPECT_EQ(t->comm_of(p.pid, p.pid), kProgName);
  // Its rings and its area freed: the names are still known, for records a reader took
  // and prints later.
  ASSERT_TRUE(rings_down_to(*t, 0));
  EXPECT_EQ(t->comm_of(p.pid, p.pid), kProgName);
  workers.clear();
  for (const auto& [tid, n] : threads)
    if (tid != p.pid) workers.insert(t->comm_of(p.pid, tid));
  EXPECT_EQ(workers, (std::set<std::string>{"worker-0", "worker-1"}));
}

// The kprobe-style text of every record now in the buffer (not consumed), each formatted
// with the symbolizer the tracer gives for its target now.
std::vector<std::string> kprobe_lines(Tracer& t, const Event& e) {
  std::vector<Rec> recs;
  t.for_each_record([&](const TraceRecord& r) {
    Rec x{r, std::vector<uint8_t>(r.data, r.data + r.len)};
    x.r.data = x.bytes.data();
    recs.push_back(std::move(x));
  });
  std::vector<std::string> out;
  for (const Rec& x : recs) {
    std::shared_ptr<events::Symbolizer> sym = t.symbolizer(x.r.pid);
    std::string line;
    events::LineContext ctx;
    ctx.comm = "x";
    EXPECT_TRUE(
        events::format_trace_line(line, e.spec.compiled, ctx, x.r.data, x.r.len, sym.get()));
    const size_t body = line.find(": add: ");
    out.push_back(body == std::string::npos ? line : line.substr(body + 7));
  }
  return out;
}

// kprobe-style lines name the function (sym+off/size) also for a target that ran and
// ended before its records were read, and for records a reader took before the area
// they came from was freed.
TEST(Tracer, DepartedTargetsRecordsAreStillSymbolized) {
  auto t = make_tracer();
  ASSERT_NE(t, nullptr);
  Event e = define(*t, "p:t/add " + kProgName + ":traced_add a=%di", 160);
  Launched p;
  ASSERT_TRUE(p.start(*t));
  EXPECT_EQ(p.pipes.ask("call 3"), "ok " + std::to_string(sum_calls(3)));
  std::vector<std::string> live = kprobe_lines(*t, e);
  ASSERT_EQ(live.size(), 3u);
  const std::string prefix = "(traced_add+0x0/0x";
  EXPECT_EQ(live[1].substr(0, prefix.size()), prefix) << live[1];
  EXPECT_NE(live[1].find(") a=0x1\n"), std::string::npos) << live[1];
  std::shared_ptr<events::Symbolizer> held = t->symbolizer(p.pid);
  ASSERT_NE(held, nullptr);

  ASSERT_TRUE(p.pipes.send("quit"));
  int st = -1;
  ASSERT_EQ(t->wait_exit(p.pid, 20000, &st), 0);  // reaped and dropped from the targets
  p.guard.release();
  EXPECT_EQ(kprobe_lines(*t, e), live);
  // Never a target: no symbolizer.
  EXPECT_EQ(t->symbolizer(getpid()), nullptr);
  // A symbolizer taken before goes on naming, whatever the tracer drops meanwhile.
  std::vector<Rec> recs = drain(*t);
  ASSERT_EQ(recs.size(), 3u);
  uint64_t ip = 0;
  memcpy(&ip, recs[0].r.data + 8, 8);
  events::SymbolInfo si;
  ASSERT_TRUE(held->lookup(ip, &si));
  EXPECT_EQ(si.name, "traced_add");
  EXPECT_EQ(si.offset, 0u);
  EXPECT_GT(si.size, 0u);
  // Its area freed (drained, target gone): the tracer still gives its symbolizer, for
  // records a reader took before and prints now.
  ASSERT_TRUE(rings_down_to(*t, 0));
  std::shared_ptr<events::Symbolizer> later = t->symbolizer(p.pid);
  ASSERT_NE(later, nullptr);
  events::SymbolInfo si2;
  ASSERT_TRUE(later->lookup(ip, &si2));
  EXPECT_EQ(si2.name, "traced_add");
  EXPECT_EQ(si2.size, si.size);
}

// The trace header's counts as the kernel keeps them (records consumed count in neither,
// records dropped count as written until the buffer is emptied), whether a consumer would
// find a record (poll), and the rings in use (buffer_total_size_kb).
TEST(Tracer, TraceHeaderCountsPollAndRingsInUse) {
  auto t = make_tracer(4);  // 4 KiB per thread
  ASSERT_NE(t, nullptr);
  Event e = define(*t, "p:t/add " + kProgName + ":traced_add a=%di b=%si", 170);
  uint64_t entries = 1, written = 1;
  t->record_counts(&entries, &written);
  EXPECT_EQ(entries, 0u);
  EXPECT_EQ(written, 0u);
  EXPECT_EQ(t->rings_in_use(), 0u);
  EXPECT_FALSE(t->has_records());
  Launched p;
  ASSERT_TRUE(p.start(*t));
  EXPECT_EQ(p.pipes.ask("call 1000"), "ok " + std::to_string(sum_calls(1000)));
  uint64_t in_buffer = 0;
  int cpu = -1;
  t->for_each_record([&](const TraceRecord& r) {
    if (in_buffer++ == 0) cpu = static_cast<int>(r.cpu);
  });
  t->record_counts(&entries, &written);
  EXPECT_EQ(entries, in_buffer);
  EXPECT_LT(entries, 1000u);
  EXPECT_EQ(written, 1000u);  // every hit: kept or dropped
  EXPECT_TRUE(t->has_records());
  EXPECT_TRUE(t->has_records(cpu));
  EXPECT_FALSE(t->has_records(4095));
  EXPECT_EQ(t->rings_in_use(), 1u);
  // has_records consumed nothing.
  t->record_counts(&entries, &written);
  EXPECT_EQ(entries, in_buffer);

  // Drained: nothing in the buffer; the dropped ones stay written, as the kernel's
  // overwritten ones do, until the buffer is emptied.
  EXPECT_EQ(drain(*t).size(), in_buffer);
  t->record_counts(&entries, &written);
  EXPECT_EQ(entries, 0u);
  EXPECT_EQ(written, 1000u - in_buffer);
  EXPECT_FALSE(t->has_records());
  EXPECT_FALSE(t->has_records(cpu));
  t->clear_records();
  t->record_counts(&entries, &written);
  EXPECT_EQ(entries, 0u);
  EXPECT_EQ(written, 0u);
  // Nothing lost: a drained buffer shows 0/0.
  EXPECT_EQ(p.pipes.ask("call 10"), "ok " + std::to_string(sum_calls(10)));
  t->record_counts(&entries, &written);
  EXPECT_EQ(entries, 10u);
  EXPECT_EQ(written, 10u);
  EXPECT_EQ(drain(*t).size(), 10u);
  t->record_counts(&entries, &written);
  EXPECT_EQ(entries, 0u);
  EXPECT_EQ(written, 0u);

  // Rings in use: the main thread's, two threads' that are gone but hold records, the
  // daemon's while it holds a marker.
  EXPECT_EQ(p.pipes.ask("threads 2 1"), "ok 0");
  EXPECT_EQ(t->rings_in_use(), 3u);
  ASSERT_EQ(write_marker(*t, 6, "m"), 0);
  EXPECT_EQ(t->rings_in_use(), 4u);
  t->record_counts(&entries, &written);
  EXPECT_EQ(entries, 3u);
  EXPECT_EQ(written, 3u);
  EXPECT_EQ(drain(*t).size(), 3u);
  ASSERT_TRUE(rings_down_to(*t, 1));  // the main thread lives on
  ASSERT_TRUE(p.pipes.send("quit"));
  int st = -1;
  ASSERT_EQ(t->wait_exit(p.pid, 20000, &st), 0);
  p.guard.release();
  EXPECT_TRUE(rings_down_to(*t, 0));
  EXPECT_FALSE(t->has_records());
}

// The values of `a` of the next (at most) `max` records of `walk`.
std::vector<uint64_t> walk_next(Tracer& t, const Event& e, RecordWalk* walk, size_t max) {
  std::vector<uint64_t> out;
  const size_t n = t.for_each_record(walk, [&](const TraceRecord& r) {
    out.push_back(field(e, r, "a"));
    return out.size() < max;
  });
  EXPECT_EQ(n, out.size());
  return out;
}

std::vector<uint64_t> iota(uint64_t from, uint64_t to) {
  std::vector<uint64_t> v;
  for (uint64_t i = from; i < to; ++i) v.push_back(i);
  return v;
}

// A walk taken in chunks (trace read a piece at a time) resumes where it stopped: nothing
// twice, nothing the consumer took meanwhile, the records that came since at the end, the
// records of a target that joined since, and after a clear only what was written after.
TEST(Tracer, AWalkResumesWhereItStopped) {
  auto t = make_tracer();
  ASSERT_NE(t, nullptr);
  Event e = define(*t, "p:t/add " + kProgName + ":traced_add a=%di", 180);
  Launched p;
  ASSERT_TRUE(p.start(*t));
  EXPECT_EQ(p.pipes.ask("call 100"), "ok " + std::to_string(sum_calls(100)));
  RecordWalk w;
  EXPECT_EQ(walk_next(*t, e, &w, 30), iota(0, 30));
  // The consumer takes records the walk passed: the walk goes on where it was.
  EXPECT_EQ(t->consume_records([](const TraceRecord&) { return true; }, 10), 10u);
  EXPECT_EQ(walk_next(*t, e, &w, 10), iota(30, 40));
  // The consumer passes the walk: it goes on at the consumer's first record.
  EXPECT_EQ(t->consume_records([](const TraceRecord&) { return true; }, 50), 50u);
  EXPECT_EQ(walk_next(*t, e, &w, 20), iota(60, 80));
  // Records written since come after the rest; then the walk is at the end.
  EXPECT_EQ(p.pipes.ask("call 5"), "ok " + std::to_string(sum_calls(5)));
  std::vector<uint64_t> want = iota(80, 100);
  for (uint64_t i : iota(0, 5)) want.push_back(i);
  EXPECT_EQ(walk_next(*t, e, &w, 1000), want);
  EXPECT_EQ(walk_next(*t, e, &w, 1000), std::vector<uint64_t>{});
  // A second walk is independent of the first.
  RecordWalk w2;
  EXPECT_EQ(walk_next(*t, e, &w2, 3), iota(60, 63));  // from the first not consumed
  // A fork child joins the walk with its own area.
  const uint64_t hits = t->profile(e.id).hits;
  std::string ans = p.pipes.ask("fork 4");
  int child = 0, st = -1;
  ASSERT_EQ(sscanf(ans.c_str(), "ok %d %d", &child, &st), 2) << ans;
  ASSERT_TRUE(hits_reach(*t, e.id, hits + 4));
  std::vector<pid_t> pids;
  const size_t n = t->for_each_record(&w, [&](const TraceRecord& r) {
    pids.push_back(r.pid);
    return true;
  });
  EXPECT_EQ(n, 4u);
  EXPECT_EQ(pids, std::vector<pid_t>(4, child));
  // Cleared: the walk goes on with what is written after.
  t->clear_records();
  EXPECT_EQ(walk_next(*t, e, &w, 1000), std::vector<uint64_t>{});
  EXPECT_EQ(p.pipes.ask("call 3"), "ok " + std::to_string(sum_calls(3)));
  EXPECT_EQ(walk_next(*t, e, &w, 1000), iota(0, 3));
  EXPECT_EQ(walk_next(*t, e, &w2, 1000), iota(0, 3));
  // The child's area is freed once drained (the child is gone): the walk lets go of it.
  EXPECT_EQ(drain(*t).size(), 3u);
  ASSERT_TRUE(rings_down_to(*t, 1));  // the main thread's ring
  EXPECT_EQ(walk_next(*t, e, &w, 1000), std::vector<uint64_t>{});
  EXPECT_EQ(p.pipes.ask("call 2"), "ok " + std::to_string(sum_calls(2)));
  EXPECT_EQ(walk_next(*t, e, &w, 1000), iota(0, 2));
}


// ---- targets that do not answer: counters, lists and requests go on without them ----

// Stops a process this test started (SIGSTOP) until the kernel reports it stopped, and
// lets it run again (SIGCONT, reported continued) on cont() or, whatever failed, at
// scope exit. The tracer reaps its launched children without WUNTRACED: the stop and
// continue reports are this test's to take.
class Stopped {
 public:
  explicit Stopped(pid_t pid) : pid_(pid) {
    int st = 0;
    stopped_ = kill(pid, SIGSTOP) == 0 && waitpid(pid, &st, WUNTRACED) == pid && WIFSTOPPED(st);
  }
  ~Stopped() {
    if (stopped_) kill(pid_, SIGCONT);
  }
  Stopped(const Stopped&) = delete;
  Stopped& operator=(const Stopped&) = delete;
  bool ok() const { return stopped_; }
  bool cont() {
    int st = 0;
    const bool ok = kill(pid_, SIGCONT) == 0 && waitpid(pid_, &st, WCONTINUED) == pid_ &&
                    WIFCONTINUED(st);
    stopped_ = !ok;
    return ok;
  }

 private:
  pid_t pid_;
  bool stopped_ = false;
};

size_t deferred_of(Tracer& t, pid_t pid) {
  for (const TargetInfo& i : t.targets())
    if (i.pid == pid) return i.deferred;
  ADD_FAILURE() << "no target " << pid;
  return 0;
}

size_t records_of(const std::vector<Rec>& recs, pid_t pid) {
  size_t n = 0;
  for (const Rec& x : recs) n += x.r.pid == pid;
  return n;
}

// kprobe_profile's misses are counted by the agent in the target's ring area as they
// happen (a return probe with maxactive 1 on a recursive function: every nested call's
// return is missed), so they read at once while the target is stopped, and stay with the
// probe once the target is gone.
TEST(Tracer, MissesAreReadFromTheAreaWithoutAskingTheTarget) {
  auto t = make_tracer();
  ASSERT_NE(t, nullptr);
  Event ret = define(*t, "r1:t/rec " + kProgName + ":traced_rec v=$retval", 190);
  Event entry = define(*t, "p:t/recin " + kProgName + ":traced_rec d=%di", 191);
  Launched p;
  ASSERT_TRUE(p.start(*t));
  // Six calls in flight at the deepest point, one instance: five returns missed.
  EXPECT_EQ(p.pipes.ask("recurse 5"), "ok 5");
  {
    Stopped stop(p.pid);
    ASSERT_TRUE(stop.ok());
    const ProbeProfile r = t->profile(ret.id);
    EXPECT_EQ(r.hits, 1u);
    EXPECT_EQ(r.misses, 5u);
    const ProbeProfile e = t->profile(entry.id);
    EXPECT_EQ(e.hits, 6u);
    EXPECT_EQ(e.misses, 0u);
    ASSERT_TRUE(stop.cont());
  }
  EXPECT_EQ(p.pipes.ask("recurse 3"), "ok 3");
  EXPECT_EQ(t->profile(ret.id).misses, 8u);
  EXPECT_EQ(t->profile(ret.id).hits, 2u);
  EXPECT_EQ(drain(*t).size(), 2u + 6u + 4u);
  // Gone: its counts stay with the probes.
  EXPECT_EQ(p.pipes.ask("quit", 10000), "");
  int st = -1;
  EXPECT_EQ(t->wait_exit(p.pid, 10000, &st), 0);
  p.guard.release();
  EXPECT_EQ(t->profile(ret.id).misses, 8u);
  EXPECT_EQ(t->profile(ret.id).hits, 2u);
  EXPECT_EQ(t->profile(entry.id).hits, 10u);
}

// Every request that goes to all targets (define, filter, arm, optimization, remove) is
// sent to each at once and collected under one deadline: with one target stopped, each
// returns what the running one answered and leaves the stopped one's request pending;
// the running one's events fire at once, the stopped one's once it runs again.
TEST(Tracer, RequestsToEveryTargetDoNotWaitForAStoppedOne) {
  auto t = make_tracer();
  ASSERT_NE(t, nullptr);
  Launched a, b;
  ASSERT_TRUE(a.start(*t));
  ASSERT_TRUE(b.start(*t));
  Stopped stop(b.pid);
  ASSERT_TRUE(stop.ok());

  Event e = define(*t, "p:t/add " + kProgName + ":traced_add a=%di", 193);
  Event gone = define(*t, "p:t/str " + kProgName + ":traced_str n=%si", 194);
  events::CompiledFilter f;
  events::Diagnostic d;
  ASSERT_TRUE(events::compile_filter("a >= 7", e.spec.compiled, &f, &d));
  ASSERT_EQ(t->set_filter(e.id, std::make_shared<events::CompiledFilter>(f)), 0);
  ASSERT_EQ(t->set_all_armed(false), 0);
  ASSERT_EQ(t->set_all_armed(true), 0);
  ASSERT_EQ(t->set_optimization(false), 0);
  ASSERT_EQ(t->set_optimization(true), 0);
  ASSERT_EQ(t->remove_probe(gone.id), 0);
  // Two DEFINEs, a SET_FILTER, two arms, two optimizations, a REMOVE.
  EXPECT_EQ(deferred_of(*t, b.pid), 8u);
  EXPECT_EQ(deferred_of(*t, a.pid), 0u);
  // A definition that no target can take is refused as before, without waiting.
  int err = 0;
  define(*t, "p:t/none " + kProgName + ":no_such_function", 195, true, &err);
  EXPECT_EQ(err, -ENOENT);

  EXPECT_EQ(a.pipes.ask("call 10"), "ok " + std::to_string(sum_calls(10)));
  EXPECT_EQ(a.pipes.ask("str 3"), "ok " + std::to_string(6 + 7 + 8));
  std::vector<Rec> recs = drain(*t);
  EXPECT_EQ(records_of(recs, a.pid), 3u);  // a = 7, 8, 9
  EXPECT_EQ(recs.size(), 3u);
  for (const Rec& x : recs) EXPECT_GE(field(e, x.r, "a"), 7u);

  ASSERT_TRUE(stop.cont());
  (void)t->kprobes_list();  // asks b, which answers once it did what it missed
  EXPECT_EQ(deferred_of(*t, b.pid), 0u);
  EXPECT_EQ(b.pipes.ask("call 10"), "ok " + std::to_string(sum_calls(10)));
  EXPECT_EQ(b.pipes.ask("str 3"), "ok " + std::to_string(6 + 7 + 8));
  recs = drain(*t);
  EXPECT_EQ(records_of(recs, b.pid), 3u);
  EXPECT_EQ(recs.size(), 3u);
  EXPECT_EQ(t->profile(e.id).hits, 20u);
}

// The thread of `pid` named `comm`, or 0 when none has that name within two seconds (a
// thread names itself once it runs).
pid_t thread_named(pid_t pid, const std::string& comm) {
  const std::string task = "/proc/" + std::to_string(pid) + "/task";
  for (int tries = 0; tries < 200; ++tries) {
    std::error_code ec;
    for (const auto& d : std::filesystem::directory_iterator(task, ec)) {
      std::ifstream f(d.path() / "comm");
      std::string name;
      if (std::getline(f, name) && name == comm) return std::stoi(d.path().filename().string());
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return 0;
}

// Holds one thread of a process this test started in a ptrace stop (PTRACE_SEIZE, then
// PTRACE_INTERRUPT) while the rest of the process runs: with the agent's thread held,
// the target is not stopped, its agent just does not answer (its requests wait for their
// deadline). Let go on release() or at scope exit, from the thread that seized it.
class HeldThread {
 public:
  explicit HeldThread(pid_t tid) : tid_(tid) {
    int st = 0;
    held_ = tid > 0 && ptrace(PTRACE_SEIZE, tid, nullptr, nullptr) == 0;
    if (held_ && (ptrace(PTRACE_INTERRUPT, tid, nullptr, nullptr) != 0 ||
                  waitpid(tid, &st, __WALL) != tid || !WIFSTOPPED(st)))
      release();
  }
  ~HeldThread() { release(); }
  HeldThread(const HeldThread&) = delete;
  HeldThread& operator=(const HeldThread&) = delete;
  bool ok() const { return held_; }
  void release() {
    if (held_) (void)ptrace(PTRACE_DETACH, tid_, nullptr, nullptr);
    held_ = false;
  }

 private:
  pid_t tid_;
  bool held_ = false;
};

// A request that waits for an agent that does not answer (until its deadline) holds up
// nobody who only reads: `targets`, wait_exit, the symbolizer of a target's records, the
// buffer size and the records themselves answer at once, and a launched program's exit
// is known as it happens (DESIGN.md §9).
TEST(Tracer, AnAgentThatDoesNotAnswerHoldsUpNoReader) {
  auto t = make_tracer();
  ASSERT_NE(t, nullptr);
  Event e = define(*t, "p:t/add " + kProgName + ":traced_add a=%di", 196);
  Launched a, b;
  ASSERT_TRUE(a.start(*t));
  ASSERT_TRUE(b.start(*t));
  EXPECT_EQ(a.pipes.ask("call 3"), "ok " + std::to_string(sum_calls(3)));
  const pid_t agent = thread_named(b.pid, "probefs-agent");
  ASSERT_NE(agent, 0);
  HeldThread held(agent);
  ASSERT_TRUE(held.ok()) << strerror(errno);

  std::atomic<bool> done{false};
  std::thread slow([&] {
    (void)t->disable_probe(e.id);  // a's agent answers; b's does not, until the deadline
    done = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_FALSE(done.load());
  const auto start = std::chrono::steady_clock::now();
  std::set<pid_t> pids;
  for (const TargetInfo& i : t->targets()) pids.insert(i.pid);
  EXPECT_EQ(pids, (std::set<pid_t>{a.pid, b.pid}));
  int st = 0;
  EXPECT_EQ(t->wait_exit(a.pid, 0, &st), -ETIMEDOUT);
  EXPECT_NE(t->symbolizer(a.pid), nullptr);
  EXPECT_EQ(t->buffer_size_kb(), 1024u);
  std::vector<Rec> recs = drain(*t);
  EXPECT_EQ(records_of(recs, a.pid), 3u);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(2));
  // A launched program's exit is known at once too, and `targets` leaves it out.
  EXPECT_EQ(a.pipes.ask("quit", 5000), "");
  EXPECT_EQ(t->wait_exit(a.pid, 3000, &st), 0);
  a.guard.release();
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << "wait status " << st;
  pids.clear();
  for (const TargetInfo& i : t->targets()) pids.insert(i.pid);
  EXPECT_EQ(pids, std::set<pid_t>{b.pid});
  EXPECT_FALSE(done.load());  // the request still waits: nothing above waited for it

  held.release();
  slow.join();
}

// The lines of `list` that name `what`.
std::vector<std::string> lines_with(const std::string& list, const std::string& what) {
  std::vector<std::string> out;
  for (size_t at = 0; at < list.size();) {
    size_t nl = list.find('\n', at);
    if (nl == std::string::npos) nl = list.size();
    const std::string line = list.substr(at, nl - at);
    if (line.find(what) != std::string::npos) out.push_back(line);
    at = nl + 1;
  }
  return out;
}

// Two targets, one stopped: a change to a probe reaches the running one at once and waits
// in the stopped one's link (deferred); kprobes/list shows the running one as it is now
// and the stopped one as it last was, without waiting for it; once it runs again, it
// does what it missed, in order, and the list says so.
TEST(Tracer, AStoppedTargetShowsItsLastListAndHoldsUpNoChange) {
  auto t = make_tracer();
  ASSERT_NE(t, nullptr);
  Event e = define(*t, "p:t/add " + kProgName + ":traced_add a=%di", 192);
  Launched a, b;
  ASSERT_TRUE(a.start(*t));
  ASSERT_TRUE(b.start(*t));
  std::vector<std::string> lines = lines_with(t->kprobes_list(), "traced_add+0x0");
  ASSERT_EQ(lines.size(), 2u) << t->kprobes_list();
  for (const std::string& l : lines) EXPECT_EQ(l.find("[DISABLED]"), std::string::npos) << l;
  const std::string blacklist = t->kprobes_blacklist();
  EXPECT_FALSE(blacklist.empty());

  Stopped stop(b.pid);
  ASSERT_TRUE(stop.ok());
  ASSERT_EQ(t->disable_probe(e.id), 0);
  EXPECT_EQ(deferred_of(*t, a.pid), 0u);
  EXPECT_EQ(deferred_of(*t, b.pid), 1u);
  lines = lines_with(t->kprobes_list(), "traced_add+0x0");
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines_with(t->kprobes_list(), "[DISABLED]").size(), 1u) << t->kprobes_list();
  EXPECT_EQ(t->kprobes_blacklist(), blacklist);  // as it was: asked once, kept
  EXPECT_EQ(a.pipes.ask("call 10"), "ok " + std::to_string(sum_calls(10)));
  EXPECT_EQ(drain(*t).size(), 0u);

  ASSERT_EQ(t->enable_probe(e.id), 0);
  EXPECT_EQ(deferred_of(*t, b.pid), 2u);
  EXPECT_EQ(lines_with(t->kprobes_list(), "[DISABLED]").size(), 0u) << t->kprobes_list();
  EXPECT_EQ(a.pipes.ask("call 10"), "ok " + std::to_string(sum_calls(10)));
  std::vector<Rec> recs = drain(*t);
  EXPECT_EQ(records_of(recs, a.pid), 10u);
  EXPECT_EQ(recs.size(), 10u);

  // Running again, b is asked for its list (it changed since it last said), and answers
  // after doing what it missed.
  ASSERT_TRUE(stop.cont());
  lines = lines_with(t->kprobes_list(), "traced_add+0x0");
  EXPECT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines_with(t->kprobes_list(), "[DISABLED]").size(), 0u);
  EXPECT_EQ(deferred_of(*t, b.pid), 0u);
  EXPECT_EQ(b.pipes.ask("call 10"), "ok " + std::to_string(sum_calls(10)));
  recs = drain(*t);
  EXPECT_EQ(records_of(recs, b.pid), 10u);
  EXPECT_EQ(recs.size(), 10u);
}

// The agent tells the daemon of what its optimizer changed on its own (LIST_CHANGED): a
// probe that could not become a jmp at once (a thread of the target runs with every
// signal blocked, where the engine cannot move it) shows [OPTIMIZED] in kprobes/list
// once the target's optimizer thread made the jmp, though the daemon asked the target
// nothing in between.
TEST(Tracer, TheListFollowsAJmpTheTargetsOptimizerMadeOnItsOwn) {
  auto t = make_tracer();
  ASSERT_NE(t, nullptr);
  Launched p;
  ASSERT_TRUE(p.start(*t));
  ASSERT_EQ(p.pipes.ask("spin"), "ok");
  Event e = define(*t, "p:t/add " + kProgName + ":traced_add a=%di", 196);
  std::string list = t->kprobes_list();
  ASSERT_EQ(lines_with(list, "traced_add+0x0").size(), 1u) << list;
  EXPECT_EQ(list.find("[OPTIMIZED]"), std::string::npos) << list;
  EXPECT_EQ(t->kprobes_list(), list);  // nothing changed: the same text, nothing asked
  ASSERT_EQ(p.pipes.ask("unspin"), "ok");
  // The target's optimizer retries on its own time: polled, with a bound.
  bool optimized = false;
  for (int i = 0; i < 4000 && !optimized; ++i) {
    optimized = t->kprobes_list().find("[OPTIMIZED]") != std::string::npos;
    if (!optimized) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_TRUE(optimized) << t->kprobes_list();
  EXPECT_EQ(p.pipes.ask("call 10"), "ok " + std::to_string(sum_calls(10)));
  EXPECT_EQ(drain(*t).size(), 10u);
  EXPECT_EQ(t->profile(e.id).hits, 10u);
}

}  // namespace
}  // namespace probefs::tracee

namespace probefs::tracee {
namespace {

// The records of buffer `b`, consumed.
std::vector<Rec> drain_buffer(Tracer& t, uint32_t b) {
  std::vector<Rec> out;
  t.consume_records(
      [&](const TraceRecord& r) {
        Rec x{r, std::vector<uint8_t>(r.data, r.data + r.len)};
        x.r.data = x.bytes.data();
        out.push_back(std::move(x));
        return true;
      },
      SIZE_MAX, -1, b);
  return out;
}

uint64_t entries_of(Tracer& t, uint32_t b) {
  uint64_t entries = 0, written = 0;
  t.record_counts(&entries, &written, b);
  return entries;
}

// Buffers (the instances'): a probe records into each buffer it is given and no other;
// each buffer is consumed, switched off, counted, cleared and written (trace_marker)
// apart from the others; threads record into each buffer they are given a ring of.
TEST(Tracer, EachBufferKeepsItsOwnRecords) {
  auto t = make_tracer();
  ASSERT_NE(t, nullptr);
  Event e = define(*t, "p:t/add " + kProgName + ":traced_add a=%di", 140);
  ASSERT_EQ(t->set_probe_buffers(e.id, 0b101), 0);  // the top level's and buffer 2
  Launched p;
  ASSERT_TRUE(p.start(*t));
  EXPECT_EQ(p.pipes.ask("call 50"), "ok " + std::to_string(sum_calls(50)));
  EXPECT_EQ(entries_of(*t, 0), 50u);
  EXPECT_EQ(entries_of(*t, 2), 50u);
  EXPECT_EQ(entries_of(*t, 1), 0u);
  for (uint32_t b : {0u, 2u}) {
    std::vector<Rec> recs = drain_buffer(*t, b);
    ASSERT_EQ(recs.size(), 50u) << "buffer " << b;
    for (size_t i = 0; i < recs.size(); ++i) {
      EXPECT_EQ(field(e, recs[i].r, "a"), i);
      EXPECT_EQ(recs[i].r.pid, p.pid);
      EXPECT_EQ(recs[i].r.tid, p.pid);
    }
  }
  EXPECT_TRUE(drain_buffer(*t, 1).empty());

  // Tracing off in buffer 2 alone.
  ASSERT_EQ(t->set_tracing_on(false, 2), 0);
  EXPECT_TRUE(t->tracing_on(0));
  EXPECT_FALSE(t->tracing_on(2));
  EXPECT_EQ(p.pipes.ask("call 10"), "ok " + std::to_string(sum_calls(10)));
  EXPECT_EQ(drain_buffer(*t, 0).size(), 10u);
  EXPECT_TRUE(drain_buffer(*t, 2).empty());
  ASSERT_EQ(t->set_tracing_on(true, 2), 0);

  // Buffer 1 alone; the clear of one buffer leaves the others.
  ASSERT_EQ(t->set_probe_buffers(e.id, 0b10), 0);
  EXPECT_EQ(p.pipes.ask("call 5"), "ok " + std::to_string(sum_calls(5)));
  EXPECT_EQ(entries_of(*t, 0), 0u);
  EXPECT_EQ(entries_of(*t, 1), 5u);
  ASSERT_EQ(write_marker(*t, 7, "top"), 0);
  ASSERT_EQ(t->write_record(marker_record(7, "three").data(), 13, 3), 0);
  t->clear_records(1);
  EXPECT_EQ(entries_of(*t, 1), 0u);
  std::vector<Rec> top = drain_buffer(*t, 0);
  ASSERT_EQ(top.size(), 1u);
  EXPECT_EQ(marker_text(top[0].r), "top");
  std::vector<Rec> three = drain_buffer(*t, 3);
  ASSERT_EQ(three.size(), 1u);
  EXPECT_EQ(marker_text(three[0].r), "three");
  EXPECT_EQ(three[0].r.pid, 0);

  // Eight threads, each with a ring in the top level's buffer and in buffer 1.
  ASSERT_EQ(t->set_probe_buffers(e.id, 0b11), 0);
  const std::string ans = p.pipes.ask("threads 8 1000");
  ASSERT_EQ(ans.rfind("ok ", 0), 0u) << ans;
  for (uint32_t b : {0u, 1u}) {
    std::map<int32_t, uint64_t> next;  // per thread: its next argument
    for (const Rec& x : drain_buffer(*t, b)) {
      uint64_t& n = next[x.r.tid];
      EXPECT_EQ(field(e, x.r, "a"), n) << "buffer " << b;
      n = field(e, x.r, "a") + 1;
    }
    EXPECT_EQ(next.size(), 8u) << "buffer " << b;
    for (const auto& [tid, n] : next) EXPECT_EQ(n, 1000u) << "buffer " << b << " thread " << tid;
  }
  EXPECT_EQ(t->profile(e.id).hits, 50u + 10 + 5 + 8000);
  EXPECT_EQ(t->set_probe_buffers(e.id, 1u << events::kRingMaxBuffers), -EINVAL);
  EXPECT_EQ(t->set_tracing_on(false, events::kRingMaxBuffers), -EINVAL);
}

// A fork child records into the buffers its parent's probes record into, from its first
// call (it runs on a spare area before it joins).
TEST(Tracer, AForkChildRecordsIntoEveryBufferOfItsParent) {
  auto t = make_tracer();
  ASSERT_NE(t, nullptr);
  Event e = define(*t, "p:t/add " + kProgName + ":traced_add a=%di", 141);
  ASSERT_EQ(t->set_probe_buffers(e.id, 0b1001), 0);  // the top level's and buffer 3
  Launched p;
  ASSERT_TRUE(p.start(*t));
  const std::string ans = p.pipes.ask("fork 30");
  int child = 0, st = -1;
  ASSERT_EQ(sscanf(ans.c_str(), "ok %d %d", &child, &st), 2) << ans;
  EXPECT_EQ(st, 0);
  ASSERT_TRUE(hits_reach(*t, e.id, 30));
  for (uint32_t b : {0u, 3u}) {
    std::vector<Rec> recs = drain_buffer(*t, b);
    ASSERT_EQ(recs.size(), 30u) << "buffer " << b;
    for (size_t i = 0; i < recs.size(); ++i) {
      EXPECT_EQ(recs[i].r.pid, child) << "buffer " << b;
      EXPECT_EQ(field(e, recs[i].r, "a"), i) << "buffer " << b;
    }
  }
  EXPECT_TRUE(drain_buffer(*t, 1).empty());
}

}  // namespace
}  // namespace probefs::tracee
