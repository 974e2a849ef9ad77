// Compiling a parsed definition: the flat fetch program the agent runs on every hit, the
// record layout (the kernel's: packed, no alignment) and the format file's print fmt.
//
// Record layout (offsets in bytes):
//   0  u16 common_type (event id)   2  u8 common_flags   3  u8 common_preempt_count
//   4  s32 common_pid (thread id)
//   8  u64 __probe_ip                       (entry probes)
//   8  u64 __probe_func, 16 u64 __probe_ret_ip  (return probes)
//   then each argument, packed in definition order; strings are a u32 __data_loc
//   (length << 16 | offset from the record start) into the dynamic part that follows.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "events/definition.h"
#include "events/errors.h"

namespace probefs::events {

struct FieldLayout {
  std::string name;
  const FetchType* type = nullptr;
  uint32_t offset = 0;
  uint32_t size = 0;    // bytes in the fixed part (elements x element size)
  uint32_t count = 0;   // array elements, 0 when scalar
  // A synthetic event's field: the format file's declaration ("u64 lat", "char comm[]"),
  // the size it states and its sign, which the fetch type does not say.
  std::string decl;
  uint32_t decl_size = 0;
  bool decl_signed = false;
};

// What the hit path runs. Plain data: the daemon sends it to the agent as it is, and the
// interpreter (fetch.h) reads it without allocating.
struct FetchProgram {
  std::vector<FetchInsn> insns;   // every argument's stages, each ending with kEnd
  std::string strings;            // immediate strings, NUL-terminated, by kData's param
  // When every argument is a register stored as it is (the most common definition), this
  // packs each as reg byte offset | size << 8 | field offset << 16, and the interpreter
  // takes a straight path. Empty otherwise.
  std::vector<uint32_t> fast_regs;
  uint32_t header_size = 16;      // common header + ip fields
  uint32_t fixed_size = 16;       // header + every argument's fixed part
  uint32_t nargs = 0;
  uint32_t string_slots = 0;      // dynamic strings per record (array elements counted)
  uint32_t entry_args = 0;        // $argN saved at function entry for a return probe
  uint64_t probe_offset = 0;      // uprobe: file offset of the probed address (@+FOFFS)
  bool is_return = false;
  // Kernel uprobe events record an immediate string \"..." as a fault; uprobe-syntax
  // events keep that observable behaviour, kprobe-syntax events record the string.
  bool imm_string_faults = false;

  // The largest record this program can write (every string at its maximum).
  uint32_t max_record_size() const {
    return fixed_size + string_slots * static_cast<uint32_t>(kMaxStringSize);
  }
};

struct CompiledEvent {
  ProbeSyntax syntax = ProbeSyntax::kUprobe;
  bool is_return = false;
  std::string group;
  std::string event;
  std::vector<FieldLayout> fields;  // the arguments
  FetchProgram program;
  std::string print_fmt;            // the text after "print fmt: "
  bool synthetic = false;           // no probe fields (__probe_ip...): events/synthetic.h
};

// Resolves a data symbol of `@SYM[+|-offs]` (kprobe syntax) to an address in the target.
using DataSymbolResolver = std::function<bool(std::string_view symbol, uint64_t* addr)>;

// Compiles `def`. Fails only when a data symbol does not resolve (ENOENT, logged like the
// kernel's registration failure). `resolve` may be empty when no argument names a symbol.
[[nodiscard]] bool compile(const ProbeDefinition& def, const DataSymbolResolver& resolve,
                           CompiledEvent* out, Diagnostic* err);

// The event's `format` file, byte for byte as the kernel lays it out.
std::string format_file(const CompiledEvent& ev, int id);

}  // namespace probefs::events
