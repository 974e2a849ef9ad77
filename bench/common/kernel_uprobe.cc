#include "bench/common/kernel_uprobe.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace probefs::bench {

namespace {

// The worker's last duty, removing the instance, waits this long for its readers to go.
constexpr int kInstanceBusyMs = 2000;

int64_t now_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

// One write() of `text` to `file`: 0 or the errno.
int write_file(const std::string& file, const std::string& text, bool append) {
  int fd = open(file.c_str(), O_WRONLY | O_CLOEXEC | (append ? O_APPEND : O_TRUNC));
  if (fd < 0) return errno;
  ssize_t n = ::write(fd, text.data(), text.size());
  int err = n == static_cast<ssize_t>(text.size()) ? 0 : (n < 0 ? errno : EIO);
  close(fd);
  return err;
}

bool send_all(int fd, const std::string& s) {
  size_t at = 0;
  while (at < s.size()) {
    ssize_t n = send(fd, s.data() + at, s.size() - at, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    at += static_cast<size_t>(n);
  }
  return true;
}

// The worker process: owns the private mount, the instance and the events; answers one
// line per request ("ok [VALUE]" or "err WHY"); cleans everything up when the requests
// end. Never returns.
class Worker {
 public:
  Worker(int sock, std::string mount, std::string instance)
      : sock_(sock), mount_(std::move(mount)), instance_(std::move(instance)) {}

  [[noreturn]] void run() {
    // Its own process group and no terminal signals: a Ctrl-C of the benchmark must leave
    // it alive to clean up when its requests end.
    // Whatever the benchmark's handlers were, none runs here.
    setpgid(0, 0);
    for (int sig = 1; sig < NSIG; ++sig)
      if (sig != SIGKILL && sig != SIGSTOP) signal(sig, SIG_DFL);
    for (int sig : {SIGINT, SIGQUIT, SIGHUP, SIGTSTP, SIGPIPE}) signal(sig, SIG_IGN);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    alarm(0);
    answer(start());
    std::string line;
    while (next_line(&line)) answer(serve(line));
    cleanup();
    _exit(0);
  }

 private:
  std::string start() {
    if (mount("nodev", mount_.c_str(), "tracefs", 0, nullptr) != 0)
      return std::string("err mount tracefs: ") + strerror(errno);
    mounted_ = true;
    if (mkdir(instance_.c_str(), 0755) != 0 && errno != EEXIST)
      return std::string("err tracefs instance: ") + strerror(errno);
    return "ok";
  }

  // "add\tNAME\tp|r\tBODY", "remove\tNAME" or "clear".
  std::string serve(const std::string& line) {
    std::vector<std::string> f;
    size_t at = 0;
    for (;;) {
      size_t tab = line.find('\t', at);
      f.push_back(line.substr(at, tab == std::string::npos ? std::string::npos : tab - at));
      if (tab == std::string::npos) break;
      at = tab + 1;
    }
    if (f[0] == "add" && f.size() == 4) {
      const std::string def = f[2] + ":" + KernelUprobes::kGroup + "/" + f[1] + " " + f[3] + "\n";
      // One left by a run that could not clean up would make this one EEXIST.
      (void)remove(f[1]);
      const int64_t t = now_ns();
      if (int err = write_file(mount_ + "/uprobe_events", def, true))
        return "err uprobe_events refused " + def.substr(0, def.size() - 1) + ": " + strerror(err);
      const int64_t defined = now_ns();
      events_.push_back(f[1]);
      if (int err = write_file(enable_file(f[1]), "1", false))
        return std::string("err enable: ") + strerror(err);
      return "ok " + std::to_string(t) + " " + std::to_string(defined) + " " +
             std::to_string(now_ns());
    }
    if (f[0] == "clear") {
      for (const std::string& e : events_) (void)remove(e);
      events_.clear();
      return "ok";
    }
    if (f[0] == "remove" && f.size() == 2) {
      int err = remove(f[1]);
      events_.erase(std::remove(events_.begin(), events_.end(), f[1]), events_.end());
      return err == 0 ? "ok" : std::string("err remove: ") + strerror(err);
    }
    return "err bad request";
  }

  std::string enable_file(const std::string& name) const {
    return instance_ + "/events/" + KernelUprobes::kGroup + "/" + name + "/enable";
  }

  int remove(const std::string& name) {
    (void)write_file(enable_file(name), "0", false);
    return write_file(mount_ + "/uprobe_events",
                      std::string("-:") + KernelUprobes::kGroup + "/" + name + "\n", true);
  }

  void cleanup() {
    for (const std::string& e : events_) (void)remove(e);
    // Readers of the instance's trace_pipe may still be on their way out.
    for (int waited = 0; rmdir(instance_.c_str()) != 0 && errno == EBUSY && waited < kInstanceBusyMs;
         waited += 50)
      usleep(50 * 1000);
    if (mounted_ && umount2(mount_.c_str(), 0) != 0) umount2(mount_.c_str(), MNT_DETACH);
    rmdir(mount_.c_str());
  }

  void answer(const std::string& s) { (void)send_all(sock_, s + "\n"); }

  bool next_line(std::string* line) {
    for (;;) {
      size_t nl = buf_.find('\n');
      if (nl != std::string::npos) {
        *line = buf_.substr(0, nl);
        buf_.erase(0, nl + 1);
        return true;
      }
      char b[1024];
      ssize_t n = read(sock_, b, sizeof b);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return false;
      buf_.append(b, static_cast<size_t>(n));
    }
  }

  int sock_;
  std::string mount_, instance_;
  bool mounted_ = false;
  std::vector<std::string> events_;
  std::string buf_;
};

}  // namespace

KernelUprobes::KernelUprobes(int answer_ms) : answer_ms_(answer_ms) {
  if (geteuid() != 0) {
    why_not_ = "not root";
    return;
  }
  char dir[] = "/tmp/probefs-bench-tracefs-XXXXXX";
  if (mkdtemp(dir) == nullptr) {
    why_not_ = std::string("mkdtemp: ") + strerror(errno);
    return;
  }
  mount_ = dir;
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
    why_not_ = std::string("socketpair: ") + strerror(errno);
    rmdir(mount_.c_str());
    return;
  }
  const std::string instance = mount_ + "/instances/" + kGroup;
  worker_ = fork();
  if (worker_ == 0) {
    // Nothing of the benchmark's but the request socket, not even its stdio: a pipe end
    // kept open by a worker asleep for good would keep whoever reads the benchmark's
    // output, or another child of the benchmark, from ever seeing its end.
    if (sv[1] != 3) dup2(sv[1], 3);
    int null = open("/dev/null", O_RDWR);
    for (int fd = 0; fd < 3 && null >= 0; ++fd) dup2(null, fd);
    close_range(4, ~0U, 0);
    Worker(3, mount_, instance).run();
  }
  close(sv[1]);
  if (worker_ < 0) {
    why_not_ = std::string("fork: ") + strerror(errno);
    close(sv[0]);
    rmdir(mount_.c_str());
    return;
  }
  to_worker_ = from_worker_ = sv[0];
  std::string answer;
  if (request("", &answer)) instance_ = instance;
}

KernelUprobes::~KernelUprobes() {
  if (worker_ > 0) end_worker();
}

void KernelUprobes::end_worker() {
  // The end of the requests: the worker removes everything it made and leaves.
  const pid_t worker = worker_;
  int pidfd = static_cast<int>(syscall(SYS_pidfd_open, worker, 0));
  close(to_worker_);
  to_worker_ = from_worker_ = -1;
  bool ended = false;
  if (pidfd >= 0) {
    pollfd p{pidfd, POLLIN, 0};
    ended = poll(&p, 1, answer_ms_ + kInstanceBusyMs) > 0;
    close(pidfd);
  }
  if (ended) {
    waitpid(worker, nullptr, 0);
    worker_ = -1;
  } else {
    const std::string why = why_not_;
    abandon(kNotAnswering);
    if (!why.empty()) why_not_ = why;
  }
}

bool KernelUprobes::request(const std::string& line, std::string* answer) {
  if (worker_ <= 0) return false;
  if (!line.empty() && !send_all(to_worker_, line + "\n")) {
    abandon("kernel tracefs worker ended");
    return false;
  }
  timespec start;
  clock_gettime(CLOCK_MONOTONIC, &start);
  for (;;) {
    size_t nl = pending_.find('\n');
    if (nl != std::string::npos) {
      *answer = pending_.substr(0, nl);
      pending_.erase(0, nl + 1);
      break;
    }
    timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    const long spent_ms =
        (now.tv_sec - start.tv_sec) * 1000 + (now.tv_nsec - start.tv_nsec) / 1000000;
    if (spent_ms >= answer_ms_) {
      abandon(kNotAnswering);
      return false;
    }
    pollfd p{from_worker_, POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(answer_ms_ - spent_ms)) <= 0) continue;
    char b[1024];
    ssize_t n = read(from_worker_, b, sizeof b);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      abandon("kernel tracefs worker ended");
      return false;
    }
    pending_.append(b, static_cast<size_t>(n));
  }
  if (answer->rfind("ok", 0) == 0) {
    *answer = answer->size() > 3 ? answer->substr(3) : "";
    return true;
  }
  why_not_ = answer->rfind("err ", 0) == 0 ? answer->substr(4) : *answer;
  // Refused at the start (no tracefs, no instance): nothing more to ask.
  if (line.empty()) end_worker();
  return false;
}

void KernelUprobes::abandon(const std::string& why) {
  why_not_ = why;
  // Never waited for: it may sleep in the kernel for good. The kill takes effect if it
  // ever wakes.
  if (worker_ > 0) kill(worker_, SIGKILL);
  worker_ = -1;
  if (to_worker_ >= 0) close(to_worker_);
  to_worker_ = from_worker_ = -1;
  if (!mount_.empty()) {
    umount2(mount_.c_str(), MNT_DETACH);
    rmdir(mount_.c_str());
  }
  instance_.clear();
}

bool KernelUprobes::add(const std::string& name, bool ret, const std::string& body,
                        AddTimes* times) {
  std::string answer;
  if (!request("add\t" + name + "\t" + (ret ? "r" : "p") + "\t" + body, &answer)) return false;
  if (times) {
    char* at = nullptr;
    times->started = std::strtoll(answer.c_str(), &at, 10);
    times->defined = std::strtoll(at, &at, 10);
    times->enabled = std::strtoll(at, &at, 10);
  }
  return true;
}

bool KernelUprobes::remove(const std::string& name) {
  std::string answer;
  return request("remove\t" + name, &answer);
}

void KernelUprobes::clear() {
  // The worker knows its events; removing them one by one keeps the instance.
  std::string answer;
  (void)request("clear", &answer);
}

}  // namespace probefs::bench
