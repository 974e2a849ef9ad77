// The files that show and steer the trace buffer: trace (non-consuming, with its header;
// truncation clears it), trace_pipe (consuming; blocks until data, O_NONBLOCK gives
// EAGAIN, poll works, a blocked read returns on a signal and on unmount), per_cpu/cpuN/
// (trace, trace_pipe, stats), tracing_on, trace_marker, trace_clock, buffer_size_kb,
// buffer_total_size_kb, current_tracer, available_tracers, saved_cmdlines and options/.
#pragma once

#include <memory>

namespace probefs::fs {

class Tracefs;

class TraceFiles {
 public:
  // Adds its files to fs.tree().
  explicit TraceFiles(Tracefs& fs);
  ~TraceFiles();
  TraceFiles(const TraceFiles&) = delete;
  TraceFiles& operator=(const TraceFiles&) = delete;

  // Wakes every blocked reader (tracing_on changed, the mount is going away).
  void wake_readers();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace probefs::fs
