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
static_assert(8 * 16 <= kHistMaxStringKey, "a stack key fits where a string key does");
inline constexpr uint32_t kHistCommBytes = 16;
inline constexpr uint32_t kHistControlBytes = 64;
inline constexpr uint32_t kHistTableHeaderBytes = 64;
// Histograms one process holds tables for at once (slots are numbered below this).
inline constexpr uint32_t kHistMaxSlots = 64;
// Histograms one event runs.
inline constexpr uint32_t kHistMaxPerEvent = 8;

enum class HistSource : uint8_t {
  kNumber,     // a number in the record's fixed part: offset, size, is_signed
  kString,     // a __data_loc string of the record: offset of its u32
  kCpu,        // common_cpu
  kTimestamp,  // common_timestamp: the hit's time in ns of the trace clock
  kVar,        // a variable of this histogram, as this hit sets it: offset = its index
  kVarRef,     // $var of another histogram's entry of the same key: offset = ref index
  kConst,      // a number written in the trigger: `value`
  kStack,      // keys: the hit's return addresses (common_stacktrace), kHistStackDepth u64s
};

// The return addresses a stacktrace key keeps (the kernel's HIST_STACKTRACE_DEPTH); a
// shorter stack ends in zeros.
inline constexpr uint32_t kHistStackDepth = 16;
inline constexpr uint32_t kHistStackBytes = 8 * kHistStackDepth;

enum class HistTransform : uint8_t {
  kNone,
  kLog2,     // .log2: ilog2 of the value rounded up to a power of two
  kBuckets,  // .buckets=N: the value rounded down to a multiple of N
  kUsecs,    // .usecs: ns to microseconds
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
  uint64_t value = 0;        // kConst
};

// Inter-event histograms (histogram.rst 2.2): variables, references and actions.
inline constexpr uint32_t kHistMaxVars = 8;      // per histogram
inline constexpr uint32_t kHistMaxVarRefs = 4;   // $vars of other histograms, per histogram
inline constexpr uint32_t kHistMaxParams = 8;    // fields an action's synthetic event gets

enum class HistOp : uint8_t { kNone, kAdd, kSub, kMul, kDiv };

// A variable's value on each hit: `a` or `a OP b` (u64 arithmetic; a division by 0 gives
// all ones, the kernel's -1).
struct HistExpr {
  HistOperand a;
  HistOperand b;
  HistOp op = HistOp::kNone;
};

// onmatch(...).trace(SYNTH, params): when every reference resolved, a record of the
// synthetic event `synth_id` with param i in the field at param_offset[i], its low
// param_size[i] bytes (1, 2, 4 or 8).
struct HistAction {
  uint16_t synth_id = 0;  // 0: none
  uint32_t nparams = 0;
  HistOperand params[kHistMaxParams] = {};
  uint32_t param_offset[kHistMaxParams] = {};
  uint8_t param_size[kHistMaxParams] = {};
};

// onmax($VAR) / onchange($VAR): the variable `var` of this histogram is tracked per entry;
// when a hit's value passes (above the entry's maximum, or different from its last value)
// the entry keeps it with the hit's fields `save[]` (.save(...)), and the program's
// action fires (onmax(...).trace(...)) if `fires`; otherwise that action does not fire.
enum class HistTrackKind : uint8_t { kNone, kMax, kChange };

struct HistTrack {
  HistTrackKind kind = HistTrackKind::kNone;
  bool fires = false;        // the program's action is this handler's
  uint32_t var = 0;          // this histogram's variable
  uint32_t nsave = 0;
  HistOperand save[kHistMaxParams] = {};
};

// A slot's geometry: the same for every program that counts into it (a named histogram
// shared by events has one key layout).
struct HistGeometry {
  uint32_t key_bytes = 8;    // a multiple of 8
  uint32_t nvals = 0;        // sums besides hitcount
  uint32_t capacity_bits = kHistDefaultBits;
  bool with_comm = false;    // entries keep the inserting thread's name (.execname)
  uint32_t nvars = 0;        // variables (kHistMaxVars at most)
  // onmax/onchange: how entries compare tracked values, and how many hit fields they keep
  // with them (the block: u64 when, u64 value, u64 saved[nsave]; when 0: never tracked).
  HistTrackKind track = HistTrackKind::kNone;
  uint32_t nsave = 0;        // kHistMaxParams at most

  uint32_t capacity() const { return 1u << capacity_bits; }
  uint32_t slots() const { return 2u << capacity_bits; }
  // A power of two (an entry never straddles more cache lines than it must, and its
  // address is a shift away from its index).
  uint32_t entry_bytes() const {
    const uint32_t used = 8 + key_bytes + 8 + 8 * nvals + vars_bytes() + track_bytes() +
                          (with_comm ? kHistCommBytes : 0);
    uint32_t b = 32;
    while (b < used) b <<= 1;
    return b;
  }
  // Where an entry keeps its variables: a u64 of which are set, then one u64 each.
  uint32_t vars_offset() const { return 8 + key_bytes + 8 + 8 * nvals; }
  uint32_t vars_bytes() const { return nvars ? 8 + 8 * nvars : 0; }
  uint32_t track_offset() const { return vars_offset() + vars_bytes(); }
  uint32_t track_bytes() const { return track != HistTrackKind::kNone ? 16 + 8 * nsave : 0; }
  uint32_t comm_offset() const { return track_offset() + track_bytes(); }
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
           uint64_t{with_comm} << 32 | uint64_t{nvars} << 40 |
           uint64_t{static_cast<uint8_t>(track)} << 48 | uint64_t{nsave} << 52;
  }
};

// $var of another histogram: the entry of this hit's key in that histogram's table of
// this thread's ring (so a variable is seen by later hits of the same thread), its
// variable `var`. The slot has the same key bytes (`geometry` is its geometry).
struct HistVarRef {
  uint32_t slot = 0;
  uint32_t var = 0;
  HistGeometry geometry;
};

// The trace clock as a function of the TSC, for common_timestamp in the target:
// ns = anchor_ns + ((tsc - anchor_tsc) * mult >> 32). mult 0: no clock (timestamps 0).
struct HistClock {
  uint64_t anchor_tsc = 0;
  uint64_t anchor_ns = 0;
  uint64_t mult = 0;
  uint64_t ns(uint64_t tsc) const {
    const auto d = static_cast<unsigned __int128>(tsc - anchor_tsc) * mult;
    return anchor_ns + static_cast<uint64_t>(d >> 32);
  }
};

// What a hit does for one histogram.
struct HistProgram {
  uint32_t slot = 0;         // the table memfd it counts into (below kHistMaxSlots)
  uint32_t nkeys = 0;
  uint32_t nvals = 0;        // sums besides hitcount
  HistOperand keys[kHistMaxKeys] = {};
  HistOperand vals[kHistMaxVals] = {};
  std::optional<CompiledFilter> filter;  // the trigger's `if`
  // Inter-event: variables set on each hit, references read (and consumed) from other
  // histograms' entries, an action run when they all resolved.
  uint32_t nvars = 0;
  HistExpr vars[kHistMaxVars] = {};
  uint32_t nrefs = 0;
  HistVarRef refs[kHistMaxVarRefs] = {};
  HistAction action;
  HistTrack track;

  // Whether the hit path must take hist_update_inter: variables, references, an action,
  // or a value hist_update does not compute (a timestamp, a variable, a constant).
  // Whether a key is the hit's stack (the hit path then walks it first).
  bool wants_stack() const {
    for (uint32_t k = 0; k < nkeys && k < kHistMaxKeys; ++k)
      if (keys[k].source == HistSource::kStack) return true;
    return false;
  }

  bool inter_event() const {
    if (nvars || nrefs || action.synth_id || track.kind != HistTrackKind::kNone) return true;
    for (uint32_t v = 0; v < nvals && v < kHistMaxVals; ++v)
      if (vals[v].source >= HistSource::kTimestamp || vals[v].transform == HistTransform::kUsecs)
        return true;
    return false;
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
  uint32_t nvars = 0;
  uint32_t vars_offset = 0;  // in an entry
  uint32_t track_offset = 0;
  uint32_t nsave = 0;        // saved fields of a tracking geometry
  bool track = false;
  uint32_t comm_offset = 0;
  uint64_t stride = 0;       // table_stride
  HistShape() = default;
  explicit HistShape(const HistGeometry& g)
      : key_bytes(g.key_bytes),
        nvals(g.nvals),
        capacity(g.capacity()),
        mask(g.slots() - 1),
        entry_shift(static_cast<uint32_t>(__builtin_ctz(g.entry_bytes()))),
        with_comm(g.with_comm),
        nvars(g.nvars),
        vars_offset(g.vars_offset()),
        track_offset(g.track_offset()),
        nsave(g.nsave),
        track(g.track != HistTrackKind::kNone),
        comm_offset(g.comm_offset()),
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
  if (__builtin_expect(o.size == 8, 1)) {  // most fields: one load, no jump table
    uint64_t v;
    __builtin_memcpy(&v, rec + o.offset, 8);
    return v;
  }
  switch (o.size) {
    case 1: { const uint8_t v = rec[o.offset]; return o.is_signed ? static_cast<uint64_t>(static_cast<int8_t>(v)) : v; }
    case 2: { uint16_t v; __builtin_memcpy(&v, rec + o.offset, 2); return o.is_signed ? static_cast<uint64_t>(static_cast<int16_t>(v)) : v; }
    case 4: { uint32_t v; __builtin_memcpy(&v, rec + o.offset, 4); return o.is_signed ? static_cast<uint64_t>(static_cast<int32_t>(v)) : v; }
    default: { uint64_t v; __builtin_memcpy(&v, rec + o.offset, 8); return v; }
  }
}

inline uint64_t transform(uint64_t v, const HistOperand& o) {
  if (o.transform == HistTransform::kNone) return v;  // no jump table for the usual case
  switch (o.transform) {
    case HistTransform::kLog2:
      // ilog2(roundup_pow_of_two(v)): 0 and 1 give 0.
      return v <= 1 ? 0 : 64 - static_cast<uint64_t>(__builtin_clzll(v - 1));
    case HistTransform::kBuckets: return v / o.buckets * o.buckets;
    case HistTransform::kUsecs: return v / 1000;
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
// one of the key_bytes is set (a string's bytes past its end are zeroed). `stack` is the
// hit's stack (kHistStackDepth return addresses, zero past its end) for a stacktrace key,
// or null (the key is then all zeros).
[[gnu::always_inline]] inline void hist_make_key(const HistProgram& p, const uint8_t* rec, uint32_t len, uint32_t cpu,
                          const uint64_t* stack, uint8_t* key) {
  for (uint32_t k = 0; k < p.nkeys; ++k) {
    const HistOperand& o = p.keys[k];
    uint8_t* d = key + o.key_offset;
    if (o.source == HistSource::kStack) {
      for (uint32_t i = 0; i < kHistStackDepth; ++i) {
        asm("" : "+r"(i));
        const uint64_t v = stack != nullptr ? stack[i] : 0;
        __builtin_memcpy(d + 8 * i, &v, 8);
      }
      continue;
    }
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

namespace hist_detail {

// The table as of the control's epoch: a table still of an earlier epoch (a :clear
// since) is emptied first, tags before counts, so a reader never finds an entry
// half-zeroed.
[[gnu::always_inline]] inline void settle_epoch(const HistShape& g, const HistControl* ctl,
                                                uint8_t* table) {
  auto* h = reinterpret_cast<HistTableHeader*>(table);
  const uint32_t epoch = __atomic_load_n(&ctl->epoch, __ATOMIC_ACQUIRE);
  if (__builtin_expect(h->epoch == epoch, 1)) return;
  uint8_t* entries = table + kHistTableHeaderBytes;
  for (uint32_t i = 0; i <= g.mask; ++i) {
    asm("" : "+r"(i));
    __atomic_store_n(reinterpret_cast<uint64_t*>(entries + (uint64_t{i} << g.entry_shift)), 0,
                     __ATOMIC_RELAXED);
  }
  __atomic_store_n(&h->used, 0, __ATOMIC_RELAXED);
  __atomic_store_n(&h->hits, 0, __ATOMIC_RELAXED);
  __atomic_store_n(&h->drops, 0, __ATOMIC_RELAXED);
  __atomic_store_n(&h->epoch, epoch, __ATOMIC_RELEASE);
}

[[gnu::always_inline]] inline bool same_key(const uint8_t* entry, const uint8_t* key,
                                            uint32_t kb) {
  for (uint32_t i = 0; i < kb; i += 8) {
    uint64_t a, b;
    __builtin_memcpy(&a, entry + 8 + i, 8);
    __builtin_memcpy(&b, key + i, 8);
    if (a != b) return false;
  }
  return true;
}

// The entry of `key` (hash `hash`) in `table`, made when there is none and room; nullptr
// when the table is full (the drop counted).
template <class CommOf>
[[gnu::always_inline]] inline uint8_t* find_or_insert(const HistShape& g, uint8_t* table,
                                                      const uint8_t* key, uint64_t hash,
                                                      CommOf&& comm_of) {
  auto* h = reinterpret_cast<HistTableHeader*>(table);
  uint8_t* entries = table + kHistTableHeaderBytes;
  const uint32_t kb = g.key_bytes;
  const uint64_t tag = hash | 1;
  const uint32_t mask = g.mask;
  uint32_t at = static_cast<uint32_t>(hash >> 40) & mask;
  for (uint32_t probe = 0; probe <= mask; ++probe, at = (at + 1) & mask) {
    uint8_t* c = entries + (uint64_t{at} << g.entry_shift);
    uint64_t ct;
    __builtin_memcpy(&ct, c, 8);
    if (ct == 0) {
      if (h->used >= g.capacity) break;
      for (uint32_t i = 0; i < kb; i += 8) __builtin_memcpy(c + 8 + i, key + i, 8);
      uint8_t* sums = c + 8 + kb;
      for (uint32_t i = 0; i <= g.nvals; ++i) {
        asm("" : "+r"(i));
        __atomic_store_n(reinterpret_cast<uint64_t*>(sums) + i, 0, __ATOMIC_RELAXED);
      }
      if (g.nvars) __atomic_store_n(reinterpret_cast<uint64_t*>(c + g.vars_offset), 0, __ATOMIC_RELAXED);
      if (g.track) {
        // The whole block: an entry never tracked reads 0 everywhere, as the kernel's.
        for (uint32_t i = 0; i < 2 + g.nsave; ++i) {
          asm("" : "+r"(i));
          __atomic_store_n(reinterpret_cast<uint64_t*>(c + g.track_offset) + i, 0, __ATOMIC_RELAXED);
        }
      }
      if (g.with_comm) comm_of(reinterpret_cast<char*>(c + g.comm_offset));
      __atomic_store_n(&h->used, h->used + 1, __ATOMIC_RELAXED);
      __atomic_store_n(reinterpret_cast<uint64_t*>(c), tag, __ATOMIC_RELEASE);
      return c;
    }
    if (ct == tag && same_key(c, key, kb)) return c;
  }
  // Full (every slot tried cannot happen below capacity): a dropped hit.
  __atomic_store_n(&h->drops, h->drops + 1, __ATOMIC_RELAXED);
  return nullptr;
}

// The entry of `key` in `table` if there is one (no entry is made).
[[gnu::always_inline]] inline uint8_t* find(const HistShape& g, uint8_t* table,
                                            const uint8_t* key, uint64_t hash) {
  uint8_t* entries = table + kHistTableHeaderBytes;
  const uint64_t tag = hash | 1;
  uint32_t at = static_cast<uint32_t>(hash >> 40) & g.mask;
  for (uint32_t probe = 0; probe <= g.mask; ++probe, at = (at + 1) & g.mask) {
    uint8_t* c = entries + (uint64_t{at} << g.entry_shift);
    uint64_t ct;
    __builtin_memcpy(&ct, c, 8);
    if (ct == 0) return nullptr;
    if (ct == tag && same_key(c, key, g.key_bytes)) return c;
  }
  return nullptr;
}

}  // namespace hist_detail

// Counts one hit of `p` into `table` (this thread's). `rec` is the record as the event's
// format lays it out, `len` its bytes; `comm_of` fills a new entry's name when the
// geometry keeps names (called at most once). Returns false when the hit was dropped.
// For programs without variables, references or actions (hist_update_inter has those).
template <class CommOf>
[[gnu::always_inline]] inline bool hist_update(const HistProgram& p, const HistShape& g, const HistControl* ctl,
                        uint8_t* table, const uint8_t* rec, uint32_t len, uint32_t cpu,
                        const uint64_t* stack, CommOf&& comm_of) {
  if (__atomic_load_n(&ctl->paused, __ATOMIC_RELAXED)) return true;
  auto* h = reinterpret_cast<HistTableHeader*>(table);
  hist_detail::settle_epoch(g, ctl, table);
  __atomic_store_n(&h->hits, h->hits + 1, __ATOMIC_RELAXED);
  alignas(8) uint8_t key[kHistMaxKeyBytes];
  hist_make_key(p, rec, len, cpu, stack, key);
  const uint64_t hash = hist_detail::hash_key(key, g.key_bytes);
  uint8_t* e = hist_detail::find_or_insert(g, table, key, hash, comm_of);
  if (e == nullptr) return false;
  auto* sums = reinterpret_cast<uint64_t*>(e + 8 + g.key_bytes);
  __atomic_store_n(&sums[0], sums[0] + 1, __ATOMIC_RELAXED);
  for (uint32_t v = 0; v < p.nvals; ++v) {
    const HistOperand& o = p.vals[v];
    const uint64_t x = hist_detail::transform(
        o.source == HistSource::kCpu ? cpu : hist_detail::load_number(rec, o), o);
    __atomic_store_n(&sums[1 + v], sums[1 + v] + x, __ATOMIC_RELAXED);
  }
  return true;
}

// The number of keys and values hist_update_numbers takes a program with (numbers_form).
inline constexpr uint32_t kHistNumbersMaxKeys = 2;
inline constexpr uint32_t kHistNumbersMaxVals = 2;

// 0, or (keys << 4 | values) when hist_update_numbers can count `p` into tables of `g`:
// one or two number keys, side by side from the key's start, and up to two number
// values (the usual histogram: keys=a,b:vals=c).
inline uint32_t hist_numbers_form(const HistProgram& p, const HistShape& g) {
  if (p.nkeys == 0 || p.nkeys > kHistNumbersMaxKeys || p.nvals > kHistNumbersMaxVals ||
      g.key_bytes != 8 * p.nkeys || g.nvals != p.nvals || g.nvars != 0 || g.track || g.with_comm)
    return 0;
  for (uint32_t k = 0; k < p.nkeys; ++k)
    if (p.keys[k].source != HistSource::kNumber || p.keys[k].key_offset != 8 * k) return 0;
  for (uint32_t v = 0; v < p.nvals; ++v)
    if (p.vals[v].source != HistSource::kNumber) return 0;
  return p.nkeys << 4 | p.nvals;
}

// hist_update for a program of hist_numbers_form() (NK << 4 | NV): the same counts in the
// same entries, with the operands' count known when compiled: the keys are made in
// registers, hashed and compared without a pass over the program per hit.
template <uint32_t NK, uint32_t NV>
[[gnu::always_inline]] inline bool hist_update_numbers(const HistProgram& p, const HistShape& g,
                                                       const HistControl* ctl, uint8_t* table,
                                                       const uint8_t* rec) {
  static_assert(NK >= 1 && NK <= kHistNumbersMaxKeys && NV <= kHistNumbersMaxVals);
  if (__atomic_load_n(&ctl->paused, __ATOMIC_RELAXED)) return true;
  auto* h = reinterpret_cast<HistTableHeader*>(table);
  hist_detail::settle_epoch(g, ctl, table);
  __atomic_store_n(&h->hits, h->hits + 1, __ATOMIC_RELAXED);
  alignas(8) uint64_t key[NK];
  for (uint32_t k = 0; k < NK; ++k)
    key[k] = hist_detail::transform(hist_detail::load_number(rec, p.keys[k]), p.keys[k]);
  const auto* kb = reinterpret_cast<const uint8_t*>(key);
  const uint64_t hash = hist_detail::hash_key(kb, 8 * NK);
  uint8_t* e = hist_detail::find_or_insert(g, table, kb, hash, [](char*) {});
  if (e == nullptr) return false;
  auto* sums = reinterpret_cast<uint64_t*>(e + 8 + 8 * NK);
  __atomic_store_n(&sums[0], sums[0] + 1, __ATOMIC_RELAXED);
  for (uint32_t v = 0; v < NV; ++v) {
    const uint64_t x = hist_detail::transform(hist_detail::load_number(rec, p.vals[v]), p.vals[v]);
    __atomic_store_n(&sums[1 + v], sums[1 + v] + x, __ATOMIC_RELAXED);
  }
  return true;
}

// A synthetic event an action asks for: its id and its fields' values, in order. Left
// uninitialized by its constructor (the hit path makes room for several per hit).
struct HistFired {
  uint16_t synth_id;
  uint32_t nparams;
  const HistAction* action;  // where the values go
  uint64_t params[kHistMaxParams];
};

// The tables a program's references read: for reference i, the referenced histogram's
// table of this thread's ring and its shape, or a null table when the target has none.
// Plain (no initializers): the hit path fills only the references a program has.
struct HistRefTable {
  uint8_t* table;
  const HistControl* ctl;
  const HistShape* shape;
};

namespace hist_detail {

// A hit's values: vars[i] is set before anything reads it (a variable reads only those
// before it; a read past them finds garbage, never memory outside), refs[r] for r below
// the program's references. Left uninitialized: zeroing them costs the hit.
struct InterValues {
  uint64_t now;  // the hit's time, ns
  uint32_t cpu;
  uint64_t vars[kHistMaxVars];
  uint64_t refs[kHistMaxVarRefs];
};

inline uint64_t value_of(const HistOperand& o, const uint8_t* rec, const InterValues& iv) {
  uint64_t v;
  switch (o.source) {
    case HistSource::kCpu: v = iv.cpu; break;
    case HistSource::kTimestamp: v = iv.now; break;
    case HistSource::kVar: v = iv.vars[o.offset % kHistMaxVars]; break;
    case HistSource::kVarRef: v = iv.refs[o.offset % kHistMaxVarRefs]; break;
    case HistSource::kConst: v = o.value; break;
    default: v = load_number(rec, o); break;
  }
  return transform(v, o);
}

inline uint64_t value_of(const HistExpr& x, const uint8_t* rec, const InterValues& iv) {
  const uint64_t a = value_of(x.a, rec, iv);
  switch (x.op) {
    case HistOp::kAdd: return a + value_of(x.b, rec, iv);
    case HistOp::kSub: return a - value_of(x.b, rec, iv);
    case HistOp::kMul: return a * value_of(x.b, rec, iv);
    case HistOp::kDiv: {
      const uint64_t b = value_of(x.b, rec, iv);
      return b == 0 ? ~uint64_t{0} : a / b;
    }
    default: return a;
  }
}

}  // namespace hist_detail

// hist_update for a program with variables, references or an action, as the kernel's
// event_hist_trigger: while a reference has no value for this hit's key (its variable
// unset, or no entry) nothing is counted; then the entry is updated, this program's
// variables set, the referenced variables consumed (read once), and the action, if any,
// filled into *fired (fired->synth_id stays 0 otherwise). `now_ns` is the hit's time;
// `refs[i]` the table of reference i. Returns false when the hit was dropped.
template <class CommOf>
inline bool hist_update_inter(const HistProgram& p, const HistShape& g, const HistControl* ctl,
                              uint8_t* table, const uint8_t* rec, uint32_t len, uint32_t cpu,
                              const uint64_t* stack, uint64_t now_ns, const HistRefTable* refs,
                              CommOf&& comm_of, HistFired* fired) {
  if (__atomic_load_n(&ctl->paused, __ATOMIC_RELAXED)) return true;
  auto* h = reinterpret_cast<HistTableHeader*>(table);
  hist_detail::settle_epoch(g, ctl, table);
  alignas(8) uint8_t key[kHistMaxKeyBytes];
  hist_make_key(p, rec, len, cpu, stack, key);
  const uint64_t hash = hist_detail::hash_key(key, g.key_bytes);
  hist_detail::InterValues iv;
  iv.now = now_ns;
  iv.cpu = cpu;
  uint64_t* ref_sets[kHistMaxVarRefs] = {};
  for (uint32_t r = 0; r < p.nrefs && r < kHistMaxVarRefs; ++r) {
    const HistRefTable& t = refs[r];
    if (t.table == nullptr || t.shape->key_bytes != g.key_bytes || p.refs[r].var >= t.shape->nvars)
      return true;
    // A referenced table of an earlier epoch holds nothing of now.
    const auto* rh = reinterpret_cast<const HistTableHeader*>(t.table);
    if (__atomic_load_n(&rh->epoch, __ATOMIC_RELAXED) !=
        __atomic_load_n(&t.ctl->epoch, __ATOMIC_ACQUIRE))
      return true;
    uint8_t* e = hist_detail::find(*t.shape, t.table, key, hash);
    if (e == nullptr) return true;
    auto* set = reinterpret_cast<uint64_t*>(e + t.shape->vars_offset);
    if (!(*set >> p.refs[r].var & 1)) return true;
    iv.refs[r] = set[1 + p.refs[r].var];
    ref_sets[r] = set;
  }
  __atomic_store_n(&h->hits, h->hits + 1, __ATOMIC_RELAXED);
  uint8_t* e = hist_detail::find_or_insert(g, table, key, hash, comm_of);
  if (e == nullptr) return false;
  for (uint32_t v = 0; v < p.nvars && v < kHistMaxVars; ++v)
    iv.vars[v] = hist_detail::value_of(p.vars[v], rec, iv);
  auto* sums = reinterpret_cast<uint64_t*>(e + 8 + g.key_bytes);
  __atomic_store_n(&sums[0], sums[0] + 1, __ATOMIC_RELAXED);
  for (uint32_t v = 0; v < p.nvals; ++v)
    __atomic_store_n(&sums[1 + v], sums[1 + v] + hist_detail::value_of(p.vals[v], rec, iv),
                     __ATOMIC_RELAXED);
  if (p.nvars && p.nvars <= g.nvars) {
    auto* set = reinterpret_cast<uint64_t*>(e + g.vars_offset);
    for (uint32_t v = 0; v < p.nvars; ++v) __atomic_store_n(&set[1 + v], iv.vars[v], __ATOMIC_RELAXED);
    __atomic_store_n(set, *set | ((uint64_t{1} << p.nvars) - 1), __ATOMIC_RELAXED);
  }
  for (uint32_t r = 0; r < p.nrefs && r < kHistMaxVarRefs; ++r)
    __atomic_store_n(ref_sets[r], *ref_sets[r] & ~(uint64_t{1} << p.refs[r].var), __ATOMIC_RELAXED);
  bool passed = false;
  if (p.track.kind != HistTrackKind::kNone && g.track && p.track.nsave <= g.nsave) {
    auto* block = reinterpret_cast<uint64_t*>(e + g.track_offset);
    const uint64_t v = iv.vars[p.track.var % kHistMaxVars];
    passed = p.track.kind == HistTrackKind::kMax ? v > block[1] : v != block[1];
    if (passed) {
      __atomic_store_n(&block[1], v, __ATOMIC_RELAXED);
      for (uint32_t i = 0; i < p.track.nsave && i < kHistMaxParams; ++i)
        __atomic_store_n(&block[2 + i], hist_detail::value_of(p.track.save[i], rec, iv),
                         __ATOMIC_RELAXED);
      __atomic_store_n(&block[0], now_ns | 1, __ATOMIC_RELAXED);
    }
  }
  if (p.action.synth_id != 0 && (!p.track.fires || passed)) {
    fired->synth_id = p.action.synth_id;
    fired->action = &p.action;
    fired->nparams = p.action.nparams < kHistMaxParams ? p.action.nparams : kHistMaxParams;
    for (uint32_t i = 0; i < fired->nparams; ++i)
      fired->params[i] = hist_detail::value_of(p.action.params[i], rec, iv);
  }
  return true;
}

// ---- the daemon: reading tables --------------------------------------------------------

struct HistEntry {
  uint64_t hitcount = 0;
  uint64_t vals[kHistMaxVals] = {};
  std::string comm;     // with_comm: the name of the thread that made the entry
  // A tracking geometry: the tracked value and the fields kept with it, of the table
  // whose value wins (the largest for onmax, the latest for onchange); 0 when untracked.
  uint64_t track_when = 0;
  uint64_t track_value = 0;
  uint64_t saved[kHistMaxParams] = {};
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
