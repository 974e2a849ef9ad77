// A definition on a program rebuilt while it runs, through the Tracer as the filesystem
// drives it: a root daemon probes the code the program runs (map_files reaches the file it
// mapped), and so does any daemon that read the file before the rebuild; a daemon of an
// ordinary user that looks only after it cannot reach the old file and refuses the
// definition with ESTALE and the error_log message, instead of probing addresses of the
// new file.
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <string>

#include "tests/tracee/mapped_files_util.h"
#include "tests/tracee/traced_prog_driver.h"
#include "tests/tracee/tracer_test_util.h"
#include "tracee/tracer.h"

namespace probefs::tracee {
namespace {

using testing::copy_file;
using testing::kNobody;
using testing::KillGuard;
using testing::ProgPipes;
using testing::replace_with;
using testing::run_checker;
using testing::Scratch;

long sum_calls(long n) { return 3 * (n * (n - 1) / 2); }

// In the checker: a tracer of this uid and traced_prog at `prog`, which is rebuilt
// (another program renamed over its path) while it runs: after the tracer launched it
// when `launched`, else before the tracer attaches to it. Then `p:t/add traced_add` is
// defined: placed, and its hits counted in the code the program runs, when `placed`;
// else refused, as the filesystem's write would be.
std::string define_on_rebuilt(const std::string& prog, bool launched, bool placed) {
  std::string fails;
  Tracer::Options o;
  o.agent_path = PROBEFS_AGENT_PATH;
  std::string err;
  auto t = Tracer::create(o, &err);
  MAPPED_CHECK(t != nullptr);
  if (!t) return fails + err + "\n";
  ProgPipes pipes;
  KillGuard guard;
  pid_t pid = 0;
  if (launched) {
    Tracer::LaunchSpec s;
    s.argv = {prog};
    s.stdin_fd = pipes.child_stdin();
    s.stdout_fd = pipes.child_stdout();
    MAPPED_CHECK_EQ(t->launch(s, &pid, &err), 0);
  } else {
    pid = fork();
    if (pid == 0) {
      dup2(pipes.child_stdin(), 0);
      dup2(pipes.child_stdout(), 1);
      execl(prog.c_str(), prog.c_str(), nullptr);
      _exit(127);
    }
  }
  if (pid <= 0) return fails + err + "\n";
  guard.set(pid);
  pipes.parent_side();
  MAPPED_CHECK(pipes.line() == "ready");
  MAPPED_CHECK(replace_with(PROBEFS_TRACER_STUB, prog));
  if (!launched) MAPPED_CHECK_EQ(t->attach(pid, &err), 0);

  int rc = 0;
  events::Diagnostic diag;
  testing::Event e = testing::define(*t, "p:t/add traced_add a=%di", 10, true, &rc, &diag);
  if (placed) {
    MAPPED_CHECK_EQ(rc, 0);
    MAPPED_CHECK(pipes.ask("call 100") == "ok " + std::to_string(sum_calls(100)));
    MAPPED_CHECK_EQ(t->profile(e.id).hits, 100u);
  } else {
    MAPPED_CHECK_EQ(rc, -ESTALE);
    MAPPED_CHECK_EQ(diag.err, ESTALE);
    MAPPED_CHECK(diag.code == events::ErrorCode::kMappedFileGone);
    MAPPED_CHECK(diag.logged());
    MAPPED_CHECK(diag.message() == "The file the target mapped was replaced or deleted");
  }
  return fails;
}

class TracerMappedFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(scratch_.ok());
    prog_ = scratch_.path("traced_prog");
    ASSERT_TRUE(copy_file(PROBEFS_TRACED_PROG, prog_));
    ASSERT_TRUE(scratch_.give_to(kNobody));  // where a user's checker renames a build
  }
  Scratch scratch_;
  std::string prog_;
};

// Root reaches the file the program mapped through map_files, however late it looks.
TEST_F(TracerMappedFiles, RootProbesAProgramRebuiltBeforeItAttachedInTheCodeItRuns) {
  run_checker(0, [&] { return define_on_rebuilt(prog_, false, true); });
}

// A daemon keeps open the files it read as they were mapped: a rebuild after it looked
// changes nothing for it, whoever it runs as.
TEST_F(TracerMappedFiles, AUsersDaemonProbesAProgramRebuiltAfterItWasLaunched) {
  run_checker(kNobody, [&] { return define_on_rebuilt(prog_, true, true); });
}

// A user's daemon that first looks after the rebuild cannot reach the old file: refused.
TEST_F(TracerMappedFiles, AUsersDaemonRefusesAProgramRebuiltBeforeItAttached) {
  run_checker(kNobody, [&] { return define_on_rebuilt(prog_, false, false); });
}

}  // namespace
}  // namespace probefs::tracee
