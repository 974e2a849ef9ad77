// Instructions as the jump-table matcher of optimize_check.cc sees them: an identity from a
// short list, the first two operands, and the general-purpose registers written. Internal
// to the ISA toolkit (and its tests, which compare it with a disassembler's view).
#pragma once

#include <cstdint>

#include "arch/x86_64/isa/insn.h"

namespace probefs::arch::x86_64 {

// The identities the matcher knows; everything else is kUnknown and "writes every
// register". kJmp (jmp r/m) is named for its operand only: its writes are not followed.
enum class InsnId : uint8_t {
  kUnknown,
  kMov, kMovabs, kMovzx, kMovsx, kMovsxd, kLea,
  kAdd, kSub, kAnd, kOr, kXor, kCmp, kTest,
  kShl, kShr, kSar, kInc, kDec, kNeg, kNot,
  kNop, kEndbr64, kPush, kPop, kCdqe,
  kJmp,
};

struct Operand {
  enum Type : uint8_t { kNone, kReg, kImm, kMem };
  Type type = kNone;
  uint8_t size = 0;   // bytes
  int reg = -1;       // kReg: GPR family (0 = rax .. 15 = r15), -1 for any other register
  bool high_byte = false;  // kReg: ah, ch, dh or bh (family 0..3, size 1)
  int64_t imm = 0;    // kImm
  // kMem. `simple`: no segment override, 64-bit addressing, base and index are GPRs (or
  // absent; the base may be rip). Only simple operands take part in a table pattern.
  bool simple = false;
  bool rip = false;
  int base = -1, index = -1;
  int scale = 1;
  int64_t disp = 0;
};

struct Shape {
  InsnId id = InsnId::kUnknown;
  uint8_t count = 0;    // operands (those of an unknown identity are not decoded: 0)
  Operand ops[2];
  uint16_t writes = 0;  // GPR families written, one bit each
};

// false when the bytes do not decode. Control plane only.
bool shape_of(const Insn& insn, Shape* out);

}  // namespace probefs::arch::x86_64
