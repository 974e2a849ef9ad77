// How to find a frame's caller in code built without frame pointers: a mapping's unwind
// table, the rows of its .eh_frame call-frame information reduced to what an x86-64
// walk needs (where the canonical frame address is, where the caller's rbp was saved),
// one row per range of code. The daemon builds it from the file with libdw, once per
// file range, and hands it to every traced process that maps the range (events/link.h,
// UNWIND) as a sealed memfd; the agent looks rows up on the hit path, in the target,
// without parsing any DWARF there. The layout below is the contract between the two.
//
//   header   u64 magic, u64 count (rows), u64 buckets
//   index    buckets + 1 u32: index[b] = the number of rows starting below b << kUnwindBucketShift
//   rows     count UnwindRow, ascending by pc, pc < the mapping's length
//
// with buckets = ceil(length / 2^kUnwindBucketShift). A row holds from its pc up to the
// next row's; code no FDE covers has a row of kind kUnwindUnknown.
//
// The x86-64 psABI's frames: the canonical frame address (CFA) is the stack pointer
// before the call, the return address sits at CFA - 8, and the caller's stack pointer is
// the CFA. What the row cannot express (a CFA given by a DWARF expression, as in the PLT,
// a return address elsewhere than CFA - 8, a signal frame) is kUnwindUnknown too.
#pragma once

#include <cstddef>
#include <cstdint>

namespace probefs::arch {

inline constexpr uint64_t kUnwindMagic = 0x31304457'4e554650ull;  // "PFUNWD01" in memory
inline constexpr unsigned kUnwindBucketShift = 8;
// The longest mapping a table describes (rows are numbered in 32 bits).
inline constexpr uint64_t kUnwindMaxLength = uint64_t{1} << 31;

enum UnwindKind : uint8_t {
  kUnwindUnknown = 0,    // no rule here: the walk steps by the frame pointer
  kUnwindCfaSp = 1,      // CFA = rsp + cfa_offset
  kUnwindCfaBp = 2,      // CFA = rbp + cfa_offset
  kUnwindOutermost = 3,  // the return address is undefined: the thread's first frame
};

enum UnwindBpRule : uint8_t {
  kUnwindBpSame = 0,   // the caller's rbp is this frame's rbp
  kUnwindBpSaved = 1,  // the caller's rbp is at CFA + bp_offset
};

struct UnwindRow {
  uint32_t pc = 0;          // offset of the row's first byte from the mapping's start
  int32_t cfa_offset = 0;
  int16_t bp_offset = 0;
  uint8_t kind = kUnwindUnknown;
  uint8_t bp_rule = kUnwindBpSame;
};
static_assert(sizeof(UnwindRow) == 12);

struct UnwindTableHeader {
  uint64_t magic = kUnwindMagic;
  uint64_t count = 0;
  uint64_t buckets = 0;
};

constexpr uint64_t unwind_buckets(uint64_t length) {
  return (length + (uint64_t{1} << kUnwindBucketShift) - 1) >> kUnwindBucketShift;
}

// A table's size in bytes, from its header's numbers.
constexpr uint64_t unwind_table_bytes(uint64_t count, uint64_t buckets) {
  return sizeof(UnwindTableHeader) + (buckets + 1) * 4 + count * sizeof(UnwindRow);
}

// One mapped table, checked (unwind_table_view) before any lookup trusts it.
struct UnwindTableView {
  uint64_t start = 0, end = 0;  // the mapping's run-time addresses
  const uint32_t* index = nullptr;
  const UnwindRow* rows = nullptr;
  uint64_t count = 0;
};

// The view of `bytes` bytes at `mem` as the table of mapping [start, end), or false when
// it is not one: a size other than its header says, an index that decreases or passes
// the count, rows out of order, past the mapping or in another bucket than the index
// puts them, an unknown kind. O(rows), once per table.
inline bool unwind_table_view(const void* mem, size_t bytes, uint64_t start, uint64_t end,
                              UnwindTableView* out) {
  if (end <= start || bytes < sizeof(UnwindTableHeader)) return false;
  const auto* h = static_cast<const UnwindTableHeader*>(mem);
  const uint64_t length = end - start;
  if (length > kUnwindMaxLength) return false;
  if (h->magic != kUnwindMagic || h->buckets != unwind_buckets(length) || h->count > length ||
      unwind_table_bytes(h->count, h->buckets) != bytes)
    return false;
  const auto* index = reinterpret_cast<const uint32_t*>(h + 1);
  const auto* rows = reinterpret_cast<const UnwindRow*>(index + h->buckets + 1);
  if (index[0] != 0 || index[h->buckets] != h->count) return false;
  for (uint64_t b = 0; b < h->buckets; ++b) {
    if (index[b] > index[b + 1]) return false;
    for (uint64_t i = index[b]; i < index[b + 1]; ++i) {
      const UnwindRow& r = rows[i];
      if ((r.pc >> kUnwindBucketShift) != b || r.kind > kUnwindOutermost ||
          r.bp_rule > kUnwindBpSaved || (i > 0 && rows[i - 1].pc >= r.pc))
        return false;
    }
  }
  *out = {start, end, index, rows, h->count};
  return true;
}

// The row that holds address `pc` of the view's mapping, or nullptr (outside it, or
// before its first row).
inline const UnwindRow* unwind_row(const UnwindTableView& t, uint64_t pc) {
  if (pc < t.start || pc >= t.end) return nullptr;
  const uint64_t off = pc - t.start;
  const uint64_t b = off >> kUnwindBucketShift;
  // The last row starting at or below off: in this bucket, else the one before it.
  // A bucket holds a few rows: a scan beats a search's unpredictable branches.
  uint32_t i = t.index[b];
  const uint32_t end = t.index[b + 1];
  while (i < end && t.rows[i].pc <= off) ++i;
  return i == 0 ? nullptr : &t.rows[i - 1];
}

}  // namespace probefs::arch
