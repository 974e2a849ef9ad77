// Lines of synthetic events (events/output.h): format_trace_line() prints a synthetic
// event's record as Linux 6.1's print_synth_event() (kernel/trace/trace_events_synth.c)
// does: "NAME: " then each field as synth_field_fmt() of its type, joined by blanks, the
// number cast to the field's size first; a gfp_t with its flag names; strings kept in
// place or behind a __data_loc; stacks as "STACK:" and one "=> addr" line per address.
// Expected texts follow that source, its quirks included.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "events/output.h"
#include "events/synthetic.h"

namespace probefs::events {
namespace {

using namespace std::string_literals;

CompiledEvent synth(std::string_view command) {
  SynthResult r = parse_synthetic_command(command);
  EXPECT_EQ(r.status, SynthStatus::kDefine) << command << ": " << r.error.message();
  return synthetic_compiled(r.event);
}

// comm "synth-test", pid 4242, CPU 3, 123.456789 s (rounded from nanoseconds).
const LineContext kCtx{"synth-test", 4242, 3, 123456789012};
const std::string kPrefix = "      synth-test-4242    [003] .....   123.456789: ";

// A record of `ev`: the common header (type 301, pid 4242), zeroed slots, then whatever
// dynamic data is appended.
class Record {
 public:
  explicit Record(const CompiledEvent& ev) : ev_(ev), b_(ev.program.fixed_size, 0) {
    const uint16_t type = 301;
    const int32_t pid = 4242;
    std::memcpy(&b_[0], &type, 2);
    std::memcpy(&b_[4], &pid, 4);
  }
  Record& num(size_t field, uint64_t v) {
    std::memcpy(&b_[ev_.fields.at(field).offset], &v, 8);
    return *this;
  }
  // Bytes into a string kept in place (its slot is 256 bytes).
  Record& text(size_t field, std::string_view s) {
    std::memcpy(&b_[ev_.fields.at(field).offset], s.data(), s.size());
    return *this;
  }
  Record& loc(size_t field, uint32_t off, uint32_t n) {
    const uint32_t v = n << 16 | off;
    std::memcpy(&b_[ev_.fields.at(field).offset], &v, 4);
    return *this;
  }
  // Appends `bytes` to the dynamic part and points the field's __data_loc at them.
  Record& dyn(size_t field, std::string_view bytes) {
    const uint32_t off = static_cast<uint32_t>(b_.size());
    b_.insert(b_.end(), bytes.begin(), bytes.end());
    return loc(field, off, static_cast<uint32_t>(bytes.size()));
  }
  Record& stack(size_t field, const std::vector<uint64_t>& addrs) {
    std::string bytes(addrs.size() * 8, '\0');
    if (!addrs.empty()) std::memcpy(bytes.data(), addrs.data(), bytes.size());
    return dyn(field, bytes);
  }
  const std::vector<uint8_t>& bytes() const { return b_; }

 private:
  const CompiledEvent& ev_;
  std::vector<uint8_t> b_;
};

// The line, from a copy of the record in a heap block of exactly its size.
std::string line(const CompiledEvent& ev, const Record& r, Symbolizer* sym = nullptr) {
  const std::vector<uint8_t>& b = r.bytes();
  std::unique_ptr<uint8_t[]> rec(new uint8_t[b.size()]);
  std::memcpy(rec.get(), b.data(), b.size());
  std::string out;
  EXPECT_TRUE(format_trace_line(out, ev, kCtx, rec.get(), static_cast<uint32_t>(b.size()), sym));
  return out;
}

class FakeSymbols : public Symbolizer {
 public:
  bool lookup(uint64_t addr, SymbolInfo* out) override {
    if (addr < 0x400000 || addr >= 0x401000) return false;
    out->name = "main";
    out->offset = addr - 0x400000;
    out->size = 0x1000;
    out->module = "prog";
    return true;
  }
};

TEST(SynthOutput, EveryNumericTypePrintsWithItsConversionAfterTheCastToItsSize) {
  const CompiledEvent ev = synth(
      "nums s64 a; u64 b; s32 c; u32 d; s16 e; u16 f; s8 g; u8 h; char i; unsigned char j; "
      "int k; unsigned int l; long m; unsigned long n; bool o; pid_t p");
  ASSERT_EQ(ev.fields.size(), 16u);
  // -1 stored as the whole u64 everywhere: (u8)/(u16) of it is 255/65535, promoted before
  // %d prints it, while (u32) of it is -1 again for %d.
  Record minus(ev);
  for (size_t i = 0; i < 16; ++i) minus.num(i, ~uint64_t{0});
  EXPECT_EQ(line(ev, minus),
            kPrefix +
                "nums: a=-1 b=18446744073709551615 c=-1 d=4294967295 e=65535 f=65535 g=255 "
                "h=255 i=255 j=255 k=-1 l=4294967295 m=-1 n=18446744073709551615 o=255 p=-1\n");
  // Small values as a writer stores them (sign-extended to 64 bits for the signed ones).
  Record small(ev);
  const int64_t values[] = {-5, 5, -6, 6, -7, 7, -8, 8, -9, 9, -10, 10, -11, 11, 1, -12};
  for (size_t i = 0; i < 16; ++i) small.num(i, static_cast<uint64_t>(values[i]));
  EXPECT_EQ(line(ev, small),
            kPrefix +
                "nums: a=-5 b=5 c=-6 d=6 e=65529 f=7 g=248 h=8 i=247 j=9 k=-10 l=10 m=-11 "
                "n=11 o=1 p=-12\n");
  Record zero(ev);
  EXPECT_EQ(line(ev, zero), kPrefix +
                                "nums: a=0 b=0 c=0 d=0 e=0 f=0 g=0 h=0 i=0 j=0 k=0 l=0 m=0 n=0 "
                                "o=0 p=0\n");
}

TEST(SynthOutput, TheCastKeepsOnlyTheFieldsBytesOfItsSlot) {
  const CompiledEvent ev = synth("cast u8 a; s16 b; s32 c; u32 d; s64 e; s64 f; pid_t g; bool h");
  Record r(ev);
  r.num(0, 0x1234567890abcd01)   // (u8) 0x01
      .num(1, 0xffff00000000fffe)  // (u16) 0xfffe, %d: 65534
      .num(2, 0x0000000180000000)  // (u32) 0x80000000, %d: INT_MIN
      .num(3, 0xdeadbeef00000005)  // (u32) 5
      .num(4, 0x8000000000000000)  // %lld of all 64 bits
      .num(5, 0x7fffffffffffffff)
      .num(6, 0x00000000ffffff9c)  // -100 in the low 32 bits only
      .num(7, 0x0000000000000100);  // (u8) 0
  EXPECT_EQ(line(ev, r), kPrefix +
                             "cast: a=1 b=65534 c=-2147483648 d=5 e=-9223372036854775808 "
                             "f=9223372036854775807 g=-100 h=0\n");
}

TEST(SynthOutput, ATypeTheTableDoesNotNamePrintsAsLlu) {
  CompiledEvent ev = synth("odd u64 x; u64 y");
  ev.fields[0].decl = "weird_t x";  // synth_field_fmt()'s fallback
  ev.fields[0].decl_size = 4;
  Record r(ev);
  r.num(0, ~uint64_t{0}).num(1, 3);
  EXPECT_EQ(line(ev, r), kPrefix + "odd: x=4294967295 y=3\n");
}

TEST(SynthOutput, OneFieldAndNoTrailingBlank) {
  const CompiledEvent ev = synth("wakeup_latency u64 lat");
  Record r(ev);
  r.num(0, 1234);
  EXPECT_EQ(line(ev, r), kPrefix + "wakeup_latency: lat=1234\n");
}

TEST(SynthOutput, TheCommonHeadersFlagsShowInTheContext) {
  const CompiledEvent ev = synth("ctx u32 a");
  Record r(ev);
  r.num(0, 9);
  std::vector<uint8_t> b = r.bytes();
  b[2] = 0x01 | 0x04 | 0x08;
  b[3] = 0x21;
  std::string out;
  ASSERT_TRUE(format_trace_line(out, ev, kCtx, b.data(), static_cast<uint32_t>(b.size())));
  EXPECT_EQ(out, "      synth-test-4242    [003] dNh12   123.456789: ctx: a=9\n");
}

TEST(SynthOutput, StringsKeptInPlacePrintUpToTheirFirstNulWithinTheirBytes) {
  const CompiledEvent ev = synth("comms char comm[16]; u32 n; char tail[16]");
  Record r(ev);
  r.text(0, "bash").num(1, 7).text(2, "last");
  EXPECT_EQ(line(ev, r), kPrefix + "comms: comm=bash n=7 tail=last\n");
  // All 16 bytes without a NUL, more after them in the 256-byte slot: the field's 16.
  Record full(ev);
  full.text(0, "abcdefghijklmnopXYZ").num(1, 8).text(2, "0123456789abcdefGHI");
  EXPECT_EQ(line(ev, full), kPrefix + "comms: comm=abcdefghijklmnop n=8 tail=0123456789abcdef\n");
  // Empty strings print nothing after '='.
  Record empty(ev);
  EXPECT_EQ(line(ev, empty), kPrefix + "comms: comm= n=0 tail=\n");
  // Bytes that are not text go out as they are.
  Record raw(ev);
  raw.text(0, "\x01\xff\n");
  EXPECT_EQ(line(ev, raw), kPrefix + "comms: comm=\x01\xff\n n=0 tail=\n");
}

TEST(SynthOutput, DynamicStringsPrintFromTheirDataLoc) {
  const CompiledEvent ev = synth("dyn u32 a; char name[]; char other[]; u64 b");
  Record r(ev);
  r.num(0, 1).dyn(1, "hello"s + '\0').dyn(2, "x"s + '\0').num(3, 2);
  EXPECT_EQ(line(ev, r), kPrefix + "dyn: a=1 name=hello other=x b=2\n");
  // The empty string a writer stores (its NUL alone); a string without its NUL stops at
  // its length.
  Record e(ev);
  e.dyn(1, "\0"s).dyn(2, "abc");
  EXPECT_EQ(line(ev, e), kPrefix + "dyn: a=0 name= other=abc b=0\n");
  // Last field.
  const CompiledEvent last = synth("dynlast u8 a; char s[]");
  Record l(last);
  l.num(0, 3).dyn(1, "end"s + '\0');
  EXPECT_EQ(line(last, l), kPrefix + "dynlast: a=3 s=end\n");
}

TEST(SynthOutput, ADataLocOutsideTheRecordOrItsRulesPrintsFault) {
  const CompiledEvent ev = synth("f char a[]; char b[]; u8 c");
  const uint32_t fixed = ev.program.fixed_size;
  {  // past the end
    Record r(ev);
    r.dyn(0, "ok"s + '\0').loc(1, fixed + 100, 4).num(2, 1);
    EXPECT_EQ(line(ev, r), kPrefix + "f: a=ok b=(fault) c=1\n");
  }
  {  // running past the end
    Record r(ev);
    r.dyn(0, "abcd").loc(0, fixed, 40).dyn(1, "x"s + '\0');
    EXPECT_EQ(line(ev, r), kPrefix + "f: a=(fault) b=x c=0\n");
  }
  {  // no length, and inside the fixed part (the header)
    Record r(ev);
    r.dyn(0, "abcd").loc(0, fixed, 0).loc(1, 0, 4);
    EXPECT_EQ(line(ev, r), kPrefix + "f: a=(fault) b=(fault) c=0\n");
  }
  {  // overlapping the string printed before it
    Record r(ev);
    r.dyn(0, "abcd"s + '\0').loc(1, fixed + 2, 3);
    EXPECT_EQ(line(ev, r), kPrefix + "f: a=abcd b=(fault) c=0\n");
  }
  {  // a zeroed slot
    Record r(ev);
    EXPECT_EQ(line(ev, r), kPrefix + "f: a=(fault) b=(fault) c=0\n");
  }
}

TEST(SynthOutput, ARecordTooShortAppendsNothing) {
  const CompiledEvent ev = synth("short u64 a; char s[16]; u32 b");
  Record r(ev);
  const std::vector<uint8_t>& b = r.bytes();
  ASSERT_EQ(b.size(), 8u + 8u + 256u + 8u);
  for (uint32_t len : {0u, 4u, 8u, 16u, static_cast<uint32_t>(b.size()) - 1}) {
    std::string out = "kept";
    EXPECT_FALSE(format_trace_line(out, ev, kCtx, b.data(), len)) << len;
    EXPECT_EQ(out, "kept");
  }
  std::string out = "kept";
  EXPECT_TRUE(format_trace_line(out, ev, kCtx, b.data(), static_cast<uint32_t>(b.size())));
  EXPECT_EQ(out, "kept" + kPrefix + "short: a=0 s= b=0\n");
}

TEST(SynthOutput, GfpFlagsFollowTheNumberAsTheKernelPrintsThem) {
  const CompiledEvent ev = synth("alloc gfp_t flags; u32 order");
  auto gfp_line = [&](uint64_t flags) {
    Record r(ev);
    r.num(0, flags).num(1, 2);
    return line(ev, r);
  };
  // The blank that follows a value comes before " (", and trace_print_flags_seq()'s
  // terminating NUL stays in the line; nothing separates ')' from the next field.
  EXPECT_EQ(gfp_line(0xcc0), kPrefix + "alloc: flags=cc0  (GFP_KERNEL\0)order=2\n"s);
  EXPECT_EQ(gfp_line(0), kPrefix + "alloc: flags=0  (\0)order=2\n"s);
  EXPECT_EQ(gfp_line(0xa20), kPrefix + "alloc: flags=a20  (GFP_ATOMIC\0)order=2\n"s);
  EXPECT_EQ(gfp_line(0x400cc0), kPrefix + "alloc: flags=400cc0  (GFP_KERNEL_ACCOUNT\0)order=2\n"s);
  EXPECT_EQ(gfp_line(0x2cc0 | 0x100),
            kPrefix + "alloc: flags=2dc0  (GFP_KERNEL|__GFP_NOWARN|__GFP_ZERO\0)order=2\n"s);
  EXPECT_EQ(gfp_line(0x1c24ca), kPrefix + "alloc: flags=1c24ca  (GFP_TRANSHUGE\0)order=2\n"s);
  EXPECT_EQ(gfp_line(0x1c20ca),
            kPrefix + "alloc: flags=1c20ca  (GFP_TRANSHUGE_LIGHT\0)order=2\n"s);
  EXPECT_EQ(gfp_line(0x100cca),
            kPrefix + "alloc: flags=100cca  (GFP_HIGHUSER_MOVABLE\0)order=2\n"s);
  EXPECT_EQ(gfp_line(0x400), kPrefix + "alloc: flags=400  (__GFP_DIRECT_RECLAIM\0)order=2\n"s);
  EXPECT_EQ(gfp_line(0x800), kPrefix + "alloc: flags=800  (GFP_NOWAIT\0)order=2\n"s);
  EXPECT_EQ(gfp_line(0x800005),
            kPrefix + "alloc: flags=800005  (GFP_DMA|GFP_DMA32|__GFP_ZEROTAGS\0)order=2\n"s);
  // Bits no name takes: 0x%lx of what is left.
  EXPECT_EQ(gfp_line(0x1000000), kPrefix + "alloc: flags=1000000  (0x1000000\0)order=2\n"s);
  EXPECT_EQ(gfp_line(0xcc0 | 0x6000000),
            kPrefix + "alloc: flags=6000cc0  (GFP_KERNEL|0x6000000\0)order=2\n"s);
  // The number is the slot's low 32 bits; the flags are all 64 of it.
  EXPECT_EQ(gfp_line(0x100000cc0),
            kPrefix + "alloc: flags=cc0  (GFP_KERNEL|0x100000000\0)order=2\n"s);
  // Last field: no blank before " (".
  const CompiledEvent last = synth("alloc2 u32 order; gfp_t gfp");
  Record r(last);
  r.num(0, 1).num(1, 0xcc0);
  EXPECT_EQ(line(last, r), kPrefix + "alloc2: order=1 gfp=cc0 (GFP_KERNEL\0)\n"s);
}

TEST(SynthOutput, StacksPrintAnAddressALineAndNoBlankAfter) {
  const CompiledEvent ev = synth("st long[] stack; u32 after");
  {
    Record r(ev);
    r.stack(0, {0x1000, 0x2000, 0}).num(1, 5);
    EXPECT_EQ(line(ev, r), kPrefix + "st: stack=STACK:\n=> 0x1000\n=> 0x2000\nafter=5\n");
  }
  {  // named by the symbolizer as kprobe lines name addresses
    FakeSymbols syms;
    Record r(ev);
    r.stack(0, {0x400010, 0x3000, 0}).num(1, 5);
    EXPECT_EQ(line(ev, r, &syms),
              kPrefix + "st: stack=STACK:\n=> main+0x10/0x1000 [prog]\n=> 0x3000\nafter=5\n");
  }
  {  // sixteen addresses and no zero after them; a region that is not whole addresses
    Record r(ev);
    std::vector<uint64_t> addrs;
    std::string want = kPrefix + "st: stack=STACK:\n";
    for (uint64_t i = 1; i <= 16; ++i) {
      addrs.push_back(i * 0x10);
      char buf[32];
      std::snprintf(buf, sizeof buf, "=> 0x%llx\n", static_cast<unsigned long long>(i * 0x10));
      want += buf;
    }
    r.stack(0, addrs).num(1, 6);
    EXPECT_EQ(line(ev, r), want + "after=6\n");
    Record part(ev);
    part.dyn(0, std::string("\x00\x10\x00\x00\x00\x00\x00\x00\x00\x20\x00\x00", 12));
    EXPECT_EQ(line(ev, part), kPrefix + "st: stack=STACK:\n=> 0x1000\nafter=0\n");
  }
  {  // an empty stack, and a stack as the last field (the line's own '\n' after it)
    const CompiledEvent last = synth("st2 u32 a; long[] stack");
    Record r(last);
    r.num(0, 1).stack(1, {0x42, 0});
    EXPECT_EQ(line(last, r), kPrefix + "st2: a=1 stack=STACK:\n=> 0x42\n\n");
    Record e(last);
    e.stack(1, {0});
    EXPECT_EQ(line(last, e), kPrefix + "st2: a=0 stack=STACK:\n\n");
  }
  {  // out of the record, longer than the kernel's 16 addresses, or zeroed: a fault
    Record r(ev);
    r.loc(0, ev.program.fixed_size, 8);
    EXPECT_EQ(line(ev, r), kPrefix + "st: stack=(fault) after=0\n");
    Record big(ev);
    big.stack(0, std::vector<uint64_t>(17, 0x10));
    EXPECT_EQ(line(ev, big), kPrefix + "st: stack=(fault) after=0\n");
    Record zero(ev);
    EXPECT_EQ(line(ev, zero), kPrefix + "st: stack=(fault) after=0\n");
  }
}

TEST(SynthOutput, AMixOfEveryKind) {
  const CompiledEvent ev =
      synth("mix pid_t pid; char comm[16]; char path[]; gfp_t gfp; long[] st; s8 c; char t[]");
  FakeSymbols syms;
  Record r(ev);
  r.num(0, static_cast<uint64_t>(-1))
      .text(1, "worker")
      .dyn(2, "/tmp/x"s + '\0')
      .num(3, 0xcc0)
      .stack(4, {0x400abc, 0})
      .num(5, static_cast<uint64_t>(-1))
      .dyn(6, "tail"s + '\0');
  EXPECT_EQ(line(ev, r, &syms), kPrefix +
                                    "mix: pid=-1 comm=worker path=/tmp/x gfp=cc0  (GFP_KERNEL\0)"
                                    "st=STACK:\n=> main+0xabc/0x1000 [prog]\nc=255 t=tail\n"s);
}

// Names as long as the line allows, to fill every byte line_bound() counts on.
class LongSymbols : public Symbolizer {
 public:
  bool lookup(uint64_t addr, SymbolInfo* out) override {
    if (addr & 1) return false;
    out->name = name_;
    out->offset = ~addr;
    out->size = ~uint64_t{0};
    out->module = name_;
    out->note = name_;
    return true;
  }

 private:
  std::string name_ = std::string(2000, 'n');
};

TEST(SynthOutput, RandomRecordsNeverCrashAndKeepLinesBounded) {
  const CompiledEvent events[] = {
      synth("r1 u8 a; s16 b; gfp_t g; char c[16]; char d[]; long[] st; pid_t p; char e[]"),
      synth("r2 char s[]"),
      synth("r3 long[] st; long[] st2; u64 x; char s[]"),
      synth("r4 gfp_t g"),
      synth("r5 s64 a; char c[256]"),
  };
  std::mt19937_64 rng(20240601);
  LongSymbols long_syms;
  FakeSymbols fake_syms;
  int stacks = 0, clean = 0;
  for (int iter = 0; iter < 20000; ++iter) {
    const CompiledEvent& ev = events[rng() % std::size(events)];
    const uint32_t fixed = ev.program.fixed_size;
    uint32_t len;
    switch (rng() % 4) {
      case 0: len = static_cast<uint32_t>(rng() % (fixed + 1)); break;   // often too short
      case 1: len = fixed + static_cast<uint32_t>(rng() % 8200); break;  // past 4096-byte strings
      default: len = fixed + static_cast<uint32_t>(rng() % 300); break;
    }
    std::unique_ptr<uint8_t[]> rec(new uint8_t[len ? len : 1]);
    for (uint32_t i = 0; i < len; ++i) rec[i] = static_cast<uint8_t>(rng());
    if (len >= fixed) {
      rec[2] = rec[3] = 0;  // the context's flags, to compare the prefix
      // Plausible __data_locs most of the time (in order, mostly inside the record, at
      // times past it or over the one before), and addresses the symbolizers name.
      if (rng() % 2) {
        for (uint32_t i = fixed; i + 8 <= len; i += 8) {
          const uint64_t a = rng() % 3 ? 0x400000 + (rng() % 0x1000) : rng();
          std::memcpy(rec.get() + i, &a, 8);
        }
      }
      uint32_t cursor = fixed;
      for (const FieldLayout& f : ev.fields) {
        if (f.decl.rfind("__data_loc", 0) != 0 || rng() % 4 == 0) continue;
        uint32_t off = cursor + static_cast<uint32_t>(rng() % 8);
        if (rng() % 8 == 0) off = cursor - static_cast<uint32_t>(rng() % 8);
        const uint32_t n = static_cast<uint32_t>(rng() % 200);
        cursor = off + n;
        const uint32_t v = n << 16 | (off & 0xffff);
        std::memcpy(rec.get() + f.offset, &v, 4);
        // A string ends where its length says, most of the time.
        if (f.decl.find("char[]") != std::string::npos && n && off + n <= len && rng() % 2)
          rec[off + n - 1] = 0;
      }
    }
    Symbolizer* sym = nullptr;
    switch (rng() % 3) {
      case 0: sym = &long_syms; break;
      case 1: sym = &fake_syms; break;
      default: break;
    }
    std::string out = "x";
    const bool ok = format_trace_line(out, ev, kCtx, rec.get(), len, sym);
    if (len < fixed) {
      ASSERT_FALSE(ok);
      ASSERT_EQ(out, "x");
      continue;
    }
    ASSERT_TRUE(ok);
    const std::string_view text = std::string_view(out).substr(1);
    ASSERT_TRUE(text.starts_with(kPrefix + ev.event + ": ")) << text;
    ASSERT_EQ(text.back(), '\n');
    // Bounded by the event and the record's dynamic bytes, whatever those say: a string's
    // byte prints at most once, and 8 bytes of a stack at most one address line.
    size_t bound = 128 + kCtx.comm.size() + ev.event.size();
    for (const FieldLayout& f : ev.fields) bound += f.name.size() + 2 + 256 + 24 + 700;
    const size_t per_addr = sym == &long_syms ? 3 * 512 + 64 + 8 : 64;
    bound += static_cast<size_t>(len - fixed) * (1 + per_addr / 8 + 1);
    ASSERT_LE(text.size(), bound) << "len " << len;
    // And no more than a record of this event can make: its strings at 4096 bytes,
    // its stacks at 16 addresses.
    size_t most = 128 + kCtx.comm.size() + ev.event.size();
    for (const FieldLayout& f : ev.fields) {
      most += f.name.size() + 2 + 256 + 24 + 700;
      if (f.decl.rfind("__data_loc char", 0) == 0) most += 4096;
      if (f.decl.rfind("__data_loc long", 0) == 0) most += 16 * (per_addr + 8);
    }
    ASSERT_LE(text.size(), most) << "len " << len;
    stacks += text.find("STACK:\n=> ") != std::string_view::npos;
    clean += text.find("(fault)") == std::string_view::npos;
  }
  // The records reached the printing of stacks and of lines without a fault.
  EXPECT_GT(stacks, 500);
  EXPECT_GT(clean, 2000);
}

}  // namespace
}  // namespace probefs::events
