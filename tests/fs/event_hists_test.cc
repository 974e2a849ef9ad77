// Hist triggers on real processes: events defined through kprobe_events, hist triggers
// written to their trigger files, the bundled traced_prog making known calls, and the
// hist files read back: the counts are what the program did, exactly, however many
// threads did it, and an event that only aggregates records nothing.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>

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
            "# Available triggers:\n# traceon traceoff enable_event disable_event hist\n");
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

}  // namespace
}  // namespace probefs::fs
