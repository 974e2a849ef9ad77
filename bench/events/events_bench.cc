// events benchmark: the fetch interpreter and the text formatter, each against a baseline
// measured in the same run (hand-written code doing the same minimal work, or snprintf).
//
//   fetch, 2 register args      target <= 5 ns per record
//   fetch, 1 string arg         target <= 30 ns per record
//   format a trace line         target >= 5 M lines/s on one core
//
// The string case runs three times: with an unchecked in-process reader (the
// interpreter's own cost), with FaultTolerantReader (safe; needs the agent's fault
// handler) and with LiveMemoryReader, whose process_vm_readv system call dominates.
#include <signal.h>
#include <time.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>

#include "events/compile.h"
#include "events/fetch.h"
#include "events/filter.h"
#include "events/memory_reader.h"
#include "events/output.h"
#include "events/parse.h"
#include "arch/safe_copy.h"

using namespace probefs;
using namespace probefs::events;

namespace {

inline void keep(const void* p) { asm volatile("" : : "r"(p) : "memory"); }

// The agent's SIGSEGV/SIGBUS handler does this first (arch/safe_copy.h).
void on_fault(int sig, siginfo_t*, void* uc) {
  if (arch::safe_copy_fixup(uc)) return;
  signal(sig, SIG_DFL);
  raise(sig);
}

uint64_t now_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

// Best of several runs of `iters` calls, in ns per call.
template <class F>
double measure(F&& f, uint64_t iters) {
  double best = 1e30;
  for (int run = 0; run < 7; ++run) {
    uint64_t t0 = now_ns();
    for (uint64_t i = 0; i < iters; ++i) f(i);
    double ns = static_cast<double>(now_ns() - t0) / static_cast<double>(iters);
    if (ns < best) best = ns;
  }
  return best;
}

// Reads this process's memory directly: only for memory known to be mapped. It shows
// the interpreter's cost without the system call.
struct InProcessReader {
  bool read(uint64_t addr, void* dst, size_t n) const {
    const auto* s = reinterpret_cast<const uint8_t*>(addr);
    auto* d = static_cast<uint8_t*>(dst);
    switch (n) {
      case 1: __builtin_memcpy(d, s, 1); return true;
      case 2: __builtin_memcpy(d, s, 2); return true;
      case 4: __builtin_memcpy(d, s, 4); return true;
      case 8: __builtin_memcpy(d, s, 8); return true;
      default:
        for (size_t i = 0; i < n; ++i) d[i] = s[i];
        return true;
    }
  }
  long read_string(uint64_t addr, char* dst, size_t cap) const {
    const char* s = reinterpret_cast<const char*>(addr);
    for (size_t i = 0; i < cap; ++i) {
      dst[i] = s[i];
      if (!s[i]) return static_cast<long>(i) + 1;
    }
    dst[cap - 1] = 0;
    return static_cast<long>(cap);
  }
};

CompiledEvent compile_or_die(const std::string& line) {
  ParseResult r = parse_dynamic_command(line);
  CompiledEvent ev;
  Diagnostic err;
  if (r.status != ParseStatus::kDefine || !compile(r.def, nullptr, &ev, &err)) {
    std::fprintf(stderr, "bench: cannot compile %s\n", line.c_str());
    std::exit(1);
  }
  return ev;
}

struct Row {
  const char* name;
  double value;
  double baseline;
  const char* unit;
  const char* target;
};

void print_table(const Row* rows, int n) {
  std::printf("%-44s %12s %12s %8s   %s\n", "case", "value", "baseline", "ratio", "target");
  for (int i = 0; i < n; ++i) {
    const Row& r = rows[i];
    char v[32], b[32];
    std::snprintf(v, sizeof v, "%.2f %s", r.value, r.unit);
    std::snprintf(b, sizeof b, "%.2f %s", r.baseline, r.unit);
    std::printf("%-44s %12s %12s %8.2f   %s\n", r.name, v, b, r.value / r.baseline, r.target);
  }
}

}  // namespace

int main() {
  const uint64_t kIters = 5000000;
  alignas(64) static uint8_t rec[8192];
  PtRegs regs{};
  regs.di = 0x1234;
  regs.si = 0x5678;
  HitContext ctx;
  ctx.regs = &regs;
  ctx.ip = 0x401370;
  ctx.pid = 4242;
  ctx.comm = "bench";
  InProcessReader direct;

  // 1. Two register arguments.
  CompiledEvent two = compile_or_die("p:b/two /bin/true:0x1370 a=%di b=%si:u32");
  ProgramView two_v = view_of(two.program);
  double fetch2 = measure(
      [&](uint64_t i) {
        regs.di = i;
        keep(&regs);
        uint32_t n = write_record(two_v, ctx, direct, rec, sizeof rec);
        keep(rec + n);
      },
      kIters);
  // Baseline: the same record written by hand.
  double fetch2_base = measure(
      [&](uint64_t i) {
        regs.di = i;
        keep(&regs);
        uint16_t id = ctx.event_id;
        __builtin_memcpy(rec, &id, 2);
        rec[2] = rec[3] = 0;
        __builtin_memcpy(rec + 4, &ctx.pid, 4);
        __builtin_memcpy(rec + 8, &ctx.ip, 8);
        __builtin_memcpy(rec + 16, &regs.di, 8);
        uint32_t b = static_cast<uint32_t>(regs.si);
        __builtin_memcpy(rec + 24, &b, 4);
        keep(rec + 28);
      },
      kIters);

  // 2. One string argument (a 16-byte string).
  static const char kStr[] = "hello-from-bench";
  regs.di = reinterpret_cast<uint64_t>(kStr);
  CompiledEvent str = compile_or_die("p:b/str /bin/true:0x1370 s=+0(%di):string");
  ProgramView str_v = view_of(str.program);
  double fetch_s = measure(
      [&](uint64_t) {
        keep(&regs);
        uint32_t n = write_record(str_v, ctx, direct, rec, sizeof rec);
        keep(rec + n);
      },
      kIters);
  double fetch_s_base = measure(
      [&](uint64_t) {
        keep(&regs);
        uint16_t id = ctx.event_id;
        __builtin_memcpy(rec, &id, 2);
        rec[2] = rec[3] = 0;
        __builtin_memcpy(rec + 4, &ctx.pid, 4);
        __builtin_memcpy(rec + 8, &ctx.ip, 8);
        const char* s = reinterpret_cast<const char*>(regs.di);
        uint32_t k = 0;
        for (; s[k]; ++k) rec[20 + k] = static_cast<uint8_t>(s[k]);
        rec[20 + k] = 0;
        uint32_t loc = ((k + 1) << 16) | 20;
        __builtin_memcpy(rec + 16, &loc, 4);
        keep(rec + 20 + k);
      },
      kIters);
  struct sigaction sa {};
  sa.sa_sigaction = on_fault;
  sa.sa_flags = SA_SIGINFO | SA_NODEFER;
  sigaction(SIGSEGV, &sa, nullptr);
  sigaction(SIGBUS, &sa, nullptr);
  FaultTolerantReader tolerant;
  double fetch_ft = measure(
      [&](uint64_t) {
        keep(&regs);
        uint32_t n = write_record(str_v, ctx, tolerant, rec, sizeof rec);
        keep(rec + n);
      },
      kIters);
  LiveMemoryReader live = LiveMemoryReader::for_self();
  const uint64_t kLiveIters = 200000;
  double fetch_live = measure(
      [&](uint64_t) {
        keep(&regs);
        uint32_t n = write_record(str_v, ctx, live, rec, sizeof rec);
        keep(rec + n);
      },
      kLiveIters);
  // Baseline for the live reader: the bare system call reading the same 16 bytes.
  double syscall_base = measure(
      [&](uint64_t) {
        live.read(reinterpret_cast<uint64_t>(kStr), rec + 20, 16);
        keep(rec);
      },
      kLiveIters);

  // 3. Formatting a trace line (the captured ref_add3 event).
  CompiledEvent add3 = compile_or_die(
      "p:uprobes/ref_add3 /bin/true:0x1370 a=%di b=%si:u32 c=%dx:s32 cx=%dx:x16 c64=%dx:s64 "
      "imm=\\123");
  regs.di = 2;
  regs.si = 20;
  regs.dx = 0xfffffffbu;
  ctx.ip = 0x55ded62af370;
  uint8_t add3_rec[256];
  uint32_t add3_len = write_record(view_of(add3.program), ctx, direct, add3_rec, sizeof add3_rec);
  std::string out;
  out.reserve(1 << 20);
  const uint64_t kLines = 2000000;
  double fmt_ns = measure(
      [&](uint64_t i) {
        if (out.size() > (1 << 19)) out.clear();
        LineContext lc{"probetest", 5455, 1, 426361158000ull + i * 1000};
        format_trace_line(out, add3, lc, add3_rec, add3_len);
        keep(out.data());
      },
      kLines);
  char buf[1024];
  double snprintf_ns = measure(
      [&](uint64_t i) {
        uint64_t us = (426361158000ull + i * 1000 + 500) / 1000;
        int n = std::snprintf(
            buf, sizeof buf,
            "%16s-%-7d [%03d] %5s %5lu.%06lu: %s: (0x%lx) a=0x%llx b=%u c=%d cx=0x%x c64=%lld "
            "imm=0x%llx\n",
            "probetest", 5455, 1, ".....", static_cast<unsigned long>(us / 1000000),
            static_cast<unsigned long>(us % 1000000), "ref_add3", 0x55ded62af370ul, 2ull, 20u,
            -5, 0xfffbu, 4294967291ll, 0x7bull);
        keep(buf + n);
      },
      kLines);

  // 4. A long line: the captured ref_mix event (strings, arrays, chars; ~350 bytes).
  CompiledEvent mix = compile_or_die(
      "p:uprobes/ref_mix /bin/true:0x1380 x=%di:s64 str=+0(%si):string name=+4(%dx):string "
      "ustr=+0(%si):ustring bytes=+16(%dx):u8[4] xb=+16(%dx):x8[4] sb=+16(%dx):s8[4] "
      "flags=+0(%dx):x32 bf=+0(%dx):b4@2/32 bf8=+0(%dx):b4@4/8 big=+24(%dx):s64 st=$stack "
      "st0=$stack0 st1=$stack1 comm=$comm cnt=@+0x4038:s32 cntx=@+0x4038:x32 ch=+4(%dx):char "
      "chs=+4(%dx):char[3] gmsg=+0(@+0x4040):string");
  static uint8_t st[40] = {0xc3, 0xa5, 0, 0, 'r', 'e', 'c', 'n', 'a', 'm', 'e', 0,
                           0,    0,    0, 0, 1,   2,   254, 255};
  int64_t big = -1234567890123;
  std::memcpy(st + 24, &big, 8);
  static const char kHello[] = "hello-1";
  static const char kGmsg[] = "global-msg";
  static uint64_t stack[2] = {0x55ded62af17b, 0};
  static struct {
    int32_t counter = 4661;
    int32_t pad = 0;
    const char* msg = kGmsg;
  } globals;
  regs.di = 101;
  regs.si = reinterpret_cast<uint64_t>(kHello);
  regs.dx = reinterpret_cast<uint64_t>(st);
  regs.sp = reinterpret_cast<uint64_t>(stack);
  ctx.ip = reinterpret_cast<uint64_t>(&globals) - 0x4038 + 0x1380;
  uint8_t mix_rec[1024];
  uint32_t mix_len = write_record(view_of(mix.program), ctx, direct, mix_rec, sizeof mix_rec);
  double mix_ns = measure(
      [&](uint64_t i) {
        if (out.size() > (1 << 19)) out.clear();
        LineContext lc{"probetest", 5455, 1, 426361180000ull + i * 1000};
        format_trace_line(out, mix, lc, mix_rec, mix_len);
        keep(out.data());
      },
      kLines);
  double mix_snprintf = measure(
      [&](uint64_t i) {
        uint64_t us = (426361180000ull + i * 1000 + 500) / 1000;
        int n = std::snprintf(
            buf, sizeof buf,
            "%16s-%-7d [%03d] %5s %5lu.%06lu: %s: (0x%lx) x=%lld str=\"%s\" name=\"%s\" "
            "ustr=\"%s\" bytes={%u,%u,%u,%u} xb={0x%x,0x%x,0x%x,0x%x} sb={%d,%d,%d,%d} "
            "flags=0x%x bf=%u bf8=%u big=%lld st=0x%llx st0=0x%llx st1=0x%llx comm=\"%s\" "
            "cnt=%d cntx=0x%x ch='%c' chs={'%c','%c','%c'} gmsg=\"%s\"\n",
            "probetest", 5455, 1, ".....", static_cast<unsigned long>(us / 1000000),
            static_cast<unsigned long>(us % 1000000), "ref_mix", 0x55ded62af380ul, 101ll,
            "hello-1", "recname", "hello-1", 1u, 2u, 254u, 255u, 1u, 2u, 0xfeu, 0xffu, 1, 2, -2,
            -1, 0xa5c3u, 0u, 12u, -1234567890123ll, 0x7ffe9dda2b18ull, 0x55ded62af17bull, 0ull,
            "probetest", 4661, 0x1235u, 'r', 'r', 'e', 'c', "global-msg");
        keep(buf + n);
      },
      kLines);

  // 5. A filter on a record before commit: "b >= 20 && c == -5" on ref_add3.
  CompiledFilter flt;
  Diagnostic ferr;
  if (!compile_filter("b >= 20 && c == -5", add3, &flt, &ferr)) return 1;
  FilterContext fctx{1, "probetest"};
  double filter_ns = measure(
      [&](uint64_t i) {
        add3_rec[24] = static_cast<uint8_t>(i);
        keep(add3_rec);
        bool r = filter_match(flt, add3_rec, add3_len, fctx);
        keep(&r);
      },
      kIters);
  double filter_base = measure(
      [&](uint64_t i) {
        add3_rec[24] = static_cast<uint8_t>(i);
        keep(add3_rec);
        uint32_t b;
        int32_t c;
        std::memcpy(&b, add3_rec + 24, 4);
        std::memcpy(&c, add3_rec + 28, 4);
        bool r = b >= 20 && c == -5;
        keep(&r);
      },
      kIters);

  std::printf("events benchmark (best of 7 runs; ratio = value / baseline)\n\n");
  Row rows[] = {
      {"fetch: 2 register args (ns/record)", fetch2, fetch2_base, "ns", "<= 5 ns"},
      {"fetch: 1 string arg, in-process reader", fetch_s, fetch_s_base, "ns", "<= 30 ns"},
      {"fetch: 1 string arg, FaultTolerantReader", fetch_ft, fetch_s_base, "ns", "<= 30 ns"},
      {"fetch: 1 string arg, LiveMemoryReader", fetch_live, syscall_base, "ns",
       "(baseline: one process_vm_readv)"},
      {"format: ref_add3 trace line (ns/line)", fmt_ns, snprintf_ns, "ns",
       ">= 5 M lines/s (<= 200 ns)"},
      {"format: ref_mix trace line, 350 B (ns/line)", mix_ns, mix_snprintf, "ns",
       "(long line; baseline snprintf)"},
      {"filter: 2 predicates on a record", filter_ns, filter_base, "ns",
       "(baseline: the same test hand-written)"},
  };
  print_table(rows, 7);
  std::printf("\nformat throughput: ref_add3 %.2f M lines/s (snprintf %.2f), "
              "ref_mix %.2f M lines/s (snprintf %.2f)\n",
              1000.0 / fmt_ns, 1000.0 / snprintf_ns, 1000.0 / mix_ns, 1000.0 / mix_snprintf);
  // A check that the benchmark formats what the captures show.
  std::string check;
  format_trace_line(check, mix, LineContext{"probetest", 5455, 1, 426361180000ull}, mix_rec,
                    mix_len);
  std::printf("sample: %s", check.c_str());
  return 0;
}
