// Instantiates the ring producer the way the agent's hit path uses it, so that
// check_ring_hit_path.sh can verify from the machine code that it calls no library
// function and makes no system call but the wake and the membarrier registration
// (DESIGN.md §3).
#include "events/ring.h"

using namespace probefs::events;

extern "C" bool probefs_ring_probe_claim(RingAreaHeader* area, uint32_t tid, RingProducer* p) {
  return ring_claim(area, tid, p);
}

// One hit of an event with two u64 arguments: reserve, write, commit, count.
extern "C" bool probefs_ring_probe_hit(RingProducer* p, uint64_t a, uint64_t b,
                                       uint32_t slot) {
  ring_count_hit(p, slot);
  auto* rec = static_cast<uint64_t*>(ring_reserve(p, 32));
  if (!rec) return false;
  rec[0] = 1;
  rec[1] = 0x401000;
  rec[2] = a;
  rec[3] = b;
  ring_commit(p, 32);
  return true;
}

extern "C" void probefs_ring_probe_unowned(RingAreaHeader* area, uint32_t slot) {
  ring_count_hit_unowned(area, slot);
  ring_count_miss(area, slot);
  ring_drop_unowned(area);
}

// The claimer's name, stored once it has its ring.
extern "C" void probefs_ring_probe_set_comm(RingProducer* p, uint32_t tid,
                                           const char (*comm)[kRingCommBytes]) {
  ring_set_comm(p, tid, *comm);
}

extern "C" bool probefs_ring_probe_retry(const RingAreaHeader* area, const RingProducer* p) {
  return ring_claim_worth_retrying(area, p);
}

extern "C" void probefs_ring_probe_retire(RingProducer* p) { ring_retire(p); }

extern "C" long probefs_ring_probe_register() { return ring_register_producer_process(); }
