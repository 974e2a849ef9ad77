#include "tracee/self_symbols.h"

#include <link.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>

namespace probefs::tracee {
namespace {

struct DlCounters {
  unsigned long long adds = 0;
  unsigned long long subs = 0;
};

// glibc counts every object the dynamic linker adds or removes; comparing the counters is
// far cheaper than re-reading /proc/self/maps on every call.
DlCounters dl_counters() {
  DlCounters c;
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t size, void* data) -> int {
        auto* out = static_cast<DlCounters*>(data);
        if (size >= offsetof(dl_phdr_info, dlpi_subs) + sizeof(info->dlpi_subs)) {
          out->adds = info->dlpi_adds;
          out->subs = info->dlpi_subs;
        }
        return 1;  // every entry carries the same counters
      },
      &c);
  return c;
}

void to_location(const ResolvedSymbol& r, probecore::SymbolLocation* out) {
  out->addr = r.addr;
  out->bounds = r.function.known() ? r.function : probecore::FunctionBounds{};
  out->module = r.module;
  out->name = r.name;
  out->note = ifunc_note(r);
}

}  // namespace

SelfSymbolResolver::SelfSymbolResolver() = default;
SelfSymbolResolver::~SelfSymbolResolver() = default;

int SelfSymbolResolver::reload_locked() {
  const pid_t pid = getpid();
  const DlCounters c = dl_counters();
  int err = 0;
  if (symbols_ && symbols_->pid() == pid) {
    err = symbols_->reload();
  } else {
    symbols_ = ProcessSymbols::load(pid, &err);
  }
  if (err == 0) {
    dl_adds_ = c.adds;
    dl_subs_ = c.subs;
  }
  return err;
}

int SelfSymbolResolver::refresh_locked() {
  if (!symbols_ || symbols_->pid() != getpid()) return reload_locked();
  const DlCounters c = dl_counters();
  if (c.adds != dl_adds_ || c.subs != dl_subs_) return reload_locked();
  return 0;
}

int SelfSymbolResolver::reload() {
  std::lock_guard lock(mu_);
  return reload_locked();
}

int SelfSymbolResolver::resolve(std::string_view name, probecore::SymbolLocation* out) {
  std::lock_guard lock(mu_);
  if (int err = refresh_locked(); err != 0) return err;
  ResolvedSymbol r;
  int err = symbols_->resolve(name, &r);
  // Objects mapped without the dynamic linker (or by a loader that keeps no counters) show
  // up only in the mappings, so a miss always looks again.
  if (err == -ENOENT && reload_locked() == 0) err = symbols_->resolve(name, &r);
  if (err == 0) to_location(r, out);
  return err;
}

int SelfSymbolResolver::describe(uintptr_t addr, probecore::SymbolLocation* out) {
  std::lock_guard lock(mu_);
  if (int err = refresh_locked(); err != 0) return err;
  ResolvedSymbol r;
  int err = symbols_->describe(addr, &r);
  if (err == -ENOENT && reload_locked() == 0) err = symbols_->describe(addr, &r);
  if (err == 0) to_location(r, out);
  return err;
}

SelfSymbolResolver& self_symbol_resolver() {
  static auto* instance = new SelfSymbolResolver();
  return *instance;
}

}  // namespace probefs::tracee
