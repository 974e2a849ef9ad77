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

}  // namespace
}  // namespace probefs::agent_test
