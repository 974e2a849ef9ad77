// The hist trigger language (fs/hist_trigger.h) against the kernel's: what a command
// reads back as, the error_log entry and errno a bad one gets (the carets where the
// kernel's errpos() puts them), and the hist file's text for known counts.
#include "fs/hist_trigger.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "events/compile.h"
#include "events/parse.h"

namespace probefs::fs {
namespace {

events::CompiledEvent event() {
  events::ParseResult r = events::parse_kprobe_command(
      "p:g/e prog:f a=%di:s32 b=%si:u64 name=+0(%dx):string addr=%cx:x64");
  EXPECT_EQ(r.status, events::ParseStatus::kDefine);
  events::CompiledEvent c;
  events::Diagnostic d;
  EXPECT_TRUE(events::compile(r.def, {}, &c, &d));
  return c;
}

struct Parsed {
  int rc = 0;
  HistSpec spec;
  events::Diagnostic err;
};

Parsed parse(std::string_view text) {
  Parsed p;
  p.rc = parse_hist(text, event(), "g", "e", &p.spec, &p.err);
  return p;
}

TEST(HistTrigger, ReadsBackAsTheKernelPrintsIt) {
  struct Case {
    const char* in;
    const char* out;
  } cases[] = {
      {"hist:keys=a", "hist:keys=a:vals=hitcount:sort=hitcount:size=2048"},
      {"hist:key=a:val=b", "hist:keys=a:vals=hitcount,b:sort=hitcount:size=2048"},
      {"hist:keys=a,b.hex:values=hitcount,b:sort=b.descending,a:size=100",
       "hist:keys=a,b.hex:vals=hitcount,b:sort=b.descending,a:size=128"},
      {"hist:keys=common_pid.execname,name:sort=hitcount.descending",
       "hist:keys=common_pid.execname,name:vals=hitcount:sort=hitcount.descending:size=2048"},
      {"hist:keys=b.log2,a.buckets=10:vals=b.percent,a.graph",
       "hist:keys=b.log2,a.buckets=10:vals=hitcount,b.percent,a.graph:sort=hitcount:size=2048"},
      {"hist:keys=addr.sym-offset:sort=addr.ascending",
       "hist:keys=addr.sym-offset:vals=hitcount:sort=addr.sym-offset:size=2048"},
      {"hist:keys=cpu", "hist:keys=common_cpu:vals=hitcount:sort=hitcount:size=2048"},
      {"hist:keys=common_stacktrace:vals=b",
       "hist:keys=common_stacktrace:vals=hitcount,b:sort=hitcount:size=2048"},
      {"hist:keys=stacktrace,a", "hist:keys=stacktrace,a:vals=hitcount:sort=hitcount:size=2048"},
      {"hist:name=foo:keys=a:pause", "hist:name=foo:keys=a:vals=hitcount:sort=hitcount:size=2048"},
      {"  hist:keys=a if a > 3 && b < 2  \n",
       "hist:keys=a:vals=hitcount:sort=hitcount:size=2048 if a > 3 && b < 2"},
      {"hist keys=a:size=131072", "hist:keys=a:vals=hitcount:sort=hitcount:size=131072"},
      // Variables after the values, the clock and the action after the size.
      {"hist:keys=common_pid:ts0=common_timestamp.usecs",
       "hist:keys=common_pid:vals=hitcount:ts0=common_timestamp.usecs:sort=hitcount:size=2048:"
       "clock=global"},
      {"hist:keys=a:vals=$x,b:x=b+3,y=a:z=common_timestamp-$t if a > 1",
       "hist:keys=a:vals=hitcount,$x,b:x=b+3,y=a,z=common_timestamp-$t:sort=hitcount:size=2048:"
       "clock=global if a > 1"},
      {"hist:keys=a:lat=common_timestamp.usecs-$ts0:onmatch(g.e).trace(sy,$lat,addr)",
       "hist:keys=a:vals=hitcount:lat=common_timestamp.usecs-$ts0:sort=hitcount:size=2048:"
       "clock=global:onmatch(g.e).trace(sy,$lat,addr)"},
      // Constants folded, * and / before + and -, left to right; -(EXPR).
      {"hist:keys=a:x=123,y=16-8-4-2,z=64/8/4/2",
       "hist:keys=a:vals=hitcount:x=123,y=2,z=1:sort=hitcount:size=2048"},
      {"hist:keys=a:x=4*3/2*2,y=4+3*2-2,z=4+6/2-2,w=16-8+4+2",
       "hist:keys=a:vals=hitcount:x=12,y=8,z=5,w=14:sort=hitcount:size=2048"},
      {"hist:keys=a:x=b*3,y=b/2,z=-(5),w=b+2*3",
       "hist:keys=a:vals=hitcount:x=b*3,y=b/2,z=-(5),w=b+6:sort=hitcount:size=2048"},
      {"hist:keys=a:d=b-$x:onmatch(g.e).s($d,addr)",
       "hist:keys=a:vals=hitcount:d=b-$x:sort=hitcount:size=2048:onmatch(g.e).s($d,addr)"},
      // onmax and onchange: after the size, in the order written.
      {"hist:keys=a:lat=common_timestamp.usecs-$ts0:onmax($lat).save(addr, common_pid)",
       "hist:keys=a:vals=hitcount:lat=common_timestamp.usecs-$ts0:sort=hitcount:size=2048:"
       "clock=global:onmax($lat).save(addr,common_pid)"},
      {"hist:keys=a:v=addr:onchange($v).trace(sy,$v) if b > 2",
       "hist:keys=a:vals=hitcount:v=addr:sort=hitcount:size=2048:onchange($v).trace(sy,$v)"
       " if b > 2"},
      {"hist:keys=a:v=b-$x:onmax($v).save(addr):onmatch(g.e).sy($v)",
       "hist:keys=a:vals=hitcount:v=b-$x:sort=hitcount:size=2048:onmax($v).save(addr):"
       "onmatch(g.e).sy($v)"},
  };
  for (const Case& c : cases) {
    Parsed p = parse(c.in);
    ASSERT_EQ(p.rc, 0) << c.in << ": " << p.err.message();
    EXPECT_EQ(p.spec.text(), c.out) << c.in;
  }
  EXPECT_TRUE(parse("!hist:keys=a").spec.remove);
  EXPECT_TRUE(parse("hist:keys=a:pause").spec.pause);
  EXPECT_TRUE(parse("hist:keys=a:continue").spec.cont);
  EXPECT_TRUE(parse("hist:keys=a:clear").spec.clear);
}

TEST(HistTrigger, BadCommandsGetTheKernelsErrorsAndCarets) {
  struct Case {
    const char* in;
    int rc;
    const char* message;  // nullptr: nothing logged
    int pos;
  } cases[] = {
      {"hist", -EINVAL, nullptr, 0},
      {"hist:vals=a", -EINVAL, nullptr, 0},
      {"hist:keys=a:size=64", -EINVAL, nullptr, 0},
      {"hist:keys=a:size=262144", -EINVAL, nullptr, 0},
      {"hist:keys=a:size=x", -EINVAL, nullptr, 0},
      {"hist:keys=a,b,name,addr", -EINVAL, nullptr, 0},
      {"hist:keys=a:vals=b,a,b", -EINVAL, nullptr, 0},
      {"hist:keys=a:bogus", -EINVAL, nullptr, 0},
      {"hist:keys=nope", -EINVAL, "Couldn't find field", 10},
      {"hist:keys=a:vals=zz", -EINVAL, "Couldn't find field", 17},
      {"hist:keys=a.foo", -EINVAL, "Invalid field modifier", 12},
      {"hist:keys=a.execname", -EINVAL, "Invalid field modifier", 12},
      {"hist:keys=a.percent", -EINVAL, "Invalid field modifier", 12},
      {"hist:keys=a.buckets=0", -EINVAL, "Invalid field modifier", 12},
      {"hist:keys=a:sort=", -EINVAL, "Empty assignment", 12},
      {"hist:keys=a:sort=b", -EINVAL, "Sort field must be a key or a val", 17},
      {"hist:keys=a:sort=a.up", -EINVAL, "Invalid sort modifier", 19},
      {"hist:keys=a:sort=a,hitcount,a", -EINVAL, "Too many sort fields (Max = 2)", 12},
      {"hist:keys=a:sort=a,,", -EINVAL, "Empty sort field", 12},
      {"hist:keys=common_timestamp", -EINVAL, "Couldn't create histogram for field", 10},
      {"hist:keys=a:x=b,x=a", -EINVAL, "Variable already defined", 12},
      {"hist:keys=$x", -EINVAL, "Using variable references in keys not supported", 10},
      {"hist:keys=a:vals=$y", -EINVAL, "Couldn't find variable", 17},
      // Expressions: the kernel's limit of three operators, its carets (the operand
      // where the count passes three), unary minus only as -(EXPR) and alone, division
      // by a constant 0 (EDOM); timestamps of two units, at the start.
      {"hist:keys=a:x=32+10*3/20-4", -EINVAL, "Too many subexpressions (3 max)", 17},
      {"hist:keys=a:x=1+2+3+4+5", -EINVAL, "Too many subexpressions (3 max)", 14},
      {"hist:keys=a:x=-(1)+2", -EINVAL, "Unary minus not supported in sub-expressions", 16},
      {"hist:keys=a:x=3/0", -EDOM, "Division by zero", 16},
      {"hist:keys=a:x=b/(4-4)", -EINVAL, "Couldn't find field", 16},
      {"hist:keys=a:x=-5", -EINVAL, nullptr, 0},
      {"hist:keys=a:x=a-", -EINVAL, nullptr, 0},
      {"hist:keys=a:x=name+1", -EINVAL, "String type can not be an operand in expression", 14},
      {"hist:keys=a:x=common_timestamp-common_timestamp.usecs", -EINVAL,
       "Timestamp units in expression don't match", 0},
      {"hist:keys=a:x=", -EINVAL, "Empty assignment", 12},
      // What the targets do not compute: more than one operator between terms.
      {"hist:keys=a:x=a-b-a", -EINVAL, "Couldn't create histogram for field", 14},
      {"hist:keys=a:onmatch(t", -EINVAL, "No closing paren found", 12},
      {"hist:keys=a:onmatch(te).x(a)", -EINVAL, "Missing subsystem", 12},
      {"hist:keys=a:onmatch(t.e)", -EINVAL, "No action found", 0},
      {"hist:keys=a:onmatch(t.e).save(addr)", -EINVAL, "Handler doesn't support action", 25},
      {"hist:keys=a:onmatch(t.e).trace(sy,b)", -EINVAL, "Invalid action param", 34},
      {"hist:keys=a:vals=common_timestamp.hex", -EINVAL, "Couldn't create histogram for field", 17},
      {"hist:keys=a+b", -EINVAL, "Couldn't create histogram for field", 10},
      {"hist:keys=a:onmax(b).save(addr)", -EINVAL,
       "For onmax(x) or onchange(x), x must be a variable", 18},
      {"hist:keys=a:v=b:onmax($w).save(addr)", -EINVAL, "Couldn't find onmax or onchange variable",
       23},
      {"hist:keys=a:v=b:onmax($v).save(name)", -EINVAL, "Couldn't create field variable", 31},
      {"hist:keys=a:v=b:onmax($v).save(nosuch)", -EINVAL, "Couldn't create field variable", 31},
      {"hist:keys=a:v=b:onmax($v).save(x)", -EINVAL, "Invalid action param", 20},
      {"hist:keys=a:v=b:onmax($v).save(addr):onchange($v).save(addr)", -EEXIST,
       "Can't have more than one save() action per hist", 0},
      {"hist:keys=a:v=b:onmax($v).snapshot(", -EINVAL, "No closing paren found", 0},
      {"hist:keys=a:v=b:onmax($v).snapshot()", -ENODEV, nullptr, 0},
      {"hist:keys=a:v=b:onmax($v", -EINVAL, nullptr, 0},
      {"hist:keys=a:v=b:onmax($v)", -EINVAL, "No action found", 0},
  };
  for (const Case& c : cases) {
    Parsed p = parse(c.in);
    EXPECT_EQ(p.rc, c.rc) << c.in;
    if (c.message == nullptr) {
      EXPECT_FALSE(p.err.logged()) << c.in << ": " << p.err.message();
      continue;
    }
    ASSERT_TRUE(p.err.logged()) << c.in;
    EXPECT_EQ(p.err.message(), c.message) << c.in;
    EXPECT_EQ(p.err.pos, c.pos) << c.in;
    EXPECT_EQ(p.err.command, std::string(c.in)) << c.in;
    EXPECT_EQ(p.err.location, "hist:g:e");
  }
  // The entry as error_log prints it.
  Parsed p = parse("hist:keys=a:vals=zz");
  EXPECT_EQ(events::format_error_log_entry(1500000, p.err),
            "[    0.001500] hist:g:e: error: Couldn't find field\n"
            "  Command: hist:keys=a:vals=zz\n"
            "                            ^\n");
}

std::string key_of(const std::vector<uint64_t>& words) {
  std::string k;
  for (uint64_t w : words) k.append(reinterpret_cast<const char*>(&w), 8);
  return k;
}

TEST(HistTrigger, HistFileAsTheKernelPrintsIt) {
  Parsed p = parse("hist:keys=a,b.hex:vals=b:sort=b.descending");
  ASSERT_EQ(p.rc, 0);
  tracee::HistSnapshot snap;
  auto add = [&](int64_t a, uint64_t b, uint64_t hits, uint64_t sum) {
    events::HistEntry& e = snap.entries[key_of({static_cast<uint64_t>(a), b})];
    e.hitcount = hits;
    e.vals[0] = sum;
  };
  add(1, 0x10, 3, 48);
  add(-1, 0xff, 1, 255);
  snap.totals.hits = 5;
  snap.totals.drops = 1;
  EXPECT_EQ(format_hist(p.spec, false, snap, {}, 0),
            "# event histogram\n"
            "#\n"
            "# trigger info: hist:keys=a,b.hex:vals=hitcount,b:sort=b.descending:size=2048 [active]\n"
            "#\n"
            "\n"
            "{ a: 18446744073709551615, b: ff } hitcount:          1  b:        255\n"
            "{ a:          1, b: 10 } hitcount:          3  b:         48\n"
            "\n"
            "Totals:\n"
            "    Hits: 5\n"
            "    Entries: 2\n"
            "    Dropped: 1\n");

  // A stack key: one caller a line, then the values after the closing brace; and the
  // tracked maximum of onmax with its saved field on a line of its own.
  Parsed st = parse("hist:keys=stacktrace,a:vals=b:v=b:onmax($v).save(addr)");
  ASSERT_EQ(st.rc, 0) << st.err.message();
  tracee::HistSnapshot s3;
  std::vector<uint64_t> words(events::kHistStackDepth + 1, 0);
  words[0] = 0x1010;
  words[1] = 0x2020;
  words[events::kHistStackDepth] = 7;  // a
  events::HistEntry& se = s3.entries[key_of(words)];
  se.hitcount = 2;
  se.vals[0] = 40;
  se.track_value = 30;
  se.saved[0] = 0x77;
  HistSymbolizer sym = [](uint64_t addr, bool with_offset, std::string* out) {
    if (addr != 0x1010 || !with_offset) return false;
    *out = "f+0x10/0x40 [libx.so]";
    return true;
  };
  EXPECT_EQ(format_hist(st.spec, false, s3, sym, 0),
            "# event histogram\n"
            "#\n"
            "# trigger info: hist:keys=stacktrace,a:vals=hitcount,b:v=b:sort=hitcount:size=2048:"
            "onmax($v).save(addr) [active]\n"
            "#\n"
            "\n"
            "{ stacktrace:\n"
            "         f+0x10/0x40 [libx.so]\n"
            "         0x2020\n"
            ", a:          7} hitcount:          2  b:         40\n"
            "\tmax:         30  addr:        119\n"
            "\n"
            "Totals:\n"
            "    Hits: 0\n"
            "    Entries: 1\n"
            "    Dropped: 0\n");

  Parsed q = parse("hist:keys=b.log2,a.buckets=10:vals=b.percent,a.graph:pause");
  ASSERT_EQ(q.rc, 0);
  tracee::HistSnapshot s2;
  events::HistEntry& x = s2.entries[key_of({3, 20})];
  x.hitcount = 1;
  x.vals[0] = 1;
  x.vals[1] = 10;
  events::HistEntry& y = s2.entries[key_of({4, 30})];
  y.hitcount = 2;
  y.vals[0] = 3;
  y.vals[1] = 20;
  const std::string text = format_hist(q.spec, true, s2, {}, 1);
  EXPECT_EQ(text.substr(0, 2), "\n\n");
  EXPECT_NE(text.find("size=2048 [paused]\n"), std::string::npos);
  EXPECT_NE(text.find("{ b: ~ 2^3 , a: ~ 20-29 } hitcount:          1  b (%):  25.00  a: ##########          \n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("{ b: ~ 2^4 , a: ~ 30-39 } hitcount:          2  b (%):  75.00  a: ####################\n"),
            std::string::npos)
      << text;
}

TEST(HistTrigger, SymbolAndNameKeys) {
  Parsed p = parse("hist:keys=addr.sym,common_pid.execname,name");
  ASSERT_EQ(p.rc, 0);
  tracee::HistSnapshot snap;
  std::string key = key_of({0x401000, 42});
  key += std::string("worker") + std::string(events::kHistMaxStringKey - 6, '\0');
  snap.entries[key].hitcount = 7;
  snap.entries[key].comm = "prog";
  HistSymbolizer sym = [](uint64_t addr, bool, std::string* out) {
    if (addr != 0x401000) return false;
    *out = "main";
    return true;
  };
  const std::string text = format_hist(p.spec, false, snap, sym, 0);
  const std::string want = "{ addr: [401000] main" + std::string(41, ' ') +
                           ", common_pid: prog" + std::string(12, ' ') + "[        42]" +
                           ", name: worker" + std::string(44, ' ') + " } hitcount:          7\n";
  EXPECT_NE(text.find(want), std::string::npos) << text;
}

// Commands made of the language's own pieces in random order and number: each parses or
// fails with an errno, and what parses reads back as something that parses to itself.
TEST(HistTrigger, RandomCommandsParseOrFailCleanly) {
  const char* pieces[] = {"hist", "!hist", ":", " ", "keys=", "key=", "vals=", "sort=", "size=",
                          "name=", "a", "b", "name", "addr", "common_pid", "cpu", ".hex",
                          ".log2", ".buckets=", "7", "0x10", ".execname", ".percent",
                          ".descending", ",", "hitcount", "pause", "cont", "clear", " if ",
                          "a > 1", "$x", "+", "=", "(", "onmax(", "\n", "\t", "-"};
  uint64_t seed = 12345;
  auto next = [&] {
    seed = seed * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<size_t>(seed >> 33);
  };
  const events::CompiledEvent ev = event();
  for (int i = 0; i < 20000; ++i) {
    std::string cmd = i % 2 ? "hist:keys=" : "";
    for (size_t n = next() % 12; n > 0; --n) cmd += pieces[next() % std::size(pieces)];
    HistSpec spec;
    events::Diagnostic err;
    const int rc = parse_hist(cmd, ev, "g", "e", &spec, &err);
    if (rc != 0) {
      EXPECT_LT(rc, 0) << cmd;
      if (err.logged()) {
        EXPECT_LE(static_cast<size_t>(err.pos), err.command.size()) << cmd;
      }
      continue;
    }
    HistSpec again;
    ASSERT_EQ(parse_hist(spec.text(), ev, "g", "e", &again, &err), 0) << cmd << " -> " << spec.text();
    EXPECT_EQ(again.text(), spec.text()) << cmd;
  }
}

}  // namespace
}  // namespace probefs::fs
