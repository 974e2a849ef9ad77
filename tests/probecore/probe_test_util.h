// Helpers for probecore tests: function bounds from the dynamic symbol table, a small
// dlsym-based resolver, and RAII owners that unregister probes even when a test fails.
#pragma once

#include <dlfcn.h>
#include <elf.h>
#include <link.h>
#include <sys/wait.h>

#include <gtest/gtest.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>

#include "probecore/kprobes.h"

namespace probefs::probecore::test_util {

// Checks in a test's forked child (where gtest's do not reach the parent): what a case
// found wrong goes into g_failures, which the child prints before it exits non-zero.
inline std::string g_failures;

#define CHILD_EXPECT_EQ(a, b)                                                          \
  do {                                                                                 \
    const long long va_ = static_cast<long long>(a), vb_ = static_cast<long long>(b);  \
    if (va_ != vb_) {                                                                  \
      char m_[256];                                                                    \
      std::snprintf(m_, sizeof m_, "%s:%d: %s = %lld, expected %s = %lld\n", __FILE__, \
                    __LINE__, #a, va_, #b, vb_);                                       \
      ::probefs::probecore::test_util::g_failures += m_;                               \
    }                                                                                  \
  } while (0)

#define CHILD_EXPECT_TRUE(c)                                                          \
  do {                                                                                \
    if (!(c))                                                                         \
      ::probefs::probecore::test_util::g_failures +=                                  \
          std::string(__FILE__ ":") + std::to_string(__LINE__) + ": " #c " is false\n"; \
  } while (0)

// Waits for a test's forked child (which bounds itself with an alarm) and fails the test
// unless it exited 0: a signal is named, an exit status points at the child's messages.
inline void expect_child_succeeded(pid_t pid) {
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  if (WIFSIGNALED(status)) {
    ADD_FAILURE() << "the child died of signal " << WTERMSIG(status) << " ("
                  << strsignal(WTERMSIG(status)) << ")";
  } else {
    EXPECT_EQ(WEXITSTATUS(status), 0) << "see the child's messages above";
  }
}

// Bounds of the exported function containing `fn` (the test binary links -rdynamic).
inline FunctionBounds bounds_of(const void* fn) {
  Dl_info info{};
  void* extra = nullptr;
  if (!dladdr1(fn, &info, &extra, RTLD_DL_SYMENT) || !extra ||
      !info.dli_saddr)
    return {};
  const auto* sym = static_cast<const ElfW(Sym)*>(extra);
  const auto start = reinterpret_cast<uintptr_t>(info.dli_saddr);
  return {start, start + sym->st_size};
}

template <typename F>
uintptr_t addr_of(F* fn) {
  return reinterpret_cast<uintptr_t>(fn);
}

// Resolves through the dynamic linker: enough for probecore's own tests (the ELF resolver
// proper lives in target/ and has its own tests).
class DlResolver : public SymbolResolver {
 public:
  int resolve(std::string_view name, SymbolLocation* out) override {
    std::string n(name);
    void* handle = RTLD_DEFAULT;
    if (auto colon = n.find(':'); colon != std::string::npos) {
      handle = dlopen(n.substr(0, colon).c_str(), RTLD_NOLOAD | RTLD_LAZY);
      if (!handle) return -ENOENT;
      n = n.substr(colon + 1);
    }
    void* p = dlsym(handle, n.c_str());
    if (handle != RTLD_DEFAULT) dlclose(handle);
    if (!p) return -ENOENT;
    return describe(reinterpret_cast<uintptr_t>(p), out);
  }
  int describe(uintptr_t addr, SymbolLocation* out) override {
    Dl_info info{};
    void* extra = nullptr;
    if (!dladdr1(reinterpret_cast<void*>(addr), &info, &extra,
                 RTLD_DL_SYMENT) ||
        !extra || !info.dli_saddr)
      return -ENOENT;
    const auto* sym = static_cast<const ElfW(Sym)*>(extra);
    const auto start = reinterpret_cast<uintptr_t>(info.dli_saddr);
    if (addr >= start + sym->st_size) return -ENOENT;
    out->addr = start;
    out->bounds = {start, start + sym->st_size};
    out->name = info.dli_sname ? info.dli_sname : "";
    std::string obj = info.dli_fname ? info.dli_fname : "";
    const bool is_exe = info.dli_fbase == dlsym(RTLD_DEFAULT, "main") ||
                        obj.find(".so") == std::string::npos;
    out->module = is_exe ? "" : obj.substr(obj.rfind('/') + 1);
    return 0;
  }
};

// Unregisters on scope exit, whatever the test did.
struct KprobeGuard {
  Kprobe* p;
  ~KprobeGuard() {
    if (p->aggr_) {
      EXPECT_EQ(unregister_kprobe(p), 0);
    }
  }
};
struct KretprobeGuard {
  Kretprobe* rp;
  ~KretprobeGuard() {
    if (rp->kp.aggr_) {
      EXPECT_EQ(unregister_kretprobe(rp), 0);
    }
  }
};

}  // namespace probefs::probecore::test_util
