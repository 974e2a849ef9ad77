// Decoding and classification on byte arrays: no live code involved.
#include "arch/x86_64/isa/insn.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

namespace probefs::arch::x86_64 {
namespace {

Insn decode_ok(std::vector<uint8_t> bytes, uintptr_t pc = 0x1000) {
  Insn insn;
  EXPECT_EQ(decode(bytes.data(), bytes.size(), pc, &insn), 0);
  EXPECT_EQ(insn.len, bytes.size());
  return insn;
}

TEST(Decode, PlainInstructions) {
  EXPECT_EQ(decode_ok({0x55}).kind, InsnKind::kPlain);                    // push rbp
  EXPECT_EQ(decode_ok({0x48, 0x89, 0xe5}).kind, InsnKind::kPlain);        // mov rbp, rsp
  EXPECT_EQ(decode_ok({0x48, 0x83, 0xec, 0x10}).kind, InsnKind::kPlain);  // sub rsp, 16
}

TEST(Decode, Nops) {
  EXPECT_TRUE(decode_ok({0x90}).is_nop);
  EXPECT_TRUE(decode_ok({0x0f, 0x1f, 0x44, 0x00, 0x00}).is_nop);
  EXPECT_TRUE(decode_ok({0xf3, 0x0f, 0x1e, 0xfa}).is_nop);  // endbr64
  EXPECT_FALSE(decode_ok({0x55}).is_nop);
}

TEST(Decode, RipRelativeOperandAndItsDisplacement) {
  // mov rax, [rip+0x10]
  Insn i = decode_ok({0x48, 0x8b, 0x05, 0x10, 0x00, 0x00, 0x00});
  EXPECT_EQ(i.kind, InsnKind::kRipRelative);
  EXPECT_EQ(i.disp_offset, 3);
  // lea rdi, [rip-0x20]
  Insn l = decode_ok({0x48, 0x8d, 0x3d, 0xe0, 0xff, 0xff, 0xff});
  EXPECT_EQ(l.kind, InsnKind::kRipRelative);
}

TEST(Decode, RelativeBranchesAndTheirTargets) {
  Insn j8 = decode_ok({0xeb, 0x10}, 0x1000);
  EXPECT_EQ(j8.kind, InsnKind::kJmpRel);
  EXPECT_EQ(j8.target, 0x1012u);
  Insn j32 = decode_ok({0xe9, 0x00, 0x01, 0x00, 0x00}, 0x1000);
  EXPECT_EQ(j32.target, 0x1105u);
  Insn jl = decode_ok({0x7c, 0xfe}, 0x1000);
  EXPECT_EQ(jl.kind, InsnKind::kJccRel);
  EXPECT_EQ(jl.cond, 0xc);
  EXPECT_EQ(jl.target, 0x1000u);
  Insn jne32 = decode_ok({0x0f, 0x85, 0x10, 0x00, 0x00, 0x00}, 0x1000);
  EXPECT_EQ(jne32.kind, InsnKind::kJccRel);
  EXPECT_EQ(jne32.cond, 0x5);
  EXPECT_EQ(jne32.target, 0x1016u);
  Insn call = decode_ok({0xe8, 0xfb, 0xff, 0xff, 0xff}, 0x1000);
  EXPECT_EQ(call.kind, InsnKind::kCallRel);
  EXPECT_EQ(call.target, 0x1000u);
  Insn loop = decode_ok({0xe2, 0xfe}, 0x1000);
  EXPECT_EQ(loop.kind, InsnKind::kLoopRel);
  EXPECT_EQ(loop.loop, LoopOp::kLoop);
  EXPECT_EQ(decode_ok({0xe3, 0x00}).loop, LoopOp::kJrcxz);
  EXPECT_EQ(decode_ok({0x67, 0xe3, 0x00}).loop, LoopOp::kJecxz);
}

TEST(Decode, ReturnsAndIndirectBranches) {
  EXPECT_EQ(decode_ok({0xc3}).kind, InsnKind::kRet);
  Insn r = decode_ok({0xc2, 0x08, 0x00});
  EXPECT_EQ(r.kind, InsnKind::kRet);
  EXPECT_EQ(r.ret_imm, 8);
  Insn cr = decode_ok({0xff, 0xd0});  // call rax
  EXPECT_EQ(cr.kind, InsnKind::kCallIndirect);
  EXPECT_FALSE(cr.uses_rsp);
  Insn cs = decode_ok({0xff, 0x54, 0x24, 0x08});  // call [rsp+8]
  EXPECT_TRUE(cs.uses_rsp);
  Insn jm = decode_ok({0xff, 0x25, 0x00, 0x00, 0x00, 0x00});  // jmp [rip+0]
  EXPECT_EQ(jm.kind, InsnKind::kJmpIndirect);
  EXPECT_TRUE(jm.uses_rip);
  EXPECT_EQ(jm.disp_offset, 2);
  EXPECT_EQ(decode_ok({0x3e, 0xff, 0xe0}).kind, InsnKind::kJmpIndirect);  // notrack jmp rax
}

TEST(Decode, InstructionsThatAreNeverProbed) {
  EXPECT_EQ(decode_ok({0xcc}).kind, InsnKind::kTrap);
  EXPECT_EQ(decode_ok({0xcd, 0x80}).kind, InsnKind::kTrap);
  EXPECT_EQ(decode_ok({0x0f, 0x0b}).kind, InsnKind::kTrap);  // ud2
  EXPECT_EQ(decode_ok({0xf4}).kind, InsnKind::kPrivileged);  // hlt
  EXPECT_EQ(decode_ok({0xfa}).kind, InsnKind::kPrivileged);  // cli
  EXPECT_EQ(decode_ok({0x0f, 0x05}).kind, InsnKind::kSyscall);
  EXPECT_EQ(decode_ok({0xc7, 0xf8, 0x00, 0x00, 0x00, 0x00}).kind, InsnKind::kUnsupported);  // xbegin
}

TEST(Decode, RejectsTruncatedAndInvalidBytes) {
  Insn insn;
  const uint8_t truncated[] = {0x48, 0x8b, 0x05, 0x10};
  EXPECT_EQ(decode(truncated, sizeof truncated, 0x1000, &insn), -EILSEQ);
  const uint8_t invalid[] = {0x06};  // push es: invalid in 64-bit mode
  EXPECT_EQ(decode(invalid, sizeof invalid, 0x1000, &insn), -EILSEQ);
}

TEST(Boundary, ProvedByDecodingFromTheFunctionStart) {
  // push rbp; mov rbp,rsp; mov eax,1; pop rbp; ret
  const uint8_t f[] = {0x55, 0x48, 0x89, 0xe5, 0xb8, 0x01, 0x00, 0x00, 0x00, 0x5d, 0xc3};
  const uintptr_t s = 0x4000, e = s + sizeof f;
  for (uintptr_t ok : {s, s + 1, s + 4, s + 9, s + 10}) EXPECT_EQ(check_boundary(f, s, e, ok), 0) << ok - s;
  for (uintptr_t bad : {s + 2, s + 3, s + 5, s + 8}) EXPECT_EQ(check_boundary(f, s, e, bad), -EILSEQ) << bad - s;
  EXPECT_EQ(check_boundary(f, s, e, e), -EILSEQ);
  EXPECT_EQ(check_boundary(f, s, e, s - 1), -EILSEQ);
}

// The operand-size prefix turns a near branch's rel32 into a rel16: the instruction ends
// two bytes earlier, and decode must not read the displacement it would have had. The
// bytes sit at the very end of a readable page, so a read past them faults.
TEST(Decode, Rel16BranchesReadOnlyTheirOwnBytes) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  void* map = mmap(nullptr, 2 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(map, MAP_FAILED);
  auto* base = static_cast<uint8_t*>(map);
  ASSERT_EQ(mprotect(base + page, page, PROT_NONE), 0);
  const std::vector<std::vector<uint8_t>> forms = {
      {0x66, 0xe9, 0x10, 0x00},        // jmp rel16
      {0x66, 0xe8, 0x10, 0x00},        // call rel16
      {0x66, 0x0f, 0x84, 0x10, 0x00},  // je rel16
  };
  for (const auto& bytes : forms) {
    uint8_t* at = base + page - bytes.size();
    std::memcpy(at, bytes.data(), bytes.size());
    Insn insn;
    ASSERT_EQ(decode(at, bytes.size(), 0x1000, &insn), 0);
    EXPECT_EQ(insn.len, bytes.size());
    EXPECT_EQ(insn.kind, InsnKind::kUnsupported);
  }
  munmap(map, 2 * page);
}

}  // namespace
}  // namespace probefs::arch::x86_64
