// probecore's SymbolResolver for the current process: a process that probes itself (tests,
// benchmarks, in-process users of probecore) resolves `symbol_name` through its own ELF
// objects. Control plane only: it allocates, reads files and takes a lock.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <string_view>

#include "probecore/symbol_resolver.h"
#include "tracee/elf_symbols.h"

namespace probefs::tracee {

class SelfSymbolResolver final : public probecore::SymbolResolver {
 public:
  SelfSymbolResolver();
  ~SelfSymbolResolver() override;

  // 0, -ENOENT, or -EINVAL for a malformed name (see ProcessSymbols::resolve). A miss
  // re-reads the object list once and retries: the library may have been dlopen'ed since.
  // An IFUNC symbol is the implementation this process calls (read from its own memory
  // where the dynamic linker stored it, else what its resolver returns, run here), and
  // out->note names it for `kprobes/list`; `SYM@resolver` is the resolver.
  [[nodiscard]] int resolve(std::string_view name, probecore::SymbolLocation* out) override;
  // 0 or -ENOENT; a miss re-reads the object list once and retries.
  [[nodiscard]] int describe(uintptr_t addr, probecore::SymbolLocation* out) override;

  // Re-reads the object list now. 0 or a negative errno.
  [[nodiscard]] int reload();

 private:
  // Makes symbols_ current: loads it on first use and after fork (the pid changed), and
  // re-reads it when the dynamic linker's load or unload counters moved, so a dlclose'd
  // library is not answered from stale tables. Requires mu_.
  [[nodiscard]] int refresh_locked();
  [[nodiscard]] int reload_locked();

  std::mutex mu_;  // guards everything below; any thread may call in
  std::unique_ptr<ProcessSymbols> symbols_;
  unsigned long long dl_adds_ = 0;  // dl_iterate_phdr's counters when symbols_ was read
  unsigned long long dl_subs_ = 0;
};

// The process-wide instance, created on first use and never destroyed (probes may still
// ask for it while static destructors run).
SelfSymbolResolver& self_symbol_resolver();

}  // namespace probefs::tracee
