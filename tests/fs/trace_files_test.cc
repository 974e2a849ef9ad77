// The trace files without a mount: a Tracer with the real agent, a Tracefs over it, probes
// defined straight through the tracer (the definition files are not involved), the
// bundled traced_prog run, and every file read and written through Tree::open().
#include "fs/trace_files.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sched.h>
#include <sys/wait.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <future>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "events/compile.h"
#include "events/output.h"
#include "events/parse.h"
#include "fs/tracefs.h"
#include "tests/fs/trace_files_test_util.h"
#include "tracee/probe_places.h"
#include "tracee/tracer.h"

namespace probefs::fs {
namespace {

using testing::KillOnExit;
using testing::ProgramPipes;

const std::string kProg = PROBEFS_TRACED_PROG;
const std::string kProgName = kProg.substr(kProg.rfind('/') + 1);
const std::string kComm = kProgName.substr(0, 15);
constexpr auto kBound = std::chrono::seconds(20);

long sum_calls(long n) { return 3 * (n * (n - 1) / 2); }

std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> out;
  size_t at = 0;
  while (at < text.size()) {
    size_t nl = text.find('\n', at);
    if (nl == std::string::npos) nl = text.size();
    out.push_back(text.substr(at, nl - at));
    at = nl + 1;
  }
  return out;
}

// The lines after the header.
std::vector<std::string> body(const std::string& text) {
  std::vector<std::string> out;
  for (std::string& l : split_lines(text))
    if (l.empty() || l[0] != '#') out.push_back(std::move(l));
  return out;
}

std::string join(const std::vector<std::string>& lines) {
  std::string s;
  for (const std::string& l : lines) s += l + "\n";
  return s;
}

std::string header_line(const std::string& text) {
  for (const std::string& l : split_lines(text))
    if (l.rfind("# entries-in-buffer", 0) == 0) return l;
  return "";
}

// The fields of an `add` line: "%16s-%-7d [%03d] FLAGS %5lu.%06lu: add: (0x%lx) a=0x%lx
// b=0x%lx".
struct AddLine {
  int pid = -1;
  unsigned cpu = 0;
  std::string flags;
  unsigned long sec = 0, usec = 0, ip = 0, a = 0, b = 0;
};

bool parse_add(const std::string& l, AddLine* out) {
  if (l.size() < 52) return false;
  char flags[8] = {};
  int n = sscanf(l.c_str() + 17, "%d [%u] %5c %lu.%lu: add: (0x%lx) a=0x%lx b=0x%lx", &out->pid,
                 &out->cpu, flags, &out->sec, &out->usec, &out->ip, &out->a, &out->b);
  out->flags = flags;
  return n == 8;
}

// The line as the kernel lays it out, from its values.
std::string add_line(const std::string& comm, const AddLine& v) {
  char buf[512];
  snprintf(buf, sizeof buf, "%16s-%-7d [%03u] %s %5lu.%06lu: add: (0x%lx) a=0x%lx b=0x%lx",
           comm.c_str(), v.pid, v.cpu, v.flags.c_str(), v.sec, v.usec, v.ip, v.a, v.b);
  return buf;
}

class TraceFilesTest : public testing::TracedProgramTest {
 protected:
  // The whole file from offset 0, `chunk` bytes a read.
  std::string read_file(const std::string& path, size_t chunk = 4096) {
    auto h = open(path, O_RDONLY);
    if (!h) return "";
    Request rq;
    std::string all, part;
    for (uint64_t off = 0;; off += part.size()) {
      EXPECT_EQ(h->read(rq, off, chunk, &part), 0);
      if (part.empty()) return all;
      all += part;
    }
  }

  std::string drain_text(const std::string& path) {
    std::string s;
    for (const std::string& r : drain(path)) s += r;
    return s;
  }
};

// A blocking read in another thread; `blocked` is set when it first asks whether it was
// interrupted, which it does only when it is about to wait.
struct BlockedRead {
  std::atomic<bool> interrupt{false};
  std::promise<void> blocked;
  std::atomic<bool> told{false};
  std::string text;
  std::future<int> result;

  void start(Handle& h, size_t size = 1 << 20) {
    result = std::async(std::launch::async, [this, &h, size] {
      Request rq;
      rq.flags = O_RDONLY;
      rq.interrupted = [this] {
        if (!told.exchange(true)) blocked.set_value();
        return interrupt.load();
      };
      return h.read(rq, 0, size, &text);
    });
  }
  bool wait_blocked() { return blocked.get_future().wait_for(kBound) == std::future_status::ready; }
  // Whether the read returned in time; if not, the mount's end releases it (so that the
  // test fails rather than hangs).
  bool done(Tracefs& fs) {
    if (result.wait_for(kBound) == std::future_status::ready) return true;
    interrupt = true;
    fs.shutdown();
    return false;
  }
};

TEST_F(TraceFilesTest, FilesHaveTheKernelsModes) {
  const std::map<std::string, mode_t> want = {
      {"trace", 0640},           {"trace_pipe", 0440},          {"tracing_on", 0640},
      {"trace_marker", 0220},    {"trace_clock", 0640},         {"buffer_size_kb", 0640},
      {"buffer_total_size_kb", 0440}, {"current_tracer", 0640}, {"available_tracers", 0440},
      {"saved_cmdlines", 0440},  {"saved_cmdlines_size", 0640}, {"options", 0750},
      {"options/context-info", 0640}, {"options/irq-info", 0640}, {"options/markers", 0640},
      {"options/record-tgid", 0640}, {"per_cpu", 0750},         {"per_cpu/cpu0", 0750},
      {"per_cpu/cpu0/trace", 0640}, {"per_cpu/cpu0/trace_pipe", 0440},
      {"per_cpu/cpu0/stats", 0440},
  };
  for (const auto& [path, mode] : want) {
    NodePtr n = fs_->tree().walk(path);
    ASSERT_NE(n, nullptr) << path;
    EXPECT_EQ(n->mode(), mode) << path;
  }
  for (int cpu = 0; cpu < fs_->cpus(); ++cpu)
    EXPECT_NE(fs_->tree().walk("per_cpu/cpu" + std::to_string(cpu) + "/trace_pipe"), nullptr);
  EXPECT_EQ(fs_->tree().walk("per_cpu/cpu" + std::to_string(fs_->cpus())), nullptr);
  EXPECT_TRUE(fs_->tree().walk("trace_pipe")->file()->stream());
  EXPECT_TRUE(fs_->tree().walk("per_cpu/cpu0/trace_pipe")->file()->stream());
  EXPECT_FALSE(fs_->tree().walk("trace")->file()->stream());
  EXPECT_EQ(read_file("current_tracer"), "nop\n");
  EXPECT_EQ(read_file("available_tracers"), "nop\n");
  EXPECT_EQ(write("current_tracer", "nop\n"), 4);
  EXPECT_EQ(write("current_tracer", "function"), -EINVAL);
  EXPECT_EQ(write("current_tracer", ""), -EINVAL);
}

TEST_F(TraceFilesTest, TraceHasTheHeaderAndTheKernelsLines) {
  define_add();
  ASSERT_TRUE(launch());
  call(3);
  const std::string text = read_file("trace", 100);
  EXPECT_EQ(text.substr(0, text.find("\n#\n") + 3), "# tracer: nop\n#\n");
  const std::string want_header = events::trace_header(3, 3, fs_->cpus());
  EXPECT_EQ(text.substr(0, want_header.size()), want_header);
  EXPECT_EQ(header_line(text), "# entries-in-buffer/entries-written: 3/3   #P:" +
                                   std::to_string(fs_->cpus()));
  std::vector<std::string> lines = body(text);
  ASSERT_EQ(lines.size(), 3u) << text;
  unsigned long last_us = 0, ip = 0;
  for (size_t i = 0; i < lines.size(); ++i) {
    AddLine v;
    ASSERT_TRUE(parse_add(lines[i], &v)) << lines[i];
    EXPECT_EQ(v.pid, pid_);
    EXPECT_EQ(v.a, i);
    EXPECT_EQ(v.b, 2 * i);
    EXPECT_EQ(v.flags, ".....");
    EXPECT_LT(v.cpu, static_cast<unsigned>(fs_->cpus()));
    EXPECT_GE(v.sec * 1000000 + v.usec, last_us);
    last_us = v.sec * 1000000 + v.usec;
    if (i) {
      EXPECT_EQ(v.ip, ip);
    }
    ip = v.ip;
    // Byte for byte the kernel's layout of those values.
    EXPECT_EQ(lines[i], add_line(kComm, v));
  }
  // trace_pipe's lines are the same bytes.
  EXPECT_EQ(drain_text("trace_pipe"), join(lines));
}

TEST_F(TraceFilesTest, KprobeStyleEventsNameTheFunction) {
  define("p:t/ksym " + kProgName + ":traced_add a=%di");
  ASSERT_TRUE(launch());
  call(1);
  std::vector<std::string> lines = body(read_file("trace"));
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_NE(lines[0].find(": ksym: (traced_add+0x0/0x"), std::string::npos) << lines[0];
  EXPECT_NE(lines[0].find(") a=0x0"), std::string::npos) << lines[0];
}

TEST_F(TraceFilesTest, TraceDoesNotConsumeTracePipeDoes) {
  define_add();
  ASSERT_TRUE(launch());
  call(5);
  const std::vector<std::string> first = body(read_file("trace"));
  ASSERT_EQ(first.size(), 5u);
  EXPECT_EQ(body(read_file("trace", 7)), first);
  EXPECT_EQ(drain_text("trace_pipe"), join(first));
  const std::string after = read_file("trace");
  EXPECT_TRUE(body(after).empty());
  // Consumed records leave both counts, as the kernel's do.
  EXPECT_EQ(header_line(after),
            "# entries-in-buffer/entries-written: 0/0   #P:" + std::to_string(fs_->cpus()));
}

TEST_F(TraceFilesTest, PartialReadsKeepTheRestOfTheLineForTheSameFile) {
  define_add();
  ASSERT_TRUE(launch());
  call(2);
  const std::vector<std::string> lines = body(read_file("trace"));
  ASSERT_EQ(lines.size(), 2u);
  auto h = open("trace_pipe", O_RDONLY | O_NONBLOCK);
  Request rq;
  rq.flags = O_RDONLY | O_NONBLOCK;
  std::string part;
  ASSERT_EQ(h->read(rq, 0, 10, &part), 0);
  EXPECT_EQ(part, lines[0].substr(0, 10));
  ASSERT_EQ(h->read(rq, 0, 10, &part), 0);
  EXPECT_EQ(part, lines[0].substr(10, 10));
  // The rest of the line alone, though more would fit.
  ASSERT_EQ(h->read(rq, 0, 4096, &part), 0);
  EXPECT_EQ(part, lines[0].substr(20) + "\n");
  ASSERT_EQ(h->read(rq, 0, 4096, &part), 0);
  EXPECT_EQ(part, lines[1] + "\n");
  EXPECT_EQ(h->read(rq, 0, 4096, &part), -EAGAIN);

  // Closing the file loses the rest of its line.
  call(1);
  ASSERT_EQ(h->read(rq, 0, 10, &part), 0);
  EXPECT_EQ(part.size(), 10u);
  h.reset();
  EXPECT_TRUE(drain("trace_pipe").empty());
}

TEST_F(TraceFilesTest, PipeReadsAreWholeLinesUpToTheKernelsLimit) {
  define_add();
  ASSERT_TRUE(launch());
  call(2000);
  const std::vector<std::string> lines = body(read_file("trace"));
  ASSERT_EQ(lines.size(), 2000u);
  const std::vector<std::string> reads = drain("trace_pipe");
  std::string all;
  size_t next = 0;  // the first line of the next read
  for (const std::string& r : reads) {
    EXPECT_LE(r.size(), kTracePipeReadMax);
    ASSERT_EQ(r.back(), '\n');
    const size_t n = split_lines(r).size();
    next += n;
    // Whole lines, as many as fit.
    if (next < lines.size()) {
      EXPECT_GT(r.size() + lines[next].size() + 1, kTracePipeReadMax);
    }
    all += r;
  }
  EXPECT_EQ(all, join(lines));

  // A smaller read: lines until it is full, the end of the last one for the next read.
  call(100);
  const std::vector<std::string> more = body(read_file("trace"));
  ASSERT_EQ(more.size(), 100u);
  auto h = open("trace_pipe", O_RDONLY | O_NONBLOCK);
  Request rq;
  rq.flags = O_RDONLY | O_NONBLOCK;
  std::string a, b;
  ASSERT_EQ(h->read(rq, 0, 4096, &a), 0);
  EXPECT_EQ(a.size(), 4096u);
  ASSERT_EQ(h->read(rq, 0, 4096, &b), 0);
  const std::string text = join(more);
  EXPECT_EQ(a + b, text.substr(0, a.size() + b.size()));
  EXPECT_EQ(b.back(), '\n');
  EXPECT_EQ(b.find('\n'), b.size() - 1);  // only what was left of one line
}

TEST_F(TraceFilesTest, EmptyPipeNonblockingIsEagain) {
  define_add();
  ASSERT_TRUE(launch());
  auto h = open("trace_pipe", O_RDONLY | O_NONBLOCK);
  Request rq;
  rq.flags = O_RDONLY | O_NONBLOCK;
  std::string part;
  EXPECT_EQ(h->read(rq, 0, 4096, &part), -EAGAIN);
  EXPECT_FALSE(h->readable());
  auto h1 = open("per_cpu/cpu0/trace_pipe", O_RDONLY | O_NONBLOCK);
  EXPECT_EQ(h1->read(rq, 0, 4096, &part), -EAGAIN);
}

TEST_F(TraceFilesTest, BlockedReadReturnsOnInterruptShutdownAndRecords) {
  define_add();
  ASSERT_TRUE(launch());
  {
    auto h = open("trace_pipe", O_RDONLY);
    BlockedRead r;
    r.start(*h);
    ASSERT_TRUE(r.wait_blocked());
    r.interrupt = true;
    ASSERT_TRUE(r.done(*fs_));
    EXPECT_EQ(r.result.get(), -EINTR);
  }
  {
    auto h = open("trace_pipe", O_RDONLY);
    BlockedRead r;
    r.start(*h);
    ASSERT_TRUE(r.wait_blocked());
    call(1);
    ASSERT_TRUE(r.done(*fs_));
    EXPECT_EQ(r.result.get(), 0);
    std::vector<std::string> lines = body(r.text);
    ASSERT_EQ(lines.size(), 1u);
    AddLine v;
    EXPECT_TRUE(parse_add(lines[0], &v)) << lines[0];
  }
  {
    auto h = open("per_cpu/cpu0/trace_pipe", O_RDONLY);
    BlockedRead r;
    r.start(*h);
    ASSERT_TRUE(r.wait_blocked());
    fs_->shutdown();
    ASSERT_TRUE(r.done(*fs_));
    EXPECT_EQ(r.result.get(), 0);
    EXPECT_TRUE(r.text.empty());
  }
}

TEST_F(TraceFilesTest, EmptyReadIsEndOfFileOnceDataWasReadAndTracingIsOff) {
  define_add();
  ASSERT_TRUE(launch());
  call(1);
  Request rq;  // a blocking read that is interrupted whenever it would wait
  rq.flags = O_RDONLY;
  rq.interrupted = [] { return true; };
  auto h = open("trace_pipe", O_RDONLY);
  std::string part;
  ASSERT_EQ(h->read(rq, 0, 4096, &part), 0);
  EXPECT_EQ(body(part).size(), 1u);
  EXPECT_EQ(h->read(rq, 0, 4096, &part), -EINTR);  // tracing on: it would wait
  ASSERT_EQ(write("tracing_on", "0\n"), 2);
  EXPECT_EQ(h->read(rq, 0, 4096, &part), 0);
  EXPECT_TRUE(part.empty());
  EXPECT_TRUE(h->readable());
  // A file that returned nothing yet still waits.
  auto fresh = open("trace_pipe", O_RDONLY);
  EXPECT_EQ(fresh->read(rq, 0, 4096, &part), -EINTR);
  ASSERT_EQ(write("tracing_on", "1"), 1);
}

TEST_F(TraceFilesTest, BlockedReaderSeesTracingOffAtOnce) {
  define_add();
  ASSERT_TRUE(launch());
  call(1);
  auto h = open("trace_pipe", O_RDONLY);
  BlockedRead first;
  first.start(*h);
  ASSERT_TRUE(first.done(*fs_));
  ASSERT_EQ(first.result.get(), 0);
  BlockedRead r;
  r.start(*h);
  ASSERT_TRUE(r.wait_blocked());
  ASSERT_EQ(write("tracing_on", "0"), 1);  // wakes it: it looks again, and ends
  ASSERT_TRUE(r.done(*fs_));
  EXPECT_EQ(r.result.get(), 0);
  EXPECT_TRUE(r.text.empty());
}

TEST_F(TraceFilesTest, PollIsWokenWhenRecordsArrive) {
  define_add();
  ASSERT_TRUE(launch());
  // The wake function outlives the test's body (the files call it until they go).
  struct Wakes {
    std::mutex mu;
    std::condition_variable cv;
    int n = 0;
  };
  auto w = std::make_shared<Wakes>();
  fs_->tree().walk("trace_pipe")->file()->set_wakeup([w] {
    std::lock_guard l(w->mu);
    ++w->n;
    w->cv.notify_all();
  });
  auto h = open("trace_pipe", O_RDONLY | O_NONBLOCK);
  EXPECT_FALSE(h->readable());
  call(1);
  {
    std::unique_lock l(w->mu);
    EXPECT_TRUE(w->cv.wait_for(l, kBound, [&] { return w->n > 0; }));
  }
  EXPECT_TRUE(h->readable());
  Request rq;
  rq.flags = O_RDONLY | O_NONBLOCK;
  std::string part;
  ASSERT_EQ(h->read(rq, 0, 4096, &part), 0);
  EXPECT_EQ(body(part).size(), 1u);
  EXPECT_FALSE(h->readable());
}

TEST_F(TraceFilesTest, TruncationClearsAndPlainWritesDoNothing) {
  define_add();
  ASSERT_TRUE(launch());
  call(3);
  const std::string cpus = std::to_string(fs_->cpus());
  EXPECT_EQ(write("trace", "x\n"), 2);
  EXPECT_EQ(write("trace", "x", O_WRONLY | O_APPEND), 1);
  EXPECT_EQ(open("trace", O_RDONLY | O_TRUNC) != nullptr, true);
  EXPECT_EQ(header_line(read_file("trace")), "# entries-in-buffer/entries-written: 3/3   #P:" + cpus);
  EXPECT_EQ(write("trace", "", O_WRONLY | O_TRUNC), 0);
  EXPECT_EQ(header_line(read_file("trace")), "# entries-in-buffer/entries-written: 0/0   #P:" + cpus);
  EXPECT_TRUE(drain("trace_pipe").empty());

  call(2);
  auto h = open("trace", O_WRONLY);
  ASSERT_EQ(h->truncate(Request{}), 0);
  EXPECT_TRUE(body(read_file("trace")).empty());
  call(2);
  ASSERT_EQ(fs_->tree().walk("trace")->file()->truncate(Request{}), 0);
  EXPECT_TRUE(body(read_file("trace")).empty());
  call(4);
  EXPECT_EQ(body(read_file("trace")).size(), 4u);
}

TEST_F(TraceFilesTest, PerCpuFilesShowTheirCpusRecords) {
  define_add();
  ASSERT_TRUE(launch());
  ASSERT_EQ(pipes_.ask("threads 4 200"), "ok " + std::to_string(4 * sum_calls(200)));
  const std::string text = read_file("trace");
  const std::vector<std::string> lines = body(text);
  ASSERT_EQ(lines.size(), 800u);
  std::map<unsigned, std::vector<std::string>> by_cpu;
  for (const std::string& l : lines) {
    AddLine v;
    ASSERT_TRUE(parse_add(l, &v)) << l;
    by_cpu[v.cpu].push_back(l);
  }
  for (int cpu = 0; cpu < fs_->cpus(); ++cpu) {
    const std::string dir = "per_cpu/cpu" + std::to_string(cpu) + "/";
    const std::string t = read_file(dir + "trace");
    // The header is the whole buffer's, as the kernel's per-CPU header is.
    EXPECT_EQ(header_line(t), header_line(text));
    EXPECT_EQ(body(t), by_cpu[static_cast<unsigned>(cpu)]) << dir;
    const std::vector<std::string> stats = split_lines(read_file(dir + "stats"));
    ASSERT_EQ(stats.size(), 8u);
    EXPECT_EQ(stats[0], "entries: " + std::to_string(by_cpu[static_cast<unsigned>(cpu)].size()));
    EXPECT_EQ(stats[1], "overrun: 0");
    EXPECT_EQ(stats[2], "commit overrun: 0");
    EXPECT_EQ(stats[3].rfind("bytes: ", 0), 0u);
    EXPECT_EQ(stats[4].rfind("oldest event ts: ", 0), 0u);
    EXPECT_EQ(stats[5].rfind("now ts: ", 0), 0u);
    EXPECT_EQ(stats[6], "dropped events: 0");
    EXPECT_EQ(stats[7], "read events: 0");
  }
  // Consuming per CPU: each CPU's trace_pipe gives that CPU's records and no other's. A
  // thread's records leave its ring in order, so a thread that moved between CPUs holds
  // its later records back until its earlier ones on the other CPU are consumed: the CPUs
  // are drained in rounds until a round takes nothing.
  std::map<unsigned, std::vector<std::string>> consumed;
  size_t taken = 0;
  for (size_t round = 0; round <= lines.size(); ++round) {
    size_t this_round = 0;
    for (int cpu = 0; cpu < fs_->cpus(); ++cpu) {
      const std::string dir = "per_cpu/cpu" + std::to_string(cpu) + "/";
      for (std::string& l : body(drain_text(dir + "trace_pipe"))) {
        consumed[static_cast<unsigned>(cpu)].push_back(std::move(l));
        ++this_round;
      }
    }
    if (this_round == 0) break;
    taken += this_round;
  }
  EXPECT_EQ(taken, lines.size());
  for (int cpu = 0; cpu < fs_->cpus(); ++cpu) {
    const std::string dir = "per_cpu/cpu" + std::to_string(cpu) + "/";
    std::vector<std::string> want = by_cpu[static_cast<unsigned>(cpu)];
    std::vector<std::string> got = consumed[static_cast<unsigned>(cpu)];
    EXPECT_EQ(split_lines(read_file(dir + "stats"))[7],
              "read events: " + std::to_string(want.size()))
        << dir;
    // Rounds may take one CPU's records out of time order: the same records, in any order.
    std::sort(want.begin(), want.end());
    std::sort(got.begin(), got.end());
    EXPECT_EQ(got, want) << dir;
  }
  EXPECT_TRUE(body(read_file("trace")).empty());
}

// Two threads, each pinned to a CPU of its own (traced_prog's cpuseq with one CPU), so that
// each CPU holds records: truncating one CPU's trace leaves the other's whole.
TEST_F(TraceFilesTest, PerCpuTruncationDropsOnlyThatCpusRecords) {
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  ASSERT_EQ(sched_getaffinity(0, sizeof allowed, &allowed), 0);
  std::vector<int> cpus;
  for (int cpu = 0; cpu < fs_->cpus() && cpus.size() < 2; ++cpu)
    if (CPU_ISSET(cpu, &allowed)) cpus.push_back(cpu);
  if (cpus.size() < 2) GTEST_SKIP() << "needs two CPUs this test may run on";
  define_add();
  ASSERT_TRUE(launch());
  for (int cpu : cpus)
    ASSERT_EQ(pipes_.ask("cpuseq 10 " + std::to_string(cpu)), "ok " + std::to_string(sum_calls(10)));
  const std::vector<std::string> lines = body(read_file("trace"));
  ASSERT_EQ(lines.size(), 20u);
  std::vector<std::string> on_second;
  for (const std::string& l : lines) {
    AddLine v;
    ASSERT_TRUE(parse_add(l, &v)) << l;
    ASSERT_TRUE(v.cpu == static_cast<unsigned>(cpus[0]) || v.cpu == static_cast<unsigned>(cpus[1]))
        << l;
    if (v.cpu == static_cast<unsigned>(cpus[1])) on_second.push_back(l);
  }
  ASSERT_EQ(on_second.size(), 10u);
  ASSERT_EQ(write("per_cpu/cpu" + std::to_string(cpus[0]) + "/trace", "", O_WRONLY | O_TRUNC), 0);
  EXPECT_EQ(body(read_file("trace")), on_second);
  ASSERT_EQ(write("per_cpu/cpu" + std::to_string(cpus[1]) + "/trace", "", O_WRONLY | O_TRUNC), 0);
  EXPECT_TRUE(body(read_file("trace")).empty());
}

TEST_F(TraceFilesTest, TracingOnTakesTheKernelsNumbers) {
  const std::vector<std::pair<std::string, int64_t>> writes = {
      {"0", 1}, {"1", 1}, {"2", 1}, {"01", 2}, {"+1", 2}, {"1\n", 2}, {"0\n", 2},
      {"", -EINVAL}, {" 1", -EINVAL}, {"0x1", -EINVAL}, {"1\n\n", -EINVAL}, {"-0", -EINVAL},
      {"abc", -EINVAL}, {"1 ", -EINVAL},
  };
  for (const auto& [text, rc] : writes) {
    ASSERT_EQ(write("tracing_on", "1"), 1);
    const int64_t got = write("tracing_on", text);
    EXPECT_EQ(got, rc) << "'" << text << "'";
    if (rc < 0) {
      EXPECT_EQ(read_file("tracing_on"), "1\n") << text;
      continue;
    }
    const bool on = text[0] != '0' || text == "01";
    EXPECT_EQ(read_file("tracing_on"), on ? "1\n" : "0\n") << text;
    EXPECT_EQ(fs_->tracing_on(), on);
  }
}

TEST_F(TraceFilesTest, TraceMarkerLinesInterleaveWithEvents) {
  // What the marker refuses, the kernel refuses before anything is recorded.
  ASSERT_EQ(write("options/markers", "0"), 1);
  EXPECT_EQ(write("trace_marker", "hello"), -EINVAL);
  ASSERT_EQ(write("options/markers", "1"), 1);
  ASSERT_EQ(write("tracing_on", "0"), 1);
  EXPECT_EQ(write("trace_marker", "hello"), -EBADF);
  ASSERT_EQ(write("tracing_on", "1"), 1);
  int err = 0;
  open("trace_marker", O_WRONLY, &err);
  EXPECT_EQ(err, 0);

  define_add();
  ASSERT_TRUE(launch());
  call(1);
  ASSERT_EQ(write("trace_marker", "hello"), 5);
  call(1);
  ASSERT_EQ(write("trace_marker", "two\nlines\n"), 10);
  EXPECT_EQ(write("trace_marker", std::string(5000, 'x')), 4054);
  const std::vector<std::string> lines = body(read_file("trace"));
  ASSERT_EQ(lines.size(), 6u);
  AddLine v;
  EXPECT_TRUE(parse_add(lines[0], &v)) << lines[0];
  const std::string comm = split_lines(
      [] {
        char b[64] = {};
        FILE* f = fopen("/proc/thread-self/comm", "r");
        if (f) {
          (void)!fgets(b, sizeof b, f);
          fclose(f);
        }
        return std::string(b);
      }())[0];
  char prefix[64];
  snprintf(prefix, sizeof prefix, "%16s-%-7d [", comm.c_str(), static_cast<int>(gettid()));
  EXPECT_EQ(lines[1].rfind(prefix, 0), 0u) << lines[1];
  EXPECT_EQ(lines[1].substr(31, 6), "...1. ") << lines[1];
  EXPECT_EQ(lines[1].substr(lines[1].find(": tracing_mark_write: ")),
            ": tracing_mark_write: hello");
  EXPECT_TRUE(parse_add(lines[2], &v)) << lines[2];
  EXPECT_NE(lines[3].find(": tracing_mark_write: two"), std::string::npos);
  EXPECT_EQ(lines[4], "lines");
  EXPECT_EQ(lines[5].substr(lines[5].find(": tracing_mark_write: ") + 22), std::string(4054, 'x'));
  EXPECT_NE(read_file("saved_cmdlines").find(std::to_string(gettid()) + " " + comm + "\n"),
            std::string::npos);
}

// snapshot: the kernel's help while it holds nothing; `echo 1` moves every record of the
// buffer into it, printed as `trace` prints them; 2 empties it, 0 frees it.
TEST_F(TraceFilesTest, SnapshotTakesTheBuffersRecords) {
  const std::string freed = read_file("snapshot");
  EXPECT_EQ(freed.substr(0, freed.find("# Snapshot commands:")),
            "# tracer: nop\n#\n#\n# * Snapshot is freed *\n#\n");
  EXPECT_NE(freed.find("# echo 1 > snapshot : Allocates snapshot buffer, if not already "
                       "allocated.\n#                      Takes a snapshot of the main buffer.\n"),
            std::string::npos);
  ASSERT_EQ(write("tracing_on", "0"), 1);
  ASSERT_EQ(write("snapshot", "1"), 1);
  EXPECT_NE(read_file("snapshot").find("# * Snapshot is allocated *"), std::string::npos);
  EXPECT_EQ(read_file("tracing_on"), "0\n");  // a snapshot switches nothing
  ASSERT_EQ(write("tracing_on", "1"), 1);
  define_add();
  ASSERT_TRUE(launch());
  call(3);
  const std::string trace = read_file("trace");
  ASSERT_EQ(write("snapshot", "1"), 1);
  const std::string snap = read_file("snapshot");
  EXPECT_EQ(snap, trace);  // header, counts and lines: what `trace` showed
  EXPECT_EQ(body(snap).size(), 3u);
  EXPECT_TRUE(body(read_file("trace")).empty());  // moved, not copied
  call(2);
  EXPECT_EQ(body(read_file("trace")).size(), 2u);
  EXPECT_EQ(read_file("snapshot"), snap);
  ASSERT_EQ(write("snapshot", "2"), 1);
  EXPECT_NE(read_file("snapshot").find("# * Snapshot is allocated *"), std::string::npos);
  ASSERT_EQ(write("snapshot", "0"), 1);
  EXPECT_EQ(read_file("snapshot"), freed);
  EXPECT_EQ(write("snapshot", "x"), -EINVAL);
}

TEST_F(TraceFilesTest, ClockChangeEmptiesTheBufferAndChangesTheStamps) {
  define_add();
  ASSERT_TRUE(launch());
  call(2);
  EXPECT_EQ(read_file("trace_clock"),
            "[local] global counter uptime perf mono mono_raw boot tai x86-tsc\n");
  EXPECT_EQ(write("trace_clock", "bogus"), -EINVAL);
  EXPECT_EQ(write("trace_clock", ""), -EINVAL);
  ASSERT_EQ(write("trace_clock", "x86-tsc\n"), 8);
  EXPECT_EQ(read_file("trace_clock"),
            "local global counter uptime perf mono mono_raw boot tai [x86-tsc]\n");
  EXPECT_TRUE(body(read_file("trace")).empty());
  call(2);
  std::vector<std::string> lines = body(read_file("trace"));
  ASSERT_EQ(lines.size(), 2u);
  // " %12llu" rather than seconds.microseconds.
  const std::string& l = lines[0];
  const size_t ts = l.find("] ..... ") + 8;
  const size_t colon = l.find(": add: ");
  ASSERT_NE(colon, std::string::npos);
  EXPECT_GE(colon - ts, 12u) << l;
  EXPECT_EQ(l.substr(ts, colon - ts).find('.'), std::string::npos) << l;
  ASSERT_EQ(write("trace_clock", " mono "), 6);
  EXPECT_EQ(read_file("trace_clock"),
            "local global counter uptime perf [mono] mono_raw boot tai x86-tsc\n");
  ASSERT_EQ(write("trace_clock", "local"), 5);
}

TEST_F(TraceFilesTest, BufferSizeIsRoundedAsTheKernelRoundsIt) {
  EXPECT_EQ(read_file("buffer_size_kb"), "1410\n");
  EXPECT_EQ(read_file("buffer_total_size_kb"), "0\n");  // no ring holds records
  const std::vector<std::pair<std::string, std::string>> sizes = {
      {"1", "7\n"}, {"4", "7\n"}, {"8", "11\n"}, {"010", "11\n"}, {"+5", "7\n"}, {"1410", "1410\n"},
  };
  for (const auto& [in, out] : sizes) {
    ASSERT_EQ(write("buffer_size_kb", in), static_cast<int64_t>(in.size())) << in;
    EXPECT_EQ(read_file("buffer_size_kb"), out) << in;
  }
  for (const char* bad : {"0", "", "abc", " 5", "5 ", "0x10", "-1"})
    EXPECT_EQ(write("buffer_size_kb", bad), -EINVAL) << bad;
  EXPECT_EQ(write("buffer_size_kb", "99999999999"), -ENOMEM);
  EXPECT_EQ(read_file("buffer_size_kb"), "1410\n");
  int err = 0;
  open("buffer_total_size_kb", O_RDONLY, &err);
  EXPECT_EQ(err, 0);

  ASSERT_EQ(write("buffer_size_kb", "4"), 1);
  define_add();
  ASSERT_TRUE(launch());
  call(1);
  EXPECT_EQ(read_file("buffer_total_size_kb"), "7\n");
  ASSERT_EQ(pipes_.ask("threads 2 1"), "ok 0");
  EXPECT_EQ(read_file("buffer_total_size_kb"), "21\n");
}

TEST_F(TraceFilesTest, OptionsChangeTheText) {
  define_add();
  ASSERT_TRUE(launch());
  call(2);
  const std::string plain = read_file("trace");
  const std::vector<std::string> lines = body(plain);
  ASSERT_EQ(lines.size(), 2u);
  const std::string entries = header_line(plain) + "\n#\n";
  for (const char* o : {"context-info", "irq-info", "markers"})
    EXPECT_EQ(read_file(std::string("options/") + o), "1\n") << o;
  EXPECT_EQ(read_file("options/record-tgid"), "0\n");

  // irq-info: no flags column.
  ASSERT_EQ(write("options/irq-info", "0\n"), 2);
  std::string t = read_file("trace");
  EXPECT_EQ(t.substr(0, t.find(lines[0].substr(0, 10))),
            "# tracer: nop\n#\n" + entries +
                "#           TASK-PID     CPU#     TIMESTAMP  FUNCTION\n"
                "#              | |         |         |         |\n");
  for (size_t i = 0; i < 2; ++i) {
    std::string want = lines[i];
    want.erase(want.find("] ") + 2, 5);
    EXPECT_EQ(body(t)[i], want);
  }
  ASSERT_EQ(write("options/irq-info", "1"), 1);

  // record-tgid: the TGID column.
  ASSERT_EQ(write("options/record-tgid", "1"), 1);
  t = read_file("trace");
  char tgid[32];
  snprintf(tgid, sizeof tgid, "(%7d) ", pid_);
  EXPECT_EQ(t.substr(0, t.find(lines[0].substr(0, 10))),
            "# tracer: nop\n#\n" + entries +
                "#                                          _-----=> irqs-off/BH-disabled\n"
                "#                                         / _----=> need-resched\n"
                "#                                        | / _---=> hardirq/softirq\n"
                "#                                        || / _--=> preempt-depth\n"
                "#                                        ||| / _-=> migrate-disable\n"
                "#                                        |||| /     delay\n"
                "#           TASK-PID       TGID    CPU#  |||||  TIMESTAMP  FUNCTION\n"
                "#              | |           |       |   |||||     |         |\n");
  for (size_t i = 0; i < 2; ++i)
    EXPECT_EQ(body(t)[i], lines[i].substr(0, 25) + tgid + lines[i].substr(25));
  ASSERT_EQ(write("options/irq-info", "0"), 1);
  t = read_file("trace");
  EXPECT_NE(t.find("#           TASK-PID       TGID    CPU#     TIMESTAMP  FUNCTION\n"
                   "#              | |           |       |         |         |\n"),
            std::string::npos);
  ASSERT_EQ(write("options/irq-info", "1"), 1);
  ASSERT_EQ(write("options/record-tgid", "0"), 1);

  // context-info: the event alone.
  ASSERT_EQ(write("options/context-info", "0"), 1);
  t = read_file("trace");
  EXPECT_EQ(t, "# tracer: nop\n#\n" + lines[0].substr(lines[0].find(": add: ") + 2) + "\n" +
                   lines[1].substr(lines[1].find(": add: ") + 2) + "\n");
  // trace_pipe prints the same way.
  EXPECT_EQ(drain_text("trace_pipe"), t.substr(16));
  ASSERT_EQ(write("options/context-info", "1"), 1);

  for (const char* bad : {"2", "", "x", "0x1", " 1"})
    EXPECT_EQ(write("options/irq-info", bad), -EINVAL) << bad;
  EXPECT_EQ(write("options/irq-info", "01"), 2);
  EXPECT_EQ(write("options/irq-info", "+1"), 2);
  EXPECT_EQ(read_file("options/irq-info"), "1\n");
}

// set_event_pid and set_event_notrace_pid decide which threads' events are kept, as the
// kernel's lists do; emptying them (O_TRUNC) keeps every thread's again.
TEST_F(TraceFilesTest, EventPidListsKeepTheListedThreadsEvents) {
  define_add();
  ASSERT_TRUE(launch());
  const std::string other = std::to_string(pid_ + 1);  // not the program's thread
  ASSERT_EQ(write("set_event_pid", other), static_cast<int64_t>(other.size()));
  call(5);
  EXPECT_EQ(drain_text("trace_pipe"), "");
  ASSERT_EQ(write("set_event_pid", std::to_string(pid_)),
            static_cast<int64_t>(std::to_string(pid_).size()));
  call(3);
  EXPECT_EQ(body(drain_text("trace_pipe")).size(), 3u);
  ASSERT_EQ(write("set_event_pid", "", O_WRONLY | O_TRUNC), 0);
  ASSERT_EQ(write("set_event_notrace_pid", std::to_string(pid_)),
            static_cast<int64_t>(std::to_string(pid_).size()));
  call(4);
  EXPECT_EQ(drain_text("trace_pipe"), "");
  ASSERT_EQ(write("set_event_notrace_pid", "", O_WRONLY | O_TRUNC), 0);
  call(2);
  EXPECT_EQ(body(drain_text("trace_pipe")).size(), 2u);
}

// A listed process's fork child is kept only with options/event-fork, as the kernel adds
// a listed task's children to the list only then.
TEST_F(TraceFilesTest, EventForkKeepsAListedProcesssChildren) {
  define_add();
  ASSERT_TRUE(launch());
  ASSERT_EQ(write("set_event_pid", std::to_string(pid_)),
            static_cast<int64_t>(std::to_string(pid_).size()));
  std::string answer = pipes_.ask("fork 4");
  ASSERT_EQ(answer.rfind("ok ", 0), 0u) << answer;
  EXPECT_EQ(drain_text("trace_pipe"), "");
  ASSERT_EQ(write("options/event-fork", "1"), 1);
  answer = pipes_.ask("fork 4");
  ASSERT_EQ(answer.rfind("ok ", 0), 0u) << answer;
  const pid_t child = static_cast<pid_t>(std::atol(answer.c_str() + 3));
  // The child ran at once on its parent's spare area and may be gone before the daemon
  // took its HELLO: its records are read from when it became a target, which its exit,
  // once known, says it did.
  int status = 0, rc;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while ((rc = tracer_->wait_exit(child, 100, &status)) == -ESRCH &&
         std::chrono::steady_clock::now() < until)
    std::this_thread::yield();
  ASSERT_EQ(rc, 0) << "the fork child never became a target";
  const std::vector<std::string> lines = body(drain_text("trace_pipe"));
  ASSERT_EQ(lines.size(), 4u);
  for (const std::string& l : lines) {
    AddLine v;
    ASSERT_TRUE(parse_add(l, &v)) << l;
    EXPECT_EQ(v.pid, child) << l;
  }
}

// tracing_cpumask keeps the records of the CPUs it has.
TEST_F(TraceFilesTest, TracingCpumaskKeepsTheRecordsOfItsCpus) {
  if (fs_->cpus() < 2) GTEST_SKIP() << "one CPU: no mask leaves the program's CPU out";
  define_add();
  ASSERT_TRUE(launch());
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(0, &one);
  ASSERT_EQ(sched_setaffinity(pid_, sizeof one, &one), 0);
  ASSERT_EQ(write("tracing_cpumask", "2"), 1);  // CPU 1 only
  call(5);
  EXPECT_EQ(drain_text("trace_pipe"), "");
  ASSERT_EQ(write("tracing_cpumask", "1"), 1);  // CPU 0 only
  call(5);
  EXPECT_EQ(body(drain_text("trace_pipe")).size(), 5u);
}

TEST_F(TraceFilesTest, LostRecordsPrintTheKernelsLostLine) {
  ASSERT_EQ(write("buffer_size_kb", "4"), 1);
  define_add();
  ASSERT_TRUE(launch());
  call(2000);
  const size_t kept = body(drain_text("trace_pipe")).size();
  ASSERT_GT(kept, 0u);
  ASSERT_LT(kept, 2000u);
  // The next record carries the count of those dropped before it.
  call(1);
  const std::string header = header_line(read_file("trace"));
  EXPECT_EQ(header, "# entries-in-buffer/entries-written: 1/" + std::to_string(2001 - kept) +
                        "   #P:" + std::to_string(fs_->cpus()));
  const std::vector<std::string> lines = split_lines(drain_text("trace_pipe"));
  ASSERT_EQ(lines.size(), 2u);
  AddLine v;
  ASSERT_TRUE(parse_add(lines[1], &v)) << lines[1];
  EXPECT_EQ(v.a, 0u);
  EXPECT_EQ(lines[0], "CPU:" + std::to_string(v.cpu) + " [LOST " + std::to_string(2000 - kept) +
                          " EVENTS]");
  const std::string stats =
      read_file("per_cpu/cpu" + std::to_string(v.cpu) + "/stats");
  EXPECT_NE(stats.find("dropped events: " + std::to_string(2000 - kept) + "\n"),
            std::string::npos)
      << stats;
}

// Records of an event that is gone are not shown, in `trace` or `trace_pipe`.
TEST_F(TraceFilesTest, RecordsOfAnEventThatIsGoneAreNotShown) {
  const uint16_t id = define_add();
  ASSERT_TRUE(launch());
  call(3);
  EXPECT_EQ(body(read_file("trace")).size(), 3u);
  fs_->events().unpublish(id);
  EXPECT_TRUE(body(read_file("trace")).empty());
  EXPECT_TRUE(drain("trace_pipe").empty());
}

TEST_F(TraceFilesTest, TraceStreamsALargeBufferInChunks) {
  ASSERT_EQ(write("buffer_size_kb", "16384"), 5);
  define_add();
  ASSERT_TRUE(launch());
  constexpr long kCalls = 150000;  // about 7 MiB of records: more than one chunk
  call(kCalls);
  const std::string text = read_file("trace", 128 << 10);
  EXPECT_EQ(header_line(text), "# entries-in-buffer/entries-written: " +
                                   std::to_string(kCalls) + "/" + std::to_string(kCalls) +
                                   "   #P:" + std::to_string(fs_->cpus()));
  const std::vector<std::string> lines = body(text);
  ASSERT_EQ(lines.size(), static_cast<size_t>(kCalls));
  for (size_t i = 0; i < lines.size(); ++i) {
    AddLine v;
    ASSERT_TRUE(parse_add(lines[i], &v)) << lines[i];
    ASSERT_EQ(v.a, i);
  }
  EXPECT_EQ(drain_text("trace_pipe"), join(lines));
}

TEST_F(TraceFilesTest, SavedCmdlinesNamesTheThreadsSeen) {
  EXPECT_EQ(read_file("saved_cmdlines_size"), "6552\n");
  define_add();
  ASSERT_TRUE(launch());
  call(1);
  EXPECT_NE(read_file("saved_cmdlines").find(std::to_string(pid_) + " " + kComm + "\n"),
            std::string::npos);
  EXPECT_EQ(write("saved_cmdlines_size", "0"), -EINVAL);
  EXPECT_EQ(write("saved_cmdlines_size", "40000"), -EINVAL);
  EXPECT_EQ(write("saved_cmdlines_size", "10\n"), 3);
  EXPECT_EQ(read_file("saved_cmdlines_size"), "10\n");
}

}  // namespace
}  // namespace probefs::fs
