// Hist triggers on real processes: events defined through kprobe_events, hist triggers
// written to their trigger files, the bundled traced_prog making known calls, and the
// hist files read back: the counts are what the program did, exactly, however many
// threads did it, and an event that only aggregates records nothing.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <map>

#include <sstream>
#include <string>
#include <vector>

#include "tests/fs/trace_files_test_util.h"

namespace probefs::fs {
namespace {

const std::string kProg = PROBEFS_TRACED_PROG;
const std::string kProgName = kProg.substr(kProg.rfind('/') + 1);

class EventHistsTest : public testing::TracedProgramTest {
 protected:
  void SetUp() override {
    TracedProgramTest::SetUp();
    ASSERT_EQ(echo("kprobe_events", "p:t/add " + kProgName + ":traced_add a=%di:s64 b=%si:s64"), 0);
  }
  // The stacktrace-key check on one build of stack_prog (below).
  // Where the stack is taken: on inner's first instruction; there with return probes on
  // its callers; where inner returns to (a return probe on inner).
  enum class StackAt { kEntry, kEntryUnderReturnProbes, kReturn };
  void expect_stacks(const std::string& prog, StackAt at);
  int64_t echo(const std::string& path, const std::string& line) {
    const int64_t n = write(path, line + "\n", O_WRONLY | O_APPEND);
    return n == static_cast<int64_t>(line.size() + 1) ? 0 : n;
  }
  std::string read(const std::string& path) {
    int err = 0;
    std::unique_ptr<Handle> h = open(path, O_RDONLY, &err);
    if (err != 0) return "<open error " + std::to_string(err) + ">";
    const Request rq = request(O_RDONLY);
    std::string all, chunk;
    for (uint64_t off = 0;; off += chunk.size()) {
      if (h->read(rq, off, 4096, &chunk) != 0 || chunk.empty()) break;
      all += chunk;
    }
    return all;
  }
  // The entry lines of the hist file's block `n` (0: the first histogram).
  std::vector<std::string> entries(const std::string& hist, int n = 0) {
    std::vector<std::string> out;
    size_t at = 0;
    for (int i = 0; i <= n; ++i) {
      at = hist.find("# event histogram", at);
      if (at == std::string::npos) return out;
      if (i < n) ++at;
    }
    const size_t end = hist.find("Totals:", at);
    size_t line = hist.find("\n{ ", at);
    while (line != std::string::npos && line < end) {
      const size_t nl = hist.find('\n', line + 1);
      out.push_back(hist.substr(line + 1, nl - line - 1));
      line = hist.find("\n{ ", nl);
    }
    return out;
  }
  // The lines a drain of trace_pipe gives, whatever reads they came in.
  std::vector<std::string> pipe_lines() {
    std::string all;
    for (const std::string& part : drain("trace_pipe")) all += part;
    std::vector<std::string> lines;
    for (size_t at = 0; at < all.size();) {
      const size_t nl = all.find('\n', at);
      lines.push_back(all.substr(at, nl == std::string::npos ? std::string::npos : nl - at));
      at = nl == std::string::npos ? all.size() : nl + 1;
    }
    return lines;
  }
  std::string totals(const std::string& hist, int n = 0) {
    size_t at = 0;
    for (int i = 0; i <= n && at != std::string::npos; ++i) at = hist.find("Totals:", i ? at + 1 : 0);
    if (at == std::string::npos) return "";
    std::string t = hist.substr(at, hist.find("\n\n", at) - at);
    while (!t.empty() && t.back() == '\n') t.pop_back();
    return t;
  }
};

// hist:keys=a.buckets=10:vals=b on traced_add(i, 2i) for i in [0, 100): ten buckets of
// ten calls, each with its sum of b; the event is in soft mode and writes no record.
TEST_F(EventHistsTest, AnEventThatOnlyAggregatesCountsEveryCallAndRecordsNothing) {
  ASSERT_EQ(echo("events/t/add/trigger", "hist:keys=a.buckets=10:vals=b"), 0);
  EXPECT_EQ(read("events/t/add/enable"), "0*\n");
  EXPECT_EQ(read("events/t/add/trigger"),
            "hist:keys=a.buckets=10:vals=hitcount,b:sort=hitcount:size=2048 [active]\n");
  ASSERT_TRUE(launch());
  call(100);
  const std::string hist = read("events/t/add/hist");
  std::vector<std::string> want;
  for (int k = 0; k < 10; ++k) {
    char line[160];
    snprintf(line, sizeof line, "{ a: ~ %d-%d } hitcount:         10  b: %10d", 10 * k,
             10 * k + 9, 200 * k + 90);
    want.push_back(line);
  }
  EXPECT_EQ(entries(hist), want) << hist;
  EXPECT_EQ(hist.substr(0, hist.find("{ ")),
            "# event histogram\n#\n# trigger info: "
            "hist:keys=a.buckets=10:vals=hitcount,b:sort=hitcount:size=2048 [active]\n#\n\n");
  EXPECT_EQ(totals(hist), "Totals:\n    Hits: 100\n    Entries: 10\n    Dropped: 0");
  EXPECT_TRUE(drain("trace_pipe").empty());
  // Enabled, it records as well, and the histogram goes on counting.
  ASSERT_EQ(echo("events/t/add/enable", "1"), 0);
  EXPECT_EQ(read("events/t/add/enable"), "1*\n");
  call(10);
  EXPECT_EQ(drain("trace_pipe").size() > 0, true);
  EXPECT_EQ(totals(read("events/t/add/hist")),
            "Totals:\n    Hits: 110\n    Entries: 10\n    Dropped: 0");
}

// An event that only aggregates, on arguments narrower than their registers: the hit
// counts them from the saved registers (no record is written), cut and sign-extended as
// the record would hold them. traced_add(i, 2i) for i in [0, 300): a s8 key wraps at 128
// (to negative keys) and 256, a u8 value at 256.
TEST_F(EventHistsTest, NarrowAndSignedArgumentsCountAsTheRecordWouldHoldThem) {
  ASSERT_EQ(echo("kprobe_events", "p:t/narrow " + kProgName + ":traced_add a=%di:s8 b=%si:u8 c=%si:s16"), 0);
  ASSERT_EQ(echo("events/t/narrow/trigger", "hist:keys=a,c.log2:vals=b"), 0);
  ASSERT_TRUE(launch());
  call(300);
  std::map<std::pair<int64_t, uint64_t>, std::pair<uint64_t, uint64_t>> want;  // key: hits, b
  for (long i = 0; i < 300; ++i) {
    const auto a = static_cast<int8_t>(i);
    const auto c = static_cast<int16_t>(2 * i);
    const uint64_t log2 = c <= 1 ? 0 : 64 - static_cast<uint64_t>(__builtin_clzll(static_cast<uint64_t>(c) - 1));
    auto& w = want[{a, log2}];
    ++w.first;
    w.second += static_cast<uint8_t>(2 * i);
  }
  std::vector<std::string> lines;
  for (const auto& [k, v] : want) {
    char line[200];
    // Keys print as u64, as the kernel's do: a negative one sign-extended.
    snprintf(line, sizeof line, "{ a: %10llu, c: ~ 2^%-2llu } hitcount: %10llu  b: %10llu",
             static_cast<unsigned long long>(k.first), static_cast<unsigned long long>(k.second),
             static_cast<unsigned long long>(v.first), static_cast<unsigned long long>(v.second));
    lines.push_back(line);
  }
  const std::string hist = read("events/t/narrow/hist");
  std::vector<std::string> got = entries(hist);
  std::sort(got.begin(), got.end());
  std::sort(lines.begin(), lines.end());
  EXPECT_EQ(got, lines) << hist;
  EXPECT_EQ(totals(hist), "Totals:\n    Hits: 300\n    Entries: " + std::to_string(want.size()) +
                              "\n    Dropped: 0");
  EXPECT_TRUE(drain("trace_pipe").empty());
}

// Eight named threads calling at once: one entry per thread, each with its name and
// exactly its calls; a second histogram on the same event, with a filter, beside it.
TEST_F(EventHistsTest, ThreadsCountExactlyAndEntriesKeepTheirNames) {
  ASSERT_EQ(echo("events/t/add/trigger", "hist:keys=common_pid.execname:sort=common_pid"), 0);
  ASSERT_EQ(echo("events/t/add/trigger", "hist:keys=a:vals=b if a < 5"), 0);
  ASSERT_TRUE(launch());
  ASSERT_EQ(pipes_.ask("named 8 20000 w"),
            "ok " + std::to_string(8 * 3 * (20000L * 19999 / 2)));
  const std::string hist = read("events/t/add/hist");
  std::vector<std::string> lines = entries(hist);
  ASSERT_EQ(lines.size(), 8u) << hist;
  std::vector<std::string> names;
  for (const std::string& l : lines) {
    EXPECT_NE(l.find("} hitcount:      20000"), std::string::npos) << l;
    names.push_back(l.substr(l.find("w-"), 3));
  }
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"w-0", "w-1", "w-2", "w-3", "w-4", "w-5", "w-6", "w-7"}));
  EXPECT_EQ(totals(hist), "Totals:\n    Hits: 160000\n    Entries: 8\n    Dropped: 0");
  EXPECT_EQ(entries(hist, 1), (std::vector<std::string>{
                                  "{ a:          0 } hitcount:          8  b:          0",
                                  "{ a:          1 } hitcount:          8  b:         16",
                                  "{ a:          2 } hitcount:          8  b:         32",
                                  "{ a:          3 } hitcount:          8  b:         48",
                                  "{ a:          4 } hitcount:          8  b:         64"}))
      << hist;
}

TEST_F(EventHistsTest, PauseContinueClearAndRemove) {
  ASSERT_EQ(echo("events/t/add/trigger", "hist:keys=a"), 0);
  ASSERT_TRUE(launch());
  call(3);
  ASSERT_EQ(echo("events/t/add/trigger", "hist:keys=a:pause"), 0);
  EXPECT_EQ(read("events/t/add/trigger"),
            "hist:keys=a:vals=hitcount:sort=hitcount:size=2048 [paused]\n");
  call(5);
  EXPECT_EQ(totals(read("events/t/add/hist")), "Totals:\n    Hits: 3\n    Entries: 3\n    Dropped: 0");
  ASSERT_EQ(echo("events/t/add/trigger", "hist:keys=a:cont"), 0);
  call(4);
  EXPECT_EQ(totals(read("events/t/add/hist")), "Totals:\n    Hits: 7\n    Entries: 4\n    Dropped: 0");
  ASSERT_EQ(echo("events/t/add/trigger", "hist:keys=a:clear"), 0);
  EXPECT_EQ(totals(read("events/t/add/hist")), "Totals:\n    Hits: 0\n    Entries: 0\n    Dropped: 0");
  call(2);
  EXPECT_EQ(entries(read("events/t/add/hist")),
            (std::vector<std::string>{"{ a:          0 } hitcount:          1",
                                      "{ a:          1 } hitcount:          1"}));
  // The same trigger again is EEXIST; a clear of one that is not there ENOENT.
  EXPECT_EQ(echo("events/t/add/trigger", "hist:keys=a"), -EEXIST);
  EXPECT_EQ(echo("events/t/add/trigger", "hist:keys=b:clear"), -ENOENT);
  ASSERT_EQ(echo("events/t/add/trigger", "!hist:keys=a"), 0);
  EXPECT_EQ(read("events/t/add/trigger"),
            "# Available triggers:\n# traceon traceoff snapshot stacktrace enable_event disable_event hist\n");
  EXPECT_EQ(read("events/t/add/enable"), "0\n");
  EXPECT_EQ(read("events/t/add/hist"), "");
  call(2);  // nothing counts, nothing records
  EXPECT_TRUE(drain("trace_pipe").empty());
}

TEST_F(EventHistsTest, ANamedHistogramIsSharedByItsEvents) {
  ASSERT_EQ(echo("kprobe_events", "p:t/add2 " + kProgName + ":traced_add a=%di:s64"), 0);
  ASSERT_EQ(echo("events/t/add/trigger", "hist:name=both:keys=a"), 0);
  ASSERT_EQ(echo("events/t/add2/trigger", "hist:name=both:keys=a"), 0);
  EXPECT_EQ(echo("events/t/add2/trigger", "hist:name=both:keys=a.hex"), -EINVAL);
  EXPECT_NE(read("error_log").find(
                "hist:t:add2: error: Named hist trigger doesn't match existing named trigger "
                "(includes variables)\n  Command: hist:name=both:keys=a.hex\n" +
                std::string(11 + 5, ' ') + "^\n"),
            std::string::npos)
      << read("error_log");
  ASSERT_TRUE(launch());
  call(3);
  const std::vector<std::string> want = {"{ a:          0 } hitcount:          2",
                                         "{ a:          1 } hitcount:          2",
                                         "{ a:          2 } hitcount:          2"};
  EXPECT_EQ(entries(read("events/t/add/hist")), want);
  EXPECT_EQ(entries(read("events/t/add2/hist")), want);
  EXPECT_NE(read("events/t/add2/hist").find("trigger info: hist:name=both:keys=a:vals="),
            std::string::npos);
  // The histogram stays while one event still names it.
  ASSERT_EQ(echo("events/t/add/trigger", "!hist:name=both:keys=a"), 0);
  call(1);
  EXPECT_EQ(entries(read("events/t/add2/hist")),
            (std::vector<std::string>{"{ a:          1 } hitcount:          2",
                                      "{ a:          2 } hitcount:          2",
                                      "{ a:          0 } hitcount:          3"}));
}

TEST_F(EventHistsTest, EntriesOutliveTheTargetAndAFullTableCountsItsDrops) {
  ASSERT_EQ(echo("events/t/add/trigger", "hist:keys=a:size=128"), 0);
  ASSERT_TRUE(launch());
  call(1000);
  ASSERT_EQ(pipes_.ask("quit"), "");
  int status = -1;
  ASSERT_EQ(tracer_->wait_exit(pid_, 30000, &status), 0);
  pid_ = 0;
  const std::string hist = read("events/t/add/hist");
  EXPECT_EQ(entries(hist).size(), 128u);
  EXPECT_EQ(totals(hist), "Totals:\n    Hits: 1000\n    Entries: 128\n    Dropped: 872");
}

// Children forked one after another, most of them running at once on a spare ring area
// their parent held (with its histogram tables, handed ahead of it): every call of every
// child counts, under the child's own pid.
TEST_F(EventHistsTest, ForkChildrenCountFromTheirFirstCall) {
  ASSERT_EQ(echo("events/t/add/trigger", "hist:keys=common_pid"), 0);
  ASSERT_TRUE(launch());
  ASSERT_EQ(pipes_.ask("forks 30 100"), "ok 30");
  const std::string hist = read("events/t/add/hist");
  const std::vector<std::string> lines = entries(hist);
  EXPECT_EQ(lines.size(), 30u) << hist;
  for (const std::string& l : lines) EXPECT_NE(l.find("} hitcount:        100"), std::string::npos) << l;
  EXPECT_EQ(totals(hist), "Totals:\n    Hits: 3000\n    Entries: 30\n    Dropped: 0");
}

// The tables' memfd is the target's too: one that opens it again (map_files) can neither
// shrink it under the daemon's mapping nor grow it, and the daemon reads on.
TEST_F(EventHistsTest, ATargetCannotResizeItsTables) {
  ASSERT_EQ(echo("events/t/add/trigger", "hist:keys=a"), 0);
  ASSERT_TRUE(launch());
  call(3);
  std::ifstream maps("/proc/" + std::to_string(pid_) + "/maps");
  std::string line;
  int tried = 0;
  while (std::getline(maps, line)) {
    if (line.find("memfd:probefs-hist") == std::string::npos) continue;
    const std::string range = line.substr(0, line.find(' '));
    const int fd = ::open(("/proc/" + std::to_string(pid_) + "/map_files/" + range).c_str(),
                          O_RDWR | O_CLOEXEC);
    ASSERT_GE(fd, 0) << range;
    EXPECT_EQ(::ftruncate(fd, 0), -1);
    EXPECT_EQ(errno, EPERM);
    EXPECT_EQ(::ftruncate(fd, 1 << 30), -1);
    EXPECT_EQ(errno, EPERM);
    ::close(fd);
    ++tried;
  }
  EXPECT_GE(tried, 1);
  EXPECT_EQ(totals(read("events/t/add/hist")), "Totals:\n    Hits: 3\n    Entries: 3\n    Dropped: 0");
}


// ---- inter-event histograms: variables, onmatch, synthetic events --------------------------

// The latency of a function, as histogram.rst measures wakeup latency: the entry saves
// common_timestamp.usecs per thread, the return subtracts it and writes a synthetic event,
// whose own histogram sums the latencies by argument. traced_sleep sleeps a known time:
// each call's latency is at least that.
TEST_F(EventHistsTest, AFunctionsLatencyIsOneSyntheticEventAndItsHistogram) {
  ASSERT_EQ(echo("synthetic_events", "fnlat u64 lat; long us"), 0);
  ASSERT_EQ(echo("kprobe_events", "p:t/sin " + kProgName + ":traced_sleep us=%di"), 0);
  ASSERT_EQ(echo("kprobe_events", "r:t/sout " + kProgName + ":traced_sleep ret=$retval"), 0);
  ASSERT_EQ(echo("events/t/sin/trigger", "hist:keys=common_pid:ts0=common_timestamp.usecs"), 0);
  ASSERT_EQ(echo("events/t/sout/trigger",
                 "hist:keys=common_pid:lat=common_timestamp.usecs-$ts0:"
                 "onmatch(t.sin).trace(fnlat,$lat,ret)"),
            0);
  ASSERT_EQ(echo("events/synthetic/fnlat/trigger", "hist:keys=us:vals=lat:sort=us"), 0);
  EXPECT_EQ(read("events/t/sin/trigger"),
            "hist:keys=common_pid:vals=hitcount:ts0=common_timestamp.usecs:sort=hitcount:"
            "size=2048:clock=global [active]\n");
  EXPECT_EQ(read("events/t/sout/trigger"),
            "hist:keys=common_pid:vals=hitcount:lat=common_timestamp.usecs-$ts0:sort=hitcount:"
            "size=2048:clock=global:onmatch(t.sin).trace(fnlat,$lat,ret) [active]\n");
  ASSERT_EQ(echo("events/synthetic/fnlat/enable", "1"), 0);
  ASSERT_TRUE(launch());
  ASSERT_EQ(pipes_.ask("sleeps 4 1000 5000 20000"), "ok 12");
  // Every call one synthetic record: its latency and the function's argument.
  int lines = 0;
  for (const std::string& line : pipe_lines()) {
    const size_t at = line.find("fnlat: lat=");
    ASSERT_NE(at, std::string::npos) << line;
    unsigned long lat = 0, us = 0;
    ASSERT_EQ(sscanf(line.c_str() + at, "fnlat: lat=%lu us=%lu", &lat, &us), 2) << line;
    EXPECT_GE(lat, us) << line;
    ++lines;
  }
  EXPECT_EQ(lines, 12);
  // Its histogram: four calls for each time, their latencies summed.
  std::vector<std::string> got = entries(read("events/synthetic/fnlat/hist"));
  ASSERT_EQ(got.size(), 3u) << read("events/synthetic/fnlat/hist");
  const unsigned long us_of[] = {1000, 5000, 20000};
  for (size_t i = 0; i < got.size(); ++i) {
    unsigned long us = 0, hits = 0, sum = 0;
    ASSERT_EQ(sscanf(got[i].c_str(), "{ us: %lu } hitcount: %lu lat: %lu", &us, &hits, &sum), 3)
        << got[i];
    EXPECT_EQ(us, us_of[i]);
    EXPECT_EQ(hits, 4u);
    EXPECT_GE(sum, 4 * us_of[i]);
  }
  // The return event's histogram counted the matches, one entry for the thread.
  EXPECT_EQ(totals(read("events/t/sout/hist")), "Totals:\n    Hits: 12\n    Entries: 1\n    Dropped: 0");
  // Busy while used: the entry histogram (its variable is read), the synthetic event.
  EXPECT_EQ(echo("events/t/sin/trigger", "!hist:keys=common_pid:ts0=common_timestamp.usecs"),
            -EBUSY);
  EXPECT_EQ(echo("events/synthetic/fnlat/enable", "0"), 0);
  EXPECT_EQ(echo("synthetic_events", "!fnlat"), -EBUSY);
  ASSERT_EQ(echo("events/t/sout/trigger",
                 "!hist:keys=common_pid:lat=common_timestamp.usecs-$ts0:"
                 "onmatch(t.sin).trace(fnlat,$lat,ret)"),
            0);
  EXPECT_EQ(echo("events/t/sin/trigger", "!hist:keys=common_pid:ts0=common_timestamp.usecs"), 0);
}

// The entry saves each call's first argument per thread; the return reads it once: the
// synthetic record pairs each call's result with its argument. A return whose entry's
// variable was already read (or never set) matches nothing.
TEST_F(EventHistsTest, AVariableIsReadOnceAndOnlyAfterItWasSet) {
  ASSERT_EQ(echo("synthetic_events", "pair s64 rv; u64 d"), 0);
  ASSERT_EQ(echo("kprobe_events", "r:t/ret " + kProgName + ":traced_add rv=$retval:s64"), 0);
  ASSERT_EQ(echo("events/t/add/trigger", "hist:keys=common_pid:a0=a"), 0);
  ASSERT_EQ(echo("events/t/ret/trigger",
                 "hist:keys=common_pid:vals=$d:d=rv-$a0:onmatch(t.add).pair(rv,$d)"),
            0);
  EXPECT_EQ(read("events/t/ret/trigger"),
            "hist:keys=common_pid:vals=hitcount,$d:d=rv-$a0:sort=hitcount:size=2048:"
            "onmatch(t.add).pair(rv,$d) [active]\n");
  ASSERT_EQ(echo("events/synthetic/pair/enable", "1"), 0);
  ASSERT_TRUE(launch());
  call(5);  // traced_add(i, 2i) returns 3i: d = 3i - i
  std::vector<std::string> got;
  for (const std::string& line : pipe_lines()) got.push_back(line.substr(line.find("pair: ")));
  EXPECT_EQ(got, (std::vector<std::string>{"pair: rv=0 d=0", "pair: rv=3 d=2", "pair: rv=6 d=4",
                                           "pair: rv=9 d=6", "pair: rv=12 d=8"}));
  std::string hist = read("events/t/ret/hist");
  EXPECT_EQ(entries(hist), (std::vector<std::string>{"{ common_pid: " + [&] {
              char pid[16];
              snprintf(pid, sizeof pid, "%10d", pid_);
              return std::string(pid);
            }() + " } hitcount:          5  d:         20"}))
      << hist;
  // The entry probe off: its variable is never set again, so the returns match nothing.
  ASSERT_EQ(echo("events/t/add/trigger", "hist:keys=common_pid:a0=a:pause"), 0);
  call(3);
  EXPECT_TRUE(pipe_lines().empty());
  EXPECT_EQ(totals(read("events/t/ret/hist")), "Totals:\n    Hits: 5\n    Entries: 1\n    Dropped: 0");
}

// An action's param may be a variable of another histogram of the same event, named
// SYSTEM.EVENT.$VAR (the kernel's find_event_var): it is set by the earlier histogram
// on the same hit.
TEST_F(EventHistsTest, AParamReadsAnotherHistogramOfTheSameEvent) {
  ASSERT_EQ(echo("synthetic_events", "pair s64 rv; u64 d"), 0);
  ASSERT_EQ(echo("kprobe_events", "r:t/ret " + kProgName + ":traced_add rv=$retval:s64"), 0);
  ASSERT_EQ(echo("events/t/add/trigger", "hist:keys=common_pid:a0=a"), 0);
  ASSERT_EQ(echo("events/t/ret/trigger", "hist:keys=common_pid:d=rv-$a0"), 0);
  ASSERT_EQ(echo("events/t/ret/trigger",
                 "hist:keys=common_pid:onmatch(t.add).pair(rv,t.ret.$d)"),
            0);
  EXPECT_EQ(echo("events/t/ret/trigger", "hist:keys=common_pid:onmatch(t.add).pair(rv,t.$d)"),
            -EINVAL);
  ASSERT_EQ(echo("events/synthetic/pair/enable", "1"), 0);
  ASSERT_TRUE(launch());
  call(4);  // traced_add(i, 2i) returns 3i: d = 3i - i
  std::vector<std::string> got;
  for (const std::string& line : pipe_lines()) got.push_back(line.substr(line.find("pair: ")));
  EXPECT_EQ(got, (std::vector<std::string>{"pair: rv=0 d=0", "pair: rv=3 d=2", "pair: rv=6 d=4",
                                           "pair: rv=9 d=6"}));
}

// Variables computed with * and /, and constants, summed as values: traced_add(i, 2i)
// for i in [0, 10): a*3 sums 135, b/4 (2i/4, rounded down) sums 20, 100/7 is 14 each time.
TEST_F(EventHistsTest, VariablesMultiplyDivideAndFoldConstants) {
  ASSERT_EQ(echo("events/t/add/trigger", "hist:keys=common_pid:vals=$x,$y:x=a*3,y=b/4"), 0);
  ASSERT_EQ(echo("events/t/add/trigger", "hist:keys=common_pid:vals=$z:z=100/7"), 0);
  EXPECT_EQ(read("events/t/add/trigger"),
            "hist:keys=common_pid:vals=hitcount,$x,$y:x=a*3,y=b/4:sort=hitcount:size=2048 [active]\n"
            "hist:keys=common_pid:vals=hitcount,$z:z=14:sort=hitcount:size=2048 [active]\n");
  ASSERT_TRUE(launch());
  call(10);
  const std::string hist = read("events/t/add/hist");
  const std::vector<std::string> e = entries(hist), f = entries(hist, 1);
  ASSERT_EQ(e.size(), 1u) << hist;
  ASSERT_EQ(f.size(), 1u) << hist;
  EXPECT_NE(e[0].find("hitcount:         10  x:        135  y:         20"), std::string::npos)
      << e[0];
  EXPECT_NE(f[0].find("hitcount:         10  z:        140"), std::string::npos) << f[0];
}

// onmax($lat).save(ret): each entry keeps its largest latency and the return value of the
// call that made it (traced_sleep returns its argument): a 100 ms sleep beside 100 us ones.
// onchange($r).trace(...): a synthetic record each time the return value differs from the
// entry's last one; onmax($r).trace(...): each time it is above every earlier one.
TEST_F(EventHistsTest, OnmaxKeepsTheMaximumWithItsFieldsAndOnchangeFiresOnChanges) {
  ASSERT_EQ(echo("synthetic_events", "changed u64 r"), 0);
  ASSERT_EQ(echo("synthetic_events", "newmax u64 r"), 0);
  ASSERT_EQ(echo("kprobe_events", "p:t/sin " + kProgName + ":traced_sleep us=%di"), 0);
  ASSERT_EQ(echo("kprobe_events", "r:t/sout " + kProgName + ":traced_sleep ret=$retval"), 0);
  ASSERT_EQ(echo("events/t/sin/trigger", "hist:keys=common_pid:ts0=common_timestamp.usecs"), 0);
  const std::string lat_hist =
      "hist:keys=common_pid:lat=common_timestamp.usecs-$ts0:onmax($lat).save(ret,common_pid)";
  ASSERT_EQ(echo("events/t/sout/trigger", lat_hist), 0);
  ASSERT_EQ(echo("events/t/sout/trigger", "hist:keys=common_pid:r=ret:onchange($r).changed($r)"), 0);
  ASSERT_EQ(echo("events/t/sout/trigger", "hist:keys=common_pid:m=ret:onmax($m).trace(newmax,$m)"),
            0);
  EXPECT_EQ(read("events/t/sout/trigger"),
            "hist:keys=common_pid:vals=hitcount:lat=common_timestamp.usecs-$ts0:sort=hitcount:"
            "size=2048:clock=global:onmax($lat).save(ret,common_pid) [active]\n"
            "hist:keys=common_pid:vals=hitcount:r=ret:sort=hitcount:size=2048:"
            "onchange($r).changed($r) [active]\n"
            "hist:keys=common_pid:vals=hitcount:m=ret:sort=hitcount:size=2048:"
            "onmax($m).trace(newmax,$m) [active]\n");
  ASSERT_EQ(echo("events/synthetic/changed/enable", "1"), 0);
  ASSERT_EQ(echo("events/synthetic/newmax/enable", "1"), 0);
  ASSERT_TRUE(launch());
  ASSERT_EQ(pipes_.ask("sleeps 1 100 100000 100 200 150 300 300"), "ok 7");
  std::vector<unsigned long> changed, newmax;
  for (const std::string& line : pipe_lines()) {
    unsigned long r = 0;
    if (const size_t at = line.find("changed: r="); at != std::string::npos) {
      ASSERT_EQ(sscanf(line.c_str() + at, "changed: r=%lu", &r), 1) << line;
      changed.push_back(r);
    } else if (const size_t at2 = line.find("newmax: r="); at2 != std::string::npos) {
      ASSERT_EQ(sscanf(line.c_str() + at2, "newmax: r=%lu", &r), 1) << line;
      newmax.push_back(r);
    } else {
      ADD_FAILURE() << line;
    }
  }
  EXPECT_EQ(changed, (std::vector<unsigned long>{100, 100000, 100, 200, 150, 300}));
  EXPECT_EQ(newmax, (std::vector<unsigned long>{100, 100000}));
  // The entries: the maximum and what was saved with it, on the line after the counts.
  const std::string hist = read("events/t/sout/hist");
  char pid[16];
  snprintf(pid, sizeof pid, "%10d", pid_);
  const std::string key = std::string("{ common_pid: ") + pid + " } hitcount:          7";
  size_t at = hist.find(key + "\n\tmax: ");
  ASSERT_NE(at, std::string::npos) << hist;
  unsigned long max = 0, ret = 0, saved_pid = 0;
  ASSERT_EQ(sscanf(hist.c_str() + at + key.size(), "\n\tmax: %lu  ret: %lu  common_pid: %lu", &max,
                   &ret, &saved_pid),
            3)
      << hist;
  EXPECT_GE(max, 100000u);
  EXPECT_EQ(ret, 100000u);
  EXPECT_EQ(saved_pid, static_cast<unsigned long>(pid_));
  EXPECT_NE(hist.find(key + "\n\tchanged:        300\n"), std::string::npos) << hist;
  EXPECT_NE(hist.find(key + "\n\tmax:     100000\n"), std::string::npos) << hist;
  // Removed by the same command.
  EXPECT_EQ(echo("events/t/sout/trigger", "!" + lat_hist), 0);
  EXPECT_EQ(read("events/t/sout/hist").find("  ret: "), std::string::npos);
}

// A stacktrace key's entries: each stack's lines (as printed, without the indent) and its
// hitcount, in the hist file's order.
struct StackEntry {
  std::vector<std::string> frames;
  unsigned long hits = 0;
};
std::vector<StackEntry> stack_entries(const std::string& hist, const std::string& name) {
  std::vector<StackEntry> out;
  const std::string head = "\n{ " + name + ":\n";
  for (size_t at = hist.find(head); at != std::string::npos; at = hist.find(head, at + 1)) {
    StackEntry e;
    size_t line = at + head.size();
    while (line < hist.size() && hist.compare(line, 9, std::string(9, ' ')) == 0) {
      const size_t nl = hist.find('\n', line);
      e.frames.push_back(hist.substr(line + 9, nl - line - 9));
      line = nl + 1;
    }
    if (sscanf(hist.c_str() + line, "} hitcount: %lu", &e.hits) != 1) return {};
    out.push_back(std::move(e));
  }
  return out;
}

// "NAME+0xOFF/0xSIZE [object]" up to the size: what backtrace() and dladdr say of the
// same address.
std::string up_to_size(const std::string& frame) { return frame.substr(0, frame.find('/')); }

// hist:keys=common_stacktrace on inner(), reached from main through via_a or via_b and
// middle: one entry per stack with its count. Its first line is inner itself (where a
// return probe on inner takes it: the return address in middle); the next ones are the
// return addresses the program's own backtrace() finds inside inner, with frame pointers
// and without (the unwind tables of the code), and the program computes what it would
// untraced.
void EventHistsTest::expect_stacks(const std::string& prog, StackAt at) {
  EventHistsTest* t = this;
  const std::string name = prog.substr(prog.rfind('/') + 1);
  const bool ret = at == StackAt::kReturn;
  auto define = [&] {
    ASSERT_EQ(t->echo("kprobe_events", (ret ? "r:st/inner " : "p:st/inner ") + name + ":inner"), 0);
    ASSERT_EQ(t->echo("events/st/inner/trigger", "hist:keys=common_stacktrace"), 0);
    EXPECT_EQ(t->read("events/st/inner/trigger"),
              "hist:keys=common_stacktrace:vals=hitcount:sort=hitcount:size=2048 [active]\n");
  };
  // The program's own backtrace() stops at a return probe's return point (as at the
  // kernel's uretprobe trampoline): its answer is taken before that probe exists, and
  // the probe goes into the running program.
  if (!ret) define();
  ASSERT_TRUE(t->launch(prog));
  const std::string where = t->pipes_.ask("where");
  ASSERT_EQ(where.substr(0, 3), "ok ") << where;
  const size_t bar = where.find(" | ");
  ASSERT_NE(bar, std::string::npos) << where;
  std::vector<std::string> want_a, want_b;
  std::istringstream a(where.substr(3, bar - 3)), b(where.substr(bar + 3));
  for (std::string w; a >> w;) want_a.push_back(w);
  for (std::string w; b >> w;) want_b.push_back(w);
  ASSERT_EQ(want_a.size(), 3u) << where;
  ASSERT_EQ(want_b.size(), 3u) << where;
  ASSERT_EQ(want_a[0], want_b[0]) << where;
  if (ret) define();
  if (HasFatalFailure()) return;
  if (at == StackAt::kEntryUnderReturnProbes) {
    // Return probes on both callers: while inner runs, their frames' return addresses are
    // the engine's return points, and the walk must see through them.
    ASSERT_EQ(t->echo("kprobe_events", "r:st/mid " + name + ":middle"), 0);
    ASSERT_EQ(t->echo("kprobe_events", "r:st/via " + name + ":via_a"), 0);
    ASSERT_EQ(t->echo("events/st/mid/enable", "1"), 0);
    ASSERT_EQ(t->echo("events/st/via/enable", "1"), 0);
  }
  // via_a(i) = 3i + 3 for i < 5, via_b(i) = 6i + 8 for i < 3: as computed untraced.
  ASSERT_EQ(t->pipes_.ask("run 5 3"), "ok 87");
  const std::string hist = t->read("events/st/inner/hist");
  const std::vector<StackEntry> got = stack_entries(hist, "common_stacktrace");
  ASSERT_FALSE(got.empty()) << hist;
  // Every stack starts at inner (or in middle, where inner returns); its callers are
  // backtrace()'s. `where` called from other lines of main than `run`: its stacks are
  // entries of their own, the run's differ from them in main's return address only.
  const size_t first_caller = ret ? 0 : 1;
  unsigned long total = 0, through_a = 0, through_b = 0, exact_a = 0, exact_b = 0;
  for (const StackEntry& e : got) {
    total += e.hits;
    ASSERT_GE(e.frames.size(), first_caller + 3) << hist;
    if (!ret) {
      EXPECT_EQ(up_to_size(e.frames[0]), "inner+0x0") << hist;
    }
    const std::vector<std::string> seen = {up_to_size(e.frames[first_caller]),
                                           up_to_size(e.frames[first_caller + 1]),
                                           up_to_size(e.frames[first_caller + 2])};
    EXPECT_EQ(seen[0], want_a[0]) << hist;  // middle, whichever way
    if (seen[1] == want_a[1]) through_a += e.hits;
    if (seen[1] == want_b[1]) through_b += e.hits;
    if (seen == want_a) exact_a += e.hits;
    if (seen == want_b) exact_b += e.hits;
  }
  // `where`'s two calls are counted when the probe was there before them.
  const unsigned long traced_where = ret ? 0 : 1;
  EXPECT_EQ(total, 8 + 2 * traced_where) << hist;
  EXPECT_EQ(got.size(), 2 + 2 * traced_where) << hist;
  EXPECT_EQ(through_a, 5 + traced_where) << hist;
  EXPECT_EQ(through_b, 3 + traced_where) << hist;
  EXPECT_EQ(exact_a, traced_where) << hist;
  EXPECT_EQ(exact_b, traced_where) << hist;
  EXPECT_NE(hist.find("Totals:\n    Hits: " + std::to_string(total) +
                      "\n    Entries: " + std::to_string(got.size()) +
                      "\n    Dropped: 0"),
            std::string::npos)
      << hist;
  // The program gone, its stacks are still named as they were.
  ASSERT_EQ(t->pipes_.ask("quit"), "");
  int status = -1;
  ASSERT_EQ(t->tracer_->wait_exit(t->pid_, 30000, &status), 0);
  t->pid_ = 0;
  EXPECT_EQ(t->read("events/st/inner/hist"), hist);
}

TEST_F(EventHistsTest, StackKeysWithFramePointersNameEveryCallerBacktraceFinds) {
  expect_stacks(PROBEFS_STACK_PROG_FP, StackAt::kEntry);
}

TEST_F(EventHistsTest, StackKeysSeeThroughTheReturnPointsOfReturnProbes) {
  expect_stacks(PROBEFS_STACK_PROG_FP, StackAt::kEntryUnderReturnProbes);
}

TEST_F(EventHistsTest, StackKeysWithoutFramePointersNameEveryCallerBacktraceFinds) {
  expect_stacks(PROBEFS_STACK_PROG_NOFP, StackAt::kEntry);
}

TEST_F(EventHistsTest, StackKeysWithoutFramePointersSeeThroughReturnPointsToo) {
  expect_stacks(PROBEFS_STACK_PROG_NOFP, StackAt::kEntryUnderReturnProbes);
}

// A return probe's stack starts where its function returns to: in the middle of the
// caller, whose frame the unwind tables describe there.
TEST_F(EventHistsTest, StackKeysOfAReturnProbeStartInTheCallerWithoutFramePointers) {
  expect_stacks(PROBEFS_STACK_PROG_NOFP, StackAt::kReturn);
}

TEST_F(EventHistsTest, StackKeysOfAReturnProbeStartInTheCallerWithFramePointers) {
  expect_stacks(PROBEFS_STACK_PROG_FP, StackAt::kReturn);
}

// What cannot resolve is refused as the kernel refuses it, with its error_log entry.
TEST_F(EventHistsTest, InterEventErrorsAreTheKernels) {
  ASSERT_EQ(echo("synthetic_events", "one u64 v"), 0);
  auto last_error = [&] {
    const std::string log = read("error_log");
    const size_t at = log.rfind("error: ");
    return at == std::string::npos ? log : log.substr(at);
  };
  EXPECT_EQ(echo("events/t/add/trigger", "hist:keys=common_pid:d=b-$nope"), -EINVAL);
  EXPECT_EQ(last_error().substr(0, 29), "error: Couldn't find variable");
  EXPECT_EQ(echo("events/t/add/trigger", "hist:keys=common_pid:onmatch(t.add).nope(common_pid)"), -EINVAL);
  EXPECT_EQ(last_error().substr(0, 36), "error: Couldn't find synthetic event");
  EXPECT_EQ(echo("events/t/add/trigger", "hist:keys=common_pid:onmatch(t.add).one(common_pid,common_pid)"), -EINVAL);
  EXPECT_EQ(last_error().substr(0, 60), "error: Param count doesn't match synthetic event field count");
  EXPECT_EQ(echo("events/t/add/trigger", "hist:keys=common_pid:onmatch(t.add).one(zz)"), -EINVAL);
  EXPECT_EQ(last_error().substr(0, 26), "error: Couldn't find param");
  EXPECT_EQ(echo("events/t/add/trigger", "hist:keys=common_pid:onmatch(x.y).one(common_pid)"), -EINVAL);
  EXPECT_EQ(last_error().substr(0, 38), "error: Invalid subsystem or event name");
  // A variable belongs to its event: a second histogram there cannot define it again.
  ASSERT_EQ(echo("events/t/add/trigger", "hist:keys=common_pid:va=a"), 0);
  EXPECT_EQ(echo("events/t/add/trigger", "hist:keys=a:va=b"), -EINVAL);
  EXPECT_EQ(last_error().substr(0, 31), "error: Variable already defined");
  EXPECT_NE(read("error_log").find("hist:keys=a:va=b\n" + std::string(11 + 12, ' ') + "^"),
            std::string::npos)
      << read("error_log");
  ASSERT_EQ(echo("events/t/add/trigger", "!hist:keys=common_pid:va=a"), 0);
  // Nothing was added by any of them.
  EXPECT_EQ(read("events/t/add/trigger"),
            "# Available triggers:\n"
            "# traceon traceoff snapshot stacktrace enable_event disable_event hist\n");
}
}  // namespace
}  // namespace probefs::fs
