// The tracefs error_log: the last few positioned errors of the dynamic-event files and
// the event filters, each shown as the kernel shows it (events::format_error_log_entry).
//
// Threads: any thread may add, read or clear; one lock guards the entries.
#pragma once

#include <cstdint>
#include <deque>
#include <mutex>
#include <string>

#include "events/errors.h"

namespace probefs::fs {

class ErrorLog {
 public:
  // The kernel keeps this many entries and drops the oldest.
  static constexpr size_t kMaxEntries = 8;

  // Adds `d` (nothing for a diagnostic that is not logged), stamped now.
  void add(const events::Diagnostic& d);
  std::string text() const;
  void clear();

 private:
  struct Entry {
    uint64_t timestamp_ns;
    events::Diagnostic diag;
  };
  mutable std::mutex mu_;
  std::deque<Entry> entries_;  // oldest first
};

}  // namespace probefs::fs
