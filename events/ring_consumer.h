// The daemon's side of the ring buffer (events/ring.h): creating an area, reading its
// rings, merging the rings of every traced process in timestamp order, freeing the rings
// of threads that are gone, summing the hit counters, and sleeping until a producer
// commits.
//
// Every byte of an area is writable by the traced process, so it is hostile input here.
// A reader copies the geometry once when it attaches and never reads it again; it reads
// each head, record header and lost count once into its own memory and checks it against
// the ring's bounds before it follows it; it copies each payload out before handing it
// on; every loop is bounded by the ring's size. A ring found inconsistent is skipped up
// to its current head and counted (RingReaderStats::corrupt). Nothing in an area can make
// the reader read outside it, loop for ever or wait on a producer: a producer that died
// between reserve and commit published nothing, and is never waited for.
//
// Threads: a RingAreaReader and a RingMerger belong to one thread at a time (the daemon
// serialises the `trace` and `trace_pipe` readers over one lock). ring_wait may run on
// that thread only, too.
//
// Typical use by the daemon:
//   per target:  RingArea::create(geometry, ring_detect_stamp_mode(clock stamp), &area);
//                pass area.fd() to the agent; reader.attach(area.mem(), area.size(), pid);
//                pipe.add(&reader, target id); look.add(&reader, target id)
//   trace_pipe:  while (pipe.next(&rec)) { if (rec.lost_before) "CPU:N [LOST n EVENTS]";
//                  format rec.payload at converter.convert(rec.stamp, rec.counter_stamp) }
//                pipe.publish() at the end of the read; ring_wait(readers, 100) when a
//                blocking read found nothing
//   trace_pipe_raw: per batch, pipe.next_kept(&rec, cpu) then pipe.next_run(run, n, cpu)
//                behind it, each record copied once into the page and checked there, then
//                pipe.release_kept()
//   trace:       look.rewind(), then look.next() to the end
//   now and then (each second, and when a thread-exit notice arrives): reader.reclaim(),
//                converter.update()
//   trace_clock: ring_set_stamp_mode on every area, reader.clear(), converter.calibrate()
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "events/ring.h"

namespace probefs::events {

// --- creating an area -------------------------------------------------------------------

// The stamp_mode for this machine (cpuid: rdpid, else rdtscp, else no CPU number) with the
// given stamp.
uint32_t ring_detect_stamp_mode(RingStampClock clock);

// Writes the header of a new area into `mem` (size bytes, zero-filled, as a fresh memfd
// is). 0, or -EINVAL when the geometry is out of range or does not fit in size.
[[nodiscard]] int ring_area_init(void* mem, uint64_t size, const RingGeometry& g,
                                 uint32_t stamp_mode);

// Changes the stamp the producers take (a new trace clock). Records already in the rings
// keep theirs: clear the readers, as the kernel empties its buffers on a clock change.
void ring_set_stamp_mode(RingAreaHeader* area, uint32_t stamp_mode);

// options/stacktrace and userstacktrace for the area's writers (kRingKernelStack...).
void ring_set_stack_options(RingAreaHeader* area, uint32_t options);

// An area in a memfd: created, sized, sealed against shrinking and growing (so that the
// traced process cannot truncate it under the daemon's feet: an access past the end would
// be SIGBUS), initialised and mapped here. The fd goes to the agent, which maps it too.
class RingArea {
 public:
  RingArea() = default;
  ~RingArea();
  RingArea(RingArea&& o) noexcept;
  RingArea& operator=(RingArea&& o) noexcept;
  RingArea(const RingArea&) = delete;
  RingArea& operator=(const RingArea&) = delete;

  // 0 or -errno (EINVAL: geometry out of range).
  [[nodiscard]] static int create(const RingGeometry& g, uint32_t stamp_mode, RingArea* out);

  int fd() const { return fd_; }  // -1 once closed
  // The mapping stays; the descriptor goes once the agent has its own (a daemon reading
  // thousands of areas must not hold a descriptor for each).
  void close_fd();
  void* mem() const { return mem_; }
  uint64_t size() const { return size_; }
  RingAreaHeader* header() const { return static_cast<RingAreaHeader*>(mem_); }

 private:
  void reset();
  int fd_ = -1;
  void* mem_ = nullptr;
  uint64_t size_ = 0;
};

// Whether thread `tid` of process `pid` exists: tgkill(pid, tid, 0) does not fail with
// ESRCH. A tid the kernel has given to a new thread of the same process since the owner
// exited reads as alive (tids are reused only after pid_max others), which keeps that
// ring from being freed until the new thread exits too: a ring lost for a while, never a
// ring shared. A main thread that exited before the others stays a zombie, and alive,
// until the process ends.
bool ring_owner_alive(pid_t pid, uint32_t tid);

// --- reading ----------------------------------------------------------------------------

struct RingRecord {
  uint64_t stamp = 0;        // TSC or counter (counter_stamp): TraceClockConverter
  uint64_t lost_before = 0;  // records of this ring dropped just before this one
  uint32_t cpu = 0;
  // The thread that wrote it: the last owner record before it in the ring, or (a ring
  // whose owner gives no name, or read from the middle of a thread's records) the ring's
  // owner when read. The payload has its own pid.
  uint32_t tid = 0;
  uint32_t tag = 0;          // the merger's tag of the area
  uint32_t ring = 0;
  bool counter_stamp = false;
  // The first record after an owner record: that record's name for `tid` (at most 15
  // bytes and a NUL, the process's bytes), for the thread's lines after it is gone.
  bool named = false;
  char comm[kRingCommBytes] = {};
  // The record's bytes, copied out of the area; valid until the next call on the reader
  // or merger that returned it.
  std::span<const uint8_t> payload;
};

// One record of a run (RingMerger::next_run): its stamp, and its bytes where they lie in
// the ring.
struct RingRunRecord {
  uint64_t stamp;
  const uint8_t* payload;
  uint32_t len;
  uint32_t cpu;
  bool counter_stamp;
};

struct RingReaderStats {
  uint64_t records = 0;            // consumed
  uint64_t lost_reported = 0;      // the sum of lost_before of the records consumed
  uint64_t lost_unattributed = 0;  // dropped after the last record of a ring now freed
  uint64_t corrupt = 0;            // times a ring was found inconsistent and skipped
  uint64_t padding = 0;            // padding markers passed
  uint64_t rings_freed = 0;
  uint64_t rings_freed_retired = 0;  // of those, rings whose owner had retired them
};

// One area, as the daemon reads it.
class RingAreaReader {
 public:
  // `mem` and `size`: the daemon's mapping of the area, kept alive by the caller for the
  // reader's life; `pid`: the traced process (for ring_owner_alive). 0, or -EINVAL when
  // the header does not describe an area that fits.
  [[nodiscard]] int attach(void* mem, uint64_t size, pid_t pid);

  uint32_t ring_count() const { return geometry_.ring_count; }
  // The rings that may hold anything: those below the area's rings_high (at most
  // ring_count, whatever the process wrote there).
  uint32_t rings_used() const;
  uint32_t probe_slots() const { return geometry_.probe_slots; }
  uint32_t ring_bytes() const { return geometry_.ring_bytes; }
  pid_t pid() const { return pid_; }
  // The process that writes here from now on (a spare area a fork child took).
  void set_pid(pid_t pid) { pid_ = pid; }
  RingAreaHeader* header() const { return area_; }

  // Consuming (trace_pipe). front: the ring's next record without consuming it; pop: consume
  // the record front returned; consume: both.
  bool front(uint32_t ring, RingRecord* out);
  void pop(uint32_t ring);
  bool consume(uint32_t ring, RingRecord* out);

  // Non-consuming (trace): a cursor at the ring's first unconsumed record. A cursor the
  // consumer has passed since moves up to the consumer.
  struct Cursor {
    uint32_t ring = 0;
    uint32_t off = 0;
    uint64_t pos = 0;            // bytes from the ring's first record ever
    uint64_t lost_reported = 0;  // lost counts already accounted before `off`
    uint32_t writer = 0;         // the last owner record's tid before `off` (0: none seen)
  };
  Cursor cursor(uint32_t ring) const;
  bool peek(Cursor* c, RingRecord* out);

  // The buffer whose records ring `ring` holds (RingControl::buffer): one the process
  // wrote out of range counts as the top level's (0).
  uint32_t buffer_of(uint32_t ring) const;

  // `buffer` >= 0 in the calls below limits them to the rings of that buffer; -1: all.
  // Whether any ring holds records not consumed (one load per ring). `cpu` >= 0: whether
  // a ring's next record is of that CPU (what a consumer of that CPU can take: a ring is
  // read in order).
  bool has_data(int cpu = -1, int buffer = -1) const;
  // Records not consumed, in every ring (a walk of their headers: no copy).
  uint64_t entries(int buffer = -1) const;
  // Records dropped since the reader attached or was last cleared: those a full ring
  // lost (reported or not yet) and those of threads that had no ring (the top level's).
  uint64_t dropped(int buffer = -1) const;
  // Rings that hold records not consumed or have an owner.
  uint32_t rings_in_use(int buffer = -1) const;
  // Drops every record not consumed (echo > trace; a clock change); dropped() starts
  // again from 0.
  void clear(int buffer = -1);
  // Frees the rings that are drained and whose owner retired or is gone: folds their hit
  // counters and unreported lost counts into this reader's totals and clears the owner.
  // Returns how many; bumps the area's free_generation if any. `names`, when given, gets
  // the tid and name (owner_comm) of each owner whose ring was freed and had one.
  uint32_t reclaim(std::vector<std::pair<uint32_t, std::string>>* names = nullptr);
  // The ring's owner word as read now (0: free), with kRingOwnerRetired if set.
  uint32_t owner(uint32_t ring) const;
  // The name the ring's owner stored when it claimed the ring (ring_set_comm), when the
  // ring is owned by thread `tid` and the name is that thread's: at most 15 bytes, cut at
  // the first NUL (the process writes it: any other bytes are its own business).
  bool owner_comm(uint32_t ring, uint32_t tid, std::string* out) const;
  // owner_comm of the ring thread `tid` owns, if any.
  bool find_comm(uint32_t tid, std::string* out) const;

  // kprobe_profile: the hits of probe slot `slot` since its last reset (the folded totals,
  // the fallback array and every ring), and its misses. hits_all fills hits for every
  // slot (out.size() >= probe_slots()).
  uint64_t hits(uint32_t slot) const;
  void hits_all(std::span<uint64_t> out) const;
  uint64_t misses(uint32_t slot) const;
  // Counting for `slot` starts again from 0 (a new probe takes the slot).
  void reset_counters(uint32_t slot);

  // Records of threads that had no ring (the area's unowned_lost).
  uint64_t unowned_lost() const;
  // Records of threads without a ring since the last call (or clear): the consumer shows
  // them as lost before the next record it returns of this area.
  uint64_t take_unowned_lost();
  const RingReaderStats& stats() const { return stats_; }
  // Moves whenever a tail does (a record consumed, a skip, a clear). Where nobody writes
  // any more (the process is gone), has_data() keeps its answer while this stays.
  uint64_t progress() const { return progress_; }

 private:
  friend class RingMerger;

  struct State {
    uint32_t tail = 0;
    uint32_t bad_head = 0;       // the last head found out of range (counted once)
    uint64_t consumed = 0;       // bytes consumed ever (advances with tail)
    uint64_t lost_reported = 0;  // cumulative lost count already reported or folded
    uint32_t unpublished = 0;    // bytes consumed since the tail was last stored
    uint32_t writer = 0;         // the last owner record's tid consumed (0: none since a skip)
    uint64_t lost_base = 0;      // the ring's lost count at the last clear
  };
  // A record parsed out of the ring (values copied once from shared memory).
  struct Parsed {
    uint32_t off = 0;        // the record's header
    uint32_t next = 0;       // the offset after it
    uint32_t advance = 0;    // bytes from the cursor to `next`, padding included
    uint32_t len = 0;
    uint32_t cpu = 0;
    uint8_t flags = 0;
    uint64_t stamp = 0;
    uint64_t lost_count = 0; // cumulative, when flags has kRingFlagLostCount
    bool padded = false;     // a padding marker passed on the way
    uint32_t writer = 0;     // the last owner record passed on the way (0: none)
    char writer_comm[kRingCommBytes] = {};
  };
  // kSkip: owner records (and padding) up to the head, or more of them than one call
  // passes: `next`, `advance` and `writer` say how far they went.
  enum class ParseResult { kEmpty, kRecord, kCorrupt, kSkip };

  RingControl* control(uint32_t ring) const;
  const uint8_t* data(uint32_t ring) const;
  const uint64_t* ring_hits(uint32_t ring) const;
  const uint64_t* fallback_hits() const;
  const uint64_t* misses_array() const;
  // The ring's head, checked (in range, 8-aligned); false when it is not.
  bool head(uint32_t ring, uint32_t* out) const;
  ParseResult parse(uint32_t ring, uint32_t off, uint32_t head, Parsed* out) const;
  // The lost count a record reports before itself, given what was reported so far.
  static uint64_t lost_before(const Parsed& p, uint64_t reported);
  // The record's facts into *out, its payload copied into *buf, or (buf nullptr) left
  // where it lies in the ring.
  void fill(uint32_t ring, const Parsed& p, uint64_t lost, uint32_t owner,
            std::vector<uint8_t>* buf, RingRecord* out) const;
  // Consumes `p` (the record at the ring's tail): advances the tail, and stores it for
  // the producer once a sixteenth of the ring is consumed (publish_due), unless
  // keep_bytes: then the caller, which reads the bytes in place, stores it later. Storing
  // it for every record would move the cache line to the reader and back for each one.
  void advance(uint32_t ring, const Parsed& p, bool keep_bytes = false);
  // Stores the tail once a sixteenth of the ring was consumed since it was last stored.
  void publish_due(uint32_t ring);
  // Stores the tail if it moved since it was last stored: whenever the reader has caught
  // up with a head, and before a ring changes hands.
  void publish(uint32_t ring);
  // Consumes, from the ring's tail, the plain data records that follow one another up to
  // `head`, at most `max`, into `out` (bytes left where they lie, the tail not stored, as
  // advance(.., true)): those of CPU `cpu` (-1: any) stamped at most `last_stamp`, with no
  // lost count and no owner record or padding before them. It stops at the first other
  // one, which parse() takes from there (a bad one included). The tight loop of a busy
  // thread's records: one look at each header, the ring's state moved once.
  size_t take_run(uint32_t ring, uint32_t head, int cpu, uint64_t last_stamp,
                  RingRunRecord* out, size_t max);
  // Skips everything up to `head` (or to the current head when it is bad) and counts it.
  void skip_corrupt(uint32_t ring);
  // Moves the tail past what a parse at the tail passed (owner records and padding, and
  // the record, if any), taking the last owner record's writer. advance() counts the
  // record; a kSkip parse's owner records alone come here directly.
  void move_tail(uint32_t ring, const Parsed& p, bool keep_bytes = false);
  uint64_t sum_hits(uint32_t slot) const;
  static uint64_t& slot_value(std::vector<uint64_t>& v, uint32_t slot);
  static uint64_t slot_value(const std::vector<uint64_t>& v, uint32_t slot);

  RingAreaHeader* area_ = nullptr;
  uint8_t* base_ = nullptr;
  uint64_t size_ = 0;
  pid_t pid_ = 0;
  RingGeometry geometry_;
  RingLayout layout_;
  std::vector<State> states_;
  // Per slot, as far as the highest slot that has a value (slot_value).
  std::vector<uint64_t> folded_hits_;  // of rings freed
  std::vector<uint64_t> hits_base_;    // subtracted: the sum at the last reset
  std::vector<uint64_t> misses_base_;
  std::vector<uint8_t> buf_;           // payload copies of front/consume/peek
  uint64_t unowned_base_ = 0;          // unowned_lost at the last clear
  uint64_t unowned_taken_ = 0;         // unowned_lost when take_unowned_lost last looked
  bool front_valid_ = false;
  uint32_t front_ring_ = 0;
  Parsed front_;
  RingReaderStats stats_;
  uint64_t progress_ = 0;
};

// Records of many areas (one per traced process) in timestamp order across all their
// rings. It works in snapshots: when it has nothing left to give it reads every ring's
// head, and then yields the records committed before that in stamp order (the stamp is
// taken at reserve, so a record committed late may follow a later stamp of another ring,
// as in the kernel). A ring's lost count comes with its next record (lost_before).
//
// Consuming mode (trace_pipe) consumes what it returns. Non-consuming mode (trace) walks
// the records without consuming them: rewind() starts over at the first unconsumed one.
// A merger reads the rings of one buffer (RingAreaReader::buffer_of), or of all (-1).
class RingMerger {
 public:
  explicit RingMerger(bool consume = true, int buffer = -1) : consume_(consume), buffer_(buffer) {}

  // `tag` comes back in RingRecord::tag. The reader must outlive its membership.
  void add(RingAreaReader* reader, uint32_t tag);
  void remove(RingAreaReader* reader);
  // Many at once: one pass over the lanes, however many readers leave.
  void remove(std::span<RingAreaReader* const> readers);

  // The next record, or false when none is left in this snapshot and a fresh one finds
  // none either. `cpu` >= 0 takes only records written on that CPU (per_cpu/cpuN): a ring
  // whose next record is of another CPU is passed over with every record behind it
  // (a ring is read in order), until a call with another `cpu` or a fresh snapshot finds
  // it free. Nothing is skipped for good: a record is returned once, whatever the calls.
  bool next(RingRecord* out, int cpu = -1);
  // next() for a caller that reads the payload where it lies in the ring, and takes
  // records in batches: `payload` points into the target's memory, which may change under
  // the caller (copy it once, and check the copy), and stays the caller's (its ring's tail
  // is not stored past it) until release_kept() or publish(). Consuming mode only.
  // With `refresh` false, none is taken from a fresh snapshot: a reader's pass that took
  // what one snapshot held stops there (Tracer::ReadPass).
  bool next_kept(RingRecord* out, int cpu = -1, bool refresh = true);
  // After next_kept() returned a record: the records that follow it in its ring while
  // that ring stays the oldest, at most `max`, into `out`, kept as next_kept()'s are. Only
  // plain ones: of CPU `cpu` (-1: any), with no owner record before them and no lost
  // count, so that their ring, tag and thread are that record's. The rest come from
  // next_kept(). Most records of a busy thread come this way, at a fraction of the cost.
  size_t next_run(RingRunRecord* out, size_t max, int cpu = -1);
  // The kept records are done with: their room goes back to the producers as next() would
  // have given it (a sixteenth of a ring at a time).
  void release_kept();
  // Snapshots taken so far.
  uint64_t snapshots() const { return snapshots_; }
  // Non-consuming mode: start over at the first unconsumed record of every ring.
  void rewind();
  // Consuming mode: gives the producers the room of every record returned so far now
  // (the reader otherwise does so in batches); at the end of a trace_pipe read.
  void publish();

 private:
  struct Lane {
    RingAreaReader* reader;
    uint32_t tag;
    uint32_t ring;
    uint32_t head;   // of the snapshot
    uint32_t owner;  // read with the head (the producer's cache line: not per record)
    RingAreaReader::Cursor cursor;
    RingAreaReader::Parsed rec;  // the record at cursor.off
  };
  struct Item {
    uint64_t stamp;
    uint32_t lane;
  };
  static constexpr uint32_t kNoLane = UINT32_MAX;
  static bool heap_greater(const Item& a, const Item& b);
  static Lane new_lane(RingAreaReader* reader, uint32_t tag, uint32_t ring);
  // Takes a snapshot: lanes for every ring with records, the heap of their first ones.
  void refresh();
  // Parses the lane's record at its cursor; true when there is one before the snapshot.
  bool load(uint32_t lane);
  void push(uint32_t lane);

  bool consume_;
  int buffer_;
  bool hold_ = false;  // in next_kept() and next_run(): the tails are stored by release_kept()
  bool may_refresh_ = true;  // false in a next_kept() that takes no fresh snapshot
  uint64_t snapshots_ = 0;
  uint32_t returned_ = kNoLane;  // the lane of next()'s last record
  // next_kept()'s rings since release_kept() (lanes move when a snapshot adds some).
  std::vector<std::pair<RingAreaReader*, uint32_t>> kept_;
  bool rewound_ = true;
  int cpu_ = -1;                 // the CPU the current snapshot was taken for (-1: any)
  std::vector<std::pair<RingAreaReader*, uint32_t>> sources_;
  std::vector<Lane> lanes_;
  std::vector<Item> heap_;       // lanes with a record in the snapshot, oldest first
  uint32_t current_ = kNoLane;   // the oldest of all, kept out of the heap
  std::vector<uint8_t> buf_;
};

// --- sleeping ---------------------------------------------------------------------------

enum class RingWaitResult {
  kReady,    // a ring had records before the reader slept
  kWoken,    // a producer woke the reader (or a wake word changed under it)
  kTimeout,  // nothing within the timeout (a wake may have been missed: look anyway)
};

// Waits until a producer of any of `readers` commits, at most timeout_ms. One daemon
// thread waits for any of up to FUTEX_WAITV_MAX (128) areas at once with futex_waitv;
// with more, it waits on 128 of them (a different 128 each call) and at most 10 ms, so
// the others are polled. It spins briefly before it sleeps, so that a busy consumer does
// not pay for the barrier.
// With `buffer` >= 0, kReady only for records of that buffer (a commit into another still
// wakes the waiter, which then finds nothing of its own and may wait again).
RingWaitResult ring_wait(std::span<RingAreaReader* const> readers, int timeout_ms,
                         int buffer = -1);

}  // namespace probefs::events
