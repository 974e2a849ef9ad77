// Jump optimization: a probe's int3 becomes a 5-byte jmp to a detour that saves the
// registers, runs the handlers through the shared thunk (optprobe_thunk.S), runs a
// relocated copy of the replaced instructions and jumps back. No trap on the hit path.
//
// A detour holds three blocks that share the copy. Each starts with a 40-byte header the
// thunk reads through the return address its call pushed (R, at +51):
//   +0 ctx cell  +8 thunk  +16 addr  +24 miss_back  +32 call-mode trampoline
// (the thunks of blocks C and L are _entry ones, see optprobe_thunk.S)
//   +40 lea -128(%rsp),%rsp ; call *+8(%rip)
//
// Block P, at the start (plain):
//   +51 lea 128(%rsp),%rsp
//   +59 relocated region ; jmp addr+len
// Block C, after it (call mode), the entry of a function with a return probe:
//   +51 lea 136(%rsp),%rsp      the return address is in a kretprobe instance: drop it
//   +59 call P+59               run the function as a call of ours, so its ret is predicted
//   +64 jmp *+32(%rip)          and lands in the call-mode trampoline
// When no handler hijacked the return address on a hit (the instance pool was empty, an
// entry handler declined), the thunk returns to block P instead: miss_back = C - P.
// Block L is block C with the lean entry thunk (DetourEntry::kCallLean). Each comes twice:
// with the return trampoline that saves the vector registers and with the one that does
// not (return handlers that touch general-purpose registers only).
#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <vector>

#include "arch/x86_64/cpu_state.h"
#include "arch/x86_64/near_alloc.h"
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
  void* volatile* ctx_cell;
  uint64_t thunk;
  uint64_t addr;
  uint64_t miss_back;
  uint64_t call_trampoline;
  uint8_t code[];
};
static_assert(offsetof(Detour, code) == 40);

namespace {

constexpr size_t kHeaderLen = sizeof(Detour);
constexpr size_t kRegionCopyOffset = 59;  // from the start of the detour
constexpr size_t kCallBlockLen = 70;

// lea -0x80(%rsp),%rsp ; call *-43(%rip) (the header's thunk)
constexpr uint8_t kCallThunk[] = {0x48, 0x8d, 0x64, 0x24, 0x80, 0xff, 0x15, 0xd5, 0xff, 0xff, 0xff};
static_assert(kHeaderLen + sizeof kCallThunk == 51);

struct DetourInfo {
  Detour* detour;       // block P
  Detour* call_blocks[4];  // C, C with the lean thunk (L); each with vector, gpr return
  uint8_t region_len;
  uint8_t count;
  uint8_t orig_off[kJmpRel32Len + 1];   // instruction k at addr + orig_off[k]
  uint8_t copy_off[kJmpRel32Len + 1];   // and at detour + kRegionCopyOffset + copy_off[k]
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
std::map<const Site*, DetourInfo>& g_site_detours = *new std::map<const Site*, DetourInfo>;

// Direct branch targets of a whole executable mapping, for branches into a region from
// other functions (glibc's __mempcpy_* jumps into the middle of __memmove_*, past its first
// instruction). The function-local check cannot see those; a linear sweep of the mapping
// can. Built once per mapping. (g_text_mu)
struct MappingBranches {
  uintptr_t start = 0, end = 0;
  unsigned long inode = 0;
  std::vector<uintptr_t> targets;  // sorted
};
std::vector<MappingBranches>& g_mapping_branches = *new std::vector<MappingBranches>;

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
      out->inode = inode;
      found = true;
      break;
    }
  }
  std::fclose(f);
  return found;
}

const MappingBranches* branches_of_mapping(uintptr_t addr) {
  MappingBranches m;
  if (!find_exec_mapping(addr, &m)) return nullptr;
  for (const MappingBranches& b : g_mapping_branches)
    if (b.start == m.start && b.end == m.end && b.inode == m.inode) return &b;
  std::vector<uint8_t> code(m.end - m.start);
  if (read_memory(m.start, code.data(), code.size()) != 0) return nullptr;
  for (auto it = g_saved.lower_bound(m.start); it != g_saved.end() && it->first < m.end; ++it)
    code[it->first - m.start] = it->second;
  // Linear sweep; bytes that do not decode are stepped over one at a time (padding, data,
  // instructions Capstone does not know) and the sweep finds its footing again.
  for (uintptr_t pc = m.start; pc < m.end;) {
    Insn insn;
    if (decode(code.data() + (pc - m.start), m.end - pc, pc, &insn) != 0) {
      ++pc;
      continue;
    }
    switch (insn.kind) {
      case InsnKind::kJmpRel: case InsnKind::kJccRel: case InsnKind::kCallRel:
      case InsnKind::kLoopRel:
        m.targets.push_back(insn.target);
        break;
      default:
        break;
    }
    pc += insn.len;
  }
  std::sort(m.targets.begin(), m.targets.end());
  g_mapping_branches.push_back(std::move(m));
  return &g_mapping_branches.back();
}

// Does any direct branch of the mapping land strictly inside (addr, addr + len)?
bool branch_into_region_from_anywhere(uintptr_t addr, size_t len) {
  const MappingBranches* b = branches_of_mapping(addr);
  if (!b) return true;  // unknown: assume the worst
  auto it = std::upper_bound(b->targets.begin(), b->targets.end(), addr);
  return it != b->targets.end() && *it < addr + len;
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
  return read_memory(addr, buf, n) == 0;
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
  constexpr size_t kCallBlockStride = (kCallBlockLen + 7) & ~size_t{7};
  const size_t cap = kRegionCopyOffset + copy_cap + 7 + 4 * kCallBlockStride;
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
  auto put_block = [&](size_t at, uint64_t thunk, uint64_t miss_back, uint64_t trampoline) {
    const Detour header{cell, thunk, region.addr, miss_back, trampoline};
    std::memcpy(code.data() + at, &header, kHeaderLen);
    std::memcpy(code.data() + at + kHeaderLen, kCallThunk, sizeof kCallThunk);
  };

  // Block P.
  put_block(0, thunk, 0, 0);
  static const uint8_t lea_up[] = {0x48, 0x8d, 0xa4, 0x24, 0x80, 0x00, 0x00, 0x00};  // lea 0x80(%rsp),%rsp
  std::memcpy(code.data() + 51, lea_up, sizeof lea_up);
  DetourInfo info{};
  info.detour = static_cast<Detour*>(mem);
  info.region_len = region.len;
  info.count = region.count;
  size_t at = kRegionCopyOffset;
  uint8_t orig = 0;
  for (unsigned k = 0; k < region.count; ++k) {
    const Insn& insn = region.insns[k];
    info.orig_off[k] = orig;
    info.copy_off[k] = static_cast<uint8_t>(at - kRegionCopyOffset);
    int n = relocate(insn, base + at, code.data() + at, kRegionCopyOffset + copy_cap - at);
    if (n < 0) return n;
    at += static_cast<size_t>(n);
    orig = static_cast<uint8_t>(orig + insn.len);
  }
  info.orig_off[region.count] = orig;
  info.copy_off[region.count] = static_cast<uint8_t>(at - kRegionCopyOffset);
  at += emit_jmp(code.data() + at, base + at, region.addr + region.len);

  // Blocks C and L, 8-aligned after the copy.
  auto put_call_block = [&](size_t c, uint64_t block_thunk, uint64_t trampoline) {
    put_block(c, block_thunk, c, trampoline);
    uint8_t* tail = code.data() + c + 51;
    static const uint8_t lea_up_ret[] = {0x48, 0x8d, 0xa4, 0x24, 0x88, 0x00, 0x00, 0x00};  // lea 0x88(%rsp),%rsp
    std::memcpy(tail, lea_up_ret, sizeof lea_up_ret);
    tail[8] = 0xe8;  // call rel32 -> the copy
    const int32_t rel = static_cast<int32_t>(kRegionCopyOffset - (c + 64));
    std::memcpy(tail + 9, &rel, 4);
    static const uint8_t jmp_tramp[] = {0xff, 0x25, 0xda, 0xff, 0xff, 0xff};  // jmp *-38(%rip) -> +32
    std::memcpy(tail + 13, jmp_tramp, sizeof jmp_tramp);
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
  if (int rc = text_poke(base, code.data(), at); rc) return rc;
  g_detours.emplace(key, info);
  *out = info;
  return 0;
}

// [start, end) as it is with no probe armed (g_saved holds what our writes replaced).
// Requires g_text_mu.
bool text_without_probes(uintptr_t start, uintptr_t end, std::vector<uint8_t>* out) {
  out->resize(end - start);
  if (read_memory(start, out->data(), out->size()) != 0) return false;
  for (auto it = g_saved.lower_bound(start); it != g_saved.end() && it->first < end; ++it)
    (*out)[it->first - start] = it->second;
  return true;
}

void write_jmp(Site* site) {
  const DetourInfo& d = g_site_detours.at(site);
  const int k = (site->detour_entry == DetourEntry::kCallLean ? 2 : 0) +
                (site->detour_return_saves_vector ? 0 : 1);
  const Detour* entry = site->detour_entry == DetourEntry::kPlain ? d.detour : d.call_blocks[k];
  uint8_t jmp[kJmpRel32Len];
  emit_jmp(jmp, site->addr, reinterpret_cast<uintptr_t>(entry->code));
  // The tail, under the int3 that guards the first byte. No other probe lies in the
  // region (probecore checks), so these bytes are the original code.
  uint8_t original[kJmpRel32Len];
  read_memory(site->addr, original, kJmpRel32Len);
  for (unsigned i = 1; i < kJmpRel32Len; ++i) g_saved[site->addr + i] = original[i];
  text_poke(site->addr + 1, jmp + 1, kJmpRel32Len - 1);
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
  std::vector<uint8_t> code(func_end - func_start);
  if (read_memory(func_start, code.data(), code.size()) != 0) {
    *why = "function not readable";
    return -EINVAL;
  }
  for (auto it = g_saved.lower_bound(func_start); it != g_saved.end() && it->first < func_end; ++it)
    code[it->first - func_start] = it->second;
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
  if (site->detour) __atomic_store_n(site->detour->ctx_cell, ctx, __ATOMIC_RELEASE);
}

bool site_optimized(const Site* site) { return site->optimized; }

size_t optimize(Site* const* sites, size_t n, void (*wait_for_handlers)()) {
  std::unique_lock lock(g_text_mu);
  std::vector<Site*> batch;
  for (size_t i = 0; i < n; ++i) {
    Site* s = sites[i];
    if (s->detour && s->armed && !s->gone && !s->optimized) batch.push_back(s);
  }
  if (batch.empty()) return 0;

  // 1. Every new int3 hit resumes in a detour's copy of the whole region.
  for (Site* s : batch) {
    s->detour_resume.store(reinterpret_cast<uintptr_t>(s->detour) + kRegionCopyOffset,
                           std::memory_order_release);
  }
  // 2. Handlers that started before that may still resume into the region itself.
  lock.unlock();
  wait_for_handlers();
  lock.lock();

  // 3. Threads on the region, or in a boosted copy that returns into it, move to the copy.
  std::vector<Site*> movable;
  for (Site* s : batch) {
    const DetourInfo& d = g_site_detours.at(s);
    const uintptr_t copy = reinterpret_cast<uintptr_t>(s->detour) + kRegionCopyOffset;
    std::vector<IpMove> moves;
    for (unsigned k = 1; k < d.count; ++k) moves.push_back({s->addr + d.orig_off[k], copy + d.copy_off[k]});
    if (s->boost_slot) {
      const auto slot = reinterpret_cast<uintptr_t>(s->boost_slot);
      moves.push_back({slot, copy});
      if (d.count > 1) {
        // The boosted copy's jmp back follows the relocated first instruction.
        uint8_t tmp[kMaxRelocatedLen];
        const int len0 = relocate(s->insn, slot, tmp, sizeof tmp);
        if (len0 > 0) moves.push_back({slot + static_cast<unsigned>(len0), copy + d.copy_off[1]});
      }
    }
    if (move_threads(moves.data(), moves.size()) == 0) movable.push_back(s);
    else s->detour_resume.store(0, std::memory_order_release);  // try again later
  }

  // 4. The jmp: tail, barrier, first byte, barrier.
  for (Site* s : movable) write_jmp(s);
  text_sync();
  for (Site* s : movable) {
    const uint8_t e9 = 0xe9;
    text_poke(s->addr, &e9, 1);
    s->optimized = true;
  }
  text_sync();
  return movable.size();
}

void unoptimize_locked(Site* site) {
  if (!site->optimized) return;
  const uint8_t int3 = kInt3;
  text_poke(site->addr, &int3, 1);
  text_sync();
  uint8_t tail[kJmpRel32Len];
  for (unsigned i = 1; i < kJmpRel32Len; ++i) {
    tail[i] = g_saved[site->addr + i];
    g_saved.erase(site->addr + i);
  }
  text_poke(site->addr + 1, tail + 1, kJmpRel32Len - 1);
  text_sync();
  site->optimized = false;
  site->detour_resume.store(0, std::memory_order_release);
}

void unoptimize(Site* const* sites, size_t n) {
  std::lock_guard lock(g_text_mu);
  for (size_t i = 0; i < n; ++i) unoptimize_locked(sites[i]);
}

}  // namespace probefs::arch

