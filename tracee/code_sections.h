// The code sections of an object file, read from the file: where a uprobe's file offset
// falls in code that no symbol or FDE describes (.init, .plt, .fini), the instruction
// there is found by decoding the executable section that holds it from its start
// (arch/code_scan.h). The file is any file a target maps: every byte of it is checked.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>

namespace probefs::tracee {

// The largest code section read to prove an offset in it (libc's .text is 1.5 MiB).
inline constexpr uint64_t kMaxCodeSectionBytes = 64u << 20;

// Reads n bytes at file offset `at` into out: false when they are not all there.
using FileBytes = std::function<bool(uint64_t at, void* out, size_t n)>;

// The length of the instruction at file offset `offset` of the 64-bit ELF object `file`
// reads, proven by decoding from its start the executable section (SHF_EXECINSTR, with
// bytes in the file) that holds it. 0 and *len, or a negative errno: -EILSEQ inside an
// instruction (or bytes that do not decode before it), -ENOENT in no code section,
// -ENOEXEC not such an object, -EFBIG a section over kMaxCodeSectionBytes.
int section_instruction(const FileBytes& file, uint64_t offset, size_t* len);

}  // namespace probefs::tracee
