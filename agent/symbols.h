// What the engine knows of the code it probes in this process: the agent reads no ELF, so
// the daemon's definitions say which symbol and object each probed address belongs to,
// and this resolver answers the engine's describe() from them (for `kprobes/list`, and
// for the engine's knowledge of functions glibc runs with every signal blocked).
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>

#include "probecore/symbol_resolver.h"

namespace probefs::agent {

class DefinedSymbols : public probecore::SymbolResolver {
 public:
  // Probes may share an address: entries are counted.
  void add(uintptr_t addr, const std::string& name, const std::string& module,
           uintptr_t symbol_addr, const probecore::FunctionBounds& bounds);
  void remove(uintptr_t addr);
  void clear();

  // Names are resolved by the daemon, never here.
  int resolve(std::string_view name, probecore::SymbolLocation* out) override;
  int describe(uintptr_t addr, probecore::SymbolLocation* out) override;

 private:
  struct Entry {
    probecore::SymbolLocation loc;
    int refs = 0;
  };
  std::mutex mu_;  // the control plane adds; the engine reads under its own lock
  std::map<uintptr_t, Entry> by_addr_;
};

// The one instance, installed as the engine's resolver at startup.
DefinedSymbols& defined_symbols();

}  // namespace probefs::agent
