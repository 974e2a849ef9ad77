// The ISA toolkit's own decoder on known answers from the encoding rules (Intel SDM vol. 2
// ch. 2 and appendix A): lengths, where the parts are, what is refused. The differential
// tests (x86_64/isa/decoder_diff_test.cc) hold it to Capstone over real code; these pin the
// cases a disassembler gets wrong or does not know.
#include "arch/x86_64/isa/decoder.h"

#include <gtest/gtest.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "arch/x86_64/isa/insn.h"
#include "arch/x86_64/isa/shape.h"

namespace probefs::arch::x86_64 {
namespace {

using Bytes = std::vector<uint8_t>;

// Decodes `b` with room for exactly its bytes: the length must be all of them.
Insn decode_all(const Bytes& b, uintptr_t pc = 0x401000) {
  Insn insn;
  EXPECT_EQ(decode(b.data(), b.size(), pc, &insn), 0);
  EXPECT_EQ(insn.len, b.size());
  return insn;
}

bool refuses(const Bytes& b) {
  Insn insn;
  return decode(b.data(), b.size(), 0x401000, &insn) == -EILSEQ;
}

TEST(Decoder, RepeatedPrefixesUpToFifteenBytes) {
  // 66 66 2e nopw 0x0(%rax,%rax,1): the padding compilers emit.
  const Insn nop = decode_all({0x66, 0x66, 0x2e, 0x0f, 0x1f, 0x84, 0x00, 0, 0, 0, 0});
  EXPECT_TRUE(nop.is_nop);
  EXPECT_EQ(nop.opcode_offset, 3);
  Bytes fourteen(14, 0x66);
  fourteen.push_back(0x90);
  EXPECT_EQ(decode_all(fourteen).len, 15);
  Bytes fifteen(15, 0x66);
  fifteen.push_back(0x90);
  EXPECT_TRUE(refuses(fifteen));  // 16 bytes: #GP
}

TEST(Decoder, RexCountsOnlyRightBeforeTheOpcode) {
  EXPECT_EQ(decode_all({0x48, 0x89, 0xc0}).kind, InsnKind::kPlain);
  // A REX followed by 66 is ignored by the CPU: the instruction decodes, never probed.
  EXPECT_EQ(decode_all({0x48, 0x66, 0x89, 0xc0}).kind, InsnKind::kUnsupported);
  decoder::Decoded d;
  const uint8_t rex_rex[] = {0x41, 0x48, 0xb8, 1, 2, 3, 4, 5, 6, 7, 8};
  ASSERT_EQ(decoder::decode(rex_rex, sizeof rex_rex, &d), 0);
  EXPECT_EQ(d.len, 11);  // the second REX (REX.W) makes the imm64
  EXPECT_TRUE(d.rex_ignored);
}

TEST(Decoder, ImmediateSizes) {
  EXPECT_EQ(decode_all({0x48, 0xb8, 1, 2, 3, 4, 5, 6, 7, 8}).len, 10);  // movabs rax, imm64
  decode_all({0xb8, 1, 2, 3, 4});                                       // mov eax, imm32
  decode_all({0x66, 0xb8, 1, 2});                                       // mov ax, imm16
  decode_all({0x66, 0x48, 0x05, 1, 2, 3, 4});  // add rax, imm32: REX.W wins over 66
  decode_all({0xa1, 1, 2, 3, 4, 5, 6, 7, 8});  // mov eax, moffs64
  decode_all({0x67, 0xa1, 1, 2, 3, 4});        // mov eax, moffs32
  decode_all({0xc8, 0x10, 0x00, 0x01});        // enter 16, 1
  decode_all({0xc2, 0x08, 0x00});              // ret 8
  decode_all({0xf6, 0xc1, 0x7f});              // test cl, 0x7f
  decode_all({0xf7, 0xc1, 1, 2, 3, 4});        // test ecx, imm32
  decode_all({0x66, 0xf7, 0xc1, 1, 2});        // test cx, imm16
  decode_all({0xf7, 0xd9});                    // neg ecx: no immediate
  decode_all({0xf6, 0xe1});                    // mul cl: no immediate
  decode_all({0x69, 0xc1, 1, 2, 3, 4});        // imul eax, ecx, imm32
  decode_all({0x6b, 0xc1, 0x10});              // imul eax, ecx, imm8
  decode_all({0x66, 0x0f, 0x78, 0xc0, 0x10, 0x20});  // extrq xmm0, 16, 32
  decode_all({0x0f, 0x78, 0xc0});                    // vmread rax, rax
}

TEST(Decoder, ModrmSibAndDisplacements) {
  const Insn rip = decode_all({0x48, 0x8b, 0x05, 0x10, 0, 0, 0});  // mov rax, [rip+16]
  EXPECT_EQ(rip.kind, InsnKind::kRipRelative);
  EXPECT_EQ(rip.disp_offset, 3);
  // SIB with base 101 and mod 00: [disp32] with no base, not rip-relative.
  EXPECT_EQ(decode_all({0x8b, 0x04, 0x25, 0x28, 0, 0, 0}).kind, InsnKind::kPlain);
  decode_all({0x8b, 0x44, 0x24, 0x08});             // mov eax, [rsp+8]
  decode_all({0x8b, 0x84, 0x24, 1, 2, 3, 4});       // mov eax, [rsp+disp32]
  decode_all({0x41, 0x8b, 0x45, 0x00});             // mov eax, [r13+0]
  decode_all({0x42, 0x8b, 0x04, 0xe5, 1, 2, 3, 4});  // mov eax, [r12*8+disp32]
  // mov to and from control registers: mod is ignored, no displacement ever.
  EXPECT_EQ(decode_all({0x0f, 0x20, 0x05}).kind, InsnKind::kPrivileged);
  // [eip + disp32]: its address wraps at 4 GiB, no copy reproduces it.
  EXPECT_EQ(decode_all({0x67, 0x8b, 0x05, 0, 0, 0, 0}).kind, InsnKind::kUnsupported);
}

TEST(Decoder, OpcodesInvalidInLongMode) {
  for (uint8_t op : {0x06, 0x07, 0x0e, 0x16, 0x17, 0x1e, 0x1f, 0x27, 0x2f, 0x37, 0x3f, 0x60,
                     0x61, 0x82, 0x9a, 0xce, 0xd4, 0xd5, 0xd6, 0xea}) {
    EXPECT_TRUE(refuses({op, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00})) << std::hex << int{op};
  }
  EXPECT_TRUE(refuses({0x0f, 0x04}));
  EXPECT_TRUE(refuses({0x0f, 0x38, 0x50, 0xc0}));     // unassigned in legacy 0F38
  EXPECT_TRUE(refuses({0xfe, 0xd0}));                 // group 4 has only inc and dec
  EXPECT_TRUE(refuses({0xff, 0xf8}));                 // group 5 /7
  EXPECT_TRUE(refuses({0xc7, 0xc8, 1, 2, 3, 4}));     // group 11 /1
  EXPECT_TRUE(refuses({0x48, 0x8b, 0x05, 0x10}));     // runs past the bytes given
}

TEST(Decoder, ReservedFormsDecodeButAreNeverProbed) {
  EXPECT_EQ(decode_all({0xf0, 0x01, 0x00}).kind, InsnKind::kPlain);        // lock add [rax], eax
  EXPECT_EQ(decode_all({0xf0, 0x01, 0xc0}).kind, InsnKind::kUnsupported);  // lock, register
  EXPECT_EQ(decode_all({0xf0, 0x90}).kind, InsnKind::kUnsupported);
  EXPECT_EQ(decode_all({0x8d, 0xc0}).kind, InsnKind::kUnsupported);        // lea, register
  EXPECT_EQ(decode_all({0x66, 0x0f, 0x52, 0xc1}).kind, InsnKind::kUnsupported);  // no 66 form
}

TEST(Decoder, TrapsWithModrm) {
  // ud1 and ud0 take a ModRM (clang's trap for sanitizers is ud1 with a displacement).
  EXPECT_EQ(decode_all({0x0f, 0xb9, 0x40, 0x10}).kind, InsnKind::kTrap);
  EXPECT_EQ(decode_all({0x0f, 0xff, 0xc0}).kind, InsnKind::kTrap);
  EXPECT_EQ(decode_all({0x0f, 0x0b}).kind, InsnKind::kTrap);
}

TEST(Decoder, VexEncodings) {
  EXPECT_EQ(decode_all({0xc5, 0xf8, 0x77}).kind, InsnKind::kPlain);  // vzeroupper
  decode_all({0xc5, 0xfd, 0x6f, 0xc1});                             // vmovdqa ymm0, ymm1
  decode_all({0xc4, 0xe3, 0x7d, 0x18, 0xc1, 0x01});                 // vinsertf128 imm8
  // vbroadcastss xmm0, [rip+0]
  const Insn b = decode_all({0xc4, 0xe2, 0x79, 0x18, 0x05, 0, 0, 0, 0});
  EXPECT_EQ(b.kind, InsnKind::kRipRelative);
  EXPECT_EQ(b.disp_offset, 5);
  EXPECT_EQ(b.opcode_offset, 0);
  // 66, F2, F3, LOCK or REX before VEX: #UD.
  EXPECT_TRUE(refuses({0x66, 0xc5, 0xf8, 0x77}));
  EXPECT_TRUE(refuses({0x48, 0xc5, 0xf8, 0x77}));
  EXPECT_EQ(decode_all({0x2e, 0xc5, 0xf8, 0x77}).len, 4);  // a segment prefix is fine
}

TEST(Decoder, EvexEncodingsCapstoneFourCannotDecode) {
  decode_all({0x62, 0xf1, 0x7c, 0x48, 0x28, 0xc1});                  // vmovaps zmm0, zmm1
  decode_all({0x62, 0xf1, 0x7c, 0x48, 0x28, 0x40, 0x01});            // disp8 (times 64)
  decode_all({0x62, 0xf3, 0x7d, 0x48, 0x3f, 0xc1, 0x00});            // vpcmpb k0, zmm0, zmm1, 0
  decode_all({0x62, 0xf2, 0x7d, 0x48, 0x50, 0xc1});                  // vpdpbusd
  decode_all({0x62, 0xf2, 0x7d, 0x48, 0x63, 0xc1});                  // vpcompressb
  decode_all({0x62, 0xf3, 0xfd, 0x48, 0x70, 0xc1, 0x01});            // vpshldw imm8
  decode_all({0x62, 0xf5, 0x7c, 0x48, 0x58, 0xc1});                  // vaddph (map 5)
  const Insn m = decode_all({0x62, 0xf1, 0xfe, 0x48, 0x6f, 0x05, 0, 0, 0, 0});
  EXPECT_EQ(m.kind, InsnKind::kRipRelative);  // vmovdqu64 zmm0, [rip+0]
  EXPECT_EQ(m.disp_offset, 6);
  EXPECT_TRUE(refuses({0x62, 0xf0, 0x7c, 0x48, 0x28, 0xc1}));  // map 0
  EXPECT_TRUE(refuses({0x62, 0xf1, 0x78, 0x48, 0x28, 0xc1}));  // P1 bit 2 clear
}

TEST(Decoder, XopAnd3DNowDecodeButAreNeverProbed) {
  EXPECT_EQ(decode_all({0x8f, 0xe8, 0x78, 0xa2, 0xc1, 0x20}).kind, InsnKind::kUnsupported);
  EXPECT_EQ(decode_all({0x8f, 0xea, 0x78, 0x10, 0xc0, 1, 2, 3, 4}).len, 9);  // bextr imm32
  EXPECT_EQ(decode_all({0x8f, 0xc0}).kind, InsnKind::kPlain);                // pop rax
  EXPECT_EQ(decode_all({0x0f, 0x0f, 0xc1, 0xb4}).kind, InsnKind::kUnsupported);  // pfmul
  EXPECT_TRUE(refuses({0x0f, 0x0f, 0xc1, 0xff}));
}

TEST(Decoder, NearTransfersUnderOperandSizeAreRefused) {
  EXPECT_EQ(decode_all({0x66, 0x74, 0x10}).kind, InsnKind::kUnsupported);  // je rel8
  EXPECT_EQ(decode_all({0x66, 0xc3}).kind, InsnKind::kUnsupported);
  EXPECT_EQ(decode_all({0x66, 0xff, 0xe0}).kind, InsnKind::kUnsupported);  // jmp ax
  // The TLS call sequence: data16 data16 rex.W call: REX.W makes it rel32.
  EXPECT_EQ(decode_all({0x66, 0x66, 0x48, 0xe8, 1, 2, 3, 4}).kind, InsnKind::kUnsupported);
  EXPECT_EQ(decode_all({0xf3, 0xc3}).kind, InsnKind::kRet);                // repz ret
  EXPECT_EQ(decode_all({0xf2, 0xe9, 0, 0, 0, 0}).kind, InsnKind::kJmpRel);  // bnd jmp
}

TEST(Shape, OperandsOfATableDispatch) {
  Shape s;
  // movslq (%rdx,%rax,4), %rax
  ASSERT_TRUE(shape_of(decode_all({0x48, 0x63, 0x04, 0x82}), &s));
  EXPECT_EQ(s.id, InsnId::kMovsxd);
  EXPECT_EQ(s.writes, 1u << 0);
  EXPECT_EQ(s.ops[1].type, Operand::kMem);
  EXPECT_EQ(s.ops[1].size, 4);
  EXPECT_EQ(s.ops[1].base, 2);
  EXPECT_EQ(s.ops[1].index, 0);
  EXPECT_EQ(s.ops[1].scale, 4);
  EXPECT_TRUE(s.ops[1].simple);
  // Without REX.W movsxd writes 32 bits: not a 64-bit entry load.
  ASSERT_TRUE(shape_of(decode_all({0x63, 0x04, 0x82}), &s));
  EXPECT_EQ(s.ops[0].size, 4);
  // notrack jmp *tbl(,%rax,8): the segment prefix makes the operand not simple.
  ASSERT_TRUE(shape_of(decode_all({0x3e, 0xff, 0x24, 0xc5, 0, 0, 0, 0}), &s));
  EXPECT_EQ(s.id, InsnId::kJmp);
  EXPECT_FALSE(s.ops[0].simple);
  // mov ah, 1: a high byte register of rax.
  ASSERT_TRUE(shape_of(decode_all({0xb4, 0x01}), &s));
  EXPECT_EQ(s.ops[0].reg, 0);
  EXPECT_TRUE(s.ops[0].high_byte);
  // test al, imm writes no register; cmpxchg is not followed (writes everything).
  ASSERT_TRUE(shape_of(decode_all({0xa8, 0x01}), &s));
  EXPECT_EQ(s.writes, 0u);
  ASSERT_TRUE(shape_of(decode_all({0x0f, 0xb1, 0x0a}), &s));
  EXPECT_EQ(s.id, InsnId::kUnknown);
  EXPECT_EQ(s.writes, 0xffffu);
}

TEST(Disassemble, NamesWhatTheToolkitKnows) {
  char text[96];
  auto dis = [&](const Bytes& b) {
    EXPECT_EQ(disassemble(b.data(), b.size(), 0x1000, text, sizeof text),
              static_cast<int>(b.size()));
    return std::string(text);
  };
  EXPECT_EQ(dis({0x48, 0x89, 0xe5}), "mov rbp, rsp");
  EXPECT_EQ(dis({0x48, 0x8b, 0x05, 0x10, 0, 0, 0}), "mov rax, qword ptr [rip + 0x10]");
  EXPECT_EQ(dis({0x48, 0x63, 0x04, 0x82}), "movsxd rax, dword ptr [rdx + rax*4]");
  EXPECT_EQ(dis({0xeb, 0x10}), "jmp 0x1012");
  EXPECT_EQ(dis({0x0f, 0x85, 0x10, 0, 0, 0}), "jne 0x1016");
  EXPECT_EQ(dis({0xff, 0xd0}), "call rax");
  EXPECT_EQ(dis({0xc3}), "ret");
  EXPECT_EQ(dis({0x0f, 0x58, 0xc1}), "(plain) 0f 58 c1");
  uint8_t bad[] = {0x06};
  EXPECT_EQ(disassemble(bad, sizeof bad, 0x1000, text, sizeof text), -EILSEQ);
}

}  // namespace
}  // namespace probefs::arch::x86_64
