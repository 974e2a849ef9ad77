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
// Inter-event histograms (histogram.rst 2.2):
//   NAME=EXPR[,NAME=EXPR...]   variables, set on each hit for the hit's key
//   EXPR:  TERM, TERM OP TERM (OP: + - * /) and deeper, -(EXPR); * and / before + and -,
//          left to right, at most three operators; constants folded
//          TERM: a field, common_timestamp[.usecs], $VAR, a number
//   vals=$VAR                  a variable of this histogram, summed
//   onmatch(SYSTEM.EVENT).trace(SYNTH,PARAM,...) or .SYNTH(PARAM,...)
//          PARAM: $VAR or a field of this event, maybe qualified (SYSTEM.EVENT.$VAR: a
//          variable of that event's histograms, this event's other ones included):
//          a record of the synthetic event SYNTH
//          each time every $VAR of this histogram's expressions and params resolved
//   onmax($VAR) or onchange($VAR), then .save(FIELD,...) or .trace(...)/.SYNTH(...):
//          each entry tracks this histogram's variable VAR; when a hit's value is above
//          the entry's maximum (or differs from its last value) the entry keeps it with
//          the hit's FIELDs (printed after its values), or the synthetic event fires
// A $VAR of another histogram is read from that histogram's entry of this hit's key and
// then unset (read once), as in the kernel.
//
// What differs from the kernel (README's limits say so too):
//   - A variable is seen by later hits of the same thread only (each thread counts into
//     its own table): entry and return of a function, not a wakeup on another CPU.
//   - string variables, variables as keys and expressions that do not fold into one
//     operator between two terms are refused ("Couldn't create histogram for field"), as is the .syscall modifier and a
//     stacktrace key on a synthetic event; a stacktrace key walks frame pointers only; save() keeps numbers only ("Couldn't create field variable"
//     for a string); snapshot() fails with ENODEV, as on a kernel without a snapshot
//     buffer; a histogram has one onmax/onchange and one synthetic event to fire.
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
  bool is_timestamp = false;  // common_timestamp (flag kUsecs: in microseconds)
  bool is_stack = false;      // common_stacktrace (or stacktrace): the hit's callers, a key
  bool is_const = false;      // a number
  uint64_t constant = 0;
  std::string var;            // $VAR: the variable's name (as written, maybe SYS.EVENT.VAR)
};

// NAME=EXPR, as the targets compute it: A, or A OP B.
struct HistVarDef {
  std::string name;
  HistField a, b;
  char op = 0;       // 0, '+', '-', '*' or '/'
  std::string expr;  // EXPR as the kernel prints it (constants folded); "": from a, op, b
  std::string text() const;  // "NAME=EXPR" as the kernel prints it
};

// HANDLER.ACTION(PARAMS). HANDLER: onmatch(SYSTEM.EVENT), onmax($VAR), onchange($VAR).
// ACTION: "trace" (the first param names the synthetic event), the synthetic event's
// name, or (onmax and onchange) "save" (params: fields of this event).
enum class HistHandler : uint8_t { kMatch, kMax, kChange };
struct HistHandlerDef {
  HistHandler handler = HistHandler::kMatch;
  std::string system, event;  // onmatch
  std::string track;          // onmax/onchange: the variable as written ("$NAME")
  bool save = false;
  std::string synth;
  bool trace_keyword = false;
  std::vector<std::string> params;
  std::vector<HistField> saved;  // save(): the params, resolved
  std::string text() const;  // ":onmatch(...)..." as the kernel prints it
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
  std::vector<HistVarDef> vars;
  std::vector<HistHandlerDef> actions;  // one that fires an event, one that tracks at most
  // Whether a timestamp is read (the read-back then names the clock).
  bool uses_timestamp() const;

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

// The operand a key or value reads (not a $VAR: the caller resolves those).
events::HistOperand hist_operand(const HistField& f);

// The event's field `name` (or common_cpu) as a key or value finds it; false if none.
bool hist_find_field(const events::CompiledEvent& ev, std::string_view name, HistField* f);

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
