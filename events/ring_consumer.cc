#include "events/ring_consumer.h"

#include <cpuid.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <linux/membarrier.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#include <x86intrin.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>

namespace probefs::events {
namespace {

using ring_detail::load_acquire;
using ring_detail::load_relaxed;
using ring_detail::store_relaxed;
using ring_detail::store_release;

constexpr uint32_t align8(uint64_t v) { return static_cast<uint32_t>((v + 7) & ~uint64_t{7}); }

// Bytes from offset a forward to offset b in a ring of `size` bytes.
constexpr uint32_t distance(uint32_t a, uint32_t b, uint32_t size) {
  return b >= a ? b - a : size - a + b;
}

// How far ahead of the record it parses the consumer asks for the ring's bytes.
constexpr uint32_t kPrefetchAhead = 1024;

// The producer's recent lines come from another core: a reader at `cur` asks for the ones
// a few records on while it handles this one, so that a reader close behind the producer
// keeps up; but never for the line it may still be writing, which it would then have to
// take back.
inline void prefetch_ahead(const uint8_t* d, uint32_t cur, uint32_t head, uint32_t size) {
  if (head > cur ? head - cur > kPrefetchAhead + 64 : size - cur + head > kPrefetchAhead + 64) {
    uint32_t ahead = cur + kPrefetchAhead;
    if (ahead >= size) ahead -= size;
    __builtin_prefetch(d + ahead, 0, 3);
  }
}

bool head_ok(uint32_t h, uint32_t size) { return h < size && h % 8 == 0; }

bool less_item(uint64_t stamp_a, uint32_t lane_a, uint64_t stamp_b, uint32_t lane_b) {
  return stamp_a != stamp_b ? stamp_a < stamp_b : lane_a < lane_b;
}

// Whether read() gives the CPU sched_getcpu() gives, on a try where the thread did not
// move meanwhile.
template <class Read>
bool source_is_the_cpu(Read read) {
  for (int i = 0; i < 16; ++i) {
    const int before = sched_getcpu();
    const uint32_t cpu = read();
    if (before >= 0 && sched_getcpu() == before) return cpu == static_cast<uint32_t>(before);
  }
  return false;
}

bool tsc_aux_is_the_cpu(RingCpuSource how) {
  return source_is_the_cpu([how] {
    uint32_t aux;
    if (how == kRingCpuRdpid) {
      uint64_t a64;
      asm volatile("rdpid %0" : "=r"(a64));
      aux = static_cast<uint32_t>(a64);
    } else {
      uint32_t lo, hi;
      asm volatile("rdtscp" : "=a"(lo), "=d"(hi), "=c"(aux));
    }
    return aux & 0xfff;
  });
}

bool rseq_is_the_cpu() {
  const int32_t off = ring_rseq_cpu_offset();
  return source_is_the_cpu([off] { return ring_detail::ring_rseq_cpu(off); });
}

}  // namespace

// --- creating an area -------------------------------------------------------------------

uint32_t ring_detect_stamp_mode(RingStampClock clock) {
  // Once: in a virtual machine each cpuid is an exit to the hypervisor (tens of
  // microseconds), and every new target's area asks.
  // An instruction counts only where TSC_AUX is the CPU the kernel says the thread is on
  // (a hypervisor may leave the host's value there: the instructions work, but the
  // kernel does not list them as features and never sets it).
  static const RingCpuSource cpu = [] {
    unsigned a, b, c, d;
    if (__get_cpuid_count(7, 0, &a, &b, &c, &d) && (c & (1u << 22)) &&
        tsc_aux_is_the_cpu(kRingCpuRdpid))
      return kRingCpuRdpid;
    if (__get_cpuid(0x80000001, &a, &b, &c, &d) && (d & (1u << 27)) &&
        tsc_aux_is_the_cpu(kRingCpuRdtscp))
      return kRingCpuRdtscp;
    if (ring_rseq_cpu_offset() >= 0 && rseq_is_the_cpu()) return kRingCpuRseq;
    return kRingCpuNone;
  }();
  return ring_stamp_mode(clock, cpu);
}

int ring_area_init(void* mem, uint64_t size, const RingGeometry& g, uint32_t stamp_mode) {
  RingLayout l;
  if (!mem || !ring_layout(g, &l) || l.area_bytes > size) return -EINVAL;
  auto* a = static_cast<RingAreaHeader*>(mem);
  memset(a, 0, sizeof *a);
  a->magic = kRingAreaMagic;
  a->version = kRingAreaVersion;
  a->area_bytes = l.area_bytes;
  a->ring_count = g.ring_count;
  a->ring_bytes = static_cast<uint32_t>(ring_align_up(g.ring_bytes, kRingPageBytes));
  a->ring_stride = l.ring_stride;
  a->probe_slots = g.probe_slots;
  a->fallback_offset = l.fallback_offset;
  a->rings_offset = l.rings_offset;
  a->stamp_mode = stamp_mode;
  return 0;
}

void ring_set_stamp_mode(RingAreaHeader* area, uint32_t stamp_mode) {
  store_relaxed(&area->stamp_mode, stamp_mode);
}

void ring_set_stack_options(RingAreaHeader* area, uint32_t options) {
  store_relaxed(&area->stack_options, options);
}

RingArea::~RingArea() { reset(); }

RingArea::RingArea(RingArea&& o) noexcept : fd_(o.fd_), mem_(o.mem_), size_(o.size_) {
  o.fd_ = -1;
  o.mem_ = nullptr;
  o.size_ = 0;
}

RingArea& RingArea::operator=(RingArea&& o) noexcept {
  if (this != &o) {
    reset();
    fd_ = o.fd_;
    mem_ = o.mem_;
    size_ = o.size_;
    o.fd_ = -1;
    o.mem_ = nullptr;
    o.size_ = 0;
  }
  return *this;
}

void RingArea::close_fd() {
  if (fd_ >= 0) close(fd_);
  fd_ = -1;
}

void RingArea::reset() {
  if (mem_) munmap(mem_, size_);
  if (fd_ >= 0) close(fd_);
  fd_ = -1;
  mem_ = nullptr;
  size_ = 0;
}

int RingArea::create(const RingGeometry& g, uint32_t stamp_mode, RingArea* out) {
  RingLayout l;
  if (!ring_layout(g, &l)) return -EINVAL;
  RingArea area;
  area.fd_ = memfd_create("probefs-ring", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (area.fd_ < 0) return -errno;
  if (ftruncate(area.fd_, static_cast<off_t>(l.area_bytes)) != 0) return -errno;
  if (fcntl(area.fd_, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0)
    return -errno;
  void* mem = mmap(nullptr, l.area_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, area.fd_, 0);
  if (mem == MAP_FAILED) return -errno;
  area.mem_ = mem;
  area.size_ = l.area_bytes;
  if (int r = ring_area_init(mem, l.area_bytes, g, stamp_mode); r != 0) return r;
  *out = std::move(area);
  return 0;
}

bool ring_owner_alive(pid_t pid, uint32_t tid) {
  if (tid == 0 || pid <= 0) return false;
  // 0 or EPERM: the thread exists. Only ESRCH says it is gone.
  return syscall(SYS_tgkill, pid, static_cast<pid_t>(tid), 0) == 0 || errno != ESRCH;
}

// --- one area ---------------------------------------------------------------------------

int RingAreaReader::attach(void* mem, uint64_t size, pid_t pid) {
  auto* a = static_cast<RingAreaHeader*>(mem);
  if (!a || !ring_area_header_valid(a, size)) return -EINVAL;
  // The geometry, once: whatever the process writes to the header later, the reader goes
  // by these values.
  RingGeometry g;
  g.ring_count = a->ring_count;
  g.ring_bytes = a->ring_bytes;
  g.probe_slots = a->probe_slots;
  RingLayout l;
  if (!ring_layout(g, &l) || l.area_bytes > size) return -EINVAL;
  area_ = a;
  base_ = static_cast<uint8_t*>(mem);
  size_ = size;
  pid_ = pid;
  geometry_ = g;
  layout_ = l;
  states_.assign(g.ring_count, State{});
  // Start where the rings are now: at the first record no reader consumed (all of them,
  // in an area the process wrote into before the reader attached); a tail out of range
  // starts at the head. Every loss counted so far is still to be reported. Rings above the
  // highest claimed were never written: their tails are 0, and their pages stay untouched
  // (a read of a shared-memory hole allocates a page, and an area has a thousand rings).
  for (uint32_t i = 0, used = rings_used(); i < used; ++i) {
    const uint32_t t = load_relaxed(&control(i)->tail);
    uint32_t h;
    states_[i].tail = head_ok(t, g.ring_bytes) ? t : (head(i, &h) ? h : 0);
  }
  // The per-slot totals grow to the highest slot that has one (slot_value): a daemon
  // reading thousands of areas keeps a few words each, not three arrays of probe_slots.
  folded_hits_.clear();
  hits_base_.clear();
  misses_base_.clear();
  front_valid_ = false;
  stats_ = RingReaderStats{};
  unowned_base_ = 0;
  unowned_taken_ = 0;
  return 0;
}

inline RingControl* RingAreaReader::control(uint32_t ring) const {
  return reinterpret_cast<RingControl*>(base_ + layout_.rings_offset +
                                        uint64_t{ring} * layout_.ring_stride);
}

inline const uint8_t* RingAreaReader::data(uint32_t ring) const {
  return reinterpret_cast<const uint8_t*>(control(ring)) + layout_.data_offset;
}

inline const uint64_t* RingAreaReader::ring_hits(uint32_t ring) const {
  return reinterpret_cast<const uint64_t*>(reinterpret_cast<const uint8_t*>(control(ring)) +
                                           layout_.hits_offset);
}

const uint64_t* RingAreaReader::fallback_hits() const {
  return reinterpret_cast<const uint64_t*>(base_ + layout_.fallback_offset);
}

const uint64_t* RingAreaReader::misses_array() const {
  return fallback_hits() + geometry_.probe_slots;
}

inline bool RingAreaReader::head(uint32_t ring, uint32_t* out) const {
  const uint32_t h = load_acquire(&control(ring)->head);
  if (!head_ok(h, geometry_.ring_bytes)) return false;
  *out = h;
  return true;
}

// Reads the record at `off` of the records that end at `head`: owner records on the way
// are passed (the last one's tid and name go to `out`), and one padding marker. Every
// value comes from shared memory once and is checked before it is used.
inline RingAreaReader::ParseResult RingAreaReader::parse(uint32_t ring, uint32_t off,
                                                         uint32_t head, Parsed* out) const {
  // Owner records passed in one call at most; the caller goes on from where they end.
  constexpr int kMaxOwnerSteps = 64;
  const uint32_t size = geometry_.ring_bytes;
  const uint8_t* d = data(ring);
  uint32_t cur = off;
  uint32_t advance = 0;
  int owners = 0;
  out->writer = 0;
  out->padded = false;
  while (cur != head && owners < kMaxOwnerSteps) {
    const uint32_t len = load_relaxed(reinterpret_cast<const uint32_t*>(d + cur));
    const uint32_t word = load_relaxed(reinterpret_cast<const uint32_t*>(d + cur + 4));
    const uint32_t cpu = word & 0xffff;
    const uint8_t kind = static_cast<uint8_t>(word >> 16);
    const uint8_t flags = static_cast<uint8_t>(word >> 24);
    if (kind == kRingKindPadding) {
      // Only where the producer went back to 0, so the head is behind, only up to the
      // end, and once.
      if (out->padded || head > cur || len != size - cur) return ParseResult::kCorrupt;
      out->padded = true;
      advance += size - cur;
      cur = 0;
      continue;
    }
    // Committed bytes from cur without a wrap: up to the head, or to the end when the
    // head is behind.
    const uint32_t avail = (head > cur ? head : size) - cur;
    if (kind == kRingKindOwner) {
      if (flags != 0 || len != sizeof(RingOwnerRecord) || avail < kRingOwnerRecordBytes)
        return ParseResult::kCorrupt;
      RingOwnerRecord o;
      for (uint32_t w = 0; w < sizeof o / 8; ++w) {
        const uint64_t v = load_relaxed(
            reinterpret_cast<const uint64_t*>(d + cur + kRingRecordHeaderSize) + w);
        memcpy(reinterpret_cast<uint8_t*>(&o) + 8 * w, &v, 8);
      }
      if (o.tid == 0 || (o.tid & ~kRingOwnerTidMask) != 0) return ParseResult::kCorrupt;
      out->writer = o.tid;
      memcpy(out->writer_comm, o.comm, kRingCommBytes);
      advance += kRingOwnerRecordBytes;
      cur = cur + kRingOwnerRecordBytes == size ? 0 : cur + kRingOwnerRecordBytes;
      ++owners;
      continue;
    }
    if (kind != kRingKindData || (flags & ~kRingKnownFlags) != 0) return ParseResult::kCorrupt;
    const uint32_t extra = (flags & kRingFlagLostCount) ? 8 : 0;
    if (avail < kRingRecordHeaderSize + extra ||
        len > avail - kRingRecordHeaderSize - extra) {
      return ParseResult::kCorrupt;
    }
    const uint32_t stride = align8(uint64_t{kRingRecordHeaderSize} + extra + len);
    prefetch_ahead(d, cur, head, size);
    out->off = cur;
    out->next = cur + stride == size ? 0 : cur + stride;
    out->advance = advance + stride;
    out->len = len;
    out->cpu = cpu;
    out->flags = flags;
    out->stamp = load_relaxed(reinterpret_cast<const uint64_t*>(d + cur + 8));
    out->lost_count =
        extra ? load_relaxed(reinterpret_cast<const uint64_t*>(d + cur + kRingRecordHeaderSize))
              : 0;
    return ParseResult::kRecord;
  }
  if (owners == 0) return ParseResult::kEmpty;
  // Owner records, and nothing after them yet (or more follow than one call passes).
  out->off = cur;
  out->next = cur;
  out->advance = advance;
  return ParseResult::kSkip;
}

size_t RingAreaReader::take_run(uint32_t ring, uint32_t head, int cpu, uint64_t last_stamp,
                                RingRunRecord* out, size_t max) {
  const uint32_t size = geometry_.ring_bytes;
  const uint8_t* d = data(ring);
  State& st = states_[ring];
  uint32_t cur = st.tail;
  uint64_t bytes = 0;
  size_t n = 0;
  while (n < max && cur != head) {
    const uint32_t len = load_relaxed(reinterpret_cast<const uint32_t*>(d + cur));
    const uint32_t word = load_relaxed(reinterpret_cast<const uint32_t*>(d + cur + 4));
    const uint8_t kind = static_cast<uint8_t>(word >> 16);
    const uint8_t flags = static_cast<uint8_t>(word >> 24);
    const uint32_t avail = (head > cur ? head : size) - cur;
    if (kind != kRingKindData || (flags & ~kRingFlagCounterStamp) != 0 ||
        avail < kRingRecordHeaderSize || len > avail - kRingRecordHeaderSize ||
        (cpu >= 0 && (word & 0xfff) != static_cast<uint32_t>(cpu)))
      break;
    const uint64_t stamp = load_relaxed(reinterpret_cast<const uint64_t*>(d + cur + 8));
    if (stamp > last_stamp) break;
    prefetch_ahead(d, cur, head, size);
    RingRunRecord& o = out[n++];
    o.stamp = stamp;
    o.payload = d + cur + kRingRecordHeaderSize;
    o.len = len;
    o.cpu = word & 0xfff;
    o.counter_stamp = (flags & kRingFlagCounterStamp) != 0;
    const uint32_t stride = align8(uint64_t{kRingRecordHeaderSize} + len);
    bytes += stride;
    cur = cur + stride == size ? 0 : cur + stride;
  }
  if (n != 0) {
    st.tail = cur;
    st.consumed += bytes;
    st.unpublished += static_cast<uint32_t>(bytes);
    stats_.records += n;
    progress_ += n;
  }
  return n;
}

inline uint64_t RingAreaReader::lost_before(const Parsed& p, uint64_t reported) {
  if (!(p.flags & kRingFlagLostCount) || p.lost_count < reported) return 0;
  return p.lost_count - reported;
}

inline void RingAreaReader::fill(uint32_t ring, const Parsed& p, uint64_t lost,
                                 uint32_t owner, std::vector<uint8_t>* buf,
                                 RingRecord* out) const {
  const uint32_t extra = (p.flags & kRingFlagLostCount) ? 8 : 0;
  // parse() checked that the payload lies inside the ring's data, in one piece.
  const uint8_t* payload = data(ring) + p.off + kRingRecordHeaderSize + extra;
  if (buf != nullptr) {
    if (buf->size() < p.len) buf->resize(std::max<size_t>(p.len, 256));
    // An empty payload may meet a buffer that has none (memcpy wants real pointers even
    // for 0 bytes).
    if (p.len) memcpy(buf->data(), payload, p.len);
    payload = buf->data();
  }
  out->stamp = p.stamp;
  out->lost_before = lost;
  out->cpu = p.cpu & 0xfff;
  out->tid = (p.writer != 0 ? p.writer : owner) & kRingOwnerTidMask;
  out->ring = ring;
  out->counter_stamp = (p.flags & kRingFlagCounterStamp) != 0;
  out->named = p.writer != 0;
  if (out->named) memcpy(out->comm, p.writer_comm, kRingCommBytes);
  out->payload = std::span<const uint8_t>(payload, p.len);
}

inline void RingAreaReader::move_tail(uint32_t ring, const Parsed& p, bool keep_bytes) {
  State& st = states_[ring];
  if (p.padded) ++stats_.padding;
  if (p.writer != 0) st.writer = p.writer;
  st.tail = p.next;
  ++progress_;
  st.consumed += p.advance;
  st.unpublished += p.advance;
  if (!keep_bytes) publish_due(ring);
}

inline void RingAreaReader::publish_due(uint32_t ring) {
  if (states_[ring].unpublished >= geometry_.ring_bytes / 16) publish(ring);
}

inline void RingAreaReader::advance(uint32_t ring, const Parsed& p, bool keep_bytes) {
  State& st = states_[ring];
  const uint64_t lost = lost_before(p, st.lost_reported);
  if (p.flags & kRingFlagLostCount) st.lost_reported = std::max(st.lost_reported, p.lost_count);
  ++stats_.records;
  stats_.lost_reported += lost;
  move_tail(ring, p, keep_bytes);
}

inline void RingAreaReader::publish(uint32_t ring) {
  State& st = states_[ring];
  if (st.unpublished == 0) return;
  st.unpublished = 0;
  store_release(&control(ring)->tail, st.tail);
}

void RingAreaReader::skip_corrupt(uint32_t ring) {
  State& st = states_[ring];
  front_valid_ = false;
  uint32_t h;
  if (!head(ring, &h)) {
    // A head the producer cannot have written: nothing to read until it is sane again.
    const uint32_t raw = load_relaxed(&control(ring)->head);
    if (raw != st.bad_head) {
      st.bad_head = raw;
      ++stats_.corrupt;
    }
    return;
  }
  ++stats_.corrupt;
  ++progress_;
  st.consumed += distance(st.tail, h, geometry_.ring_bytes);
  st.tail = h;
  st.writer = 0;  // whose records follow is the owner word's from here
  st.unpublished = 0;
  store_release(&control(ring)->tail, st.tail);
}

bool RingAreaReader::front(uint32_t ring, RingRecord* out) {
  front_valid_ = false;
  if (ring >= geometry_.ring_count) return false;
  State& st = states_[ring];
  uint32_t h;
  if (!head(ring, &h)) {
    skip_corrupt(ring);
    return false;
  }
  const uint32_t owner_now = owner(ring);
  Parsed p;
  for (bool record = false; !record;) {
    switch (parse(ring, st.tail, h, &p)) {
      case ParseResult::kEmpty:
        publish(ring);
        return false;
      case ParseResult::kCorrupt:
        skip_corrupt(ring);
        return false;
      case ParseResult::kSkip:
        move_tail(ring, p);  // each moves the tail on: at most a ring's worth
        break;
      case ParseResult::kRecord:
        record = true;
        break;
    }
  }
  fill(ring, p, lost_before(p, st.lost_reported), st.writer != 0 ? st.writer : owner_now, &buf_,
       out);
  front_ = p;
  front_ring_ = ring;
  front_valid_ = true;
  return true;
}

void RingAreaReader::pop(uint32_t ring) {
  if (!front_valid_ || front_ring_ != ring) return;
  front_valid_ = false;
  advance(ring, front_);
}

bool RingAreaReader::consume(uint32_t ring, RingRecord* out) {
  if (!front(ring, out)) return false;
  pop(ring);
  return true;
}

RingAreaReader::Cursor RingAreaReader::cursor(uint32_t ring) const {
  Cursor c;
  c.ring = ring;
  if (ring < geometry_.ring_count) {
    c.off = states_[ring].tail;
    c.pos = states_[ring].consumed;
    c.lost_reported = states_[ring].lost_reported;
    c.writer = states_[ring].writer;
  }
  return c;
}

bool RingAreaReader::peek(Cursor* c, RingRecord* out) {
  if (c->ring >= geometry_.ring_count) return false;
  if (c->pos < states_[c->ring].consumed) *c = cursor(c->ring);
  uint32_t h;
  if (!head(c->ring, &h)) return false;
  Parsed p;
  for (bool record = false; !record;) {
    switch (parse(c->ring, c->off, h, &p)) {
      case ParseResult::kEmpty:
        return false;
      case ParseResult::kCorrupt:
        // Not ours to repair: step over what is there, as the consumer will.
        c->pos += distance(c->off, h, geometry_.ring_bytes);
        c->off = h;
        c->writer = 0;
        return false;
      case ParseResult::kSkip:
        c->off = p.next;
        c->pos += p.advance;
        c->writer = p.writer;
        break;
      case ParseResult::kRecord:
        record = true;
        break;
    }
  }
  fill(c->ring, p, lost_before(p, c->lost_reported), c->writer != 0 ? c->writer : owner(c->ring),
       &buf_, out);
  if (p.writer != 0) c->writer = p.writer;
  if (p.flags & kRingFlagLostCount) c->lost_reported = std::max(c->lost_reported, p.lost_count);
  c->off = p.next;
  c->pos += p.advance;
  return true;
}

uint32_t RingAreaReader::buffer_of(uint32_t ring) const {
  if (ring >= geometry_.ring_count) return 0;
  const uint32_t b = load_relaxed(&control(ring)->buffer);
  return b < kRingMaxBuffers ? b : 0;
}

namespace {
bool in_buffer(const RingAreaReader& r, uint32_t ring, int buffer) {
  return buffer < 0 || r.buffer_of(ring) == static_cast<uint32_t>(buffer);
}
}  // namespace

bool RingAreaReader::has_data(int cpu, int buffer) const {
  for (uint32_t i = 0, n_ = rings_used(); i < n_; ++i) {
    uint32_t h;
    if (!in_buffer(*this, i, buffer)) continue;
    if (!head(i, &h) || h == states_[i].tail) continue;
    // Owner records alone are nothing to read.
    Parsed p;
    ParseResult r = ParseResult::kSkip;
    for (uint32_t off = states_[i].tail; r == ParseResult::kSkip; off = p.next)
      r = parse(i, off, h, &p);
    if (r == ParseResult::kCorrupt && cpu < 0) return true;  // something to skip
    if (r == ParseResult::kRecord && (cpu < 0 || (p.cpu & 0xfff) == static_cast<uint32_t>(cpu)))
      return true;
  }
  return false;
}

uint64_t RingAreaReader::entries(int buffer) const {
  uint64_t n = 0;
  for (uint32_t i = 0, n_ = rings_used(); i < n_; ++i) {
    uint32_t h;
    if (!in_buffer(*this, i, buffer) || !head(i, &h)) continue;
    // Each step moves forward by at least a record header and stops at the head or at
    // anything inconsistent: at most ring_bytes / 16 steps.
    uint32_t off = states_[i].tail;
    Parsed p;
    for (ParseResult r; (r = parse(i, off, h, &p)) == ParseResult::kRecord ||
                        r == ParseResult::kSkip;
         off = p.next)
      if (r == ParseResult::kRecord) ++n;
  }
  return n;
}

uint64_t RingAreaReader::dropped(int buffer) const {
  uint64_t n = 0;
  for (uint32_t i = 0, n_ = rings_used(); i < n_; ++i) {
    if (!in_buffer(*this, i, buffer)) continue;
    const uint64_t lost = load_relaxed(&control(i)->lost);
    if (lost > states_[i].lost_base) n += lost - states_[i].lost_base;
  }
  if (buffer > 0) return n;
  const uint64_t unowned = unowned_lost();
  return n + (unowned > unowned_base_ ? unowned - unowned_base_ : 0);
}

uint32_t RingAreaReader::rings_in_use(int buffer) const {
  uint32_t n = 0;
  for (uint32_t i = 0, n_ = rings_used(); i < n_; ++i) {
    uint32_t h;
    if (!in_buffer(*this, i, buffer)) continue;
    if (owner(i) != 0 || (head(i, &h) && h != states_[i].tail)) ++n;
  }
  return n;
}

void RingAreaReader::clear(int buffer) {
  front_valid_ = false;
  ++progress_;
  for (uint32_t i = 0, n_ = rings_used(); i < n_; ++i) {
    if (!in_buffer(*this, i, buffer)) continue;
    State& st = states_[i];
    st.lost_base = load_relaxed(&control(i)->lost);
    uint32_t h;
    if (!head(i, &h)) continue;
    st.consumed += distance(st.tail, h, geometry_.ring_bytes);
    st.tail = h;
    st.writer = 0;
    st.lost_reported = std::max(st.lost_reported, st.lost_base);
    st.unpublished = 0;
    store_release(&control(i)->tail, st.tail);
  }
  if (buffer > 0) return;
  unowned_base_ = unowned_lost();
  unowned_taken_ = unowned_base_;
}

uint32_t RingAreaReader::owner(uint32_t ring) const {
  return ring < geometry_.ring_count ? load_acquire(&control(ring)->owner) : 0;
}

bool RingAreaReader::owner_comm(uint32_t ring, uint32_t tid, std::string* out) const {
  if (ring >= geometry_.ring_count || tid == 0 || (tid & ~kRingOwnerTidMask) != 0) return false;
  const RingControl* ctl = control(ring);
  if ((load_acquire(&ctl->owner) & kRingOwnerTidMask) != tid) return false;
  // The name was stored before comm_tid (release); the daemon alone zeroes comm_tid, when
  // it frees the ring, before anyone can claim it again.
  if (load_acquire(&ctl->comm_tid) != tid) return false;
  char name[kRingCommBytes];
  for (uint32_t w = 0; w < kRingCommBytes / 8; ++w) {
    const uint64_t v = load_relaxed(&ctl->comm[w]);
    memcpy(name + 8 * w, &v, 8);
  }
  out->assign(name, strnlen(name, kRingCommBytes - 1));
  return true;
}

bool RingAreaReader::find_comm(uint32_t tid, std::string* out) const {
  for (uint32_t i = 0, n_ = rings_used(); i < n_; ++i)
    if (owner_comm(i, tid, out)) return true;
  return false;
}

uint32_t RingAreaReader::reclaim(std::vector<std::pair<uint32_t, std::string>>* names) {
  uint32_t freed = 0;
  for (uint32_t i = 0, n_ = rings_used(); i < n_; ++i) {
    RingControl* ctl = control(i);
    const uint32_t o = load_acquire(&ctl->owner);
    if (o == 0) continue;
    if (o & kRingOwnerFreeing) continue;  // not ours to touch (the process wrote it)
    if (!(o & kRingOwnerRetired) && ring_owner_alive(pid_, o & kRingOwnerTidMask)) continue;
    State& st = states_[i];
    uint32_t h;
    if (!head(i, &h)) {
      skip_corrupt(i);
    } else if (h != st.tail) {
      // Owner records alone are drained; records still to read are freed on a later call.
      Parsed p;
      if (parse(i, st.tail, h, &p) != ParseResult::kSkip || p.next != h) continue;
      move_tail(i, p);
    }
    // Ours from here: a new thread that takes the ring over CASes the same owner word.
    uint32_t held = o;
    if (!__atomic_compare_exchange_n(&ctl->owner, &held, o | kRingOwnerFreeing, false,
                                     __ATOMIC_ACQUIRE, __ATOMIC_RELAXED))
      continue;
    // The next owner starts from the tail it reads.
    publish(i);
    // The owner is gone: nobody writes these counters any more.
    uint64_t* hits = const_cast<uint64_t*>(ring_hits(i));
    for (uint32_t s = 0; s < geometry_.probe_slots; ++s) {
      const uint64_t v = load_relaxed(&hits[s]);
      if (v == 0) continue;
      slot_value(folded_hits_, s) += v;
      store_relaxed(&hits[s], uint64_t{0});
    }
    const uint64_t lost = load_relaxed(&ctl->lost);
    if (lost > st.lost_reported) {
      stats_.lost_unattributed += lost - st.lost_reported;
      st.lost_reported = lost;
    }
    std::string comm;
    const bool named = names != nullptr && owner_comm(i, o & kRingOwnerTidMask, &comm);
    // The next owner's name is valid only once it stores it.
    store_relaxed(&ctl->comm_tid, 0u);
    uint32_t expected = o | kRingOwnerFreeing;
    if (__atomic_compare_exchange_n(&ctl->owner, &expected, 0u, false, __ATOMIC_RELEASE,
                                    __ATOMIC_RELAXED)) {
      ++freed;
      if (o & kRingOwnerRetired) ++stats_.rings_freed_retired;
      if (named) names->emplace_back(o & kRingOwnerTidMask, std::move(comm));
    }
  }
  if (freed) {
    __atomic_add_fetch(&area_->free_generation, 1u, __ATOMIC_RELEASE);
    stats_.rings_freed += freed;
  }
  return freed;
}

uint64_t& RingAreaReader::slot_value(std::vector<uint64_t>& v, uint32_t slot) {
  if (slot >= v.size()) v.resize(slot + 1, 0);
  return v[slot];
}

uint64_t RingAreaReader::slot_value(const std::vector<uint64_t>& v, uint32_t slot) {
  return slot < v.size() ? v[slot] : 0;
}

uint64_t RingAreaReader::sum_hits(uint32_t slot) const {
  uint64_t sum = slot_value(folded_hits_, slot) + load_relaxed(&fallback_hits()[slot]);
  for (uint32_t i = 0, n_ = rings_used(); i < n_; ++i) sum += load_relaxed(&ring_hits(i)[slot]);
  return sum;
}

uint64_t RingAreaReader::hits(uint32_t slot) const {
  if (slot >= geometry_.probe_slots) return 0;
  return sum_hits(slot) - slot_value(hits_base_, slot);
}

void RingAreaReader::hits_all(std::span<uint64_t> out) const {
  const uint32_t n = std::min<uint64_t>(out.size(), geometry_.probe_slots);
  const uint64_t* fallback = fallback_hits();
  for (uint32_t s = 0; s < n; ++s)
    out[s] = slot_value(folded_hits_, s) + load_relaxed(&fallback[s]) - slot_value(hits_base_, s);
  for (uint32_t i = 0, n_ = rings_used(); i < n_; ++i) {
    const uint64_t* h = ring_hits(i);
    for (uint32_t s = 0; s < n; ++s) out[s] += load_relaxed(&h[s]);
  }
}

uint64_t RingAreaReader::misses(uint32_t slot) const {
  if (slot >= geometry_.probe_slots) return 0;
  return load_relaxed(&misses_array()[slot]) - slot_value(misses_base_, slot);
}

void RingAreaReader::reset_counters(uint32_t slot) {
  if (slot >= geometry_.probe_slots) return;
  const uint64_t hits = sum_hits(slot), misses = load_relaxed(&misses_array()[slot]);
  if (hits != 0 || slot < hits_base_.size()) slot_value(hits_base_, slot) = hits;
  if (misses != 0 || slot < misses_base_.size()) slot_value(misses_base_, slot) = misses;
}

uint64_t RingAreaReader::unowned_lost() const { return load_relaxed(&area_->unowned_lost); }

uint32_t RingAreaReader::rings_used() const {
  return std::min(load_acquire(&area_->rings_high), geometry_.ring_count);
}

uint64_t RingAreaReader::take_unowned_lost() {
  const uint64_t now = unowned_lost();  // the process may write anything: never backwards
  if (now <= unowned_taken_) return 0;
  const uint64_t n = now - unowned_taken_;
  unowned_taken_ = now;
  return n;
}

// --- the merger -------------------------------------------------------------------------

// An area's lanes lie together, in ring order, one per ring its threads claimed so far
// (rings_used): a target with a thousand rings and one thread costs the merger one lane,
// and a traced build that makes thousands of areas does not copy a thousand lanes each.
// Lanes for rings claimed since are inserted by refresh(), after the area's others.
void RingMerger::add(RingAreaReader* reader, uint32_t tag) {
  sources_.emplace_back(reader, tag);
  const uint32_t used = reader->rings_used();
  for (uint32_t i = 0; i < used; ++i) lanes_.push_back(new_lane(reader, tag, i));
  if (used == 0) lanes_.push_back(new_lane(reader, tag, 0));  // the area's place
  heap_.clear();  // the next call takes a snapshot that includes the new area
  current_ = kNoLane;
}

RingMerger::Lane RingMerger::new_lane(RingAreaReader* reader, uint32_t tag, uint32_t ring) {
  Lane l{};
  l.reader = reader;
  l.tag = tag;
  l.ring = ring;
  l.cursor = reader->cursor(ring);
  l.head = l.cursor.off;
  return l;
}

void RingMerger::remove(RingAreaReader* reader) { remove(std::span(&reader, 1)); }

void RingMerger::remove(std::span<RingAreaReader* const> readers) {
  if (readers.empty()) return;
  std::vector<RingAreaReader*> gone(readers.begin(), readers.end());
  std::sort(gone.begin(), gone.end());
  auto is_gone = [&](RingAreaReader* r) { return std::binary_search(gone.begin(), gone.end(), r); };
  std::erase_if(sources_, [&](const auto& s) { return is_gone(s.first); });
  std::erase_if(lanes_, [&](const Lane& l) { return is_gone(l.reader); });
  std::erase_if(kept_, [&](const auto& k) { return is_gone(k.first); });
  heap_.clear();
  current_ = kNoLane;
}

bool RingMerger::heap_greater(const Item& a, const Item& b) {
  return less_item(b.stamp, b.lane, a.stamp, a.lane);
}

void RingMerger::push(uint32_t lane) {
  heap_.push_back({lanes_[lane].rec.stamp, lane});
  std::push_heap(heap_.begin(), heap_.end(), heap_greater);
}

bool RingMerger::load(uint32_t lane) {
  Lane& l = lanes_[lane];
  if (l.cursor.off == l.head) {
    if (consume_ && !hold_) l.reader->publish(l.ring);
    return false;
  }
  for (;;) {
    switch (l.reader->parse(l.ring, l.cursor.off, l.head, &l.rec)) {
      case RingAreaReader::ParseResult::kRecord:
        return true;
      case RingAreaReader::ParseResult::kEmpty:
        if (consume_ && !hold_) l.reader->publish(l.ring);
        return false;
      case RingAreaReader::ParseResult::kSkip:
        // Owner records: the lane's writer from here (each step moves the cursor on).
        if (consume_) {
          l.reader->move_tail(l.ring, l.rec, hold_);
          l.cursor = l.reader->cursor(l.ring);
        } else {
          l.cursor.off = l.rec.next;
          l.cursor.pos += l.rec.advance;
          l.cursor.writer = l.rec.writer;
        }
        continue;
      case RingAreaReader::ParseResult::kCorrupt:
        break;
    }
    break;
  }
  if (consume_) {
    l.reader->skip_corrupt(l.ring);
    l.cursor = l.reader->cursor(l.ring);
    l.head = l.cursor.off;
  } else {
    l.cursor.pos += distance(l.cursor.off, l.head, l.reader->ring_bytes());
    l.cursor.off = l.head;
    l.cursor.writer = 0;
  }
  return false;
}

void RingMerger::refresh() {
  ++snapshots_;
  heap_.clear();
  current_ = kNoLane;
  const RingAreaReader* seen = nullptr;
  uint32_t used = 0;
  for (uint32_t i = 0; i < lanes_.size(); ++i) {
    if (lanes_[i].reader != seen) {
      seen = lanes_[i].reader;
      used = lanes_[i].reader->rings_used();
      // Lanes for the rings claimed since the last snapshot, after the area's others.
      uint32_t have = 0;
      while (i + have < lanes_.size() && lanes_[i + have].reader == seen) ++have;
      const uint32_t last = lanes_[i + have - 1].ring;
      if (used > last + 1) {
        std::vector<Lane> more;
        for (uint32_t r = last + 1; r < used; ++r)
          more.push_back(new_lane(lanes_[i].reader, lanes_[i].tag, r));
        lanes_.insert(lanes_.begin() + i + have, more.begin(), more.end());
      }
    }
    Lane& l = lanes_[i];
    if (l.ring >= used) continue;  // the area's placeholder, before its first ring
    const RingAreaReader::State& st = l.reader->states_[l.ring];
    if (consume_ || l.cursor.pos < st.consumed) l.cursor = l.reader->cursor(l.ring);
    if (!in_buffer(*l.reader, l.ring, buffer_)) {  // another buffer's: its merger's
      l.head = l.cursor.off;
      continue;
    }
    if (!l.reader->head(l.ring, &l.head)) {
      if (consume_) l.reader->skip_corrupt(l.ring);
      l.head = l.cursor.off;
      continue;
    }
    l.owner = l.reader->owner(l.ring);
    if (load(i)) push(i);
  }
}

bool RingMerger::next(RingRecord* out, int cpu) {
  if (cpu != cpu_) {
    // Lanes set aside for another CPU (or none) come back: a new snapshot.
    cpu_ = cpu;
    heap_.clear();
    current_ = kNoLane;
  }
  bool refreshed = false;
  for (;;) {
    uint32_t lane;
    if (current_ != kNoLane) {
      lane = current_;
      current_ = kNoLane;
    } else {
      if (heap_.empty()) {
        if (refreshed || !may_refresh_) return false;
        refresh();
        refreshed = true;
        if (heap_.empty()) return false;
      }
      std::pop_heap(heap_.begin(), heap_.end(), heap_greater);
      lane = heap_.back().lane;
      heap_.pop_back();
    }
    Lane& l = lanes_[lane];
    RingAreaReader* r = l.reader;
    const RingAreaReader::State& st = r->states_[l.ring];
    if (l.cursor.pos != st.consumed && (consume_ || l.cursor.pos < st.consumed)) {
      // Consumed behind the merger's back (a reader call, clear()): start the lane over.
      l.cursor = r->cursor(l.ring);
      if (load(lane)) push(lane);
      continue;
    }
    if (cpu >= 0 && (l.rec.cpu & 0xfff) != static_cast<uint32_t>(cpu)) {
      // Another CPU's record first: the lane waits, out of the heap, with everything
      // behind it, until the snapshot ends.
      continue;
    }
    r->fill(l.ring, l.rec, RingAreaReader::lost_before(l.rec, l.cursor.lost_reported),
            l.cursor.writer != 0 ? l.cursor.writer : l.owner, hold_ ? nullptr : &buf_, out);
    out->tag = l.tag;
    returned_ = lane;
    if (consume_) {
      r->advance(l.ring, l.rec, hold_);
      l.cursor.off = st.tail;
      l.cursor.pos = st.consumed;
      l.cursor.lost_reported = st.lost_reported;
      l.cursor.writer = st.writer;
    } else {
      if (l.rec.flags & kRingFlagLostCount)
        l.cursor.lost_reported = std::max(l.cursor.lost_reported, l.rec.lost_count);
      if (l.rec.writer != 0) l.cursor.writer = l.rec.writer;
      l.cursor.off = l.rec.next;
      l.cursor.pos += l.rec.advance;
    }
    if (load(lane)) {
      // Still the oldest: no heap operation (the common case of one busy ring).
      if (heap_.empty() || !heap_greater(Item{l.rec.stamp, lane}, heap_.front()))
        current_ = lane;
      else
        push(lane);
    }
    return true;
  }
}

bool RingMerger::next_kept(RingRecord* out, int cpu, bool refresh) {
  hold_ = true;
  may_refresh_ = refresh;
  const bool got = next(out, cpu);
  may_refresh_ = true;
  hold_ = false;
  if (got) {
    const Lane& l = lanes_[returned_];
    if (kept_.empty() || kept_.back().first != l.reader || kept_.back().second != l.ring)
      kept_.emplace_back(l.reader, l.ring);
  }
  return got;
}

size_t RingMerger::next_run(RingRunRecord* out, size_t max, int cpu) {
  // next() left the lane of its record current while that lane stays the oldest, with
  // its next record parsed.
  if (!consume_ || current_ == kNoLane || current_ != returned_ || max == 0) return 0;
  const uint32_t lane = current_;
  Lane& l = lanes_[lane];
  RingAreaReader* r = l.reader;
  const RingAreaReader::State& st = r->states_[l.ring];
  const RingAreaReader::Parsed& p = l.rec;
  if (p.writer != 0 || (p.flags & kRingFlagLostCount) != 0 || l.cursor.pos != st.consumed ||
      (cpu >= 0 && (p.cpu & 0xfff) != static_cast<uint32_t>(cpu)))
    return 0;
  // The run goes on while its records come before every other lane's oldest: up to that
  // stamp, or the one before it where that lane wins the tie.
  uint64_t last_stamp = UINT64_MAX;
  if (!heap_.empty()) {
    const Item& front = heap_.front();
    if (front.lane > lane) last_stamp = front.stamp;
    else if (front.stamp != 0) last_stamp = front.stamp - 1;
    else max = 1;  // nothing behind the parsed record can come before it
  }
  // parse() checked that the payload lies inside the ring's data, in one piece.
  out[0].stamp = p.stamp;
  out[0].payload = r->data(l.ring) + p.off + kRingRecordHeaderSize;
  out[0].len = p.len;
  out[0].cpu = p.cpu & 0xfff;
  out[0].counter_stamp = (p.flags & kRingFlagCounterStamp) != 0;
  r->advance(l.ring, p, true);
  const size_t n = 1 + r->take_run(l.ring, l.head, cpu, last_stamp, out + 1, max - 1);
  l.cursor.off = st.tail;
  l.cursor.pos = st.consumed;
  hold_ = true;  // load() at the snapshot's end must not hand the kept bytes back
  if (!load(lane)) {
    current_ = kNoLane;
  } else if (!heap_.empty() && heap_greater(Item{l.rec.stamp, lane}, heap_.front())) {
    current_ = kNoLane;
    push(lane);
  }
  hold_ = false;
  return n;
}

void RingMerger::release_kept() {
  for (const auto& [reader, ring] : kept_) reader->publish_due(ring);
  kept_.clear();
}

void RingMerger::publish() {
  kept_.clear();
  if (!consume_) return;
  for (const Lane& l : lanes_) l.reader->publish(l.ring);
}

void RingMerger::rewind() {
  for (Lane& l : lanes_) {
    l.cursor = l.reader->cursor(l.ring);
    l.head = l.cursor.off;
  }
  heap_.clear();
  current_ = kNoLane;
}

// --- sleeping ---------------------------------------------------------------------------

namespace {

constexpr uint64_t kSpins = 64;
constexpr uint64_t kSpinHeads = 4096;
constexpr int kManyAreasTimeoutMs = 10;

bool global_barrier_available() {
  static const bool available = [] {
    const long r = syscall(SYS_membarrier, MEMBARRIER_CMD_QUERY, 0, 0);
    return r > 0 && (r & MEMBARRIER_CMD_GLOBAL_EXPEDITED) != 0;
  }();
  return available;
}

bool any_data(std::span<RingAreaReader* const> readers, int buffer) {
  for (RingAreaReader* r : readers)
    if (r->has_data(-1, buffer)) return true;
  return false;
}

}  // namespace

RingWaitResult ring_wait(std::span<RingAreaReader* const> readers, int timeout_ms, int buffer) {
  if (timeout_ms < 0) timeout_ms = 0;
  // A short spin first (a few microseconds: as many heads read in all however many areas
  // there are), so that a reader that keeps up with busy producers never pays for the
  // barrier and the system calls.
  uint64_t rings = 0;
  for (RingAreaReader* r : readers) rings += r->rings_used();
  const uint64_t spins = rings ? std::clamp<uint64_t>(kSpinHeads / rings, 1, kSpins) : 0;
  for (uint64_t i = 0; i < spins; ++i) {
    if (any_data(readers, buffer)) return RingWaitResult::kReady;
    for (int k = 0; k < 16; ++k) _mm_pause();
  }
  timespec deadline;
  clock_gettime(CLOCK_MONOTONIC, &deadline);
  const size_t n = readers.size();
  if (n > FUTEX_WAITV_MAX) timeout_ms = std::min(timeout_ms, kManyAreasTimeoutMs);
  deadline.tv_sec += timeout_ms / 1000;
  deadline.tv_nsec += static_cast<long>(timeout_ms % 1000) * 1000000;
  if (deadline.tv_nsec >= 1000000000) {
    deadline.tv_sec += 1;
    deadline.tv_nsec -= 1000000000;
  }
  if (n == 0) {
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &deadline, nullptr) == EINTR) {
    }
    return RingWaitResult::kTimeout;
  }

  static std::atomic<size_t> rotation{0};
  const size_t m = std::min<size_t>(n, FUTEX_WAITV_MAX);
  const size_t start = n > m ? rotation.fetch_add(m, std::memory_order_relaxed) % n : 0;
  futex_waitv waiters[FUTEX_WAITV_MAX];
  for (size_t k = 0; k < m; ++k) {
    RingAreaHeader* a = readers[(start + k) % n]->header();
    waiters[k] = futex_waitv{};
    waiters[k].val = load_acquire(&a->wake_seq);
    waiters[k].uaddr = reinterpret_cast<uintptr_t>(&a->wake_seq);
    waiters[k].flags = FUTEX_32;  // shared: no FUTEX_PRIVATE_FLAG
    store_relaxed(&a->sleeping, 1u);
  }
  // Between the flags and the last look at the heads, a barrier on every CPU that runs a
  // registered producer: a commit this look misses will see its flag (ring.h).
  if (!global_barrier_available() ||
      syscall(SYS_membarrier, MEMBARRIER_CMD_GLOBAL_EXPEDITED, 0, 0) != 0) {
    std::atomic_thread_fence(std::memory_order_seq_cst);
  }
  RingWaitResult result;
  if (any_data(readers, buffer)) {
    result = RingWaitResult::kReady;
  } else {
    const long r = syscall(SYS_futex_waitv, waiters, m, 0, &deadline, CLOCK_MONOTONIC);
    if (r >= 0 || errno == EAGAIN || errno == EINTR) {
      result = RingWaitResult::kWoken;
    } else if (errno == ETIMEDOUT) {
      result = RingWaitResult::kTimeout;
    } else {
      // No futex_waitv (a kernel before 5.16): wait on one area, at most 10 ms.
      timespec rel{0, static_cast<long>(std::min(timeout_ms, kManyAreasTimeoutMs)) * 1000000};
      const long w = syscall(SYS_futex, waiters[0].uaddr, FUTEX_WAIT,
                             static_cast<uint32_t>(waiters[0].val), &rel, nullptr, 0);
      result = w == 0 || errno == EAGAIN ? RingWaitResult::kWoken : RingWaitResult::kTimeout;
    }
  }
  for (size_t k = 0; k < m; ++k) store_relaxed(&readers[(start + k) % n]->header()->sleeping, 0u);
  return result;
}

}  // namespace probefs::events
