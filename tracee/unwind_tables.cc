#include "tracee/unwind_tables.h"

#include <dwarf.h>
#include <elfutils/libdw.h>
#include <gelf.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>

#include "arch/unwind_table.h"
#include "tracee/eh_frame.h"

namespace probefs::tracee {

namespace {

constexpr int kRegBp = 6, kRegSp = 7, kRegRa = 16;  // DWARF numbers (x86-64 psABI)

using arch::UnwindRow;

template <class T>
bool fits(int64_t v) {
  return v >= std::numeric_limits<T>::min() && v <= std::numeric_limits<T>::max();
}

// CFA + n, as libdw writes an offset(N) rule: DW_OP_call_frame_cfa, DW_OP_plus_uconst N
// (N taken as signed). false for any other shape.
bool cfa_plus(const Dwarf_Op* ops, size_t nops, int64_t* n) {
  if (nops == 1 && ops[0].atom == DW_OP_call_frame_cfa) {
    *n = 0;
    return true;
  }
  if (nops != 2 || ops[0].atom != DW_OP_call_frame_cfa) return false;
  if (ops[1].atom == DW_OP_plus_uconst || ops[1].atom == DW_OP_consts) {
    *n = static_cast<int64_t>(ops[1].number);
    return true;
  }
  return false;
}

// One row of frame f, whose return address is in DWARF register ra.
UnwindRow row_of(Dwarf_Frame* f, int ra, bool signal) {
  UnwindRow unknown;
  if (signal || ra != kRegRa) return unknown;
  Dwarf_Op mem[3];
  Dwarf_Op* ops = nullptr;
  size_t nops = 0;
  // The return address: at CFA - 8, or undefined in the outermost frame.
  if (dwarf_frame_register(f, kRegRa, mem, &ops, &nops) != 0) return unknown;
  if (nops == 0 && ops == mem) {
    UnwindRow outermost;
    outermost.kind = arch::kUnwindOutermost;
    return outermost;
  }
  int64_t at = 0;
  if (!cfa_plus(ops, nops, &at) || at != -8) return unknown;
  // The CFA: a register plus an offset.
  if (dwarf_frame_cfa(f, &ops, &nops) != 0 || nops != 1) return unknown;
  int64_t reg = -1, off = 0;
  if (ops[0].atom == DW_OP_bregx) {
    reg = static_cast<int64_t>(ops[0].number);
    off = static_cast<int64_t>(ops[0].number2);
  } else if (ops[0].atom >= DW_OP_breg0 && ops[0].atom <= DW_OP_breg31) {
    reg = ops[0].atom - DW_OP_breg0;
    off = static_cast<int64_t>(ops[0].number);
  }
  if ((reg != kRegSp && reg != kRegBp) || !fits<int32_t>(off)) return unknown;
  UnwindRow row;
  row.kind = reg == kRegSp ? arch::kUnwindCfaSp : arch::kUnwindCfaBp;
  row.cfa_offset = static_cast<int32_t>(off);
  // The caller's rbp: this frame's (same value, or undefined: nothing better is known),
  // or saved at CFA + n.
  if (dwarf_frame_register(f, kRegBp, mem, &ops, &nops) != 0) return unknown;
  if (nops != 0) {
    if (!cfa_plus(ops, nops, &at) || !fits<int16_t>(at)) return unknown;
    row.bp_rule = arch::kUnwindBpSaved;
    row.bp_offset = static_cast<int16_t>(at);
  }
  return row;
}

bool same_rule(const UnwindRow& a, const UnwindRow& b) {
  return a.kind == b.kind && a.cfa_offset == b.cfa_offset && a.bp_rule == b.bp_rule &&
         a.bp_offset == b.bp_offset;
}

// A PT_LOAD segment's file bytes, as the mapping sees them.
struct Segment {
  uint64_t vaddr = 0, filesz = 0, offset = 0;
};

}  // namespace

int build_unwind_table(Elf* elf, uint64_t offset, uint64_t length, std::vector<uint8_t>* out) {
  if (length == 0 || length > arch::kUnwindMaxLength) return -EINVAL;
  // The segments whose file bytes the mapping holds, by which an FDE's address becomes
  // an offset in the mapping.
  std::vector<Segment> segments;
  size_t phnum = 0;
  if (elf_getphdrnum(elf, &phnum) != 0) return -ENOENT;
  for (size_t i = 0; i < phnum; ++i) {
    GElf_Phdr ph;
    if (gelf_getphdr(elf, static_cast<int>(i), &ph) == nullptr || ph.p_type != PT_LOAD) continue;
    if (ph.p_offset + ph.p_filesz <= offset || ph.p_offset >= offset + length) continue;
    segments.push_back({ph.p_vaddr, ph.p_filesz, ph.p_offset});
  }
  // The mapping offset of vaddr, or UINT64_MAX when the mapping does not hold it.
  auto to_mapping = [&](uint64_t vaddr) -> uint64_t {
    for (const Segment& s : segments) {
      if (vaddr - s.vaddr >= s.filesz) continue;
      const uint64_t file_off = s.offset + (vaddr - s.vaddr);
      if (file_off >= offset && file_off - offset < length) return file_off - offset;
    }
    return UINT64_MAX;
  };
  EhFrame eh;
  eh.load(elf);
  Dwarf_CFI* cfi = dwarf_getcfi_elf(elf);
  if (cfi == nullptr || eh.fdes().empty()) {
    if (cfi != nullptr) dwarf_cfi_end(cfi);
    return -ENOENT;
  }
  std::unique_ptr<Dwarf_CFI, int (*)(Dwarf_CFI*)> cfi_owner(cfi, dwarf_cfi_end);

  std::vector<UnwindRow> rows;
  auto emit = [&](uint64_t pc, UnwindRow row) {
    row.pc = static_cast<uint32_t>(pc);
    if (!rows.empty() && rows.back().pc == row.pc) {
      rows.back() = row;  // an FDE that starts where the last one's gap row is
      if (rows.size() >= 2 && same_rule(rows[rows.size() - 2], row)) rows.pop_back();
      return;
    }
    if (!rows.empty() && same_rule(rows.back(), row)) return;
    rows.push_back(row);
  };
  uint64_t covered_to = 0;  // mapping offset where the last FDE's code ends
  for (const FdeRange& fde : eh.fdes()) {
    if (rows.size() >= kUnwindMaxRows) break;
    const uint64_t start = to_mapping(fde.start);
    if (start == UINT64_MAX || fde.end <= fde.start) continue;
    // The FDE's end, within the mapping (an FDE never spans segments in real objects).
    const uint64_t span = std::min<uint64_t>(fde.end - fde.start, length - start);
    if (start < covered_to) continue;  // overlapping FDEs: the first one's rows stand
    if (start > covered_to) emit(covered_to, UnwindRow{});
    uint64_t a = fde.start;
    size_t n = 0;
    while (a < fde.start + span) {
      UnwindRow row;
      uint64_t next = fde.start + span;
      Dwarf_Frame* f = nullptr;
      if (n < kUnwindMaxRowsPerFde && dwarf_cfi_addrframe(cfi, a, &f) == 0) {
        Dwarf_Addr s = 0, e = 0;
        bool signal = false;
        const int ra = dwarf_frame_info(f, &s, &e, &signal);
        if (e > a && e < next) next = e;
        row = row_of(f, ra, signal);
        std::free(f);
      }
      emit(start + (a - fde.start), row);
      ++n;
      a = next;
    }
    covered_to = start + span;
  }
  if (rows.empty()) return -ENOENT;
  if (covered_to < length) emit(covered_to, UnwindRow{});

  const uint64_t buckets = arch::unwind_buckets(length);
  out->assign(arch::unwind_table_bytes(rows.size(), buckets), 0);
  arch::UnwindTableHeader h;
  h.count = rows.size();
  h.buckets = buckets;
  std::memcpy(out->data(), &h, sizeof h);
  auto* index = reinterpret_cast<uint32_t*>(out->data() + sizeof h);
  size_t r = 0;
  for (uint64_t b = 0; b <= buckets; ++b) {
    while (r < rows.size() && (rows[r].pc >> arch::kUnwindBucketShift) < b) ++r;
    index[b] = static_cast<uint32_t>(r);
  }
  std::memcpy(out->data() + sizeof h + (buckets + 1) * 4, rows.data(),
              rows.size() * sizeof(UnwindRow));
  return 0;
}

namespace {

int build(int file, const Mapping& m, std::vector<uint8_t>* table) {
  if (elf_version(EV_CURRENT) == EV_NONE) return -ENOSYS;
  Elf* elf = elf_begin(file, ELF_C_READ, nullptr);
  if (elf == nullptr) return -ENOEXEC;
  const int rc = build_unwind_table(elf, m.offset, m.end - m.start, table);
  elf_end(elf);
  return rc;
}

}  // namespace

UnwindTables::UnwindTables()
    : MappingTables("probefs-unwind", {kMaxMappingBytes, kMaxTables, kMaxCachedBytes}, build) {}

}  // namespace probefs::tracee
