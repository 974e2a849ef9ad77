// The ISA toolkit's decoding and operand reading as they were when Capstone did them: the
// oracle the differential tests hold our own decoder to. Test code only; Capstone stays
// behind this header.
#pragma once

#include <cstddef>
#include <cstdint>

#include "arch/x86_64/isa/insn.h"
#include "arch/x86_64/isa/shape.h"

namespace probefs::arch::x86_64::oracle {

// decode() as Capstone 4 made it (insn.h).
int decode(const uint8_t* code, size_t avail, uintptr_t pc, Insn* out);

// shape_of() as Capstone 4 made it, its identities named by ours. `capstone_id` (may be
// nullptr) receives Capstone's own instruction id.
bool shape_of(const Insn& insn, Shape* out, unsigned* capstone_id = nullptr);

// Capstone's "mnemonic operands", and the length (or -EILSEQ).
int disassemble(const uint8_t* code, size_t avail, uintptr_t pc, char* buf, size_t bufsize);

// Capstone's length alone (0 when it cannot decode), up to 15 bytes.
int length(const uint8_t* code, size_t avail, uintptr_t pc);

}  // namespace probefs::arch::x86_64::oracle
