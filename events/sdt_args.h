// A USDT point's arguments as fetch arguments. A SystemTap SDT note says where each
// argument of its point is, as an assembler operand with a size ("-4@%eax 8@-16(%rbp)
// 4@$5": SIZE@OPERAND, a negative size for a signed value). A kprobe-syntax definition on
// an SDT point (`[MOD:]%PROVIDER:NAME`) reads them as $arg1..$argN; the daemon binds each
// to the operand of the note at every place the point has (one point may be at several
// places, each with operands of its own).
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "events/definition.h"

namespace probefs::events {

struct SdtOperand {
  enum class Kind : uint8_t { kRegister, kMemory, kImmediate };
  Kind kind = Kind::kRegister;
  uint8_t size = 8;        // bytes: 1, 2, 4 or 8
  bool is_signed = false;
  int reg_offset = 0;      // kRegister, kMemory: the register's offset in PtRegs
  int64_t disp = 0;        // kMemory: DISP(%reg)
  uint64_t imm = 0;        // kImmediate
};

// The operands of a note's argument spec, in order. False when one is not a register, a
// base register with a displacement, or an immediate (a %rip-relative symbol, an index
// register): those cannot be read as fetch arguments, and *bad is its index (from 0).
bool parse_sdt_args(std::string_view spec, std::vector<SdtOperand>* out, size_t* bad);

// Binds every $argN load of def's arguments to operand N of the point (`operands`), in
// place. False when an argument cannot be bound: *bad_arg is its index in def.args, *why
// kBadArgNum ($argN past the last operand) or kTooManyOps (a memory operand's
// dereference would make it longer than a fetch program may be).
bool bind_sdt_args(ProbeDefinition* def, const std::vector<SdtOperand>& operands,
                   size_t* bad_arg, ErrorCode* why);

}  // namespace probefs::events
