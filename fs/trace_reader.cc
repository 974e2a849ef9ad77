#include "fs/trace_reader.h"
#include "fs/trace_reader_direct.h"

#include <time.h>
#include <x86intrin.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <unordered_set>

#include "events/output.h"
#include "events/record.h"
#include "fs/settings_files.h"
#include "tracee/proc_info.h"
#include "tracee/proc_maps.h"

namespace probefs::fs {
namespace {

using Clock = std::chrono::steady_clock;

// A thread's name is read again when it is older than this (a thread may rename itself).
constexpr int64_t kCommRefreshMs = 1000;
// Caches of threads bigger than this are emptied (or pruned) rather than grown.
constexpr size_t kMaxComms = 16384;
constexpr size_t kMaxIdleGates = 4096;
// Threads whose scope is remembered at once; past it the memory starts again.
constexpr size_t kMaxScopeThreads = 16384;
// How far up its parents a process is followed under event-fork.
constexpr int kMaxAncestors = 64;
// The background waiter's wait on the tracer, and its pause when records are there that
// none of the waiting readers takes (another CPU's).
constexpr int kTracerWaitMs = 100;
constexpr auto kRecheck = std::chrono::milliseconds(2);
// What format_trace_line writes before the event name for an empty name, pid 0, CPU 0 and
// time 0: "%16s-%-7d [%03d] FFFFF %5lu.%06lu: ".
constexpr size_t kBlankContext = 51;

int32_t load32(const uint8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

int64_t coarse_ms() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000 + ts.tv_nsec / 1000000;
}

void append_number(std::string& out, int64_t v) {
  char buf[24];
  auto r = std::to_chars(buf, buf + sizeof buf, v);
  out.append(buf, static_cast<size_t>(r.ptr - buf));
}

// `v` in a column of `width`, on the left (pad after) or the right (pad before).
void append_padded(std::string& out, int64_t v, size_t width, bool left, char pad = ' ') {
  char buf[24];
  auto r = std::to_chars(buf, buf + sizeof buf, v);
  const size_t n = static_cast<size_t>(r.ptr - buf);
  if (!left && n < width) out.append(width - n, pad);
  out.append(buf, n);
  if (left && n < width) out.append(width - n, pad);
}

// The clock's value now, for per_cpu stats ("now ts"). The tracer converts record stamps
// against the same POSIX clocks (events/trace_clock.h); counter has no value outside a
// traced process and reads 0.
uint64_t clock_now(events::TraceClock c) {
  clockid_t id = CLOCK_MONOTONIC_RAW;
  switch (c) {
    case events::TraceClock::kCounter: return 0;
    case events::TraceClock::kX86Tsc: return __rdtsc();
    case events::TraceClock::kMono:
    case events::TraceClock::kUptime: id = CLOCK_MONOTONIC; break;
    case events::TraceClock::kBoot: id = CLOCK_BOOTTIME; break;
    case events::TraceClock::kTai: id = CLOCK_TAI; break;
    default: break;
  }
  timespec ts;
  clock_gettime(id, &ts);
  uint64_t ns = static_cast<uint64_t>(ts.tv_sec) * 1000000000u + static_cast<uint64_t>(ts.tv_nsec);
  return c == events::TraceClock::kUptime ? ns / 10000000u : ns;
}

// "%5llu.%06lu" of a time in ns rounded to microseconds, or "%llu" for other clocks.
std::string stats_time(events::TraceClock c, uint64_t v) {
  char buf[48];
  if (events::trace_clock_in_ns(c)) {
    const uint64_t us = (v + 500) / 1000;
    snprintf(buf, sizeof buf, "%5" PRIu64 ".%06" PRIu64, us / 1000000, us % 1000000);
  } else {
    snprintf(buf, sizeof buf, "%" PRIu64, v);
  }
  return buf;
}

constexpr std::string_view kLegendTgid =
    "#                                          _-----=> irqs-off/BH-disabled\n"
    "#                                         / _----=> need-resched\n"
    "#                                        | / _---=> hardirq/softirq\n"
    "#                                        || / _--=> preempt-depth\n"
    "#                                        ||| / _-=> migrate-disable\n"
    "#                                        |||| /     delay\n"
    "#           TASK-PID       TGID    CPU#  |||||  TIMESTAMP  FUNCTION\n"
    "#              | |           |       |   |||||     |         |\n";
constexpr std::string_view kColumnsNoIrq =
    "#           TASK-PID     CPU#     TIMESTAMP  FUNCTION\n"
    "#              | |         |         |         |\n";
constexpr std::string_view kColumnsNoIrqTgid =
    "#           TASK-PID       TGID    CPU#     TIMESTAMP  FUNCTION\n"
    "#              | |           |       |         |         |\n";

}  // namespace

// ---- SavedCmdlines -------------------------------------------------------------------------

void SavedCmdlines::save(pid_t tid, std::string_view comm) {
  std::lock_guard l(mu_);
  auto [it, inserted] = comm_.try_emplace(tid, comm);
  if (!inserted) {
    if (it->second != comm) it->second.assign(comm);
    return;
  }
  order_.push_back(tid);
  while (order_.size() > capacity_) {
    comm_.erase(order_.front());
    order_.pop_front();
  }
}

std::string SavedCmdlines::show() const {
  std::lock_guard l(mu_);
  std::string out;
  for (pid_t tid : order_) {
    auto it = comm_.find(tid);
    if (it == comm_.end()) continue;
    append_number(out, tid);
    out.push_back(' ');
    out += it->second;
    out.push_back('\n');
  }
  return out;
}

uint32_t SavedCmdlines::size() const {
  std::lock_guard l(mu_);
  return capacity_;
}

void SavedCmdlines::resize(uint32_t n) {
  std::lock_guard l(mu_);
  capacity_ = n;
  while (order_.size() > capacity_) {
    comm_.erase(order_.front());
    order_.pop_front();
  }
}

// ---- TraceReader: construction and options ---------------------------------------------------

TraceReader::TraceReader(Tracefs& fs, SavedCmdlines& cmdlines, uint32_t buffer)
    : fs_(fs), tracer_(fs.tracer()), cmdlines_(cmdlines), buffer_(buffer) {
  views_.resize(kLastEventId - kFirstEventId + 1);
  read_events_.assign(static_cast<size_t>(fs.cpus()), 0);
  dropped_events_.assign(static_cast<size_t>(fs.cpus()), 0);
  // The tracer's clock, from its file's bracketed name.
  std::string text = tracer_.trace_clock_text();
  size_t open = text.find('['), close = text.find(']');
  events::TraceClock c;
  if (open != std::string::npos && close > open &&
      events::parse_trace_clock(std::string_view(text).substr(open + 1, close - open - 1), &c))
    clock_ = c;
}

TraceReader::~TraceReader() { stop(); }

void TraceReader::set_options(const TextOptions& o) {
  std::lock_guard l(opt_mu_);
  opts_ = o;
}

TextOptions TraceReader::options() const {
  std::lock_guard l(opt_mu_);
  return opts_;
}

std::unique_lock<std::mutex> TraceReader::lock() {
  std::unique_lock<std::mutex> l(mu_);
  begin_fill();
  settle_snapshots();
  // Restored records, and records a snapshot request may send elsewhere, are consumed
  // from a batch, never straight from the rings.
  if (restored_.left() != 0 || snapshot_.allocated) fill_direct_ = false;
  return l;
}

void TraceReader::begin_fill() {
  ++fill_gen_;
  fill_opts_ = options();
  fill_clock_ = clock();
  fill_fast_ = fill_opts_.irq_info && fill_opts_.context_info && !fill_opts_.record_tgid &&
               events::trace_clock_in_ns(fill_clock_);
  fill_now_ms_ = coarse_ms();
  fill_scope_ = scope_ ? scope_->scope_version() : 0;
  if (fill_scope_ != 0) {
    const bool follow = event_fork_ && event_fork_();
    if (fill_scope_ != scope_seen_ || follow != scope_follow_ ||
        scope_threads_.size() > kMaxScopeThreads) {
      scope_seen_ = fill_scope_;
      scope_follow_ = follow;
      scope_threads_.clear();
      scope_cpus_.assign(static_cast<size_t>(fs_.cpus()), 0);
      for (int cpu = 0; cpu < fs_.cpus(); ++cpu) scope_cpus_[cpu] = scope_->cpu_traced(cpu);
    }
  }
  fill_direct_ = fill_scope_ == 0;
  symbolizers_.clear();
  maps_.clear();
  if (comms_.size() > kMaxComms) comms_.clear();
}

int TraceReader::reset_buffer(const std::function<int()>& op) {
  std::lock_guard l(mu_);
  int err = op();
  if (err == 0) {
    gates_.clear();
    ++clear_gen_;
    std::fill(read_events_.begin(), read_events_.end(), 0);
    std::fill(dropped_events_.begin(), dropped_events_.end(), 0);
    restored_ = Batch{};
  }
  return err;
}

TraceReader::Cursor TraceReader::start_cursor() {
  std::lock_guard l(mu_);
  Cursor c;
  c.clear_gen = clear_gen_;
  return c;
}

// ---- the gate ------------------------------------------------------------------------------

TraceReader::ThreadGate& TraceReader::gate(uint64_t key) {
  auto [it, inserted] = gates_.try_emplace(key);
  if (inserted) it->second.incarnation = next_incarnation_++;
  return it->second;
}

bool TraceReader::admit_new(const Held& h, const uint8_t* data) {
  if (h.len < 8) return false;
  const uint16_t id = load16(data);
  // Markers are the daemon's own.
  if (id == kMarkerEventId || id == kMarkerRawEventId) return h.pid == 0;
  // A stack record is its thread's, kept by the same rules as the thread's events: one
  // after an event's record (options/stacktrace) goes where that record goes, and the
  // stack a stacktrace trigger takes at the hit of a soft-disabled event, which wrote no
  // record, is kept as the kernel keeps it.
  if (id == events::kKernelStackEventId || id == events::kUserStackEventId) {
    if (h.pid == 0 || !stack_record_fits(id, data, h.len)) return false;
    return fill_scope_ == 0 || in_scope(h);
  }
  return admit_event(h, data, id);
}

bool TraceReader::admit_event(const Held& h, const uint8_t* data, uint16_t id) {
  if (fill_scope_ != 0 && !in_scope(h)) return false;
  const EventView* v = view(id);
  if (!v) return false;
  // A record its event's program cannot have written is dropped here, before a trigger,
  // filter or line sees it, and counted with the CPU's dropped events (stats).
  if (events::check_record(v->compiled, data, h.len) != events::RecordFault::kFits) {
    if (h.cpu < dropped_events_.size()) ++dropped_events_[h.cpu];
    return false;
  }
  return true;
}

void TraceReader::set_scope(const SettingsFiles* settings, std::function<bool()> event_fork) {
  std::lock_guard l(mu_);
  scope_ = settings;
  event_fork_ = std::move(event_fork);
}

bool TraceReader::in_scope(const Held& h) {
  if (h.cpu >= scope_cpus_.size() || !scope_cpus_[h.cpu]) return false;
  auto [it, added] = scope_threads_.try_emplace(key_of(h.pid, h.tid), false);
  if (added) it->second = pid_in_scope(h.pid, h.tid);
  return it->second;
}

// The kernel keeps a task's events when set_event_pid (if not empty) lists it and
// set_event_notrace_pid does not; with event-fork it adds the threads and processes a
// listed task makes as they are made. Here that is: a thread of a listed process, or of
// a process with a listed ancestor, is kept, unless it is refused itself.
bool TraceReader::pid_in_scope(pid_t tgid, pid_t tid) {
  if (scope_->event_pid_allowed(tid)) return true;
  if (!scope_follow_ || scope_->event_pid_refused(tid)) return false;
  pid_t p = tgid;
  for (int depth = 0; p > 1 && depth < kMaxAncestors; ++depth) {
    if (scope_->event_pid_allowed(p)) return true;
    // A target's parent as the tracer saw the fork (the child may be gone by now);
    // else the process's parent now.
    if (const pid_t parent = fs_.fork_parent(p); parent > 0) {
      p = parent;
      continue;
    }
    tracee::ProcStat st;
    if (tracee::read_proc_stat(p, 0, &st) != 0) break;
    p = st.ppid;
  }
  return false;
}

bool TraceReader::decide_consumed(ThreadGate& g, const Held& h, const uint8_t* data) {
  if (g.consumed < g.decided) {  // a `trace` reader decided it already
    const bool refused = !g.rejected.empty() && g.rejected.front() == g.consumed;
    if (refused) g.rejected.pop_front();
    ++g.consumed;
    return !refused;
  }
  ++g.consumed;
  ++g.decided;
  return admit_new(h, data);
}

void TraceReader::skip_consumed(ThreadGate& g) {
  if (g.consumed < g.decided) {
    if (!g.rejected.empty() && g.rejected.front() == g.consumed) g.rejected.pop_front();
  } else {
    ++g.decided;
  }
  ++g.consumed;
}

bool TraceReader::decide_peeked(ThreadGate& g, uint64_t index, const Held& h,
                                const uint8_t* data) {
  if (index < g.decided) return !std::binary_search(g.rejected.begin(), g.rejected.end(), index);
  g.decided = index + 1;  // index == decided: the walk meets a thread's records in order
  const bool ok = admit_new(h, data);
  if (!ok) g.rejected.push_back(index);
  return ok;
}

// Threads the last walk did not meet have no record in the buffer: whatever was decided
// for them was consumed or dropped with the buffer. A thread that records again starts
// afresh (a new incarnation, so no cursor mistakes its records for ones it passed).
void TraceReader::prune_unseen() {
  for (auto it = gates_.begin(); it != gates_.end();) {
    if (!it->second.seen) {
      it = gates_.erase(it);
      continue;
    }
    it->second.seen = false;
    ++it;
  }
}

// ---- consuming -------------------------------------------------------------------------------

size_t TraceReader::consume(Batch* b, size_t max, int cpu) {
  const size_t n = consume_raw(b, max, cpu);
  if (!snapshot_.allocated || n == 0) return n;
  // A target's snapshot request among them: the buffer and its snapshot swap there, so
  // what this consumer takes is what the buffer holds after the swaps.
  const size_t first = b->recs.size() - n;
  size_t k = first;
  while (k < b->recs.size() && !is_snapshot_request(*b, b->recs[k])) ++k;
  if (k == b->recs.size()) return n;
  Batch all;
  all.clear_gen = clear_gen_;
  for (size_t i = first; i < b->recs.size(); ++i) append_held(&all, *b, b->recs[i]);
  b->recs.resize(first);
  consume_raw(&all, SIZE_MAX, -1);
  // Of one CPU, then of every one: back in timestamp order.
  if (cpu >= 0)
    std::stable_sort(all.recs.begin(), all.recs.end(),
                     [](const Held& x, const Held& y) { return x.ts < y.ts; });
  snapshot_seen_ = tracer_.snapshot_requests(buffer_);
  replay_swaps(std::move(all));
  return take_restored(b, max, cpu);
}

bool TraceReader::is_snapshot_request(const Batch& b, const Held& h) {
  return h.len >= 8 && load16(b.bytes.data() + h.off) == events::kSnapshotRequestEventId;
}

void TraceReader::append_held(Batch* to, const Batch& from, const Held& h) {
  Held c = h;
  c.off = static_cast<uint32_t>(to->bytes.size());
  to->bytes.insert(to->bytes.end(), from.bytes.begin() + h.off, from.bytes.begin() + h.off + h.len);
  to->recs.push_back(c);
}

// Every record of the buffer now, in order, with the snapshot requests among them: the
// buffer (`main`) and the snapshot swap at each request, as the kernel's swaps did at
// each hit; what the buffer holds then is restored, read before anything written since.
void TraceReader::replay_swaps(Batch all) {
  Batch main;
  main.clear_gen = clear_gen_;
  for (size_t i = all.next; i < all.recs.size(); ++i) {
    const Held& h = all.recs[i];
    if (!is_snapshot_request(all, h)) {
      append_held(&main, all, h);
      continue;
    }
    std::swap(main, snapshot_.batch);
    main.next = 0;
    main.clear_gen = clear_gen_;
  }
  snapshot_.batch.next = 0;
  snapshot_.lost = 0;
  restore(std::move(main));
}

void TraceReader::settle_snapshots() {
  if (!snapshot_.allocated) return;
  const uint32_t requests = tracer_.snapshot_requests(buffer_);
  if (requests == snapshot_seen_) return;
  snapshot_seen_ = requests;
  Batch all;
  consume_raw(&all, SIZE_MAX, -1);
  replay_swaps(std::move(all));
}

void TraceReader::swap_snapshot() {
  Batch all;
  consume_raw(&all, SIZE_MAX, -1);
  snapshot_.allocated = true;
  // A request among them swaps there first; the swap asked for now comes last.
  replay_swaps(std::move(all));
  Batch main = std::move(restored_);
  restored_ = Batch{};
  uint64_t lost = 0;
  for (size_t i = main.next; i < main.recs.size(); ++i) lost += main.recs[i].lost_before;
  std::swap(main, snapshot_.batch);
  snapshot_.lost = lost;
  main.clear_gen = clear_gen_;
  restore(std::move(main));
}

void TraceReader::clear_snapshot() {
  snapshot_.batch = Batch{};
  snapshot_.lost = 0;
}

void TraceReader::free_snapshot() {
  clear_snapshot();
  snapshot_.allocated = false;
}

void TraceReader::allocate_snapshot() {
  if (!snapshot_.allocated) snapshot_seen_ = tracer_.snapshot_requests(buffer_);
  snapshot_.allocated = true;
}

size_t TraceReader::consume_raw(Batch* b, size_t max, int cpu) {
  if (b->clear_gen != clear_gen_ || b->next == b->recs.size()) {  // nothing worth keeping
    b->bytes.clear();
    b->recs.clear();
    b->next = 0;
    b->clear_gen = clear_gen_;
  }
  const size_t from_restored = take_restored(b, max, cpu);
  if (from_restored == max) return max;
  max -= from_restored;
  const size_t first = b->recs.size();
  const size_t n = tracer_.consume_records(
      [b](const tracee::TraceRecord& r) {
        Held h = held_of(r);
        h.off = copy_record(b->bytes, r);
        b->recs.push_back(h);
        return true;
      },
      max, cpu, buffer_);
  // The records are decided here, once the tracer's lock is released. Records come in runs of one
  // thread's: its entry is looked up once a run (entries stay where they are until the
  // pruning below).
  ThreadGate* g = nullptr;
  uint64_t g_key = 0;
  for (size_t i = first; i < b->recs.size(); ++i) {
    Held& h = b->recs[i];
    const uint8_t* d = b->bytes.data() + h.off;
    const uint64_t key = key_of(h.pid, h.tid);
    if (!g || key != g_key) {
      g = &gate(key);
      g_key = key;
    }
    h.shown = decide_consumed(*g, h, d);
    if (h.cpu < read_events_.size()) {
      ++read_events_[h.cpu];
      dropped_events_[h.cpu] += h.lost_before;
    }
  }
  prune_idle();
  if (n != 0) takes_.fetch_add(1, std::memory_order_relaxed);
  return from_restored + n;
}

size_t TraceReader::take_restored(Batch* b, size_t max, int cpu) {
  if (restored_.left() == 0) return 0;
  size_t n = 0;
  std::vector<Held> left;
  for (size_t i = restored_.next; i < restored_.recs.size(); ++i) {
    const Held& h = restored_.recs[i];
    if (n == max || (cpu >= 0 && static_cast<int>(h.cpu) != cpu)) {
      left.push_back(h);
      continue;
    }
    Held c = h;
    c.off = static_cast<uint32_t>(b->bytes.size());
    b->bytes.insert(b->bytes.end(), restored_.bytes.begin() + h.off,
                    restored_.bytes.begin() + h.off + h.len);
    b->recs.push_back(c);
    if (h.cpu < read_events_.size()) ++read_events_[h.cpu];
    ++n;
  }
  if (left.empty()) {
    restored_ = Batch{};
  } else {
    restored_.recs = std::move(left);
    restored_.next = 0;
  }
  return n;
}

void TraceReader::restore(Batch b) {
  if (b.clear_gen != clear_gen_) return;  // from before the buffer was emptied
  Batch kept;
  kept.clear_gen = clear_gen_;
  for (size_t i = b.next; i < b.recs.size(); ++i) {
    Held h = b.recs[i];
    const uint32_t off = h.off;
    h.off = static_cast<uint32_t>(kept.bytes.size());
    h.lost_before = 0;  // said where they were first read
    kept.bytes.insert(kept.bytes.end(), b.bytes.begin() + off, b.bytes.begin() + off + h.len);
    kept.recs.push_back(h);
  }
  restored_ = std::move(kept);
}

bool TraceReader::restored(int cpu) const {
  for (size_t i = restored_.next; i < restored_.recs.size(); ++i)
    if (cpu < 0 || static_cast<int>(restored_.recs[i].cpu) == cpu) return true;
  return false;
}

void TraceReader::prune_idle() {
  if (gates_.size() <= kMaxIdleGates) return;
  // A thread with nothing decided ahead of the consumers needs no entry: its records
  // still in the buffer were never passed by a cursor.
  for (auto it = gates_.begin(); it != gates_.end();)
    it = it->second.consumed == it->second.decided ? gates_.erase(it) : std::next(it);
}

void TraceReader::revalidate(Batch* b) {
  if (b->clear_gen == clear_gen_) return;
  b->bytes.clear();
  b->recs.clear();
  b->next = 0;
  b->clear_gen = clear_gen_;
}

void TraceReader::discard(int cpu) {
  std::lock_guard l(mu_);
  Batch gone;
  take_restored(&gone, SIZE_MAX, cpu);
  tracer_.consume_records(
      [this](const tracee::TraceRecord& r) {
        skip_consumed(gate(key_of(r.pid, r.tid)));
        return true;
      },
      SIZE_MAX, cpu, buffer_);
}

// ---- walking (trace) -----------------------------------------------------------------------

bool TraceReader::trace_chunk(Cursor* c, int cpu, std::string* out) {
  if (c->clear_gen != clear_gen_) return false;
  if (!c->restored_passed) {
    c->restored_passed = true;
    for (size_t i = restored_.next; i < restored_.recs.size(); ++i) {
      const Held& h = restored_.recs[i];
      if (h.shown && (cpu < 0 || static_cast<int>(h.cpu) == cpu))
        append_line(*out, h, restored_.bytes.data() + h.off);
    }
  }
  pass_.clear();
  peek_bytes_.clear();
  peeked_.clear();
  bool full = false;
  PassEntry* last = nullptr;
  tracer_.for_each_record([&](const tracee::TraceRecord& r) {
    const uint64_t key = key_of(r.pid, r.tid);
    PassEntry* pe = last && last->key == key ? last : nullptr;
    if (!pe) {
      auto [it, inserted] = pass_.try_emplace(key);
      pe = &it->second;
      if (inserted) {
        pe->key = key;
        pe->gate = &gate(key);
        pe->gate->seen = true;
        auto p = c->passed.find(key);
        if (p != c->passed.end() && p->second.first == pe->gate->incarnation)
          pe->first_unpassed = p->second.second;
      }
      last = pe;
    }
    const uint64_t index = pe->gate->consumed + pe->count++;
    if (full || index < pe->first_unpassed) return;
    Peeked p;
    p.h.pid = r.pid;
    p.h.tid = r.tid;
    p.h.cpu = r.cpu;
    p.h.ts = r.ts_ns;
    p.h.lost_before = r.lost_before;
    p.h.len = r.len;
    p.h.off = copy_record(peek_bytes_, r);
    p.gate = pe->gate;
    p.key = key;
    p.index = index;
    peeked_.push_back(p);
    if (peek_bytes_.size() >= kTraceChunkRecordBytes) full = true;
  }, buffer_);
  // Every record this chunk passes is decided in walk (timestamp) order, those of other
  // CPUs included, so that per_cpu/cpuN/trace keeps the gate's order too.
  for (Peeked& p : peeked_) {
    const uint8_t* d = peek_bytes_.data() + p.h.off;
    p.h.shown = decide_peeked(*p.gate, p.index, p.h, d);
    c->passed[p.key] = {p.gate->incarnation, p.index + 1};
    if (p.h.shown && (cpu < 0 || static_cast<int>(p.h.cpu) == cpu)) append_line(*out, p.h, d);
  }
  prune_unseen();
  return !peeked_.empty();
}

std::string TraceReader::header() {
  // The kernel's counts: the records in the buffer, and those plus the ones lost since it
  // was last emptied; records consumed leave both.
  uint64_t entries = 0, written = 0;
  tracer_.record_counts(&entries, &written, buffer_);
  {
    std::lock_guard l(mu_);
    for (size_t i = restored_.next; i < restored_.recs.size(); ++i)
      if (restored_.recs[i].shown) ++entries, ++written;
  }
  return header(entries, written);
}

std::string TraceReader::header(uint64_t entries, uint64_t written) {
  const TextOptions o = options();
  std::string s = "# tracer: nop\n#\n";
  if (!o.context_info) return s;
  if (o.irq_info && !o.record_tgid) return events::trace_header(entries, written, fs_.cpus());
  s += "# entries-in-buffer/entries-written: ";
  append_number(s, static_cast<int64_t>(entries));
  s.push_back('/');
  append_number(s, static_cast<int64_t>(written));
  s += "   #P:";
  append_number(s, fs_.cpus());
  s += "\n#\n";
  if (o.irq_info) s += kLegendTgid;
  else s += o.record_tgid ? kColumnsNoIrqTgid : kColumnsNoIrq;
  return s;
}

// ---- formatting ----------------------------------------------------------------------------

const EventView* TraceReader::view(uint16_t id) {
  if (id < kFirstEventId || id > kLastEventId) return nullptr;
  ViewSlot& s = views_[id - kFirstEventId];
  if (s.gen != fill_gen_) {
    s.view = fs_.events().find(id);
    s.gen = fill_gen_;
  }
  return s.view.get();
}

const std::string& TraceReader::comm(pid_t pid, pid_t tid) {
  CommSlot& s = comms_[key_of(pid, tid)];
  if (s.comm.empty() || fill_now_ms_ - s.fetched_ms >= kCommRefreshMs) {
    std::string c = tracer_.comm_of(pid, tid);
    // A thread that is gone keeps the name it had (as saved_cmdlines keeps it).
    if (c != "<...>") {
      if (c != s.comm) cmdlines_.save(tid, c);
      s.comm = std::move(c);
    } else if (s.comm.empty()) {
      s.comm = std::move(c);
    }
    s.fetched_ms = fill_now_ms_;
  }
  return s.comm;
}

tracee::TargetSymbolizer* TraceReader::symbolizer(pid_t pid) {
  for (const auto& [p, s] : symbolizers_)
    if (p == pid) return s.get();
  symbolizers_.emplace_back(pid, tracer_.symbolizer(pid));
  return symbolizers_.back().second.get();
}

void TraceReader::append(std::string& out, const Batch& b, const Held& h, bool lost_lines) {
  if (lost_lines && h.lost_before) events::format_lost_events(out, h.cpu, h.lost_before);
  if (h.shown) append_line(out, h, b.bytes.data() + h.off);
}

bool TraceReader::stack_record_fits(uint16_t id, const uint8_t* data, uint32_t len) {
  if (id == events::kUserStackEventId) return len >= events::kUserStackRecordBytes;
  if (len < 16) return false;
  const int32_t n = load32(data + 8);
  return n >= 0 && static_cast<uint32_t>(n) <= events::kStackRecordDepth &&
         16 + 8 * static_cast<uint32_t>(n) <= len;
}

// "<stack trace>" or "<user stack trace>", then " => " and each address as the kernel's
// seq_print_ip_sym (the target's names: func, func+off/size [object] with sym-offset) or
// seq_print_user_ip (the address, or its file and offset in its mapping with sym-userobj
// while the process lives) prints it.
void TraceReader::append_stack(std::string& out, const Held& h, const uint8_t* data) {
  const uint16_t id = load16(data);
  if (!stack_record_fits(id, data, h.len)) return;
  const pid_t tid = load32(data + 4);
  put_context(out, comm(h.pid, tid), tid, h.pid, h.cpu, data[2], data[3], h.ts);
  const bool user = id == events::kUserStackEventId;
  out += user ? "<user stack trace>\n" : "<stack trace>\n";
  const uint32_t n = user ? events::kUserStackDepth : static_cast<uint32_t>(load32(data + 8));
  char buf[64];
  auto addr_tail = [&](uint64_t ip) {
    snprintf(buf, sizeof buf, " <%016" PRIx64 ">", ip);
    out += buf;
  };
  tracee::TargetSymbolizer* sym = user ? nullptr : symbolizer(h.pid);
  const std::vector<std::pair<std::pair<uint64_t, uint64_t>, std::string>>* maps = nullptr;
  if (user && fill_opts_.sym_userobj) {
    auto [it, added] = maps_.try_emplace(h.pid);
    if (added) {
      std::vector<tracee::Mapping> m;
      if (tracee::read_maps(h.pid, &m) == 0)
        for (const tracee::Mapping& x : m)
          if (!x.path.empty() && x.path.front() == '/') it->second.push_back({{x.start, x.end}, x.path});
    }
    maps = &it->second;
  }
  for (uint32_t i = 0; i < n; ++i) {
    uint64_t ip;
    std::memcpy(&ip, data + 16 + 8 * i, 8);
    if (ip == 0 && user) break;
    if (ip == UINT64_MAX) break;
    out += " => ";
    if (user) {
      bool named = false;
      if (maps != nullptr)
        for (const auto& [range, path] : *maps)
          if (range.first <= ip && ip < range.second) {
            snprintf(buf, sizeof buf, "[+0x%" PRIx64 "]", ip - range.first);
            out += path;
            out += buf;
            named = true;
            break;
          }
      if (!named || fill_opts_.sym_addr) addr_tail(ip);
    } else if (ip == 0) {
      out += '0';
    } else {
      events::SymbolInfo info;
      if (sym != nullptr && sym->lookup(ip, &info) && !info.name.empty()) {
        info.note = {};
        if (fill_opts_.sym_offset) events::format_symbol(out, info);  // %pS
        else out += info.name;  // kallsyms_lookup(): the name alone
      } else {
        snprintf(buf, sizeof buf, "0x%08" PRIx64, ip);
        out += buf;
      }
      if (fill_opts_.sym_addr) addr_tail(ip);
    }
    out += '\n';
  }
}

void TraceReader::append_line(std::string& out, const Held& h, const uint8_t* data) {
  if (h.len < 8) return;
  const uint16_t id = load16(data);
  if (id == events::kKernelStackEventId || id == events::kUserStackEventId) {
    if (h.pid != 0) append_stack(out, h, data);
    return;
  }
  if (id == kMarkerEventId || id == kMarkerRawEventId) {
    if (h.pid != 0) return;  // only trace_marker and trace_marker_raw write these
    if (id == kMarkerEventId) append_marker(out, h, data);
    else append_marker_raw(out, h, data);
    return;
  }
  const EventView* v = view(id);
  if (!v) return;
  const pid_t tid = h.tid;
  const std::string& name = comm(h.pid, tid);
  // The event's view of its target's names: its probes' addresses carry their notes (an
  // IFUNC's implementation shows the name the definition asked for).
  tracee::TargetSymbolizer* target = v->kprobe_style ? symbolizer(h.pid) : nullptr;
  tracee::EventSymbolizer names(target, id);
  events::Symbolizer* sym = target != nullptr ? &names : nullptr;
  if (fill_fast_) {
    events::LineContext ctx;
    ctx.comm = name;
    ctx.pid = tid;
    ctx.cpu = h.cpu;
    ctx.ts_ns = h.ts;
    events::format_trace_line(out, v->compiled, ctx, data, h.len, sym);
    return;
  }
  // Other columns: the line with blank ones, then ours in their place.
  const size_t at = out.size();
  events::LineContext blank;
  blank.comm = std::string_view("", 0);  // not a null pointer: it is copied with memcpy
  if (!events::format_trace_line(out, v->compiled, blank, data, h.len, sym)) return;
  if (out.size() - at < kBlankContext || out.compare(at + kBlankContext - 2, 2, ": ") != 0)
    return;
  std::string context;
  put_context(context, name, tid, h.pid, h.cpu, data[2], data[3], h.ts);
  out.replace(at, kBlankContext, context);
}

void TraceReader::append_marker(std::string& out, const Held& h, const uint8_t* data) {
  if (h.len < kMarkerHeaderSize) return;
  const pid_t tid = load32(data + 4), tgid = load32(data + 8);
  uint32_t text_len = static_cast<uint32_t>(load32(data + 12));
  text_len = std::min(text_len, h.len - kMarkerHeaderSize);
  const char* comm16 = reinterpret_cast<const char*>(data + 16);
  put_context(out, std::string_view(comm16, strnlen(comm16, 16)), tid, tgid, h.cpu, data[2],
              data[3], h.ts);
  out += "tracing_mark_write: ";
  // The kernel prints the text as a C string: it ends at a NUL, newline included.
  const char* text = reinterpret_cast<const char*>(data + kMarkerHeaderSize);
  out.append(text, strnlen(text, text_len));
}

// The kernel's raw_data line: "# ID buf:" and each byte of the data in hex, the data
// padded with zeros as the kernel's entry is, to a multiple of 4 bytes with the 12 before.
void TraceReader::append_marker_raw(std::string& out, const Held& h, const uint8_t* data) {
  if (h.len < kMarkerHeaderSize + 4) return;
  const pid_t tid = load32(data + 4), tgid = load32(data + 8);
  uint32_t len = static_cast<uint32_t>(load32(data + 12));
  len = std::min(len, h.len - kMarkerHeaderSize);
  if (len < 4) return;
  const char* comm16 = reinterpret_cast<const char*>(data + 16);
  put_context(out, std::string_view(comm16, strnlen(comm16, 16)), tid, tgid, h.cpu, data[2],
              data[3], h.ts);
  const uint8_t* bytes = data + kMarkerHeaderSize;
  char buf[16];
  snprintf(buf, sizeof buf, "# %x buf:", static_cast<uint32_t>(load32(bytes)));
  out += buf;
  const uint32_t shown = ((12 + (len - 4) + 3) & ~3u) - 12;
  for (uint32_t i = 0; i < shown; ++i) {
    snprintf(buf, sizeof buf, " %02x", 4 + i < len ? bytes[4 + i] : 0);
    out += buf;
  }
  out += '\n';
}

// "%16s-%-7d [(%7d) ][%03d] [FLAGS] TIMESTAMP: " as the options say.
void TraceReader::put_context(std::string& out, std::string_view comm, pid_t tid, pid_t tgid,
                              uint32_t cpu, uint8_t flags, uint8_t pc, uint64_t ts) const {
  if (!fill_opts_.context_info) return;
  if (comm.size() < 16) out.append(16 - comm.size(), ' ');
  out += comm;
  out.push_back('-');
  append_padded(out, tid, 7, true);
  out.push_back(' ');
  if (fill_opts_.record_tgid) {
    out.push_back('(');
    if (tgid > 0) append_padded(out, tgid, 7, false);
    else out += "-------";
    out += ") ";
  }
  out.push_back('[');
  append_padded(out, cpu, 3, false, '0');
  out += "] ";
  if (fill_opts_.irq_info) {
    // The kernel's legend, as events/output.cc reads the two bytes.
    out.push_back(flags & 0x01 ? 'd' : '.');
    out.push_back(flags & 0x04 ? 'N' : '.');
    out.push_back(flags & 0x08 ? 'h' : (flags & 0x10 ? 's' : '.'));
    out.push_back(pc & 0x0f ? "0123456789abcdef"[pc & 0x0f] : '.');
    out.push_back(pc & 0xf0 ? "0123456789abcdef"[pc >> 4] : '.');
  }
  events::format_trace_timestamp(out, fill_clock_, ts);
  out += ": ";
}

// ---- per_cpu stats and buffer figures ------------------------------------------------------

std::string TraceReader::stats(int cpu) {
  uint64_t entries = 0, bytes = 0, oldest = 0;
  bool any = false;
  tracer_.for_each_record([&](const tracee::TraceRecord& r) {
    if (static_cast<int>(r.cpu) != cpu) return;
    ++entries;
    bytes += r.len;
    if (!any) oldest = r.ts_ns;
    any = true;
  }, buffer_);
  uint64_t read = 0, dropped = 0;
  {
    std::lock_guard l(mu_);
    if (cpu >= 0 && static_cast<size_t>(cpu) < read_events_.size()) {
      read = read_events_[static_cast<size_t>(cpu)];
      dropped = dropped_events_[static_cast<size_t>(cpu)];
    }
  }
  // Records a target had no business writing (tracee::TraceRecord) are dropped events
  // too: they never reach a reader.
  dropped += tracer_.rejected_records(cpu, buffer_);
  const events::TraceClock c = clock();
  char buf[512];
  snprintf(buf, sizeof buf,
           "entries: %" PRIu64 "\noverrun: 0\ncommit overrun: 0\nbytes: %" PRIu64
           "\noldest event ts: %s\nnow ts: %s\ndropped events: %" PRIu64
           "\nread events: %" PRIu64 "\n",
           entries, bytes, stats_time(c, oldest).c_str(), stats_time(c, clock_now(c)).c_str(),
           dropped, read);
  return buf;
}

void TraceReader::learn_comms() {
  std::unordered_set<uint64_t> threads;
  tracer_.for_each_record([&](const tracee::TraceRecord& r) {
    if (r.pid != 0) threads.insert(key_of(r.pid, r.tid));
  }, buffer_);
  auto l = lock();
  for (uint64_t key : threads)
    comm(static_cast<pid_t>(key >> 32), static_cast<pid_t>(key & 0xffffffffu));
}

// ---- waiting ---------------------------------------------------------------------------------

bool TraceReader::read_ends(bool returned_data) {
  if (fs_.shutting_down() || stopped()) return true;
  return returned_data && !fs_.tracing_on(buffer_);
}

int TraceReader::empty_read(const Request& rq, bool returned_data) {
  if (rq.nonblocking()) return -EAGAIN;
  if (read_ends(returned_data)) return 0;
  if (rq.is_interrupted()) return -EINTR;
  return 1;
}

uint64_t TraceReader::data_gen() {
  std::lock_guard l(wait_mu_);
  return data_gen_;
}

void TraceReader::wait(uint64_t seen, int timeout_ms) {
  std::unique_lock l(wait_mu_);
  if (stop_ || data_gen_ != seen) return;
  ++blocked_;
  if (!waiter_.joinable()) waiter_ = std::thread([this] { waiter_main(); });
  waiter_cv_.notify_one();
  readers_cv_.wait_for(l, std::chrono::milliseconds(timeout_ms),
                       [&] { return stop_ || data_gen_ != seen; });
  --blocked_;
}

void TraceReader::arm_poll() {
  std::lock_guard l(wait_mu_);
  if (stop_) return;
  poll_armed_ = true;
  if (!waiter_.joinable()) waiter_ = std::thread([this] { waiter_main(); });
  waiter_cv_.notify_one();
}

void TraceReader::add_poll_wake(std::function<void()> wake) {
  std::lock_guard l(wait_mu_);
  poll_wakes_.push_back(std::move(wake));
}

void TraceReader::wake_all() {
  {
    std::lock_guard l(wait_mu_);
    ++data_gen_;
    poll_armed_ = false;
    // The poll wakes run on the waiter thread: this may be called under the reader lock
    // (a traceoff trigger, through the gate), and a wake asks readable(), which takes it.
    if (!poll_wakes_.empty() && !stop_) {
      wake_polls_ = true;
      if (!waiter_.joinable()) waiter_ = std::thread([this] { waiter_main(); });
    }
  }
  readers_cv_.notify_all();
  waiter_cv_.notify_all();
  tracer_.interrupt_wait();  // the waiter thread looks again
}

void TraceReader::stop() {
  {
    std::lock_guard l(wait_mu_);
    stop_ = true;
  }
  readers_cv_.notify_all();
  waiter_cv_.notify_all();
  tracer_.interrupt_wait();
  if (waiter_.joinable()) waiter_.join();
}

// Runs while a reader is blocked or a poll is armed: waits on the tracer and wakes them.
void TraceReader::waiter_main() {
  bool pause = false;
  uint64_t takes_at_wake = 0;
  std::unique_lock l(wait_mu_);
  auto call_wakes = [&] {
    std::vector<std::function<void()>> wakes = poll_wakes_;
    l.unlock();
    for (auto& w : wakes) w();
    l.lock();
  };
  for (;;) {
    waiter_cv_.wait(l, [&] { return stop_ || wake_polls_ || blocked_ > 0 || poll_armed_; });
    if (stop_) return;
    if (wake_polls_) {
      wake_polls_ = false;
      call_wakes();
      continue;
    }
    if (pause) {
      // Records were there at once and the readers were woken for them: if they were not
      // theirs (per_cpu readers of another CPU), asking again at once would spin. A reader
      // that took records since and is blocked again has caught up with a busy producer:
      // it waits for the next records, not for the pause (which would outlast a ring's
      // room at tens of millions of records a second).
      const uint64_t gen = data_gen_;
      waiter_cv_.wait_for(l, kRecheck, [&] {
        return stop_ || wake_polls_ || data_gen_ != gen ||
               (blocked_ > 0 && takes_.load(std::memory_order_relaxed) != takes_at_wake);
      });
      pause = false;
      continue;
    }
    l.unlock();
    const auto start = Clock::now();
    const bool woke = tracer_.wait_for_records(kTracerWaitMs, static_cast<int>(buffer_));
    const bool at_once = Clock::now() - start < std::chrono::milliseconds(1);
    l.lock();
    if (stop_) return;
    if (!woke) continue;
    ++data_gen_;
    takes_at_wake = takes_.load(std::memory_order_relaxed);
    readers_cv_.notify_all();
    pause = at_once;
    if (poll_armed_) {
      poll_armed_ = false;
      call_wakes();
    }
  }
}

}  // namespace probefs::fs
