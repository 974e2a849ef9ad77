// /proc/PID: what the daemon reads of a process or of one of its threads (state, parent,
// start time, name, status fields, links), in one place. Daemon side.
//
// Some of what these files say is the process's own to choose: its name (prctl(PR_SET_NAME),
// or a write to /proc/PID/comm) may hold ')', '(', spaces and newlines. So every read is
// bounded (kProcTextMax), every parse takes any text without crashing, and the name in stat
// ends at the LAST ')' of the file.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

namespace probefs::tracee {

// The most read of any one file: far above stat (a few hundred bytes, a name of at most
// 64 among them) and status (a few KiB, more only with thousands of supplementary groups).
inline constexpr size_t kProcTextMax = 16384;

// "/proc/PID/LEAF", or with a thread (tid > 0) "/proc/PID/task/TID/LEAF"; an empty leaf
// names the directory ("/proc/PID/").
std::string proc_path(pid_t pid, pid_t tid, const char* leaf);

// The text of file `path`, at most `max` bytes (the rest is left unread), opened
// O_CLOEXEC and read until its end. 0, or the negative errno of the open or a read.
[[nodiscard]] int read_proc_text(const char* path, std::string* out, size_t max = kProcTextMax);

// read_proc_text of proc_path(pid, tid, leaf). -ESRCH for pid <= 0 or tid < 0 without
// looking; -ENOENT (or -ESRCH from a read) when the process or thread is gone.
[[nodiscard]] int read_proc_file(pid_t pid, pid_t tid, const char* leaf, std::string* out,
                                 size_t max = kProcTextMax);

// ---- stat ------------------------------------------------------------------------------

// What /proc/PID/stat (or a thread's) says:
//   PID (COMM) STATE PPID PGRP SESSION TTY TPGID FLAGS MINFLT CMINFLT MAJFLT CMAJFLT UTIME
//   STIME CUTIME CSTIME PRIORITY NICE THREADS ITREALVALUE STARTTIME ...
// COMM is raw (no escapes): it lies between the first '(' and the LAST ')'.
struct ProcStat {
  std::string comm;
  char state = 0;      // R S D T t Z X I ...
  pid_t ppid = -1;     // field 4
  uint64_t start = 0;  // field 22: clock ticks after boot; with the pid, tells a process
                       // from a later one that got its number
};

// Parses stat text. False when it is not one: no "(...)", no state, a field missing or
// not a number (out is then partly filled).
[[nodiscard]] bool parse_proc_stat(std::string_view text, ProcStat* out);

// Reads and parses /proc/PID/stat (tid 0) or /proc/PID/task/TID/stat. 0, -EINVAL when
// the text does not parse, or read_proc_file's error.
[[nodiscard]] int read_proc_stat(pid_t pid, pid_t tid, ProcStat* out);

// The scheduler state letter (R, S, D, T, t, Z, X, ...) of a process or thread; 0 when it
// cannot be read (gone).
char proc_state(pid_t pid, pid_t tid = 0);

// Whether `pid` runs: it exists and is neither a zombie (Z) nor dead (X).
bool process_running(pid_t pid);

// Whether `pid` is stopped now: job control (SIGSTOP: T) or a debugger's stop (t).
bool process_stopped(pid_t pid);

// ---- status ----------------------------------------------------------------------------

// The text of /proc/PID/status, looked up by field name ("Tgid", "PPid", "TracerPid",
// "Uid", "Gid", "CapEff", "Kthread", ...). The kernel escapes the name on its "Name:"
// line, so no line of it is the process's to forge.
class ProcStatus {
 public:
  ProcStatus() = default;
  explicit ProcStatus(std::string text) : text_(std::move(text)) {}

  // Reads /proc/PID/status (tid 0) or the thread's, at most `max` bytes (the fields wanted
  // may be near the start: Tgid is in the first hundred). 0 or read_proc_file's error.
  [[nodiscard]] int read(pid_t pid, pid_t tid = 0, size_t max = kProcTextMax);

  // The value of the first line "NAME:", the blanks after the colon left out; empty when
  // there is no such line (or it is empty).
  std::string_view field(std::string_view name) const;

  // The index-th blank-separated number of field NAME (Uid and Gid: real, effective,
  // saved, filesystem), in `base` (CapEff is hexadecimal). False when the field or that
  // number is missing, or is not a whole number that fits.
  [[nodiscard]] bool number(std::string_view name, uint64_t* out, int index = 0,
                            int base = 10) const;

  const std::string& text() const { return text_; }

 private:
  std::string text_;
};

// The thread group (process) of thread `tid`: status's Tgid; 0 when it cannot be read.
pid_t proc_tgid(pid_t tid);

// ---- comm and links --------------------------------------------------------------------

// The name of a process (tid 0) or of one of its threads: /proc/PID/comm, up to its first
// newline (the kernel ends it with one; a name that holds one is cut there, so it cannot
// add a line to a file it is printed in). 0 or read_proc_file's error.
[[nodiscard]] int read_proc_comm(pid_t pid, pid_t tid, std::string* out);

// read_proc_comm's name, "" when it cannot be read.
std::string proc_comm(pid_t pid, pid_t tid = 0);

// Where link LEAF of /proc/PID (or of thread tid) points ("exe", "cwd"): "" when it
// cannot be read or is longer than PATH_MAX. A deleted file keeps the kernel's
// " (deleted)".
std::string proc_link(pid_t pid, pid_t tid, const char* leaf);

// The executable of `pid`: proc_link(pid, 0, "exe").
std::string proc_exe(pid_t pid);

}  // namespace probefs::tracee
