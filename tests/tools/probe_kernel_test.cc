// probefs-probe pointed at the kernel's own tracefs: the definitions it writes are accepted
// by the kernel's uprobe_events, and the kernel's trace shows the values the program
// computed, as ours does. Every step that touches the kernel runs with a deadline
// (tests/fs/kernel_tracefs.h); a kernel that does not answer skips the test. The probes go
// on a copy of the program of the test's own, so they reach no other process, and each
// event has one probe only.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "tests/fs/kernel_tracefs.h"

namespace {

using probefs::fs::testing::KernelTracefs;

std::vector<std::string> lines_with(const std::string& text, const std::string& what) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);)
    if (l.find(what) != std::string::npos && l[0] != '#') out.push_back(l);
  return out;
}

// "name=value" pairs of TEXT after its first AFTER, strings unquoted.
std::map<std::string, std::string> values(const std::string& text, const std::string& after) {
  std::map<std::string, std::string> v;
  size_t at = text.find(after);
  std::istringstream in(at == std::string::npos ? "" : text.substr(at + after.size()));
  for (std::string w; in >> w;) {
    size_t eq = w.find('=');
    if (eq == std::string::npos) continue;
    std::string value = w.substr(eq + 1);
    if (value.size() >= 2 && value.front() == '"') value = value.substr(1, value.size() - 2);
    v[w.substr(0, eq)] = value;
  }
  return v;
}

TEST(ProbeKernelTest, TheKernelTakesTheDefinitionsAndShowsTheProgramsValues) {
  KernelTracefs k;
  if (std::string why = k.start(5000); !why.empty()) GTEST_SKIP() << why;
  const std::filesystem::path dir = std::filesystem::path(k.dir()).parent_path() /
                                    ("probefs-probe-prog-" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  struct Cleanup {
    std::filesystem::path p;
    ~Cleanup() { std::filesystem::remove_all(p); }
  } cleanup{dir};
  const std::string prog = (dir / "probe_prog_O2").string();
  std::filesystem::copy_file(PROBE_PROG_O2, prog);

  // The group and the event names are the test's own: names must be new to the kernel in
  // every group, as perf checks them. perf adds "__return" to a given name too.
  const std::string g = k.group(), order = g + "_order", priced = g + "_priced";
  k.remember_probe(g + "/" + order);
  k.remember_probe(g + "/" + priced + "__return");
  KernelTracefs::Step s = k.run(
      "\"$1\" --target \"$2\" -x \"$3\" -a \"$4:$5=price_order o->id discount "
      "item=o->item:string orders_seen\" -a \"$4:$6=price_order%return \\$retval:s64\"",
      {PROBEFS_PROBE_BIN, k.dir(), prog, g, order, priced}, 30000);
  if (!s.answered) GTEST_SKIP() << "the kernel's tracefs did not answer";
  ASSERT_EQ(s.exit_code, 0) << s.err;
  EXPECT_NE(s.err.find("Added new events:"), std::string::npos) << s.err;

  // Read back in the kernel's form, then recorded in the test's own instance.
  s = k.run("cat \"$1/uprobe_events\"", {k.dir()}, 10000);
  ASSERT_TRUE(s.answered);
  EXPECT_NE(s.out.find("p:" + g + "/" + order + " " + prog + ":0x"), std::string::npos) << s.out;
  EXPECT_NE(s.out.find("r:" + g + "/" + priced + "__return " + prog + ":0x"), std::string::npos) << s.out;
  s = k.run("echo 1 > \"$1/events/$2/enable\" && exec \"$3\" 1", {k.instance(), g, prog},
            30000);
  ASSERT_TRUE(s.answered);
  ASSERT_EQ(s.exit_code, 0) << s.err;
  std::vector<std::string> calls = lines_with(s.out, "price id=");
  ASSERT_EQ(calls.size(), 3u) << s.out;
  s = k.run("cat \"$1/trace\"", {k.instance()}, 10000);
  ASSERT_TRUE(s.answered);
  std::vector<std::string> orders = lines_with(s.out, " " + order + ": ");
  std::vector<std::string> returns = lines_with(s.out, " " + priced + "__return: ");
  ASSERT_EQ(orders.size(), calls.size()) << s.out;
  ASSERT_EQ(returns.size(), calls.size()) << s.out;
  for (size_t i = 0; i < calls.size(); ++i) {
    auto want = values(calls[i], "price ");
    auto got = values(orders[i], ") ");
    EXPECT_EQ(got["id"], want["id"]) << orders[i];
    EXPECT_EQ(got["discount"], want["discount"]) << orders[i];
    EXPECT_EQ(got["item"], want["item"]) << orders[i];
    EXPECT_EQ(got["orders_seen"], std::to_string(i)) << orders[i];
    EXPECT_EQ(values(returns[i], ") ")["arg1"], calls[i].substr(calls[i].rfind(' ') + 1))
        << returns[i];
  }

  // -d removes them from the kernel too.
  s = k.run("echo 0 > \"$1/events/$2/enable\"; \"$3\" --target \"$4\" -d \"$2:*\"",
            {k.instance(), g, PROBEFS_PROBE_BIN, k.dir()}, 30000);
  ASSERT_TRUE(s.answered);
  EXPECT_EQ(s.exit_code, 0) << s.err;
  EXPECT_NE(s.err.find("Removed event: " + g + ":" + order), std::string::npos) << s.err;
}

}  // namespace
