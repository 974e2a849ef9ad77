// A binary's USDT probe points (SystemTap's SDT notes, `.note.stapsdt`), as perf probe
// reads them for its `sdt_PROVIDER:NAME` events: where each point is, its semaphore,
// and its arguments as fetch arguments of the kernel's uprobe syntax. Read from the file
// alone (no probe cache).
//
// A note (owner "stapsdt", type 3): u64 pc, u64 base, u64 semaphore (0: none), then the
// provider, the name and the argument spec, each NUL-terminated. The addresses are the
// link-time ones, to be moved by the difference between .stapsdt.base's address and
// `base` when the object was prelinked. An argument: "[-]SIZE@OPERAND" (a negative size
// is signed), OPERAND an x86-64 register (%eax), a memory operand (-16(%rbp)) or an
// immediate ($5).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "tools/elf_image.h"
#include "tools/result.h"
#include "tools/trace_probe.h"

namespace probefs::tools {

struct SdtNote {
  std::string provider;
  std::string name;
  uint64_t pc = 0;         // link-time address of the point
  uint64_t semaphore = 0;  // link-time address of its u16 semaphore; 0: none
  std::string args;        // the argument spec as the note has it
};

// Every SDT note of the object, in the order of its notes. A note that does not read as
// one is skipped.
std::vector<SdtNote> sdt_notes(const ElfImage& image);

// Argument `index` (from 1: perf's arg1, arg2 ...) of a note's spec, as a fetch argument:
// "-4@%edx" is arg1=%dx:s32, "8@-16(%rbp)" arg2=-16(%bp):u64, "4@$5" arg3=\5:u32. An
// operand the kernel's fetch arguments cannot say (a %rip-relative symbol, an index
// register) is an error naming it.
Result<TraceArg> sdt_argument(std::string_view spec, int index);

// The spec's arguments, split at blanks.
std::vector<std::string> sdt_argument_specs(std::string_view args);

}  // namespace probefs::tools
