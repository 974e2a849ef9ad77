// The traced program (tests/tracee/traced_prog.c) as a child of the test, started plain or
// as `probefs exec MOUNTPOINT -- PROGRAM` (the program then runs as that very process, a
// target of the mount), with its stdin and stdout on pipes: one command line in, one
// answer line out, every wait bounded. Killed and reaped at the end whatever the test did.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "tests/fs/line_reader.h"
#include "tests/fs/mount_fixture.h"

namespace probefs::fs::testing {

class ProgramProcess {
 public:
  // `argv` runs with the pipes as its stdin and stdout; stderr is the test's.
  explicit ProgramProcess(const std::vector<std::string>& argv) {
    int in[2], out[2];
    if (pipe2(in, O_CLOEXEC) != 0) return;
    if (pipe2(out, O_CLOEXEC) != 0) {
      close(in[0]);
      close(in[1]);
      return;
    }
    std::vector<char*> a;
    for (const std::string& s : argv) a.push_back(const_cast<char*>(s.c_str()));
    a.push_back(nullptr);
    pid_ = fork();
    if (pid_ == 0) {
      dup2(in[0], 0);
      dup2(out[1], 1);
      execvp(a[0], a.data());
      _exit(127);
    }
    close(in[0]);
    close(out[1]);
    to_ = in[1];
    from_ = out[0];
    if (pid_ > 0) ready_ = line() == "ready";
  }

  // `program` (traced_prog or a copy of it) under `probefs exec MOUNTPOINT --`, or plain.
  static std::vector<std::string> under_probefs(const std::string& mountpoint,
                                                const std::string& program = PROBEFS_TRACED_PROG) {
    return {PROBEFS_BIN, "exec", mountpoint, "--", program};
  }
  static std::vector<std::string> plain(const std::string& program = PROBEFS_TRACED_PROG) {
    return {program};
  }

  ~ProgramProcess() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      wait_child(pid_, 10000);
    }
    if (to_ >= 0) close(to_);
    if (from_ >= 0) close(from_);
  }
  ProgramProcess(const ProgramProcess&) = delete;
  ProgramProcess& operator=(const ProgramProcess&) = delete;

  bool ready() const { return ready_; }
  pid_t pid() const { return pid_; }

  // One command, its answer ("" after `timeout_ms` or at end of file).
  std::string ask(const std::string& cmd, int timeout_ms = 30000) {
    if (!send(cmd)) return "";
    return line(timeout_ms);
  }

  // A command whose answer is read later (answer()), while the test does other things.
  bool send(const std::string& cmd) {
    std::string l = cmd + "\n";
    return to_ >= 0 && write(to_, l.data(), l.size()) == static_cast<ssize_t>(l.size());
  }
  std::string answer(int timeout_ms = 30000) { return line(timeout_ms); }

  // traced_add(i, 2*i) for i in [0, n): true when the program says it computed them all.
  bool call(long n) {
    return ask("call " + std::to_string(n)) == "ok " + std::to_string(3 * (n * (n - 1) / 2));
  }

  // traced_str("name-<i % 10>", i) for i in [0, n).
  bool str(long n) {
    long sum = 0;
    for (long i = 0; i < n; ++i) sum += 6 + i;
    return ask("str " + std::to_string(n)) == "ok " + std::to_string(sum);
  }

  // Says quit; the wait status (-1: it had to be killed).
  int quit() {
    if (pid_ <= 0) return -1;
    if (to_ >= 0) (void)!write(to_, "quit\n", 5);
    int st = wait_child(pid_, 20000);
    pid_ = -1;
    return st;
  }

 private:
  std::string line(int timeout_ms = 30000) { return read_line(from_, &buf_, timeout_ms); }

  pid_t pid_ = -1;
  int to_ = -1, from_ = -1;
  bool ready_ = false;
  std::string buf_;
};

}  // namespace probefs::fs::testing
