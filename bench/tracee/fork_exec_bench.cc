// What a traced process pays per fork and per exec: a shell loop that forks (subshells)
// or forks and execs (/bin/true) N times, launched untraced (the baseline, same run) and
// launched by the tracer with ten events on libc (malloc, free, openat, ... : defined,
// enabled, placed in every child and new image), each the median of 3 runs. Every new
// image and fork child joins as a target of its own (ring area, SETUP, the events, GO).
//
//   row      what the shell does N times                    budget (issue: fork and exec)
//   fork     ( : )            a fork child that exits      <= 1 ms added per fork
//   exec     /bin/true        a fork and an exec            <= 2 ms added per exec
//   build    make -j2 of 200 generated C files (gcc, cc1, as, ld: thousands of forks and
//            execs, malloc-heavy)                           <= 1.3 x plain
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "events/compile.h"
#include "events/parse.h"
#include "tracee/tracer.h"

namespace {

using namespace probefs;
using Clock = std::chrono::steady_clock;

constexpr int kRuns = 3;
constexpr long kLoops = 100;

const char* const kEvents[] = {
    "p:b/malloc libc:malloc size=%di",  "p:b/free libc:free p=%di",
    "p:b/calloc libc:calloc n=%di",     "p:b/realloc libc:realloc p=%di",
    "p:b/openat libc:openat path=+0(%si):string", "p:b/close libc:close fd=%di",
    "p:b/read libc:read fd=%di",        "p:b/write libc:write fd=%di",
    "p:b/getenv libc:getenv name=+0(%di):string", "r:b/mallocr libc:malloc p=$retval",
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

std::vector<std::string> shell_loop(const std::string& body) {
  return {"/bin/sh", "-c", "i=0; while [ $i -lt " + std::to_string(kLoops) + " ]; do " + body +
                               "; i=$((i+1)); done"};
}

// Seconds the loop took, untraced: fork, exec, wait.
double plain_run(const std::vector<std::string>& argv) {
  const auto t0 = Clock::now();
  const pid_t pid = fork();
  if (pid == 0) {
    std::vector<char*> a;
    for (const std::string& s : argv) a.push_back(const_cast<char*>(s.c_str()));
    a.push_back(nullptr);
    execv(a[0], a.data());
    _exit(127);
  }
  int st = 0;
  waitpid(pid, &st, 0);
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Seconds the loop took, launched by `t` (its events placed in every child and image).
double traced_run(tracee::Tracer& t, const std::vector<std::string>& argv) {
  tracee::Tracer::LaunchSpec spec;
  spec.argv = argv;
  std::string err;
  pid_t pid = 0;
  const auto t0 = Clock::now();
  if (t.launch(spec, &pid, &err) != 0) {
    std::fprintf(stderr, "launch: %s\n", err.c_str());
    return 0;
  }
  int st = 0;
  (void)t.wait_exit(pid, 120000, &st);
  const double s = std::chrono::duration<double>(Clock::now() - t0).count();
  while (t.consume_records([](const tracee::TraceRecord&) { return true; }, 1 << 16) != 0) {
  }
  return s;
}

// A directory with kFiles small C files and a Makefile that compiles and links them: the
// parallel build of the budget. Empty on failure.
constexpr int kFiles = 200;
std::string make_project() {
  char dir[] = "/tmp/probefs-bench-build-XXXXXX";
  if (!mkdtemp(dir)) return {};
  std::ofstream mk(std::string(dir) + "/Makefile");
  mk << "OBJS :=";
  for (int i = 0; i < kFiles; ++i) mk << " f" << i << ".o";
  mk << "\nprog: $(OBJS) main.o\n\t$(CC) -o $@ $^\n%.o: %.c\n\t$(CC) -O1 -c -o $@ $<\n";
  for (int i = 0; i < kFiles; ++i) {
    std::ofstream c(std::string(dir) + "/f" + std::to_string(i) + ".c");
    c << "#include <stdio.h>\n#include <string.h>\n"
      << "struct s" << i << " { int a[16]; char name[32]; };\n"
      << "int f" << i << "(int n) {\n  struct s" << i << " v;\n  memset(&v, 0, sizeof v);\n"
      << "  for (int k = 0; k < n; ++k) v.a[k % 16] += k * " << i + 1 << ";\n"
      << "  snprintf(v.name, sizeof v.name, \"f%d\", n);\n  return v.a[n % 16] + (int)strlen(v.name);\n}\n";
  }
  std::ofstream m(std::string(dir) + "/main.c");
  for (int i = 0; i < kFiles; ++i) m << "int f" << i << "(int);\n";
  m << "int main(void) {\n  int s = 0;\n";
  for (int i = 0; i < kFiles; ++i) m << "  s += f" << i << "(" << i << ");\n";
  m << "  return s == 0;\n}\n";
  return dir;
}

bool define_events(tracee::Tracer& t) {
  uint16_t id = 100;
  for (const char* line : kEvents) {
    events::ParseResult r = events::parse_dynamic_command(line);
    tracee::ProbeSpec spec;
    spec.def = r.def;
    events::Diagnostic d;
    if (r.status != events::ParseStatus::kDefine || !events::compile(spec.def, {}, &spec.compiled, &d))
      return false;
    spec.event_id = id++;
    spec.enabled = true;
    tracee::ProbeId pid;
    if (int err = t.define_probe(spec, &pid, &d); err != 0) {
      std::fprintf(stderr, "define %s: %d\n", line, err);
      return false;
    }
  }
  return true;
}

}  // namespace

int main() {
  tracee::Tracer::Options o;
  o.agent_path = PROBEFS_AGENT_PATH;
  o.buffer_size_kb = 64;
  std::string err;
  auto t = tracee::Tracer::create(o, &err);
  if (!t) {
    std::fprintf(stderr, "tracer: %s\n", err.c_str());
    return 1;
  }
  if (!define_events(*t)) return 1;
  const std::string project = make_project();
  if (project.empty()) return 1;
  struct Row {
    const char* name;
    const char* what;
    std::vector<std::string> argv;
    long ops;  // per row: ms/op = run time / ops
    const char* budget;
  } rows[] = {
      {"fork", "( : )     a fork child that exits", shell_loop("( : )"), kLoops, "+1 ms"},
      {"exec", "/bin/true a fork and an exec", shell_loop("/bin/true"), kLoops, "+2 ms"},
      {"build", "make -j2, 200 C files (ms/build)",
       {"/usr/bin/make", "-s", "-B", "-j2", "-C", project}, 1, "1.3 x"},
  };
  std::printf("fork and exec under probefs, 10 events on libc; %ld loops, median of %d runs\n\n",
              kLoops, kRuns);
  std::printf("%-5s %-34s %12s %12s %12s %8s %8s\n", "row", "what", "plain ms/op",
              "traced ms/op", "added ms/op", "x plain", "budget");
  for (const Row& r : rows) {
    std::vector<double> plain, traced;
    for (int i = 0; i < kRuns; ++i) {
      plain.push_back(plain_run(r.argv));
      traced.push_back(traced_run(*t, r.argv));
    }
    const double p = median(plain) * 1e3 / r.ops, q = median(traced) * 1e3 / r.ops;
    std::printf("%-5s %-34s %12.2f %12.2f %12.2f %8.2f %8s\n", r.name, r.what, p, q, q - p,
                p > 0 ? q / p : 0, r.budget);
  }
  (void)std::system(("rm -rf '" + project + "'").c_str());
  return 0;
}
