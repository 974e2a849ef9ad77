// The spawn guards: probes of the agent's own on the ways a child can run on its parent
// thread's TLS before it execs (vfork; posix_spawn and posix_spawnp, whose clone shares
// memory). Their handlers (hit.cc) open a window in which every hit asks the kernel which
// process runs it, so that a child's hits are never recorded as its parent's.
//
// vfork is `pop %rdi; mov $SYS_vfork,%eax; syscall; ...`: it returns twice on one stack,
// so no return probe; a probe on the instruction after its system call sees the child
// first (rax 0) and the parent when it runs again. posix_spawn's child runs on a stack of
// its own and never returns: a return probe closes the parent's window.
//
// Best effort: a guard that cannot be placed (another libc, a jmp that cannot be written
// where an int3 would be fatal) leaves that way uncovered, and tracing goes on.
#include <dlfcn.h>

#include <cstring>
#include <mutex>

#include "agent/agent.h"
#include "agent/signal_guard.h"
#include "probecore/kprobes.h"

namespace probefs::agent {

namespace {

std::mutex g_mu;
bool g_installed = false;
// Never destroyed: registered with the engine until uninstalled, which the control
// thread may do while exit() runs the static destructors.
probecore::Kprobe& g_vfork = *new probecore::Kprobe;
bool g_vfork_registered = false;
constexpr const char* kSpawners[] = {"posix_spawn", "posix_spawnp"};
constexpr size_t kNumSpawners = sizeof kSpawners / sizeof kSpawners[0];
static_assert(1 + kNumSpawners == kMaxSpawnGuards, "vfork's guard and the spawners'");
probecore::Kretprobe* const g_spawn = new probecore::Kretprobe[kNumSpawners];
bool g_spawn_registered[kNumSpawners];

// The address just after vfork's `mov $SYS_vfork,%eax; syscall`, 0 when its code is not
// the expected shape.
uintptr_t after_vfork_syscall(uintptr_t start, uintptr_t end) {
  static const uint8_t kCall[] = {0xb8, 58, 0, 0, 0, 0x0f, 0x05};  // mov $58,%eax; syscall
  for (uintptr_t at = start; at + sizeof kCall <= end && at < start + 16; ++at)
    if (std::memcmp(reinterpret_cast<const void*>(at), kCall, sizeof kCall) == 0)
      return at + sizeof kCall < end ? at + sizeof kCall : 0;
  return 0;
}

}  // namespace

size_t register_spawn_guards(probecore::Kprobe** out, size_t max) {
  std::lock_guard lock(g_mu);
  if (g_installed) return 0;
  g_installed = true;
  void* libc = dlopen("libc.so.6", RTLD_NOLOAD | RTLD_LAZY);
  if (!libc) return 0;
  uintptr_t addr = 0;
  probecore::FunctionBounds bounds;
  if (resolve_own_guard_site(libc, "vfork", nullptr, &addr, &bounds)) {
    if (const uintptr_t at = after_vfork_syscall(bounds.start, bounds.end)) {
      g_vfork.symbol_name = nullptr;
      g_vfork.offset = 0;
      g_vfork.addr = at;
      g_vfork.bounds = bounds;
      g_vfork.pre_handler = vfork_return_pre_handler;
      g_vfork.post_handler = nullptr;
      // The child runs it before it execs: never an int3 there.
      g_vfork.flags = probecore::KPROBE_FLAG_GPR_ONLY | probecore::KPROBE_FLAG_NESTED |
                      probecore::KPROBE_FLAG_NO_INT3 | probecore::KPROBE_FLAG_DISABLED;
      g_vfork_registered = probecore::register_kprobe(&g_vfork) == 0;
    }
  }
  for (size_t i = 0; i < kNumSpawners; ++i) {
    if (!resolve_own_guard_site(libc, kSpawners[i], nullptr, &addr, &bounds)) continue;
    probecore::Kretprobe& rp = g_spawn[i];
    rp.kp.symbol_name = nullptr;
    rp.kp.offset = 0;
    rp.kp.addr = addr;
    rp.kp.bounds = bounds;
    rp.kp.flags = probecore::KPROBE_FLAG_GPR_ONLY | probecore::KPROBE_FLAG_DISABLED;
    rp.entry_handler = spawn_entry_handler;
    rp.handler = spawn_return_handler;
    g_spawn_registered[i] = probecore::register_kretprobe(&rp) == 0;
  }
  dlclose(libc);
  size_t n = 0;
  if (g_vfork_registered && n < max) out[n++] = &g_vfork;
  for (size_t i = 0; i < kNumSpawners; ++i)
    if (g_spawn_registered[i] && n < max) out[n++] = &g_spawn[i].kp;
  return n;
}

void install_spawn_guards() {
  // Registered disabled, enabled together: one write window for all.
  probecore::Kprobe* all[kMaxSpawnGuards];
  const size_t n = register_spawn_guards(all, kMaxSpawnGuards);
  if (n > 0) (void)probecore::enable_kprobes(all, static_cast<int>(n));
}

void uninstall_spawn_guards() {
  std::lock_guard lock(g_mu);
  if (!g_installed) return;
  g_installed = false;
  if (g_vfork_registered) (void)probecore::unregister_kprobe(&g_vfork);
  g_vfork_registered = false;
  for (size_t i = 0; i < kNumSpawners; ++i) {
    if (g_spawn_registered[i]) (void)probecore::unregister_kretprobe(&g_spawn[i]);
    g_spawn_registered[i] = false;
  }
}

size_t spawn_guard_addresses(uintptr_t* out, size_t max) {
  std::lock_guard lock(g_mu);
  size_t n = 0;
  if (g_vfork_registered && n < max) out[n++] = g_vfork.addr;
  for (size_t i = 0; i < kNumSpawners; ++i)
    if (g_spawn_registered[i] && n < max) out[n++] = g_spawn[i].kp.addr;
  return n;
}

}  // namespace probefs::agent
