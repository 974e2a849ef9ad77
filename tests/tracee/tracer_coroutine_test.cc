// ucontext coroutines under return events, through the daemon-side API (tracee/tracer.h):
// coroutine_prog launched with the agent, `r:` events on swapcontext, setcontext and the
// coroutines' body and the function the bodies call and yield from. The coroutines'
// stacks lie above and below the main stack, and returns come back on other stacks than
// the entries before them: the program must answer as it does untraced and exit 0, and
// the records must be exactly the returns it made, with their values.
#include "tracee/tracer.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "events/compile.h"
#include "events/parse.h"
#include "tests/tracee/traced_prog_driver.h"
#include "tests/tracee/tracer_test_util.h"

namespace probefs::tracee {
namespace {

using testing::define;
using testing::Event;
using testing::KillGuard;
using testing::make_tracer;
using testing::ProgPipes;

const std::string kProg = PROBEFS_COROUTINE_PROG;
const std::string kProgName = kProg.substr(kProg.rfind('/') + 1);

constexpr long kCoroutines = 3, kRounds = 6, kRuns = 3;  // as coroutine_prog.c

long step_value(long id, long round) { return id * 1000 + round * 7; }

long body_value(long id) {
  long acc = 0;
  for (long r = 0; r < kRounds + id; ++r) acc += step_value(id, r);
  return acc + id;
}

uint16_t event_id_of(const TraceRecord& r) {
  uint16_t id = 0;
  if (r.len >= 2) std::memcpy(&id, r.data, 2);
  return id;
}

int64_t field(const Event& e, const TraceRecord& r, const std::string& name) {
  for (const auto& f : e.spec.compiled.fields) {
    if (f.name != name) continue;
    int64_t v = 0;
    if (f.offset + f.size <= r.len)
      std::memcpy(&v, r.data + f.offset, std::min<uint32_t>(f.size, 8));
    return v;
  }
  ADD_FAILURE() << "no field " << name;
  return 0;
}

// The answer of coroutine_prog run untraced: "ok SWAPS STEPS TRANSCRIPT".
std::string untraced_answer(const std::string& cmd) {
  ProgPipes pipes;
  EXPECT_TRUE(pipes.ok());
  const pid_t pid = fork();
  if (pid == 0) {
    dup2(pipes.child_stdin(), 0);
    dup2(pipes.child_stdout(), 1);
    execl(kProg.c_str(), kProg.c_str(), nullptr);
    _exit(127);
  }
  KillGuard guard(pid);
  pipes.parent_side();
  EXPECT_EQ(pipes.line(), "ready");
  const std::string answer = pipes.ask(cmd);
  EXPECT_EQ(pipes.ask("quit", 10000), "");
  guard.release();
  int st = -1;
  EXPECT_EQ(waitpid(pid, &st, 0), pid);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << "wait status " << st;
  return answer;
}

// What the steps returned, in the order they returned, from a transcript " ID:ROUND=VALUE".
std::vector<int64_t> step_values(const std::string& answer, long* swaps, long* steps) {
  std::istringstream in(answer);
  std::string ok, item;
  in >> ok >> *swaps >> *steps;
  std::vector<int64_t> values;
  while (in >> item) values.push_back(std::stoll(item.substr(item.find('=') + 1)));
  return values;
}

void coroutines_under_return_events(bool optimized) {
  const std::string cmd = "run " + std::to_string(kRuns);
  const std::string want = untraced_answer(cmd);
  long swaps = 0, steps = 0;
  const std::vector<int64_t> want_steps = step_values(want, &swaps, &steps);
  ASSERT_EQ(static_cast<long>(want_steps.size()), steps) << want;
  ASSERT_EQ(steps, kRuns * (kCoroutines * kRounds + 3));

  auto t = make_tracer();
  ASSERT_NE(t, nullptr);
  ASSERT_EQ(t->set_optimization(optimized), 0);
  Event swap = define(*t, "r:t/swap libc:swapcontext rv=$retval:s64", 10);
  Event set = define(*t, "r:t/set libc:setcontext rv=$retval:s64", 11);
  Event body = define(*t, "r:t/body " + kProgName + ":co_body rv=$retval:s64", 12);
  Event step = define(*t, "r:t/step " + kProgName + ":co_step rv=$retval:s64", 13);

  ProgPipes pipes;
  ASSERT_TRUE(pipes.ok());
  Tracer::LaunchSpec s;
  s.argv = {kProg};
  s.stdin_fd = pipes.child_stdin();
  s.stdout_fd = pipes.child_stdout();
  pid_t pid = 0;
  std::string err;
  ASSERT_EQ(t->launch(s, &pid, &err), 0) << err;
  KillGuard guard(pid);
  pipes.parent_side();
  ASSERT_EQ(pipes.line(), "ready");
  EXPECT_EQ(pipes.ask(cmd), want);

  std::vector<int64_t> swap_rv, set_rv, body_rv, step_rv;
  TraceRecord r;
  while (t->next_record(&r)) {
    switch (event_id_of(r)) {
      case 10: swap_rv.push_back(field(swap, r, "rv")); break;
      case 11: set_rv.push_back(field(set, r, "rv")); break;
      case 12: body_rv.push_back(field(body, r, "rv")); break;
      case 13: step_rv.push_back(field(step, r, "rv")); break;
      default: ADD_FAILURE() << "event " << event_id_of(r);
    }
  }
  // Every swapcontext returns once, with 0; no setcontext returns.
  EXPECT_EQ(static_cast<long>(swap_rv.size()), swaps);
  EXPECT_EQ(std::count(swap_rv.begin(), swap_rv.end(), 0), static_cast<long>(swap_rv.size()));
  EXPECT_TRUE(set_rv.empty());
  // The bodies end in the order of their lengths, each run.
  std::vector<int64_t> want_bodies;
  for (long run = 0; run < kRuns; ++run)
    for (long id = 0; id < kCoroutines; ++id) want_bodies.push_back(body_value(id));
  EXPECT_EQ(body_rv, want_bodies);
  EXPECT_EQ(step_rv, want_steps);
  for (const Event* e : {&swap, &set, &body, &step}) EXPECT_EQ(t->profile(e->id).misses, 0u);

  EXPECT_EQ(pipes.ask("quit", 10000), "");
  int st = -1;
  EXPECT_EQ(t->wait_exit(pid, 10000, &st), 0);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << "wait status " << st;
  guard.release();
}

TEST(TracerCoroutines, ReturnEventsOnSwapcontextAndBodiesInt3) {
  coroutines_under_return_events(false);
}

TEST(TracerCoroutines, ReturnEventsOnSwapcontextAndBodiesOptimized) {
  coroutines_under_return_events(true);
}

}  // namespace
}  // namespace probefs::tracee
