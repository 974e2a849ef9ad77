// Holding the ISA toolkit's own decoder to Capstone 4, the oracle (capstone_oracle.h): the
// bytes of one instruction decoded both ways, every Insn field and the jump-table matcher's
// Shape compared, and each difference either put in a documented category or reported.
// Shared by the differential tests (decoder_diff_test.cc) and the fuzzer (fuzz_isa.cc).
#pragma once

#include <cstddef>
#include <cstdint>

namespace probefs::arch::x86_64::difftest {

// The documented ways the two legitimately differ (decoder_diff.cc says why for each).
enum class Category : uint8_t {
  kSame,               // both decode to the same fields, or both refuse the bytes
  kCapstoneFails,      // Capstone 4 cannot decode them (EVEX, newer instructions, ...);
                       // ours decodes to a sane length, or refuses too
  kUdModrm,            // ud0 / ud1 take a ModRM: Capstone 4 reads them without
  kOpsizeTransfer,     // 66 on a near transfer: vendor dependent; we refuse it, and read
                       // rel16 whatever other prefixes follow the 66
  kRetImmRexW,         // ret imm16 under REX.W: Capstone 4 reads a 4-byte immediate
  kOpsizeBeforeRep,    // 66 F2/F3 opcode: Capstone 4 drops the 66 for some opcodes
  kIgnoredRex,         // a REX followed by another prefix: we refuse the instruction
  kUnknownToUs,        // decodes by the encoding rules, not known to exist: refused
  kPrefixBeforeVex,    // 66/F2/F3/LOCK/REX before VEX/EVEX/XOP: #UD, we refuse the bytes
  kNotAnInstruction,   // Capstone 4 decodes bytes that are none: 3DNow! suffix 0E
  kCapstoneEvexBug,    // EVEX: Capstone 4 reads a byte after embedded rounding, and no
                       // disp32 after mod=00 rm=101 under 67
  kCapstoneAddr32Rel,  // 67 and REX.W before a near transfer: Capstone 4 reads a rel16
  kExtrqPrefixOrder,   // 0F 78/79 (vmread/extrq/insertq): Capstone 4 honours 66/F2 only
                       // right before the opcode
  kRefusedEitherWay,   // both never probe it (trap, privileged, unsupported), named apart
  kEipRelative,        // [eip + disp32] under 67: Capstone's kind was kPlain, we refuse
  kOursStricter,       // we never probe it (privileged, unsupported), Capstone 4 had it
                       // probeable
  kHintNop,            // Capstone says nop, we run it: reserved-nop opcodes (0F 18-1E),
                       // pause (F3 90) with another prefix between
  kShapeCapstoneBug,   // Capstone 4 misreports the registers written, a size or a name
  kUnexplained,        // a difference none of the above explains: a bug on one side
};

const char* category_name(Category c);

struct Verdict {
  Category category = Category::kSame;
  int our_len = 0;       // 0: ours refused the bytes
  int oracle_len = 0;    // 0: Capstone refused them
  char detail[200] = {};  // what differed (kUnexplained) or the bytes (any category)
};

// Compares the instruction at code[0..avail) as if at pc.
Verdict compare(const uint8_t* code, size_t avail, uintptr_t pc);

}  // namespace probefs::arch::x86_64::difftest
