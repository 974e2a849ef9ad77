// The dynamic events of a mount: the definition files (kprobe_events, uprobe_events,
// dynamic_events), the events they define (groups, names, ids, the probes of each event
// in the tracer), and every file that shows or drives them: kprobe_profile,
// uprobe_profile, error_log, events/ (enable and filter at every level; per event
// enable, filter, format, id, trigger), available_events and set_event.
//
// Triggers (traceon, traceoff, stacktrace, enable_event, disable_event, with counts and
// filters) and soft mode act at the hit, in the traced processes (fs/event_triggers.h).
// events/ftrace/print's triggers and histograms run in the daemon, on each trace_marker
// write (fs/marker_event.cc).
//
// Threads: every method, and every file it adds, may be used from any thread at once.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string_view>

#include "events/errors.h"
#include "fs/vfs.h"

namespace probefs::fs {

class Tracefs;

class DynamicEvents {
 public:
  // Adds its files to fs.tree().
  explicit DynamicEvents(Tracefs& fs);
  ~DynamicEvents();
  DynamicEvents(const DynamicEvents&) = delete;
  DynamicEvents& operator=(const DynamicEvents&) = delete;

  // Removes every event and its probes from every target (the mount is going away).
  // Triggers stop switching tracing_on from here on.
  void clear_all();

  // Adds an entry to error_log (nothing for a diagnostic that is not logged).
  void log_error(const events::Diagnostic& d);

  // An instance's events/ and set_event under its directory `dir`, for its buffer (the
  // enable files; fs/instances.h), kept in step with the events defined from now on.
  void add_instance(uint32_t buffer, const NodePtr& dir);
  // The instance goes: every event is disabled in its buffer (its files go with `dir`).
  void remove_instance(uint32_t buffer);

  // trace_marker of buffer `buffer` recorded `text` (as written) for thread `tid`
  // named `comm`: the print event's triggers and histograms of that buffer run.
  void marker_written(uint32_t buffer, pid_t tid, std::string_view comm, std::string_view text);

  struct Impl;  // fs/dynamic_events_impl.h

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace probefs::fs
