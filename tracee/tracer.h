// The daemon's view of everything it traces: the processes (targets), the probes defined
// in them, their counters, and the records they write. This is the whole interface the
// filesystem (fs/) needs from the layers below it; fs keeps the user-visible objects
// (event names, groups, ids, format files, error_log) and calls in here to make them real.
//
//   Tracer
//   ├─ targets: launched (LD_PRELOAD), attached (ptrace injection), their fork children,
//   │           each with an agent (libprobefs-agent.so) on a private link and a ring area
//   ├─ probes:  one per place of an event; placed in every target where it applies, now
//   │           and later (a library mapped later, a module name that appears, a new target)
//   └─ reader:  the records of every ring of every target, in timestamp order, with the
//               kernel's lost-event counts
//
// Where a probe applies (DESIGN.md §6):
//   - uprobe syntax PATH:OFFSET: every target that maps that file, matched by device and
//     inode (not by name), at the run-time address of the file offset; a library mapped
//     later gets the probe before its code runs (the agent stops the dynamic linker at its
//     r_brk while the probe is placed).
//   - kprobe syntax SYM[+OFFS]: resolved in each target (executable first, then libraries
//     in load order). When no current target has SYM (none at all included), the
//     definition fails with ENOENT, as a kernel kprobe on an unknown symbol does.
//     MOD:SYM[+OFFS]: in targets that have loaded MOD (a basename, with or without its
//     version suffix, the executable's included); where MOD is not loaded yet, it waits
//     for it, as a kernel kprobe waits for its module: the way to define a probe before
//     the program is launched. MEMADDR: that address in every target.
//
// Errors follow the kernel: every call that can fail returns 0 or a negative errno, and
// the calls that take a definition also fill in a Diagnostic (message, caret position)
// when the kernel would log one in error_log.
//
// Threads: every method may be called from any thread. The calls that change targets or
// probes are serialised; the records, `targets`, wait_exit, symbolizer() and the buffer
// size are read without waiting for them (tracee/tracer_impl.h says which lock guards
// what). Target notices are delivered on the tracer's own thread, with no lock held: a
// listener may call back into the Tracer.
//
// A stopped target (SIGSTOP, a debugger) holds nobody up: a request to it waits in its
// link, in order, and takes effect as soon as it runs again; the call goes on at once,
// and the queries answer what it said last.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "events/compile.h"
#include "events/definition.h"
#include "events/errors.h"
#include "events/control_page.h"
#include "events/filter.h"
#include "events/hist.h"
#include "events/output.h"

namespace probefs::tracee {

enum class TargetOrigin : uint8_t { kLaunched, kAttached, kForked };

struct TargetInfo {
  pid_t pid = 0;
  pid_t parent = 0;          // the target it was forked from; 0 otherwise
  TargetOrigin origin = TargetOrigin::kLaunched;
  std::string exe;           // /proc/PID/exe at the time it joined (or exec'd)
  std::string comm;
  // Empty for a target. Otherwise the process was refused and runs untraced, for this
  // reason (one word: "target-limit"), or probefs cannot enter it (`untraceable`, the
  // reason one of tracee/untraceable.h's states: "static", "secure-exec", "foreign",
  // "no-agent"); targets() lists the last few such while they run.
  std::string untraced;
  bool untraceable = false;
  // Requests it has not done yet because it is stopped (SIGSTOP, a debugger): they wait
  // in its link, in order, and take effect when it runs again.
  size_t deferred = 0;
  // Probes defined earlier that could not go into it (TargetNotice::kNotPlaced).
  size_t not_placed = 0;
};

// What happened to a target, for the `targets` file and for readers that wait on one.
struct TargetNotice {
  enum class Kind : uint8_t {
    kJoined,    // launched or attached, agent ready, probes placed
    kForked,    // a target's fork child joined with its parent's probes
    kExeced,    // a launched target (or its child) exec'd and its new image joined
    kExited,    // the process ended; `status` is its wait status where known, else -1
    kDetached,  // detach() finished: its agent removed every probe and is idle
    kLeft,      // an attached target exec'd: the new image has no agent (see README)
    kRefused,   // a fork child or new image was refused and runs untraced (`reason`)
    kNotPlaced, // a probe defined earlier could not go into this target (`diag`): once
                // per probe and target
  };
  Kind kind = Kind::kJoined;
  pid_t pid = 0;
  pid_t parent = 0;
  int status = -1;
  std::string reason;     // kRefused: why, one line
  bool untraceable = false;  // kRefused: probefs cannot enter it (TargetInfo::untraceable)
  events::Diagnostic diag;  // kNotPlaced: the kernel's error_log entry for it
};

using ProbeId = uint32_t;

// One probe of an event, as fs defines it: the parsed line, the event it belongs to
// (`event_id` becomes each record's common_type) and the event compiled once for its
// record layout and format. The tracer compiles again per target where the definition
// names data symbols (`@SYM`), whose addresses differ between processes: for `compiled`,
// a resolver that gives any address will do (the layout does not depend on it).
struct ProbeSpec {
  events::ProbeDefinition def;
  events::CompiledEvent compiled;
  uint16_t event_id = 0;
  bool enabled = false;
  // Optional; set_filter() changes it later.
  std::shared_ptr<const events::CompiledFilter> filter;
  // The histograms its hits count into, its event's triggers, and the buffers the event
  // is in soft mode in (it records into buffer b only while its control-page bit of b is
  // clear: set_soft_disabled); set_hists() changes them.
  std::vector<events::HistProgram> hists;
  std::vector<events::TriggerSpec> triggers;
  uint32_t soft = 0;  // bit b: in soft mode in buffer b
  // The buffers its records go into (bit b: buffer b; bit 0 the top level's, the others
  // instances'); set_probe_buffers() changes it. Only while the probe is enabled.
  uint32_t buffers = 1;
  // By buffer: the event's filter in each instance that has one (`filter` is the top
  // level's); set_instance_filter() changes them.
  std::vector<std::shared_ptr<const events::CompiledFilter>> instance_filters;
};

// What a histogram holds now, summed over every target that counted into it (live or
// gone since).
struct HistSnapshot {
  events::HistEntries entries;
  events::HistTotals totals;
};

class Tracer;

// Names the addresses of one target for kprobe-style trace lines (sym+off/size), as its
// program is mapped now (Tracer::symbolizer). Beside them, each event's probes carry the
// note kprobes/list shows after them (ifunc_note, tracee/elf_symbols.h): where a
// definition's symbol is an IFUNC, its probe sits on the implementation and the line
// names that, followed by " (memcpy)".
class TargetSymbolizer : public events::Symbolizer {
 public:
  // lookup(), with out->note set where `addr` is a place of a probe of event `event_id`
  // that carries one. The views stay valid until the calling thread's next lookup.
  virtual bool lookup_event(uint64_t addr, uint16_t event_id, events::SymbolInfo* out) = 0;
};

// One event's view of a target's names, for the lines of that event's records: what
// format_trace_line is given, so that the probe's address shows its note.
class EventSymbolizer final : public events::Symbolizer {
 public:
  EventSymbolizer(TargetSymbolizer* target, uint16_t event_id)
      : target_(target), event_id_(event_id) {}
  bool lookup(uint64_t addr, events::SymbolInfo* out) override {
    return target_->lookup_event(addr, event_id_, out);
  }

 private:
  TargetSymbolizer* target_;
  uint16_t event_id_;
};

// A place in the walk of the records not consumed (`trace`), kept between calls so that a
// reader that takes the buffer in chunks walks it once (Tracer::for_each_record). Each
// walk belongs to one caller at a time; any number may exist at once. It keeps alive the
// ring areas it walks, until its next call finds them freed or it is destroyed.
class RecordWalk {
 public:
  RecordWalk();
  ~RecordWalk();
  RecordWalk(RecordWalk&&) noexcept;
  RecordWalk& operator=(RecordWalk&&) noexcept;

 private:
  friend class Tracer;
  struct State;  // tracee/tracer_records.cc
  std::unique_ptr<State> state_;
};

struct ProbeProfile {
  uint64_t hits = 0;    // records the probe's handler ran for, in every target
  uint64_t misses = 0;  // hits not handled (recursion, every kretprobe instance in use)
};

// One record, as the reader hands it out: valid until the next call on the reader.
//
// Who wrote it is the daemon's fact, never the record's claim (DESIGN.md §8): `pid` is the
// target whose ring area holds it, `tid` the thread that owns the ring, checked to be a
// thread of `pid` (or one that is gone and now no process's). The payload's own
// common_pid, flags and preempt count are whatever the process wrote: a reader shows
// these two fields instead. Records a target has no business writing never reach a
// reader: an event id it was given no probe of, trace_marker's id (only the daemon's own
// writes carry it), a ring owned by another process's thread, fewer than 8 bytes. They are
// consumed, dropped and counted (rejected_records).
struct TraceRecord {
  pid_t pid = 0;             // the target (thread group) that wrote it; 0: the daemon
  pid_t tid = 0;             // its thread (the daemon's own records: the writer's)
  uint32_t cpu = 0;
  uint64_t ts_ns = 0;        // in the current trace clock
  const uint8_t* data = nullptr;  // the events record (events/compile.h layout)
  uint32_t len = 0;
  // Records dropped from this record's ring because it was full, since the last record
  // the reader returned from it: trace_pipe prints "CPU:%d [LOST %lu EVENTS]" first.
  uint64_t lost_before = 0;
  uint16_t id = 0;  // a target's record: the event id it was admitted with
};

class Tracer {
 public:
  struct Options {
    std::string agent_path;          // libprobefs-agent.so
    uint32_t buffer_size_kb = 1410;  // each thread's ring (the kernel's per-CPU size)
    // Threads that can have a ring at once, per target (at most events::kRingMaxCount). A
    // ring costs memory only once its thread writes; a new thread takes over the drained
    // ring of one that is gone; a thread that finds none records nothing, and its records
    // are counted lost (trace_pipe's LOST line before the target's next record).
    uint32_t rings_per_target = 1024;
    // Ring areas at once: targets, and departed targets whose records are not read yet.
    // A new target beyond it first pushes out the oldest departed target's unread records
    // (counted as lost); with none to push out it is refused (-ENOSPC, a kRefused notice)
    // and runs untraced. Each area costs the daemon a mapping and a few KiB of its heap.
    uint32_t max_targets = 4096;
  };

  // nullptr and *error on failure (no link could be set up). Raises this process's soft
  // RLIMIT_NOFILE to the hard limit (each target holds a descriptor of its link);
  // programs it launches start with the soft limit it had.
  static std::unique_ptr<Tracer> create(const Options& opts, std::string* error);
  // Detaches from every target (each agent removes its probes and idles; launched
  // targets run on) and frees the rings.
  ~Tracer();
  Tracer(const Tracer&) = delete;
  Tracer& operator=(const Tracer&) = delete;

  // ---- targets ------------------------------------------------------------------------

  struct LaunchSpec {
    std::vector<std::string> argv;  // argv[0] is searched in PATH
    std::vector<std::string> env;   // NAME=VALUE added to this process's environment
    // The child's stdin, stdout, stderr: -1 keeps this process's.
    int stdin_fd = -1;
    int stdout_fd = -1;
    int stderr_fd = -1;
  };
  // Starts a program with the agent preloaded; every probe defined and enabled before this
  // call fires from the first instruction of main on. The child runs on when the tracer
  // goes; the tracer reaps it, and its exit is a kExited notice with its wait status.
  [[nodiscard]] int launch(const LaunchSpec& spec, pid_t* pid, std::string* error);
  // Injects the agent into a running process (ptrace, then detached again) and places
  // every probe that applies. -EPERM (with the reason in *error) where ptrace is refused.
  [[nodiscard]] int attach(pid_t pid, std::string* error);
  // Removes every probe from the target and leaves its agent idle (it can be attached
  // again). -ESRCH for a pid that is not a target.
  [[nodiscard]] int detach(pid_t pid);
  std::vector<TargetInfo> targets() const;
  // Waits at most `timeout_ms` for target `pid` to end: 0 and its wait status (-1 for a
  // process the tracer did not start), -ETIMEDOUT, or -ESRCH when pid was never a target.
  [[nodiscard]] int wait_exit(pid_t pid, int timeout_ms, int* status);
  // `probefs exec`: process `pid` (of user `uid`, the requester's) is about to exec a
  // program itself, with the environment tracee::agent_environment(agent_path(),
  // *link_name, its LD_PRELOAD) gives (tracee/launch.h: the agent preloaded first,
  // link::kLinkEnv). Its agent's connection, from a process of that uid (SO_PEERCRED),
  // makes it a launched target, served as launch() serves one (its ring area and every
  // probe that applies, then GO, then a kJoined notice), so probes defined before fire
  // from main's first instruction on. It is not the tracer's child: nothing here reaps
  // it, and its exit is a kExited notice with status -1 (wait_exit too). The expectation
  // lapses when no agent connects within `timeout_ms` (0: at once); a later connection is
  // refused, and the agent lets the program run on untraced. No thread waits meanwhile.
  // -EINVAL (pid <= 0, timeout_ms < 0), -ESRCH (no such process), -EPERM (another uid
  // than the daemon's, unless the daemon is root), -EEXIST (pid is a target already),
  // -ENOSPC (Options::max_targets: launch and attach say so too).
  [[nodiscard]] int prepare_exec(pid_t pid, uid_t uid, int timeout_ms, std::string* link_name);

  // Process `pid` runs a program probefs cannot enter (`state`, one of
  // tracee/untraceable.h's; `why`, one line): targets() lists it as such while it runs,
  // and a kRefused notice says so once. `probefs exec` says it of itself before it execs
  // such a program; the tracer finds it of a target that exec'd one, and of a process
  // announced with prepare_exec whose agent never came.
  void note_untraceable(pid_t pid, const std::string& state, const std::string& why);
  const std::string& agent_path() const;
  // Replaces the listener (nullptr: none).
  void on_target_notice(std::function<void(const TargetNotice&)> listener);

  // ---- probes -------------------------------------------------------------------------

  // Places the probe in every target where it applies (see above) and keeps it for the
  // targets and libraries to come. On failure nothing is placed anywhere: the errno and,
  // where the kernel logs one, *diag (positioned in spec.def's command).
  [[nodiscard]] int define_probe(const ProbeSpec& spec, ProbeId* id, events::Diagnostic* diag);
  [[nodiscard]] int remove_probe(ProbeId id);
  [[nodiscard]] int enable_probe(ProbeId id);
  [[nodiscard]] int disable_probe(ProbeId id);
  // nullptr removes the filter.
  [[nodiscard]] int set_filter(ProbeId id, std::shared_ptr<const events::CompiledFilter> f);
  // The histograms the probe's hits count into (their slots made by create_hist), its
  // event's triggers (their counts made by create_trigger_count), and whether the event
  // is in soft mode in (bit b: buffer b).
  [[nodiscard]] int set_hists(ProbeId id, std::vector<events::HistProgram> programs,
                              std::vector<events::TriggerSpec> triggers, uint32_t soft);
  // The buffers the probe's records go into (ProbeSpec::buffers), in every target.
  [[nodiscard]] int set_probe_buffers(ProbeId id, uint32_t buffers);
  // The probe's filter for its records in instance buffer `buffer` (1 and up); nullptr
  // removes it.
  [[nodiscard]] int set_instance_filter(ProbeId id, uint32_t buffer,
                                        std::shared_ptr<const events::CompiledFilter> f);

  // ---- histograms (events/hist.h) ----------------------------------------------------
  // A histogram's tables, made in every target now and to come: its slot, or -ENOSPC when
  // events::kHistMaxSlots are in use.
  [[nodiscard]] int create_hist(const events::HistGeometry& geometry, uint32_t* slot);
  // Lets the tables go in every target (no probe counts into the slot any more).
  void destroy_hist(uint32_t slot);
  // :clear and :pause/:cont, in every target; reading never waits for one.
  void clear_hist(uint32_t slot);
  void pause_hist(uint32_t slot, bool paused);
  HistSnapshot read_hist(uint32_t slot);
  // The daemon's own hits: trace_marker's writes on ftrace/print, and the synthetic
  // events their histograms fire. Counted into a table of each program's histogram that
  // the daemon holds beside the targets' (read_hist merges it in, clear_hist and
  // pause_hist reach it; a reference reads the daemon's table of its slot). `rec` is
  // laid out as the programs' event's format says, `comm` names the writer; the
  // programs' filters decide as at a target's hit. The actions that fired are appended
  // to *fired (their `action` points into `programs`).
  void count_daemon_hists(const std::vector<events::HistProgram>& programs, const uint8_t* rec,
                          uint32_t len, std::string_view comm,
                          std::vector<events::HistFired>* fired);

  // A synthetic event as hist actions write it in every target (events/synthetic.h): its
  // records' size, whether they are written (enabled), their filter, and the histograms
  // they count into. Replaces what the event had; remove_synth() lets it go.
  struct SynthSpec {
    uint32_t size = 0;
    bool record = false;
    std::optional<events::CompiledFilter> filter;
    std::vector<events::HistProgram> hists;
  };
  [[nodiscard]] int set_synth(uint16_t event_id, SynthSpec spec);
  void remove_synth(uint16_t event_id);

  // kprobe_profile's counts, from the targets' ring areas (their agents count each hit
  // and each miss there as it happens): never waits for a target.
  ProbeProfile profile(ProbeId id);

  // The kernel's kprobes/list (every target's probes, its lines as probecore prints them,
  // and after a probe whose definition named an IFUNC " (NOTE)", ifunc_note's: "memcpy"
  // beside the implementation, "memcpy@resolver" on the resolver, "memcpy@resolver:
  // implementation unknown" where the implementation could not be known in that target)
  // and kprobes/enabled (the global arm switch, applied to every target).
  std::string kprobes_list();
  [[nodiscard]] int set_all_armed(bool armed);
  bool all_armed() const;
  // debug.kprobes_optimization, in every target.
  [[nodiscard]] int set_optimization(bool on);

  // ---- records --------------------------------------------------------------------------
  //
  // Buffers. Records go into buffers (events::kRingMaxBuffers of them): 0 is the top
  // level's, the others the instances' (instances/NAME), each with its own records,
  // tracing_on and trace_marker; they share the trace clock and the ring size. A call
  // below that takes `buffer` acts on that buffer alone.

  // ---- the control page (events/control_page.h): what every target reads at each hit,
  // and what triggers change there ----
  // tracing_on: while off, hits are counted and nothing is recorded (every target, and
  // targets to come). A traceon or traceoff trigger changes it at the hit.
  [[nodiscard]] int set_tracing_on(bool on, uint32_t buffer = 0);
  bool tracing_on(uint32_t buffer = 0) const;
  // An event in soft mode records only while this is false; an enable_event or
  // disable_event trigger changes it at the hit.
  // Of buffer `buffer` (each buffer has its bit).
  bool soft_disabled(uint16_t event_id, uint32_t buffer = 0) const;
  void set_soft_disabled(uint16_t event_id, bool disabled, uint32_t buffer = 0);
  // Every buffer's bit clear (an event id that goes, or comes again).
  void clear_soft_disabled(uint16_t event_id);
  // A trigger's count (traceoff:3): a slot holding `count`, which the trigger's hits take
  // from; -ENOSPC when every slot is taken.
  [[nodiscard]] int create_trigger_count(int64_t count, uint32_t* slot);
  int64_t trigger_count(uint32_t slot) const;
  // Takes one from the count, as a target's hit does (a trigger the daemon runs itself:
  // trace_marker's); true when there was one (events::kNoCountSlot: always).
  bool take_trigger_count(uint32_t slot);
  // How many snapshot triggers fired in buffer `buffer` so far (each wrote a request
  // record into its ring: events/ring.h, kSnapshotRequestEventId).
  uint32_t snapshot_requests(uint32_t buffer) const;
  void destroy_trigger_count(uint32_t slot);

  // options/stacktrace and options/userstacktrace: every target writes a kernel_stack or
  // user_stack record (events/ring.h) after each record of an event, from now on.
  int set_stack_options(bool kernel_stack, bool user_stack);

  // Adds a record written by the daemon itself (trace_marker): `len` bytes of an events
  // record (events/compile.h), stamped now as the targets' records are (the TSC, or for
  // the `counter` clock the daemon's own counter: converted alike) on the calling CPU,
  // and merged with the targets' records in timestamp order; its TraceRecord has pid 0.
  // The daemon's buffer is one ring of buffer_size_kb, emptied by clear_records and by a
  // clock or size change like the others. Any thread may call it. -ENOSPC when that
  // buffer is full (the record is lost, and the next one reports it in lost_before, as a
  // target's ring does), -EBADF while tracing_on is 0 (the kernel's answer for
  // trace_marker then), -EINVAL for no bytes or more than the buffer can ever hold.
  [[nodiscard]] int write_record(const void* data, uint32_t len, uint32_t buffer = 0);

  // The next record of all targets in timestamp order, consumed (trace_pipe). false when
  // there is none now.
  bool next_record(TraceRecord* out);
  // Consumes records in timestamp order, handing each to `fn` (valid during the call),
  // until `fn` returns false, `max` were consumed, or none is left: the consumer's fast
  // path (one lock for the batch). The number consumed. `cpu` >= 0 takes only records of
  // that CPU (per_cpu/cpuN/trace_pipe): a thread's ring whose next record was written on
  // another CPU holds back its later records until that one is consumed. `fn` must not
  // call the Tracer (it runs under the reader's lock), nor may for_each_record's.
  size_t consume_records(const std::function<bool(const TraceRecord&)>& fn, size_t max,
                         int cpu = -1, uint32_t buffer = 0);
  // consume_records() for a consumer that copies each record itself, in batches of up to
  // kInPlaceBatch records, every one consumed; `fn` returns false to take no more. A
  // target's record's `data` points into that target's memory, which it may change at
  // any time: copy the bytes once, check the copy, and take it only if its event id is
  // still `id`. The raw readers' path: a run of one thread's records behind the first is
  // taken without the merger's and the admission's per-record work (tens of millions of
  // records a second).
  //
  // With `pass`, the calls that share it take the rest of the merger's current snapshot
  // (an earlier call's look), then what one fresh look at the rings finds, and then
  // none (looks that find nothing do not count): a raw reader's fill, which would
  // otherwise chase a busy producer a few records at a time, reading each cache line of
  // its ring while the producer still writes it. What comes meanwhile is the next pass's.
  struct ReadPass {
    bool begun = false;
    bool took = false;       // a record was consumed in the pass
    uint64_t snapshots = 0;  // the merger's count when the pass began
  };
  static constexpr size_t kInPlaceBatch = 64;
  size_t consume_records_in_place(const std::function<bool(std::span<const TraceRecord>)>& fn,
                                  size_t max, int cpu = -1, uint32_t buffer = 0,
                                  ReadPass* pass = nullptr);
  // Waits until a record may be there or `timeout_ms` passed (a bounded wait: a wake-up
  // can be missed at most for that long, a record is never lost). true if woken.
  // `buffer` >= 0: records of that buffer (others may still wake it).
  bool wait_for_records(int timeout_ms, int buffer = -1);
  // Wakes a wait_for_records() in another thread (a reader closing its file).
  void interrupt_wait();
  // Every record not yet consumed, in timestamp order, without consuming them (trace).
  void for_each_record(const std::function<void(const TraceRecord&)>& fn, uint32_t buffer = 0);
  // Goes on with `walk`: hands `fn` the records not consumed, in timestamp order, from
  // where the walk stopped (a new walk: the first record in the buffer), until `fn`
  // returns false (its record counts as handed out) or none is left. The number handed
  // out. Nothing is handed out twice; records consumed or dropped since are passed over
  // (after clear_records the walk goes on with the records written since); records
  // that arrive meanwhile come when the walk reaches them, so a thread's record stamped
  // before one of another thread already handed out comes after it. `fn` must not call
  // the Tracer.
  size_t for_each_record(RecordWalk* walk, const std::function<bool(const TraceRecord&)>& fn,
                         uint32_t buffer = 0);
  // Drops every record not yet consumed (`echo > trace`).
  void clear_records(uint32_t buffer = 0);
  // An instance's buffer is not read any more (rmdir): its records go, and what reading
  // it kept (its mergers' state for every area) is let go until it is read again.
  void release_buffer(uint32_t buffer);
  // The trace header's counts, as the kernel's: `entries`, the records in the buffer now;
  // `written`, those and the records dropped since the buffers were last emptied (for
  // want of room, or of a ring for the thread), where the kernel counts the ones
  // overwritten. Records consumed count in neither: a drained buffer that lost nothing
  // shows 0/0.
  void record_counts(uint64_t* entries, uint64_t* written, uint32_t buffer = 0);
  // Whether a consuming read would find a record now (poll), without consuming: of any
  // CPU, or for `cpu` >= 0 what consume_records(.., cpu) can take.
  bool has_records(int cpu = -1, uint32_t buffer = 0);
  // Connections of agents the listener turned away so far (diagnostics, tests).
  uint64_t refused_links() const;
  // Records dropped because their target had no business writing them (TraceRecord), on
  // CPU `cpu` (-1: all), since the buffers were last emptied: per_cpu/cpuN/stats counts
  // them among its dropped events.
  uint64_t rejected_records(int cpu = -1, uint32_t buffer = 0);
  // Rings (threads) that hold records or belong to a thread now, the daemon's own
  // (trace_marker) while it holds records: buffer_total_size_kb is this many times
  // buffer_size_kb.
  uint64_t rings_in_use(uint32_t buffer = 0);
  // Rings of the targets' areas the daemon freed after their threads retired them (at
  // thread exit), rather than found their owners gone.
  uint64_t rings_freed_retired();

  // trace_clock: "local", "global", "counter", "mono", ... (events/trace_clock.h); a change
  // empties the buffers, as the kernel's does. -EINVAL for an unknown name.
  [[nodiscard]] int set_trace_clock(const std::string& name);
  std::string trace_clock_text() const;  // "[local] global counter ..."
  // The size of each thread's ring from now on (existing targets are given new rings;
  // every unconsumed record is dropped, as a kernel resize keeps none either).
  [[nodiscard]] int set_buffer_size_kb(uint32_t kb);
  uint32_t buffer_size_kb() const;

  // kprobes/blacklist: "0x%016lx-0x%016lx\tNAME\n" lines ([start, end), the kernel's
  // format), the code no probe may be put on in the targets: what each target's engine
  // refuses (asked over the link: the agent's own text, the signal-return path), named
  // as the kernel's %ps names the start (the symbol there, " [module]" for a library;
  // "[module]" where no symbol covers it; the address where nothing is known). A line
  // that two targets share (a fork child's) is listed once.
  std::string kprobes_blacklist();

  // Names addresses of target `pid` for kprobe-style trace lines (sym+off/size), as its
  // program is mapped now. A target that is gone keeps its symbolizer while records of
  // it can be in the buffer (its ring area is freed once drained), and the symbolizers of
  // the last few targets whose areas were freed are kept for the records readers took
  // and print later. nullptr for a pid of none of these. Any thread may use it; the
  // names a lookup returns stay valid until that thread's next lookup. (After an exec,
  // the pid's symbolizer is the new program's, also for the old program's records.)
  std::shared_ptr<TargetSymbolizer> symbolizer(pid_t pid);
  // Every symbolizer symbolizer() would give, newest first: for addresses whose process
  // is not known (a histogram's stack keys merge every target's tables).
  std::vector<std::shared_ptr<TargetSymbolizer>> symbolizers();
  // The name of thread `tid` of target `pid` for trace lines, as the kernel's
  // saved_cmdlines gives it: the thread's name now while it lives (/proc); once it is
  // gone, the name it had when it claimed its ring (its agent stores it there with the
  // thread's first record in that area), which outlives the ring by the newest few
  // thousand threads; else "<...>". A thread renamed after its first record shows the
  // new name while it lives and the old one once gone.
  std::string comm_of(pid_t pid, pid_t tid);

  struct Impl;  // the implementation's state (tracee/tracer_impl.h)

 private:
  explicit Tracer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace probefs::tracee
