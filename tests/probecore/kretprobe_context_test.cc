// Return probes on ucontext coroutines, in the engine in process. A scheduler on the main
// stack runs three coroutines (makecontext, swapcontext) whose stacks lie above the main
// stack (mapped at a hint above it) and below it (malloc'd from the heap, and mapped where
// the kernel puts mappings), with return probes on swapcontext, setcontext, the
// coroutines' entry function and body, and a function the bodies call and yield from.
// A thread's instance list is one stack's call chain: here returns come back on another
// stack than the entries before them, and each must find its own instance (parked, see
// kretprobe_instances.cc) and run its handler with its own data, return value and caller.
// The program must compute what it computes unprobed, every instance must come back, and
// nmissed must count exactly the returns that were not delivered; also with fewer
// instances than frames in flight, and with C++ exceptions thrown and caught on the
// coroutines' stacks while the others wait in swapcontext.
//
// Each case runs in a child with an alarm: a lost return ends the process, and must not
// take the test runner with it.
#include "probecore/kprobes.h"

#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <ucontext.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "probecore/testing.h"
#include "tests/probecore/probe_test_util.h"
#include "tracee/self_symbols.h"

// ---- the coroutine program ----

namespace {

constexpr int kCoroutines = 3;
constexpr long kRounds = 6;  // coroutine i runs kRounds + i rounds: they end at different times

struct Coroutine {
  ucontext_t ctx;
  bool done;
  long result;
};

ucontext_t g_sched;
Coroutine g_co[kCoroutines];
int g_running = -1;  // the coroutine the scheduler switched to
long g_swaps = 0;    // swapcontext calls (each returns once: every coroutine is resumed)
long g_steps = 0;    // pf_co_step calls
bool g_throw = false;  // pf_co_step gets some of its values as exceptions (pf_co_thrower)
char g_transcript[16384];
size_t g_transcript_len = 0;

__attribute__((format(printf, 1, 2))) void note(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  const int n = std::vsnprintf(g_transcript + g_transcript_len,
                               sizeof g_transcript - g_transcript_len, fmt, ap);
  va_end(ap);
  if (n > 0) g_transcript_len = std::min(g_transcript_len + n, sizeof g_transcript - 1);
}

long step_value(long id, long round) { return id * 1000 + round * 7; }

long body_value(long id) {
  long acc = 0;
  for (long r = 0; r < kRounds + id; ++r) acc += step_value(id, r);
  return acc + id;
}

}  // namespace

extern "C" {

// Back to the scheduler; returns when the scheduler switches here again.
__attribute__((noinline, noipa)) long pf_co_yield(Coroutine* co) {
  ++g_swaps;
  return swapcontext(&co->ctx, &g_sched);
}

__attribute__((noinline, noipa)) long pf_co_thrower(long v, long round) {
  if (g_throw && round % 3 != 1) throw v;
  return v;
}

// Called by the bodies; on odd rounds it yields before it returns, so its frame (and its
// return probe's instance) lives across switches to other stacks. With g_throw, the values
// of two rounds in three come back as an exception, thrown and caught on the coroutine's
// stack while the other coroutines and the scheduler wait inside swapcontext.
__attribute__((noinline, noipa)) long pf_co_step(long id, long round) {
  ++g_steps;
  if (round % 2 && pf_co_yield(&g_co[id]) != 0) note("yield failed ");
  try {
    return pf_co_thrower(step_value(id, round), round);
  } catch (long v) {
    return v;
  }
}

__attribute__((noinline, noipa)) long pf_co_body(long id) {
  long acc = 0;
  for (long r = 0; r < kRounds + id; ++r) {
    const long v = pf_co_step(id, r);
    note("%ld:%ld=%ld ", id, r, v);
    acc += v;
    if (pf_co_yield(&g_co[id]) != 0) note("yield failed ");
  }
  return acc + id;
}

// makecontext's entry. Coroutines 0 and 1 end by returning (uc_link: glibc's
// __start_context calls setcontext(&g_sched)); coroutine 2 calls setcontext itself. The
// last setcontext of each never returns, nor does this function in coroutine 2.
__attribute__((noinline, noipa)) long pf_co_entry(int id) {
  const long r = pf_co_body(id);
  g_co[id].result = r;
  g_co[id].done = true;
  note("done %d=%ld ", id, r);
  if (id == 2) setcontext(&g_sched);
  return r;
}

// Round robin until every coroutine is done.
__attribute__((noinline, noipa)) long pf_co_schedule() {
  long switches = 0;
  for (bool any = true; any;) {
    any = false;
    for (int i = 0; i < kCoroutines; ++i) {
      if (g_co[i].done) continue;
      any = true;
      g_running = i;
      ++g_swaps;
      if (swapcontext(&g_sched, &g_co[i].ctx) != 0) note("swapcontext failed ");
      ++switches;
    }
  }
  return switches;
}

}  // extern "C"

namespace probefs::probecore {
namespace {

using test_util::g_failures;

// ---- stacks above and below the main stack ----

enum class Place { kAboveMainStack, kHeap, kMapped };

struct Stack {
  Place place;
  char* base = nullptr;
  size_t size = 0;
};

// The [stack] mapping's end, from /proc/self/maps.
uintptr_t main_stack_end() {
  FILE* f = std::fopen("/proc/self/maps", "r");
  if (!f) return 0;
  char line[512];
  uintptr_t end = 0;
  while (std::fgets(line, sizeof line, f)) {
    unsigned long lo, hi;
    if (std::strstr(line, "[stack]") && std::sscanf(line, "%lx-%lx", &lo, &hi) == 2) end = hi;
  }
  std::fclose(f);
  return end;
}

// A mapping at a higher address than the whole main stack: the first free one at hints
// going up from just past it (the vDSO usually sits right above the stack).
char* map_above_main_stack(size_t size) {
  const uintptr_t end = main_stack_end();
  if (!end) return nullptr;
  constexpr uintptr_t kStep = uintptr_t{64} << 10;  // fine: ASLR may leave little room
  constexpr uintptr_t kTop = uintptr_t{0x7fffffff} << 16;  // below the end of user space
  for (uintptr_t hint = (end + kStep) & ~(kStep - 1); hint + size < kTop; hint += kStep) {
    void* p = mmap(reinterpret_cast<void*>(hint), size, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
    if (p == MAP_FAILED) continue;
    if (reinterpret_cast<uintptr_t>(p) == hint) return static_cast<char*>(p);
    munmap(p, size);  // an old kernel took the flag for a hint
  }
  return nullptr;
}

bool make_stack(Stack* s) {
  switch (s->place) {
    case Place::kAboveMainStack:
      s->size = 256 * 1024;
      s->base = map_above_main_stack(s->size);
      break;
    case Place::kHeap:
      s->size = 96 * 1024;  // under malloc's mmap threshold: from the heap
      s->base = static_cast<char*>(std::malloc(s->size));
      break;
    case Place::kMapped: {
      s->size = 256 * 1024;
      void* p = mmap(nullptr, s->size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                     -1, 0);
      s->base = p == MAP_FAILED ? nullptr : static_cast<char*>(p);
      break;
    }
  }
  return s->base != nullptr;
}

// The frames left on a stack are gone for good: unmapped, or cleared and freed.
void release_stack(Stack* s) {
  if (!s->base) return;
  if (s->place == Place::kHeap) {
    std::memset(s->base, 0, s->size);
    std::free(s->base);
  } else {
    munmap(s->base, s->size);
  }
  s->base = nullptr;
}

struct Run {
  std::string transcript;
  long results[kCoroutines] = {};
  long swaps = 0, steps = 0, switches = 0;
};

// Runs the coroutine program on fresh stacks placed as `places` says (kept in *stacks).
__attribute__((noinline)) Run run_coroutines(const Place* places, std::vector<Stack>* stacks) {
  Run run;
  g_transcript_len = 0;
  g_transcript[0] = 0;
  g_swaps = g_steps = 0;
  const auto here = reinterpret_cast<uintptr_t>(__builtin_frame_address(0));
  for (int i = 0; i < kCoroutines; ++i) {
    Stack s{places[i]};
    if (!make_stack(&s)) {
      g_failures += "no stack for coroutine " + std::to_string(i) + "\n";
      return run;
    }
    const bool above = reinterpret_cast<uintptr_t>(s.base) > here;
    CHILD_EXPECT_EQ(above, places[i] == Place::kAboveMainStack);
    stacks->push_back(s);
    g_co[i].done = false;
    g_co[i].result = 0;
    getcontext(&g_co[i].ctx);
    g_co[i].ctx.uc_stack.ss_sp = s.base;
    g_co[i].ctx.uc_stack.ss_size = s.size;
    g_co[i].ctx.uc_link = &g_sched;
    makecontext(&g_co[i].ctx, reinterpret_cast<void (*)()>(pf_co_entry), 1, i);
  }
  run.switches = pf_co_schedule();
  run.transcript.assign(g_transcript, g_transcript_len);
  for (int i = 0; i < kCoroutines; ++i) run.results[i] = g_co[i].result;
  run.swaps = g_swaps;
  run.steps = g_steps;
  return run;
}

void expect_same_run(const Run& got, const Run& want) {
  CHILD_EXPECT_TRUE(got.transcript == want.transcript);
  if (got.transcript != want.transcript)
    g_failures += "  got:  " + got.transcript + "\n  want: " + want.transcript + "\n";
  for (int i = 0; i < kCoroutines; ++i) CHILD_EXPECT_EQ(got.results[i], body_value(i));
  CHILD_EXPECT_EQ(got.swaps, want.swaps);
  CHILD_EXPECT_EQ(got.steps, want.steps);
  CHILD_EXPECT_EQ(got.switches, want.switches);
}

// Where the coroutines' stacks lie (coroutine i's is places[i]).
constexpr Place kPlacesA[kCoroutines] = {Place::kAboveMainStack, Place::kHeap, Place::kMapped};
constexpr Place kPlacesB[kCoroutines] = {Place::kHeap, Place::kMapped, Place::kAboveMainStack};

// ---- the probes ----

// Bounds of the functions a return must come back to, found before the probes fire (the
// handlers run in a signal handler or a detour: they only compare).
struct Callers {
  FunctionBounds body, entry, yield, schedule;
};
Callers g_callers;

bool bounds_of(const char* name, FunctionBounds* out) {
  SymbolLocation loc;
  if (tracee::self_symbol_resolver().resolve(name, &loc) != 0 || !loc.bounds.known()) {
    g_failures += std::string("no bounds for ") + name + "\n";
    return false;
  }
  *out = loc.bounds;
  return true;
}

// A return probe whose handlers count and check. The entry handler keeps the arguments in
// the instance's data; the return handler checks them against what came back.
struct Probe : Kretprobe {
  long entries = 0, returns = 0, wrong = 0;
  const char* first_wrong = nullptr;
  std::vector<uintptr_t> callers;  // every return's caller, for checks outside the handler
};

struct EntryArgs {
  uint64_t a, b;
};

Probe* probe_of(KretprobeInstance* ri) { return static_cast<Probe*>(get_kretprobe(ri)); }

int keep_args(KretprobeInstance* ri, PtRegs* regs) {
  ++probe_of(ri)->entries;
  auto* args = reinterpret_cast<EntryArgs*>(ri->data);
  args->a = regs->di;
  args->b = regs->si;
  return 0;
}

void wrong(Probe* p, const char* what) {
  if (p->wrong++ == 0) p->first_wrong = what;
}

void record_caller(Probe* p, KretprobeInstance* ri) {
  if (p->callers.size() < p->callers.capacity()) p->callers.push_back(ri->ret_addr);
}

int check_step(KretprobeInstance* ri, PtRegs* regs) {
  Probe* p = probe_of(ri);
  ++p->returns;
  const auto* args = reinterpret_cast<const EntryArgs*>(ri->data);
  if (regs->ax != static_cast<uint64_t>(step_value(args->a, args->b))) wrong(p, "return value");
  if (!g_callers.body.contains(ri->ret_addr)) wrong(p, "caller");
  return 0;
}

int check_body(KretprobeInstance* ri, PtRegs* regs) {
  Probe* p = probe_of(ri);
  ++p->returns;
  const auto* args = reinterpret_cast<const EntryArgs*>(ri->data);
  if (regs->ax != static_cast<uint64_t>(body_value(args->a))) wrong(p, "return value");
  if (!g_callers.entry.contains(ri->ret_addr)) wrong(p, "caller");
  return 0;
}

// pf_co_entry returns (in coroutines 0 and 1) into glibc's __start_context.
int check_entry(KretprobeInstance* ri, PtRegs* regs) {
  Probe* p = probe_of(ri);
  ++p->returns;
  const auto* args = reinterpret_cast<const EntryArgs*>(ri->data);
  if (regs->ax != static_cast<uint64_t>(body_value(args->a))) wrong(p, "return value");
  if (static_cast<int>(args->a) == 2) wrong(p, "coroutine 2 returned from its entry");
  record_caller(p, ri);
  return 0;
}

// swapcontext(oucp, ucp) returns 0 into the context it saved in oucp: the scheduler's
// (into pf_co_schedule) or the running coroutine's (into pf_co_yield).
int check_swap(KretprobeInstance* ri, PtRegs* regs) {
  Probe* p = probe_of(ri);
  ++p->returns;
  const auto* args = reinterpret_cast<const EntryArgs*>(ri->data);
  if (regs->ax != 0) wrong(p, "return value");
  const bool to_sched = args->a == reinterpret_cast<uintptr_t>(&g_sched);
  if (to_sched ? !g_callers.schedule.contains(ri->ret_addr)
               : !g_callers.yield.contains(ri->ret_addr))
    wrong(p, "caller");
  if (!to_sched && (g_running < 0 ||
                    args->a != reinterpret_cast<uintptr_t>(&g_co[g_running].ctx)))
    wrong(p, "another coroutine's instance");
  return 0;
}

int setcontext_returned(KretprobeInstance* ri, PtRegs*) {
  Probe* p = probe_of(ri);
  ++p->returns;
  wrong(p, "setcontext returned");
  return 0;
}

void init_probe(Probe* p, const char* sym, kretprobe_handler_t handler, int maxactive = 0) {
  p->kp.symbol_name = sym;
  p->entry_handler = keep_args;
  p->handler = handler;
  p->data_size = sizeof(EntryArgs);
  p->maxactive = maxactive;
  p->callers.reserve(64);
}

enum class Mode { kInt3, kOptimized };

// Registers, and in optimized mode waits until the optimizer took the probe.
bool arm(Probe* p, Mode mode) {
  if (int rc = register_kretprobe(p); rc) {
    g_failures += std::string("register_kretprobe(") + p->kp.symbol_name +
                  ") = " + std::to_string(rc) + "\n";
    return false;
  }
  if (mode == Mode::kOptimized) {
    wait_for_kprobe_optimizer();
    if (!(p->kp.flags & KPROBE_FLAG_OPTIMIZED))
      g_failures += std::string(p->kp.symbol_name) + " not optimized: " +
                    kprobe_optimization_status(&p->kp) + "\n";
  }
  return true;
}

void expect_right(const Probe& p) {
  if (p.wrong) {
    g_failures += std::string(p.kp.symbol_name) + ": " + std::to_string(p.wrong) +
                  " wrong returns, first: " + p.first_wrong + "\n";
  }
}

// Runs body(mode) in a child with optimization set as `mode` asks; the child ends with 0
// when body found nothing wrong, 1 when it did, or by the signal that killed it.
void run_in_child(Mode mode, void (*body)(Mode)) {
  std::fflush(nullptr);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    alarm(60);  // a hang ends as SIGALRM
    set_symbol_resolver(&tracee::self_symbol_resolver());
    set_kprobes_optimization(mode == Mode::kOptimized);
    if (bounds_of("pf_co_body", &g_callers.body) && bounds_of("pf_co_entry", &g_callers.entry) &&
        bounds_of("pf_co_yield", &g_callers.yield) &&
        bounds_of("pf_co_schedule", &g_callers.schedule))
      body(mode);
    if (!g_failures.empty()) std::fputs(g_failures.c_str(), stderr);
    std::fflush(nullptr);
    _exit(g_failures.empty() ? 0 : 1);
  }
  test_util::expect_child_succeeded(pid);
}

void for_each_mode(void (*body)(Mode)) {
  for (Mode m : {Mode::kInt3, Mode::kOptimized}) {
    SCOPED_TRACE(m == Mode::kInt3 ? "int3" : "optimized");
    run_in_child(m, body);
  }
}

void release_all(std::vector<Stack>* stacks) {
  for (Stack& s : *stacks) release_stack(&s);
  stacks->clear();
}

// Every return comes back on its own stack with its own instance, also where the
// coroutine's stack lies above the main stack's frames, which the instance order alone
// would take for gone. Frames that never return (the last setcontext of each coroutine,
// and coroutine 2's entry) keep their instances until their stacks are gone; once they
// are and the probes are unregistered, the thread's next park change gives them back.
void coroutines_under_return_probes(Mode mode) {
  std::vector<Stack> stacks;
  const Run want = run_coroutines(kPlacesA, &stacks);
  release_all(&stacks);
  CHILD_EXPECT_EQ(want.steps, 3 * kRounds + 3);
  CHILD_EXPECT_EQ(testing::thread_kretprobe_instances(), 0);

  Probe swap, set, entry, body, step;
  init_probe(&swap, "libc:swapcontext", check_swap);
  init_probe(&set, "libc:setcontext", setcontext_returned);
  init_probe(&entry, "pf_co_entry", check_entry);
  init_probe(&body, "pf_co_body", check_body);
  init_probe(&step, "pf_co_step", check_step);
  Probe* all[] = {&swap, &set, &entry, &body, &step};
  for (Probe* p : all)
    if (!arm(p, mode)) return;

  long runs = 0;
  for (const Place* places : {kPlacesA, kPlacesB}) {
    const Run got = run_coroutines(places, &stacks);
    ++runs;
    expect_same_run(got, want);
    for (Probe* p : all) {
      expect_right(*p);
      CHILD_EXPECT_EQ(p->nmissed.load(), 0);
    }
    CHILD_EXPECT_EQ(swap.entries, runs * want.swaps);
    CHILD_EXPECT_EQ(swap.returns, runs * want.swaps);
    CHILD_EXPECT_EQ(set.entries, runs * kCoroutines);
    CHILD_EXPECT_EQ(set.returns, 0);
    CHILD_EXPECT_EQ(entry.entries, runs * kCoroutines);
    CHILD_EXPECT_EQ(entry.returns, runs * (kCoroutines - 1));
    CHILD_EXPECT_EQ(body.returns, runs * kCoroutines);
    CHILD_EXPECT_EQ(step.returns, runs * want.steps);
    // In flight: what never returns, on stacks that are still there.
    CHILD_EXPECT_EQ(testing::kretprobe_instances_out(&swap), 0);
    CHILD_EXPECT_EQ(testing::kretprobe_instances_out(&set), runs * kCoroutines);
    CHILD_EXPECT_EQ(testing::kretprobe_instances_out(&entry), runs);
    CHILD_EXPECT_EQ(testing::kretprobe_instances_out(&body), 0);
    CHILD_EXPECT_EQ(testing::kretprobe_instances_out(&step), 0);
    // The thread holds them parked: they were taken for gone when it left their stacks.
    CHILD_EXPECT_EQ(testing::thread_kretprobe_instances(), runs * (kCoroutines + 1));
    CHILD_EXPECT_EQ(testing::thread_parked_kretprobe_instances(), runs * (kCoroutines + 1));
  }
  // pf_co_entry returned into glibc (__start_context, which goes on to setcontext).
  CHILD_EXPECT_EQ(entry.callers.size(), runs * (kCoroutines - 1));
  for (uintptr_t c : entry.callers) {
    SymbolLocation loc;
    CHILD_EXPECT_TRUE(tracee::self_symbol_resolver().describe(c, &loc) == 0 &&
                      loc.module.rfind("libc.so", 0) == 0);
  }

  release_all(&stacks);
  for (Probe* p : all) CHILD_EXPECT_EQ(unregister_kretprobe(p), 0);
  // Nothing looked at the park since: the frames' instances are still out.
  CHILD_EXPECT_EQ(testing::thread_kretprobe_instances(), runs * (kCoroutines + 1));

  // The program again, under one new return probe: its first park change finds the old
  // frames' stacks gone (unmapped, or cleared) and gives their instances back.
  Probe again;
  init_probe(&again, "pf_co_step", check_step);
  if (!arm(&again, mode)) return;
  expect_same_run(run_coroutines(kPlacesA, &stacks), want);
  expect_right(again);
  CHILD_EXPECT_EQ(again.returns, want.steps);
  CHILD_EXPECT_EQ(again.nmissed.load(), 0);
  CHILD_EXPECT_EQ(testing::kretprobe_instances_out(&again), 0);
  CHILD_EXPECT_EQ(testing::thread_kretprobe_instances(), 0);
  release_all(&stacks);
  CHILD_EXPECT_EQ(unregister_kretprobe(&again), 0);
  CHILD_EXPECT_EQ(testing::thread_kretprobe_instances(), 0);
}

TEST(KretprobeContext, CoroutinesAboveAndBelowTheMainStack) {
  for_each_mode(coroutines_under_return_probes);
}

// Fewer instances than frames in flight: the entries that find none are missed and
// counted, every one that took an instance returns through its handler, the program is
// unchanged, and every instance comes back.
void fewer_instances_than_frames(Mode mode) {
  std::vector<Stack> stacks;
  const Run want = run_coroutines(kPlacesA, &stacks);
  release_all(&stacks);

  Probe swap, step, body;
  init_probe(&swap, "libc:swapcontext", check_swap, 2);  // up to 4 in flight
  init_probe(&step, "pf_co_step", check_step, 1);        // up to 3
  init_probe(&body, "pf_co_body", check_body, 2);        // 3
  Probe* all[] = {&swap, &step, &body};
  for (Probe* p : all)
    if (!arm(p, mode)) return;
  for (const Place* places : {kPlacesA, kPlacesB}) {
    expect_same_run(run_coroutines(places, &stacks), want);
    release_all(&stacks);
  }
  for (Probe* p : all) expect_right(*p);
  CHILD_EXPECT_EQ(swap.returns, swap.entries);
  CHILD_EXPECT_EQ(swap.returns + static_cast<long>(swap.nmissed.load()), 2 * want.swaps);
  CHILD_EXPECT_EQ(step.returns, step.entries);
  CHILD_EXPECT_EQ(step.returns + static_cast<long>(step.nmissed.load()), 2 * want.steps);
  CHILD_EXPECT_EQ(body.returns, body.entries);
  CHILD_EXPECT_EQ(body.returns + static_cast<long>(body.nmissed.load()), 2 * kCoroutines);
  CHILD_EXPECT_TRUE(swap.nmissed.load() > 0 && step.nmissed.load() > 0 &&
                    body.nmissed.load() > 0);
  for (Probe* p : all) CHILD_EXPECT_EQ(testing::kretprobe_instances_out(p), 0);
  CHILD_EXPECT_EQ(testing::thread_kretprobe_instances(), 0);
  for (Probe* p : all) CHILD_EXPECT_EQ(unregister_kretprobe(p), 0);
}

TEST(KretprobeContext, FewerInstancesThanFramesInFlight) {
  for_each_mode(fewer_instances_than_frames);
}

// C++ exceptions thrown and caught on the coroutines' stacks, through return-probed
// frames, while the scheduler and the other coroutines wait in return-probed
// swapcontext calls on stacks above and below: before each unwind the engine gives the
// thread's instances above the thrower back (their frames run no return handler, as
// README says), and those of frames on other stacks still find their way back. The
// program runs as unprobed, every handler that runs sees its own values, and nothing is
// missed.
void exceptions_on_coroutine_stacks(Mode mode) {
  g_throw = true;
  std::vector<Stack> stacks;
  const Run want = run_coroutines(kPlacesA, &stacks);
  release_all(&stacks);

  Probe swap, body, step;
  init_probe(&swap, "libc:swapcontext", check_swap);
  init_probe(&body, "pf_co_body", check_body);
  init_probe(&step, "pf_co_step", check_step);
  Probe* all[] = {&swap, &body, &step};
  for (Probe* p : all)
    if (!arm(p, mode)) return;
  for (const Place* places : {kPlacesA, kPlacesB}) {
    expect_same_run(run_coroutines(places, &stacks), want);
    for (Probe* p : all) {
      expect_right(*p);
      CHILD_EXPECT_EQ(p->nmissed.load(), 0);
    }
  }
  CHILD_EXPECT_TRUE(swap.returns > 0 && swap.returns < swap.entries);  // some given back
  CHILD_EXPECT_TRUE(step.returns > 0 && step.returns < step.entries);
  CHILD_EXPECT_EQ(testing::kretprobe_instances_out(&swap), 0);
  CHILD_EXPECT_EQ(testing::kretprobe_instances_out(&body), 0);
  // A frame whose slot the give-back restored while it was parked returns past the
  // trampoline: its instance stays out until its stack is seen to be gone.
  release_all(&stacks);
  for (Probe* p : all) CHILD_EXPECT_EQ(unregister_kretprobe(p), 0);
  g_throw = false;
  Probe again;
  init_probe(&again, "pf_co_step", check_step);
  if (!arm(&again, mode)) return;
  expect_same_run(run_coroutines(kPlacesA, &stacks), want);
  expect_right(again);
  CHILD_EXPECT_EQ(testing::thread_kretprobe_instances(), 0);
  release_all(&stacks);
  CHILD_EXPECT_EQ(unregister_kretprobe(&again), 0);
}

TEST(KretprobeContext, ExceptionsOnCoroutineStacks) {
  for_each_mode(exceptions_on_coroutine_stacks);
}

}  // namespace
}  // namespace probefs::probecore
