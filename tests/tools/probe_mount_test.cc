// probefs-probe end to end on a real mount: each spec is added with the command, enabled,
// and the bundled program runs under `probefs exec`; the values its events show in the
// trace equal the values the program printed for the same calls (-O0 and -O2, parameters,
// locals, members through values and pointers, arrays, bitfields, strings, a global, a
// static function, inlined instances, a library, %return). Then -l, -d and the errors the
// tracefs gives back.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "tests/fs/mount_fixture.h"

namespace {

using probefs::fs::testing::CommandResult;
using probefs::fs::testing::Mount;
using probefs::fs::testing::run_command;

// The name=value pairs of a trace line's body after "(0xADDR) ", strings unquoted.
std::map<std::string, std::string> trace_values(const std::string& line) {
  std::map<std::string, std::string> v;
  size_t at = line.find(") ", line.find(": ("));
  if (at == std::string::npos) return v;
  at += 2;
  while (at < line.size()) {
    size_t eq = line.find('=', at);
    if (eq == std::string::npos) break;
    std::string name = line.substr(at, eq - at), value;
    size_t end;
    if (line[eq + 1] == '"') {
      end = line.find('"', eq + 2);
      if (end == std::string::npos) break;
      value = line.substr(eq + 2, end - eq - 2);
      ++end;
    } else {
      end = line.find(' ', eq);
      if (end == std::string::npos) end = line.size();
      value = line.substr(eq + 1, end - eq - 1);
    }
    v[name] = value;
    at = end + 1;
  }
  return v;
}

// The name=value pairs of one of the program's own lines ("price id=0 discount=0 ... -> 6").
std::map<std::string, std::string> program_values(const std::string& line) {
  std::map<std::string, std::string> v;
  std::istringstream in(line);
  std::string word;
  while (in >> word) {
    size_t eq = word.find('=');
    if (eq != std::string::npos) v[word.substr(0, eq)] = word.substr(eq + 1);
  }
  if (size_t arrow = line.find(" -> "); arrow != std::string::npos)
    v["result"] = line.substr(arrow + 4);
  return v;
}

std::vector<std::string> lines_of(const std::string& text, const std::string& with) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);)
    if (l.find(with) != std::string::npos && l[0] != '#') out.push_back(l);
  return out;
}

class ProbeFixture : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(m_.ok()) << m_.daemon_stderr(); }

  CommandResult probe(std::vector<std::string> args) {
    std::vector<std::string> argv = {PROBEFS_PROBE_BIN, "--target", m_.dir()};
    argv.insert(argv.end(), args.begin(), args.end());
    return run_command(argv, 60000);
  }

  // Adds SPEC on BIN with the command, which must succeed.
  void add(const std::string& bin, const std::string& spec) {
    CommandResult r = probe({"-x", bin, spec});
    ASSERT_EQ(r.exit_code(), 0) << spec << "\n" << r.err;
    ASSERT_NE(r.err.find("Added new event"), std::string::npos) << r.err;
  }

  // Enables every event, runs the program for ROUNDS rounds, and gives its output.
  std::string run_program(const std::string& bin, const std::string& rounds = "2") {
    EXPECT_EQ(m_.write("events/enable", "1\n"), 0);
    CommandResult r = run_command({PROBEFS_BIN, "exec", m_.dir(), "--", bin, rounds}, 60000);
    EXPECT_EQ(r.exit_code(), 0) << r.err;
    return r.out;
  }

  Mount m_;
};

class ProbeMountTest : public ProbeFixture, public ::testing::WithParamInterface<const char*> {};

// Every parameter, member, array element, bitfield and string of price_order, and its
// return value, against the program's own line for each call.
TEST_P(ProbeMountTest, FunctionArgumentsEqualTheProgramsValues) {
  const std::string bin = GetParam();
  add(bin, "price_order o->id discount coupon:string qty2=o->qty[2] o->priority o->rush "
           "o->weight zone=o->ship.zone postcode=o->bill->postcode item=o->item:string "
           "o->note:string");
  add(bin, "price_order%return $retval:s64");
  std::string out = run_program(bin);
  std::vector<std::string> calls = lines_of(out, "price id=");
  ASSERT_EQ(calls.size(), 6u) << out;
  std::string trace = m_.read("trace");
  std::vector<std::string> entries = lines_of(trace, ": price_order: ");
  std::vector<std::string> returns = lines_of(trace, ": price_order__return: ");
  ASSERT_EQ(entries.size(), calls.size()) << trace;
  ASSERT_EQ(returns.size(), calls.size()) << trace;
  for (size_t i = 0; i < calls.size(); ++i) {
    auto want = program_values(calls[i]);
    auto got = trace_values(entries[i]);
    for (const char* k : {"id", "discount", "qty2", "priority", "rush", "weight", "zone",
                          "postcode", "item", "note"})
      EXPECT_EQ(got[k], want[k]) << k << " in " << entries[i] << "\nprogram: " << calls[i];
    EXPECT_EQ(got["coupon_string"], i % 3 == 2 ? "XMAS" : "") << entries[i];
    EXPECT_EQ(trace_values(returns[i])["arg1"], want["result"]) << returns[i];
  }
}

// C++ by name (beyond perf): one overload chosen by its parameters, with `this->member`,
// members of a reference and a std::string's characters; a template by its demangled
// name; a lambda as the demangler names it (out of line at -O0 only). The values are the
// program's own: order i is ITEM QTY DISCOUNT PRICE on its line; Pricer::price(o, d)
// gets discount 0 from the plain pricer (order 0), d + 5 from the bulk one.
class ProbeMountCxx : public ProbeFixture, public ::testing::WithParamInterface<const char*> {};
TEST_P(ProbeMountCxx, MethodsTemplatesAndLambdasEqualTheProgramsValues) {
  const std::string bin = GetParam();
  const bool o0 = bin == PROBE_SHOP_O0;
  add(bin, "shop::Pricer::price(shop::Order const&, int) const this->tax_ o.item:string o.qty "
           "discount");
  add(bin, "shop::twice<int> v");
  if (o0) add(bin, "main::{lambda(shop::Order const&, int)#1}::operator() o.qty discount");
  // A member function inlined at -O2 (its instance in main), out of line at -O0.
  add(bin, o0 ? "shop::Pricer::tax this->tax_" : "shop::Pricer::tax");
  const std::string events = m_.read("uprobe_events");
  EXPECT_NE(events.find("/shop_Pricer_price "), std::string::npos) << events;
  EXPECT_NE(events.find("/shop_twice_int "), std::string::npos) << events;
  std::string out = run_program(bin, "5");
  std::vector<std::string> orders;
  for (const std::string& l : lines_of(out, " "))
    if (l.rfind("apple ", 0) == 0 || l.rfind("pear ", 0) == 0) orders.push_back(l);
  ASSERT_EQ(orders.size(), 5u) << out;
  const std::string trace = m_.read("trace");
  const std::vector<std::string> prices = lines_of(trace, ": shop_Pricer_price: ");
  const std::vector<std::string> twices = lines_of(trace, ": shop_twice_int: ");
  ASSERT_EQ(prices.size(), 5u) << trace;
  ASSERT_EQ(twices.size(), 5u) << trace;
  for (size_t i = 0; i < orders.size(); ++i) {
    std::istringstream line(orders[i]);
    std::string item, qty, discount;
    line >> item >> qty >> discount;
    auto got = trace_values(prices[i]);
    EXPECT_EQ(got["item"], item) << prices[i];
    EXPECT_EQ(got["qty"], qty) << prices[i];
    EXPECT_EQ(got["discount"], i == 0 ? discount : std::to_string(std::stoi(discount) + 5))
        << prices[i];
    // 0.25 and 0.125 as doubles: the pricers' tax.
    EXPECT_EQ(got["tax_"], i == 0 ? "0x3fd0000000000000" : "0x3fc0000000000000") << prices[i];
    EXPECT_EQ(trace_values(twices[i])["v"], std::to_string(i + 1)) << twices[i];
  }
  const std::vector<std::string> taxes = lines_of(trace, ": shop_Pricer_tax: ");
  ASSERT_EQ(taxes.size(), 1u) << trace;  // main's twice(plain.tax())
  if (o0) {
    EXPECT_EQ(trace_values(taxes[0])["tax_"], "0x3fd0000000000000") << taxes[0];
    const std::vector<std::string> lambdas = lines_of(trace, ": main_lambda_shop_Order_const_int_1_operator_call: ");
    ASSERT_EQ(lambdas.size(), 5u) << trace;
    for (size_t i = 0; i < orders.size(); ++i) {
      std::istringstream line(orders[i]);
      std::string item, qty, discount;
      line >> item >> qty >> discount;
      EXPECT_EQ(trace_values(lambdas[i])["qty"], qty) << lambdas[i];
      EXPECT_EQ(trace_values(lambdas[i])["discount"], discount) << lambdas[i];
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Builds, ProbeMountCxx, ::testing::Values(PROBE_SHOP_O0, PROBE_SHOP_O2),
                         [](const auto& info) {
                           return std::string(info.param) == PROBE_SHOP_O0 ? "O0" : "O2";
                         });

// A program started outside probefs, waiting on its stdin (PROBE_PROG_WAIT): killed when
// the test ends, whatever happened.
class WaitingProgram {
 public:
  explicit WaitingProgram(const std::string& bin) {
    int in[2], out[2], exec_seen[2];
    if (pipe2(in, O_CLOEXEC) != 0 || pipe2(out, O_CLOEXEC) != 0 || pipe2(exec_seen, O_CLOEXEC) != 0)
      return;
    pid_ = fork();
    if (pid_ == 0) {
      dup2(in[0], 0);
      dup2(out[1], 1);
      setenv("PROBE_PROG_WAIT", "1", 1);
      execl(bin.c_str(), bin.c_str(), "2", nullptr);
      _exit(127);
    }
    close(in[0]);
    close(out[1]);
    close(exec_seen[1]);
    in_ = in[1];
    out_ = out[0];
    // The write end closes at exec (O_CLOEXEC): from then on /proc/PID/exe is the program.
    char c;
    while (read(exec_seen[0], &c, 1) < 0 && errno == EINTR) {
    }
    close(exec_seen[0]);
  }
  ~WaitingProgram() {
    if (pid_ > 0 && !reaped_) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    if (in_ >= 0) close(in_);
    if (out_ >= 0) close(out_);
  }
  pid_t pid() const { return pid_; }

  // Lets it run, and gives what it printed once it ended ("" if it did not within 60 s).
  std::string go() {
    if (write(in_, "go\n", 3) != 3) return "";
    close(in_);
    in_ = -1;
    std::string text;
    char buf[4096];
    for (;;) {
      pollfd p{out_, POLLIN, 0};
      if (poll(&p, 1, 60000) <= 0) return "";
      const ssize_t n = read(out_, buf, sizeof buf);
      if (n <= 0) break;
      text.append(buf, static_cast<size_t>(n));
    }
    int status = 0;
    reaped_ = waitpid(pid_, &status, 0) == pid_;
    return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? text : "";
  }

 private:
  pid_t pid_ = -1;
  int in_ = -1, out_ = -1;
  bool reaped_ = false;
};

// --pid (beyond perf): a running program that probefs did not start; its executable and
// its library by -m come from /proc/PID, the definitions go to the mount, the process is
// attached, and its calls after that are the events.
class ProbeMountPid : public ProbeFixture {};
TEST_F(ProbeMountPid, DefinesAndAttachesARunningProgram) {
  WaitingProgram prog(PROBE_PROG_O2);
  ASSERT_GT(prog.pid(), 0);
  const std::string pid = std::to_string(prog.pid());
  CommandResult r = probe({"--pid", pid, "price_order o->id discount"});
  ASSERT_EQ(r.exit_code(), 0) << r.err;
  EXPECT_NE(r.err.find("Process " + pid + " is traced now."), std::string::npos) << r.err;
  r = probe({"--pid", pid, "-m", "probefs_probe_lib", "lib_checksum n"});
  ASSERT_EQ(r.exit_code(), 0) << r.err;
  EXPECT_NE(m_.read("targets").find(pid + " probe_prog_O2 attached"), std::string::npos)
      << m_.read("targets");
  ASSERT_EQ(m_.write("events/enable", "1\n"), 0);
  const std::string out = prog.go();
  ASSERT_NE(out, "");
  const std::vector<std::string> calls = lines_of(out, "price id="),
                                  sums = lines_of(out, "checksum n=");
  ASSERT_EQ(calls.size(), 6u) << out;
  const std::string trace = m_.read("trace");
  const std::vector<std::string> entries = lines_of(trace, ": price_order: "),
                                  checks = lines_of(trace, ": lib_checksum: ");
  ASSERT_EQ(entries.size(), calls.size()) << trace;
  ASSERT_EQ(checks.size(), sums.size()) << trace;
  for (size_t i = 0; i < calls.size(); ++i)
    EXPECT_EQ(trace_values(entries[i])["id"], program_values(calls[i])["id"]) << entries[i];
  for (size_t i = 0; i < sums.size(); ++i)
    EXPECT_EQ(trace_values(checks[i])["n"], program_values(sums[i])["n"]) << checks[i];
  // No such process: nothing is defined for it.
  r = probe({"--pid", "999999999", "price_order"});
  EXPECT_NE(r.exit_code(), 0);
}

// A lazy line pattern with a global read on it, and the library's function by -x.
TEST_P(ProbeMountTest, LazyLineGlobalAndLibrary) {
  const std::string bin = GetParam();
  add(bin, "price_order;orders_seen* orders_seen");
  add(PROBE_LIB, "lib_checksum s:string n");
  std::string out = run_program(bin);
  std::string trace = m_.read("trace");
  std::vector<std::string> seen = lines_of(trace, ": price_order: ");
  ASSERT_EQ(seen.size(), 6u) << trace;
  for (size_t i = 0; i < seen.size(); ++i)  // before the increment on that line
    EXPECT_EQ(trace_values(seen[i])["orders_seen"], std::to_string(i)) << seen[i];
  std::vector<std::string> sums = lines_of(out, "checksum n=");
  std::vector<std::string> hits = lines_of(trace, ": lib_checksum: ");
  ASSERT_EQ(hits.size(), sums.size()) << trace;
  const char* items[] = {"apple", "bread", "cheese"};
  for (size_t i = 0; i < hits.size(); ++i) {
    EXPECT_EQ(trace_values(hits[i])["s_string"], items[i % 3]) << hits[i];
    EXPECT_EQ(trace_values(hits[i])["n"], program_values(sums[i])["n"]) << hits[i];
  }
}

INSTANTIATE_TEST_SUITE_P(Opt, ProbeMountTest, ::testing::Values(PROBE_PROG_O0, PROBE_PROG_O2),
                         [](const auto& info) {
                           return std::string(info.param).find("O0") != std::string::npos
                                      ? "O0"
                                      : "O2";
                         });

// An SDT point by name (sdt_PROVIDER:NAME, read from the binary's .note.stapsdt, as perf
// reads its probe cache): the definition counts in the point's semaphore, so the code it
// guards runs, and the note's argument is fetched as perf names it (arg1).
using ProbeMountSdt = ProbeFixture;
TEST_F(ProbeMountSdt, APointByNameRunsItsGuardedCodeAndFetchesItsArguments) {
  // By name alone (%NAME: any provider), and a name the binary does not have.
  CommandResult d = probe({"-x", SDT_PROG, "-D", "%tick"});
  EXPECT_EQ(d.exit_code(), 0) << d.err;
  EXPECT_NE(d.out.find("p:sdt_sdtprog/tick "), std::string::npos) << d.out;
  CommandResult none = probe({"-x", SDT_PROG, "-D", "sdt_sdtprog:tock"});
  EXPECT_NE(none.exit_code(), 0);
  EXPECT_NE(none.err.find("Probe point 'sdt_sdtprog:tock' not found."), std::string::npos)
      << none.err;
  add(SDT_PROG, "sdt_sdtprog:tick");
  const std::string defs = m_.read("uprobe_events");
  EXPECT_NE(defs.find("p:sdt_sdtprog/tick " + std::string(SDT_PROG) + ":0x"), std::string::npos)
      << defs;
  EXPECT_NE(defs.find(") arg1=%dx:s32\n"), std::string::npos) << defs;  // after (REF_CTR)
  EXPECT_EQ(m_.write("events/enable", "1\n"), 0);
  CommandResult r = run_command({PROBEFS_BIN, "exec", m_.dir(), "--", SDT_PROG}, 60000,
                                "sem\ntick 3\nquit\n");
  EXPECT_EQ(r.exit_code(), 0) << r.err;
  EXPECT_EQ(r.out, "ready\nok 1\nok 3\n");
  const std::vector<std::string> lines = lines_of(m_.read("trace"), " tick: (");
  ASSERT_EQ(lines.size(), 3u) << m_.read("trace");
  for (size_t i = 0; i < lines.size(); ++i)
    EXPECT_EQ(trace_values(lines[i])["arg1"], std::to_string(i)) << lines[i];
}

using ProbeMountO0 = ProbeFixture;

// At -O0 clamp is inlined twice (always_inline): one probe on each instance, its parameter
// read in each, and the static function scale with both parameters.
TEST_F(ProbeMountO0, InlinedInstancesAndStaticFunction) {
  add(PROBE_PROG_O0, "clamp v");
  add(PROBE_PROG_O0, "scale v by");
  std::string out = run_program(PROBE_PROG_O0);
  std::string trace = m_.read("trace");
  std::vector<std::string> clamps = lines_of(trace, ": clamp: ");
  // Two rounds of three orders; each calls clamp in price_order and in main.
  ASSERT_EQ(clamps.size(), 12u) << trace;
  std::vector<std::string> calls = lines_of(out, "price id=");
  std::vector<std::string> totals = lines_of(out, "clamp v=");
  for (size_t i = 0; i < 6; ++i) {
    EXPECT_EQ(trace_values(clamps[2 * i])["v"], program_values(calls[i])["discount"]);
    EXPECT_EQ(trace_values(clamps[2 * i + 1])["v"], program_values(totals[i])["v"]);
  }
  std::vector<std::string> scales = lines_of(trace, ": scale: ");
  ASSERT_EQ(scales.size(), 2u) << trace;  // the XMAS orders
  EXPECT_EQ(trace_values(scales[0])["by"], "2");
}

// -l shows the events with their source places; -d with a glob removes them.
TEST_F(ProbeMountO0, ListAndDelete) {
  add(PROBE_PROG_O0, "price_order discount");
  add(PROBE_PROG_O0, "scale");
  CommandResult l = probe({"-l"});
  ASSERT_EQ(l.exit_code(), 0) << l.err;
  EXPECT_NE(l.out.find("probe_probe_prog_O0:price_order (on price_order:1@"), std::string::npos)
      << l.out;
  EXPECT_NE(l.out.find("tests/tools/probe_prog.c in " + std::string(PROBE_PROG_O0) +
                       " with discount)"),
            std::string::npos)
      << l.out;
  EXPECT_NE(l.out.find("probe_probe_prog_O0:scale (on scale@"), std::string::npos) << l.out;
  CommandResult d = probe({"-d", "probe_probe_prog_O0:*"});
  ASSERT_EQ(d.exit_code(), 0) << d.err;
  EXPECT_NE(d.err.find("Removed event: probe_probe_prog_O0:price_order"), std::string::npos);
  EXPECT_NE(d.err.find("Removed event: probe_probe_prog_O0:scale"), std::string::npos);
  EXPECT_EQ(m_.read("uprobe_events"), "");
  d = probe({"-d", "probe_probe_prog_O0:*"});
  EXPECT_NE(d.exit_code(), 0);
  EXPECT_NE(d.err.find("\"probe_probe_prog_O0:*\" does not hit any event."), std::string::npos)
      << d.err;
}

// A name in use is refused, -f takes the next free one; what was defined stays.
TEST_F(ProbeMountO0, DuplicateNamesAndForce) {
  add(PROBE_PROG_O0, "scale");
  CommandResult r = probe({"-x", PROBE_PROG_O0, "scale"});
  EXPECT_NE(r.exit_code(), 0);
  EXPECT_NE(r.err.find("Error: event \"scale\" already exists."), std::string::npos) << r.err;
  r = probe({"-f", "-x", PROBE_PROG_O0, "scale"});
  ASSERT_EQ(r.exit_code(), 0) << r.err;
  std::string defs = m_.read("uprobe_events");
  EXPECT_NE(defs.find("p:probe_probe_prog_O0/scale "), std::string::npos) << defs;
  EXPECT_NE(defs.find("p:probe_probe_prog_O0/scale_1 "), std::string::npos) << defs;
}

// A definition the tracefs refuses comes back with its errno and the error_log entry, and
// nothing defined before is lost.
TEST_F(ProbeMountO0, TracefsRefusalIsReported) {
  add(PROBE_PROG_O0, "scale");
  CommandResult r = probe({"-x", PROBE_PROG_O0, "price_order", "+0(%di):nosuchtype"});
  EXPECT_NE(r.exit_code(), 0);
  EXPECT_NE(r.err.find("Failed to write event: Invalid argument\n"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("Command: p:probe_probe_prog_O0/price_order"), std::string::npos) << r.err;
  EXPECT_NE(m_.read("uprobe_events").find("/scale "), std::string::npos);
}

// One run's definitions land together or not at all: when the tracefs refuses a later one,
// the events the run made before it are taken back.
TEST_F(ProbeMountO0, ARefusedDefinitionTakesBackTheRunsOthers) {
  add(PROBE_PROG_O0, "price_order");
  CommandResult r = probe({"-x", PROBE_PROG_O0, "-a", "scale", "-a", "main",
                           "-a", "clamp +0(%di):nosuchtype"});
  EXPECT_NE(r.exit_code(), 0);
  std::string defs = m_.read("uprobe_events");
  EXPECT_NE(defs.find("/price_order "), std::string::npos) << defs;
  EXPECT_EQ(defs.find("/scale "), std::string::npos) << defs;
  EXPECT_EQ(defs.find("/main "), std::string::npos) << defs;
  EXPECT_EQ(defs.find("/clamp "), std::string::npos) << defs;
}

// The dry run writes nothing; -v shows the definitions.
TEST_F(ProbeMountO0, DryRunWritesNothing) {
  CommandResult r = probe({"-n", "-v", "-x", PROBE_PROG_O0, "price_order discount"});
  ASSERT_EQ(r.exit_code(), 0) << r.err;
  EXPECT_NE(r.err.find("Writing event: p:probe_probe_prog_O0/price_order " +
                       std::string(PROBE_PROG_O0) + ":0x"),
            std::string::npos)
      << r.err;
  EXPECT_EQ(m_.read("uprobe_events"), "");
}

}  // namespace
