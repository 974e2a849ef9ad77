// instances/: `mkdir instances/NAME` makes an instance, a trace buffer of its own beside
// the top level's, as the kernel's are (trace-cmd's -B records into one): its own records
// (trace, trace_pipe, per_cpu/cpuN/ with trace_pipe_raw), tracing_on, trace_marker and
// trace_marker_raw, snapshot, options/, set_event_pid, tracing_cpumask, and its own
// events/ (enable and filter at every level; each event's trigger, hist, format and id;
// set_event), whose triggers act on the instance's buffer. `rmdir` takes its triggers
// and histograms away, disables its events in it and removes it. An event enabled in any
// instance is busy, as in the top level (it cannot be removed).
//
// An instance's buffer is one of the tracer's buffers (tracee::Tracer's "Buffers"):
// at most events::kRingMaxBuffers - 1 instances at once (mkdir beyond: ENOSPC). What the
// instance shares with the top level: the trace clock and the ring size (trace_clock and
// buffer_size_kb act on every buffer), saved_cmdlines.
//
// Threads: any; mkdir and rmdir are serialised by the instances' lock, taken before the
// definitions' (fs/dynamic_events.h).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "fs/vfs.h"

namespace probefs::fs {

class Tracefs;
class TraceFiles;

class Instances : public DirOps {
 public:
  explicit Instances(Tracefs& fs);
  ~Instances() override;
  // instances/, the directory whose mkdir and rmdir this serves (it holds this object).
  void attach(const NodePtr& dir);

  int mkdir(const Request& rq, std::string_view name) override;
  int rmdir(const Request& rq, std::string_view name) override;

  // The trace files of every instance, in buffer order.
  std::vector<std::shared_ptr<TraceFiles>> trace_files() const;

 private:
  struct Instance {
    uint32_t buffer = 0;
    std::shared_ptr<TraceFiles> files;
  };
  NodePtr dir() const { return dir_.lock(); }

  Tracefs& fs_;
  std::weak_ptr<Node> dir_;
  mutable std::mutex mu_;
  std::map<std::string, Instance, std::less<>> by_name_;
  uint32_t buffers_used_ = 1;  // bit b: buffer b is an instance's (bit 0: the top level's)
};

}  // namespace probefs::fs
