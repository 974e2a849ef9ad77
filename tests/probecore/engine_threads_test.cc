// The program's threads and the engine's own, with probes on the code both run.
//
// glibc runs some of its code with every signal blocked (thread start and exit, around
// clone in pthread_create and posix_spawn), where a trap is fatal: probes there must never
// be an int3, and the first probe must not kill the process by starting the engine's own
// thread. And the engine's control plane calls libc functions that users probe: those
// hits are the engine's, reported to no handler and counted as no one's miss.
//
// Each case runs in a child process (the failure it guards against kills the process),
// with an alarm so that a hung child cannot hang the test.
#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "probecore/kprobes.h"
#include "tests/probecore/targets.h"
#include "tracee/self_symbols.h"

namespace probefs::probecore {
namespace {

std::atomic<long> g_hits{0};
int count_hit(Kprobe*, PtRegs*) {
  g_hits.fetch_add(1, std::memory_order_relaxed);
  return 0;
}
void post_nothing(Kprobe*, PtRegs*, unsigned long) {}

// Runs body() in a child process; returns its exit status as waitpid() gives it.
template <typename F>
int in_child(F body) {
  fflush(nullptr);
  const pid_t pid = fork();
  if (pid == 0) {
    alarm(60);  // never outlive a broken parent
    _exit(body());
  }
  int status = 0;
  if (pid < 0 || waitpid(pid, &status, 0) != pid) return -1;
  return status;
}

std::string describe(int status) {
  if (WIFEXITED(status)) return "exit " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return "killed by signal " + std::to_string(WTERMSIG(status));
  return "status " + std::to_string(status);
}

void* thread_body(void* arg) { return arg; }

// Starts and joins `n` threads: each runs glibc's thread start and exit, with every signal
// blocked around clone, __ctype_init and _setjmp at start, madvise and getpagesize at exit.
bool run_threads(int n) {
  for (int i = 0; i < n; ++i) {
    pthread_t t;
    if (pthread_create(&t, nullptr, thread_body, nullptr) != 0) return false;
    if (pthread_join(t, nullptr) != 0) return false;
  }
  return true;
}

class SignalsBlocked : public ::testing::TestWithParam<bool> {};  // the optimization switch

// The probe is registered by the program's only thread, before the engine has any thread
// of its own: the engine's own thread starts at init, before the probe is armed, and the
// program's threads then run the probed code with every signal blocked.
TEST_P(SignalsBlocked, FirstProbeOnThreadStartCodeDoesNotKillTheProcess) {
  const bool optimize = GetParam();
  // (clone is where pthread_create goes only when the kernel has no clone3.)
  for (const char* name : {"libc:__ctype_init", "libc:_setjmp", "libc:__sigsetjmp",
                           "libc:madvise", "libc:getpagesize"}) {
    const int status = in_child([&] {
      set_symbol_resolver(&tracee::self_symbol_resolver());
      set_kprobes_optimization(optimize);
      Kprobe k;
      k.symbol_name = name;
      k.pre_handler = count_hit;
      if (register_kprobe(&k) != 0) return 10;
      // Never an int3 there: a jmp, whatever the switch says.
      if (!(k.flags & KPROBE_FLAG_OPTIMIZED)) {
        fprintf(stderr, "%s: %s\n", name, kprobe_optimization_status(&k).c_str());
        return 11;
      }
      if (!run_threads(20)) return 12;
      const long hits = g_hits.load();
      if (unregister_kprobe(&k) != 0) return 13;
      // Every thread ran the probed function at least once (__sigsetjmp and getpagesize
      // may run more often, from other callers).
      if (hits < 20) {
        fprintf(stderr, "%s: %ld hits for 20 threads\n", name, hits);
        return 14;
      }
      return 0;
    });
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
        << name << (optimize ? " (optimizing)" : " (optimization off)") << ": "
        << describe(status);
  }
}

// system() makes posix_spawn call clone and munmap in the parent with every signal
// blocked, and its child runs __libc_sigaction and pthread_sigmask with every signal
// blocked, then execve with its handlers reset to the default (where a trap is as fatal).
TEST_P(SignalsBlocked, ProbesOnSpawnCodeSurviveSystem) {
  const bool optimize = GetParam();
  const int status = in_child([&] {
    set_symbol_resolver(&tracee::self_symbol_resolver());
    set_kprobes_optimization(optimize);
    static const char* const kNames[] = {"libc:munmap", "libc:clone", "libc:__libc_sigaction",
                                         "libc:sigismember", "libc:pthread_sigmask",
                                         "libc:execve"};
    Kprobe probes[6];
    for (int i = 0; i < 6; ++i) {
      probes[i].symbol_name = kNames[i];
      probes[i].pre_handler = count_hit;
      if (register_kprobe(&probes[i]) != 0) {
        fprintf(stderr, "cannot probe %s\n", kNames[i]);
        return 10;
      }
    }
    for (int round = 0; round < 3; ++round)
      if (system("exit 3") != 3 << 8) return 11;
    const long hits = g_hits.load();
    for (Kprobe& k : probes)
      if (unregister_kprobe(&k) != 0) return 12;
    return hits >= 3 ? 0 : 13;
  });
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << describe(status);
}

// Where only an int3 could serve (a post_handler), the probe is refused, not armed.
TEST_P(SignalsBlocked, ProbeThatNeedsAnInt3ThereIsRefused) {
  const bool optimize = GetParam();
  const int status = in_child([&] {
    set_symbol_resolver(&tracee::self_symbol_resolver());
    set_kprobes_optimization(optimize);
    Kprobe k;
    k.symbol_name = "libc:__ctype_init";
    k.pre_handler = count_hit;
    k.post_handler = post_nothing;
    if (register_kprobe(&k) != -EINVAL) return 10;
    // A plain probe there is still taken, and a post_handler probe joining it is refused
    // without disturbing it.
    Kprobe plain;
    plain.symbol_name = "libc:__ctype_init";
    plain.pre_handler = count_hit;
    if (register_kprobe(&plain) != 0) return 11;
    Kprobe joiner;
    joiner.symbol_name = "libc:__ctype_init";
    joiner.post_handler = post_nothing;
    if (register_kprobe(&joiner) != -EINVAL) return 12;
    if (!(plain.flags & KPROBE_FLAG_OPTIMIZED)) return 13;
    if (!run_threads(5)) return 14;
    if (unregister_kprobe(&plain) != 0) return 15;
    return g_hits.load() >= 5 ? 0 : 16;
  });
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << describe(status);
}

INSTANTIATE_TEST_SUITE_P(Modes, SignalsBlocked, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& i) {
                           return i.param ? "Optimizing" : "OptimizationOff";
                         });

class EngineThreads : public ::testing::TestWithParam<bool> {};  // the optimization switch

void* (*volatile v_malloc)(size_t) = malloc;

// Probes on what the control plane calls: files (/proc/self/mem, /proc/self/task and its
// files), memory, threads. Control operations hit them all; none of those hits reaches a
// handler or counts as a miss. The program's own calls still hit.
TEST_P(EngineThreads, EngineHitsAreNotReportedNorMissed) {
  const bool optimize = GetParam();
  const int status = in_child([&] {
    set_symbol_resolver(&tracee::self_symbol_resolver());
    set_kprobes_optimization(optimize);
    static const char* const kNames[] = {
        "libc:malloc", "libc:free",     "libc:open64",   "libc:close",    "libc:pwrite64",
        "libc:read",   "libc:opendir",  "libc:readdir64", "libc:closedir", "libc:sched_yield",
        "libc:syscall", "libc:process_vm_readv", "libc:pthread_create",
    };
    constexpr int kN = sizeof kNames / sizeof kNames[0];
    Kprobe probes[kN];
    for (int i = 0; i < kN; ++i) {
      probes[i].symbol_name = kNames[i];
      probes[i].pre_handler = count_hit;
      if (register_kprobe(&probes[i]) != 0) {
        fprintf(stderr, "cannot probe %s\n", kNames[i]);
        return 10;
      }
    }
    // A busy second thread, so that the optimizer's writes park a running thread.
    std::atomic<bool> stop{false};
    pthread_t busy;
    if (pthread_create(&busy, nullptr, [](void* s) -> void* {
          while (!static_cast<std::atomic<bool>*>(s)->load(std::memory_order_relaxed)) {}
          return nullptr;
        }, &stop) != 0)
      return 11;
    // The lists are freed after counting: their memory is the program's to free.
    std::string lists[20];
    g_hits = 0;
    // Control operations of every kind, each of which calls probed functions.
    for (int round = 0; round < 20; ++round) {
      Kprobe k;
      k.symbol_name = "add_o2";
      k.pre_handler = count_hit;
      if (register_kprobe(&k) != 0) return 12;
      wait_for_kprobe_optimizer();
      if (disable_kprobe(&k) != 0 || enable_kprobe(&k) != 0) return 13;
      lists[round] = kprobes_list();
      if (lists[round].empty()) return 14;
      if (unregister_kprobe(&k) != 0) return 15;
    }
    const long engine_hits = g_hits.load();
    unsigned long missed = 0;
    for (const Kprobe& p : probes) missed += p.nmissed.load();
    // The program's own call is reported.
    void* volatile m = v_malloc(24);
    free(m);
    const long own_hits = g_hits.load() - engine_hits;
    stop = true;
    pthread_join(busy, nullptr);
    for (Kprobe& p : probes)
      if (unregister_kprobe(&p) != 0) return 16;
    if (engine_hits != 0 || missed != 0) {
      fprintf(stderr, "engine hits reported: %ld, missed: %lu\n", engine_hits, missed);
      return 17;
    }
    return own_hits >= 2 ? 0 : 18;  // malloc and free
  });
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << describe(status);
}

std::atomic<long> g_signal_tid{0};
void record_tid(int) { g_signal_tid = gettid(); }

// The program's signals are not delivered to the engine's thread: with the program's only
// thread blocking SIGUSR1, a SIGUSR1 sent to the process waits for it.
TEST(EngineThreadSignals, ProgramSignalsAreNotTakenByTheEngineThread) {
  const int status = in_child([] {
    Kprobe k;  // registering starts the engine's thread
    k.symbol_name = "add_o2";
    k.pre_handler = count_hit;
    set_symbol_resolver(&tracee::self_symbol_resolver());
    if (register_kprobe(&k) != 0) return 10;
    struct sigaction sa {};
    sa.sa_handler = record_tid;
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGUSR1, &sa, nullptr) != 0) return 11;
    sigset_t usr1;
    sigemptyset(&usr1);
    sigaddset(&usr1, SIGUSR1);
    if (pthread_sigmask(SIG_BLOCK, &usr1, nullptr) != 0) return 12;
    // Every other thread (the engine's) blocks it, as /proc says.
    int others = 0;
    if (DIR* d = opendir("/proc/self/task")) {
      while (dirent* e = readdir(d)) {
        const long tid = std::atol(e->d_name);
        if (tid <= 0 || tid == gettid()) continue;
        ++others;
        const std::string path = "/proc/self/task/" + std::to_string(tid) + "/status";
        FILE* f = fopen(path.c_str(), "re");
        char line[256];
        unsigned long long blocked = 0;
        while (f && fgets(line, sizeof line, f))
          if (sscanf(line, "SigBlk: %llx", &blocked) == 1) break;
        if (f) fclose(f);
        if (!(blocked & (1ull << (SIGUSR1 - 1)))) return 18;
      }
      closedir(d);
    }
    if (others == 0) return 19;
    if (kill(getpid(), SIGUSR1) != 0) return 13;
    wait_for_kprobe_optimizer();  // the engine's thread has had its chances
    if (g_signal_tid.load() != 0) return 14;  // some other thread took it
    if (pthread_sigmask(SIG_UNBLOCK, &usr1, nullptr) != 0) return 15;
    if (g_signal_tid.load() != gettid()) return 16;
    return unregister_kprobe(&k) == 0 ? 0 : 17;
  });
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << describe(status);
}

INSTANTIATE_TEST_SUITE_P(Modes, EngineThreads, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& i) {
                           return i.param ? "Optimizing" : "OptimizationOff";
                         });

}  // namespace
}  // namespace probefs::probecore
