// The files probefs has so that tools written for the kernel's tracefs find what they
// look for: events/ftrace/, options/ and trace_options, and the root's settings and
// placeholders (tracing_cpumask, set_event_pid, buffer_percent, saved_tgids, ...). Driven
// without a mount through Tree::open(); every expected text is the kernel's, as its
// tracefs reads on a 2-CPU machine with nop as the tracer.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "fs/trace_files.h"
#include "fs/tracefs.h"
#include "fs/vfs.h"
#include "tests/fs/trace_files_test_util.h"
#include "tracee/probe_places.h"
#include "tracee/tracer.h"

namespace probefs::fs {
namespace {



// The kernel's options/, in its readdir order, and what each reads on a fresh boot.
const std::vector<std::pair<std::string, std::string>> kKernelOptions = {
    {"blk_cgname", "0\n"},        {"blk_cgroup", "0\n"},        {"blk_classic", "0\n"},
    {"test_nop_refuse", "0\n"},   {"test_nop_accept", "0\n"},   {"func-no-repeats", "0\n"},
    {"func_stack_trace", "0\n"},  {"stacktrace", "0\n"},        {"function-fork", "0\n"},
    {"function-trace", "1\n"},    {"hash-ptr", "1\n"},          {"pause-on-trace", "0\n"},
    {"copy_trace_marker", "1\n"}, {"trace_printk_dest", "1\n"}, {"event-fork", "0\n"},
    {"markers", "1\n"},           {"irq-info", "1\n"},          {"disable_on_free", "0\n"},
    {"overwrite", "1\n"},         {"record-tgid", "0\n"},       {"record-cmd", "1\n"},
    {"latency-format", "0\n"},    {"context-info", "1\n"},      {"printk-msg-only", "0\n"},
    {"sym-userobj", "0\n"},       {"userstacktrace", "0\n"},    {"annotate", "1\n"},
    {"trace_printk", "1\n"},      {"fields", "0\n"},            {"block", "0\n"},
    {"bin", "0\n"},               {"hex", "0\n"},               {"raw", "0\n"},
    {"verbose", "0\n"},           {"sym-addr", "0\n"},          {"sym-offset", "0\n"},
    {"print-parent", "1\n"},
};

// The kernel's trace_options on a fresh boot.
const char kKernelTraceOptions[] =
    "print-parent\nnosym-offset\nnosym-addr\nnoverbose\nnoraw\nnohex\nnobin\nnoblock\n"
    "nofields\ntrace_printk\nannotate\nnouserstacktrace\nnosym-userobj\nnoprintk-msg-only\n"
    "context-info\nnolatency-format\nrecord-cmd\nnorecord-tgid\noverwrite\n"
    "nodisable_on_free\nirq-info\nmarkers\nnoevent-fork\ntrace_printk_dest\n"
    "copy_trace_marker\nnopause-on-trace\nhash-ptr\nfunction-trace\nnofunction-fork\n"
    "nostacktrace\nnotest_nop_accept\nnotest_nop_refuse\n";

const char kCommonFields[] =
    "\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n"
    "\tfield:unsigned char common_flags;\toffset:2;\tsize:1;\tsigned:0;\n"
    "\tfield:unsigned char common_preempt_count;\toffset:3;\tsize:1;\tsigned:0;\n"
    "\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;\n";

class TracefsKernelFilesTest : public testing::TracedProgramTest {
 protected:
  void SetUp() override { ASSERT_TRUE(make(2, 64)); }

  // The whole file, or "<errno N>" when the open or a read fails.
  std::string read(const std::string& path) {
    Request rq = request(O_RDONLY);
    std::unique_ptr<Handle> h;
    if (int err = fs_->tree().open(path, rq, O_RDONLY, &h); err != 0)
      return "<errno " + std::to_string(-err) + ">";
    std::string all, part;
    for (uint64_t off = 0;; off += part.size()) {
      if (int err = h->read(rq, off, 4096, &part); err != 0)
        return "<errno " + std::to_string(-err) + ">";
      if (part.empty()) return all;
      all += part;
    }
  }

  int open_truncating(const std::string& path) {
    Request rq = request(O_WRONLY | O_TRUNC);
    std::unique_ptr<Handle> h;
    return fs_->tree().open(path, rq, O_WRONLY | O_TRUNC, &h);
  }

  std::vector<std::string> ls(const std::string& path) {
    std::vector<std::string> names;
    NodePtr dir = fs_->tree().walk(path);
    if (!dir) return {"<missing>"};
    for (const NodePtr& n : fs_->tree().children(dir)) names.push_back(n->name());
    return names;
  }

  mode_t mode(const std::string& path) {
    NodePtr n = fs_->tree().walk(path);
    return n ? n->mode() : 0;
  }
};

// ---- events/ftrace -----------------------------------------------------------------------

TEST_F(TracefsKernelFilesTest, FtraceEventsAreTheKernels) {
  EXPECT_EQ(ls("events"),
            (std::vector<std::string>{"enable", "header_page", "header_event", "ftrace"}));
  EXPECT_EQ(ls("events/ftrace"),
            (std::vector<std::string>{"bputs", "raw_data", "print", "bprint", "user_stack",
                                      "kernel_stack", "function"}));
  // The stack records of options/stacktrace and userstacktrace: the kernel's formats.
  EXPECT_EQ(ls("events/ftrace/kernel_stack"), (std::vector<std::string>{"format"}));
  EXPECT_EQ(ls("events/ftrace/user_stack"), (std::vector<std::string>{"format"}));
  const std::string stack_fmt =
      "\nprint fmt: \"\\t=> %ps\\n\\t=> %ps\\n\\t=> %ps\\n\" \"\\t=> %ps\\n\\t=> %ps\\n\\t=> "
      "%ps\\n\" \"\\t=> %ps\\n\\t=> %ps\\n\", (void *)REC->caller[0], (void *)REC->caller[1], "
      "(void *)REC->caller[2], (void *)REC->caller[3], (void *)REC->caller[4], (void "
      "*)REC->caller[5], (void *)REC->caller[6], (void *)REC->caller[7]\n";
  EXPECT_EQ(read("events/ftrace/kernel_stack/format"),
            std::string("name: kernel_stack\nID: 4\nformat:\n") + kCommonFields +
                "\n\tfield:int size;\toffset:8;\tsize:4;\tsigned:1;\n"
                "\tfield:unsigned long caller[8];\toffset:16;\tsize:64;\tsigned:0;\n" + stack_fmt);
  EXPECT_EQ(read("events/ftrace/user_stack/format"),
            std::string("name: user_stack\nID: 13\nformat:\n") + kCommonFields +
                "\n\tfield:unsigned int tgid;\toffset:8;\tsize:4;\tsigned:0;\n"
                "\tfield:unsigned long caller[8];\toffset:16;\tsize:64;\tsigned:0;\n" + stack_fmt);
  EXPECT_EQ(ls("events/ftrace/print"),
            (std::vector<std::string>{"trigger", "hist", "format", "id"}));
  EXPECT_EQ(ls("events/ftrace/function"), (std::vector<std::string>{"format", "id"}));
  EXPECT_EQ(ls("events/ftrace/bprint"), (std::vector<std::string>{"format"}));
  EXPECT_EQ(ls("events/ftrace/bputs"), (std::vector<std::string>{"format"}));
  EXPECT_EQ(ls("events/ftrace/raw_data"), (std::vector<std::string>{"format"}));
  for (const char* dir : {"events/ftrace", "events/ftrace/print", "events/ftrace/function",
                          "events/ftrace/bprint", "events/ftrace/bputs"})
    EXPECT_EQ(mode(dir), 0755u) << dir;
  EXPECT_EQ(mode("events/ftrace/print/trigger"), 0640u);
  for (const char* f : {"events/ftrace/print/format", "events/ftrace/print/id",
                        "events/ftrace/function/format", "events/ftrace/function/id",
                        "events/ftrace/bprint/format", "events/ftrace/bputs/format"})
    EXPECT_EQ(mode(f), 0440u) << f;

  EXPECT_EQ(read("events/ftrace/print/format"),
            std::string("name: print\nID: 5\nformat:\n") + kCommonFields +
                "\n\tfield:unsigned long ip;\toffset:8;\tsize:8;\tsigned:0;\n"
                "\tfield:char buf[];\toffset:16;\tsize:0;\tsigned:0;\n"
                "\nprint fmt: \"%ps: %s\", (void *)REC->ip, REC->buf\n");
  EXPECT_EQ(read("events/ftrace/bprint/format"),
            std::string("name: bprint\nID: 6\nformat:\n") + kCommonFields +
                "\n\tfield:unsigned long ip;\toffset:8;\tsize:8;\tsigned:0;\n"
                "\tfield:const char * fmt;\toffset:16;\tsize:8;\tsigned:0;\n"
                "\tfield:u32 buf[];\toffset:24;\tsize:0;\tsigned:0;\n"
                "\nprint fmt: \"%ps: %s\", (void *)REC->ip, REC->fmt\n");
  EXPECT_EQ(read("events/ftrace/bputs/format"),
            std::string("name: bputs\nID: 15\nformat:\n") + kCommonFields +
                "\n\tfield:unsigned long ip;\toffset:8;\tsize:8;\tsigned:0;\n"
                "\tfield:const char * str;\toffset:16;\tsize:8;\tsigned:0;\n"
                "\nprint fmt: \"%ps: %s\", (void *)REC->ip, REC->str\n");
  EXPECT_EQ(read("events/ftrace/function/format"),
            std::string("name: function\nID: 1\nformat:\n") + kCommonFields +
                "\n\tfield:unsigned long ip;\toffset:8;\tsize:8;\tsigned:0;\n"
                "\tfield:unsigned long parent_ip;\toffset:16;\tsize:8;\tsigned:0;\n"
                "\tfield:unsigned long args[];\toffset:24;\tsize:0;\tsigned:0;\n"
                "\nprint fmt: \" %ps <-- %ps\", (void *)REC->ip, (void *)REC->parent_ip\n");
  EXPECT_EQ(read("events/ftrace/raw_data/format"),
            std::string("name: raw_data\nID: 19\nformat:\n") + kCommonFields +
                "\n\tfield:unsigned int id;\toffset:8;\tsize:4;\tsigned:0;\n"
                "\tfield:char buf[];\toffset:12;\tsize:0;\tsigned:0;\n"
                "\nprint fmt: \"id:%04x %08x\", REC->id, (int)REC->buf[0]\n");
  EXPECT_EQ(read("events/ftrace/print/id"), "5\n");
  EXPECT_EQ(read("events/ftrace/function/id"), "1\n");
  EXPECT_EQ(kPrintEventId, 5);
}

TEST_F(TracefsKernelFilesTest, FtraceEventsAreNotDynamicEvents) {
  EXPECT_EQ(read("available_events"), "");
  EXPECT_EQ(read("set_event"), "");
  EXPECT_EQ(read("events/enable"), "?\n");
  // The kernel's ftrace group has no group files.
  EXPECT_EQ(fs_->tree().walk("events/ftrace/enable"), nullptr);
  EXPECT_EQ(fs_->tree().walk("events/ftrace/filter"), nullptr);
  // Turning every event on reaches none of them.
  EXPECT_EQ(write("events/enable", "1"), 1);
  EXPECT_EQ(write("set_event", "ftrace:print"), -EINVAL);
  EXPECT_EQ(read("set_event"), "");
}

TEST_F(TracefsKernelFilesTest, PrintFilesOtherThanTriggersAreReadOnly) {
  // The trigger and hist files are trace_marker's (marker_event_test.cc).
  EXPECT_EQ(write("events/ftrace/print/format", "x"), -EINVAL);
  EXPECT_EQ(write("events/ftrace/print/id", "6"), -EINVAL);
  EXPECT_EQ(open_truncating("events/ftrace/print/trigger"), 0);
}

// ---- options/ and trace_options ---------------------------------------------------------

TEST_F(TracefsKernelFilesTest, OptionsAreTheKernelsWithItsDefaults) {
  EXPECT_EQ(mode("options"), 0750u);
  EXPECT_EQ(mode("trace_options"), 0640u);
  std::vector<std::string> names;
  for (const auto& [name, value] : kKernelOptions) {
    names.push_back(name);
    EXPECT_EQ(read("options/" + name), value) << name;
    EXPECT_EQ(mode("options/" + name), 0640u) << name;
  }
  EXPECT_EQ(ls("options"), names);
  EXPECT_EQ(read("trace_options"), kKernelTraceOptions);
}

TEST_F(TracefsKernelFilesTest, OptionsAndTraceOptionsAreOneState) {
  // Written in options/, read in trace_options; and the other way.
  ASSERT_EQ(write("options/function-trace", "0\n"), 2);
  EXPECT_EQ(read("options/function-trace"), "0\n");
  EXPECT_NE(read("trace_options").find("\nnofunction-trace\n"), std::string::npos);
  ASSERT_EQ(write("trace_options", "function-trace"), 14);
  EXPECT_EQ(read("options/function-trace"), "1\n");
  ASSERT_EQ(write("trace_options", "  sym-offset\n"), 13);
  EXPECT_EQ(read("options/sym-offset"), "1\n");
  ASSERT_EQ(write("trace_options", "nosym-offset"), 12);
  EXPECT_EQ(read("options/sym-offset"), "0\n");
  ASSERT_EQ(write("trace_options", "test_nop_accept\n"), 16);
  EXPECT_EQ(read("options/test_nop_accept"), "1\n");
  // The options that act keep acting, whichever file sets them.
  ASSERT_EQ(write("trace_options", "noirq-info"), 10);
  EXPECT_EQ(read("options/irq-info"), "0\n");
  ASSERT_EQ(write("trace_options", "record-tgid"), 11);
  EXPECT_EQ(read("options/record-tgid"), "1\n");
  ASSERT_EQ(write("trace_options", "nomarkers"), 9);
  EXPECT_EQ(read("options/markers"), "0\n");
  EXPECT_EQ(write("trace_marker", "x"), -EINVAL);
  ASSERT_EQ(write("options/markers", "1"), 1);
  EXPECT_EQ(write("trace_marker", "x"), 1);
  EXPECT_NE(read("trace").find(": tracing_mark_write: x\n"), std::string::npos);
  std::string want = kKernelTraceOptions;
  want.replace(want.find("\nirq-info\n"), 10, "\nnoirq-info\n");
  want.replace(want.find("\nnorecord-tgid\n"), 15, "\nrecord-tgid\n");
  want.replace(want.find("\nnotest_nop_accept\n"), 19, "\ntest_nop_accept\n");
  EXPECT_EQ(read("trace_options"), want);
}

TEST_F(TracefsKernelFilesTest, OptionWritesTheKernelRefuses) {
  for (const char* bad : {"", "2", "x", "0x1", " 1", "-1", "1 "})
    EXPECT_EQ(write("options/overwrite", bad), -EINVAL) << bad;
  EXPECT_EQ(read("options/overwrite"), "1\n");
  EXPECT_EQ(write("options/overwrite", "0"), 1);
  EXPECT_EQ(read("options/overwrite"), "0\n");
  for (const char* bad : {"", "\n", "no", "bogus", "nobogus", "func_stack_trace",
                          "blk_classic", "nofunc-no-repeats", "overwrite x"})
    EXPECT_EQ(write("trace_options", bad), -EINVAL) << "'" << bad << "'";
  EXPECT_EQ(write("trace_options", std::string(61, ' ') + "hex"), -EINVAL);  // 63 at most
  EXPECT_EQ(write("trace_options", std::string(60, ' ') + "hex"), 63);
  EXPECT_EQ(read("options/hex"), "1\n");
  // Another tracer's options are only in options/.
  EXPECT_EQ(write("options/func_stack_trace", "1"), 1);
  EXPECT_EQ(read("options/func_stack_trace"), "1\n");
  EXPECT_EQ(read("trace_options").find("func_stack_trace"), std::string::npos);
  // The top instance cannot clear trace_printk_dest.
  EXPECT_EQ(write("options/trace_printk_dest", "0"), -EINVAL);
  EXPECT_EQ(write("trace_options", "notrace_printk_dest"), -EINVAL);
  EXPECT_EQ(write("options/trace_printk_dest", "1"), 1);
  EXPECT_EQ(write("trace_options", "trace_printk_dest"), 17);
  EXPECT_EQ(read("options/trace_printk_dest"), "1\n");
  // nop refuses every change of test_nop_refuse, and trace_options always asks it.
  EXPECT_EQ(write("options/test_nop_refuse", "1"), -EINVAL);
  EXPECT_EQ(write("options/test_nop_refuse", "0"), 1);
  EXPECT_EQ(write("trace_options", "test_nop_refuse"), -EINVAL);
  EXPECT_EQ(write("trace_options", "notest_nop_refuse"), -EINVAL);
  EXPECT_EQ(read("options/test_nop_refuse"), "0\n");
}

// ---- tracing_cpumask ---------------------------------------------------------------------

TEST_F(TracefsKernelFilesTest, TracingCpumaskIsTheKernelsMask) {
  EXPECT_EQ(mode("tracing_cpumask"), 0640u);
  EXPECT_EQ(read("tracing_cpumask"), "3\n");
  const TraceFiles& tf = fs_->trace_files();
  EXPECT_TRUE(tf.cpu_traced(0));
  EXPECT_TRUE(tf.cpu_traced(1));
  EXPECT_FALSE(tf.cpu_traced(2));
  EXPECT_FALSE(tf.cpu_traced(-1));
  ASSERT_EQ(write("tracing_cpumask", "2\n"), 2);
  EXPECT_EQ(read("tracing_cpumask"), "2\n");
  EXPECT_FALSE(tf.cpu_traced(0));
  EXPECT_TRUE(tf.cpu_traced(1));
  ASSERT_EQ(write("tracing_cpumask", ""), 0);
  EXPECT_EQ(read("tracing_cpumask"), "0\n");
  EXPECT_FALSE(tf.cpu_traced(1));
  ASSERT_EQ(write("tracing_cpumask", " 1 \n"), 4);
  EXPECT_EQ(read("tracing_cpumask"), "1\n");
  const std::vector<std::pair<std::string, int64_t>> bad = {
      {"4", -EOVERFLOW},   {"7", -EOVERFLOW}, {"1,1", -EOVERFLOW}, {"000000001", -EOVERFLOW},
      {"g", -EINVAL},      {"0x3", -EINVAL},  {"-1", -EINVAL},     {"3;", -EINVAL},
  };
  for (const auto& [text, err] : bad) {
    EXPECT_EQ(write("tracing_cpumask", text), err) << text;
    EXPECT_EQ(read("tracing_cpumask"), "1\n") << text;
  }
  // The text ends at its first newline.
  ASSERT_EQ(write("tracing_cpumask", "3\nxyz"), 5);
  EXPECT_EQ(read("tracing_cpumask"), "3\n");
}

TEST_F(TracefsKernelFilesTest, TracingCpumaskOfManyCpusIsInChunks) {
  ASSERT_TRUE(make(40));
  EXPECT_EQ(read("tracing_cpumask"), "ff,ffffffff\n");
  ASSERT_EQ(write("tracing_cpumask", "1,0"), 3);
  EXPECT_EQ(read("tracing_cpumask"), "01,00000000\n");
  EXPECT_TRUE(fs_->trace_files().cpu_traced(32));
  EXPECT_FALSE(fs_->trace_files().cpu_traced(0));
  ASSERT_EQ(write("tracing_cpumask", "80000001"), 8);
  EXPECT_EQ(read("tracing_cpumask"), "00,80000001\n");
  EXPECT_TRUE(fs_->trace_files().cpu_traced(31));
  EXPECT_EQ(write("tracing_cpumask", "100,0"), -EOVERFLOW);
  EXPECT_EQ(write("tracing_cpumask", "1,0,0"), -EOVERFLOW);
  ASSERT_TRUE(make(8));
  EXPECT_EQ(read("tracing_cpumask"), "ff\n");
  ASSERT_EQ(write("tracing_cpumask", "5"), 1);
  EXPECT_EQ(read("tracing_cpumask"), "05\n");
  ASSERT_TRUE(make(32));
  EXPECT_EQ(read("tracing_cpumask"), "ffffffff\n");
}

// ---- set_event_pid and set_event_notrace_pid --------------------------------------------

TEST_F(TracefsKernelFilesTest, EventPidListsTakeAndShowPids) {
  for (const char* f : {"set_event_pid", "set_event_notrace_pid"}) {
    SCOPED_TRACE(f);
    const std::string file = f;
    EXPECT_EQ(mode(file), 0640u);
    EXPECT_EQ(read(file), "");
    ASSERT_EQ(write(file, "10 3\t0x20\n"), 10);
    EXPECT_EQ(read(file), "3\n10\n32\n");
    // Every write adds, with or without O_APPEND; O_TRUNC empties first.
    ASSERT_EQ(write(file, "7 010"), 5);
    ASSERT_EQ(write(file, "3", O_WRONLY | O_APPEND), 1);
    EXPECT_EQ(read(file), "3\n7\n8\n10\n32\n");
    // A bad word anywhere: nothing of the write is taken.
    for (const char* bad : {"12 x", "-1", "1.5", "0x", "5 6a"})
      EXPECT_EQ(write(file, bad), -EINVAL) << bad;
    EXPECT_EQ(write(file, "12 " + std::string(128, '1')), -EINVAL);
    EXPECT_EQ(write(file, "12 1073741824"), -EPERM);
    EXPECT_EQ(read(file), "3\n7\n8\n10\n32\n");
    ASSERT_EQ(write(file, " \n"), 2);
    EXPECT_EQ(read(file), "3\n7\n8\n10\n32\n");
    ASSERT_EQ(write(file, "5", O_WRONLY | O_TRUNC), 1);
    EXPECT_EQ(read(file), "5\n");
    ASSERT_EQ(open_truncating(file), 0);
    EXPECT_EQ(read(file), "");
  }
}

TEST_F(TracefsKernelFilesTest, EventPidAllowedFollowsBothLists) {
  const TraceFiles& tf = fs_->trace_files();
  EXPECT_TRUE(tf.event_pid_allowed(1234));
  ASSERT_EQ(write("set_event_pid", "1234 99"), 7);
  EXPECT_TRUE(tf.event_pid_allowed(1234));
  EXPECT_TRUE(tf.event_pid_allowed(99));
  EXPECT_FALSE(tf.event_pid_allowed(1235));
  ASSERT_EQ(write("set_event_notrace_pid", "99 500"), 6);
  EXPECT_FALSE(tf.event_pid_allowed(99));
  EXPECT_TRUE(tf.event_pid_allowed(1234));
  EXPECT_FALSE(tf.event_pid_allowed(500));
  ASSERT_EQ(open_truncating("set_event_pid"), 0);
  EXPECT_TRUE(tf.event_pid_allowed(1235));
  EXPECT_FALSE(tf.event_pid_allowed(500));
  ASSERT_EQ(open_truncating("set_event_notrace_pid"), 0);
  EXPECT_TRUE(tf.event_pid_allowed(500));
}

// ---- the small files ---------------------------------------------------------------------

TEST_F(TracefsKernelFilesTest, RootFilesHaveTheKernelsModes) {
  const std::map<std::string, mode_t> want = {
      {"buffer_percent", 0640},  {"free_buffer", 0200},    {"instances", 0750},
      {"printk_formats", 0440},  {"saved_tgids", 0440},    {"set_event_notrace_pid", 0640},
      {"set_event_pid", 0640},   {"timestamp_mode", 0440}, {"trace_marker_raw", 0220},
      {"trace_options", 0640},   {"tracing_cpumask", 0640}, {"tracing_thresh", 0640},
  };
  for (const auto& [path, m] : want) {
    NodePtr n = fs_->tree().walk(path);
    ASSERT_NE(n, nullptr) << path;
    EXPECT_EQ(n->mode(), m) << path;
    EXPECT_EQ(n->is_dir(), path == "instances") << path;
  }
  EXPECT_TRUE(ls("instances").empty());
}

TEST_F(TracefsKernelFilesTest, SmallFilesReadAndTakeWhatTheKernelsDo) {
  EXPECT_EQ(read("buffer_percent"), "50\n");
  for (const char* bad : {"101", "-1", "x", "", "50 "})
    EXPECT_EQ(write("buffer_percent", bad), -EINVAL) << bad;
  ASSERT_EQ(write("buffer_percent", "100\n"), 4);
  EXPECT_EQ(read("buffer_percent"), "100\n");
  ASSERT_EQ(write("buffer_percent", "0"), 1);
  EXPECT_EQ(read("buffer_percent"), "0\n");

  EXPECT_EQ(read("tracing_thresh"), "0\n");
  ASSERT_EQ(write("tracing_thresh", "250\n"), 4);
  EXPECT_EQ(read("tracing_thresh"), "250\n");
  for (const char* bad : {"x", "", "-5", "1.5"})
    EXPECT_EQ(write("tracing_thresh", bad), -EINVAL) << bad;
  EXPECT_EQ(read("tracing_thresh"), "250\n");

  EXPECT_EQ(read("timestamp_mode"), "[delta] absolute\n");
  EXPECT_EQ(write("timestamp_mode", "absolute"), -EINVAL);
  EXPECT_EQ(read("printk_formats"), "");
  EXPECT_EQ(write("printk_formats", "x"), -EINVAL);

  // free_buffer takes a write and changes nothing; it has no read.
  EXPECT_EQ(write("free_buffer", "1\n"), 2);
  EXPECT_EQ(read("free_buffer"), "<errno 22>");
  EXPECT_EQ(read("tracing_on"), "1\n");
}

TEST_F(TracefsKernelFilesTest, TraceMarkerRawChecksAsTheKernelDoes) {
  const std::string id_and_data("\x01\x00\x00\x00payload", 11);
  EXPECT_EQ(write("trace_marker_raw", id_and_data), 11);
  EXPECT_EQ(write("trace_marker_raw", std::string(4, '\0')), 4);
  // Past what a page holds (4060): the kernel's EBADF, as when the buffer takes nothing.
  EXPECT_EQ(write("trace_marker_raw", std::string(4096, 'r')), -EBADF);
  EXPECT_EQ(write("trace_marker_raw", std::string(4061, 'r')), -EBADF);
  EXPECT_EQ(write("trace_marker_raw", std::string(3, '\0')), -EINVAL);
  EXPECT_EQ(write("trace_marker_raw", ""), -EINVAL);
  EXPECT_EQ(write("trace_marker_raw", std::string(4097, 'r')), -EINVAL);
  EXPECT_EQ(read("trace_marker_raw"), "<errno 22>");
  ASSERT_EQ(write("options/markers", "0"), 1);
  EXPECT_EQ(write("trace_marker_raw", id_and_data), -EINVAL);
  ASSERT_EQ(write("options/markers", "1"), 1);
  ASSERT_EQ(write("tracing_on", "0"), 1);
  EXPECT_EQ(write("trace_marker_raw", id_and_data), -EBADF);
  ASSERT_EQ(write("tracing_on", "1"), 1);
  // The two writes taken are two records.
  EXPECT_NE(read("trace").find("# entries-in-buffer/entries-written: 2/2 "), std::string::npos);
}

// ---- saved_tgids ---------------------------------------------------------------------------

TEST_F(TracefsKernelFilesTest, SavedTgidsNamesTheGroupOfEachThreadSeen) {
  EXPECT_EQ(read("saved_tgids"), "");
  ASSERT_EQ(write("trace_marker", "m"), 1);
  const std::string mine = std::to_string(gettid()) + " " + std::to_string(getpid()) + "\n";
  EXPECT_EQ(read("saved_tgids"), mine);

  define_add();
  ASSERT_TRUE(launch());
  ASSERT_EQ(pipes_.ask("call 1"), "ok 0");
  ASSERT_EQ(pipes_.ask("threads 2 1"), "ok 0");
  // "TID TGID" lines, ascending by thread: the program's three threads (two of them gone
  // by now: the records said whose they were) and the marker's writer.
  std::set<pid_t> program_threads;
  std::vector<pid_t> order;
  const std::string text = read("saved_tgids");
  size_t at = 0;
  while (at < text.size()) {
    const size_t nl = text.find('\n', at);
    ASSERT_NE(nl, std::string::npos) << text;
    int tid = 0, tgid = 0;
    char rest = 0;
    ASSERT_EQ(sscanf(text.substr(at, nl - at).c_str(), "%d %d%c", &tid, &tgid, &rest), 2)
        << text;
    order.push_back(tid);
    if (tgid == pid_) program_threads.insert(tid);
    else EXPECT_EQ(text.substr(at, nl - at + 1), mine);
    at = nl + 1;
  }
  EXPECT_EQ(program_threads.size(), 3u) << text;
  EXPECT_TRUE(program_threads.count(pid_)) << text;
  EXPECT_EQ(order.size(), 4u) << text;
  EXPECT_TRUE(std::is_sorted(order.begin(), order.end())) << text;
}

}  // namespace
}  // namespace probefs::fs
