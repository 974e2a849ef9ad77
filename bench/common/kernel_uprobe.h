// The kernel's own uprobe events on a benchmark's function, for the tables' reference
// column: a private tracefs mount, an instance of its own (so the top-level buffer is left
// alone), the definitions removed and the mount undone whatever happens. Needs root and a
// kernel with uprobe events; otherwise available() is false and the column says why.
//
// A kernel whose tracefs does not answer (an events lock left held by a kernel bug makes
// every process that touches events/ or uprobe_events sleep for good, unkillable) must
// never hang the benchmark. So every operation on the kernel's tracefs (the mount, the
// instance, uprobe_events, enable, their removal, the unmount) runs in a worker process
// that this object asks, one request at a time, each answer awaited at most `answer_ms`.
// A worker that does not answer in time is abandoned, never waited for: available() turns
// false, why_not() says "kernel tracefs not answering", the private mount is detached.
// The worker cleans up by itself when its request pipe ends: when this object goes, or
// when the benchmark dies for any reason (the pipe is close-on-exec, so programs the
// benchmark starts do not keep it open).
//
// The instance's other files (trace_pipe) are the caller's to read: from a process with a
// deadline of its own.
//
// Threads: one. Not async-signal-safe.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>

namespace probefs::bench {

class KernelUprobes {
 public:
  static constexpr const char* kGroup = "probefs_bench";
  static constexpr const char* kNotAnswering = "kernel tracefs not answering";

  // Starts the worker; it mounts tracefs and makes the instance, answering within
  // `answer_ms` or never.
  explicit KernelUprobes(int answer_ms = 3000);
  ~KernelUprobes();
  KernelUprobes(const KernelUprobes&) = delete;
  KernelUprobes& operator=(const KernelUprobes&) = delete;

  bool available() const { return worker_ > 0; }
  const std::string& why_not() const { return why_not_; }
  // The instance's directory (trace_pipe, trace, ...), "" when not available.
  const std::string& instance() const { return instance_; }

  // CLOCK_MONOTONIC times of an add(), in ns: just before the definition's write, after
  // it, and after the enable's.
  struct AddTimes {
    int64_t started = 0, defined = 0, enabled = 0;
  };
  // Adds `p:probefs_bench/NAME BODY` (or r: when `ret`) to uprobe_events and enables it in
  // the instance. false when the kernel refused it (why_not() says so) or did not answer.
  bool add(const std::string& name, bool ret, const std::string& body,
           AddTimes* times = nullptr);
  // Disables and removes one event added.
  bool remove(const std::string& name);
  // Disables and removes every event added.
  void clear();

 private:
  bool request(const std::string& line, std::string* answer);
  void end_worker();
  void abandon(const std::string& why);

  int answer_ms_;
  pid_t worker_ = -1;
  int to_worker_ = -1;
  int from_worker_ = -1;
  std::string pending_;  // what the worker sent after its last answer line
  std::string mount_;    // the private tracefs mount's directory
  std::string instance_;
  std::string why_not_;
};

}  // namespace probefs::bench
