// The daemon's side of the histogram tables (events/hist.h): reading them, as hostile
// memory written by a traced process.
#include "events/hist.h"

#include <cstring>

namespace probefs::events {

void hist_read_tables(const uint8_t* base, uint64_t bytes, uint32_t ring_count,
                      const HistGeometry& g, HistEntries* out, HistTotals* totals) {
  if (base == nullptr || bytes < g.memfd_bytes(ring_count)) return;
  const auto* ctl = reinterpret_cast<const HistControl*>(base);
  const uint32_t epoch = __atomic_load_n(&ctl->epoch, __ATOMIC_ACQUIRE);
  const uint32_t eb = g.entry_bytes();
  const uint32_t kb = g.key_bytes;
  for (uint32_t r = 0; r < ring_count; ++r) {
    const uint8_t* table = base + kHistControlBytes + uint64_t{r} * g.table_stride();
    const auto* h = reinterpret_cast<const HistTableHeader*>(table);
    if (__atomic_load_n(&h->epoch, __ATOMIC_ACQUIRE) != epoch) continue;
    totals->hits += __atomic_load_n(&h->hits, __ATOMIC_RELAXED);
    totals->drops += __atomic_load_n(&h->drops, __ATOMIC_RELAXED);
    if (__atomic_load_n(&h->used, __ATOMIC_RELAXED) == 0) continue;
    const uint8_t* entries = table + kHistTableHeaderBytes;
    uint32_t seen = 0;  // a writer never takes more than capacity(); a table that says so lies
    for (uint32_t i = 0, n = g.slots(); i < n && seen < g.capacity(); ++i) {
      const uint8_t* e = entries + uint64_t{i} * eb;
      if (__atomic_load_n(reinterpret_cast<const uint64_t*>(e), __ATOMIC_ACQUIRE) == 0) continue;
      ++seen;
      const auto* sums = reinterpret_cast<const uint64_t*>(e + 8 + kb);
      std::string key(reinterpret_cast<const char*>(e + 8), kb);
      auto found = out->find(key);
      if (found == out->end() && out->size() >= g.capacity()) {
        // The histogram holds `size` keys at most, as the kernel's map: the hits of a key
        // past that are dropped ones.
        totals->drops += __atomic_load_n(&sums[0], __ATOMIC_RELAXED);
        continue;
      }
      const bool fresh = found == out->end();
      if (fresh) found = out->emplace(std::move(key), HistEntry{}).first;
      HistEntry& dst = found->second;
      dst.hitcount += __atomic_load_n(&sums[0], __ATOMIC_RELAXED);
      for (uint32_t v = 0; v < g.nvals && v < kHistMaxVals; ++v)
        dst.vals[v] += __atomic_load_n(&sums[1 + v], __ATOMIC_RELAXED);
      if (g.track != HistTrackKind::kNone && g.nsave <= kHistMaxParams) {
        const auto* block = reinterpret_cast<const uint64_t*>(e + g.track_offset());
        const uint64_t when = __atomic_load_n(&block[0], __ATOMIC_RELAXED);
        const uint64_t value = __atomic_load_n(&block[1], __ATOMIC_RELAXED);
        const bool wins = dst.track_when == 0 ||
                          (g.track == HistTrackKind::kMax ? value > dst.track_value
                                                          : when > dst.track_when);
        if (when != 0 && wins) {
          dst.track_when = when;
          dst.track_value = value;
          for (uint32_t i = 0; i < g.nsave; ++i)
            dst.saved[i] = __atomic_load_n(&block[2 + i], __ATOMIC_RELAXED);
        }
      }
      if (fresh && g.with_comm) {
        const char* c = reinterpret_cast<const char*>(e + g.comm_offset());
        dst.comm.assign(c, strnlen(c, kHistCommBytes - 1));
      }
    }
  }
}

}  // namespace probefs::events
