// The unwind table contract (arch/unwind_table.h): the checks a table passes before the
// hit path trusts it, the row lookup, and the walk by the rows (arch/frame_walk.h,
// walk_unwind) over a stack laid out by hand. The tables of real objects, built by the
// daemon, are tests/tracee/unwind_tables_test.cc's.
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <vector>

#include "arch/frame_walk.h"
#include "arch/unwind_table.h"

namespace probefs::arch {
namespace {

constexpr uint64_t kStart = 0x400000;

UnwindRow row(uint32_t pc, uint8_t kind, int32_t cfa = 0, uint8_t bp_rule = kUnwindBpSame,
              int16_t bp = 0) {
  UnwindRow r;
  r.pc = pc;
  r.kind = kind;
  r.cfa_offset = cfa;
  r.bp_rule = bp_rule;
  r.bp_offset = bp;
  return r;
}

// A table for a mapping of `length` bytes, laid out as the contract says.
std::vector<uint64_t> table_of(uint64_t length, const std::vector<UnwindRow>& rows) {
  const uint64_t buckets = unwind_buckets(length);
  std::vector<uint64_t> words((unwind_table_bytes(rows.size(), buckets) + 7) / 8);
  auto* bytes = reinterpret_cast<uint8_t*>(words.data());
  UnwindTableHeader h;
  h.count = rows.size();
  h.buckets = buckets;
  std::memcpy(bytes, &h, sizeof h);
  auto* index = reinterpret_cast<uint32_t*>(bytes + sizeof h);
  size_t r = 0;
  for (uint64_t b = 0; b <= buckets; ++b) {
    while (r < rows.size() && (rows[r].pc >> kUnwindBucketShift) < b) ++r;
    index[b] = static_cast<uint32_t>(r);
  }
  std::memcpy(index + buckets + 1, rows.data(), rows.size() * sizeof(UnwindRow));
  return words;
}

// A function at 0 (push rbp; mov rsp,rbp; ...), one at 0x200 without a frame pointer
// (sub $0x28,rsp at 0x204), code nobody describes at 0x300, the thread's first function
// at 0x380.
const std::vector<UnwindRow> kRows = {
    row(0x000, kUnwindCfaSp, 8),
    row(0x001, kUnwindCfaSp, 16, kUnwindBpSaved, -16),
    row(0x004, kUnwindCfaBp, 16, kUnwindBpSaved, -16),
    row(0x200, kUnwindCfaSp, 8),
    row(0x204, kUnwindCfaSp, 48),
    row(0x300, kUnwindUnknown),
    row(0x380, kUnwindOutermost),
};
constexpr uint64_t kLength = 0x400;

TEST(UnwindTable, RowsAreFoundByTheBucketIndexAcrossBuckets) {
  const std::vector<uint64_t> t = table_of(kLength, kRows);
  UnwindTableView v;
  ASSERT_TRUE(unwind_table_view(t.data(), unwind_table_bytes(kRows.size(), unwind_buckets(kLength)),
                                kStart, kStart + kLength, &v));
  const std::map<uint64_t, uint32_t> want = {
      {0x000, 0x000}, {0x001, 0x001}, {0x003, 0x001}, {0x004, 0x004}, {0x150, 0x004},
      {0x1ff, 0x004}, {0x200, 0x200}, {0x203, 0x200}, {0x2ff, 0x204}, {0x300, 0x300},
      {0x37f, 0x300}, {0x3ff, 0x380}};
  for (const auto& [off, pc] : want) {
    const UnwindRow* r = unwind_row(v, kStart + off);
    ASSERT_NE(r, nullptr) << std::hex << off;
    EXPECT_EQ(r->pc, pc) << std::hex << off;
  }
  EXPECT_EQ(unwind_row(v, kStart - 1), nullptr);
  EXPECT_EQ(unwind_row(v, kStart + kLength), nullptr);
  // A table whose first row starts past the mapping's start has nothing before it.
  const std::vector<UnwindRow> late = {row(0x120, kUnwindCfaSp, 8)};
  const std::vector<uint64_t> t2 = table_of(kLength, late);
  ASSERT_TRUE(unwind_table_view(t2.data(), unwind_table_bytes(1, unwind_buckets(kLength)), kStart,
                                kStart + kLength, &v));
  EXPECT_EQ(unwind_row(v, kStart + 0x11f), nullptr);
  EXPECT_EQ(unwind_row(v, kStart + 0x120)->pc, 0x120u);
}

TEST(UnwindTable, AnythingButAWellFormedTableIsRefused) {
  const uint64_t bytes = unwind_table_bytes(kRows.size(), unwind_buckets(kLength));
  UnwindTableView v;
  auto refused = [&](std::vector<UnwindRow> rows, auto&& spoil, uint64_t size, uint64_t length) {
    std::vector<uint64_t> t = table_of(kLength, rows);
    spoil(reinterpret_cast<uint8_t*>(t.data()));
    return !unwind_table_view(t.data(), size, kStart, kStart + length, &v);
  };
  auto none = [](uint8_t*) {};
  EXPECT_FALSE(refused(kRows, none, bytes, kLength));
  EXPECT_TRUE(refused(kRows, [](uint8_t* p) { p[0] ^= 1; }, bytes, kLength));  // magic
  EXPECT_TRUE(refused(kRows, none, bytes - 4, kLength));                       // size
  EXPECT_TRUE(refused(kRows, none, bytes, kLength + 0x100));                   // buckets
  EXPECT_TRUE(refused(kRows, none, bytes, uint64_t{1} << 40));                 // too long
  EXPECT_TRUE(refused(kRows, [](uint8_t* p) { p[8] = 99; }, bytes, kLength));  // count
  // An index that goes down.
  EXPECT_TRUE(refused(kRows, [](uint8_t* p) { reinterpret_cast<uint32_t*>(p + 24)[1] = 5; },
                      bytes, kLength));
  std::vector<UnwindRow> rows = kRows;
  std::swap(rows[3], rows[4]);  // out of order (and in the wrong bucket)
  EXPECT_TRUE(refused(rows, none, bytes, kLength));
  // A row in another bucket than the index puts it: row 2 (bucket 0) moved to 0x104.
  const size_t rows_at = sizeof(UnwindTableHeader) + (unwind_buckets(kLength) + 1) * 4;
  EXPECT_TRUE(refused(kRows,
                      [&](uint8_t* p) {
                        const uint32_t pc = 0x104;
                        std::memcpy(p + rows_at + 2 * sizeof(UnwindRow), &pc, 4);
                      },
                      bytes, kLength));
  rows = kRows;
  rows[1].kind = 7;
  EXPECT_TRUE(refused(rows, none, bytes, kLength));
  rows = kRows;
  rows[1].bp_rule = 2;
  EXPECT_TRUE(refused(rows, none, bytes, kLength));
  rows = kRows;
  rows[6].pc = 0x400;  // past the mapping
  EXPECT_TRUE(refused(rows, none, bytes, kLength));
}

// Stack memory at chosen addresses; reads elsewhere fail.
struct FakeStack {
  uint64_t base = 0;
  std::vector<uint64_t> words;
  bool read(uint64_t addr, void* dst, size_t n) const {
    if (addr < base || addr + n > base + words.size() * 8 || addr + n < addr) return false;
    std::memcpy(dst, reinterpret_cast<const uint8_t*>(words.data()) + (addr - base), n);
    return true;
  }
  void put(uint64_t addr, uint64_t value) { words[(addr - base) / 8] = value; }
};

// A thread stopped at 0x210 (past the sub, CFA = sp + 48) in the function without a
// frame pointer, called from 0x10 of the frame-pointer function (CFA = rbp + 16, its
// caller's rbp saved at CFA - 16), called from 0x310 (no row: its frame by the
// frame-pointer chain), called from 0x390, the first function, where the walk ends.
TEST(UnwindTable, AWalkFollowsTheRowsAndTheFramePointersWhereThereAreNone) {
  const std::vector<uint64_t> t = table_of(kLength, kRows);
  UnwindTableView v;
  ASSERT_TRUE(unwind_table_view(t.data(), unwind_table_bytes(kRows.size(), unwind_buckets(kLength)),
                                kStart, kStart + kLength, &v));
  FakeStack st;
  st.base = 0x7000;
  st.words.resize(64);
  const uint64_t sp = 0x7000;
  const uint64_t cfa0 = sp + 48;             // 0x7030
  st.put(cfa0 - 8, kStart + 0x10);           // return into the fp function
  const uint64_t fp1 = cfa0 + 0x20;          // its rbp: CFA1 = fp1 + 16
  st.put(fp1 + 8, kStart + 0x310);           // its return address (CFA1 - 8)
  const uint64_t fp2 = fp1 + 0x40;           // the saved rbp at CFA1 - 16 = fp1
  st.put(fp1, fp2);
  st.put(fp2, fp2 + 0x20);                   // the unknown frame's caller's rbp
  st.put(fp2 + 8, kStart + 0x390);           // and its return address
  auto find = [&](uint64_t pc) { return unwind_row(v, pc); };
  auto same = [](uint64_t, uint64_t ra) { return ra; };
  uint64_t out[8] = {};
  // rbp at the stop is anything (the function has no frame pointer): the rows need none.
  uint32_t n = walk_unwind(st, kStart + 0x210, sp, fp1, false, out, 8, find, same);
  ASSERT_EQ(n, 3u);
  EXPECT_EQ(out[0], kStart + 0x10);
  EXPECT_EQ(out[1], kStart + 0x310);
  EXPECT_EQ(out[2], kStart + 0x390);  // the first function's frame ends the walk
  // Bounded by max, and the fix-up sees every slot.
  std::vector<uint64_t> slots;
  n = walk_unwind(st, kStart + 0x210, sp, fp1, false, out, 2, find,
                  [&](uint64_t slot, uint64_t ra) {
                    slots.push_back(slot);
                    return ra + 1;
                  });
  ASSERT_EQ(n, 2u);
  EXPECT_EQ(out[0], kStart + 0x11);
  EXPECT_EQ(slots, (std::vector<uint64_t>{cfa0 - 8, fp1 + 8}));
  // A frame whose CFA is not above the stack pointer ends the walk: a saved rbp that
  // points below the stack.
  st.put(fp1, 0x100);
  st.put(0x7000 + 8 * 40, 0);
  n = walk_unwind(st, kStart + 0x210, sp, fp1, false, out, 8, find, same);
  EXPECT_EQ(n, 2u);
  // No row for the stop: on a function's first instruction, the caller is at [sp].
  st.put(sp, kStart + 0x10);
  n = walk_unwind(st, kStart + 0x3f0 + 0x1000, sp, 0, true, out, 1,
                  [](uint64_t) -> const UnwindRow* { return nullptr; }, same);
  ASSERT_EQ(n, 1u);
  EXPECT_EQ(out[0], kStart + 0x10);
}

}  // namespace
}  // namespace probefs::arch
