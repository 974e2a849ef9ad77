// Helpers for the signal guard tests: each scenario runs in a forked child with a time
// limit (the guards own the process's signals, and some scenarios end in a death that is
// the point of the test), function bounds from the dynamic symbol table, and checks that
// end the child with a message.
#pragma once

#include <dlfcn.h>
#include <elf.h>
#include <link.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>

#include "probecore/kprobes.h"

namespace probefs::agent::test_util {

// A failed check inside a child: says where on stderr and ends the child with status 1.
#define CHILD_CHECK(cond)                                                                \
  do {                                                                                   \
    if (!(cond)) {                                                                       \
      std::fprintf(stderr, "%s:%d: child check failed: %s\n", __FILE__, __LINE__, #cond); \
      std::fflush(stderr);                                                               \
      _exit(1);                                                                          \
    }                                                                                    \
  } while (0)

#define CHILD_CHECK_EQ(a, b)                                                             \
  do {                                                                                   \
    const auto va_ = (a);                                                                \
    const auto vb_ = (b);                                                                \
    if (!(va_ == vb_)) {                                                                 \
      std::fprintf(stderr, "%s:%d: child check failed: %s == %s (%#llx vs %#llx)\n",     \
                   __FILE__, __LINE__, #a, #b, (unsigned long long)va_,                  \
                   (unsigned long long)vb_);                                             \
      std::fflush(stderr);                                                               \
      _exit(1);                                                                          \
    }                                                                                    \
  } while (0)

// Runs fn in a forked child, which exits with fn's result; returns its wait status, or -1
// when it did not end within `seconds` (it is killed then). The child is killed and
// reaped whatever happens here.
inline int run_child(const std::function<int()>& fn, int seconds = 120) {
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t pid = fork();
  if (pid < 0) return -2;
  if (pid == 0) {
    prctl(PR_SET_DUMPABLE, 0);  // the deaths tested here leave no core behind
    _exit(fn());
  }
  struct Reaper {
    pid_t pid;
    bool reaped = false;
    ~Reaper() {
      if (!reaped) {
        kill(pid, SIGKILL);
        waitpid(pid, nullptr, 0);
      }
    }
  } reaper{pid};
  const int pidfd = static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
  if (pidfd < 0) return -3;
  pollfd p{pidfd, POLLIN, 0};
  const int ready = poll(&p, 1, seconds * 1000);
  close(pidfd);
  if (ready != 1) return -1;
  int status = 0;
  if (waitpid(pid, &status, 0) != pid) return -4;
  reaper.reaped = true;
  return status;
}

inline std::string describe_status(int status) {
  if (status < 0) return "timed out or not started (" + std::to_string(status) + ")";
  if (WIFEXITED(status)) return "exit status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return std::string("killed by ") + strsignal(WTERMSIG(status));
  return "status " + std::to_string(status);
}

inline bool exited_ok(int status) { return status >= 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0; }
inline bool killed_by(int status, int sig) {
  return status >= 0 && WIFSIGNALED(status) && WTERMSIG(status) == sig;
}

// Bounds of the exported function at `fn` (the test binary links -rdynamic; libc's from
// its .dynsym).
inline probecore::FunctionBounds bounds_of(const void* fn) {
  Dl_info info{};
  void* extra = nullptr;
  if (!dladdr1(fn, &info, &extra, RTLD_DL_SYMENT) || !extra || !info.dli_saddr) return {};
  const auto* sym = static_cast<const ElfW(Sym)*>(extra);
  const auto start = reinterpret_cast<uintptr_t>(info.dli_saddr);
  return {start, start + sym->st_size};
}

// A probe on the function at `fn` with a pre_handler.
inline int probe_function(probecore::Kprobe* k, const void* fn,
                          probecore::kprobe_pre_handler_t pre) {
  k->addr = reinterpret_cast<uintptr_t>(fn);
  k->bounds = bounds_of(fn);
  k->pre_handler = pre;
  return probecore::register_kprobe(k);
}

// The kernel's view, without libc (whose functions the guards rewrite).
inline uint64_t real_blocked() {
  uint64_t m = 0;
  syscall(SYS_rt_sigprocmask, SIG_BLOCK, nullptr, &m, 8);
  return m;
}

struct KernelAction {
  uint64_t handler, flags, restorer, mask;
};
inline KernelAction real_action(int sig) {
  KernelAction k{};
  syscall(SYS_rt_sigaction, sig, nullptr, &k, 8);
  return k;
}

inline uint64_t bit(int sig) { return uint64_t{1} << (sig - 1); }
inline uint64_t word0(const sigset_t& s) { return reinterpret_cast<const uint64_t*>(&s)[0]; }

}  // namespace probefs::agent::test_util
