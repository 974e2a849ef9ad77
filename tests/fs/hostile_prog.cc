// A traced program that attacks the daemon through its own ring area (tests/fs/
// hostile_target_test.cc): beside the records its agent writes for its probe, it claims
// rings of the area itself and commits records no honest agent writes. The area is
// writable by the process (events/ring.h), so this is exactly what any traced program can
// do; the daemon must print only what the process is entitled to and count the rest.
//
// Protocol on stdin/stdout, one line each way:
//   "ready"                          once it runs
//   legit N      -> "ok N"           calls legit(N, "hostile"), the probed function
//   forge VICTIM_TID FOREIGN_ID OWN_ID FIXED LOC_S LOC_T
//                -> "forged K"       commits K forged records (below): VICTIM_TID is a
//                                    thread of another target, FOREIGN_ID an event that
//                                    target holds, OWN_ID this program's own event, whose
//                                    records are FIXED bytes before their strings with
//                                    the __data_loc words of its two strings at LOC_S and
//                                    LOC_T
//   scribble     -> "scribbled"      writes garbage over the mount's control page
//                                    (events/control_page.h): tracing_on, every event's
//                                    soft-disabled byte, every trigger count
#include <sys/prctl.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "events/control_page.h"
#include "events/ring.h"

using namespace probefs::events;

extern "C" [[gnu::noinline]] int legit(int n, const char* s) {
  asm volatile("" ::: "memory");
  return n + static_cast<int>(std::strlen(s));
}

namespace {

// Where the agent mapped the daemon's memfd named `name` (its one mapping), or nullptr.
void* find_mapping(const char* name) {
  FILE* f = std::fopen("/proc/self/maps", "r");
  if (!f) return nullptr;
  char line[512];
  void* at = nullptr;
  while (std::fgets(line, sizeof line, f)) {
    if (!std::strstr(line, name)) continue;
    at = reinterpret_cast<void*>(std::strtoull(line, nullptr, 16));
    break;
  }
  std::fclose(f);
  return at;
}

// The ring area, and the mount's control page, as any target can reach them.
RingAreaHeader* find_area() { return static_cast<RingAreaHeader*>(find_mapping("probefs-ring")); }
ControlPage* find_control() { return static_cast<ControlPage*>(find_mapping("probefs-control")); }

bool scribble() {
  ControlPage* c = find_control();
  if (!c) return false;
  c->magic = 0x12345678;
  for (uint32_t& w : c->tracing_off) w = 0xdeadbeef;
  std::memset(c->reserved, 0xa5, sizeof c->reserved);
  std::memset(c->soft_disabled, 0xff, sizeof c->soft_disabled);
  for (int64_t& n : c->counts) n = -7;
  return true;
}

// Commits `len` bytes of `rec` on `p`'s ring: true when it went in.
bool put(RingProducer* p, const void* rec, uint32_t len) {
  void* at = ring_reserve(p, len);
  if (!at) return false;
  std::memcpy(at, rec, len);
  ring_commit(p, len);
  return true;
}

void header(uint8_t* rec, uint16_t id, int32_t pid) {
  std::memcpy(rec, &id, 2);
  rec[2] = 0x0d;  // irqs-off, need-resched, hardirq: flags no user thread has
  rec[3] = 0x3f;
  std::memcpy(rec + 4, &pid, 4);
  const uint64_t ip = 0x1234;
  std::memcpy(rec + 8, &ip, 8);
}

uint32_t data_loc(uint32_t len, uint32_t off) { return len << 16 | off; }

int forge(uint32_t victim, uint16_t foreign_id, uint16_t own_id, uint32_t fixed, uint32_t loc_s,
          uint32_t loc_t) {
  RingAreaHeader* area = find_area();
  if (!area) return -1;
  const uint32_t self = static_cast<uint32_t>(gettid());
  int n = 0;
  static uint8_t rec[70000];

  // A ring whose owner word names another process's thread: whatever it holds is forged.
  RingProducer as_victim{};
  if (!ring_claim(area, victim, &as_victim)) return -1;
  std::memset(rec, 0, sizeof rec);
  header(rec, own_id, static_cast<int32_t>(victim));
  n += put(&as_victim, rec, fixed);

  // A ring of its own, with records that are not.
  RingProducer mine{};
  if (!ring_claim(area, self, &mine)) return -1;
  // trace_marker's id, naming the victim, its tgid and a name.
  std::memset(rec, 0, sizeof rec);
  header(rec, 0x7FFF, static_cast<int32_t>(victim));  // fs/tracefs.h: kMarkerEventId
  std::memcpy(rec + 8, &victim, 4);
  const uint32_t text_len = 12;
  std::memcpy(rec + 12, &text_len, 4);
  std::memcpy(rec + 16, "victim", 7);
  std::memcpy(rec + 32, "forged mark\n", 12);
  n += put(&mine, rec, 44);
  // Another target's event.
  std::memset(rec, 0, sizeof rec);
  header(rec, foreign_id, static_cast<int32_t>(victim));
  n += put(&mine, rec, 64);
  // Shorter than its own event's fixed part.
  header(rec, own_id, static_cast<int32_t>(victim));
  n += put(&mine, rec, 10);
  // Both strings on the same bytes, each claiming the whole record.
  std::memset(rec, 'A', 4096);
  header(rec, own_id, static_cast<int32_t>(victim));
  uint32_t loc = data_loc(4096 - fixed, fixed);
  std::memcpy(rec + loc_s, &loc, 4);
  std::memcpy(rec + loc_t, &loc, 4);
  n += put(&mine, rec, 4096);
  // A 65,535-byte string in a record that long, and one past the record's end.
  std::memset(rec, 'B', sizeof rec);
  header(rec, own_id, static_cast<int32_t>(victim));
  loc = data_loc(0xFFFF, fixed);
  std::memcpy(rec + loc_s, &loc, 4);
  loc = data_loc(0xFFFF, 0xFFFF);
  std::memcpy(rec + loc_t, &loc, 4);
  n += put(&mine, rec, fixed + 0xFFFF);
  // Its own event, well formed, but naming the victim as the writer: shown, as its own.
  std::memset(rec, 0, sizeof rec);
  header(rec, own_id, static_cast<int32_t>(victim));
  loc = data_loc(5, fixed);
  std::memcpy(rec + loc_s, &loc, 4);
  loc = data_loc(5, fixed + 5);
  std::memcpy(rec + loc_t, &loc, 4);
  std::memcpy(rec + fixed, "fake\0fake", 10);
  n += put(&mine, rec, fixed + 10);

  // Garbage where a record header belongs, in a third ring: the reader skips it.
  RingProducer junk{};
  if (ring_claim(area, self, &junk)) {
    auto* h = reinterpret_cast<RingRecordHeader*>(junk.data);
    h->len = 0xFFFFFFF0u;
    h->kind = 7;
    __atomic_store_n(&junk.ctl->head, 64u, __ATOMIC_RELEASE);
  }
  return n;
}

}  // namespace

int main() {
  setvbuf(stdout, nullptr, _IOLBF, 0);
  std::printf("ready\n");
  char line[256];
  while (std::fgets(line, sizeof line, stdin)) {
    unsigned long a[6] = {};
    if (std::sscanf(line, "legit %lu", &a[0]) == 1) {
      std::printf("ok %d\n", legit(static_cast<int>(a[0]), "hostile") - 7);
    } else if (std::sscanf(line, "forge %lu %lu %lu %lu %lu %lu", &a[0], &a[1], &a[2], &a[3],
                           &a[4], &a[5]) == 6) {
      std::printf("forged %d\n",
                  forge(static_cast<uint32_t>(a[0]), static_cast<uint16_t>(a[1]),
                        static_cast<uint16_t>(a[2]), static_cast<uint32_t>(a[3]),
                        static_cast<uint32_t>(a[4]), static_cast<uint32_t>(a[5])));
    } else if (std::strncmp(line, "scribble", 8) == 0) {
      std::printf(scribble() ? "scribbled\n" : "no page\n");
    } else {
      std::printf("?\n");
    }
  }
  return 0;
}
