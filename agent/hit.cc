// The hit path of the agent: the handlers probecore runs when a probe of the daemon's
// fires in this process. Each finds the thread's ring, reserves room for the largest
// record its program can write, runs the fetch program (events/fetch.h) into it, applies
// the event's filter and commits or drops the record; each counts the hit for
// kprobe_profile, first, so that a hit counts while tracing_on is 0 (the area's
// record_disabled, checked before the reservation) and nothing is recorded.
//
// A hit the engine did not hand to the probe (nmissed: inside another handler, a return
// probe out of instances) counts in the area's shared misses, as it happens.
//
// Built -O2 -mgeneral-regs-only, never instrumented, and calling no library function
// (DESIGN.md §3; tests/agent/check_hit_path.sh checks this object): probes may sit on any
// libc function, and the detours of probes whose handlers all promise KPROBE_FLAG_GPR_ONLY
// save no vector registers.
//
// Thread state lives in one initial-exec TLS block, t_ring (the agent is dlopen'ed at
// attach: its static TLS comes from the small surplus glibc keeps for that):
//   prod  the ring this thread claimed in the area of generation `gen`
//   tid   the thread id it claimed it with
//   gen   that area's generation; a new area (SETUP, fork) makes the thread claim again
//   inst  the rings it claimed in that area for the instances' buffers, by buffer (the
//         ring's index + 1; 0: none yet), claimed at its first record into each
//
// A vfork child, and posix_spawn's (a clone that shares memory and runs until it execs),
// runs on its parent thread's TLS and thread descriptor: the fast path would take it for
// the parent. While such a child may run, the thread is in a window (the spawn guards
// open and close it, spawn_guard.cc): its gen is kSharedTlsGen, so every hit asks the
// kernel whose it is, and a child's hits are not recorded (as themselves they cannot be:
// the child is no target until it execs; as the parent they must not be).
#include <linux/prctl.h>

#include <cstddef>
#include <new>
#include <type_traits>

#include "agent/agent.h"
#include "arch/syscall.h"
#include "arch/frame_walk.h"
#include "events/memory_reader.h"
#include "probecore/rcu.h"

namespace probefs::agent {

std::atomic<AreaState*> g_area{nullptr};
namespace {
constinit events::ControlPage g_no_control{};
}  // namespace
std::atomic<events::ControlPage*> g_control{&g_no_control};
std::atomic<const HitSynth*> g_synths[kMaxSynthEvents];
long g_tid_offset = -1;

namespace {

// One TLS block, so that the handler finds all of it from one offset.
struct ThreadRing {
  events::RingProducer* prod;
  uint32_t gen;
  int32_t tid;
  // The area's free_generation when this thread last failed to claim a ring; with prod
  // null and gen current, the thread retries only once the daemon freed rings since.
  uint32_t claim_free_gen;
  uint32_t saved_gen;  // gen before the shared-TLS window opened
  uint16_t inst[events::kRingMaxBuffers];
  // The buffers whose ring this thread failed to claim, while the area's free_generation
  // is inst_free_gen: no new scan before the daemon frees rings.
  uint32_t inst_failed;
  uint32_t inst_free_gen;
};
// No area has it (control.cc skips 0 only; it would take 2^32 areas).
constexpr uint32_t kSharedTlsGen = ~0u;
constinit thread_local ThreadRing t_ring __attribute__((tls_model("initial-exec"))) = {};

// This thread's id as glibc's thread descriptor holds it: the word at %fs:0x10 is the
// descriptor's address (tcbhead_t.self), and the kernel writes the tid field itself
// (CLONE_CHILD_SETTID, in fork children too). 0 when the offset is unknown.
[[gnu::always_inline]] inline int32_t descriptor_tid() {
  const long off = __atomic_load_n(&g_tid_offset, __ATOMIC_RELAXED);
  if (off < 0) return 0;
  uintptr_t self;
  asm volatile("mov %%fs:0x10, %0" : "=r"(self));
  return __atomic_load_n(reinterpret_cast<const int32_t*>(self + static_cast<uintptr_t>(off)),
                         __ATOMIC_RELAXED);
}

// The thread's name, as the kernel's comm.
void read_comm(char (&comm)[16]) {
  comm[0] = 0;
  arch::raw_syscall(__NR_prctl, PR_GET_NAME, reinterpret_cast<long>(comm));
  comm[15] = 0;
}

void forget_instance_rings() {
  for (uint16_t& r : t_ring.inst) {
    asm("" : "+r"(r));
    r = 0;
  }
  t_ring.inst_failed = 0;
}

// The first hit of a thread in an area, or a thread whose tid is not the one it claimed
// its ring with (a child of _Fork or a raw clone that ran no atfork handler: the area is
// its parent's). Returns the thread's ring, or nullptr (no ring: every ring is taken, or
// the process is not the area's). The claim writes the thread's name (one more system
// call, once per thread and area) in the ring's owner record, which names its records.
[[gnu::noinline]] events::RingProducer* claim_slow(AreaState* as, int32_t* tid) {
  if (t_ring.gen == kSharedTlsGen) {  // a spawned child may be the one running
    if (static_cast<int32_t>(arch::raw_syscall(__NR_getpid)) != as->pid) {
      *tid = 0;
      return nullptr;
    }
    *tid = static_cast<int32_t>(arch::raw_syscall(__NR_gettid));
    // The parent: its ring, if it had one in this area; else its hit counts as unowned.
    return t_ring.saved_gen == as->generation && t_ring.tid == *tid ? t_ring.prod : nullptr;
  }
  if (t_ring.gen == as->generation && t_ring.prod == nullptr && t_ring.tid != 0 &&
      t_ring.claim_free_gen == __atomic_load_n(&as->area->free_generation, __ATOMIC_ACQUIRE)) {
    *tid = t_ring.tid;
    return nullptr;  // claimed in vain before, and nothing was freed since
  }
  if (static_cast<int32_t>(arch::raw_syscall(__NR_getpid)) != as->pid) {
    *tid = 0;
    return nullptr;
  }
  const auto real = static_cast<int32_t>(arch::raw_syscall(__NR_gettid));
  *tid = real;
  // In this very process the descriptor must say the same: if not, the offset found at
  // startup is wrong, and every thread asks the kernel from now on.
  if (g_tid_offset >= 0 && descriptor_tid() != real) __atomic_store_n(&g_tid_offset, -1, __ATOMIC_RELAXED);
  if (t_ring.gen == as->generation && t_ring.prod != nullptr && t_ring.tid == real) return t_ring.prod;
  events::RingProducer fresh{};
  if (t_ring.gen != as->generation || t_ring.tid != real) forget_instance_rings();
  t_ring.gen = as->generation;
  t_ring.tid = real;
  char comm[events::kRingCommBytes];
  read_comm(comm);
  if (!events::ring_claim(as->area, static_cast<uint32_t>(real), &fresh,
                          static_cast<uint32_t>(as->pid), comm)) {
    t_ring.prod = nullptr;
    t_ring.claim_free_gen = fresh.claim_generation;
    return nullptr;
  }
  fresh.rseq_cpu = as->rseq_cpu;
  events::ring_set_comm(&fresh, static_cast<uint32_t>(real), comm);
  new (&as->producers[fresh.ring]) events::RingProducer(fresh);
  t_ring.prod = &as->producers[fresh.ring];
  watch_thread_exit();
  return t_ring.prod;
}

[[gnu::always_inline]] inline events::RingProducer* this_thread_ring(AreaState* as,
                                                                     int32_t* tid) {
  events::RingProducer* p = t_ring.prod;
  if (__builtin_expect(p != nullptr && t_ring.gen == as->generation, 1)) {
    const int32_t live = descriptor_tid();
    if (__builtin_expect(live == t_ring.tid || live == 0, 1)) {
      *tid = t_ring.tid;
      return p;
    }
  }
  return claim_slow(as, tid);
}

// The thread's ring for instance buffer `b`, in the area this_thread_ring() just gave it a
// ring of (as `tid`): claimed at its first record there. nullptr when it has none (every
// ring taken: the record is lost, counted with the area's unowned ones; or the shared-TLS
// window, whose hits record into the top level's buffer alone).
[[gnu::noinline]] events::RingProducer* instance_ring(AreaState* as, uint32_t b, int32_t tid) {
  if (t_ring.gen != as->generation || t_ring.tid != tid || b >= events::kRingMaxBuffers)
    return nullptr;
  if (const uint32_t r = t_ring.inst[b]; r != 0) return &as->producers[r - 1];
  const uint32_t free_gen = __atomic_load_n(&as->area->free_generation, __ATOMIC_ACQUIRE);
  if ((t_ring.inst_failed >> b) & 1) {
    if (t_ring.inst_free_gen == free_gen) return nullptr;
    t_ring.inst_failed = 0;
  }
  char comm[events::kRingCommBytes];
  read_comm(comm);
  events::RingProducer fresh{};
  if (!events::ring_claim(as->area, static_cast<uint32_t>(tid), &fresh,
                          static_cast<uint32_t>(as->pid), comm, b)) {
    t_ring.inst_failed |= 1u << b;
    t_ring.inst_free_gen = fresh.claim_generation;
    return nullptr;
  }
  fresh.rseq_cpu = as->rseq_cpu;
  events::ring_set_comm(&fresh, static_cast<uint32_t>(tid), comm);
  new (&as->producers[fresh.ring]) events::RingProducer(fresh);
  t_ring.inst[b] = static_cast<uint16_t>(fresh.ring + 1);
  return &as->producers[fresh.ring];
}

// A record's bytes into another ring's reservation: whole 8-byte words (both sides have
// them: reservations are 8-byte aligned and padded), with no library call.
[[gnu::always_inline]] inline void copy_words(uint8_t* d, const uint8_t* src, uint32_t len) {
  for (uint32_t i = 0; i < len; i += 8) {
    asm("" : "+r"(i));
    __builtin_memcpy(d + i, src + i, 8);
  }
}

// The fetch program's view of a hit.
[[gnu::always_inline]] inline events::HitContext hit_context(const HitProbe* hp, const PtRegs* regs,
                                                             uint64_t ip, uint64_t ret_ip,
                                                             const uint64_t* entry_args,
                                                             int32_t tid) {
  events::HitContext hc;
  hc.regs = regs;
  hc.ip = ip;
  hc.ret_ip = ret_ip;
  hc.entry_args = entry_args;
  hc.pid = tid;
  hc.event_id = hp->event_id;
  return hc;
}

template <class Reader>
[[gnu::always_inline]] inline uint32_t write_with(Reader& rd, const HitProbe* hp,
                                                  const events::HitContext& hc, uint8_t* rec) {
  return events::write_record(hp->view, hc, rd, rec, hp->record_cap);
}

// A hit of a thread that has no ring: counted in the area's shared counters, and its
// record as lost unless recording is off.
[[gnu::noinline, gnu::cold]] void count_unowned(AreaState* as, const HitProbe* hp) {
  events::ring_count_hit_unowned(as->area, hp->counter_slot);
  if (!events::control_tracing_off(g_control.load(std::memory_order_relaxed)))
    events::ring_drop_unowned(as->area);
}

// The bytes of a record built for histograms alone (the event does not record, or its
// ring is full): on the handler's stack, strings cut to fit.
constexpr uint32_t kHistRecordBytes = 1024;

// The synthetic events a hit's hist actions asked for: written after the hit's own
// record is committed (a ring holds one reservation at a time).
struct FiredSet {
  uint32_t n = 0;
  events::HistFired f[events::kHistMaxPerEvent];
};

void name_entry(char* name) {
  arch::raw_syscall(__NR_prctl, PR_GET_NAME, reinterpret_cast<long>(name));
  name[events::kHistCommBytes - 1] = 0;
}

// The unwind tables (UNWIND): slots filled in order, the count published after each.
arch::UnwindTableView g_unwind[kMaxUnwindTables];
std::atomic<uint32_t> g_unwind_count{0};

// The row of the newest table whose mapping holds pc, or nullptr. `last` remembers the
// table of the previous lookup: a walk's frames are mostly in one object.
struct UnwindFinder {
  uint32_t count = g_unwind_count.load(std::memory_order_acquire);
  uint32_t last = UINT32_MAX;
  const arch::UnwindRow* operator()(uint64_t pc) {
    if (last < count && pc - g_unwind[last].start < g_unwind[last].end - g_unwind[last].start)
      return arch::unwind_row(g_unwind[last], pc);
    for (uint32_t i = count; i-- > 0;) {
      if (pc - g_unwind[i].start < g_unwind[i].end - g_unwind[i].start) {
        last = i;
        return arch::unwind_row(g_unwind[i], pc);
      }
    }
    return nullptr;
  }
};

// A thread's stack into out[0, depth), zeros past its end: `first` (where the thread
// stopped), then its callers, by the unwind tables where the daemon handed the code's
// (arch/frame_walk.h, walk_unwind), by the frame-pointer chain elsewhere; `at_entry`: the
// thread stopped on a function's first instruction, whose caller is at the stack pointer.
// With `fp_only`, the frame-pointer chain alone (user_stack records: the kernel's walk).
// A frame below a return probe's function holds its return point: the function's own
// return address is given instead.
[[gnu::noinline]] void walk_stack(const AreaState* as, const PtRegs* regs, uint64_t first,
                                  bool at_entry, bool fp_only, uint64_t* out, uint32_t depth) {
  uint32_t n = 0;
  out[n++] = first;
  auto fix = [](uint64_t slot, uint64_t value) -> uint64_t {
    return probecore::kretprobe_slot_return(reinterpret_cast<const uintptr_t*>(slot), value);
  };
  auto walk = [&](const auto& rd) {
    if (fp_only) {
      n += arch::walk_frame_pointers(rd, regs->bp, regs->sp, out + n, depth - n, fix);
    } else {
      n += arch::walk_unwind(rd, first, regs->sp, regs->bp, at_entry, out + n, depth - n,
                             UnwindFinder{}, fix);
    }
  };
  if (as->fault_tolerant) walk(events::FaultTolerantReader{});
  else walk(events::LiveMemoryReader(as->pid));
  for (uint32_t i = n; i < depth; ++i) {
    asm("" : "+r"(i));
    out[i] = 0;
  }
}

// The hit's stack for a stacktrace key and a kernel_stack record (kHistStackDepth
// addresses): the probed instruction (for a return probe the address it returns to),
// the caller at the stack pointer when the probe is on a function's first instruction.
void capture_stack(const AreaState* as, const HitProbe* hp, const PtRegs* regs, uint64_t ret_ip,
                   uint64_t* out) {
  const bool is_return = hp->view.is_return;
  const bool at_entry = hp->rp.kp.bounds.start == hp->address;
  walk_stack(as, regs, is_return ? ret_ip : hp->address, !is_return && at_entry, false, out,
             events::kHistStackDepth);
}

// Whether a committed record is followed by stack records (write_stacks).
[[gnu::always_inline]] inline bool wants_stacks(const events::RingProducer* p) {
  return events::ring_stack_options(p->area) != 0;
}

// options/stacktrace and userstacktrace (`opts`), and the stacktrace trigger
// (kRingKernelStack alone): the thread's stack as records of their own, after the record
// of the hit (the ring holds one reservation at a time). kernel_stack is the walk of
// stack keys; user_stack the kernel's walk of a uprobe's user stack (where the thread
// stopped, then the frame-pointer chain).
[[gnu::noinline, gnu::cold]] void write_stacks(const AreaState* as, const HitProbe* hp,
                                               events::RingProducer* p, const PtRegs* regs,
                                               uint64_t ret_ip, int32_t tid, uint32_t opts) {
  if (opts & events::kRingKernelStack) {
    static_assert(events::kStackRecordDepth == events::kHistStackDepth);
    uint64_t frames[events::kStackRecordDepth];
    capture_stack(as, hp, regs, ret_ip, frames);
    uint32_t n = 0;
    while (n < events::kStackRecordDepth && frames[n] != 0) ++n;
    const uint32_t bytes = 16 + 8 * n;
    if (auto* r = static_cast<uint8_t*>(events::ring_reserve(p, bytes))) {
      const uint64_t common = events::kKernelStackEventId | uint64_t{static_cast<uint32_t>(tid)} << 32;
      const uint64_t size = n;  // s32 size, then 4 bytes of 0
      __builtin_memcpy(r, &common, 8);
      __builtin_memcpy(r + 8, &size, 8);
      for (uint32_t i = 0; i < n; ++i) __builtin_memcpy(r + 16 + 8 * i, &frames[i], 8);
      events::ring_commit(p, bytes);
    }
  }
  if (opts & events::kRingUserStack) {
    uint64_t frames[events::kUserStackDepth];
    walk_stack(as, regs, hp->view.is_return ? ret_ip : hp->address, false, true, frames,
               events::kUserStackDepth);
    constexpr uint32_t bytes = events::kUserStackRecordBytes;
    if (auto* r = static_cast<uint8_t*>(events::ring_reserve(p, bytes))) {
      const uint64_t common = events::kUserStackEventId | uint64_t{static_cast<uint32_t>(tid)} << 32;
      const uint64_t tgid = static_cast<uint32_t>(as->pid);  // u32 tgid, then 4 bytes of 0
      __builtin_memcpy(r, &common, 8);
      __builtin_memcpy(r + 8, &tgid, 8);
      __builtin_memcpy(r + 16, frames, sizeof frames);
      events::ring_commit(p, bytes);
    }
  }
}

// One hit of a program with variables, references or an action (hist_update_inter): its
// references' tables are this ring's tables of their slots.
[[gnu::noinline]] void count_inter(AreaState* as, const HitHists* hh, uint32_t i,
                                   const events::HistControl* ctl, uint8_t* table,
                                   const uint8_t* rec, uint32_t len, uint32_t ring, uint32_t cpu,
                                   const uint64_t* stack, FiredSet* fired) {
  const events::HistProgram& prog = hh->programs[i];
  events::HistRefTable refs[events::kHistMaxVarRefs];
  for (uint32_t r = 0; r < prog.nrefs && r < events::kHistMaxVarRefs; ++r) {
    HistSlot& rs = as->hist[prog.refs[r].slot % events::kHistMaxSlots];
    uint8_t* base = rs.base.load(std::memory_order_acquire);
    refs[r].shape = &hh->ref_shapes[i][r];
    refs[r].ctl = reinterpret_cast<const events::HistControl*>(base);
    refs[r].table = base == nullptr || rs.signature != hh->ref_signatures[i][r] || ring >= rs.rings
                        ? nullptr
                        : base + events::kHistControlBytes + uint64_t{ring} * refs[r].shape->stride;
  }
  const uint64_t now = hh->clock.mult ? hh->clock.ns(events::ring_detail::read_tsc()) : 0;
  events::HistFired f;
  f.synth_id = 0;
  (void)events::hist_update_inter(prog, hh->shapes[i], ctl, table, rec, len, cpu, stack, now,
                                  refs, name_entry, &f);
  if (f.synth_id != 0 && fired != nullptr && fired->n < events::kHistMaxPerEvent)
    fired->f[fired->n++] = f;
}

// Counts the hit in each of hh's histograms whose filter keeps it. `rec` is the record as
// the event's format lays it out; `ring` the thread's ring, which names its tables. The
// actions that fire go into *fired (none are kept when it is null).
[[gnu::always_inline]] inline void count_hists(AreaState* as, const HitHists* hh,
                                               const uint8_t* rec, uint32_t len, uint32_t ring,
                                               uint32_t cpu, const char* comm,
                                               const uint64_t* stack, FiredSet* fired) {
  for (uint32_t i = 0; i < hh->n; ++i) {
    const events::HistProgram& prog = hh->programs[i];
    const events::HistShape& g = hh->shapes[i];
    HistSlot& slot = as->hist[prog.slot];
    uint8_t* base = slot.base.load(std::memory_order_acquire);
    if (base == nullptr || slot.signature != hh->signatures[i] || ring >= slot.rings) continue;
    if (prog.filter) {
      events::FilterContext fc;
      fc.cpu = cpu;
      fc.comm = comm;
      if (!events::filter_match(*prog.filter, rec, len, fc)) continue;
    }
    const auto* ctl = reinterpret_cast<const events::HistControl*>(base);
    uint8_t* table = base + events::kHistControlBytes + uint64_t{ring} * g.stride;
    if (__builtin_expect(hh->inter[i], 0)) {
      count_inter(as, hh, i, ctl, table, rec, len, ring, cpu, stack, fired);
      continue;
    }
    (void)events::hist_update(prog, g, ctl, table, rec, len, cpu, stack, name_entry);
  }
}

const HitSynth* find_synth(uint16_t id) {
  for (auto& slot : g_synths) {
    const HitSynth* hs = slot.load(std::memory_order_acquire);
    if (hs != nullptr && hs->event_id == id) return hs;
  }
  return nullptr;
}

// The records of the synthetic events `fs` holds, into the thread's ring (when the event
// records) and their own histograms; a synthetic event's actions fire one level further
// at most (a chain of synthetic events ends there).
[[gnu::noinline]] void emit_synths(AreaState* as, events::RingProducer* p, int32_t tid,
                                   uint32_t cpu, const FiredSet& fs, int depth) {
  for (uint32_t k = 0; k < fs.n; ++k) {
    const events::HistFired& f = fs.f[k];
    const HitSynth* hs = find_synth(f.synth_id);
    constexpr uint32_t kSynthRecordBytes = 1024;
    if (hs == nullptr || hs->size > kSynthRecordBytes || hs->size % 8 || f.action == nullptr)
      continue;
    alignas(8) uint8_t rec[kSynthRecordBytes];
    for (uint32_t i = 0; i < hs->size; i += 8) {
      asm("" : "+r"(i));
      __builtin_memset(rec + i, 0, 8);
    }
    const uint64_t common = hs->event_id | uint64_t{static_cast<uint32_t>(tid)} << 32;
    __builtin_memcpy(rec, &common, 8);
    for (uint32_t i = 0; i < f.nparams; ++i) {
      const uint32_t off = f.action->param_offset[i], size = f.action->param_size[i];
      if (off < 8 || off > hs->size || size > hs->size - off) continue;
      const uint64_t v = f.params[i];  // little-endian: the low bytes
      switch (size) {
        case 1: rec[off] = static_cast<uint8_t>(v); break;
        case 2: { const auto x = static_cast<uint16_t>(v); __builtin_memcpy(rec + off, &x, 2); break; }
        case 4: { const auto x = static_cast<uint32_t>(v); __builtin_memcpy(rec + off, &x, 4); break; }
        default: __builtin_memcpy(rec + off, &v, 8); break;
      }
    }
    FiredSet next;
    if (hs->hists.n)
      count_hists(as, &hs->hists, rec, hs->size, p->ring, cpu, "", nullptr, depth < 1 ? &next : nullptr);
    if (hs->record && !events::control_tracing_off(g_control.load(std::memory_order_relaxed))) {
      if (hs->filter) {
        events::FilterContext fc;
        fc.cpu = cpu;
        fc.comm = "";
        if (!events::filter_match(*hs->filter, rec, hs->size, fc)) goto chained;
      }
      if (auto* r = static_cast<uint8_t*>(events::ring_reserve(p, hs->size))) {
        for (uint32_t i = 0; i < hs->size; i += 8) {  // sizes are multiples of 8
          asm("" : "+r"(i));
          __builtin_memcpy(r + i, rec + i, 8);
        }
        events::ring_commit(p, hs->size);
      }
    }
  chained:
    if (next.n) emit_synths(as, p, tid, cpu, next, depth + 1);
  }
}

// Everything but the straight path: histograms, triggers, soft mode (below).
void emit_slow(const HitProbe* hp, AreaState* as, events::RingProducer* p, int32_t tid,
               const PtRegs* regs, uint64_t ip, uint64_t ret_ip, const uint64_t* entry_args,
               bool fast);

// Out of line: the handlers' straight path (emit_fast) then needs no frame of its own.
[[gnu::noinline]] void emit(const HitProbe* hp, const PtRegs* regs, uint64_t ip,
                                        uint64_t ret_ip, const uint64_t* entry_args) {
  AreaState* as = g_area.load(std::memory_order_acquire);
  if (__builtin_expect(as == nullptr, 0)) return;  // no area yet, or the tracer is gone
  int32_t tid = 0;
  events::RingProducer* p = this_thread_ring(as, &tid);
  if (__builtin_expect(p == nullptr, 0)) {
    if (tid != 0) count_unowned(as, hp);  // a thread of this process without a ring
    return;
  }
  events::ring_count_hit(p, hp->counter_slot);
  if (__builtin_expect(hp->slow.load(std::memory_order_acquire), 0)) {
    emit_slow(hp, as, p, tid, regs, ip, ret_ip, entry_args, false);
    return;
  }
  if (__builtin_expect(events::control_tracing_off(g_control.load(std::memory_order_relaxed)), 0))
    return;  // tracing_on 0
  auto* rec = static_cast<uint8_t*>(events::ring_reserve(p, hp->record_cap));
  if (__builtin_expect(rec == nullptr, 0)) return;  // full: counted as lost
  char comm[16];
  events::HitContext hc = hit_context(hp, regs, ip, ret_ip, entry_args, tid);
  // Read once: a SET_FILTER may turn it on while this hit runs (it never turns off).
  const bool with_comm = __atomic_load_n(&hp->needs_comm, __ATOMIC_ACQUIRE);
  if (__builtin_expect(with_comm, 0)) {
    read_comm(comm);
    hc.comm = comm;
  }
  uint32_t len;
  if (as->fault_tolerant) {
    events::FaultTolerantReader rd;
    len = write_with(rd, hp, hc, rec);
  } else {
    events::LiveMemoryReader rd(as->pid);
    len = write_with(rd, hp, hc, rec);
  }
  if (__builtin_expect(len == 0, 0)) {
    events::ring_discard(p);
    return;
  }
  if (const events::CompiledFilter* f = hp->filter.load(std::memory_order_acquire)) {
    const auto* rh = reinterpret_cast<const events::RingRecordHeader*>(p->data + p->pending_off);
    events::FilterContext fc;
    fc.cpu = rh->cpu;
    fc.comm = with_comm ? comm : "";
    if (!events::filter_match(*f, rec, len, fc)) {
      events::ring_discard(p);
      return;
    }
  }
  events::ring_commit(p, len);
  if (__builtin_expect(wants_stacks(p), 0))
    write_stacks(as, hp, p, regs, ret_ip, tid, events::ring_stack_options(p->area));
}

// The filter of a probe that has one (emit_fast): whether the record stays.
[[gnu::noinline]] bool fast_filter_keeps(const events::CompiledFilter* f,
                                         const events::RingProducer* p, const uint8_t* rec,
                                         uint32_t len) {
  const auto* rh = reinterpret_cast<const events::RingRecordHeader*>(p->data + p->pending_off);
  events::FilterContext fc;
  fc.cpu = rh->cpu;
  fc.comm = "";
  return events::filter_match(*f, rec, len, fc);
}

// The record of a probe whose arguments are all registers (HitProbe::fast): the common
// header, ip (and ret_ip), and register stores, written here directly.
// `pid_word` is the thread id in the upper half of a word (common_pid's place), made by
// the caller as it enters: a 32-bit tid spilled and read back as the 64-bit word this
// store needs is a store-forwarding stall of a dozen cycles.
[[gnu::always_inline]] inline void write_fast_record(const HitProbe* hp, const PtRegs* regs,
                                                     uint64_t ret_ip, uint64_t pid_word,
                                                     uint8_t* rec) {
  // event id, common_flags 0, common_preempt_count 0, pid: one store.
  const uint64_t common = hp->event_id | pid_word;
  __builtin_memcpy(rec, &common, 8);
  __builtin_memcpy(rec + 8, &hp->address, 8);
  if (hp->view.is_return) __builtin_memcpy(rec + 16, &ret_ip, 8);
  const auto* r = reinterpret_cast<const uint8_t*>(regs);
  for (uint32_t a = 0, n = hp->fast_nargs; a < n; ++a) {
    const uint32_t f = hp->fast_args[a];
    uint64_t v;
    __builtin_memcpy(&v, r + (f & 0xff), 8);
    uint8_t* d = rec + (f >> 16);
    switch ((f >> 8) & 0xff) {
      case 8: __builtin_memcpy(d, &v, 8); break;
      case 4: { const auto x = static_cast<uint32_t>(v); __builtin_memcpy(d, &x, 4); break; }
      case 2: { const auto x = static_cast<uint16_t>(v); __builtin_memcpy(d, &x, 2); break; }
      default: *d = static_cast<uint8_t>(v); break;
    }
  }
}

// One trigger whose condition held (the kernel's trigger functions, with counts that stay
// exact when threads race: the count is taken before the switch, and given back when
// another hit made that very switch first). traceon and traceoff, enable_event and
// disable_event spend no count when tracing or the event already is as they would set it.
void fire_trigger(const HitTriggers::One& t, events::ControlPage* ctl, AreaState* as,
                  const HitProbe* hp, events::RingProducer* p, const PtRegs* regs,
                  uint64_t ret_ip, int32_t tid) {
  using A = events::TriggerAction;
  switch (t.action) {
    case A::kTraceOn:
    case A::kTraceOff: {
      const bool off = t.action == A::kTraceOff;
      if (events::control_tracing_off(ctl, t.buffer) == off) return;
      if (!events::control_take_count(ctl, t.count_slot)) return;
      if (!events::control_switch_tracing(ctl, off, t.buffer))
        events::control_give_count(ctl, t.count_slot);
      return;
    }
    case A::kEnableEvent:
    case A::kDisableEvent: {
      const bool disable = t.action == A::kDisableEvent;
      if (events::control_soft_disabled(ctl, t.target_event, t.buffer) == disable) return;
      if (!events::control_take_count(ctl, t.count_slot)) return;
      if (!events::control_switch_soft(ctl, t.target_event, disable, t.buffer))
        events::control_give_count(ctl, t.count_slot);
      return;
    }
    case A::kStackTrace: {
      if (!events::control_take_count(ctl, t.count_slot)) return;
      if (events::control_tracing_off(ctl, t.buffer)) return;
      // An instance's trigger: the stack goes into that buffer's ring of this thread.
      events::RingProducer* q = t.buffer == 0 ? p : instance_ring(as, t.buffer, tid);
      if (q != nullptr) write_stacks(as, hp, q, regs, ret_ip, tid, events::kRingKernelStack);
      return;
    }
    case A::kSnapshot: {
      // The request goes after the record that fired it, into that buffer's ring of this
      // thread; the daemon swaps there. A full ring loses it, as it loses a record.
      if (!events::control_take_count(ctl, t.count_slot)) return;
      events::RingProducer* q = t.buffer == 0 ? p : instance_ring(as, t.buffer, tid);
      if (q == nullptr) return;
      if (auto* r = static_cast<uint8_t*>(events::ring_reserve(q, events::kSnapshotRequestBytes))) {
        const uint64_t common =
            events::kSnapshotRequestEventId | uint64_t{static_cast<uint32_t>(tid)} << 32;
        __builtin_memcpy(r, &common, 8);
        events::ring_commit(q, events::kSnapshotRequestBytes);
        events::control_request_snapshot(ctl, t.buffer);
      }
      return;
    }
  }
}

// The triggers of a hit with a record (HitTriggers::cond): those whose filter keeps it
// run now (traceon, enable_event, disable_event), or after the record is committed
// (traceoff, stacktrace, snapshot: their bits in the result), as the kernel runs them:
// the record that fires a traceoff is in the trace (and one that fires a snapshot, in
// the snapshot), one that fires a conditional traceon is not.
uint64_t run_cond_triggers(const HitTriggers* tr, events::ControlPage* ctl, AreaState* as,
                           const HitProbe* hp, events::RingProducer* p, const PtRegs* regs,
                           uint64_t ret_ip, int32_t tid, const uint8_t* rec, uint32_t len,
                           uint32_t cpu, const char* comm) {
  uint64_t post = 0;
  for (uint32_t i = 0; i < tr->n; ++i) {
    const HitTriggers::One& t = tr->t[i];
    if (t.filter != nullptr) {
      events::FilterContext fc;
      fc.cpu = cpu;
      fc.comm = comm;
      if (len == 0 || !events::filter_match(*t.filter, rec, len, fc)) continue;
    }
    if (t.action == events::TriggerAction::kTraceOff ||
        t.action == events::TriggerAction::kStackTrace ||
        t.action == events::TriggerAction::kSnapshot)
      post |= uint64_t{1} << i;
    else
      fire_trigger(t, ctl, as, hp, p, regs, ret_ip, tid);
  }
  return post;
}

// The instances' buffers a hit records into (HitProbe::instances), out of the general
// path's way: a probe with none pays one load and one test for them.
struct InstanceRecord {
  uint32_t want = 0;                       // buffers still to get the record
  events::RingProducer* built_in = nullptr;  // an instance's ring the record is built in
  uint32_t built_buffer = 0;
  const HitInstanceFilters* filters = nullptr;
};

// The buffers of `mask` whose tracing is on; with no top-level record to build in
// (`need_ring`), the record is reserved in the first of them that has room.
[[gnu::noinline]] void instance_reserve(const HitProbe* hp, AreaState* as, int32_t tid,
                                        events::ControlPage* ctl, uint32_t mask,
                                        bool need_ring, InstanceRecord* ir, uint8_t** rec) {
  // Soft-disabled in a buffer where the event is in soft mode: nothing goes there.
  const uint32_t soft = hp->soft.load(std::memory_order_relaxed);
  const uint32_t off = soft != 0 ? soft & events::control_soft_bits(ctl, hp->event_id) : 0;
  for (uint32_t bits = mask & ~off; bits != 0; bits &= bits - 1) {
    const uint32_t b = static_cast<uint32_t>(__builtin_ctz(bits));
    if (!events::control_tracing_off(ctl, b)) ir->want |= 1u << b;
  }
  ir->filters = hp->instance_filters.load(std::memory_order_acquire);
  while (need_ring && ir->built_in == nullptr && ir->want != 0) {
    const uint32_t b = static_cast<uint32_t>(__builtin_ctz(ir->want));
    ir->want &= ir->want - 1;
    events::RingProducer* q = instance_ring(as, b, tid);
    if (q == nullptr) {
      events::ring_drop_unowned(as->area);
      continue;
    }
    if (auto* r = static_cast<uint8_t*>(events::ring_reserve(q, hp->record_cap))) {
      *rec = r;
      ir->built_in = q;
      ir->built_buffer = b;
    }
  }
}

// Whether instance buffer b's filter keeps the record.
bool instance_keeps(const InstanceRecord& ir, uint32_t b, const uint8_t* rec, uint32_t len,
                    uint32_t cpu, const char* comm) {
  const events::CompiledFilter* f = ir.filters != nullptr ? ir.filters->filter[b] : nullptr;
  if (f == nullptr) return true;
  events::FilterContext fc;
  fc.cpu = cpu;
  fc.comm = comm;
  return events::filter_match(*f, rec, len, fc);
}

// The record, built (`len` bytes at `rec`, still reserved), into the instances' buffers
// that keep it: copied into each ring but the one it was built in, which is committed.
[[gnu::noinline]] void instance_commit(AreaState* as, int32_t tid, InstanceRecord& ir,
                                       const uint8_t* rec, uint32_t len, uint32_t cpu,
                                       const char* comm) {
  for (uint32_t bits = len != 0 ? ir.want : 0; bits != 0; bits &= bits - 1) {
    const auto b = static_cast<uint32_t>(__builtin_ctz(bits));
    if (!instance_keeps(ir, b, rec, len, cpu, comm)) continue;
    events::RingProducer* q = instance_ring(as, b, tid);
    if (q == nullptr) {
      events::ring_drop_unowned(as->area);
      continue;
    }
    if (auto* r = static_cast<uint8_t*>(events::ring_reserve(q, len))) {
      copy_words(r, rec, len);
      events::ring_commit(q, len);
    }
  }
  if (ir.built_in != nullptr) {
    if (len == 0 || !instance_keeps(ir, ir.built_buffer, rec, len, cpu, comm))
      events::ring_discard(ir.built_in);
    else
      events::ring_commit(ir.built_in, len);
  }
}

// Everything but the straight path: histograms, triggers, soft mode. As the kernel's
// event path: triggers that need no record run first; then the record is built (into
// the ring when the event records and there is room, else on the stack, for histograms
// and triggers), counted in the histograms, the conditional triggers run on it, it is
// committed or dropped (soft-disabled, the event's filter), and the post triggers run.
// Instances' buffers (HitProbe::instances) get the same record, built in the first ring
// it goes to and copied into the others, each kept by its own filter.
// `fast`: the probe's record is written by write_fast_record (HitProbe::fast).
[[gnu::noinline]] void emit_slow(const HitProbe* hp, AreaState* as, events::RingProducer* p,
                                 int32_t tid, const PtRegs* regs, uint64_t ip, uint64_t ret_ip,
                                 const uint64_t* entry_args, bool fast) {
  events::ControlPage* ctl = g_control.load(std::memory_order_relaxed);
  const HitHists* hh = hp->hists.load(std::memory_order_acquire);
  const HitTriggers* tr = hp->triggers.load(std::memory_order_acquire);
  if (tr != nullptr && !tr->cond)
    for (uint32_t i = 0; i < tr->n; ++i) fire_trigger(tr->t[i], ctl, as, hp, p, regs, ret_ip, tid);
  const bool cond = tr != nullptr && tr->cond;
  const bool soft_off = (hp->soft.load(std::memory_order_relaxed) & 1) != 0 &&
                        events::control_soft_disabled(ctl, hp->event_id);
  bool record = !soft_off && hp->record.load(std::memory_order_relaxed) &&
                !events::control_tracing_off(ctl);
  const uint32_t instances = hp->instances.load(std::memory_order_relaxed);
  if (!record && hh == nullptr && !cond && instances == 0) return;

  alignas(8) uint8_t stack[kHistRecordBytes];
  uint8_t* rec = stack;
  uint32_t cpu = 0;
  if (record) {
    if (auto* r = static_cast<uint8_t*>(events::ring_reserve(p, hp->record_cap))) {
      rec = r;
      cpu = reinterpret_cast<const events::RingRecordHeader*>(p->data + p->pending_off)->cpu;
    } else {
      record = false;  // full: counted as lost; histograms and triggers still see the hit
    }
  }
  InstanceRecord ir;
  if (__builtin_expect(instances != 0, 0)) {
    instance_reserve(hp, as, tid, ctl, instances, !record, &ir, &rec);
    if (ir.built_in != nullptr)
      cpu = reinterpret_cast<const events::RingRecordHeader*>(ir.built_in->data +
                                                              ir.built_in->pending_off)->cpu;
    if (!record && ir.built_in == nullptr && ir.want == 0 && hh == nullptr && !cond) return;
  }
  const bool in_ring = record || ir.built_in != nullptr;
  if (!in_ring && ((hh && hh->needs_cpu) || cond))
    cpu = events::ring_detail::ring_rseq_cpu(p->rseq_cpu);
  const bool needs_comm = __atomic_load_n(&hp->needs_comm, __ATOMIC_ACQUIRE) ||
                          (hh && hh->needs_comm) || (tr && tr->needs_comm) ||
                          (ir.filters && ir.filters->needs_comm);
  char comm[16];
  comm[0] = 0;
  if (needs_comm) read_comm(comm);
  uint32_t len;
  if (fast && !needs_comm) {
    write_fast_record(hp, regs, ret_ip, uint64_t{static_cast<uint32_t>(tid)} << 32, rec);
    len = hp->view.fixed_size;
  } else {
    const uint32_t cap =
        in_ring || hp->record_cap <= kHistRecordBytes ? hp->record_cap : kHistRecordBytes;
    events::HitContext hc = hit_context(hp, regs, ip, ret_ip, entry_args, tid);
    if (needs_comm) hc.comm = comm;
    if (as->fault_tolerant) {
      events::FaultTolerantReader rd;
      len = events::write_record(hp->view, hc, rd, rec, cap);
    } else {
      events::LiveMemoryReader rd(as->pid);
      len = events::write_record(hp->view, hc, rd, rec, cap);
    }
  }
  FiredSet fired;
  if (hh != nullptr && len != 0) {
    uint64_t frames[events::kHistStackDepth];
    if (__builtin_expect(hh->needs_stack, 0)) capture_stack(as, hp, regs, ret_ip, frames);
    count_hists(as, hh, rec, len, p->ring, cpu, comm, frames, &fired);
  }
  const uint64_t post =
      cond ? run_cond_triggers(tr, ctl, as, hp, p, regs, ret_ip, tid, rec, len, cpu, comm) : 0;
  // The instances' copies, while the record's bytes are still reserved.
  if (__builtin_expect(instances != 0, 0)) instance_commit(as, tid, ir, rec, len, cpu, comm);
  if (record) {
    const events::CompiledFilter* f = hp->filter.load(std::memory_order_acquire);
    events::FilterContext fc;
    fc.cpu = cpu;
    fc.comm = comm;
    if (len == 0 || (f != nullptr && !events::filter_match(*f, rec, len, fc))) {
      events::ring_discard(p);
    } else {
      events::ring_commit(p, len);
      if (__builtin_expect(wants_stacks(p), 0))
        write_stacks(as, hp, p, regs, ret_ip, tid, events::ring_stack_options(p->area));
    }
  }
  for (uint64_t bits = post; bits != 0; bits &= bits - 1)
    fire_trigger(tr->t[__builtin_ctzll(bits)], ctl, as, hp, p, regs, ret_ip, tid);
  if (__builtin_expect(fired.n != 0, 0)) emit_synths(as, p, tid, cpu, fired, 0);
}

// The general path's work for a hit that only counts one lean histogram (HitProbe::
// lean_hists): false when this hit needs more after all (its record is to be written:
// the event is not soft-disabled now), for emit_slow to do.
[[gnu::always_inline]] inline bool count_lean(const HitProbe* hp, const HitHists* hh,
                                              AreaState* as, const events::RingProducer* p,
                                              const PtRegs* regs, uint64_t ret_ip,
                                              uint64_t pid_word) {
  if (hp->record.load(std::memory_order_relaxed)) {
    const events::ControlPage* ctl = g_control.load(std::memory_order_relaxed);
    const bool soft_off = (hp->soft.load(std::memory_order_relaxed) & 1) != 0 &&
                          events::control_soft_disabled(ctl, hp->event_id);
    if (!soft_off && !events::control_tracing_off(ctl)) return false;
  }
  const events::HistProgram& prog = hh->programs[0];
  HistSlot& slot = as->hist[prog.slot];
  uint8_t* base = slot.base.load(std::memory_order_acquire);
  const uint32_t ring = p->ring;
  if (base == nullptr || slot.signature != hh->signatures[0] || ring >= slot.rings) return true;
  const events::HistShape& g = hh->shapes[0];
  const auto* ctl = reinterpret_cast<const events::HistControl*>(base);
  uint8_t* table = base + events::kHistControlBytes + uint64_t{ring} * g.stride;
  alignas(8) uint8_t rec[kLeanRecordBytes];
  // The operands straight from the saved registers, or from the record built here.
  const events::HistProgram& from = hh->lean_from_regs ? hh->lean_regs_program : prog;
  const uint8_t* src = reinterpret_cast<const uint8_t*>(regs);
  if (!hh->lean_from_regs) {
    write_fast_record(hp, regs, ret_ip, pid_word, rec);
    src = rec;
  }
  switch (hh->lean_form) {
    case 1 << 4 | 0: (void)events::hist_update_numbers<1, 0>(from, g, ctl, table, src); break;
    case 1 << 4 | 1: (void)events::hist_update_numbers<1, 1>(from, g, ctl, table, src); break;
    case 1 << 4 | 2: (void)events::hist_update_numbers<1, 2>(from, g, ctl, table, src); break;
    case 2 << 4 | 0: (void)events::hist_update_numbers<2, 0>(from, g, ctl, table, src); break;
    case 2 << 4 | 1: (void)events::hist_update_numbers<2, 1>(from, g, ctl, table, src); break;
    case 2 << 4 | 2: (void)events::hist_update_numbers<2, 2>(from, g, ctl, table, src); break;
    default:  // no lean form, so never from the registers: src is the record
      (void)events::hist_update(prog, g, ctl, table, src, hp->view.fixed_size, 0, nullptr,
                                name_entry);
  }
  return true;
}

// emit() for a probe whose arguments are all registers (HitProbe::fast) and that reads
// no thread name: the record written by write_fast_record. No call on the way but the
// cold ones.
[[gnu::always_inline]] inline void emit_fast(const HitProbe* hp, const PtRegs* regs,
                                             uint64_t ret_ip) {
  AreaState* as = g_area.load(std::memory_order_acquire);
  if (__builtin_expect(as == nullptr, 0)) return;
  int32_t tid = 0;
  events::RingProducer* p = this_thread_ring(as, &tid);
  if (__builtin_expect(p == nullptr, 0)) {
    if (tid != 0) count_unowned(as, hp);
    return;
  }
  events::ring_count_hit(p, hp->counter_slot);
  if (__builtin_expect(hp->slow.load(std::memory_order_acquire), 0)) {
    const HitHists* hh = hp->lean_hists.load(std::memory_order_acquire);
    if (hh == nullptr ||
        !count_lean(hp, hh, as, p, regs, ret_ip, uint64_t{static_cast<uint32_t>(tid)} << 32))
      emit_slow(hp, as, p, tid, regs, hp->address, ret_ip, nullptr, true);
    return;
  }
  if (__builtin_expect(events::control_tracing_off(g_control.load(std::memory_order_relaxed)), 0))
    return;  // tracing_on 0
  auto* rec = static_cast<uint8_t*>(events::ring_reserve(p, hp->record_cap));
  if (__builtin_expect(rec == nullptr, 0)) return;
  write_fast_record(hp, regs, ret_ip, uint64_t{static_cast<uint32_t>(tid)} << 32, rec);
  const uint32_t len = hp->view.fixed_size;
  if (const events::CompiledFilter* f = hp->filter.load(std::memory_order_acquire)) {
    if (!fast_filter_keeps(f, p, rec, len)) {
      events::ring_discard(p);
      return;
    }
  }
  events::ring_commit(p, len);
  if (__builtin_expect(wants_stacks(p), 0))
    write_stacks(as, hp, p, regs, ret_ip, tid, events::ring_stack_options(p->area));
}

// The straight path applies while no one asked for the thread's name (needs_comm only
// grows: a filter that reads COMM may come later).
[[gnu::always_inline]] inline bool takes_fast_path(const HitProbe* hp) {
  return hp->fast && !__atomic_load_n(&hp->needs_comm, __ATOMIC_RELAXED);
}

inline HitProbe* from_kprobe(probecore::Kprobe* kp) { return reinterpret_cast<HitProbe*>(kp); }

}  // namespace

static_assert(offsetof(probecore::Kretprobe, kp) == 0);
static_assert(std::is_standard_layout_v<probecore::Kretprobe>);

int entry_pre_handler(probecore::Kprobe* kp, PtRegs* regs) {
  const HitProbe* hp = from_kprobe(kp);
  if (__builtin_expect(takes_fast_path(hp), 1)) {
    emit_fast(hp, regs, 0);
    return 0;
  }
  emit(hp, regs, hp->address, 0, nullptr);
  return 0;
}

int return_entry_handler(probecore::KretprobeInstance* ri, PtRegs* regs) {
  probecore::Kretprobe* rp = probecore::get_kretprobe(ri);
  if (!rp) return 1;
  const HitProbe* hp = reinterpret_cast<const HitProbe*>(rp);
  if (hp->view.entry_args) {
    auto* out = reinterpret_cast<uint64_t*>(ri->data);
    AreaState* as = g_area.load(std::memory_order_acquire);
    if (as && as->fault_tolerant) {
      events::FaultTolerantReader rd;
      events::save_entry_args(hp->view, *regs, rd, out);
    } else {
      events::LiveMemoryReader rd(as ? as->pid : arch::raw_syscall(__NR_getpid));
      events::save_entry_args(hp->view, *regs, rd, out);
    }
  }
  return 0;
}

int return_handler(probecore::KretprobeInstance* ri, PtRegs* regs) {
  probecore::Kretprobe* rp = probecore::get_kretprobe(ri);
  if (!rp) return 0;
  const HitProbe* hp = reinterpret_cast<const HitProbe*>(rp);
  if (__builtin_expect(takes_fast_path(hp), 1)) {
    emit_fast(hp, regs, ri->ret_addr);
    return 0;
  }
  emit(hp, regs, hp->address, ri->ret_addr, reinterpret_cast<const uint64_t*>(ri->data));
  return 0;
}

// Runs inside the engine's read-side section, as the handlers do: the area it counts in
// is not unmapped before it returns (replace_area waits for a grace period). A missed hit
// writes no record, so it needs no ring: one atomic add on the shared array.
void probe_missed(probecore::Kprobe* kp) {
  AreaState* as = g_area.load(std::memory_order_acquire);
  if (__builtin_expect(as == nullptr, 0)) return;  // no area yet, or the tracer is gone
  events::ring_count_miss(as->area, from_kprobe(kp)->counter_slot);
}

int dl_hook_pre_handler(probecore::Kprobe*, PtRegs* regs) {
  // _dl_debug_state is an empty function: the stub takes its place and returns to its
  // caller, outside any handler, where it may wait for the daemon.
  regs->ip = reinterpret_cast<uintptr_t>(&probefs_agent_dl_stub);
  return 1;
}

// Never runs (the pre_handler always moves ip): its presence keeps the hook an int3 probe,
// since a jump-optimized probe ignores a pre_handler's change of ip.
void dl_hook_post_handler(probecore::Kprobe*, PtRegs*, unsigned long) {}

void forget_thread_ring() {
  t_ring.prod = nullptr;
  t_ring.gen = 0;
  t_ring.tid = 0;
  t_ring.claim_free_gen = 0;
  forget_instance_rings();
}

void retire_thread_ring() {
  if (t_ring.prod == nullptr || t_ring.gen == kSharedTlsGen) return;
  // Read-side, as a hit: an area replaced meanwhile stays mapped until we are out.
  probecore::rcu_read_lock();
  AreaState* as = g_area.load(std::memory_order_acquire);
  // Only a ring of the current area, claimed by this very thread.
  if (as != nullptr && t_ring.gen == as->generation &&
      t_ring.tid == static_cast<int32_t>(arch::raw_syscall(__NR_gettid))) {
    events::ring_retire(t_ring.prod);
    for (uint16_t r : t_ring.inst)
      if (r != 0) events::ring_retire(&as->producers[r - 1]);
  }
  probecore::rcu_read_unlock();
  forget_thread_ring();
}

// ---- the shared-TLS window (spawn_guard.cc registers these) ----

static void open_shared_tls_window() {
  if (t_ring.gen == kSharedTlsGen) return;
  t_ring.saved_gen = t_ring.gen;
  t_ring.gen = kSharedTlsGen;
}

static void close_shared_tls_window() {
  if (t_ring.gen == kSharedTlsGen) t_ring.gen = t_ring.saved_gen;
}

// Just after vfork's system call: 0 in the child (the window opens, and stays open until
// the parent runs again), the child's pid or an error in the parent (it closes).
int vfork_return_pre_handler(probecore::Kprobe*, PtRegs* regs) {
  if (regs->ax == 0) open_shared_tls_window();
  else close_shared_tls_window();
  return 0;
}

int spawn_entry_handler(probecore::KretprobeInstance*, PtRegs*) {
  open_shared_tls_window();
  return 0;
}

int spawn_return_handler(probecore::KretprobeInstance*, PtRegs*) {
  close_shared_tls_window();
  return 0;
}

bool add_unwind_table(const arch::UnwindTableView& t) {
  const uint32_t n = g_unwind_count.load(std::memory_order_relaxed);
  if (n == kMaxUnwindTables) return false;
  g_unwind[n] = t;
  g_unwind_count.store(n + 1, std::memory_order_release);
  return true;
}

}  // namespace probefs::agent
