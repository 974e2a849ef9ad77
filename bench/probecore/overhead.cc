// Per-hit overhead of probecore's probe kinds, in the layout of the kprobes documentation's
// table: each figure is (probed loop - unprobed loop) per call, on the same function in the
// same run, with a handler that counts hits.
//
//   k   kprobe, probed instruction single-stepped (trap flag)
//   b   kprobe, boosted (out-of-line copy, no single-step)
//   r   kretprobe, entry single-stepped
//   rb  kretprobe, entry boosted
//   kr  kprobe + kretprobe on the same function, boosted
//   o   kprobe, jump-optimized (no trap)
//   ro  kretprobe, entry jump-optimized, return through the trampoline
//   okr kprobe + kretprobe on the same function, both optimized
//   ov  o with a handler that may use vector registers (no KPROBE_FLAG_GPR_ONLY): the
//       detour saves the vector state this CPU has (xmm, ymm, or zmm and k)
//
// Then the control plane: registering, arming and optimizing N probes one at a time and in
// one batch (and unregistering them), against N no-op control operations in the same run.
//
// The measuring thread stays on the CPU it started on, so that the figures do not carry
// migrations (which also move kretprobe instances between CPUs' free lists).
#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <cerrno>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <functional>
#include <string>
#include <vector>

#include "bench/probecore/counting_handlers.h"
#include "probecore/kprobes.h"

extern "C" long bench_target(long);
extern "C" char bench_target_end[];
extern "C" char bench_reg_targets[], bench_reg_targets_end[];

namespace {

using namespace probefs;
using namespace probefs::probecore;

long (*volatile g_target)(long) = bench_target;
using bench::count_pre;
using bench::count_ret;
using bench::g_hits;

double now_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e9 + ts.tv_nsec;
}

// Median ns per call over `reps` runs of `calls` calls.
double time_calls(long calls, int reps) {
  std::vector<double> runs;
  for (int r = 0; r < reps; ++r) {
    const double t0 = now_ns();
    long sum = 0;
    for (long i = 0; i < calls; ++i) sum += g_target(i);
    const double t1 = now_ns();
    if (sum == 42) std::puts("");  // keep the loop
    runs.push_back((t1 - t0) / calls);
  }
  std::sort(runs.begin(), runs.end());
  return runs[runs.size() / 2];
}

// Wall and CPU time of this process, in ms.
struct Clock {
  double wall, cpu;
  static Clock now() {
    timespec w, c;
    clock_gettime(CLOCK_MONOTONIC, &w);
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c);
    return {w.tv_sec * 1e3 + w.tv_nsec / 1e6, c.tv_sec * 1e3 + c.tv_nsec / 1e6};
  }
  Clock operator-(const Clock& o) const { return {wall - o.wall, cpu - o.cpu}; }
};

// Registration at scale: N probes on N functions, registered, armed and optimized (until
// wait_for_kprobe_optimizer() returns and every one is [OPTIMIZED]), one at a time and as
// one batch; then unregistered the same two ways. The baseline is N control operations
// that do nothing (unregistering a probe that is not registered: the lock, the checks,
// the settling of nothing). Returns false when something failed.
bool registration_rows() {
  constexpr size_t kStride = 16;
  const auto base = reinterpret_cast<uintptr_t>(bench_reg_targets);
  const size_t n = (reinterpret_cast<uintptr_t>(bench_reg_targets_end) - base) / kStride;
  std::vector<Kprobe> probes(n);
  std::vector<Kprobe*> ptrs;
  auto reset = [&] {
    ptrs.clear();
    for (size_t i = 0; i < n; ++i) {
      Kprobe& k = probes[i];
      k.~Kprobe();
      new (&k) Kprobe;
      k.addr = base + i * kStride;
      k.bounds = {k.addr, k.addr + kStride};
      k.pre_handler = count_pre;
      k.flags = KPROBE_FLAG_GPR_ONLY;
      ptrs.push_back(&k);
    }
  };
  auto all_optimized = [&] {
    for (const Kprobe& k : probes)
      if (!(k.flags & KPROBE_FLAG_OPTIMIZED)) return false;
    // And they fire: each once.
    g_hits = 0;
    for (size_t i = 0; i < n; ++i)
      if (reinterpret_cast<long (*)(long)>(base + i * kStride)(41) != 42) return false;
    return g_hits.load() == static_cast<long>(n);
  };
  set_kprobes_optimization(true);
  set_kprobes_boost(true);

  reset();
  Clock t0 = Clock::now();
  for (Kprobe* k : ptrs)
    if (unregister_kprobe(k) != -EINVAL) return false;
  const Clock noop = Clock::now() - t0;

  t0 = Clock::now();
  for (Kprobe* k : ptrs)
    if (register_kprobe(k) != 0) return false;
  wait_for_kprobe_optimizer();
  const Clock reg1 = Clock::now() - t0;
  const bool ok1 = all_optimized();
  t0 = Clock::now();
  for (Kprobe* k : ptrs)
    if (unregister_kprobe(k) != 0) return false;
  const Clock unreg1 = Clock::now() - t0;

  reset();
  t0 = Clock::now();
  if (register_kprobes(ptrs.data(), static_cast<int>(n)) != 0) return false;
  wait_for_kprobe_optimizer();
  const Clock regn = Clock::now() - t0;
  const bool okn = all_optimized();
  t0 = Clock::now();
  unregister_kprobes(ptrs.data(), static_cast<int>(n));
  const Clock unregn = Clock::now() - t0;
  if (kprobes_list() != "") return false;

  std::printf("\nprobecore registration of %zu probes (register + arm + optimize, then unregister)\n\n", n);
  std::printf("%-7s %-44s %10s %10s %10s %12s\n", "row", "what", "wall ms", "cpu ms",
              "us/probe", "x no-op ops");
  auto row = [&](const char* name, const char* what, const Clock& c, bool ok) {
    std::printf("%-7s %-44s %10.1f %10.1f %10.2f %12.1f%s\n", name, what, c.wall, c.cpu,
                c.wall * 1e3 / n, c.wall / noop.wall, ok ? "" : "  (not all optimized and firing!)");
  };
  row("noop", "no-op control operation each (baseline)", noop, true);
  row("reg1", "register_kprobe each, until all optimized", reg1, ok1);
  row("regN", "register_kprobes, one batch, until optimized", regn, okn);
  row("unreg1", "unregister_kprobe each", unreg1, true);
  row("unregN", "unregister_kprobes, one batch", unregn, true);
  return ok1 && okn;
}

struct Mode {
  const char* name;
  const char* what;
  long calls;
  std::function<bool()> setup;
  std::function<void()> teardown;
  long hits_per_call;
};

}  // namespace

int main(int argc, char** argv) {
  const double scale = argc > 1 ? std::atof(argv[1]) : 1.0;  // shorter or longer runs
  if (const int cpu = sched_getcpu(); cpu >= 0) {
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(cpu, &one);
    pthread_setaffinity_np(pthread_self(), sizeof one, &one);
  }
  const int reps = 5;
  const uintptr_t fn = reinterpret_cast<uintptr_t>(bench_target);
  const FunctionBounds bounds{fn, reinterpret_cast<uintptr_t>(bench_target_end)};

  Kprobe kp;
  Kretprobe rp;
  auto reset = [&] {
    kp.~Kprobe();
    new (&kp) Kprobe;
    kp.addr = fn;
    kp.bounds = bounds;
    kp.pre_handler = count_pre;
    kp.flags = KPROBE_FLAG_GPR_ONLY;  // the handlers are built -mgeneral-regs-only
    rp.~Kretprobe();
    new (&rp) Kretprobe;
    rp.kp.addr = fn;
    rp.kp.bounds = bounds;
    rp.handler = count_ret;
    rp.kp.flags = KPROBE_FLAG_GPR_ONLY;
  };
  // Trap modes run with the optimizer off; optimized modes wait for it and check it worked.
  auto with_boost = [&](bool boost, std::function<bool()> f) {
    return [=] {
      set_kprobes_optimization(false);
      set_kprobes_boost(boost);
      reset();
      return f();
    };
  };
  auto optimized = [&](std::function<bool()> f) {
    return [=, &kp, &rp] {
      set_kprobes_optimization(true);
      set_kprobes_boost(true);
      reset();
      if (!f()) return false;
      wait_for_kprobe_optimizer();
      const Kprobe& probe = kp.aggr_ ? kp : rp.kp;
      return (probe.flags & KPROBE_FLAG_OPTIMIZED) != 0;
    };
  };
  auto reg_k = [&] { return register_kprobe(&kp) == 0; };
  auto reg_k_vector = [&] {
    kp.flags = 0;
    return register_kprobe(&kp) == 0;
  };
  auto reg_r = [&] { return register_kretprobe(&rp) == 0; };
  auto unreg_all = [&] {
    if ((kp.aggr_ && unregister_kprobe(&kp) != 0) ||
        (rp.kp.aggr_ && unregister_kretprobe(&rp) != 0)) {
      std::printf("unregister failed\n");
      std::exit(1);
    }
  };

  const long slow = static_cast<long>(20000 * scale), fast = static_cast<long>(100000 * scale);
  std::vector<Mode> modes = {
      {"k", "kprobe, single-stepped", slow, with_boost(false, reg_k), unreg_all, 1},
      {"b", "kprobe, boosted", fast, with_boost(true, reg_k), unreg_all, 1},
      {"r", "kretprobe, entry single-stepped", slow, with_boost(false, reg_r), unreg_all, 1},
      {"rb", "kretprobe, entry boosted", fast, with_boost(true, reg_r), unreg_all, 1},
      {"kr", "kprobe + kretprobe, boosted", fast,
       with_boost(true, [&] { return reg_k() && reg_r(); }), unreg_all, 2},
      {"o", "kprobe, optimized", fast * 100, optimized(reg_k), unreg_all, 1},
      {"ro", "kretprobe, optimized entry", fast * 100, optimized(reg_r), unreg_all, 1},
      {"okr", "kprobe + kretprobe, optimized", fast * 100,
       optimized([&] { return reg_k() && reg_r(); }), unreg_all, 2},
      {"ov", "kprobe, optimized, vector handler", fast * 100, optimized(reg_k_vector),
       unreg_all, 1},
  };

  const double base = time_calls(static_cast<long>(10000000 * scale), reps);
  std::printf("probecore per-hit overhead on bench_target (median of %d runs)\n\n", reps);
  std::printf("%-5s %-34s %12s %14s %12s\n", "mode", "what", "ns/call", "ns/hit", "x baseline");
  std::printf("%-5s %-34s %12.1f %14s %12.1f\n", "base", "unprobed call", base, "-", 1.0);
  int status = 0;
  for (const Mode& m : modes) {
    if (!m.setup()) {
      std::printf("%-5s %-34s %12s\n", m.name, m.what, "register/optimize failed");
      m.teardown();
      status = 1;
      continue;
    }
    g_hits = 0;
    const double t = time_calls(m.calls, reps);
    const long hits = g_hits.load();
    m.teardown();
    const bool exact = hits == m.calls * reps * m.hits_per_call;
    std::printf("%-5s %-34s %12.1f %14.1f %12.1f%s\n", m.name, m.what, t, t - base, t / base,
                exact ? "" : "  (hit count wrong!)");
    if (!exact) status = 1;
  }
  set_kprobes_boost(true);
  set_kprobes_optimization(true);
  if (!registration_rows()) {
    std::printf("registration rows failed\n");
    status = 1;
  }
  return status;
}
