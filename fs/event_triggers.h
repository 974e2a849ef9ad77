// Event triggers: what an event's `trigger` file takes and holds (traceon, traceoff,
// stacktrace, enable_event, disable_event, each with an optional count and filter), and
// how each becomes what the event's probes run at the hit (events::TriggerSpec).
//
// Triggers act at the hit, in the traced process, as in the kernel: the event's probes
// carry them (Tracer::set_hists), their counts live in the control page every target
// shares (events/control_page.h), and traceon/traceoff and enable_event/disable_event
// change tracing_on and the target event's soft-disabled byte there. A traceoff stops
// every target at its next hit, whether anyone reads or not. The daemon only keeps the
// definitions (fs/event_files.cc, under the definitions' lock) and reads the counts back.
//
// Soft mode: an event with triggers, and an event an enable_event or disable_event
// targets, runs its probes whether or not it is enabled, and records only while it is
// soft-enabled (its enable file reads "1*", or "0*" while soft-disabled).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "events/control_page.h"
#include "events/filter.h"

namespace probefs::fs {

enum class TriggerKind : uint8_t {
  kTraceOn,
  kTraceOff,
  kEnableEvent,
  kDisableEvent,
  kStackTrace,
  kSnapshot,
};

// One write to an event's trigger file:
//   [!]traceon|traceoff|stacktrace|snapshot[:COUNT] [if FILTER]
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

// 0, or -EINVAL for anything else (hist, unknown words, a bad count, "if" without a
// filter).
[[nodiscard]] int parse_trigger(std::string_view text, TriggerCommand* out);

// What an event's trigger file reads when it holds no trigger (`marker`: of
// events/ftrace/print, which takes no stacktrace).
std::string_view no_triggers_text(bool marker = false);

struct DynEvent;

// One trigger on an event, as its trigger file lists it.
struct Trigger {
  TriggerKind kind = TriggerKind::kTraceOn;
  int64_t count = -1;                    // as written; -1: unlimited
  uint32_t count_slot = events::kNoCountSlot;  // what is left: Tracer::trigger_count
  bool has_filter = false;
  std::string filter_text;
  std::shared_ptr<const events::CompiledFilter> filter;
  DynEvent* target = nullptr;  // enable_event / disable_event (held in soft mode by it)
  std::string target_name;     // "SYSTEM:EVENT"
  // The buffer whose trigger file holds it (0: the top level's; an instance's only on
  // events/ftrace/print): the buffer its traceon, traceoff and snapshot act on.
  uint32_t buffer = 0;
};

// traceon and traceoff share one place per event, stacktrace and snapshot have their
// own, enable_event and disable_event one per target (the kernel's trigger types).
bool same_place(const Trigger& t, TriggerKind kind, const DynEvent* target);

// The trigger's line in the trigger file; `left` is what its count has left.
std::string trigger_line(const Trigger& t, int64_t left);

// What the hit runs for it.
events::TriggerSpec hit_trigger(const Trigger& t, uint16_t target_id);

}  // namespace probefs::fs
