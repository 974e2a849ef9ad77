// Symbols and function bounds of the ELF objects mapped into a process (libelf, libdw).
// Daemon side: reads /proc/PID/maps and the object files; never runs inside a target.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace probefs::target {

struct FunctionRange {
  uintptr_t start = 0;  // run-time addresses, [start, end)
  uintptr_t end = 0;
};

struct ResolvedSymbol {
  std::string name;        // without module prefix
  std::string module;      // basename of the object ("libc.so.6"); empty for the executable
  std::string path;        // path of the object as mapped
  uintptr_t addr = 0;      // run-time address
  FunctionRange function;  // enclosing function; end == start when unknown
};

// One process's mapped ELF objects, the executable first, then libraries in load order.
class ProcessSymbols {
 public:
  // Loads the objects mapped in `pid` (getpid() for this process). Returns nullptr and
  // sets *err to a negative errno on failure.
  static std::unique_ptr<ProcessSymbols> load(pid_t pid, int* err);
  ~ProcessSymbols();

  // `SYM` or `MOD:SYM`; MOD is an object basename with or without its version suffix
  // ("libc:malloc", "libc.so.6:malloc"). .symtab where present, else .dynsym; the
  // executable is searched first, then libraries in load order. 0 or -ENOENT.
  int resolve(std::string_view name, ResolvedSymbol* out) const;

  // The function containing `addr`: from the symbol table (symbol size), or, where the code
  // has no symbol (stripped objects), from the .eh_frame FDE that covers it. 0 or -ENOENT.
  int describe(uintptr_t addr, ResolvedSymbol* out) const;

 private:
  struct Impl;
  explicit ProcessSymbols(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace probefs::target
