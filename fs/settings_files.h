// Files whose settings probefs keeps for the tools that write and read them, and
// files that read as the kernel's with nothing behind them:
//   tracing_cpumask       the CPUs traced, as the kernel prints a cpumask ("3\n" for two
//                         CPUs); takes a hex mask (CpuMask). Asked through cpu_traced().
//   set_event_pid         the thread ids events are kept for (none: every thread), one a
//   set_event_notrace_pid line, ascending; the thread ids events are dropped for. A write
//                         adds the numbers it holds (all or nothing); O_TRUNC empties
//                         the list. The trace readers keep a record only when
//                         its CPU is in tracing_cpumask and its thread passes the
//                         lists (TraceReader, with options/event-fork), asking
//                         scope_version() whether anything limits them at all.
//   buffer_percent        50; takes 0..100 (stored; probefs wakes readers at any data)
//   tracing_thresh        0; takes microseconds (stored; no latency tracer here)
//   timestamp_mode        "[delta] absolute", read-only
//   printk_formats        empty: no kernel trace_printk formats here
//   free_buffer           write-only; a write is taken and does nothing (the kernel frees
//                         the buffer when it is closed; probefs keeps it)
// An instance (fs/instances.h) has its own of these but tracing_thresh and
// printk_formats.
//
// Threads: any; one lock over the settings.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "fs/vfs.h"

namespace probefs::fs {

// A set of CPUs, in the kernel's cpumask text: 32-bit hex chunks, most significant first,
// separated by commas, the first one with as many digits as its CPUs need and the others
// with eight ("3" for 2 CPUs, "ff,ffffffff" for 40).
class CpuMask {
 public:
  explicit CpuMask(int cpus);  // every CPU set

  bool test(int cpu) const;
  bool all() const;  // every CPU set
  std::string text() const;  // with its newline
  // The kernel's cpumask parsing: chunks of up to 8 hex digits, separated by commas or
  // blanks, the last one the lowest 32 CPUs; the text ends at its first newline. 0, or
  // -EINVAL (not hex) or -EOVERFLOW (a chunk too long, more chunks or bits than CPUs);
  // the mask is unchanged on error.
  [[nodiscard]] int parse(std::string_view text);

 private:
  int cpus_;
  std::vector<uint32_t> chunks_;  // [0]: CPUs 0..31
};

// A set of thread ids as set_event_pid shows and takes it.
class PidList {
 public:
  bool empty() const { return pids_.empty(); }
  bool contains(pid_t tid) const { return pids_.count(tid) != 0; }
  void clear() { pids_.clear(); }
  std::string text() const;  // one per line, ascending
  // Adds every number of `data` (blank-separated, kstrtoul with base 0): the bytes taken,
  // or -EINVAL (not a number, or a word longer than the kernel's 127 bytes) or -EPERM (a
  // number past the kernel's pid range), with nothing added.
  int64_t add(std::string_view data);

 private:
  std::set<pid_t> pids_;
};

class SettingsFiles {
 public:
  explicit SettingsFiles(int cpus);
  SettingsFiles(const SettingsFiles&) = delete;
  SettingsFiles& operator=(const SettingsFiles&) = delete;

  // Adds the files under `root`: the tracefs root, or (`instance`) an instance's
  // directory, which has neither tracing_thresh, printk_formats nor instances/.
  void add_files(Tree& tree, const NodePtr& root, bool instance = false);

  // tracing_cpumask has CPU `cpu`.
  bool cpu_traced(int cpu) const;
  // Whether events of thread `tid` are kept under set_event_pid and
  // set_event_notrace_pid, as the kernel decides for a task: not in a non-empty
  // set_event_pid, or in set_event_notrace_pid, is dropped.
  bool event_pid_allowed(pid_t tid) const;
  // Whether `tid` is in set_event_notrace_pid.
  bool event_pid_refused(pid_t tid) const;
  // 0 while nothing limits what is traced (every CPU, both lists empty); otherwise a
  // number that changes with every change of the three.
  uint64_t scope_version() const { return scope_version_.load(std::memory_order_acquire); }

 private:
  void changed();  // mu_ held
  std::shared_ptr<TextFile> pid_file(PidList SettingsFiles::*list);
  int64_t write_cpumask(std::string_view data);

  mutable std::mutex mu_;
  CpuMask cpumask_;
  PidList event_pids_;
  PidList notrace_pids_;
  uint64_t buffer_percent_ = 50;
  uint64_t thresh_ns_ = 0;  // the kernel keeps microseconds * 1000
  uint64_t changes_ = 0;
  std::atomic<uint64_t> scope_version_{0};
};

}  // namespace probefs::fs
