// The files that show and steer the trace buffer: trace (non-consuming, with its header;
// truncation clears it), trace_pipe (consuming; blocks until data, O_NONBLOCK gives
// EAGAIN, poll works, a blocked read returns on a signal and on unmount), per_cpu/cpuN/
// (trace, trace_pipe, trace_pipe_raw: fs/raw_pipe.h, stats, buffer_size_kb), tracing_on, trace_marker, trace_marker_raw (the kernel's
// raw_data records), trace_clock, buffer_size_kb, buffer_subbuf_size_kb (the size of
// trace_pipe_raw's pages), buffer_total_size_kb, snapshot,
// current_tracer, available_tracers, saved_cmdlines, saved_cmdlines_size, saved_tgids,
// options/ and trace_options (every kernel option; context-info, irq-info, markers and
// record-tgid act, the others are stored: fs/trace_options.h), and the settings and
// placeholders of fs/settings_files.h (tracing_cpumask, set_event_pid,
// set_event_notrace_pid, buffer_percent, tracing_thresh, timestamp_mode,
// printk_formats, free_buffer, instances/).
//
// Where the kernel's buffer is per CPU, probefs's is per thread (events/ring.h):
//   - buffer_size_kb is the size of each thread's ring, rounded as the kernel rounds a
//     per-CPU buffer (to 4080-byte pages, at least two); buffer_total_size_kb is that
//     times the threads whose records are in the buffer now (the rings holding data).
//   - per_cpu/cpuN/ shows the records written on CPU N, from every thread's ring;
//     its buffer_size_kb is that one size (a write sets it for every CPU).
//   - a record lost because its thread's ring was full is the kernel's non-overwrite
//     loss: trace_pipe prints "CPU:N [LOST n EVENTS]" before the next record of that
//     ring, and per_cpu stats count it under "dropped events".
//
// The reading side (the gate, formatting, waiting) is fs/trace_reader.h.
//
// Threads: any FUSE thread; see fs/trace_reader.h.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>

#include "events/trace_clock.h"
#include "fs/vfs.h"

namespace probefs::fs {

class Tracefs;

// The most a trace_pipe read returns (whole lines, unless one line alone is longer): the
// kernel formats a read into one trace_seq of 8156 bytes, its NUL included.
inline constexpr size_t kTracePipeReadMax = 8155;

class TraceFiles {
 public:
  // The top level's: adds its files to fs.tree()'s root, for buffer 0.
  explicit TraceFiles(Tracefs& fs);
  // An instance's (fs/instances.h): its files under `dir`, for buffer `buffer`; no
  // saved_cmdlines, saved_cmdlines_size nor saved_tgids (the mount's names are the top
  // level's, whose `top` names this one's threads too). trace_clock and buffer_size_kb
  // are the mount's: writing them in an instance changes them for every buffer.
  TraceFiles(Tracefs& fs, uint32_t buffer, const NodePtr& dir, TraceFiles& top);
  ~TraceFiles();
  TraceFiles(const TraceFiles&) = delete;
  TraceFiles& operator=(const TraceFiles&) = delete;

  // Wakes every blocked reader and poll waiter (tracing_on changed, the mount is going
  // away): each looks again.
  void wake_readers();
  // The readers stop: their blocked reads return (the instance goes).
  void stop_readers();
  // Runs `op`, a tracer call that empties the buffers, between this buffer's readers,
  // who forget what they held (TraceReader::reset_buffer).
  int reset_buffer(const std::function<int()>& op);
  void set_clock(events::TraceClock c);

  uint32_t buffer() const;
  // `echo 1 > snapshot`: the buffer's records go into the snapshot, and what the
  // snapshot held comes back into the buffer (the kernel swaps the two), ahead of any
  // record written since.
  void snapshot_swap();
  // The snapshot is allocated (empty if it was not).
  void allocate_snapshot();

  // Whether tracing_cpumask has CPU `cpu` (false for a CPU past the configured ones).
  bool cpu_traced(int cpu) const;
  // Whether set_event_pid and set_event_notrace_pid keep the events of thread `tid`: a
  // thread id, as the kernel tests a task's pid (not its process's). The trace readers
  // keep a record by these and by options/event-fork (fs/trace_reader.h, set_scope).
  bool event_pid_allowed(pid_t tid) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace probefs::fs
