// What the trace files' tests need around a traced program: the program's stdin and
// stdout as pipes (one command line in, one answer line out, every wait bounded) and a
// guard that kills it whatever the test did.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <string>

#include "tests/fs/line_reader.h"

namespace probefs::fs::testing {

class ProgramPipes {
 public:
  ProgramPipes() {
    if (pipe2(in_, O_CLOEXEC) != 0 || pipe2(out_, O_CLOEXEC) != 0) in_[0] = -1;
  }
  ~ProgramPipes() {
    for (int* fd : {&in_[0], &in_[1], &out_[0], &out_[1]}) close_fd(*fd);
  }
  ProgramPipes(const ProgramPipes&) = delete;
  ProgramPipes& operator=(const ProgramPipes&) = delete;

  bool ok() const { return in_[0] >= 0; }
  int child_stdin() const { return in_[0]; }
  int child_stdout() const { return out_[1]; }
  // Once the program runs, the parent keeps only its own ends.
  void parent_side() {
    close_fd(in_[0]);
    close_fd(out_[1]);
  }

  // The answer to `cmd` (without its newline), or "" after `timeout_ms` or at EOF.
  std::string ask(const std::string& cmd, int timeout_ms = 30000) {
    std::string l = cmd + "\n";
    if (write(in_[1], l.data(), l.size()) != static_cast<ssize_t>(l.size())) return "";
    return line(timeout_ms);
  }

  std::string line(int timeout_ms = 30000) { return read_line(out_[0], &buf_, timeout_ms); }

 private:
  static void close_fd(int& fd) {
    if (fd >= 0) close(fd);
    fd = -1;
  }
  int in_[2] = {-1, -1};
  int out_[2] = {-1, -1};
  std::string buf_;
};

class KillOnExit {
 public:
  ~KillOnExit() {
    if (pid_ > 0) kill(pid_, SIGKILL);
  }
  void set(pid_t pid) { pid_ = pid; }

 private:
  pid_t pid_ = 0;
};

}  // namespace probefs::fs::testing
