// The agent's parts and what they share. libprobefs-agent.so runs inside each traced
// process: it carries the engine (probecore + arch), the events interpreter and the ring
// producer, and serves the daemon over the agent link (events/link.h).
//
//   bootstrap.cc  the constructor (launch: serve until GO), probefs_agent_attach, the
//                 control thread, fork and exec, tracer death
//   control.cc    one request in, one reply out: the probe table, the ring area, LIST,
//                 PROFILE, teardown
//   dl_hook.cc    the dynamic linker's r_brk hook: MAPPED requests from the loading thread
//   hit.cc        the handlers probecore calls on a hit (the hit path: no libc)
//
// Threads and locks (in this order when nested; probecore's own lock comes after them):
//   g_ctl_mu    serialises every request's effect (probe table, area, teardown): the
//               control thread, the constructor before GO, the loading thread applying
//               MAPPED answers, fork's handlers
//   g_send_mu   one sender on the link at a time (replies, MAPPED, HELLO)
//   the MAPPED mailbox's own mutex (dl_hook.cc), never held while taking the others
// Handlers take none of them: they read the RCU-published probe data and area
// (hit.cc), inside the read-side section probecore runs them in.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "events/compile.h"
#include "events/control_page.h"
#include "events/fetch.h"
#include "events/filter.h"
#include "events/hist.h"
#include "events/link.h"
#include "events/ring.h"
#include "arch/unwind_table.h"
#include "probecore/kprobes.h"

namespace probefs::agent {

namespace lk = events::link;

// ---------------------------------------------------------------------------------------
// What the handlers read (hit.cc). Plain data, published before the probe is registered
// and freed only after it is unregistered (probecore waits for a grace period there) or,
// for a replaced filter, after a grace period of its own.

// The largest straight-path record a lean histogram counts from (built on the stack).
inline constexpr uint32_t kLeanRecordBytes = 256;

// The histograms one probe's hits count into (SET_HIST), immutable once published: a new
// set replaces it whole, freed after a grace period.
struct HitHists {
  uint32_t n = 0;
  bool needs_comm = false;  // a trigger's filter reads the thread's name
  bool needs_cpu = false;   // a key, a value or a filter reads the CPU
  bool any_inter = false;   // a program takes hist_update_inter (variables, actions...)
  bool needs_stack = false; // a key is the hit's stack (common_stacktrace)
  // One histogram of plain keys and values: no filter, variables, actions, stack or CPU
  // (HitProbe::lean_hists); and its events::hist_numbers_form() (0: none).
  bool lean = false;
  uint32_t lean_form = 0;
  // With a lean form, when every key and value is an argument the straight path stores
  // from a register whole (HitProbe::fast_args): programs[0] with each operand's offset
  // that register's in PtRegs, so that the hit reads them where the thunk saved them,
  // writing no record (little-endian: a register's low bytes are the field's).
  bool lean_from_regs = false;
  events::HistProgram lean_regs_program;
  events::HistProgram programs[events::kHistMaxPerEvent];
  events::HistShape shapes[events::kHistMaxPerEvent];
  uint64_t signatures[events::kHistMaxPerEvent];  // each geometry's (HistSlot::signature)
  bool inter[events::kHistMaxPerEvent] = {};      // programs[i].inter_event()
  // References' shapes and signatures, by program and reference.
  events::HistShape ref_shapes[events::kHistMaxPerEvent][events::kHistMaxVarRefs];
  uint64_t ref_signatures[events::kHistMaxPerEvent][events::kHistMaxVarRefs] = {};
  events::HistClock clock;  // common_timestamp from the TSC
};

// The triggers of one probe's event (SET_HIST), immutable once published: a new set
// replaces it whole, freed after a grace period. They act at the hit, through the control
// page (events/control_page.h) that every target of the mount shares.
struct HitTriggers {
  struct One {
    events::TriggerAction action = events::TriggerAction::kTraceOn;
    uint16_t target_event = 0;
    uint32_t count_slot = events::kNoCountSlot;
    uint32_t buffer = 0;  // events::TriggerSpec::buffer
    const events::CompiledFilter* filter = nullptr;  // into filters[]
  };
  uint32_t n = 0;
  // The record is built before they run (the kernel's TRIGGER_COND): one has a filter, or
  // acts after the record is committed (traceoff, stacktrace, snapshot). Else they run
  // before it
  // (an unconditional traceon's own record is in the trace).
  bool cond = false;
  bool needs_comm = false;  // a filter reads the thread's name
  One t[events::kMaxHitTriggers];
  std::optional<events::CompiledFilter> filters[events::kMaxHitTriggers];
};

// The event's filters in the instances' buffers (SET_HIST), by buffer: nullptr where it
// has none. Immutable once published.
struct HitInstanceFilters {
  bool needs_comm = false;  // one reads the thread's name
  const events::CompiledFilter* filter[events::kRingMaxBuffers] = {};
  std::optional<events::CompiledFilter> storage[events::kRingMaxBuffers];
};

// The mount's control page (CONTROL), mapped shared; until one comes, a page of zeros
// that nothing writes (tracing on, nothing soft-disabled, no trigger).
extern std::atomic<events::ControlPage*> g_control;

// A synthetic event as hist actions write it (SET_HIST with a synth_id): its record size,
// whether it records, its filter and its own histograms. Immutable once published;
// replaced whole, the old one freed after a grace period.
struct HitSynth {
  uint16_t event_id = 0;
  uint32_t size = 0;  // the record: header and one u64 slot per field (strings: more)
  bool record = false;
  std::optional<events::CompiledFilter> filter;
  HitHists hists;
};
inline constexpr uint32_t kMaxSynthEvents = 64;
// The synthetic events of this process, found by a scan for their event id.
extern std::atomic<const HitSynth*> g_synths[kMaxSynthEvents];

// The tables of one histogram slot for one ring area (HIST_TABLE): the memfd mapping, and
// what it was made for. base is published (release) after the rest; a handler that loads
// it non-null reads the rest as they were then. They belong to the area: a fork child
// that takes a spare area takes its tables, and they go when the area goes.
struct HistSlot {
  std::atomic<uint8_t*> base{nullptr};
  uint64_t signature = 0;  // HistGeometry::signature()
  uint32_t rings = 0;      // tables in the mapping: a ring at or past this counts nowhere
  uint64_t bytes = 0;
};

// One probe as its handlers see it. `rp` comes first, so the Kprobe* and Kretprobe* that
// probecore hands a handler are pointers to the HitProbe.
struct HitProbe {
  probecore::Kretprobe rp;  // entry probes use rp.kp only
  events::ProgramView view;
  std::atomic<const events::CompiledFilter*> filter{nullptr};
  uint64_t address = 0;     // the probed address (__probe_ip; the function for returns)
  uint32_t counter_slot = 0;
  uint32_t record_cap = 0;  // bytes reserved per record (strings are cut to fit)
  uint16_t event_id = 0;
  bool needs_comm = false;  // the program or the filter reads the thread's name
  // The straight path (hit.cc): when every argument is a register or $retval stored as
  // it is, the handler writes the record itself from these, packed as in
  // FetchProgram::fast_regs (reg byte offset | size << 8 | field offset << 16), with no
  // interpreter, reader or context. Set at DEFINE (control.cc); fast_nargs <= kMaxFastArgs.
  static constexpr uint32_t kMaxFastArgs = 8;
  bool fast = false;
  uint8_t fast_nargs = 0;
  uint32_t fast_args[kMaxFastArgs] = {};
  // Histograms and triggers (SET_HIST): null when none.
  std::atomic<const HitHists*> hists{nullptr};
  std::atomic<const HitTriggers*> triggers{nullptr};
  // False: the hits write no record into the top level's buffer (a synthetic event's
  // only, or an event enabled only in instances).
  std::atomic<bool> record{true};
  // The instances' buffers the hits also record into (bit b: buffer b; bit 0 clear), and
  // the event's filters there (null: none).
  std::atomic<uint32_t> instances{0};
  std::atomic<const HitInstanceFilters*> instance_filters{nullptr};
  // Soft mode, bit b for buffer b: the hits record into buffer b only while the event's
  // control-page bit of b is clear.
  std::atomic<uint32_t> soft{0};
  // Any of hists, triggers, soft, instances, or not record: the handler takes the general
  // path (emit_slow).
  std::atomic<bool> slow{false};
  // `hists` when all the general path has to do for a hit that writes no record is to
  // count that one lean histogram (no triggers, no instances, a straight-path record):
  // the handler counts it itself (hit.cc, count_lean).
  std::atomic<const HitHists*> lean_hists{nullptr};
};

// The ring area of this process, as the handlers see it. Replaced (SETUP, fork, tracer
// death) by publishing another or nullptr and waiting for a grace period before the old
// one is unmapped.
struct AreaState {
  events::RingAreaHeader* area = nullptr;
  uint64_t size = 0;
  events::RingProducer* producers = nullptr;  // one per ring, used by its owner thread:
                                              // mapped zero pages, each made at its claim
  size_t producer_bytes = 0;
  uint32_t generation = 0;  // distinct for every area this process ever had
  int32_t pid = 0;          // the process that set it up (a fork child has its own)
  bool fault_tolerant = false;  // read through the SIGSEGV fixup (see lk::kSetupSyscallReads)
  bool syscall_reads = false;   // SETUP asked for system calls (lk::kSetupSyscallReads)
  int32_t rseq_cpu = -1;        // RingProducer::rseq_cpu of every ring this process claims
  HistSlot hist[events::kHistMaxSlots];  // this area's histogram tables, by slot
};

extern std::atomic<AreaState*> g_area;

// The unwind tables the daemon handed (UNWIND, control.cc), for the stack walks of the
// hit path (hit.cc): added under g_ctl_mu, published by the count, never removed (a
// later table of the same range is found first).
inline constexpr uint32_t kMaxUnwindTables = 256;
bool add_unwind_table(const arch::UnwindTableView& t);

// Handlers (hit.cc).
int entry_pre_handler(probecore::Kprobe* kp, PtRegs* regs);
int return_entry_handler(probecore::KretprobeInstance* ri, PtRegs* regs);
int return_handler(probecore::KretprobeInstance* ri, PtRegs* regs);
// Every probe's miss_handler: the miss counts in the area's misses[counter_slot]
// (kprobe_profile's second column, read by the daemon without asking).
void probe_missed(probecore::Kprobe* kp);
// The r_brk hook: sends the thread to dl_stub() in place of _dl_debug_state.
int dl_hook_pre_handler(probecore::Kprobe* kp, PtRegs* regs);
void dl_hook_post_handler(probecore::Kprobe* kp, PtRegs* regs, unsigned long flags);
// The spawn guards' handlers (hit.cc, registered by spawn_guard.cc): a child that runs on
// this thread's TLS (vfork, posix_spawn) records nothing, never as its parent.
int vfork_return_pre_handler(probecore::Kprobe* kp, PtRegs* regs);
int spawn_entry_handler(probecore::KretprobeInstance* ri, PtRegs* regs);
int spawn_return_handler(probecore::KretprobeInstance* ri, PtRegs* regs);
// Where glibc's thread descriptor keeps the thread id (bytes from the descriptor), so a
// handler reads it without a system call; -1 when unknown or untrusted, and then handlers
// ask the kernel once per thread and area. Set at startup (bootstrap.cc).
extern long g_tid_offset;
// Forget this thread's ring (fork child: the area is the parent's).
void forget_thread_ring();
// The thread ends: its ring, if it has one in the current area, is retired and forgotten.
void retire_thread_ring();
// Retiring rings at thread exit (thread_exit.cc): init_thread_exit once, before any ring
// is claimed (ensure_engine); watch_thread_exit on a thread's claim, so that its
// retire_thread_ring runs when it ends.
void init_thread_exit();
void watch_thread_exit();

// ---------------------------------------------------------------------------------------
// The control plane (control.cc). Every function here with g_ctl_mu held.

extern std::mutex g_ctl_mu;

// Serves one request; fills the reply. Never throws; a request that does not apply
// changes nothing. `received_fd` is the descriptor that came with it (SETUP), taken over.
void handle_request(const lk::Message& m, int received_fd, lk::Reply* reply);
// Removes every probe (the daemon's, the r_brk hook) and the ring area; the program runs
// on untraced. After tracer death, DETACH, or a fork child that found no daemon.
void teardown();
// Start-up, until GO: probes defined meanwhile are enabled together when it ends
// (control.cc).
void begin_startup();
void end_startup();
// Drops the ring area (and the spare) without a grace period: a fork child, whose only
// thread is the caller.
void drop_area_in_child();
// Fork with spare areas (SPARE, events/link.h). In the parent: the oldest spare is the
// child's now, never to be used here. In the child: that spare becomes the area, in place
// of the parent's, and its id is returned; with no spare, drop_area_in_child() and 0.
// Neither makes a system call for an area when a spare was held: views that are no one's
// any more are unmapped at the next SETUP or SPARE (control.cc).
void take_spare_in_parent();
uint32_t adopt_spare_in_child();
// Number of the daemon's probes registered (tests, logs).
size_t probe_count();
// Their ids, or none when there are more than `max` (HELLO of a fork child).
std::vector<uint32_t> probe_ids(size_t max);
// The same into out[0, cap), allocating nothing (a fork child's HELLO): false when there
// are more than cap.
bool probe_ids_into(uint32_t* out, size_t cap, size_t* n);

// ---------------------------------------------------------------------------------------
// The link (bootstrap.cc).

// Sends m on the current link (g_send_mu taken inside). 0 or a negative errno.
int send_on_link(const lk::Message& m);
// The same, without waiting for room in the socket: -EAGAIN when there is none.
int send_on_link_now(const lk::Message& m);
uint32_t next_agent_seq();
// Whether a control thread serves the link now (MAPPED needs it to receive the answer).
bool control_thread_running();

// ---------------------------------------------------------------------------------------
// The signal guard (the program keeps its signal calls, the agent keeps its SIGTRAP,
// SIGSEGV and SIGBUS handling; guards.cc).

// `also`: registered, disabled probes enabled in the guards' write window (a process that
// starts: its own, at GO).
int install_guards(probecore::Kprobe* const* also = nullptr, int n_also = 0);
void uninstall_guards();

// The spawn guards (spawn_guard.cc): vfork's and posix_spawn's children, which run on
// their parent thread's TLS, record nothing. Best effort; guards.cc installs them with
// the signal guards.
void install_spawn_guards();
// Their probes registered, disabled, and put in out (at most max; kMaxSpawnGuards is all
// of them), for the caller to enable with others; 0 when installed already.
inline constexpr size_t kMaxSpawnGuards = 3;
size_t register_spawn_guards(probecore::Kprobe** out, size_t max);
void uninstall_spawn_guards();
size_t spawn_guard_addresses(uintptr_t* out, size_t max);
// Reads of target memory may go through arch::safe_copy (the agent's SIGSEGV/SIGBUS
// handler fixes their faults up).
bool fault_fixup_installed();

// ---------------------------------------------------------------------------------------
// The r_brk hook (dl_hook.cc).

// Registers the hook probe on the dynamic linker's r_brk. 0 or a negative errno.
int install_dl_hook();
void remove_dl_hook();
// The hook's address while it is registered, else 0.
uintptr_t dl_hook_address();
// The control thread received a message that belongs to a MAPPED exchange in flight
// (a DEFINE with kFlagAnswer, or the REPLY to MAPPED): true when the mailbox took it.
bool dl_mailbox_offer(const lk::Message& m);
// The link ended: wake the loading thread that waits for an answer.
void dl_mailbox_close();
// A new link: MAPPED exchanges may start once its control thread exists.
void dl_mailbox_open();
// The control thread exists (its pthread_create returned): a loading thread that waits
// for an answer will get one. Before, a loading thread does not wait: it holds the
// dynamic linker's TLS lock, which that pthread_create takes.
void dl_mailbox_reader_created();
// Around fork (the atfork handlers): the mailbox's lock is held across the fork, taken
// after the agent's other locks, so that the child never inherits it locked by a thread
// that does not exist there.
void dl_mailbox_lock_for_fork();
void dl_mailbox_unlock_after_fork();
extern "C" void probefs_agent_dl_stub();

}  // namespace probefs::agent
