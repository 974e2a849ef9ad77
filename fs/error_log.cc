#include "fs/error_log.h"

#include <time.h>

namespace probefs::fs {
namespace {

// The kernel stamps its entries with its local clock, the one dmesg shows (time since
// boot, suspend excluded). CLOCK_MONOTONIC is the same count as a process sees it.
uint64_t now_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

}  // namespace

void ErrorLog::add(const events::Diagnostic& d) {
  if (!d.logged()) return;
  uint64_t ts = now_ns();
  std::lock_guard l(mu_);
  if (entries_.size() == kMaxEntries) entries_.pop_front();
  entries_.push_back({ts, d});
}

std::string ErrorLog::text() const {
  std::lock_guard l(mu_);
  std::string out;
  for (const Entry& e : entries_) out += events::format_error_log_entry(e.timestamp_ns, e.diag);
  return out;
}

void ErrorLog::clear() {
  std::lock_guard l(mu_);
  entries_.clear();
}

}  // namespace probefs::fs
