// The daemon's half of arch/unwind_table.h: the unwind table of each executable file
// mapping a target has, built from the file's .eh_frame with libdw's CFI reader once per
// file range, and handed to the traced processes that want stacks (events/link.h,
// UNWIND) as a sealed memfd.
#pragma once

#include <libelf.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "tracee/mapping_tables.h"

namespace probefs::tracee {

// What one object can make the daemon spend on its table (a target chooses its files):
// rows read per FDE and in all. libdw computes a row from the FDE's start, so an FDE of
// k rows costs k*k/2 steps; past either bound the rest of the code is left without rows
// (the walk steps by frame pointers there). Far above real code: glibc's largest FDE has
// a few dozen rows, and all of libc some 30,000.
inline constexpr size_t kUnwindMaxRowsPerFde = 512;
inline constexpr size_t kUnwindMaxRows = size_t{2} << 20;

// The unwind table (arch/unwind_table.h) of the bytes at file offset [offset, offset +
// length) of `elf` as a mapping of them: 0, or -ENOENT (no .eh_frame, or no FDE in the
// range), -EINVAL (length 0 or past arch::kUnwindMaxLength).
int build_unwind_table(Elf* elf, uint64_t offset, uint64_t length, std::vector<uint8_t>* out);

class UnwindTables : public MappingTables {
 public:
  static constexpr uint64_t kMaxMappingBytes = uint64_t{256} << 20;
  static constexpr size_t kMaxTables = 64;
  static constexpr uint64_t kMaxCachedBytes = uint64_t{128} << 20;

  UnwindTables();
};

}  // namespace probefs::tracee
