// A program that probes every function of libc, as a new user would, and runs real work
// under the probes: a zlib round trip, stdio on a temporary file, qsort and bsearch,
// string functions, malloc churn, C++ strings, maps and exceptions, threads with a mutex
// and a condition variable, system(), setjmp/longjmp (also out of a qsort comparator),
// signals, fork and waitpid.
//
//   libc_workload [--probes=none|kprobe|kretprobe] [--optimize=on|off] [--limit=N]
//                 [--only=NAME,NAME...] [--exclude=NAME,NAME...] [--late-optimizer]
//                 [--blocked] [--work=zlib,stdio,sort,...] [--unregister]
//
// Every name of a FUNC or GNU_IFUNC symbol of libc.so.6's .dynsym is probed as `libc:NAME`
// (its default version) (--only: just those; --limit: the first N; --exclude: all but those). It
// prints, in this order:
//   refused NAME ERRNO                      a probe register_* refused
//   unoptimized NAME REASON                 --optimize=on: a probe left as an int3
//   probes N registered, N refused
//   result WHAT VALUE                       one per piece of work, the same with or
//                                           without probes
//   count NAME HITS [RETURNS NMISSED]       per probed function, hits during the work only
//   blocked NAME HITS                       --blocked: hits with SIGTRAP blocked
//   known NAME COUNT...                     what the work calls a known number of times
//   done
// and exits 0, with the probes still registered (--unregister: after unregistering them).
// libc_wide_test runs it as a child with a time limit and compares.
//
// With --optimize=on the engine's optimizer thread is started before the first probe is
// armed (glibc runs functions at thread start with every signal blocked, where an int3
// is fatal); --late-optimizer leaves that to the engine, as a new user would.
#include <fcntl.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "arch/syscall.h"
#include "probecore/kprobes.h"
#include "tests/tracee/libc_dynsym.h"
#include "tracee/self_symbols.h"

namespace {

using namespace probefs;
using namespace probefs::probecore;

// How many times the work calls functions whose counts it therefore knows.
constexpr int kQsortReturns = 7;   // qsort calls that return
constexpr int kQsortLeft = 3;      // qsort calls left by longjmp from the comparator
constexpr int kBsearchCalls = 11;
constexpr int kRaiseCalls = 5;

void result(const char* what, unsigned long long v) { std::printf("result %s %llu\n", what, v); }

// ---- the work ----

unsigned long fnv(const void* p, size_t n, unsigned long h = 1469598103934665603ul) {
  const auto* b = static_cast<const unsigned char*>(p);
  for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 1099511628211ul;
  return h;
}

void work_zlib() {
  std::vector<unsigned char> in(64 * 1024);
  for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<unsigned char>((i * 7 + i / 300) % 61);
  uLongf clen = compressBound(in.size());
  std::vector<unsigned char> c(clen);
  const int rc1 = compress2(c.data(), &clen, in.data(), in.size(), 6);
  std::vector<unsigned char> out(in.size());
  uLongf olen = out.size();
  const int rc2 = uncompress(out.data(), &olen, c.data(), clen);
  result("zlib_rc", static_cast<unsigned>(rc1 * 16 + rc2));
  result("zlib_compressed", clen);
  result("zlib_roundtrip", olen == in.size() && out == in);
  result("zlib_crc32", crc32(0, in.data(), static_cast<uInt>(in.size())));
}

void work_stdio() {
  char path[] = "/tmp/probefs_workload_XXXXXX";
  const int fd = mkstemp(path);
  FILE* f = fd >= 0 ? fdopen(fd, "w+") : nullptr;
  if (!f) {
    result("stdio_open", 0);
    return;
  }
  for (int i = 0; i < 200; ++i) std::fprintf(f, "line %d %x %s\n", i, i * 31, i % 2 ? "odd" : "even");
  std::fflush(f);
  std::rewind(f);
  char line[128];
  unsigned long sum = 0, lines = 0;
  while (std::fgets(line, sizeof line, f)) {
    int n = 0;
    unsigned x = 0;
    char word[16];
    if (std::sscanf(line, "line %d %x %15s", &n, &x, word) == 3) sum += n + x + std::strlen(word);
    ++lines;
  }
  std::fseek(f, 0, SEEK_END);
  result("stdio_lines", lines);
  result("stdio_sum", sum);
  result("stdio_size", static_cast<unsigned long long>(std::ftell(f)));
  std::fclose(f);
  unlink(path);
}

int cmp_int(const void* a, const void* b) {
  const int x = *static_cast<const int*>(a), y = *static_cast<const int*>(b);
  return (x > y) - (x < y);
}

void work_sort() {
  std::vector<int> v(1000);
  unsigned long h = 0;
  for (int round = 0; round < kQsortReturns; ++round) {
    for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<int>((i * 7919 + round * 104729) % 10007);
    qsort(v.data(), v.size(), sizeof(int), cmp_int);
    h = fnv(v.data(), v.size() * sizeof(int), h);
  }
  // <stdlib.h> inlines bsearch at -O2; through a pointer it is libc's.
  void* (*volatile search)(const void*, const void*, size_t, size_t,
                           int (*)(const void*, const void*)) = bsearch;
  unsigned found = 0;
  for (int k = 0; k < kBsearchCalls; ++k) {
    const int key = v[static_cast<size_t>(k) * 90];
    if (search(&key, v.data(), v.size(), sizeof(int), cmp_int)) ++found;
  }
  result("sort_hash", h);
  result("bsearch_found", found);
}

void work_strings() {
  char buf[256];
  unsigned long h = 0;
  for (int i = 0; i < 100; ++i) {
    std::snprintf(buf, sizeof buf, "item-%d,%s,%x;tail", i, i % 3 ? "abc" : "xyz", i * 17);
    char* copy = strdup(buf);
    char* save = nullptr;
    for (char* tok = strtok_r(copy, ",;", &save); tok; tok = strtok_r(nullptr, ",;", &save)) {
      h = fnv(tok, std::strlen(tok), h);
      h += std::strtoul(tok, nullptr, 16);
    }
    std::free(copy);
    if (std::strstr(buf, "xyz")) ++h;
    if (std::strcmp(buf, "item-0") > 0) h += 3;
    char up[256];
    size_t n = std::strlen(buf);
    for (size_t k = 0; k <= n; ++k) up[k] = static_cast<char>(toupper(static_cast<unsigned char>(buf[k])));
    std::memmove(up + 1, up, n / 2);
    h = fnv(up, n, h);
  }
  result("strings_hash", h);
}

void work_malloc() {
  std::vector<void*> live(512, nullptr);
  unsigned long h = 0;
  unsigned seed = 12345;
  for (int i = 0; i < 20000; ++i) {
    seed = seed * 1103515245 + 12345;
    const size_t slot = (seed >> 8) % live.size();
    const size_t size = 1 + (seed >> 12) % (i % 97 == 0 ? 200000 : 600);
    if (live[slot] && (seed & 1)) {
      live[slot] = std::realloc(live[slot], size);
    } else {
      std::free(live[slot]);
      live[slot] = std::malloc(size);
    }
    std::memset(live[slot], static_cast<int>(i & 0xff), size);
    h = h * 31 + static_cast<const unsigned char*>(live[slot])[size - 1];
  }
  for (void* p : live) std::free(p);
  void* c = std::calloc(1000, 8);
  h += fnv(c, 8000);
  std::free(c);
  result("malloc_hash", h);
}

void work_cxx() {
  std::map<std::string, int> m;
  std::string all;
  for (int i = 0; i < 300; ++i) {
    std::string key = "key" + std::to_string(i * 37 % 101) + std::string(i % 5, 'x');
    m[key] += i;
    all += key.substr(0, 4);
  }
  int caught = 0;
  for (int i = 0; i < 100; ++i) {
    try {
      if (i % 3 == 0) throw std::runtime_error("three " + std::to_string(i));
      if (i % 5 == 0) throw i;
    } catch (const std::runtime_error& e) {
      caught += static_cast<int>(std::strlen(e.what()));
    } catch (int v) {
      caught += v;
    }
  }
  unsigned long h = fnv(all.data(), all.size());
  for (const auto& [k, v] : m) h = fnv(k.data(), k.size(), h) + static_cast<unsigned>(v);
  result("cxx_map_size", m.size());
  result("cxx_hash", h);
  result("cxx_caught", static_cast<unsigned>(caught));
}

struct Shared {
  pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
  pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
  long counter = 0;
  int turn = 0;  // the thread whose turn it is in the handshake
};

constexpr int kThreads = 4;
constexpr int kIncrements = 5000;
constexpr int kHandshakes = 50;

struct ThreadArg {
  Shared* s;
  int id;
};

void* thread_main(void* p) {
  auto* a = static_cast<ThreadArg*>(p);
  for (int i = 0; i < kIncrements; ++i) {
    pthread_mutex_lock(&a->s->mu);
    ++a->s->counter;
    pthread_mutex_unlock(&a->s->mu);
  }
  // Take turns: each thread waits for its turn, then passes it on.
  for (int r = 0; r < kHandshakes; ++r) {
    pthread_mutex_lock(&a->s->mu);
    while (a->s->turn != a->id) pthread_cond_wait(&a->s->cv, &a->s->mu);
    a->s->turn = (a->id + 1) % kThreads;
    pthread_cond_broadcast(&a->s->cv);
    pthread_mutex_unlock(&a->s->mu);
  }
  return reinterpret_cast<void*>(static_cast<intptr_t>(a->id * 10));
}

void work_threads() {
  Shared s;
  pthread_t t[kThreads];
  ThreadArg args[kThreads];
  for (int i = 0; i < kThreads; ++i) {
    args[i] = {&s, i};
    pthread_create(&t[i], nullptr, thread_main, &args[i]);
  }
  long joined = 0;
  for (int i = 0; i < kThreads; ++i) {
    void* r = nullptr;
    pthread_join(t[i], &r);
    joined += reinterpret_cast<intptr_t>(r);
  }
  result("threads_counter", static_cast<unsigned long long>(s.counter));
  result("threads_joined", static_cast<unsigned long long>(joined));
  result("threads_turn", static_cast<unsigned>(s.turn));
}

void work_system() {
  const int st = system("true");
  result("system_status", static_cast<unsigned>(st));
}

jmp_buf g_env;
int cmp_leaving(const void*, const void*) { longjmp(g_env, 2); }

int sort_left_by_longjmp() {
  int a[] = {3, 1, 2};
  if (setjmp(g_env) == 0) {
    qsort(a, 3, sizeof(int), cmp_leaving);
    return 0;
  }
  return 1;
}

void work_setjmp() {
  volatile int jumps = 0;
  const int v = setjmp(g_env);
  if (v < 10) {
    jumps = jumps + 1;
    longjmp(g_env, v + 1);
  }
  int left = 0;
  for (int i = 0; i < kQsortLeft; ++i) left += sort_left_by_longjmp();
  result("setjmp_jumps", static_cast<unsigned>(jumps));
  result("setjmp_left_qsort", static_cast<unsigned>(left));
}

volatile sig_atomic_t g_signals = 0;
void on_usr1(int) { g_signals = g_signals + 1; }

void work_signals() {
  struct sigaction sa {};
  sa.sa_handler = on_usr1;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGUSR1, &sa, nullptr);
  for (int i = 0; i < kRaiseCalls; ++i) raise(SIGUSR1);
  signal(SIGUSR1, SIG_DFL);
  result("signals_handled", static_cast<unsigned>(g_signals));
}

void work_fork() {
  std::fflush(nullptr);
  const pid_t pid = fork();
  if (pid == 0) {
    unsigned long h = fnv("child", 5);
    _exit(static_cast<int>(h % 200) + 1);
  }
  int status = 0;
  const pid_t w = waitpid(pid, &status, 0);
  result("fork_waited", w == pid);
  result("fork_exit", WIFEXITED(status) ? static_cast<unsigned>(WEXITSTATUS(status)) : 999u);
}

struct Work {
  const char* name;
  void (*run)();
};
constexpr Work kWork[] = {
    {"zlib", work_zlib},       {"stdio", work_stdio},     {"sort", work_sort},
    {"strings", work_strings}, {"malloc", work_malloc},   {"cxx", work_cxx},
    {"threads", work_threads}, {"system", work_system},   {"setjmp", work_setjmp},
    {"signals", work_signals}, {"fork", work_fork},
};

void run_work(const std::set<std::string>& only) {
  for (const Work& w : kWork)
    if (only.empty() || only.count(w.name)) w.run();
}

// ---- the probes ----

struct CountingProbe {
  std::string name;  // "libc:NAME"
  Kprobe kp;
  Kretprobe rp;
  std::atomic<unsigned long> hits{0}, returns{0};
  bool registered = false;
};

int count_hit(Kprobe* p, PtRegs*) {
  auto* c = reinterpret_cast<CountingProbe*>(reinterpret_cast<char*>(p) - offsetof(CountingProbe, kp));
  c->hits.fetch_add(1, std::memory_order_relaxed);
  return 0;
}

// --blocked: also counts the hits of a thread that blocks SIGTRAP, where an int3 probe
// kills the process (jump-optimized probes take no trap, so there it can be seen).
int count_hit_and_mask(Kprobe* p, PtRegs* regs) {
  auto* c = reinterpret_cast<CountingProbe*>(reinterpret_cast<char*>(p) - offsetof(CountingProbe, kp));
  uint64_t mask = 0;
  const long rc = arch::raw_syscall(__NR_rt_sigprocmask, SIG_BLOCK, 0,
                                    reinterpret_cast<long>(&mask), static_cast<long>(sizeof mask));
  if (rc == 0 && (mask & (1ull << (SIGTRAP - 1)))) c->returns.fetch_add(1, std::memory_order_relaxed);
  return count_hit(p, regs);
}

CountingProbe* owner(KretprobeInstance* ri) {
  return reinterpret_cast<CountingProbe*>(reinterpret_cast<char*>(get_kretprobe(ri)) -
                                          offsetof(CountingProbe, rp));
}

int count_entry(KretprobeInstance* ri, PtRegs*) {
  owner(ri)->hits.fetch_add(1, std::memory_order_relaxed);
  return 0;
}

int count_return(KretprobeInstance* ri, PtRegs*) {
  owner(ri)->returns.fetch_add(1, std::memory_order_relaxed);
  return 0;
}

std::set<std::string> split(const char* list) {
  std::set<std::string> out;
  std::string s = list;
  size_t start = 0;
  while (start <= s.size()) {
    const size_t comma = s.find(',', start);
    const std::string item = s.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    if (!item.empty()) out.insert(item);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

int noop_pre(Kprobe*, PtRegs*) { return 0; }

}  // namespace

int main(int argc, char** argv) {
  std::string probes = "none";
  bool optimize = true;
  bool blocked = false;
  bool early_optimizer = true;
  bool unregister = false;
  long limit = -1;
  std::set<std::string> only, exclude, work;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("--probes=", 0) == 0) probes = a.substr(9);
    else if (a == "--optimize=off") optimize = false;
    else if (a == "--optimize=on") optimize = true;
    else if (a == "--blocked") blocked = true;
    else if (a == "--late-optimizer") early_optimizer = false;
    else if (a == "--unregister") unregister = true;
    else if (a.rfind("--limit=", 0) == 0) limit = std::atol(a.c_str() + 8);
    else if (a.rfind("--only=", 0) == 0) only = split(a.c_str() + 7);
    else if (a.rfind("--exclude=", 0) == 0) exclude = split(a.c_str() + 10);
    else if (a.rfind("--work=", 0) == 0) work = split(a.c_str() + 7);
    else {
      std::fprintf(stderr, "libc_workload: unknown argument %s\n", a.c_str());
      return 2;
    }
  }
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // a crash loses no finished line

  std::vector<std::unique_ptr<CountingProbe>> ps;
  if (probes != "none") {
    set_symbol_resolver(&tracee::self_symbol_resolver());
    set_kprobes_optimization(optimize);
    if (optimize && early_optimizer) {
      // The engine's optimizer thread starts on the first probe that waits for it; glibc
      // runs _setjmp and __ctype_init at thread start with every signal blocked, where an
      // int3 is fatal. Start it before any of those is armed.
      Kprobe first;
      first.symbol_name = "libc:labs";
      first.pre_handler = noop_pre;
      if (register_kprobe(&first) == 0) {
        wait_for_kprobe_optimizer();
        if (const int rc = unregister_kprobe(&first); rc != 0) {
          std::fprintf(stderr, "libc_workload: unregister_kprobe: %d\n", rc);
          return 3;
        }
      }
    }
    std::set<std::string> seen;
    for (const auto& f : tracee::test_support::dynsym_functions(tracee::test_support::libc_path())) {
      // Each name once: `libc:NAME` is its default version, or its one compat version
      // when it has no other.
      if (!seen.insert(f.name).second) continue;
      if (!only.empty() && !only.count(f.name)) continue;
      if (exclude.count(f.name)) continue;
      if (limit >= 0 && static_cast<long>(ps.size()) >= limit) break;
      auto c = std::make_unique<CountingProbe>();
      c->name = "libc:" + f.name;
      ps.push_back(std::move(c));
    }
    int refused = 0;
    for (auto& c : ps) {
      int rc;
      if (probes == "kretprobe") {
        c->rp.kp.symbol_name = c->name.c_str();
        c->rp.entry_handler = count_entry;
        c->rp.handler = count_return;
        rc = register_kretprobe(&c->rp);
      } else {
        c->kp.symbol_name = c->name.c_str();
        c->kp.pre_handler = blocked ? count_hit_and_mask : count_hit;
        rc = register_kprobe(&c->kp);
      }
      c->registered = rc == 0;
      if (rc) {
        ++refused;
        std::printf("refused %s %d\n", c->name.c_str() + 5, -rc);
      }
    }
    if (optimize) {
      wait_for_kprobe_optimizer();
      for (auto& c : ps) {
        const Kprobe& k = probes == "kretprobe" ? c->rp.kp : c->kp;
        if (c->registered && !(k.flags & KPROBE_FLAG_OPTIMIZED))
          std::printf("unoptimized %s %s\n", c->name.c_str() + 5, kprobe_optimization_status(&k).c_str());
      }
    }
    std::printf("probes %zu registered, %d refused\n", ps.size() - refused, refused);
    std::fflush(stdout);
  }

  std::vector<unsigned long> hits0(ps.size()), returns0(ps.size()), missed0(ps.size());
  for (size_t i = 0; i < ps.size(); ++i) {
    hits0[i] = ps[i]->hits.load();
    returns0[i] = ps[i]->returns.load();
    missed0[i] = ps[i]->rp.nmissed.load();
  }
  std::vector<std::string> results;
  run_work(work);
  std::vector<unsigned long> hits1(ps.size()), returns1(ps.size()), missed1(ps.size());
  for (size_t i = 0; i < ps.size(); ++i) {
    hits1[i] = ps[i]->hits.load();
    returns1[i] = ps[i]->returns.load();
    missed1[i] = ps[i]->rp.nmissed.load();
  }
  for (size_t i = 0; i < ps.size(); ++i) {
    if (!ps[i]->registered) continue;
    if (probes == "kretprobe") {
      std::printf("count %s %lu %lu %lu\n", ps[i]->name.c_str() + 5, hits1[i] - hits0[i],
                  returns1[i] - returns0[i], missed1[i] - missed0[i]);
    } else {
      std::printf("count %s %lu\n", ps[i]->name.c_str() + 5, hits1[i] - hits0[i]);
      if (blocked && returns1[i]) std::printf("blocked %s %lu\n", ps[i]->name.c_str() + 5, returns1[i]);
    }
  }
  std::printf("known qsort %d %d\nknown bsearch %d\nknown raise %d\n", kQsortReturns + kQsortLeft,
              kQsortReturns, kBsearchCalls, kRaiseCalls);
  std::fflush(stdout);
  if (unregister) {
    for (auto& c : ps) {
      if (!c->registered) continue;
      const int rc = probes == "kretprobe" ? unregister_kretprobe(&c->rp) : unregister_kprobe(&c->kp);
      if (rc != 0) {
        std::fprintf(stderr, "libc_workload: unregistering %s: %d\n", c->name.c_str(), rc);
        return 3;
      }
    }
  } else {
    // The probes stay through exit, as in a program that never removes them; their
    // counters must outlive it.
    new std::vector<std::unique_ptr<CountingProbe>>(std::move(ps));
  }
  std::printf("done\n");
  std::fflush(stdout);
  return 0;
}
