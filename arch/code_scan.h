// Instructions in code read from a file, outside any process: where a probe may go in
// code that no symbol or FDE describes. The kernel's uprobes take any file offset and
// decode the instruction there when they install; probefs proves the offset is an
// instruction by decoding the code section that holds it from its first byte (sections
// such as .init, .plt and .fini are instructions end to end), and gives the engine that
// one instruction as the probe's bounds (tracee/probe_places.cc).
#pragma once

#include <cstddef>
#include <cstdint>

namespace probefs::arch {

// The length of the instruction at `addr` in code[0, n), the bytes of a section that
// starts at `start`, decoded from its first byte. 0 and *len, or -EILSEQ: `addr` falls
// inside an instruction, or bytes before it (or at it) do not decode.
int instruction_in_section(const uint8_t* code, size_t n, uintptr_t start, uintptr_t addr,
                           size_t* len);

}  // namespace probefs::arch
