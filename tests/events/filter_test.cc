// Filters against 05-semantics.txt: accepted filters and which records they pass, every
// invalid filter with its errno, filter-file text and error_log caret.
#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "events/compile.h"
#include "events/fetch.h"
#include "events/filter.h"
#include "events/memory_reader.h"
#include "events/parse.h"

namespace probefs::events {
namespace {

const std::string kProg = "/srv/reference/kernel-tracefs-caps/prog/probetest";

CompiledEvent compile_line(const std::string& line) {
  ParseResult r = parse_uprobe_command(line);
  EXPECT_EQ(r.status, ParseStatus::kDefine) << line;
  CompiledEvent ev;
  Diagnostic err;
  EXPECT_TRUE(compile(r.def, nullptr, &ev, &err));
  return ev;
}

CompiledEvent add3() {
  return compile_line(
      "p:uprobes/ref_add3 " + kProg +
      ":0x1370 a=%di b=%si:u32 c=%dx:s32 cx=%dx:x16 c64=%dx:s64 imm=\\123 imms=\\\"hi\"");
}

CompiledEvent mix() {
  return compile_line("p:uprobes/ref_mix " + kProg +
                      ":0x1380 x=%di:s64 str=+0(%si):string bytes=+16(%dx):u8[4] comm=$comm");
}

// The records probetest writes for iteration i (a=i, b=10*i, c=-5; str="hello-i").
struct Records {
  std::vector<std::vector<uint8_t>> recs;
  Records(const CompiledEvent& ev, int n) {
    for (int i = 0; i < n; ++i) {
      PtRegs regs{};
      regs.di = static_cast<uint64_t>(ev.fields[0].type->is_signed ? 100 + i : i);
      regs.si = ev.fields.size() > 2 && ev.fields[1].type->is_string ? 0x1000 : 10ull * i;
      regs.dx = 0xfffffffbu;
      FakeMemoryReader mem;
      std::string s = "hello-" + std::to_string(i);
      mem.map_string(0x1000, s.c_str());
      HitContext ctx;
      ctx.regs = &regs;
      ctx.pid = 4242;
      ctx.comm = "probetest";
      std::vector<uint8_t> rec(1024);
      rec.resize(write_record(view_of(ev.program), ctx, mem, rec.data(), 1024));
      recs.push_back(rec);
    }
  }
};

std::vector<int> passing(const CompiledEvent& ev, const std::string& text, int n = 5) {
  CompiledFilter f;
  Diagnostic err;
  EXPECT_TRUE(compile_filter(text, ev, &f, &err)) << text << ": " << err.message();
  Records r(ev, n);
  std::vector<int> out;
  FilterContext ctx{1, "probetest"};
  for (int i = 0; i < n; ++i)
    if (filter_match(f, r.recs[static_cast<size_t>(i)].data(),
                     static_cast<uint32_t>(r.recs[static_cast<size_t>(i)].size()), ctx))
      out.push_back(i);
  return out;
}

TEST(Filter, AcceptedFromCapture) {
  CompiledEvent a = add3();
  EXPECT_EQ(passing(a, "a == 2"), (std::vector<int>{2}));
  EXPECT_EQ(passing(a, "b >= 20 && c == -5"), (std::vector<int>{2, 3, 4}));
  EXPECT_EQ(passing(a, "common_pid != 0 || a == 1"), (std::vector<int>{0, 1, 2, 3, 4}));
  EXPECT_EQ(passing(a, "a & 1"), (std::vector<int>{1, 3}));
  EXPECT_EQ(passing(a, "b > 0x10"), (std::vector<int>{2, 3, 4}));
  EXPECT_EQ(passing(a, "a == 3"), (std::vector<int>{3}));
  CompiledEvent m = mix();
  EXPECT_EQ(passing(m, "str ~ \"hello-[13]\""), (std::vector<int>{1, 3}));
  EXPECT_EQ(passing(m, "str == \"hello-2\""), (std::vector<int>{2}));
  EXPECT_EQ(passing(m, "str ~ \"*-4\" || x == 100"), (std::vector<int>{0, 4}));
  EXPECT_EQ(passing(m, "comm == \"probetest\" && bytes == 1"), (std::vector<int>{}));
  // Beyond the capture: precedence, negation, parentheses, signed compares, cpu.
  EXPECT_EQ(passing(a, "a == 1 || a == 2 && b == 20"), (std::vector<int>{1, 2}));
  EXPECT_EQ(passing(a, "!(a == 1 || a == 2)"), (std::vector<int>{0, 3, 4}));
  EXPECT_EQ(passing(a, "c < 0 && c64 > 0"), (std::vector<int>{0, 1, 2, 3, 4}));
  EXPECT_EQ(passing(a, "cpu == 1 && a <= 1"), (std::vector<int>{0, 1}));
  EXPECT_EQ(passing(m, "str != \"hello-2\" && str ~ \"!*-0\""), (std::vector<int>{1, 3, 4}));
  EXPECT_EQ(passing(m, "str ~ 'hello-?'"), (std::vector<int>{0, 1, 2, 3, 4}));
  // The operand is cut to the field's width: for s32 c, 4294967291 is -5.
  EXPECT_EQ(passing(a, "c == 4294967291"), (std::vector<int>{0, 1, 2, 3, 4}));
  EXPECT_EQ(passing(a, "c < 4294967292"), (std::vector<int>{0, 1, 2, 3, 4}));
  // A 3-byte array has no comparison in the kernel: never true, not even with "!=".
  CompiledEvent three =
      compile_line("p:uprobes/t " + kProg + ":0x1370 a=%di chs=+0(%di):char[3]");
  EXPECT_EQ(passing(three, "chs != 1"), (std::vector<int>{}));
}

struct BadFilter {
  const char* text;    // as written
  int err;
  const char* file;    // the filter file afterwards
  int log_pos;         // error_log caret, -1 when the log says just "Error" at 0
  const char* message; // error_log message
};

TEST(Filter, InvalidFromCapture) {
  CompiledEvent a = add3();
  CompiledEvent m = mix();
  const BadFilter rows[] = {
      {"zzz == 5", EINVAL, "zzz == 5\n    ^\nparse_error: Field not found\n\n", 4,
       "Field not found"},
      {"a == ", EINVAL, "a ==\n    ^\nparse_error: Invalid value (did you forget quotes)?\n\n",
       5, "Invalid value (did you forget quotes)?"},
      {"a === 5", EINVAL,
       "a === 5\n     ^\nparse_error: Invalid value (did you forget quotes)?\n\n", 5,
       "Invalid value (did you forget quotes)?"},
      {"a == abc", EINVAL,
       "a == abc\n      ^\nparse_error: Invalid value (did you forget quotes)?\n\n", 6,
       "Invalid value (did you forget quotes)?"},
      {"str > 5", EINVAL, "str > 5\n    ^\nparse_error: Field not found\n\n", 4,
       "Field not found"},
      {"(a == 1", ENOENT, "(a == 1\n^\nparse_error: Too many '('\n\n", 0, "Too many '('"},
      {"a ~ \"x*\"", EINVAL, "a ~ \"x*\"\n     ^\nparse_error: Expecting numeric field\n\n", 5,
       "Expecting numeric field"},
      {"str == hello", EINVAL, "str == hello\n    ^\nparse_error: Field not found\n\n", 4,
       "Field not found"},
      {"&& a == 1", EPERM, "&& a == 1\nError: (0)\n\n", 0, "Error"},
      {"", EINVAL, "\nError: (0)\n\n", 0, "Error"},
      {"\n", EINVAL, "\nError: (0)\n\n", 0, "Error"},
  };
  for (const BadFilter& row : rows) {
    CompiledFilter f;
    Diagnostic err;
    EXPECT_FALSE(compile_filter(row.text, a, &f, &err)) << row.text;
    EXPECT_EQ(err.err, row.err) << row.text;
    EXPECT_EQ(filter_error_text(err), row.file) << row.text;
    EXPECT_EQ(err.pos, row.log_pos) << row.text;
    EXPECT_EQ(err.message(), row.message) << row.text;
    EXPECT_EQ(err.subsystem, kLogFilter);
  }
  CompiledFilter f;
  Diagnostic err;
  EXPECT_FALSE(compile_filter("str == 5", m, &f, &err));
  EXPECT_EQ(filter_error_text(err), "str == 5\n        ^\nparse_error: Expecting string field\n\n");
  EXPECT_EQ(err.pos, 8);
  EXPECT_EQ(format_error_log_entry(627787475000ull, err),
            "[  627.787475] event filter parse error: error: Expecting string field\n"
            "  Command: str == 5\n"
            "                   ^\n");
  // Messages the capture does not show, with the kernel's texts.
  EXPECT_FALSE(compile_filter("a == 1 )", a, &f, &err));
  EXPECT_EQ(err.message(), "Too few '('");
  EXPECT_EQ(err.err, EPERM);
  EXPECT_EQ(err.pos, 7);
  EXPECT_FALSE(compile_filter("str == \"abc", m, &f, &err));
  EXPECT_EQ(err.message(), "Missing matching quote");
  EXPECT_EQ(err.err, ESRCH);
  EXPECT_EQ(err.pos, 7);
  EXPECT_FALSE(compile_filter("(a == 1 && (b == 2", a, &f, &err));
  EXPECT_EQ(err.message(), "Too many '('");
  EXPECT_EQ(err.pos, 11);
  EXPECT_FALSE(compile_filter("a !~ \"x\"", a, &f, &err));
  EXPECT_EQ(err.message(), "Invalid operator");
  EXPECT_FALSE(compile_filter("a =! 1", a, &f, &err));
  EXPECT_EQ(err.message(), "Invalid operator");
  EXPECT_FALSE(compile_filter("b == -1", a, &f, &err));
  EXPECT_EQ(err.message(), "Illegal integer value");
  EXPECT_FALSE(compile_filter("a ~ 5", a, &f, &err));
  EXPECT_EQ(err.message(), "Illegal operation for field type");
  EXPECT_FALSE(compile_filter("str < \"a\"", m, &f, &err));
  EXPECT_EQ(err.message(), "Illegal operation for field type");
  EXPECT_FALSE(compile_filter("a == 1 b == 2", a, &f, &err));
  EXPECT_EQ(err.message(), "Too many terms in predicate expression");
  EXPECT_EQ(err.err, EPERM);
  EXPECT_EQ(err.pos, 7);
}

TEST(Filter, SubsystemError) {
  Diagnostic d = subsystem_filter_error("a == 1\n");
  EXPECT_EQ(filter_error_text(d),
            "a == 1\n^\nparse_error: Couldn't find or set field in one of a subsystem's "
            "events\n\n");
  EXPECT_EQ(format_error_log_entry(628005993000ull, d),
            "[  628.005993] event filter parse error: error: Couldn't find or set field in one "
            "of a subsystem's events\n  Command: a == 1\n           ^\n");
}

TEST(Filter, Glob) {
  auto g = [](const char* p, const char* s) {
    return glob_match(p, static_cast<uint32_t>(std::strlen(p)), s,
                      static_cast<uint32_t>(std::strlen(s)));
  };
  EXPECT_TRUE(g("hello-[13]", "hello-1"));
  EXPECT_FALSE(g("hello-[13]", "hello-2"));
  EXPECT_TRUE(g("*-4", "hello-4"));
  EXPECT_TRUE(g("h*o*", "hello-4"));
  EXPECT_TRUE(g("[a-c]x", "bx"));
  EXPECT_TRUE(g("[!a-c]x", "dx"));
  EXPECT_TRUE(g("[]a]", "]"));
  EXPECT_TRUE(g("a[b", "a[b"));  // an unclosed '[' is an ordinary character
  EXPECT_FALSE(g("a[b", "ab"));
  EXPECT_TRUE(g("a\\*", "a*"));
  EXPECT_FALSE(g("a\\*", "ab"));
  EXPECT_TRUE(g("*", ""));
  EXPECT_FALSE(g("?", ""));
}

// A filter that came over the agent link names offsets the record may not have; the
// largest ones must not wrap the bounds check around (found by the fuzz run).
TEST(Filter, OffsetsPastTheRecordNeverMatchNorRead) {
  uint8_t rec[16] = {};
  for (uint32_t offset : {0xffffffffu, 0xfffffffeu, 0xfffffffcu, 17u, 13u}) {
    for (auto source : {FilterInsn::kRecordNumber, FilterInsn::kRecordString}) {
      CompiledFilter f;
      FilterInsn in;
      in.source = source;
      in.op = source == FilterInsn::kRecordString ? FilterOp::kGlob : FilterOp::kEq;
      in.size = 4;
      in.offset = offset;
      f.patterns = "*";
      in.pattern_len = 1;
      f.insns.push_back(in);
      f.max_depth = 1;
      // A number out of the record is false; a string out of it is the empty string.
      EXPECT_EQ(filter_match(f, rec, sizeof rec, FilterContext{}),
                source == FilterInsn::kRecordString)
          << offset;
    }
  }
}

}  // namespace
}  // namespace probefs::events
