// saved_tgids: the thread group (process) of each thread seen, "TID TGID" a line in
// ascending TID order, as the kernel lists its tgid map. The kernel notes a thread's
// group as it records; probefs learns it from the records (whose writer the tracer
// knows), from trace_marker's writers, and, for threads whose records readers already
// took (saved_cmdlines names them), from /proc while they live.
//
// Threads: any; one lock.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <string_view>

namespace probefs::fs {

class SavedTgids {
 public:
  // The threads kept, the newest: PID_MAX_DEFAULT, as many as saved_cmdlines can name.
  static constexpr size_t kCapacity = 32768;

  // Thread `tid` belongs to `tgid` (a thread id reused by another process moves).
  void save(pid_t tid, pid_t tgid);
  // For each thread of saved_cmdlines's text ("TID COMM" lines) not known yet, its group
  // as `tgid_of` finds it (0: unknown, nothing saved).
  void save_missing(std::string_view cmdlines_text, const std::function<pid_t(pid_t)>& tgid_of);
  std::string show() const;

 private:
  mutable std::mutex mu_;
  std::deque<pid_t> order_;       // oldest first
  std::map<pid_t, pid_t> tgids_;  // by thread, ascending: show()'s order
};

}  // namespace probefs::fs
