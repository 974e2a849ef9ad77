// Event triggers and the record gate: what an event's `trigger` file holds (traceon,
// traceoff, stacktrace, enable_event, disable_event, each with an optional count and
// filter), the soft
// mode that enable_event/disable_event put their target in, and the gate that applies both
// to records as the trace readers take them (EventTable::set_gate).
//
// How this differs from the kernel, where triggers run in the probe handler at the hit:
//   - Triggers act when the daemon reads a record, once per record and in timestamp
//     order, not when the probe fires. A record no reader has taken yet has fired nothing.
//   - They act on records only: a hit whose record the event's filter dropped (the filter
//     runs in the traced process), a hit while tracing is off (nothing is recorded then)
//     and a lost record (full ring) fire no trigger. In the kernel an unconditional
//     trigger fires on every hit, and a traceon can end a traceoff that way; here a
//     traceon fires only on records written before tracing really stopped.
//   - traceoff hides every record read after the one that fired it (so every later
//     timestamp), including records the targets had written before they learnt that
//     tracing was off; the tracer is switched off right after, from the gate's own thread
//     (Tracefs::set_tracing_on), since the gate runs inside a trace reader and must not
//     call into the tracer. When tracing is turned on again through tracing_on rather
//     than by a trigger, records are shown again within a few tens of milliseconds.
//   - A soft-disabled event's probes run and write records, as its tracepoint does in
//     the kernel; the gate drops those records as it reads them, so an event that is
//     soft-enabled at read time shows records written while it was soft-disabled.
//   - stacktrace: the event's probes take the stack at every hit (a kernel_stack record
//     after the event's, events/ring.h); the gate shows it when the trigger's filter
//     matched the event's record and its count lasts (stack_shown).
//   - Which record a trigger shows follows what the kernel's uprobe events do: the record
//     that fires traceoff is shown; the record that fires an unconditional traceon is
//     shown, one that fires a traceon with a filter is not.
//
// Threads: the gate's state has its own lock, apart from the definitions' lock (fs/
// dynamic_events.cc takes the definitions' lock first, then this one). The gate never
// calls into the tracer or the tree while holding it: admit() runs inside the tracer's
// record reader, which holds the tracer's reader lock.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <vector>

#include "events/filter.h"
#include "tracee/tracer.h"

namespace probefs::fs {

struct EventView;

enum class TriggerKind : uint8_t { kTraceOn, kTraceOff, kEnableEvent, kDisableEvent, kStackTrace };

// One write to an event's trigger file:
//   [!]traceon|traceoff|stacktrace[:COUNT] [if FILTER]
//   [!]enable_event|disable_event:SYSTEM:EVENT[:COUNT] [if FILTER]
// COUNT is a kstrtoul number of any base; text after it up to a blank is ignored, as the
// kernel ignores it. The whole write is one trigger (a newline inside is an error).
struct TriggerCommand {
  TriggerKind kind = TriggerKind::kTraceOn;
  bool remove = false;
  std::string system;  // enable_event / disable_event: the target event
  std::string event;
  int64_t count = -1;  // -1: unlimited
  bool has_filter = false;
  std::string filter;  // as read back: after "if" and one blank, trailing blanks cut
};

// 0, or -EINVAL for anything else (hist, snapshot, unknown words, a bad count, "if"
// without a filter).
[[nodiscard]] int parse_trigger(std::string_view text, TriggerCommand* out);

// What an event's trigger file reads when it holds no trigger.
std::string_view no_triggers_text();

class TriggerGate {
 public:
  // One event's soft state and triggers (opaque outside the gate).
  struct Event;
  using EventPtr = std::shared_ptr<Event>;

  struct Trigger {
    TriggerKind kind = TriggerKind::kTraceOn;
    int64_t count = -1;  // what is left; -1: unlimited
    bool has_filter = false;
    std::string filter_text;
    std::shared_ptr<const events::CompiledFilter> filter;
    EventPtr target;          // enable_event / disable_event
    std::string target_name;  // "SYSTEM:EVENT"
  };

  struct Hooks {
    // Called from the gate's own thread, without any of the gate's locks held.
    std::function<void(bool on)> set_tracing_on;
    std::function<bool()> tracing_on;
    // The name of thread `tid` of target `pid`, for trigger filters that test `comm`.
    std::function<std::string(pid_t pid, pid_t tid)> comm_of;
  };

  explicit TriggerGate(Hooks hooks);
  ~TriggerGate();
  TriggerGate(const TriggerGate&) = delete;
  TriggerGate& operator=(const TriggerGate&) = delete;

  // The gate's record of event `id`, from its creation to its removal.
  EventPtr add_event(uint16_t id);
  void remove_event(uint16_t id);

  bool soft_disabled(const Event& ev) const;
  void set_soft_disabled(Event& ev, bool on);

  // The trigger file's text.
  std::string show(const Event& ev) const;
  // traceon and traceoff share one place per event, enable_event and disable_event one
  // per target: true when that place is taken.
  bool taken(const Event& ev, TriggerKind kind, const Event* target) const;
  // Adds `t` first (the file lists the newest first).
  void add(Event& ev, Trigger t);
  // Removes the trigger in that place; false when there was none. *target_out gets the
  // removed trigger's target (enable_event / disable_event), else nullptr.
  bool remove(Event& ev, TriggerKind kind, const Event* target, EventPtr* target_out);
  // Removes every trigger of `ev`; the targets of those that had one.
  std::vector<EventPtr> remove_all(Event& ev);

  // The EventTable gate: whether the record is shown; fires the event's triggers.
  bool admit(const EventView& view, const tracee::TraceRecord& rec);
  // Whether the kernel_stack record after the last record admit() saw of that thread is
  // shown: its event's stacktrace trigger fired for it, or the event has none (the stack
  // is options/stacktrace's).
  bool stack_shown(pid_t pid, int32_t tid) const;
  // True while admit() would show every record and fire nothing.
  bool quiet() const { return quiet_.load(std::memory_order_acquire); }

  // Waits until every tracing_on change the triggers asked for has been made, then
  // looks at tracing_on at once (rather than at the thread's next look).
  void sync();
  // Stops the gate's thread (the mount is going away): changes asked for later are
  // dropped.
  void stop();

 private:
  bool fire(Trigger& t);
  void request_tracing(bool on);
  void update_quiet();
  void worker();
  void poll_user_on();
  Event* lookup(uint16_t id) const;

  Hooks hooks_;

  // ---- guarded by mu_: every event's soft state and triggers, the tracing state as the
  // records show it ----
  mutable std::mutex mu_;
  std::vector<EventPtr> by_id_;  // index: id - kFirstEventId
  size_t trigger_count_ = 0;
  size_t soft_disabled_count_ = 0;
  // A traceoff fired: later records are hidden. Written under mu_; the gate's thread
  // reads it without.
  std::atomic<bool> tracing_off_{false};
  uint64_t off_generation_ = 0;  // counts the traceoffs that fired
  // True while nothing above can hide a record or fire a trigger: admit() then returns
  // at once, without the lock.
  std::atomic<bool> quiet_{true};
  // stack_shown(): by thread (pid << 32 | tid), what the last admit() of its records said.
  std::unordered_map<uint64_t, bool> stack_shown_;

  // ---- guarded by work_mu_ (taken after mu_, never before): the tracing_on changes for
  // the gate's thread ----
  std::mutex work_mu_;
  std::condition_variable work_cv_;
  std::condition_variable done_cv_;
  std::optional<bool> pending_;
  bool applying_ = false;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace probefs::fs
