// KernelShark on a recording of a mount: `trace-cmd record` under `probefs run` writes a
// trace.dat of a traced program's events, and KernelShark must take it as it takes a
// recording of the kernel's. Its library (kshark_count.c) must load every event as the
// program's, with its arguments; KernelShark itself must open the file and draw it on an
// X server of the test's own (Xvfb), seen in a screenshot (xwd, read through xwdtopnm).
//
// With PROBEFS_KERNELSHARK_SCREENSHOT=FILE.png in the environment, the GUI test also keeps
// its screenshot there (the README's picture).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "tests/fs/mount_fixture.h"
#include "tests/fs/tracefs_clients.h"

extern char** environ;

namespace probefs::fs {
namespace {

using testing::Clock;
using testing::CommandResult;
using testing::Mount;
using testing::ms_left;
using testing::on_path;
using testing::run_command;
using testing::TempDir;

constexpr int kCalls = 40;
// Tall enough for KernelShark's table to show every one of the kCalls rows under its graph.
constexpr int kScreenWidth = 1280;
constexpr int kScreenHeight = 1200;


std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}


// A program that runs beside the test (an X server, KernelShark): in a process group of its
// own, stdin /dev/null, stdout and stderr to a file. Ended, with all its group, when it goes
// out of scope.
class Background {
 public:
  Background() = default;
  Background(const Background&) = delete;
  Background& operator=(const Background&) = delete;
  ~Background() { stop(5000); }

  // argv[0] is looked up on PATH; `env` entries ("NAME=VALUE") replace or add to the test's
  // environment; `fd3`, when not -1, is the program's descriptor 3.
  bool start(const std::vector<std::string>& argv, const std::vector<std::string>& env,
             const std::string& log, int fd3 = -1) {
    std::vector<std::string> envs = env;
    for (char** e = environ; *e; ++e) {
      std::string s = *e;
      std::string name = s.substr(0, s.find('='));
      bool replaced = std::any_of(env.begin(), env.end(), [&](const std::string& o) {
        return o.compare(0, name.size() + 1, name + "=") == 0;
      });
      if (!replaced) envs.push_back(s);
    }
    std::vector<char*> a, ev;
    for (const std::string& s : argv) a.push_back(const_cast<char*>(s.c_str()));
    a.push_back(nullptr);
    for (const std::string& s : envs) ev.push_back(const_cast<char*>(s.c_str()));
    ev.push_back(nullptr);
    pid_ = fork();
    if (pid_ == 0) {
      setpgid(0, 0);
      int in = open("/dev/null", O_RDONLY | O_CLOEXEC);
      int out = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
      if (in < 0 || out < 0) _exit(126);
      dup2(in, 0);
      dup2(out, 1);
      dup2(out, 2);
      if (fd3 == 3)
        fcntl(3, F_SETFD, 0);
      else if (fd3 >= 0)
        dup2(fd3, 3);
      execvpe(a[0], a.data(), ev.data());
      _exit(127);
    }
    if (pid_ < 0) return false;
    setpgid(pid_, pid_);  // also here: no signal may miss the group for a race
    pidfd_ = static_cast<int>(syscall(SYS_pidfd_open, pid_, 0));
    return pidfd_ >= 0;
  }

  // Whether it still runs (it is not reaped here, so its group stays its own).
  bool running() {
    if (pid_ <= 0) return false;
    siginfo_t info{};
    return waitid(P_PID, static_cast<id_t>(pid_), &info, WEXITED | WNOHANG | WNOWAIT) == 0 &&
           info.si_pid == 0;
  }

  // Waits at most `ms` for it to end, waking as soon as it does.
  void wait_for_exit(int ms) {
    if (pidfd_ < 0) return;
    pollfd p{pidfd_, POLLIN, 0};
    poll(&p, 1, ms);
  }

  // SIGTERM to the group, at most `timeout_ms` for the program to end, then SIGKILL to
  // whatever of the group is left. Its wait status.
  int stop(int timeout_ms) {
    if (pid_ <= 0) return status_;
    kill(-pid_, SIGTERM);
    wait_for_exit(timeout_ms);
    kill(-pid_, SIGKILL);
    waitpid(pid_, &status_, 0);
    close(pidfd_);
    pid_ = -1;
    pidfd_ = -1;
    return status_;
  }

 private:
  pid_t pid_ = -1;
  int pidfd_ = -1;
  int status_ = -1;
};

// An image as xwdtopnm writes it (binary PPM, P6).
struct Image {
  int width = 0, height = 0;
  std::string rgb;  // 3 bytes a pixel
};

bool parse_ppm(const std::string& data, Image* img) {
  size_t at = 0;
  auto token = [&]() -> std::string {
    for (;;) {
      while (at < data.size() && isspace(static_cast<unsigned char>(data[at]))) ++at;
      if (at < data.size() && data[at] == '#') {
        while (at < data.size() && data[at] != '\n') ++at;
        continue;
      }
      break;
    }
    size_t from = at;
    while (at < data.size() && !isspace(static_cast<unsigned char>(data[at]))) ++at;
    return data.substr(from, at - from);
  };
  if (token() != "P6") return false;
  img->width = atoi(token().c_str());
  img->height = atoi(token().c_str());
  if (token() != "255" || img->width <= 0 || img->height <= 0) return false;
  ++at;  // the one whitespace byte before the pixels
  size_t size = static_cast<size_t>(img->width) * static_cast<size_t>(img->height) * 3;
  if (data.size() - std::min(at, data.size()) < size) return false;
  img->rgb = data.substr(at, size);
  return true;
}

// What a screenshot holds: how many colours, and the share of the commonest. A display
// nobody drew on is one colour; a window not painted yet is one colour over most of it.
struct Colours {
  size_t distinct = 0;
  double commonest_share = 1.0;
};

Colours colours_of(const Image& img) {
  std::map<uint32_t, size_t> count;
  for (size_t i = 0; i + 2 < img.rgb.size(); i += 3) {
    uint32_t c = static_cast<uint32_t>(static_cast<unsigned char>(img.rgb[i])) << 16 |
                 static_cast<uint32_t>(static_cast<unsigned char>(img.rgb[i + 1])) << 8 |
                 static_cast<unsigned char>(img.rgb[i + 2]);
    ++count[c];
  }
  Colours c;
  c.distinct = count.size();
  size_t most = 0;
  for (auto& [colour, n] : count) most = std::max(most, n);
  if (!img.rgb.empty()) c.commonest_share = static_cast<double>(most) / (img.rgb.size() / 3);
  return c;
}

bool looks_drawn(const Colours& c) { return c.distinct >= 16 && c.commonest_share < 0.9; }

class KernelSharkTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!on_path("trace-cmd")) GTEST_SKIP() << "no trace-cmd on PATH (the trace-cmd package)";
    ASSERT_TRUE(m_.ok()) << m_.daemon_stderr();
    ASSERT_TRUE(dir_.ok());
    file_ = dir_.file("trace.dat");
  }

  // trace-cmd records traced_prog's kCalls calls of traced_add through the mount; the
  // program says its pid first.
  void record() {
    ASSERT_EQ(m_.write("kprobe_events", "p:ks/add traced_prog:traced_add a=%di b=%si\n"), 0)
        << m_.read("error_log");
    CommandResult r =
        run_command({PROBEFS_BIN, "run", m_.dir(), "--", "trace-cmd", "record", "-d", "-e", "ks",
                     "-o", file_, PROBEFS_BIN, "exec", m_.dir(), "--", PROBEFS_TRACED_PROG},
                    120000, "pid\ncall " + std::to_string(kCalls) + "\n");
    ASSERT_EQ(r.exit_code(), 0) << r.status << "\n" << r.out << r.err;
    std::vector<long> answers;
    std::istringstream out(r.out);
    for (std::string line; std::getline(out, line);)
      if (line.rfind("ok ", 0) == 0) answers.push_back(atol(line.c_str() + 3));
    ASSERT_EQ(answers.size(), 2u) << r.out;
    pid_ = static_cast<pid_t>(answers[0]);
    ASSERT_EQ(answers[1], 3L * kCalls * (kCalls - 1) / 2) << r.out;
    struct stat st;
    ASSERT_EQ(stat(file_.c_str(), &st), 0) << r.out << r.err;
  }

  Mount m_;
  TempDir dir_;
  std::string file_;
  pid_t pid_ = -1;
};

TEST_F(KernelSharkTest, LibksharkLoadsEveryEventAsTheProgramsWithItsArguments) {
  ASSERT_NO_FATAL_FAILURE(record());
  CommandResult r = run_command({PROBEFS_KSHARK_COUNT, file_}, 60000);
  ASSERT_EQ(r.exit_code(), 0) << r.err
                              << "(kshark_count is built where pkg-config finds libkshark: "
                                 "Debian's libkshark-dev)";
  // "ks/add PID (ADDR) a=0xI b=0x2I", one line an entry, then "count N".
  std::set<long> calls;
  int adds = 0, entries = 0, unnamed = 0;
  long count = -1;
  std::istringstream out(r.out);
  for (std::string line; std::getline(out, line);) {
    if (line.rfind("count ", 0) == 0) {
      count = atol(line.c_str() + 6);
      continue;
    }
    ++entries;
    if (line.rfind("<id ", 0) == 0) ++unnamed;
    char event[64] = "";
    int pid = -1;
    if (sscanf(line.c_str(), "%63s %d", event, &pid) != 2 || std::string(event) != "ks/add")
      continue;
    EXPECT_EQ(pid, pid_) << line;
    size_t args = line.rfind(" a=0x");
    long a = -1, b = -1;
    ASSERT_NE(args, std::string::npos) << line;
    ASSERT_EQ(sscanf(line.c_str() + args, " a=0x%lx b=0x%lx", &a, &b), 2) << line;
    EXPECT_EQ(b, 2 * a) << line;
    calls.insert(a);
    ++adds;
  }
  EXPECT_EQ(count, entries) << r.out;
  // KernelShark keeps an event's id in 16 signed bits (kshark_entry::event_id): an id from
  // 0x8000 up comes out negative, and the entry has no event, no fields and no info.
  EXPECT_EQ(unnamed, 0) << "entries whose event libkshark cannot look up; the event's id: "
                        << m_.read("events/ks/add/id");
  EXPECT_EQ(adds, kCalls) << r.out;
  std::set<long> expected;
  for (long i = 0; i < kCalls; ++i) expected.insert(i);
  EXPECT_EQ(calls, expected) << r.out;
}

TEST_F(KernelSharkTest, KernelSharkOpensTheRecordingAndDrawsIt) {
  if (!on_path("kernelshark")) GTEST_SKIP() << "no kernelshark on PATH (the kernelshark package)";
  if (!on_path("Xvfb")) GTEST_SKIP() << "no Xvfb on PATH (the xvfb package)";
  ASSERT_NO_FATAL_FAILURE(record());

  // An X server on a display Xvfb finds free; it writes the number once it takes clients.
  int ready[2];
  ASSERT_EQ(pipe2(ready, O_CLOEXEC), 0);
  Background xvfb;
  const std::string screen = std::to_string(kScreenWidth) + "x" + std::to_string(kScreenHeight);
  bool started =
      xvfb.start({"Xvfb", "-displayfd", "3", "-screen", "0", screen + "x24", "-nolisten", "tcp"},
                 {}, dir_.file("xvfb.log"), ready[1]);
  close(ready[1]);
  std::string number;
  const auto xvfb_deadline = Clock::now() + std::chrono::seconds(30);
  while (started && number.find('\n') == std::string::npos && ms_left(xvfb_deadline) > 0) {
    pollfd p{ready[0], POLLIN, 0};
    if (poll(&p, 1, ms_left(xvfb_deadline)) <= 0) continue;
    char b[32];
    ssize_t n = read(ready[0], b, sizeof b);
    if (n <= 0) break;
    number.append(b, static_cast<size_t>(n));
  }
  close(ready[0]);
  ASSERT_NE(number.find('\n'), std::string::npos)
      << "Xvfb gave no display: " << slurp(dir_.file("xvfb.log"));
  const std::string display = ":" + number.substr(0, number.find('\n'));

  // Run as root, KernelShark first asks, in a dialog, to be let go on; its own setting
  // (in the cache directory it is given) says not to ask.
  ASSERT_TRUE(std::filesystem::create_directory(dir_.file("cache")));
  ASSERT_TRUE(std::filesystem::create_directory(dir_.file("run")));
  chmod(dir_.file("run").c_str(), 0700);
  std::ofstream(dir_.file("cache/setting.ini")) << "[General]\nnoRootWarn=true\n";
  Background ks;
  ASSERT_TRUE(ks.start({"kernelshark", "-geometry", screen + "+0+0", file_},
                       {"DISPLAY=" + display, "KS_USER_CACHE_DIR=" + dir_.file("cache"),
                        "XDG_RUNTIME_DIR=" + dir_.file("run")},
                       dir_.file("kernelshark.log")));

  // KernelShark names its window after the file once it has loaded it. A file it cannot
  // load is an "ERROR: ..." line on stderr and a dialog that holds the naming back.
  const std::string title = "\"Kernel Shark (" + file_ + ")\"";
  const auto deadline = Clock::now() + std::chrono::seconds(60);
  std::string windows;
  bool shown = false;
  while (!shown && ks.running() && ms_left(deadline) > 0 &&
         slurp(dir_.file("kernelshark.log")).find("ERROR") == std::string::npos) {
    windows = run_command({"xwininfo", "-root", "-tree", "-display", display}, 10000).out;
    shown = windows.find(title) != std::string::npos;
    if (!shown) ks.wait_for_exit(100);  // the next look, or at once if it ends
  }
  ASSERT_TRUE(ks.running()) << "kernelshark ended: " << slurp(dir_.file("kernelshark.log"));
  ASSERT_TRUE(shown) << "no window " << title << ":\n"
                     << windows << slurp(dir_.file("kernelshark.log"));

  // The window paints after it is named: screenshots until one shows it drawn.
  const std::string xwd = dir_.file("screen.xwd");
  Image img;
  Colours colours;
  std::string why;
  for (bool first = true; first || (!looks_drawn(colours) && ms_left(deadline) > 0);
       first = false) {
    if (!first) ks.wait_for_exit(100);
    CommandResult shot =
        run_command({"xwd", "-root", "-silent", "-display", display, "-out", xwd}, 30000);
    if (shot.exit_code() != 0) {
      why = "xwd: " + shot.err;
      continue;
    }
    CommandResult ppm = run_command({"xwdtopnm", xwd}, 30000);
    if (ppm.exit_code() != 0 || !parse_ppm(ppm.out, &img)) {
      why = "xwdtopnm: " + ppm.err;
      continue;
    }
    colours = colours_of(img);
    why.clear();
  }
  ASSERT_EQ(why, "");
  EXPECT_EQ(img.width, kScreenWidth);
  EXPECT_EQ(img.height, kScreenHeight);
  EXPECT_TRUE(looks_drawn(colours)) << colours.distinct << " colours, the commonest on "
                                    << colours.commonest_share * 100 << "% of the screen";
  EXPECT_TRUE(ks.running()) << slurp(dir_.file("kernelshark.log"));
  if (const char* keep = getenv("PROBEFS_KERNELSHARK_SCREENSHOT")) {
    CommandResult png =
        run_command({"sh", "-c", "xwdtopnm \"$1\" | pnmquant 64 | pnmtopng -compression 9 > \"$2\"",
                     "sh", xwd, keep},
                    60000);
    EXPECT_EQ(png.exit_code(), 0) << png.err;
  }

  ks.stop(10000);
  xvfb.stop(10000);
  const std::string log = slurp(dir_.file("kernelshark.log"));
  EXPECT_EQ(log.find("ERROR"), std::string::npos) << log;
}

}  // namespace
}  // namespace probefs::fs
