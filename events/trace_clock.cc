#include "events/trace_clock.h"

#include <x86intrin.h>

#include <cerrno>
#include <cinttypes>
#include <cstdio>

namespace probefs::events {
namespace {

constexpr size_t kMaxPieces = 64;
constexpr int64_t kStepNs = 10'000'000;        // a larger difference is a step of the clock
constexpr int64_t kCalibrationNs = 10'000'000;
constexpr int64_t kLongRunNs = 1'000'000'000;
constexpr int64_t kMaxSlewDivisor = 1000;  // 1000 ppm

struct Names {
  TraceClock clock;
  std::string_view name;
};
constexpr Names kNames[] = {
    {TraceClock::kLocal, "local"},     {TraceClock::kGlobal, "global"},
    {TraceClock::kCounter, "counter"}, {TraceClock::kUptime, "uptime"},
    {TraceClock::kPerf, "perf"},       {TraceClock::kMono, "mono"},
    {TraceClock::kMonoRaw, "mono_raw"}, {TraceClock::kBoot, "boot"},
    {TraceClock::kTai, "tai"},         {TraceClock::kX86Tsc, "x86-tsc"},
};

clockid_t posix_clock_of(TraceClock c) {
  switch (c) {
    case TraceClock::kMono:
    case TraceClock::kUptime: return CLOCK_MONOTONIC;
    case TraceClock::kBoot: return CLOCK_BOOTTIME;
    case TraceClock::kTai: return CLOCK_TAI;
    default: return CLOCK_MONOTONIC_RAW;  // local, global, perf, mono_raw
  }
}

bool read_ns(clockid_t id, int64_t* ns) {
  timespec ts;
  if (clock_gettime(id, &ts) != 0) return false;
  *ns = static_cast<int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
  return true;
}

// A (TSC, clock) pair read as close together as this thread manages: the tightest of a
// few tries, the TSC taken halfway through the clock read.
bool sample(clockid_t id, uint64_t* tsc, int64_t* ns) {
  uint64_t best = UINT64_MAX;
  for (int i = 0; i < 8; ++i) {
    int64_t t;
    const uint64_t a = __rdtsc();
    if (!read_ns(id, &t)) return false;
    const uint64_t b = __rdtsc();
    if (b >= a && b - a < best) {
      best = b - a;
      *tsc = a + (b - a) / 2;
      *ns = t;
    }
  }
  return best != UINT64_MAX;
}

// ns per tick << 32 between two pairs; 0 if the TSC did not advance.
uint64_t mult_between(uint64_t tsc0, int64_t ns0, uint64_t tsc1, int64_t ns1) {
  if (tsc1 <= tsc0 || ns1 <= ns0) return 0;
  const unsigned __int128 num = static_cast<unsigned __int128>(ns1 - ns0) << 32;
  return static_cast<uint64_t>(num / (tsc1 - tsc0));
}

uint64_t measure_tsc_mult() {
  uint64_t tsc0, tsc1;
  int64_t ns0, ns1, now;
  for (int attempt = 0; attempt < 3; ++attempt) {
    if (!sample(CLOCK_MONOTONIC_RAW, &tsc0, &ns0)) break;
    do {
      if (!read_ns(CLOCK_MONOTONIC_RAW, &now)) return 0;
    } while (now - ns0 < kCalibrationNs);
    if (!sample(CLOCK_MONOTONIC_RAW, &tsc1, &ns1)) break;
    if (const uint64_t m = mult_between(tsc0, ns0, tsc1, ns1)) return m;
  }
  return 0;
}

}  // namespace

std::string_view trace_clock_name(TraceClock c) {
  for (const Names& n : kNames)
    if (n.clock == c) return n.name;
  return "local";
}

bool parse_trace_clock(std::string_view text, TraceClock* out) {
  const auto space = [](char ch) {
    return ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r' || ch == '\v' || ch == '\f';
  };
  while (!text.empty() && space(text.front())) text.remove_prefix(1);
  while (!text.empty() && space(text.back())) text.remove_suffix(1);
  for (const Names& n : kNames) {
    if (n.name == text) {
      *out = n.clock;
      return true;
    }
  }
  return false;
}

std::string trace_clock_file(TraceClock current) {
  std::string s;
  for (const Names& n : kNames) {
    if (!s.empty()) s += ' ';
    if (n.clock == current) {
      s += '[';
      s += n.name;
      s += ']';
    } else {
      s += n.name;
    }
  }
  s += '\n';
  return s;
}

bool trace_clock_in_ns(TraceClock c) {
  return c != TraceClock::kCounter && c != TraceClock::kUptime && c != TraceClock::kX86Tsc;
}

RingStampClock trace_clock_stamp(TraceClock c) {
  return c == TraceClock::kCounter ? kRingStampCounter : kRingStampTsc;
}

void format_trace_timestamp(std::string& out, TraceClock c, uint64_t value) {
  char buf[48];
  int n;
  if (trace_clock_in_ns(c)) {
    const uint64_t usecs = (value + 500) / 1000;
    n = snprintf(buf, sizeof buf, " %5" PRIu64 ".%06" PRIu64, usecs / 1000000,
                 usecs % 1000000);
  } else {
    n = snprintf(buf, sizeof buf, " %12" PRIu64, value);
  }
  if (n > 0) out.append(buf, static_cast<size_t>(n));
}

uint64_t tsc_ns_mult() {
  static const uint64_t mult = measure_tsc_mult();
  return mult;
}

int TraceClockConverter::calibrate(TraceClock clock) {
  clock_ = clock;
  posix_ = posix_clock_of(clock);
  pieces_.clear();
  if (clock == TraceClock::kCounter || clock == TraceClock::kX86Tsc) return 0;
  base_mult_ = tsc_ns_mult();
  if (base_mult_ == 0) return -EIO;
  uint64_t tsc;
  int64_t ns;
  if (!sample(posix_, &tsc, &ns)) return -errno;
  pieces_.push_back({tsc, ns, base_mult_});
  first_tsc_ = tsc;
  first_ns_ = ns;
  last_update_tsc_ = tsc;
  return 0;
}

void TraceClockConverter::update() {
  if (pieces_.empty()) return;
  uint64_t tsc;
  int64_t ns;
  if (!sample(posix_, &tsc, &ns) || tsc <= pieces_.back().tsc) return;
  const int64_t predicted = to_ns(tsc);
  const int64_t err = ns - predicted;
  Piece next;
  next.tsc = tsc;
  if (err > kStepNs || err < -kStepNs) {
    // The clock stepped: follow it, and measure its rate afresh from here.
    next.ns = ns;
    next.mult = base_mult_;
    first_tsc_ = tsc;
    first_ns_ = ns;
  } else {
    // Continue without a jump; over the next interval (as long as the last one) run at
    // the clock's long-run rate plus what takes up the difference.
    // The long-run rate once the anchor is far enough back to be precise.
    next.ns = predicted;
    uint64_t rate = ns - first_ns_ >= kLongRunNs ? mult_between(first_tsc_, first_ns_, tsc, ns)
                                                 : base_mult_;
    if (rate == 0) rate = base_mult_;
    const uint64_t interval = tsc - last_update_tsc_;
    __int128 correction =
        interval ? (static_cast<__int128>(err) << 32) / static_cast<__int128>(interval) : 0;
    // At most what NTP slews by (500 ppm), twice over: frequent updates cannot swing the
    // rate, and a larger difference is taken up over several intervals.
    const __int128 limit = static_cast<__int128>(rate) / kMaxSlewDivisor;
    if (correction > limit) correction = limit;
    if (correction < -limit) correction = -limit;
    next.mult = static_cast<uint64_t>(static_cast<__int128>(rate) + correction);
  }
  last_update_tsc_ = tsc;
  if (pieces_.size() == kMaxPieces) pieces_.erase(pieces_.begin());
  pieces_.push_back(next);
}

}  // namespace probefs::events
