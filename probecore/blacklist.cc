// Where probes may not go (the engine's own text, arch's signal-return path and
// trampolines: the kernel's kprobe blacklist), and where a probe may only be a jmp (code
// glibc runs with every signal blocked).
#include <link.h>

#include "probecore/engine_state.h"

namespace probefs::probecore::detail {

namespace {

struct EngineText {
  std::vector<arch::TextRange> ranges;
};

int engine_text_cb(dl_phdr_info* info, size_t, void* data) {
  auto* out = static_cast<EngineText*>(data);
  const auto self = reinterpret_cast<uintptr_t>(&register_kprobe);
  bool ours = false;
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const ElfW(Phdr)& ph = info->dlpi_phdr[i];
    const uintptr_t lo = info->dlpi_addr + ph.p_vaddr;
    if (ph.p_type == PT_LOAD && self >= lo && self < lo + ph.p_memsz) ours = true;
  }
  if (!ours) return 0;
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const ElfW(Phdr)& ph = info->dlpi_phdr[i];
    if (ph.p_type == PT_LOAD && (ph.p_flags & PF_X)) {
      const uintptr_t lo = info->dlpi_addr + ph.p_vaddr;
      out->ranges.push_back({lo, lo + ph.p_memsz});
    }
  }
  return 1;
}

std::vector<arch::TextRange>& g_blacklist = *new std::vector<arch::TextRange>;  // g_mu; init()

}  // namespace

void build_blacklist() {
  EngineText text;
  dl_iterate_phdr(engine_text_cb, &text);
  g_blacklist = std::move(text.ranges);
  arch::TextRange extra[8];
  const size_t n = arch::blacklist(extra, 8);
  g_blacklist.insert(g_blacklist.end(), extra, extra + n);
}

bool blacklisted_locked(uintptr_t addr) {
  for (const auto& r : g_blacklist)
    if (addr >= r.start && addr < r.end) return true;
  return false;
}

// Code glibc runs where a trap kills the thread at once: with every signal blocked (a
// synchronous SIGTRAP that is blocked is fatal), or in a posix_spawn child whose handlers
// were reset to the default. At thread start __ctype_init and _setjmp; at thread exit
// madvise and getpagesize; in pthread_create and posix_spawn around clone, clone and
// munmap; in the spawned child (system, popen), sigaction, sigismember, sigprocmask and
// execve. glibc blocks with the raw system call, so no interposition can stop it. Such a
// site is jump-optimized or not armed at all; never an int3. Known only where the
// resolver names the function (by any of its names).
bool runs_with_signals_blocked(std::string_view module, std::string_view symbol) {
  if (module.substr(0, 7) != "libc.so") return false;
  static constexpr std::string_view kNames[] = {
      "__ctype_init",  "_setjmp",       "__sigsetjmp",       "setjmp",
      "sigsetjmp",     "madvise",       "__madvise",         "getpagesize",
      "__getpagesize", "munmap",        "__munmap",          "clone",
      "__clone",       "sigaction",     "__sigaction",       "__libc_sigaction",
      "sigismember",   "__sigismember", "sigprocmask",       "__sigprocmask",
      "pthread_sigmask", "__pthread_sigmask", "execve",      "__execve",
  };
  for (std::string_view name : kNames)
    if (symbol == name) return true;
  return false;
}

}  // namespace probefs::probecore::detail

namespace probefs::probecore {

using namespace detail;

bool within_kprobe_blacklist(uintptr_t addr) {
  EngineSection engine;
  std::lock_guard lock(g_mu);
  if (init_locked() != 0) return false;
  return blacklisted_locked(addr);
}

std::vector<arch::TextRange> kprobe_blacklist() {
  EngineSection engine;
  std::lock_guard lock(g_mu);
  if (init_locked() != 0) return {};
  return g_blacklist;
}

}  // namespace probefs::probecore
