// Sites on real code: the boosted copy's way back is the one recorded when the copy was
// built, and a released site leaves nothing behind in the optimizer's per-site state.
#include <gtest/gtest.h>

#include <cstdint>

#include "arch/arch.h"
#include "arch/testing.h"
#include "arch/x86_64/isa/insn.h"

// A function whose bytes the test knows:
//   +0  mov %rdi,%rax     3 bytes
//   +3  add $1,%rax       4 bytes
//   +7  add %rsi,%rax     3 bytes
//   +10 ret
// No branch and no call: its first 7 bytes are a region the optimizer accepts.
asm(R"(
    .text
    .p2align 4
    .globl probefs_site_test_fn
    .type probefs_site_test_fn, @function
probefs_site_test_fn:
    mov %rdi, %rax
    add $1, %rax
    add %rsi, %rax
    ret
probefs_site_test_fn_end:
    .size probefs_site_test_fn, .-probefs_site_test_fn
    .globl probefs_site_test_fn_end
)");
extern "C" long probefs_site_test_fn(long, long);
extern "C" char probefs_site_test_fn_end[];

namespace probefs::arch {
namespace {

uintptr_t fn_start() { return reinterpret_cast<uintptr_t>(&probefs_site_test_fn); }
uintptr_t fn_end() { return reinterpret_cast<uintptr_t>(probefs_site_test_fn_end); }

TEST(Site, BoostedCopyJumpsBackFromTheRecordedPoint) {
  for (const uintptr_t off : {0u, 3u, 7u}) {
    const uintptr_t addr = fn_start() + off;
    Site* site = nullptr;
    ASSERT_EQ(prepare(addr, fn_start(), fn_end(), &site), 0) << off;
    const uintptr_t back = testing::boost_return(site);
    ASSERT_NE(back, 0u) << off;
    // What lies there is the jmp to the instruction after the probed one.
    x86_64::Insn probed, jmp;
    ASSERT_EQ(x86_64::decode(reinterpret_cast<const uint8_t*>(addr), 15, addr, &probed), 0);
    ASSERT_EQ(x86_64::decode(reinterpret_cast<const uint8_t*>(back), 15, back, &jmp), 0);
    EXPECT_EQ(jmp.kind, x86_64::InsnKind::kJmpRel) << off;
    EXPECT_EQ(jmp.target, probed.next()) << off;
    release(site);
  }
  // An instruction that does not fall through has no way back.
  const uintptr_t ret = fn_end() - 1;
  Site* site = nullptr;
  ASSERT_EQ(prepare(ret, fn_start(), fn_end(), &site), 0);
  EXPECT_EQ(testing::boost_return(site), 0u);
  release(site);
}

TEST(Site, ReleaseForgetsTheDetour) {
  EXPECT_EQ(probefs_site_test_fn(2, 3), 6);
  const size_t before = testing::site_detour_entries();
  Site* sites[3] = {};
  for (Site*& s : sites) {
    ASSERT_EQ(prepare(fn_start(), fn_start(), fn_end(), &s), 0);
    const char* why = nullptr;
    ASSERT_EQ(prepare_optimized(s, fn_start(), fn_end(), {}, false, DetourEntry::kPlain, false,
                                &why),
              0)
        << why;
    EXPECT_EQ(site_region_end(s), fn_start() + 7);
  }
  EXPECT_EQ(testing::site_detour_entries(), before + 3);
  for (Site* s : sites) release(s);
  EXPECT_EQ(testing::site_detour_entries(), before);
  EXPECT_EQ(probefs_site_test_fn(2, 3), 6);
}

}  // namespace
}  // namespace probefs::arch
