#include "tracee/self_symbols.h"

#include <dlfcn.h>
#include <link.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "tests/tracee/dl_helpers.h"
#include "tests/tracee/test_functions.h"
#include "tests/tracee/throwing.h"

namespace probefs::tracee {
namespace {

using test_support::dynsym_size;
using test_support::fn_addr;

// p_vaddr of the first PT_LOAD of the loaded object whose load bias is `bias`.
uintptr_t first_load_vaddr(uintptr_t bias) {
  struct Query {
    uintptr_t bias;
    uintptr_t vaddr = 0;
  } q{bias};
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* data) -> int {
        auto* q = static_cast<Query*>(data);
        if (info->dlpi_addr != q->bias) return 0;
        for (int i = 0; i < info->dlpi_phnum; ++i) {
          if (info->dlpi_phdr[i].p_type == PT_LOAD) {
            q->vaddr = info->dlpi_phdr[i].p_vaddr;
            return 1;
          }
        }
        return 1;
      },
      &q);
  return q.vaddr;
}

TEST(SelfSymbolResolver, IsOneProcessWideInstance) {
  probecore::SymbolResolver* a = &self_symbol_resolver();
  probecore::SymbolResolver* b = &self_symbol_resolver();
  EXPECT_EQ(a, b);
}

TEST(SelfSymbolResolver, ResolvesAndDescribes) {
  probecore::SymbolResolver& resolver = self_symbol_resolver();
  const uintptr_t a = fn_addr(&probefs_test_fn_a);
  const uint64_t size = dynsym_size(a);
  ASSERT_GT(size, 2u);

  probecore::SymbolLocation loc;
  ASSERT_EQ(resolver.resolve("probefs_test_fn_a", &loc), 0);
  EXPECT_EQ(loc.addr, a);
  EXPECT_EQ(loc.name, "probefs_test_fn_a");
  EXPECT_EQ(loc.module, "");
  EXPECT_EQ(loc.bounds.start, a);
  EXPECT_EQ(loc.bounds.end, a + size);

  probecore::SymbolLocation mid;
  ASSERT_EQ(resolver.describe(a + size / 2, &mid), 0);
  EXPECT_EQ(mid.name, "probefs_test_fn_a");
  EXPECT_EQ(mid.addr, a);
  EXPECT_TRUE(mid.bounds.known());
  EXPECT_EQ(mid.bounds.start, a);
  EXPECT_EQ(mid.bounds.end, a + size);

  ASSERT_EQ(resolver.resolve("libc:getpid", &loc), 0);
  EXPECT_EQ(loc.module, "libc.so.6");
  EXPECT_TRUE(loc.bounds.contains(loc.addr));
}

// The engine gets the same landing pads and split-off parts ProcessSymbols finds.
TEST(SelfSymbolResolver, BoundsCarryLandingPadsAndSplitOffParts) {
  int err = 1;
  auto syms = ProcessSymbols::load(getpid(), &err);
  ASSERT_EQ(err, 0);
  for (const void* fn : {reinterpret_cast<const void*>(throwing::cleanup_only_o2),
                         reinterpret_cast<const void*>(throwing::with_cold_o2)}) {
    const auto addr = reinterpret_cast<uintptr_t>(fn);
    ResolvedSymbol r;
    ASSERT_EQ(syms->describe(addr, &r), 0);
    probecore::SymbolLocation loc;
    ASSERT_EQ(self_symbol_resolver().describe(addr, &loc), 0);
    EXPECT_EQ(loc.bounds.start, r.function.start);
    EXPECT_EQ(loc.bounds.end, r.function.end);
    EXPECT_EQ(loc.bounds.landing_pads, r.function.landing_pads);
    ASSERT_EQ(loc.bounds.related.size(), r.function.related.size());
    for (size_t i = 0; i < r.function.related.size(); ++i) {
      EXPECT_EQ(loc.bounds.related[i].start, r.function.related[i].start);
      EXPECT_EQ(loc.bounds.related[i].end, r.function.related[i].end);
    }
    EXPECT_FALSE(loc.bounds.landing_pads.empty() && loc.bounds.related.empty()) << r.name;
  }
}

TEST(SelfSymbolResolver, ErrorsAreNegativeErrno) {
  probecore::SymbolResolver& resolver = self_symbol_resolver();
  probecore::SymbolLocation loc;
  EXPECT_EQ(resolver.resolve("probefs_no_such_function", &loc), -ENOENT);
  EXPECT_EQ(resolver.resolve("", &loc), -EINVAL);
  EXPECT_EQ(resolver.resolve(":", &loc), -EINVAL);
  EXPECT_EQ(resolver.resolve("libc:", &loc), -EINVAL);
  int on_stack = 0;
  EXPECT_EQ(resolver.describe(reinterpret_cast<uintptr_t>(&on_stack), &loc), -ENOENT);
}

// A miss re-reads the mappings; the object files the resolver itself has open must not
// show up there as more mappings of the same objects (they did when libelf mapped them).
TEST(SelfSymbolResolver, DescribesLibcAfterAMissMadeItReload) {
  const auto addr = reinterpret_cast<uintptr_t>(dlsym(RTLD_DEFAULT, "getpid"));
  ASSERT_NE(addr, 0u);
  probecore::SymbolLocation before, after;
  ASSERT_EQ(self_symbol_resolver().describe(addr, &before), 0);
  EXPECT_EQ(self_symbol_resolver().resolve("libc:no_such_function_here", &after), -ENOENT);
  ASSERT_EQ(self_symbol_resolver().describe(addr, &after), 0);
  EXPECT_EQ(after.bounds.start, before.bounds.start);
  EXPECT_EQ(after.bounds.end, before.bounds.end);
  EXPECT_EQ(after.module, before.module);
}

TEST(SelfSymbolResolver, ServesSeveralThreadsAtOnce) {
  SelfSymbolResolver& resolver = self_symbol_resolver();
  const uintptr_t a = fn_addr(&probefs_test_fn_a);
  std::atomic<int> wrong{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&resolver, &wrong, a, t] {
      for (int i = 0; i < 50; ++i) {
        probecore::SymbolLocation loc;
        if (resolver.resolve("probefs_test_fn_a", &loc) != 0 || loc.addr != a) ++wrong;
        if (resolver.describe(a + 1, &loc) != 0 || loc.bounds.start != a) ++wrong;
        if (t == 0 && i % 10 == 0 && resolver.reload() != 0) ++wrong;
      }
    });
  }
  for (std::thread& th : threads) th.join();
  EXPECT_EQ(wrong.load(), 0);
}

TEST(SelfSymbolResolver, FindsALibraryLoadedAfterFirstUse) {
  ASSERT_EQ(dlopen(PROBEFS_LATE_LIB, RTLD_NOW | RTLD_NOLOAD), nullptr)
      << "the late library must be loaded by this test only";
  SelfSymbolResolver& resolver = self_symbol_resolver();
  probecore::SymbolLocation loc;
  ASSERT_EQ(resolver.resolve("getpid", &loc), 0);  // in use before the dlopen
  EXPECT_EQ(resolver.resolve("probefs_late_fn", &loc), -ENOENT);

  void* lib = dlopen(PROBEFS_LATE_LIB, RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(lib, nullptr) << dlerror();
  const uintptr_t late = reinterpret_cast<uintptr_t>(dlsym(lib, "probefs_late_fn"));
  ASSERT_NE(late, 0u);
  const uint64_t size = dynsym_size(late);

  // The premise of the bias check: the library's first PT_LOAD has a nonzero p_vaddr.
  link_map* map = nullptr;
  ASSERT_EQ(dlinfo(lib, RTLD_DI_LINKMAP, &map), 0);
  EXPECT_NE(first_load_vaddr(map->l_addr), 0u);

  int resolved = resolver.resolve("probefs_late_fn", &loc);
  int described = -1;
  probecore::SymbolLocation mid;
  if (resolved == 0) described = resolver.describe(late + size / 2, &mid);
  dlclose(lib);

  ASSERT_EQ(resolved, 0);
  EXPECT_EQ(loc.addr, late);
  EXPECT_EQ(loc.module, "libprobefs_tracee_late.so");
  EXPECT_EQ(loc.bounds.start, late);
  EXPECT_EQ(loc.bounds.end, late + size);
  ASSERT_EQ(described, 0);
  EXPECT_EQ(mid.name, "probefs_late_fn");
  EXPECT_EQ(mid.bounds.start, late);

  // Once the library is really gone, its symbols are too.
  if (dlopen(PROBEFS_LATE_LIB, RTLD_NOW | RTLD_NOLOAD) == nullptr) {
    EXPECT_EQ(resolver.resolve("probefs_late_fn", &loc), -ENOENT);
  }
}

}  // namespace
}  // namespace probefs::tracee
