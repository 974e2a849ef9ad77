// Jump optimization: a probe's int3 becomes a 5-byte jmp to a detour that saves the
// registers, runs the handlers through the shared thunk (optprobe_thunk.S), runs a
// relocated copy of the replaced instructions and jumps back. No trap on the hit path.
//
// A detour holds blocks that share the copy. Each starts with a header the thunk reads
// through the return address its call pushed (R); frame_layout.h (DETOUR_*) is the layout,
// shared with the thunks' assembly:
//   header: ctx cell, thunk, addr, miss_back, call-mode trampoline
// (the thunks of blocks C and L are _entry ones, see optprobe_thunk.S)
//   lea -128(%rsp),%rsp ; call *thunk(%rip) ; R:
//
// Block P, at the start (plain):
//   R:  lea 128(%rsp),%rsp
//       relocated region ; jmp addr+len   (at DETOUR_REGION_COPY)
// Block C, after it (call mode), the entry of a function with a return probe:
//   R:  lea 136(%rsp),%rsp      the return address is in a kretprobe instance: drop it
//       call P's copy           run the function as a call of ours, so its ret is predicted
//       jmp *trampoline(%rip)   and lands in the call-mode trampoline
// When no handler hijacked the return address on a hit (the instance pool was empty, an
// entry handler declined), the thunk returns to block P instead: miss_back = C - P.
// Block L is block C with the lean entry thunk (DetourEntry::kCallLean). Each comes twice:
// with the return trampoline that saves the vector registers and with the one that does
// not (return handlers that touch general-purpose registers only).
#include <link.h>

#include <algorithm>
#include <cstddef>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <initializer_list>
#include <map>
#include <vector>

#include "arch/branch_targets.h"
#include "arch/self_memory.h"
#include "arch/testing.h"
#include "arch/warn.h"
#include "arch/x86_64/cpu_state.h"
#include "arch/x86_64/frame_layout.h"
#include "arch/x86_64/near_alloc.h"
#include "arch/x86_64/rel32_scan.h"
#include "arch/x86_64/isa/optimize_check.h"
#include "arch/x86_64/isa/relocate.h"
#include "arch/x86_64/site.h"
#include "arch/x86_64/text_patch.h"
#include "arch/x86_64/thread_fixup.h"

extern "C" {
void probefs_optprobe_thunk_gpr();
void probefs_optprobe_thunk_sse();
void probefs_optprobe_thunk_avx();
void probefs_optprobe_thunk_avx512();
void probefs_optprobe_thunk_gpr_entry();
void probefs_optprobe_thunk_sse_entry();
void probefs_optprobe_thunk_avx_entry();
void probefs_optprobe_thunk_avx512_entry();
void probefs_optprobe_thunk_lean_entry();
extern char probefs_optprobe_thunks_begin[], probefs_optprobe_thunks_end[];
void probefs_kretprobe_trampoline_call_gpr();
void probefs_kretprobe_trampoline_call_sse();
void probefs_kretprobe_trampoline_call_avx();
void probefs_kretprobe_trampoline_call_avx512();
}

namespace probefs::arch {

using namespace x86_64;

// The detour's header lives in read+exec memory like its code; what changes at run time,
// the context, lives in a cell of ordinary memory that the header points to.
struct Detour {
  DetourHeader header;
  uint8_t code[];  // the block's code, from the call into the thunk on
};
static_assert(offsetof(Detour, code) == DETOUR_CALL_THUNK);

namespace {

// The few fixed instructions of a detour block, emitted at `at` into the detour's buffer.
// Targets are offsets in the same buffer, so displacements do not depend on where it will
// live; each is computed from where its instruction ends.
struct BlockEmitter {
  uint8_t* code;
  size_t at;

  void put(std::initializer_list<uint8_t> bytes) {
    for (uint8_t b : bytes) code[at++] = b;
  }
  void put32(int32_t v) {
    std::memcpy(code + at, &v, 4);
    at += 4;
  }
  // lea disp(%rsp),%rsp
  void lea_rsp(int32_t disp) {
    if (disp >= -128 && disp < 128) {
      put({0x48, 0x8d, 0x64, 0x24, static_cast<uint8_t>(disp)});
    } else {
      put({0x48, 0x8d, 0xa4, 0x24});
      put32(disp);
    }
  }
  // call/jmp *slot(%rip), slot an offset in the buffer
  void call_indirect(size_t slot) {
    put({0xff, 0x15});
    put32(rel_to(slot));
  }
  void jmp_indirect(size_t slot) {
    put({0xff, 0x25});
    put32(rel_to(slot));
  }
  // call target, an offset in the buffer
  void call(size_t target) {
    put({0xe8});
    put32(rel_to(target));
  }

 private:
  int32_t rel_to(size_t target) const {  // from the end of a rel32 field starting at `at`
    return static_cast<int32_t>(static_cast<int64_t>(target) - static_cast<int64_t>(at + 4));
  }
};

struct DetourInfo {
  Detour* detour;       // block P, the start of the detour's memory
  uint32_t size;        // of that memory: blocks P, C and L and the region's copy
  Detour* call_blocks[4];  // C, C with the lean thunk (L); each with vector, gpr return
  uint8_t region_len;
  uint8_t count;
  uint8_t orig_off[kJmpRel32Len + 1];   // instruction k at addr + orig_off[k]
  uint8_t copy_off[kJmpRel32Len + 1];   // and at detour + DETOUR_REGION_COPY + copy_off[k]
};

struct DetourKey {
  uintptr_t addr;
  bool save_vector;
  size_t len;
  uint8_t bytes[kMaxInsnLen * kJmpRel32Len];
  bool operator<(const DetourKey& o) const {
    if (addr != o.addr) return addr < o.addr;
    if (save_vector != o.save_vector) return save_vector < o.save_vector;
    if (len != o.len) return len < o.len;
    return std::memcmp(bytes, o.bytes, len) < 0;
  }
};

// Detours, interned like out-of-line copies: never freed, so a thread still inside one
// always finds it intact. (g_text_mu)
std::map<DetourKey, DetourInfo>& g_detours = *new std::map<DetourKey, DetourInfo>;
// The detour each prepared site uses; erased when the site is released.
std::map<const Site*, DetourInfo>& g_site_detours = *new std::map<const Site*, DetourInfo>;

// Direct branches into a region from other functions (glibc's __mempcpy_* jumps into the
// middle of __memmove_*, past its first instruction). The function-local check cannot see
// those. A linear sweep of a whole mapping with the decoder would (it took 0.45 s for
// libc, in the first control operation that touched it); instead:
//  - long branches (call, jmp, jcc rel32) can come from anywhere: once per mapping, a scan
//    of its bytes marks every byte that some position's bytes, read as such a branch,
//    land on (rel32_scan.h). That is a superset of the real targets, a bit per byte. A
//    traced process that starts is handed the tables of libc and of the objects its
//    probes go into by the daemon, built once per file (arch/branch_targets.h);
//  - short branches (jmp, jcc, loop, jrcxz rel8) can come only from within 128 bytes: the
//    bytes around the region are scanned the same way, per region.
// A region none of whose inner bytes is marked is safe from long branches. Otherwise each
// candidate that lands there (the scan keeps them all, unsorted: a region is rarely hit)
// is a real branch when a linear sweep from kResyncBytes before it lands on it (or on prefixes just
// before it); the sweep finds its footing within a few instructions, as a sweep from the
// mapping's start would. (g_text_mu)
//
// A mapping of a file whose table the daemon handed over (arch/branch_targets.h) is not
// swept at all: the table has the bits, and its candidates sorted by target, so that a
// region's are found by a search.
struct MappingBranches {
  uintptr_t start = 0, end = 0;
  arch::MappingKey key;
  std::vector<uint64_t> bits;        // Rel32Targets over [start, end), when swept here
  const uint64_t* given = nullptr;   // or the daemon's table's
  const uint64_t* given_candidates = nullptr;  // sorted by target
  size_t given_count = 0;
  // Every candidate as (target << 32 | source), offsets from start, in the order found:
  // what a region some candidate lands in is checked against (a pass, not a search).
  std::vector<uint64_t> candidates;  // when swept here

  Rel32Targets targets() {
    return {given ? const_cast<uint64_t*>(given) : bits.data(), end - start};
  }
};
std::vector<MappingBranches>& g_mapping_branches = *new std::vector<MappingBranches>;
constexpr size_t kResyncBytes = 128;

// The daemon's tables, by mapping (provide_branch_table). Bounded: each is a mapping the
// process keeps. (g_text_mu)
struct GivenTable {
  arch::MappingKey key;
  const uint64_t* bits;
  const uint64_t* candidates;
  size_t count;
};
constexpr size_t kMaxGivenTables = 256;
std::vector<GivenTable>& g_given_tables = *new std::vector<GivenTable>;

bool find_exec_mapping(uintptr_t addr, MappingBranches* out) {
  FILE* f = std::fopen("/proc/self/maps", "re");
  if (!f) return false;
  char line[512];
  bool found = false;
  while (std::fgets(line, sizeof line, f)) {
    unsigned long lo, hi, off, inode;
    char perms[8];
    unsigned dev_major, dev_minor;
    if (std::sscanf(line, "%lx-%lx %7s %lx %x:%x %lu", &lo, &hi, perms, &off, &dev_major,
                    &dev_minor, &inode) != 7)
      continue;
    if (addr >= lo && addr < hi && perms[2] == 'x') {
      out->start = lo;
      out->end = hi;
      out->key = {dev_major, dev_minor, inode, off, hi - lo};
      found = true;
      break;
    }
  }
  std::fclose(f);
  return found;
}

// dl_iterate_phdr's counters of objects loaded and unloaded: while they stay the same, the
// mappings of the objects found before are still theirs, and /proc/self/maps need not be
// read again for them.
struct DlCounters {
  unsigned long long adds = 0, subs = 0;
  bool operator==(const DlCounters&) const = default;
};

int dl_counters_cb(dl_phdr_info* info, size_t size, void* data) {
  auto* c = static_cast<DlCounters*>(data);
  if (size >= offsetof(dl_phdr_info, dlpi_subs) + sizeof info->dlpi_subs) {
    c->adds = info->dlpi_adds;
    c->subs = info->dlpi_subs;
  }
  return 1;  // the first object carries them
}

// Calls fn(source, target) for every candidate rel32 branch of mapping m, both as offsets
// from its start, reading the code as it is without our patches. In chunks through one
// buffer (no copy of the whole mapping), each chunk overlapping the next by the bytes of
// a branch that starts at its end. false when the code could not be read.
template <class Fn>
bool scan_mapping(const MappingBranches& m, Fn&& fn) {
  constexpr size_t kChunk = 256 * 1024, kTail = 5;
  static uint8_t* const buf = new uint8_t[kChunk + kTail];
  const size_t size = m.end - m.start;
  for (size_t at = 0; at < size; at += kChunk) {
    const size_t n = std::min(kChunk + kTail, size - at);
    if (!read_self_memory_all(m.start + at, buf, n)) return false;
    const uintptr_t lo = m.start + at;
    for (auto it = g_saved.lower_bound(lo); it != g_saved.end() && it->first < lo + n; ++it)
      buf[it->first - lo] = it->second;
    for_each_rel32(buf, n, std::min(kChunk, n), [&](size_t q, int64_t target) {
      fn(at + q, static_cast<int64_t>(at) + target);
    });
  }
  return true;
}

// Fills m.bits and m.candidates from a sweep of its bytes.
bool sweep(MappingBranches& m) {
  const size_t size = m.end - m.start;
  m.bits.assign(branch_table_words(size), 0);
  m.candidates.reserve(size / 24);
  Rel32Targets t = m.targets();
  return scan_mapping(m, [&](size_t source, int64_t target) {
    if (target < 0 || static_cast<uint64_t>(target) >= size) return;
    t.mark(target);
    m.candidates.push_back(static_cast<uint64_t>(target) << 32 | source);
  });
}

MappingBranches* branches_of_mapping(uintptr_t addr) {
  static DlCounters seen{~0ull, ~0ull};
  DlCounters now;
  dl_iterate_phdr(dl_counters_cb, &now);
  if (now == seen) {
    for (MappingBranches& b : g_mapping_branches)
      if (addr >= b.start && addr < b.end) return &b;
  }
  seen = now;
  MappingBranches m;
  if (!find_exec_mapping(addr, &m)) return nullptr;
  for (MappingBranches& b : g_mapping_branches)
    if (b.start == m.start && b.end == m.end && b.key == m.key) return &b;
  const size_t size = m.end - m.start;
  if (size > UINT32_MAX) return nullptr;  // offsets are kept in 32 bits
  for (const GivenTable& g : g_given_tables) {
    if (g.key == m.key && m.key.inode != 0) {
      m.given = g.bits;
      m.given_candidates = g.candidates;
      m.given_count = g.count;
    }
  }
  if (!m.given && !sweep(m)) return nullptr;
  g_mapping_branches.push_back(std::move(m));
  return &g_mapping_branches.back();
}

bool is_prefix(uint8_t b) {
  switch (b) {
    case 0x26: case 0x2e: case 0x36: case 0x3e: case 0x64: case 0x65: case 0x66: case 0x67:
    case 0xf0: case 0xf2: case 0xf3:
      return true;
    default:
      return false;
  }
}

// The bytes the linear sweep for `at` reads: from kResyncBytes before it (or the mapping's
// start) to an instruction's length after it.
struct SweepWindow {
  uintptr_t at;
  uintptr_t from;
  size_t n;
};
SweepWindow sweep_window(uintptr_t at, const MappingBranches& m) {
  const uintptr_t from = at - std::min<uintptr_t>(at - m.start, kResyncBytes);
  return {at, from, static_cast<size_t>(std::min<uintptr_t>(at + kMaxInsnLen, m.end) - from)};
}
constexpr size_t kSweepWindowBytes = kResyncBytes + kMaxInsnLen;

// Is `at` the opcode of an instruction in a linear sweep of `code` (w's bytes as read)
// from w.from (at its start, or after prefixes)? Sees code as it is without our patches.
bool decodes_as_instruction_in(uint8_t* code, const SweepWindow& w) {
  const uintptr_t from = w.from, at = w.at;
  const size_t n = w.n;
  for (auto it = g_saved.lower_bound(from); it != g_saved.end() && it->first < from + n; ++it)
    code[it->first - from] = it->second;
  for (uintptr_t pc = from; pc <= at;) {
    Insn insn;
    if (decode(code + (pc - from), n - (pc - from), pc, &insn) != 0) {
      ++pc;
      continue;
    }
    if (pc == at) return true;
    if (pc < at && at < pc + insn.len && at - pc <= 4) {
      bool prefixes = true;
      for (uintptr_t q = pc; q < at; ++q) prefixes = prefixes && is_prefix(code[q - from]);
      if (prefixes) return true;
    }
    pc += insn.len;
  }
  return false;
}

bool decodes_as_instruction(uintptr_t at, const MappingBranches& m) {
  const SweepWindow w = sweep_window(at, m);
  uint8_t code[kSweepWindowBytes];
  if (!read_self_memory_all(w.from, code, w.n)) return true;  // unreadable: assume the worst
  return decodes_as_instruction_in(code, w);
}

// Whether any of the direct branches at `sources` (addresses in mapping m) is a real one
// (decodes_as_instruction), reading their code in batches of one system call each: a
// region of libc can have dozens of candidate branches into it.
bool any_decodes_as_instruction(const uintptr_t* sources, size_t count, const MappingBranches& m) {
  constexpr size_t kBatch = 32;
  struct IoVec {  // struct iovec, without libc's headers
    void* base;
    size_t len;
  };
  uint8_t code[kBatch][kSweepWindowBytes];  // 4.5 KiB: control operations only
  for (size_t at = 0; at < count; at += kBatch) {
    const size_t k = std::min(kBatch, count - at);
    SweepWindow w[kBatch];
    IoVec local[kBatch], remote[kBatch];
    long want = 0;
    for (size_t i = 0; i < k; ++i) {
      w[i] = sweep_window(sources[at + i], m);
      local[i] = {code[i], w[i].n};
      remote[i] = {reinterpret_cast<void*>(w[i].from), w[i].n};
      want += static_cast<long>(w[i].n);
    }
    const long got = raw_syscall(__NR_process_vm_readv, self_memory_pid(),
                                 reinterpret_cast<long>(local), static_cast<long>(k),
                                 reinterpret_cast<long>(remote), static_cast<long>(k), 0);
    for (size_t i = 0; i < k; ++i) {
      // A batch cut short (an unreadable window): the rest one by one.
      const bool read = got == want;
      if (read ? decodes_as_instruction_in(code[i], w[i]) : decodes_as_instruction(w[i].at, m))
        return true;
    }
  }
  return false;
}

// Does a direct branch from anywhere in the mapping land strictly inside (addr, addr+len)?
bool branch_into_region_from_anywhere(uintptr_t addr, size_t len) {
  MappingBranches* b = branches_of_mapping(addr);
  if (!b) return true;  // unknown: assume the worst
  const uintptr_t lo = b->start;
  const size_t from_target = addr - lo + 1, to_target = addr - lo + len;  // [from, to)
  if (b->targets().any(from_target, to_target)) {
    auto lands = [&](uint64_t target) { return target - from_target < to_target - from_target; };
    std::vector<uintptr_t> sources;
    if (b->given) {  // the candidates that land here, by a search
      const uint64_t* c = std::lower_bound(b->given_candidates,
                                           b->given_candidates + b->given_count,
                                           static_cast<uint64_t>(from_target) << 32);
      for (; c != b->given_candidates + b->given_count && lands(*c >> 32); ++c)
        sources.push_back(lo + (*c & 0xffffffffu));
    } else {
      for (uint64_t c : b->candidates)
        if (lands(c >> 32)) sources.push_back(lo + (c & 0xffffffffu));
    }
    if (any_decodes_as_instruction(sources.data(), sources.size(), *b)) return true;
  }
// Short branches: their opcode lies within [addr - 129, addr + len + 126].
  const uintptr_t from = std::max(lo, addr - std::min<uintptr_t>(addr, 130));
  const uintptr_t to = std::min(b->end, addr + len + 128);
  uint8_t code[130 + kMaxInsnLen * kJmpRel32Len + 128 + 2];
  if (to <= from + 2 || to - from > sizeof code || !read_self_memory_all(from, code, to - from))
    return true;
  for (auto it = g_saved.lower_bound(from); it != g_saved.end() && it->first < to; ++it)
    code[it->first - from] = it->second;
  std::vector<uintptr_t> sources;
  for (uintptr_t q = from; q + 2 <= to; ++q) {
    const uint8_t op = code[q - from];
    if (op != 0xeb && (op & 0xf0) != 0x70 && (op < 0xe0 || op > 0xe3)) continue;
    const uintptr_t target = q + 2 + static_cast<int8_t>(code[q - from + 1]);
    if (target > addr && target < addr + len) sources.push_back(q);
  }
  return any_decodes_as_instruction(sources.data(), sources.size(), *b);
}

// The context cell of every detour at a probe address, whatever its kind: one per address,
// never freed (a thread inside a detour may still read it). (g_text_mu)
void* volatile* context_cell(uintptr_t addr) {
  static std::map<uintptr_t, void* volatile*>& cells = *new std::map<uintptr_t, void* volatile*>;
  void* volatile*& cell = cells[addr];
  if (!cell) cell = new void* volatile(nullptr);
  return cell;
}

bool read_for_check(void*, uintptr_t addr, void* buf, size_t n) {
  return read_self_memory_all(addr, buf, n);
}

int build_detour(const OptimizeRegion& region, bool save_vector, DetourInfo* out) {
  DetourKey key{};
  key.addr = region.addr;
  key.save_vector = save_vector;
  for (unsigned k = 0; k < region.count; ++k) {
    std::memcpy(key.bytes + key.len, region.insns[k].bytes, region.insns[k].len);
    key.len += region.insns[k].len;
  }
  if (auto it = g_detours.find(key); it != g_detours.end()) {
    *out = it->second;
    return 0;
  }

  const size_t copy_cap = region.count * kMaxRelocatedLen + kJmpAbsLen;
  constexpr size_t kCallBlockStride = (DETOUR_CALL_BLOCK_LEN + 7) & ~size_t{7};
  const size_t cap = DETOUR_REGION_COPY + copy_cap + 7 + 4 * kCallBlockStride;
  void* mem = alloc_near(region.addr, cap);
  if (!mem) return -ENOMEM;
  const auto base = reinterpret_cast<uintptr_t>(mem);
  std::vector<uint8_t> code(cap, 0xcc);
  auto address = [](void (*f)()) { return reinterpret_cast<uintptr_t>(f); };
  // The thunks and trampolines that save vector registers save what this CPU has.
  using Code = void (*)();
  static const Code kThunks[] = {probefs_optprobe_thunk_sse, probefs_optprobe_thunk_avx,
                                 probefs_optprobe_thunk_avx512};
  static const Code kEntryThunks[] = {probefs_optprobe_thunk_sse_entry,
                                      probefs_optprobe_thunk_avx_entry,
                                      probefs_optprobe_thunk_avx512_entry};
  static const Code kCallTrampolines[] = {probefs_kretprobe_trampoline_call_sse,
                                          probefs_kretprobe_trampoline_call_avx,
                                          probefs_kretprobe_trampoline_call_avx512};
  const int level = vector_level() - 1;
  const uint64_t thunk = address(save_vector ? kThunks[level] : probefs_optprobe_thunk_gpr);
  const uint64_t entry_thunk =
      address(save_vector ? kEntryThunks[level] : probefs_optprobe_thunk_gpr_entry);
  void* volatile* cell = context_cell(region.addr);
  // A block's header and its call into the thunk; returns an emitter at R.
  auto put_block = [&](size_t at, uint64_t thunk, uint64_t miss_back, uint64_t trampoline) {
    const DetourHeader header{cell, thunk, region.addr, miss_back, trampoline};
    std::memcpy(code.data() + at, &header, sizeof header);
    BlockEmitter e{code.data(), at + DETOUR_CALL_THUNK};
    e.lea_rsp(-RED_ZONE);
    e.call_indirect(at + DETOUR_THUNK);
    return e;
  };
  // The layout is fixed (the thunks read the header through R): an emitter that disagrees
  // with it is a bug here, and the detour is not used.
  bool layout_ok = true;
  auto check = [&](const BlockEmitter& e, size_t block, size_t offset) {
    layout_ok &= !PROBEFS_WARN_ON_ONCE(e.at != block + offset,
                                       "detour code does not match frame_layout.h");
  };

  // Block P.
  BlockEmitter p = put_block(0, thunk, 0, 0);
  check(p, 0, DETOUR_R);
  p.lea_rsp(RED_ZONE);
  check(p, 0, DETOUR_REGION_COPY);
  DetourInfo info{};
  info.detour = static_cast<Detour*>(mem);
  info.size = static_cast<uint32_t>(cap);
  info.region_len = region.len;
  info.count = region.count;
  size_t at = DETOUR_REGION_COPY;
  uint8_t orig = 0;
  for (unsigned k = 0; k < region.count; ++k) {
    const Insn& insn = region.insns[k];
    info.orig_off[k] = orig;
    info.copy_off[k] = static_cast<uint8_t>(at - DETOUR_REGION_COPY);
    int n = relocate(insn, base + at, code.data() + at, DETOUR_REGION_COPY + copy_cap - at);
    if (n < 0) return n;
    at += static_cast<size_t>(n);
    orig = static_cast<uint8_t>(orig + insn.len);
  }
  info.orig_off[region.count] = orig;
  info.copy_off[region.count] = static_cast<uint8_t>(at - DETOUR_REGION_COPY);
  at += emit_jmp(code.data() + at, base + at, region.addr + region.len);

  // Blocks C and L, 8-aligned after the copy.
  auto put_call_block = [&](size_t c, uint64_t block_thunk, uint64_t trampoline) {
    BlockEmitter e = put_block(c, block_thunk, c, trampoline);
    check(e, c, DETOUR_R);
    e.lea_rsp(RED_ZONE + 8);
    check(e, c, DETOUR_CALL_COPY);
    e.call(DETOUR_REGION_COPY);
    check(e, c, DETOUR_CALL_JMP_TRAMPOLINE);
    e.jmp_indirect(c + DETOUR_CALL_TRAMPOLINE);
    check(e, c, DETOUR_CALL_BLOCK_LEN);
    return reinterpret_cast<Detour*>(base + c);
  };
  const uint64_t lean_thunk = address(probefs_optprobe_thunk_lean_entry);
  const uint64_t tramp_vector = address(kCallTrampolines[level]);
  const uint64_t tramp_gpr = address(probefs_kretprobe_trampoline_call_gpr);
  const uint64_t thunks[4] = {entry_thunk, entry_thunk, lean_thunk, lean_thunk};
  const uint64_t trampolines[4] = {tramp_vector, tramp_gpr, tramp_vector, tramp_gpr};
  at = (at + 7) & ~size_t{7};
  for (int k = 0; k < 4; ++k) {
    info.call_blocks[k] = put_call_block(at, thunks[k], trampolines[k]);
    at += kCallBlockStride;
  }
  if (!layout_ok) return -EINVAL;
  if (int rc = text_poke(base, code.data(), at); rc) return rc;
  g_detours.emplace(key, info);
  *out = info;
  return 0;
}

// [start, end) as it is with no probe armed (g_saved holds what our writes replaced).
// Requires g_text_mu.
bool text_without_probes(uintptr_t start, uintptr_t end, std::vector<uint8_t>* out) {
  out->resize(end - start);
  if (!read_self_memory_all(start, out->data(), out->size())) return false;
  for (auto it = g_saved.lower_bound(start); it != g_saved.end() && it->first < end; ++it)
    (*out)[it->first - start] = it->second;
  return true;
}

// Where the site's jmp goes: the block of its detour for its kind of entry.
uintptr_t jmp_target(const Site* site) {
  const DetourInfo& d = g_site_detours.at(site);
  const int k = (site->detour_entry == DetourEntry::kCallLean ? 2 : 0) +
                (site->detour_return_saves_vector ? 0 : 1);
  const Detour* entry = site->detour_entry == DetourEntry::kPlain ? d.detour : d.call_blocks[k];
  return reinterpret_cast<uintptr_t>(entry->code);
}

// Where a thread may be that would come back into the middle of s's region once its jmp
// is written, and where it goes instead (the kernel waits for every task to leave the
// out-of-line code instead, with synchronize_rcu_tasks; here the parked threads are
// looked at):
//  - on one of the region's instructions after the first: to its copy in s's detour;
//  - in a boosted copy of one of them, made for this probe or any earlier one there (a
//    thread may sit in one long after its probe went): at its start, to the detour's copy
//    of the instruction; on its jmp back, to the copy of the next;
//  - in the detour of another region that overlaps this one (a neighbour that was
//    optimized before this probe arrived, whose threads may not have left it): from an
//    instruction inside this region, to the same instruction's copy here; from anywhere
//    else in it, when that detour's way out lands inside this region, nowhere: the batch
//    waits (`hazards`), as it does for a thread in a thunk or a handler a detour called,
//    which may return into such a detour.
void add_region_moves(const Site* s, std::vector<IpMove>* moves, std::vector<CodeRange>* hazards) {
  const DetourInfo& d = g_site_detours.at(s);
  const uintptr_t start = s->addr, end = s->addr + d.region_len;
  const uintptr_t copy = reinterpret_cast<uintptr_t>(s->detour) + DETOUR_REGION_COPY;
  auto copy_of = [&](uintptr_t a) -> uintptr_t {  // 0: not an instruction of the region
    for (unsigned k = 0; k < d.count; ++k)
      if (start + d.orig_off[k] == a) return copy + d.copy_off[k];
    return 0;
  };
  for (unsigned k = 1; k < d.count; ++k) moves->push_back({start + d.orig_off[k], copy + d.copy_off[k]});
  for (unsigned k = 0; k < d.count; ++k) {
    for (const BoostCopy& b : boost_copies_at(start + d.orig_off[k])) {
      moves->push_back({b.start, copy + d.copy_off[k]});
      if (b.jmp_back && k + 1 < d.count) moves->push_back({b.jmp_back, copy + d.copy_off[k + 1]});
    }
  }
  DetourKey from{};
  from.addr = start - std::min<uintptr_t>(start, kMaxInsnLen * kJmpRel32Len);
  for (auto it = g_detours.lower_bound(from); it != g_detours.end() && it->first.addr < end; ++it) {
    const uintptr_t o_start = it->first.addr;
    const DetourInfo& o = it->second;
    const uintptr_t o_end = o_start + o.region_len;
    if (o_start == start || o_end <= start) continue;  // the same region, or one before it
    const uintptr_t o_copy = reinterpret_cast<uintptr_t>(o.detour) + DETOUR_REGION_COPY;
    const bool exits_inside = o_end > start && o_end < end;
    if (exits_inside) {  // a thread anywhere in it but where moved waits for the batch
      const auto base = reinterpret_cast<uintptr_t>(o.detour);
      hazards->push_back({base, base + o.size});
    }
    for (unsigned j = 0; j < o.count; ++j) {
      const uintptr_t a = o_start + o.orig_off[j];
      const uintptr_t at = o_copy + o.copy_off[j];
      if (a >= start && a < end) moves->push_back({at, copy_of(a)});
      else if (a < start && exits_inside) moves->push_back({at, 0});
    }
    if (exits_inside) moves->push_back({o_copy + o.copy_off[o.count], copy_of(o_end)});
  }
}

}  // namespace

int prepare_optimized(Site* site, uintptr_t func_start, uintptr_t func_end,
                      const FunctionEntries& outside, bool save_vector, DetourEntry entry,
                      bool return_saves_vector, const char** why) {
  std::lock_guard lock(g_text_mu);
  *why = "";
  const bool same_entry = site->detour_entry == entry &&
                          site->detour_return_saves_vector == return_saves_vector;
  if (site->detour && site->detour_saves_vector == save_vector && same_entry) return 0;
  if (site->optimized) return -EBUSY;
  if (site->detour && site->detour_saves_vector == save_vector) {  // same detour, other entry
    site->detour_entry = entry;
    site->detour_return_saves_vector = return_saves_vector;
    return 0;
  }
  if (site->gone) {
    *why = "the code is gone";
    return -EINVAL;
  }
  if (func_end <= func_start || func_end - func_start > (1u << 20)) {
    *why = "function bounds unknown";
    return -EINVAL;
  }
  std::vector<uint8_t> code;
  if (!text_without_probes(func_start, func_end, &code)) {
    *why = "function not readable";
    return -EINVAL;
  }
  // Split-off parts are checked as they are with no probe armed, like the function.
  std::vector<std::vector<uint8_t>> related_code(outside.n_related);
  std::vector<RelatedCode> related(outside.n_related);
  for (size_t i = 0; i < outside.n_related; ++i) {
    const TextRange& t = outside.related[i];
    if (t.end <= t.start || t.end - t.start > (1u << 20) ||
        !text_without_probes(t.start, t.end, &related_code[i])) {
      *why = "split-off part of the function not readable";
      return -EINVAL;
    }
    related[i] = {related_code[i].data(), t.start, t.end};
  }
  const OutsideEntries entries{related.data(), related.size(), outside.landing_pads,
                               outside.n_landing_pads};
  OptimizeRegion region{};
  const OptimizeRefusal r = check_optimizable(code.data(), func_start, func_end, site->addr,
                                              read_for_check, nullptr, entries, &region);
  if (r != OptimizeRefusal::kNone) {
    *why = refusal_text(r);
    return -EINVAL;
  }
  if (branch_into_region_from_anywhere(region.addr, region.len)) {
    *why = "a jump from other code lands in the replaced instructions";
    return -EINVAL;
  }
  DetourInfo info;
  if (int rc = build_detour(region, save_vector, &info); rc) {
    *why = "no memory for a detour within reach";
    return rc;
  }
  g_site_detours[site] = info;
  // A detour of the other kind left behind shares the context cell: a thread still on its
  // way through it finds the probes' current context, and runs those its detour saved
  // enough for.
  site->detour = info.detour;
  site->detour_saves_vector = save_vector;
  site->detour_entry = entry;
  site->detour_return_saves_vector = return_saves_vector;
  site->region_len = region.len;
  return 0;
}

uintptr_t site_region_end(const Site* site) {
  return site->addr + (site->region_len ? site->region_len : 1);
}

void set_optimized_context(Site* site, void* ctx) {
  if (site->detour) __atomic_store_n(site->detour->header.ctx_cell, ctx, __ATOMIC_RELEASE);
}

bool site_optimized(const Site* site) { return site->optimized; }

size_t optimize(Site* const* sites, size_t n, void (*wait_for_handlers)()) {
  std::unique_lock lock(g_text_mu);
  std::vector<Site*> batch;
  for (size_t i = 0; i < n; ++i) {
    Site* s = sites[i];
    if (s->detour && !s->gone && !s->optimized) batch.push_back(s);
  }
  if (batch.empty()) return 0;

  // Everything that allocates happens before any thread is parked: the moves, the jmps,
  // and the original bytes they replace (kept in g_saved, for read_text and unoptimize).
  struct Patch {
    Site* site;
    bool was_armed;
    bool ok;
    uint8_t jmp[kJmpRel32Len];
    uint8_t original[kJmpRel32Len];
  };
  std::vector<Patch> patches;
  std::vector<IpMove> moves;
  std::vector<CodeRange> hazards;
  bool any_armed = false;
  for (Site* s : batch) {
    Patch p{s, s->armed, true, {}, {}};
    // No other probe lies in the region (probecore checks), so these bytes are the
    // original code, but for an armed site's int3.
    if (PROBEFS_WARN_ON_ONCE(!read_self_memory_all(s->addr, p.original, kJmpRel32Len),
                             "could not read the code under a probe being optimized"))
      continue;
    p.original[0] = s->insn.bytes[0];
    emit_jmp(p.jmp, s->addr, jmp_target(s));
    add_region_moves(s, &moves, &hazards);
    any_armed |= s->armed;
    for (unsigned i = p.was_armed ? 1 : 0; i < kJmpRel32Len; ++i) g_saved[s->addr + i] = p.original[i];
    patches.push_back(p);
  }
  if (patches.empty()) return 0;
  auto forget_originals = [&](const Patch& p) {
    for (unsigned i = p.was_armed ? 1 : 0; i < kJmpRel32Len; ++i) g_saved.erase(p.site->addr + i);
    p.site->detour_resume.store(0, std::memory_order_release);
  };

  // 1. Every new int3 hit on an armed site resumes in a detour's copy of the whole region;
  // 2. handlers that started before that may still resume into the region itself: wait.
  for (const Patch& p : patches)
    p.site->detour_resume.store(reinterpret_cast<uintptr_t>(p.site->detour) + DETOUR_REGION_COPY,
                                std::memory_order_release);
  if (any_armed) {
    lock.unlock();
    wait_for_handlers();
    lock.lock();
  }

  // 3. Running threads stop (parked in a signal handler; those on a region or in a boosted
  // copy move to the detour's copy first). None of them can now reach an int3 with SIGTRAP
  // blocked: a thread that blocks signals while running postpones the batch.
  if (!hazards.empty()) {
    hazards.push_back({reinterpret_cast<uintptr_t>(probefs_optprobe_thunks_begin),
                       reinterpret_cast<uintptr_t>(probefs_optprobe_thunks_end)});
    std::sort(hazards.begin(), hazards.end(),
              [](const CodeRange& a, const CodeRange& b) { return a.start < b.start; });
    hazards.erase(std::unique(hazards.begin(), hazards.end(),
                              [](const CodeRange& a, const CodeRange& b) {
                                return a.start == b.start;
                              }),
                  hazards.end());
  }
  if (park_threads(moves.data(), moves.size(), hazards.data(), hazards.size()) != 0) {
    for (const Patch& p : patches) forget_originals(p);
    return 0;
  }

  // 4. Sites not armed yet take an int3 for the write (a thread asleep in the kernel that
  // wakes meanwhile traps and resumes in the detour); then the jmp: tail, barrier, first
  // byte, barrier. No allocation and no lock from here to unpark: a write that fails puts
  // back what it replaced, and the site is left as it was.
  const uint8_t int3 = kInt3;
  bool wrote_int3 = false;
  for (Patch& p : patches) {
    if (p.was_armed) continue;
    p.ok = !PROBEFS_WARN_ON_ONCE(text_poke(p.site->addr, &int3, 1) != 0,
                                 "could not write the int3 that guards a jmp being written");
    wrote_int3 |= p.ok;
  }
  if (wrote_int3) text_sync();
  for (Patch& p : patches) {
    if (!p.ok) continue;
    if (PROBEFS_WARN_ON_ONCE(text_poke(p.site->addr + 1, p.jmp + 1, kJmpRel32Len - 1) != 0,
                             "could not write an optimized probe's jmp")) {
      p.ok = false;
      PROBEFS_WARN_ON_ONCE(text_poke(p.site->addr + 1, p.original + 1, kJmpRel32Len - 1) != 0,
                           "could not put back the bytes under a jmp that failed");
    }
  }
  text_sync();
  size_t optimized = 0;
  for (Patch& p : patches) {
    if (!p.ok) continue;
    if (PROBEFS_WARN_ON_ONCE(text_poke(p.site->addr, p.jmp, 1) != 0,
                             "could not write the first byte of an optimized probe's jmp")) {
      p.ok = false;
      PROBEFS_WARN_ON_ONCE(text_poke(p.site->addr + 1, p.original + 1, kJmpRel32Len - 1) != 0,
                           "could not put back the bytes under a jmp that failed");
      continue;
    }
    p.site->armed = true;
    p.site->optimized = true;
    ++optimized;
  }
  text_sync();
  // A site that was not armed goes back to its original bytes.
  bool restored = false;
  for (Patch& p : patches) {
    if (p.ok || p.was_armed || p.site->optimized) continue;
    restored = true;
    PROBEFS_WARN_ON_ONCE(text_poke(p.site->addr, p.original, 1) != 0,
                         "could not take back the int3 of a jmp that failed");
  }
  if (restored) text_sync();
  unpark_threads();
  for (const Patch& p : patches)
    if (!p.ok) forget_originals(p);
  return optimized;
}

// Parks the running threads around a window in which an int3 stands on a site, so that
// none of them can meet it with SIGTRAP blocked. A thread that blocks signals for longer
// than a few tries leaves the window unguarded, as it was before parking existed.
bool park_for_window() {
  for (int attempt = 0; attempt < 3; ++attempt) {
    if (park_threads(nullptr, 0) == 0) return true;
    sched_yield();
  }
  return false;
}

// Puts the int3 back on each optimized site: int3 on the first byte, barrier, the original
// tail, barrier; with `then_original` the original first byte too, in the same window.
// False when some write failed: that site stays optimized (its jmp whole), or, when only
// the last byte failed, an int3 probe.
bool unoptimize_locked(Site* const* sites, size_t n, bool then_original) {
  struct Undo {
    Site* site;
    bool ok;
    uint8_t tail[kJmpRel32Len];
  };
  std::vector<Undo> undo;
  for (size_t i = 0; i < n; ++i) {
    Site* site = sites[i];
    if (!site->optimized) continue;
    Undo u{site, true, {}};
    for (unsigned k = 1; k < kJmpRel32Len; ++k) u.tail[k] = g_saved[site->addr + k];
    undo.push_back(u);
  }
  if (undo.empty()) return true;
  bool all = true;
  const bool parked = park_for_window();
  // No allocation and no lock from here to unpark.
  const uint8_t int3 = kInt3, e9 = 0xe9;
  for (Undo& u : undo)
    u.ok = !PROBEFS_WARN_ON_ONCE(text_poke(u.site->addr, &int3, 1) != 0,
                                 "could not write the int3 over an optimized probe's jmp");
  text_sync();
  for (Undo& u : undo) {
    if (!u.ok) continue;
    if (PROBEFS_WARN_ON_ONCE(text_poke(u.site->addr + 1, u.tail + 1, kJmpRel32Len - 1) != 0,
                             "could not put back the bytes under an optimized probe's jmp")) {
      // The jmp again, so that the bytes stay whole; the site stays optimized.
      u.ok = false;
      PROBEFS_WARN_ON_ONCE(text_poke(u.site->addr, &e9, 1) != 0,
                           "an optimized probe's jmp is left behind an int3");
    }
  }
  text_sync();
  if (then_original) {
    for (Undo& u : undo) {
      if (!u.ok) continue;
      if (PROBEFS_WARN_ON_ONCE(text_poke(u.site->addr, u.site->insn.bytes, 1) != 0,
                               "could not put back the byte under a probe's int3"))
        all = false;  // an int3 probe now
      else
        u.site->armed = false;
    }
    text_sync();
  }
  if (parked) unpark_threads();
  for (const Undo& u : undo) {
    if (!u.ok) {
      all = false;
      continue;
    }
    for (unsigned k = 1; k < kJmpRel32Len; ++k) g_saved.erase(u.site->addr + k);
    if (!u.site->armed) g_saved.erase(u.site->addr);
    u.site->optimized = false;
    u.site->detour_resume.store(0, std::memory_order_release);
  }
  return all;
}

bool unoptimize_locked(Site* site, bool then_original) {
  return unoptimize_locked(&site, 1, then_original);
}

void forget_site_detour(const Site* site) {
  std::lock_guard lock(g_text_mu);
  g_site_detours.erase(site);
}

size_t testing::site_detour_entries() {
  std::lock_guard lock(g_text_mu);
  return g_site_detours.size();
}

void unoptimize(Site* const* sites, size_t n) {
  std::lock_guard lock(g_text_mu);
  unoptimize_locked(sites, n, false);  // a failed write is warned; that site stays a jmp
}

bool provide_branch_table(const MappingKey& key, const uint64_t* table, size_t words) {
  if (!table || key.length == 0 || key.length > UINT32_MAX) return false;
  const size_t bit_words = branch_table_words(key.length);
  if (words <= bit_words || table[bit_words] != words - bit_words - 1) return false;
  const GivenTable given{key, table, table + bit_words + 1, words - bit_words - 1};
  std::lock_guard lock(g_text_mu);
  for (GivenTable& g : g_given_tables) {
    if (g.key == key) {
      g = given;
      return true;
    }
  }
  if (g_given_tables.size() >= kMaxGivenTables) return false;
  g_given_tables.push_back(given);
  return true;
}

}  // namespace probefs::arch

