// Event hits in another process, end to end: the traced program (bench_target) times its
// own loop, and each figure is (loop with the events enabled - the same loop with none) per
// call, from the same run, while a consumer thread drains the rings as the daemon does.
// Beside each, the kernel's own uprobe event on the same function with the same fetch
// arguments (a private tracefs instance; root only), each request to the kernel's tracefs
// bounded in time: a kernel that does not answer leaves "kernel tracefs not answering" in
// the column (bench/common/kernel_uprobe.h).
//
//   event 2 args   p: bench_add a=%di b=%si                (optimized entry, ring record)
//   entry+return   the above and r: bench_add rv=$retval
//   string arg     p: bench_str s=+0(%di):string
//   histogram      p: bench_add a=%di b=%si with hist:keys=b,a.log2:vals=a, counted in the
//                  target: the event only aggregates (soft mode), no ring record
//   latency        the entry and return events of bench_add as README's latency walk sets
//                  them: ts0=common_timestamp on entry, lat=common_timestamp-$ts0 and
//                  onmatch(...).lat($lat) on return, hist:keys=lat.log2 on the synthetic
//                  event; no ring record
//   stack key      p: bench_add a=%di with hist:keys=common_stacktrace, bench_add called
//                  under 15 frames (a stack of depth 16), against the same loop untraced
//   ring           records consumed per second while the 2-args loop runs, and lost
//   attach         a running program until its first event is read, median of 5
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "bench/common/kernel_uprobe.h"
#include "events/compile.h"
#include "events/parse.h"
#include "tracee/probe_places.h"
#include "tracee/tracer.h"

namespace {

using namespace probefs;
using Clock = std::chrono::steady_clock;

std::string g_target;  // bench_target's path

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Runs `fn` and returns what the child printed on stdout.
std::string read_all(int fd) {
  std::string out;
  char b[4096];
  ssize_t n;
  while ((n = read(fd, b, sizeof b)) > 0) out.append(b, static_cast<size_t>(n));
  return out;
}

std::vector<double> ns_per_call_of(const std::string& out) {
  std::vector<double> v;
  size_t at = 0;
  while ((at = out.find("ns_per_call=", at)) != std::string::npos) {
    at += 12;
    v.push_back(std::strtod(out.c_str() + at, nullptr));
  }
  return v;
}

// Drains every record while it runs; counts them.
class Drain {
 public:
  explicit Drain(tracee::Tracer& t) : t_(t), th_([this] { run(); }) {}
  ~Drain() { stop(); }
  void stop() {
    if (!th_.joinable()) return;
    stop_ = true;
    t_.interrupt_wait();
    th_.join();
    // What is left after the target ended.
    tracee::TraceRecord r;
    while (t_.next_record(&r)) count(r);
  }
  uint64_t records() const { return records_; }
  uint64_t lost() const { return lost_; }
  double seconds_busy() const { return busy_s_; }

 private:
  void count(const tracee::TraceRecord& r) {
    ++records_;
    lost_ += r.lost_before;
  }
  void run() {
    while (!stop_) {
      bool any = false;
      auto t0 = Clock::now();
      while (t_.consume_records([this](const tracee::TraceRecord& r) { count(r); return true; },
                                4096) != 0)
        any = true;
      if (any) busy_s_ += std::chrono::duration<double>(Clock::now() - t0).count();
      else t_.wait_for_records(50);
    }
  }
  tracee::Tracer& t_;
  std::atomic<bool> stop_{false};
  uint64_t records_ = 0;
  uint64_t lost_ = 0;
  double busy_s_ = 0;
  std::thread th_;
};

bool define(tracee::Tracer& t, const std::string& line, uint16_t id, tracee::ProbeId* pid) {
  events::ParseResult r = events::parse_dynamic_command(line);
  if (r.status != events::ParseStatus::kDefine) {
    std::fprintf(stderr, "bad definition: %s\n", line.c_str());
    return false;
  }
  tracee::ProbeSpec spec;
  spec.def = r.def;
  events::Diagnostic d;
  if (!events::compile(spec.def, {}, &spec.compiled, &d)) return false;
  spec.event_id = id;
  spec.enabled = true;
  int err = t.define_probe(spec, pid, &d);
  if (err != 0) std::fprintf(stderr, "define %s: %d %s\n", line.c_str(), err, std::string(d.message()).c_str());
  return err == 0;
}

struct Run {
  std::vector<double> ns;  // per rep
  uint64_t records = 0;
  uint64_t lost = 0;
  double wall_s = 0;
  double busy_s = 0;  // the consumer's time with records to take
};

// hist:keys=b,a.log2:vals=a on the first event (a at 16, b at 24 in its records), the
// event only aggregating.
bool add_hist(tracee::Tracer& t, tracee::ProbeId probe) {
  events::HistGeometry g;
  g.key_bytes = 16;
  g.nvals = 1;
  uint32_t slot = 0;
  if (t.create_hist(g, &slot) != 0) return false;
  events::HistProgram p;
  p.slot = slot;
  p.nkeys = 2;
  p.keys[0].offset = 24;
  p.keys[1].offset = 16;
  p.keys[1].key_offset = 8;
  p.keys[1].transform = events::HistTransform::kLog2;
  p.nvals = 1;
  p.vals[0].offset = 16;
  return t.set_hists(probe, {p}, {}, 1u) == 0;
}

// hist:keys=common_stacktrace on the first event, the event only aggregating.
bool add_stack_hist(tracee::Tracer& t, tracee::ProbeId probe) {
  events::HistGeometry g;
  g.key_bytes = events::kHistStackBytes;
  uint32_t slot = 0;
  if (t.create_hist(g, &slot) != 0) return false;
  events::HistProgram p;
  p.slot = slot;
  p.nkeys = 1;
  p.keys[0].source = events::HistSource::kStack;
  p.keys[0].key_size = events::kHistStackBytes;
  return t.set_hists(probe, {p}, {}, 1u) == 0;
}

// The latency histogram of bench_add (see the top): the entry's ts0 per thread, the
// return's lat=now-$ts0 and its action, and keys=lat.log2 on synthetic event 300.
bool add_latency(tracee::Tracer& t, tracee::ProbeId entry, tracee::ProbeId ret) {
  events::HistGeometry ge;
  ge.nvars = 1;
  events::HistGeometry gs;
  uint32_t se = 0, ss = 0, sr = 0;
  if (t.create_hist(ge, &se) != 0 || t.create_hist(gs, &ss) != 0 || t.create_hist(ge, &sr) != 0)
    return false;
  events::HistOperand pid;  // common_pid
  pid.offset = 4;
  pid.size = 4;
  pid.is_signed = true;
  events::HistProgram pe;
  pe.slot = se;
  pe.nkeys = 1;
  pe.keys[0] = pid;
  pe.nvars = 1;
  pe.vars[0].a.source = events::HistSource::kTimestamp;
  events::HistProgram ps;
  ps.slot = ss;
  ps.nkeys = 1;
  ps.keys[0].offset = 8;
  ps.keys[0].transform = events::HistTransform::kLog2;
  tracee::Tracer::SynthSpec synth;
  synth.size = 16;
  synth.hists = {ps};
  events::HistProgram pr = pe;
  pr.slot = sr;
  pr.vars[0].op = events::HistOp::kSub;
  pr.vars[0].b.source = events::HistSource::kVarRef;
  pr.nrefs = 1;
  pr.refs[0] = {se, 0, ge};
  pr.action.synth_id = 300;
  pr.action.nparams = 1;
  pr.action.params[0].source = events::HistSource::kVar;
  pr.action.param_offset[0] = 8;
  pr.action.param_size[0] = 8;
  return t.set_hists(entry, {pe}, {}, 1u) == 0 && t.set_synth(300, synth) == 0 &&
         t.set_hists(ret, {pr}, {}, 1u) == 0;
}

enum class Aggregate { kNone, kHist, kLatency, kStack };

// Launches bench_target under the tracer with the events given, drains while it runs.
Run traced_run(const std::vector<std::string>& defs, long n, const char* mode, int reps,
               uint32_t buffer_size_kb = 4096, Aggregate agg = Aggregate::kNone) {
  const bool hist = agg == Aggregate::kHist;
  Run run;
  std::string err;
  tracee::Tracer::Options o;
  o.agent_path = PROBEFS_AGENT_PATH;
  o.buffer_size_kb = buffer_size_kb;
  auto t = tracee::Tracer::create(o, &err);
  if (!t) {
    std::fprintf(stderr, "tracer: %s\n", err.c_str());
    return run;
  }
  uint16_t id = 100;
  // An event given histograms here only aggregates: soft mode (set_hists), soft-disabled.
  for (size_t i = 0; i < defs.size(); ++i) t->set_soft_disabled(static_cast<uint16_t>(id + i), true);
  std::vector<tracee::ProbeId> probes;
  for (const std::string& d : defs) {
    tracee::ProbeId pid;
    if (!define(*t, d, id++, &pid)) return run;
    probes.push_back(pid);
    if (hist && id == 101 && !add_hist(*t, pid)) {
      std::fprintf(stderr, "hist: not set\n");
      return run;
    }
    if (agg == Aggregate::kStack && id == 101 && !add_stack_hist(*t, pid)) {
      std::fprintf(stderr, "stack hist: not set\n");
      return run;
    }
  }
  if (agg == Aggregate::kLatency && (probes.size() != 2 || !add_latency(*t, probes[0], probes[1]))) {
    std::fprintf(stderr, "latency: not set\n");
    return run;
  }
  int out[2];
  if (pipe2(out, O_CLOEXEC) != 0) return run;
  tracee::Tracer::LaunchSpec spec;
  spec.argv = {g_target, std::to_string(n), mode, std::to_string(reps)};
  spec.stdout_fd = out[1];
  pid_t pid = 0;
  auto t0 = Clock::now();
  {
    Drain drain(*t);
    if (t->launch(spec, &pid, &err) != 0) {
      std::fprintf(stderr, "launch: %s\n", err.c_str());
      close(out[0]);
      close(out[1]);
      return run;
    }
    close(out[1]);
    std::string text = read_all(out[0]);
    close(out[0]);
    int st = 0;
    (void)t->wait_exit(pid, 60000, &st);
    run.wall_s = std::chrono::duration<double>(Clock::now() - t0).count();
    drain.stop();
    run.ns = ns_per_call_of(text);
    run.records = drain.records();
    run.lost = drain.lost();
    run.busy_s = drain.seconds_busy();
  }
  return run;
}

// The same program, untraced, with the kernel's uprobe events enabled (or none). At most
// kKernelRunMs: a program that has not ended by then is killed (and not waited for: it
// may sleep in the kernel for good), and its figures are missing.
constexpr int kKernelRunMs = 30000;

std::vector<double> kernel_run(long n, const char* mode, int reps) {
  int out[2];
  if (pipe2(out, O_CLOEXEC) != 0) return {};
  pid_t pid = fork();
  if (pid == 0) {
    dup2(out[1], 1);
    std::string ns = std::to_string(n), rs = std::to_string(reps);
    execl(g_target.c_str(), g_target.c_str(), ns.c_str(), mode, rs.c_str(), nullptr);
    _exit(127);
  }
  close(out[1]);
  std::string text;
  const auto deadline = Clock::now() + std::chrono::milliseconds(kKernelRunMs);
  bool ended = false;
  for (;;) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    pollfd p{out[0], POLLIN, 0};
    if (left <= 0 || poll(&p, 1, static_cast<int>(left)) <= 0) break;
    char b[4096];
    ssize_t k = read(out[0], b, sizeof b);
    if (k <= 0) {
      ended = true;
      break;
    }
    text.append(b, static_cast<size_t>(k));
  }
  close(out[0]);
  if (!ended) {
    kill(pid, SIGKILL);
    return {};
  }
  int st;
  waitpid(pid, &st, 0);
  return ns_per_call_of(text);
}

// bpftrace beside the same function (issue's comparison): `probe` (an action on
// uprobe:TARGET:FUNC) attached first (its BEGIN prints once every probe is attached),
// then the target run as kernel_run() runs it, then bpftrace stopped. Its cost per hit
// against base_ns, or why there is none.
constexpr int kBpftraceStartMs = 60000;
std::string bpftrace_cost(const std::string& probe, long n, const char* mode, int reps,
                          double base_ns) {
  if (access("/usr/bin/bpftrace", X_OK) != 0) return "n/a (no bpftrace)";
  const std::string script = "BEGIN { printf(\"ready\\n\"); } " + probe;
  int out[2];
  if (pipe2(out, O_CLOEXEC) != 0) return "n/a (pipe)";
  const pid_t pid = fork();
  if (pid == 0) {
    dup2(out[1], 1);
    dup2(out[1], 2);
    execl("/usr/bin/bpftrace", "bpftrace", "-e", script.c_str(), nullptr);
    _exit(127);
  }
  close(out[1]);
  std::string text;
  const auto deadline = Clock::now() + std::chrono::milliseconds(kBpftraceStartMs);
  auto read_until = [&](const char* what) {
    while (what == nullptr || text.find(what) == std::string::npos) {
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
      pollfd p{out[0], POLLIN, 0};
      if (left <= 0 || poll(&p, 1, static_cast<int>(left)) <= 0) return false;
      char b[4096];
      const ssize_t k = read(out[0], b, sizeof b);
      if (k <= 0) return what == nullptr;
      text.append(b, static_cast<size_t>(k));
    }
    return true;
  };
  std::string cost;
  if (!read_until("ready\n")) {
    const size_t err = text.find("ERROR");
    cost = "n/a (bpftrace: " + (err == std::string::npos ? std::string("did not start")
                                                          : text.substr(err, text.find('\n', err) - err)) + ")";
  } else {
    std::vector<double> v = kernel_run(n, mode, reps);
    char c[32];
    std::snprintf(c, sizeof c, "%.1f", v.empty() ? 0.0 : median(v) - base_ns);
    cost = v.empty() ? "no figures (killed)" : c;
  }
  kill(pid, SIGINT);
  if (!read_until(nullptr)) kill(pid, SIGKILL);
  close(out[0]);
  int st;
  waitpid(pid, &st, 0);
  return cost;
}

// A row of the kernel's column alone (bpftrace).
void kernel_row(const char* what, const char* kernel_col, const char* note) {
  std::printf("%-28s %10s %10s %10s %28s  %s\n", what, "", "", "", kernel_col, note);
}

void row(const char* what, double ns, double base, const char* kernel_col, const char* note) {
  std::printf("%-28s %10.1f %10.1f %9.1fx %28s  %s\n", what, ns, ns - base,
              base > 0 ? ns / base : 0.0, kernel_col, note);
}

double attach_latency_ms() {
  std::vector<double> v;
  for (int i = 0; i < 5; ++i) {
    int out[2];
    if (pipe2(out, O_CLOEXEC) != 0) break;
    pid_t pid = fork();
    if (pid == 0) {
      dup2(out[1], 1);
      execl(g_target.c_str(), g_target.c_str(), "0", "spin", nullptr);
      _exit(127);
    }
    close(out[1]);
    // The program is in its loop once it says so.
    char line[16] = {0};
    bool spinning = read(out[0], line, sizeof line - 1) > 0;
    std::string err;
    tracee::Tracer::Options o;
    o.agent_path = PROBEFS_AGENT_PATH;
    auto t = tracee::Tracer::create(o, &err);
    tracee::ProbeId id;
    if (spinning && t && define(*t, "p:bench/add bench_target:bench_add a=%di b=%si", 100, &id)) {
      auto t0 = Clock::now();
      if (t->attach(pid, &err) == 0) {
        tracee::TraceRecord r;
        while (!t->next_record(&r) && Clock::now() - t0 < std::chrono::seconds(10))
          t->wait_for_records(10);
        v.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
      } else {
        std::fprintf(stderr, "attach: %s\n", err.c_str());
      }
    }
    t.reset();
    kill(pid, SIGKILL);
    int st;
    waitpid(pid, &st, 0);
    close(out[0]);
  }
  return median(v);
}

}  // namespace

int main(int argc, char** argv) {
  g_target = PROBEFS_BENCH_TARGET;
  const long n = argc > 1 ? std::atol(argv[1]) : 2000000;
  const int reps = 5;
  // `event_bench N one|ret|str [KB]` runs only the 2-args, entry + return or string
  // case, long enough to profile it (perf record -a -g); it prints that case's figures and
  // nothing else. KB sets the ring's size: one that holds every record shows the
  // producer's cost without drops (a dropped record takes a cheaper path), though then
  // each record's first write to a fresh page of the ring counts too.
  if (argc > 2 && (std::string(argv[2]) == "one" || std::string(argv[2]) == "ret" ||
                   std::string(argv[2]) == "str" || std::string(argv[2]) == "hist" ||
                   std::string(argv[2]) == "latency" || std::string(argv[2]) == "stack" ||
                   std::string(argv[2]) == "stacknofp")) {
    const std::string which = argv[2];
    const auto kb = static_cast<uint32_t>(argc > 3 ? std::atol(argv[3]) : 4096);
    std::vector<std::string> defs = {"p:bench/add bench_target:bench_add a=%di b=%si"};
    if (which == "ret" || which == "latency")
      defs.push_back("r:bench/addret bench_target:bench_add rv=$retval");
    if (which == "str") defs = {"p:bench/str bench_target:bench_str s=+0(%di):string"};
    const char* mode = which == "str"       ? "str"
                       : which == "stack"   ? "deep"
                       : which == "stacknofp" ? "deepnofp"
                                            : "add";
    Run b1 = traced_run({}, n, mode, reps, kb);
    const Aggregate agg = which == "hist"      ? Aggregate::kHist
                          : which == "latency" ? Aggregate::kLatency
                          : which == "stack" || which == "stacknofp" ? Aggregate::kStack
                                               : Aggregate::kNone;
    Run e1 = traced_run(defs, n, mode, reps, kb, agg);
    std::printf("%s: baseline %.1f ns/call, with events %.1f ns/call (%.1f ns/hit), records "
                "%llu, lost %llu\n",
                which.c_str(), median(b1.ns), median(e1.ns), median(e1.ns) - median(b1.ns),
                static_cast<unsigned long long>(e1.records),
                static_cast<unsigned long long>(e1.lost));
    return 0;
  }

  Run base = traced_run({}, n, "add", reps);
  Run base_str = traced_run({}, n, "str", reps);
  Run ev2 = traced_run({"p:bench/add bench_target:bench_add a=%di b=%si"}, n, "add", reps);
  Run entret = traced_run({"p:bench/add bench_target:bench_add a=%di b=%si",
                           "r:bench/addret bench_target:bench_add rv=$retval"},
                          n, "add", reps);
  Run str = traced_run({"p:bench/str bench_target:bench_str s=+0(%di):string"}, n, "str", reps);
  Run hist = traced_run({"p:bench/add bench_target:bench_add a=%di b=%si"}, n, "add", reps,
                        4096, Aggregate::kHist);
  Run latency = traced_run({"p:bench/add bench_target:bench_add a=%di b=%si",
                            "r:bench/addret bench_target:bench_add rv=$retval"},
                           n, "add", reps, 4096, Aggregate::kLatency);
  Run base_deep = traced_run({}, n, "deep", reps);
  Run stack = traced_run({"p:bench/add bench_target:bench_add a=%di"}, n, "deep", reps, 4096,
                         Aggregate::kStack);
  Run base_nofp = traced_run({}, n, "deepnofp", reps);
  Run stack_nofp = traced_run({"p:bench/add bench_target:bench_add a=%di"}, n, "deepnofp", reps,
                              4096, Aggregate::kStack);

  // The kernel's uprobes cost microseconds: fewer calls.
  const long kn = std::max(1L, n / 100);
  bench::KernelUprobes k;
  uint64_t add_off = 0, str_off = 0;
  (void)tracee::symbol_file_offset(g_target, "bench_add", &add_off);
  (void)tracee::symbol_file_offset(g_target, "bench_str", &str_off);
  char body[512];
  // A cell the kernel did not fill says why ("kernel tracefs not answering", ...).
  auto kernel_cost = [&](bool added, const char* mode, double base_ns) {
    if (!added) return k.why_not().empty() ? std::string("n/a") : k.why_not();
    std::vector<double> v = kernel_run(kn, mode, reps);
    if (v.empty()) return std::string("no figures (killed)");
    char s[32];
    std::snprintf(s, sizeof s, "%.1f", median(v) - base_ns);
    return std::string(s);
  };
  std::snprintf(body, sizeof body, "%s:0x%llx a=%%di b=%%si", g_target.c_str(),
                static_cast<unsigned long long>(add_off));
  const std::string k_ev2 = kernel_cost(k.add("kadd", false, body), "add", median(base.ns));
  std::snprintf(body, sizeof body, "%s:0x%llx rv=$retval", g_target.c_str(),
                static_cast<unsigned long long>(add_off));
  const std::string k_entret =
      kernel_cost(k.available() && k.add("kaddret", true, body), "add", median(base.ns));
  k.clear();
  std::snprintf(body, sizeof body, "%s:0x%llx s=+0(%%di):string", g_target.c_str(),
                static_cast<unsigned long long>(str_off));
  const std::string k_str =
      kernel_cost(k.available() && k.add("kstr", false, body), "str", median(base_str.ns));
  k.clear();
  const std::string uprobe = "uprobe:" + g_target + ":bench_add ";
  const std::string bt_count =
      bpftrace_cost(uprobe + "{ @[arg1] = count(); }", kn, "add", reps, median(base.ns));
  const std::string bt_stack =
      bpftrace_cost(uprobe + "{ @[ustack] = count(); }", kn, "deep", reps, median(base_deep.ns));

  const double b = median(base.ns), bs = median(base_str.ns);
  std::printf("probefs events in another process: %ld calls x %d reps, medians\n", n, reps);
  std::printf("%-28s %10s %10s %10s %28s\n", "", "ns/call", "ns/hit", "ratio", "kernel uprobe ns/hit");
  row("baseline (no event)", b, b, "", "bench_add loop, same run");
  row("event, 2 args (budget 25)", median(ev2.ns), b, k_ev2.c_str(), "");
  row("entry + return (budget 50)", median(entret.ns), b, k_entret.c_str(), "");
  row("baseline (string loop)", bs, bs, "", "bench_str loop");
  row("string arg (budget 50)", median(str.ns), bs, k_str.c_str(), "");
  row("hist 2 keys 1 val (budget 20)", median(hist.ns), b, "", "no ring record");
  kernel_row("  bpftrace @[arg1] = count()", bt_count.c_str(), "bpftrace, same function");
  row("latency hist (entry+return)", median(latency.ns), b, k_entret.c_str(),
      "ts0, lat, onmatch, lat.log2");
  const double bd = median(base_deep.ns);
  row("baseline (15 frames deep)", bd, bd, "", "bench_deep loop");
  row("stack key, depth 16 (b. 300)", median(stack.ns), bd, "", "frame pointers, no record");
  kernel_row("  bpftrace @[ustack] = count()", bt_stack.c_str(), "bpftrace, same function");
  const double bn = median(base_nofp.ns);
  row("baseline (15 frames, no fp)", bn, bn, "", "bench_deep_nofp loop");
  row("stack key, depth 16, no fp", median(stack_nofp.ns), bn, "", "unwind tables, no record");
  const double expected = static_cast<double>(n) * reps;
  std::printf("\nrecords: 2 args %llu of %.0f (lost %llu), entry+return %llu of %.0f (lost %llu), "
              "string %llu of %.0f (lost %llu)\n",
              static_cast<unsigned long long>(ev2.records), expected,
              static_cast<unsigned long long>(ev2.lost),
              static_cast<unsigned long long>(entret.records), 2 * expected,
              static_cast<unsigned long long>(entret.lost),
              static_cast<unsigned long long>(str.records), expected,
              static_cast<unsigned long long>(str.lost));
  if (ev2.busy_s > 0)
    std::printf("ring: one hot thread into the ring, the daemon's consumer drains %.1f M "
                "records/s while it has records (budget >= 20); the program wrote one "
                "every %.1f ns\n",
                ev2.records / ev2.busy_s / 1e6, median(ev2.ns));
  std::printf("attach to a running program until its first event is read: %.1f ms (budget 200)\n",
              attach_latency_ms());
  return 0;
}
