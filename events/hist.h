// Histograms in the target: what a hist trigger computes on a hit, and the tables it
// counts into. The daemon compiles a trigger (fs/hist_trigger.h) into a HistProgram per
// event; the agent runs hist_update() on the hit path, after the record is written and
// before the event's own filter decides whether it is committed, so that a histogram sees
// every hit as the kernel's triggers do; the daemon reads the tables when `hist` is read.
//
// Tables live in one memfd per histogram and traced process ("slot"), made by the daemon
// and mapped by both sides:
//
//   0                    HistControl: written by the daemon only (epoch, paused)
//   kHistControlBytes    table of ring 0, then ring 1, ... every `table_stride` bytes
//
// A thread counts into the table of the ring it records with (its ring index in the
// area), so each table has one writer and an update takes no lock and no atomic
// read-modify-write. A ring that passes to another thread keeps its table: its counts
// are merged with the others' anyway.
//
// A table (HistTableHeader, then 2 x capacity entries, open addressing):
//   entry: u64 tag (0: free; the key's hash | 1 once published), key (key_bytes),
//          u64 hitcount, u64 vals[nvals], [char comm[16] when the program keeps names]
// The writer fills the key (and name) and then stores the tag with release; the daemon
// reads a tag with acquire and then the rest. At most `capacity` entries are taken; a
// new key past that counts in `drops`. Sums are read while they grow: each is one
// aligned 8-byte store, so a reader sees an old or a new value, never a torn one.
//
// Clearing (`:clear`) bumps the control's epoch: the next update of each table sees its
// own epoch behind, zeroes its table and takes the new epoch; the daemon skips tables
// whose epoch is behind (their counts belong to before the clear).
//
// Everything the daemon reads from a table is target-written and hostile (DESIGN.md §8):
// hist_read_table() takes sizes from the daemon's own HistProgram, never from the table,
// and forces names and string keys to end within their bytes.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "events/filter.h"

namespace probefs::events {

// The kernel's limits (tracing_map.h, trace_events_hist.c).
inline constexpr uint32_t kHistMaxKeys = 3;
inline constexpr uint32_t kHistMaxVals = 3;  // hitcount included
inline constexpr uint32_t kHistMaxSortKeys = 2;
inline constexpr uint32_t kHistMinBits = 7;
inline constexpr uint32_t kHistMaxBits = 17;
inline constexpr uint32_t kHistDefaultBits = 11;
// A string key keeps at most this many bytes, NUL included (the kernel's
// MAX_FILTER_STR_VAL).
inline constexpr uint32_t kHistMaxStringKey = 256;
inline constexpr uint32_t kHistMaxKeyBytes = kHistMaxKeys * kHistMaxStringKey;
inline constexpr uint32_t kHistCommBytes = 16;
inline constexpr uint32_t kHistControlBytes = 64;
inline constexpr uint32_t kHistTableHeaderBytes = 64;
// Histograms one process holds tables for at once (slots are numbered below this).
inline constexpr uint32_t kHistMaxSlots = 64;
// Histograms one event runs.
inline constexpr uint32_t kHistMaxPerEvent = 8;

enum class HistSource : uint8_t {
  kNumber,  // a number in the record's fixed part: offset, size, is_signed
  kString,  // a __data_loc string of the record: offset of its u32
  kCpu,     // common_cpu
};

enum class HistTransform : uint8_t {
  kNone,
  kLog2,     // .log2: ilog2 of the value rounded up to a power of two
  kBuckets,  // .buckets=N: the value rounded down to a multiple of N
};

// One key or value of a histogram.
struct HistOperand {
  HistSource source = HistSource::kNumber;
  HistTransform transform = HistTransform::kNone;
  uint8_t size = 8;          // kNumber: 1, 2, 4 or 8
  bool is_signed = false;
  uint32_t offset = 0;       // in the record
  uint32_t key_offset = 0;   // keys: where in the entry's key; numbers take 8 bytes
  uint32_t key_size = 8;     // keys: 8 for numbers, the string's bytes for strings
  uint64_t buckets = 0;      // kBuckets: N > 0
};

// What a hit does for one histogram.
struct HistProgram {
  uint32_t slot = 0;         // the table memfd it counts into (below kHistMaxSlots)
  uint32_t nkeys = 0;
  uint32_t nvals = 0;        // sums besides hitcount
  HistOperand keys[kHistMaxKeys] = {};
  HistOperand vals[kHistMaxVals] = {};
  std::optional<CompiledFilter> filter;  // the trigger's `if`
};

// A slot's geometry: the same for every program that counts into it (a named histogram
// shared by events has one key layout).
struct HistGeometry {
  uint32_t key_bytes = 8;    // a multiple of 8
  uint32_t nvals = 0;        // sums besides hitcount
  uint32_t capacity_bits = kHistDefaultBits;
  bool with_comm = false;    // entries keep the inserting thread's name (.execname)

  uint32_t capacity() const { return 1u << capacity_bits; }
  uint32_t slots() const { return 2u << capacity_bits; }
  // A power of two (an entry never straddles more cache lines than it must, and its
  // address is a shift away from its index).
  uint32_t entry_bytes() const {
    const uint32_t used = 8 + key_bytes + 8 + 8 * nvals + (with_comm ? kHistCommBytes : 0);
    uint32_t b = 32;
    while (b < used) b <<= 1;
    return b;
  }
  uint64_t table_stride() const {
    const uint64_t b = kHistTableHeaderBytes + uint64_t{slots()} * entry_bytes();
    return (b + 4095) & ~uint64_t{4095};
  }
  uint64_t memfd_bytes(uint32_t ring_count) const {
    return kHistControlBytes + uint64_t{ring_count} * table_stride();
  }
  // Equal for equal geometries: what a program and the tables it counts into must share.
  uint64_t signature() const {
    return uint64_t{key_bytes} | uint64_t{nvals} << 16 | uint64_t{capacity_bits} << 24 |
           uint64_t{with_comm} << 32;
  }
};

// What the hit path needs of a geometry, worked out once (SET_HIST), not on every hit.
struct HistShape {
  uint32_t key_bytes = 8;
  uint32_t nvals = 0;
  uint32_t capacity = 0;
  uint32_t mask = 0;         // slots - 1
  uint32_t entry_shift = 0;  // log2(entry_bytes)
  bool with_comm = false;
  uint64_t stride = 0;       // table_stride
  HistShape() = default;
  explicit HistShape(const HistGeometry& g)
      : key_bytes(g.key_bytes),
        nvals(g.nvals),
        capacity(g.capacity()),
        mask(g.slots() - 1),
        entry_shift(static_cast<uint32_t>(__builtin_ctz(g.entry_bytes()))),
        with_comm(g.with_comm),
        stride(g.table_stride()) {}
};

struct HistControl {
  uint32_t epoch;   // bumped by :clear
  uint32_t paused;  // nonzero: updates count nothing (:pause)
  uint32_t reserved[14];
};
static_assert(sizeof(HistControl) == kHistControlBytes);

struct HistTableHeader {
  uint32_t epoch;  // the control's epoch this table's counts belong to
  uint32_t used;   // entries taken
  uint64_t hits;   // updates, dropped ones included
  uint64_t drops;  // updates of a new key into a full table
  uint64_t reserved[5];
};
static_assert(sizeof(HistTableHeader) == kHistTableHeaderBytes);

// ---- the hit path (agent): no allocation, no library call ------------------------------

namespace hist_detail {

inline uint64_t load_number(const uint8_t* rec, const HistOperand& o) {
  switch (o.size) {
    case 1: { const uint8_t v = rec[o.offset]; return o.is_signed ? static_cast<uint64_t>(static_cast<int8_t>(v)) : v; }
    case 2: { uint16_t v; __builtin_memcpy(&v, rec + o.offset, 2); return o.is_signed ? static_cast<uint64_t>(static_cast<int16_t>(v)) : v; }
    case 4: { uint32_t v; __builtin_memcpy(&v, rec + o.offset, 4); return o.is_signed ? static_cast<uint64_t>(static_cast<int32_t>(v)) : v; }
    default: { uint64_t v; __builtin_memcpy(&v, rec + o.offset, 8); return v; }
  }
}

inline uint64_t transform(uint64_t v, const HistOperand& o) {
  switch (o.transform) {
    case HistTransform::kLog2:
      // ilog2(roundup_pow_of_two(v)): 0 and 1 give 0.
      return v <= 1 ? 0 : 64 - static_cast<uint64_t>(__builtin_clzll(v - 1));
    case HistTransform::kBuckets: return v / o.buckets * o.buckets;
    default: return v;
  }
}

// The key's hash: the first two words multiplied by odd constants independently (the
// multiplies overlap) and summed, any further word mixed in after; the high bits folded
// down. Short on the hit's critical path, which runs from the record through the hash to
// the entry's load.
inline uint64_t hash_key(const uint8_t* key, uint32_t key_bytes) {
  uint64_t w0, w1 = 0;
  __builtin_memcpy(&w0, key, 8);
  if (key_bytes > 8) __builtin_memcpy(&w1, key + 8, 8);
  uint64_t h = w0 * 0x9e3779b97f4a7c15ull + (w1 ^ 0x5bd1e995ull) * 0xc2b2ae3d27d4eb4full;
  for (uint32_t i = 16; i < key_bytes; i += 8) {
    uint64_t w;
    __builtin_memcpy(&w, key + i, 8);
    h = (h ^ w) * 0x165667b19e3779f9ull;
    h ^= h >> 29;
  }
  return h ^ (h >> 31);
}

}  // namespace hist_detail

// Builds the key of `p` for a record of `len` bytes: the keys lie side by side, so every
// one of the key_bytes is set (a string's bytes past its end are zeroed).
[[gnu::always_inline]] inline void hist_make_key(const HistProgram& p, const uint8_t* rec, uint32_t len, uint32_t cpu,
                          uint8_t* key) {
  for (uint32_t k = 0; k < p.nkeys; ++k) {
    const HistOperand& o = p.keys[k];
    uint8_t* d = key + o.key_offset;
    if (o.source == HistSource::kString) {
      for (uint32_t i = 0; i < o.key_size; i += 8) {
        asm("" : "+r"(i));
        __builtin_memset(d + i, 0, 8);
      }
      uint32_t loc;
      __builtin_memcpy(&loc, rec + o.offset, 4);
      const uint32_t off = loc & 0xffff, n = loc >> 16;
      if (off > len || n > len - off) continue;  // a record of ours never does this
      const uint32_t cap = o.key_size - 1;
      for (uint32_t i = 0; i < n && i < cap && rec[off + i] != 0; ++i) {
        asm("" : "+r"(i));
        d[i] = rec[off + i];
      }
      continue;
    }
    const uint64_t v = o.source == HistSource::kCpu ? cpu : hist_detail::load_number(rec, o);
    const uint64_t t = hist_detail::transform(v, o);
    __builtin_memcpy(d, &t, 8);
  }
}

// Counts one hit of `p` into `table` (this thread's). `rec` is the record as the event's
// format lays it out, `len` its bytes; `comm_of` fills a new entry's name when the
// geometry keeps names (called at most once). Returns false when the hit was dropped.
template <class CommOf>
[[gnu::always_inline]] inline bool hist_update(const HistProgram& p, const HistShape& g, const HistControl* ctl,
                        uint8_t* table, const uint8_t* rec, uint32_t len, uint32_t cpu,
                        CommOf&& comm_of) {
  if (__atomic_load_n(&ctl->paused, __ATOMIC_RELAXED)) return true;
  auto* h = reinterpret_cast<HistTableHeader*>(table);
  const uint32_t epoch = __atomic_load_n(&ctl->epoch, __ATOMIC_ACQUIRE);
  const uint32_t eshift = g.entry_shift;
  uint8_t* entries = table + kHistTableHeaderBytes;
  if (__builtin_expect(h->epoch != epoch, 0)) {
    // Cleared: tags first (so the reader finds no entry half-zeroed), then the counts.
    for (uint32_t i = 0; i <= g.mask; ++i) {
      asm("" : "+r"(i));
      __atomic_store_n(reinterpret_cast<uint64_t*>(entries + (uint64_t{i} << eshift)), 0, __ATOMIC_RELAXED);
    }
    __atomic_store_n(&h->used, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&h->hits, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&h->drops, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&h->epoch, epoch, __ATOMIC_RELEASE);
  }
  __atomic_store_n(&h->hits, h->hits + 1, __ATOMIC_RELAXED);
  alignas(8) uint8_t key[kHistMaxKeyBytes];
  const uint32_t kb = g.key_bytes;
  hist_make_key(p, rec, len, cpu, key);
  const uint64_t hash = hist_detail::hash_key(key, kb);
  const uint64_t tag = hash | 1;
  const uint32_t mask = g.mask;
  uint32_t at = static_cast<uint32_t>(hash >> 40) & mask;
  uint8_t* e = nullptr;
  for (uint32_t probe = 0; probe <= mask; ++probe, at = (at + 1) & mask) {
    uint8_t* c = entries + (uint64_t{at} << eshift);
    uint64_t ct;
    __builtin_memcpy(&ct, c, 8);
    if (ct == 0) {
      if (h->used >= g.capacity) {
        __atomic_store_n(&h->drops, h->drops + 1, __ATOMIC_RELAXED);
        return false;
      }
      for (uint32_t i = 0; i < kb; i += 8) __builtin_memcpy(c + 8 + i, key + i, 8);
      uint8_t* sums = c + 8 + kb;
      for (uint32_t i = 0; i <= g.nvals; ++i) {
        asm("" : "+r"(i));
        __atomic_store_n(reinterpret_cast<uint64_t*>(sums) + i, 0, __ATOMIC_RELAXED);
      }
      if (g.with_comm) comm_of(reinterpret_cast<char*>(sums + 8 + 8 * g.nvals));
      __atomic_store_n(&h->used, h->used + 1, __ATOMIC_RELAXED);
      __atomic_store_n(reinterpret_cast<uint64_t*>(c), tag, __ATOMIC_RELEASE);
      e = c;
      break;
    }
    if (ct != tag) continue;
    bool same = true;
    for (uint32_t i = 0; i < kb; i += 8) {
      uint64_t a, b;
      __builtin_memcpy(&a, c + 8 + i, 8);
      __builtin_memcpy(&b, key + i, 8);
      if (a != b) {
        same = false;
        break;
      }
    }
    if (same) {
      e = c;
      break;
    }
  }
  if (e == nullptr) {  // every slot was tried: cannot happen below capacity
    __atomic_store_n(&h->drops, h->drops + 1, __ATOMIC_RELAXED);
    return false;
  }
  auto* sums = reinterpret_cast<uint64_t*>(e + 8 + kb);
  __atomic_store_n(&sums[0], sums[0] + 1, __ATOMIC_RELAXED);
  for (uint32_t v = 0; v < p.nvals; ++v) {
    const HistOperand& o = p.vals[v];
    const uint64_t x = hist_detail::transform(
        o.source == HistSource::kCpu ? cpu : hist_detail::load_number(rec, o), o);
    __atomic_store_n(&sums[1 + v], sums[1 + v] + x, __ATOMIC_RELAXED);
  }
  return true;
}

// ---- the daemon: reading tables --------------------------------------------------------

struct HistEntry {
  uint64_t hitcount = 0;
  uint64_t vals[kHistMaxVals] = {};
  std::string comm;     // with_comm: the name of the thread that made the entry
};

struct HistTotals {
  uint64_t hits = 0;
  uint64_t drops = 0;
};

// Adds the entries of every table of a slot's memfd mapping (`base`, `bytes` long) of the
// current epoch to `out` (by key: sums added, the first name kept), and the tables'
// hits and drops to `totals`. Reads at most `ring_count` tables and nothing outside
// [base, base + bytes).
using HistEntries = std::map<std::string, HistEntry>;
void hist_read_tables(const uint8_t* base, uint64_t bytes, uint32_t ring_count,
                      const HistGeometry& g, HistEntries* out, HistTotals* totals);

}  // namespace probefs::events
