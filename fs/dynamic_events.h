// The dynamic events of a mount: the definition files (kprobe_events, uprobe_events,
// dynamic_events), the events they define (groups, names, ids, the probes of each event
// in the tracer), and every file that shows or drives them: kprobe_profile,
// uprobe_profile, error_log, events/ (enable and filter at every level; per event
// enable, filter, format, id, trigger), available_events and set_event.
//
// It installs the EventTable's gate: soft-disabled events and the triggers (traceon,
// traceoff, enable_event, disable_event, with counts and filters) act on records as the
// readers take them, in timestamp order.
#pragma once

#include <memory>

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
  void clear_all();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace probefs::fs
