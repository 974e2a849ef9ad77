// Records as hostile data: check_record's verdict on what the record writer produces and
// on what it cannot produce (strings on the same bytes, 64 KiB __data_locs, locs past the
// end, a cut fixed part, overlapping string-array entries), the trace line each of those
// formats to, and what filters read of them. The sanitizer build runs these too, so a
// read or write outside a record fails there even where the text would look right.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "events/compile.h"
#include "events/fetch.h"
#include "events/filter.h"
#include "events/memory_reader.h"
#include "events/output.h"
#include "events/parse.h"
#include "events/record.h"

namespace probefs::events {
namespace {

CompiledEvent compile_line(const std::string& line) {
  ParseResult r = parse_dynamic_command(line);
  EXPECT_EQ(r.status, ParseStatus::kDefine) << line << ": " << r.error.message();
  CompiledEvent ev;
  Diagnostic err;
  EXPECT_TRUE(compile(r.def, nullptr, &ev, &err)) << line;
  return ev;
}

const FieldLayout& field(const CompiledEvent& ev, const std::string& name) {
  for (const FieldLayout& f : ev.fields)
    if (f.name == name) return f;
  ADD_FAILURE() << "no field " << name;
  return ev.fields.front();
}

uint32_t loc_of(const std::vector<uint8_t>& rec, const FieldLayout& f, uint32_t i = 0) {
  uint32_t loc;
  std::memcpy(&loc, rec.data() + f.offset + 4 * i, 4);
  return loc;
}

void set_loc(std::vector<uint8_t>& rec, const FieldLayout& f, uint32_t i, uint32_t loc) {
  std::memcpy(rec.data() + f.offset + 4 * i, &loc, 4);
}

uint32_t make_loc(uint32_t len, uint32_t off) { return len << 16 | off; }

// An event with an integer, two strings and a string array of three, and one hit of it
// as the agent records it: a="hello", s="world", arr={"x","yy","zzz"}.
struct Strings {
  CompiledEvent ev = compile_line(
      "p:uprobes/rec /bin/true:0x1370 a=%di:u32 s=+0(%si):string t=+0(%dx):ustring "
      "arr=+0(%cx):string[3]");
  std::vector<uint8_t> rec;

  Strings() {
    PtRegs regs{};
    HitContext hc;
    hc.regs = &regs;
    hc.ip = 0x55ded62af370;
    hc.pid = 5455;
    FakeMemoryReader mem;
    regs.di = 7;
    regs.si = 0x10000;
    regs.dx = 0x20000;
    regs.cx = 0x30000;
    mem.map_string(0x10000, "hello");
    mem.map_string(0x20000, "world");
    const uint64_t table[3] = {0x40000, 0x40010, 0x40020};
    mem.map(0x30000, table, sizeof table);
    mem.map_string(0x40000, "x");
    mem.map_string(0x40010, "yy");
    mem.map_string(0x40020, "zzz");
    rec.resize(ev.program.max_record_size());
    uint32_t n = write_record(view_of(ev.program), hc, mem, rec.data(),
                              static_cast<uint32_t>(rec.size()));
    rec.resize(n);
  }

  std::string line(const std::vector<uint8_t>& r, uint32_t len) const {
    std::string out;
    EXPECT_TRUE(format_trace_line(out, ev, LineContext{"probetest", 5455, 1, 426361180000},
                                  r.data(), len));
    return out;
  }
  std::string line(const std::vector<uint8_t>& r) const {
    return line(r, static_cast<uint32_t>(r.size()));
  }
  RecordFault check(const std::vector<uint8_t>& r) const {
    return check_record(ev, r.data(), static_cast<uint32_t>(r.size()));
  }
};

const char kPrefix[] = "       probetest-5455    [001] .....   426.361180: rec: (0x55ded62af370) ";

TEST(CheckRecord, WellFormedRecordFitsAndPrintsAsBefore) {
  Strings s;
  EXPECT_EQ(s.rec.size(), s.ev.program.fixed_size + 6 + 6 + 2 + 3 + 4);
  EXPECT_EQ(s.check(s.rec), RecordFault::kFits);
  EXPECT_EQ(s.line(s.rec),
            std::string(kPrefix) + "a=7 s=\"hello\" t=\"world\" arr={\"x\",\"yy\",\"zzz\"}\n");
}

TEST(CheckRecord, FaultsTheWriterRecordsFit) {
  CompiledEvent ev = compile_line(
      "p:uprobes/rec /bin/true:0x1370 a=%di:u32 s=+0(%si):string t=+0(%dx):string "
      "arr=+0(%cx):string[3] imm=\\\"data\"");
  PtRegs regs{};
  HitContext hc;
  hc.regs = &regs;
  FakeMemoryReader mem;  // nothing mapped: every string faults
  regs.dx = 0x20000;
  mem.map_string(0x20000, "only");
  std::vector<uint8_t> rec(ev.program.max_record_size());
  uint32_t n = write_record(view_of(ev.program), hc, mem, rec.data(),
                            static_cast<uint32_t>(rec.size()));
  EXPECT_EQ(n, ev.program.fixed_size + 5);
  EXPECT_EQ(check_record(ev, rec.data(), n), RecordFault::kFits);
  std::string out;
  ASSERT_TRUE(format_trace_line(out, ev, LineContext{"t", 1, 0, 0}, rec.data(), n));
  EXPECT_NE(out.find(" s=(fault) t=\"only\" arr={(fault),(fault),(fault)} imm=(fault)\n"),
            std::string::npos)
      << out;
  // A record cut short by the room there was: the strings that did not fit are faults.
  n = write_record(view_of(ev.program), hc, mem, rec.data(), ev.program.fixed_size + 3);
  EXPECT_LE(n, ev.program.fixed_size + 3);
  EXPECT_EQ(check_record(ev, rec.data(), n), RecordFault::kFits);
}

TEST(CheckRecord, TwoLocsOnTheSameBytes) {
  Strings s;
  std::vector<uint8_t> r = s.rec;
  set_loc(r, field(s.ev, "t"), 0, loc_of(r, field(s.ev, "s")));
  EXPECT_EQ(s.check(r), RecordFault::kStringOrder);
  // The bytes print once; the second name for them is a fault.
  EXPECT_EQ(s.line(r),
            std::string(kPrefix) + "a=7 s=\"hello\" t=(fault) arr={\"x\",\"yy\",\"zzz\"}\n");
}

TEST(CheckRecord, StringsOutOfOrder) {
  Strings s;
  std::vector<uint8_t> r = s.rec;
  const uint32_t ls = loc_of(r, field(s.ev, "s")), lt = loc_of(r, field(s.ev, "t"));
  set_loc(r, field(s.ev, "s"), 0, lt);
  set_loc(r, field(s.ev, "t"), 0, ls);
  EXPECT_EQ(s.check(r), RecordFault::kStringOrder);
  EXPECT_EQ(s.line(r),
            std::string(kPrefix) + "a=7 s=\"world\" t=(fault) arr={\"x\",\"yy\",\"zzz\"}\n");
}

TEST(CheckRecord, StringArrayWithOverlappingEntries) {
  Strings s;
  std::vector<uint8_t> r = s.rec;
  const FieldLayout& arr = field(s.ev, "arr");
  const uint32_t first = loc_of(r, arr, 0);
  set_loc(r, arr, 1, first);                                    // the same bytes
  set_loc(r, arr, 2, make_loc(3, (first & 0xffff) + 1));        // inside entry 1's
  EXPECT_EQ(s.check(r), RecordFault::kStringOrder);
  EXPECT_EQ(s.line(r),
            std::string(kPrefix) + "a=7 s=\"hello\" t=\"world\" arr={\"x\",(fault),(fault)}\n");
}

TEST(CheckRecord, LocPastTheEnd) {
  Strings s;
  std::vector<uint8_t> r = s.rec;
  const uint32_t len = static_cast<uint32_t>(r.size());
  set_loc(r, field(s.ev, "arr"), 2, make_loc(5, len - 2));
  EXPECT_EQ(s.check(r), RecordFault::kStringOutside);
  EXPECT_EQ(s.line(r),
            std::string(kPrefix) + "a=7 s=\"hello\" t=\"world\" arr={\"x\",\"yy\",(fault)}\n");
  set_loc(r, field(s.ev, "arr"), 2, make_loc(1, len));  // one past the end
  EXPECT_EQ(s.check(r), RecordFault::kStringOutside);
  set_loc(r, field(s.ev, "arr"), 2, make_loc(0xffff, 0xffff));
  EXPECT_EQ(s.check(r), RecordFault::kStringOutside);
  EXPECT_EQ(s.line(r),
            std::string(kPrefix) + "a=7 s=\"hello\" t=\"world\" arr={\"x\",\"yy\",(fault)}\n");
}

TEST(CheckRecord, LocIntoTheFixedPart) {
  Strings s;
  std::vector<uint8_t> r = s.rec;
  set_loc(r, field(s.ev, "s"), 0, make_loc(8, 0));  // the header, as a string
  EXPECT_EQ(s.check(r), RecordFault::kStringOutside);
  EXPECT_EQ(s.line(r),
            std::string(kPrefix) + "a=7 s=(fault) t=\"world\" arr={\"x\",\"yy\",\"zzz\"}\n");
}

// A __data_loc of 65,535 bytes: past the end of a short record, and inside a record long
// enough to hold it. Either way it prints as a fault, and the line stays short.
TEST(CheckRecord, SixtyFourKiBLoc) {
  Strings s;
  std::vector<uint8_t> r = s.rec;
  const uint32_t fixed = s.ev.program.fixed_size;
  set_loc(r, field(s.ev, "s"), 0, make_loc(0xffff, fixed));
  EXPECT_EQ(s.check(r), RecordFault::kStringOutside);
  EXPECT_EQ(s.line(r),
            std::string(kPrefix) + "a=7 s=(fault) t=\"world\" arr={\"x\",\"yy\",\"zzz\"}\n");

  // An event whose program may write that much: 17 strings of up to 4 KiB.
  CompiledEvent big =
      compile_line("p:uprobes/big /bin/true:0x1370 s=+0(%si):string arr=+0(%cx):string[16]");
  const uint32_t bfixed = big.program.fixed_size;
  std::vector<uint8_t> b(bfixed + 0xffff, 'a');
  std::memset(b.data(), 0, bfixed);
  uint32_t loc = make_loc(0xffff, bfixed);
  std::memcpy(b.data() + big.fields[0].offset, &loc, 4);
  const uint32_t blen = static_cast<uint32_t>(b.size());
  EXPECT_LE(blen, max_record_len(big));
  EXPECT_EQ(check_record(big, b.data(), blen), RecordFault::kStringTooLong);
  std::string out;
  ASSERT_TRUE(format_trace_line(out, big, LineContext{"t", 1, 0, 0}, b.data(), blen));
  EXPECT_NE(out.find(" s=(fault) arr={(fault),(fault),"), std::string::npos) << out;
  EXPECT_LT(out.size(), 512u);
  // A filter compares it as the empty string it prints as, reading no more of it.
  CompiledFilter f;
  Diagnostic err;
  ASSERT_TRUE(compile_filter("s == \"\"", big, &f, &err)) << err.message();
  EXPECT_TRUE(filter_match(f, b.data(), blen, FilterContext{}));
}

// Seventeen entries on the same 4,095 bytes: each would have printed them all again.
TEST(CheckRecord, ManyLocsOnOneLongString) {
  CompiledEvent big = compile_line("p:uprobes/big /bin/true:0x1370 s=+0(%si):string[17]");
  const uint32_t fixed = big.program.fixed_size;
  std::vector<uint8_t> b(fixed + 4096, 'a');
  std::memset(b.data(), 0, fixed);
  b.back() = 0;
  for (uint32_t i = 0; i < 17; ++i) {
    uint32_t loc = make_loc(4096, fixed);
    std::memcpy(b.data() + big.fields[0].offset + 4 * i, &loc, 4);
  }
  const uint32_t len = static_cast<uint32_t>(b.size());
  EXPECT_EQ(check_record(big, b.data(), len), RecordFault::kStringOrder);
  std::string out;
  ASSERT_TRUE(format_trace_line(out, big, LineContext{"t", 1, 0, 0}, b.data(), len));
  std::string want = " s={\"" + std::string(4095, 'a') + "\"";
  for (int i = 1; i < 17; ++i) want += ",(fault)";
  want += "}\n";
  ASSERT_GE(out.size(), want.size());
  EXPECT_EQ(out.substr(out.size() - want.size()), want);
}

TEST(CheckRecord, LengthBelowTheFixedPart) {
  Strings s;
  const uint32_t fixed = s.ev.program.fixed_size;
  for (uint32_t len : {0u, 7u, 8u, fixed - 1}) {
    EXPECT_EQ(check_record(s.ev, s.rec.data(), len), RecordFault::kShort) << len;
    std::string out = "kept";
    EXPECT_FALSE(format_trace_line(out, s.ev, LineContext{"t", 1, 0, 0}, s.rec.data(), len));
    EXPECT_EQ(out, "kept");
  }
  // The fixed part alone: every string is past the end.
  EXPECT_EQ(check_record(s.ev, s.rec.data(), fixed), RecordFault::kStringOutside);
  EXPECT_EQ(s.line(s.rec, fixed),
            std::string(kPrefix) + "a=7 s=(fault) t=(fault) arr={(fault),(fault),(fault)}\n");
}

TEST(CheckRecord, TrailingBytesAndTooLong) {
  Strings s;
  std::vector<uint8_t> r = s.rec;
  r.push_back(0);
  EXPECT_EQ(s.check(r), RecordFault::kTrailing);
  // Nothing names the extra byte: the line is the record's.
  EXPECT_EQ(s.line(r), s.line(s.rec));
  // A gap between two strings is no layout the writer makes either.
  r = s.rec;
  r.insert(r.begin() + (loc_of(r, field(s.ev, "t")) & 0xffff), 0);
  for (const char* name : {"t", "arr"}) {
    const FieldLayout& f = field(s.ev, name);
    for (uint32_t i = 0; i < (f.count ? f.count : 1); ++i) set_loc(r, f, i, loc_of(r, f, i) + 1);
  }
  EXPECT_EQ(s.check(r), RecordFault::kStringOrder);
  r.assign(max_record_len(s.ev) + 1, 0);
  EXPECT_EQ(s.check(r), RecordFault::kTooLong);
  // Without strings the record is the fixed part exactly.
  CompiledEvent plain = compile_line("p:uprobes/plain /bin/true:0x1370 a=%di b=+0(%si):u8[4]");
  std::vector<uint8_t> p(plain.program.fixed_size + 1, 0);
  EXPECT_EQ(check_record(plain, p.data(), plain.program.fixed_size), RecordFault::kFits);
  EXPECT_EQ(check_record(plain, p.data(), plain.program.fixed_size + 1), RecordFault::kTooLong);
}

TEST(CheckRecord, SymstrIsEightBytes) {
  CompiledEvent ev = compile_line("p:kprobes/sy do_thing s=+0(%si):symstr n=%di:s32");
  const uint32_t fixed = ev.program.fixed_size;
  std::vector<uint8_t> r(fixed + 8, 0);
  uint32_t loc = make_loc(8, fixed);
  std::memcpy(r.data() + ev.fields[0].offset, &loc, 4);
  EXPECT_EQ(check_record(ev, r.data(), fixed + 8), RecordFault::kFits);
  r.push_back(0);
  loc = make_loc(9, fixed);
  std::memcpy(r.data() + ev.fields[0].offset, &loc, 4);
  EXPECT_EQ(check_record(ev, r.data(), fixed + 9), RecordFault::kSymstrSize);
}

// A filter on a string reads only inside the record, however its __data_loc lies.
TEST(CheckRecord, FiltersReadInsideTheRecord) {
  Strings s;
  CompiledFilter f;
  Diagnostic err;
  ASSERT_TRUE(compile_filter("s == \"hello\" && t ~ \"w*\"", s.ev, &f, &err))
      << err.message();
  EXPECT_TRUE(filter_match(f, s.rec.data(), static_cast<uint32_t>(s.rec.size()), {}));
  std::vector<uint8_t> r = s.rec;
  const uint32_t len = static_cast<uint32_t>(r.size());
  set_loc(r, field(s.ev, "s"), 0, make_loc(0xffff, len - 1));
  ASSERT_TRUE(compile_filter("s == \"hello\"", s.ev, &f, &err));
  EXPECT_FALSE(filter_match(f, r.data(), len, {}));
  ASSERT_TRUE(compile_filter("s == \"\"", s.ev, &f, &err));
  EXPECT_TRUE(filter_match(f, r.data(), len, {}));
  // A record shorter than the field's __data_loc itself.
  EXPECT_TRUE(filter_match(f, r.data(), field(s.ev, "s").offset + 2, {}));
}

TEST(CheckRecord, FaultNames) {
  EXPECT_STREQ(record_fault_name(RecordFault::kFits), "fits");
  EXPECT_STREQ(record_fault_name(RecordFault::kStringOrder), "string_order");
  EXPECT_STREQ(record_fault_name(RecordFault::kTrailing), "trailing");
}

}  // namespace
}  // namespace probefs::events
