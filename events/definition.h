// What a parsed dynamic-event line means, before anything is resolved: the probe kind,
// names, the unresolved place (symbol, address or path+offset) and each argument with its
// type and staged fetch code. The daemon parses (parse.h), resolves the place in each
// target, then compiles (compile.h); nothing here touches a process or a file.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "events/errors.h"

namespace probefs::events {

// The kernel's limits for dynamic events.
inline constexpr int kMaxEventNameLen = 64;     // names must be shorter than this
inline constexpr int kMaxArgNameLen = 32;
inline constexpr int kMaxArgStrLen = 63;        // one fetch expression, type included
inline constexpr int kMaxTraceArgs = 128;
inline constexpr int kMaxArrayLen = 64;
inline constexpr int kMaxStringSize = 4096;     // a fetched string, its NUL included
inline constexpr int kMaxStackParam = 2048;     // $stackN / $argN bound of kprobe syntax
inline constexpr int kMaxActiveMax = 4096;      // r<MAXACTIVE>
inline constexpr int kFetchInsnMax = 16;        // slots per argument, the last is the end
inline constexpr int kWriteBufSize = 4096;      // one line of a write, its newline included

enum class ProbeSyntax : uint8_t { kKprobe, kUprobe };

// How a stored value prints; also selects the filter comparison.
enum class PrintKind : uint8_t { kUnsigned, kSigned, kHex, kChar, kString, kSymbol };

// One of the kernel's fetch types. `name` is what identifies the type when two probes of
// one event are compared (bitfields compare as their container type).
struct FetchType {
  const char* name;       // "u32", "x64", "string", ...
  const char* fmttype;    // type as the format file declares it
  const char* fmt;        // the print fmt conversion, as the format file shows it
  uint8_t size;           // bytes in the fixed part of the record
  bool is_signed;
  bool is_string;         // stored as a __data_loc into the dynamic part
  PrintKind print;
};

// Looks a type up by name; nullptr when unknown. Applies the kernel's rules: bitfield
// strings `b<w>@<o>/<size>` map to u<size>; `symbol`/`symstr` are refused for uprobes.
const FetchType* find_fetch_type(const char* name, ProbeSyntax syntax);
const FetchType* default_fetch_type();  // x64

// The staged fetch program of one argument: load -> deref* -> store -> modify -> loop.
enum class FetchOp : uint8_t {
  kNop = 0,
  kEnd,
  // load
  kReg,          // param = byte offset into PtRegs
  kStackP,       // the stack pointer
  kStack,        // param = N: the Nth word on the stack
  kRetval,
  kArg,          // param = N-1: a System V argument at function entry
  kEntryData,    // param = byte offset into data saved at function entry
  kImm,          // imm
  kComm,         // the thread's name
  kData,         // an immediate string: data_index into the program's strings
  kFileOffset,   // imm = file offset; probe address - probe file offset + imm
  kSymbol,       // @SYM: unresolved data symbol (name in ProbeArg::symbol); compile -> kImm
  // dereference
  kDeref,        // offset
  kUDeref,       // offset, user memory (same as kDeref in user space)
  // store
  kStRaw,        // size
  kStMem,        // size, offset
  kStUMem,
  kStString,     // offset
  kStUString,
  kStSymstr,
  // modify
  kModBitfield,  // lshift, rshift, basesize
  // loop
  kLoopArray,    // param = count
};

struct FetchInsn {
  FetchOp op = FetchOp::kNop;
  uint8_t size = 0;
  uint8_t lshift = 0;
  uint8_t rshift = 0;
  uint32_t param = 0;
  int64_t offset = 0;
  uint64_t imm = 0;
};

struct ProbeArg {
  std::string name;             // field name ("arg3" when not named)
  std::string comm;             // the expression as written, echoed by read-back
  const FetchType* type = nullptr;
  uint32_t count = 0;           // array length, 0 when scalar
  std::vector<FetchInsn> code;  // ends with kEnd
  std::string symbol;           // @SYM[+|-offs] data symbol (kprobe syntax), else empty
  std::string data;             // the immediate string of \"...\"
};

struct ProbeDefinition {
  ProbeSyntax syntax = ProbeSyntax::kUprobe;
  // An `f` line (dynamic_events): the kernel's fprobe event, a function's entry or exit by
  // its symbol, kprobe syntax otherwise; no offset, no registers among its arguments.
  bool fprobe = false;
  bool is_return = false;
  int maxactive = 0;            // r<N>: kprobe syntax only
  std::string group;
  std::string event;
  // kprobe syntax: [MOD:]SYM[+offs], [MOD:]%PROVIDER:NAME (a USDT point: an SDT note of
  // the object, whose arguments are $arg1..$argN) or MEMADDR
  std::string module;           // object basename, empty when not given
  std::string symbol;           // empty for an address; "%PROVIDER:NAME" for a USDT point
  uint64_t address = 0;         // MEMADDR
  uint64_t offset = 0;          // SYM+offs, or the uprobe file offset
  // uprobe syntax: PATH:OFFSET[(REF_CTR_OFFSET)]
  std::string path;
  uint64_t ref_ctr_offset = 0;
  // $argN on a return probe: how many entry arguments must be saved at function entry.
  uint32_t entry_args = 0;
  std::vector<ProbeArg> args;
  std::vector<std::string> argv;  // the command split as parsed (comments removed)

  bool on_symbol() const { return !symbol.empty(); }
  bool on_sdt() const { return symbol.size() > 1 && symbol[0] == '%'; }
  // argv joined with single spaces: what error_log shows as Command.
  std::string command() const;
};

// `-:[GRP/][EVENT] [head...]`: which events (or which probe of an event) to remove.
struct RemovalRequest {
  bool has_group = false;
  std::string group;
  std::string event;               // empty: every event of `group`
  std::vector<std::string> head;   // place and arguments that must match, in order
};

// The text an events file reads back for a definition, without the trailing newline:
// `p:GRP/EVENT PATH:0x%016lx[(0x%lx)] ARGS`, `p:GRP/EVENT SYM[+off] ARGS`, `r<N>:...`,
// `f:GRP/EVENT SYM[%return] ARGS`.
std::string read_back(const ProbeDefinition& def);

// True when `req` removes `def` (the kernel's match rules: group, event, then the place in
// read-back form and each `name=expression` in order).
bool removal_matches(const RemovalRequest& req, const ProbeDefinition& def);

}  // namespace probefs::events
