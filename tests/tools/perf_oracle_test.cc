// probefs-probe against perf probe itself (Debian's linux-perf): for the same spec on the
// same binary, the dry run writes the same definitions ("Writing event: ..." of -v -n) and
// fails with the same error. Both run against a probefs mount (perf through TRACEFS_PATH,
// with a scratch HOME), so neither can reach the kernel's tracefs. Where probefs-probe
// writes something else on purpose, the case says what and why (README, "probefs-probe").
#include <gtest/gtest.h>
#include <fcntl.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "tests/fs/mount_fixture.h"

namespace {

using probefs::fs::testing::CommandResult;
using probefs::fs::testing::Mount;
using probefs::fs::testing::run_command;

struct Case {
  const char* bin;   // "O0", "O2" or "lib"
  const char* spec;  // one probe definition, split at spaces like a shell would not
};

std::string binary(const std::string& which) {
  if (which == "O0") return PROBE_PROG_O0;
  if (which == "O2") return PROBE_PROG_O2;
  if (which == "shopO0") return PROBE_SHOP_O0;
  if (which == "shopO2") return PROBE_SHOP_O2;
  if (which == "lib") return PROBE_LIB;
  return which;  // a path: an object of the system
}

// The lines of TEXT that start with PREFIX (after leading blanks).
std::vector<std::string> lines_with(const std::string& text, const std::string& prefix) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);) {
    size_t start = l.find_first_not_of(' ');
    if (start != std::string::npos && l.compare(start, prefix.size(), prefix) == 0)
      out.push_back(l.substr(start));
  }
  return out;
}

class PerfOracle : public ::testing::TestWithParam<Case> {
 protected:
  static void SetUpTestSuite() {
    if (access("/usr/bin/perf", X_OK) != 0) return;
    mount_ = new Mount();
    std::string tmpl = (std::filesystem::temp_directory_path() / "probefs-perf-XXXXXX").string();
    home_ = mkdtemp(tmpl.data()) ? tmpl : "";
  }
  static void TearDownTestSuite() {
    delete mount_;
    mount_ = nullptr;
    if (!home_.empty()) std::filesystem::remove_all(home_);
  }
  void SetUp() override {
    if (!mount_) GTEST_SKIP() << "no /usr/bin/perf (linux-perf)";
    ASSERT_TRUE(mount_->ok());
    ASSERT_FALSE(home_.empty());
  }

  // perf probe ARGS against the mount only.
  CommandResult perf(const std::vector<std::string>& args) {
    std::vector<std::string> argv = {"env", "-u", "DEBUGINFOD_URLS",
                                     "TRACEFS_PATH=" + mount_->dir(), "HOME=" + home_,
                                     "/usr/bin/perf", "probe"};
    argv.insert(argv.end(), args.begin(), args.end());
    return run_command(argv, 60000);
  }
  CommandResult ours(const std::vector<std::string>& args) {
    std::vector<std::string> argv = {PROBEFS_PROBE_BIN, "--target", mount_->dir()};
    argv.insert(argv.end(), args.begin(), args.end());
    return run_command(argv, 60000);
  }

  std::string mounted_events() { return mount_->read("uprobe_events"); }

  static Mount* mount_;
  static std::string home_;
};
Mount* PerfOracle::mount_ = nullptr;
std::string PerfOracle::home_;

// The dry run's definitions and its error line are perf's.
TEST_P(PerfOracle, SameDefinitions) {
  const Case& c = GetParam();
  std::vector<std::string> args = {"-v", "-n", "-x", binary(c.bin), c.spec};
  CommandResult theirs = perf(args), mine = ours(args);
  ASSERT_GE(theirs.status, 0) << "perf did not end";
  ASSERT_GE(mine.status, 0) << "probefs-probe did not end";
  EXPECT_EQ(lines_with(mine.err, "Writing event: "), lines_with(theirs.err, "Writing event: "))
      << "perf:\n" << theirs.err << "\nprobefs-probe:\n" << mine.err;
  EXPECT_EQ(lines_with(mine.err, "Error: "), lines_with(theirs.err, "Error: "))
      << "perf:\n" << theirs.err << "\nprobefs-probe:\n" << mine.err;
  EXPECT_EQ(mine.exit_code() == 0, theirs.exit_code() == 0);
  EXPECT_EQ(mounted_events(), "") << "a dry run wrote a definition";
}

// -D prints perf's definitions on stdout, writes nothing, and ends as perf ends: the -D
// path differs from -n's in how it answers, so a case of each kind is enough.
class PerfOracleShown : public PerfOracle {};
TEST_P(PerfOracleShown, SameDefinitionsShown) {
  const Case& c = GetParam();
  std::vector<std::string> args = {"-x", binary(c.bin), "-D", c.spec};
  CommandResult theirs = perf(args), mine = ours(args);
  ASSERT_GE(theirs.status, 0) << "perf did not end";
  EXPECT_EQ(mine.out, theirs.out) << "perf:\n" << theirs.err << "\nprobefs-probe:\n" << mine.err;
  EXPECT_EQ(lines_with(mine.err, "Error: "), lines_with(theirs.err, "Error: "));
  EXPECT_EQ(mine.exit_code(), theirs.exit_code());
  EXPECT_EQ(mounted_events(), "") << "-D wrote a definition";
}

// -F lists perf's names (functions, objects, labels, PLT entries; C++ demangled), through
// perf's filters, and refuses a filter perf refuses at the same position.
class PerfOracleFuncs : public PerfOracle {};
TEST_P(PerfOracleFuncs, SameFunctionList) {
  const Case& c = GetParam();
  std::vector<std::string> args = {"-x", binary(c.bin)};
  std::istringstream words(c.spec);
  // @TESTS@: the tests/ folder of the source tree (-s finds probe_prog.c under it).
  const std::string src = PROBE_PROG_SOURCE;
  const std::string tests = src.substr(0, src.rfind('/', src.rfind('/') - 1));
  for (std::string w; std::getline(words, w, '\t');)
    args.push_back(w == "@TESTS@" ? tests : w);
  CommandResult theirs = perf(args), mine = ours(args);
  ASSERT_GE(theirs.status, 0) << "perf did not end";
  EXPECT_EQ(mine.out, theirs.out) << "perf stderr:\n" << theirs.err << "\nours:\n" << mine.err;
  EXPECT_EQ(lines_with(mine.err, "Filter parse error"), lines_with(theirs.err, "Filter parse error"));
  EXPECT_EQ(lines_with(mine.err, "Source: "), lines_with(theirs.err, "Source: "));
  EXPECT_EQ(mine.exit_code(), theirs.exit_code());
}

// -L of a function and of a file range is perf's, line for line.
class PerfOracleLines : public PerfOracle {};
TEST_P(PerfOracleLines, SameLineListing) {
  const Case& c = GetParam();
  std::vector<std::string> args = {"-x", binary(c.bin), "-L", c.spec};
  CommandResult theirs = perf(args), mine = ours(args);
  EXPECT_EQ(mine.out, theirs.out) << "perf stderr:\n" << theirs.err << "\nours:\n" << mine.err;
  EXPECT_EQ(mine.exit_code() == 0, theirs.exit_code() == 0);
}

// Where probefs-probe writes something else on purpose (README, "probefs-probe"): a global
// as the kernel's uprobe syntax reads it (perf's "@SYM+0" is refused by uprobe_events), and
// DWARF 5 bitfields, which perf 6.1 cannot read.
class PerfDifferences : public PerfOracle {};
TEST_F(PerfDifferences, GlobalsAndBitfields) {
  std::vector<std::string> args = {"-v", "-n", "-x", PROBE_PROG_O2, "price_order orders_seen"};
  CommandResult theirs = perf(args), mine = ours(args);
  EXPECT_NE(theirs.err.find(" orders_seen=@orders_seen+0:s64"), std::string::npos) << theirs.err;
  std::vector<std::string> w = lines_with(mine.err, "Writing event: ");
  ASSERT_EQ(w.size(), 1u) << mine.err;
  EXPECT_NE(w[0].find(" orders_seen=@+0x"), std::string::npos) << w[0];

  args = {"-v", "-n", "-x", PROBE_PROG_O2, "price_order o->priority o->rush o->weight"};
  theirs = perf(args);
  mine = ours(args);
  EXPECT_NE(theirs.err.find("Failed to get the offset of priority."), std::string::npos)
      << theirs.err;
  w = lines_with(mine.err, "Writing event: ");
  ASSERT_EQ(w.size(), 1u) << mine.err;
  EXPECT_NE(w[0].find(" priority=+20(%di):b3@0/32 rush=+20(%di):b1@3/32 weight=+20(%di):b9@4/32"),
            std::string::npos)
      << w[0];
}

// The blocks of perf probe's --cache --list: each binary's "PATH (BUILDID):" line with the
// lines that follow it, up to the next such line.
std::map<std::string, std::string> cache_blocks(const std::string& text) {
  std::map<std::string, std::string> blocks;
  std::istringstream in(text);
  std::string head;
  for (std::string l; std::getline(in, l);) {
    if (!l.empty() && l.back() == ':' && l.find(" (") != std::string::npos) head = l;
    blocks[head] += l + "\n";
  }
  return blocks;
}

// perf's own USDT flow on a mount: perf buildid-cache scans a binary's SDT notes into
// perf's cache (under the scratch HOME), and perf probe defines sdt_PROVIDER:NAME from it
// through TRACEFS_PATH; the event counts in the point's semaphore, so the code the
// semaphore guards runs and the event fires. probefs-probe --cache --list -x BIN shows
// what perf's cache shows for that binary, read from the binary itself, and with -v the
// definitions perf's cache file keeps.
class PerfSdt : public PerfOracle {
 protected:
  CommandResult perf_tool(const std::vector<std::string>& args) {
    std::vector<std::string> argv = {"env", "-u", "DEBUGINFOD_URLS",
                                     "TRACEFS_PATH=" + mount_->dir(), "HOME=" + home_,
                                     "/usr/bin/perf"};
    argv.insert(argv.end(), args.begin(), args.end());
    return run_command(argv, 60000);
  }
  void TearDown() override {
    if (!mount_) return;
    EXPECT_EQ(mount_->write("events/enable", "0\n"), 0);
    EXPECT_EQ(mount_->write("uprobe_events", "\n", O_WRONLY | O_TRUNC), 0);
  }
};

TEST_F(PerfSdt, BuildidCacheThenPerfProbeOfAnSdtPoint) {
  const std::string python = "/usr/bin/python3.11";
  std::vector<std::string> bins = {SDT_PROG};
  if (access(python.c_str(), R_OK) == 0) bins.push_back(python);
  for (const std::string& bin : bins) {
    CommandResult added = perf_tool({"buildid-cache", "--add", bin});
    ASSERT_EQ(added.exit_code(), 0) << added.err;
  }
  const std::map<std::string, std::string> theirs = cache_blocks(perf({"--cache", "--list"}).out);
  for (const std::string& bin : bins) {
    CommandResult mine = ours({"--cache", "--list", "-x", bin});
    ASSERT_EQ(mine.exit_code(), 0) << mine.err;
    const std::string head = mine.out.substr(0, mine.out.find('\n'));
    ASSERT_TRUE(theirs.count(head)) << "perf's cache has no " << head;
    EXPECT_EQ(mine.out, theirs.at(head));
    // The cache file of that binary: "%sdt_P:N=N" and the definition, for each point.
    const std::string id = head.substr(head.rfind('(') + 1, head.size() - head.rfind('(') - 3);
    std::ifstream file(home_ + "/.debug" + bin + "/" + id + "/probes");
    std::stringstream cached;
    cached << file.rdbuf();
    std::string shown = ours({"--cache", "--list", "-v", "-x", bin}).out;
    shown = shown.substr(shown.find('\n') + 1);
    for (size_t at = 0; (at = shown.find("sdt_", at)) != std::string::npos;
         at = shown.find('\n', at))
      if (at == 0 || shown[at - 1] == '\n') shown.insert(at, "%"), ++at;
    EXPECT_EQ(shown, cached.str()) << bin;
  }

  // perf probe from its cache, on the mount; the program's guarded code runs while the
  // event is enabled, and each hit fetches the note's argument.
  CommandResult defined = perf({"-x", SDT_PROG, "sdt_sdtprog:tick"});
  ASSERT_EQ(defined.exit_code(), 0) << defined.err;
  const std::string defs = mount_->read("uprobe_events");
  EXPECT_NE(defs.find("p:sdt_sdtprog/tick " + std::string(SDT_PROG) + ":0x"), std::string::npos)
      << defs;
  ASSERT_EQ(mount_->write("trace", "\n", O_WRONLY | O_TRUNC), 0);
  ASSERT_EQ(mount_->write("events/sdt_sdtprog/tick/enable", "1\n"), 0);
  CommandResult r = run_command({PROBEFS_BIN, "exec", mount_->dir(), "--", SDT_PROG}, 60000,
                                "sem\ntick 4\nquit\n");
  EXPECT_EQ(r.exit_code(), 0) << r.err;
  EXPECT_EQ(r.out, "ready\nok 1\nok 4\n");  // the semaphore held, the guarded code run
  const std::vector<std::string> ticks = lines_with(mount_->read("trace"), "sdt_prog-");
  ASSERT_EQ(ticks.size(), 4u) << mount_->read("trace");
  for (size_t i = 0; i < ticks.size(); ++i)
    EXPECT_NE(ticks[i].find(" tick: (0x"), std::string::npos) << ticks[i];
  for (size_t i = 0; i < ticks.size(); ++i)
    EXPECT_EQ(ticks[i].substr(ticks[i].rfind(' ') + 1), "arg1=" + std::to_string(i));
  ASSERT_EQ(mount_->write("events/sdt_sdtprog/tick/enable", "0\n"), 0);
  CommandResult removed = perf({"-d", "sdt_sdtprog:tick"});
  EXPECT_EQ(removed.exit_code(), 0) << removed.err;
  EXPECT_EQ(mount_->read("uprobe_events"), "");
}

// Cases where both tools can express the spec.
const Case kCases[] = {
    // Places.
    {"O0", "price_order"}, {"O2", "price_order"},
    {"O0", "price_order+4"}, {"O2", "price_order+4"},
    {"O0", "price_order%return $retval"}, {"O2", "price_order%return $retval"},
    {"O0", "price_order:4"}, {"O2", "price_order:6"},
    {"O0", "price_order;orders_seen*"}, {"O2", "price_order;orders_seen*"},
    {"O0", "probe_prog.c:40"}, {"O2", "probe_prog.c:40"},
    {"O0", "probe_prog.c;*printf*"}, {"O2", "probe_prog.c;*printf*"},
    {"O0", "main;*clamp*"}, {"O2", "main;*clamp*"},
    {"O0", "clamp"}, {"O2", "clamp"}, {"O0", "clamp:2"},
    {"O0", "scale"}, {"O2", "scale"},
    {"O0", "price_order@probe_prog.c"}, {"O2", "main:10"}, {"O0", "price*"},
    {"lib", "lib_checksum"}, {"lib", "lib_checksum%return $retval"},
    // Arguments.
    {"O0", "price_order o->id discount coupon:string q=o->qty[2] o->ship.zone "
           "o->bill->postcode o->item:string o->note:string"},
    {"O2", "price_order o->id discount coupon:string q=o->qty[2] o->ship.zone "
           "o->bill->postcode o->item:string o->note:string"},
    {"O0", "price_order $params"}, {"O2", "price_order $params"},
    {"O0", "price_order $vars"}, {"O2", "price_order $vars"},
    {"O0", "price_order discount:x32 coupon:u64 d=discount"},
    {"O2", "price_order discount:x32 coupon:u64 d=discount"},
    {"O0", "price_order:4 subtotal i"}, {"O0", "clamp v lo hi"},
    {"O0", "scale v by"}, {"O2", "scale v by"},
    {"O0", "price_order %di +0(%si):u8 $arg1"}, {"O2", "price_order %di +0(%si):u8 $arg1"},
    {"O0", "main;*price_order(&o* round k"},
    {"lib", "lib_checksum s:string n"}, {"lib", "lib_checksum:2 sum i"},
    // Errors.
    {"O0", "nosuch"}, {"O2", "price_order nosuchvar"}, {"O0", "price_order o->nosuch"},
    {"O0", "price_order:3"}, {"O2", "price_order:4"}, {"O0", "clamp%return"},
    {"O0", "price_order:200"}, {"O0", "price_order%return discount"},
    {"O2", "clamp v"}, {"O0", "probe_prog.c:2"}, {"O0", "price_order discount->x"},
    {"O0", "price_order o.id"},
};

const Case kLineCases[] = {
    {"O0", "price_order"}, {"O2", "price_order"}, {"O0", "price_order:2-5"},
    {"O2", "price_order:2-5"}, {"O0", "probe_prog.c:36-40"}, {"O2", "probe_prog.c:36-40"},
    {"O0", "clamp"}, {"O2", "clamp"}, {"O0", "scale"}, {"O2", "scale"}, {"O2", "main:3+4"},
    {"O0", "main"}, {"lib", "lib_checksum"}, {"O0", "nosuch"},
};

const Case kShownCases[] = {
    {"O0", "price_order"}, {"O2", "price_order%return $retval"}, {"O2", "price_order:6"},
    {"O0", "probe_prog.c:40"}, {"O2", "main;*clamp*"}, {"O2", "clamp"},
    {"O0", "price_order o->id discount coupon:string q=o->qty[2] o->item:string"},
    {"O2", "price_order $params"}, {"lib", "lib_checksum s:string n"},
    {"O0", "nosuch"}, {"O2", "price_order nosuchvar"}, {"O0", "price_order%return discount"},
    {"O0", "price_order o.id"},
};

// -F and -V with their filters; the words of a command line are separated by \t.
const Case kFuncCases[] = {
    {"O0", "-F"}, {"O2", "-F"}, {"lib", "-F"}, {"shopO0", "-F"}, {"shopO2", "-F"},
    {"O0", "-F\t*"}, {"O2", "-F\t*@plt"}, {"lib", "-F\t*"}, {"shopO0", "-F\t*"},
    {"shopO2", "-F\t*"}, {"shopO0", "-F\tshop::*"}, {"shopO2", "-F\t*Pricer*"},
    {"shopO0", "--no-demangle\t-F\t*"}, {"shopO0", "-F\t!(*std* | *gnu*) & *::*"},
    {"shopO0", "--filter\t*twice*\t-F\t*Pricer*"},
    {"shopO0", "--filter\t*twice*\t-F"},  // a bare -F adds the default: ORed
    {"shopO0", "-v\t-F\t*"}, {"shopO2", "-v\t-F\tshop::*"},  // -v: with parameters
    {"/lib/x86_64-linux-gnu/libc.so.6", "-F\t*"},  // symbols of its debug file
    {"/lib/x86_64-linux-gnu/libstdc++.so.6", "-F\t*"},
    {"O0", "-F\t&&"}, {"O0", "-F\tmain &"}, {"O0", "-F\t(main"}, {"O0", "-F\tmain)"},
    {"O0", "-F\t()"}, {"O0", "-F\tma(in"}, {"O0", "-F\t!"}, {"O0", "-F\t"},
    {"O0", "--filter\ta | | b\t-F"},
    {"O0", "-V\tprice_order"}, {"O0", "-V\tprice_order\t--filter\td*"},
    {"O0", "-V\tprice_order\t--externs\t--filter\t!o* & !*_*"},
    {"O2", "--filter\tx* | s*\t-V\tprice_order:4"},
    // --range: where each variable is valid ([VAL], [INV] for one valid later, [EXT]).
    {"O0", "--range\t-V\tprice_order"}, {"O0", "--range\t-V\tprice_order:4"},
    {"O0", "--range\t--externs\t-V\tmain"}, {"O2", "--range\t-V\tmain"},
    {"O2", "--range\t-V\tclamp"}, {"O0", "--range\t-V\tscale"},
    {"O0", "--range\t--filter\t*int*\t-V\tprice_order"},
    {"shopO0", "--range\t-V\tmain"},
    // --no-inlines: a function with an abstract definition is not searched at all.
    {"O0", "--no-inlines\t-D\tprice_order"}, {"O0", "--no-inlines\t-D\tclamp"},
    {"O2", "--no-inlines\t-D\tclamp"}, {"O2", "--no-inlines\t-D\tscale"},
    {"O2", "--no-inlines\t-D\tmain;*clamp*"}, {"O2", "-D\tclamp"},
    // -s: sources read under another directory (the DWARF's path, then its tail).
    {"O0", "-s\t@TESTS@\t-L\tprice_order:1-4"}, {"O2", "-s\t@TESTS@\t-L\tprobe_prog.c:36-40"},
    {"O0", "-s\t@TESTS@\t-D\tprice_order;subtotal*"}, {"O0", "-s\t/nonexistent\t-L\tmain"},
    {"O0", "-s\t/nonexistent\t-D\tprice_order;subtotal*"},
};

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  std::string n = std::to_string(info.index) + "_";
  for (const char* p = info.param.bin; *p && n.size() < 16; ++p)
    n += isalnum(static_cast<unsigned char>(*p)) ? *p : '_';
  n += '_';
  for (const char* p = info.param.spec; *p && n.size() < 48; ++p)
    n += isalnum(static_cast<unsigned char>(*p)) ? *p : '_';
  return n;
}

INSTANTIATE_TEST_SUITE_P(Specs, PerfOracle, ::testing::ValuesIn(kCases), case_name);
INSTANTIATE_TEST_SUITE_P(Shown, PerfOracleShown, ::testing::ValuesIn(kShownCases), case_name);
INSTANTIATE_TEST_SUITE_P(Ranges, PerfOracleLines, ::testing::ValuesIn(kLineCases), case_name);
INSTANTIATE_TEST_SUITE_P(Listings, PerfOracleFuncs, ::testing::ValuesIn(kFuncCases), case_name);

}  // namespace
