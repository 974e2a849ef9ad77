// Event filters: the kernel's filter language over an event's fields, compiled (daemon,
// control thread) to a flat postfix program that the agent evaluates, from any thread at
// once, on a record before it commits it.
//
//   FILTER := OR
//   OR     := AND ( "||" AND )*
//   AND    := UNARY ( "&&" UNARY )*
//   UNARY  := "!" UNARY | "(" OR ")" | PRED
//   PRED   := FIELD OP VALUE
//   OP     := "==" | "!=" | "<" | "<=" | ">" | ">=" | "&" | "~"
//   VALUE  := NUMBER (decimal, 0x.., 0..; '-' for signed fields) | "STRING" | 'STRING'
// Strings take ==, != and ~ (a glob: * ? [...] and a leading '!' to negate).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "events/compile.h"
#include "events/errors.h"

namespace probefs::events {

enum class FilterOp : uint8_t { kGlob, kNe, kEq, kLe, kLt, kGe, kGt, kBand };

struct FilterInsn {
  enum Kind : uint8_t { kPred, kAnd, kOr, kNot } kind = kPred;
  enum Source : uint8_t { kRecordNumber, kRecordString, kCpu, kComm } source = kRecordNumber;
  FilterOp op = FilterOp::kEq;
  bool negate = false;       // != and "!pattern"
  bool is_signed = false;
  uint8_t size = 0;          // numeric field size: 1, 2, 4, 8; other sizes never match
  uint32_t offset = 0;       // field offset in the record
  uint64_t value = 0;        // numeric operand
  uint32_t pattern = 0;      // string operand: offset into `patterns` ...
  uint32_t pattern_len = 0;  // ... and length
};

struct CompiledFilter {
  std::string text;                // as written, whitespace trimmed; read back verbatim
  std::vector<FilterInsn> insns;   // postfix
  std::string patterns;
  uint32_t max_depth = 0;
};

inline constexpr uint32_t kMaxFilterDepth = 64;

// What a record does not hold but a filter may test.
struct FilterContext {
  uint32_t cpu = 0;
  const char* comm = "";
};

// Compiles `text` against `ev`'s fields. On failure `err` holds the message, errno and
// position (subsystem kLogFilter, command = the trimmed text); err->code == kFiltErrno
// is the kernel's unpositioned "Error: (0)" case.
[[nodiscard]] bool compile_filter(std::string_view text, const CompiledEvent& ev,
                                  CompiledFilter* out, Diagnostic* err);

// Runs on the hit path: no allocation, no library calls. Also runs in the daemon on
// records a traced process wrote (trigger filters): it reads nothing outside rec[0, len)
// whatever the record says, and a string field whose __data_loc names bytes outside it,
// or more than kMaxStringSize of them, compares as the empty string, as a fault does.
bool filter_match(const CompiledFilter& f, const uint8_t* rec, uint32_t len,
                  const FilterContext& ctx);

// What the event's `filter` file reads after a failed write:
//   "<text>\n<caret line>\nparse_error: <message>\n\n"  or  "<text>\nError: (0)\n\n"
std::string filter_error_text(const Diagnostic& err);

// A group (subsystem) filter that an event of the group cannot take: the message that
// event's filter file and error_log show.
Diagnostic subsystem_filter_error(std::string_view text);

// Glob match used by `~` (exposed for tests).
bool glob_match(const char* pat, uint32_t pat_len, const char* s, uint32_t s_len);

}  // namespace probefs::events
