// The signal guards' control plane: finding libc's signal functions, taking the owned
// signals, registering the guard probes, giving everything back (agent/signal_guard.h).
// The hit path is signal_guard_hit.cc.
//
// Every action and mask change here is a raw system call: the guards may already be armed
// (reconcile, a second install), and libc's own functions would go through them.
#include "agent/signal_guard.h"

#include <dlfcn.h>
#include <link.h>
#include <pthread.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <mutex>
#include <thread>
#include <vector>

#include "agent/signal_guard_state.h"
#include "arch/signals.h"
#include "arch/syscall.h"
#include "probecore/kprobes.h"

namespace probefs::agent {

using namespace detail;
using arch::raw_syscall;

namespace {

struct GuardSpec {
  const char* name;
  const char* version;   // nullptr: the default version
  const char* fallback;  // where `name` is not exported (another glibc)
  probecore::kprobe_pre_handler_t handler;
  // Without it the program can displace or block the owned signals: install fails.
  // These are also functions glibc calls with every signal blocked: never an int3.
  bool essential;
};

constexpr GuardSpec kGuards[] = {
    {"__libc_sigaction", "GLIBC_PRIVATE", "sigaction", guard_sigaction, true},
    {"pthread_sigmask", nullptr, nullptr, guard_sigmask, true},
    {"sigsuspend", nullptr, nullptr, guard_wait_mask_arg1, false},
    {"ppoll", nullptr, nullptr, guard_wait_mask_arg4, false},
    {"pselect", nullptr, nullptr, guard_wait_mask_arg6, false},
    {"epoll_pwait", nullptr, nullptr, guard_wait_mask_arg5, false},
    {"epoll_pwait2", nullptr, nullptr, guard_wait_mask_arg5, false},
};
constexpr size_t kNumGuards = sizeof kGuards / sizeof kGuards[0];

// All of the below: g_mu.
std::mutex g_mu;
bool g_installed = false;
// Never destroyed: registered with the engine until the guards come out, which the
// agent's control thread may do while exit() runs the static destructors.
probecore::Kprobe* const g_probes = new probecore::Kprobe[kNumGuards];
const char* g_probe_names[kNumGuards];
bool g_registered[kNumGuards];
// The handler the kernel keeps for each owned signal while installed: the agent's (SIGSEGV,
// SIGBUS) or the engine's (SIGTRAP, the fixup signal).
KernelAction g_ours[kOwnedCount];

KernelAction query_real(int sig) {
  KernelAction k{};
  raw_syscall(__NR_rt_sigaction, sig, 0, reinterpret_cast<long>(&k), 8);
  return k;
}

int set_real(int sig, const KernelAction& k) {
  return static_cast<int>(
      raw_syscall(__NR_rt_sigaction, sig, reinterpret_cast<long>(&k), 0, 8));
}

// glibc's struct sigaction (as sigaction() reads one back) and the kernel's.
KernelAction from_libc(const struct sigaction& sa) {
  KernelAction k{};
  k.handler = reinterpret_cast<uint64_t>(sa.sa_handler);
  k.flags = static_cast<uint32_t>(sa.sa_flags) & kKernelSaFlags;
  k.restorer = reinterpret_cast<uint64_t>(sa.sa_restorer);
  k.mask = reinterpret_cast<const uint64_t*>(&sa.sa_mask)[0] & ~kUnblockable;
  return k;
}

struct sigaction to_libc(const KernelAction& k) {
  struct sigaction sa {};
  sa.sa_handler = reinterpret_cast<__sighandler_t>(k.handler);
  sa.sa_flags = static_cast<int>(k.flags);
  sa.sa_restorer = reinterpret_cast<void (*)()>(k.restorer);
  reinterpret_cast<uint64_t*>(&sa.sa_mask)[0] = k.mask;
  return sa;
}

// An action installed as libc would install it: with its restorer.
KernelAction through_libc(KernelAction k) {
  if (k.handler != reinterpret_cast<uint64_t>(SIG_DFL) &&
      k.handler != reinterpret_cast<uint64_t>(SIG_IGN) && g_libc_restorer) {
    k.flags |= kSaRestorer;
    k.restorer = g_libc_restorer;
  }
  return k;
}

void store_virtual(int idx, const KernelAction& k) { exchange_action(idx, k); }

int resolve(const GuardSpec& g, void* libc, uintptr_t* addr, probecore::FunctionBounds* bounds,
            const char** used) {
  *used = g.name;
  if (resolve_own_guard_site(libc, g.name, g.version, addr, bounds)) return 0;
  // A fallback exists where `name` is not exported at all (another glibc).
  const bool exported = g.version ? dlvsym(libc, g.name, g.version) : dlsym(libc, g.name);
  if (exported || !g.fallback) return -ENOENT;
  *used = g.fallback;
  return resolve_own_guard_site(libc, g.fallback, nullptr, addr, bounds) ? 0 : -ENOENT;
}

void unregister_all_locked() {
  for (size_t i = 0; i < kNumGuards; ++i) {
    if (!g_registered[i]) continue;
    (void)probecore::unregister_kprobe(&g_probes[i]);
    g_registered[i] = false;
  }
}

bool armed_locked() {
  for (size_t i = 0; i < kNumGuards; ++i) {
    if (!kGuards[i].essential) continue;
    if (!g_registered[i] || !probecore::kprobe_optimization_status(&g_probes[i]).empty())
      return false;
  }
  return true;
}

// The calling thread's owned bits that are blocked for real become virtual ones.
void adopt_thread_mask(uint64_t owned) {
  uint64_t real = 0;
  raw_syscall(__NR_rt_sigprocmask, SIG_BLOCK, 0, reinterpret_cast<long>(&real), 8);
  if (!(real & owned)) return;
  t_signals.blocked |= real & owned;
  const uint64_t unblock = real & owned;
  raw_syscall(__NR_rt_sigprocmask, SIG_UNBLOCK, reinterpret_cast<long>(&unblock), 0, 8);
}

int reconcile_locked() {
  if (!g_installed) return -EINVAL;
  for (int idx = 0; idx < kOwnedCount; ++idx) {
    const int sig = g_owned_sig[idx];
    const KernelAction real = query_real(sig);
    if (real.handler == g_ours[idx].handler) continue;
    // Changed while no guard saw it: that is the program's action now.
    store_virtual(idx, real);
    if (int rc = set_real(sig, g_ours[idx]); rc) return rc;
  }
  adopt_thread_mask(g_owned_mask.load());
  return 0;
}

void atfork_child() {
  // A fork child owns its memory, and no signal is pending in it.
  g_pid.store(raw_syscall(__NR_getpid), std::memory_order_relaxed);
  t_signals.pending = 0;
}

// Owned signals and the virtual actions, taken from the kernel and the engine. g_mu.
int take_signals_locked() {
  g_owned_sig[0] = SIGTRAP;
  g_owned_sig[1] = SIGSEGV;
  g_owned_sig[2] = SIGBUS;
  g_owned_sig[3] = arch::fixup_signal();
  if (int rc = arch::install_thread_fixup_handler(); rc) return rc;
  // libc's restorer, from the engine's SIGTRAP action (installed through libc).
  g_libc_restorer = query_real(SIGTRAP).restorer;

  for (int idx : {0, 3}) {
    const int sig = g_owned_sig[idx];
    struct sigaction engine {}, program {};
    if (int rc = arch::engine_signal_action(sig, &engine); rc) return rc;
    if (int rc = arch::program_signal_action(sig, &program); rc) return rc;
    g_ours[idx] = through_libc(from_libc(engine));
    store_virtual(idx, from_libc(program));
    // The engine's handler may have been displaced since it was installed (an earlier
    // install was undone, and the program set its own): that one is the program's.
    const KernelAction real = query_real(sig);
    if (real.handler != g_ours[idx].handler) {
      store_virtual(idx, real);
      if (int rc = set_real(sig, g_ours[idx]); rc) return rc;
    }
  }
  for (int idx : {1, 2}) {
    KernelAction ours{};
    ours.handler = reinterpret_cast<uint64_t>(&on_fault_signal);
    // SA_NODEFER: a fetch that faults inside the program's own SIGSEGV handler (a probe hit
    // there) still reaches the fixup. SA_ONSTACK: a stack overflow still reaches the
    // program's handler where the thread has an alternate stack.
    ours.flags = SA_SIGINFO | SA_ONSTACK | SA_NODEFER | SA_RESTART;
    ours = through_libc(ours);
    KernelAction previous{};
    if (long rc = raw_syscall(__NR_rt_sigaction, g_owned_sig[idx],
                              reinterpret_cast<long>(&ours), reinterpret_cast<long>(&previous),
                              8);
        rc)
      return static_cast<int>(rc);
    g_ours[idx] = ours;
    store_virtual(idx, previous);
  }
  return 0;
}

// Gives back the actions taken by take_signals_locked(), where they are still ours.
void give_back_actions_locked() {
  for (int idx = 0; idx < kOwnedCount; ++idx) {
    const int sig = g_owned_sig[idx];
    if (!sig) continue;
    const KernelAction program = load_action(idx);
    if (idx == 0 || idx == 3) {
      (void)arch::set_program_signal_action(sig, to_libc(program));
    } else if (query_real(sig).handler == g_ours[idx].handler) {
      set_real(sig, program);
    }
  }
}

}  // namespace

bool resolve_own_guard_site(void* handle, const char* name, const char* version,
                            uintptr_t* addr, probecore::FunctionBounds* bounds) {
  void* sym = version ? dlvsym(handle, name, version) : dlsym(handle, name);
  if (!sym) return false;
  Dl_info info{};
  void* extra = nullptr;
  if (!dladdr1(sym, &info, &extra, RTLD_DL_SYMENT) || !extra || info.dli_saddr != sym)
    return false;
  const auto* es = static_cast<const ElfW(Sym)*>(extra);
  if (es->st_size == 0) return false;
  *addr = reinterpret_cast<uintptr_t>(sym);
  *bounds = {*addr, *addr + es->st_size};
  return true;
}

int install_signal_guards(probecore::Kprobe* const* also, int n_also) {
  std::lock_guard lock(g_mu);
  auto enable_also = [&] {
    if (n_also > 0)
      (void)probecore::enable_kprobes(const_cast<probecore::Kprobe**>(also), n_also);
  };
  if (g_installed) {
    enable_also();
    return reconcile_locked();
  }

  void* libc = dlopen("libc.so.6", RTLD_NOLOAD | RTLD_LAZY);
  if (!libc) return -ENOENT;
  int rc = 0;
  for (size_t i = 0; i < kNumGuards && rc == 0; ++i) {
    const GuardSpec& g = kGuards[i];
    uintptr_t addr = 0;
    probecore::FunctionBounds bounds;
    const char* used = nullptr;
    if (resolve(g, libc, &addr, &bounds, &used) != 0) {
      if (g.essential) rc = -ENOENT;
      continue;
    }
    bool duplicate = false;
    for (size_t j = 0; j < i; ++j) duplicate |= g_registered[j] && g_probes[j].addr == addr;
    if (duplicate) continue;
    probecore::Kprobe& p = g_probes[i];
    p.symbol_name = nullptr;
    p.offset = 0;
    p.addr = addr;
    p.bounds = bounds;
    p.pre_handler = g.handler;
    p.post_handler = nullptr;
    // Registered disabled (no guard runs before the virtual state exists); the first
    // registration also starts the engine, whose SIGTRAP handler is then in place.
    p.flags = probecore::KPROBE_FLAG_DISABLED | probecore::KPROBE_FLAG_NESTED |
              (g.essential ? uint32_t{probecore::KPROBE_FLAG_NO_INT3} : 0u);
    if (int r = probecore::register_kprobe(&p); r) {
      if (g.essential) rc = r;
      continue;
    }
    g_registered[i] = true;
    g_probe_names[i] = used;
  }
  dlclose(libc);
  if (rc == 0) rc = take_signals_locked();
  if (rc != 0) {
    unregister_all_locked();
    give_back_actions_locked();
    enable_also();
    return rc;
  }

  g_pid.store(raw_syscall(__NR_getpid), std::memory_order_relaxed);
  static std::once_flag atfork_once;
  std::call_once(atfork_once, [] { pthread_atfork(nullptr, nullptr, atfork_child); });
  uint64_t owned = 0;
  for (int sig : g_owned_sig) owned |= sig_bit(sig);
  adopt_thread_mask(owned);
  g_owned_mask.store(owned, std::memory_order_release);
  arch::set_foreign_signal_handler(&deliver);
  std::vector<probecore::Kprobe*> guards;
  for (size_t i = 0; i < kNumGuards; ++i)
    if (g_registered[i]) guards.push_back(&g_probes[i]);
  guards.insert(guards.end(), also, also + std::max(n_also, 0));
  if (!guards.empty())  // their jmps (and the others' int3s) in one window
    (void)probecore::enable_kprobes(guards.data(), static_cast<int>(guards.size()));
  g_installed = true;

  // Armed when their jmps are written: at once unless a thread sits where they go.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(1);
  while (!armed_locked() && std::chrono::steady_clock::now() < deadline) {
    probecore::wait_for_kprobe_optimizer();
    if (!armed_locked()) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  // What the program changed before the guards were armed.
  return reconcile_locked();
}

void uninstall_signal_guards() {
  std::lock_guard lock(g_mu);
  if (!g_installed) return;
  unregister_all_locked();
  give_back_actions_locked();
  arch::set_foreign_signal_handler(nullptr);
  const uint64_t owned = g_owned_mask.exchange(0);
  ThreadSignals& t = t_signals;
  if (const uint64_t block = t.blocked & owned)
    raw_syscall(__NR_rt_sigprocmask, SIG_BLOCK, reinterpret_cast<long>(&block), 0, 8);
  t.blocked = 0;
  // The waiting ones go to the kernel, which holds them while the thread blocks them.
  requeue_pending(t, t.pending, /*block_first=*/false);
  g_installed = false;
}

int reconcile_signal_guards() {
  std::lock_guard lock(g_mu);
  return reconcile_locked();
}

bool signal_guards_installed() {
  std::lock_guard lock(g_mu);
  return g_installed;
}

bool signal_guards_armed() {
  std::lock_guard lock(g_mu);
  return g_installed && armed_locked();
}

std::string signal_guard_status() {
  std::lock_guard lock(g_mu);
  std::string out;
  for (size_t i = 0; i < kNumGuards; ++i) {
    if (!g_registered[i]) continue;
    const std::string why = probecore::kprobe_optimization_status(&g_probes[i]);
    char line[256];
    std::snprintf(line, sizeof line, "%s %#" PRIxPTR " %s\n", g_probe_names[i], g_probes[i].addr,
                  why.empty() ? "armed" : why.c_str());
    out += line;
  }
  return out;
}

size_t signal_guard_addresses(uintptr_t* out, size_t max) {
  std::lock_guard lock(g_mu);
  size_t n = 0;
  for (size_t i = 0; i < kNumGuards; ++i) {
    if (!g_registered[i]) continue;
    if (n < max) out[n] = g_probes[i].addr;
    ++n;
  }
  return n;
}

uint64_t owned_signal_mask() { return g_owned_mask.load(std::memory_order_acquire); }

}  // namespace probefs::agent
