// The tracefs model: the file tree of a probefs mount and the state behind it, built on a
// tracee::Tracer (the processes, probes and records). FUSE is not involved here
// (fs/fuse_server.h serves this tree); tests build a Tracefs and open its files directly.
//
//   Tracefs
//   ├─ DynamicEvents (fs/dynamic_events.h): kprobe_events, uprobe_events, dynamic_events,
//   │     kprobe_profile, uprobe_profile, error_log, events/ (groups, events, enable,
//   │     filter, format, id, trigger; the kernel's events/ftrace/ from
//   │     fs/ftrace_events.cc), available_events, set_event
//   ├─ TraceFiles (fs/trace_files.h): trace, trace_pipe, per_cpu/, tracing_on, trace_marker,
//   │     trace_marker_raw, trace_clock, buffer_size_kb, buffer_total_size_kb,
//   │     current_tracer, available_tracers, saved_cmdlines, saved_tgids, options/ and
//   │     trace_options (fs/trace_options.h), and the stored settings of
//   │     fs/settings_files.h: tracing_cpumask, set_event_pid, set_event_notrace_pid,
//   │     buffer_percent, tracing_thresh, timestamp_mode, printk_formats, free_buffer
//   ├─ Instances (fs/instances.h): instances/, each a TraceFiles of its own buffer and
//   │     its events' enables (DynamicEvents::add_instance)
//   └─ control files (fs/control_files.cc): README, targets, kprobes/ (list, enabled,
//         blacklist, optimization)
//
// The parts meet in the EventTable: event id -> what a reader needs to print a record of
// that event. (Triggers and soft-disabled events decide at the hit, in the targets: what
// the rings hold is what is shown, but for the readers' own settings, set_event_pid and
// tracing_cpumask.)
//
// Threads: every method may be called from any FUSE thread.
#pragma once

#include <sys/types.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "events/compile.h"
#include "events/trace_clock.h"
#include "fs/vfs.h"
#include "tracee/tracer.h"

namespace probefs::fs {

// Event ids (common_type) are taken from the top of the positive 16-bit range, which the
// kernel never reaches (it hands its own ids out from the bottom, a few thousand at most),
// so that `perf record -e` on a probefs event finds no kernel tracepoint with that id and
// fails rather than recording something else. Not above 0x7FFF: KernelShark keeps an
// event's id in a signed 16-bit number, and names no event whose id is negative there.
inline constexpr uint16_t kFirstEventId = 0x7000;   // 28672
inline constexpr uint16_t kLastEventId = 0x7FFD;
// The id of trace_marker_raw's records (the kernel's ftrace/raw_data event).
inline constexpr uint16_t kMarkerRawEventId = 0x7FFE;
// The id of trace_marker's records (the kernel's ftrace/print event).
inline constexpr uint16_t kMarkerEventId = 0x7FFF;
// The kernel's id of ftrace/print (events/ftrace/print/id): what trace_marker's records
// are in a raw buffer, where tools decode them with that event's format.
inline constexpr uint16_t kPrintEventId = 5;
// The kernel's id of ftrace/raw_data: what trace_marker_raw's records are in a raw buffer.
inline constexpr uint16_t kRawDataEventId = 19;

// What printing a record of one event needs. Immutable once published.
struct EventView {
  uint16_t id = 0;
  std::string system;  // group
  std::string name;
  events::CompiledEvent compiled;
  bool kprobe_style = false;  // (sym+off/size) rather than (0xADDR)
};

class EventTable {
 public:
  // A free id, or 0 when every id of the range is in use.
  uint16_t allocate_id();
  void release_id(uint16_t id);

  void publish(std::shared_ptr<const EventView> view);
  void unpublish(uint16_t id);
  std::shared_ptr<const EventView> find(uint16_t id) const;

 private:
  mutable std::mutex mu_;
  std::unordered_map<uint16_t, std::shared_ptr<const EventView>> views_;
  std::unordered_map<uint16_t, bool> used_;
  uint16_t next_ = kFirstEventId;
};

class DynamicEvents;  // fs/dynamic_events.h
class TraceFiles;     // fs/trace_files.h
class Instances;      // fs/instances.h

class Tracefs {
 public:
  struct Options {
    int cpus = 0;  // CPUs for per_cpu/ and "#P:"; 0: the machine's configured CPUs
    // What `targets` and the command need to start a program themselves (probefs exec).
    std::string agent_path;
    // The longest a many-page trace_pipe_raw read waits for more pages (raw_gather_wait;
    // a test lengthens it to have slower programs' records gathered).
    std::chrono::microseconds raw_gather_max{200};
  };

  Tracefs(tracee::Tracer& tracer, const Options& opts);
  ~Tracefs();
  Tracefs(const Tracefs&) = delete;
  Tracefs& operator=(const Tracefs&) = delete;

  Tree& tree() { return tree_; }
  tracee::Tracer& tracer() { return tracer_; }
  EventTable& events() { return events_; }
  const Options& options() const { return opts_; }
  int cpus() const { return opts_.cpus; }

  DynamicEvents& dynamic_events() { return *dynamic_; }
  TraceFiles& trace_files() { return *trace_; }

  // tracing_on: the file, and the traceon/traceoff triggers. Hits are still counted while
  // it is off; nothing is recorded. Of buffer `buffer` (0: the top level's).
  bool tracing_on(uint32_t buffer = 0) const;
  void set_tracing_on(bool on);

  // Runs `op`, a tracer call that empties every buffer (a clock or size change), between
  // the readers of every buffer, who forget what they held.
  int reset_all_buffers(const std::function<int()>& op);
  // Every buffer's readers print with this clock from now on.
  void set_clock(events::TraceClock c);
  // Wakes the blocked readers and poll waiters of every buffer.
  void wake_readers();
  // The snapshot trigger of buffer `buffer` (trace_marker's: fs/marker_event.cc): its
  // records and its snapshot's change places, as `echo 1 > snapshot` does.
  void snapshot(uint32_t buffer);
  // Its snapshot is allocated (a snapshot trigger was set, as the kernel allocates it).
  void allocate_snapshot(uint32_t buffer);

  // buffer_subbuf_size_kb of buffer `buffer`, in bytes: the size of trace_pipe_raw's
  // pages and what events/header_page says of them (4096 until set).
  uint32_t subbuf_bytes(uint32_t buffer) const {
    return buffer < subbuf_.size() ? subbuf_[buffer].load() : 4096;
  }
  void set_subbuf_bytes(uint32_t buffer, uint32_t bytes) {
    if (buffer < subbuf_.size()) subbuf_[buffer].store(bytes);
  }

  // The target `pid` was forked from, as the tracer said when the child joined (0: not
  // known, or not a fork child). Remembered for the last kForkParentsKept children, gone
  // or not: their records may be read long after they ended.
  pid_t fork_parent(pid_t pid) const;
  static constexpr size_t kForkParentsKept = 65536;

  // The mount is going away: blocked readers return.
  void shutdown();
  bool shutting_down() const;

 private:
  tracee::Tracer& tracer_;
  Options opts_;
  Tree tree_;
  EventTable events_;
  std::unique_ptr<DynamicEvents> dynamic_;
  std::shared_ptr<TraceFiles> trace_;
  std::shared_ptr<Instances> instances_;
  std::atomic<bool> shutdown_{false};
  std::array<std::atomic<uint32_t>, 16> subbuf_{};  // by buffer (events::kRingMaxBuffers)
  // Where the tracer's notices of refused processes go (error_log): shared with the
  // listener, which runs on the tracer's thread and may outlive this object for a moment.
  struct NoticeSink;
  std::shared_ptr<NoticeSink> notices_;
};

// The control files (fs/control_files.cc): README, targets, kprobes/.
void add_control_files(Tracefs& fs);

// events/ftrace/ (fs/ftrace_events.cc): the kernel's print, bprint, bputs and function
// events, under `events_dir`; `print_files` adds print's first files (its trigger and
// hist: fs/marker_event.cc) into its directory.
void add_ftrace_events(Tree& tree, const NodePtr& events_dir,
                       const std::function<void(const NodePtr&)>& print_files);

}  // namespace probefs::fs
