// IFUNC symbols: `SYM` and `MOD:SYM` of a GNU_IFUNC name the implementation the
// process calls, found where its dynamic linker stored it (in this process, in another
// one), `SYM@resolver` the resolver; and probes placed so, in a launched target, fire
// exactly as often as the program calls them, named in kprobes/list and trace lines with
// the name they were asked by.
#include <dlfcn.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "events/compile.h"
#include "events/output.h"
#include "events/parse.h"
#include "tests/tracee/libc_dynsym.h"
#include "tests/tracee/traced_prog_driver.h"
#include "tests/tracee/tracer_test_util.h"
#include "tracee/elf_symbols.h"
#include "tracee/tracer.h"

// Of libprobefs_ifunc_a, which this test links (and calls nothing else of): its
// probefs_ifunc_unbound is bound by no slot in this process.
extern "C" int probefs_ifunc_call_bound(int);

namespace probefs::tracee {
namespace {

using testing::define;
using testing::Event;
using testing::KillGuard;
using testing::make_tracer;
using testing::ProgPipes;

const std::string kProg = PROBEFS_IFUNC_PROG;
const std::string kLibA = PROBEFS_IFUNC_LIB_A;

// The four functions of the issue, and a few more of libc's IFUNCs.
const char* const kLibcIfuncs[] = {"memcpy", "strlen", "strcmp", "memset",
                                   "memmove", "strchr", "memcmp", "strstr"};

uintptr_t addr_of(const void* p) { return reinterpret_cast<uintptr_t>(p); }

std::unique_ptr<ProcessSymbols> load(pid_t pid) {
  int err = 1;
  auto syms = ProcessSymbols::load(pid, &err);
  EXPECT_EQ(err, 0);
  return syms;
}

// libc's definition of NAME in this process: dlsym runs an IFUNC's resolver.
uintptr_t libc_dlsym(const char* name) {
  void* libc = dlopen("libc.so.6", RTLD_NOW | RTLD_NOLOAD);
  if (libc == nullptr) return 0;
  const uintptr_t a = addr_of(dlsym(libc, name));
  dlclose(libc);
  return a;
}

// The ELF value of a default-version libc function, moved by libc's load bias here.
uintptr_t libc_symbol_value(ProcessSymbols& syms, const std::string& name) {
  const auto fns = test_support::dynsym_functions(test_support::libc_path());
  uint64_t getpid_value = 0, value = 0;
  for (const auto& f : fns) {
    if (f.name == "getpid" && f.is_default) getpid_value = f.value;
    if (f.name == name && f.is_default) value = f.value;
  }
  ResolvedSymbol g;
  if (syms.resolve("libc:getpid", &g) != 0 || getpid_value == 0 || value == 0) return 0;
  return g.addr - getpid_value + value;
}

// ---- this process ----

TEST(IfuncSymbols, LibcIfuncsResolveToTheImplementationTheProcessCalls) {
  auto syms = load(getpid());
  ASSERT_NE(syms, nullptr);
  for (const char* name : kLibcIfuncs) {
    SCOPED_TRACE(name);
    const uintptr_t impl = libc_dlsym(name);
    ASSERT_NE(impl, 0u);
    // SYM alone is the first definition in load order, as for the dynamic linker: libc's
    // where nothing interposes it (a sanitizer's runtime defines memcpy and the like).
    ResolvedSymbol first;
    ASSERT_EQ(syms->resolve(name, &first), 0);
    EXPECT_EQ(first.addr, addr_of(dlsym(RTLD_DEFAULT, name)));
    for (const std::string& asked : {std::string(name), "libc:" + std::string(name)}) {
      if (asked == name && first.module != "libc.so.6") continue;
      ResolvedSymbol r;
      ASSERT_EQ(syms->resolve(asked, &r), 0) << asked;
      EXPECT_EQ(r.addr, impl) << asked;
      EXPECT_NE(r.ifunc, IfuncChoice::kNone);
      EXPECT_NE(r.ifunc, IfuncChoice::kUnknown);
      EXPECT_NE(r.ifunc, IfuncChoice::kResolver);
      EXPECT_EQ(r.module, "libc.so.6");
      EXPECT_EQ(r.asked, name);
      EXPECT_EQ(ifunc_note(r), name);
      // Bounds of the implementation, as describe() gives them (and its name).
      EXPECT_EQ(r.function.start, impl);
      EXPECT_GT(r.function.end, impl);
      ResolvedSymbol d;
      ASSERT_EQ(syms->describe(impl, &d), 0);
      EXPECT_EQ(d.name, r.name);
      EXPECT_EQ(d.function.end, r.function.end);
      // The resolver is the symbol's own address, and reached by `@resolver`.
      const uintptr_t value = libc_symbol_value(*syms, name);
      ASSERT_NE(value, 0u);
      EXPECT_EQ(r.resolver, value);
      ResolvedSymbol res;
      ASSERT_EQ(syms->resolve(asked + "@resolver", &res), 0);
      EXPECT_EQ(res.addr, value);
      EXPECT_EQ(res.ifunc, IfuncChoice::kResolver);
      EXPECT_EQ(res.name, name);
      EXPECT_EQ(ifunc_note(res), std::string(name) + "@resolver");
    }
  }
  // libc reaches its own string functions through IRELATIVE slots: that is where these
  // are read (libc.so.6 has them for memcpy, strlen, strcmp and memset).
  for (const char* name : {"memcpy", "strlen", "strcmp", "memset"}) {
    ResolvedSymbol r;
    ASSERT_EQ(syms->resolve(std::string("libc:") + name, &r), 0);
    EXPECT_EQ(r.ifunc, IfuncChoice::kRelocation) << name;
  }
}

// A stripped libc names its implementations from its debug file, where one is installed.
TEST(IfuncSymbols, ImplementationsAreNamedFromTheDebugFile) {
  auto syms = load(getpid());
  ASSERT_NE(syms, nullptr);
  ResolvedSymbol r;
  ASSERT_EQ(syms->resolve("libc:strlen", &r), 0);
  if (r.name.empty()) GTEST_SKIP() << "no debug file for " << r.path;
  EXPECT_NE(r.name, "strlen");
  EXPECT_NE(r.name.find("strlen"), std::string::npos) << r.name;  // __strlen_avx2 and the like
  // Exported functions keep the names of .dynsym.
  ASSERT_EQ(syms->describe(libc_dlsym("qsort"), &r), 0);
  EXPECT_EQ(r.name, "qsort");
}

// Each way the implementation is learnt, on a library of our own in this process.
TEST(IfuncSymbols, EachWayTheImplementationIsFound) {
  ASSERT_EQ(probefs_ifunc_call_bound(1), 2);
  auto syms = load(getpid());
  ASSERT_NE(syms, nullptr);
  struct Case {
    const char* name;
    IfuncChoice how;
    int adds;  // what the implementation adds to its argument
  };
  for (const Case& c : {Case{"probefs_ifunc_hidden", IfuncChoice::kRelocation, 2},
                        Case{"probefs_ifunc_bound", IfuncChoice::kBinding, 1},
                        Case{"probefs_ifunc_unbound", IfuncChoice::kCalled, 3}}) {
    SCOPED_TRACE(c.name);
    ResolvedSymbol r;
    ASSERT_EQ(syms->resolve(std::string("libprobefs_ifunc_a:") + c.name, &r), 0);
    EXPECT_EQ(r.ifunc, c.how);
    EXPECT_EQ(r.name, std::string(c.name) + "_impl");
    EXPECT_EQ(r.module, "libprobefs_ifunc_a.so");
    EXPECT_EQ(reinterpret_cast<int (*)(int)>(r.addr)(10), 10 + c.adds);
    // The resolver: by `@resolver`, and by its own name, which is a plain function.
    ResolvedSymbol res, own;
    ASSERT_EQ(syms->resolve(std::string("libprobefs_ifunc_a:") + c.name + "@resolver", &res), 0);
    ASSERT_EQ(syms->resolve(std::string("libprobefs_ifunc_a:") + c.name + "_resolver", &own), 0);
    EXPECT_EQ(res.addr, r.resolver);
    EXPECT_EQ(own.addr, r.resolver);
    EXPECT_EQ(own.ifunc, IfuncChoice::kNone);
    EXPECT_EQ(ifunc_note(own), "");
  }
}

// Functions that are no IFUNC resolve exactly as they did: where dlsym finds them, no
// note, and no resolver to ask for.
TEST(IfuncSymbols, PlainFunctionsAreUnchanged) {
  auto syms = load(getpid());
  ASSERT_NE(syms, nullptr);
  for (const char* name : {"getpid", "malloc", "qsort", "printf", "pthread_create"}) {
    SCOPED_TRACE(name);
    ResolvedSymbol r;
    ASSERT_EQ(syms->resolve(std::string("libc:") + name, &r), 0);
    EXPECT_EQ(r.addr, libc_dlsym(name));
    EXPECT_EQ(r.name, name);
    EXPECT_EQ(r.ifunc, IfuncChoice::kNone);
    EXPECT_EQ(r.resolver, 0u);
    EXPECT_EQ(ifunc_note(r), "");
    EXPECT_EQ(syms->resolve(std::string("libc:") + name + "@resolver", &r), -ENOENT);
  }
  ResolvedSymbol r;
  EXPECT_EQ(syms->resolve("@resolver", &r), -EINVAL);
  EXPECT_EQ(syms->resolve("libc:@resolver", &r), -EINVAL);
  // `@SYM` of an IFUNC is the address the program has for it.
  uint64_t a = 0;
  ASSERT_EQ(syms->resolve_data("libc:memcpy", &a), 0);
  EXPECT_EQ(a, libc_dlsym("memcpy"));
}

// ---- another process ----

// ifunc_prog as a plain child of the test, with pipes.
struct Child {
  ProgPipes pipes;
  KillGuard guard;
  pid_t pid = 0;

  bool start() {
    pid = fork();
    if (pid == 0) {
      dup2(pipes.child_stdin(), 0);
      dup2(pipes.child_stdout(), 1);
      execl(kProg.c_str(), kProg.c_str(), nullptr);
      _exit(127);
    }
    guard.set(pid);
    pipes.parent_side();
    return pipes.line() == "ready";
  }
  ~Child() {
    if (pid > 0) {
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
      guard.release();
    }
  }
  uintptr_t addr(const std::string& name) {
    const std::string a = pipes.ask("addr " + name);
    return a.starts_with("ok 0x") ? std::stoull(a.substr(5), nullptr, 16) : 0;
  }
};

TEST(IfuncSymbols, AnotherProcessGetsWhatItsDynamicLinkerStored) {
  Child c;
  ASSERT_TRUE(c.start());
  // Libraries loaded by dlopen are relocated before dlopen returns.
  ASSERT_EQ(c.pipes.ask("dlopen " + kLibA), "ok");
  auto syms = load(c.pid);
  ASSERT_NE(syms, nullptr);
  for (const char* name : kLibcIfuncs) {
    SCOPED_TRACE(name);
    ResolvedSymbol r;
    ASSERT_EQ(syms->resolve(std::string("libc:") + name, &r), 0);
    EXPECT_EQ(r.addr, c.addr(name));
    EXPECT_NE(r.ifunc, IfuncChoice::kUnknown);
    EXPECT_EQ(ifunc_note(r), name);
  }
  struct Case {
    std::string name;
    IfuncChoice how;
    std::string impl;  // its name, where resolve() finds it
  };
  const std::vector<Case> cases = {
      // The library's own slots, bound when it was loaded.
      {"libprobefs_ifunc_b:probefs_ifunc_hidden", IfuncChoice::kRelocation,
       "probefs_ifunc_hidden_impl"},
      {"libprobefs_ifunc_b:probefs_ifunc_bound", IfuncChoice::kBinding, "probefs_ifunc_bound_impl"},
      // No slot: this process maps the same file, whose resolver chooses as the target's.
      {"libprobefs_ifunc_a:probefs_ifunc_unbound", IfuncChoice::kCalled,
       "probefs_ifunc_unbound_impl"},
      // No slot, and a file this process does not map: the resolver, said so.
      {"libprobefs_ifunc_b:probefs_ifunc_unbound", IfuncChoice::kUnknown, "probefs_ifunc_unbound"},
  };
  for (const Case& k : cases) {
    SCOPED_TRACE(k.name);
    ResolvedSymbol r;
    ASSERT_EQ(syms->resolve(k.name, &r), 0);
    EXPECT_EQ(r.ifunc, k.how);
    EXPECT_EQ(r.name, k.impl);
    ResolvedSymbol res;
    ASSERT_EQ(syms->resolve(k.name + "@resolver", &res), 0);
    EXPECT_EQ(res.addr, r.resolver);
    if (k.how == IfuncChoice::kUnknown) {
      EXPECT_EQ(r.addr, r.resolver);
      EXPECT_EQ(ifunc_note(r), "probefs_ifunc_unbound@resolver: implementation unknown");
    } else {
      EXPECT_NE(r.addr, r.resolver);
      EXPECT_EQ(ifunc_note(r), k.name.substr(k.name.find(':') + 1));
    }
  }
  // The implementation of an exported one is what the target's dlsym finds (lib b first:
  // the program links it).
  ResolvedSymbol r;
  ASSERT_EQ(syms->resolve("libprobefs_ifunc_b:probefs_ifunc_bound", &r), 0);
  EXPECT_EQ(r.addr, c.addr("probefs_ifunc_bound"));
  EXPECT_EQ(c.pipes.ask("bound"), "ok 2 3");
}

// ---- probes in a launched target, through the Tracer ----

struct Launched {
  ProgPipes pipes;
  KillGuard guard;
  pid_t pid = 0;

  bool start(Tracer& t) {
    Tracer::LaunchSpec s;
    s.argv = {kProg};
    s.stdin_fd = pipes.child_stdin();
    s.stdout_fd = pipes.child_stdout();
    std::string err;
    if (t.launch(s, &pid, &err) != 0) {
      ADD_FAILURE() << err;
      return false;
    }
    guard.set(pid);
    pipes.parent_side();
    return pipes.line() == "ready";
  }
  void quit(Tracer& t) {
    EXPECT_EQ(pipes.ask("quit", 10000), "");
    int st = -1;
    EXPECT_EQ(t.wait_exit(pid, 10000, &st), 0);
    EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << st;
    guard.release();
  }
};

// The lines of kprobes/list that end with `note` in parentheses.
std::vector<std::string> list_lines_noted(const std::string& list, const std::string& note) {
  std::vector<std::string> out;
  std::istringstream in(list);
  for (std::string l; std::getline(in, l);)
    if (l.ends_with(" (" + note + ")")) out.push_back(l);
  return out;
}

TEST(IfuncProbes, LaunchedTargetHitsAreExactlyTheProgramsCalls) {
  auto t = make_tracer(2048);
  ASSERT_NE(t, nullptr);
  // Defined before the launch (MOD:SYM waits for libc), disabled until the window.
  std::map<std::string, Event> ev;
  ev["memcpy"] = define(*t, "p:ifunc/memcpy libc:memcpy dst=%di:x64 len=%dx:u64", 101, false);
  ev["strlen"] = define(*t, "p:ifunc/strlen libc:strlen", 102, false);
  ev["strcmp"] = define(*t, "p:ifunc/strcmp libc.so.6:strcmp", 103, false);
  ev["memset"] = define(*t, "p:ifunc/memset libc:memset", 104, false);
  ev["resolver"] = define(*t, "p:ifunc/resolver libc:memcpy@resolver", 105, false);
  Launched p;
  ASSERT_TRUE(p.start(*t));
  // What the target's dynamic linker gives for memcpy: the place of the memcpy probe.
  const std::string a = p.pipes.ask("addr memcpy");
  ASSERT_TRUE(a.starts_with("ok 0x")) << a;
  const uintptr_t memcpy_impl = std::stoull(a.substr(5), nullptr, 16);

  // kprobes/list: each line as the kernel's columns give it (the implementation's name),
  // then the name the definition asked for.
  const std::string list = t->kprobes_list();
  auto syms = load(p.pid);
  ASSERT_NE(syms, nullptr);
  ResolvedSymbol impl;
  ASSERT_EQ(syms->describe(memcpy_impl, &impl), 0);
  for (const char* name : {"memcpy", "strlen", "strcmp", "memset"}) {
    const auto lines = list_lines_noted(list, name);
    ASSERT_EQ(lines.size(), 1u) << name << "\n" << list;
    EXPECT_NE(lines[0].find("  k  "), std::string::npos) << lines[0];
    EXPECT_NE(lines[0].find("  libc.so.6 "), std::string::npos) << lines[0];
  }
  char head[64];
  snprintf(head, sizeof head, "%016lx  k  ", static_cast<unsigned long>(memcpy_impl));
  const std::string memcpy_line = list_lines_noted(list, "memcpy").at(0);
  EXPECT_TRUE(memcpy_line.starts_with(head)) << memcpy_line;
  if (!impl.name.empty()) {
    EXPECT_TRUE(memcpy_line.starts_with(head + impl.name + "+0x0  libc.so.6 ")) << memcpy_line;
  }
  const auto on_resolver = list_lines_noted(list, "memcpy@resolver");
  ASSERT_EQ(on_resolver.size(), 1u) << list;
  EXPECT_NE(on_resolver[0].find("  memcpy+0x0  libc.so.6 "), std::string::npos) << on_resolver[0];

  for (auto& [name, e] : ev) ASSERT_EQ(t->enable_probe(e.id), 0) << name;
  const std::string counts = p.pipes.ask("window 1000");
  for (auto& [name, e] : ev) ASSERT_EQ(t->disable_probe(e.id), 0) << name;
  unsigned long n_memcpy = 0, n_strlen = 0, n_strcmp = 0, n_memset = 0;
  ASSERT_EQ(sscanf(counts.c_str(), "ok %lu %lu %lu %lu", &n_memcpy, &n_strlen, &n_strcmp,
                   &n_memset), 4)
      << counts;
  EXPECT_EQ(n_memcpy, 1000u);
  EXPECT_EQ(t->profile(ev["memcpy"].id).hits, n_memcpy);
  EXPECT_EQ(t->profile(ev["strlen"].id).hits, n_strlen);
  EXPECT_EQ(t->profile(ev["strcmp"].id).hits, n_strcmp);
  EXPECT_EQ(t->profile(ev["memset"].id).hits, n_memset);
  EXPECT_EQ(t->profile(ev["resolver"].id).hits, 0u);

  // The trace line of a memcpy record: the implementation, then what was asked for.
  TraceRecord r;
  bool seen = false;
  std::shared_ptr<TargetSymbolizer> names = t->symbolizer(p.pid);
  ASSERT_NE(names, nullptr);
  while (t->next_record(&r)) {
    uint16_t id = 0;
    memcpy(&id, r.data, 2);
    if (id != 101 || seen) continue;
    seen = true;
    EventSymbolizer sym(names.get(), id);
    std::string line;
    events::LineContext ctx;
    ctx.comm = "ifunc_prog";
    ctx.pid = p.pid;
    ASSERT_TRUE(events::format_trace_line(line, ev["memcpy"].spec.compiled, ctx, r.data, r.len,
                                          &sym));
    if (!impl.name.empty()) {
      EXPECT_NE(line.find(": (" + impl.name + "+0x0/0x"), std::string::npos) << line;
    }
    EXPECT_NE(line.find(" [libc.so.6] (memcpy)) dst="), std::string::npos) << line;
    // Another event's view of the same address carries no note.
    EventSymbolizer other(names.get(), 102);
    std::string plain;
    ASSERT_TRUE(events::format_trace_line(plain, ev["memcpy"].spec.compiled, ctx, r.data, r.len,
                                          &other));
    EXPECT_NE(plain.find(" [libc.so.6]) dst="), std::string::npos) << plain;
  }
  EXPECT_TRUE(seen);

  // A second window, with the probes enabled again: still exact.
  for (auto& [name, e] : ev) ASSERT_EQ(t->enable_probe(e.id), 0) << name;
  const std::string again = p.pipes.ask("window 77");
  for (auto& [name, e] : ev) ASSERT_EQ(t->disable_probe(e.id), 0) << name;
  ASSERT_EQ(sscanf(again.c_str(), "ok %lu %lu %lu %lu", &n_memcpy, &n_strlen, &n_strcmp,
                   &n_memset), 4)
      << again;
  EXPECT_EQ(t->profile(ev["memcpy"].id).hits, 1000u + n_memcpy);
  EXPECT_EQ(t->profile(ev["memset"].id).hits, 4000u + n_memset);
  EXPECT_EQ(t->profile(ev["resolver"].id).hits, 0u);
  p.quit(*t);
}

// In a library of the target's own: a JUMP_SLOT the library bound, and an IFUNC whose
// implementation cannot be known in the target (no slot, a file the daemon does not map),
// which falls back to its resolver and says so.
TEST(IfuncProbes, LibraryIfuncsInATargetAndTheNamedFallback) {
  auto t = make_tracer(2048);
  ASSERT_NE(t, nullptr);
  Event bound = define(*t, "p:ifunc/bound libprobefs_ifunc_b:probefs_ifunc_bound", 111, false);
  Event hidden = define(*t, "p:ifunc/hidden libprobefs_ifunc_b:probefs_ifunc_hidden", 112, false);
  Event unbound = define(*t, "p:ifunc/unbound libprobefs_ifunc_b:probefs_ifunc_unbound", 113, false);
  Launched p;
  ASSERT_TRUE(p.start(*t));
  const std::string list = t->kprobes_list();
  const auto b = list_lines_noted(list, "probefs_ifunc_bound");
  ASSERT_EQ(b.size(), 1u) << list;
  EXPECT_NE(b[0].find("  probefs_ifunc_bound_impl+0x0  libprobefs_ifunc_b.so "), std::string::npos)
      << b[0];
  const auto u = list_lines_noted(list, "probefs_ifunc_unbound@resolver: implementation unknown");
  ASSERT_EQ(u.size(), 1u) << list;
  EXPECT_NE(u[0].find("  probefs_ifunc_unbound+0x0  libprobefs_ifunc_b.so "), std::string::npos)
      << u[0];
  for (ProbeId id : {bound.id, hidden.id, unbound.id}) ASSERT_EQ(t->enable_probe(id), 0);
  EXPECT_EQ(p.pipes.ask("bound"), "ok 2 3");
  EXPECT_EQ(t->profile(bound.id).hits, 1u);
  EXPECT_EQ(t->profile(hidden.id).hits, 1u);
  EXPECT_EQ(t->profile(unbound.id).hits, 0u);
  p.quit(*t);
}

}  // namespace
}  // namespace probefs::tracee
