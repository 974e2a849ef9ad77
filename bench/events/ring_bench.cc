// Ring buffer benchmark: one hot producer thread writes records of an event with two u64
// arguments (the events record: 8-byte common header, probe ip, two arguments: 32 bytes)
// and a timestamp into its ring, as the agent's hit path does; a consumer thread drains
// it through a RingMerger and ring_wait, as the daemon does.
//
//   baseline     the same loop writing the same 48 bytes (stamp, CPU, payload) into a
//                private array of the ring's size: what the record costs without the ring
//   producer     reserve + stamp + commit alone (batches that fit, drained off the clock)
//   end to end   the producer waits for room when the ring is full: every record arrives
//   free-running the producer never waits: records/s consumed, and what was dropped
//   consumer CPU the consumer thread's CPU time per record: what the daemon spends, and
//                what one core could take if nothing else ran (the wall-clock rates on a
//                machine shared with other work are lower)
//
// Targets (DESIGN.md §7): >= 20 M records/s consumed; the hit with two arguments and a
// timestamp <= 25 ns, of which the ring's part is what this measures.
#include <sched.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#include <x86intrin.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>

#include "events/ring.h"
#include "events/ring_consumer.h"

using namespace probefs::events;

namespace {

inline void keep(const void* p) { asm volatile("" : : "r"(p) : "memory"); }

uint64_t now_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

uint64_t thread_cpu_ns() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

uint32_t self_tid() { return static_cast<uint32_t>(syscall(SYS_gettid)); }

constexpr uint32_t kPayload = 32;

// The record the fetch program would write: common_type, flags, preempt count, pid, ip,
// two arguments.
inline void write_payload(uint64_t* rec, uint64_t i) {
  rec[0] = 0x0000'1234'0000'0007ull;
  rec[1] = 0x401000;
  rec[2] = i;
  rec[3] = i * 3;
}

inline uint64_t stamp_rdpid(uint32_t* cpu) {
  const uint64_t tsc = __rdtsc();
  uint64_t aux;
  asm volatile("rdpid %0" : "=r"(aux));
  *cpu = static_cast<uint32_t>(aux) & 0xfff;
  return tsc;
}

template <class F>
double best_ns_per_op(F&& f, uint64_t iters, int runs = 7) {
  double best = 1e30;
  for (int run = 0; run < runs; ++run) {
    const uint64_t t0 = now_ns();
    f(iters);
    const double ns = static_cast<double>(now_ns() - t0) / static_cast<double>(iters);
    if (ns < best) best = ns;
  }
  return best;
}

struct Rig {
  RingArea area;
  RingAreaReader reader;
  bool ok = false;
  explicit Rig(const RingGeometry& g) {
    ok = RingArea::create(g, ring_detect_stamp_mode(kRingStampTsc), &area) == 0 &&
         reader.attach(area.mem(), area.size(), getpid()) == 0;
  }
};

struct Flow {
  uint64_t produced = 0;   // committed
  uint64_t full = 0;       // reserve found no room
  uint64_t consumed = 0;
  uint64_t lost_reported = 0;
  double seconds = 0;
  double consumer_cpu_ns = 0;  // the consumer thread's CPU time per record
  double rate() const { return seconds > 0 ? static_cast<double>(consumed) / seconds / 1e6 : 0; }
};

// Producer and consumer threads; `wait_for_room`: the producer retries a record until it
// fits, so every one of n arrives.
Flow run_flow(const RingGeometry& g, uint64_t n, bool wait_for_room) {
  Rig rig(g);
  Flow f;
  if (!rig.ok) return f;
  alignas(64) std::atomic<bool> producer_done{false};
  alignas(64) std::atomic<bool> start{false};
  uint64_t t_start = 0;
  // Each thread keeps what it reads in the loop to itself: a flag or counter that shares a
  // cache line with the other thread's (the consumer's stack) would cost a transfer per
  // record and measure that instead.
  std::thread producer([&, n, wait_for_room] {
    RingProducer p;
    if (!ring_claim(rig.area.header(), self_tid(), &p)) {
      producer_done = true;
      return;
    }
    while (!start.load(std::memory_order_acquire)) {
    }
    uint64_t full = 0;
    for (uint64_t i = 0; i < n; ++i) {
      void* rec;
      while (!(rec = ring_reserve(&p, kPayload))) {
        ++full;
        if (!wait_for_room) break;
        // On a shared machine a producer that only spins can hold the CPU the consumer
        // needs to make room.
        if (full % 64 == 0) sched_yield(); else _mm_pause();
      }
      if (!rec) continue;
      write_payload(static_cast<uint64_t*>(rec), i);
      ring_commit(&p, kPayload);
    }
    f.full = full;
    f.produced = wait_for_room ? n : n - full;
    producer_done.store(true, std::memory_order_release);
  });
  RingMerger m(true);
  m.add(&rig.reader, 0);
  RingAreaReader* readers[] = {&rig.reader};
  RingRecord r;
  uint64_t sum = 0, consumed = 0, lost = 0;
  t_start = now_ns();
  const uint64_t cpu_start = thread_cpu_ns();
  start.store(true, std::memory_order_release);
  for (;;) {
    if (m.next(&r)) {
      ++consumed;
      lost += r.lost_before;
      sum += r.payload[16];
      continue;
    }
    if (producer_done.load(std::memory_order_acquire)) {
      if (!m.next(&r)) break;
      ++consumed;
      lost += r.lost_before;
      continue;
    }
    ring_wait(readers, 100);
  }
  const uint64_t t_end = now_ns();
  const uint64_t cpu_end = thread_cpu_ns();
  producer.join();
  keep(&sum);
  f.consumed = consumed;
  f.lost_reported = lost;
  f.seconds = static_cast<double>(t_end - t_start) / 1e9;
  f.consumer_cpu_ns =
      f.consumed ? static_cast<double>(cpu_end - cpu_start) / static_cast<double>(f.consumed) : 0;
  return f;
}

// The best of `runs` flows by records/s consumed (others share this machine's CPUs).
Flow best_flow(const RingGeometry& g, uint64_t n, bool wait_for_room, int runs) {
  Flow best;
  for (int i = 0; i < runs; ++i) {
    Flow f = run_flow(g, n, wait_for_room);
    if (f.rate() > best.rate()) best = f;
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  const uint64_t n = argc > 1 ? strtoull(argv[1], nullptr, 10) : 20'000'000;
  RingGeometry g;  // the daemon's default: 64 rings of buffer_size_kb 1410 (1412 KiB)
  const uint32_t ring_bytes = static_cast<uint32_t>(ring_align_up(g.ring_bytes, kRingPageBytes));
  const uint32_t record_bytes = kRingRecordHeaderSize + kPayload;
  const uint32_t batch = ring_bytes / record_bytes - 1;

  // The stamp alone, both ways the producer can read the CPU.
  const double rdpid_ns = best_ns_per_op(
      [&](uint64_t iters) {
        uint64_t s = 0;
        for (uint64_t i = 0; i < iters; ++i) {
          uint32_t cpu;
          s += stamp_rdpid(&cpu) + cpu;
        }
        keep(&s);
      },
      n / 8);
  const double rdtscp_ns = best_ns_per_op(
      [&](uint64_t iters) {
        uint64_t s = 0;
        for (uint64_t i = 0; i < iters; ++i) {
          unsigned aux;
          s += __rdtscp(&aux) + aux;
        }
        keep(&s);
      },
      n / 8);

  // The producer alone, in batches that fit in the ring (drained off the clock), and the
  // baseline: the same record bytes and stamp into a private array of the ring's size.
  // Taken in turns, best of each, so that both see the same machine.
  Rig rig(g);
  if (!rig.ok) {
    fprintf(stderr, "cannot create the ring area\n");
    return 1;
  }
  RingProducer p;
  if (!ring_claim(rig.area.header(), self_tid(), &p)) return 1;
  std::vector<uint8_t> priv(ring_bytes);
  double prod_ns = 1e30, base_ns = 1e30;
  uint64_t failures = 0;
  for (int run = 0; run < 30; ++run) {
    uint64_t t0 = now_ns();
    uint32_t off = 0;
    for (uint32_t i = 0; i < batch; ++i) {
      uint8_t* rec = priv.data() + off;
      uint32_t cpu;
      const uint64_t stamp = stamp_rdpid(&cpu);
      RingRecordHeader h{kPayload, static_cast<uint16_t>(cpu), kRingKindData, 0, stamp};
      memcpy(rec, &h, sizeof h);
      write_payload(reinterpret_cast<uint64_t*>(rec + sizeof h), i);
      off += record_bytes;
      keep(rec);
    }
    double ns = static_cast<double>(now_ns() - t0) / batch;
    if (ns < base_ns) base_ns = ns;

    t0 = now_ns();
    for (uint32_t i = 0; i < batch; ++i) {
      void* rec = ring_reserve(&p, kPayload);
      if (!rec) {
        ++failures;
        continue;
      }
      write_payload(static_cast<uint64_t*>(rec), i);
      ring_commit(&p, kPayload);
    }
    ns = static_cast<double>(now_ns() - t0) / batch;
    if (ns < prod_ns) prod_ns = ns;
    rig.reader.clear();
  }

  const Flow e2e = best_flow(g, n, true, 5);
  const Flow free_run = best_flow(g, n, false, 5);
  const double e2e_rate = e2e.rate();
  const double free_rate = free_run.rate();
  double load = 0;
  if (FILE* la = fopen("/proc/loadavg", "r")) {
    if (fscanf(la, "%lf", &load) != 1) load = 0;
    fclose(la);
  }

  printf("ring buffer: one hot producer thread, one consumer thread (RingMerger + ring_wait)\n");
  printf("record: 16-byte ring header (stamp, CPU) + 32-byte payload (2 u64 args); "
         "ring %u KiB; %llu records per flow run\n\n",
         ring_bytes / 1024, static_cast<unsigned long long>(n));
  printf("%-52s %10s %12s %8s\n", "case", "ns/record", "M records/s", "ratio");
  printf("%-52s %10.2f %12.1f %8s\n", "baseline: same bytes + stamp into a private array",
         base_ns, 1e3 / base_ns, "1.00");
  printf("%-52s %10.2f %12.1f %8.2f\n", "producer alone: reserve + stamp + commit", prod_ns,
         1e3 / prod_ns, prod_ns / base_ns);
  printf("%-52s %10.2f %12.1f %8.2f\n", "consumed end to end (producer waits for room)",
         1e3 / e2e_rate, e2e_rate, (1e3 / e2e_rate) / base_ns);
  printf("%-52s %10.2f %12.1f %8.2f\n", "consumed, free-running producer (drops when full)",
         1e3 / free_rate, free_rate, (1e3 / free_rate) / base_ns);
  printf("%-52s %10.2f %12.1f %8.2f\n", "consumer thread CPU time per record (end to end)",
         e2e.consumer_cpu_ns, 1e3 / e2e.consumer_cpu_ns, e2e.consumer_cpu_ns / base_ns);
  printf("\n%-52s %10.2f\n", "stamp alone: rdtsc + rdpid (the producer's)", rdpid_ns);
  printf("%-52s %10.2f\n", "stamp alone: rdtscp (fallback)", rdtscp_ns);
  printf("\nend to end: %llu consumed, %llu reserve attempts found the ring full "
         "(%llu reported as lost)\n",
         static_cast<unsigned long long>(e2e.consumed),
         static_cast<unsigned long long>(e2e.full),
         static_cast<unsigned long long>(e2e.lost_reported));
  printf("free-running: %llu produced, %llu consumed, %llu dropped (%llu reported as lost before "
         "a later record; the rest come after the ring's last record)\n",
         static_cast<unsigned long long>(free_run.produced),
         static_cast<unsigned long long>(free_run.consumed),
         static_cast<unsigned long long>(free_run.full),
         static_cast<unsigned long long>(free_run.lost_reported));
  printf("target: >= 20 M records/s consumed: %s (end to end %.1f, best of 5 runs; "
         "load average %.2f on %ld CPUs)\n",
         e2e_rate >= 20 ? "met" : "NOT met", e2e_rate, load, sysconf(_SC_NPROCESSORS_ONLN));
  if (failures) printf("(producer-alone batches dropped %llu)\n",
                       static_cast<unsigned long long>(failures));
  return 0;
}
