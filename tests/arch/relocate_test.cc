// Relocation checked by decoding what it wrote: the copy must reach the same absolute
// places from its new address.
#include "arch/x86_64/isa/relocate.h"

#include <gtest/gtest.h>

#include <cerrno>
#include <cstring>
#include <vector>

namespace probefs::arch::x86_64 {
namespace {

constexpr uintptr_t kOld = 0x7f0000001000;
constexpr uintptr_t kNew = 0x7f0040000000;  // 1 GiB away: rel8 can't, rel32 can

Insn at_old(std::vector<uint8_t> bytes) {
  Insn insn;
  EXPECT_EQ(decode(bytes.data(), bytes.size(), kOld, &insn), 0);
  return insn;
}

// Decodes the relocated code into its instructions.
std::vector<Insn> decode_all(const uint8_t* code, int len, uintptr_t pc) {
  std::vector<Insn> out;
  for (int off = 0; off < len;) {
    Insn i;
    if (decode(code + off, len - off, pc + off, &i) != 0) break;
    out.push_back(i);
    off += i.len;
  }
  return out;
}

int64_t rip_target(const Insn& i) {
  int32_t disp;
  std::memcpy(&disp, i.bytes + i.disp_offset, 4);
  return static_cast<int64_t>(i.next()) + disp;
}

TEST(Relocate, PlainInstructionIsCopied) {
  uint8_t out[kMaxRelocatedLen];
  Insn i = at_old({0x48, 0x89, 0xe5});
  ASSERT_EQ(relocate(i, kNew, out, sizeof out), 3);
  EXPECT_EQ(std::memcmp(out, i.bytes, 3), 0);
}

TEST(Relocate, RipRelativeOperandKeepsItsAbsoluteTarget) {
  uint8_t out[kMaxRelocatedLen];
  Insn i = at_old({0x48, 0x8b, 0x05, 0x10, 0x00, 0x00, 0x00});  // mov rax,[rip+0x10]
  const int64_t want = rip_target(i);
  ASSERT_EQ(relocate(i, kNew, out, sizeof out), 7);
  auto copy = decode_all(out, 7, kNew);
  ASSERT_EQ(copy.size(), 1u);
  EXPECT_EQ(copy[0].kind, InsnKind::kRipRelative);
  EXPECT_EQ(rip_target(copy[0]), want);
}

TEST(Relocate, RipRelativeOutOfReachIsRefused) {
  uint8_t out[kMaxRelocatedLen];
  Insn i = at_old({0x48, 0x8b, 0x05, 0x10, 0x00, 0x00, 0x00});
  EXPECT_EQ(relocate(i, kOld + (3ull << 31), out, sizeof out), -ERANGE);
}

TEST(Relocate, ShortJumpBecomesNearJumpToTheSameTarget) {
  uint8_t out[kMaxRelocatedLen];
  Insn i = at_old({0xeb, 0x10});
  int n = relocate(i, kNew, out, sizeof out);
  auto copy = decode_all(out, n, kNew);
  ASSERT_EQ(copy.size(), 1u);
  EXPECT_EQ(copy[0].kind, InsnKind::kJmpRel);
  EXPECT_EQ(copy[0].target, i.target);
}

TEST(Relocate, FarTargetsUseTheAbsoluteForm) {
  uint8_t out[kMaxRelocatedLen];
  Insn i = at_old({0x7c, 0x10});  // jl
  const uintptr_t far = kOld + (5ull << 32);
  int n = relocate(i, far, out, sizeof out);
  ASSERT_EQ(n, 2 + static_cast<int>(kJmpAbsLen));
  auto copy = decode_all(out, 8, far);
  ASSERT_GE(copy.size(), 2u);
  EXPECT_EQ(copy[0].kind, InsnKind::kJccRel);
  EXPECT_EQ(copy[0].cond, 0xd);  // jge over the jump
  EXPECT_EQ(copy[0].target, far + n);
  EXPECT_EQ(copy[1].kind, InsnKind::kJmpIndirect);
  uint64_t abs;
  std::memcpy(&abs, out + 8, 8);
  EXPECT_EQ(abs, i.target);
}

TEST(Relocate, ConditionalJumpKeepsItsCondition) {
  uint8_t out[kMaxRelocatedLen];
  Insn i = at_old({0x0f, 0x84, 0x00, 0x01, 0x00, 0x00});  // je
  int n = relocate(i, kNew, out, sizeof out);
  auto copy = decode_all(out, n, kNew);
  ASSERT_EQ(copy.size(), 1u);
  EXPECT_EQ(copy[0].cond, 0x4);
  EXPECT_EQ(copy[0].target, i.target);
}

TEST(Relocate, CallPushesTheOriginalReturnAddress) {
  uint8_t out[kMaxRelocatedLen];
  Insn i = at_old({0xe8, 0x00, 0x10, 0x00, 0x00});
  int n = relocate(i, kNew, out, sizeof out);
  ASSERT_GT(n, 0);
  auto copy = decode_all(out, 6 + 5, kNew);
  ASSERT_EQ(copy.size(), 2u);
  EXPECT_EQ(copy[0].kind, InsnKind::kRipRelative);  // push [rip+k]
  const int64_t k = rip_target(copy[0]);
  uint64_t pushed;
  std::memcpy(&pushed, out + (k - static_cast<int64_t>(kNew)), 8);
  EXPECT_EQ(pushed, i.next());
  EXPECT_EQ(copy[1].kind, InsnKind::kJmpRel);
  EXPECT_EQ(copy[1].target, i.target);
}

TEST(Relocate, IndirectCallBecomesPushAndIndirectJump) {
  uint8_t out[kMaxRelocatedLen];
  Insn i = at_old({0xff, 0xd0});  // call rax
  int n = relocate(i, kNew, out, sizeof out);
  auto copy = decode_all(out, 6 + 2, kNew);
  ASSERT_EQ(copy.size(), 2u);
  EXPECT_EQ(copy[1].kind, InsnKind::kJmpIndirect);
  EXPECT_EQ(n, 6 + 2 + 8);
  Insn via_rsp = at_old({0xff, 0x54, 0x24, 0x08});  // call [rsp+8]: the push would move it
  EXPECT_EQ(relocate(via_rsp, kNew, out, sizeof out), -EINVAL);
}

TEST(Relocate, LoopBranchesThroughANearJump) {
  uint8_t out[kMaxRelocatedLen];
  Insn i = at_old({0xe2, 0xf0});
  int n = relocate(i, kNew, out, sizeof out);
  auto copy = decode_all(out, n, kNew);
  ASSERT_EQ(copy.size(), 3u);
  EXPECT_EQ(copy[0].kind, InsnKind::kLoopRel);
  EXPECT_EQ(copy[0].target, copy[2].addr);  // taken: to the near jump
  EXPECT_EQ(copy[1].target, kNew + n);      // not taken: past it
  EXPECT_EQ(copy[2].target, i.target);
}

TEST(Relocate, TrapsAreNotRelocatable) {
  uint8_t out[kMaxRelocatedLen];
  EXPECT_EQ(relocate(at_old({0xcc}), kNew, out, sizeof out), -EINVAL);
  EXPECT_EQ(relocate(at_old({0x0f, 0x0b}), kNew, out, sizeof out), -EINVAL);
}

TEST(Relocate, SingleStepCopyKeepsTheLength) {
  uint8_t out[kMaxInsnLen];
  Insn i = at_old({0x48, 0x8b, 0x05, 0x10, 0x00, 0x00, 0x00});
  ASSERT_EQ(copy_for_singlestep(i, kNew, out), 7);
  EXPECT_EQ(copy_for_singlestep(at_old({0xeb, 0x00}), kNew, out), -EINVAL);
}

TEST(Conditions, EvaluatedFromFlags) {
  constexpr uint64_t CF = 1, ZF = 1 << 6, SF = 1 << 7, OF = 1 << 11;
  EXPECT_TRUE(condition_holds(0x4, ZF));          // e
  EXPECT_FALSE(condition_holds(0x5, ZF));         // ne
  EXPECT_TRUE(condition_holds(0x2, CF));          // b
  EXPECT_TRUE(condition_holds(0x7, 0));           // a
  EXPECT_FALSE(condition_holds(0x7, CF));
  EXPECT_TRUE(condition_holds(0xc, SF));          // l: SF != OF
  EXPECT_FALSE(condition_holds(0xc, SF | OF));
  EXPECT_TRUE(condition_holds(0xe, ZF));          // le
  EXPECT_TRUE(condition_holds(0xf, SF | OF));     // g
  EXPECT_TRUE(condition_holds(0x0, OF));          // o
  EXPECT_TRUE(condition_holds(0xb, 0));           // np
}

}  // namespace
}  // namespace probefs::arch::x86_64
