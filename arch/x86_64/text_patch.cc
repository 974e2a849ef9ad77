#include "arch/x86_64/text_patch.h"

#include "arch/membarrier.h"
#include "arch/self_memory.h"
#include "arch/warn.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>

namespace probefs::arch::x86_64 {
namespace {

// Kept open between writes (callers serialize, under g_text_mu), and opened again in a
// fork child: a descriptor kept across fork() still names the parent's memory.
int g_mem_fd = -1;
long g_mem_fd_pid = 0;

int poke_proc_mem(uintptr_t addr, const void* src, size_t n) {
  const long pid = self_memory_pid();
  if (g_mem_fd < 0 || g_mem_fd_pid != pid) {
    if (g_mem_fd >= 0) close(g_mem_fd);
    g_mem_fd = open("/proc/self/mem", O_RDWR | O_CLOEXEC);
    g_mem_fd_pid = pid;
    if (g_mem_fd < 0) return -errno;
  }
  ssize_t w = pwrite(g_mem_fd, src, n, static_cast<off_t>(addr));
  if (w == static_cast<ssize_t>(n)) return 0;
  return w < 0 ? -errno : -EFAULT;
}

int poke_mprotect(uintptr_t addr, const void* src, size_t n) {
  const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t lo = addr & ~(page - 1), hi = (addr + n + page - 1) & ~(page - 1);
  void* p = reinterpret_cast<void*>(lo);
  if (mprotect(p, hi - lo, PROT_READ | PROT_WRITE | PROT_EXEC) != 0) return -errno;
  std::memcpy(reinterpret_cast<void*>(addr), src, n);
  // Text we patch is mapped read+exec: that is what it goes back to.
  PROBEFS_WARN_ON_ONCE(mprotect(p, hi - lo, PROT_READ | PROT_EXEC) != 0,
                       "patched code stays writable: mprotect refused to take write back");
  return 0;
}

}  // namespace

int text_poke_by_copy(uintptr_t addr, const void* src, size_t n) {
  return n == 0 ? 0 : poke_proc_mem(addr, src, n);
}

int text_poke(uintptr_t addr, const void* src, size_t n) {
  if (n == 0) return 0;
  int rc = poke_proc_mem(addr, src, n);
  if (rc == -EACCES || rc == -EPERM || rc == -ENOENT) rc = poke_mprotect(addr, src, n);
  if (rc == -ENOMEM) rc = -EFAULT;
  return rc;
}

void text_sync() {
  static std::atomic<int> registered{0};  // 1: SYNC_CORE available, -1: not available
  int state = registered.load(std::memory_order_acquire);
  if (state == 0) {
    state = membarrier(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED_SYNC_CORE) == 0 ? 1 : -1;
    registered.store(state, std::memory_order_release);
  }
  if (state == 1 && membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED_SYNC_CORE) == 0) return;
  // Without SYNC_CORE, a plain expedited barrier still makes every running thread take an
  // interrupt, and returning from it serializes the core on x86.
  if (membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED) == 0) return;
  PROBEFS_WARN_ON_ONCE(membarrier(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED) != 0 ||
                           membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED) != 0,
                       "no membarrier: other threads may run stale code after a patch");
}

}  // namespace probefs::arch::x86_64
