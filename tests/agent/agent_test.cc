// The agent in real processes: launched with the agent preloaded, driven over the link by
// a test daemon (agent_test_util.h), its records read back from the ring area.
#include <sys/ptrace.h>
#include <sys/wait.h>

#include <algorithm>
#include <set>

#include "tests/agent/agent_test_util.h"

namespace probefs::agent_test {
namespace {

constexpr long kCalls = 1000;

// The agent is dlopen'ed at attach: its static TLS must fit what glibc keeps for that.
TEST(AgentLoad, DlopenIntoAProgramThatDoesNotLinkIt) {
  Child c;
  int out[2];
  ASSERT_EQ(pipe2(out, O_CLOEXEC), 0);
  c.pid = fork();
  ASSERT_GE(c.pid, 0);
  if (c.pid == 0) {
    dup2(out[1], 1);
    execl(PROBEFS_AGENT_TARGET, PROBEFS_AGENT_TARGET, "dlopen-agent", PROBEFS_AGENT_LIB,
          nullptr);
    _exit(127);
  }
  close(out[1]);
  c.out = out[0];
  std::string line;
  ASSERT_TRUE(c.read_line(&line));
  EXPECT_EQ(line, "ok");
  ASSERT_TRUE(c.wait_exit());
  EXPECT_TRUE(c.exited_ok());
}

// Entry and return events defined before main: exact counts, the real arguments and
// return values.
TEST(AgentLaunch, EntryAndReturnEventsFromMainOn) {
  TestDaemon d;
  Child c;
  Target t;
  ASSERT_TRUE(d.launch({PROBEFS_AGENT_TARGET, "calls", std::to_string(kCalls)}, &c, &t));
  ASSERT_TRUE(d.setup(&t));
  Event add, sq;
  ASSERT_TRUE(d.define(&t, "p:test/add probefs_target_add a=%di:s64 b=%si:s64", 1, 0, &add));
  ASSERT_TRUE(d.define(&t, "r:test/sq probefs_target_square ret=$retval:s64 x=$arg1:s64", 2, 1,
                       &sq));
  ASSERT_EQ(t.link->go().error, 0);
  ASSERT_TRUE(c.wait_exit());
  ASSERT_TRUE(c.exited_ok());

  const std::vector<Rec> all = TestDaemon::drain(&t);
  const std::vector<Rec> adds = of_event(all, 1), sqs = of_event(all, 2);
  ASSERT_EQ(adds.size(), static_cast<size_t>(kCalls));
  ASSERT_EQ(sqs.size(), static_cast<size_t>(kCalls));
  for (long i = 0; i < kCalls; ++i) {
    EXPECT_EQ(add.field(adds[i], "a"), i);
    EXPECT_EQ(add.field(adds[i], "b"), 1000 + i);
    EXPECT_EQ(adds[i].tid, t.pid);
    EXPECT_EQ(sq.field(sqs[i], "x"), i);
    EXPECT_EQ(sq.field(sqs[i], "ret"), i * i);
  }
  EXPECT_EQ(t.reader->hits(0), static_cast<uint64_t>(kCalls));
  EXPECT_EQ(t.reader->hits(1), static_cast<uint64_t>(kCalls));
}

// The bytes of the target's memory at addr (through /proc/PID/mem).
std::vector<uint8_t> read_mem(pid_t pid, uint64_t addr, size_t n) {
  std::vector<uint8_t> out(n);
  const int fd = open(("/proc/" + std::to_string(pid) + "/mem").c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return {};
  const ssize_t got = pread(fd, out.data(), n, static_cast<off_t>(addr));
  close(fd);
  if (got != static_cast<ssize_t>(n)) return {};
  return out;
}

// A phase of `phases` mode: one line in, "done" out.
void run_phase(Child* c) {
  ASSERT_TRUE(c->send_line("x"));
  std::string line;
  ASSERT_TRUE(c->read_line(&line));
  ASSERT_EQ(line, "done");
}

uint64_t address_of(Target* t, const std::string& sym) {
  tracee::ResolvedSymbol rs;
  EXPECT_EQ(t->symbols->resolve(sym, &rs), 0) << sym;
  return rs.addr;
}

// Disable, enable, filters, remove, LIST and PROFILE while the program runs; between
// phases the counts are exact.
TEST(AgentControl, DisableFilterRemoveListProfile) {
  constexpr long kN = 100;
  TestDaemon d;
  Child c;
  Target t;
  ASSERT_TRUE(d.launch({PROBEFS_AGENT_TARGET, "phases", std::to_string(kN)}, &c, &t));
  ASSERT_TRUE(d.setup(&t));
  Event add, sq;
  ASSERT_TRUE(d.define(&t, "p:test/add probefs_target_add a=%di:s64 b=%si:s64", 1, 0, &add));
  ASSERT_TRUE(d.define(&t, "r:test/sq probefs_target_square ret=$retval:s64 x=$arg1:s64", 2, 1,
                       &sq));
  const uint64_t add_addr = address_of(&t, "probefs_target_add");
  ASSERT_EQ(t.link->go().error, 0);

  // A second definition with a taken id, and requests for ids that do not exist.
  link::Define dup;
  Event unused;
  ASSERT_TRUE(d.prepare(&t, "p:test/add2 probefs_target_add", 3, 0, &unused, &dup));
  EXPECT_EQ(t.link->define(dup).error, -EEXIST);
  EXPECT_EQ(t.link->remove(99).error, -ENOENT);
  EXPECT_EQ(t.link->enable(99).error, -ENOENT);
  EXPECT_EQ(t.link->set_filter(99, nullptr).error, -ENOENT);

  run_phase(&c);
  std::vector<Rec> all = TestDaemon::drain(&t);
  EXPECT_EQ(of_event(all, 1).size(), static_cast<size_t>(kN));
  EXPECT_EQ(of_event(all, 2).size(), static_cast<size_t>(kN));

  tracee::LinkResult list = t.link->list();
  ASSERT_EQ(list.error, 0);
  EXPECT_NE(list.message.find("  k  probefs_target_add+0x0"), std::string::npos) << list.message;
  EXPECT_NE(list.message.find("  r  probefs_target_square+0x0"), std::string::npos)
      << list.message;
  tracee::LinkResult prof = t.link->profile();
  ASSERT_EQ(prof.error, 0);
  ASSERT_EQ(prof.profile.size(), 2u);
  for (const auto& e : prof.profile) EXPECT_EQ(e.nmissed, 0u);

  // Disabled: no records, no hits.
  ASSERT_EQ(t.link->disable(1).error, 0);
  list = t.link->list();
  {
    const size_t at = list.message.find("probefs_target_add+0x0");
    ASSERT_NE(at, std::string::npos) << list.message;
    const std::string add_line = list.message.substr(at, list.message.find('\n', at) - at);
    EXPECT_NE(add_line.find("[DISABLED]"), std::string::npos) << list.message;
  }
  run_phase(&c);
  all = TestDaemon::drain(&t);
  EXPECT_EQ(of_event(all, 1).size(), 0u);
  EXPECT_EQ(of_event(all, 2).size(), static_cast<size_t>(kN));
  EXPECT_EQ(t.reader->hits(0), static_cast<uint64_t>(kN));

  // Enabled with a filter: every call is a hit, ten are recorded.
  events::CompiledFilter f;
  events::Diagnostic diag;
  ASSERT_TRUE(events::compile_filter("a < 10", add.ev, &f, &diag)) << diag.message();
  ASSERT_EQ(t.link->enable(1).error, 0);
  ASSERT_EQ(t.link->set_filter(1, &f).error, 0);
  run_phase(&c);
  all = TestDaemon::drain(&t);
  std::vector<Rec> adds = of_event(all, 1);
  ASSERT_EQ(adds.size(), 10u);
  for (long i = 0; i < 10; ++i) EXPECT_EQ(add.field(adds[i], "a"), i);
  EXPECT_EQ(t.reader->hits(0), static_cast<uint64_t>(2 * kN));

  // A filter on the return event; the entry event's filter cleared.
  events::CompiledFilter g;
  ASSERT_TRUE(events::compile_filter("ret > 100", sq.ev, &g, &diag)) << diag.message();
  ASSERT_EQ(t.link->set_filter(2, &g).error, 0);
  ASSERT_EQ(t.link->set_filter(1, nullptr).error, 0);
  run_phase(&c);
  all = TestDaemon::drain(&t);
  EXPECT_EQ(of_event(all, 1).size(), static_cast<size_t>(kN));
  std::vector<Rec> sqs = of_event(all, 2);
  ASSERT_EQ(sqs.size(), static_cast<size_t>(kN - 11));  // 11*11 > 100
  for (const Rec& r : sqs) EXPECT_GT(sq.field(r, "ret"), 100);

  // Removed: the code is as it was.
  const std::vector<uint8_t> patched = read_mem(t.pid, add_addr, 1);
  ASSERT_EQ(t.link->remove(1).error, 0);
  list = t.link->list();
  EXPECT_EQ(list.message.find("probefs_target_add"), std::string::npos) << list.message;
  run_phase(&c);
  all = TestDaemon::drain(&t);
  EXPECT_EQ(of_event(all, 1).size(), 0u);
  const std::vector<uint8_t> now = read_mem(t.pid, add_addr, 1);
  ASSERT_EQ(now.size(), 1u);
  EXPECT_NE(now[0], 0xcc);
  EXPECT_NE(now[0], 0xe9);
  (void)patched;

  // Disarm all: nothing fires, and arming again restores the enabled probe.
  ASSERT_EQ(t.link->disarm_all().error, 0);
  run_phase(&c);
  EXPECT_EQ(TestDaemon::drain(&t).size(), 0u);
  ASSERT_EQ(t.link->arm_all().error, 0);
  ASSERT_EQ(t.link->set_filter(2, nullptr).error, 0);
  run_phase(&c);
  EXPECT_EQ(of_event(TestDaemon::drain(&t), 2).size(), static_cast<size_t>(kN));

  c.close_stdin();
  ASSERT_TRUE(c.wait_exit());
  EXPECT_TRUE(c.exited_ok());
}

// The daemon's end of the link closes abruptly (as when it is killed): the agent removes
// every probe at once, and the program runs on with correct results.
TEST(AgentTracerDeath, ProbesGoWhenTheLinkEnds) {
  TestDaemon d;
  Child c;
  Target t;
  ASSERT_TRUE(d.launch({PROBEFS_AGENT_TARGET, "loop"}, &c, &t));
  ASSERT_TRUE(d.setup(&t));
  int err = 0;
  t.symbols = tracee::ProcessSymbols::load(t.pid, &err);
  ASSERT_NE(t.symbols, nullptr);
  const uint64_t add_addr = address_of(&t, "probefs_target_add");
  const std::vector<uint8_t> original = read_mem(t.pid, add_addr, 8);
  ASSERT_EQ(original.size(), 8u);
  Event add;
  ASSERT_TRUE(d.define(&t, "p:test/add probefs_target_add a=%di:s64 b=%si:s64", 1, 0, &add));
  ASSERT_EQ(t.link->go().error, 0);
  std::string line;
  ASSERT_TRUE(c.read_line(&line));
  ASSERT_EQ(line, "running");
  // The probe fires (bounded wait on the hit counter).
  const auto deadline = Clock::now() + kWait;
  while (t.reader->hits(0) == 0 && Clock::now() < deadline) sched_yield();
  ASSERT_GT(t.reader->hits(0), 0u);
  ASSERT_NE(read_mem(t.pid, add_addr, 8), original);

  const auto closed_at = Clock::now();
  t.link->close();
  // The requirement is 1 s; the bound here is looser so a loaded machine cannot fail it.
  bool restored = false;
  while (!restored && Clock::now() < closed_at + 10s) {
    restored = read_mem(t.pid, add_addr, 8) == original;
    if (!restored) sched_yield();
  }
  EXPECT_TRUE(restored);
  std::printf("probes removed %lld ms after the link closed\n",
              static_cast<long long>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                         Clock::now() - closed_at).count()));
  const uint64_t hits = t.reader->hits(0);
  c.close_stdin();
  ASSERT_TRUE(c.wait_exit());
  EXPECT_TRUE(c.exited_ok());  // every add() gave the right result
  EXPECT_EQ(t.reader->hits(0), hits);  // nothing counted after the probes went
}

// A fork child is a target of its own: HELLO kFork, its own ring area, the probes it
// inherited.
TEST(AgentProcesses, ForkChildIsTracedWithTheSameEvents) {
  constexpr long kN = 100;
  TestDaemon d;
  Child c;
  Target t;
  ASSERT_TRUE(d.launch({PROBEFS_AGENT_TARGET, "fork", std::to_string(kN)}, &c, &t));
  ASSERT_TRUE(d.setup(&t));
  Event add;
  ASSERT_TRUE(d.define(&t, "p:test/add probefs_target_add a=%di:s64 b=%si:s64", 1, 0, &add));
  ASSERT_EQ(t.link->go().error, 0);

  tracee::LinkEvent ev;
  ASSERT_TRUE(d.next_event(&ev));
  ASSERT_EQ(ev.kind, tracee::LinkEvent::kConnected)
      << "link of " << ev.link->pid() << " (parent " << t.pid << ")";
  EXPECT_EQ(ev.link->hello().reason, link::HelloReason::kFork);
  EXPECT_EQ(ev.link->hello().ppid, t.pid);
  Target child;
  child.pid = ev.link->pid();
  child.link = ev.link;
  ASSERT_TRUE(d.setup(&child));
  ASSERT_EQ(child.link->go().error, 0);

  ASSERT_TRUE(c.wait_exit());
  ASSERT_TRUE(c.exited_ok());
  const std::vector<Rec> parent_adds = of_event(TestDaemon::drain(&t), 1);
  const std::vector<Rec> child_adds = of_event(TestDaemon::drain(&child), 1);
  ASSERT_EQ(parent_adds.size(), static_cast<size_t>(kN));
  ASSERT_EQ(child_adds.size(), static_cast<size_t>(kN));
  for (long i = 0; i < kN; ++i) {
    EXPECT_EQ(add.field(parent_adds[i], "b"), 1000 + i);
    EXPECT_EQ(parent_adds[i].tid, t.pid);
    EXPECT_EQ(add.field(child_adds[i], "a"), i);
    EXPECT_EQ(add.field(child_adds[i], "b"), 2000 + i);
    EXPECT_EQ(child_adds[i].tid, child.pid);
  }
  EXPECT_EQ(child.reader->hits(0), static_cast<uint64_t>(kN));
}

// A launched program that execs is traced in its new image (HELLO kExec, same pid).
TEST(AgentProcesses, ExecImageIsTraced) {
  constexpr long kN = 100;
  TestDaemon d;
  Child c;
  Target t;
  ASSERT_TRUE(d.launch({PROBEFS_AGENT_TARGET, "exec", std::to_string(kN)}, &c, &t));
  ASSERT_TRUE(d.setup(&t));
  Event add;
  ASSERT_TRUE(d.define(&t, "p:test/add probefs_target_add a=%di:s64 b=%si:s64", 1, 0, &add));
  ASSERT_EQ(t.link->go().error, 0);

  Target img;
  for (tracee::LinkEvent ev; !img.link;) {
    ASSERT_TRUE(d.next_event(&ev));
    if (ev.kind == tracee::LinkEvent::kClosed) {
      EXPECT_EQ(ev.link, t.link);
      continue;
    }
    ASSERT_EQ(ev.kind, tracee::LinkEvent::kConnected);
    EXPECT_EQ(ev.link->hello().reason, link::HelloReason::kExec);
    EXPECT_EQ(ev.link->pid(), t.pid);
    img.pid = ev.link->pid();
    img.link = ev.link;
  }
  ASSERT_TRUE(d.setup(&img));
  Event add2, sq2;
  ASSERT_TRUE(d.define(&img, "p:test/add probefs_target_add a=%di:s64 b=%si:s64", 1, 0, &add2));
  ASSERT_TRUE(d.define(&img, "r:test/sq probefs_target_square ret=$retval:s64", 2, 1, &sq2));
  ASSERT_EQ(img.link->go().error, 0);
  ASSERT_TRUE(c.wait_exit());
  ASSERT_TRUE(c.exited_ok());
  EXPECT_EQ(TestDaemon::drain(&t).size(), 0u);
  const std::vector<Rec> all = TestDaemon::drain(&img);
  const std::vector<Rec> adds = of_event(all, 1), sqs = of_event(all, 2);
  ASSERT_EQ(adds.size(), static_cast<size_t>(kN));
  ASSERT_EQ(sqs.size(), static_cast<size_t>(kN));
  for (long i = 0; i < kN; ++i) {
    EXPECT_EQ(add2.field(adds[i], "b"), 1000 + i);
    EXPECT_EQ(sq2.field(sqs[i], "ret"), i * i);
  }
}

// A library loaded after the definitions gets its probe when it is mapped, before its
// constructor runs; its unloading is reported too.
TEST(AgentLibraries, LibraryLoadedLaterIsProbedBeforeItsCodeRuns) {
  constexpr long kN = 5;
  TestDaemon d;
  Child c;
  Target t;
  ASSERT_TRUE(d.launch({PROBEFS_AGENT_TARGET, "dlopen", PROBEFS_AGENT_LATE_LIB,
                        std::to_string(kN)},
                       &c, &t));
  ASSERT_TRUE(d.setup(&t));
  Event add;
  ASSERT_TRUE(d.define(&t, "p:test/add probefs_target_add a=%di:s64 b=%si:s64", 1, 0, &add));
  ASSERT_EQ(t.link->go().error, 0);

  Event late;
  bool defined = false, unmapped = false;
  while (!unmapped) {
    tracee::LinkEvent ev;
    ASSERT_TRUE(d.next_event(&ev));
    ASSERT_EQ(ev.kind, tracee::LinkEvent::kMapped);
    std::vector<link::Define> defs;
    if (ev.mapped.kind == link::MappedKind::kUnmapped) {
      unmapped = true;
    } else if (!defined) {
      ASSERT_EQ(t.symbols->reload(), 0);
      link::Define dl;
      ASSERT_TRUE(d.prepare(&t, "p:test/late probefs_late_ctor_fn x=%di:s64", 3, 2, &late, &dl));
      EXPECT_NE(dl.module.find("late_ctor"), std::string::npos) << dl.module;
      defs.push_back(dl);
      defined = true;
    }
    const std::vector<tracee::LinkResult> rs = ev.link->answer_mapped(ev.seq, defs);
    ASSERT_EQ(rs.size(), defs.size());
    for (const auto& r : rs) EXPECT_EQ(r.error, 0) << r.message;
  }
  ASSERT_TRUE(c.wait_exit());
  ASSERT_TRUE(c.exited_ok());
  const std::vector<Rec> all = TestDaemon::drain(&t);
  const std::vector<Rec> lates = of_event(all, 3);
  ASSERT_EQ(lates.size(), static_cast<size_t>(kN + 1));
  EXPECT_EQ(late.field(lates[0], "x"), 7);  // from the library's constructor
  for (long i = 0; i < kN; ++i) EXPECT_EQ(late.field(lates[i + 1], "x"), i);
  EXPECT_EQ(of_event(all, 1).size(), 1u);
}

}  // namespace
}  // namespace probefs::agent_test
