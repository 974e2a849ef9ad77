// Attach in two steps, end to end through the Tracer: hundreds of attach and detach rounds
// on a program whose threads allocate and load libraries all the time
// (tests/tracee/attach_stress_prog.c), and targets in other namespaces, which attach or are
// refused at once with the reason. Every wait is bounded; every child is killed and reaped
// whatever happens.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "tracee/inject.h"
#include "tracee/tracer.h"
#include "tracer_test_util.h"
#include "traced_prog_driver.h"

namespace probefs::tracee {
namespace {

using testing::make_tracer;
using testing::ProgPipes;

const std::string kProg = PROBEFS_ATTACH_STRESS_PROG;
const std::string kLib = PROBEFS_ATTACH_STRESS_LIB;
const std::string kAgent = PROBEFS_AGENT_PATH;

// What a child does before it runs the program: unshare namespaces, mount.
enum class Setup {
  kNone,
  kNetNamespace,
  kMountNamespaceCopy,
  kMountNamespaceOwnRun,   // its own /run and /tmp: not the daemon's link endpoints
  kMountNamespaceNoAgent,  // its own directory where the daemon's agent is
  kPidNamespace,
};

// Runs attach_stress_prog in a child after `setup`. The child reports on a pipe "ok" or
// "skip REASON" (its setup needs rights we lack); for kPidNamespace it forks the program
// as the namespace's first process and reports "ok PID" (the program's pid in ours).
struct Child {
  ProgPipes pipes;
  pid_t pid = 0;        // the program
  pid_t setup_pid = 0;  // kPidNamespace: our child, the program's parent
  std::string skip;

  // Killed and reaped whatever the test did (the program of kPidNamespace, the first of
  // its namespace, takes the namespace with it; its parent, our child, then ends).
  ~Child() {
    if (pid > 0) kill(pid, SIGKILL);
    const pid_t ours = setup_pid > 0 ? setup_pid : pid;
    if (ours > 0) {
      kill(ours, SIGKILL);
      int st;
      waitpid(ours, &st, 0);
    }
  }

  // False with `skip` set when the setup needs rights this test lacks.
  bool start(Setup setup) {
    int report[2];
    if (!pipes.ok() || pipe2(report, O_CLOEXEC) != 0) return false;
    const pid_t child = fork();
    if (child < 0) return false;
    if (child == 0) {
      close(report[0]);
      auto say = [&](const std::string& s) { (void)!write(report[1], s.data(), s.size()); };
      auto need = [&](bool ok, const char* what) {
        if (ok) return;
        say(std::string("skip ") + what + ": " + strerror(errno) + "\n");
        _exit(0);
      };
      switch (setup) {
        case Setup::kNone:
          break;
        case Setup::kNetNamespace:
          need(unshare(CLONE_NEWNET) == 0, "unshare(CLONE_NEWNET)");
          break;
        case Setup::kMountNamespaceCopy:
        case Setup::kMountNamespaceOwnRun:
        case Setup::kMountNamespaceNoAgent:
          need(unshare(CLONE_NEWNS) == 0, "unshare(CLONE_NEWNS)");
          need(mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) == 0,
               "mount(MS_PRIVATE)");
          if (setup == Setup::kMountNamespaceNoAgent) {
            const std::string dir = kAgent.substr(0, kAgent.rfind('/'));
            need(mount("tmpfs", dir.c_str(), "tmpfs", 0, nullptr) == 0, "mount(tmpfs, agent)");
          }
          if (setup == Setup::kMountNamespaceOwnRun) {
            // Where the daemon's link endpoints live: the container's own, empty.
            need(mount("tmpfs", "/run", "tmpfs", 0, nullptr) == 0, "mount(tmpfs, /run)");
            // /tmp too (the endpoints' place where /run is not usable), unless the program
            // to run lives there (a build tree under /tmp): it could not be started.
            auto under_tmp = [](const std::string& p) { return p.rfind("/tmp/", 0) == 0; };
            if (!under_tmp(kProg) && !under_tmp(kLib))
              need(mount("tmpfs", "/tmp", "tmpfs", 0, nullptr) == 0, "mount(tmpfs, /tmp)");
            const char* xdg = getenv("XDG_RUNTIME_DIR");
            if (xdg != nullptr && xdg[0] == '/') (void)mount("tmpfs", xdg, "tmpfs", 0, nullptr);
          }
          break;
        case Setup::kPidNamespace: {
          need(unshare(CLONE_NEWPID) == 0, "unshare(CLONE_NEWPID)");
          const pid_t init = fork();
          if (init < 0) _exit(1);
          if (init > 0) {
            say("ok " + std::to_string(init) + "\n");
            int st = 0;
            waitpid(init, &st, 0);
            _exit(WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st));
          }
          break;
        }
      }
      if (setup != Setup::kPidNamespace) say("ok\n");
      dup2(pipes.child_stdin(), 0);
      dup2(pipes.child_stdout(), 1);
      execl(kProg.c_str(), kProg.c_str(), kLib.c_str(), nullptr);
      _exit(127);
    }
    close(report[1]);
    pipes.parent_side();
    (setup == Setup::kPidNamespace ? setup_pid : pid) = child;
    std::string line = read_report(report[0]);
    if (setup == Setup::kPidNamespace && line.rfind("ok ", 0) == 0) {
      pid = static_cast<pid_t>(std::stol(line.substr(3)));
      line = "ok";
    }
    close(report[0]);
    if (line.rfind("skip ", 0) == 0) {
      skip = line.substr(5);
      return false;
    }
    return line == "ok" && pipes.line() == "ready";
  }

  static std::string read_report(int fd) {
    std::string line;
    pollfd p{fd, POLLIN, 0};
    char c;
    while (poll(&p, 1, 30000) == 1 && read(fd, &c, 1) == 1 && c != '\n') line.push_back(c);
    return line;
  }

  // "quit": the program stops its workers and exits 0 after checking them all.
  void expect_quits_cleanly() {
    const std::string done = pipes.ask("quit");
    unsigned long long alloc_rounds = 0, load_rounds = 0;
    EXPECT_EQ(std::sscanf(done.c_str(), "done %llu %llu", &alloc_rounds, &load_rounds), 2)
        << done;
    EXPECT_GT(alloc_rounds, 0u);
    EXPECT_GT(load_rounds, 0u);
    // Our child: the program, or its parent, which exits with its status.
    const pid_t ours = setup_pid > 0 ? setup_pid : pid;
    ASSERT_TRUE(testing::wait_gone(ours, 30000));
    int st = -1;
    ASSERT_EQ(waitpid(ours, &st, 0), ours);
    EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << "wait status " << st;
    pid = 0;
    setup_pid = 0;
  }
};

size_t thread_count(pid_t pid) {
  size_t n = 0;
  for (const auto& e : std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/task")) {
    (void)e;
    ++n;
  }
  return n;
}

// The program's threads never stop allocating, freeing, loading and unloading: most of
// the time each is inside malloc or the dynamic loader. Every attach must find a thread
// where one may start a thread, load the agent from ours, link and detach; the program
// must run on, every result right.
TEST(AttachStress, HundredsOfAttachDetachRoundsOnAnAllocatingLoadingProgram) {
  auto t = make_tracer();
  ASSERT_NE(t, nullptr);
  Child c;
  ASSERT_TRUE(c.start(Setup::kNone));
  const size_t threads_before = thread_count(c.pid);
  constexpr int kRounds = 200;
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < kRounds; ++i) {
    std::string err;
    ASSERT_EQ(t->attach(c.pid, &err), 0) << "round " << i << ": " << err;
    ASSERT_EQ(t->detach(c.pid), 0) << "round " << i;
    if (i % 50 == 49) {
      ASSERT_EQ(c.pipes.ask("progress"), "progress ok") << "round " << i;
    }
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("%d attach and detach rounds in %.1f s (%.1f ms a round)\n", kRounds, seconds,
              seconds * 1000 / kRounds);
  // None of our loading threads is left; the agent's control thread may still be ending.
  EXPECT_LE(thread_count(c.pid), threads_before + 1);
  ASSERT_EQ(c.pipes.ask("progress"), "progress ok");
  c.expect_quits_cleanly();
}

// A program started in `setup` is attached, detached, and goes on unharmed.
void expect_attached(Setup setup) {
  auto t = make_tracer();
  ASSERT_NE(t, nullptr);
  Child c;
  if (!c.start(setup) && !c.skip.empty()) GTEST_SKIP() << c.skip;
  ASSERT_GT(c.pid, 0);
  std::string err;
  ASSERT_EQ(t->attach(c.pid, &err), 0) << err;
  ASSERT_EQ(t->detach(c.pid), 0);
  ASSERT_EQ(c.pipes.ask("progress"), "progress ok");
  c.expect_quits_cleanly();
}

// A socket file works across network namespaces.
TEST(AttachNamespaces, ProgramInAnotherNetworkNamespaceIsAttached) {
  expect_attached(Setup::kNetNamespace);
}

// A mount namespace that still shows the daemon's files (a private copy) works.
TEST(AttachNamespaces, ProgramInACopyOfTheMountNamespaceIsAttached) {
  expect_attached(Setup::kMountNamespaceCopy);
}

// A container with its own /run and /tmp cannot reach the daemon's link: refused before
// the process is touched, and the message names the mount namespace.
TEST(AttachNamespaces, ProgramThatCannotReachTheLinkIsRefusedAtOnce) {
  auto t = make_tracer();
  ASSERT_NE(t, nullptr);
  Child c;
  if (!c.start(Setup::kMountNamespaceOwnRun) && !c.skip.empty()) GTEST_SKIP() << c.skip;
  ASSERT_GT(c.pid, 0);
  std::string err;
  EXPECT_EQ(t->attach(c.pid, &err), -EOPNOTSUPP) << err;
  EXPECT_NE(err.find("another mount namespace"), std::string::npos) << err;
  EXPECT_NE(err.find("link endpoint"), std::string::npos) << err;
  EXPECT_TRUE(t->targets().empty());
  // Never traced: no thread of ours came, and the program runs on.
  ASSERT_EQ(c.pipes.ask("progress"), "progress ok");
  c.expect_quits_cleanly();
}

// Where the daemon's agent file is not the process's, it could not load it.
TEST(AttachNamespaces, ProgramThatCannotSeeTheAgentIsRefusedAtOnce) {
  auto t = make_tracer();
  ASSERT_NE(t, nullptr);
  Child c;
  if (!c.start(Setup::kMountNamespaceNoAgent) && !c.skip.empty()) GTEST_SKIP() << c.skip;
  ASSERT_GT(c.pid, 0);
  std::string err;
  EXPECT_EQ(t->attach(c.pid, &err), -EOPNOTSUPP) << err;
  EXPECT_NE(err.find("another mount namespace"), std::string::npos) << err;
  EXPECT_NE(err.find(kAgent + " does not exist"), std::string::npos) << err;
  ASSERT_EQ(c.pipes.ask("progress"), "progress ok");
  c.expect_quits_cleanly();
}

// An abstract socket name lives in one network namespace, unlike a socket file.
TEST(AttachNamespaces, AbstractLinkNameInAnotherNetworkNamespaceIsRefused) {
  Child c;
  if (!c.start(Setup::kNetNamespace) && !c.skip.empty()) GTEST_SKIP() << c.skip;
  ASSERT_GT(c.pid, 0);
  const std::string abstract = "probefs.1.0123456789abcdef0123456789abcdef";
  PtraceError error;
  EXPECT_EQ(check_namespaces(c.pid, kAgent, abstract, &error), -EOPNOTSUPP);
  EXPECT_NE(error.message.find("another network namespace"), std::string::npos)
      << error.message;
  // In ours the same name would do.
  EXPECT_EQ(check_namespaces(getpid(), kAgent, abstract, &error), 0) << error.message;
  ASSERT_EQ(c.pipes.ask("progress"), "progress ok");
  c.expect_quits_cleanly();
}

TEST(AttachNamespaces, ProgramInAnotherPidNamespaceIsRefusedAtOnce) {
  auto t = make_tracer();
  ASSERT_NE(t, nullptr);
  Child c;
  if (!c.start(Setup::kPidNamespace) && !c.skip.empty()) GTEST_SKIP() << c.skip;
  ASSERT_GT(c.pid, 0);
  std::string err;
  EXPECT_EQ(t->attach(c.pid, &err), -EOPNOTSUPP) << err;
  EXPECT_NE(err.find("another PID namespace"), std::string::npos) << err;
  EXPECT_TRUE(t->targets().empty());
  ASSERT_EQ(c.pipes.ask("progress"), "progress ok");
  c.expect_quits_cleanly();
}

}  // namespace
}  // namespace probefs::tracee
