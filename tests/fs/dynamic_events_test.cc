// The dynamic-event files of the tracefs model, driven without a mount: a real Tracer and
// a Tracefs over it, every file opened, written and read through Tree::open as a FUSE
// request would. The expected texts, errno values and error_log entries are the kernel's,
// as the tracefs reference captured them; where a test needs records or hits it launches
// the bundled traced_prog and reads its real records.
#include "fs/dynamic_events.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "events/ring.h"
#include "fs/tracefs.h"
#include "fs/vfs.h"
#include "tests/fs/dynamic_events_test_prog.h"
#include "tracee/probe_places.h"
#include "tracee/tracer.h"

namespace probefs::fs {
namespace {

const std::string kProg = PROBEFS_TRACED_PROG;
const std::string kProgDir = kProg.substr(0, kProg.rfind('/'));
const std::string kProgName = kProg.substr(kProg.rfind('/') + 1);

std::string replace_all(std::string s, std::string_view from, std::string_view to) {
  for (size_t i = s.find(from); i != std::string::npos; i = s.find(from, i + to.size()))
    s.replace(i, from.size(), to);
  return s;
}

std::string padded(uint64_t offset) {
  char buf[32];
  snprintf(buf, sizeof buf, "0x%016llx", static_cast<unsigned long long>(offset));
  return buf;
}

// The length of the kernel's "[%5llu.%06u] " at the start of an error_log line, or 0.
size_t stamp_length(const std::string& line) {
  auto digit = [&](size_t i) { return i < line.size() && line[i] >= '0' && line[i] <= '9'; };
  if (line.empty() || line[0] != '[') return 0;
  size_t i = 1;
  while (i < line.size() && line[i] == ' ') ++i;
  size_t first = i;
  while (digit(i)) ++i;
  if (i == first || i - 1 < 5 || i >= line.size() || line[i] != '.') return 0;
  for (int k = 0; k < 6; ++k)
    if (!digit(++i)) return 0;
  return line.compare(i + 1, 2, "] ") == 0 ? i + 3 : 0;
}

// error_log's text without the timestamps, each checked for the kernel's format.
std::string without_stamps(const std::string& log) {
  std::string out;
  size_t start = 0;
  while (start < log.size()) {
    size_t nl = log.find('\n', start);
    std::string line = log.substr(start, nl == std::string::npos ? std::string::npos
                                                                  : nl - start + 1);
    start = nl == std::string::npos ? log.size() : nl + 1;
    if (!line.empty() && line[0] == '[') {
      size_t n = stamp_length(line);
      EXPECT_NE(n, 0u) << line;
      line = line.substr(n);
    }
    out += line;
  }
  return out;
}

std::string log_entry(std::string_view subsystem, std::string_view message,
                      std::string_view command, int pos) {
  return std::string(subsystem) + ": error: " + std::string(message) + "\n  Command: " +
         std::string(command) + "\n" + std::string(11 + pos, ' ') + "^\n";
}

// A directory of links to the traced program under other names (the kernel's default
// event names depend on the name), removed at the end.
class LinkDir {
 public:
  LinkDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "probefs-dyn-XXXXXX").string();
    if (mkdtemp(tmpl.data())) dir_ = tmpl;
  }
  ~LinkDir() {
    for (const std::string& n : names_) unlink((dir_ + "/" + n).c_str());
    if (!dir_.empty()) rmdir(dir_.c_str());
  }
  std::string link(const std::string& name) {
    std::string p = dir_ + "/" + name;
    if (symlink(kProg.c_str(), p.c_str()) == 0) names_.push_back(name);
    return p;
  }

 private:
  std::string dir_;
  std::vector<std::string> names_;
};

uint64_t file_offset(const char* symbol) {
  uint64_t off = 0;
  EXPECT_EQ(tracee::symbol_file_offset(kProg, symbol, &off), 0) << symbol;
  return off;
}

class DynamicEventsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    tracee::Tracer::Options o;
    o.agent_path = PROBEFS_AGENT_PATH;
    o.buffer_size_kb = 256;
    std::string err;
    tracer_ = tracee::Tracer::create(o, &err);
    ASSERT_NE(tracer_, nullptr) << err;
    fs_ = std::make_unique<Tracefs>(*tracer_, Tracefs::Options{});
  }
  void TearDown() override {
    fs_.reset();
    tracer_.reset();
  }

  Request request(int flags) const {
    Request rq;
    rq.pid = getpid();
    rq.flags = flags;
    return rq;
  }

  // One open, one write(), close, as `echo DATA >> PATH` without the newline: the bytes
  // taken, or the negative errno of the open or of the write.
  int64_t write(std::string_view path, std::string_view data,
                int flags = O_WRONLY | O_APPEND) {
    Request rq = request(flags);
    std::unique_ptr<Handle> h;
    if (int err = fs_->tree().open(path, rq, flags, &h); err != 0) return err;
    return h->write(rq, 0, data);
  }
  // A definition line as `echo LINE >> PATH` writes it.
  int64_t echo(std::string_view path, const std::string& line) {
    int64_t n = write(path, line + "\n");
    return n == static_cast<int64_t>(line.size() + 1) ? 0 : n;
  }
  int open_truncating(std::string_view path) {
    Request rq = request(O_WRONLY | O_TRUNC);
    std::unique_ptr<Handle> h;
    return fs_->tree().open(path, rq, O_WRONLY | O_TRUNC, &h);
  }
  std::string read(std::string_view path, int flags = O_RDONLY) {
    Request rq = request(flags);
    std::unique_ptr<Handle> h;
    if (int err = fs_->tree().open(path, rq, flags, &h); err != 0)
      return "<open error " + std::to_string(err) + ">";
    std::string all, chunk;
    for (uint64_t off = 0;; off += chunk.size()) {
      if (h->read(rq, off, 4096, &chunk) != 0 || chunk.empty()) break;
      all += chunk;
    }
    return all;
  }
  // A consuming file read until it has nothing (EAGAIN): never blocks.
  std::string drain(std::string_view path) { return read(path, O_RDONLY | O_NONBLOCK); }
  bool exists(std::string_view path) { return fs_->tree().walk(path) != nullptr; }
  std::vector<std::string> ls(std::string_view path) {
    std::vector<std::string> names;
    NodePtr dir = fs_->tree().walk(path);
    if (!dir) return names;
    for (const NodePtr& n : fs_->tree().children(dir)) names.push_back(n->name());
    return names;
  }
  mode_t mode(std::string_view path) {
    NodePtr n = fs_->tree().walk(path);
    return n ? n->mode() : 0;
  }
  void clear_log() { ASSERT_EQ(open_truncating("error_log"), 0); }
  std::string log() { return without_stamps(read("error_log")); }

  std::unique_ptr<tracee::Tracer> tracer_;
  std::unique_ptr<Tracefs> fs_;
};

// ---- the files and their places --------------------------------------------------------

TEST_F(DynamicEventsTest, FilesHaveTheKernelsModesAndOrder) {
  struct {
    const char* path;
    mode_t mode;
  } files[] = {
      {"kprobe_events", 0640}, {"uprobe_events", 0640}, {"dynamic_events", 0640},
      {"synthetic_events", 0640},
      {"kprobe_profile", 0440}, {"uprobe_profile", 0440}, {"error_log", 0640},
      {"available_events", 0440}, {"set_event", 0640}, {"events", 0755},
      {"events/enable", 0640}, {"events/header_page", 0440}, {"events/header_event", 0440},
  };
  for (const auto& f : files) EXPECT_EQ(mode(f.path), f.mode) << f.path;
  std::vector<std::string> root = ls("");
  auto pos = [&](const char* n) { return std::find(root.begin(), root.end(), n) - root.begin(); };
  // Readdir order of the kernel's root (newest first): events, uprobe_profile,
  // uprobe_events, ..., set_event, dynamic_events, available_events.
  EXPECT_LT(pos("events"), pos("uprobe_profile"));
  EXPECT_LT(pos("uprobe_profile"), pos("uprobe_events"));
  EXPECT_LT(pos("uprobe_events"), pos("set_event"));
  EXPECT_LT(pos("set_event"), pos("dynamic_events"));
  EXPECT_LT(pos("dynamic_events"), pos("available_events"));
  EXPECT_EQ(ls("events"),
            (std::vector<std::string>{"enable", "header_page", "header_event", "ftrace"}));
  EXPECT_EQ(read("events/header_page"),
            "\tfield: u64 timestamp;\toffset:0;\tsize:8;\tsigned:0;\n"
            "\tfield: local_t commit;\toffset:8;\tsize:8;\tsigned:1;\n"
            "\tfield: int overwrite;\toffset:8;\tsize:1;\tsigned:1;\n"
            "\tfield: char data;\toffset:16;\tsize:4080;\tsigned:0;\n");
  EXPECT_EQ(read("events/header_event"),
            "# compressed entry header\n\ttype_len    :    5 bits\n\ttime_delta  :   27 bits\n"
            "\tarray       :   32 bits\n\n\tpadding     : type == 29\n"
            "\ttime_extend : type == 30\n\ttime_stamp : type == 31\n"
            "\tdata max type_len  == 28\n");
  for (const char* f : {"uprobe_events", "kprobe_events", "dynamic_events", "synthetic_events",
                        "uprobe_profile",
                        "kprobe_profile", "available_events", "set_event", "error_log"})
    EXPECT_EQ(read(f), "") << f;
  // No event at all: the kernel's aggregate of nothing, and a reset that changes nothing
  // (ResetsSucceedWithNoEvent).
  EXPECT_EQ(read("events/enable"), "?\n");
  EXPECT_EQ(write("events/enable", "1\n"), 2);
  // The profiles are read-only.
  EXPECT_EQ(write("uprobe_profile", "0\n"), -EINVAL);
  EXPECT_EQ(write("kprobe_profile", "0\n"), -EINVAL);
}

TEST_F(DynamicEventsTest, EventDirectoriesComeAndGoWithTheirEvents) {
  const std::string b = kProg;
  ASSERT_EQ(echo("uprobe_events", "p:zgrp/e1 " + b + ":0x1370 a=%di"), 0);
  ASSERT_EQ(echo("uprobe_events", "p:zgrp/e2 " + b + ":0x1380 x=%di"), 0);
  ASSERT_EQ(echo("uprobe_events", "p:zgrp/e0 " + b + ":0x13b0"), 0);
  ASSERT_EQ(echo("uprobe_events", "p:agrp/e3 " + b + ":0x13c0"), 0);
  // The kernel's readdir orders, as its tracefs lists them.
  EXPECT_EQ(ls("events"), (std::vector<std::string>{"enable", "header_page", "header_event",
                                                    "ftrace", "zgrp", "agrp"}));
  EXPECT_EQ(ls("events/zgrp"), (std::vector<std::string>{"filter", "enable", "e1", "e2", "e0"}));
  EXPECT_EQ(ls("events/zgrp/e1"),
            (std::vector<std::string>{"enable", "filter", "trigger", "hist", "format", "id"}));
  for (const char* f : {"enable", "filter", "trigger"})
    EXPECT_EQ(mode(std::string("events/zgrp/e1/") + f), 0640u) << f;
  EXPECT_EQ(mode("events/zgrp/e1/format"), 0440u);
  EXPECT_EQ(mode("events/zgrp/e1/id"), 0440u);
  EXPECT_EQ(mode("events/zgrp/e1"), 0755u);
  EXPECT_EQ(mode("events/zgrp"), 0755u);
  EXPECT_EQ(mode("events/zgrp/enable"), 0640u);
  EXPECT_EQ(mode("events/zgrp/filter"), 0640u);
  // Ids are consecutive from the first, in definition order.
  EXPECT_EQ(read("events/zgrp/e1/id"), std::to_string(kFirstEventId) + "\n");
  EXPECT_EQ(read("events/zgrp/e2/id"), std::to_string(kFirstEventId + 1) + "\n");
  EXPECT_EQ(read("events/agrp/e3/id"), std::to_string(kFirstEventId + 3) + "\n");
  EXPECT_EQ(read("events/zgrp/e1/format"),
            "name: e1\nID: " + std::to_string(kFirstEventId) +
                "\nformat:\n"
                "\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n"
                "\tfield:unsigned char common_flags;\toffset:2;\tsize:1;\tsigned:0;\n"
                "\tfield:unsigned char common_preempt_count;\toffset:3;\tsize:1;\tsigned:0;\n"
                "\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;\n\n"
                "\tfield:unsigned long __probe_ip;\toffset:8;\tsize:8;\tsigned:0;\n"
                "\tfield:u64 a;\toffset:16;\tsize:8;\tsigned:0;\n\n"
                "print fmt: \"(%lx) a=0x%Lx\", REC->__probe_ip, REC->a\n");
  EXPECT_EQ(read("events/zgrp/e1/enable"), "0\n");
  EXPECT_EQ(read("events/zgrp/e1/filter"), "none\n");
  EXPECT_EQ(read("events/zgrp/e1/trigger"),
            "# Available triggers:\n# traceon traceoff snapshot stacktrace enable_event disable_event hist\n");
  EXPECT_EQ(read("events/zgrp/filter"),
            "### global filter ###\n# Use this to set filters for multiple events.\n"
            "# Only events with the given fields will be affected.\n"
            "# If no events are modified, an error message will be displayed here\n");
  // Newest first.
  EXPECT_EQ(read("available_events"), "agrp:e3\nzgrp:e0\nzgrp:e2\nzgrp:e1\n");
  // The format of every event is published for the readers.
  auto view = fs_->events().find(kFirstEventId + 1);
  ASSERT_NE(view, nullptr);
  EXPECT_EQ(view->system, "zgrp");
  EXPECT_EQ(view->name, "e2");
  EXPECT_FALSE(view->kprobe_style);

  ASSERT_EQ(echo("uprobe_events", "-:agrp/e3"), 0);
  EXPECT_FALSE(exists("events/agrp"));
  EXPECT_EQ(fs_->events().find(kFirstEventId + 3), nullptr);
  ASSERT_EQ(echo("uprobe_events", "-:zgrp/e2"), 0);
  EXPECT_EQ(ls("events/zgrp"), (std::vector<std::string>{"filter", "enable", "e1", "e0"}));
  // A file still open on a removed event refuses writes. (The open file's node is held,
  // as the FUSE server holds the nodes the kernel knows.)
  Request rq = request(O_WRONLY);
  std::unique_ptr<Handle> h;
  NodePtr held = fs_->tree().walk("events/zgrp/e0/enable");
  ASSERT_NE(held, nullptr);
  ASSERT_EQ(held->file()->open(rq, O_WRONLY, &h), 0);
  ASSERT_EQ(echo("uprobe_events", "-:zgrp/"), 0);
  EXPECT_EQ(h->write(rq, 0, "1\n"), -ENODEV);
  EXPECT_FALSE(exists("events/zgrp"));
  EXPECT_EQ(ls("events"),
            (std::vector<std::string>{"enable", "header_page", "header_event", "ftrace"}));
  EXPECT_EQ(read("available_events"), "");
  // The next event gets the next id: ids are not reused at once.
  ASSERT_EQ(echo("uprobe_events", "p:zgrp/e5 " + b + ":0x1370"), 0);
  EXPECT_EQ(read("events/zgrp/e5/id"), std::to_string(kFirstEventId + 4) + "\n");
}

// The kernel takes a dynamic event into its own ftrace group (a uprobe `p:ftrace/x` is
// defined there, with its event files but no group enable or filter), and refuses a name
// one of its ftrace events has.
TEST_F(DynamicEventsTest, FtraceGroupTakesDynamicEventsBesideTheKernels) {
  const std::string b = kProg;
  const std::vector<std::string> kernel_events = {
      "bputs", "raw_data", "print", "bprint", "user_stack", "kernel_stack", "function"};
  ASSERT_EQ(echo("uprobe_events", "p:ftrace/x " + b + ":0x1370"), 0);
  EXPECT_EQ(read("uprobe_events"), "p:ftrace/x " + b + ":" + padded(0x1370) + "\n");
  EXPECT_EQ(read("available_events"), "ftrace:x\n");
  std::vector<std::string> with_x = kernel_events;
  with_x.push_back("x");
  EXPECT_EQ(ls("events/ftrace"), with_x);
  EXPECT_EQ(ls("events/ftrace/x"),
            (std::vector<std::string>{"enable", "filter", "trigger", "hist", "format", "id"}));
  EXPECT_EQ(read("events/ftrace/x/id"), std::to_string(kFirstEventId) + "\n");
  ASSERT_EQ(write("events/ftrace/x/enable", "1"), 1);
  EXPECT_EQ(read("set_event"), "ftrace:x\n");
  EXPECT_EQ(read("events/enable"), "1\n");
  ASSERT_EQ(write("events/ftrace/x/enable", "0"), 1);
  ASSERT_EQ(echo("uprobe_events", "-:ftrace/x"), 0);
  EXPECT_EQ(ls("events/ftrace"), kernel_events);
  EXPECT_EQ(read("available_events"), "");

  clear_log();
  const std::string taken = "p:ftrace/print " + b + ":0x1370";
  EXPECT_EQ(echo("uprobe_events", taken), -EEXIST);
  EXPECT_EQ(log(), log_entry("trace_uprobe",
                             "Given group/event name is already used by another event", taken, 0));
  EXPECT_EQ(read("uprobe_events"), "");
  EXPECT_EQ(ls("events/ftrace/print"),
            (std::vector<std::string>{"trigger", "hist", "format", "id"}));
  // The kernel's events are not dynamic: nothing removes them.
  EXPECT_EQ(echo("uprobe_events", "-:ftrace/print"), -ENOENT);
  EXPECT_EQ(echo("dynamic_events", "-:ftrace/"), -ENOENT);
  ASSERT_EQ(open_truncating("dynamic_events"), 0);
  EXPECT_EQ(ls("events/ftrace"), kernel_events);
}

// ---- definitions: read-back, errors ------------------------------------------------------

// The reference's read-back normalization capture, with the traced program for its binary.
TEST_F(DynamicEventsTest, ReadBackIsNormalizedAsTheKernelDoes) {
  LinkDir links;
  const std::string b = kProg;
  const std::string myprog = links.link("my-prog.v2");
  const std::string ptx = links.link("pt_x");
  const std::string link = links.link("link");
  const std::string p1370 = b + ":" + padded(0x1370);
  std::vector<std::string> ok = {
      "p " + b + ":0x1370",
      "r " + b + ":0x13c0",
      "p " + b + ":0x13b0%return",
      "r " + b + ":0x1380%return",
      "p:mygrp/ " + b + ":0x1370",
      "p:ev_only " + b + ":0x1370",
      "p:grp1/ev2 " + b + ":4976",
      "p:grp1/ev4 " + myprog + ":0x1370",
      "p " + myprog + ":0x1370",
      "p " + ptx + ":0x1370",
      "p:grp1/ev5 " + link + ":0x1370",
  };
  for (const std::string& d : ok) EXPECT_EQ(echo("uprobe_events", d), 0) << d;
  // A relative path is the writer's: written from the program's directory.
  char cwd[4096];
  ASSERT_NE(getcwd(cwd, sizeof cwd), nullptr);
  ASSERT_EQ(chdir(kProgDir.c_str()), 0);
  int64_t rel = echo("uprobe_events", "p:grp1/ev6 ./" + kProgName + ":0x1370");
  ASSERT_EQ(chdir(cwd), 0);
  EXPECT_EQ(rel, 0);
  EXPECT_EQ(echo("uprobe_events", "p:grp1/ev6b ./no-such-" + kProgName + ":0x1370"), -ENOENT);
  std::vector<std::string> more = {
      "p:grp1/ev7   " + b + ":0x1370    a=%di\t b=%si  ",
      "p:grp1/multi " + b + ":0x1370 a=%di",
      "p:grp1/multi " + b + ":0x13c0 a=%di",
      "p:grp1/ev8 " + b + ":0x1370 a=%di # trailing comment",
      "# a comment line",
      "p:grp1/ev9 " + b + ":0x1370 %di +0(%si):u8 $comm\np:grp1/ev10 " + b + ":0X1370 a=%di",
      "p:grp1/ev11 " + b + ":0x01370",
  };
  for (const std::string& d : more) EXPECT_EQ(echo("uprobe_events", d), 0) << d;
  EXPECT_EQ(write("uprobe_events", "   \n"), 4);

  const std::string expected =
      "p:uprobes/p_traced_0x1370 " + p1370 + "\n"
      "r:uprobes/p_traced_0x13c0 " + b + ":" + padded(0x13c0) + "\n"
      "r:uprobes/p_traced_0x13b0 " + b + ":" + padded(0x13b0) + "\n"
      "r:uprobes/p_traced_0x1380 " + b + ":" + padded(0x1380) + "\n"
      "p:mygrp/p_traced_0x1370 " + p1370 + "\n"
      "p:uprobes/ev_only " + p1370 + "\n"
      "p:grp1/ev2 " + p1370 + "\n"
      "p:grp1/ev4 " + myprog + ":" + padded(0x1370) + "\n"
      "p:uprobes/p_my_0x1370 " + myprog + ":" + padded(0x1370) + "\n"
      "p:uprobes/p_pt_0x1370 " + ptx + ":" + padded(0x1370) + "\n"
      "p:grp1/ev5 " + link + ":" + padded(0x1370) + "\n"
      "p:grp1/ev6 ./" + kProgName + ":" + padded(0x1370) + "\n"
      "p:grp1/ev7 " + p1370 + " a=%di b=%si\n"
      "p:grp1/multi " + p1370 + " a=%di\n"
      "p:grp1/multi " + b + ":" + padded(0x13c0) + " a=%di\n"
      "p:grp1/ev8 " + p1370 + " a=%di\n"
      "p:grp1/ev9 " + p1370 + " arg1=%di arg2=+0(%si):u8 arg3=$comm\n"
      "p:grp1/ev10 " + p1370 + " a=%di\n"
      "p:grp1/ev11 " + p1370 + "\n";
  EXPECT_EQ(read("uprobe_events"), expected);
  EXPECT_EQ(read("dynamic_events"), expected);
  EXPECT_EQ(read("kprobe_events"), "");
  EXPECT_EQ(ls("events/grp1"),
            (std::vector<std::string>{"filter", "enable", "ev2", "ev4", "ev5", "ev6", "ev7",
                                      "multi", "ev8", "ev9", "ev10", "ev11"}));
  EXPECT_EQ(ls("events/mygrp"),
            (std::vector<std::string>{"filter", "enable", "p_traced_0x1370"}));
  std::string format = read("events/grp1/ev9/format");
  EXPECT_NE(format.find("\tfield:unsigned long __probe_ip;\toffset:8;\tsize:8;\tsigned:0;\n"
                        "\tfield:u64 arg1;\toffset:16;\tsize:8;\tsigned:0;\n"
                        "\tfield:u8 arg2;\toffset:24;\tsize:1;\tsigned:0;\n"
                        "\tfield:__data_loc char[] arg3;\toffset:25;\tsize:4;\tsigned:1;\n\n"
                        "print fmt: \"(%lx) arg1=0x%Lx arg2=%u arg3=\\\"%s\\\"\", REC->__probe_ip, "
                        "REC->arg1, REC->arg2, __get_str(arg3)\n"),
            std::string::npos)
      << format;
  EXPECT_NE(read("events/grp1/multi/format").find("print fmt: \"(%lx) a=0x%Lx\""),
            std::string::npos);
  // Nothing of this went to error_log but the missing relative file.
  EXPECT_EQ(log(), log_entry("trace_uprobe", "Failed to find the given file",
                             "p:grp1/ev6b ./no-such-" + kProgName + ":0x1370", 12));
}

struct ErrorRow {
  const char* title;
  const char* def;
  int err;
  const char* message;  // nullptr: nothing is logged
  const char* command;
  int pos;
};

const ErrorRow kErrorRows[] = {
#include "tests/fs/dynamic_events_error_table.inc"
};

// Every captured malformed line, replayed against uprobe_events with the traced program
// for the captured binary: errno, error_log text and caret, byte for byte.
TEST_F(DynamicEventsTest, ErrorTableMatchesTheKernel) {
  const std::string b = kProg;
  const int shift = static_cast<int>(b.size()) - 3;
  // The events the capture's rows run into.
  ASSERT_EQ(echo("uprobe_events", "p:uprobes/ref_add3 " + b +
                                      ":0x1370 a=%di b=%si:u32 c=%dx:s32 cx=%dx:x16 "
                                      "c64=%dx:s64 imm=\\123 imms=\\\"hi\""),
            0);
  ASSERT_EQ(echo("uprobe_events", "p:uprobes/ref_negs " + b + ":0x13c0 v=%di:s64"), 0);
  ASSERT_EQ(echo("uprobe_events", "r " + b + ":0x13c0"), 0);
  // An event of the other kind holds sched/sched_switch (the kernel's own event there).
  ASSERT_EQ(echo("kprobe_events", "p:sched/sched_switch " + kProgName + ":traced_add"), 0);

  auto run = [&](const std::string& title, const std::string& def, int err,
                 const std::string& expected_log) {
    clear_log();
    int64_t r = write("uprobe_events", def + "\n");
    EXPECT_EQ(r, err ? -err : static_cast<int64_t>(def.size() + 1)) << title;
    EXPECT_EQ(log(), expected_log) << title;
  };
  for (const ErrorRow& row : kErrorRows) {
    std::string def = replace_all(row.def, "@B@", b);
    std::string expected;
    if (row.message) {
      std::string command = row.command;
      size_t at = command.find("@B@");
      int pos = row.pos + (at != std::string::npos && row.pos > static_cast<int>(at) ? shift : 0);
      expected = log_entry("trace_uprobe", row.message, replace_all(command, "@B@", b), pos);
    }
    run(row.title, def, row.err, expected);
    // As the capture did: the accepted 63-character name goes again.
    const std::string longest(63, 'g');
    if (read("uprobe_events").find("uprobes/" + longest + " ") != std::string::npos) {
      EXPECT_EQ(echo("uprobe_events", "-:uprobes/" + longest), 0);
    }
  }
  std::string args129, args128;
  for (int i = 0; i < 129; ++i) {
    if (i < 128) args128 += (i ? " a" : "a") + std::to_string(i) + "=%di";
    args129 += (i ? " a" : "a") + std::to_string(i) + "=%di";
  }
  std::string many = "p:uprobes/e11 " + b + ":0x1370 " + args129;
  run("too many args (129)", many, E2BIG,
      log_entry("trace_uprobe", "Too many arguments are specified", many,
                static_cast<int>(many.find(" a0=") + 1)));
  run("128 args (limit ok?)", "p:uprobes/e24 " + b + ":0x1370 " + args128, 0, "");
  run("line too long (5000 chars)",
      "p:uprobes/e25 " + b + ":0x1370 " + std::string(5000, 'x'), EINVAL, "");

  // What the accepted odd lines read back as.
  std::string back = read("uprobe_events");
  const std::string p1370 = b + ":" + padded(0x1370);
  for (const std::string& line :
       {"p:uprobes/e12f " + p1370 + " a=+0(%si):b2@1/8[2]", "p:bad-grp/ev " + p1370,
        "p:uprobes/e19d " + p1370 + " a=\\123:string",
        "r:uprobes/e20c " + b + ":" + padded(0x13c0),
        "p:uprobes/e24 " + p1370 + " " + args128})
    EXPECT_NE(back.find(line + "\n"), std::string::npos) << line;
  EXPECT_NE(read("events/uprobes/e12f/format").find(
                "print fmt: \"(%lx) a={%u,%u}\", REC->__probe_ip, REC->a[0], REC->a[1]"),
            std::string::npos);
  EXPECT_NE(read("events/uprobes/e19d/format").find(
                "print fmt: \"(%lx) a=\\\"%s\\\"\", REC->__probe_ip, __get_str(a)"),
            std::string::npos);
}

TEST_F(DynamicEventsTest, ErrorLogKeepsEightEntriesAndClearsOnlyOnTruncation) {
  const std::string b = kProg;
  std::string expected;
  for (int i = 1; i <= 12; ++i) {
    std::string def = "p:uprobes/ring" + std::to_string(i) + " " + b + ":0x1370 a=%bad" +
                      std::to_string(i);
    EXPECT_EQ(echo("uprobe_events", def), -EINVAL);
    if (i > 4) expected += log_entry("trace_uprobe", "Invalid register name", def,
                                     static_cast<int>(def.find("%bad")));
  }
  EXPECT_EQ(log(), expected);
  // Writes without O_TRUNC take the bytes and change nothing.
  EXPECT_EQ(write("error_log", "x\n"), 2);
  EXPECT_EQ(write("error_log", "x\n", O_WRONLY), 2);
  EXPECT_EQ(log(), expected);
  // Read-only with O_TRUNC clears nothing either.
  Request rq = request(O_RDONLY | O_TRUNC);
  std::unique_ptr<Handle> h;
  ASSERT_EQ(fs_->tree().open("error_log", rq, O_RDONLY | O_TRUNC, &h), 0);
  EXPECT_EQ(log(), expected);
  EXPECT_EQ(write("error_log", "\n", O_WRONLY | O_TRUNC), 1);
  EXPECT_EQ(read("error_log"), "");
  // Others add entries through DynamicEvents; truncate() clears.
  events::Diagnostic d = events::subsystem_filter_error("a == 1");
  fs_->dynamic_events().log_error(d);
  EXPECT_EQ(log(), log_entry("event filter parse error",
                             "Couldn't find or set field in one of a subsystem's events",
                             "a == 1", 0));
  ASSERT_EQ(fs_->tree().walk("error_log")->file()->truncate(request(O_WRONLY)), 0);
  EXPECT_EQ(read("error_log"), "");
}

TEST_F(DynamicEventsTest, EachWriteIsParsedByItselfLineByLine) {
  const std::string b = kProg;
  // Line 1 applies, line 2 fails, line 3 is never looked at.
  const std::string ml2 = "p:uprobes/ml2 " + b + ":0x1370 a=%bad";
  EXPECT_EQ(write("uprobe_events", "p:uprobes/ml1 " + b + ":0x1370\n" + ml2 + "\np:uprobes/ml3 " +
                                       b + ":0x1370"),
            -EINVAL);
  EXPECT_EQ(read("uprobe_events"), "p:uprobes/ml1 " + b + ":" + padded(0x1370) + "\n");
  EXPECT_EQ(log(), log_entry("trace_uprobe", "Invalid register name", ml2,
                             static_cast<int>(ml2.find("%bad"))));
  EXPECT_EQ(echo("uprobe_events", "-:ml1"), 0);
  EXPECT_EQ(echo("uprobe_events", "-:ml3"), -ENOENT);
  // A definition split across two write() calls: the first is a whole line already.
  const std::string split = "p:uprobes/split1 " + b + ":0x1370";
  EXPECT_EQ(write("uprobe_events", split), static_cast<int64_t>(split.size()));
  EXPECT_EQ(write("uprobe_events", " a=%di\n"), -EINVAL);
  EXPECT_EQ(read("uprobe_events"), "p:uprobes/split1 " + b + ":" + padded(0x1370) + "\n");
  // The kernel's answers to the shell's `echo ... >> uprobe_events`.
  EXPECT_EQ(echo("uprobe_events", "p:uprobes/sh2 /nonexistent:0x1370"), -ENOENT);
  EXPECT_EQ(echo("uprobe_events", "p:uprobes/split1 " + b + ":0x1370"), -EEXIST);
  EXPECT_EQ(echo("uprobe_events", "-:uprobes/nope"), -ENOENT);
  // dynamic_events logs uprobe errors as trace_uprobe.
  clear_log();
  const std::string dy1 = "p:uprobes/dy1 " + b + ":0x1370 a=%zz";
  EXPECT_EQ(echo("dynamic_events", dy1), -EINVAL);
  EXPECT_EQ(log(), log_entry("trace_uprobe", "Invalid register name", dy1,
                             static_cast<int>(dy1.find("%zz"))));
  // Event probes (e:), which no dynamic-event kind claims: EINVAL, nothing logged. f: and
  // t: are trace_fprobe's: a function no target has, a tracepoint no process has.
  clear_log();
  EXPECT_EQ(echo("dynamic_events", "e:dyn/ep sched.sched_switch"), -EINVAL);
  EXPECT_EQ(log(), "");
  EXPECT_EQ(echo("dynamic_events", "f:dyn/fp vfs_read"), -ENOENT);
  EXPECT_EQ(echo("dynamic_events", "t:dyn/tp sched_switch"), -EINVAL);
  EXPECT_EQ(log(), log_entry("trace_fprobe", "Invalid probed address or symbol",
                             "f:dyn/fp vfs_read", 9) +
                       log_entry("trace_fprobe", "Tracepoint is not found",
                                 "t:dyn/tp sched_switch", 9));
  // A synthetic event belongs to the synthetic group alone.
  clear_log();
  EXPECT_EQ(echo("dynamic_events", "s:dyn/synth u64 lat"), -EINVAL);
  EXPECT_EQ(log(), log_entry("synthetic_events",
                             "Command must be of the form: s or -:[synthetic/]<name> "
                             "field[;field] ...",
                             "s:dyn/synth u64 lat", 0));
  // A name without group and event prefix characters ("r10:", "pfoo:") keeps the defaults.
  LinkDir links;
  const std::string ptx = links.link("pt_x");
  EXPECT_EQ(echo("uprobe_events", "r10:uprobes/e20 " + ptx + ":0x13b0"), 0);
  EXPECT_EQ(echo("uprobe_events", "pfoo:uprobes/e20b " + ptx + ":0x1380"), 0);
  std::string back = read("uprobe_events");
  EXPECT_NE(back.find("r:uprobes/p_pt_0x13b0 " + ptx + ":" + padded(0x13b0) + "\n"),
            std::string::npos);
  EXPECT_NE(back.find("p:uprobes/p_pt_0x1380 " + ptx + ":" + padded(0x1380) + "\n"),
            std::string::npos);
}

TEST_F(DynamicEventsTest, KprobeSyntaxHasItsOwnFileGroupAndLog) {
  const std::string b = kProg;
  const std::string sym = kProgName + ":traced_add";
  EXPECT_EQ(echo("kprobe_events", "p:kp/add " + sym + " a=%di b=%si:s64"), 0);
  EXPECT_EQ(echo("kprobe_events", "r " + sym + " rv=$retval"), 0);
  EXPECT_EQ(echo("uprobe_events", "p:up/add " + b + ":0x1370"), 0);
  EXPECT_EQ(read("kprobe_events"),
            "p:kp/add " + sym + " a=%di b=%si:s64\n"
            "r:kprobes/r_" + kProgName + "_traced_add_0 " + sym + " rv=$retval\n");
  EXPECT_EQ(read("uprobe_events"), "p:up/add " + b + ":" + padded(0x1370) + "\n");
  EXPECT_EQ(read("dynamic_events"), read("kprobe_events") + read("uprobe_events"));
  auto view = fs_->events().find(kFirstEventId);
  ASSERT_NE(view, nullptr);
  EXPECT_TRUE(view->kprobe_style);
  // kprobe_profile: "  %-44s %15lu %15lu\n", event, hits, misses.
  char line[160];
  std::string profile;
  snprintf(line, sizeof line, "  %-44s %15lu %15lu\n", "add", 0ul, 0ul);
  profile += line;
  snprintf(line, sizeof line, "  %-44s %15lu %15lu\n",
           ("r_" + kProgName + "_traced_add_0").c_str(), 0ul, 0ul);
  profile += line;
  EXPECT_EQ(read("kprobe_profile"), profile);
  // Uprobe syntax is not kprobe_events' (and the other way round): EINVAL, unlogged.
  EXPECT_EQ(echo("kprobe_events", "p:up/x " + b + ":0x1370"), -EINVAL);
  EXPECT_EQ(echo("uprobe_events", "p:kp/x " + sym), -EINVAL);
  EXPECT_EQ(log(), "");
  const std::string bad = "p:kp/bad " + sym + " a=%foo";
  EXPECT_EQ(echo("kprobe_events", bad), -EINVAL);
  EXPECT_EQ(log(), log_entry("trace_kprobe", "Invalid register name", bad,
                             static_cast<int>(bad.find("%foo"))));
  // The same name in the other kind: the kernel cannot register the name again.
  clear_log();
  const std::string clash = "p:kp/add " + b + ":0x1370";
  EXPECT_EQ(echo("uprobe_events", clash), -EEXIST);
  EXPECT_EQ(log(), log_entry("trace_uprobe",
                             "Given group/event name is already used by another event", clash, 0));
  // Removals stay within their file's kind; dynamic_events removes any.
  EXPECT_EQ(echo("uprobe_events", "-:kp/add"), -ENOENT);
  EXPECT_EQ(echo("kprobe_events", "-:up/add"), -ENOENT);
  EXPECT_EQ(echo("dynamic_events", "-:kp/add"), 0);
  EXPECT_EQ(echo("dynamic_events", "!up/add"), -EINVAL);  // "!" needs a type and ":"
  EXPECT_EQ(echo("dynamic_events", "!p:up/add"), 0);
  // O_TRUNC on kprobe_events removes the kprobe events only.
  EXPECT_EQ(echo("uprobe_events", "p:up/add " + b + ":0x1370"), 0);
  EXPECT_EQ(open_truncating("kprobe_events"), 0);
  EXPECT_EQ(read("kprobe_events"), "");
  EXPECT_EQ(read("kprobe_profile"), "");
  EXPECT_EQ(read("uprobe_events"), "p:up/add " + b + ":" + padded(0x1370) + "\n");
}

// ---- removal, truncation, several probes per event ------------------------------------

TEST_F(DynamicEventsTest, RemovalForms) {
  const std::string b = kProg;
  for (const std::string& d : {"p:grp1/ev2 " + b + ":0x1370", "p:grp2/ev2 " + b + ":0x1380",
                               "p:mygrp/a " + b + ":0x1370", "p:mygrp/b " + b + ":0x1380",
                               "p:grp1/multi " + b + ":0x1370 a=%di",
                               "p:grp1/multi " + b + ":0x13c0 a=%di"})
    ASSERT_EQ(echo("uprobe_events", d), 0) << d;
  // -:EVENT removes that event in every group.
  EXPECT_EQ(echo("uprobe_events", "-:ev2"), 0);
  EXPECT_FALSE(exists("events/grp2"));
  EXPECT_EQ(echo("uprobe_events", "-:grp1/ev2"), -ENOENT);
  // -:GROUP/ removes the group; GROUP/* names an event called "*".
  EXPECT_EQ(echo("uprobe_events", "-:mygrp/*"), -ENOENT);
  EXPECT_EQ(echo("uprobe_events", "-:mygrp/"), 0);
  EXPECT_FALSE(exists("events/mygrp"));
  EXPECT_EQ(echo("uprobe_events", "-:mygrp/"), -ENOENT);
  // One probe of several: the place as read back (padded offset) and the arguments.
  EXPECT_EQ(echo("uprobe_events", "-:grp1/multi " + b + ":0x13c0 a=%di"), -ENOENT);
  EXPECT_EQ(echo("uprobe_events", "-:grp1/multi " + b + ":" + padded(0x13c0) + " a=%si"),
            -ENOENT);
  EXPECT_EQ(echo("uprobe_events", "-:grp1/multi " + b + ":" + padded(0x13c0) + " a=%di"), 0);
  EXPECT_EQ(read("uprobe_events"), "p:grp1/multi " + b + ":" + padded(0x1370) + " a=%di\n");
  EXPECT_EQ(echo("uprobe_events", "-:grp1/multi " + b + ":" + padded(0x1370)), 0);
  EXPECT_EQ(read("uprobe_events"), "");
  EXPECT_EQ(ls("events"),
            (std::vector<std::string>{"enable", "header_page", "header_event", "ftrace"}));
  // Malformed removals.
  for (const char* d : {"-:", "-", "-uprobes/x"}) EXPECT_EQ(echo("uprobe_events", d), -EINVAL) << d;
  EXPECT_EQ(echo("uprobe_events", "-:uprobes/bad-name"), -ENOENT);
  EXPECT_EQ(log(), "");
  // Across files: defined in one, removed through the other.
  ASSERT_EQ(echo("dynamic_events", "p:dyn/u2 " + b + ":0x1370"), 0);
  EXPECT_EQ(echo("uprobe_events", "-:dyn/u2"), 0);
  EXPECT_EQ(read("dynamic_events"), "");
}

TEST_F(DynamicEventsTest, EnabledEventsAreBusy) {
  const std::string b = kProg;
  ASSERT_EQ(echo("uprobe_events", "p:uprobes/ref_add3 " + b + ":0x1370 a=%di"), 0);
  ASSERT_EQ(echo("uprobe_events", "p:uprobes/other " + b + ":0x1380"), 0);
  ASSERT_EQ(write("events/uprobes/ref_add3/enable", "1\n"), 2);
  const std::string before = read("uprobe_events");
  // O_TRUNC fails at open and removes nothing, through either file; so does truncate().
  EXPECT_EQ(open_truncating("uprobe_events"), -EBUSY);
  EXPECT_EQ(open_truncating("dynamic_events"), -EBUSY);
  EXPECT_EQ(fs_->tree().walk("uprobe_events")->file()->truncate(request(O_WRONLY)), -EBUSY);
  EXPECT_EQ(read("uprobe_events"), before);
  EXPECT_EQ(echo("uprobe_events", "-:uprobes/ref_add3"), -EBUSY);
  EXPECT_EQ(echo("dynamic_events", "-:uprobes/ref_add3"), -EBUSY);
  // A probe may still join an enabled event.
  LinkDir links;
  const std::string ptx = links.link("pt_x");
  EXPECT_EQ(echo("uprobe_events", "p:uprobes/ref_add3 " + ptx + ":0x1370 a=%di"), 0);
  // Removing every probe of an enabled event: the kernel frees them in order, the first
  // while it has a sibling, then finds the last one busy.
  EXPECT_EQ(echo("uprobe_events", "-:uprobes/ref_add3"), -EBUSY);
  EXPECT_EQ(read("uprobe_events"), "p:uprobes/other " + b + ":" + padded(0x1380) + "\n" +
                                       "p:uprobes/ref_add3 " + ptx + ":" + padded(0x1370) +
                                       " a=%di\n");
  EXPECT_EQ(log(), "");
  ASSERT_EQ(write("events/uprobes/ref_add3/enable", "0\n"), 2);
  // With nothing enabled: O_TRUNC removes every event and its files, and the same open
  // may define again.
  Request rq = request(O_WRONLY | O_TRUNC);
  std::unique_ptr<Handle> h;
  ASSERT_EQ(fs_->tree().open("uprobe_events", rq, O_WRONLY | O_TRUNC, &h), 0);
  EXPECT_EQ(read("uprobe_events"), "");
  EXPECT_EQ(read("uprobe_profile"), "");
  EXPECT_EQ(read("available_events"), "");
  EXPECT_FALSE(exists("events/uprobes"));
  const std::string t2 = "p:uprobes/t2 " + b + ":0x1380\n";
  EXPECT_EQ(h->write(rq, 0, t2), static_cast<int64_t>(t2.size()));
  EXPECT_EQ(read("uprobe_events"), "p:uprobes/t2 " + b + ":" + padded(0x1380) + "\n");
  // A read-only open with O_TRUNC removes nothing.
  Request ro = request(O_RDONLY | O_TRUNC);
  ASSERT_EQ(fs_->tree().open("uprobe_events", ro, O_RDONLY | O_TRUNC, &h), 0);
  EXPECT_NE(read("uprobe_events"), "");
  EXPECT_EQ(open_truncating("dynamic_events"), 0);
  EXPECT_EQ(read("dynamic_events"), "");
}

TEST_F(DynamicEventsTest, SeveralProbesPerEvent) {
  const std::string b = kProg;
  LinkDir links;
  const std::string ptx = links.link("pt_x");
  ASSERT_EQ(echo("uprobe_events", "p:grp2/m2 " + b + ":0x1370 a=%di"), 0);
  const std::string differ_name = "p:grp2/m2 " + b + ":0x13c0 b=%di";
  const std::string differ_type = "p:grp2/m2 " + b + ":0x13c0 a=%di:u32";
  const std::string differ_kind = "r:grp2/m2 " + b + ":0x13c0 a=%di";
  const std::string same = "p:grp2/m2 " + b + ":0x1370 a=%di";
  EXPECT_EQ(echo("uprobe_events", differ_name), -EEXIST);
  EXPECT_EQ(echo("uprobe_events", differ_type), -EEXIST);
  EXPECT_EQ(echo("uprobe_events", "p:grp2/m2 " + b + ":0x13c0 a=%si"), 0);
  EXPECT_EQ(echo("uprobe_events", differ_kind), -EEXIST);
  EXPECT_EQ(echo("uprobe_events", same), -EEXIST);
  EXPECT_EQ(echo("uprobe_events", "p:grp2/m2 " + ptx + ":0x1370 a=%di"), 0);
  const std::string arg_pos = b + ":0x13c0 ";
  EXPECT_EQ(log(),
            log_entry("trace_uprobe", "Argument type or name is different from existing probe",
                      differ_name, static_cast<int>(differ_name.find(arg_pos) + arg_pos.size())) +
                log_entry("trace_uprobe",
                          "Argument type or name is different from existing probe", differ_type,
                          static_cast<int>(differ_type.find(arg_pos) + arg_pos.size())) +
                log_entry("trace_uprobe", "Probe type is different from existing probe",
                          differ_kind, 0) +
                log_entry("trace_uprobe", "There is already the exact same probe event", same, 0));
  EXPECT_EQ(read("uprobe_events"), "p:grp2/m2 " + b + ":" + padded(0x1370) + " a=%di\n" +
                                       "p:grp2/m2 " + b + ":" + padded(0x13c0) + " a=%si\n" +
                                       "p:grp2/m2 " + ptx + ":" + padded(0x1370) + " a=%di\n");
  EXPECT_EQ(read("available_events"), "grp2:m2\n");
  EXPECT_EQ(read("events/grp2/m2/id"), std::to_string(kFirstEventId) + "\n");
  std::string profile;
  events::format_profile_line(profile, b, "m2", 0);
  events::format_profile_line(profile, b, "m2", 0);
  events::format_profile_line(profile, ptx, "m2", 0);
  EXPECT_EQ(read("uprobe_profile"), profile);
}

// ---- enable, filter, set_event ---------------------------------------------------------

TEST_F(DynamicEventsTest, EnableFilesFollowTheKernelsNumberRules) {
  const std::string b = kProg;
  ASSERT_EQ(echo("uprobe_events", "p:uprobes/a " + b + ":0x1370"), 0);
  ASSERT_EQ(echo("uprobe_events", "p:uprobes/b " + b + ":0x1380"), 0);
  ASSERT_EQ(echo("uprobe_events", "p:other/c " + b + ":0x13b0"), 0);
  const char* e = "events/uprobes/a/enable";
  EXPECT_EQ(write(e, "1\n"), 2);
  EXPECT_EQ(read(e), "1\n");
  EXPECT_EQ(write(e, "1\n"), 2);  // already 1: fine
  for (const char* bad : {"2\n", "-1\n", "abc\n", "\n", " 1\n", "1 \n", "0x1\n", "10\n",
                          "1abc\n", ""})
    EXPECT_EQ(write(e, bad), -EINVAL) << bad;
  EXPECT_EQ(read(e), "1\n");
  EXPECT_EQ(write(e, "01\n"), 3);
  EXPECT_EQ(write(e, "+1\n"), 3);
  EXPECT_EQ(write(e, "1"), 1);
  // Group and top-level aggregates.
  EXPECT_EQ(read("events/uprobes/enable"), "X\n");
  EXPECT_EQ(read("events/other/enable"), "0\n");
  EXPECT_EQ(read("events/enable"), "X\n");
  EXPECT_EQ(read("set_event"), "uprobes:a\n");
  EXPECT_EQ(write("events/uprobes/enable", "1\n"), 2);
  EXPECT_EQ(read("events/uprobes/enable"), "1\n");
  EXPECT_EQ(read("events/uprobes/b/enable"), "1\n");
  for (const char* bad : {"2\n", "X\n", "x\n", "abc\n"})
    EXPECT_EQ(write("events/uprobes/enable", bad), -EINVAL) << bad;
  EXPECT_EQ(write("events/enable", "1\n"), 2);
  EXPECT_EQ(read("events/enable"), "1\n");
  EXPECT_EQ(read("set_event"), "other:c\nuprobes:b\nuprobes:a\n");
  EXPECT_EQ(write("events/enable", "0\n"), 2);
  EXPECT_EQ(read("events/enable"), "0\n");
  EXPECT_EQ(read("set_event"), "");
  // An enabled event's probes are enabled in the tracer: O_TRUNC is refused.
  EXPECT_EQ(write("events/other/enable", "1\n"), 2);
  EXPECT_EQ(open_truncating("uprobe_events"), -EBUSY);
}

// The resets scripts write unconditionally (ftracetest's first lines, trace-cmd's) succeed
// on a mount with no event at all, where the kernel's events/ is never empty.
TEST_F(DynamicEventsTest, ResetsSucceedWithNoEvent) {
  EXPECT_EQ(write("events/enable", "0\n"), 2);
  EXPECT_EQ(write("events/enable", "1\n"), 2);
  EXPECT_EQ(read("events/enable"), "?\n");  // the kernel's answer for no event
  for (const char* w : {"*:*\n", "!*:*\n", ":\n", "!:\n", "*:\n", ":*\n", "\n"})
    EXPECT_EQ(write("set_event", w), static_cast<int64_t>(std::strlen(w))) << w;
  EXPECT_EQ(read("set_event"), "");
  // A word that names something still needs it to exist.
  for (const char* w : {"grp:ev\n", "ev\n", "*\n", "grp:*\n", "*:ev\n"})
    EXPECT_EQ(write("set_event", w), -EINVAL) << w;
  EXPECT_EQ(open_truncating("set_event"), 0);
  EXPECT_EQ(open_truncating("kprobe_events"), 0);
  EXPECT_EQ(open_truncating("uprobe_events"), 0);
  EXPECT_EQ(open_truncating("dynamic_events"), 0);
}

TEST_F(DynamicEventsTest, SetEventTakesOneWordPerWrite) {
  const std::string b = kProg;
  ASSERT_EQ(echo("uprobe_events", "p:zgrp/e1 " + b + ":0x1370 a=%di"), 0);
  ASSERT_EQ(echo("uprobe_events", "p:zgrp/e2 " + b + ":0x1380"), 0);
  ASSERT_EQ(echo("uprobe_events", "p:zgrp/e0 " + b + ":0x13b0"), 0);
  ASSERT_EQ(echo("uprobe_events", "p:agrp/e3 " + b + ":0x13c0"), 0);
  struct Step {
    const char* write;
    int64_t result;
    const char* set_event;
  } steps[] = {
      {"zgrp:nope\n", -EINVAL, ""},
      {"nope\n", -EINVAL, ""},
      {"nogrp:e1\n", -EINVAL, ""},
      {"zgrp:e1\n", 8, "zgrp:e1\n"},
      {"!zgrp:e1\n", 9, ""},
      {"zgrp\n", 5, "zgrp:e0\nzgrp:e2\nzgrp:e1\n"},
      {"!e2\n", 4, "zgrp:e0\nzgrp:e1\n"},
      {"zgrp:*\n", 7, "zgrp:e0\nzgrp:e2\nzgrp:e1\n"},
      {"!zgrp:*\n", 8, ""},
      {":e1\n", 4, "zgrp:e1\n"},
      {"zgrp:\n", 6, "zgrp:e0\nzgrp:e2\nzgrp:e1\n"},
      {"!zgrp\n", 6, ""},
      {"zgrp:e0 agrp:e3\n", 8, "zgrp:e0\n"},
      {"!nope\n", -EINVAL, "zgrp:e0\n"},
      {"zgrp:e*\n", -EINVAL, "zgrp:e0\n"},
      {"z*:e1\n", -EINVAL, "zgrp:e0\n"},
      {"\n", 1, "zgrp:e0\n"},
      {"   \n", 4, "zgrp:e0\n"},
      {"!*\n", -EINVAL, "zgrp:e0\n"},
      {"!zgrp:e0:x\n", -EINVAL, "zgrp:e0\n"},
      {"!\n", -EINVAL, "zgrp:e0\n"},
      {"*:*\n", 4, "agrp:e3\nzgrp:e0\nzgrp:e2\nzgrp:e1\n"},
      {"!*:e0\n", 6, "agrp:e3\nzgrp:e2\nzgrp:e1\n"},
      {"!:\n", 3, ""},
  };
  for (const Step& s : steps) {
    EXPECT_EQ(write("set_event", s.write), s.result) << s.write;
    EXPECT_EQ(read("set_event"), s.set_event) << s.write;
  }
  EXPECT_EQ(write("set_event", "zgrp:e1\n"), 8);
  EXPECT_EQ(read("events/zgrp/e1/enable"), "1\n");
  // O_TRUNC turns every event off; read-only O_TRUNC does nothing.
  Request ro = request(O_RDONLY | O_TRUNC);
  std::unique_ptr<Handle> h;
  ASSERT_EQ(fs_->tree().open("set_event", ro, O_RDONLY | O_TRUNC, &h), 0);
  EXPECT_EQ(read("set_event"), "zgrp:e1\n");
  EXPECT_EQ(open_truncating("set_event"), 0);
  EXPECT_EQ(read("set_event"), "");
  EXPECT_EQ(read("events/zgrp/e1/enable"), "0\n");
}

TEST_F(DynamicEventsTest, FilterFiles) {
  const std::string b = kProg;
  ASSERT_EQ(echo("uprobe_events", "p:uprobes/ref_add3 " + b +
                                      ":0x1370 a=%di b=%si:u32 c=%dx:s32 cx=%dx:x16 "
                                      "c64=%dx:s64 imm=\\123 imms=\\\"hi\""),
            0);
  ASSERT_EQ(echo("uprobe_events", "p:uprobes/ref_mix " + b +
                                      ":0x1380 x=%di:s64 str=+0(%si):string"),
            0);
  ASSERT_EQ(echo("uprobe_events", "p:uprobes/ref_negs " + b + ":0x13c0 v=%di:s64"), 0);
  const char* f = "events/uprobes/ref_add3/filter";
  const char* mixf = "events/uprobes/ref_mix/filter";
  for (const char* good : {"a == 2", "b >= 20 && c == -5", "common_pid != 0 || a == 1", "a & 1",
                           "b > 0x10"}) {
    EXPECT_EQ(write(f, std::string(good) + "\n"), static_cast<int64_t>(strlen(good) + 1));
    EXPECT_EQ(read(f), std::string(good) + "\n");
  }
  for (const char* good : {"str ~ \"hello-[13]\"", "str == \"hello-2\"",
                           "str ~ \"*-4\" || x == 100"}) {
    EXPECT_EQ(write(mixf, std::string(good) + "\n"), static_cast<int64_t>(strlen(good) + 1));
    EXPECT_EQ(read(mixf), std::string(good) + "\n");
  }
  clear_log();
  struct Bad {
    const char* file;
    const char* text;
    int err;
    const char* shown;
    const char* message;  // error_log, nullptr for "Error"
    int pos;
  } bad[] = {
      {f, "zzz == 5", EINVAL, "zzz == 5\n    ^\nparse_error: Field not found\n\n",
       "Field not found", 4},
      {f, "a == ", EINVAL, "a ==\n    ^\nparse_error: Invalid value (did you forget quotes)?\n\n",
       "Invalid value (did you forget quotes)?", 5},
      {f, "a === 5", EINVAL,
       "a === 5\n     ^\nparse_error: Invalid value (did you forget quotes)?\n\n",
       "Invalid value (did you forget quotes)?", 5},
      {f, "(a == 1", ENOENT, "(a == 1\n^\nparse_error: Too many '('\n\n", "Too many '('", 0},
      {f, "a ~ \"x*\"", EINVAL, "a ~ \"x*\"\n     ^\nparse_error: Expecting numeric field\n\n",
       "Expecting numeric field", 5},
      {f, "&& a == 1", EPERM, "&& a == 1\nError: (0)\n\n", "Error", 0},
      {mixf, "str == 5", EINVAL, "str == 5\n        ^\nparse_error: Expecting string field\n\n",
       "Expecting string field", 8},
  };
  std::string expected_log;
  for (const Bad& x : bad) {
    EXPECT_EQ(write(x.file, std::string(x.text) + "\n"), -x.err) << x.text;
    EXPECT_EQ(read(x.file), x.shown) << x.text;
    std::string cmd = x.text;
    while (!cmd.empty() && cmd.back() == ' ') cmd.pop_back();
    expected_log += log_entry("event filter parse error", x.message, cmd, x.pos);
  }
  // error_log keeps the last eight.
  EXPECT_EQ(log(), expected_log);
  // `0` clears; an empty write is the kernel's "Error: (0)", not a clear.
  EXPECT_EQ(write(f, "a == 1\n"), 7);
  EXPECT_EQ(write(f, "0\n"), 2);
  EXPECT_EQ(read(f), "none\n");
  EXPECT_EQ(write(f, "a == 1\n"), 7);
  EXPECT_EQ(write(f, "\n"), -EINVAL);
  EXPECT_EQ(read(f), "\nError: (0)\n\n");
  EXPECT_EQ(write(f, "a == 1\n"), 7);
  EXPECT_EQ(write(f, "\n", O_WRONLY | O_TRUNC), -EINVAL);
  EXPECT_EQ(read(f), "\nError: (0)\n\n");

  // A group filter: the events with the fields take it, the others show the kernel's
  // subsystem error (and log it); the group file keeps its banner; the write succeeds.
  clear_log();
  EXPECT_EQ(write("events/uprobes/filter", "a == 1\n"), 7);
  const std::string banner =
      "### global filter ###\n# Use this to set filters for multiple events.\n"
      "# Only events with the given fields will be affected.\n"
      "# If no events are modified, an error message will be displayed here\n";
  const std::string sub =
      "a == 1\n^\nparse_error: Couldn't find or set field in one of a subsystem's events\n\n";
  EXPECT_EQ(read("events/uprobes/filter"), banner);
  EXPECT_EQ(read(f), "a == 1\n");
  EXPECT_EQ(read(mixf), sub);
  EXPECT_EQ(read("events/uprobes/ref_negs/filter"), sub);
  const std::string sub_log = log_entry(
      "event filter parse error", "Couldn't find or set field in one of a subsystem's events",
      "a == 1", 0);
  EXPECT_EQ(log(), sub_log + sub_log);
  EXPECT_EQ(write("events/uprobes/filter", "zzz == 1\n"), 9);
  EXPECT_EQ(read("events/uprobes/filter"), banner);
  EXPECT_EQ(write("events/uprobes/filter", "0\n"), 2);
  EXPECT_EQ(read(f), "none\n");
  EXPECT_EQ(read(mixf), "none\n");
}

// ---- triggers ------------------------------------------------------------------------------

TEST_F(DynamicEventsTest, TriggerFileGrammarAndReadBack) {
  const std::string b = kProg;
  ASSERT_EQ(echo("uprobe_events", "p:zgrp/e1 " + b + ":0x1370 a=%di"), 0);
  ASSERT_EQ(echo("uprobe_events", "p:zgrp/e2 " + b + ":0x1380 x=%di"), 0);
  ASSERT_EQ(echo("uprobe_events", "p:zgrp/e0 " + b + ":0x13b0"), 0);
  ASSERT_EQ(echo("uprobe_events", "p:agrp/e3 " + b + ":0x13c0"), 0);
  const char* t = "events/zgrp/e1/trigger";
  const std::string none = "# Available triggers:\n# traceon traceoff snapshot stacktrace enable_event disable_event hist\n";
  struct Step {
    const char* write;
    int err;
    const char* after;  // nullptr: unchanged
  } steps[] = {
      {"foo", EINVAL, nullptr},
      {"hist:keys=x", EINVAL, nullptr},
      {"snapshot+1", EINVAL, nullptr},
      {"", EINVAL, nullptr},
      {"# c", EINVAL, nullptr},
      {"traceoff", 0, "traceoff:unlimited\n"},
      {"traceon:3", EEXIST, nullptr},  // traceon and traceoff share one place
      {"traceoff if a == 1", EEXIST, nullptr},
      {"enable_event:zgrp:e2:3 if a == 0", 0,
       "enable_event:zgrp:e2:count=3 if a == 0\ntraceoff:unlimited\n"},
      {"disable_event:zgrp:e0", 0,
       "disable_event:zgrp:e0:unlimited\nenable_event:zgrp:e2:count=3 if a == 0\n"
       "traceoff:unlimited\n"},
      {"enable_event:zgrp:nope", EINVAL, nullptr},
      {"enable_event:nogrp:e2", EINVAL, nullptr},
      {"enable_event:zgrp:e2", EEXIST, nullptr},
      {"disable_event:zgrp:e2", EEXIST, nullptr},  // one place per target
      {"traceoff:-1", EINVAL, nullptr},
      {"traceoff:abc", EINVAL, nullptr},
      {"traceoff:3x", EINVAL, nullptr},
      {"traceoff:count=3", EINVAL, nullptr},
      {"traceon if", EINVAL, nullptr},
      {"traceon iff a==1", EINVAL, nullptr},
      {"traceon # x", EINVAL, nullptr},
      {"traceon\ntraceoff", EINVAL, nullptr},
      {"enable_event:zgrp", EINVAL, nullptr},
      {"enable_event:zgrp:e2:", EINVAL, nullptr},
      {"enable_event:zgrp:e2:x", EINVAL, nullptr},
      {"!foo", EINVAL, nullptr},
      {"!enable_event:zgrp:nope", EINVAL, nullptr},
      // Removal: by kind (traceon removes traceoff) and target; count and filter are not
      // looked at; nothing to remove is fine.
      {"!traceon", 0,
       "disable_event:zgrp:e0:unlimited\nenable_event:zgrp:e2:count=3 if a == 0\n"},
      {"!traceoff:7", 0, nullptr},
      {"!enable_event:zgrp:e2:5", 0, "disable_event:zgrp:e0:unlimited\n"},
      {"!disable_event:zgrp:e2", 0, nullptr},
      {"!enable_event:zgrp:e0", 0, ""},
      {"  traceoff", 0, "traceoff:unlimited\n"},
      {"traceoff   ", EEXIST, nullptr},
      {"traceoff:0", EEXIST, nullptr},
      {"!traceoff if zzz", 0, ""},
      {"traceon:0x10", 0, "traceon:count=16\n"},
      {"!traceon", 0, ""},
      {"traceon:3:4", 0, "traceon:count=3\n"},
      {"!traceon", 0, ""},
      {"traceon:010", 0, "traceon:count=8\n"},
      {"!traceon", 0, ""},
      {"traceon:  if   a==0   ", 0, "traceon:unlimited if   a==0\n"},
      {"!traceon", 0, ""},
      {"traceon if   a==0  &&  a  >  1 ", 0, "traceon:unlimited if   a==0  &&  a  >  1\n"},
      {"!traceon", 0, ""},
      {"traceoff 3", 0, "traceoff:count=3\n"},
      {"!traceoff", 0, ""},
      {"traceoff\tif a == 1", 0, "traceoff:unlimited if a == 1\n"},
      {"!traceoff", 0, ""},
      {"traceoff:2:x", 0, "traceoff:count=2\n"},
      {"enable_event:zgrp:e1", 0, "enable_event:zgrp:e1:unlimited\ntraceoff:count=2\n"},
  };
  for (const Step& s : steps) {
    std::string before = read(t);
    std::string data = std::string(s.write) + "\n";
    EXPECT_EQ(write(t, data), s.err ? -s.err : static_cast<int64_t>(data.size())) << s.write;
    std::string after = read(t);
    std::string want = !s.after ? before : *s.after ? std::string(s.after) : none;
    EXPECT_EQ(after, want) << s.write;
  }
  // Filter errors of a trigger: the filter's errno and an error_log entry.
  clear_log();
  ASSERT_EQ(write(t, "!traceoff\n"), 10);
  EXPECT_EQ(write(t, "traceoff if (a == 1\n"), -ENOENT);
  EXPECT_EQ(write(t, "traceoff if && a == 1\n"), -EPERM);
  EXPECT_EQ(write(t, "traceoff if a == \n"), -EINVAL);
  EXPECT_EQ(write(t, "traceoff if zzz == 1\n"), -EINVAL);
  EXPECT_EQ(log(), log_entry("event filter parse error", "Too many '('", "(a == 1", 0) +
                       log_entry("event filter parse error", "Error", "&& a == 1", 0) +
                       log_entry("event filter parse error",
                                 "Invalid value (did you forget quotes)?", "a ==", 5) +
                       log_entry("event filter parse error", "Field not found", "zzz == 1", 4));
  // O_TRUNC keeps the triggers (the kernel clears only hist triggers that way).
  EXPECT_EQ(write(t, "\n", O_WRONLY | O_TRUNC), -EINVAL);
  EXPECT_EQ(read(t), "enable_event:zgrp:e1:unlimited\n");
}

TEST_F(DynamicEventsTest, SoftModeStates) {
  const std::string b = kProg;
  ASSERT_EQ(echo("uprobe_events", "p:zgrp/src " + b + ":0x1370 a=%di"), 0);
  ASSERT_EQ(echo("uprobe_events", "p:zgrp/dst " + b + ":0x1380"), 0);
  ASSERT_EQ(echo("uprobe_events", "p:zgrp/on " + b + ":0x13b0"), 0);
  const char* t = "events/zgrp/src/trigger";
  ASSERT_EQ(write(t, "enable_event:zgrp:dst\n"), 22);
  // A target in soft mode is enabled for the kernel (set_event, aggregates, busy), off
  // for the reader; so is the event with the trigger.
  EXPECT_EQ(read("events/zgrp/dst/enable"), "0*\n");
  EXPECT_EQ(read("events/zgrp/src/enable"), "0*\n");
  EXPECT_EQ(read("set_event"), "zgrp:dst\nzgrp:src\n");
  EXPECT_EQ(read("events/zgrp/enable"), "X\n");
  EXPECT_EQ(echo("uprobe_events", "-:zgrp/dst"), -EBUSY);
  EXPECT_EQ(write("events/zgrp/dst/enable", "1\n"), 2);
  EXPECT_EQ(read("events/zgrp/dst/enable"), "1*\n");
  EXPECT_EQ(write("events/zgrp/dst/enable", "0\n"), 2);
  EXPECT_EQ(read("events/zgrp/dst/enable"), "0*\n");
  EXPECT_EQ(read("set_event"), "zgrp:dst\nzgrp:src\n");
  // Leaving soft mode while soft-disabled: off.
  ASSERT_EQ(write(t, "!enable_event:zgrp:dst\n"), 23);
  EXPECT_EQ(read("events/zgrp/dst/enable"), "0\n");
  EXPECT_EQ(read("set_event"), "");
  // An enabled target stays enabled through soft mode and after it.
  ASSERT_EQ(write("events/zgrp/on/enable", "1\n"), 2);
  ASSERT_EQ(write(t, "disable_event:zgrp:on\n"), 22);
  EXPECT_EQ(read("events/zgrp/on/enable"), "1*\n");
  ASSERT_EQ(write(t, "!disable_event:zgrp:on\n"), 23);
  EXPECT_EQ(read("events/zgrp/on/enable"), "1\n");
  // An event with a trigger is busy, as its target is; without, both go.
  ASSERT_EQ(write(t, "enable_event:zgrp:dst\n"), 22);
  EXPECT_EQ(read("events/zgrp/dst/enable"), "0*\n");
  EXPECT_EQ(echo("uprobe_events", "-:zgrp/src"), -EBUSY);
  ASSERT_EQ(write(t, "!enable_event:zgrp:dst\n"), 23);
  EXPECT_EQ(read("events/zgrp/src/enable"), "0\n");
  EXPECT_EQ(echo("uprobe_events", "-:zgrp/src"), 0);
  EXPECT_EQ(echo("uprobe_events", "-:zgrp/dst"), 0);
}

// ---- real programs: hits, records, triggers ------------------------------------------

// A launched traced_prog, killed at the end whatever happens.
struct Program : testing::TracedProgram {
  bool start(tracee::Tracer& t) {
    std::string err;
    bool ok = TracedProgram::start(t, kProg, &err);
    EXPECT_TRUE(ok) << err;
    return ok;
  }
};

// A record in the rings: its event and the fields by name.
struct Shown {
  std::string event;
  std::map<std::string, uint64_t> fields;
};

// Every record now in the rings, in timestamp order, as a trace reader takes them.
std::vector<Shown> read_records(Tracefs& fs) {
  std::vector<Shown> out;
  fs.tracer().consume_records(
      [&](const tracee::TraceRecord& r) {
        uint16_t id = 0;
        if (r.len >= 2) memcpy(&id, r.data, 2);
        auto view = fs.events().find(id);
        if (!view) return true;
        Shown s;
        s.event = view->name;
        for (const events::FieldLayout& f : view->compiled.fields) {
          uint64_t v = 0;
          if (f.offset + f.size <= r.len)
            memcpy(&v, r.data + f.offset, std::min<uint32_t>(f.size, 8));
          s.fields[f.name] = v;
        }
        out.push_back(std::move(s));
        return true;
      },
      SIZE_MAX);
  return out;
}

// "add0 ret0 add1 ..." for a compact comparison.
std::string sequence(const std::vector<Shown>& recs) {
  std::string s;
  for (const Shown& r : recs) {
    if (!s.empty()) s += ' ';
    s += r.event;
    if (r.fields.count("a")) s += std::to_string(r.fields.at("a"));
    else if (r.fields.count("rv")) s += std::to_string(r.fields.at("rv") / 3);
  }
  return s;
}

TEST_F(DynamicEventsTest, ProfilesCountRealHits) {
  const std::string b = kProg;
  const uint64_t add = file_offset("traced_add");
  const uint64_t str = file_offset("traced_str");
  char line[256];
  snprintf(line, sizeof line, "p:prof/add %s:0x%llx a=%%di", b.c_str(),
           static_cast<unsigned long long>(add));
  ASSERT_EQ(echo("uprobe_events", line), 0);
  snprintf(line, sizeof line, "p:prof/off %s:0x%llx", b.c_str(),
           static_cast<unsigned long long>(add));
  ASSERT_EQ(echo("uprobe_events", line), 0);
  // One event, two probes: one line each.
  snprintf(line, sizeof line, "p:prof/both %s:0x%llx", b.c_str(),
           static_cast<unsigned long long>(add));
  ASSERT_EQ(echo("uprobe_events", line), 0);
  snprintf(line, sizeof line, "p:prof/both %s:0x%llx", b.c_str(),
           static_cast<unsigned long long>(str));
  ASSERT_EQ(echo("uprobe_events", line), 0);
  ASSERT_EQ(echo("kprobe_events", "p:kprof/kadd " + kProgName + ":traced_add"), 0);
  ASSERT_EQ(write("events/prof/add/enable", "1\n"), 2);
  ASSERT_EQ(write("events/prof/both/enable", "1\n"), 2);
  ASSERT_EQ(write("events/kprof/kadd/enable", "1\n"), 2);

  Program p;
  ASSERT_TRUE(p.start(*tracer_));
  ASSERT_TRUE(p.call(100));
  ASSERT_EQ(p.ask("str 7"), "ok " + std::to_string(7 * 6 + 21));
  std::string expected;
  events::format_profile_line(expected, b, "add", 100);
  events::format_profile_line(expected, b, "off", 0);
  events::format_profile_line(expected, b, "both", 100);
  events::format_profile_line(expected, b, "both", 7);
  EXPECT_EQ(read("uprobe_profile"), expected);
  snprintf(line, sizeof line, "  %-44s %15lu %15lu\n", "kadd", 100ul, 0ul);
  EXPECT_EQ(read("kprobe_profile"), line);
  // Disabled again, the counts stay (they live as long as the probe).
  ASSERT_EQ(write("events/prof/add/enable", "0\n"), 2);
  ASSERT_TRUE(p.call(10));
  EXPECT_EQ(read("uprobe_profile").substr(0, read("uprobe_profile").find('\n') + 1),
            expected.substr(0, expected.find('\n') + 1));
  // The records of an enabled event carry the program's values.
  std::vector<Shown> recs = read_records(*fs_);
  size_t adds = 0;
  for (const Shown& r : recs)
    if (r.event == "add") {
      EXPECT_EQ(r.fields.at("a"), adds);
      ++adds;
    }
  EXPECT_EQ(adds, 100u);
}

class TriggerRecordsTest : public DynamicEventsTest {
 protected:
  // trg/add on traced_add's entry (a), trg/ret on its return (rv = 3a); `enable` says
  // which start enabled.
  void define(bool add_on, bool ret_on) {
    const uint64_t off = file_offset("traced_add");
    char line[256];
    snprintf(line, sizeof line, "p:trg/add %s:0x%llx a=%%di", kProg.c_str(),
             static_cast<unsigned long long>(off));
    ASSERT_EQ(echo("uprobe_events", line), 0);
    snprintf(line, sizeof line, "r:trg/ret %s:0x%llx rv=$retval", kProg.c_str(),
             static_cast<unsigned long long>(off));
    ASSERT_EQ(echo("uprobe_events", line), 0);
    if (add_on) {
      ASSERT_EQ(write("events/trg/add/enable", "1\n"), 2);
    }
    if (ret_on) {
      ASSERT_EQ(write("events/trg/ret/enable", "1\n"), 2);
    }
  }
};

// traceoff with a count and a condition, traceon with a condition, acting at the hits,
// as the kernel's uprobe events do.
TEST_F(TriggerRecordsTest, TraceoffAndTraceonActOnRecordsInOrder) {
  define(true, true);
  ASSERT_EQ(write("events/trg/add/trigger", "traceoff:2 if a >= 2\n"), 21);
  ASSERT_EQ(write("events/trg/ret/trigger", "traceon if rv == 15\n"), 20);
  Program p;
  ASSERT_TRUE(p.start(*tracer_));
  ASSERT_TRUE(p.call(10));
  // add2 turns tracing off (and is shown); ret5 turns it on (a conditional traceon's own
  // record is not shown); add6 spends the count and turns it off again. add3..add5 found
  // tracing already off: they did not count.
  EXPECT_EQ(sequence(read_records(*fs_)), "add0 ret0 add1 ret1 add2 add6");
  EXPECT_EQ(read("events/trg/add/trigger"), "traceoff:count=0 if a >= 2\n");
  EXPECT_EQ(read("events/trg/ret/trigger"), "traceon:unlimited if rv == 15\n");
  EXPECT_FALSE(fs_->tracing_on());
  // tracing_on set by hand: records again.
  fs_->set_tracing_on(true);
  ASSERT_TRUE(p.call(2));
  EXPECT_EQ(sequence(read_records(*fs_)), "add0 ret0 add1 ret1");
}

TEST_F(TriggerRecordsTest, UnconditionalTraceonShowsItsOwnRecord) {
  define(true, true);
  ASSERT_EQ(write("events/trg/add/trigger", "traceoff:1 if a == 1\n"), 21);
  ASSERT_EQ(write("events/trg/ret/trigger", "traceon\n"), 8);
  Program p;
  ASSERT_TRUE(p.start(*tracer_));
  ASSERT_TRUE(p.call(4));
  // add1 turns it off; ret1 (unconditional traceon) turns it on and is shown.
  EXPECT_EQ(sequence(read_records(*fs_)), "add0 ret0 add1 ret1 add2 ret2 add3 ret3");
  EXPECT_EQ(read("events/trg/add/trigger"), "traceoff:count=0 if a == 1\n");
  EXPECT_TRUE(fs_->tracing_on());
}

TEST_F(TriggerRecordsTest, EnableEventPutsItsTargetInSoftMode) {
  define(true, false);
  ASSERT_EQ(write("events/trg/add/trigger", "enable_event:trg:ret if a == 3\n"), 31);
  EXPECT_EQ(read("events/trg/ret/enable"), "0*\n");
  Program p;
  ASSERT_TRUE(p.start(*tracer_));
  ASSERT_TRUE(p.call(6));
  // ret's probe runs from the start (soft mode), its records are shown once add3 fired.
  EXPECT_EQ(sequence(read_records(*fs_)), "add0 add1 add2 add3 ret3 add4 ret4 add5 ret5");
  EXPECT_EQ(read("events/trg/ret/enable"), "1*\n");
  // The trigger goes: ret was soft-enabled, so it stays enabled.
  ASSERT_EQ(write("events/trg/add/trigger", "!enable_event:trg:ret\n"), 22);
  EXPECT_EQ(read("events/trg/ret/enable"), "1\n");
  ASSERT_TRUE(p.call(1));
  EXPECT_EQ(sequence(read_records(*fs_)), "add0 ret0");
}

// "add0 ret0 ..." of a trace file's text (trace, snapshot): its add and ret lines.
std::string file_sequence(const std::string& text) {
  std::string s;
  size_t at = 0;
  while (at < text.size()) {
    size_t end = text.find('\n', at);
    if (end == std::string::npos) end = text.size();
    const std::string line = text.substr(at, end - at);
    at = end + 1;
    const bool add = line.find(" add: (") != std::string::npos;
    const bool ret = line.find(" ret: (") != std::string::npos;
    if (!add && !ret) continue;
    const size_t v = line.find(add ? " a=" : " rv=");
    if (v == std::string::npos) continue;
    const uint64_t n = std::stoull(line.substr(v + (add ? 3 : 4)), nullptr, 0);
    if (!s.empty()) s += ' ';
    s += (add ? "add" : "ret") + std::to_string(add ? n : n / 3);
  }
  return s;
}

// The snapshot trigger swaps the buffer and its snapshot at the hit that fires it (the
// hit's record on the snapshot's side), and at each hit in turn when several fire.
TEST_F(TriggerRecordsTest, SnapshotSwapsTheBufferAtTheHitThatFiresIt) {
  define(true, false);
  EXPECT_NE(read("snapshot").find("Snapshot is freed"), std::string::npos);
  ASSERT_EQ(write("events/trg/add/trigger", "snapshot:1 if a == 2\n"), 21);
  EXPECT_NE(read("snapshot").find("Snapshot is allocated"), std::string::npos);
  Program p;
  ASSERT_TRUE(p.start(*tracer_));
  ASSERT_TRUE(p.call(4));
  EXPECT_EQ(file_sequence(read("trace")), "add3");
  EXPECT_EQ(file_sequence(read("snapshot")), "add0 add1 add2");
  EXPECT_EQ(read("events/trg/add/trigger"), "snapshot:count=0 if a == 2\n");
  // At every hit: add0 swaps {add3, add0} out, add1 {add0 add1 add2 add1}, add2
  // {add3 add0 add2}.
  ASSERT_EQ(write("events/trg/add/trigger", "!snapshot\n"), 10);
  ASSERT_EQ(write("events/trg/add/trigger", "snapshot\n"), 9);
  ASSERT_TRUE(p.call(3));
  EXPECT_EQ(file_sequence(read("trace")), "add0 add1 add2 add1");
  EXPECT_EQ(file_sequence(read("snapshot")), "add3 add0 add2");
  // A consumer takes what the buffer holds after the swaps, and the snapshot stays.
  EXPECT_EQ(file_sequence(drain("trace_pipe")), "add0 add1 add2 add1");
  EXPECT_EQ(file_sequence(read("trace")), "");
  EXPECT_EQ(file_sequence(read("snapshot")), "add3 add0 add2");
}

TEST_F(TriggerRecordsTest, DisableEventWithACount) {
  define(true, true);
  ASSERT_EQ(write("events/trg/add/trigger", "disable_event:trg:ret:1 if a >= 1\n"), 34);
  EXPECT_EQ(read("events/trg/ret/enable"), "1*\n");
  Program p;
  ASSERT_TRUE(p.start(*tracer_));
  ASSERT_TRUE(p.call(4));
  EXPECT_EQ(sequence(read_records(*fs_)), "add0 ret0 add1 add2 add3");
  EXPECT_EQ(read("events/trg/add/trigger"), "disable_event:trg:ret:count=0 if a >= 1\n");
  EXPECT_EQ(read("events/trg/ret/enable"), "0*\n");
  // Enabled by hand while in soft mode, its records show again.
  ASSERT_EQ(write("events/trg/ret/enable", "1\n"), 2);
  ASSERT_TRUE(p.call(1));
  EXPECT_EQ(sequence(read_records(*fs_)), "add0 ret0");
}

// Triggers act at the hit, in the target, with no reader: tracing_on reads 0 as soon as
// the call that fired traceoff returned, and an event that is not enabled runs its
// triggers (soft mode) without recording.
TEST_F(TriggerRecordsTest, TraceoffActsAtTheHitWithNoReader) {
  define(false, false);
  ASSERT_EQ(write("events/trg/add/trigger", "traceoff if a == 2\n"), 19);
  EXPECT_EQ(read("events/trg/add/enable"), "0*\n");
  Program p;
  ASSERT_TRUE(p.start(*tracer_));
  ASSERT_TRUE(p.call(2));
  EXPECT_EQ(read("tracing_on"), "1\n");
  ASSERT_TRUE(p.call(3));
  EXPECT_EQ(read("tracing_on"), "0\n");
  EXPECT_EQ(sequence(read_records(*fs_)), "");
  // Back on by hand: the trigger fires again at the next a == 2.
  ASSERT_EQ(write("tracing_on", "1\n"), 2);
  ASSERT_TRUE(p.call(2));
  EXPECT_EQ(read("tracing_on"), "1\n");
  ASSERT_TRUE(p.call(3));
  EXPECT_EQ(read("tracing_on"), "0\n");
  ASSERT_EQ(write("tracing_on", "1\n"), 2);
}

TEST_F(TriggerRecordsTest, EnableEventActsAtTheHitWithNoReader) {
  define(false, false);
  ASSERT_EQ(write("events/trg/add/trigger", "enable_event:trg:ret:1 if a == 1\n"), 33);
  EXPECT_EQ(read("events/trg/ret/enable"), "0*\n");
  Program p;
  ASSERT_TRUE(p.start(*tracer_));
  ASSERT_TRUE(p.call(1));
  EXPECT_EQ(read("events/trg/ret/enable"), "0*\n");
  ASSERT_TRUE(p.call(3));
  EXPECT_EQ(read("events/trg/ret/enable"), "1*\n");
  EXPECT_EQ(read("events/trg/add/trigger"), "enable_event:trg:ret:count=0 if a == 1\n");
  // ret records from the hit on: ret1 and ret2 of this call (add itself is soft-disabled).
  EXPECT_EQ(sequence(read_records(*fs_)), "ret1 ret2");
}

// A count is spent exactly, whatever number of threads race for it: stacktrace:50 on an
// event hit by 8 threads at once writes 50 stacks, not one more.
TEST_F(TriggerRecordsTest, CountsStayExactWithManyThreads) {
  define(false, false);
  ASSERT_EQ(write("events/trg/add/trigger", "stacktrace:50\n"), 14);
  Program p;
  ASSERT_TRUE(p.start(*tracer_));
  EXPECT_EQ(p.ask("crowd 8 2000").rfind("ok ", 0), 0u);
  EXPECT_EQ(read("events/trg/add/trigger"), "stacktrace:count=0\n");
  size_t stacks = 0, others = 0;
  fs_->tracer().consume_records(
      [&](const tracee::TraceRecord& r) {
        uint16_t id = 0;
        if (r.len >= 2) memcpy(&id, r.data, 2);
        (id == events::kKernelStackEventId ? stacks : others) += 1;
        return true;
      },
      SIZE_MAX);
  EXPECT_EQ(stacks, 50u);
  EXPECT_EQ(others, 0u);  // the event itself is soft-disabled
}

// A stacktrace trigger on an event that is not enabled takes the stack at the hit and the
// trace shows it, with no event line before it (the kernel's way), whether the readers
// keep every thread or only those set_event_pid lists.
TEST_F(TriggerRecordsTest, AStacktraceTriggerOfASoftDisabledEventIsInTheTrace) {
  define(false, false);
  ASSERT_EQ(write("events/trg/add/trigger", "stacktrace:2\n"), 13);
  EXPECT_EQ(read("events/trg/add/enable"), "0*\n");
  Program p;
  ASSERT_TRUE(p.start(*tracer_));
  auto stacks = [](const std::string& text) {
    size_t n = 0;
    for (size_t at = text.find("<stack trace>"); at != std::string::npos;
         at = text.find("<stack trace>", at + 1))
      ++n;
    return n;
  };
  ASSERT_TRUE(p.call(1));
  const std::string all = read("trace");
  EXPECT_EQ(stacks(all), 1u) << all;
  EXPECT_EQ(all.find(" add: "), std::string::npos) << all;
  const std::string pid = std::to_string(p.pid()) + "\n";
  ASSERT_EQ(write("set_event_pid", pid), static_cast<int64_t>(pid.size()));
  ASSERT_TRUE(p.call(3));
  const std::string kept = read("trace");
  EXPECT_EQ(stacks(kept), 2u) << kept;
  EXPECT_EQ(read("events/trg/add/trigger"), "stacktrace:count=0\n");
}

// A fork child's stacks are its own records, as its parent's are: a child that runs on a
// spare area from its first instruction as much as one set up after it forked.
TEST_F(TriggerRecordsTest, AForkChildsStacksAreInTheTrace) {
  define(true, false);
  ASSERT_EQ(write("events/trg/add/trigger", "stacktrace\n"), 11);
  Program p;
  ASSERT_TRUE(p.start(*tracer_));
  for (int round = 0; round < 3; ++round) {
    const std::string answer = p.ask("fork 2");
    ASSERT_EQ(answer.rfind("ok ", 0), 0u) << answer;
    const pid_t child = static_cast<pid_t>(std::stol(answer.substr(3)));
    // The child has ended; its area is read once the daemon took its HELLO (it ran on a
    // spare area before that), which may come after the answer: the records are taken
    // as they become readable, within a deadline.
    size_t adds = 0, stacks = 0;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while ((adds < 2 || stacks < 2) && std::chrono::steady_clock::now() < deadline) {
      fs_->tracer().consume_records(
          [&](const tracee::TraceRecord& r) {
            uint16_t id = 0;
            if (r.len >= 2) memcpy(&id, r.data, 2);
            if (r.pid != child) return true;
            if (id == events::kKernelStackEventId) ++stacks;
            else if (fs_->events().find(id)) ++adds;
            return true;
          },
          SIZE_MAX);
      if (adds < 2 || stacks < 2) (void)fs_->tracer().wait_for_records(20);
    }
    EXPECT_EQ(adds, 2u) << "round " << round;
    EXPECT_EQ(stacks, 2u) << "round " << round;
  }
}

TEST_F(TriggerRecordsTest, AFilterThatFailsLeavesTheEventUnfiltered) {
  define(true, false);
  Program p;
  ASSERT_TRUE(p.start(*tracer_));
  ASSERT_EQ(write("events/trg/add/filter", "a == 3\n"), 7);
  ASSERT_TRUE(p.call(5));
  EXPECT_EQ(sequence(read_records(*fs_)), "add3");
  EXPECT_EQ(write("events/trg/add/filter", "zzz == 1\n"), -EINVAL);
  ASSERT_TRUE(p.call(3));
  EXPECT_EQ(sequence(read_records(*fs_)), "add0 add1 add2");
}

// A definition is placed in every target at once; a target that exits or execs on the
// way (its link gone before it answered) refuses nothing. Targets here come and go
// without pause: fork children of the program, each calling and exiting at once, while
// the same definition on libc's read comes and goes.
TEST_F(DynamicEventsTest, DefinitionsWhileTargetsComeAndGoAreNeverRefused) {
  Program p;
  ASSERT_TRUE(p.start(*tracer_));
  std::atomic<bool> done{false};
  std::string answer;
  std::thread churn([&] {
    answer = p.ask("forks 400 1", 240000);
    done = true;
  });
  int rounds = 0, refused = 0;
  std::string first_refusal;
  for (; rounds < 400 && !done; ++rounds) {
    const int64_t rc = echo("kprobe_events", "p:churn/rd read fd=%di");
    if (rc != 0 && refused++ == 0) first_refusal = std::to_string(rc) + ": " + read("error_log");
    EXPECT_EQ(echo("kprobe_events", "-:churn/rd"), rc == 0 ? 0 : -ENOENT);
  }
  churn.join();
  EXPECT_EQ(answer, "ok 400");
  EXPECT_GT(rounds, 10);
  EXPECT_EQ(refused, 0) << first_refusal;
}

// fprobe events (`f` lines in dynamic_events): a function's entry and exit, the exit
// with the entry's arguments; dynamic_events lists them, kprobe_events and kprobe_profile
// do not, and their records are a kprobe's and a kretprobe's.
TEST_F(DynamicEventsTest, FprobeEventsOnAFunctionsEntryAndExit) {
  ASSERT_EQ(echo("dynamic_events", "f:fp/add " + kProgName + ":traced_add a=$arg1:s64"), 0);
  ASSERT_EQ(echo("dynamic_events", "f:fp/ret " + kProgName + ":traced_add%return rv=$retval:s64 a=$arg1:s64"), 0);
  EXPECT_EQ(echo("kprobe_events", "f:fp/k " + kProgName + ":traced_add"), -EINVAL);
  EXPECT_EQ(read("dynamic_events"),
            "f:fp/add " + kProgName + ":traced_add a=$arg1:s64\n"
            "f:fp/ret " + kProgName + ":traced_add%return rv=$retval:s64 a=$arg1:s64\n");
  EXPECT_EQ(read("kprobe_events"), "");
  ASSERT_EQ(write("events/fp/enable", "1\n"), 2);
  Program p;
  ASSERT_TRUE(p.start(*tracer_));
  ASSERT_TRUE(p.call(3));
  std::string seq;
  for (const Shown& r : read_records(*fs_)) {
    seq += (seq.empty() ? "" : " ") + r.event + std::to_string(r.fields.at("a"));
    if (r.event == "ret") {
      EXPECT_EQ(r.fields.at("rv"), 3 * r.fields.at("a"));
    }
  }
  EXPECT_EQ(seq, "add0 ret0 add1 ret1 add2 ret2");
  EXPECT_EQ(read("kprobe_profile"), "");
  ASSERT_EQ(write("events/fp/enable", "0\n"), 2);
  EXPECT_EQ(echo("dynamic_events", "-:fp/ret"), 0);
  EXPECT_EQ(read("dynamic_events"), "f:fp/add " + kProgName + ":traced_add a=$arg1:s64\n");
}

// ---- concurrency and the end ----------------------------------------------------------

TEST_F(DynamicEventsTest, WritersAtOnceNeverCorruptTheDefinitions) {
  const std::string b = kProg;
  constexpr int kRounds = 150;
  std::atomic<bool> failed{false};
  auto writer = [&](const std::string& group, const char* file) {
    for (int i = 0; i < kRounds; ++i) {
      std::string ev = group + "/e" + std::to_string(i);
      if (echo(file, "p:" + ev + " " + b + ":0x1370 a=%di") != 0) failed = true;
      // Every third one goes again, through a removal that names it exactly.
      if (i % 3 == 0 && echo(file, "-:" + ev) != 0) failed = true;
    }
  };
  std::atomic<bool> stop{false};
  std::thread reader([&] {
    while (!stop) {
      (void)read("uprobe_events");
      (void)read("available_events");
      (void)read("events/enable");
    }
  });
  std::thread t1(writer, "ta", "uprobe_events");
  std::thread t2(writer, "tb", "dynamic_events");
  t1.join();
  t2.join();
  stop = true;
  reader.join();
  EXPECT_FALSE(failed);
  std::set<std::string> lines, ids;
  std::string back = read("uprobe_events");
  for (size_t s = 0, nl; (nl = back.find('\n', s)) != std::string::npos; s = nl + 1)
    lines.insert(back.substr(s, nl - s));
  std::set<std::string> expected;
  for (const char* g : {"ta", "tb"})
    for (int i = 0; i < kRounds; ++i)
      if (i % 3 != 0) {
        expected.insert(std::string("p:") + g + "/e" + std::to_string(i) + " " + b + ":" +
                        padded(0x1370) + " a=%di");
        ids.insert(read(std::string("events/") + g + "/e" + std::to_string(i) + "/id"));
      }
  EXPECT_EQ(lines, expected);
  EXPECT_EQ(ids.size(), expected.size());  // every event its own id
  EXPECT_EQ(ls("events/ta").size(), 2 + 100u);
}

TEST_F(DynamicEventsTest, ClearAllRemovesEverything) {
  const std::string b = kProg;
  ASSERT_EQ(echo("uprobe_events", "p:g/a " + b + ":0x1370 a=%di"), 0);
  ASSERT_EQ(echo("uprobe_events", "p:g/c " + b + ":0x1380"), 0);
  ASSERT_EQ(echo("kprobe_events", "p:k/b " + kProgName + ":traced_add"), 0);
  ASSERT_EQ(write("events/g/a/enable", "1\n"), 2);
  ASSERT_EQ(write("events/g/a/trigger", "enable_event:g:c\n"), 17);
  fs_->dynamic_events().clear_all();
  EXPECT_EQ(read("dynamic_events"), "");
  EXPECT_EQ(read("available_events"), "");
  EXPECT_EQ(read("set_event"), "");
  EXPECT_EQ(ls("events"),
            (std::vector<std::string>{"enable", "header_page", "header_event", "ftrace"}));
  EXPECT_EQ(fs_->events().find(kFirstEventId), nullptr);
  // The tracer holds no probe any more: a program launched now runs without any.
  ASSERT_EQ(echo("uprobe_events", "p:g/a " + b + ":0x1370"), 0);
  EXPECT_EQ(read("uprobe_events"), "p:g/a " + b + ":" + padded(0x1370) + "\n");
}

// ---- synthetic events ------------------------------------------------------------------

// synthetic_events and `s:` in dynamic_events define the same events: each file reads them
// back in its own form, dynamic_events in definition order among the probes; each gets
// events/synthetic/NAME with the kernel's format; `!NAME`, `-:[synthetic/]NAME` and a
// truncating open remove them, not while enabled.
TEST_F(DynamicEventsTest, SyntheticEventsAreDefinedReadBackAndRemovedAsInTheKernel) {
  const std::string b = kProg;
  ASSERT_EQ(echo("uprobe_events", "p:g/a " + b + ":0x1370"), 0);
  ASSERT_EQ(echo("synthetic_events", "wakeup_latency  u64 lat;pid_t pid"), 0);
  ASSERT_EQ(echo("dynamic_events", "s:synthetic/name_len char[] name; unsigned int len"), 0);
  ASSERT_EQ(echo("uprobe_events", "p:g/c " + b + ":0x1380"), 0);
  EXPECT_EQ(read("synthetic_events"),
            "wakeup_latency\tu64 lat; pid_t pid\nname_len\tchar[] name; unsigned int len\n");
  EXPECT_EQ(read("dynamic_events"),
            "p:g/a " + b + ":" + padded(0x1370) + "\n" +
            "s:synthetic/wakeup_latency\tu64 lat; pid_t pid\n"
            "s:synthetic/name_len\tchar[] name; unsigned int len\n" +
            "p:g/c " + b + ":" + padded(0x1380) + "\n");
  EXPECT_EQ(read("uprobe_events"),
            "p:g/a " + b + ":" + padded(0x1370) + "\np:g/c " + b + ":" + padded(0x1380) + "\n");
  EXPECT_EQ(ls("events/synthetic/wakeup_latency"),
            (std::vector<std::string>{"enable", "filter", "trigger", "hist", "format", "id"}));
  const std::string id = read("events/synthetic/wakeup_latency/id");
  EXPECT_EQ(read("events/synthetic/wakeup_latency/format"),
            "name: wakeup_latency\nID: " + id.substr(0, id.size() - 1) + "\nformat:\n"
            "\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n"
            "\tfield:unsigned char common_flags;\toffset:2;\tsize:1;\tsigned:0;\n"
            "\tfield:unsigned char common_preempt_count;\toffset:3;\tsize:1;\tsigned:0;\n"
            "\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;\n\n"
            "\tfield:u64 lat;\toffset:8;\tsize:8;\tsigned:0;\n"
            "\tfield:pid_t pid;\toffset:16;\tsize:4;\tsigned:1;\n\n"
            "print fmt: \"lat=%llu, pid=%d\", REC->lat, REC->pid\n");
  EXPECT_NE(read("available_events").find("synthetic:wakeup_latency\n"), std::string::npos);
  // Its fields work in a filter and as hist keys; probe fields do not exist on it.
  EXPECT_EQ(write("events/synthetic/wakeup_latency/filter", "lat > 10 && pid != 0\n"), 21);
  EXPECT_EQ(read("events/synthetic/wakeup_latency/filter"), "lat > 10 && pid != 0\n");
  EXPECT_EQ(write("events/synthetic/wakeup_latency/filter", "__probe_ip != 0\n"), -EINVAL);
  EXPECT_EQ(echo("events/synthetic/wakeup_latency/trigger", "hist:keys=pid:vals=lat"), 0);
  EXPECT_EQ(read("events/synthetic/wakeup_latency/trigger"),
            "hist:keys=pid:vals=hitcount,lat:sort=hitcount:size=2048 [active]\n");
  EXPECT_NE(read("events/synthetic/wakeup_latency/hist").find("Hits: 0\n"), std::string::npos);
  EXPECT_EQ(echo("events/synthetic/wakeup_latency/trigger", "!hist:keys=pid:vals=lat"), 0);

  // Errors: a taken name (logged, EEXIST), a probe event in the synthetic group.
  clear_log();
  EXPECT_EQ(echo("synthetic_events", "wakeup_latency u64 x"), -EEXIST);
  EXPECT_EQ(echo("dynamic_events", "  s:wakeup_latency u64 x"), -EEXIST);
  EXPECT_EQ(log(), log_entry("synthetic_events", "Event already exists", "wakeup_latency u64 x", 0) +
                       log_entry("synthetic_events", "Event already exists",
                                 "s:wakeup_latency u64 x", 2));
  clear_log();
  EXPECT_EQ(echo("uprobe_events", "p:synthetic/wakeup_latency " + b + ":0x1370"), -EEXIST);
  EXPECT_EQ(echo("synthetic_events", "lat2 u65 x"), -EINVAL);
  EXPECT_EQ(log(), log_entry("trace_uprobe", "Given group/event name is already used by another event",
                             "p:synthetic/wakeup_latency " + b + ":0x1370", 0) +
                       log_entry("synthetic_events", "Invalid type", "lat2 u65 x", 5));
  // A write stops at its first bad line; the lines before it stay.
  EXPECT_EQ(write("synthetic_events", "ok1 u64 a\nbad u64\nok2 u64 b\n"), -EINVAL);
  EXPECT_NE(read("synthetic_events").find("ok1\tu64 a\n"), std::string::npos);
  EXPECT_EQ(read("synthetic_events").find("ok2"), std::string::npos);

  // Removal: by name in either file; ENOENT for none; EBUSY while enabled.
  EXPECT_EQ(echo("synthetic_events", "!nope"), -ENOENT);
  EXPECT_EQ(echo("synthetic_events", "!ok1"), 0);
  EXPECT_EQ(echo("dynamic_events", "-:nope"), -ENOENT);
  ASSERT_EQ(write("events/synthetic/name_len/enable", "1\n"), 2);
  EXPECT_EQ(echo("dynamic_events", "-:synthetic/name_len"), -EBUSY);
  EXPECT_EQ(echo("synthetic_events", "!name_len"), -EBUSY);
  EXPECT_EQ(open_truncating("synthetic_events"), -EBUSY);
  EXPECT_EQ(open_truncating("dynamic_events"), -EBUSY);
  ASSERT_EQ(write("events/synthetic/name_len/enable", "0\n"), 2);
  EXPECT_EQ(echo("dynamic_events", "-:synthetic/name_len"), 0);
  EXPECT_FALSE(exists("events/synthetic/name_len"));
  EXPECT_EQ(read("synthetic_events"), "wakeup_latency\tu64 lat; pid_t pid\n");
  // Truncating synthetic_events leaves the probes; dynamic_events removes both.
  ASSERT_EQ(open_truncating("synthetic_events"), 0);
  EXPECT_EQ(read("synthetic_events"), "");
  EXPECT_FALSE(exists("events/synthetic"));
  EXPECT_EQ(read("uprobe_events"),
            "p:g/a " + b + ":" + padded(0x1370) + "\np:g/c " + b + ":" + padded(0x1380) + "\n");
  ASSERT_EQ(echo("synthetic_events", "again u64 a"), 0);
  ASSERT_EQ(open_truncating("dynamic_events"), 0);
  EXPECT_EQ(read("dynamic_events"), "");
  EXPECT_EQ(read("synthetic_events"), "");
}

}  // namespace
}  // namespace probefs::fs
