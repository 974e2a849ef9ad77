// The files of a tracefs (a probefs mount, or the kernel's own) as the helper uses them:
// finding the mount, writing definitions, reading back the events that are defined, and
// the kernel's error for a refused write (errno, and the error_log entry with its caret).
// Plain system calls on the mount's files only (DESIGN.md §1).
#pragma once

#include <string>
#include <vector>

#include "tools/result.h"

namespace probefs::tools {

// The tracefs to use: --target MOUNTPOINT when given; else $TRACEFS_PATH; else the current
// directory when it is a probefs mount (fuse.probefs in /proc/self/mountinfo, or a
// directory holding uprobe_events and README); else -ENOENT with
// "No tracefs given: use --target MOUNTPOINT or TRACEFS_PATH".
Result<std::string> find_tracefs(const std::string& target_option);

// A defined dynamic event as read back from uprobe_events / kprobe_events.
struct DefinedEvent {
  char kind = 'p';       // 'p' or 'r'
  std::string group, event;
  std::string location;  // "/path/prog:0x0000000000001139" (uprobe) or "prog:func+4" (kprobe)
  std::string args;      // the rest of the line ("id=-20(%bp):s32 ...")
  std::string line;      // the whole line as read
  bool uprobe = true;    // from uprobe_events (else kprobe_events)
};

class Tracefs {
 public:
  explicit Tracefs(std::string dir) : dir_(std::move(dir)) {}
  const std::string& dir() const { return dir_; }

  // Every event defined in uprobe_events and kprobe_events (a file that does not exist is
  // empty).
  Result<std::vector<DefinedEvent>> events() const;

  // One write(2) of DEFINITION (with a newline) to uprobe_events, or kprobe_events when
  // KPROBE, opened O_WRONLY|O_APPEND. On failure: the write's -errno, and as the message
  // the kernel's error_log entry for it when there is a new one ("bad_arg: Invalid
  // argument ... \n  Command: ... \n             ^"), else strerror.
  Status add(const std::string& definition, bool kprobe);

  // Removes GROUP/EVENT ("-:GROUP/EVENT" to the file the event is in).
  Status remove(const DefinedEvent& event);

  // The README's text ("" when unreadable): perf looks for features there.
  std::string readme() const;

 private:
  std::string dir_;
};

}  // namespace probefs::tools
