#include "agent/symbols.h"

#include <cerrno>

namespace probefs::agent {

void DefinedSymbols::add(uintptr_t addr, const std::string& name, const std::string& module,
                         uintptr_t symbol_addr, const probecore::FunctionBounds& bounds) {
  std::lock_guard l(mu_);
  Entry& e = by_addr_[addr];
  if (e.refs++ == 0) {
    e.loc.addr = symbol_addr;
    e.loc.name = name;
    e.loc.module = module;
    e.loc.bounds = bounds;
  }
}

void DefinedSymbols::remove(uintptr_t addr) {
  std::lock_guard l(mu_);
  auto it = by_addr_.find(addr);
  if (it != by_addr_.end() && --it->second.refs <= 0) by_addr_.erase(it);
}

void DefinedSymbols::clear() {
  std::lock_guard l(mu_);
  by_addr_.clear();
}

int DefinedSymbols::resolve(std::string_view, probecore::SymbolLocation*) { return -ENOENT; }

int DefinedSymbols::describe(uintptr_t addr, probecore::SymbolLocation* out) {
  std::lock_guard l(mu_);
  auto it = by_addr_.find(addr);
  if (it == by_addr_.end()) return -ENOENT;
  *out = it->second.loc;
  return 0;
}

DefinedSymbols& defined_symbols() {
  static DefinedSymbols* s = new DefinedSymbols;  // never destroyed: used until exit
  return *s;
}

}  // namespace probefs::agent
