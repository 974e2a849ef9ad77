// How probecore turns `symbol_name` into an address and learns the bounds of the function
// around an address. probecore itself reads no ELF: inside a traced process the daemon sends
// addresses and bounds; a process probing itself installs a resolver (target/self_symbols.h).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace probefs::probecore {

// [start, end) of the function that contains a probe address; {0, 0} when unknown.
struct FunctionBounds {
  uintptr_t start = 0;
  uintptr_t end = 0;
  bool known() const { return start < end; }
  bool contains(uintptr_t a) const { return start <= a && a < end; }
};

struct SymbolLocation {
  uintptr_t addr = 0;      // run-time address of the symbol
  FunctionBounds bounds;   // the function containing addr
  std::string module;      // object basename ("libc.so.6"); empty for the executable
  std::string name;        // symbol name without module prefix
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
