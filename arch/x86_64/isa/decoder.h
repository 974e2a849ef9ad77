// The x86-64 instruction decoder (64-bit mode only): where an instruction's parts are and
// how long it is, from the encoding rules of the Intel SDM (vol. 2, ch. 2 and appendix A)
// and the AMD APM (vol. 3). Table driven, no allocation, no library: it runs inside traced
// processes. Internal to the ISA toolkit; insn.h's decode() classifies what it finds and
// shape.h reads operands from it.
//
//   [legacy prefixes] [REX] opcode                       one-byte map
//   [legacy prefixes] [REX] 0F opcode                    map 0F
//   [legacy prefixes] [REX] 0F 38|3A opcode              maps 0F38, 0F3A
//   [legacy prefixes] [REX] 0F 0F ModRM ... ib           3DNow! (the ib is the opcode)
//   [67] [segment] C5 xx | C4 xx xx  opcode              VEX maps 0F, 0F38, 0F3A
//   [67] [segment] 62 xx xx xx opcode                    EVEX maps 0F, 0F38, 0F3A, 5, 6
//   [67] [segment] 8F xx xx opcode                       XOP maps 8, 9, A (8F xx with
//                                                        xx & 0x1f >= 8; else pop r/m)
//   ... followed by [ModRM [SIB] [disp8|disp32]] [immediates]
#pragma once

#include <cstddef>
#include <cstdint>

namespace probefs::arch::x86_64::decoder {

enum class Encoding : uint8_t { kLegacy, kVex, kEvex, kXop };

// Opcode maps. The 3DNow! map is 0F 0F with its opcode in the trailing byte; VEX and EVEX
// use 1..3 for 0F, 0F38, 0F3A; EVEX adds 5 and 6; XOP has 8, 9 and 10.
enum Map : uint8_t {
  kMapOne = 0, kMap0F = 1, kMap0F38 = 2, kMap0F3A = 3, kMap3DNow = 4,
  kMapEvex5 = 5, kMapEvex6 = 6, kMapXop8 = 8, kMapXop9 = 9, kMapXopA = 10,
};

// Legacy prefixes seen (any order, any number; the last segment override counts).
enum Prefix : uint16_t {
  kPrefixLock = 1u << 0,
  kPrefixRep = 1u << 1,     // F3
  kPrefixRepne = 1u << 2,   // F2
  kPrefixOpSize = 1u << 3,  // 66
  kPrefixAddrSize = 1u << 4,  // 67
  kPrefixSegment = 1u << 5,   // any of 26 2E 36 3E 64 65
};

struct Decoded {
  uint8_t len = 0;
  uint8_t prefix_end = 0;   // first byte after the legacy prefixes and REX: the opcode, the
                            // 0F escape or the VEX/EVEX/XOP lead byte
  uint8_t opcode_at = 0;    // the opcode byte itself (3DNow!: its trailing byte)
  uint8_t opcode = 0;
  Encoding encoding = Encoding::kLegacy;
  Map map = kMapOne;

  uint16_t prefixes = 0;    // Prefix bits
  uint8_t segment = 0;      // the last segment override byte, 0 if none
  uint8_t mandatory = 0;    // the prefix that selects among forms: 0, 0x66, 0xf3 or 0xf2
                            // (the last of F2/F3, else 66); VEX/EVEX/XOP: from pp
  // REX in effect (0x40..0x4f, 0: none). For VEX/EVEX/XOP, W R X B of the payload in
  // REX's bit positions (with 0x40 set).
  uint8_t rex = 0;
  bool rex_ignored = false;  // a REX followed by another prefix: the CPU ignores it

  bool has_modrm = false;
  uint8_t modrm = 0;        // mov to/from CRn, DRn: recorded with mod 3 (mod is ignored)
  bool has_sib = false;
  uint8_t sib = 0;
  uint8_t disp_at = 0, disp_size = 0;  // disp_size 0, 1 or 4
  uint8_t imm_at = 0, imm_size = 0;    // the first immediate (or relative offset)
  uint8_t imm2_size = 0;               // a second one right after it (enter, extrq)

  // VEX/EVEX/XOP payload
  uint8_t vex_l = 0;      // vector length: 0 (128), 1 (256), 2 (512)
  uint8_t vex_vvvv = 0;   // the extra register operand, inverted back (0..15)

  // The known-instruction verdict: false when the length follows from the encoding rules
  // but the instruction is not one this decoder knows to exist (an unassigned VEX/EVEX/XOP
  // opcode, 3DNow!). Such instructions decode; their classification must not trust them.
  bool known = true;

  uint8_t mod() const { return modrm >> 6; }
  uint8_t reg() const { return (modrm >> 3) & 7; }
  uint8_t rm() const { return modrm & 7; }
  bool rex_w() const { return rex & 8; }
  bool memory() const { return has_modrm && mod() != 3; }
  // mod=00 rm=101: [rip + disp32] ([eip + disp32] under 67).
  bool rip_relative() const { return memory() && mod() == 0 && rm() == 5; }
};

// Decodes one instruction from code[0..avail) (at most 15 bytes are looked at). 0, or
// -EILSEQ when the bytes are not an instruction valid in 64-bit mode or run past avail.
int decode(const uint8_t* code, size_t avail, Decoded* out);

}  // namespace probefs::arch::x86_64::decoder
