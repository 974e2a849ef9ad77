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
//
// As perf 6.1 reads them: '=', '@', '+', ':', ';' and '%' in a probe point can be escaped with
// a backslash; the first word is a SRC (not a FUNC) when it has none of "+@%", has ':' or
// ';', and a '.' before that; numbers are C literals (10, 0x1f, 017); a line or offset of 0
// is the same as none; the arguments are the words after the first, split on white space
// (no quoting). Error messages are perf's lines as it prints them ("Semantic error :..."),
// with perf's codes (-EINVAL, -EOPNOTSUPP for %foo, -ERANGE for more than 128 arguments).
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
  bool user_access = false;      // VAR@user (kprobes only: the variable is in user memory)

  // Whether `var` names a variable in the program: it starts like a C identifier. Only a
  // variable has fields; anything else is kept whole in `var`.
  bool is_variable() const;
  // Whether the argument goes to the tracefs as written: %REG, +OFF(...), -OFF(...), @SYM,
  // $retval, $argN, $stackN, $comm, \IMM, "str" ... (everything but a variable, $params
  // and $vars).
  bool is_raw() const;
};

struct ProbePoint {
  std::string function;  // FUNC (may hold glob characters: *, ?, [...]); "" for SRC:ALN;
                         // "0x1234" for a raw address (kept, as perf keeps it)
  std::string file;      // @SRC, or SRC of SRC:ALN / SRC;PTN; "" when none
  long line = 0;         // RLN (relative to FUNC's first line, may be < 0) or ALN (when
  bool has_line = false; // function is ""); has_line is line != 0
  uint64_t offset = 0;   // +OFFS from FUNC's entry
  bool has_offset = false;
  bool retprobe = false; // %return
  std::string lazy;      // ;PTN (a glob over the source line's text)
  bool has_lazy = false;
  uint64_t address = 0;  // a raw address given as FUNC ("0x1234")
  bool has_address = false;
  // An SDT point (tools/sdt_notes.h): sdt_PROVIDER:NAME, %sdt_PROVIDER:NAME or %NAME
  // (any provider).
  bool sdt = false;
  std::string sdt_provider;  // "" for any
  std::string sdt_name;
};

struct ProbeSpec {
  std::string group;   // GROUP of [[GROUP:]EVENT=]; "" when not given
  std::string event;   // EVENT; "" when not given. Both C identifiers of at most 63
                       // characters (the kernel's limit), else -EINVAL / -E2BIG
  ProbePoint point;
  std::vector<ProbeArg> args;
  std::string text;    // the whole spec as given (for messages)
};

// Parses one probe definition (one -a argument, or the non-option arguments joined with
// spaces). Errors carry perf's messages ("Semantic error :..."), code -EINVAL unless perf
// has another. Refused where perf would fail only later (or crash): no FUNC nor SRC
// (":3", "%return"), SDT events and cached probes (-EOPNOTSUPP), an empty NAME=, argument or
// :TYPE ("Semantic error :Argument parse error: ARG").
Result<ProbeSpec> parse_probe_spec(std::string_view text);

// A line range for -L.
struct LineRange {
  std::string function;  // "" when a file range
  std::string file;
  long start = 0;        // RLN (function) or ALN (file); 0 with a function: from its first line
  long end = 0;          // inclusive (START+NUM-1 for +NUM); with has_end false: to the end
  bool has_end = false;
};
// Errors as perf words them ("Semantic error :Start line must be smaller than end line."),
// -EINVAL. Stricter than perf: a FUNC before '@' must be a C identifier too.
Result<LineRange> parse_line_range(std::string_view text);

// An event name or group as perf makes one from text: characters other than [A-Za-z0-9_]
// become '_', a leading digit gets a '_' prefix. Used for "probe_" + basename and for
// argument names derived from types ("msg_string").
std::string sanitize_event_name(std::string_view text);

// Whether all of `name` matches perf's glob pattern: '*' any run, '?' one character,
// "[abc]", "[a-z]", "[!x]" (a ']' first in the class is literal; an unclosed class or a
// reversed range matches nothing), a backslash makes the next character literal.
bool glob_match(std::string_view pattern, std::string_view name);

}  // namespace probefs::tools
