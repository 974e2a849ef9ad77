// trace_marker's event, events/ftrace/print, with triggers and histograms on a real mount
// (fs/marker_event.cc): what its trigger file takes, traceoff and snapshot acting on the
// write that matches, histograms of the written texts per buffer, and a latency between
// two markers as a synthetic event, as the kernel documents them for trace_marker.
//
// Nothing here can hang: reads are non-blocking, the mount is taken down whatever a test
// did.

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cinttypes>
#include <map>
#include <regex>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "tests/fs/elf_symbols.h"
#include "tests/fs/mount_fixture.h"
#include "tests/fs/trace_lines.h"

namespace probefs::fs {
namespace {

using testing::find_elf_symbol;
using testing::Mount;
using testing::trace_body_lines;

const std::string kProg = PROBEFS_TRACED_PROG;
const std::string kPrint = "events/ftrace/print/";
const std::string kNoTriggers =
    "# Available triggers:\n# traceon traceoff snapshot enable_event disable_event hist\n";

class MarkerEventTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(m_.ok()) << m_.daemon_stderr(); }
  void TearDown() override { EXPECT_EQ(m_.unmount(), 0) << m_.daemon_stderr(); }

  std::string read(const std::string& rel) const { return m_.read(rel); }
  // One write, as `echo -n TEXT >> FILE`: 0 or the errno.
  int append(const std::string& rel, const std::string& text) { return m_.write(rel, text); }
  int mark(const std::string& text, const std::string& dir = "") {
    return m_.write(dir + "trace_marker", text, O_WRONLY | O_TRUNC);
  }
  // The marker texts of a trace file, in order.
  std::vector<std::string> marks(const std::string& rel) const {
    std::vector<std::string> out;
    for (const std::string& l : trace_body_lines(read(rel))) {
      const std::string tag = ": tracing_mark_write: ";
      if (const size_t at = l.find(tag); at != std::string::npos) out.push_back(l.substr(at + tag.size()));
    }
    return out;
  }
  // A hist file's entries: key text (what is between the braces, its blanks and newlines
  // each one space, trimmed) to hitcount.
  static std::map<std::string, uint64_t> entries(const std::string& hist) {
    std::map<std::string, uint64_t> out;
    static const std::regex entry(R"(\{ ([^}]*)\} hitcount:\s*(\d+))");
    for (auto it = std::sregex_iterator(hist.begin(), hist.end(), entry);
         it != std::sregex_iterator(); ++it) {
      std::string key;
      for (char c : (*it)[1].str()) {
        const bool blank = c == ' ' || c == '\n';
        if (!blank) key.push_back(c);
        else if (!key.empty() && key.back() != ' ') key.push_back(' ');
      }
      if (!key.empty() && key.back() == ' ') key.pop_back();
      out[key] += std::stoull((*it)[2]);
    }
    return out;
  }
  static std::string place(const char* sym) {
    const testing::ElfSymbol s = find_elf_symbol(kProg, sym);
    EXPECT_TRUE(s.found) << sym;
    char b[32];
    snprintf(b, sizeof b, "0x%" PRIx64, s.file_offset);
    return kProg + ":" + b;
  }

  Mount m_;
};

TEST_F(MarkerEventTest, TriggerFileTakesTheCommandsOfThePrintEvent) {
  EXPECT_EQ(read(kPrint + "trigger"), kNoTriggers);
  EXPECT_EQ(read(kPrint + "hist"), "");
  // The writer's stack is not the daemon's to take; unknown words and events are refused.
  for (const char* bad : {"stacktrace", "bogus", "enable_event:nogroup:noevent", "traceoff if",
                          "traceoff if nofield == 1"})
    EXPECT_EQ(append(kPrint + "trigger", bad), EINVAL) << bad;
  EXPECT_EQ(append(kPrint + "trigger", "traceoff:2 if buf == \"x\""), 0);
  EXPECT_EQ(append(kPrint + "trigger", "traceon"), EEXIST);  // one place for both
  EXPECT_EQ(append(kPrint + "trigger", "snapshot:1"), 0);
  EXPECT_EQ(read(kPrint + "trigger"),
            "snapshot:count=1\ntraceoff:count=2 if buf == \"x\"\n");
  EXPECT_EQ(append(kPrint + "trigger", "!traceoff"), 0);
  EXPECT_EQ(append(kPrint + "trigger", "!snapshot"), 0);
  EXPECT_EQ(read(kPrint + "trigger"), kNoTriggers);

  // enable_event: a top-level event, held in soft mode by it, switched at the write.
  ASSERT_EQ(append("uprobe_events", "p:grp/add " + place("traced_add") + " a=%di"), 0);
  EXPECT_EQ(append(kPrint + "trigger", "enable_event:grp:add:1"), 0);
  EXPECT_EQ(read("events/grp/add/enable"), "0*\n");
  EXPECT_EQ(mark("unrelated"), 0);
  EXPECT_EQ(read("events/grp/add/enable"), "1*\n");
  EXPECT_EQ(read(kPrint + "trigger"), "enable_event:grp:add:count=0\n");
  // An instance's print triggers act on its own buffer: the event's enable there.
  ASSERT_EQ(::mkdir(m_.path("instances/in").c_str(), 0755), 0);
  const std::string in = "instances/in/";
  EXPECT_EQ(read(in + kPrint + "trigger"), kNoTriggers);
  EXPECT_EQ(append(in + kPrint + "trigger", "enable_event:grp:add"), 0);
  EXPECT_EQ(read(in + "events/grp/add/enable"), "0*\n");
  EXPECT_EQ(mark("top"), 0);
  EXPECT_EQ(read(in + "events/grp/add/enable"), "0*\n");
  EXPECT_EQ(mark("in", in), 0);
  EXPECT_EQ(read(in + "events/grp/add/enable"), "1*\n");
  EXPECT_EQ(read(kPrint + "trigger"), "enable_event:grp:add:count=0\n");
  EXPECT_EQ(read(in + kPrint + "trigger"), "enable_event:grp:add:unlimited\n");
  // The instance goes with its triggers, and the soft mode they held there.
  EXPECT_EQ(::rmdir(m_.path("instances/in").c_str()), 0);
  EXPECT_EQ(append(kPrint + "trigger", "!enable_event:grp:add"), 0);
  EXPECT_EQ(read("events/grp/add/enable"), "1\n");  // soft-enabled, then out of soft mode
}

TEST_F(MarkerEventTest, TraceoffStopsTheBufferAfterTheWriteItMatches) {
  ASSERT_EQ(append(kPrint + "trigger", "traceoff if buf == \"stop\""), 0);
  EXPECT_EQ(mark("go"), 0);
  EXPECT_EQ(read("tracing_on"), "1\n");
  EXPECT_EQ(mark("stop"), 0);
  EXPECT_EQ(read("tracing_on"), "0\n");
  EXPECT_EQ(mark("after"), EBADF);  // the kernel's answer while the buffer takes nothing
  EXPECT_EQ(marks("trace"), (std::vector<std::string>{"go", "stop"}));
  // In an instance: its own tracing_on, not the top level's.
  ASSERT_EQ(append("tracing_on", "1"), 0);
  ASSERT_EQ(::mkdir(m_.path("instances/in").c_str(), 0755), 0);
  ASSERT_EQ(append("instances/in/" + kPrint + "trigger", "traceoff"), 0);
  EXPECT_EQ(mark("stop", "instances/in/"), 0);
  EXPECT_EQ(read("instances/in/tracing_on"), "0\n");
  EXPECT_EQ(read("tracing_on"), "1\n");
  EXPECT_EQ(mark("go"), 0);  // the top level's trigger matches only "stop"
  EXPECT_EQ(read("tracing_on"), "1\n");
  EXPECT_EQ(::rmdir(m_.path("instances/in").c_str()), 0);
}

TEST_F(MarkerEventTest, HistogramsCountEachBuffersTextsApart) {
  ASSERT_EQ(::mkdir(m_.path("instances/in").c_str(), 0755), 0);
  ASSERT_EQ(append(kPrint + "trigger", "hist:keys=buf"), 0);
  ASSERT_EQ(append("instances/in/" + kPrint + "trigger", "hist:keys=common_pid"), 0);
  EXPECT_EQ(read(kPrint + "trigger"), "hist:keys=buf:vals=hitcount:sort=hitcount:size=2048 [active]\n");
  for (const char* t : {"a", "b", "a", "c\n", "b", "a"}) EXPECT_EQ(mark(t), 0) << t;
  for (int i = 0; i < 4; ++i) EXPECT_EQ(mark("z", "instances/in/"), 0);
  const std::string hist = read(kPrint + "hist");
  const auto top = entries(hist);
  EXPECT_EQ(top.size(), 3u) << hist;
  EXPECT_EQ(top.at("buf: a"), 3u);
  EXPECT_EQ(top.at("buf: b"), 2u);
  EXPECT_EQ(top.at("buf: c"), 1u);
  // The text as written, before the newline a record gets where it has none: "a", not
  // "a\n"; "c\n" as it came.
  EXPECT_NE(hist.find("{ buf: a "), std::string::npos) << hist;
  EXPECT_NE(hist.find("{ buf: c\n"), std::string::npos) << hist;
  EXPECT_NE(hist.find("Hits: 6\n"), std::string::npos) << hist;
  const std::string in = read("instances/in/" + kPrint + "hist");
  const auto ins = entries(in);
  ASSERT_EQ(ins.size(), 1u) << in;
  EXPECT_EQ(ins.begin()->first, "common_pid: " + std::to_string(::gettid()));
  EXPECT_EQ(ins.begin()->second, 4u);
  // The instance goes with its histogram.
  EXPECT_EQ(::rmdir(m_.path("instances/in").c_str()), 0);
  EXPECT_EQ(append(kPrint + "trigger", "!hist:keys=buf"), 0);
  EXPECT_EQ(read(kPrint + "hist"), "");
}

TEST_F(MarkerEventTest, LatencyBetweenTwoMarkersIsASyntheticEvent) {
  ASSERT_EQ(append("synthetic_events", "latency u64 lat"), 0);
  ASSERT_EQ(append("events/synthetic/latency/enable", "1"), 0);
  ASSERT_EQ(append(kPrint + "trigger",
                   "hist:keys=common_pid:ts0=common_timestamp.usecs if buf == \"start\""),
            0);
  ASSERT_EQ(append(kPrint + "trigger",
                   "hist:keys=common_pid:lat=common_timestamp.usecs-$ts0:"
                   "onmatch(ftrace.print).latency($lat) if buf == \"end\""),
            0);
  ASSERT_EQ(append("events/synthetic/latency/trigger", "hist:keys=common_pid,lat:sort=lat"), 0);
  EXPECT_EQ(mark("end"), 0);  // no start yet: nothing fires
  EXPECT_EQ(mark("start"), 0);
  EXPECT_EQ(mark("end"), 0);
  EXPECT_EQ(mark("end"), 0);  // $ts0 was read once: nothing fires
  // Each of the two histograms has one entry of this thread: one "start", one "end" that
  // found its $ts0 (the first "end" found none, the last found it read).
  const std::string print = read(kPrint + "hist");
  const std::string pid = "common_pid: " + std::to_string(::gettid());
  EXPECT_EQ(entries(print), (std::map<std::string, uint64_t>{{pid, 2}})) << print;
  EXPECT_NE(print.find("Hits: 1\n"), std::string::npos) << print;
  const auto lat = entries(read("events/synthetic/latency/hist"));
  ASSERT_EQ(lat.size(), 1u) << read("events/synthetic/latency/hist");
  EXPECT_EQ(lat.begin()->second, 1u);
  EXPECT_EQ(lat.begin()->first.rfind(pid + ", lat: ", 0), 0u) << lat.begin()->first;
  // The synthetic event's record, after the marker that fired it.
  std::vector<std::string> lines;
  for (const std::string& l : trace_body_lines(read("trace")))
    if (l.find("tracing_mark_write") != std::string::npos || l.find(" latency: ") != std::string::npos)
      lines.push_back(l);
  ASSERT_EQ(lines.size(), 5u) << read("trace");
  EXPECT_NE(lines[2].find("tracing_mark_write: end"), std::string::npos) << lines[2];
  EXPECT_TRUE(std::regex_search(lines[3], std::regex(R"( latency: lat=\d+$)"))) << lines[3];
  // Nothing may go while the action writes the synthetic event.
  EXPECT_EQ(append("synthetic_events", "!latency"), EBUSY);
}

TEST_F(MarkerEventTest, SnapshotTriggerSwapsTheBufferAndItsSnapshot) {
  for (const std::string dir : {"", "instances/in/"}) {
    SCOPED_TRACE(dir);
    if (!dir.empty()) {
      ASSERT_EQ(::mkdir(m_.path("instances/in").c_str(), 0755), 0);
    }
    EXPECT_NE(read(dir + "snapshot").find("Snapshot is freed"), std::string::npos);
    ASSERT_EQ(append(dir + kPrint + "trigger", "snapshot"), 0);
    EXPECT_NE(read(dir + "snapshot").find("Snapshot is allocated"), std::string::npos);
    for (int i = 1; i <= 6; ++i) EXPECT_EQ(mark("m" + std::to_string(i), dir), 0);
    // Each write swaps: the buffer then holds every other text, the snapshot the rest.
    EXPECT_EQ(marks(dir + "trace"), (std::vector<std::string>{"m1", "m3", "m5"}));
    EXPECT_EQ(marks(dir + "snapshot"), (std::vector<std::string>{"m2", "m4", "m6"}));
    // A consumer reads the records the swap gave back first.
    ASSERT_EQ(append(dir + kPrint + "trigger", "!snapshot"), 0);
    EXPECT_EQ(mark("m7", dir), 0);
    EXPECT_EQ(marks(dir + "trace"), (std::vector<std::string>{"m1", "m3", "m5", "m7"}));
    std::vector<std::string> piped;
    const std::string pipe = read(dir + "trace_pipe");
    for (size_t at = 0; (at = pipe.find("tracing_mark_write: ", at)) != std::string::npos;) {
      at += 20;
      piped.push_back(pipe.substr(at, pipe.find('\n', at) - at));
    }
    EXPECT_EQ(piped, (std::vector<std::string>{"m1", "m3", "m5", "m7"}));
    EXPECT_EQ(marks(dir + "trace"), std::vector<std::string>{});
  }
  EXPECT_EQ(::rmdir(m_.path("instances/in").c_str()), 0);
}

}  // namespace
}  // namespace probefs::fs
