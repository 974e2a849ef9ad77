// The /proc/PID reader on real processes (this one, a stopped child, a zombie, children
// with hostile names, a process that does not exist) and its parsers on garbage.
#include "tracee/proc_info.h"

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <future>
#include <string>
#include <thread>

#include <gtest/gtest.h>

namespace probefs::tracee {
namespace {

// A number no process can have: above the kernel's PID_MAX_LIMIT (4 Mi).
constexpr pid_t kNoSuchPid = 0x3fffffff;

// A forked child that names itself `name` (when given), then either exits at once or
// says it is ready and blocks until the parent's end of a pipe closes. Its state is the
// parent's to change; the guard kills and reaps it whatever happened.
class Child {
 public:
  explicit Child(const char* name = nullptr, bool exit_now = false) {
    int ready[2] = {-1, -1};
    int hold[2] = {-1, -1};
    if (pipe2(ready, O_CLOEXEC) != 0 || pipe2(hold, O_CLOEXEC) != 0) return;
    pid_ = fork();
    if (pid_ == 0) {
      // Only async-signal-safe calls: the test process may have threads.
      close(ready[0]);
      close(hold[1]);
      if (name != nullptr) prctl(PR_SET_NAME, name);
      if (exit_now) _exit(0);
      char c = 1;
      if (write(ready[1], &c, 1) != 1) _exit(1);
      while (read(hold[0], &c, 1) < 0 && errno == EINTR) {
      }
      _exit(0);
    }
    close(ready[1]);
    close(hold[0]);
    hold_ = hold[1];
    if (pid_ > 0 && !exit_now) {
      char c = 0;
      ready_ = read(ready[0], &c, 1) == 1;
    }
    close(ready[0]);
  }
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;
  ~Child() {
    if (hold_ >= 0) close(hold_);
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }

  pid_t pid() const { return pid_; }
  bool ready() const { return ready_; }

 private:
  pid_t pid_ = -1;
  int hold_ = -1;
  bool ready_ = false;
};

std::string own_name() {
  char name[17] = {};
  prctl(PR_GET_NAME, name);
  return name;
}

// ---- real processes --------------------------------------------------------------------

TEST(ProcInfo, ThisProcess) {
  ProcStat stat;
  ASSERT_EQ(read_proc_stat(getpid(), 0, &stat), 0);
  EXPECT_EQ(stat.state, 'R');  // it is reading its own file
  EXPECT_EQ(stat.ppid, getppid());
  EXPECT_EQ(stat.comm, own_name());
  EXPECT_GT(stat.start, 0u);
  ProcStat again;
  ASSERT_EQ(read_proc_stat(getpid(), getpid(), &again), 0);  // the main thread's
  EXPECT_EQ(again.start, stat.start);
  EXPECT_EQ(again.ppid, stat.ppid);

  EXPECT_EQ(proc_state(getpid()), 'R');
  EXPECT_TRUE(process_running(getpid()));
  EXPECT_FALSE(process_stopped(getpid()));
  EXPECT_EQ(proc_comm(getpid()), own_name());
  EXPECT_EQ(proc_tgid(getpid()), getpid());

  ProcStatus status;
  ASSERT_EQ(status.read(getpid()), 0);
  uint64_t v = 0;
  ASSERT_TRUE(status.number("Tgid", &v));
  EXPECT_EQ(v, static_cast<uint64_t>(getpid()));
  ASSERT_TRUE(status.number("PPid", &v));
  EXPECT_EQ(v, static_cast<uint64_t>(getppid()));
  ASSERT_TRUE(status.number("Uid", &v, 0));
  EXPECT_EQ(v, getuid());
  ASSERT_TRUE(status.number("Uid", &v, 1));
  EXPECT_EQ(v, geteuid());
  ASSERT_TRUE(status.number("Gid", &v, 0));
  EXPECT_EQ(v, getgid());
  EXPECT_TRUE(status.number("TracerPid", &v));
  EXPECT_TRUE(status.number("CapEff", &v, 0, 16));
  EXPECT_FALSE(status.number("Uid", &v, 4));  // four of them: real, effective, saved, fs
  EXPECT_EQ(status.field("Name"), own_name());

  // The links: the same file as this process's own view of them.
  struct stat mine, theirs;
  const std::string exe = proc_exe(getpid());
  ASSERT_FALSE(exe.empty());
  ASSERT_EQ(::stat("/proc/self/exe", &mine), 0);
  ASSERT_EQ(::stat(exe.c_str(), &theirs), 0);
  EXPECT_EQ(mine.st_ino, theirs.st_ino);
  EXPECT_EQ(mine.st_dev, theirs.st_dev);
  char cwd[PATH_MAX];
  ASSERT_NE(getcwd(cwd, sizeof cwd), nullptr);
  EXPECT_EQ(proc_link(getpid(), 0, "cwd"), cwd);
}

TEST(ProcInfo, AThreadOfThisProcess) {
  // The thread names itself with a forged state after a ')', then waits to be let go.
  std::promise<pid_t> named;
  std::promise<void> go;
  std::thread t([&] {
    pthread_setname_np(pthread_self(), "w) T 1 2 (x");
    named.set_value(gettid());
    go.get_future().wait();
  });
  struct Join {
    std::promise<void>* go;
    std::thread* t;
    ~Join() {
      go->set_value();
      t->join();
    }
  } join{&go, &t};
  const pid_t tid = named.get_future().get();

  EXPECT_EQ(proc_comm(getpid(), tid), "w) T 1 2 (x");
  EXPECT_EQ(proc_tgid(tid), getpid());
  ProcStat stat;
  ASSERT_EQ(read_proc_stat(getpid(), tid, &stat), 0);
  EXPECT_EQ(stat.comm, "w) T 1 2 (x");
  EXPECT_NE(stat.state, 'T');  // the forged one
  EXPECT_NE(stat.state, 0);
  EXPECT_EQ(stat.ppid, getppid());  // a thread's parent is its process's
  EXPECT_NE(proc_state(getpid(), tid), 'T');
  // The process's own name is the main thread's.
  EXPECT_EQ(proc_comm(getpid()), own_name());
}

TEST(ProcInfo, StoppedChildThenContinued) {
  Child child("stopme");
  ASSERT_TRUE(child.ready());
  EXPECT_TRUE(process_running(child.pid()));
  EXPECT_FALSE(process_stopped(child.pid()));

  ASSERT_EQ(kill(child.pid(), SIGSTOP), 0);
  // The kernel marks the child stopped before it reports the stop to its parent.
  int st = 0;
  ASSERT_EQ(waitpid(child.pid(), &st, WUNTRACED), child.pid());
  ASSERT_TRUE(WIFSTOPPED(st));
  EXPECT_EQ(proc_state(child.pid()), 'T');
  EXPECT_TRUE(process_stopped(child.pid()));
  EXPECT_TRUE(process_running(child.pid()));  // stopped is not gone
  ProcStat stat;
  ASSERT_EQ(read_proc_stat(child.pid(), 0, &stat), 0);
  EXPECT_EQ(stat.state, 'T');
  EXPECT_EQ(stat.ppid, getpid());
  EXPECT_EQ(stat.comm, "stopme");

  // SIGCONT wakes it before kill() returns.
  ASSERT_EQ(kill(child.pid(), SIGCONT), 0);
  ASSERT_EQ(waitpid(child.pid(), &st, WCONTINUED), child.pid());
  ASSERT_TRUE(WIFCONTINUED(st));
  EXPECT_FALSE(process_stopped(child.pid()));
  EXPECT_TRUE(process_running(child.pid()));
  const char state = proc_state(child.pid());
  EXPECT_TRUE(state == 'R' || state == 'S') << state;
}

TEST(ProcInfo, Zombie) {
  Child child("zombie", /*exit_now=*/true);
  ASSERT_GT(child.pid(), 0);
  // Waits for the exit, leaving the child unreaped: a zombie until the guard reaps it.
  siginfo_t info{};
  ASSERT_EQ(waitid(P_PID, static_cast<id_t>(child.pid()), &info, WEXITED | WNOWAIT), 0);
  EXPECT_EQ(proc_state(child.pid()), 'Z');
  EXPECT_FALSE(process_running(child.pid()));
  EXPECT_FALSE(process_stopped(child.pid()));
  ProcStat stat;
  ASSERT_EQ(read_proc_stat(child.pid(), 0, &stat), 0);
  EXPECT_EQ(stat.state, 'Z');
  EXPECT_EQ(stat.ppid, getpid());
  EXPECT_EQ(stat.comm, "zombie");
  EXPECT_EQ(proc_tgid(child.pid()), child.pid());
}

// Names a process may give itself to fool a parser that reads its files naively.
TEST(ProcInfo, HostileNames) {
  struct Case {
    const char* name;     // what the child sets (15 bytes at most)
    const char* comm;     // what proc_comm gives: cut at a newline
  };
  const Case cases[] = {
      {"a) b (c", "a) b (c"},
      {"x) Z 1 2 3", "x) Z 1 2 3"},  // a zombie's state, if taken after the first ')'
      {")))(((", ")))((("},
      {"n\nTgid:\t1", "n"},        // a status line, if the kernel did not escape it
      {"s\n1 (y) Z", "s"},          // a stat line of its own after a newline
      {"", ""},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(testing::PrintToString(std::string(c.name)));
    Child child(c.name);
    ASSERT_TRUE(child.ready());
    const pid_t pid = child.pid();

    std::string comm;
    ASSERT_EQ(read_proc_comm(pid, 0, &comm), 0);
    EXPECT_EQ(comm, c.comm);
    EXPECT_EQ(proc_comm(pid), c.comm);
    EXPECT_EQ(proc_comm(pid, pid), c.comm);

    ProcStat stat;
    ASSERT_EQ(read_proc_stat(pid, 0, &stat), 0);
    EXPECT_EQ(stat.comm, c.name);  // raw in stat, newline and all
    EXPECT_TRUE(stat.state == 'R' || stat.state == 'S') << stat.state;
    EXPECT_EQ(stat.ppid, getpid());
    EXPECT_TRUE(process_running(pid));
    EXPECT_FALSE(process_stopped(pid));

    ProcStatus status;
    ASSERT_EQ(status.read(pid), 0);
    uint64_t v = 0;
    ASSERT_TRUE(status.number("Tgid", &v));
    EXPECT_EQ(v, static_cast<uint64_t>(pid));
    ASSERT_TRUE(status.number("PPid", &v));
    EXPECT_EQ(v, static_cast<uint64_t>(getpid()));
    EXPECT_EQ(proc_tgid(pid), pid);
    EXPECT_EQ(status.field("Name").find('\n'), std::string_view::npos);
  }
}

TEST(ProcInfo, NoSuchProcess) {
  for (pid_t pid : {kNoSuchPid, pid_t{0}, pid_t{-1}}) {
    SCOPED_TRACE(pid);
    ProcStat stat;
    const int err = read_proc_stat(pid, 0, &stat);
    EXPECT_TRUE(err == -ENOENT || err == -ESRCH) << err;
    EXPECT_EQ(proc_state(pid), 0);
    EXPECT_FALSE(process_running(pid));
    EXPECT_FALSE(process_stopped(pid));
    std::string comm = "x";
    EXPECT_LT(read_proc_comm(pid, 0, &comm), 0);
    EXPECT_EQ(proc_comm(pid), "");
    EXPECT_EQ(proc_comm(pid, pid), "");
    EXPECT_EQ(proc_tgid(pid), 0);
    EXPECT_EQ(proc_exe(pid), "");
    ProcStatus status;
    EXPECT_LT(status.read(pid), 0);
    uint64_t v = 0;
    EXPECT_FALSE(status.number("Tgid", &v));
  }
  // A thread that is not one of the process's.
  EXPECT_EQ(proc_state(getpid(), kNoSuchPid), 0);
  EXPECT_EQ(proc_comm(getpid(), kNoSuchPid), "");
}

TEST(ProcInfo, ReadsAreBounded) {
  std::string text;
  ASSERT_EQ(read_proc_text("/proc/self/status", &text, 10), 0);
  EXPECT_EQ(text.size(), 10u);
  ASSERT_EQ(read_proc_text("/proc/self/status", &text), 0);
  EXPECT_GT(text.size(), 10u);
  EXPECT_LE(text.size(), kProcTextMax);
  EXPECT_EQ(read_proc_text("/proc/self/no-such-file", &text), -ENOENT);
  EXPECT_TRUE(text.empty());
}

// ---- parsers on text -------------------------------------------------------------------

TEST(ProcInfo, ParsesStatText) {
  ProcStat s;
  ASSERT_TRUE(parse_proc_stat(
      "42 (a) b (c) S 7 42 42 0 -1 4194304 100 0 0 0 1 2 0 0 20 0 1 0 123456 1000 2 3\n", &s));
  EXPECT_EQ(s.comm, "a) b (c");
  EXPECT_EQ(s.state, 'S');
  EXPECT_EQ(s.ppid, 7);
  EXPECT_EQ(s.start, 123456u);
  // Exactly 22 fields, no newline.
  ASSERT_TRUE(parse_proc_stat("1 () t 0 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 9", &s));
  EXPECT_EQ(s.comm, "");
  EXPECT_EQ(s.state, 't');
  EXPECT_EQ(s.ppid, 0);
  EXPECT_EQ(s.start, 9u);
  // A name with a newline and a forged line after it.
  ASSERT_TRUE(parse_proc_stat(
      "5 (n\n5 (m) Z 1 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 1) R 3 5 5 0 -1 0 0 0 0 0 0 0 0 "
      "0 20 0 1 0 77\n",
      &s));
  EXPECT_EQ(s.state, 'R');
  EXPECT_EQ(s.ppid, 3);
  EXPECT_EQ(s.start, 77u);
}

TEST(ProcInfo, RefusesGarbageStat) {
  const std::string tail = " 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 5";  // fields 5 to 22
  const std::string garbage[] = {
      "",
      "(",
      ")",
      ")(",
      "1 )x(",
      "1 (x)",
      "1 (x) ",
      "1 (x)S 1" + tail,
      "1 (x) S",
      "1 (x) S ",
      "1 (x) SS 1" + tail,
      "1 (x) S -3" + tail,
      "1 (x) S 1 1 1",
      "1 (x) S 1x" + tail,
      "1 (x) S 99999999999999999999" + tail,
      "1 (x) S 1 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 5a",
      "1 (x) S 1 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 -5",
      "1 (x) S 1 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 99999999999999999999999",
      std::string("1 (x) S 1\0" "1", 11) + tail,
      std::string(20000, ')'),
      std::string(20000, '(') + ")",
  };
  for (const std::string& g : garbage) {
    SCOPED_TRACE(testing::PrintToString(g.substr(0, 80)));
    ProcStat s;
    EXPECT_FALSE(parse_proc_stat(g, &s));
  }
}

TEST(ProcInfo, StatusFieldsByName) {
  const ProcStatus s(
      "Name:\tx\\ny\n"
      "Tgid:\t12\n"
      "Tgidx:\t99\n"
      "PPid: \t 3\n"
      "Uid:\t1000\t1001\t1002\t1003\n"
      "Gid:\t5\n"
      "Empty:\n"
      "Bad:\t-5\t12a\t99999999999999999999999\n"
      "CapEff:\t000001ffffffffff\n"
      "Tgid:\t13\n"
      "NoColon 7\n"
      "Last:\t8");  // no newline at the end
  uint64_t v = 0;
  EXPECT_EQ(s.field("Name"), "x\\ny");
  ASSERT_TRUE(s.number("Tgid", &v));
  EXPECT_EQ(v, 12u);  // the first line of that name
  ASSERT_TRUE(s.number("Tgidx", &v));
  EXPECT_EQ(v, 99u);
  EXPECT_EQ(s.field("Tgi"), "");
  EXPECT_FALSE(s.number("Tgi", &v));
  ASSERT_TRUE(s.number("PPid", &v));
  EXPECT_EQ(v, 3u);
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(s.number("Uid", &v, i));
    EXPECT_EQ(v, 1000u + static_cast<unsigned>(i));
  }
  EXPECT_FALSE(s.number("Uid", &v, 4));
  EXPECT_FALSE(s.number("Uid", &v, -1));
  EXPECT_FALSE(s.number("Gid", &v, 1));
  EXPECT_EQ(s.field("Empty"), "");
  EXPECT_FALSE(s.number("Empty", &v));
  for (int i = 0; i < 4; ++i) EXPECT_FALSE(s.number("Bad", &v, i)) << i;
  ASSERT_TRUE(s.number("CapEff", &v, 0, 16));
  EXPECT_EQ(v, 0x1ffffffffffu);
  EXPECT_FALSE(s.number("NoColon", &v));
  ASSERT_TRUE(s.number("Last", &v));
  EXPECT_EQ(v, 8u);
  EXPECT_FALSE(s.number("Missing", &v));
  EXPECT_EQ(s.field(""), "");

  const ProcStatus empty;
  EXPECT_EQ(empty.field("Tgid"), "");
  EXPECT_FALSE(empty.number("Tgid", &v));
  const char raw[] = "Tgid:\t1\0" "2\n\0\0PPid:\t4\n";
  const ProcStatus nuls(std::string(raw, sizeof raw - 1));
  EXPECT_FALSE(nuls.number("Tgid", &v));
  EXPECT_FALSE(nuls.number("PPid", &v));  // the line starts with NULs
}

}  // namespace
}  // namespace probefs::tracee
