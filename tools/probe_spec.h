// perf probe's probe definition syntax, parsed into plain values (no DWARF, no files):
//
//   [[GROUP:]EVENT=]FUNC[@SRC][:RLN|+OFFS|%return|;PTN] [ARG ...]
//   [[GROUP:]EVENT=]SRC:ALN [ARG ...]
//   [[GROUP:]EVENT=]SRC;PTN [ARG ...]
//   ARG := [NAME=]LOCALVAR|$retval|$params|$vars|$argN|%REG|@SYM|RAWFETCHARG [:TYPE]
//   LOCALVAR := NAME | LOCALVAR->FIELD | LOCALVAR.FIELD | LOCALVAR[N]
//
// and perf probe -L's range syntax:
//
//   FUNC[@SRC][:RLN[+NUM|-RLN2]]   or   SRC[:ALN[+NUM|-ALN2]]
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "tools/result.h"

namespace probefs::tools {

// One step of a variable argument after its name.
struct ArgField {
  enum class Kind { kArrow, kDot, kIndex };
  Kind kind = Kind::kDot;
  std::string name;  // kArrow, kDot: the member
  long index = 0;    // kIndex: [N]
};

struct ProbeArg {
  std::string name;  // NAME= as written; empty when none was given
  // What is fetched: a variable name ("count"), "$retval", "$params", "$vars", "$argN", or a
  // raw fetch argument passed through as written ("%di", "+8(%sp)", "@sym", "$stack2",
  // "$comm", "\"str\"" ...).
  std::string var;
  std::vector<ArgField> fields;  // ->member, .member, [N] in order
  std::string type;              // after ':' ("s32", "string", "x64", "b4@2/32", ...); "" if none
  std::string text;              // the whole argument as written

  // Whether `var` names a variable in the program (as opposed to a raw fetch argument or
  // one of the $ names).
  bool is_variable() const;
  bool is_raw() const;  // %REG, +OFF(...), -OFF(...), @SYM, $stackN, $comm, a literal ...
};

struct ProbePoint {
  std::string function;  // FUNC (may hold glob characters: *, ?, [...]); "" for SRC:ALN
  std::string file;      // @SRC, or SRC of SRC:ALN / SRC;PTN; "" when none
  long line = 0;         // RLN (relative to FUNC's first line) or ALN (when function is "")
  bool has_line = false;
  uint64_t offset = 0;   // +OFFS from FUNC's entry
  bool has_offset = false;
  bool retprobe = false; // %return
  std::string lazy;      // ;PTN (a glob over the source line's text)
  bool has_lazy = false;
  uint64_t address = 0;  // a raw address given as FUNC ("0x1234")
  bool has_address = false;
};

struct ProbeSpec {
  std::string group;   // GROUP of [[GROUP:]EVENT=]; "" when not given
  std::string event;   // EVENT; "" when not given
  ProbePoint point;
  std::vector<ProbeArg> args;
  std::string text;    // the whole spec as given (for messages)
};

// Parses one probe definition (one -a argument, or the non-option arguments joined with
// spaces). Errors carry perf's messages ("Semantic error :..."), code -EINVAL.
Result<ProbeSpec> parse_probe_spec(std::string_view text);

// A line range for -L.
struct LineRange {
  std::string function;  // "" when a file range
  std::string file;
  long start = 0;        // RLN (function) or ALN (file); 0 with a function: from its first line
  long end = 0;          // inclusive; 0: to the function's / file's end
  bool has_end = false;
};
Result<LineRange> parse_line_range(std::string_view text);

// An event name or group as perf makes one from text: characters other than [A-Za-z0-9_]
// become '_', a leading digit gets a '_' prefix. Used for "probe_" + basename and for
// argument names derived from types ("msg_string").
std::string sanitize_event_name(std::string_view text);

// Whether `name` matches perf's glob pattern (*, ?, [...], \ escapes).
bool glob_match(std::string_view pattern, std::string_view name);

}  // namespace probefs::tools
