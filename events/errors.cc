#include "events/errors.h"

#include <cstdio>

namespace probefs::events {
namespace {

struct Entry {
  std::string_view message;
  int err;
};

constexpr Entry kCatalogue[] = {
#define PROBEFS_EVENTS_ERROR_ROW(code, msg, err) {msg, err},
    PROBEFS_EVENTS_ERRORS(PROBEFS_EVENTS_ERROR_ROW)
#undef PROBEFS_EVENTS_ERROR_ROW
};

}  // namespace

std::string_view error_message(ErrorCode code) {
  return kCatalogue[static_cast<size_t>(code)].message;
}

int error_errno(ErrorCode code) { return kCatalogue[static_cast<size_t>(code)].err; }

std::string format_error_log_entry(uint64_t timestamp_ns, const Diagnostic& d) {
  char stamp[48];
  std::snprintf(stamp, sizeof stamp, "[%5llu.%06u] ",
                static_cast<unsigned long long>(timestamp_ns / 1000000000ull),
                static_cast<unsigned>((timestamp_ns % 1000000000ull) / 1000));
  std::string out = stamp;
  if (d.location.empty()) out += d.subsystem;
  else out += d.location;
  out += ": error: ";
  out += d.message();
  out += "\n  Command: ";
  out += d.command;
  out += '\n';
  out.append(11 + static_cast<size_t>(d.pos < 0 ? 0 : d.pos), ' ');
  out += "^\n";
  return out;
}

}  // namespace probefs::events
