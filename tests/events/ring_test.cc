// The ring buffer (events/ring.h, events/ring_consumer.h) and trace_clock
// (events/trace_clock.h): producers in threads and in fork children, the consumer over
// hostile memory, the merger, the wake, the counters and the clocks.
//
// Every wait is bounded: children are reaped through a pidfd with a timeout and killed by
// a guard on failure; consumers give up at a deadline. No test depends on timing.
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/sysinfo.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <x86intrin.h>

#include <atomic>
#include <cstring>
#include <map>
#include <set>
#include <random>
#include <thread>
#include <vector>

#include "events/ring.h"
#include "events/ring_consumer.h"
#include "events/trace_clock.h"

using namespace probefs::events;

namespace {

uint32_t self_tid() { return static_cast<uint32_t>(syscall(SYS_gettid)); }

uint64_t now_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

// A deadline for loops that wait on another thread or process: a bound, not a measure.
struct Deadline {
  explicit Deadline(uint64_t seconds) : end(now_ns() + seconds * 1000000000ull) {}
  bool passed() const { return now_ns() > end; }
  uint64_t end;
};

RingGeometry geometry(uint32_t rings, uint32_t bytes, uint32_t slots = 64) {
  RingGeometry g;
  g.ring_count = rings;
  g.ring_bytes = bytes;
  g.probe_slots = slots;
  return g;
}

struct TestArea {
  explicit TestArea(const RingGeometry& g, uint32_t mode = ring_detect_stamp_mode(kRingStampTsc)) {
    EXPECT_EQ(RingArea::create(g, mode, &area), 0);
    EXPECT_EQ(reader.attach(area.mem(), area.size(), getpid()), 0);
  }
  RingAreaHeader* header() const { return area.header(); }
  RingArea area;
  RingAreaReader reader;
};

// The payload the tests write: who and which.
struct Payload {
  uint64_t producer;
  uint64_t seq;
};

bool produce(RingProducer* p, uint64_t producer, uint64_t seq, uint32_t extra_len = 0) {
  auto* rec = static_cast<uint8_t*>(ring_reserve(p, sizeof(Payload) + extra_len));
  if (!rec) return false;
  Payload pl{producer, seq};
  memcpy(rec, &pl, sizeof pl);
  for (uint32_t i = 0; i < extra_len; ++i) rec[sizeof pl + i] = static_cast<uint8_t>(seq + i);
  ring_commit(p, sizeof(Payload) + extra_len);
  return true;
}

Payload payload_of(const RingRecord& r) {
  Payload pl{};
  EXPECT_GE(r.payload.size(), sizeof pl);
  if (r.payload.size() >= sizeof pl) memcpy(&pl, r.payload.data(), sizeof pl);
  return pl;
}

// A child process that is killed and reaped whatever happens to the test.
class Child {
 public:
  template <class F>
  explicit Child(F&& body) {
    pid_ = fork();
    if (pid_ == 0) {
      alarm(120);  // never outlive a broken parent
      _exit(body());
    }
    if (pid_ > 0) pidfd_ = static_cast<int>(syscall(SYS_pidfd_open, pid_, 0));
  }
  ~Child() {
    if (pid_ > 0 && !reaped_) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    if (pidfd_ >= 0) close(pidfd_);
  }
  pid_t pid() const { return pid_; }
  bool started() const { return pid_ > 0 && pidfd_ >= 0; }
  // The wait status, or -1 if the child did not end within timeout_ms.
  int wait(int timeout_ms) {
    pollfd pfd{pidfd_, POLLIN, 0};
    if (poll(&pfd, 1, timeout_ms) != 1) return -1;
    int status = 0;
    if (waitpid(pid_, &status, 0) != pid_) return -1;
    reaped_ = true;
    return status;
  }

 private:
  pid_t pid_ = -1;
  int pidfd_ = -1;
  bool reaped_ = false;
};

// What a consumer saw of one producer: the sequence numbers in order, the lost counts.
struct Tally {
  uint64_t received = 0;
  uint64_t lost = 0;
  int64_t last = -1;
  bool in_order = true;
  bool lost_exact = true;
  bool ended = false;
  uint64_t end_seq = 0;
};

constexpr uint64_t kEndMarker = 1ull << 63;

// Accounts one record; producers end with a record whose seq has kEndMarker set and
// counts every attempt before it.
void tally(std::map<uint64_t, Tally>& t, const RingRecord& r) {
  const Payload pl = payload_of(r);
  Tally& x = t[pl.producer];
  const uint64_t seq = pl.seq & ~kEndMarker;
  if (static_cast<int64_t>(seq) <= x.last) x.in_order = false;
  // Every record dropped between two returned ones is reported before the second.
  if (r.lost_before != seq - static_cast<uint64_t>(x.last) - 1) x.lost_exact = false;
  x.lost += r.lost_before;
  x.last = static_cast<int64_t>(seq);
  ++x.received;
  if (pl.seq & kEndMarker) {
    x.ended = true;
    x.end_seq = seq;
  }
}

// Writes n records, then an end marker, retrying until it fits: every attempt has a seq.
void produce_run(RingProducer* p, uint64_t producer, uint64_t n) {
  uint64_t seq = 0;
  for (; seq < n; ++seq) produce(p, producer, seq);
  while (!produce(p, producer, seq | kEndMarker)) {
    ++seq;
    for (int i = 0; i < 64; ++i) _mm_pause();
  }
}

// Frees rings until `expected` were freed in all. A thread that pthread_join returned for
// may still be in the kernel's tables for a moment (the join wakes on the tid clear,
// before the task is released), so a ring can take a few calls to come free.
uint32_t reclaim_until(RingAreaReader& reader, uint32_t expected) {
  Deadline dl(30);
  uint32_t freed = reader.reclaim();
  while (freed < expected && !dl.passed()) {
    std::this_thread::yield();
    freed += reader.reclaim();
  }
  return freed;
}

// Drains `readers` through a consuming merger until every one of `producers` ended.
::testing::AssertionResult drain_until_ended(std::vector<RingAreaReader*> readers,
                                             size_t producers,
                                             std::map<uint64_t, Tally>* t,
                                             uint64_t seconds = 120) {
  RingMerger m(true);
  for (size_t i = 0; i < readers.size(); ++i) m.add(readers[i], static_cast<uint32_t>(i));
  Deadline dl(seconds);
  size_t ended = 0;
  RingRecord r;
  while (ended < producers) {
    if (dl.passed()) return ::testing::AssertionFailure() << ended << " producers ended";
    if (!m.next(&r)) {
      ring_wait(readers, 100);
      continue;
    }
    tally(*t, r);
    if (payload_of(r).seq & kEndMarker) ++ended;
  }
  return ::testing::AssertionSuccess();
}

}  // namespace

// --- layout -------------------------------------------------------------------------------

TEST(RingLayout, GeometryIsCheckedAndRingsArePages) {
  RingLayout l;
  ASSERT_TRUE(ring_layout(RingGeometry{}, &l));
  EXPECT_EQ(l.rings_offset % kRingPageBytes, 0u);
  EXPECT_EQ(l.data_offset % 64, 0u);
  EXPECT_EQ(l.ring_stride % 64, 0u);
  EXPECT_FALSE(ring_layout(geometry(0, 4096), &l));
  EXPECT_FALSE(ring_layout(geometry(kRingMaxCount + 1, 4096), &l));
  EXPECT_FALSE(ring_layout(geometry(1, 0), &l));
  EXPECT_FALSE(ring_layout(geometry(1, kRingMaxBytes + 1), &l));
  EXPECT_FALSE(ring_layout(geometry(1, 4096, 7), &l));
  EXPECT_FALSE(ring_layout(geometry(4096, kRingMaxBytes), &l));  // area too large

  // buffer_size_kb 1410 (the kernel's default) and 4 become whole pages per ring.
  TestArea a(geometry(2, 1410 * 1024));
  EXPECT_EQ(a.header()->ring_bytes, 1412u * 1024);
  TestArea b(geometry(2, 4 * 1024 + 1));
  EXPECT_EQ(b.header()->ring_bytes, 8192u);
  EXPECT_TRUE(ring_area_header_valid(b.header(), b.area.size()));
  EXPECT_FALSE(ring_area_header_valid(b.header(), b.area.size() - 1));
}

TEST(RingLayout, AreaIsSealedAgainstTruncation) {
  TestArea a(geometry(1, 4096));
  EXPECT_NE(ftruncate(a.area.fd(), 0), 0);
  EXPECT_NE(ftruncate(a.area.fd(), static_cast<off_t>(a.area.size()) + 4096), 0);
}

// --- one producer ---------------------------------------------------------------------------

TEST(Ring, SingleThreadRoundTrip) {
  TestArea a(geometry(4, 64 * 1024));
  RingProducer p;
  ASSERT_TRUE(ring_claim(a.header(), self_tid(), &p));
  const int cpus = get_nprocs_conf();
  for (uint64_t seq = 0; seq < 500; ++seq) ASSERT_TRUE(produce(&p, 7, seq, seq % 41));
  RingRecord r;
  uint64_t last_stamp = 0;
  for (uint64_t seq = 0; seq < 500; ++seq) {
    ASSERT_TRUE(a.reader.consume(p.ring, &r)) << seq;
    ASSERT_EQ(r.payload.size(), sizeof(Payload) + seq % 41);
    const Payload pl = payload_of(r);
    EXPECT_EQ(pl.producer, 7u);
    EXPECT_EQ(pl.seq, seq);
    for (uint32_t i = 0; i < seq % 41; ++i)
      ASSERT_EQ(r.payload[sizeof(Payload) + i], static_cast<uint8_t>(seq + i));
    EXPECT_LT(r.cpu, static_cast<uint32_t>(cpus));
    EXPECT_EQ(r.tid, self_tid());
    EXPECT_EQ(r.lost_before, 0u);
    EXPECT_FALSE(r.counter_stamp);
    EXPECT_GE(r.stamp, last_stamp);
    last_stamp = r.stamp;
  }
  EXPECT_FALSE(a.reader.consume(p.ring, &r));
  EXPECT_FALSE(a.reader.has_data());
  EXPECT_EQ(a.reader.stats().records, 500u);
  EXPECT_EQ(a.reader.stats().corrupt, 0u);
}

TEST(Ring, DiscardedReservationPublishesNothing) {
  TestArea a(geometry(1, 4096));
  RingProducer p;
  ASSERT_TRUE(ring_claim(a.header(), self_tid(), &p));
  ASSERT_NE(ring_reserve(&p, 100), nullptr);
  ring_discard(&p);
  EXPECT_FALSE(a.reader.has_data());
  ASSERT_TRUE(produce(&p, 1, 42));
  RingRecord r;
  ASSERT_TRUE(a.reader.consume(0, &r));
  EXPECT_EQ(payload_of(r).seq, 42u);
}

TEST(Ring, WrapAroundLeavesPadding) {
  TestArea a(geometry(1, 4096));
  RingProducer p;
  ASSERT_TRUE(ring_claim(a.header(), self_tid(), &p));
  RingRecord r;
  // The smallest padding: a record that ends 8 bytes before the end of the ring.
  auto* rec = static_cast<uint8_t*>(ring_reserve(&p, 4072));
  ASSERT_NE(rec, nullptr);
  memset(rec, 0xab, 4072);
  ring_commit(&p, 4072);
  ASSERT_TRUE(a.reader.consume(0, &r));
  EXPECT_EQ(r.payload.size(), 4072u);
  ASSERT_TRUE(produce(&p, 1, 1));
  ASSERT_TRUE(a.reader.consume(0, &r));
  EXPECT_EQ(payload_of(r).seq, 1u);
  EXPECT_EQ(a.reader.stats().padding, 1u);

  // Many laps with records of every size, the consumer a few records behind; the
  // attempts that find the ring full are reported before the next record.
  std::mt19937 rng(1);
  uint64_t attempts = 0, consumed = 0, dropped = 0;
  int64_t last = -1;
  while (consumed < 20000) {
    const int burst = static_cast<int>(rng() % 8);
    for (int i = 0; i < burst; ++i) dropped += !produce(&p, 2, attempts++, rng() % 300);
    const int take = static_cast<int>(rng() % 8);
    for (int i = 0; i < take && a.reader.consume(0, &r); ++i) {
      const uint64_t seq = payload_of(r).seq;
      ASSERT_GT(static_cast<int64_t>(seq), last);
      ASSERT_EQ(r.lost_before, seq - static_cast<uint64_t>(last) - 1);
      last = static_cast<int64_t>(seq);
      ++consumed;
    }
  }
  EXPECT_GT(dropped, 0u);
  EXPECT_GT(a.reader.stats().padding, 100u);
  EXPECT_EQ(a.reader.stats().corrupt, 0u);
}

TEST(Ring, FullRingDropsAndReportsExactLostBeforeNextRecord) {
  TestArea a(geometry(2, 4096));
  RingProducer p, q;
  ASSERT_TRUE(ring_claim(a.header(), self_tid(), &p));
  ASSERT_TRUE(ring_claim(a.header(), self_tid(), &q));
  uint64_t stored = 0;
  while (produce(&p, 1, stored)) ++stored;
  EXPECT_EQ(stored, 4088u / 32);  // 16-byte header + 16-byte payload, 8 bytes kept free
  uint64_t dropped = 1;           // the attempt that ended the loop
  for (int i = 0; i < 6; ++i, ++dropped) EXPECT_FALSE(produce(&p, 1, 999));

  // The other ring, before and after: its records carry no loss.
  ASSERT_TRUE(produce(&q, 2, 0));
  RingMerger m(true);
  m.add(&a.reader, 0);
  RingRecord r;
  // Only room after the consumer moved: read half, then the record after the drops.
  for (uint64_t i = 0; i < stored / 2; ++i) {
    ASSERT_TRUE(m.next(&r));
    if (payload_of(r).producer == 2) {
      ASSERT_TRUE(m.next(&r));
    }
    ASSERT_EQ(payload_of(r).seq, i);
    EXPECT_EQ(r.lost_before, 0u);
  }
  ASSERT_TRUE(produce(&p, 1, stored + dropped));
  ASSERT_TRUE(produce(&p, 1, stored + dropped + 1));
  ASSERT_TRUE(produce(&q, 2, 1));
  std::vector<RingRecord> rest;
  std::vector<Payload> rest_pl;
  while (m.next(&r)) {
    rest.push_back(r);
    rest_pl.push_back(payload_of(r));
  }
  uint64_t expect = stored / 2;
  int seen_after = 0;
  for (size_t i = 0; i < rest.size(); ++i) {
    if (rest_pl[i].producer == 2) {
      EXPECT_EQ(rest[i].lost_before, 0u);
      continue;
    }
    if (expect == stored) expect = stored + dropped;  // the first after the drops
    ASSERT_EQ(rest_pl[i].seq, expect);
    EXPECT_EQ(rest[i].lost_before, expect == stored + dropped ? dropped : 0u) << expect;
    if (expect >= stored + dropped) ++seen_after;
    ++expect;
  }
  EXPECT_EQ(seen_after, 2);
  EXPECT_EQ(a.reader.stats().lost_reported, dropped);
}

// --- many producers -----------------------------------------------------------------------

TEST(Ring, ManyThreadsEachIntoItsOwnRingExactTotals) {
  constexpr int kThreads = 8;
  constexpr uint64_t kRecords = 40000;
  TestArea a(geometry(kThreads, 16 * 1024));
  std::atomic<int> claimed{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      RingProducer p;
      if (!ring_claim(a.header(), self_tid(), &p)) return;
      claimed.fetch_add(1);
      for (uint64_t i = 0; i < kRecords; ++i) ring_count_hit(&p, static_cast<uint32_t>(t));
      produce_run(&p, static_cast<uint64_t>(t), kRecords);
    });
  }
  std::map<uint64_t, Tally> t;
  const auto drained = drain_until_ended({&a.reader}, kThreads, &t);
  for (auto& th : threads) th.join();
  ASSERT_EQ(claimed.load(), kThreads);
  ASSERT_TRUE(drained);
  uint64_t total_lost = 0;
  for (int i = 0; i < kThreads; ++i) {
    const Tally& x = t[static_cast<uint64_t>(i)];
    EXPECT_TRUE(x.in_order) << i;
    EXPECT_TRUE(x.lost_exact) << i;
    ASSERT_TRUE(x.ended) << i;
    // Every attempt is either received or reported lost.
    EXPECT_EQ(x.received + x.lost, x.end_seq + 1) << i;
    EXPECT_GE(x.end_seq, kRecords);
    total_lost += x.lost;
    EXPECT_EQ(a.reader.hits(static_cast<uint32_t>(i)), kRecords);
  }
  EXPECT_EQ(a.reader.stats().lost_reported, total_lost);
  if (getenv("RING_TEST_VERBOSE"))
    fprintf(stderr, "records %lu lost %lu\n", (unsigned long)a.reader.stats().records,
            (unsigned long)total_lost);
  EXPECT_EQ(a.reader.stats().corrupt, 0u);

  // The threads are gone and their rings drained: all freed, counters folded.
  EXPECT_EQ(reclaim_until(a.reader, kThreads), static_cast<uint32_t>(kThreads));
  for (int i = 0; i < kThreads; ++i) {
    EXPECT_EQ(a.reader.hits(static_cast<uint32_t>(i)), kRecords);
    EXPECT_EQ(a.reader.owner(static_cast<uint32_t>(i)), 0u);
  }
  EXPECT_EQ(a.reader.stats().lost_unattributed, 0u);
}

TEST(Ring, ForkChildProducesIntoAreaTheParentConsumes) {
  constexpr uint64_t kRecords = 200000;
  TestArea a(geometry(2, 64 * 1024));
  const int fd = a.area.fd();
  const uint64_t size = a.area.size();
  Child child([&] {
    // As the agent does: map the memfd afresh, register for the reader's barrier.
    void* mem = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (mem == MAP_FAILED) return 2;
    auto* area = static_cast<RingAreaHeader*>(mem);
    if (!ring_area_header_valid(area, size)) return 3;
    ring_register_producer_process();
    RingProducer p;
    if (!ring_claim(area, self_tid(), &p)) return 4;
    produce_run(&p, 1, kRecords);
    return 0;
  });
  ASSERT_TRUE(child.started());
  RingAreaReader reader;
  ASSERT_EQ(reader.attach(a.area.mem(), a.area.size(), child.pid()), 0);
  std::map<uint64_t, Tally> t;
  ASSERT_TRUE(drain_until_ended({&reader}, 1, &t));
  const int status = child.wait(60000);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  const Tally& x = t[1];
  EXPECT_TRUE(x.in_order);
  EXPECT_TRUE(x.lost_exact);
  EXPECT_EQ(x.received + x.lost, x.end_seq + 1);
  EXPECT_EQ(reader.reclaim(), 1u);
}

TEST(Ring, ChildKilledBetweenReserveAndCommitLeavesRingUsable) {
  for (const bool wrap : {false, true}) {
    SCOPED_TRACE(wrap ? "reservation wraps" : "plain reservation");
    TestArea a(geometry(1, 4096));
    Child child([&] {
      RingProducer p;
      if (!ring_claim(a.header(), self_tid(), &p)) return 4;
      for (uint64_t s = 0; s < 10; ++s) produce(&p, 1, s, 300);
      // Wait for the reader to take them, so that a large reservation goes back to 0.
      Deadline dl(60);
      while (__atomic_load_n(&p.ctl->tail, __ATOMIC_ACQUIRE) != p.head) {
        if (dl.passed()) return 3;
      }
      // A reservation half written, then death; with `wrap`, one that pads the end.
      auto* rec = static_cast<uint8_t*>(ring_reserve(&p, wrap ? 1000 : 64));
      if (!rec || (p.pending_off == 0) != wrap) return 5;
      memset(rec, 0xee, 20);
      raise(SIGKILL);
      return 6;
    });
    ASSERT_TRUE(child.started());
    RingAreaReader reader;
    ASSERT_EQ(reader.attach(a.area.mem(), a.area.size(), child.pid()), 0);
    RingMerger m(true);
    m.add(&reader, 0);
    RingRecord r;
    Deadline dl(60);
    for (uint64_t s = 0; s < 10;) {
      ASSERT_FALSE(dl.passed());
      if (!m.next(&r)) continue;
      EXPECT_EQ(payload_of(r).seq, s);
      ++s;
    }
    const int status = child.wait(60000);
    ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << status;
    EXPECT_FALSE(m.next(&r));
    EXPECT_FALSE(reader.has_data());
    EXPECT_EQ(reader.stats().corrupt, 0u);
    // The owner is dead and the ring drained: it is free again and works.
    EXPECT_EQ(reader.reclaim(), 1u);
    RingProducer p;
    ASSERT_TRUE(ring_claim(a.header(), self_tid(), &p));
    for (uint64_t s = 0; s < 2000; ++s) {
      ASSERT_TRUE(produce(&p, 2, s, s % 100));
      ASSERT_TRUE(m.next(&r));
      ASSERT_EQ(payload_of(r).seq, s);
      ASSERT_EQ(payload_of(r).producer, 2u);
    }
    EXPECT_EQ(reader.stats().corrupt, 0u);
    EXPECT_GT(reader.stats().padding, 0u);
  }
}

// --- hostile areas --------------------------------------------------------------------------

namespace {

// The area's memfd mapped again with an inaccessible page on each side, so that a read
// outside it faults instead of passing unnoticed.
struct GuardedMapping {
  GuardedMapping(int fd, uint64_t size) : size_(size) {
    const uint64_t span = size + 2 * kRingPageBytes + kRingPageBytes;
    void* r = mmap(nullptr, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (r == MAP_FAILED) return;
    reserve_ = static_cast<uint8_t*>(r);
    span_ = span;
    void* m = mmap(reserve_ + kRingPageBytes, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED,
                   fd, 0);
    if (m != MAP_FAILED) mem_ = static_cast<uint8_t*>(m);
  }
  ~GuardedMapping() {
    if (reserve_) munmap(reserve_, span_);
  }
  uint8_t* mem() const { return mem_; }
  uint8_t* reserve_ = nullptr;
  uint8_t* mem_ = nullptr;
  uint64_t span_ = 0;
  uint64_t size_;
};

// Exercises every reader entry point; each must return, whatever the area holds.
void read_everything(RingAreaReader& reader) {
  RingMerger consume(true), look(false);
  consume.add(&reader, 0);
  look.add(&reader, 0);
  RingRecord r;
  const uint64_t bound = uint64_t{reader.ring_count()} * reader.ring_bytes() / 8 + 8;
  uint64_t n = 0;
  while (look.next(&r)) ASSERT_LT(++n, bound);
  for (uint32_t i = 0; i < reader.ring_count(); ++i) {
    auto c = reader.cursor(i);
    n = 0;
    while (reader.peek(&c, &r)) ASSERT_LT(++n, bound);
  }
  n = 0;
  while (consume.next(&r)) {
    ASSERT_LT(++n, bound);
    ASSERT_LE(r.payload.size(), reader.ring_bytes());
  }
  for (uint32_t i = 0; i < reader.ring_count(); ++i) {
    n = 0;
    while (reader.consume(i, &r)) ASSERT_LT(++n, bound);
  }
  (void)reader.has_data();
  std::vector<uint64_t> hits(reader.probe_slots());
  reader.hits_all(hits);
  (void)reader.hits(0);
  (void)reader.misses(reader.probe_slots() - 1);
  reader.reclaim();
  reader.clear();
}

}  // namespace

TEST(RingHostile, RandomBytesAreNoArea) {
  TestArea a(geometry(2, 4096));
  std::mt19937_64 rng(3);
  auto* w = static_cast<uint64_t*>(a.area.mem());
  for (int trial = 0; trial < 200; ++trial) {
    for (uint64_t i = 0; i < a.area.size() / 8; ++i) w[i] = rng();
    RingAreaReader reader;
    EXPECT_EQ(reader.attach(a.area.mem(), a.area.size(), getpid()), -EINVAL);
  }
  RingAreaReader reader;
  EXPECT_EQ(reader.attach(nullptr, 0, getpid()), -EINVAL);
}

TEST(RingHostile, GarbageRingsNeverCrashOrHang) {
  const RingGeometry g = geometry(4, 4096, 16);
  for (int trial = 0; trial < 300; ++trial) {
    SCOPED_TRACE(trial);
    TestArea a(g);
    GuardedMapping map(a.area.fd(), a.area.size());
    ASSERT_NE(map.mem(), nullptr);
    std::mt19937_64 rng(static_cast<uint64_t>(trial));
    RingLayout l;
    ASSERT_TRUE(ring_layout(g, &l));
    // Random bytes after the header: controls, counters and data. Some trials write
    // plausible values instead, so that parsing gets past the first checks.
    uint8_t* rings = map.mem() + l.rings_offset;
    for (uint64_t i = 0; i < a.area.size() - l.rings_offset; ++i)
      rings[i] = static_cast<uint8_t>(rng());
    for (uint32_t k = 0; k < g.ring_count; ++k) {
      auto* ctl = reinterpret_cast<RingControl*>(rings + uint64_t{k} * l.ring_stride);
      uint8_t* data = reinterpret_cast<uint8_t*>(ctl) + l.data_offset;
      if (trial % 3 == 0) continue;  // all random
      ctl->head = static_cast<uint32_t>(rng() % 4096) & ~7u;
      ctl->tail = static_cast<uint32_t>(rng() % 4096) & ~7u;
      for (uint32_t off = 0; off < 4096; off += 8 * (1 + rng() % 16)) {
        auto* h = reinterpret_cast<RingRecordHeader*>(data + off);
        if (off + 8 > 4096) break;
        h->kind = static_cast<uint8_t>(1 + rng() % 2);
        h->flags = static_cast<uint8_t>(rng() % 4);
        const uint32_t choice = static_cast<uint32_t>(rng() % 5);
        h->len = choice == 0 ? 0xffffffffu
                 : choice == 1 ? 4096 - off
                 : choice == 2 ? static_cast<uint32_t>(rng() % 64)
                 : choice == 3 ? 4096 - off - 16
                               : static_cast<uint32_t>(rng());
      }
    }
    RingAreaReader reader;
    ASSERT_EQ(reader.attach(map.mem(), a.area.size(), getpid()), 0);
    read_everything(reader);
    // Afterwards each ring can be claimed (owners were random tids) and works.
  }
}

TEST(RingHostile, CraftedRecordsAreSkippedAndCounted) {
  struct Case {
    const char* what;
    uint32_t head;
    uint32_t len;
    uint8_t kind;
    uint8_t flags;
  };
  const Case cases[] = {
      {"length past the head", 48, 33, kRingKindData, 0},
      {"length 2^32-1", 48, 0xffffffffu, kRingKindData, 0},
      {"length past the end", 4088, 5000, kRingKindData, 0},
      {"no room for the lost count", 16, 0, kRingKindData, kRingFlagLostCount},
      {"padding with the head ahead", 48, 4096, kRingKindPadding, 0},
      {"padding of the wrong length", 48, 100, kRingKindPadding, 0},
      {"unknown kind", 48, 8, 7, 0},
      {"zeroed memory", 48, 0, 0, 0},
      {"unknown flag", 48, 8, kRingKindData, 0x80},
      {"head not aligned", 44, 8, kRingKindData, 0},
      {"head past the end", 8192, 8, kRingKindData, 0},
      {"owner record of the wrong length", 48, 8, kRingKindOwner, 0},
      {"owner record with a flag", 48, 24, kRingKindOwner, 1},
      {"owner record of tid 0", 48, 24, kRingKindOwner, 0},
      {"owner record past the head", 32, 24, kRingKindOwner, 0},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    TestArea a(geometry(1, 4096));
    RingLayout l;
    ASSERT_TRUE(ring_layout(geometry(1, 4096), &l));
    auto* ctl = reinterpret_cast<RingControl*>(static_cast<uint8_t*>(a.area.mem()) +
                                               l.rings_offset);
    auto* h = reinterpret_cast<RingRecordHeader*>(reinterpret_cast<uint8_t*>(ctl) +
                                                  l.data_offset);
    h->len = c.len;
    h->kind = c.kind;
    h->flags = c.flags;
    ctl->head = c.head;
    RingRecord r;
    EXPECT_FALSE(a.reader.consume(0, &r));
    EXPECT_GE(a.reader.stats().corrupt, 1u);
    read_everything(a.reader);
    // The process can start over: a sane head, then records again.
    ctl->head = 0;
    ctl->tail = 0;
    RingAreaReader fresh;
    ASSERT_EQ(fresh.attach(a.area.mem(), a.area.size(), getpid()), 0);
    ctl->owner = 0;
    RingProducer p;
    ASSERT_TRUE(ring_claim(a.header(), self_tid(), &p));
    ASSERT_TRUE(produce(&p, 3, 1));
    ASSERT_TRUE(fresh.consume(0, &r));
    EXPECT_EQ(payload_of(r).seq, 1u);
  }
}

TEST(RingHostile, LostCountGoingBackwardsIsIgnored) {
  TestArea a(geometry(1, 4096));
  RingProducer p;
  ASSERT_TRUE(ring_claim(a.header(), self_tid(), &p));
  p.lost = 100;  // as if 100 were dropped
  ASSERT_TRUE(produce(&p, 1, 0));
  p.lost = 40;   // a process rewriting its own counts
  p.lost_marked = 0;
  ASSERT_TRUE(produce(&p, 1, 1));
  RingRecord r;
  ASSERT_TRUE(a.reader.consume(0, &r));
  EXPECT_EQ(r.lost_before, 100u);
  ASSERT_TRUE(a.reader.consume(0, &r));
  EXPECT_EQ(r.lost_before, 0u);
}

TEST(RingHostile, ScribblingProcessNeverCrashesOrStallsTheReader) {
  const RingGeometry g = geometry(4, 8192, 16);
  TestArea a(g);
  GuardedMapping map(a.area.fd(), a.area.size());
  ASSERT_NE(map.mem(), nullptr);
  RingLayout l;
  ASSERT_TRUE(ring_layout(g, &l));
  const uint64_t size = a.area.size();
  const int fd = a.area.fd();
  std::atomic<uint32_t>* go = static_cast<std::atomic<uint32_t>*>(
      mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  ASSERT_NE(static_cast<void*>(go), MAP_FAILED);
  go->store(0);
  // Half the time a real producer, half the time random writes everywhere, header too.
  Child child([&] {
    auto* mem = static_cast<uint8_t*>(
        mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
    if (mem == MAP_FAILED) return 2;
    std::mt19937_64 rng(9);
    RingProducer p;
    auto* area = reinterpret_cast<RingAreaHeader*>(mem);
    const bool claimed = ring_claim(area, self_tid(), &p);
    Deadline dl(30);
    while (go->load() == 0) {
      if (dl.passed()) return 3;
    }
    for (uint64_t round = 0; go->load() == 1; ++round) {
      if (claimed && round % 2 == 0) {
        for (int i = 0; i < 100; ++i) produce(&p, 1, round * 100 + i, rng() % 200);
      } else {
        for (int i = 0; i < 200; ++i) {
          const uint64_t off = rng() % (size / 4) * 4;
          *reinterpret_cast<uint32_t*>(mem + off) = static_cast<uint32_t>(rng());
        }
        p.head = static_cast<uint32_t>(rng() % l.ring_stride) & ~7u;  // its own mess
        if (p.head >= p.size) p.head = 0;
        p.tail_cache = p.head;
      }
    }
    return 0;
  });
  ASSERT_TRUE(child.started());
  RingAreaReader reader;
  ASSERT_EQ(reader.attach(map.mem(), size, child.pid()), 0);
  go->store(1);
  RingAreaReader* readers[] = {&reader};
  RingMerger consume(true), look(false);
  consume.add(&reader, 0);
  look.add(&reader, 0);
  RingRecord r;
  uint64_t records = 0;
  for (int round = 0; round < 3000; ++round) {
    for (int i = 0; i < 64 && consume.next(&r); ++i) {
      ++records;
      ASSERT_LE(r.payload.size(), reader.ring_bytes());
    }
    look.rewind();
    for (int i = 0; i < 64 && look.next(&r); ++i) {
    }
    if (round % 100 == 0) {
      reader.reclaim();
      ring_wait(readers, 1);
    }
  }
  go->store(2);
  const int status = child.wait(30000);
  EXPECT_TRUE(WIFEXITED(status)) << status;
  EXPECT_GT(records + reader.stats().corrupt, 0u);
  if (getenv("RING_TEST_VERBOSE"))
    fprintf(stderr, "records %lu corrupt %lu padding %lu\n", (unsigned long)records,
            (unsigned long)reader.stats().corrupt, (unsigned long)reader.stats().padding);
  munmap(go, 4096);
}

// --- merging, peeking -----------------------------------------------------------------------

TEST(RingMerger, OrdersRecordsOfThreeAreasByStamp) {
  std::vector<std::unique_ptr<TestArea>> areas;
  std::vector<RingProducer> producers(6);
  for (int i = 0; i < 3; ++i) {
    areas.push_back(std::make_unique<TestArea>(geometry(2, 64 * 1024)));
    ASSERT_TRUE(ring_claim(areas[i]->header(), self_tid(), &producers[2 * i]));
    ASSERT_TRUE(ring_claim(areas[i]->header(), self_tid(), &producers[2 * i + 1]));
  }
  std::mt19937 rng(5);
  constexpr uint64_t kRecords = 3000;
  for (uint64_t seq = 0; seq < kRecords; ++seq) {
    const uint32_t k = rng() % 6;
    ASSERT_TRUE(produce(&producers[k], k, seq));
  }
  RingMerger m(true);
  for (int i = 0; i < 3; ++i) m.add(&areas[i]->reader, static_cast<uint32_t>(10 + i));
  RingRecord r;
  std::vector<uint64_t> seqs, stamps;
  std::map<uint64_t, int64_t> last_of;
  while (m.next(&r)) {
    const Payload pl = payload_of(r);
    EXPECT_EQ(r.tag, 10 + pl.producer / 2);
    EXPECT_GT(static_cast<int64_t>(pl.seq), last_of.count(pl.producer) ? last_of[pl.producer] : -1);
    last_of[pl.producer] = static_cast<int64_t>(pl.seq);
    seqs.push_back(pl.seq);
    stamps.push_back(r.stamp);
  }
  ASSERT_EQ(seqs.size(), kRecords);
  for (size_t i = 1; i < stamps.size(); ++i) ASSERT_LE(stamps[i - 1], stamps[i]) << i;
  // Where the stamps differ, they put the records in the order they were written.
  size_t distinct = 0;
  for (size_t i = 1; i < seqs.size(); ++i) {
    if (stamps[i - 1] < stamps[i]) {
      ++distinct;
      EXPECT_LT(seqs[i - 1], seqs[i]) << i;
    }
  }
  EXPECT_GT(distinct, kRecords / 2);
}

TEST(RingMerger, CounterClockGivesTheExactOrderInOneArea) {
  TestArea a(geometry(3, 64 * 1024), ring_detect_stamp_mode(kRingStampCounter));
  RingProducer p[3];
  for (auto& x : p) ASSERT_TRUE(ring_claim(a.header(), self_tid(), &x));
  std::mt19937 rng(6);
  for (uint64_t seq = 0; seq < 3000; ++seq) {
    const uint32_t k = rng() % 3;
    ASSERT_TRUE(produce(&p[k], k, seq));
  }
  RingMerger m(true);
  m.add(&a.reader, 0);
  RingRecord r;
  uint64_t expect = 0, last_stamp = 0;
  while (m.next(&r)) {
    EXPECT_TRUE(r.counter_stamp);
    EXPECT_GT(r.stamp, last_stamp);
    last_stamp = r.stamp;
    ASSERT_EQ(payload_of(r).seq, expect++);
  }
  EXPECT_EQ(expect, 3000u);
}

TEST(RingMerger, PeekingDoesNotConsume) {
  TestArea a(geometry(2, 64 * 1024));
  RingProducer p[2];
  for (auto& x : p) ASSERT_TRUE(ring_claim(a.header(), self_tid(), &x));
  for (uint64_t seq = 0; seq < 100; ++seq) ASSERT_TRUE(produce(&p[seq % 2], seq % 2, seq));
  RingMerger look(false), consume(true);
  look.add(&a.reader, 0);
  consume.add(&a.reader, 0);
  RingRecord r;
  for (int pass = 0; pass < 2; ++pass) {
    look.rewind();
    for (uint64_t seq = 0; seq < 100; ++seq) {
      ASSERT_TRUE(look.next(&r));
      ASSERT_EQ(payload_of(r).seq, seq);
    }
    EXPECT_FALSE(look.next(&r));
  }
  EXPECT_EQ(a.reader.stats().records, 0u);
  EXPECT_TRUE(a.reader.has_data());
  // Per ring, too.
  auto c = a.reader.cursor(p[1].ring);
  for (uint64_t seq = 1; seq < 100; seq += 2) {
    ASSERT_TRUE(a.reader.peek(&c, &r));
    ASSERT_EQ(payload_of(r).seq, seq);
  }
  EXPECT_FALSE(a.reader.peek(&c, &r));
  for (uint64_t seq = 0; seq < 40; ++seq) {
    ASSERT_TRUE(consume.next(&r));
    ASSERT_EQ(payload_of(r).seq, seq);
  }
  // A walk started before the consumer moved goes on from where the consumer is.
  look.rewind();
  ASSERT_TRUE(look.next(&r));
  EXPECT_EQ(payload_of(r).seq, 40u);
  for (uint64_t seq = 40; seq < 60; ++seq) ASSERT_TRUE(consume.next(&r));
  ASSERT_TRUE(look.next(&r));
  EXPECT_EQ(payload_of(r).seq, 60u);
  look.rewind();
  uint64_t n = 0;
  while (look.next(&r)) ++n;
  EXPECT_EQ(n, 40u);
  a.reader.clear();
  look.rewind();
  EXPECT_FALSE(look.next(&r));
  EXPECT_FALSE(consume.next(&r));
  EXPECT_FALSE(a.reader.has_data());
}

TEST(RingMerger, TailIsStoredInBatchesAndOnPublish) {
  TestArea a(geometry(1, 64 * 1024));
  RingProducer p;
  ASSERT_TRUE(ring_claim(a.header(), self_tid(), &p));
  for (uint64_t seq = 0; seq < 10; ++seq) ASSERT_TRUE(produce(&p, 1, seq));
  RingMerger m(true);
  m.add(&a.reader, 0);
  RingRecord r;
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(m.next(&r));
  EXPECT_EQ(__atomic_load_n(&p.ctl->tail, __ATOMIC_ACQUIRE), 0u);  // not yet
  m.publish();
  EXPECT_EQ(__atomic_load_n(&p.ctl->tail, __ATOMIC_ACQUIRE), 3u * 32);
  // Caught up: stored without asking.
  while (m.next(&r)) {
  }
  EXPECT_EQ(__atomic_load_n(&p.ctl->tail, __ATOMIC_ACQUIRE), p.head);
  // A sixteenth of the ring: stored as it goes.
  for (uint64_t seq = 0; seq < 1000; ++seq) ASSERT_TRUE(produce(&p, 1, seq));
  const uint32_t start = p.head - 1000 * 32;
  for (int i = 0; i < 200; ++i) ASSERT_TRUE(m.next(&r));
  const uint32_t tail = __atomic_load_n(&p.ctl->tail, __ATOMIC_ACQUIRE);
  EXPECT_GT(tail, start);
  EXPECT_LE(tail, start + 200 * 32);
}

namespace {

// A record as if written on CPU `cpu`: the header's CPU is set between reserve and commit.
bool produce_on(RingProducer* p, uint64_t producer, uint64_t seq, uint16_t cpu) {
  auto* rec = static_cast<uint8_t*>(ring_reserve(p, sizeof(Payload)));
  if (!rec) return false;
  reinterpret_cast<RingRecordHeader*>(p->data + p->pending_off)->cpu = cpu;
  Payload pl{producer, seq};
  memcpy(rec, &pl, sizeof pl);
  ring_commit(p, sizeof pl);
  return true;
}

// The seqs next(cpu) returns until it has none.
std::vector<uint64_t> take_cpu(RingMerger& m, int cpu) {
  std::vector<uint64_t> out;
  RingRecord r;
  while (m.next(&r, cpu)) {
    EXPECT_EQ(r.cpu, static_cast<uint32_t>(cpu));
    out.push_back(payload_of(r).seq);
  }
  return out;
}

}  // namespace

// Per-CPU consumption (per_cpu/cpuN/trace_pipe): only that CPU's records, in stamp order;
// a ring whose next record is another CPU's holds back what follows it.
TEST(RingMerger, OneCpuAtATimeHoldsBackARingAtAnotherCpusRecord) {
  TestArea a(geometry(2, 64 * 1024), ring_detect_stamp_mode(kRingStampCounter));
  RingProducer ra, rb;
  ASSERT_TRUE(ring_claim(a.header(), self_tid(), &ra));
  ASSERT_TRUE(ring_claim(a.header(), self_tid(), &rb));
  // seq (the stamp order), ring, CPU:  A: 0/0 2/0 4/1 5/1 7/0   B: 1/1 3/0 6/1
  const struct { RingProducer* p; uint16_t cpu; } writes[] = {
      {&ra, 0}, {&rb, 1}, {&ra, 0}, {&rb, 0}, {&ra, 1}, {&ra, 1}, {&rb, 1}, {&ra, 0}};
  for (uint64_t seq = 0; seq < std::size(writes); ++seq)
    ASSERT_TRUE(produce_on(writes[seq].p, 0, seq, writes[seq].cpu));
  RingMerger m(true);
  m.add(&a.reader, 0);
  EXPECT_EQ(take_cpu(m, 0), (std::vector<uint64_t>{0, 2}));
  EXPECT_EQ(take_cpu(m, 1), (std::vector<uint64_t>{1, 4, 5}));
  EXPECT_EQ(take_cpu(m, 0), (std::vector<uint64_t>{3, 7}));
  EXPECT_EQ(take_cpu(m, 0), (std::vector<uint64_t>{}));
  EXPECT_EQ(take_cpu(m, 1), (std::vector<uint64_t>{6}));
  RingRecord r;
  EXPECT_FALSE(m.next(&r));
}

// Random CPUs in four rings, consumed by calls for random CPUs (or any) of random sizes:
// every record comes out exactly once, each ring's in its order, each call's in stamp
// order and of its CPU.
// The figures of the trace header and of poll: records in the buffer (consumed ones
// leave), records dropped since the last clear (consumed or not), whether a consumer of a
// CPU finds a record, and the rings in use.
TEST(RingCounts, EntriesDroppedNextRecordsCpuAndRingsInUse) {
  TestArea a(geometry(2, 4096));
  EXPECT_EQ(a.reader.entries(), 0u);
  EXPECT_EQ(a.reader.dropped(), 0u);
  EXPECT_EQ(a.reader.rings_in_use(), 0u);
  EXPECT_FALSE(a.reader.has_data());
  EXPECT_FALSE(a.reader.has_data(0));
  RingProducer p;
  ASSERT_TRUE(ring_claim(a.header(), self_tid(), &p));
  EXPECT_EQ(a.reader.rings_in_use(), 1u);  // owned, empty
  uint64_t kept = 0;
  while (produce_on(&p, 1, kept, 3)) ++kept;
  for (int i = 0; i < 2; ++i) EXPECT_FALSE(produce_on(&p, 1, 0, 3));
  ring_drop_unowned(a.header());
  EXPECT_EQ(a.reader.entries(), kept);
  EXPECT_EQ(a.reader.dropped(), 4u);  // three for want of room, one for want of a ring
  EXPECT_TRUE(a.reader.has_data());
  EXPECT_TRUE(a.reader.has_data(3));
  EXPECT_FALSE(a.reader.has_data(0));
  RingRecord r;
  ASSERT_TRUE(a.reader.consume(p.ring, &r));
  EXPECT_EQ(a.reader.entries(), kept - 1);
  EXPECT_EQ(a.reader.dropped(), 4u);
  // Across the wrap: a record of CPU 0 at the front of the ring, then one of CPU 5 after
  // the padding.
  while (a.reader.consume(p.ring, &r)) {
  }
  EXPECT_EQ(a.reader.entries(), 0u);
  EXPECT_FALSE(a.reader.has_data(3));
  uint64_t n = 0;
  while (produce_on(&p, 1, n, static_cast<uint16_t>(n == 0 ? 0 : 5))) ++n;
  EXPECT_EQ(a.reader.entries(), n);
  EXPECT_EQ(a.reader.dropped(), 5u);  // one more for want of room
  EXPECT_TRUE(a.reader.has_data(0));
  EXPECT_FALSE(a.reader.has_data(5));  // held back behind CPU 0's
  ASSERT_TRUE(a.reader.consume(p.ring, &r));
  EXPECT_TRUE(a.reader.has_data(5));
  EXPECT_EQ(a.reader.entries(), n - 1);
  // Cleared: nothing in the buffer, nothing dropped; the ring is still its owner's.
  a.reader.clear();
  EXPECT_EQ(a.reader.entries(), 0u);
  EXPECT_EQ(a.reader.dropped(), 0u);
  EXPECT_FALSE(a.reader.has_data());
  EXPECT_EQ(a.reader.rings_in_use(), 1u);
  ring_drop_unowned(a.header());
  EXPECT_EQ(a.reader.dropped(), 1u);
  ring_retire(&p);
  EXPECT_EQ(a.reader.reclaim(), 1u);
  EXPECT_EQ(a.reader.rings_in_use(), 0u);
  // The next owner's ring, with a record: one ring in use.
  RingProducer q;
  ASSERT_TRUE(ring_claim(a.header(), self_tid(), &q));
  ASSERT_TRUE(produce(&q, 2, 0));
  EXPECT_EQ(a.reader.rings_in_use(), 1u);
  EXPECT_EQ(a.reader.entries(), 1u);
}

// progress() moves with every tail (a record consumed, the merger's reads, a clear) and
// with nothing else: not with what producers write, nor with looking.
TEST(RingCounts, ProgressMovesOnlyWhenATailDoes) {
  TestArea a(geometry(2, 4096));
  const uint64_t p0 = a.reader.progress();
  RingProducer p;
  ASSERT_TRUE(ring_claim(a.header(), self_tid(), &p));
  for (uint64_t i = 0; i < 3; ++i) ASSERT_TRUE(produce(&p, 1, i));
  EXPECT_TRUE(a.reader.has_data());
  (void)a.reader.entries();
  EXPECT_EQ(a.reader.progress(), p0);
  RingRecord r;
  ASSERT_TRUE(a.reader.consume(p.ring, &r));
  const uint64_t p1 = a.reader.progress();
  EXPECT_NE(p1, p0);
  ASSERT_TRUE(produce(&p, 1, 3));
  EXPECT_EQ(a.reader.progress(), p1);
  RingMerger m;
  m.add(&a.reader, 1);
  ASSERT_TRUE(m.next(&r));
  EXPECT_NE(a.reader.progress(), p1);
  const uint64_t p2 = a.reader.progress();
  a.reader.clear();
  EXPECT_NE(a.reader.progress(), p2);
  EXPECT_FALSE(a.reader.has_data());
}

TEST(RingMerger, PerCpuCallsNeverLoseOrRepeatARecord) {
  TestArea a(geometry(4, 64 * 1024), ring_detect_stamp_mode(kRingStampCounter));
  RingProducer p[4];
  for (auto& x : p) ASSERT_TRUE(ring_claim(a.header(), self_tid(), &x));
  std::mt19937 rng(11);
  constexpr uint64_t kRecords = 2000;
  for (uint64_t seq = 0; seq < kRecords; ++seq) {
    const uint32_t k = rng() % 4;
    ASSERT_TRUE(produce_on(&p[k], k, seq, static_cast<uint16_t>(rng() % 3)));
  }
  RingMerger m(true);
  m.add(&a.reader, 0);
  std::vector<int> seen(kRecords, 0);
  std::map<uint64_t, int64_t> last_of;
  size_t total = 0;
  for (int call = 0; call < 100000 && total < kRecords; ++call) {
    const int cpu = static_cast<int>(rng() % 4) - 1;
    const size_t max = 1 + rng() % 50;
    RingRecord r;
    uint64_t last_stamp = 0;
    for (size_t n = 0; n < max && m.next(&r, cpu); ++n) {
      const Payload pl = payload_of(r);
      if (cpu >= 0) {
        EXPECT_EQ(r.cpu, static_cast<uint32_t>(cpu));
      }
      EXPECT_GT(r.stamp, last_stamp);
      last_stamp = r.stamp;
      ASSERT_LT(pl.seq, kRecords);
      ++seen[pl.seq];
      EXPECT_GT(static_cast<int64_t>(pl.seq),
                last_of.count(pl.producer) ? last_of[pl.producer] : -1);
      last_of[pl.producer] = static_cast<int64_t>(pl.seq);
      ++total;
    }
  }
  EXPECT_EQ(total, kRecords);
  for (uint64_t seq = 0; seq < kRecords; ++seq) EXPECT_EQ(seen[seq], 1) << seq;
}

namespace {

// One record as a batched consumer takes it (next_kept, then the run behind it).
struct Taken {
  uint64_t seq;
  uint64_t stamp;
  uint32_t cpu;
  uint64_t lost_before;
};

// Takes up to `max` records of `cpu` as the tracer's in-place consumer does: next_kept(),
// then the run next_run() hands out behind it, each with the first's ring, tag and CPU.
std::vector<Taken> take_batch(RingMerger& m, size_t max, int cpu) {
  std::vector<Taken> out;
  RingRecord r;
  RingRunRecord run[16];
  while (out.size() < max && m.next_kept(&r, cpu)) {
    out.push_back({payload_of(r).seq, r.stamp, r.cpu, r.lost_before});
    const size_t n = m.next_run(run, std::min(std::size(run), max - out.size()), cpu);
    for (size_t i = 0; i < n; ++i) {
      Payload pl{};
      EXPECT_EQ(run[i].len, sizeof pl);
      memcpy(&pl, run[i].payload, sizeof pl);
      EXPECT_EQ(pl.producer, payload_of(r).producer);  // the first's ring
      out.push_back({pl.seq, run[i].stamp, run[i].cpu, 0});
    }
  }
  return out;
}

}  // namespace

// Batches of runs, taken while the producers go on (rings filling up, records dropped):
// every record written comes out once, each ring's in order, each batch in stamp order and
// of the CPU asked for, and before each record exactly the count of its ring's records
// dropped since the one before it.
TEST(RingMerger, RunsGiveEveryRecordOnceWithItsLostCount) {
  for (int with_cpus = 0; with_cpus < 2; ++with_cpus) {
    TestArea a(geometry(3, 4096), ring_detect_stamp_mode(kRingStampCounter));
    RingProducer p[3];
    for (auto& x : p) ASSERT_TRUE(ring_claim(a.header(), self_tid(), &x));
    std::mt19937 rng(21 + with_cpus);
    struct Attempt {
      uint32_t ring;
      bool written;
      uint16_t cpu;
    };
    std::map<uint64_t, Attempt> attempts;
    RingMerger m(true);
    m.add(&a.reader, 0);
    std::vector<Taken> got;
    uint64_t seq = 0;
    size_t dropped = 0, runs = 0;
    for (int round = 0; round < 400; ++round) {
      if (round < 300) {
        for (int i = 0; i < 50; ++i, ++seq) {
          // Mostly runs of one ring, now and then another.
          const uint32_t k = rng() % 8 < 6 ? static_cast<uint32_t>(seq / 40 % 3) : rng() % 3;
          const uint16_t cpu = with_cpus ? static_cast<uint16_t>(rng() % 5 == 0) : 0;
          const bool ok = produce_on(&p[k], k, seq, cpu);
          attempts[seq] = {k, ok, cpu};
          if (!ok) ++dropped;
        }
      }
      const int cpu = with_cpus && round < 300 ? static_cast<int>(rng() % 3) - 1 : -1;
      const std::vector<Taken> batch = take_batch(m, 1 + rng() % 60, cpu);
      for (size_t i = 0; i < batch.size(); ++i) {
        EXPECT_EQ(batch[i].cpu, attempts[batch[i].seq].cpu);  // a run's records too
        if (cpu >= 0) {
          EXPECT_EQ(batch[i].cpu, static_cast<uint32_t>(cpu));
        }
        if (i > 0) {
          EXPECT_GT(batch[i].stamp, batch[i - 1].stamp);
          if (batch[i].lost_before == 0 &&
              attempts[batch[i].seq].ring == attempts[batch[i - 1].seq].ring)
            ++runs;
        }
      }
      got.insert(got.end(), batch.begin(), batch.end());
      m.release_kept();
    }
    ASSERT_GT(dropped, 0u);
    ASSERT_GT(runs, 1000u);
    std::map<uint32_t, int64_t> last_of;  // ring: its last seq taken
    std::set<uint64_t> seen;
    for (const Taken& t : got) {
      ASSERT_EQ(attempts.count(t.seq), 1u);
      const uint32_t ring = attempts[t.seq].ring;
      ASSERT_TRUE(attempts[t.seq].written) << t.seq;
      ASSERT_TRUE(seen.insert(t.seq).second) << t.seq;
      const int64_t prev = last_of.count(ring) ? last_of[ring] : -1;
      ASSERT_GT(static_cast<int64_t>(t.seq), prev);
      uint64_t lost = 0;
      for (auto it = attempts.lower_bound(static_cast<uint64_t>(prev + 1));
           it != attempts.end() && it->first < t.seq; ++it)
        if (it->second.ring == ring && !it->second.written) ++lost;
      EXPECT_EQ(t.lost_before, lost) << "seq " << t.seq;
      last_of[ring] = static_cast<int64_t>(t.seq);
    }
    size_t written = 0;
    for (const auto& [s, at] : attempts) written += at.written;
    EXPECT_EQ(seen.size(), written);
  }
}

// A run's bytes stay the consumer's until release_kept(): the tail is not stored past
// them, even where the run reaches the end of what the producer wrote (where next() alone
// hands the room back at once).
TEST(RingMerger, KeptRecordsKeepTheirRoomUntilReleased) {
  TestArea a(geometry(1, 64 * 1024));
  RingProducer p;
  ASSERT_TRUE(ring_claim(a.header(), self_tid(), &p));
  for (uint64_t seq = 0; seq < 10; ++seq) ASSERT_TRUE(produce(&p, 1, seq));
  RingMerger m(true);
  m.add(&a.reader, 0);
  const std::vector<Taken> all = take_batch(m, 100, -1);
  ASSERT_EQ(all.size(), 10u);
  EXPECT_EQ(__atomic_load_n(&p.ctl->tail, __ATOMIC_ACQUIRE), 0u);
  RingRecord r;
  EXPECT_FALSE(m.next_kept(&r));  // caught up: still kept
  EXPECT_EQ(__atomic_load_n(&p.ctl->tail, __ATOMIC_ACQUIRE), 0u);
  m.release_kept();
  m.publish();
  EXPECT_EQ(__atomic_load_n(&p.ctl->tail, __ATOMIC_ACQUIRE), p.head);
}

// next_kept(.., false) ends at the end of the snapshot it has: records written after it
// wait for a call that may take a fresh one, which counts in snapshots(); those of the
// snapshot come as before, runs included, with nothing skipped.
TEST(RingMerger, NoFreshSnapshotWhenRefused) {
  TestArea a(geometry(2, 64 * 1024));
  RingProducer p[2];
  for (auto& x : p) ASSERT_TRUE(ring_claim(a.header(), self_tid(), &x));
  uint64_t seq = 0;
  for (; seq < 20; ++seq) ASSERT_TRUE(produce(&p[seq % 2], 1, seq));
  RingMerger m(true);
  m.add(&a.reader, 0);
  RingRecord r;
  EXPECT_FALSE(m.next_kept(&r, -1, false));  // no snapshot yet, and none may be taken
  EXPECT_EQ(m.snapshots(), 0u);
  ASSERT_TRUE(m.next_kept(&r, -1, true));
  EXPECT_EQ(m.snapshots(), 1u);
  EXPECT_EQ(payload_of(r).seq, 0u);
  uint64_t want = 1;
  for (; seq < 30; ++seq) ASSERT_TRUE(produce(&p[seq % 2], 1, seq));  // after the look
  while (m.next_kept(&r, -1, false)) {
    EXPECT_EQ(payload_of(r).seq, want);
    ++want;
  }
  EXPECT_EQ(want, 20u);  // the snapshot's records, and no more
  EXPECT_EQ(m.snapshots(), 1u);
  while (m.next_kept(&r, -1, true)) {
    EXPECT_EQ(payload_of(r).seq, want);
    ++want;
  }
  EXPECT_EQ(want, 30u);
  EXPECT_GE(m.snapshots(), 2u);
  m.release_kept();
  m.publish();
}

// --- waking the reader ----------------------------------------------------------------------

namespace {

// Waits (bounded) until the reader has armed its flag in every area.
bool until_asleep(std::vector<RingAreaHeader*> areas, const Deadline& dl) {
  for (;;) {
    bool all = true;
    for (RingAreaHeader* h : areas)
      all = all && __atomic_load_n(&h->sleeping, __ATOMIC_ACQUIRE) != 0;
    if (all) return true;
    if (dl.passed()) return false;
    std::this_thread::yield();
  }
}

}  // namespace

TEST(RingWait, TimesOutWhenNothingComes) {
  TestArea a(geometry(1, 4096));
  RingAreaReader* readers[] = {&a.reader};
  EXPECT_EQ(ring_wait(readers, 5), RingWaitResult::kTimeout);
  EXPECT_EQ(__atomic_load_n(&a.header()->sleeping, __ATOMIC_RELAXED), 0u);
  RingProducer p;
  ASSERT_TRUE(ring_claim(a.header(), self_tid(), &p));
  ASSERT_TRUE(produce(&p, 1, 1));
  EXPECT_EQ(ring_wait(readers, 5), RingWaitResult::kReady);
}

TEST(RingWait, CommitWakesTheSleepingReader) {
  ASSERT_EQ(ring_register_producer_process(), 0);
  TestArea a(geometry(2, 4096));
  RingAreaReader* readers[] = {&a.reader};
  for (int round = 0; round < 20; ++round) {
    std::atomic<int> result{-1};
    std::thread consumer([&] { result = static_cast<int>(ring_wait(readers, 20000)); });
    Deadline dl(20);
    const bool asleep = until_asleep({a.header()}, dl);
    RingProducer p;
    if (asleep) {
      EXPECT_TRUE(ring_claim(a.header(), self_tid(), &p));
      EXPECT_TRUE(produce(&p, 1, static_cast<uint64_t>(round)));
    }
    consumer.join();
    ASSERT_TRUE(asleep);
    EXPECT_NE(result.load(), static_cast<int>(RingWaitResult::kTimeout));
    RingRecord r;
    ASSERT_TRUE(a.reader.consume(p.ring, &r));
    EXPECT_EQ(payload_of(r).seq, static_cast<uint64_t>(round));
    ring_retire(&p);
    a.reader.reclaim();
  }
}

TEST(RingWait, OneThreadWaitsForAnyOfManyAreas) {
  ASSERT_EQ(ring_register_producer_process(), 0);
  std::vector<std::unique_ptr<TestArea>> areas;
  std::vector<RingAreaReader*> readers;
  std::vector<RingAreaHeader*> headers;
  for (int i = 0; i < 3; ++i) {
    areas.push_back(std::make_unique<TestArea>(geometry(1, 4096)));
    readers.push_back(&areas.back()->reader);
    headers.push_back(areas.back()->header());
  }
  for (int which = 0; which < 3; ++which) {
    std::atomic<int> result{-1};
    std::thread consumer([&] { result = static_cast<int>(ring_wait(readers, 20000)); });
    Deadline dl(20);
    const bool asleep = until_asleep(headers, dl);
    RingProducer p;
    if (asleep) {
      EXPECT_TRUE(ring_claim(headers[which], self_tid(), &p));
      EXPECT_TRUE(produce(&p, 1, 1));
    }
    consumer.join();
    ASSERT_TRUE(asleep);
    EXPECT_NE(result.load(), static_cast<int>(RingWaitResult::kTimeout));
    EXPECT_TRUE(readers[which]->has_data());
    RingRecord r;
    EXPECT_TRUE(readers[which]->consume(0, &r));
    ring_retire(&p);
    readers[which]->reclaim();
  }
}

TEST(RingWait, ProducerInAnotherProcessWakesTheReader) {
  TestArea a(geometry(1, 4096));
  RingAreaReader* readers[] = {&a.reader};
  Child child([&] {
    ring_register_producer_process();
    Deadline dl(30);
    while (__atomic_load_n(&a.header()->sleeping, __ATOMIC_ACQUIRE) == 0) {
      if (dl.passed()) return 3;
    }
    RingProducer p;
    if (!ring_claim(a.header(), self_tid(), &p)) return 4;
    produce(&p, 1, 77);
    return 0;
  });
  ASSERT_TRUE(child.started());
  const RingWaitResult res = ring_wait(readers, 30000);
  const int status = child.wait(30000);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  EXPECT_NE(res, RingWaitResult::kTimeout);
  RingRecord r;
  ASSERT_TRUE(a.reader.consume(0, &r));
  EXPECT_EQ(payload_of(r).seq, 77u);
}

// --- owners and counters --------------------------------------------------------------------

TEST(RingOwners, ClaimFailsWhenFullAndRetriesAfterReclaim) {
  TestArea a(geometry(2, 4096, 8));
  RingProducer mine[2], extra;
  ASSERT_TRUE(ring_claim(a.header(), self_tid(), &mine[0]));
  uint32_t thread_tid = 0;
  std::thread t([&] {
    thread_tid = self_tid();
    RingProducer p;
    if (!ring_claim(a.header(), thread_tid, &p)) return;
    ring_count_hit(&p, 3);
    ring_count_hit(&p, 3);
    produce(&p, 9, 0);
  });
  t.join();
  EXPECT_FALSE(ring_claim(a.header(), self_tid(), &extra));
  EXPECT_FALSE(ring_claim_worth_retrying(a.header(), &extra));
  // Without a ring: hits and records go to the area's shared counters.
  ring_count_hit_unowned(a.header(), 3);
  ring_drop_unowned(a.header());
  ring_count_miss(a.header(), 3);
  EXPECT_EQ(a.reader.hits(3), 3u);
  EXPECT_EQ(a.reader.misses(3), 1u);
  EXPECT_EQ(a.reader.unowned_lost(), 1u);
  // The thread is gone but its ring holds a record: not freed until read.
  EXPECT_EQ(a.reader.reclaim(), 0u);
  RingMerger m(true);
  m.add(&a.reader, 0);
  RingRecord r;
  ASSERT_TRUE(m.next(&r));
  EXPECT_EQ(r.tid, thread_tid);
  EXPECT_EQ(reclaim_until(a.reader, 1), 1u);
  EXPECT_EQ(a.reader.hits(3), 3u);  // folded
  EXPECT_TRUE(ring_claim_worth_retrying(a.header(), &extra));
  ASSERT_TRUE(ring_claim(a.header(), self_tid(), &extra));
  ring_count_hit(&extra, 3);
  EXPECT_EQ(a.reader.hits(3), 4u);
  a.reader.reset_counters(3);
  EXPECT_EQ(a.reader.hits(3), 0u);
  EXPECT_EQ(a.reader.misses(3), 0u);
  ring_count_hit(&extra, 3);
  EXPECT_EQ(a.reader.hits(3), 1u);
  std::vector<uint64_t> all(8);
  a.reader.hits_all(all);
  EXPECT_EQ(all[3], 1u);
  // A live owner that retired is freed too.
  EXPECT_EQ(a.reader.reclaim(), 0u);
  ring_retire(&mine[0]);
  EXPECT_EQ(a.reader.reclaim(), 1u);
  EXPECT_TRUE(ring_claim(a.header(), self_tid(), &mine[1]));
}

TEST(RingOwners, LostAfterTheLastRecordIsFoldedWhenFreed) {
  TestArea a(geometry(1, 4096));
  RingProducer p;
  ASSERT_TRUE(ring_claim(a.header(), self_tid(), &p));
  uint64_t n = 0;
  while (produce(&p, 1, n)) ++n;
  RingRecord r;
  while (a.reader.consume(0, &r)) {
  }
  ring_retire(&p);
  EXPECT_EQ(a.reader.reclaim(), 1u);
  EXPECT_EQ(a.reader.stats().lost_unattributed, 1u);
  // The next owner starts with nothing to report.
  ASSERT_TRUE(ring_claim(a.header(), self_tid(), &p));
  ASSERT_TRUE(produce(&p, 1, 0));
  ASSERT_TRUE(a.reader.consume(0, &r));
  EXPECT_EQ(r.lost_before, 0u);
}

// The claimer's name (ring_set_comm): read for that owner only, kept through the owner's
// end until the ring is freed (and handed to reclaim's caller then), never taken for the
// next owner's.
TEST(RingOwners, TheClaimersNameOutlivesItUntilTheRingIsFreed) {
  TestArea a(geometry(2, 4096));
  std::string name;
  uint32_t tid = 0;
  std::thread t([&] {
    tid = self_tid();
    RingProducer p;
    if (!ring_claim(a.header(), tid, &p)) return;
    // Claimed, name not stored yet: nothing to read (a previous owner's name is not it).
    if (a.reader.find_comm(tid, &name)) return;
    const char comm[kRingCommBytes] = "worker-7";
    ring_set_comm(&p, tid, comm);
    produce(&p, 1, 0);
  });
  t.join();
  ASSERT_NE(tid, 0u);
  ASSERT_TRUE(a.reader.find_comm(tid, &name));
  EXPECT_EQ(name, "worker-7");
  EXPECT_FALSE(a.reader.find_comm(tid + 1, &name));
  EXPECT_FALSE(a.reader.find_comm(0, &name));
  // Gone, but its record is unread: the ring and its name stay.
  std::vector<std::pair<uint32_t, std::string>> names;
  EXPECT_EQ(a.reader.reclaim(&names), 0u);
  EXPECT_TRUE(names.empty());
  ASSERT_TRUE(a.reader.find_comm(tid, &name));
  EXPECT_EQ(name, "worker-7");
  RingRecord r;
  uint32_t ring = 0;
  for (; ring < 2 && !a.reader.front(ring, &r); ++ring) {
  }
  ASSERT_LT(ring, 2u);
  a.reader.pop(ring);
  // Drained: freed, and the name goes to the caller.
  Deadline dl(30);
  while (names.empty() && !dl.passed()) {
    a.reader.reclaim(&names);
    std::this_thread::yield();
  }
  ASSERT_EQ(names.size(), 1u);
  EXPECT_EQ(names[0].first, tid);
  EXPECT_EQ(names[0].second, "worker-7");
  EXPECT_FALSE(a.reader.find_comm(tid, &name));
  // The next owner of that ring, even one with the same tid (a tid used again), reads as
  // nameless until it stores its own name; a name of 16 bytes with no NUL (the process
  // may write anything) is cut to the kernel's 15.
  RingProducer q;
  ASSERT_TRUE(ring_claim(a.header(), tid, &q));
  ASSERT_EQ(q.ring, ring);  // the scan starts at tid % 2
  EXPECT_FALSE(a.reader.owner_comm(ring, tid, &name));
  char full[kRingCommBytes];
  memset(full, 'x', sizeof full);
  ring_set_comm(&q, tid, full);
  ASSERT_TRUE(a.reader.owner_comm(ring, tid, &name));
  EXPECT_EQ(name, std::string(15, 'x'));
  EXPECT_FALSE(a.reader.owner_comm(1 - ring, tid, &name));
  EXPECT_FALSE(a.reader.owner_comm(2, tid, &name));
}

// Threads that come and go faster than the reader reads: a new thread takes over the
// unread ring of one that is gone (retired, or its thread ended) once no ring is free or
// drained, and the owner record each claim writes names every record by its writer.
TEST(RingOwners, AThreadTakesOverTheUnreadRingOfOneGoneAndRecordsKeepTheirWriters) {
  TestArea a(geometry(1, 4 * 4096));
  const uint32_t pid = static_cast<uint32_t>(getpid());
  struct Writer {
    uint32_t tid = 0;
    bool claimed = false;
  };
  // Claims with its name, writes n records, and retires (or just ends).
  auto run = [&](const char* name, uint64_t producer, int n, bool retire) {
    Writer w;
    std::thread t([&] {
      w.tid = self_tid();
      char comm[kRingCommBytes] = {};
      strncpy(comm, name, sizeof comm - 1);
      RingProducer p;
      if (!ring_claim(a.header(), w.tid, &p, pid, comm)) return;
      w.claimed = true;
      for (int i = 0; i < n; ++i) produce(&p, producer, static_cast<uint64_t>(i));
      if (retire) ring_retire(&p);
    });
    t.join();
    return w;
  };
  const Writer alpha = run("alpha", 1, 3, true);
  ASSERT_TRUE(alpha.claimed);
  // Its thread ended without retiring: taken over once the kernel released it.
  const Writer beta = run("beta", 2, 2, false);
  ASSERT_TRUE(beta.claimed);
  Deadline dl(30);
  while (ring_owner_alive(getpid(), beta.tid) && !dl.passed()) std::this_thread::yield();
  const Writer gamma = run("gamma", 3, 1, true);
  ASSERT_TRUE(gamma.claimed);
  // A claimer without a name (which writes no owner record) never takes an unread ring.
  RingProducer nameless;
  EXPECT_FALSE(ring_claim(a.header(), self_tid(), &nameless, pid));
  EXPECT_EQ(a.reader.entries(), 6u);
  EXPECT_TRUE(a.reader.has_data());

  struct Seen {
    uint32_t tid;
    uint64_t producer;
    std::string name;  // only on the first record after an owner record
  };
  auto read_all = [&](bool consume) {
    std::vector<Seen> seen;
    RingMerger m(consume);
    m.add(&a.reader, 0);
    RingRecord r;
    while (m.next(&r))
      seen.push_back({r.tid, payload_of(r).producer,
                      r.named ? std::string(r.comm, strnlen(r.comm, sizeof r.comm)) : ""});
    return seen;
  };
  const std::vector<Seen> expected = {
      {alpha.tid, 1, "alpha"}, {alpha.tid, 1, ""}, {alpha.tid, 1, ""},
      {beta.tid, 2, "beta"},   {beta.tid, 2, ""},  {gamma.tid, 3, "gamma"}};
  for (bool consume : {false, true}) {
    SCOPED_TRACE(consume ? "consuming" : "walking");
    const std::vector<Seen> seen = read_all(consume);
    ASSERT_EQ(seen.size(), expected.size());
    for (size_t i = 0; i < seen.size(); ++i) {
      EXPECT_EQ(seen[i].tid, expected[i].tid) << i;
      EXPECT_EQ(seen[i].producer, expected[i].producer) << i;
      EXPECT_EQ(seen[i].name, expected[i].name) << i;
    }
  }
  EXPECT_FALSE(a.reader.has_data());
  EXPECT_EQ(a.reader.stats().corrupt, 0u);
  EXPECT_EQ(reclaim_until(a.reader, 1), 1u);
}

// A ring is taken over unread only while an eighth of it is free: a thread that finds
// every ring full has none (its records are counted lost) until the reader makes room.
TEST(RingOwners, AFullRingIsNotTakenOverUntilTheReaderMakesRoom) {
  TestArea a(geometry(1, 4096));
  const uint32_t pid = static_cast<uint32_t>(getpid());
  const char comm[kRingCommBytes] = "filler";
  RingProducer p;
  ASSERT_TRUE(ring_claim(a.header(), self_tid(), &p, pid, comm));
  uint64_t n = 0;
  while (produce(&p, 1, n)) ++n;
  ring_retire(&p);
  uint32_t tid = 0;
  bool claimed = true;
  std::thread t([&] {
    tid = self_tid();
    RingProducer q;
    claimed = ring_claim(a.header(), tid, &q, pid, comm);
  });
  t.join();
  EXPECT_FALSE(claimed);
  RingRecord r;
  for (int i = 0; i < 40; ++i) ASSERT_TRUE(a.reader.consume(0, &r));
  RingProducer q;
  ASSERT_TRUE(ring_claim(a.header(), tid, &q, pid, comm));
  ASSERT_TRUE(produce(&q, 2, 0));
  uint64_t from_first = 40;
  uint32_t last_tid = 0;
  while (a.reader.consume(0, &r)) {
    last_tid = r.tid;
    if (payload_of(r).producer == 1) ++from_first;
  }
  EXPECT_EQ(from_first, n);
  EXPECT_EQ(last_tid, tid);
}

// What a thread lost after its last record is reported before the first record of the
// thread that takes its ring over, read or not: nothing is lost without a count.
TEST(RingOwners, ATakerReportsWhatTheRingsLastOwnerLostAfterItsLastRecord) {
  TestArea a(geometry(1, 4096));
  const uint32_t pid = static_cast<uint32_t>(getpid());
  const char first[kRingCommBytes] = "first";
  RingProducer p;
  ASSERT_TRUE(ring_claim(a.header(), self_tid(), &p, pid, first));
  uint64_t written = 0, attempts = 0;
  for (; attempts < 1000; ++attempts)
    if (produce(&p, 1, attempts)) ++written;
  ASSERT_LT(written, attempts);  // the ring filled and dropped the rest
  ring_retire(&p);
  // The reader makes room (not all of it read), then another thread takes the ring.
  RingRecord r;
  uint64_t read = 0, lost = 0;
  for (int i = 0; i < 60; ++i, ++read) {
    ASSERT_TRUE(a.reader.consume(0, &r));
    lost += r.lost_before;
  }
  const char second[kRingCommBytes] = "second";
  RingProducer q;
  ASSERT_TRUE(ring_claim(a.header(), self_tid(), &q, pid, second));
  ASSERT_TRUE(produce(&q, 2, 0));
  while (a.reader.consume(0, &r)) {
    ++read;
    lost += r.lost_before;
    if (payload_of(r).producer == 2) {
      EXPECT_EQ(r.lost_before, attempts - written);
    }
  }
  EXPECT_EQ(read, written + 1);
  EXPECT_EQ(read + lost, attempts + 1);
}

// Owner records one after another, more than one parse passes: each reader goes on
// from where the last left off, and the record after them is the last claimer's.
TEST(RingOwners, ManyOwnerRecordsInARowAreAllPassed) {
  TestArea a(geometry(1, 4 * 4096));
  const uint32_t pid = static_cast<uint32_t>(getpid());
  const uint32_t tid = self_tid();
  RingProducer p;
  for (int i = 0; i < 150; ++i) {
    char comm[kRingCommBytes] = {};
    snprintf(comm, sizeof comm, "claim-%d", i);
    ASSERT_TRUE(ring_claim(a.header(), tid, &p, pid, comm)) << i;
    ASSERT_EQ(p.ring, 0u);
    ring_retire(&p);
  }
  EXPECT_FALSE(a.reader.has_data());  // owner records are nothing to read
  EXPECT_EQ(a.reader.entries(), 0u);
  EXPECT_FALSE(a.reader.has_data(0));
  const char last[kRingCommBytes] = "last";
  ASSERT_TRUE(ring_claim(a.header(), tid, &p, pid, last));
  ASSERT_TRUE(produce(&p, 5, 0));
  EXPECT_EQ(a.reader.entries(), 1u);
  for (bool consume : {false, true}) {
    RingMerger m(consume);
    m.add(&a.reader, 0);
    RingRecord r;
    ASSERT_TRUE(m.next(&r));
    EXPECT_EQ(r.tid, tid);
    ASSERT_TRUE(r.named);
    EXPECT_STREQ(r.comm, "last");
    EXPECT_FALSE(m.next(&r));
  }
  EXPECT_EQ(a.reader.stats().corrupt, 0u);
  // Owner records alone are no records to wait for: the ring is drained.
  ring_retire(&p);
  char again[kRingCommBytes] = "again";
  ASSERT_TRUE(ring_claim(a.header(), tid, &p, pid, again));
  ring_retire(&p);
  EXPECT_EQ(a.reader.reclaim(), 1u);
}

TEST(RingOwners, OwnerLiveness) {
  EXPECT_TRUE(ring_owner_alive(getpid(), self_tid()));
  uint32_t gone = 0;
  std::thread t([&] { gone = self_tid(); });
  t.join();
  // Gone once the kernel released it (just after the join); its tid could only be in use
  // again after pid_max others.
  Deadline dl(30);
  while (ring_owner_alive(getpid(), gone) && !dl.passed()) std::this_thread::yield();
  EXPECT_FALSE(ring_owner_alive(getpid(), gone));
  EXPECT_FALSE(ring_owner_alive(getpid(), 0));
}

// --- clocks ---------------------------------------------------------------------------------

TEST(TraceClock, FileNamesAndFormats) {
  EXPECT_EQ(trace_clock_file(TraceClock::kLocal),
            "[local] global counter uptime perf mono mono_raw boot tai x86-tsc\n");
  EXPECT_EQ(trace_clock_file(TraceClock::kX86Tsc),
            "local global counter uptime perf mono mono_raw boot tai [x86-tsc]\n");
  for (TraceClock c : kTraceClocks) {
    TraceClock back;
    ASSERT_TRUE(parse_trace_clock(std::string(trace_clock_name(c)) + "\n", &back));
    EXPECT_EQ(back, c);
  }
  TraceClock c;
  EXPECT_FALSE(parse_trace_clock("jiffies", &c));
  EXPECT_FALSE(parse_trace_clock("", &c));
  EXPECT_FALSE(parse_trace_clock("[local]", &c));
  EXPECT_TRUE(trace_clock_in_ns(TraceClock::kMono));
  EXPECT_FALSE(trace_clock_in_ns(TraceClock::kCounter));
  EXPECT_FALSE(trace_clock_in_ns(TraceClock::kUptime));
  EXPECT_EQ(trace_clock_stamp(TraceClock::kCounter), kRingStampCounter);
  EXPECT_EQ(trace_clock_stamp(TraceClock::kGlobal), kRingStampTsc);
  std::string s;
  format_trace_timestamp(s, TraceClock::kLocal, 1113391850499ull);
  EXPECT_EQ(s, "  1113.391850");
  s.clear();
  format_trace_timestamp(s, TraceClock::kLocal, 1113391850500ull);
  EXPECT_EQ(s, "  1113.391851");
  s.clear();
  format_trace_timestamp(s, TraceClock::kCounter, 42);
  EXPECT_EQ(s, "           42");
}

TEST(TraceClock, ConversionsAreSaneAndMonotonic) {
  for (TraceClock c : {TraceClock::kLocal, TraceClock::kGlobal, TraceClock::kPerf,
                       TraceClock::kMono, TraceClock::kMonoRaw, TraceClock::kBoot,
                       TraceClock::kTai, TraceClock::kUptime}) {
    SCOPED_TRACE(std::string(trace_clock_name(c)));
    TraceClockConverter conv;
    ASSERT_EQ(conv.calibrate(c), 0);
    clockid_t id = c == TraceClock::kMono || c == TraceClock::kUptime ? CLOCK_MONOTONIC
                   : c == TraceClock::kBoot                           ? CLOCK_BOOTTIME
                   : c == TraceClock::kTai                            ? CLOCK_TAI
                                                                      : CLOCK_MONOTONIC_RAW;
    uint64_t last = 0;
    std::vector<uint64_t> tscs;
    for (int round = 0; round < 20; ++round) {
      for (int i = 0; i < 200; ++i) {
        tscs.push_back(__rdtsc());
        const uint64_t v = conv.convert(tscs.back(), false);
        ASSERT_GE(v, last);
        last = v;
      }
      conv.update();
    }
    // After every update, old stamps convert in order still.
    last = 0;
    for (uint64_t t : tscs) {
      const uint64_t v = conv.convert(t, false);
      ASSERT_GE(v, last);
      last = v;
    }
    // Close to the POSIX clock (generous: a preempted sample is all it may be off by).
    timespec ts;
    const uint64_t tsc = __rdtsc();
    clock_gettime(id, &ts);
    uint64_t ref = static_cast<uint64_t>(ts.tv_sec) * 1000000000ull +
                   static_cast<uint64_t>(ts.tv_nsec);
    uint64_t got = conv.convert(tsc, false);
    if (c == TraceClock::kUptime) {
      ref /= 10000000;
      EXPECT_LE(got > ref ? got - ref : ref - got, 2u);
    } else {
      EXPECT_LT(got > ref ? got - ref : ref - got, 5000000u) << got << " vs " << ref;
    }
    // A stamp taken as a counter is itself.
    EXPECT_EQ(conv.convert(12345, true), 12345u);
  }
  TraceClockConverter tsc;
  ASSERT_EQ(tsc.calibrate(TraceClock::kX86Tsc), 0);
  EXPECT_EQ(tsc.convert(987654321, false), 987654321u);
}

TEST(TraceClock, CounterModeStampsStrictlyIncreaseAcrossThreads) {
  TestArea a(geometry(4, 256 * 1024), ring_detect_stamp_mode(kRingStampCounter));
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      RingProducer p;
      if (!ring_claim(a.header(), self_tid(), &p)) return;
      for (uint64_t i = 0; i < 5000; ++i) produce(&p, static_cast<uint64_t>(t), i);
    });
  }
  for (auto& th : threads) th.join();
  RingMerger m(true);
  m.add(&a.reader, 0);
  RingRecord r;
  uint64_t last = 0, n = 0;
  while (m.next(&r)) {
    ASSERT_TRUE(r.counter_stamp);
    ASSERT_GT(r.stamp, last);
    last = r.stamp;
    ++n;
  }
  EXPECT_EQ(n, 20000u);
  EXPECT_EQ(last, 20000u);
}

TEST(TraceClock, StampModeFollowsTheClock) {
  TestArea a(geometry(1, 4096));
  RingProducer p;
  ASSERT_TRUE(ring_claim(a.header(), self_tid(), &p));
  ASSERT_TRUE(produce(&p, 1, 0));
  ring_set_stamp_mode(a.header(), ring_detect_stamp_mode(kRingStampCounter));
  a.reader.clear();
  ASSERT_TRUE(produce(&p, 1, 1));
  ASSERT_TRUE(produce(&p, 1, 2));
  RingRecord r;
  ASSERT_TRUE(a.reader.consume(0, &r));
  EXPECT_TRUE(r.counter_stamp);
  EXPECT_EQ(r.stamp, 1u);
  ASSERT_TRUE(a.reader.consume(0, &r));
  EXPECT_EQ(r.stamp, 2u);
  // Every CPU-number source this machine has gives one of its CPUs.
  const uint32_t detected = ring_detect_stamp_mode(kRingStampTsc) >> 16;
  std::vector<uint32_t> sources = {detected, kRingCpuNone};
  if (detected == kRingCpuRdpid) sources.push_back(kRingCpuRdtscp);
  if (ring_rseq_cpu_offset() >= 0) {
    sources.push_back(kRingCpuRseq);
    p.rseq_cpu = ring_rseq_cpu_offset();
  }
  for (uint32_t src : sources) {
    ring_set_stamp_mode(a.header(),
                        ring_stamp_mode(kRingStampTsc, static_cast<RingCpuSource>(src)));
    ASSERT_TRUE(produce(&p, 1, 3));
    ASSERT_TRUE(a.reader.consume(0, &r));
    EXPECT_FALSE(r.counter_stamp);
    EXPECT_LT(r.cpu, static_cast<uint32_t>(get_nprocs_conf()));
    EXPECT_GT(r.stamp, 1000u);
  }
}
