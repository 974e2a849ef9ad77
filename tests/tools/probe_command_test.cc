// probefs-probe's command line as a user types it, against a real probefs mount: -V with and
// without --externs, -F, -m, DWARF found beside the object or by build-id, objects without
// DWARF, --max-probes, -q, -n, -a, -d, -l, usage errors, how the tracefs is found, perf's
// error messages, and -k with the values its probes trace. Where perf probe can do the same,
// its output on the same binary is the oracle; it runs only with TRACEFS_PATH=the mount and
// a fresh scratch HOME each time (its build-id cache there would otherwise hand it the DWARF
// of a copy that has none).
#include <dlfcn.h>
#include <fcntl.h>
#include <gnu/libc-version.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "tests/fs/mount_fixture.h"

namespace {

namespace stdfs = std::filesystem;
using probefs::fs::testing::CommandResult;
using probefs::fs::testing::Mount;
using probefs::fs::testing::run_command;

constexpr char kPerf[] = "/usr/bin/perf";
constexpr int kTimeoutMs = 60000;
constexpr char kNoDebugHint[] = "Rebuild with -g, or install an appropriate debuginfo package.";

// Paths as the command writes them: absolute, links resolved.
std::string real(const std::string& path) {
  std::error_code ec;
  stdfs::path p = stdfs::canonical(path, ec);
  return ec ? path : p.string();
}

std::string binary(const std::string& which) {
  if (which == "O0") return real(PROBE_PROG_O0);
  if (which == "O2") return real(PROBE_PROG_O2);
  return real(PROBE_LIB);
}

// The copies of probe_prog_O2 that tests/tools/debuginfo_variants.cmake makes beside it.
std::string variant(const std::string& rel) {
  return real(stdfs::path(PROBE_PROG_O2).parent_path() / "debuginfo_variants" / rel);
}

// A fresh directory, removed with what it holds.
class ScratchDir {
 public:
  ScratchDir() {
    std::string tmpl = (stdfs::temp_directory_path() / "probefs-cli-XXXXXX").string();
    if (mkdtemp(tmpl.data())) path_ = tmpl;
  }
  ~ScratchDir() {
    std::error_code ec;
    if (!path_.empty()) stdfs::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

std::vector<std::string> concat(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

// The lines of TEXT that start with PREFIX after leading blanks, without the blanks.
std::vector<std::string> lines_with(const std::string& text, const std::string& prefix) {
  std::vector<std::string> out;
  for (const std::string& l : lines_of(text)) {
    size_t start = l.find_first_not_of(' ');
    if (start != std::string::npos && l.compare(start, prefix.size(), prefix) == 0)
      out.push_back(l.substr(start));
  }
  return out;
}

// The lines of TEXT that contain WORD.
std::vector<std::string> lines_having(const std::string& text, const std::string& word) {
  std::vector<std::string> out;
  for (const std::string& l : lines_of(text))
    if (l.find(word) != std::string::npos && l[0] != '#') out.push_back(l);
  return out;
}

std::string replace_all(std::string text, const std::string& from, const std::string& to) {
  for (size_t at = text.find(from); at != std::string::npos; at = text.find(from, at + to.size()))
    text.replace(at, from.size(), to);
  return text;
}

// The NAME=VALUE words of a line, the program's own ("price id=3 discount=60 ...") or a
// trace's ("price_order: (price_order+0x14/0x16b) id=3 discount=60").
std::map<std::string, std::string> word_values(const std::string& line) {
  std::map<std::string, std::string> v;
  std::istringstream in(line);
  for (std::string w; in >> w;)
    if (size_t eq = w.find('='); eq != std::string::npos) v[w.substr(0, eq)] = w.substr(eq + 1);
  return v;
}

// The function symbols of BIN as nm names them (types t, T, i; the bundled objects have no
// weak functions, whose type W nm shares with weak data).
std::set<std::string> function_symbols(const std::string& bin) {
  CommandResult r = run_command({"nm", "--defined-only", bin}, kTimeoutMs);
  std::set<std::string> names;
  for (const std::string& l : lines_of(r.out)) {
    std::istringstream in(l);
    std::string addr, type, name;
    if (in >> addr >> type >> name && (type == "t" || type == "T" || type == "i"))
      names.insert(name);
  }
  return names;
}

// The file offset of the first "Writing event: ... PATH:0xOFF" line of a -v run.
uint64_t written_offset(const std::string& err) {
  std::smatch m;
  if (!std::regex_search(err, m, std::regex("Writing event: \\S+ \\S+:0x([0-9a-f]+)"))) return 0;
  return std::stoull(m[1], nullptr, 16);
}

class ProbeCommand : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(m_.ok()) << m_.daemon_stderr(); }

  // probefs-probe ARGS through `env ENV...` (ENV: "-u NAME" first, then "NAME=VALUE").
  static CommandResult run_probe(const std::vector<std::string>& env,
                                 const std::vector<std::string>& args) {
    return run_command(concat(concat({"env"}, env), concat({PROBEFS_PROBE_BIN}, args)), kTimeoutMs);
  }
  // As a user on the mount runs it: TRACEFS_PATH names the mount.
  CommandResult ours(const std::vector<std::string>& args,
                     const std::vector<std::string>& env = {}) const {
    return run_probe(concat(env, {"TRACEFS_PATH=" + m_.dir()}), args);
  }
  CommandResult perf(const std::vector<std::string>& args) const {
    ScratchDir home;
    return run_command(concat({"env", "-u", "DEBUGINFOD_URLS", "TRACEFS_PATH=" + m_.dir(),
                               "HOME=" + home.path(), kPerf, "probe"},
                              args),
                       kTimeoutMs);
  }

  // Adds with ARGS, which must succeed, and gives what uprobe_events then holds; clears it
  // (O_TRUNC, as on the kernel's) for the next.
  std::string added(const std::vector<std::string>& args,
                    const std::vector<std::string>& env = {}) {
    CommandResult r = ours(args, env);
    EXPECT_EQ(r.exit_code(), 0) << r.err;
    std::string defs = m_.read("uprobe_events");
    EXPECT_EQ(m_.write("uprobe_events", "", O_WRONLY | O_TRUNC), 0);
    return defs;
  }

  // Enables every event, runs BIN for two rounds under the mount, and gives its output.
  std::string run_program(const std::string& bin) {
    EXPECT_EQ(m_.write("events/enable", "1\n"), 0);
    CommandResult r = run_command({PROBEFS_BIN, "exec", m_.dir(), "--", bin, "2"}, kTimeoutMs);
    EXPECT_EQ(r.exit_code(), 0) << r.err;
    return r.out;
  }

  Mount m_;
};

// The tests that compare with perf probe.
class ProbeCommandPerf : public ProbeCommand {
 protected:
  void SetUp() override {
    if (access(kPerf, X_OK) != 0) GTEST_SKIP() << "no " << kPerf << " (linux-perf)";
    ProbeCommand::SetUp();
  }
};

// ---- IFUNC names

// libc as the dynamic linker loaded it: the object of a function no sanitizer intercepts.
std::string libc_path() {
  Dl_info info{};
  return dladdr(reinterpret_cast<void*>(&gnu_get_libc_version), &info) && info.dli_fname
             ? info.dli_fname
             : "";
}

// A uprobe on an IFUNC name keeps the kernel's meaning, the resolver's file offset, as
// perf writes it (the default version only), and the command says how to reach the code
// the program calls.
TEST_F(ProbeCommandPerf, IfuncNameIsTheResolverAndSaysSo) {
  const std::string libc = libc_path();
  ASSERT_FALSE(libc.empty());
  std::vector<std::string> args = {"-n", "-v", "-x", libc, "memcpy"};
  CommandResult mine = ours(args), theirs = perf(args);
  EXPECT_EQ(mine.exit_code(), 0) << mine.err;
  EXPECT_NE(mine.err.find("Note: memcpy is an IFUNC: this probes its resolver"),
            std::string::npos)
      << mine.err;
  EXPECT_EQ(lines_with(mine.err, "Writing event: ").size(), 1u) << mine.err;
  EXPECT_EQ(lines_with(mine.err, "Writing event: "), lines_with(theirs.err, "Writing event: "))
      << theirs.err;
}

// ---- -V / --vars

struct VarsCase {
  const char* bin;  // "O0", "O2" or "lib"
  const char* spec;
  bool externs;
  size_t places;  // "@<FUNC+OFF>" blocks; 0: refused
};

void PrintTo(const VarsCase& c, std::ostream* os) {
  *os << c.bin << " -V '" << c.spec << "'" << (c.externs ? " --externs" : "");
}

class ProbeCommandVars : public ProbeCommandPerf, public ::testing::WithParamInterface<VarsCase> {};

// `probefs-probe -x BIN -V SPEC [--externs]` prints perf's text, stdout and stderr, and exits
// as perf does: one block per place (each inlined instance of clamp), the CU's globals only
// with --externs.
TEST_P(ProbeCommandVars, SameAsPerf) {
  const VarsCase& c = GetParam();
  std::vector<std::string> args = {"-x", binary(c.bin), "-V", c.spec};
  if (c.externs) args.push_back("--externs");
  CommandResult mine = ours(args), theirs = perf(args);
  EXPECT_EQ(mine.out, theirs.out);
  EXPECT_EQ(mine.err, theirs.err);
  EXPECT_EQ(mine.exit_code(), theirs.exit_code());
  if (c.places == 0) {
    EXPECT_EQ(mine.out, "");
    EXPECT_NE(mine.err.find(std::string("Failed to find the address of ") + c.spec +
                            "\n  Error: Failed to show vars.\n"),
              std::string::npos)
        << mine.err;
    EXPECT_EQ(mine.exit_code(), 254);  // -ENOENT
    return;
  }
  EXPECT_EQ(mine.exit_code(), 0) << mine.err;
  ASSERT_FALSE(mine.out.empty());
  EXPECT_EQ(lines_of(mine.out)[0], std::string("Available variables at ") + c.spec);
  EXPECT_EQ(lines_with(mine.out, "\t@<").size(), c.places) << mine.out;
  const bool has_globals = c.externs && std::strcmp(c.bin, "lib") != 0;
  EXPECT_EQ(mine.out.find("long int\torders_seen\n") != std::string::npos, has_globals) << mine.out;
}

const VarsCase kVarsCases[] = {
    {"O0", "price_order", false, 1},   {"O0", "price_order", true, 1},
    {"O2", "price_order", false, 1},   {"O2", "price_order", true, 1},
    {"O0", "price_order:4", false, 1}, {"O0", "price_order:4", true, 1},
    {"O2", "price_order:4", false, 0},  // the line shares its address with line 2
    {"O0", "clamp", false, 2},         {"O0", "clamp", true, 2},
    {"O2", "clamp", false, 2},         {"O2", "clamp", true, 2},
    {"lib", "lib_checksum", false, 1}, {"lib", "lib_checksum", true, 1},
};

INSTANTIATE_TEST_SUITE_P(Specs, ProbeCommandVars, ::testing::ValuesIn(kVarsCases),
                         [](const ::testing::TestParamInfo<VarsCase>& info) {
                           std::string n = std::string(info.param.bin) + "_";
                           for (const char* p = info.param.spec; *p; ++p)
                             n += isalnum(static_cast<unsigned char>(*p)) ? *p : '_';
                           return n + (info.param.externs ? "_externs" : "");
                         });

// ---- -F / --funcs

class ProbeCommandFuncs : public ProbeCommandPerf,
                          public ::testing::WithParamInterface<const char*> {};

// `-F` alone: perf's list, byte for byte (functions, objects and labels of .symtab and
// again of .dynsym, without the names starting with '_' or ending in "@plt"), and every
// function symbol that does not start with '_' is in it.
TEST_P(ProbeCommandFuncs, AllFunctions) {
  const std::string bin = binary(GetParam());
  CommandResult mine = ours({"-x", bin, "-F"}), theirs = perf({"-x", bin, "-F"});
  ASSERT_EQ(mine.exit_code(), 0) << mine.err;
  ASSERT_EQ(theirs.exit_code(), 0) << theirs.err;
  EXPECT_EQ(mine.out, theirs.out);
  const std::vector<std::string> listed = lines_of(mine.out);
  size_t hidden = 0;
  for (const std::string& f : function_symbols(bin)) {
    if (f[0] == '_') ++hidden;
    else EXPECT_NE(std::find(listed.begin(), listed.end(), f), listed.end()) << f;
  }
  for (const std::string& l : listed) EXPECT_NE(l[0], '_') << l;
  EXPECT_GT(hidden, 0u) << "no '_' name to hide";
}

INSTANTIATE_TEST_SUITE_P(Objects, ProbeCommandFuncs, ::testing::Values("O0", "O2", "lib"),
                         [](const auto& info) { return std::string(info.param); });

// `--funcs='price*'`, `-F 'sc*'`: the names the glob matches, as perf lists them (twice
// where both symbol tables have one: lib_checksum); a filter shows the '_' names too.
TEST_F(ProbeCommandPerf, FuncsWithAFilter) {
  const std::vector<std::vector<std::string>> runs = {{"-x", binary("O0"), "--funcs=price*"},
                                                      {"-x", binary("O2"), "-F", "sc*"},
                                                      {"-x", binary("lib"), "--funcs", "lib_*"}};
  const char* want[] = {"price_order\n", "scale.constprop.0\n", "lib_checksum\nlib_checksum\n"};
  for (size_t i = 0; i < runs.size(); ++i) {
    CommandResult mine = ours(runs[i]), theirs = perf(runs[i]);
    EXPECT_EQ(mine.out, want[i]);
    EXPECT_EQ(mine.out, theirs.out);
    EXPECT_EQ(mine.exit_code(), 0) << mine.err;
  }
  CommandResult underscores = ours({"-x", binary("O0"), "-F", "_*"});
  EXPECT_NE(underscores.out.find("_start\n"), std::string::npos) << underscores.out;
  EXPECT_EQ(underscores.out.find("price_order"), std::string::npos) << underscores.out;
}

// -V and -L on C++ names (beyond perf): an overload by its parameter list, a virtual
// override by its class.
TEST_F(ProbeCommand, CxxVarsAndLines) {
  CommandResult vars =
      ours({"-x", PROBE_SHOP_O0, "-V", "shop::Pricer::price(shop::Order const&, int) const"});
  ASSERT_EQ(vars.exit_code(), 0) << vars.err;
  EXPECT_EQ(vars.out,
            "Available variables at shop::Pricer::price(shop::Order const&, int) const\n"
            "\t@<price+0>\n\t\tPricer*\tthis\n\t\tint\tdiscount\n\t\tstruct Order&\to\n");
  CommandResult lines = ours({"-x", PROBE_SHOP_O0, "-L", "shop::BulkPricer::price"});
  ASSERT_EQ(lines.exit_code(), 0) << lines.err;
  EXPECT_EQ(lines.out.rfind("<shop::BulkPricer::price@", 0), 0u) << lines.out;
  EXPECT_NE(lines.out.find("      1      return Pricer::price(o, discount"), std::string::npos)
      << lines.out;
}

// ---- -m: a library by name (perf's -m is for kernel modules: no oracle)

// With LD_LIBRARY_PATH set to the library's directory (for the command only), `-m
// probefs_probe_lib` and `-m libprobefs_probe_lib.so` find the library -x PATH names and
// write the same definition.
TEST_F(ProbeCommand, ModuleByName) {
  const std::string lib = binary("lib");
  const std::string ld_path = "LD_LIBRARY_PATH=" + stdfs::path(lib).parent_path().string();
  const std::string spec = "lib_checksum s:string n";
  const std::string by_path = added({"-x", lib, spec});
  EXPECT_EQ(by_path.rfind("p:probe_libprobefs_probe_lib/lib_checksum " + lib + ":0x", 0), 0u)
      << by_path;
  EXPECT_EQ(added({"-m", "probefs_probe_lib", spec}, {ld_path}), by_path);
  EXPECT_EQ(added({"-m", "libprobefs_probe_lib.so", spec}, {ld_path}), by_path);
}

// `-m libc` is libc.so.6, not the linker script libc6-dev installs as libc.so in the same
// directory (the first match of libc.so* there).
TEST_F(ProbeCommand, ModuleByNameSkipsALinkerScript) {
  CommandResult r = ours({"-m", "libc", "-D", "malloc"});
  ASSERT_EQ(r.exit_code(), 0) << r.err;
  EXPECT_NE(r.out.find("/libc.so.6:0x"), std::string::npos) << r.out;
}

// A name found nowhere is an error, with the exit status of -ENOENT as perf's statuses go
// (the negative errno modulo 256); without LD_LIBRARY_PATH the bundled library is not where
// the dynamic linker looks.
TEST_F(ProbeCommand, UnknownModule) {
  const std::string ld_path =
      "LD_LIBRARY_PATH=" + stdfs::path(binary("lib")).parent_path().string();
  CommandResult r = ours({"-m", "probefs_no_such_lib", "lib_checksum"}, {ld_path});
  EXPECT_EQ(r.err,
            "Failed to find the library probefs_no_such_lib.\n  Error: Failed to add events.\n");
  EXPECT_EQ(r.exit_code(), 254);
  r = ours({"-m", "probefs_probe_lib", "lib_checksum"}, {"-u", "LD_LIBRARY_PATH"});
  EXPECT_EQ(r.err,
            "Failed to find the library probefs_probe_lib.\n  Error: Failed to add events.\n");
  EXPECT_EQ(r.exit_code(), 254);
  EXPECT_EQ(m_.read("uprobe_events"), "");
}

// ---- DWARF found elsewhere, and none

// Specs that need the DWARF: members, strings, a lazy line with a global, a source line.
const char* const kDwarfSpecs[] = {
    "price_order o->id discount coupon:string q=o->qty[2] o->bill->postcode o->note:string",
    "price_order;orders_seen* orders_seen", "probe_prog.c:40"};

// The copy whose DWARF moved to .debug/NAME.debug behind a .gnu_debuglink writes the
// original's definitions, with the copy's path. (perf 6.1 does not look in .debug/ beside
// the object: the copy "has no debug information" to it.)
TEST_F(ProbeCommand, DebuglinkCopy) {
  const std::string copy = variant("split/probe_prog_O2");
  ASSERT_TRUE(stdfs::exists(copy)) << copy << ": build probe_prog_debuginfo_variants";
  for (const char* spec : kDwarfSpecs) {
    const std::string original = added({"-x", binary("O2"), spec});
    ASSERT_NE(original, "") << spec;
    EXPECT_EQ(added({"-x", copy, spec}), replace_all(original, binary("O2"), copy)) << spec;
  }
}

// The copy without DWARF and without a debuglink has its DWARF only by build-id:
// --debuginfo-dir at a root holding .build-id/XX/REST.debug finds it, for definitions and
// for -V; without it the copy has no debug information.
TEST_F(ProbeCommand, BuildIdUnderDebuginfoDir) {
  const std::string copy = variant("nodebug/probe_prog_O2");
  const std::string root = variant("buildid-root");
  ASSERT_TRUE(stdfs::exists(copy) && stdfs::exists(root)) << "build probe_prog_debuginfo_variants";
  for (const char* spec : kDwarfSpecs) {
    const std::string original = added({"-x", binary("O2"), spec});
    EXPECT_EQ(added({"--debuginfo-dir", root, "-x", copy, spec}),
              replace_all(original, binary("O2"), copy))
        << spec;
  }
  CommandResult r = ours({"-x", copy, "price_order discount"});
  EXPECT_EQ(r.err, "The " + copy + " file has no debug information.\n" + kNoDebugHint +
                       "\n  Error: Failed to add events.\n");
  CommandResult original = ours({"-x", binary("O2"), "-V", "clamp", "--externs"});
  CommandResult by_id = ours({"--debuginfo-dir", root, "-x", copy, "-V", "clamp", "--externs"});
  EXPECT_EQ(by_id.exit_code(), 0) << by_id.err;
  EXPECT_EQ(by_id.out, original.out);
}

// --symfs: a root that holds the debug files where a system keeps them (a sysroot, a
// container's /): the build-id copy's DWARF is found under ROOT/usr/lib/debug, for
// definitions, -V and -L. (perf 6.1 finds the file too, then cannot read its variables'
// locations: "Sorry, we don't support this variable location yet.")
TEST_F(ProbeCommand, BuildIdUnderSymfs) {
  const std::string copy = variant("nodebug/probe_prog_O2");
  const std::string root = variant("buildid-root");
  ASSERT_TRUE(stdfs::exists(copy) && stdfs::exists(root)) << "build probe_prog_debuginfo_variants";
  ScratchDir sys;
  stdfs::create_directories(sys.path() + "/usr/lib");
  stdfs::create_directory_symlink(root, sys.path() + "/usr/lib/debug");
  for (const char* spec : kDwarfSpecs) {
    const std::string original = added({"-x", binary("O2"), spec});
    EXPECT_EQ(added({"--symfs", sys.path(), "-x", copy, spec}),
              replace_all(original, binary("O2"), copy))
        << spec;
  }
  CommandResult original = ours({"-x", binary("O2"), "-V", "clamp", "--externs"});
  CommandResult in_root = ours({"--symfs=" + sys.path(), "-x", copy, "-V", "clamp", "--externs"});
  EXPECT_EQ(in_root.exit_code(), 0) << in_root.err;
  EXPECT_EQ(in_root.out, original.out);
  CommandResult lines = ours({"--symfs", sys.path(), "-x", copy, "-L", "price_order:1-3"});
  EXPECT_EQ(lines.exit_code(), 0) << lines.err;
  EXPECT_EQ(lines.out, ours({"-x", binary("O2"), "-L", "price_order:1-3"}).out);
}

// Without DWARF (strip --strip-debug: the .symtab stays) an entry, +OFFS, %return with
// $retval and raw arguments come from the symbol table, at the offsets the DWARF gives the
// original, as perf writes them for the same copy. (The strip --strip-all copy, stripped/,
// keeps .dynsym only, where price_order is not: see StrippedOfAllSymbols.)
TEST_F(ProbeCommandPerf, SymbolsOnly) {
  const std::string copy = variant("nodebug/probe_prog_O2");
  ASSERT_TRUE(stdfs::exists(copy)) << "build probe_prog_debuginfo_variants";
  for (const char* spec : {"price_order", "price_order+4", "price_order%return $retval",
                           "price_order %di +0(%si):u8"}) {
    const std::string original = added({"-x", binary("O2"), spec});
    ASSERT_NE(original, "") << spec;
    EXPECT_EQ(added({"-x", copy, spec}), replace_all(original, binary("O2"), copy)) << spec;
    const std::vector<std::string> dry = {"-v", "-n", "-x", copy, spec};
    CommandResult mine = ours(dry), theirs = perf(dry);
    EXPECT_EQ(lines_with(mine.err, "Writing event: "), lines_with(theirs.err, "Writing event: "))
        << "perf:\n"
        << theirs.err << "\nprobefs-probe:\n"
        << mine.err;
  }
}

// What needs DWARF is refused on that copy with perf's two lines and perf's status.
TEST_F(ProbeCommandPerf, SymbolsOnlyRefusesWhatNeedsDwarf) {
  const std::string copy = variant("nodebug/probe_prog_O2");
  ASSERT_TRUE(stdfs::exists(copy)) << "build probe_prog_debuginfo_variants";
  for (const char* spec : {"price_order discount", "price_order:3"}) {
    CommandResult mine = ours({"-x", copy, spec}), theirs = perf({"-x", copy, spec});
    EXPECT_EQ(mine.err, "The " + copy + " file has no debug information.\n" + kNoDebugHint +
                            "\n  Error: Failed to add events.\n")
        << spec;
    EXPECT_EQ(mine.err, theirs.err) << spec;
    EXPECT_EQ(mine.exit_code(), 254) << spec;  // -ENOENT
    EXPECT_EQ(mine.exit_code(), theirs.exit_code()) << spec;
  }
  EXPECT_EQ(m_.read("uprobe_events"), "");
}

// strip --strip-all leaves .dynsym only, without the program's own functions.
TEST_F(ProbeCommandPerf, StrippedOfAllSymbols) {
  const std::string copy = variant("stripped/probe_prog_O2");
  ASSERT_TRUE(stdfs::exists(copy)) << "build probe_prog_debuginfo_variants";
  CommandResult mine = ours({"-x", copy, "price_order"}),
                theirs = perf({"-x", copy, "price_order"});
  EXPECT_EQ(mine.err,
            "Failed to find symbol price_order in " + copy + "\n  Error: Failed to add events.\n");
  EXPECT_EQ(mine.err, theirs.err);
  EXPECT_EQ(mine.exit_code(), theirs.exit_code());
}

// ---- --max-probes

// probe_prog.c:40 is six places at -O0: `--max-probes 1` refuses it as perf does, with
// perf's status for -ERANGE; six are allowed, five are not.
TEST_F(ProbeCommandPerf, MaxProbes) {
  const std::string bin = binary("O0");
  CommandResult all = ours({"-v", "-n", "-x", bin, "probe_prog.c:40"});
  EXPECT_EQ(lines_with(all.err, "Writing event: ").size(), 6u) << all.err;
  const std::vector<std::string> one = {"--max-probes", "1", "-x", bin, "probe_prog.c:40"};
  CommandResult mine = ours(one), theirs = perf(one);
  EXPECT_EQ(mine.err, "Too many( > 1) probe point found.\n  Error: Failed to add events.\n");
  EXPECT_EQ(mine.err, theirs.err);
  EXPECT_EQ(mine.exit_code(), 222);
  EXPECT_EQ(mine.exit_code(), theirs.exit_code());
  EXPECT_EQ(ours({"-n", "--max-probes", "6", "-x", bin, "probe_prog.c:40"}).exit_code(), 0);
  EXPECT_EQ(ours({"-n", "--max-probes=5", "-x", bin, "probe_prog.c:40"}).exit_code(), 222);
  EXPECT_EQ(m_.read("uprobe_events"), "");
}

// ---- -q, -n, -a, -d, -l

// -q: nothing on stdout or stderr, and the event is there.
TEST_F(ProbeCommand, QuietSaysNothing) {
  CommandResult r = ours({"-q", "-x", binary("O0"), "price_order discount"});
  EXPECT_EQ(r.exit_code(), 0);
  EXPECT_EQ(r.out, "");
  EXPECT_EQ(r.err, "");
  EXPECT_NE(m_.read("uprobe_events").find("p:probe_probe_prog_O0/price_order "), std::string::npos);
}

// perf's -q silences its errors too: only the status tells.
TEST_F(ProbeCommandPerf, QuietFailureSaysNothing) {
  const std::vector<std::string> args = {"-q", "-x", binary("O0"), "nosuch"};
  CommandResult mine = ours(args), theirs = perf(args);
  EXPECT_EQ(mine.err, "");
  EXPECT_EQ(mine.err, theirs.err);
  EXPECT_EQ(mine.exit_code(), 254);
  EXPECT_EQ(mine.exit_code(), theirs.exit_code());
}

// -n: the event is shown as added, nothing reaches the mount.
TEST_F(ProbeCommand, DryRunWritesNothing) {
  CommandResult r = ours({"-n", "-x", binary("O0"), "price_order discount"});
  EXPECT_EQ(r.exit_code(), 0) << r.err;
  EXPECT_NE(r.err.find("Added new event:\n  probe_probe_prog_O0:price_order (on price_order in "),
            std::string::npos)
      << r.err;
  EXPECT_EQ(m_.read("uprobe_events"), "");
  EXPECT_EQ(m_.read("events/probe_probe_prog_O0/price_order/format"), "<errno 2>");
}

// Two -a in one run: both specs' events (clamp's two instances under one name), as perf
// writes them on the same mount.
TEST_F(ProbeCommandPerf, TwoAddsInOneRun) {
  const std::vector<std::string> args = {"-x", binary("O0"), "-a", "scale", "-a", "clamp v"};
  CommandResult theirs = perf(args);
  ASSERT_EQ(theirs.exit_code(), 0) << theirs.err;
  const std::string perfs = m_.read("uprobe_events");
  ASSERT_EQ(m_.write("uprobe_events", "", O_WRONLY | O_TRUNC), 0);
  CommandResult mine = ours(args);
  ASSERT_EQ(mine.exit_code(), 0) << mine.err;
  EXPECT_EQ(m_.read("uprobe_events"), perfs);
  EXPECT_EQ(lines_having(perfs, "/scale ").size(), 1u) << perfs;
  EXPECT_EQ(lines_having(perfs, "/clamp ").size(), 2u) << perfs;
  EXPECT_EQ(lines_with(mine.err, "probe_probe_prog_O0:"),
            lines_with(theirs.err, "probe_probe_prog_O0:"));
  EXPECT_NE(mine.err.find("Added new events:\n"), std::string::npos) << mine.err;
}

class ProbeCommandEvents : public ProbeCommandPerf {
 protected:
  // A few uprobes and kprobes on the program, defined by the command.
  void define() {
    ASSERT_EQ(m_.write("uprobe_events", "", O_WRONLY | O_TRUNC), 0);
    ASSERT_EQ(m_.write("kprobe_events", "", O_WRONLY | O_TRUNC), 0);
    const std::string bin = binary("O0");
    ASSERT_EQ(ours({"-q", "-x", bin, "-a", "scale", "-a", "price_order discount", "-a", "main",
                    "-a", "price_order%return $retval"})
                  .exit_code(),
              0);
    ASSERT_EQ(ours({"-q", "-k", "-x", bin, "-a", "k1=clamp v", "-a", "k0=main"}).exit_code(), 0);
  }
  std::string defined() { return m_.read("uprobe_events") + m_.read("kprobe_events"); }
};

// `-d` with globs: a pattern matches EVENT or GROUP:EVENT as a whole ('probe_*' takes every
// event of the probe_ groups), several -d make one filter, removals are reported in perf's
// order, and a filter that hits nothing is an error: all as perf does it on the same events.
TEST_F(ProbeCommandEvents, DeleteWithGlobs) {
  const std::vector<std::vector<std::string>> runs = {{"-d", "probe_probe_prog_O0:[cs]*"},
                                                      {"-d", "probe_*", "-d", "*:main"},
                                                      {"-d", "k?"},
                                                      {"--del=price*"},
                                                      {"-d", "nosuch", "-d", "other"}};
  for (const std::vector<std::string>& args : runs) {
    define();
    CommandResult theirs = perf(args);
    const std::string perfs = defined();
    define();
    CommandResult mine = ours(args);
    EXPECT_EQ(mine.err, theirs.err) << args.back();
    EXPECT_EQ(mine.exit_code(), theirs.exit_code()) << args.back();
    EXPECT_EQ(defined(), perfs) << args.back();
  }
  define();
  CommandResult r = ours({"-d", "probe_probe_prog_O0:[cs]*"});
  EXPECT_EQ(r.err, "Removed event: probe_probe_prog_O0:scale\n");
  EXPECT_EQ(r.exit_code(), 0);
  r = ours({"-d", "probe_*"});
  EXPECT_EQ(lines_with(r.err, "Removed event: ").size(), 5u) << r.err;
  EXPECT_EQ(defined(), "");
  r = ours({"-d", "nosuch", "-d", "other"});
  EXPECT_EQ(r.err, "\"nosuch|other\" does not hit any event.\n  Error: Failed to delete events.\n");
  EXPECT_EQ(r.exit_code(), 254);
}

// `-l` with and without a filter: perf's lines in perf's order (kprobe_events first, each
// file sorted), uprobes with their source places, kprobes as "SYM+OFF in MOD".
TEST_F(ProbeCommandEvents, ListAsPerf) {
  define();
  for (const std::vector<std::string>& args : std::vector<std::vector<std::string>>{
           {"-l"}, {"-l", "probe_*"}, {"-l", "*:price*"}, {"--list=k*"}, {"-l", "nosuch"}}) {
    CommandResult mine = ours(args), theirs = perf(args);
    EXPECT_EQ(mine.out, theirs.out) << args.back();
    EXPECT_EQ(mine.exit_code(), theirs.exit_code()) << args.back();
  }
  CommandResult r = ours({"-l", "k*"});
  EXPECT_EQ(lines_of(r.out),
            (std::vector<std::string>{
                "  probe_probe_prog_O0:k0 (on main in probe_prog_O0)",
                "  probe_probe_prog_O0:k1 (on main+588 in probe_prog_O0 with v)",
                "  probe_probe_prog_O0:k1 (on price_order+103 in probe_prog_O0 with v)"}));
}

// An unknown option or switch, or no action: perf's usage on stderr and status 129.
TEST_F(ProbeCommandPerf, UsageErrors) {
  for (const std::vector<std::string>& args : std::vector<std::vector<std::string>>{
           {"--frobnicate"}, {"-z"}, {}, {"-x", binary("O0")}, {"-q", "-j"}}) {
    CommandResult mine = ours(args), theirs = perf(args);
    const std::string what = args.empty() ? "(none)" : args.back();
    EXPECT_EQ(mine.exit_code(), 129) << what;
    EXPECT_EQ(theirs.exit_code(), 129) << what;
    EXPECT_EQ(mine.out, "") << what;
    // The same head (error line and synopsis), up to the option table, where the two
    // commands' options differ.
    std::string head = replace_all(theirs.err.substr(0, theirs.err.find("\n    -")), "perf probe",
                                   "probefs-probe");
    EXPECT_NE(head, "") << what;
    EXPECT_EQ(mine.err.substr(0, head.size()), head) << what;
  }
  EXPECT_EQ(m_.read("uprobe_events"), "");
}

// ---- Which tracefs

// TRACEFS_PATH names the mount (no --target): the event is there, and the closing hint
// names the mount's files.
TEST_F(ProbeCommand, TracefsPathNamesTheMount) {
  CommandResult r = run_probe({"TRACEFS_PATH=" + m_.dir()}, {"-x", binary("O0"), "scale"});
  EXPECT_EQ(r.exit_code(), 0) << r.err;
  EXPECT_NE(m_.read("uprobe_events").find("p:probe_probe_prog_O0/scale "), std::string::npos);
  EXPECT_NE(r.err.find("echo 1 > " + m_.dir() + "/events/probe_probe_prog_O0/scale/enable\n"),
            std::string::npos)
      << r.err;
}

// Run from inside the mount with no TRACEFS_PATH: the current directory is the tracefs.
TEST_F(ProbeCommand, CurrentDirectoryIsTheMount) {
  CommandResult r = run_command({"sh", "-c", "cd \"$0\" && exec env -u TRACEFS_PATH \"$@\"",
                                 m_.dir(), PROBEFS_PROBE_BIN, "-x", binary("O0"), "scale"},
                                kTimeoutMs);
  EXPECT_EQ(r.exit_code(), 0) << r.err;
  EXPECT_NE(m_.read("uprobe_events").find("p:probe_probe_prog_O0/scale "), std::string::npos);
  EXPECT_NE(r.err.find("echo 1 > " + m_.dir() + "/events/"), std::string::npos) << r.err;
}

// Neither TRACEFS_PATH nor --target, in a directory that is not a tracefs: adding, -l and
// -d fail with the -ENOENT status; a dry run needs no tracefs.
TEST_F(ProbeCommand, NoTracefs) {
  ScratchDir cwd;
  auto in_cwd = [&](std::vector<std::string> args) {
    return run_command(concat({"sh", "-c", "cd \"$0\" && exec env -u TRACEFS_PATH \"$@\"",
                               cwd.path(), PROBEFS_PROBE_BIN},
                              args),
                       kTimeoutMs);
  };
  const std::string none = "No tracefs given: use --target MOUNTPOINT or TRACEFS_PATH\n";
  CommandResult r = in_cwd({"-x", binary("O0"), "scale"});
  EXPECT_EQ(r.err, none + "  Error: Failed to add events.\n");
  EXPECT_EQ(r.exit_code(), 254);
  r = in_cwd({"-l"});
  EXPECT_EQ(r.err, none + "  Error: Failed to show event list.\n");
  EXPECT_EQ(r.exit_code(), 254);
  r = in_cwd({"-d", "*"});
  EXPECT_EQ(r.err, none + "  Error: Failed to delete events.\n");
  EXPECT_EQ(r.exit_code(), 254);
  r = in_cwd({"-n", "-x", binary("O0"), "scale"});
  EXPECT_EQ(r.exit_code(), 0) << r.err;
  EXPECT_TRUE(stdfs::is_empty(cwd.path()));
}

// --target wins over TRACEFS_PATH, and a directory that is no tracefs is refused.
TEST_F(ProbeCommand, TargetThatIsNoTracefs) {
  ScratchDir dir;
  CommandResult r = ours({"--target", dir.path(), "-x", binary("O0"), "scale"});
  EXPECT_EQ(r.err, "--target " + dir.path() +
                       ": not a tracefs (neither a probefs mount nor a directory with "
                       "uprobe_events and README)\n  Error: Failed to add events.\n");
  EXPECT_EQ(r.exit_code(), 254);
  r = ours({"--target", dir.path() + "/nosuch", "-l"});
  EXPECT_EQ(r.err, "--target " + dir.path() +
                       "/nosuch: No such file or directory\n  Error: Failed to show event list.\n");
  EXPECT_EQ(m_.read("uprobe_events"), "");
  EXPECT_TRUE(stdfs::is_empty(dir.path()));
}

// ---- Errors in perf's words

struct ErrorCase {
  const char* bin;
  const char* spec;
  const char* message;  // the lines before "  Error: ..."
  const char* what;     // "Failed to add events" or "Command Parse Error"
};

void PrintTo(const ErrorCase& c, std::ostream* os) { *os << c.bin << " '" << c.spec << "'"; }

class ProbeCommandErrors : public ProbeCommandPerf,
                           public ::testing::WithParamInterface<ErrorCase> {};

// The spec is refused before anything is written, with perf's message (a missing
// variable's hints included: " Use -V with the --range option..."), perf's "Error:" line
// (the reason and code only with -v) and perf's status.
TEST_P(ProbeCommandErrors, SameAsPerf) {
  const ErrorCase& c = GetParam();
  const std::vector<std::string> args = {"-x", binary(c.bin), c.spec};
  CommandResult mine = ours(args), theirs = perf(args);
  EXPECT_NE(mine.err.find(std::string(c.message) + "\n  Error: " + c.what + ".\n"),
            std::string::npos)
      << mine.err;
  EXPECT_EQ(mine.err, theirs.err);
  EXPECT_NE(mine.exit_code(), 0);
  EXPECT_EQ(mine.exit_code(), theirs.exit_code());
  EXPECT_EQ(m_.read("uprobe_events"), "");
  const std::vector<std::string> verbose = {"-v", "-x", binary(c.bin), c.spec};
  EXPECT_EQ(lines_with(ours(verbose).err, "Error: "), lines_with(perf(verbose).err, "Error: "));
}

const ErrorCase kErrorCases[] = {
    {"O0", "nosuch", "Probe point 'nosuch' not found.", "Failed to add events"},
    {"O0", "price_order:200", "Probe point 'price_order:200' not found.", "Failed to add events"},
    {"O0", "probe_prog.c:2", "Probe point '@probe_prog.c:2' not found.", "Failed to add events"},
    {"O2", "clamp v",
     "Failed to find the location of the 'v' variable at this address.\n"
     " Perhaps it has been optimized out.\n"
     " Use -V with the --range option to show 'v' location range.",
     "Failed to add events"},
    {"O2", "price_order nosuchvar",
     "Failed to find the location of the 'nosuchvar' variable at this address.\n"
     " Perhaps it has been optimized out.\n"
     " Use -V with the --range option to show 'nosuchvar' location range.",
     "Failed to add events"},
    {"O0", "price_order o->nosuch", "o(type:order) has no member nosuch.", "Failed to add events"},
    {"O0", "price_order discount->x", "discount is not a data structure nor a union.",
     "Failed to add events"},
    {"O0", "price_order:3",
     "This line is sharing the address with other lines.\n"
     "Please try to probe at price_order:-11 instead.",
     "Failed to add events"},
    {"O0", "price_order%return:3",
     "Semantic error :Offset/Line/Lazy pattern can't be used with return probe.",
     "Command Parse Error"},
    {"O0", "price_order%return discount",
     "Semantic error :You can't specify local variable for kretprobe.", "Command Parse Error"},
};

INSTANTIATE_TEST_SUITE_P(Specs, ProbeCommandErrors, ::testing::ValuesIn(kErrorCases),
                         [](const ::testing::TestParamInfo<ErrorCase>& info) {
                           std::string n = std::to_string(info.index) + "_" + info.param.bin + "_";
                           for (const char* p = info.param.spec; *p; ++p)
                             n += isalnum(static_cast<unsigned char>(*p)) ? *p : '_';
                           return n;
                         });

// ---- -k / --kprobe-syntax

class ProbeCommandKprobe : public ProbeCommand, public ::testing::WithParamInterface<const char*> {
 protected:
  std::string bin() const { return binary(GetParam()); }
  std::string name() const { return stdfs::path(bin()).filename().string(); }
};

// `-k -x PROG 'price_order o->id discount'` writes "p:GROUP/price_order PROG:price_order+N
// ..." into kprobe_events, N where the uprobe definition places it (past the prologue at
// -O0), and its values in the trace are the program's.
TEST_P(ProbeCommandKprobe, ArgumentsEqualTheProgramsValues) {
  const std::string spec = "price_order o->id discount";
  const uint64_t entry = written_offset(ours({"-v", "-n", "-x", bin(), "price_order"}).err);
  const uint64_t placed = written_offset(ours({"-v", "-n", "-x", bin(), spec}).err);
  ASSERT_NE(entry, 0u);
  CommandResult r = ours({"-k", "-x", bin(), spec});
  ASSERT_EQ(r.exit_code(), 0) << r.err;
  const std::string defs = m_.read("kprobe_events");
  std::smatch m;
  ASSERT_TRUE(std::regex_match(defs, m,
                               std::regex("p:probe_" + name() + "/price_order " + name() +
                                          ":price_order(?:\\+(\\d+))? id=\\S+ "
                                          "discount=\\S+\n")))
      << defs;
  EXPECT_EQ(m[1].matched ? std::stoull(m[1]) : 0, placed - entry) << defs;
  EXPECT_EQ(m_.read("uprobe_events"), "");

  const std::string out = run_program(bin());
  const std::vector<std::string> calls = lines_having(out, "price id=");
  const std::vector<std::string> hits = lines_having(m_.read("trace"), ": price_order: ");
  ASSERT_EQ(calls.size(), 6u) << out;
  ASSERT_EQ(hits.size(), calls.size());
  for (size_t i = 0; i < calls.size(); ++i) {
    auto want = word_values(calls[i]), got = word_values(hits[i]);
    EXPECT_EQ(got["id"], want["id"]) << hits[i];
    EXPECT_EQ(got["discount"], want["discount"]) << hits[i];
  }
}

// A global with -k is fetched by its symbol ("@orders_seen+0"); the mount takes it, and at
// each call it holds the number of calls before.
TEST_P(ProbeCommandKprobe, GlobalBySymbol) {
  CommandResult r = ours({"-k", "-x", bin(), "price_order orders_seen"});
  ASSERT_EQ(r.exit_code(), 0) << r.err;
  const std::string defs = m_.read("kprobe_events");
  EXPECT_NE(defs.find(" orders_seen=@orders_seen+0:s64\n"), std::string::npos) << defs;
  run_program(bin());
  const std::vector<std::string> hits = lines_having(m_.read("trace"), ": price_order: ");
  ASSERT_EQ(hits.size(), 6u);
  for (size_t i = 0; i < hits.size(); ++i)
    EXPECT_EQ(word_values(hits[i])["orders_seen"], std::to_string(i)) << hits[i];
}

INSTANTIATE_TEST_SUITE_P(Opt, ProbeCommandKprobe, ::testing::Values("O0", "O2"),
                         [](const auto& info) { return std::string(info.param); });

}  // namespace
