// instances/ on a real mount (fs/instances.h): mkdir makes a trace buffer of its own, with
// its own event enables, tracing_on, trace_marker and readers; rmdir takes it away. A
// program under `probefs exec` records into each buffer its events are enabled in, and
// into no other.
//
// Nothing here can hang: reads are non-blocking, programs and commands have timeouts,
// the mount is taken down whatever a test did.

#include <fcntl.h>
#include <poll.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cinttypes>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "tests/fs/elf_symbols.h"
#include "tests/fs/mount_fixture.h"
#include "tests/fs/program_process.h"
#include "tests/fs/trace_lines.h"

namespace probefs::fs {
namespace {

using testing::find_elf_symbol;
using testing::Mount;
using testing::ProgramProcess;
using testing::trace_body_lines;

const std::string kProg = PROBEFS_TRACED_PROG;

std::string place(const char* sym) {
  const testing::ElfSymbol s = find_elf_symbol(kProg, sym);
  EXPECT_TRUE(s.found) << sym;
  char b[32];
  snprintf(b, sizeof b, "0x%" PRIx64, s.file_offset);
  return kProg + ":" + b;
}

class InstancesTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(m_.ok()) << m_.daemon_stderr(); }
  void TearDown() override { EXPECT_EQ(m_.unmount(), 0) << m_.daemon_stderr(); }

  std::string read(const std::string& rel) const { return m_.read(rel); }
  // A write that must succeed (O_TRUNC, as `echo >`).
  void put(const std::string& rel, const std::string& text) {
    EXPECT_EQ(m_.write(rel, text, O_WRONLY | O_TRUNC), 0) << rel << " < " << text;
  }
  int make(const std::string& name) {
    return ::mkdir(m_.path("instances/" + name).c_str(), 0755) == 0 ? 0 : errno;
  }
  int remove(const std::string& name) {
    return ::rmdir(m_.path("instances/" + name).c_str()) == 0 ? 0 : errno;
  }
  bool exists(const std::string& rel) const {
    struct stat st;
    return ::stat(m_.path(rel).c_str(), &st) == 0;
  }
  // The `add` lines of a trace file: their arguments, in order.
  std::vector<std::string> adds(const std::string& rel) const {
    std::vector<std::string> out;
    for (const std::string& l : trace_body_lines(read(rel))) {
      const size_t at = l.find(" a=");
      if (l.find(" add: (") != std::string::npos && at != std::string::npos)
        out.push_back(l.substr(at + 1));
    }
    return out;
  }
  std::unique_ptr<ProgramProcess> exec_program() {
    auto p = std::make_unique<ProgramProcess>(ProgramProcess::under_probefs(m_.dir()));
    EXPECT_TRUE(p->ready()) << m_.daemon_stderr();
    return p;
  }

  Mount m_;
};

using Lines = std::vector<std::string>;

TEST_F(InstancesTest, AnInstanceHasItsOwnBufferEnablesAndSwitch) {
  ASSERT_EQ(m_.write("uprobe_events", "p:in/add " + place("traced_add") + " a=%di\n"), 0);
  ASSERT_EQ(make("one"), 0);
  // The kernel's instance files, and none of the top level's alone.
  for (const char* f : {"trace", "trace_pipe", "tracing_on", "trace_marker", "trace_marker_raw",
                        "set_event", "set_event_pid", "buffer_size_kb", "trace_clock",
                        "options/event-fork", "per_cpu/cpu0/trace_pipe_raw", "events/enable",
                        "events/in/enable", "events/in/add/enable", "events/in/add/format",
                        "events/in/add/id", "events/ftrace/print/format"})
    EXPECT_TRUE(exists("instances/one/" + std::string(f))) << f;
  for (const char* f : {"uprobe_events", "saved_cmdlines", "README", "instances"})
    EXPECT_FALSE(exists("instances/one/" + std::string(f))) << f;
  EXPECT_EQ(read("instances/one/tracing_on"), "1\n");
  EXPECT_EQ(read("instances/one/events/in/add/id"), read("events/in/add/id"));

  // Enabled in the instance alone: its records are there and not at the top level.
  put("instances/one/events/in/add/enable", "1");
  EXPECT_EQ(read("instances/one/events/in/add/enable"), "1\n");
  EXPECT_EQ(read("events/in/add/enable"), "0\n");
  EXPECT_EQ(read("instances/one/set_event"), "in:add\n");
  EXPECT_EQ(read("set_event"), "");
  EXPECT_EQ(read("instances/one/events/enable"), "1\n");
  EXPECT_EQ(read("events/enable"), "0\n");
  auto prog = exec_program();
  ASSERT_TRUE(prog->call(3));
  EXPECT_EQ(adds("instances/one/trace"), (Lines{"a=0x0", "a=0x1", "a=0x2"}));
  EXPECT_EQ(adds("trace"), Lines{});

  // Both: each buffer gets every record.
  put("events/in/add/enable", "1");
  ASSERT_TRUE(prog->call(2));
  EXPECT_EQ(adds("trace"), (Lines{"a=0x0", "a=0x1"}));
  EXPECT_EQ(adds("instances/one/trace"), (Lines{"a=0x0", "a=0x1", "a=0x2", "a=0x0", "a=0x1"}));

  // Enabled in an instance, an event is busy.
  put("events/in/add/enable", "0");
  EXPECT_EQ(m_.write("uprobe_events", "-:in/add\n"), EBUSY);
  EXPECT_EQ(m_.write("uprobe_events", "", O_WRONLY | O_TRUNC), EBUSY);

  // The instance's switch, marker, clear and consuming read are its own.
  put("instances/one/tracing_on", "0");
  EXPECT_EQ(read("tracing_on"), "1\n");
  ASSERT_TRUE(prog->call(1));
  EXPECT_EQ(adds("instances/one/trace").size(), 5u);
  EXPECT_EQ(m_.write("instances/one/trace_marker", "off\n"), EBADF);
  put("instances/one/tracing_on", "1");
  ASSERT_EQ(m_.write("instances/one/trace_marker", "in the instance\n"), 0);
  EXPECT_NE(read("instances/one/trace").find("tracing_mark_write: in the instance"),
            std::string::npos);
  EXPECT_EQ(read("trace").find("in the instance"), std::string::npos);
  put("instances/one/trace", "");
  EXPECT_EQ(trace_body_lines(read("instances/one/trace")), Lines{});
  EXPECT_EQ(adds("trace"), (Lines{"a=0x0", "a=0x1"}));
  ASSERT_TRUE(prog->call(2));
  const std::string piped = read("instances/one/trace_pipe");
  EXPECT_NE(piped.find(" a=0x1\n"), std::string::npos) << piped;
  EXPECT_EQ(read("instances/one/trace_pipe"), "");  // consumed
  EXPECT_EQ(adds("trace"), (Lines{"a=0x0", "a=0x1"}));  // the top level's untouched

  // set_event in the instance, and its truncation.
  put("instances/one/set_event", "");
  EXPECT_EQ(read("instances/one/events/in/add/enable"), "0\n");
  ASSERT_EQ(m_.write("instances/one/set_event", "in:add\n"), 0);
  EXPECT_EQ(read("instances/one/events/in/add/enable"), "1\n");

  // Names: taken, absent; rmdir disables the instance's events, and the event can go.
  EXPECT_EQ(make("one"), EEXIST);
  EXPECT_EQ(remove("two"), ENOENT);
  EXPECT_EQ(remove("one"), 0);
  EXPECT_FALSE(exists("instances/one"));
  EXPECT_EQ(m_.write("uprobe_events", "-:in/add\n"), 0);
  EXPECT_EQ(read("uprobe_events"), "");
  EXPECT_EQ(prog->ask("call 1"), "ok 0");  // the program ran on unharmed
}

TEST_F(InstancesTest, ANewInstanceStartsEmptyAndTheirNumberIsBounded) {
  ASSERT_EQ(m_.write("uprobe_events", "p:in/add " + place("traced_add") + " a=%di\n"), 0);
  ASSERT_EQ(make("a"), 0);
  put("instances/a/events/in/enable", "1");
  auto prog = exec_program();
  ASSERT_TRUE(prog->call(2));
  EXPECT_EQ(adds("instances/a/trace").size(), 2u);
  put("instances/a/tracing_on", "0");
  ASSERT_EQ(remove("a"), 0);
  // Its buffer, taken again, holds nothing of before and is on.
  ASSERT_EQ(make("b"), 0);
  EXPECT_EQ(trace_body_lines(read("instances/b/trace")), Lines{});
  EXPECT_EQ(read("instances/b/tracing_on"), "1\n");
  EXPECT_EQ(read("instances/b/events/in/add/enable"), "0\n");
  ASSERT_TRUE(prog->call(1));
  EXPECT_EQ(trace_body_lines(read("instances/b/trace")), Lines{});
  // Fifteen at once, the sixteenth refused.
  std::vector<std::string> made = {"b"};
  for (int i = 0; i < 14; ++i) {
    made.push_back("n" + std::to_string(i));
    ASSERT_EQ(make(made.back()), 0) << i;
  }
  EXPECT_EQ(make("one-too-many"), ENOSPC);
  for (const std::string& n : made) EXPECT_EQ(remove(n), 0) << n;
  EXPECT_EQ(read("events/in/add/enable"), "0\n");
}

// A reader waiting on an instance's trace_pipe wakes for the instance's records; the top
// level's trace_pipe has none to give.
TEST_F(InstancesTest, AnInstancesPipeWakesForItsRecords) {
  ASSERT_EQ(m_.write("uprobe_events", "p:in/add " + place("traced_add") + " a=%di\n"), 0);
  ASSERT_EQ(make("w"), 0);
  put("instances/w/events/in/add/enable", "1");
  auto prog = exec_program();
  const int in = ::open(m_.path("instances/w/trace_pipe").c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  const int top = ::open(m_.path("trace_pipe").c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  ASSERT_GE(in, 0);
  ASSERT_GE(top, 0);
  char b[4096];
  EXPECT_EQ(::read(in, b, sizeof b), -1);
  EXPECT_EQ(errno, EAGAIN);
  ASSERT_TRUE(prog->send("call 1"));  // its answer is read once the reader woke
  pollfd p{in, POLLIN, 0};
  ASSERT_EQ(::poll(&p, 1, 20000), 1);
  const ssize_t n = ::read(in, b, sizeof b);
  ASSERT_GT(n, 0);
  EXPECT_NE(std::string(b, static_cast<size_t>(n)).find(" add: ("), std::string::npos);
  pollfd q{top, POLLIN, 0};
  EXPECT_EQ(::poll(&q, 1, 0), 0);
  EXPECT_EQ(prog->answer(), "ok 0");
  ::close(in);
  ::close(top);
  ASSERT_EQ(remove("w"), 0);
}

// An event's filter in an instance is the instance's own: its records there are
// filtered as the filter says, the top level's and another instance's are not.
TEST_F(InstancesTest, AnInstancesFilterIsItsOwn) {
  ASSERT_EQ(m_.write("uprobe_events", "p:in/add " + place("traced_add") + " a=%di\n"), 0);
  ASSERT_EQ(make("odd"), 0);
  ASSERT_EQ(make("all"), 0);
  put("instances/odd/events/in/add/filter", "a == 1 || a == 3");
  EXPECT_EQ(read("instances/odd/events/in/add/filter"), "a == 1 || a == 3\n");
  EXPECT_EQ(read("instances/all/events/in/add/filter"), "none\n");
  EXPECT_EQ(read("events/in/add/filter"), "none\n");
  for (const char* en : {"events/in/add/enable", "instances/odd/events/in/add/enable",
                         "instances/all/events/in/add/enable"})
    put(en, "1");
  auto prog = exec_program();
  ASSERT_TRUE(prog->call(5));
  EXPECT_EQ(adds("instances/odd/trace"), (Lines{"a=0x1", "a=0x3"}));
  EXPECT_EQ(adds("instances/all/trace").size(), 5u);
  EXPECT_EQ(adds("trace").size(), 5u);
  // A filter that does not compile: EINVAL, the kernel's text in the file, an entry in
  // error_log; the group's filter sets every event's in the instance alone.
  EXPECT_EQ(m_.write("instances/all/events/in/add/filter", "zzz == 1", O_WRONLY | O_TRUNC), EINVAL);
  EXPECT_EQ(read("instances/all/events/in/add/filter"),
            "zzz == 1\n    ^\nparse_error: Field not found\n\n");
  EXPECT_NE(read("error_log").find("Field not found"), std::string::npos);
  put("instances/all/events/in/filter", "a == 4");
  EXPECT_EQ(read("instances/all/events/in/add/filter"), "a == 4\n");
  EXPECT_EQ(read("instances/odd/events/in/add/filter"), "a == 1 || a == 3\n");
  put("instances/all/trace", "");
  ASSERT_TRUE(prog->call(5));
  EXPECT_EQ(adds("instances/all/trace"), Lines{"a=0x4"});
  put("instances/odd/events/in/add/filter", "0");
  EXPECT_EQ(read("instances/odd/events/in/add/filter"), "none\n");
  EXPECT_EQ(adds("trace").size(), 10u);
  ASSERT_EQ(remove("odd"), 0);
  ASSERT_EQ(remove("all"), 0);
}

// As the kernel's instance-event selftest: instances made and removed from several
// threads while others enable events in them and a program records: nothing breaks, and
// what is left is what was made last.
TEST_F(InstancesTest, MadeAndRemovedWhileEventsAreEnabledInThem) {
  ASSERT_EQ(m_.write("uprobe_events", "p:in/add " + place("traced_add") + " a=%di\n"), 0);
  auto prog = exec_program();
  std::atomic<bool> stop{false};
  std::vector<std::thread> threads;
  for (const char* name : {"x", "y", "z"}) {
    threads.emplace_back([&, name] {
      for (int i = 0; i < 150; ++i) {
        (void)make(name);
        (void)m_.write(std::string("instances/") + name + "/events/enable", "1\n",
                       O_WRONLY | O_TRUNC);
        (void)remove(name);
      }
    });
  }
  threads.emplace_back([&] {
    while (!stop) (void)m_.write("instances/x/events/in/add/enable", "1\n", O_WRONLY | O_TRUNC);
  });
  for (int i = 0; i < 3; ++i) threads[i].join();
  stop = true;
  threads[3].join();
  ASSERT_TRUE(prog->call(50));
  for (const char* name : {"x", "y", "z"}) EXPECT_FALSE(exists(std::string("instances/") + name));
  // Nothing holds the event: it goes.
  EXPECT_EQ(m_.write("uprobe_events", "-:in/add\n"), 0);
  EXPECT_EQ(prog->ask("call 1"), "ok 0");
}

// An instance's event files have their own triggers and histograms, held and run apart
// from the top level's: they act on the instance's buffer (its tracing_on, the soft mode
// of its events there) and show only there; rmdir takes them away.
TEST_F(InstancesTest, TriggersAndHistogramsOfAnInstanceActOnItsBuffer) {
  ASSERT_EQ(m_.write("uprobe_events", "p:in/add " + place("traced_add") + " a=%di\n"), 0);
  ASSERT_EQ(m_.write("uprobe_events", "r:in/ret " + place("traced_add") + " r=$retval\n"), 0);
  ASSERT_EQ(make("t"), 0);
  const std::string t = "instances/t/events/in/";
  const std::string none =
      "# Available triggers:\n# traceon traceoff snapshot stacktrace enable_event disable_event hist\n";
  EXPECT_EQ(read(t + "add/trigger"), none);
  put(t + "add/enable", "1");
  // enable_event: its target in soft mode in the instance alone.
  ASSERT_EQ(m_.write(t + "add/trigger", "enable_event:in:ret:1"), 0);
  EXPECT_EQ(read(t + "ret/enable"), "0*\n");
  EXPECT_EQ(read("events/in/ret/enable"), "0\n");
  EXPECT_EQ(read("events/in/add/trigger"), none);
  auto prog = exec_program();
  ASSERT_TRUE(prog->call(2));
  EXPECT_EQ(read(t + "ret/enable"), "1*\n");
  EXPECT_EQ(read("events/in/ret/enable"), "0\n");
  EXPECT_EQ(read(t + "add/trigger"), "enable_event:in:ret:count=0\n");
  auto count = [&](const std::string& rel, const std::string& what) {
    size_t n = 0;
    for (const std::string& l : trace_body_lines(read(rel))) n += l.find(what) != std::string::npos;
    return n;
  };
  // The first call's return comes after the hit that enabled it.
  EXPECT_EQ(count("instances/t/trace", " ret: ("), 2u);
  EXPECT_EQ(count("instances/t/trace", " add: ("), 2u);
  EXPECT_EQ(trace_body_lines(read("trace")), Lines{});

  // traceoff with a filter: the instance's tracing_on, at the hit that matches.
  ASSERT_EQ(m_.write(t + "add/trigger", "traceoff if a == 1"), 0);
  ASSERT_TRUE(prog->call(3));
  EXPECT_EQ(read("instances/t/tracing_on"), "0\n");
  EXPECT_EQ(read("tracing_on"), "1\n");
  EXPECT_EQ(adds("instances/t/trace"), (Lines{"a=0x0", "a=0x1", "a=0x0", "a=0x1"}));

  // A histogram of the instance: its hist file alone shows it.
  put("instances/t/tracing_on", "1");
  ASSERT_EQ(m_.write(t + "add/trigger", "!traceoff"), 0);
  ASSERT_EQ(m_.write(t + "add/trigger", "hist:keys=a"), 0);
  ASSERT_TRUE(prog->call(3));
  const std::string hist = read(t + "add/hist");
  EXPECT_NE(hist.find("Hits: 3\n"), std::string::npos) << hist;
  EXPECT_NE(hist.find("{ a:          2 } hitcount:          1"), std::string::npos) << hist;
  EXPECT_EQ(read("events/in/add/hist"), "");
  EXPECT_EQ(read(t + "add/trigger"),
            "enable_event:in:ret:count=0\nhist:keys=a:vals=hitcount:sort=hitcount:size=2048 [active]\n");

  // rmdir: the instance's triggers and histograms go, with the soft mode they held.
  EXPECT_EQ(remove("t"), 0);
  EXPECT_EQ(m_.write("uprobe_events", "-:in/ret\n"), 0);
  EXPECT_EQ(m_.write("uprobe_events", "-:in/add\n"), 0);
  EXPECT_EQ(prog->ask("call 1"), "ok 0");
}

}  // namespace
}  // namespace probefs::fs
