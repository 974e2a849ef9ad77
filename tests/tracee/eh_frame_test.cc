// The .eh_frame / LSDA reader: LSDAs as bytes in each encoding the compilers use, then
// the landing pads of real compiled code against the ones the C++ runtime itself resumes
// at, and every LSDA of libstdc++.
#include "tracee/eh_frame.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <link.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <typeinfo>
#include <vector>

#include <gtest/gtest.h>

#include "tracee/elf_symbols.h"
#include "tests/tracee/throwing.h"
#include "tests/tracee/unwinder_witness.h"

namespace probefs::tracee {
namespace {

using namespace throwing;

constexpr uint64_t kFunc = 0x401000;
constexpr uint64_t kLsda = 0x402000;

std::vector<uint64_t> pads_of(const std::vector<uint8_t>& lsda, bool* ok) {
  std::vector<uint64_t> out;
  *ok = parse_lsda(lsda.data(), lsda.data() + lsda.size(), kLsda, kFunc, true, &out);
  return out;
}

TEST(ParseLsda, GccUleb128CallSitesFromTheFunctionStart) {
  // GCC 12 -O2, int foo(int x) { G g; bar(x); return x + 1; }: LPStart and TType omitted,
  // one call site [7, 7+5) with its landing pad at +0x1f, no action.
  bool ok = false;
  EXPECT_EQ(pads_of({0xff, 0xff, 0x01, 0x04, 0x07, 0x05, 0x1f, 0x00}, &ok),
            std::vector<uint64_t>{kFunc + 0x1f});
  EXPECT_TRUE(ok);
  // Call sites without a landing pad (0) add nothing.
  EXPECT_EQ(pads_of({0xff, 0xff, 0x01, 0x04, 0x0d, 0x05, 0x00, 0x00}, &ok),
            std::vector<uint64_t>{});
  EXPECT_TRUE(ok);
}

TEST(ParseLsda, Udata4CallSitesBehindATypeTable) {
  // TType pcrel|sdata4 with its uleb128 offset, call sites udata4 (Clang's form): two
  // sites, the second with a pad at +0x40, and a multi-byte uleb128 in an action.
  const std::vector<uint8_t> lsda = {
      0xff,                    // LPStart omitted
      0x9b, 0x29,              // TType: indirect|pcrel|sdata4, offset 0x29
      0x03,                    // call sites: udata4
      0x1a,                    // table length: 2 * 13
      0x04, 0, 0, 0, 0x08, 0, 0, 0, 0x00, 0, 0, 0, 0x00,        // [4, 12): no pad
      0x10, 0, 0, 0, 0x05, 0, 0, 0, 0x40, 0, 0, 0, 0x81, 0x01,  // [16, 21): pad +0x40
  };
  bool ok = false;
  // 13 + 14 bytes: the table length must cover both records.
  std::vector<uint8_t> fixed = lsda;
  fixed[4] = 27;
  EXPECT_EQ(pads_of(fixed, &ok), std::vector<uint64_t>{kFunc + 0x40});
  EXPECT_TRUE(ok);
  // A length that cuts a record in the middle is malformed.
  pads_of(lsda, &ok);
  EXPECT_FALSE(ok);
}

TEST(ParseLsda, ExplicitLpStartAbsoluteAndPcRelative) {
  bool ok = false;
  // absptr LPStart 0x500000: pads count from there, not from the function.
  EXPECT_EQ(pads_of({0x00, 0x00, 0x00, 0x50, 0x00, 0x00, 0x00, 0x00, 0x00,  // LPStart
                     0xff, 0x01, 0x04, 0x00, 0x02, 0x10, 0x00},
                    &ok),
            std::vector<uint64_t>{0x500010});
  EXPECT_TRUE(ok);
  // pcrel|sdata4 LPStart -0x1000 from the field (at kLsda + 1): kLsda + 1 - 0x1000.
  EXPECT_EQ(pads_of({0x1b, 0x00, 0xf0, 0xff, 0xff, 0xff, 0x01, 0x04, 0x00, 0x02, 0x10, 0x00},
                    &ok),
            std::vector<uint64_t>{kLsda + 1 - 0x1000 + 0x10});
  EXPECT_TRUE(ok);
}

TEST(ParseLsda, MalformedTablesAreRefused) {
  bool ok = true;
  pads_of({}, &ok);
  EXPECT_FALSE(ok);
  pads_of({0xff, 0xff}, &ok);  // no call-site encoding
  EXPECT_FALSE(ok);
  pads_of({0xff, 0xff, 0x01, 0x10, 0x00}, &ok);  // the table runs past the end
  EXPECT_FALSE(ok);
  pads_of({0xff, 0xff, 0x13, 0x04, 0, 0, 0, 0}, &ok);  // call sites are offsets, never pcrel
  EXPECT_FALSE(ok);
  pads_of({0x80, 0xff, 0x01, 0x00}, &ok);  // an indirect LPStart: not what compilers emit
  EXPECT_FALSE(ok);
  pads_of({0xff, 0xff, 0x01, 0x02, 0x80, 0x80}, &ok);  // an unterminated uleb128
  EXPECT_FALSE(ok);
}

uintptr_t addr_of(int (*fn)(int)) { return reinterpret_cast<uintptr_t>(fn); }

// Throws through the fixtures of one build, so that the runtime picks landing pads.
void run_throws(int (*catches)(int)) {
  for (int x = 0; x < 8; ++x) catches(x);
}

// Every landing pad the C++ runtime resumed a frame at is one of the landing pads the
// reader lists with the bounds of the function that holds it.
TEST(EhFrame, LandingPadsIncludeEveryOneTheRuntimeResumesAt) {
  int err = 1;
  auto syms = ProcessSymbols::load(getpid(), &err);
  ASSERT_EQ(err, 0);
  for (int (*catches)(int) : {catches_o0, catches_o2}) {
    test_support::clear_landing_pads_seen();
    run_throws(catches);
    const auto seen = test_support::landing_pads_seen();
    ASSERT_GE(seen.size(), 4u) << "the personality routine saw no landing pad";
    for (const auto& s : seen) {
      ResolvedSymbol r;
      ASSERT_EQ(syms->describe(s.landing_pad, &r), 0);
      EXPECT_TRUE(r.function.contains(s.landing_pad));
      EXPECT_TRUE(std::binary_search(r.function.landing_pads.begin(),
                                     r.function.landing_pads.end(), s.landing_pad))
          << r.name << " +" << s.landing_pad - r.function.start;
      // The FDE the runtime used starts where the reader's bounds start.
      EXPECT_EQ(s.region_start, r.function.start) << r.name;
    }
  }
}

// GCC 12 -O2: cleanup_only has one call that can throw and one landing pad, which the
// runtime uses; the reader lists exactly that one.
TEST(EhFrame, OneCleanupOneLandingPad) {
  int err = 1;
  auto syms = ProcessSymbols::load(getpid(), &err);
  ASSERT_EQ(err, 0);
  for (int (*fn)(int) : {cleanup_only_o0, cleanup_only_o2}) {
    ResolvedSymbol r;
    ASSERT_EQ(syms->describe(addr_of(fn), &r), 0);
    test_support::clear_landing_pads_seen();
    try {
      fn(1);
    } catch (const Thrown&) {
    }
    std::vector<uintptr_t> in_fn;
    for (const auto& s : test_support::landing_pads_seen())
      if (r.function.contains(s.landing_pad)) in_fn.push_back(s.landing_pad);
    EXPECT_EQ(r.function.landing_pads, in_fn) << r.name;
    ASSERT_EQ(r.function.landing_pads.size(), 1u) << r.name;
    // Functions that cannot throw list none.
    ResolvedSymbol plain;
    ASSERT_EQ(syms->resolve("probefs_test_fn_a", &plain), 0);
    EXPECT_TRUE(plain.function.landing_pads.empty());
  }
}

// with_cold_o2's path for x < 0 is in with_cold_o2.cold: the bounds of each part name the
// other as related code. note_return_address records an address inside the cold part.
TEST(EhFrame, ColdPartsAreRelatedBothWays) {
  int err = 1;
  auto syms = ProcessSymbols::load(getpid(), &err);
  ASSERT_EQ(err, 0);
  EXPECT_EQ(with_cold_o2(-1), 8);
  const uintptr_t in_cold = noted_return_address();
  ResolvedSymbol hot, cold;
  ASSERT_EQ(syms->describe(addr_of(with_cold_o2), &hot), 0);
  ASSERT_EQ(syms->describe(in_cold, &cold), 0);
  ASSERT_FALSE(hot.function.contains(in_cold)) << "GCC kept the unlikely path in line";
  EXPECT_EQ(cold.name.substr(cold.name.size() - 5), ".cold") << cold.name;
  ASSERT_EQ(hot.function.related.size(), 1u);
  EXPECT_EQ(hot.function.related[0].start, cold.function.start);
  EXPECT_EQ(hot.function.related[0].end, cold.function.end);
  ASSERT_EQ(cold.function.related.size(), 1u);
  EXPECT_EQ(cold.function.related[0].start, hot.function.start);
  EXPECT_EQ(cold.function.related[0].end, hot.function.end);
  // The -O0 build splits nothing.
  ResolvedSymbol o0;
  ASSERT_EQ(syms->describe(addr_of(with_cold_o0), &o0), 0);
  EXPECT_TRUE(o0.function.related.empty());
}

// Every LSDA of libstdc++ (thousands of functions with cleanups and catches) parses, and
// every landing pad lies inside an FDE's code.
TEST(EhFrame, EveryLsdaOfLibstdcxxParses) {
  void* handle = dlopen("libstdc++.so.6", RTLD_NOW | RTLD_NOLOAD);
  ASSERT_NE(handle, nullptr);
  link_map* lm = nullptr;
  ASSERT_EQ(dlinfo(handle, RTLD_DI_LINKMAP, &lm), 0);
  const std::string path = lm->l_name;
  dlclose(handle);
  ASSERT_EQ(elf_version(EV_CURRENT) == EV_NONE, false);
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0) << path;
  Elf* elf = elf_begin(fd, ELF_C_READ, nullptr);
  ASSERT_NE(elf, nullptr);
  EhFrame f;
  f.load(elf);
  EXPECT_GT(f.fdes().size(), 1000u);
  EXPECT_GT(f.landing_pads().size(), 1000u);
  EXPECT_TRUE(f.unreadable_lsdas().empty()) << f.unreadable_lsdas().size();
  size_t outside = 0;
  for (uint64_t pad : f.landing_pads()) outside += f.covering(pad) == nullptr;
  EXPECT_EQ(outside, 0u);
  elf_end(elf);
  close(fd);
}

}  // namespace
}  // namespace probefs::tracee
