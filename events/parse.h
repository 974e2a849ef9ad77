// Parsing lines written to kprobe_events, uprobe_events and dynamic_events.
//
// Each entry point takes one line (no newline). It removes a `#` comment, splits on
// whitespace, and answers one of: an empty line, "not mine" (another event type's
// syntax), a definition, a removal, or an error positioned for error_log. The result keeps
// the place unresolved; the daemon resolves it in each target and then compiles. These
// are pure functions: any thread may call them.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "events/definition.h"
#include "events/errors.h"

namespace probefs::events {

enum class ParseStatus : uint8_t { kEmpty, kNotMine, kDefine, kRemove, kError };

struct ParseResult {
  ParseStatus status = ParseStatus::kEmpty;
  ProbeDefinition def;      // kDefine
  RemovalRequest removal;   // kRemove
  Diagnostic error;         // kError (also kNotMine carries EINVAL, unlogged)
};

struct ParseOptions {
  // Checks a uprobe PATH at the point where the kernel looks the file up, so that errors
  // come in the kernel's order. Returns nothing for a regular file, else kFileNotFound or
  // kNoRegularFile. Unset: every path is taken as a regular file.
  std::function<std::optional<ErrorCode>(const std::string& path)> check_path;
};

// kprobe_events:
//   p[:[GRP/][EVENT]] [MOD:]SYM[+offs]|MEMADDR [FETCHARGS]
//   r[MAXACTIVE][:[GRP/][EVENT]] [MOD:]SYM[+0] [FETCHARGS]
//   p[:[GRP/][EVENT]] [MOD:]SYM[+0]%return [FETCHARGS]
//   -:[GRP/][EVENT] [place [args...]]
// A line of another type's syntax is an error (EINVAL, nothing logged) here.
[[nodiscard]] ParseResult parse_kprobe_command(std::string_view line,
                                           const ParseOptions& opts = {});

// uprobe_events:
//   p|r[:[GRP/][EVENT]] PATH:OFFSET[%return][(REF_CTR_OFFSET)] [FETCHARGS]
//   -:[GRP/][EVENT] [PATH:0x%016lx[(0x%lx)] [args...]]
[[nodiscard]] ParseResult parse_uprobe_command(std::string_view line,
                                           const ParseOptions& opts = {});

// dynamic_events: `-:`/`!` lines are removals of any type; any other line is offered to
// the kprobe type, then the uprobe type; a line neither claims is EINVAL, unlogged.
[[nodiscard]] ParseResult parse_dynamic_command(std::string_view line,
                                           const ParseOptions& opts = {});

// FETCHARGS, one argument:
//   [NAME=]FETCHARG[:TYPE]
//   FETCHARG := %REG | @ADDR | @SYM[+|-offs] | @+FOFFS | $stackN | $stack | $argN | $retval
//             | $comm | +|-[u]OFFS(FETCHARG) | \IMM | \"STRING"
//   TYPE     := u8..u64 | s8..s64 | x8..x64 | char | string | ustring | symbol | symstr
//             | b<width>@<offset>/<container> | TYPE[N]

// Splits one write() into lines the way the kernel does: at '\n', a missing last newline
// is fine, and a line that cannot fit the kernel's line buffer ends the write with EINVAL
// (`*too_long` set; the lines before it are still returned and are to be applied).
std::vector<std::string> split_write(std::string_view buf, bool* too_long);

// The byte offset in PtRegs of the register the fetch arguments name NAME ("ax", "r12",
// "sp": %NAME without the '%'), or -1.
int register_offset(std::string_view name);

// A diagnostic positioned like the kernel's (argument `index` of argv, byte `offset` in
// it), for errors found after parsing: file lookup, symbol resolution, registration.
Diagnostic make_diagnostic(const ProbeDefinition& def, ErrorCode code, int index, int offset,
                           int err = 0);

// Adding `incoming` to an event that already holds `existing` (same group and name):
// probe kind, then argument names and types, then an identical place and arguments.
// Returns an ok() diagnostic when the probe may join the event.
[[nodiscard]] Diagnostic check_append(const ProbeDefinition& existing,
                                      const ProbeDefinition& incoming);

}  // namespace probefs::events
