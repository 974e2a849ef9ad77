// Hist triggers, as the kernel's Documentation/trace/histogram.rst describes them: the
// `hist:...` command an event's trigger file takes, checked against the event's fields
// and compiled into what the targets run (events/hist.h), its read-back line, and the
// text of the event's `hist` file.
//
//   [!]hist:keys=K[,K...][:vals=V[,V...]][:sort=S[,S]][:size=N][:name=NAME]
//          [:pause][:cont][:clear] [if FILTER]
//   K, V: an event field, common_pid, common_cpu; with a modifier .hex .sym .sym-offset
//         .execname (common_pid) .log2 .buckets=N, and on values .percent .graph
//   S:    hitcount or a key or value name, with .ascending or .descending
//
// What differs from the kernel (README's limits say so too):
//   - common_timestamp, variables, expressions, actions (onmatch, onmax, onchange) and
//     the stacktrace key are refused ("Couldn't create histogram for field"), as is the
//     .syscall modifier (no system-call keys in user-space events).
//   - `size` bounds each thread's table and the merged histogram: the hits of a key that
//     finds either full count as dropped.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "events/compile.h"
#include "events/errors.h"
#include "events/hist.h"
#include "tracee/tracer.h"

namespace probefs::fs {

enum class HistFlag : uint8_t {
  kNone, kHex, kSym, kSymOffset, kExecname, kLog2, kBuckets, kUsecs, kPercent, kGraph
};

// One key or value, as written and as found in the event.
struct HistField {
  std::string name;  // the field's name ("common_cpu" for the CPU)
  HistFlag flag = HistFlag::kNone;
  uint64_t buckets = 0;
  // Resolved against the event.
  bool is_cpu = false;
  bool is_string = false;
  bool is_signed = false;
  uint32_t offset = 0;
  uint32_t size = 8;
};

struct HistSortKey {
  int field = -1;  // -1: hitcount; 0..: values, then keys, as HistSpec lists them
  bool descending = false;
};

// A parsed and resolved hist command.
struct HistSpec {
  bool remove = false;
  std::vector<HistField> keys;
  std::vector<HistField> vals;  // besides hitcount
  std::vector<HistSortKey> sort;  // at least one
  uint32_t bits = events::kHistDefaultBits;
  std::string name;  // NAME of name=NAME, or empty
  bool pause = false, cont = false, clear = false;
  bool has_filter = false;
  std::string filter;  // as written after "if", trimmed

  // What the trigger file and the hist header show, without " [active]"/" [paused]".
  std::string text() const;
  // The same, for deciding whether two commands name the same histogram (the kernel's
  // hist_trigger_match: everything but the size and the pause/cont/clear words).
  std::string identity() const;
  // The table layout it needs, and the program a hit runs (slot and filter set by the
  // caller).
  events::HistGeometry geometry() const;
  events::HistProgram program() const;
};

// Parses `text` (a whole write to a trigger file that starts with "hist" or "!hist") and
// resolves it against the event `ev` of `group`/`event`. 0, or a negative errno with *err
// set where the kernel logs an entry (err->err == 0 where it logs none).
[[nodiscard]] int parse_hist(std::string_view text, const events::CompiledEvent& ev,
                             std::string_view group, std::string_view event, HistSpec* out,
                             events::Diagnostic* err);

// A diagnostic of a hist command at `pos` in its command ("hist:" + the text after it).
events::Diagnostic hist_diagnostic(events::ErrorCode code, std::string_view command, int pos,
                                   std::string_view group, std::string_view event);

// Names addresses for .sym and .sym-offset keys: "func" or "func+0xoff/0xsize", or false.
using HistSymbolizer = std::function<bool(uint64_t addr, bool with_offset, std::string* out)>;

// One histogram's block of the hist file (the kernel's hist_trigger_show), `n` its place
// among the event's hist triggers.
std::string format_hist(const HistSpec& spec, bool paused, const tracee::HistSnapshot& snap,
                        const HistSymbolizer& sym, int n);

}  // namespace probefs::fs
