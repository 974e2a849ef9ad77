// The synthetic_events language (events/synthetic.h): definitions, their read-back and
// record layout, and every error the kernel's trace_events_synth.c logs, with its caret.
// Expected texts follow the kernel 6.1 source and Documentation/trace/histogram.rst.
#include "events/synthetic.h"

#include <gtest/gtest.h>

#include <random>
#include <string>

namespace probefs::events {
namespace {

SynthEvent defined(std::string_view line) {
  SynthResult r = parse_synthetic_command(line);
  EXPECT_EQ(r.status, SynthStatus::kDefine) << line << ": " << r.error.message();
  return r.event;
}

TEST(Synthetic, DefinitionsReadBackAsTheKernelListsThem) {
  EXPECT_EQ(synthetic_description(defined("wakeup_latency u64 lat; pid_t pid; int prio")),
            "wakeup_latency\tu64 lat; pid_t pid; int prio");
  // Blanks anywhere, fields without ';' (the old syntax), unsigned types, strings.
  EXPECT_EQ(synthetic_description(defined("  \tx   u64  a  unsigned int b;char c[];  char d[16]")),
            "x\tu64 a; unsigned int b; char[] c; char[16] d");
  EXPECT_EQ(synthetic_description(defined("y long st[]")), "y\tlong[] st");
  SynthResult removal = parse_synthetic_command("!wakeup_latency");
  EXPECT_EQ(removal.status, SynthStatus::kRemove);
  EXPECT_EQ(removal.remove, "wakeup_latency");
  EXPECT_EQ(parse_synthetic_command("   ").status, SynthStatus::kEmpty);
}

TEST(Synthetic, LayoutIsAU64SlotPerFieldAndStringsKeptInPlaceTake256Bytes) {
  const SynthEvent ev = defined("e u8 a; char s[16]; char d[]; s16 b; unsigned long c");
  ASSERT_EQ(ev.fields.size(), 5u);
  EXPECT_EQ(ev.fields[0].offset, 8u);
  EXPECT_EQ(ev.fields[1].offset, 16u);
  EXPECT_EQ(ev.fields[2].offset, 16u + 256u);
  EXPECT_EQ(ev.fields[3].offset, 16u + 256u + 8u);
  EXPECT_EQ(ev.fields[4].offset, 16u + 256u + 16u);
  EXPECT_EQ(format_file(synthetic_compiled(ev), 7),
            "name: e\nID: 7\nformat:\n"
            "\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n"
            "\tfield:unsigned char common_flags;\toffset:2;\tsize:1;\tsigned:0;\n"
            "\tfield:unsigned char common_preempt_count;\toffset:3;\tsize:1;\tsigned:0;\n"
            "\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;\n\n"
            "\tfield:u8 a;\toffset:8;\tsize:1;\tsigned:0;\n"
            "\tfield:char s[];\toffset:16;\tsize:16;\tsigned:1;\n"
            "\tfield:__data_loc char[] d;\toffset:272;\tsize:8;\tsigned:1;\n"
            "\tfield:s16 b;\toffset:280;\tsize:2;\tsigned:1;\n"
            "\tfield:unsigned long c;\toffset:288;\tsize:8;\tsigned:0;\n\n"
            "print fmt: \"a=%u, s=%s, d=%s, b=%d, c=%lu\", REC->a, REC->s, __get_str(d), "
            "REC->b, REC->c\n");
}

TEST(Synthetic, EveryFieldTypeHasTheKernelsSizeSignAndConversion) {
  struct Case {
    const char* decl;
    uint32_t size;
    bool is_signed;
    const char* fmt;
  } cases[] = {
      {"s64", 8, true, "%lld"},   {"u64", 8, false, "%llu"}, {"s32", 4, true, "%d"},
      {"u32", 4, false, "%u"},    {"s16", 2, true, "%d"},    {"u16", 2, false, "%u"},
      {"s8", 1, true, "%d"},      {"u8", 1, false, "%u"},    {"char", 1, true, "%d"},
      {"unsigned char", 1, false, "%u"}, {"int", 4, true, "%d"},
      {"unsigned int", 4, false, "%u"},  {"long", 8, true, "%ld"},
      {"unsigned long", 8, false, "%lu"}, {"bool", 1, true, "%d"}, {"pid_t", 4, true, "%d"},
      {"gfp_t", 4, false, "%x"},
  };
  for (const Case& c : cases) {
    const SynthEvent ev = defined(std::string("t ") + c.decl + " f");
    ASSERT_EQ(ev.fields.size(), 1u) << c.decl;
    EXPECT_EQ(ev.fields[0].size, c.size) << c.decl;
    EXPECT_EQ(ev.fields[0].is_signed, c.is_signed) << c.decl;
    EXPECT_EQ(synthetic_compiled(ev).print_fmt, std::string("\"f=") + c.fmt + "\", REC->f")
        << c.decl;
  }
}

TEST(Synthetic, ErrorsAreTheKernelsWithTheCaretWhereTheWordFirstOccurs) {
  struct Case {
    const char* line;
    ErrorCode code;
    int pos;
  } cases[] = {
      {"lat", ErrorCode::kSynthInvalidCmd, 0},
      {"lat u64", ErrorCode::kSynthInvalidCmd, 0},
      {"lat u64;x y", ErrorCode::kSynthInvalidCmd, 0},
      {"1lat u64 x", ErrorCode::kSynthBadName, 0},
      {"lat u64 x-y", ErrorCode::kSynthBadName, 8},
      {"lat u65 x", ErrorCode::kSynthInvalidType, 4},
      {"lat u64 a; u64", ErrorCode::kSynthInvalidField, 4},
      {"lat u64 a; unsigned b", ErrorCode::kSynthIncompleteType, 11},
      {"lat char s[300]", ErrorCode::kSynthInvalidArraySpec, 9},
      {"lat char s[1000]", ErrorCode::kSynthInvalidArraySpec, 9},
      {"lat char s[x]", ErrorCode::kSynthInvalidArraySpec, 9},
      {"lat u64 x[2]", ErrorCode::kSynthInvalidType, 4},
      {"lat char[300] s", ErrorCode::kSynthInvalidType, 4},
      // Leading blanks are not part of the command error_log shows.
      {"   lat u65 x", ErrorCode::kSynthInvalidType, 4},
  };
  for (const Case& c : cases) {
    SynthResult r = parse_synthetic_command(c.line);
    ASSERT_EQ(r.status, SynthStatus::kError) << c.line;
    EXPECT_EQ(r.error.code, c.code) << c.line << ": " << r.error.message();
    EXPECT_EQ(r.error.pos, c.pos) << c.line;
    EXPECT_EQ(r.error.err, EINVAL) << c.line;
    EXPECT_EQ(r.error.subsystem, kLogSynth);
    EXPECT_EQ(r.error.command, std::string_view(c.line).substr(std::string_view(c.line).find_first_not_of(' ')));
  }
  std::string many = "m";
  for (int i = 0; i < 65; ++i) many += " u64 f" + std::to_string(i) + ";";
  SynthResult r = parse_synthetic_command(many);
  EXPECT_EQ(r.error.code, ErrorCode::kSynthTooManyFields);
  EXPECT_EQ(r.error.pos, 0);
  many = "m";
  for (int i = 0; i < 64; ++i) many += " u64 f" + std::to_string(i) + ";";
  EXPECT_EQ(parse_synthetic_command(many).status, SynthStatus::kDefine);
}

TEST(Synthetic, DynamicEventsFormTakesTheSyntheticGroupOnly) {
  EXPECT_TRUE(is_synthetic_dynamic("  s:x u64 a"));
  EXPECT_FALSE(is_synthetic_dynamic("p:x a"));
  SynthResult r = parse_synthetic_dynamic("s:synthetic/lat u64 lat; pid_t pid");
  ASSERT_EQ(r.status, SynthStatus::kDefine);
  EXPECT_EQ(synthetic_description(r.event), "lat\tu64 lat; pid_t pid");
  r = parse_synthetic_dynamic("s:lat2 u64 lat");
  ASSERT_EQ(r.status, SynthStatus::kDefine);
  EXPECT_EQ(r.event.name, "lat2");
  struct Case {
    const char* line;
    ErrorCode code;
    int pos;
  } cases[] = {
      {"s:dyn/lat u64 lat", ErrorCode::kSynthInvalidDynCmd, 0},
      {"s:lat", ErrorCode::kSynthInvalidCmd, 0},
      {"s:lat u64", ErrorCode::kSynthInvalidCmd, 0},
      {"s:synthetic/lat u65 x", ErrorCode::kSynthInvalidType, 16},
      {"s:synthetic/9lat u64 x", ErrorCode::kSynthBadName, 12},
  };
  for (const Case& c : cases) {
    r = parse_synthetic_dynamic(c.line);
    ASSERT_EQ(r.status, SynthStatus::kError) << c.line;
    EXPECT_EQ(r.error.code, c.code) << c.line;
    EXPECT_EQ(r.error.pos, c.pos) << c.line;
    EXPECT_EQ(r.error.command, c.line);
  }
}

// Random lines never crash the parser, and a definition it takes reads back into one it
// takes again the same way.
TEST(Synthetic, RandomLinesParseOrFailCleanly) {
  std::mt19937 rng(7);
  const char* pieces[] = {"u64", "s32", "unsigned", "char", "int", "x", "y[", "]", "[16]",
                          ";", " ", "\t", "!", "long", "z[]", "q", "_a", "9", "[300]"};
  for (int i = 0; i < 20000; ++i) {
    std::string line = "e ";
    const int n = static_cast<int>(rng() % 8);
    for (int k = 0; k < n; ++k) line += pieces[rng() % (sizeof pieces / sizeof *pieces)];
    SynthResult r = parse_synthetic_command(line);
    if (r.status != SynthStatus::kDefine) continue;
    std::string back = synthetic_description(r.event);
    back[back.find('\t')] = ' ';
    SynthResult again = parse_synthetic_command(back);
    ASSERT_EQ(again.status, SynthStatus::kDefine) << line << " -> " << back;
    EXPECT_EQ(synthetic_description(again.event), synthetic_description(r.event));
  }
}

}  // namespace
}  // namespace probefs::events
