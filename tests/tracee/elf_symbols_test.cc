#include "tracee/elf_symbols.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <link.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <latch>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "events/compile.h"
#include "events/fetch.h"
#include "events/memory_reader.h"
#include "events/parse.h"
#include "tests/tracee/dl_helpers.h"
#include "tests/tracee/libc_dynsym.h"
#include "tests/tracee/test_functions.h"

extern char** environ;

// Variables of the test executable for data symbols (`@SYM`): one exported (the executable
// exports its symbols), one file-local (in .symtab only) and one thread-local. Named as C
// names them (C++ would mangle the file-local one: _ZL23...).
extern "C" {
int probefs_test_global_var = 11;
__thread int probefs_test_tls_var = 13;
}
static int probefs_test_static_var __asm__("probefs_test_static_var") = 12;

namespace probefs::tracee {
namespace {

using test_support::dynsym_size;
using test_support::fn_addr;

std::unique_ptr<ProcessSymbols> load_self() {
  int err = 1;
  auto syms = ProcessSymbols::load(getpid(), &err);
  EXPECT_EQ(err, 0);
  return syms;
}

uintptr_t addr_of(const void* p) { return reinterpret_cast<uintptr_t>(p); }

// libc's own definition of a symbol (dlsym on libc's handle: never a PLT stub, and for an
// IFUNC the implementation the resolver chose).
uintptr_t libc_symbol(const char* name) {
  void* libc = dlopen("libc.so.6", RTLD_NOW | RTLD_NOLOAD);
  if (libc == nullptr) return 0;
  uintptr_t a = addr_of(dlsym(libc, name));
  dlclose(libc);
  return a;
}

std::string basename_of(const std::string& path) { return path.substr(path.rfind('/') + 1); }

TEST(ProcessSymbols, ResolvesFunctionsOfTheExecutable) {
  auto syms = load_self();
  ASSERT_NE(syms, nullptr);
  ResolvedSymbol r;
  ASSERT_EQ(syms->resolve("probefs_test_fn_a", &r), 0);
  const uintptr_t a = fn_addr(&probefs_test_fn_a);
  EXPECT_EQ(r.addr, a);
  EXPECT_EQ(r.name, "probefs_test_fn_a");
  EXPECT_EQ(r.module, "");  // the executable
  const uint64_t size = dynsym_size(a);
  ASSERT_GT(size, 0u);
  EXPECT_EQ(r.function.start, a);
  EXPECT_EQ(r.function.end, a + size);

  // The executable also answers to its basename as MOD.
  char exe[4096];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  ASSERT_GT(n, 0);
  exe[n] = '\0';
  const std::string qualified = basename_of(exe) + ":probefs_test_fn_b";
  ASSERT_EQ(syms->resolve(qualified, &r), 0);
  EXPECT_EQ(r.addr, fn_addr(&probefs_test_fn_b));
  EXPECT_EQ(r.name, "probefs_test_fn_b");
}

TEST(ProcessSymbols, ResolvesMangledNames) {
  auto syms = load_self();
  ASSERT_NE(syms, nullptr);
  ResolvedSymbol r;
  // probefs::tracee::ProcessSymbols::fork_of(probefs::tracee::ProcessSymbols const&, int)
  ASSERT_EQ(syms->resolve("_ZN7probefs6tracee14ProcessSymbols7fork_ofERKS1_i", &r), 0);
  EXPECT_EQ(r.addr, fn_addr(&ProcessSymbols::fork_of));
  EXPECT_TRUE(r.function.contains(r.addr));
}

TEST(ProcessSymbols, ResolvesLibcWithAndWithoutModule) {
  auto syms = load_self();
  ASSERT_NE(syms, nullptr);
  const uintptr_t getpid_addr = libc_symbol("getpid");
  ASSERT_NE(getpid_addr, 0u);
  const uint64_t size = dynsym_size(getpid_addr);
  ASSERT_GT(size, 0u);
  for (const char* name : {"getpid", "libc:getpid", "libc.so:getpid", "libc.so.6:getpid"}) {
    SCOPED_TRACE(name);
    ResolvedSymbol r;
    ASSERT_EQ(syms->resolve(name, &r), 0);
    EXPECT_EQ(r.addr, getpid_addr);
    EXPECT_EQ(r.name, "getpid");
    EXPECT_EQ(r.module, "libc.so.6");
    EXPECT_EQ(r.function.start, getpid_addr);
    EXPECT_EQ(r.function.end, getpid_addr + size);
  }
}

// A fork child's symbols start as a copy of its parent's (no file read), name the child,
// and reload from the child's own mappings.
TEST(ProcessSymbols, AForkChildStartsWithItsParentsSymbols) {
  auto syms = load_self();
  ASSERT_NE(syms, nullptr);
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  const pid_t child = fork();
  if (child == 0) {
    char c;
    (void)!read(ready[0], &c, 1);  // until the parent is done with it (or gone)
    _exit(0);
  }
  ASSERT_GT(child, 0);
  auto forked = ProcessSymbols::fork_of(*syms, child);
  ASSERT_NE(forked, nullptr);
  EXPECT_EQ(forked->pid(), child);
  ResolvedSymbol a, b;
  ASSERT_EQ(syms->resolve("libc:getpid", &a), 0);
  ASSERT_EQ(forked->resolve("libc:getpid", &b), 0);
  EXPECT_EQ(a.addr, b.addr);
  EXPECT_EQ(a.function.end, b.function.end);
  EXPECT_EQ(forked->reload(), 0);  // the child's own maps: the same objects
  ResolvedSymbol c;
  ASSERT_EQ(forked->resolve("libc:getpid", &c), 0);
  EXPECT_EQ(c.addr, a.addr);
  (void)!write(ready[1], "x", 1);
  close(ready[0]);
  close(ready[1]);
  int st = 0;
  EXPECT_EQ(waitpid(child, &st, 0), child);
  EXPECT_EQ(ProcessSymbols::fork_of(*syms, 0), nullptr);
}

TEST(ProcessSymbols, AgreesWithTheDynamicLinkerOnLibcFunctions) {
  auto syms = load_self();
  ASSERT_NE(syms, nullptr);
  // Plain FUNC symbols of libc (IFUNCs differ from dlsym by design, see below).
  for (const char* fn : {"getpid", "write", "read", "close", "qsort", "fopen", "printf",
                         "abort", "pthread_create", "dlopen", "exit", "setenv"}) {
    SCOPED_TRACE(fn);
    const uintptr_t expected = libc_symbol(fn);
    ASSERT_NE(expected, 0u);
    ResolvedSymbol r;
    ASSERT_EQ(syms->resolve(std::string("libc:") + fn, &r), 0);
    EXPECT_EQ(r.addr, expected);
    EXPECT_EQ(r.function.start, expected);
    EXPECT_EQ(r.function.end, expected + dynsym_size(expected));
    ResolvedSymbol d;
    ASSERT_EQ(syms->describe(expected + (r.function.end - r.function.start) / 2, &d), 0);
    EXPECT_EQ(d.function.start, r.function.start);
    EXPECT_EQ(d.function.end, r.function.end);
  }
}

// A GNU_IFUNC symbol resolves to the implementation its resolver chose, which the program
// calls (and dlsym hands out); `SYM@resolver` to the resolver, the symbol's own address.
TEST(ProcessSymbols, IfuncResolvesToTheImplementation) {
  auto syms = load_self();
  ASSERT_NE(syms, nullptr);
  ResolvedSymbol r;
  ASSERT_EQ(syms->resolve("probefs_test_ifunc", &r), 0);
  EXPECT_EQ(r.addr, addr_of(dlsym(RTLD_DEFAULT, "probefs_test_ifunc")));
  EXPECT_NE(r.addr, fn_addr(&probefs_test_ifunc_resolver));
  EXPECT_EQ(r.resolver, fn_addr(&probefs_test_ifunc_resolver));
  EXPECT_EQ(r.asked, "probefs_test_ifunc");
  EXPECT_NE(r.ifunc, IfuncChoice::kUnknown);
  EXPECT_EQ(probefs_test_ifunc(), 42);
  ASSERT_EQ(syms->resolve("probefs_test_ifunc@resolver", &r), 0);
  EXPECT_EQ(r.addr, fn_addr(&probefs_test_ifunc_resolver));
  EXPECT_EQ(r.ifunc, IfuncChoice::kResolver);

  // libc's strlen is a GNU_IFUNC: the implementation, in libc, that dlsym hands out.
  ASSERT_EQ(syms->resolve("libc:strlen", &r), 0);
  EXPECT_EQ(r.module, "libc.so.6");
  EXPECT_EQ(r.addr, libc_symbol("strlen"));
  ResolvedSymbol resolver;
  ASSERT_EQ(syms->resolve("libc:strlen@resolver", &resolver), 0);
  EXPECT_NE(resolver.addr, r.addr);
  EXPECT_EQ(resolver.addr, r.resolver);
  Dl_info in_libc, at_getpid;
  ASSERT_NE(dladdr(reinterpret_cast<void*>(resolver.addr), &in_libc), 0);
  ASSERT_NE(dladdr(reinterpret_cast<void*>(libc_symbol("getpid")), &at_getpid), 0);
  EXPECT_EQ(in_libc.dli_fbase, at_getpid.dli_fbase);
}

TEST(ProcessSymbols, DescribeGivesTheEnclosingFunction) {
  auto syms = load_self();
  ASSERT_NE(syms, nullptr);
  const uintptr_t a = fn_addr(&probefs_test_fn_a);
  const uint64_t size = dynsym_size(a);
  ASSERT_GT(size, 2u);
  ResolvedSymbol r;
  ASSERT_EQ(syms->describe(a + size / 2, &r), 0);
  EXPECT_EQ(r.name, "probefs_test_fn_a");
  EXPECT_EQ(r.addr, a);
  EXPECT_EQ(r.function.start, a);
  EXPECT_EQ(r.function.end, a + size);
  EXPECT_EQ(r.module, "");

  const uintptr_t g = libc_symbol("getpid");
  const uint64_t gsize = dynsym_size(g);
  ASSERT_GT(gsize, 1u);
  ASSERT_EQ(syms->describe(g + gsize - 1, &r), 0);
  EXPECT_EQ(r.function.start, g);
  EXPECT_EQ(r.function.end, g + gsize);
  EXPECT_EQ(r.module, "libc.so.6");

  // Not code of any object.
  int on_stack = 0;
  EXPECT_EQ(syms->describe(addr_of(&on_stack), &r), -ENOENT);
}

TEST(ProcessSymbols, UnknownSymbolsAreENOENT) {
  auto syms = load_self();
  ASSERT_NE(syms, nullptr);
  ResolvedSymbol r;
  EXPECT_EQ(syms->resolve("probefs_no_such_function", &r), -ENOENT);
  EXPECT_EQ(syms->resolve("probefs_no_such_object:getpid", &r), -ENOENT);
  EXPECT_EQ(syms->resolve("libc:probefs_test_fn_a", &r), -ENOENT);
  EXPECT_EQ(syms->resolve("lib:getpid", &r), -ENOENT);  // a prefix is not a module name
  EXPECT_EQ(syms->resolve("environ", &r), -ENOENT);     // data, not a function
}

// A stripped libc's static functions resolve from its debug file, where one is installed,
// as the kernel probes any function kallsyms names. A name several of them share names
// none of them (the kernel's "not unique"), and exported names come from .dynsym as ever.
TEST(ProcessSymbols, LocalFunctionsOfAStrippedLibraryResolveFromItsDebugFile) {
  auto syms = load_self();
  ASSERT_NE(syms, nullptr);
  ResolvedSymbol r;
  const int rc = syms->resolve("libc:do_dlopen", &r);
  if (rc == -ENOENT) GTEST_SKIP() << "no debug file for libc (libc6-dbg)";
  ASSERT_EQ(rc, 0);
  EXPECT_EQ(r.name, "do_dlopen");
  EXPECT_TRUE(r.function.known());
  ResolvedSymbol named;
  ASSERT_EQ(syms->describe(r.addr, &named), 0);
  EXPECT_EQ(named.name, "do_dlopen");
  ResolvedSymbol bare;
  ASSERT_EQ(syms->resolve("do_dlopen", &bare), 0);
  EXPECT_EQ(bare.addr, r.addr);
  EXPECT_EQ(syms->resolve("libc:internal_getent", &r), -EADDRNOTAVAIL);
  EXPECT_EQ(syms->resolve("internal_getent", &r), -EADDRNOTAVAIL);
  ASSERT_EQ(syms->resolve("libc:qsort", &r), 0);
  EXPECT_EQ(r.addr, libc_symbol("qsort"));  // libc's own (a sanitizer intercepts qsort)
}

TEST(ProcessSymbols, MalformedNamesAreEINVAL) {
  auto syms = load_self();
  ASSERT_NE(syms, nullptr);
  ResolvedSymbol r;
  for (const char* name : {"", ":", "libc:", ":getpid", "libc:get pid", "a:b:c", " getpid"}) {
    SCOPED_TRACE(name);
    EXPECT_EQ(syms->resolve(name, &r), -EINVAL);
  }
}

TEST(ProcessSymbols, ExecutableFirstThenLinkMapOrder) {
  auto syms = load_self();
  ASSERT_NE(syms, nullptr);
  std::vector<MappedObject> objects = syms->objects();
  ASSERT_FALSE(objects.empty());
  EXPECT_TRUE(objects[0].executable);
  for (size_t i = 1; i < objects.size(); ++i) EXPECT_FALSE(objects[i].executable);

  // The dynamic linker's list, in load order, without the vDSO (which we skip).
  std::vector<uintptr_t> dl_biases;
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* data) -> int {
        if (std::strstr(info->dlpi_name, "linux-vdso") == nullptr) {
          static_cast<std::vector<uintptr_t>*>(data)->push_back(info->dlpi_addr);
        }
        return 0;
      },
      &dl_biases);
  ASSERT_GE(objects.size(), dl_biases.size());
  for (size_t i = 0; i < dl_biases.size(); ++i) {
    SCOPED_TRACE(objects[i].path);
    EXPECT_EQ(objects[i].load_bias, dl_biases[i]) << "position " << i;
  }
}

TEST(ProcessSymbols, FirstLoadedDefinitionWins) {
  auto syms = load_self();
  ASSERT_NE(syms, nullptr);
  ASSERT_EQ(probefs_dup_a_id() + probefs_dup_b_id(), 2);
  ResolvedSymbol r;
  ASSERT_EQ(syms->resolve("probefs_dup_fn", &r), 0);
  EXPECT_EQ(r.addr, addr_of(dlsym(RTLD_DEFAULT, "probefs_dup_fn")));
  EXPECT_EQ(r.module, "libprobefs_tracee_dup_a.so");

  Dl_info b;
  ASSERT_NE(dladdr(reinterpret_cast<void*>(&probefs_dup_b_id), &b), 0);
  void* handle = dlopen(b.dli_fname, RTLD_NOW | RTLD_NOLOAD);
  ASSERT_NE(handle, nullptr);
  const uintptr_t in_b = addr_of(dlsym(handle, "probefs_dup_fn"));
  dlclose(handle);
  ASSERT_EQ(syms->resolve("libprobefs_tracee_dup_b:probefs_dup_fn", &r), 0);
  EXPECT_EQ(r.addr, in_b);
  EXPECT_EQ(r.module, "libprobefs_tracee_dup_b.so");
  EXPECT_NE(r.addr, addr_of(dlsym(RTLD_DEFAULT, "probefs_dup_fn")));
}

// dlclose on scope exit.
struct Library {
  explicit Library(const char* path) : handle(dlopen(path, RTLD_NOW | RTLD_LOCAL)) {}
  ~Library() {
    if (handle != nullptr) dlclose(handle);
  }
  Library(const Library&) = delete;
  Library& operator=(const Library&) = delete;
  void* handle;
};

TEST(ProcessSymbols, StrippedLibraryBoundsComeFromEhFrame) {
  ASSERT_EQ(dlopen(PROBEFS_STRIPPED_LIB, RTLD_NOW | RTLD_NOLOAD), nullptr)
      << "the stripped library must be loaded by this test only";
  auto syms = load_self();
  ASSERT_NE(syms, nullptr);
  const std::string module = basename_of(PROBEFS_STRIPPED_LIB);
  const std::string exported = module + ":probefs_stripped_exported";
  ResolvedSymbol r;
  EXPECT_EQ(syms->resolve(exported, &r), -ENOENT);

  Library lib(PROBEFS_STRIPPED_LIB);
  ASSERT_NE(lib.handle, nullptr) << dlerror();
  // Loading alone does not change what an existing ProcessSymbols knows.
  EXPECT_EQ(syms->resolve(exported, &r), -ENOENT);
  ASSERT_EQ(syms->reload(), 0);

  // .dynsym survives strip --strip-all.
  const uintptr_t exp = addr_of(dlsym(lib.handle, "probefs_stripped_exported"));
  ASSERT_NE(exp, 0u);
  ASSERT_EQ(syms->resolve(exported, &r), 0);
  EXPECT_EQ(r.addr, exp);
  EXPECT_EQ(r.module, module);
  EXPECT_EQ(r.function.end, exp + dynsym_size(exp));

  using RangesFn = void (*)(uintptr_t*);
  auto ranges_fn = reinterpret_cast<RangesFn>(dlsym(lib.handle, "probefs_stripped_hidden_ranges"));
  ASSERT_NE(ranges_fn, nullptr);
  uintptr_t ranges[6];
  ranges_fn(ranges);
  const FunctionBounds a{ranges[0], ranges[1]};
  const FunctionBounds b{ranges[2], ranges[3]};
  ASSERT_TRUE(a.known());
  ASSERT_TRUE(b.known());

  // Every byte of each hidden function maps to exactly that function: the FDE, not the
  // CFA row around the address, and not the neighbour that starts where it ends.
  for (const FunctionBounds& f : {a, b}) {
    for (uintptr_t p = f.start; p < f.end; ++p) {
      SCOPED_TRACE(p - f.start);
      ASSERT_EQ(syms->describe(p, &r), 0);
      EXPECT_EQ(r.function.start, f.start);
      EXPECT_EQ(r.function.end, f.end);
      EXPECT_EQ(r.addr, f.start);
      EXPECT_EQ(r.name, "");  // no symbol names it: the library really is stripped
      EXPECT_EQ(r.module, module);
    }
  }

  // A symbol of size 0 names the code, the FDE bounds it.
  const FunctionBounds unsized{ranges[4], ranges[5]};
  ASSERT_TRUE(unsized.known());
  ASSERT_EQ(dynsym_size(unsized.start), 0u);
  ASSERT_EQ(syms->resolve(module + ":probefs_stripped_unsized", &r), 0);
  EXPECT_EQ(r.addr, unsized.start);
  EXPECT_EQ(r.function.start, unsized.start);
  EXPECT_EQ(r.function.end, unsized.end);
  ASSERT_EQ(syms->describe(unsized.end - 1, &r), 0);
  EXPECT_EQ(r.name, "probefs_stripped_unsized");
  EXPECT_EQ(r.addr, unsized.start);
  EXPECT_EQ(r.function.start, unsized.start);
  EXPECT_EQ(r.function.end, unsized.end);
}

// Reads one line from fd without stdio buffering.
std::string read_line(int fd) {
  std::string line;
  char c;
  while (read(fd, &c, 1) == 1 && c != '\n') line.push_back(c);
  return line;
}

// Kills and reaps the child on early test exit; closing its stdin lets it exit by itself.
struct Child {
  ~Child() {
    if (to_child >= 0) close(to_child);
    if (from_child >= 0) close(from_child);
    if (pid > 0) {
      int status;
      if (waitpid(pid, &status, WNOHANG) == 0) {
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
      }
    }
  }
  pid_t pid = -1;
  int to_child = -1;
  int from_child = -1;
};

TEST(ProcessSymbols, AnotherProcessWithANonPieExecutable) {
  // The premise: the child is ET_EXEC.
  int exe_fd = open(PROBEFS_NOPIE_CHILD, O_RDONLY | O_CLOEXEC);
  ASSERT_GE(exe_fd, 0);
  ElfW(Ehdr) eh;
  ASSERT_EQ(pread(exe_fd, &eh, sizeof eh, 0), static_cast<ssize_t>(sizeof eh));
  close(exe_fd);
  ASSERT_EQ(eh.e_type, ET_EXEC);

  Child child;
  int in_pipe[2], out_pipe[2];
  ASSERT_EQ(pipe2(in_pipe, O_CLOEXEC), 0);
  child.to_child = in_pipe[1];
  ASSERT_EQ(pipe2(out_pipe, O_CLOEXEC), 0);
  child.from_child = out_pipe[0];
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, in_pipe[0], 0);
  posix_spawn_file_actions_adddup2(&actions, out_pipe[1], 1);
  char* argv[] = {const_cast<char*>(PROBEFS_NOPIE_CHILD), nullptr};
  int spawned = posix_spawn(&child.pid, PROBEFS_NOPIE_CHILD, &actions, nullptr, argv, environ);
  posix_spawn_file_actions_destroy(&actions);
  close(in_pipe[0]);
  close(out_pipe[1]);
  ASSERT_EQ(spawned, 0);

  unsigned long child_fn = 0, child_getpid = 0;
  const std::string line = read_line(child.from_child);
  ASSERT_EQ(std::sscanf(line.c_str(), "%lx %lx", &child_fn, &child_getpid), 2) << line;
  ASSERT_NE(child_getpid, 0u);

  int err = 1;
  auto syms = ProcessSymbols::load(child.pid, &err);
  ASSERT_NE(syms, nullptr);
  EXPECT_EQ(err, 0);
  EXPECT_EQ(syms->pid(), child.pid);
  std::vector<MappedObject> objects = syms->objects();
  ASSERT_FALSE(objects.empty());
  EXPECT_TRUE(objects[0].executable);
  EXPECT_EQ(objects[0].load_bias, 0u);
  EXPECT_EQ(objects[0].module, basename_of(PROBEFS_NOPIE_CHILD));

  ResolvedSymbol r;
  ASSERT_EQ(syms->resolve("probefs_child_fn", &r), 0);
  EXPECT_EQ(r.addr, child_fn);
  EXPECT_TRUE(r.function.known());
  ASSERT_EQ(syms->describe(child_fn + 1, &r), 0);
  EXPECT_EQ(r.name, "probefs_child_fn");
  EXPECT_EQ(r.function.start, child_fn);

  ASSERT_EQ(syms->resolve("getpid", &r), 0);
  EXPECT_EQ(r.addr, child_getpid);
  EXPECT_EQ(r.module, "libc.so.6");

  close(child.to_child);
  child.to_child = -1;
  int status = 0;
  ASSERT_EQ(waitpid(child.pid, &status, 0), child.pid);
  child.pid = -1;
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

// `SYM` is the default version, the one ld.so binds a new reference to; glibc keeps
// pthread_cond_* twice (GLIBC_2.3.2 by default, GLIBC_2.2.5 for old programs).
TEST(ProcessSymbols, BareNamesAreTheDefaultVersion) {
  auto syms = load_self();
  ASSERT_NE(syms, nullptr);
  void* libc = dlopen("libc.so.6", RTLD_NOW | RTLD_NOLOAD);
  ASSERT_NE(libc, nullptr);
  for (const char* fn : {"pthread_cond_signal", "pthread_cond_broadcast", "pthread_cond_wait",
                         "pthread_cond_timedwait", "pthread_cond_init", "pthread_cond_destroy"}) {
    SCOPED_TRACE(fn);
    const uintptr_t current = addr_of(dlvsym(libc, fn, "GLIBC_2.3.2"));
    const uintptr_t compat = addr_of(dlvsym(libc, fn, "GLIBC_2.2.5"));
    ASSERT_NE(current, 0u);
    ASSERT_NE(compat, 0u);
    ASSERT_NE(current, compat);
    EXPECT_EQ(addr_of(dlsym(libc, fn)), current);  // what the dynamic linker binds
    ResolvedSymbol r;
    ASSERT_EQ(syms->resolve(std::string("libc:") + fn, &r), 0);
    EXPECT_EQ(r.addr, current);
    EXPECT_EQ(r.function.start, current);
    EXPECT_EQ(r.function.end, current + dynsym_size(current));
    EXPECT_EQ(r.name, fn);
    // Programs call it through their PLT, which lands on the same address.
    ASSERT_EQ(syms->resolve(fn, &r), 0);
    EXPECT_EQ(r.addr, current);
  }
  // The program's own calls go there.
  EXPECT_EQ(addr_of(dlsym(RTLD_DEFAULT, "pthread_cond_signal")),
            addr_of(dlvsym(libc, "pthread_cond_signal", "GLIBC_2.3.2")));
  dlclose(libc);
}

// `SYM@VERSION` names any version, `SYM@@VERSION` the default one as .symtab spells it.
TEST(ProcessSymbols, NamesWithAVersionPickThatVersion) {
  auto syms = load_self();
  ASSERT_NE(syms, nullptr);
  void* libc = dlopen("libc.so.6", RTLD_NOW | RTLD_NOLOAD);
  ASSERT_NE(libc, nullptr);
  const uintptr_t current = addr_of(dlvsym(libc, "pthread_cond_signal", "GLIBC_2.3.2"));
  const uintptr_t compat = addr_of(dlvsym(libc, "pthread_cond_signal", "GLIBC_2.2.5"));
  dlclose(libc);
  ResolvedSymbol r;
  ASSERT_EQ(syms->resolve("libc:pthread_cond_signal@GLIBC_2.2.5", &r), 0);
  EXPECT_EQ(r.addr, compat);
  EXPECT_EQ(r.function.end, compat + dynsym_size(compat));
  EXPECT_EQ(r.name, "pthread_cond_signal@GLIBC_2.2.5");
  ASSERT_EQ(syms->resolve("libc:pthread_cond_signal@GLIBC_2.3.2", &r), 0);
  EXPECT_EQ(r.addr, current);
  ASSERT_EQ(syms->resolve("libc:pthread_cond_signal@@GLIBC_2.3.2", &r), 0);
  EXPECT_EQ(r.addr, current);
  ASSERT_EQ(syms->resolve("pthread_cond_signal@GLIBC_2.2.5", &r), 0);
  EXPECT_EQ(r.addr, compat);
  // A version the symbol does not have, and a compat version spelled as the default.
  EXPECT_EQ(syms->resolve("libc:pthread_cond_signal@GLIBC_2.17", &r), -ENOENT);
  EXPECT_EQ(syms->resolve("libc:pthread_cond_signal@@GLIBC_2.2.5", &r), -ENOENT);
  // describe names the default version bare and another with its version, so that the
  // name resolves back to the same function.
  ASSERT_EQ(syms->describe(compat, &r), 0);
  EXPECT_EQ(r.name, "pthread_cond_signal@GLIBC_2.2.5");
  ASSERT_EQ(syms->describe(current, &r), 0);
  EXPECT_EQ(r.name, "pthread_cond_signal");
  ASSERT_EQ(syms->describe(libc_symbol("qsort"), &r), 0);
  EXPECT_EQ(r.name, "qsort");
}

// Every default-version function of libc resolves where the dynamic linker puts it, and
// every version of it by its versioned name.
TEST(ProcessSymbols, EveryLibcFunctionAgreesWithTheDynamicLinker) {
  auto syms = load_self();
  ASSERT_NE(syms, nullptr);
  const std::vector<test_support::LibcFunction> fns =
      test_support::dynsym_functions(test_support::libc_path());
  ASSERT_GT(fns.size(), 2000u);
  void* libc = dlopen("libc.so.6", RTLD_NOW | RTLD_NOLOAD);
  ASSERT_NE(libc, nullptr);
  ResolvedSymbol getpid_sym;
  ASSERT_EQ(syms->resolve("libc:getpid", &getpid_sym), 0);
  const uintptr_t bias = getpid_sym.addr - [&] {
    for (const auto& f : fns)
      if (f.name == "getpid") return f.value;
    return uint64_t{0};
  }();
  size_t defaults = 0;
  for (const auto& f : fns) {
    SCOPED_TRACE(f.name + "@" + f.version);
    ResolvedSymbol r;
    // An IFUNC resolves to its implementation, which dlsym hands out too, where that is
    // code of an object (not the vDSO's: time, gettimeofday), and `@resolver` to the
    // symbol itself.
    auto expect_at = [&](const std::string& name, void* dl) {
      ASSERT_EQ(syms->resolve(name, &r), 0);
      if (!f.ifunc) {
        EXPECT_EQ(r.addr, f.value + bias);
        return;
      }
      Dl_info in;
      if (dladdr(dl, &in) != 0 && in.dli_fname != nullptr &&
          std::strstr(in.dli_fname, "vdso") == nullptr) {
        EXPECT_EQ(r.addr, addr_of(dl));
        EXPECT_NE(r.ifunc, IfuncChoice::kUnknown);
      } else {
        EXPECT_EQ(r.ifunc, IfuncChoice::kUnknown);
        EXPECT_EQ(r.addr, f.value + bias);
      }
      ResolvedSymbol res;
      ASSERT_EQ(syms->resolve(name + "@resolver", &res), 0);
      EXPECT_EQ(res.addr, f.value + bias);
      EXPECT_EQ(res.ifunc, IfuncChoice::kResolver);
    };
    if (!f.version.empty()) {
      expect_at("libc:" + f.name + "@" + f.version,
                dlvsym(libc, f.name.c_str(), f.version.c_str()));
    }
    if (!f.is_default) continue;
    ++defaults;
    expect_at("libc:" + f.name, dlsym(libc, f.name.c_str()));
    if (!f.ifunc) {
      EXPECT_EQ(r.addr, addr_of(dlsym(libc, f.name.c_str())));
    }
  }
  dlclose(libc);
  EXPECT_GT(defaults, 2000u);
}

// The same in an object of ours, with .symtab (versions in the names) and stripped (versions
// only in .dynsym's versioning sections).
TEST(ProcessSymbols, VersionsInSymtabAndInDynsym) {
  for (const char* path : {PROBEFS_VERSIONED_SYMTAB_LIB, PROBEFS_VERSIONED_STRIPPED_LIB}) {
    SCOPED_TRACE(path);
    void* h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    ASSERT_NE(h, nullptr) << dlerror();
    const uintptr_t v1 = addr_of(dlvsym(h, "probefs_versioned_fn", "PROBEFS_1"));
    const uintptr_t v2 = addr_of(dlvsym(h, "probefs_versioned_fn", "PROBEFS_2"));
    const uintptr_t plain = addr_of(dlsym(h, "probefs_versioned_plain"));
    ASSERT_NE(v1, 0u);
    ASSERT_NE(v2, 0u);
    ASSERT_NE(v1, v2);
    EXPECT_EQ(addr_of(dlsym(h, "probefs_versioned_fn")), v2);
    auto syms = load_self();
    ASSERT_NE(syms, nullptr);
    const std::string mod = basename_of(path) + ":";
    ResolvedSymbol r;
    ASSERT_EQ(syms->resolve(mod + "probefs_versioned_fn", &r), 0);
    EXPECT_EQ(r.addr, v2);
    ASSERT_EQ(syms->resolve(mod + "probefs_versioned_fn@PROBEFS_2", &r), 0);
    EXPECT_EQ(r.addr, v2);
    ASSERT_EQ(syms->resolve(mod + "probefs_versioned_fn@@PROBEFS_2", &r), 0);
    EXPECT_EQ(r.addr, v2);
    ASSERT_EQ(syms->resolve(mod + "probefs_versioned_fn@PROBEFS_1", &r), 0);
    EXPECT_EQ(r.addr, v1);
    EXPECT_EQ(syms->resolve(mod + "probefs_versioned_fn@PROBEFS_3", &r), -ENOENT);
    ASSERT_EQ(syms->resolve(mod + "probefs_versioned_plain", &r), 0);
    EXPECT_EQ(r.addr, plain);
    ASSERT_EQ(syms->resolve(mod + "probefs_versioned_plain@PROBEFS_1", &r), 0);
    EXPECT_EQ(r.addr, plain);
    // describe's name resolves back to the function (with .symtab a local alias such as
    // probefs_versioned_fn_v1 may name it; stripped, only the versioned name can).
    for (uintptr_t a : {v1, v2}) {
      ASSERT_EQ(syms->describe(a, &r), 0);
      const std::string name = r.name;
      ASSERT_EQ(syms->resolve(mod + name, &r), 0) << name;
      EXPECT_EQ(r.addr, a) << name;
    }
    if (std::string(path) == PROBEFS_VERSIONED_STRIPPED_LIB) {
      ASSERT_EQ(syms->describe(v1, &r), 0);
      EXPECT_EQ(r.name, "probefs_versioned_fn@PROBEFS_1");
      ASSERT_EQ(syms->describe(v2, &r), 0);
      EXPECT_EQ(r.name, "probefs_versioned_fn");
    }
    dlclose(h);
  }
}

TEST(ProcessSymbols, LoadOfAMissingProcessFails) {
  int err = 0;
  // Above any pid_max the kernel allows.
  EXPECT_EQ(ProcessSymbols::load(INT_MAX, &err), nullptr);
  EXPECT_EQ(err, -ESRCH);
  err = 0;
  EXPECT_EQ(ProcessSymbols::load(0, &err), nullptr);
  EXPECT_EQ(err, -ESRCH);
}

std::string read_file(const char* path) {
  std::string out;
  FILE* f = std::fopen(path, "rb");
  if (f == nullptr) return out;
  char buf[65536];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) out.append(buf, n);
  std::fclose(f);
  return out;
}

// An object given as bytes answers as the same object mapped in a process does, at its
// own virtual addresses.
TEST(ProcessSymbols, ImageAnswersAtItsOwnAddresses) {
  auto live = load_self();
  ASSERT_NE(live, nullptr);
  const std::vector<MappedObject> objects = live->objects();
  ASSERT_FALSE(objects.empty());
  ASSERT_TRUE(objects[0].executable);
  const uintptr_t bias = objects[0].load_bias;

  const std::string bytes = read_file("/proc/self/exe");
  ASSERT_FALSE(bytes.empty());
  int err = 1;
  auto image = ProcessSymbols::load_image(bytes, "/images/tracee_test", &err);
  ASSERT_NE(image, nullptr);
  EXPECT_EQ(err, 0);
  EXPECT_EQ(image->pid(), 0);
  ASSERT_EQ(image->objects().size(), 1u);
  EXPECT_EQ(image->objects()[0].module, "tracee_test");

  ResolvedSymbol want, got;
  ASSERT_EQ(live->resolve("probefs_test_fn_a", &want), 0);
  ASSERT_EQ(image->resolve("probefs_test_fn_a", &got), 0);
  EXPECT_EQ(got.addr + bias, want.addr);
  EXPECT_EQ(got.function.start + bias, want.function.start);
  EXPECT_EQ(got.function.end + bias, want.function.end);
  ASSERT_EQ(image->resolve("tracee_test:probefs_test_fn_a", &got), 0);
  ASSERT_EQ(image->describe(want.addr - bias + 1, &got), 0);
  EXPECT_EQ(got.name, "probefs_test_fn_a");
  EXPECT_EQ(got.function.start + bias, want.function.start);

  EXPECT_EQ(image->reload(), -ESRCH);  // no process behind it
}

TEST(ProcessSymbols, ImageThatIsNoElfObjectIsENOEXEC) {
  int err = 0;
  EXPECT_EQ(ProcessSymbols::load_image("", "x", &err), nullptr);
  EXPECT_EQ(err, -ENOEXEC);
  err = 0;
  EXPECT_EQ(ProcessSymbols::load_image("#!/bin/sh\necho\n", "x", &err), nullptr);
  EXPECT_EQ(err, -ENOEXEC);
  // A relocatable object is ELF, but nothing is mapped from it.
  std::string rel(64, '\0');
  std::memcpy(rel.data(), "\x7f" "ELF\x02\x01\x01", 7);
  rel[16] = 1;  // e_type ET_REL
  err = 0;
  EXPECT_EQ(ProcessSymbols::load_image(rel, "x", &err), nullptr);
  EXPECT_EQ(err, -ENOEXEC);
}

// Objects given as bytes belong to their ProcessSymbols alone.
TEST(ProcessSymbols, ImagesAreNotShared) {
  const std::string bytes = read_file("/proc/self/exe");
  ASSERT_FALSE(bytes.empty());
  const ElfFileCacheStats before = elf_file_cache_stats();
  int err = 1;
  auto one = ProcessSymbols::load_image(bytes, "/images/tracee_test", &err);
  ASSERT_NE(one, nullptr);
  auto two = ProcessSymbols::load_image(bytes, "/images/tracee_test", &err);
  ASSERT_NE(two, nullptr);
  ResolvedSymbol a, b;
  ASSERT_EQ(one->resolve("probefs_test_fn_a", &a), 0);
  ASSERT_EQ(two->resolve("probefs_test_fn_a", &b), 0);
  EXPECT_EQ(a.addr, b.addr);
  const ElfFileCacheStats after = elf_file_cache_stats();
  EXPECT_EQ(after.files, before.files);
  EXPECT_EQ(after.files_parsed, before.files_parsed);
  EXPECT_EQ(after.symbol_tables_read, before.symbol_tables_read);
}

// A fork of this process: it maps what this process maps, and waits until its pipe closes.
bool fork_waiting(Child* child) {
  int p[2];
  if (pipe2(p, O_CLOEXEC) != 0) return false;
  const pid_t pid = fork();
  if (pid < 0) {
    close(p[0]);
    close(p[1]);
    return false;
  }
  if (pid == 0) {
    close(p[1]);
    char c;
    while (read(p[0], &c, 1) > 0) {
    }
    _exit(0);
  }
  close(p[0]);
  child->pid = pid;
  child->to_child = p[1];
  return true;
}

// A copy of an object file in a directory of its own, removed on scope exit: a file with an
// inode of its own, which no other test maps.
struct TempCopy {
  explicit TempCopy(const char* from) {
    const char* tmp = std::getenv("TMPDIR");
    std::string dir_template = std::string(tmp != nullptr && *tmp ? tmp : "/tmp") +
                               "/probefs-elf-XXXXXX";
    if (mkdtemp(dir_template.data()) == nullptr) return;
    dir = dir_template;
    const std::string bytes = read_file(from);
    if (bytes.empty()) return;
    const std::string to = dir + "/" + basename_of(from);
    const int fd = open(to.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0755);
    if (fd < 0) return;
    const bool written = write(fd, bytes.data(), bytes.size()) ==
                         static_cast<ssize_t>(bytes.size());
    close(fd);
    if (written) {
      path = to;
    } else {
      unlink(to.c_str());
    }
  }
  ~TempCopy() {
    if (!path.empty()) unlink(path.c_str());
    if (!dir.empty()) rmdir(dir.c_str());
  }
  TempCopy(const TempCopy&) = delete;
  TempCopy& operator=(const TempCopy&) = delete;
  std::string dir;
  std::string path;  // empty when the copy failed
};

// The daemon holds one ProcessSymbols per traced process, and fork children map the
// very files of their parent: those are parsed once.
TEST(ProcessSymbols, ProcessesThatMapTheSameFilesShareTheirParse) {
  auto self = load_self();
  ASSERT_NE(self, nullptr);
  ResolvedSymbol in_self_libc, in_self_exe;
  ASSERT_EQ(self->resolve("libc:getpid", &in_self_libc), 0);
  ASSERT_EQ(self->resolve("probefs_test_fn_a", &in_self_exe), 0);
  const std::vector<MappedObject> self_objects = self->objects();

  Child child;
  ASSERT_TRUE(fork_waiting(&child));
  const ElfFileCacheStats before = elf_file_cache_stats();
  EXPECT_GE(before.files, self_objects.size());
  int err = 1;
  auto forked = ProcessSymbols::load(child.pid, &err);
  ASSERT_NE(forked, nullptr);
  EXPECT_EQ(err, 0);
  ResolvedSymbol r;
  ASSERT_EQ(forked->resolve("libc:getpid", &r), 0);
  EXPECT_EQ(r.addr, in_self_libc.addr);
  EXPECT_EQ(r.function.end, in_self_libc.function.end);
  ASSERT_EQ(forked->resolve("probefs_test_fn_a", &r), 0);
  EXPECT_EQ(r.addr, in_self_exe.addr);
  EXPECT_EQ(r.function.end, in_self_exe.function.end);
  ASSERT_EQ(forked->describe(in_self_exe.addr + 1, &r), 0);
  EXPECT_EQ(r.name, "probefs_test_fn_a");

  // Nothing was parsed or read again: the child's objects are the parent's files.
  const ElfFileCacheStats after = elf_file_cache_stats();
  EXPECT_EQ(after.files, before.files);
  EXPECT_EQ(after.files_parsed, before.files_parsed);
  EXPECT_EQ(after.symbol_tables_read, before.symbol_tables_read);

  const std::vector<MappedObject> forked_objects = forked->objects();
  ASSERT_EQ(forked_objects.size(), self_objects.size());
  for (size_t i = 0; i < self_objects.size(); ++i) {
    EXPECT_EQ(forked_objects[i].path, self_objects[i].path);
    EXPECT_EQ(forked_objects[i].load_bias, self_objects[i].load_bias);
    EXPECT_EQ(forked_objects[i].executable, self_objects[i].executable);
  }
}

// A library rewritten on disk (here: grown, so its size and modification time change) is
// another file: a ProcessSymbols that opens it now parses it anew, while those that hold
// the old parse keep it; a file no ProcessSymbols holds is let go.
TEST(ProcessSymbols, AFileChangedOnDiskIsParsedAnew) {
  const ElfFileCacheStats at_start = elf_file_cache_stats();
  TempCopy copy(PROBEFS_LATE_LIB);
  ASSERT_FALSE(copy.path.empty());
  Library lib(copy.path.c_str());
  ASSERT_NE(lib.handle, nullptr) << dlerror();
  const uintptr_t late_fn = addr_of(dlsym(lib.handle, "probefs_late_fn"));
  ASSERT_NE(late_fn, 0u);
  const std::string name = basename_of(copy.path) + ":probefs_late_fn";

  Child child;  // maps the copy, as this process does
  ASSERT_TRUE(fork_waiting(&child));
  int err = 1;
  auto first = ProcessSymbols::load(child.pid, &err);
  ASSERT_NE(first, nullptr);
  ResolvedSymbol r;
  ASSERT_EQ(first->resolve(name, &r), 0);
  EXPECT_EQ(r.addr, late_fn);
  EXPECT_EQ(r.path, copy.path);

  // Unchanged: shared.
  ElfFileCacheStats before = elf_file_cache_stats();
  auto again = ProcessSymbols::load(child.pid, &err);
  ASSERT_NE(again, nullptr);
  EXPECT_EQ(elf_file_cache_stats().files_parsed, before.files_parsed);
  EXPECT_EQ(elf_file_cache_stats().files, before.files);
  again.reset();

  // Grown in place: the same inode, whose bytes so far stay as they were.
  struct stat old_st;
  ASSERT_EQ(stat(copy.path.c_str(), &old_st), 0);
  {
    const int fd = open(copy.path.c_str(), O_WRONLY | O_APPEND | O_CLOEXEC);
    ASSERT_GE(fd, 0);
    const std::string tail(4096, '\0');
    const ssize_t n = write(fd, tail.data(), tail.size());
    close(fd);
    ASSERT_EQ(n, static_cast<ssize_t>(tail.size()));
  }
  struct stat new_st;
  ASSERT_EQ(stat(copy.path.c_str(), &new_st), 0);
  ASSERT_EQ(new_st.st_ino, old_st.st_ino);
  ASSERT_NE(new_st.st_size, old_st.st_size);

  before = elf_file_cache_stats();
  auto second = ProcessSymbols::load(child.pid, &err);
  ASSERT_NE(second, nullptr);
  ElfFileCacheStats after = elf_file_cache_stats();
  EXPECT_EQ(after.files_parsed, before.files_parsed + 1);  // the copy, and only it
  EXPECT_EQ(after.files, before.files + 1);                // beside the old parse
  ASSERT_EQ(second->resolve(name, &r), 0);
  EXPECT_EQ(r.addr, late_fn);
  EXPECT_EQ(elf_file_cache_stats().symbol_tables_read, after.symbol_tables_read + 1);
  ASSERT_EQ(first->resolve(name, &r), 0);
  EXPECT_EQ(r.addr, late_fn);

  // A third process view shares the new parse.
  before = elf_file_cache_stats();
  auto third = ProcessSymbols::load(child.pid, &err);
  ASSERT_NE(third, nullptr);
  ASSERT_EQ(third->resolve(name, &r), 0);
  EXPECT_EQ(r.addr, late_fn);
  after = elf_file_cache_stats();
  EXPECT_EQ(after.files_parsed, before.files_parsed);
  EXPECT_EQ(after.symbol_tables_read, before.symbol_tables_read);

  first.reset();
  EXPECT_EQ(elf_file_cache_stats().files, after.files - 1);  // the old parse is gone
  second.reset();
  third.reset();
  EXPECT_EQ(elf_file_cache_stats().files, at_start.files);
}

// Threads on several ProcessSymbols of two processes that map the same files, and on one
// ProcessSymbols together, while the shared files' tables load for the first time.
TEST(ProcessSymbols, ThreadsOnSharedFiles) {
  // Private copies, so that their tables are cold when the threads start.
  TempCopy stripped(PROBEFS_STRIPPED_LIB);
  TempCopy versioned(PROBEFS_VERSIONED_SYMTAB_LIB);
  ASSERT_FALSE(stripped.path.empty());
  ASSERT_FALSE(versioned.path.empty());
  Library stripped_lib(stripped.path.c_str());
  Library versioned_lib(versioned.path.c_str());
  ASSERT_NE(stripped_lib.handle, nullptr) << dlerror();
  ASSERT_NE(versioned_lib.handle, nullptr) << dlerror();

  const uintptr_t exported = addr_of(dlsym(stripped_lib.handle, "probefs_stripped_exported"));
  ASSERT_NE(exported, 0u);
  using RangesFn = void (*)(uintptr_t*);
  auto ranges_fn =
      reinterpret_cast<RangesFn>(dlsym(stripped_lib.handle, "probefs_stripped_hidden_ranges"));
  ASSERT_NE(ranges_fn, nullptr);
  uintptr_t hidden[6];
  ranges_fn(hidden);
  const uintptr_t v1 = addr_of(dlvsym(versioned_lib.handle, "probefs_versioned_fn", "PROBEFS_1"));
  ASSERT_NE(v1, 0u);
  const uintptr_t getpid_addr = libc_symbol("getpid");
  ASSERT_NE(getpid_addr, 0u);
  const uintptr_t fn_a = fn_addr(&probefs_test_fn_a);
  const std::string stripped_exported =
      basename_of(stripped.path) + ":probefs_stripped_exported";
  const std::string versioned_v1 = basename_of(versioned.path) + ":probefs_versioned_fn@PROBEFS_1";
  const uintptr_t data_v1 =
      addr_of(dlvsym(versioned_lib.handle, "probefs_versioned_data", "PROBEFS_1"));
  ASSERT_NE(data_v1, 0u);
  const std::string versioned_data_v1 =
      basename_of(versioned.path) + ":probefs_versioned_data@PROBEFS_1";

  Child child;
  ASSERT_TRUE(fork_waiting(&child));
  // Held throughout, so that every file stays parsed while threads come and go; their
  // tables are still to load. `together` is also used by every thread at once.
  int err = 1;
  auto together = ProcessSymbols::load(getpid(), &err);
  ASSERT_NE(together, nullptr);
  auto keep_child = ProcessSymbols::load(child.pid, &err);
  ASSERT_NE(keep_child, nullptr);
  const ElfFileCacheStats before = elf_file_cache_stats();

  constexpr int kThreads = 4;
  constexpr int kRounds = 24;
  std::latch start(kThreads);
  std::atomic<int> wrong{0};
  auto check = [&](const ProcessSymbols& syms) {
    ResolvedSymbol r;
    if (syms.resolve(stripped_exported, &r) != 0 || r.addr != exported) ++wrong;
    if (syms.describe(hidden[0] + (hidden[1] - hidden[0]) / 2, &r) != 0 ||
        r.function.start != hidden[0] || r.function.end != hidden[1]) {
      ++wrong;
    }
    if (syms.resolve(versioned_v1, &r) != 0 || r.addr != v1) ++wrong;
    if (syms.resolve("getpid", &r) != 0 || r.addr != getpid_addr) ++wrong;
    if (syms.describe(fn_a + 1, &r) != 0 || r.function.start != fn_a) ++wrong;
    uint64_t data = 0;
    if (syms.resolve_data(versioned_data_v1, &data) != 0 || data != data_v1) ++wrong;
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      const pid_t pid = t % 2 == 0 ? getpid() : child.pid;
      start.arrive_and_wait();
      std::unique_ptr<ProcessSymbols> own;
      for (int round = 0; round < kRounds; ++round) {
        if (round % 8 == 0) {
          int load_err = 0;
          own = ProcessSymbols::load(pid, &load_err);
          if (own == nullptr) {
            ++wrong;
            return;
          }
        } else if (round % 8 == 4 && own->reload() != 0) {
          ++wrong;
        }
        check(*own);
        check(*together);
      }
    });
  }
  for (std::thread& th : threads) th.join();
  EXPECT_EQ(wrong.load(), 0);

  // Each file was parsed once, before the threads, and its tables read once at most.
  const ElfFileCacheStats after = elf_file_cache_stats();
  EXPECT_EQ(after.files_parsed, before.files_parsed);
  EXPECT_EQ(after.files, before.files);
  EXPECT_LE(after.symbol_tables_read - before.symbol_tables_read, before.files);
  EXPECT_GT(after.symbol_tables_read, before.symbol_tables_read);
  EXPECT_EQ(after.data_tables_read - before.data_tables_read, 1u);  // the versioned copy's
}

// ---- data symbols (`@SYM`) ----

TEST(ProcessSymbols, DataSymbolsOfTheExecutable) {
  auto syms = load_self();
  ASSERT_NE(syms, nullptr);
  uint64_t a = 0;
  ASSERT_EQ(syms->resolve_data("probefs_test_global_var", &a), 0);
  EXPECT_EQ(a, addr_of(&probefs_test_global_var));
  EXPECT_EQ(addr_of(dlsym(RTLD_DEFAULT, "probefs_test_global_var")), a);

  // A file-local variable is only in .symtab.
  ASSERT_EQ(dlsym(RTLD_DEFAULT, "probefs_test_static_var"), nullptr);
  ASSERT_EQ(syms->resolve_data("probefs_test_static_var", &a), 0);
  EXPECT_EQ(a, addr_of(&probefs_test_static_var));

  // The executable answers to its basename as MOD.
  char exe[4096];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  ASSERT_GT(n, 0);
  exe[n] = '\0';
  ASSERT_EQ(syms->resolve_data(basename_of(exe) + ":probefs_test_global_var", &a), 0);
  EXPECT_EQ(a, addr_of(&probefs_test_global_var));
  EXPECT_EQ(syms->resolve_data("libc:probefs_test_global_var", &a), -ENOENT);

  // environ: a copy relocation may have moved libc's variable into the executable; either
  // way `SYM` is the one the program uses, and `libc:SYM` libc's own definition.
  ASSERT_EQ(syms->resolve_data("environ", &a), 0);
  EXPECT_EQ(a, addr_of(&environ));
  void* libc = dlopen("libc.so.6", RTLD_NOW | RTLD_NOLOAD);
  ASSERT_NE(libc, nullptr);
  for (const char* name : {"environ", "stdout", "_IO_2_1_stdout_", "program_invocation_name"}) {
    SCOPED_TRACE(name);
    const uintptr_t expected = addr_of(dlsym(libc, name));
    ASSERT_NE(expected, 0u);
    for (const char* mod : {"libc:", "libc.so.6:"}) {
      ASSERT_EQ(syms->resolve_data(std::string(mod) + name, &a), 0);
      EXPECT_EQ(a, expected);
    }
  }
  dlclose(libc);

  // The variables stay out of resolve() and describe(), which know functions only, also
  // once their table is loaded.
  ResolvedSymbol r;
  EXPECT_EQ(syms->resolve("probefs_test_global_var", &r), -ENOENT);
  EXPECT_EQ(syms->resolve("environ", &r), -ENOENT);
  EXPECT_EQ(syms->describe(addr_of(&probefs_test_global_var), &r), -ENOENT);
  EXPECT_EQ(syms->describe(addr_of(&probefs_test_static_var), &r), -ENOENT);
}

// `@SYM` also names functions, as the kernel's kallsyms does: where resolve() finds them.
TEST(ProcessSymbols, DataSymbolsAlsoNameFunctions) {
  auto syms = load_self();
  ASSERT_NE(syms, nullptr);
  for (const char* name : {"probefs_test_fn_a", "getpid", "libc:getpid", "libc:strlen",
                           "probefs_test_ifunc", "probefs_dup_fn",
                           "libprobefs_tracee_dup_b:probefs_dup_fn"}) {
    SCOPED_TRACE(name);
    ResolvedSymbol r;
    ASSERT_EQ(syms->resolve(name, &r), 0);
    uint64_t a = 0;
    ASSERT_EQ(syms->resolve_data(name, &a), 0);
    EXPECT_EQ(a, r.addr);
  }
  uint64_t a = 0;
  ASSERT_EQ(syms->resolve_data("probefs_test_fn_a", &a), 0);
  EXPECT_EQ(a, fn_addr(&probefs_test_fn_a));
  ASSERT_EQ(syms->resolve_data("getpid", &a), 0);
  EXPECT_EQ(a, libc_symbol("getpid"));
}

TEST(ProcessSymbols, DataSymbolsOfLibrariesInLoadOrder) {
  auto syms = load_self();
  ASSERT_NE(syms, nullptr);
  ASSERT_EQ(probefs_dup_a_id() + probefs_dup_b_id(), 2);
  uint64_t a = 0;
  // Both libraries define it; the first loaded wins, as for the dynamic linker.
  const uintptr_t first = addr_of(dlsym(RTLD_DEFAULT, "probefs_dup_data"));
  ASSERT_NE(first, 0u);
  ASSERT_EQ(syms->resolve_data("probefs_dup_data", &a), 0);
  EXPECT_EQ(a, first);
  ASSERT_EQ(syms->resolve_data("libprobefs_tracee_dup_a:probefs_dup_data", &a), 0);
  EXPECT_EQ(a, first);

  Dl_info b;
  ASSERT_NE(dladdr(reinterpret_cast<void*>(&probefs_dup_b_id), &b), 0);
  void* handle = dlopen(b.dli_fname, RTLD_NOW | RTLD_NOLOAD);
  ASSERT_NE(handle, nullptr);
  const uintptr_t in_b = addr_of(dlsym(handle, "probefs_dup_data"));
  dlclose(handle);
  ASSERT_NE(in_b, 0u);
  ASSERT_NE(in_b, first);
  for (const char* name : {"libprobefs_tracee_dup_b:probefs_dup_data",
                           "libprobefs_tracee_dup_b.so:probefs_dup_data"}) {
    SCOPED_TRACE(name);
    ASSERT_EQ(syms->resolve_data(name, &a), 0);
    EXPECT_EQ(a, in_b);
  }
}

// Versions as for functions, in an object with .symtab and a stripped one, and libc's
// sys_errlist, which only has hidden versions.
TEST(ProcessSymbols, DataSymbolVersions) {
  for (const char* path : {PROBEFS_VERSIONED_SYMTAB_LIB, PROBEFS_VERSIONED_STRIPPED_LIB}) {
    SCOPED_TRACE(path);
    Library lib(path);
    ASSERT_NE(lib.handle, nullptr) << dlerror();
    const uintptr_t v1 = addr_of(dlvsym(lib.handle, "probefs_versioned_data", "PROBEFS_1"));
    const uintptr_t v2 = addr_of(dlvsym(lib.handle, "probefs_versioned_data", "PROBEFS_2"));
    ASSERT_NE(v1, 0u);
    ASSERT_NE(v2, 0u);
    ASSERT_NE(v1, v2);
    EXPECT_EQ(addr_of(dlsym(lib.handle, "probefs_versioned_data")), v2);
    auto syms = load_self();
    ASSERT_NE(syms, nullptr);
    const std::string mod = basename_of(path) + ":";
    uint64_t a = 0;
    ASSERT_EQ(syms->resolve_data(mod + "probefs_versioned_data", &a), 0);
    EXPECT_EQ(a, v2);
    ASSERT_EQ(syms->resolve_data(mod + "probefs_versioned_data@PROBEFS_2", &a), 0);
    EXPECT_EQ(a, v2);
    ASSERT_EQ(syms->resolve_data(mod + "probefs_versioned_data@@PROBEFS_2", &a), 0);
    EXPECT_EQ(a, v2);
    ASSERT_EQ(syms->resolve_data(mod + "probefs_versioned_data@PROBEFS_1", &a), 0);
    EXPECT_EQ(a, v1);
    EXPECT_EQ(syms->resolve_data(mod + "probefs_versioned_data@PROBEFS_3", &a), -ENOENT);
    // The library is opened RTLD_LOCAL but is mapped: SYM searches it after the others.
    ASSERT_EQ(syms->resolve_data("probefs_versioned_data", &a), 0);
    EXPECT_EQ(a, v2);
  }

  auto syms = load_self();
  ASSERT_NE(syms, nullptr);
  void* libc = dlopen("libc.so.6", RTLD_NOW | RTLD_NOLOAD);
  ASSERT_NE(libc, nullptr);
  const uintptr_t errlist = addr_of(dlvsym(libc, "sys_errlist", "GLIBC_2.12"));
  dlclose(libc);
  if (errlist == 0) GTEST_SKIP() << "this libc has no sys_errlist@GLIBC_2.12";
  uint64_t a = 0;
  ASSERT_EQ(syms->resolve_data("libc:sys_errlist@GLIBC_2.12", &a), 0);
  EXPECT_EQ(a, errlist);
  ASSERT_EQ(syms->resolve_data("libc:sys_errlist", &a), 0);  // no default: a hidden one
  EXPECT_EQ(a, errlist);  // all its versions share one address
}

// A thread-local variable has no one address: its symbol's value is an offset into each
// thread's block. It is not found (-ENOENT), as an unknown name is not; a malformed name
// is -EINVAL as for resolve().
TEST(ProcessSymbols, DataSymbolsRefuseThreadLocalsAndUnknownNames) {
  auto syms = load_self();
  ASSERT_NE(syms, nullptr);
  probefs_test_tls_var += 1;  // keeps the variable, in case the compiler would drop it
  uint64_t a = 0;
  EXPECT_EQ(syms->resolve_data("probefs_test_tls_var", &a), -ENOENT);
  EXPECT_EQ(syms->resolve_data("libc:errno", &a), -ENOENT);  // errno is glibc's TLS symbol
  EXPECT_EQ(syms->resolve_data("probefs_no_such_variable", &a), -ENOENT);
  EXPECT_EQ(syms->resolve_data("probefs_no_such_object:environ", &a), -ENOENT);
  EXPECT_EQ(syms->resolve_data("lib:environ", &a), -ENOENT);  // a prefix is not a module
  EXPECT_EQ(a, 0u);  // untouched on failure
  for (const char* name : {"", ":", "libc:", ":environ", "libc:env iron", "a:b:c", " environ"}) {
    SCOPED_TRACE(name);
    EXPECT_EQ(syms->resolve_data(name, &a), -EINVAL);
  }
}

// The table of variables is read once per file, on the first data lookup: function lookups
// never read it, and data lookups use the function table that is already there.
TEST(ProcessSymbols, DataTableIsReadOnlyForDataLookups) {
  TempCopy copy(PROBEFS_VERSIONED_SYMTAB_LIB);  // cold: parsed for this test only
  ASSERT_FALSE(copy.path.empty());
  Library lib(copy.path.c_str());
  ASSERT_NE(lib.handle, nullptr) << dlerror();
  const std::string mod = basename_of(copy.path) + ":";
  auto syms = load_self();
  ASSERT_NE(syms, nullptr);

  ElfFileCacheStats before = elf_file_cache_stats();
  ResolvedSymbol r;
  ASSERT_EQ(syms->resolve(mod + "probefs_versioned_fn", &r), 0);
  ASSERT_EQ(syms->describe(r.addr, &r), 0);
  ElfFileCacheStats after = elf_file_cache_stats();
  EXPECT_EQ(after.symbol_tables_read, before.symbol_tables_read + 1);
  EXPECT_EQ(after.data_tables_read, before.data_tables_read);

  uint64_t a = 0;
  before = after;
  ASSERT_EQ(syms->resolve_data(mod + "probefs_versioned_data", &a), 0);
  ASSERT_EQ(syms->resolve_data(mod + "probefs_versioned_plain", &a), 0);
  EXPECT_EQ(syms->resolve_data(mod + "probefs_no_such_variable", &a), -ENOENT);
  after = elf_file_cache_stats();
  EXPECT_EQ(after.symbol_tables_read, before.symbol_tables_read);
  EXPECT_EQ(after.data_tables_read, before.data_tables_read + 1);

  // describe() still names the function, not a variable, and knows no variable.
  const uintptr_t v2 = addr_of(dlvsym(lib.handle, "probefs_versioned_fn", "PROBEFS_2"));
  ASSERT_EQ(syms->describe(v2, &r), 0);
  EXPECT_EQ(r.name, "probefs_versioned_fn");
  const uintptr_t data = addr_of(dlsym(lib.handle, "probefs_versioned_data"));
  ASSERT_NE(data, 0u);
  EXPECT_EQ(syms->describe(data, &r), -ENOENT);
}

// `p ... @SYM` end to end: the parser leaves the symbol, compile() resolves it through
// resolve_data into the program's immediate, and the program reads the variable.
TEST(ProcessSymbols, AtSymbolCompilesToTheVariablesAddress) {
  auto syms = load_self();
  ASSERT_NE(syms, nullptr);
  events::DataSymbolResolver resolve = [&syms](std::string_view sym, uint64_t* addr) {
    return syms->resolve_data(sym, addr) == 0;
  };
  events::ParseResult pr = events::parse_kprobe_command(
      "p:t/e probefs_test_fn_a @probefs_test_global_var:s32 "
      "s=@probefs_test_static_var:s32 o=@probefs_test_global_var+4:u32 "
      "f=@probefs_test_fn_a:u8");
  ASSERT_EQ(pr.status, events::ParseStatus::kDefine);
  events::CompiledEvent ev;
  events::Diagnostic diag;
  ASSERT_TRUE(events::compile(pr.def, resolve, &ev, &diag)) << diag.message();

  // One immediate per argument, in order: the resolved address plus the offset.
  std::vector<uint64_t> imms;
  for (const events::FetchInsn& in : ev.program.insns) {
    EXPECT_NE(in.op, events::FetchOp::kSymbol);
    if (in.op == events::FetchOp::kImm) imms.push_back(in.imm);
  }
  ASSERT_EQ(imms.size(), 4u);
  EXPECT_EQ(imms[0], addr_of(&probefs_test_global_var));
  EXPECT_EQ(imms[1], addr_of(&probefs_test_static_var));
  EXPECT_EQ(imms[2], addr_of(&probefs_test_global_var) + 4);
  EXPECT_EQ(imms[3], fn_addr(&probefs_test_fn_a));

  // The program reads the variables of this very process.
  probefs_test_global_var = -7;
  probefs_test_static_var = 12345;
  PtRegs regs{};
  events::HitContext hc;
  hc.regs = &regs;
  hc.ip = fn_addr(&probefs_test_fn_a);
  hc.comm = "test";
  events::LiveMemoryReader reader = events::LiveMemoryReader::for_self();
  std::vector<uint8_t> rec(ev.program.max_record_size());
  const uint32_t size = events::write_record(events::view_of(ev.program), hc, reader,
                                             rec.data(), static_cast<uint32_t>(rec.size()));
  ASSERT_GE(size, ev.program.fixed_size);
  ASSERT_EQ(ev.fields.size(), 4u);
  int32_t global = 0, local = 0;
  uint8_t first_byte = 0;
  std::memcpy(&global, rec.data() + ev.fields[0].offset, sizeof global);
  std::memcpy(&local, rec.data() + ev.fields[1].offset, sizeof local);
  std::memcpy(&first_byte, rec.data() + ev.fields[3].offset, sizeof first_byte);
  EXPECT_EQ(global, -7);
  EXPECT_EQ(local, 12345);
  EXPECT_EQ(first_byte, *reinterpret_cast<const uint8_t*>(fn_addr(&probefs_test_fn_a)));
  probefs_test_global_var = 11;

  // A name that is no data symbol fails the compile as the kernel fails the registration.
  for (const char* line : {"p:t/e probefs_test_fn_a @probefs_test_tls_var:s32",
                           "p:t/e probefs_test_fn_a @probefs_no_such_variable:s32"}) {
    SCOPED_TRACE(line);
    events::ParseResult bad = events::parse_kprobe_command(line);
    ASSERT_EQ(bad.status, events::ParseStatus::kDefine);
    EXPECT_FALSE(events::compile(bad.def, resolve, &ev, &diag));
    EXPECT_EQ(diag.err, ENOENT);
    EXPECT_EQ(diag.message(), "Invalid probed address or symbol");
  }
}

}  // namespace
}  // namespace probefs::tracee
