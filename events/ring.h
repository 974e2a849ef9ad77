// The ring buffer's shared memory: the layout of one traced process's ring area, and the
// producer half, which runs on the hit path inside that process (DESIGN.md §3, §5).
//
// One AREA per traced process: a memfd the daemon creates, sizes, seals and maps
// (events/ring_consumer.h); the agent inside the process maps the same memfd. It holds a
// header and a fixed number of RINGS, each a single-producer, single-consumer byte ring
// that belongs to one thread of the process at a time:
//
//   offset 0               RingAreaHeader        geometry, clock mode, the recording
//                                                switch, the counter clock, the reader's
//                                                wake word
//   fallback_offset        u64 fallback_hits[probe_slots]   atomic; hits of a thread that
//                          u64 misses[probe_slots]          has no ring; misses (nmissed)
//   rings_offset           ring 0, ring 1, ... ring_count - 1, each ring_stride bytes:
//     +0                     RingControl         owner tid, head (producer's line), lost,
//                                                the owner's name; tail (the consumer's
//                                                line)
//     +128                   u64 hits[probe_slots]          written by the ring's producer
//     +hits_bytes            data[ring_bytes]               the records
//
// Sizes. The kernel's buffer_size_kb is the size of each per-CPU buffer; here the unit
// that has its own buffer is the thread, so buffer_size_kb sets ring_bytes:
//   ring_bytes = buffer_size_kb * 1024 rounded up to whole pages (4 KiB), as the kernel
//   rounds to pages; buffer_total_size_kb = buffer_size_kb * the rings of every area.
// The daemon chooses ring_count per area when it creates it (threads beyond that count
// record nothing until a ring is freed: their hits go to fallback_hits, their records to
// unowned_lost). A memfd's pages are allocated when first written, so the rings no
// thread ever claimed cost next to nothing.
//
// Records. Each is a 16-byte RingRecordHeader, then (only for the first data record after
// drops) the ring's cumulative lost count as a u64, then the payload (an events record,
// events/compile.h, which the ring treats as bytes; or an owner record, below), padded to
// 8 bytes. A record never
// wraps: when the bytes left before the end of the data are too few, the producer writes
// a padding marker there (only its first 8 bytes are meaningful) and puts the record at 0.
// Offsets stay in [0, ring_bytes): head == tail is empty, and the producer never lets head
// reach tail from behind, so a ring holds at most ring_bytes - 8 bytes.
//
// Publication. The producer writes the record's bytes, then stores head with release
// semantics (commit): the consumer reads head with acquire and then only the bytes before
// it. Nothing a producer does between reserve and commit is visible, so a thread killed
// there leaves the ring as it was before the reservation. The consumer stores tail with
// release once it is done with records; the producer writes over those bytes only after
// it read that tail (acquire). The consumer stores its tail in batches (a sixteenth of
// the ring, or whenever it has caught up) rather than per record, as each store costs a
// cache-line transfer between the two; so a busy reader may hold back up to that much
// room from the producer.
//
// Full ring: the new record is dropped (the kernel's non-overwrite mode) and counted in
// `lost`; the next record that fits carries the cumulative count, so the consumer tells
// exactly how many records were lost between two it returns.
//
// Owners. A thread claims a free ring at its first record (a CAS of owner from 0 to its
// tid); the daemon frees the ring once it is drained and the thread is gone (or the thread
// retired it), see RingAreaReader::reclaim. When no ring is free, the new thread takes
// over a drained ring whose owner is gone (a CAS of owner from the old tid to its own; the
// daemon's reclaim CASes the same word first to kRingOwnerFreeing, so one of the two
// wins): threads that come and go reuse rings at once, without waiting for the daemon's
// next reclaim, and the hit counters simply go on. When none of those is left either (the
// reader fell a whole area's rings behind threads that come and go), it takes over a ring
// whose owner is gone with its records still unread, as long as an eighth of it is free:
// records then follow one another in a ring whatever thread wrote them, and each claim
// says whose they are from there on.
//
// Buffers. The top level's buffer and each instance's (instances/NAME) are separate
// rings: a ring holds one buffer's records (RingControl::buffer, stored by the claimer
// before its first commit), and a thread claims one ring per buffer it records into,
// its hits counted in the first. A ring is taken over only for the buffer it holds, or
// once drained; the daemon's readers take each buffer's rings apart.
//
// Owner records. A claimer that gives its name (the agent's threads do) writes an owner
// record first thing in the ring it claimed: a record of kind kRingKindOwner whose payload
// is RingOwnerRecord, its tid and its name (the kernel's comm). The records after it, up to
// the next owner record, are that thread's: the reader names each record by the last owner
// record before it (RingRecord::tid), and keeps the name for the thread's lines after it
// is gone, as the kernel's saved_cmdlines does. Owner records are not records the reader
// returns. A claim without a name (the daemon's own ring) writes none, and its records are
// the ring's owner word's. The claimer also stores its name in the ring's control
// (ring_set_comm), where the daemon finds it for a thread whose ring it frees. Rings, reserve and
// commit are not reentrant: one thread uses its RingProducer, and the caller's recursion
// guard keeps a signal handler on the same thread from entering reserve while a
// reservation is open.
//
// After fork, the child's threads must not use the parent's RingProducers (the agent's
// atfork child handler drops them): the child is a target of its own, with its own area.
//
// Timestamps are read in process without a system call (RingAreaHeader::stamp_mode):
// the TSC with the CPU number from TSC_AUX, which Linux sets to cpu | node << 12 on every
// CPU, read by rdtsc + rdpid (about 10 ns together on our VMs, rdpid alone under 1 ns) or,
// on CPUs without rdpid, rdtscp (about 19 ns: it waits for the instructions before it);
// where TSC_AUX is not the CPU (a hypervisor that keeps the host's: the instructions
// work, the kernel does not list them), from the thread's rseq area, which the kernel
// keeps current and glibc registers for every thread (__rseq_offset from the thread
// pointer); or, for the `counter` trace clock, an atomic increment of the area's counter. The
// daemon converts TSC stamps to the chosen trace clock (events/trace_clock.h). A process
// that disables the TSC for itself (prctl PR_SET_TSC) faults on its first record.
//
// Waking the reader costs no system call per record: the consumer sets `sleeping` before
// it futex-waits on wake_seq (with a bounded timeout), and a producer that finds the flag
// set after a commit clears it, bumps wake_seq and calls FUTEX_WAKE. The consumer sets
// the flag and then issues membarrier(MEMBARRIER_CMD_GLOBAL_EXPEDITED) before it looks at
// the rings a last time, so the producer's commit needs no fence of its own: either the
// consumer sees the new head, or the producer sees the flag. Processes that did not
// register for that barrier (ring_register_producer_process) can miss a wake, which costs
// the reader its timeout in latency, never a hang.
//
// Threads: the producer functions run on the hit path of the thread that owns the
// RingProducer: no allocation, no locks, no library calls, no system call but the wake;
// they compile with -O2 -mgeneral-regs-only (tests/events/check_ring_hit_path.sh).
//
// The area is writable by the traced process, so the daemon treats every byte of it as
// hostile (ring_consumer.h). The producer trusts the header, which only the daemon writes:
// a process that scribbles over its own area can only break its own records.
#pragma once

#include <linux/futex.h>
#include <linux/membarrier.h>
#include <sys/syscall.h>

#include <cerrno>

#include <cstddef>
#include <cstdint>

#include "arch/syscall.h"

// glibc's rseq registration (2.35 on; weak: absent in an older libc, where the rseq CPU
// source says CPU 0). Read only by ring_rseq_cpu_offset(), never on the hit path.
extern "C" {
extern const ptrdiff_t __rseq_offset __attribute__((weak));
extern const unsigned int __rseq_size __attribute__((weak));
}

namespace probefs::events {

inline constexpr uint32_t kRingAreaMagic = 0x52464270;      // "pBFR"
inline constexpr uint32_t kRingAreaVersion = 4;
inline constexpr uint32_t kRingPageBytes = 4096;
inline constexpr uint32_t kRingMinBytes = kRingPageBytes;  // per ring, a page multiple
inline constexpr uint32_t kRingMaxBytes = 1u << 30;
inline constexpr uint32_t kRingMaxCount = 4096;
inline constexpr uint32_t kRingMaxProbeSlots = 1u << 16;    // a multiple of 8
inline constexpr uint64_t kRingMaxAreaBytes = 1ull << 36;
inline constexpr uint32_t kRingRecordHeaderSize = 16;
// Buffers (the top level's and each of instances/): a ring holds the records of one
// buffer (RingControl::buffer), so a thread that records into several has a ring in each.
inline constexpr uint32_t kRingMaxBuffers = 16;

// RingControl::owner: 0 when free, else the owner's tid, with kRingOwnerRetired once the
// thread promised to write no more (it may then exit before the daemon frees the ring),
// and kRingOwnerFreeing while the daemon frees it (nobody may take it over meanwhile).
inline constexpr uint32_t kRingOwnerTidMask = 0x3fffffff;  // pid_max is at most 2^22
inline constexpr uint32_t kRingOwnerRetired = 0x80000000;
inline constexpr uint32_t kRingOwnerFreeing = 0x40000000;

// RingAreaHeader::stamp_mode: the low 16 bits choose the stamp, the high 16 bits where the
// CPU number comes from. 0 (TSC + rdpid) is the fast path the producer tests first.
enum RingStampClock : uint32_t {
  kRingStampTsc = 0,      // rdtsc (or rdtscp): the TSC, converted by the daemon
  kRingStampCounter = 1,  // ++RingAreaHeader::counter: the `counter` trace clock
};
enum RingCpuSource : uint32_t {
  kRingCpuRdpid = 0,   // rdpid: TSC_AUX
  kRingCpuRdtscp = 1,  // rdtscp: the TSC and TSC_AUX in one instruction
  kRingCpuNone = 2,    // no source: every record says CPU 0
  kRingCpuRseq = 3,    // the thread's rseq cpu_id (glibc's registration)
};
constexpr uint32_t ring_stamp_mode(RingStampClock clock, RingCpuSource cpu) {
  return static_cast<uint32_t>(clock) | static_cast<uint32_t>(cpu) << 16;
}

// RingRecordHeader::kind. Zeroed memory is no record at all.
inline constexpr uint8_t kRingKindData = 1;
inline constexpr uint8_t kRingKindPadding = 2;
inline constexpr uint8_t kRingKindOwner = 3;  // payload: RingOwnerRecord
// RingRecordHeader::flags.
inline constexpr uint8_t kRingFlagCounterStamp = 1;  // stamp is the counter, not the TSC
inline constexpr uint8_t kRingFlagLostCount = 2;     // a u64 cumulative lost count follows
inline constexpr uint8_t kRingKnownFlags = kRingFlagCounterStamp | kRingFlagLostCount;

struct RingRecordHeader {
  uint32_t len;    // payload bytes (data); bytes up to the end of the ring (padding)
  uint16_t cpu;    // TSC_AUX & 0xfff
  uint8_t kind;    // kRingKind*
  uint8_t flags;   // kRingFlag*
  uint64_t stamp;  // TSC or counter value, taken at reserve
};
static_assert(sizeof(RingRecordHeader) == kRingRecordHeaderSize);

// The owner's name: at most 15 bytes and a NUL, as the kernel's TASK_COMM_LEN.
inline constexpr uint32_t kRingCommBytes = 16;

// The payload of an owner record: the records after it are this thread's.
struct RingOwnerRecord {
  uint32_t tid;
  uint32_t reserved;  // 0
  char comm[kRingCommBytes];
};
static_assert(sizeof(RingOwnerRecord) == 24);
inline constexpr uint32_t kRingOwnerRecordBytes = kRingRecordHeaderSize + sizeof(RingOwnerRecord);

struct RingAreaHeader {
  // Line 0: written by the daemon before it hands the area out; read-only afterwards but
  // for stamp_mode, which the daemon may change when the trace clock changes, and
  // stack_options, which it changes with options/. (tracing_on is the control page's:
  // events/control_page.h.)
  uint32_t magic;
  uint32_t version;
  uint64_t area_bytes;
  uint32_t ring_count;
  uint32_t ring_bytes;       // data bytes per ring: a multiple of kRingPageBytes
  uint32_t ring_stride;      // bytes from one ring to the next
  uint32_t probe_slots;      // hit counters per ring (and in each fallback array)
  uint32_t fallback_offset;  // from the area's start: fallback_hits, then misses
  uint32_t rings_offset;     // from the area's start: ring 0
  uint32_t stamp_mode;       // ring_stamp_mode(); read by every reserve (relaxed)
  uint32_t reserved1;        // 0
  uint32_t stack_options;    // kRingStack*: stack records after each event's (options/)
  uint32_t reserved0[3];
  // Line 1: the counter clock, atomic (kRingStampCounter).
  alignas(64) uint64_t counter;
  // Line 2: written rarely.
  alignas(64) uint64_t unowned_lost;  // records of threads without a ring (atomic)
  uint32_t free_generation;           // bumped by the daemon each time it frees rings
  // 1 + the highest ring ever claimed (an atomic max by claimers, who take the lowest
  // ring free): the reader looks at no ring beyond it, so an area of many rings costs
  // its reader what the rings in use cost.
  uint32_t rings_high;
  // Line 3: waking the reader.
  alignas(64) uint32_t wake_seq;  // the futex word: bumped by each wake
  uint32_t sleeping;              // nonzero: the reader is (about to be) asleep
};
static_assert(sizeof(RingAreaHeader) == 256);
static_assert(offsetof(RingAreaHeader, counter) == 64);
static_assert(offsetof(RingAreaHeader, wake_seq) == 192);

struct RingControl {
  // Line 0: the producer's. owner is CASed by claiming threads and cleared by the daemon.
  uint32_t owner;
  uint32_t head;  // end of the committed records (release); the producer's only
  uint64_t lost;  // cumulative records dropped for lack of room; the producer's only
  // The name the owner had when it claimed the ring (ring_set_comm): valid for the tid in
  // comm_tid (stored with release after comm); the daemon zeroes comm_tid when it frees
  // the ring.
  uint32_t comm_tid;
  // The buffer whose records the ring holds (below kRingMaxBuffers), set by the claimer
  // before its first commit; a ring changes buffers only while it holds no record.
  uint32_t buffer;
  uint64_t comm[kRingCommBytes / 8];
  uint32_t reserved0[6];
  // Line 1: the consumer's.
  alignas(64) uint32_t tail;  // start of the records not yet consumed (release)
  uint32_t reserved1[15];
};
static_assert(sizeof(RingControl) == 128);
static_assert(offsetof(RingControl, comm) == 24);
static_assert(offsetof(RingControl, tail) == 64);

// What the daemon asks for; ring_layout() derives the rest.
struct RingGeometry {
  uint32_t ring_count = 64;
  uint32_t ring_bytes = 1410 * 1024;  // the kernel's default buffer_size_kb
  uint32_t probe_slots = 1024;
};

struct RingLayout {
  uint64_t area_bytes = 0;
  uint32_t fallback_offset = 0;
  uint32_t rings_offset = 0;
  uint32_t ring_stride = 0;
  uint32_t hits_offset = 0;  // within a ring
  uint32_t data_offset = 0;  // within a ring
};

constexpr uint64_t ring_align_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

// Fills `out` for `g` (ring_bytes rounded up to whole pages). False when a value is out of
// range: 1..kRingMaxCount rings, kRingMinBytes..kRingMaxBytes each, probe_slots a multiple
// of 8 up to kRingMaxProbeSlots, the whole area at most kRingMaxAreaBytes.
constexpr bool ring_layout(const RingGeometry& g, RingLayout* out) {
  if (g.ring_count == 0 || g.ring_count > kRingMaxCount) return false;
  if (g.ring_bytes == 0 || g.ring_bytes > kRingMaxBytes) return false;
  if (g.probe_slots % 8 != 0 || g.probe_slots > kRingMaxProbeSlots) return false;
  const uint64_t ring_bytes = ring_align_up(g.ring_bytes, kRingPageBytes);
  const uint64_t hits_bytes = ring_align_up(uint64_t{g.probe_slots} * 8, 64);
  const uint64_t fallback_offset = sizeof(RingAreaHeader);
  const uint64_t rings_offset =
      ring_align_up(fallback_offset + 2 * uint64_t{g.probe_slots} * 8, kRingPageBytes);
  const uint64_t stride = sizeof(RingControl) + hits_bytes + ring_bytes;
  const uint64_t area = rings_offset + stride * g.ring_count;
  if (area > kRingMaxAreaBytes) return false;
  out->area_bytes = area;
  out->fallback_offset = static_cast<uint32_t>(fallback_offset);
  out->rings_offset = static_cast<uint32_t>(rings_offset);
  out->ring_stride = static_cast<uint32_t>(stride);
  out->hits_offset = static_cast<uint32_t>(sizeof(RingControl));
  out->data_offset = static_cast<uint32_t>(sizeof(RingControl) + hits_bytes);
  return true;
}

// Whether `area` (size bytes mapped) has a header that describes itself consistently and
// fits the mapping. Both sides check it after they map the memfd; the daemon also keeps
// its own copy of the geometry and never reads these fields again (ring_consumer.h).
inline bool ring_area_header_valid(const RingAreaHeader* a, uint64_t size) {
  if (size < sizeof(RingAreaHeader)) return false;
  RingGeometry g;
  g.ring_count = a->ring_count;
  g.ring_bytes = a->ring_bytes;
  g.probe_slots = a->probe_slots;
  RingLayout l;
  return a->magic == kRingAreaMagic && a->version == kRingAreaVersion &&
         a->ring_bytes % kRingPageBytes == 0 && ring_layout(g, &l) &&
         l.area_bytes == a->area_bytes && l.area_bytes <= size &&
         l.fallback_offset == a->fallback_offset && l.rings_offset == a->rings_offset &&
         l.ring_stride == a->ring_stride;
}

// --- the producer (hit path) ---------------------------------------------------------

// The calling thread's hold on its ring, kept in the thread's own memory (the agent keeps
// it in thread-local storage): pointers and the positions only this thread changes.
// Zero-initialised means "no ring yet". A cache line of its own: the owner writes it on
// every record, and kept in an array (one per ring) neighbours would share lines between
// threads on different CPUs.
struct alignas(64) RingProducer {
  uint8_t* data = nullptr;          // the ring's data; null until claimed
  RingControl* ctl = nullptr;
  RingAreaHeader* area = nullptr;
  uint64_t* hits = nullptr;
  uint32_t size = 0;                // ring_bytes
  uint32_t probe_slots = 0;
  uint32_t head = 0;                // mirrors ctl->head
  uint32_t tail_cache = 0;          // the last tail read; re-read only when short of room
  uint32_t pending_off = 0;         // the open reservation's record
  uint32_t pending_extra = 0;       // 8 when it carries the lost count
  uint64_t lost = 0;                // mirrors ctl->lost
  uint64_t lost_marked = 0;         // the lost count the last committed record carried
  uint32_t ring = 0;                // index in the area
  uint32_t claim_generation = 0;    // free_generation when the last claim failed
  int32_t rseq_cpu = -1;            // kRingCpuRseq: ring_rseq_cpu_offset(), set by the owner
};

namespace ring_detail {

template <class T>
inline T load_relaxed(const T* p) { return __atomic_load_n(p, __ATOMIC_RELAXED); }
template <class T>
inline T load_acquire(const T* p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
template <class T>
inline void store_relaxed(T* p, T v) { __atomic_store_n(p, v, __ATOMIC_RELAXED); }
template <class T>
inline void store_release(T* p, T v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }

inline uint8_t* area_bytes(RingAreaHeader* a) { return reinterpret_cast<uint8_t*>(a); }

inline RingControl* control(RingAreaHeader* a, uint32_t i) {
  return reinterpret_cast<RingControl*>(area_bytes(a) + a->rings_offset +
                                        uint64_t{i} * a->ring_stride);
}

// Where a record of `need` bytes (header included, 8-aligned) goes when the producer is at
// `h` and the consumer at `t`: `*off`, with padding from h to the end when *off != h.
// The new head must not equal t (that would read as empty).
inline bool fits(uint32_t h, uint32_t t, uint32_t need, uint32_t size, uint32_t* off) {
  if (h >= t) {  // used: [t, h); free: [h, size) and [0, t)
    const uint64_t end = uint64_t{h} + need;
    if (end < size || (end == size && t != 0)) {
      *off = h;
      return true;
    }
    if (need < t) {  // pad [h, size), record at [0, need)
      *off = 0;
      return true;
    }
    return false;
  }
  if (uint64_t{h} + need < t) {  // used: [t, size) and [0, h); free: [h, t)
    *off = h;
    return true;
  }
  return false;
}

// fits() against the tail last seen, then, when short of room, against the consumer's
// current tail: its cache line is read only then, not on every record.
[[gnu::always_inline]] inline bool place(RingProducer* p, uint64_t need, uint32_t* off) {
  if (need >= p->size) return false;
  const uint32_t n = static_cast<uint32_t>(need);
  if (fits(p->head, p->tail_cache, n, p->size, off)) return true;
  uint32_t tail = load_acquire(&p->ctl->tail);
  // Only the daemon writes the tail, but it lies in memory the process can scribble on:
  // whatever it reads, the producer writes inside its ring.
  if (tail >= p->size || tail % 8 != 0) tail = p->head;
  p->tail_cache = tail;
  return fits(p->head, p->tail_cache, n, p->size, off);
}

// The lines a reader on another core has read come back to this one with a delay the
// store buffer cannot hide: asking for the line kRingPrefetchAhead bytes on, with write
// intent, overlaps that wait with the records before it. Only within the room the reader
// has left (as far as the cached tail tells): a line it has still to read stays with it.
// (PREFETCHW; a NOP on processors without it.)
inline constexpr uint32_t kRingPrefetchAhead = 1024;
[[gnu::always_inline]] inline void prefetch_for_write(const RingProducer* p, uint32_t off) {
  const uint32_t room = p->tail_cache > off ? p->tail_cache - off : p->size - off + p->tail_cache;
  if (room <= kRingPrefetchAhead + 64) return;
  uint32_t ahead = off + kRingPrefetchAhead;
  if (ahead >= p->size) ahead -= p->size;
  asm volatile("prefetchw %0" ::"m"(*(p->data + ahead)));
}

[[gnu::always_inline]] inline uint64_t read_tsc() {
  uint32_t lo, hi;
  asm volatile("rdtsc" : "=a"(lo), "=d"(hi));
  return uint64_t{hi} << 32 | lo;
}

// The calling thread's CPU from its rseq area (struct rseq: u32 cpu_id_start, u32 cpu_id),
// `offset` from the thread pointer (ring_rseq_cpu_offset()); 0 where there is none.
[[gnu::always_inline]] inline uint32_t ring_rseq_cpu(int32_t offset) {
  if (offset < 0) return 0;
  uintptr_t tp;
  asm("mov %%fs:0, %0" : "=r"(tp));
  const int32_t cpu = *reinterpret_cast<const volatile int32_t*>(tp + static_cast<uint32_t>(offset));
  return cpu < 0 ? 0 : static_cast<uint32_t>(cpu);
}

// The stamp and CPU as stamp_mode says; the flags the record gets.
[[gnu::always_inline]] inline uint64_t read_stamp(const RingProducer* p, uint32_t* cpu,
                                                  uint8_t* flags) {
  RingAreaHeader* a = p->area;
  const uint32_t mode = load_relaxed(&a->stamp_mode);
  if (__builtin_expect(mode == ring_stamp_mode(kRingStampTsc, kRingCpuRdpid), 1)) {
    const uint64_t tsc = read_tsc();
    uint64_t aux;
    asm volatile("rdpid %0" : "=r"(aux));
    *cpu = static_cast<uint32_t>(aux) & 0xfff;
    *flags = 0;
    return tsc;
  }
  uint32_t aux = 0;
  uint64_t stamp;
  switch (mode >> 16) {
    case kRingCpuRdpid: {
      uint64_t a64;
      asm volatile("rdpid %0" : "=r"(a64));
      aux = static_cast<uint32_t>(a64);
      stamp = (mode & 0xffff) == kRingStampTsc ? read_tsc() : 0;
      break;
    }
    case kRingCpuRdtscp: {
      uint32_t lo, hi;
      asm volatile("rdtscp" : "=a"(lo), "=d"(hi), "=c"(aux));
      stamp = uint64_t{hi} << 32 | lo;
      break;
    }
    case kRingCpuRseq:
      aux = ring_rseq_cpu(p->rseq_cpu);
      stamp = (mode & 0xffff) == kRingStampTsc ? read_tsc() : 0;
      break;
    default:
      stamp = (mode & 0xffff) == kRingStampTsc ? read_tsc() : 0;
      break;
  }
  *cpu = aux & 0xfff;
  if ((mode & 0xffff) == kRingStampCounter) {
    *flags = kRingFlagCounterStamp;
    return __atomic_add_fetch(&a->counter, 1, __ATOMIC_RELAXED);
  }
  *flags = 0;
  return stamp;
}

}  // namespace ring_detail

// Whether the owner `o` of a ring that holds no unread record has left it: retired, or
// (for a process `pid` that may ask) its thread is gone. A system call: claims only.
inline bool ring_owner_left(uint32_t o, uint32_t pid) {
  if (o & kRingOwnerRetired) return true;
  if (pid == 0) return false;
  return arch::raw_syscall(__NR_tgkill, pid, o & kRingOwnerTidMask, 0) == -ESRCH;
}

namespace ring_detail {

// The padding marker at p->head, when a record goes to `off` (0) instead: the consumer
// skips from there to the end of the ring. Only its first 8 bytes are written: there may
// be no more before the end.
[[gnu::always_inline]] inline void put_padding(RingProducer* p, uint32_t off) {
  if (off == p->head) return;
  RingRecordHeader* pad = reinterpret_cast<RingRecordHeader*>(p->data + p->head);
  pad->len = p->size - p->head;
  pad->cpu = 0;
  pad->kind = kRingKindPadding;
  pad->flags = 0;
}

// Bytes a producer at `head` may still write before it reaches `tail`.
inline uint32_t room(uint32_t head, uint32_t tail, uint32_t size) {
  return tail > head ? tail - head : size - head + tail;
}

// Sets up `p` for ring i of `area`, just claimed: from the head the ring's previous owner
// left (its committed records may still be unread). A head the daemon could not have
// left (odd or out of range) starts over at the tail.
inline void attach_producer(RingAreaHeader* area, uint32_t i, RingProducer* p) {
  RingControl* ctl = control(area, i);
  uint8_t* ring = reinterpret_cast<uint8_t*>(ctl);
  const uint64_t hits_bytes = ring_align_up(uint64_t{area->probe_slots} * 8, 64);
  p->ctl = ctl;
  p->area = area;
  p->hits = reinterpret_cast<uint64_t*>(ring + sizeof(RingControl));
  p->size = area->ring_bytes;
  p->probe_slots = area->probe_slots;
  uint32_t head = load_relaxed(&ctl->head);
  uint32_t tail = load_acquire(&ctl->tail);
  if (tail >= p->size || tail % 8 != 0) tail = 0;
  if (head >= p->size || head % 8 != 0) head = tail;
  p->head = head;
  p->tail_cache = tail;
  p->lost = load_relaxed(&ctl->lost);
  // The claimer's first record carries the ring's lost count whenever it has one: what the
  // previous owner lost after its last record (it may have ended without another) is
  // reported then, and what the reader knows already counts as nothing more.
  p->lost_marked = 0;
  p->pending_off = 0;
  p->pending_extra = 0;
  p->ring = i;
  p->data = ring + sizeof(RingControl) + hits_bytes;
}

// The claimer's owner record at the head of its ring, committed: false, and nothing
// written, when the ring lacks the room.
inline bool write_owner(RingProducer* p, uint32_t tid, const char* comm) {
  uint32_t off;
  if (!place(p, kRingOwnerRecordBytes, &off)) return false;
  put_padding(p, off);
  uint8_t* rec = p->data + off;
  RingRecordHeader* h = reinterpret_cast<RingRecordHeader*>(rec);
  h->cpu = 0;
  h->kind = kRingKindOwner;
  h->flags = 0;
  h->stamp = 0;
  RingOwnerRecord o;
  o.tid = tid;
  o.reserved = 0;
  __builtin_memcpy(o.comm, comm, kRingCommBytes);
  __builtin_memcpy(rec + kRingRecordHeaderSize, &o, sizeof o);
  h->len = sizeof o;
  // Committed as ring_commit does, without waking the reader: the records that follow
  // will, and an owner record alone is nothing to read.
  uint32_t head = off + kRingOwnerRecordBytes;
  if (head == p->size) head = 0;
  p->head = head;
  store_release(&p->ctl->head, head);
  return true;
}

}  // namespace ring_detail

// Claims a ring of `area` for the calling thread, whose thread id is `tid`, for the
// records of `buffer`, and sets up `p`: a free one, or else (when `pid`, the process's id,
// is given) a drained one whose owner is gone, or else (when `comm`, the thread's name, is
// given too) one of the same buffer whose owner is gone with an eighth of it or more
// free. With `comm`, the ring's first record from here is the claimer's owner record.
// False when no ring can be had (p->claim_generation then remembers when, see
// ring_claim_worth_retrying). The scans start at ring 0, so that the rings in use stay at
// the front (RingAreaHeader::rings_high).
inline bool ring_claim(RingAreaHeader* area, uint32_t tid, RingProducer* p, uint32_t pid = 0,
                       const char* comm = nullptr, uint32_t buffer = 0) {
  using namespace ring_detail;
  const uint32_t generation = load_acquire(&area->free_generation);
  const uint32_t n = area->ring_count;
  const uint32_t size = area->ring_bytes;
  const uint32_t want = tid & kRingOwnerTidMask;
  if (want == 0) return false;
  const uint32_t passes = pid == 0 ? 1 : comm == nullptr ? 2 : 3;
  for (uint32_t k = 0; k < passes * n; ++k) {
    const uint32_t i = k % n;  // the lowest first: the rings in use stay few and together
    const uint32_t pass = k / n;
    RingControl* ctl = control(area, i);
    uint32_t expected = load_relaxed(&ctl->owner);
    if (pass == 0) {  // a free ring
      if (expected != 0) continue;
    } else {          // a ring whose owner is gone: drained (1), or with room enough (2)
      if (expected == 0 || (expected & kRingOwnerFreeing)) continue;
      const uint32_t head = load_relaxed(&ctl->head);
      const uint32_t tail = load_acquire(&ctl->tail);
      if (pass == 1 && tail != head) continue;
      if (pass == 2 && (tail == head || head >= size || tail >= size || head % 8 != 0 ||
                        tail % 8 != 0 || room(head, tail, size) < size / 8 ||
                        load_relaxed(&ctl->buffer) != buffer))
        continue;
      // A ring of this tid's: a thread that had the number before is surely gone.
      if ((expected & kRingOwnerTidMask) != want && !ring_owner_left(expected, pid)) continue;
    }
    if (!__atomic_compare_exchange_n(&ctl->owner, &expected, want, false, __ATOMIC_ACQUIRE,
                                     __ATOMIC_RELAXED))
      continue;
    for (uint32_t high = load_relaxed(&area->rings_high); high < i + 1;)
      if (__atomic_compare_exchange_n(&area->rings_high, &high, i + 1, false, __ATOMIC_RELEASE,
                                      __ATOMIC_RELAXED))
        break;
    // Before the first commit (the owner record's or a record's release of head): a
    // reader that sees records in the ring sees their buffer.
    store_relaxed(&ctl->buffer, buffer);
    attach_producer(area, i, p);
    if (comm != nullptr && !write_owner(p, want, comm)) {
      // No record of ours may follow the last owner's without our owner record before
      // it: the ring goes back as it was.
      uint32_t mine = want;
      __atomic_compare_exchange_n(&ctl->owner, &mine, expected, false, __ATOMIC_RELEASE,
                                  __ATOMIC_RELAXED);
      *p = RingProducer{};
      continue;
    }
    return true;
  }
  p->claim_generation = generation;
  return false;
}

// Stores the name of the thread that claimed `p`'s ring (its comm, read by the caller:
// PR_GET_NAME), for the daemon to name its records by once the thread is gone. The claimer
// calls it right after ring_claim; `tid` is the one it claimed with.
inline void ring_set_comm(RingProducer* p, uint32_t tid, const char (&comm)[kRingCommBytes]) {
  using namespace ring_detail;
  if (!p->ctl) return;
  for (uint32_t w = 0; w < kRingCommBytes / 8; ++w) {
    uint64_t v;
    __builtin_memcpy(&v, comm + 8 * w, 8);
    store_relaxed(&p->ctl->comm[w], v);
  }
  store_release(&p->ctl->comm_tid, tid & kRingOwnerTidMask);
}

// After a failed claim: whether the daemon has freed rings since, so that another scan
// may succeed. One load; lets a thread without a ring retry without scanning every hit.
inline bool ring_claim_worth_retrying(const RingAreaHeader* area, const RingProducer* p) {
  return ring_detail::load_acquire(&area->free_generation) != p->claim_generation;
}

// Room for a record of up to max_len payload bytes: a pointer to max_len contiguous bytes,
// or nullptr when the ring lacks room (the record is lost and counted). Takes the record's
// stamp and CPU. Nothing is visible to the reader until ring_commit.
[[gnu::always_inline]] inline void* ring_reserve(RingProducer* p, uint32_t max_len) {
  using namespace ring_detail;
  const uint32_t extra = p->lost != p->lost_marked ? 8 : 0;
  const uint64_t need = (uint64_t{kRingRecordHeaderSize} + extra + max_len + 7) & ~uint64_t{7};
  uint32_t off;
  if (__builtin_expect(!place(p, need, &off), 0)) {
    store_relaxed(&p->ctl->lost, ++p->lost);
    return nullptr;
  }
  uint8_t* rec = p->data + off;
  prefetch_for_write(p, off);
  put_padding(p, off);
  uint32_t cpu;
  uint8_t flags;
  const uint64_t stamp = read_stamp(p, &cpu, &flags);
  RingRecordHeader* h = reinterpret_cast<RingRecordHeader*>(rec);
  h->cpu = static_cast<uint16_t>(cpu);
  h->kind = kRingKindData;
  h->stamp = stamp;
  if (extra) {
    flags |= kRingFlagLostCount;
    __builtin_memcpy(rec + kRingRecordHeaderSize, &p->lost, 8);
  }
  h->flags = flags;
  p->pending_off = off;
  p->pending_extra = extra;
  return rec + kRingRecordHeaderSize + extra;
}

// Slow path of ring_commit: wakes the reader. Clearing the flag first means one wake per
// sleep, however many producers see it.
[[gnu::noinline, gnu::cold]] inline void ring_wake(RingAreaHeader* area) {
  if (__atomic_exchange_n(&area->sleeping, 0u, __ATOMIC_ACQ_REL) == 0) return;
  __atomic_add_fetch(&area->wake_seq, 1u, __ATOMIC_RELEASE);
  // A shared futex (no FUTEX_PRIVATE_FLAG): the waiter is another process.
  arch::raw_syscall(__NR_futex, reinterpret_cast<long>(&area->wake_seq), FUTEX_WAKE,
                    0x7fffffff, 0, 0, 0);
}

// Publishes the reserved record with len <= max_len payload bytes, and wakes the reader
// if it sleeps.
[[gnu::always_inline]] inline void ring_commit(RingProducer* p, uint32_t len) {
  using namespace ring_detail;
  uint8_t* rec = p->data + p->pending_off;
  reinterpret_cast<RingRecordHeader*>(rec)->len = len;
  const uint32_t stride = (kRingRecordHeaderSize + p->pending_extra + len + 7) & ~7u;
  uint32_t head = p->pending_off + stride;
  if (head == p->size) head = 0;
  p->head = head;
  if (p->pending_extra) p->lost_marked = p->lost;
  store_release(&p->ctl->head, head);
  // No fence between the store and this load: the reader's membarrier orders them.
  if (__builtin_expect(load_relaxed(&p->area->sleeping) != 0, 0)) ring_wake(p->area);
}

// Abandons the open reservation (a filter rejected the record): nothing was published.
inline void ring_discard(RingProducer*) {}

// kprobe_profile's hits of probe slot `slot`, counted by the ring's only writer.
[[gnu::always_inline]] inline void ring_count_hit(RingProducer* p, uint32_t slot) {
  if (__builtin_expect(slot < p->probe_slots, 1)) {
    uint64_t* c = p->hits + slot;
    ring_detail::store_relaxed(c, ring_detail::load_relaxed(c) + 1);
  }
}

inline uint64_t* ring_fallback_hits(RingAreaHeader* area) {
  return reinterpret_cast<uint64_t*>(ring_detail::area_bytes(area) + area->fallback_offset);
}
inline uint64_t* ring_misses(RingAreaHeader* area) {
  return ring_fallback_hits(area) + area->probe_slots;
}

// A hit of a thread that has no ring (every ring taken): an atomic counter.
inline void ring_count_hit_unowned(RingAreaHeader* area, uint32_t slot) {
  if (slot < area->probe_slots)
    __atomic_add_fetch(ring_fallback_hits(area) + slot, 1, __ATOMIC_RELAXED);
}

// A record of a thread that has no ring.
inline void ring_drop_unowned(RingAreaHeader* area) {
  __atomic_add_fetch(&area->unowned_lost, 1, __ATOMIC_RELAXED);
}

// options/stacktrace and options/userstacktrace: after each record of an event it
// committed, the hit writes the thread's stack as the kernel's ftrace records do (below).
// Read from the header's first line, as stamp_mode.
inline constexpr uint32_t kRingKernelStack = 1;  // a kernel_stack record (`<stack trace>`)
inline constexpr uint32_t kRingUserStack = 2;    // a user_stack record (`<user stack trace>`)
[[gnu::always_inline]] inline uint32_t ring_stack_options(const RingAreaHeader* area) {
  return ring_detail::load_relaxed(&area->stack_options);
}

// The kernel's stack records (events/ftrace/kernel_stack and user_stack), their ids and
// layouts, as a target writes them: the common header (common_pid the thread), then
//   kernel_stack: s32 size (entries), u32 0, u64 caller[size] (at most kStackRecordDepth)
//   user_stack:   u32 tgid, u32 0, u64 caller[8] (unused ones 0)
// The kernel_stack of a target is its own stack (the target has no kernel side), named
// like kernel addresses are; user_stack is the kernel's user stack of a uprobe, walked
// the way the kernel walks it.
inline constexpr uint16_t kKernelStackEventId = 4;
inline constexpr uint16_t kUserStackEventId = 13;
// A snapshot trigger fired (events/control_page.h, snapshot_requests): after the record
// of the event that fired it, the common header alone (common_pid the thread). No event
// has this id (the kernel's are below it, probefs's dynamic events above); it is never
// shown.
inline constexpr uint16_t kSnapshotRequestEventId = 0x6FFF;
inline constexpr uint32_t kSnapshotRequestBytes = 8;
inline constexpr uint32_t kStackRecordDepth = 16;
inline constexpr uint32_t kUserStackDepth = 8;
inline constexpr uint32_t kUserStackRecordBytes = 16 + 8 * kUserStackDepth;

// A missed hit of probe slot `slot` (kprobe_profile's misses: the probe hit inside
// another handler). Rare, so shared and atomic.
inline void ring_count_miss(RingAreaHeader* area, uint32_t slot) {
  if (slot < area->probe_slots)
    __atomic_add_fetch(ring_misses(area) + slot, 1, __ATOMIC_RELAXED);
}

// The thread will write no more (it is exiting): the daemon may free the ring once it is
// drained, without waiting to see the thread gone. `p` is no ring afterwards.
inline void ring_retire(RingProducer* p) {
  if (!p->ctl) return;
  __atomic_or_fetch(&p->ctl->owner, kRingOwnerRetired, __ATOMIC_RELEASE);
  *p = RingProducer{};
}

// Registers the calling process for the reader's MEMBARRIER_CMD_GLOBAL_EXPEDITED (see
// "Waking the reader" above). Once per process, again in a fork child; 0 or -errno.
// The offset of this thread's rseq cpu_id from the thread pointer, the same for every
// thread of the process (RingProducer::rseq_cpu); -1 where glibc registered no rseq area.
inline int32_t ring_rseq_cpu_offset() {
  if (&__rseq_size == nullptr || &__rseq_offset == nullptr || __rseq_size < 8) return -1;
  const ptrdiff_t off = __rseq_offset + 4;
  return off >= INT32_MIN && off <= INT32_MAX ? static_cast<int32_t>(off) : -1;
}

inline long ring_register_producer_process() {
  return arch::raw_syscall(__NR_membarrier, MEMBARRIER_CMD_REGISTER_GLOBAL_EXPEDITED, 0, 0);
}

}  // namespace probefs::events
