// How a record leaves the tracer for a reader (fs/trace_reader.h): the copy with the
// daemon's facts written in, the facts a reader holds, and TraceReader::consume_direct(),
// the path of trace_pipe_raw's pages, compiled with its taker so that each record's
// place(), copy and decision are one stretch of code.
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

#include "events/record.h"
#include "fs/trace_reader.h"
#include "tracee/tracer.h"

namespace probefs::fs {

inline uint64_t key_of(pid_t pid, pid_t tid) {
  return static_cast<uint64_t>(static_cast<uint32_t>(pid)) << 32 | static_cast<uint32_t>(tid);
}

inline uint16_t load16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

// A record's bytes as readers keep them, copied out of the tracer with the facts the
// daemon owns in the copy's header: common_pid is the writing thread the tracer names,
// and a target's flags and preempt count are 0 (a user thread runs with interrupts on,
// outside any kernel context; the agent writes 0 there too). Filters, triggers and lines
// all read the copy, so none of them sees what a process claimed about itself. The
// daemon's own records (pid 0) are kept as written.
inline void copy_to(uint8_t* d, const tracee::TraceRecord& r) {
  if (r.len >= 16 && r.len <= 64) {
    // A record's usual size in 16-byte moves, the last one overlapping: no library call.
    // A byte read twice may differ between the reads (the target's memory); the copy holds
    // one of them, and it is the copy that is checked.
    for (uint32_t i = 0; i + 16 < r.len; i += 16) std::memcpy(d + i, r.data + i, 16);
    std::memcpy(d + r.len - 16, r.data + r.len - 16, 16);
  } else {
    std::memcpy(d, r.data, r.len);
  }
  if (r.pid != 0 && r.len >= 8) {
    d[2] = 0;
    d[3] = 0;
    std::memcpy(d + 4, &r.tid, 4);
  }
}

inline uint32_t copy_record(std::vector<uint8_t>& bytes, const tracee::TraceRecord& r) {
  const size_t off = bytes.size();
  bytes.resize(off + r.len);
  copy_to(bytes.data() + off, r);
  return static_cast<uint32_t>(off);
}

// A record's facts as a reader holds them (its bytes are copied apart).
inline TraceReader::Held held_of(const tracee::TraceRecord& r) {
  TraceReader::Held h;
  h.pid = r.pid;
  h.tid = r.tid;
  h.cpu = r.cpu;
  h.ts = r.ts_ns;
  h.lost_before = r.lost_before;
  h.len = r.len;
  return h;
}

// admit_new() with no scope, for consume_direct(): the event's view is looked up once per
// run of its records.
inline bool TraceReader::admit_quiet(const Held& h, const uint8_t* data, QuietView* last) {
  if (h.len < 8) return false;
  const uint16_t id = load16(data);
  if (id != last->id || !last->view) {
    if (id == kMarkerEventId || id == kMarkerRawEventId) return h.pid == 0;
    // Stack records: nothing held their event back here (no trigger, no scope).
    if (id == events::kKernelStackEventId || id == events::kUserStackEventId)
      return h.pid != 0 && stack_record_fits(id, data, h.len);
    last->id = id;
    last->view = view(id);
    if (!last->view) return false;
  }
  if (events::check_record(last->view->compiled, data, h.len) != events::RecordFault::kFits) {
    if (h.cpu < dropped_events_.size()) ++dropped_events_[h.cpu];
    return false;
  }
  return true;
}

template <class Taker>
size_t TraceReader::consume_direct(Batch* b, size_t max, int cpu, Taker& t,
                                   tracee::Tracer::ReadPass* pass) {
  b->bytes.clear();
  b->recs.clear();
  b->next = 0;
  b->clear_gen = clear_gen_;
  // Decided here, with the tracer's lock held: nothing a reader sets refuses a record.
  ThreadGate* g = nullptr;
  uint64_t g_key = 0;
  QuietView last;
  // The bytes are read where they lie in the target's rings: copied once, into the page
  // (or the Batch), and decided on that copy, which must still be of the event admitted.
  bool refused = false;  // place() refused a record: the rest of its batch go to `b`
  auto take = [&](const tracee::TraceRecord& r) {
    if (r.cpu < read_events_.size()) {
      ++read_events_[r.cpu];
      dropped_events_[r.cpu] += r.lost_before;
    }
    const uint64_t key = key_of(r.pid, r.tid);
    if (!g || key != g_key) {
      g = &gate(key);
      g_key = key;
    }
    Held h = held_of(r);
    uint8_t* to = refused ? nullptr : t.place(h);
    const uint8_t* copy;
    if (to) {
      copy_to(to, r);
      copy = to;
    } else {
      h.off = copy_record(b->bytes, r);
      copy = b->bytes.data() + h.off;
    }
    bool shown;
    if (to && g->consumed == g->decided) {  // nothing decided ahead by a `trace` reader
      ++g->consumed;
      ++g->decided;
      shown = admit_quiet(h, copy, &last);
    } else {
      shown = decide_consumed(*g, h, copy);
    }
    if (shown && r.pid != 0 && load16(copy) != r.id) {  // changed under the copy
      shown = false;
      if (r.cpu < dropped_events_.size()) ++dropped_events_[r.cpu];
    }
    if (!to) {
      h.shown = shown;
      b->recs.push_back(h);
      refused = true;
      return;
    }
    t.placed(h, shown);
  };
  const size_t n = tracer_.consume_records_in_place(
      [&](std::span<const tracee::TraceRecord> recs) {
        for (const tracee::TraceRecord& r : recs) take(r);
        return !refused;
      },
      max, cpu, buffer_, pass);
  prune_idle();
  if (n != 0) takes_.fetch_add(1, std::memory_order_relaxed);
  return n;
}

}  // namespace probefs::fs
