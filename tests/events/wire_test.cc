// The daemon -> agent encoding of programs and filters: round trips give identical
// records and verdicts, and no corrupted blob decodes into a program that writes outside
// its record.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "events/compile.h"
#include "events/fetch.h"
#include "events/filter.h"
#include "events/memory_reader.h"
#include "events/parse.h"
#include "events/wire.h"

namespace probefs::events {
namespace {

const char* const kLines[] = {
    "p:uprobes/ref_mix /bin/prog:0x1380 x=%di:s64 str=+0(%si):string name=+4(%dx):string "
    "bytes=+16(%dx):u8[4] bf=+0(%dx):b4@2/32 st0=$stack0 comm=$comm cnt=@+0x4038:s32 "
    "chs=+4(%dx):char[3] imms=\\\"hi\"",
    "p:uprobes/regs /bin/prog:0x1370 a=%di b=%si:u32 c=%dx:s16",
    "r:kprobes/ret main rv=$retval:s32 a=$arg2 s=+0($arg1):string[2] sym=%ip:symbol",
    "p:kprobes/deep main v=+8(+0(+16(%di))):x16 w=-8(%sp):b3@1/8[2] i=\\-5",
};

CompiledEvent build(const char* line) {
  ParseResult r = parse_dynamic_command(line);
  EXPECT_EQ(r.status, ParseStatus::kDefine) << line;
  CompiledEvent ev;
  Diagnostic err;
  EXPECT_TRUE(compile(r.def, nullptr, &ev, &err)) << line;
  return ev;
}

struct World {
  PtRegs regs{};
  FakeMemoryReader mem;
  uint64_t entry[4] = {0x1000, 0x3000, 0, 0};
  HitContext ctx;
  World() {
    regs.di = 0x1000;
    regs.si = 0x2000;
    regs.dx = 0x3000;
    regs.sp = 0x4000;
    uint8_t bytes[64];
    for (int i = 0; i < 64; ++i) bytes[i] = static_cast<uint8_t>(i * 37 + 11);
    bytes[30] = 0;
    mem.map(0x1000, bytes, sizeof bytes);
    mem.map_string(0x2000, "hello");
    mem.map(0x3000, bytes, sizeof bytes);
    mem.map(0x3ff0, bytes, sizeof bytes);
    ctx.regs = &regs;
    ctx.ip = 0x401370;
    ctx.comm = "wire";
    ctx.entry_args = entry;
  }
  std::vector<uint8_t> run(const FetchProgram& p) {
    uint32_t cap = p.max_record_size() > 8192 ? 8192 : p.max_record_size();
    std::vector<uint8_t> rec(cap);  // exactly cap: ASan catches any write past it
    rec.resize(write_record(view_of(p), ctx, mem, rec.data(), cap));
    return rec;
  }
};

TEST(Wire, ProgramRoundTrip) {
  World w;
  for (const char* line : kLines) {
    CompiledEvent ev = build(line);
    ASSERT_TRUE(validate_program(ev.program)) << line;
    std::vector<uint8_t> blob = encode_program(ev.program);
    FetchProgram back;
    ASSERT_TRUE(decode_program(blob.data(), blob.size(), &back)) << line;
    EXPECT_EQ(w.run(back), w.run(ev.program)) << line;
    EXPECT_EQ(encode_program(back), blob);
    // Any shorter blob is refused, and so is one with trailing bytes.
    for (size_t n = 0; n < blob.size(); ++n)
      EXPECT_FALSE(decode_program(blob.data(), n, &back)) << line << " cut at " << n;
    blob.push_back(0);
    EXPECT_FALSE(decode_program(blob.data(), blob.size(), &back));
  }
}

TEST(Wire, CorruptProgramsStayInsideTheRecord) {
  World w;
  int decoded = 0, refused = 0;
  for (const char* line : kLines) {
    std::vector<uint8_t> blob = encode_program(build(line).program);
    for (size_t i = 0; i < blob.size(); ++i) {
      for (uint8_t x : {0x01, 0x02, 0x10, 0x80, 0xff}) {
        std::vector<uint8_t> bad = blob;
        bad[i] ^= x;
        FetchProgram p;
        if (!decode_program(bad.data(), bad.size(), &p)) {
          ++refused;
          continue;
        }
        ++decoded;
        w.run(p);  // must stay inside the record (checked by ASan in the sanitizer build)
      }
    }
  }
  EXPECT_GT(refused, 0);
  EXPECT_GT(decoded, 0);
}

TEST(Wire, FilterRoundTrip) {
  CompiledEvent ev = build(kLines[0]);
  World w;
  std::vector<uint8_t> rec = w.run(ev.program);
  for (const char* text : {"x == 4096 && str ~ \"hel*\"", "!(cnt > 3) || comm == \"wire\"",
                           "bytes & 0xff00", "cpu == 0"}) {
    CompiledFilter f;
    Diagnostic err;
    ASSERT_TRUE(compile_filter(text, ev, &f, &err)) << text << ": " << err.message();
    std::vector<uint8_t> blob = encode_filter(f);
    CompiledFilter back;
    ASSERT_TRUE(decode_filter(blob.data(), blob.size(), &back)) << text;
    EXPECT_EQ(back.text, f.text);
    FilterContext ctx{0, "wire"};
    EXPECT_EQ(filter_match(back, rec.data(), static_cast<uint32_t>(rec.size()), ctx),
              filter_match(f, rec.data(), static_cast<uint32_t>(rec.size()), ctx))
        << text;
    for (size_t n = 0; n < blob.size(); ++n)
      EXPECT_FALSE(decode_filter(blob.data(), n, &back)) << text;
    for (size_t i = 0; i < blob.size(); ++i) {
      std::vector<uint8_t> bad = blob;
      bad[i] ^= 0x41;
      if (decode_filter(bad.data(), bad.size(), &back))
        filter_match(back, rec.data(), static_cast<uint32_t>(rec.size()), ctx);
    }
  }
}

}  // namespace
}  // namespace probefs::events
