// The control page: the state every target of a mount reads at each hit and its triggers
// change at the hit, shared by the daemon and all its targets (one memfd, mapped
// read-write by each agent: CONTROL, events/link.h).
//
//   tracing_off    tracing_on negated, per buffer (0: the top level's, then the instances'
//                  by the buffer number fs gives each): while nonzero no target records
//                  into that buffer (hits still count)
//   soft_disabled  by event id, one bit per buffer: an event in soft mode in a buffer
//                  (it has triggers or histograms there, or an enable_event/disable_event
//                  trigger of that buffer targets it) records nothing into that buffer
//                  while its bit is set; its enable file there reads "0*". Outside soft
//                  mode the bit means nothing and the daemon keeps it 0.
//   counts         the counts of triggers that have one (traceoff:3), by slot: what is
//                  left; a trigger with no count has no slot.
//   snapshot_requests  per buffer, how many snapshot triggers fired there: each wrote a
//                  snapshot request record (events/ring.h) after its event's record, and
//                  the daemon swaps the buffer and its snapshot at that record when it
//                  next reads the buffer (fs/trace_reader.h).
//
// The kernel keeps these in the trace_array and in each event file; here they live in
// shared memory so that a traceoff in one process stops every other at its next hit,
// with no daemon in between and whether anyone reads or not.
//
// Trust (DESIGN.md §8): any target may write any byte of the page. What a hostile target
// can do with it is what it could do with triggers anyway: switch tracing and events of
// this mount on or off, spend counts. The daemon reads the words as plain numbers and
// trusts nothing else of them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>

#include "events/filter.h"
#include "events/ring.h"

namespace probefs::events {

inline constexpr uint32_t kControlMagic = 0x50464354u;  // "TCFP" in memory
inline constexpr uint32_t kControlCountSlots = 4096;
inline constexpr uint32_t kNoCountSlot = UINT32_MAX;

struct ControlPage {
  uint32_t magic;  // kControlMagic, written by the daemon before it hands the page out
  uint32_t reserved[15];
  uint32_t tracing_off[kRingMaxBuffers];  // by buffer; nonzero: its tracing_on is 0
  uint16_t soft_disabled[65536];          // by event id: bit b for buffer b
  int64_t counts[kControlCountSlots];
  uint32_t snapshot_requests[kRingMaxBuffers];  // by buffer
};
static_assert(offsetof(ControlPage, tracing_off) == 64);
static_assert(offsetof(ControlPage, soft_disabled) == 128);
static_assert(kRingMaxBuffers <= 16, "a buffer's soft-disabled bit fits in a u16");
inline constexpr size_t kControlPageBytes = (sizeof(ControlPage) + 4095) & ~size_t{4095};

// What a trigger does when it fires at the hit (SET_HIST carries them to the agents).
enum class TriggerAction : uint8_t {
  kTraceOn = 1,
  kTraceOff = 2,
  kEnableEvent = 3,   // clears the target event's soft-disabled byte
  kDisableEvent = 4,  // sets it
  kStackTrace = 5,    // a kernel_stack record of the thread's stack
  kSnapshot = 6,      // a snapshot request record, and the buffer's request count bumped
};
inline constexpr uint32_t kMaxHitTriggers = 64;  // per event
struct TriggerSpec {
  TriggerAction action = TriggerAction::kTraceOn;
  uint16_t target_event = 0;             // enable_event / disable_event
  uint32_t count_slot = kNoCountSlot;    // its count in the page; none: unlimited
  // The buffer whose trigger file holds it: the tracing_on it switches, the buffer of
  // the target event's soft-disabled bit, where a stacktrace goes.
  uint8_t buffer = 0;
  std::optional<CompiledFilter> filter;  // `if FILTER`, against the event's record
};

// ---- the hit's side: relaxed atomics (a hit racing with a switch may still record, as in
// the kernel) ----

[[gnu::always_inline]] inline bool control_tracing_off(const ControlPage* c, uint32_t buffer = 0) {
  return __atomic_load_n(&c->tracing_off[buffer % kRingMaxBuffers], __ATOMIC_RELAXED) != 0;
}

// Event `id`'s soft-disabled bits, bit b for buffer b.
[[gnu::always_inline]] inline uint16_t control_soft_bits(const ControlPage* c, uint16_t id) {
  return __atomic_load_n(&c->soft_disabled[id], __ATOMIC_RELAXED);
}

[[gnu::always_inline]] inline bool control_soft_disabled(const ControlPage* c, uint16_t id,
                                                         uint32_t buffer = 0) {
  return (control_soft_bits(c, id) >> (buffer % kRingMaxBuffers) & 1) != 0;
}

// Switches tracing of `buffer` (off: true); false when another hit switched it first, or
// it already was.
inline bool control_switch_tracing(ControlPage* c, bool off, uint32_t buffer = 0) {
  uint32_t* word = &c->tracing_off[buffer % kRingMaxBuffers];
  uint32_t current = __atomic_load_n(word, __ATOMIC_RELAXED);
  if ((current != 0) == off) return false;
  return __atomic_compare_exchange_n(word, &current, off ? 1u : 0u, false, __ATOMIC_RELAXED,
                                     __ATOMIC_RELAXED);
}

// Sets event `id`'s soft-disabled bit of `buffer`; false when it already had that value
// (another hit set it first).
inline bool control_switch_soft(ControlPage* c, uint16_t id, bool disabled, uint32_t buffer = 0) {
  const auto bit = static_cast<uint16_t>(1u << (buffer % kRingMaxBuffers));
  uint16_t* word = &c->soft_disabled[id];
  uint16_t expected = __atomic_load_n(word, __ATOMIC_RELAXED);
  for (;;) {
    if (((expected & bit) != 0) == disabled) return false;
    const auto next = static_cast<uint16_t>(disabled ? expected | bit : expected & ~bit);
    if (__atomic_compare_exchange_n(word, &expected, next, true, __ATOMIC_RELAXED,
                                    __ATOMIC_RELAXED))
      return true;
  }
}

// Takes one from count `slot`: true when there was one to take (kNoCountSlot: unlimited).
// A count the daemon set negative, or a target scribbled over, is spent.
inline bool control_take_count(ControlPage* c, uint32_t slot) {
  if (slot == kNoCountSlot) return true;
  if (slot >= kControlCountSlots) return false;
  int64_t v = __atomic_load_n(&c->counts[slot], __ATOMIC_RELAXED);
  do {
    if (v <= 0) return false;
  } while (!__atomic_compare_exchange_n(&c->counts[slot], &v, v - 1, true, __ATOMIC_RELAXED,
                                        __ATOMIC_RELAXED));
  return true;
}

// A snapshot request of `buffer` was written (its record is in the ring): the daemon
// looks for it at its next read of the buffer.
inline void control_request_snapshot(ControlPage* c, uint32_t buffer) {
  __atomic_add_fetch(&c->snapshot_requests[buffer % kRingMaxBuffers], 1, __ATOMIC_RELEASE);
}

inline uint32_t control_snapshot_requests(const ControlPage* c, uint32_t buffer) {
  return __atomic_load_n(&c->snapshot_requests[buffer % kRingMaxBuffers], __ATOMIC_ACQUIRE);
}

// Gives back what control_take_count took, when the switch it was taken for lost a race.
inline void control_give_count(ControlPage* c, uint32_t slot) {
  if (slot < kControlCountSlots) __atomic_add_fetch(&c->counts[slot], 1, __ATOMIC_RELAXED);
}

}  // namespace probefs::events
