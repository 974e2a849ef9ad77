// The tracefs files as the helper uses them, on a real probefs mount: definitions of the
// bundled program written and read back, refusals with their errno and error_log entry
// (message, command, caret where the kernel puts it), removals, and finding the tracefs
// from --target, TRACEFS_PATH or the current directory. The kernel's read-back and
// error_log forms are checked on directories that hold its text.
#include "tools/tracefs_files.h"

#include <elf.h>
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "tests/fs/mount_fixture.h"

namespace probefs::tools {
namespace {

namespace stdfs = std::filesystem;
using fs::testing::Mount;
using fs::testing::run_command;

// The file offset of function NAME in the ELF file PATH (nm gives its address, the
// PT_LOAD that maps it the offset), or 0.
uint64_t function_file_offset(const std::string& path, const std::string& name) {
  fs::testing::CommandResult nm = run_command({"nm", path});
  std::optional<uint64_t> addr;
  std::istringstream lines(nm.out);
  std::string line;
  while (std::getline(lines, line)) {
    std::istringstream f(line);
    std::string value, type, symbol;
    if (f >> value >> type >> symbol && symbol == name && (type == "T" || type == "t"))
      addr = std::stoull(value, nullptr, 16);
  }
  std::ifstream elf(path, std::ios::binary);
  Elf64_Ehdr eh{};
  if (!addr || !elf.read(reinterpret_cast<char*>(&eh), sizeof eh)) return 0;
  for (unsigned i = 0; i < eh.e_phnum; ++i) {
    Elf64_Phdr ph{};
    elf.seekg(static_cast<std::streamoff>(eh.e_phoff + i * sizeof ph));
    if (!elf.read(reinterpret_cast<char*>(&ph), sizeof ph)) return 0;
    if (ph.p_type == PT_LOAD && *addr >= ph.p_vaddr && *addr < ph.p_vaddr + ph.p_filesz)
      return *addr - ph.p_vaddr + ph.p_offset;
  }
  return 0;
}

std::string hex(uint64_t v, int width = 0) {
  char b[32];
  std::snprintf(b, sizeof b, "0x%0*llx", width, static_cast<unsigned long long>(v));
  return b;
}

const DefinedEvent* find_event(const std::vector<DefinedEvent>& events, const std::string& group,
                               const std::string& event) {
  for (const DefinedEvent& e : events)
    if (e.group == group && e.event == event) return &e;
  return nullptr;
}

// A fresh directory, removed with what it holds.
class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/probefs-tfs-XXXXXX";
    if (mkdtemp(tmpl)) dir_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    if (!dir_.empty()) stdfs::remove_all(dir_, ec);
  }
  const std::string& dir() const { return dir_; }
  void write(const std::string& name, const std::string& text) const {
    std::ofstream(dir_ + "/" + name) << text;
  }

 private:
  std::string dir_;
};

// Sets (or, with nullopt, unsets) an environment variable for a scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const std::optional<std::string>& value) : name_(name) {
    if (const char* old = getenv(name)) old_ = old;
    if (value)
      setenv(name, value->c_str(), 1);
    else
      unsetenv(name);
  }
  ~ScopedEnv() {
    if (old_)
      setenv(name_, old_->c_str(), 1);
    else
      unsetenv(name_);
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

// Goes back to the current directory at the end of the scope, whatever happened in it.
class ScopedCwd {
 public:
  ScopedCwd() : fd_(open(".", O_RDONLY | O_DIRECTORY | O_CLOEXEC)) {}
  ~ScopedCwd() {
    if (fd_ >= 0) {
      EXPECT_EQ(fchdir(fd_), 0);
      close(fd_);
    }
  }
  bool ok() const { return fd_ >= 0; }

 private:
  int fd_;
};

class TracefsFilesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(mount_.ok()) << mount_.daemon_stderr();
    offset_ = function_file_offset(PROBE_PROG_O0, "price_order");
    ASSERT_NE(offset_, 0u) << "no price_order in " << PROBE_PROG_O0;
  }

  // "p:probe_prog/EVENT PROBE_PROG_O0:0xOFFSET ARGS" on price_order.
  std::string definition(const std::string& event, const std::string& args = "") const {
    std::string d = "p:probe_prog/" + event + " " + PROBE_PROG_O0 + ":" + hex(offset_);
    return args.empty() ? d : d + " " + args;
  }

  Mount mount_;
  Tracefs fs_{mount_.dir()};
  uint64_t offset_ = 0;
};

TEST_F(TracefsFilesTest, AddedDefinitionsReadBack) {
  ASSERT_TRUE(fs_.add(definition("price_order", "o=%di discount=%si:s32"), false).ok());
  const std::string ret = "r:probe_prog/price_order__return " + std::string(PROBE_PROG_O0) + ":" +
                          hex(offset_) + " ret=$retval:s64";
  ASSERT_TRUE(fs_.add(ret, false).ok());
  ASSERT_TRUE(fs_.add("p:probe_prog/price_order_k probe_prog_O0:price_order+4 o=%di", true).ok());

  Result<std::vector<DefinedEvent>> events = fs_.events();
  ASSERT_TRUE(events.ok()) << events.error().message;
  ASSERT_EQ(events->size(), 3u);

  const DefinedEvent* entry = find_event(*events, "probe_prog", "price_order");
  ASSERT_NE(entry, nullptr);
  EXPECT_EQ(entry->kind, 'p');
  EXPECT_TRUE(entry->uprobe);
  EXPECT_EQ(entry->location, std::string(PROBE_PROG_O0) + ":" + hex(offset_, 16));
  EXPECT_EQ(entry->path, PROBE_PROG_O0);
  EXPECT_EQ(entry->file_offset, offset_);
  EXPECT_EQ(entry->ref_ctr_offset, 0u);
  EXPECT_EQ(entry->args, "o=%di discount=%si:s32");
  std::string first_line = mount_.read("uprobe_events");
  first_line = first_line.substr(0, first_line.find('\n'));
  EXPECT_EQ(entry->line, first_line);

  const DefinedEvent* exit = find_event(*events, "probe_prog", "price_order__return");
  ASSERT_NE(exit, nullptr);
  EXPECT_EQ(exit->kind, 'r');
  EXPECT_EQ(exit->file_offset, offset_);
  EXPECT_EQ(exit->args, "ret=$retval:s64");

  const DefinedEvent* k = find_event(*events, "probe_prog", "price_order_k");
  ASSERT_NE(k, nullptr);
  EXPECT_FALSE(k->uprobe);
  EXPECT_EQ(k->location, "probe_prog_O0:price_order+4");
  EXPECT_EQ(k->symbol, "probe_prog_O0:price_order");
  EXPECT_EQ(k->symbol_offset, 4u);
  EXPECT_EQ(k->path, "");
  EXPECT_EQ(k->args, "o=%di");
}

// The kernel's errno, message and caret for each (04-error-log of the kernel captures).
TEST_F(TracefsFilesTest, RefusalGivesErrnoAndItsLogEntry) {
  const std::string prog = PROBE_PROG_O0;
  struct Case {
    std::string definition;
    int code;
    std::string message;
    std::string caret_at;  // the command's text from the caret on
  };
  const std::vector<Case> cases = {
      {definition("e1", "a=%foo"), -EINVAL, "Invalid register name", "%foo"},
      {definition("e2", "a=%di:u128"), -EINVAL, "Unknown type is specified", "u128"},
      {definition("e3", "a=$retval"), -EINVAL, "$retval is not available on probe", "$retval"},
      {definition("e4", "a=+0(%si):u8["), -EINVAL, "Array is not closed", ""},
      {"p:probe_prog/e5 /nonexistent/file:0x10", -ENOENT, "Failed to find the given file",
       "/nonexistent/file:0x10"},
      {"p:probe_prog/1ev " + prog + ":0x10", -EINVAL,
       "Event name must follow the same rules as C identifiers", "1ev "},
  };
  const std::regex form(R"(\[ *[0-9]+\.[0-9]{6}\] trace_uprobe: error: [^\n]+)"
                        R"(\n  Command: [^\n]+\n {11,}\^)");
  for (const Case& c : cases) {
    SCOPED_TRACE(c.definition);
    Status st = fs_.add(c.definition, false);
    ASSERT_FALSE(st.ok());
    EXPECT_EQ(st.error().code, c.code);
    EXPECT_TRUE(std::regex_match(st.error().message, form)) << st.error().message;
    std::optional<LogEntry> entry = parse_log_entry(st.error().message);
    ASSERT_TRUE(entry.has_value()) << st.error().message;
    EXPECT_EQ(entry->source, "trace_uprobe");
    EXPECT_EQ(entry->message, c.message);
    EXPECT_EQ(entry->command, c.definition);
    EXPECT_EQ(entry->caret, static_cast<int>(c.caret_at.empty() ? c.definition.size()
                                                                : c.definition.rfind(c.caret_at)));
  }
  Result<std::vector<DefinedEvent>> events = fs_.events();
  ASSERT_TRUE(events.ok());
  EXPECT_TRUE(events->empty());
}

// error_log keeps 8 entries: once it is full, a new one pushes out the oldest and the count
// stays the same, yet each refusal still gets its own entry.
TEST_F(TracefsFilesTest, EachRefusalGetsItsOwnEntryWhenTheLogIsFull) {
  for (int i = 0; i < 12; ++i) {
    const std::string bad = definition("bad" + std::to_string(i), "a=%foo");
    Status st = fs_.add(bad, false);
    ASSERT_FALSE(st.ok());
    std::optional<LogEntry> entry = parse_log_entry(st.error().message);
    ASSERT_TRUE(entry.has_value()) << i << ": " << st.error().message;
    EXPECT_EQ(entry->command, bad);
  }
}

TEST_F(TracefsFilesTest, RefusalThatLogsNothingGivesStrerror) {
  const std::string log = mount_.read("error_log");
  Status st = fs_.add("x:probe_prog/e " + std::string(PROBE_PROG_O0) + ":0x10", false);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().code, -EINVAL);
  EXPECT_EQ(st.error().message, "Failed to write event: Invalid argument");
  EXPECT_FALSE(parse_log_entry(st.error().message).has_value());
  EXPECT_EQ(mount_.read("error_log"), log);
}

TEST_F(TracefsFilesTest, DuplicateGivesEexist) {
  ASSERT_TRUE(fs_.add(definition("price_order"), false).ok());
  Status st = fs_.add(definition("price_order"), false);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().code, -EEXIST);
  std::optional<LogEntry> entry = parse_log_entry(st.error().message);
  ASSERT_TRUE(entry.has_value()) << st.error().message;
  EXPECT_EQ(entry->message, "There is already the exact same probe event");
  EXPECT_EQ(entry->command, definition("price_order"));
  EXPECT_EQ(entry->caret, 0);
}

TEST_F(TracefsFilesTest, RemovesEventsAndPassesOnTheErrno) {
  ASSERT_TRUE(fs_.add(definition("price_order", "o=%di"), false).ok());
  ASSERT_TRUE(fs_.add("p:probe_prog/price_order_k probe_prog_O0:price_order", true).ok());
  Result<std::vector<DefinedEvent>> events = fs_.events();
  ASSERT_TRUE(events.ok());
  ASSERT_EQ(events->size(), 2u);
  const DefinedEvent uprobe = *find_event(*events, "probe_prog", "price_order");
  const DefinedEvent kprobe = *find_event(*events, "probe_prog", "price_order_k");

  ASSERT_EQ(mount_.write("events/probe_prog/price_order/enable", "1"), 0);
  Status busy = fs_.remove(uprobe);
  ASSERT_FALSE(busy.ok());
  EXPECT_EQ(busy.error().code, -EBUSY);
  EXPECT_EQ(busy.error().message, "Failed to delete event: Device or resource busy");
  ASSERT_EQ(mount_.write("events/probe_prog/price_order/enable", "0"), 0);

  EXPECT_TRUE(fs_.remove(uprobe).ok());
  EXPECT_TRUE(fs_.remove(kprobe).ok());
  events = fs_.events();
  ASSERT_TRUE(events.ok());
  EXPECT_TRUE(events->empty());
  EXPECT_EQ(mount_.read("uprobe_events"), "");
  EXPECT_EQ(mount_.read("kprobe_events"), "");

  Status missing = fs_.remove(uprobe);
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.error().code, -ENOENT);
  EXPECT_EQ(missing.error().message, "Failed to delete event: No such file or directory");
}

TEST_F(TracefsFilesTest, ReadmeIsTheMountsReadme) {
  const std::string readme = fs_.readme();
  EXPECT_EQ(readme, mount_.read("README"));
  EXPECT_NE(readme.find("uprobe_events"), std::string::npos);
}

TEST_F(TracefsFilesTest, FindsTheMountGivenAsTarget) {
  const std::string mount = stdfs::canonical(mount_.dir()).string();
  ScopedEnv env("TRACEFS_PATH", "/nonexistent");  // --target comes first
  Result<std::string> found = find_tracefs(mount_.dir());
  ASSERT_TRUE(found.ok()) << found.error().message;
  EXPECT_EQ(*found, mount);
  found = find_tracefs(mount_.dir() + "/");
  ASSERT_TRUE(found.ok()) << found.error().message;
  EXPECT_EQ(*found, mount);

  // Inside the mount, a directory that holds neither file is no tracefs.
  Result<std::string> events_dir = find_tracefs(mount_.path("events"));
  ASSERT_FALSE(events_dir.ok());
  EXPECT_EQ(events_dir.error().code, -ENOENT);
}

TEST_F(TracefsFilesTest, TakesTracefsPathAsItIs) {
  {
    ScopedEnv env("TRACEFS_PATH", mount_.dir());
    Result<std::string> found = find_tracefs("");
    ASSERT_TRUE(found.ok()) << found.error().message;
    EXPECT_EQ(*found, mount_.dir());
  }
  ScopedEnv env("TRACEFS_PATH", "relative/not/checked");
  Result<std::string> found = find_tracefs("");
  ASSERT_TRUE(found.ok()) << found.error().message;
  EXPECT_EQ(*found, "relative/not/checked");
}

TEST_F(TracefsFilesTest, FindsTheCurrentDirectoryWhenItIsATracefs) {
  ScopedEnv env("TRACEFS_PATH", std::nullopt);
  TempDir plain;
  ASSERT_FALSE(plain.dir().empty());
  ScopedCwd back;
  ASSERT_TRUE(back.ok());

  ASSERT_EQ(chdir(mount_.dir().c_str()), 0);
  Result<std::string> found = find_tracefs("");
  ASSERT_TRUE(found.ok()) << found.error().message;
  EXPECT_EQ(*found, stdfs::canonical(mount_.dir()).string());
  EXPECT_TRUE(Tracefs(*found).events().ok());

  ASSERT_EQ(chdir(plain.dir().c_str()), 0);
  found = find_tracefs("");
  ASSERT_FALSE(found.ok());
  EXPECT_EQ(found.error().code, -ENOENT);
  EXPECT_EQ(found.error().message, "No tracefs given: use --target MOUNTPOINT or TRACEFS_PATH");

  ScopedEnv empty("TRACEFS_PATH", "");  // as good as unset
  EXPECT_FALSE(find_tracefs("").ok());
}

// ---- directories that are no mount -----------------------------------------------------

TEST(TracefsFilesDirTest, TargetNeedsUprobeEventsAndReadme) {
  TempDir dir;
  ASSERT_FALSE(dir.dir().empty());
  Result<std::string> found = find_tracefs(dir.dir());
  ASSERT_FALSE(found.ok());
  EXPECT_EQ(found.error().code, -ENOENT);
  EXPECT_NE(found.error().message.find("not a tracefs"), std::string::npos)
      << found.error().message;

  dir.write("uprobe_events", "");
  EXPECT_FALSE(find_tracefs(dir.dir()).ok());
  dir.write("README", "tracing mini-HOWTO:\n");
  found = find_tracefs(dir.dir());
  ASSERT_TRUE(found.ok()) << found.error().message;
  EXPECT_EQ(*found, stdfs::canonical(dir.dir()).string());

  Result<std::string> missing = find_tracefs(dir.dir() + "/nonexistent");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.error().code, -ENOENT);
  EXPECT_NE(missing.error().message.find("No such file or directory"), std::string::npos);
}

// The kernel's read-back (02b-readback-normalization of the kernel captures; kprobe lines
// as trace_kprobe prints them), and lines of no event form, which are skipped.
TEST(TracefsFilesDirTest, ParsesTheKernelsReadBack) {
  TempDir dir;
  ASSERT_FALSE(dir.dir().empty());
  dir.write("uprobe_events",
            "p:uprobes/ref_char /opt/t/probetest:0x00000000000013b0 c=%di:char h=%si:s16\n"
            "r:uprobes/p_probetest_0x13c0 /opt/t/probetest:0x00000000000013c0\n"
            "p:sdt_app/mark /opt/t/app:0x0000000000001370(0x4038) arg1=%di\n"
            "p:grp1/colon /opt/a:b/prog:0x0000000000001370\n"
            "# not an event\n"
            "garbage\n"
            "\n");
  dir.write("kprobe_events",
            "p:kprobes/open do_sys_open dfd=%di\n"
            "r10:kprobes/ret ext4:ext4_sync_file+16 $retval\n");
  Result<std::vector<DefinedEvent>> events = Tracefs(dir.dir()).events();
  ASSERT_TRUE(events.ok()) << events.error().message;
  ASSERT_EQ(events->size(), 6u);

  const DefinedEvent& ch = (*events)[0];
  EXPECT_EQ(ch.kind, 'p');
  EXPECT_EQ(ch.group, "uprobes");
  EXPECT_EQ(ch.event, "ref_char");
  EXPECT_EQ(ch.path, "/opt/t/probetest");
  EXPECT_EQ(ch.file_offset, 0x13b0u);
  EXPECT_EQ(ch.args, "c=%di:char h=%si:s16");
  EXPECT_EQ(ch.line, "p:uprobes/ref_char /opt/t/probetest:0x00000000000013b0 c=%di:char h=%si:s16");

  const DefinedEvent& ret = (*events)[1];
  EXPECT_EQ(ret.kind, 'r');
  EXPECT_EQ(ret.event, "p_probetest_0x13c0");
  EXPECT_EQ(ret.file_offset, 0x13c0u);
  EXPECT_EQ(ret.args, "");

  const DefinedEvent& sdt = (*events)[2];
  EXPECT_EQ(sdt.location, "/opt/t/app:0x0000000000001370(0x4038)");
  EXPECT_EQ(sdt.path, "/opt/t/app");
  EXPECT_EQ(sdt.file_offset, 0x1370u);
  EXPECT_EQ(sdt.ref_ctr_offset, 0x4038u);

  EXPECT_EQ((*events)[3].path, "/opt/a:b/prog");
  EXPECT_EQ((*events)[3].file_offset, 0x1370u);

  const DefinedEvent& open_ev = (*events)[4];
  EXPECT_FALSE(open_ev.uprobe);
  EXPECT_EQ(open_ev.symbol, "do_sys_open");
  EXPECT_EQ(open_ev.symbol_offset, 0u);
  EXPECT_EQ(open_ev.args, "dfd=%di");

  const DefinedEvent& kret = (*events)[5];
  EXPECT_EQ(kret.kind, 'r');
  EXPECT_EQ(kret.group, "kprobes");
  EXPECT_EQ(kret.event, "ret");
  EXPECT_EQ(kret.symbol, "ext4:ext4_sync_file");
  EXPECT_EQ(kret.symbol_offset, 16u);
  EXPECT_EQ(kret.args, "$retval");
}

TEST(TracefsFilesDirTest, MissingFilesAreEmptyOtherFailuresAreErrors) {
  TempDir dir;
  ASSERT_FALSE(dir.dir().empty());
  Tracefs fs(dir.dir());
  Result<std::vector<DefinedEvent>> events = fs.events();
  ASSERT_TRUE(events.ok()) << events.error().message;
  EXPECT_TRUE(events->empty());
  EXPECT_EQ(fs.readme(), "");

  Status add = fs.add("p:g/e /bin/true:0x10", false);
  ASSERT_FALSE(add.ok());
  EXPECT_EQ(add.error().code, -ENOENT);
  EXPECT_EQ(add.error().message, "Failed to open uprobe_events: No such file or directory");

  ASSERT_TRUE(stdfs::create_directory(dir.dir() + "/kprobe_events"));
  events = fs.events();
  ASSERT_FALSE(events.ok());
  EXPECT_EQ(events.error().code, -EISDIR);
  EXPECT_EQ(events.error().message, "Failed to open kprobe_events: Is a directory");
}

// The entry as the kernel writes it (04-error-log of the kernel captures), and texts that
// are not one.
TEST(TracefsFilesLogTest, ParsesTheKernelsEntry) {
  const std::string kernel =
      "[  562.864839] trace_uprobe: error: Invalid register name\n"
      "  Command: p:uprobes/e7 /opt/t/probetest:0x1370 a=%foo\n"
      "                                                  ^\n";
  std::optional<LogEntry> entry = parse_log_entry(kernel);
  ASSERT_TRUE(entry.has_value());
  EXPECT_EQ(entry->source, "trace_uprobe");
  EXPECT_EQ(entry->message, "Invalid register name");
  EXPECT_EQ(entry->command, "p:uprobes/e7 /opt/t/probetest:0x1370 a=%foo");
  EXPECT_EQ(entry->caret, 39);
  EXPECT_EQ(entry->command.substr(39), "%foo");

  // Without the timestamp or the last newline.
  entry = parse_log_entry(kernel.substr(15, kernel.size() - 16));
  ASSERT_TRUE(entry.has_value());
  EXPECT_EQ(entry->caret, 39);

  entry = parse_log_entry(
      "[   10.000001] event filter parse error: error: Unbalanced parens\n"
      "  Command: (a == 1\n"
      "           ^\n");
  ASSERT_TRUE(entry.has_value());
  EXPECT_EQ(entry->source, "event filter parse error");
  EXPECT_EQ(entry->caret, 0);

  EXPECT_FALSE(parse_log_entry("Failed to write event: Invalid argument").has_value());
  EXPECT_FALSE(parse_log_entry("").has_value());
  EXPECT_FALSE(parse_log_entry(kernel + kernel).has_value());  // two entries
  EXPECT_FALSE(parse_log_entry("trace_uprobe: error: x\n  Command: c\n  ^\n").has_value());
  EXPECT_FALSE(parse_log_entry("trace_uprobe: error: x\n  Command: c\n           ^ x\n").has_value());
  EXPECT_FALSE(parse_log_entry("trace_uprobe: error: x\n  Cmd: c\n           ^\n").has_value());
  EXPECT_FALSE(parse_log_entry("[ 1.0 trace_uprobe: error: x\n  Command: c\n           ^\n")
                   .has_value());
}

}  // namespace
}  // namespace probefs::tools
