// The files of a tracefs (a probefs mount, or the kernel's own) as the helper uses them:
// finding the mount, writing definitions, reading back the events that are defined, and
// the kernel's error for a refused write (errno, and the error_log entry with its caret).
// Plain system calls on the mount's files only (DESIGN.md §1).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tools/result.h"

namespace probefs::tools {

// The tracefs to use, as an absolute path except for TRACEFS_PATH:
// - --target DIR when given: DIR must be a probefs mount (a "fuse.probefs" mount point in
//   /proc/self/mountinfo) or a directory holding uprobe_events and README (the kernel's
//   tracefs, a test directory); else -ENOENT ("--target DIR: not a tracefs ...") or the
//   errno of the failed look-up;
// - else $TRACEFS_PATH when set and not empty, taken as it is, as perf takes it;
// - else the current directory when it is a tracefs in the sense above;
// - else -ENOENT with "No tracefs given: use --target MOUNTPOINT or TRACEFS_PATH".
Result<std::string> find_tracefs(const std::string& target_option);

// A defined dynamic event as read back from uprobe_events / kprobe_events.
struct DefinedEvent {
  char kind = 'p';       // 'p' or 'r'
  std::string group, event;
  std::string location;  // "/path/prog:0x0000000000001139" (uprobe) or "prog:func+4" (kprobe)
  std::string args;      // the rest of the line ("id=-20(%bp):s32 ..."); "" when none
  std::string line;      // the whole line as read
  bool uprobe = true;    // from uprobe_events (else kprobe_events)
  // The location's parts. Uprobe: PATH:0xOFFSET[(0xREF_CTR)].
  std::string path;
  uint64_t file_offset = 0;
  uint64_t ref_ctr_offset = 0;
  // Kprobe: SYMBOL[+OFFSET], SYMBOL as read ("prog:func", "func", or an address "0x...").
  std::string symbol;
  uint64_t symbol_offset = 0;
};

// One entry of error_log:
//   "[  562.864839] trace_uprobe: error: Invalid register name\n"
//   "  Command: p:uprobes/e7 /path/prog:0x1370 a=%foo\n"
//   "                                             ^\n"
struct LogEntry {
  std::string source;   // "trace_uprobe", "trace_kprobe", "event filter parse error"
  std::string message;  // "Invalid register name"
  std::string command;  // the refused command as the kernel logged it
  int caret = 0;        // the byte of COMMAND the caret is under (may be command.size())
};

// TEXT as one error_log entry (the kernel's three lines, the timestamp optional, the last
// newline optional); nullopt for anything else, e.g. the strerror message of a refused
// write that left no entry.
std::optional<LogEntry> parse_log_entry(std::string_view text);

class Tracefs {
 public:
  explicit Tracefs(std::string dir) : dir_(std::move(dir)) {}
  const std::string& dir() const { return dir_; }

  // Every event defined in uprobe_events and kprobe_events (a file that does not exist is
  // empty; a line of neither form is skipped). Another failure to read a file: its -errno
  // with "Failed to open uprobe_events: REASON".
  Result<std::vector<DefinedEvent>> events() const;

  // One write(2) of DEFINITION (with a newline) to uprobe_events, or kprobe_events when
  // KPROBE, opened O_WRONLY|O_APPEND. On failure the -errno, and as the message:
  // - when error_log gained an entry during the write, that entry's text as the log has
  //   it, its three lines (the last newline dropped): parse_log_entry() gives its message,
  //   command and caret, for the caller to print under perf's
  //   "Error: Failed to add events. Reason: Invalid argument (Code: -22)";
  // - else perf's "Failed to write event: Invalid argument" (or "Failed to open
  //   uprobe_events: REASON" when the file cannot be opened).
  Status add(const std::string& definition, bool kprobe);

  // Removes GROUP/EVENT ("-:GROUP/EVENT" to the file the event is in). On failure the
  // -errno (-ENOENT when there is no such event, -EBUSY while it is enabled) with perf's
  // "Failed to delete event: Device or resource busy".
  Status remove(const DefinedEvent& event);

  // The README's text ("" when unreadable): perf looks for features there.
  std::string readme() const;

  // A probefs mount's `targets`: "attach PID" written to it. Ok when PID is a target now
  // (or was already); else the -errno with the mount's answer ("no such process", ...),
  // -ENOENT when the tracefs has no `targets` (the kernel's).
  Status attach(int pid) const;

 private:
  std::string dir_;
};

}  // namespace probefs::tools
