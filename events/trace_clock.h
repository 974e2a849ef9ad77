// trace_clock: the clocks the kernel offers for ordering and printing events, and the
// conversion of a ring record's stamp (events/ring.h) into the chosen clock (daemon side).
//
// The file reads "[local] global counter uptime perf mono mono_raw boot tai x86-tsc" with
// brackets around the current clock. Records are stamped in the traced process with the
// TSC (or, for `counter`, the area's counter), and the daemon converts:
//
//   clock     kernel source                    here                            printed
//   local     sched_clock(): ns since boot,    TSC scaled against              s.us
//             the TSC's own rate, per CPU      CLOCK_MONOTONIC_RAW
//   global    local, made monotonic across     as local: the TSC is one        s.us
//             CPUs                             synchronised counter on the
//                                              machines probefs runs on
//                                              (constant_tsc), and the
//                                              merger emits in stamp order
//   perf      local_clock()                    as local                        s.us
//   mono      ktime_get_mono_fast_ns()         TSC against CLOCK_MONOTONIC     s.us
//   mono_raw  ktime_get_raw_fast_ns()          TSC against CLOCK_MONOTONIC_RAW s.us
//   boot      ktime_get_boot_fast_ns()         TSC against CLOCK_BOOTTIME      s.us
//   tai       ktime_get_tai_fast_ns()          TSC against CLOCK_TAI           s.us
//   uptime    jiffies since boot in USER_HZ    CLOCK_MONOTONIC ns / 10^7       raw
//             (100) ticks
//   counter   an atomic increment              the area's counter (one per     raw
//                                              traced process: across
//                                              processes it orders nothing)
//   x86-tsc   rdtsc                            the TSC as read                 raw
//
// "s.us" is the kernel's " %5lu.%06lu" of the value rounded to microseconds; "raw" is its
// " %12llu" (clocks that do not count nanoseconds). Changing the clock empties the buffers
// in the kernel; the daemon does the same (RingAreaReader::clear), so records stamped
// under two modes never mix. A stamp taken as a counter is returned as it is whatever the
// clock.
//
// Conversion: ns = anchor_ns + (tsc - anchor_tsc) * mult >> 32, piecewise. The TSC rate
// is measured once per daemon against CLOCK_MONOTONIC_RAW (over about 10 ms); each clock
// then takes one (TSC, clock) pair as its anchor. update(), called about once a second,
// starts a new piece at the current TSC that continues the last one without a jump, at
// the clock's rate measured since its anchor (once that is a second old), corrected by at
// most 1000 ppm towards the POSIX clock (NTP slews CLOCK_MONOTONIC by up to 500 ppm); a
// difference of more than 10 ms (a suspend for `boot`, a settime for `tai`) is taken as a
// step instead, as the clock itself stepped. So converted values never decrease as the
// TSC grows, except where the POSIX clock itself stepped back.
//
// Threads: a converter belongs to one thread (the daemon's consumer); the functions of
// names and text are pure.
#pragma once

#include <time.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "events/ring.h"

namespace probefs::events {

enum class TraceClock : uint8_t {
  kLocal, kGlobal, kCounter, kUptime, kPerf, kMono, kMonoRaw, kBoot, kTai, kX86Tsc,
};
inline constexpr TraceClock kTraceClocks[] = {
    TraceClock::kLocal, TraceClock::kGlobal, TraceClock::kCounter, TraceClock::kUptime,
    TraceClock::kPerf,  TraceClock::kMono,   TraceClock::kMonoRaw, TraceClock::kBoot,
    TraceClock::kTai,   TraceClock::kX86Tsc,
};

std::string_view trace_clock_name(TraceClock c);

// A name written to trace_clock (surrounding whitespace, such as echo's newline, is
// ignored, as the kernel strips it). False for an unknown name (the kernel's EINVAL).
[[nodiscard]] bool parse_trace_clock(std::string_view text, TraceClock* out);

// The file's text: every clock, the current one in brackets, and a newline.
std::string trace_clock_file(TraceClock current);

// Whether values of the clock are nanoseconds (printed as seconds.microseconds).
bool trace_clock_in_ns(TraceClock c);

// What the producers must stamp records with for this clock.
RingStampClock trace_clock_stamp(TraceClock c);

// Appends the timestamp column without its colon: " %5lu.%06lu" for clocks in ns, else
// " %12llu", as the kernel prints it.
void format_trace_timestamp(std::string& out, TraceClock c, uint64_t value);

// Nanoseconds per TSC tick << 32 (ns = ticks * mult >> 32), measured once per process
// against CLOCK_MONOTONIC_RAW (about 10 ms, busy; thread-safe).
uint64_t tsc_ns_mult();

class TraceClockConverter {
 public:
  // Sets the clock and anchors it to the TSC now (measuring the TSC rate first if this
  // process has not yet). 0, or -errno if the clock's POSIX clock is not readable.
  [[nodiscard]] int calibrate(TraceClock clock);

  // Re-anchors against the POSIX clock (see above). About once a second.
  void update();

  // The value of the clock for a record's stamp (`counter_stamp`: the stamp is the
  // area's counter, kRingFlagCounterStamp).
  uint64_t convert(uint64_t stamp, bool counter_stamp) const;

  TraceClock clock() const { return clock_; }

 private:
  struct Piece {
    uint64_t tsc;
    int64_t ns;
    uint64_t mult;  // ns per tick << 32
  };
  int64_t to_ns(uint64_t tsc) const;

  TraceClock clock_ = TraceClock::kLocal;
  clockid_t posix_ = CLOCK_MONOTONIC_RAW;
  std::vector<Piece> pieces_;  // ascending tsc; at most kMaxPieces
  uint64_t base_mult_ = 0;     // the TSC rate measured against CLOCK_MONOTONIC_RAW
  uint64_t first_tsc_ = 0;     // the anchor the long-run rate is measured from
  int64_t first_ns_ = 0;
  uint64_t last_update_tsc_ = 0;
};

// The uptime clock's tick (USER_HZ = 100).
inline constexpr uint64_t kNsPerUptimeTick = 10'000'000;

// Per record: inline.
inline int64_t TraceClockConverter::to_ns(uint64_t tsc) const {
  // Nearly every stamp: after the last anchor, by less than 2^40 ticks (minutes). One
  // unsigned multiply, and no sum can overflow: the product shifted is below 2^48.
  const Piece& newest = pieces_.back();
  const uint64_t since = tsc - newest.tsc;
  if (tsc >= newest.tsc && since < (uint64_t{1} << 40) && newest.mult < (uint64_t{1} << 40) &&
      newest.ns >= 0 && newest.ns < INT64_MAX - (int64_t{1} << 48)) {
    return newest.ns +
           static_cast<int64_t>((static_cast<unsigned __int128>(since) * newest.mult) >> 32);
  }
  // The last piece that starts at or before tsc (the first for earlier stamps).
  size_t i = pieces_.size() - 1;
  while (i > 0 && pieces_[i].tsc > tsc) --i;
  const Piece& p = pieces_[i];
  const __int128 delta = static_cast<__int128>(tsc) - static_cast<__int128>(p.tsc);
  const __int128 scaled = delta * static_cast<__int128>(p.mult);
  // Arithmetic shift: floor for stamps before the anchor, so the map stays monotonic.
  // A stamp from a hostile process can be anything: saturate rather than wrap.
  const __int128 ns = static_cast<__int128>(p.ns) + (scaled >> 32);
  if (ns > INT64_MAX) return INT64_MAX;
  if (ns < INT64_MIN) return INT64_MIN;
  return static_cast<int64_t>(ns);
}

inline uint64_t TraceClockConverter::convert(uint64_t stamp, bool counter_stamp) const {
  if (counter_stamp || pieces_.empty()) return stamp;
  const int64_t ns = to_ns(stamp);
  const uint64_t v = ns < 0 ? 0 : static_cast<uint64_t>(ns);
  return clock_ == TraceClock::kUptime ? v / kNsPerUptimeTick : v;
}

}  // namespace probefs::events
