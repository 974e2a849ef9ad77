// How probecore turns `symbol_name` into an address and learns the bounds of the function
// around an address. probecore itself reads no ELF: inside a traced process the daemon sends
// addresses and bounds; a process probing itself installs a resolver (tracee/self_symbols.h).
//
// Plain data: the symbol side (tracee/) fills these in, and they are what travels to an
// agent with each probe.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "arch/text_range.h"

namespace probefs::probecore {

// [start, end) of the function that contains a probe address; {0, 0} when unknown.
//
// With it, the ways into the function that its own instructions do not show. The jump
// optimizer replaces whole instructions by a 5-byte jmp only where no control can arrive
// inside them; it finds the function's own branches itself, but not these:
//
//   foo:   ...  call bar      ; bar throws
//               ...  ret
//   .Lpad: mov %rax,%rbx      ; landing pad: the unwinder resumes here, no branch says so
//   ...
//   foo.cold:   ...  jmp foo+0x42   ; split-off code jumping back into foo
//
// A caller that sets bounds itself and leaves both lists empty gets the checks on the
// function's own code only (and the engine's sweep of the mapping for direct branches).
struct FunctionBounds {
  uintptr_t start = 0;
  uintptr_t end = 0;
  // Exception landing pads inside [start, end), from the LSDA (.gcc_except_table) of the
  // .eh_frame FDEs that cover the function. Sorted, no duplicates.
  std::vector<uintptr_t> landing_pads = {};
  // Code the compiler split off from the function or split the function from (`foo.cold`
  // for `foo`, and `foo` for `foo.cold`): its direct branches may land inside the function.
  std::vector<arch::TextRange> related = {};

  bool known() const { return start < end; }
  bool contains(uintptr_t a) const { return start <= a && a < end; }
};

struct SymbolLocation {
  uintptr_t addr = 0;      // run-time address of the symbol
  FunctionBounds bounds;   // the function containing addr
  std::string module;      // object basename ("libc.so.6"); empty for the executable
  std::string name;        // symbol name without module prefix
  // resolve(): what `kprobes/list` adds after the probe's line, in parentheses, where the
  // name asked for resolved to code its name does not say (an IFUNC symbol resolves to
  // the implementation the program calls: "memcpy" beside
  // __memmove_avx_unaligned_erms). Empty otherwise.
  std::string note;
};

class SymbolResolver {
 public:
  virtual ~SymbolResolver() = default;
  // `SYM` or `MOD:SYM`. Returns 0, -ENOENT, or -EINVAL for a malformed name.
  virtual int resolve(std::string_view name, SymbolLocation* out) = 0;
  // The function containing addr, for bounds and for naming it in `kprobes/list`.
  // Returns 0 or -ENOENT.
  virtual int describe(uintptr_t addr, SymbolLocation* out) = 0;
};

}  // namespace probefs::probecore
