// probefs run: unmodified tracefs clients on a real mount, both ways it shows them the
// mount (a private mount namespace as root; the preloaded library with --shim): trace-cmd
// list, stat and reset, a libtracefs program of ours (tracefs_client.c: the events, and
// the per-CPU raw buffers), the command's exit status, and the one-line errors. The
// host's mount table must be as it was, and its /sys/kernel/tracing still the kernel's.
// trace-cmd's recordings on a mount are trace_cmd_test.cc's.
#include <gtest/gtest.h>
#include <limits.h>
#include <stdlib.h>

#include <algorithm>
#include <ostream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "tests/fs/mount_fixture.h"
#include "tests/fs/tracefs_clients.h"

namespace probefs::fs {
namespace {

using testing::can_unshare_mounts;
using testing::CommandResult;
using testing::fs_type;
using testing::host_tracing_mounts;
using testing::kTracingDir;
using testing::lines_of;
using testing::Mount;
using testing::run_command;

enum class Way { kNamespace, kShim };

std::string way_name(const ::testing::TestParamInfo<Way>& info) {
  return info.param == Way::kNamespace ? "Namespace" : "Shim";
}

void PrintTo(Way way, std::ostream* os) { *os << (way == Way::kNamespace ? "namespace" : "shim"); }

// A mount with two events defined, and the host's mounts to compare with at the end.
class RunCommandBase : public ::testing::Test {
 protected:
  void start(Way way) {
    way_ = way;
    if (way == Way::kNamespace && !can_unshare_mounts())
      GTEST_SKIP() << "cannot make a mount namespace here (not root, or refused)";
    host_mounts_ = host_tracing_mounts();
    host_tracing_type_ = fs_type(kTracingDir);
    host_taken_ = true;
    ASSERT_TRUE(m_.ok()) << m_.daemon_stderr();
    char real[PATH_MAX];
    ASSERT_TRUE(realpath(m_.dir().c_str(), real));
    real_dir_ = real;
    ASSERT_EQ(m_.write("kprobe_events", "p:runtest/hit traced_prog:main\n"), 0);
    ASSERT_EQ(m_.write("kprobe_events", "r:runtest/done traced_prog:main\n"), 0);
  }

  void TearDown() override {
    if (!host_taken_) return;  // skipped before
    // The namespace was private: nothing of it is left on the host.
    EXPECT_EQ(host_tracing_mounts(), host_mounts_);
    EXPECT_EQ(fs_type(kTracingDir), host_tracing_type_);
  }

  // probefs run [--shim] MOUNT -- CMD...
  CommandResult run(const std::vector<std::string>& cmd) {
    std::vector<std::string> argv = {PROBEFS_BIN, "run"};
    if (way_ == Way::kShim) argv.push_back("--shim");
    argv.push_back(m_.dir());
    argv.push_back("--");
    argv.insert(argv.end(), cmd.begin(), cmd.end());
    return run_command(argv, 30000);
  }

  // Where libtracefs must find the mount: its own path, or the kernel's in the namespace.
  std::string expected_dir() const {
    return way_ == Way::kNamespace ? kTracingDir : real_dir_;
  }

  Way way_ = Way::kNamespace;
  Mount m_;
  std::string real_dir_;
  std::vector<std::string> host_mounts_;
  long host_tracing_type_ = -1;
  bool host_taken_ = false;
};

class RunCommandTest : public RunCommandBase, public ::testing::WithParamInterface<Way> {
 protected:
  void SetUp() override { start(GetParam()); }
};

class RunCommandNamespace : public RunCommandBase {
 protected:
  void SetUp() override { start(Way::kNamespace); }
};

class RunCommandShim : public RunCommandBase {
 protected:
  void SetUp() override { start(Way::kShim); }
};

INSTANTIATE_TEST_SUITE_P(Ways, RunCommandTest, ::testing::Values(Way::kNamespace, Way::kShim),
                         way_name);

TEST_P(RunCommandTest, TraceCmdListsTheMountsEventsAndNoneOfTheKernels) {
  SKIP_WITHOUT_TRACE_CMD();
  CommandResult r = run({"trace-cmd", "list", "-e"});
  ASSERT_EQ(r.exit_code(), 0) << r.err;
  EXPECT_EQ(r.err, "");
  std::set<std::string> listed = lines_of(r.out);
  EXPECT_EQ(listed, lines_of(m_.read("available_events")));
  EXPECT_TRUE(listed.count("runtest:hit")) << r.out;
}

TEST_P(RunCommandTest, TraceCmdStatReadsTheMount) {
  SKIP_WITHOUT_TRACE_CMD();
  CommandResult r = run({"trace-cmd", "stat"});
  EXPECT_EQ(r.exit_code(), 0) << r.err;
  EXPECT_NE(r.out.find("p:runtest/hit traced_prog:main"), std::string::npos) << r.out;
}

TEST_P(RunCommandTest, TraceCmdResetRemovesTheMountsDynamicEvents) {
  SKIP_WITHOUT_TRACE_CMD();
  // First that trace-cmd sees the mount: a reset of the kernel's tracefs must not happen.
  CommandResult r = run({"trace-cmd", "list", "-e"});
  ASSERT_EQ(lines_of(r.out), lines_of(m_.read("available_events"))) << r.err;
  r = run({"trace-cmd", "reset"});
  EXPECT_EQ(r.exit_code(), 0) << r.err;
  EXPECT_EQ(m_.read("kprobe_events"), "");
  EXPECT_EQ(m_.read("dynamic_events"), "");
  EXPECT_EQ(m_.read("available_events").find("runtest:"), std::string::npos);
}

TEST_P(RunCommandTest, LibtracefsProgramListsTheMountsEvents) {
  CommandResult r = run({PROBEFS_TRACEFS_CLIENT});
  ASSERT_EQ(r.exit_code(), 0) << r.err;
  std::set<std::string> lines = lines_of(r.out);
  EXPECT_EQ(lines.erase("dir " + expected_dir()), 1u) << r.out;
  EXPECT_EQ(lines, lines_of(m_.read("available_events")));
  EXPECT_TRUE(lines.count("runtest:done")) << r.out;
}

// tracefs_iterate_raw_events() over every CPU's trace_pipe_raw: each call once, oldest
// first, its argument read through the event's format; the records are consumed.
TEST_P(RunCommandTest, LibtracefsProgramIteratesTheRawBuffersOfEveryCpu) {
  ASSERT_EQ(m_.write("kprobe_events", "p:runtest/add traced_prog:traced_add a=%di b=%si\n"), 0);
  ASSERT_EQ(m_.write("events/runtest/add/enable", "1"), 0);
  CommandResult prog = run_command({PROBEFS_BIN, "exec", m_.dir(), "--", PROBEFS_TRACED_PROG},
                                   60000, "call 20\n");
  ASSERT_EQ(prog.exit_code(), 0) << prog.err;
  ASSERT_EQ(prog.out, "ready\nok 570\n");

  CommandResult r = run({PROBEFS_TRACEFS_CLIENT, "raw", "a"});
  ASSERT_EQ(r.exit_code(), 0) << r.err;
  EXPECT_EQ(r.err, "");
  const long cpus = sysconf(_SC_NPROCESSORS_CONF);
  std::vector<std::string> values;
  std::istringstream out(r.out);
  for (std::string line; std::getline(out, line);) {
    std::istringstream f(line);
    std::string name, value;
    long cpu = -1;
    f >> name >> cpu >> value;
    EXPECT_EQ(name, "runtest:add") << line;
    EXPECT_TRUE(cpu >= 0 && cpu < cpus) << line;
    values.push_back(value);
  }
  std::vector<std::string> want;
  for (int i = 0; i < 20; ++i) want.push_back("a=" + std::to_string(i));
  EXPECT_EQ(values, want) << r.out;

  r = run({PROBEFS_TRACEFS_CLIENT, "raw", "a"});
  EXPECT_EQ(r.exit_code(), 0) << r.err;
  EXPECT_EQ(r.out, "");
}

TEST_P(RunCommandTest, ExitStatusIsTheCommands) {
  CommandResult r = run({"sh", "-c", "exit 7"});
  EXPECT_EQ(r.exit_code(), 7) << r.err;
  r = run({"sh", "-c", "kill -TERM $$"});
  EXPECT_TRUE(r.status >= 0 && WIFSIGNALED(r.status) && WTERMSIG(r.status) == SIGTERM)
      << r.status;
  r = run({"/nonexistent/prog"});
  EXPECT_EQ(r.exit_code(), 127);
  EXPECT_EQ(r.err, "probefs: /nonexistent/prog: No such file or directory\n");
}

// libtracefs (and perf) take the first tracefs of /proc/mounts: one mounted before
// /sys/kernel/tracing must not be seen. Set up in a namespace of the test's own.
TEST_F(RunCommandNamespace, TracefsMountedEarlierIsTakenAway) {
  char tmpl[] = "/tmp/probefs-tracefs-XXXXXX";
  ASSERT_TRUE(mkdtemp(tmpl));
  const std::string early = tmpl;
  const std::string script =
      "set -e; mount -t tracefs nodev \"$1\"; umount -l /sys/kernel/tracing || true;"
      "mount -t tracefs nodev /sys/kernel/tracing;"
      "awk '$3 == \"tracefs\" { print \"before \" $2 }' /proc/self/mounts;"
      "\"$2\" run \"$3\" -- awk '$3 == \"tracefs\" { print \"in run \" $2 }' /proc/self/mounts;"
      "exec \"$2\" run \"$3\" -- \"$4\"";
  CommandResult r = run_command({"unshare", "-m", "--propagation", "private", "bash", "-c",
                                 script, "bash", early, PROBEFS_BIN, m_.dir(),
                                 PROBEFS_TRACEFS_CLIENT},
                                30000);
  rmdir(early.c_str());
  ASSERT_EQ(r.exit_code(), 0) << r.err;
  std::vector<std::string> before, in_run;
  std::set<std::string> client;
  std::istringstream out(r.out);
  for (std::string line; std::getline(out, line);) {
    if (line.rfind("before ", 0) == 0)
      before.push_back(line.substr(7));
    else if (line.rfind("in run ", 0) == 0)
      in_run.push_back(line.substr(7));
    else
      client.insert(line);
  }
  // The setup worked: the early tracefs came first.
  auto at = [&](const std::string& p) { return std::find(before.begin(), before.end(), p); };
  ASSERT_NE(at(early), before.end()) << r.out;
  ASSERT_LT(at(early), at(kTracingDir)) << r.out;
  EXPECT_EQ(in_run, std::vector<std::string>{kTracingDir}) << r.out;
  EXPECT_EQ(client.erase("dir " + std::string(kTracingDir)), 1u) << r.out;
  EXPECT_EQ(client, lines_of(m_.read("available_events")));
}

// Where unshare is refused (no CAP_SYS_ADMIN) the preload is taken without being asked for.
TEST_F(RunCommandShim, WithoutCapSysAdminThePreloadIsTaken) {
  std::vector<std::string> argv;
  if (geteuid() == 0) argv = {"setpriv", "--bounding-set=-sys_admin", "--inh-caps=-sys_admin"};
  for (const char* a : {PROBEFS_BIN, "run", m_.dir().c_str(), "--", PROBEFS_TRACEFS_CLIENT})
    argv.push_back(a);
  CommandResult r = run_command(argv, 30000);
  ASSERT_EQ(r.exit_code(), 0) << r.err;
  EXPECT_EQ(r.err, "");
  std::set<std::string> lines = lines_of(r.out);
  EXPECT_EQ(lines.erase("dir " + real_dir_), 1u) << r.out;
  EXPECT_EQ(lines, lines_of(m_.read("available_events")));
}

TEST(RunCommand, OneLineErrorsExitTwo) {
  CommandResult r = run_command({PROBEFS_BIN, "run", "/tmp", "--", "true"});
  EXPECT_EQ(r.exit_code(), 2);
  EXPECT_EQ(r.err, "probefs: /tmp: not a probefs mount\n");
  r = run_command({PROBEFS_BIN, "run", "--shim", "/tmp", "true"});
  EXPECT_EQ(r.exit_code(), 2);
  EXPECT_EQ(r.err, "probefs: /tmp: not a probefs mount\n");
  r = run_command({PROBEFS_BIN, "run", "/nonexistent/dir", "true"});
  EXPECT_EQ(r.exit_code(), 2);
  EXPECT_EQ(r.err, "probefs: /nonexistent/dir: No such file or directory\n");
  r = run_command({PROBEFS_BIN, "run", "/tmp"});
  EXPECT_EQ(r.exit_code(), 2);
  EXPECT_EQ(r.err, "probefs: usage: probefs run [--shim] MOUNTPOINT [--] CMD [ARGS...]\n");
  r = run_command({PROBEFS_BIN, "run", "--trace", "/tmp", "true"});
  EXPECT_EQ(r.exit_code(), 2);
  EXPECT_EQ(r.err, "probefs: run: unknown option --trace\n");
  r = run_command({PROBEFS_BIN, "--help"});
  EXPECT_NE(r.out.find("probefs run [--shim] MOUNTPOINT"), std::string::npos);
}

}  // namespace
}  // namespace probefs::fs
