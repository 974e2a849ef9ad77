// The dynamic events of a mount: the definition files (kprobe_events, uprobe_events,
// dynamic_events), the events they define (groups, names, ids, the probes of each event
// in the tracer), and every file that shows or drives them: kprobe_profile,
// uprobe_profile, error_log, events/ (enable and filter at every level; per event
// enable, filter, format, id, trigger), available_events and set_event.
//
// It installs the EventTable's gate: soft-disabled events and the triggers (traceon,
// traceoff, enable_event, disable_event, with counts and filters) act on records as the
// readers take them, in timestamp order (fs/event_triggers.h says how that differs from
// the kernel).
//
// Threads: every method, and every file it adds, may be used from any thread at once.
#pragma once

#include <memory>

#include "events/errors.h"

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

  // Waits until every tracing_on change that a traceon or traceoff trigger made has
  // reached Tracefs::set_tracing_on (the gate makes them from a thread of its own); and
  // when tracing_on is on again after a traceoff, shows records again from now on.
  void sync_triggers();

  struct Impl;  // fs/dynamic_events_impl.h

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace probefs::fs
