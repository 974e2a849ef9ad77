// Preparing, arming and disarming probe sites; out-of-line copies; reading code through
// our own patches.
#include <cerrno>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "arch/x86_64/near_alloc.h"
#include "arch/x86_64/isa/relocate.h"
#include "arch/x86_64/site.h"
#include "arch/x86_64/text_patch.h"

namespace probefs::arch {

using namespace x86_64;

std::mutex g_text_mu;
// Never destroyed: the optimizer thread may still patch while static destructors run.
std::map<uintptr_t, uint8_t>& g_saved = *new std::map<uintptr_t, uint8_t>;

namespace {

// Longest function prefix decoded to prove a boundary; beyond it a probe is refused.
constexpr size_t kMaxFunctionScan = 1 << 20;

struct SlotKey {
  uintptr_t addr;
  uint8_t len;
  uint8_t bytes[kMaxInsnLen];
  bool operator<(const SlotKey& o) const {
    if (addr != o.addr) return addr < o.addr;
    if (len != o.len) return len < o.len;
    return std::memcmp(bytes, o.bytes, len) < 0;
  }
};

struct Slots {
  uint8_t* boost = nullptr;
  uint8_t* step = nullptr;
};

std::map<SlotKey, Slots>& g_slots = *new std::map<SlotKey, Slots>;  // interned forever
bool g_boost_enabled = true;       // g_text_mu

// Builds (or finds) the out-of-line copies of `insn`. The bytes of a copy depend on where
// it lives, so the address is chosen first and the code built for it.
int intern_slots(const Insn& insn, Slots* out) {
  SlotKey key{};
  key.addr = insn.addr;
  key.len = insn.len;
  std::memcpy(key.bytes, insn.bytes, insn.len);
  if (auto it = g_slots.find(key); it != g_slots.end()) {
    *out = it->second;
    return 0;
  }
  Slots s;
  uint8_t code[kMaxRelocatedLen + kJmpAbsLen];
  if (void* at = alloc_near(insn.addr, sizeof code)) {
    const uintptr_t pc = reinterpret_cast<uintptr_t>(at);
    int n = relocate(insn, pc, code, sizeof code);
    if (n > 0) {
      size_t len = static_cast<size_t>(n);
      if (!insn.ends_flow()) len += emit_jmp(code + len, pc + len, insn.next());
      if (text_poke(pc, code, len) == 0) s.boost = static_cast<uint8_t*>(at);
    }
  }
  // No single-step copy for syscall: the instruction masks the trap flag, so the trap
  // would come one instruction later, past the end of the copy. It is always boosted.
  if (insn.kind == InsnKind::kSyscall) {
    g_slots.emplace(key, s);
    *out = s;
    return 0;
  }
  if (void* at = alloc_near(insn.addr, kMaxInsnLen)) {
    const uintptr_t pc = reinterpret_cast<uintptr_t>(at);
    if (copy_for_singlestep(insn, pc, code) > 0 && text_poke(pc, code, insn.len) == 0)
      s.step = static_cast<uint8_t*>(at);
  }
  g_slots.emplace(key, s);
  *out = s;
  return 0;
}

bool is_emulated(const Insn& insn) {
  switch (insn.kind) {
    case InsnKind::kJmpRel: case InsnKind::kJccRel: case InsnKind::kCallRel:
    case InsnKind::kLoopRel: case InsnKind::kRet:
      return true;
    default:
      return insn.is_nop;
  }
}

int read_text_locked(uintptr_t addr, void* buf, size_t n) {
  if (int rc = read_memory(addr, buf, n); rc) return rc;
  auto* b = static_cast<uint8_t*>(buf);
  for (auto it = g_saved.lower_bound(addr); it != g_saved.end() && it->first < addr + n; ++it)
    b[it->first - addr] = it->second;
  return 0;
}

}  // namespace

int prepare(uintptr_t addr, uintptr_t func_start, uintptr_t func_end, Site** out) {
  *out = nullptr;
  if (func_start > addr || addr >= func_end) return -EILSEQ;
  if (func_end - func_start > kMaxFunctionScan) {
    // Too long to prove from its start: accept only its first instruction.
    if (addr != func_start) return -EILSEQ;
    func_end = func_start + kMaxInsnLen;
  }
  std::lock_guard lock(g_text_mu);
  // Decode up to one instruction past addr so that its bytes are complete.
  const size_t span = func_end - func_start;
  std::vector<uint8_t> code(span + kMaxInsnLen, 0);
  if (read_text_locked(func_start, code.data(), span) != 0) return -EFAULT;
  read_text_locked(func_end, code.data() + span, kMaxInsnLen);  // may run off the mapping
  if (int rc = check_boundary(code.data(), func_start, func_end, addr); rc) return rc;

  auto site = std::make_unique<Site>();
  site->addr = addr;
  if (decode(code.data() + (addr - func_start), span - (addr - func_start) + kMaxInsnLen, addr,
             &site->insn) != 0)
    return -EILSEQ;
  switch (site->insn.kind) {
    case InsnKind::kTrap: case InsnKind::kPrivileged: case InsnKind::kUnsupported:
      return -EINVAL;
    default:
      break;
  }
  if (is_emulated(site->insn)) {
    site->mode = RunMode::kEmulate;
  } else {
    Slots s;
    if (int rc = intern_slots(site->insn, &s); rc) return rc;
    site->boost_slot = s.boost;
    site->step_slot = s.step;
    if (s.boost && (g_boost_enabled || !s.step)) site->mode = RunMode::kBoost;
    else if (s.step) site->mode = RunMode::kSingleStep;
    else return -EINVAL;  // a rip-relative operand out of reach of any copy
  }
  *out = site.release();
  return 0;
}

void release(Site* site) { delete site; }

int arm(Site* site) {
  std::lock_guard lock(g_text_mu);
  if (site->gone) return -ENOENT;
  if (site->armed) return 0;
  const uint8_t int3 = kInt3;
  if (int rc = text_poke(site->addr, &int3, 1); rc) return rc;
  g_saved[site->addr] = site->insn.bytes[0];
  site->armed = true;
  text_sync();
  return 0;
}

void unoptimize_locked(Site* site, bool then_original);  // optimize.cc
void unoptimize_locked(Site* const* sites, size_t n, bool then_original);

int disarm(Site* site) {
  std::lock_guard lock(g_text_mu);
  if (!site->armed) return 0;
  if (site->optimized) {
    // Straight from the jmp to the original bytes, in one guarded window.
    unoptimize_locked(site, true);
    site->armed = false;
    g_saved.erase(site->addr);
    return 0;
  }
  site->armed = false;
  g_saved.erase(site->addr);
  if (site->gone) return 0;
  int rc = text_poke(site->addr, site->insn.bytes, 1);
  text_sync();
  return rc;
}

void disarm_batch(Site* const* sites, size_t n) {
  std::lock_guard lock(g_text_mu);
  std::vector<Site*> int3_only;
  for (size_t i = 0; i < n; ++i)
    if (sites[i]->armed && !sites[i]->optimized && !sites[i]->gone) int3_only.push_back(sites[i]);
  // The jmps go straight to the original bytes in one window; then the int3s, a byte each.
  unoptimize_locked(sites, n, true);
  for (Site* site : int3_only) text_poke(site->addr, site->insn.bytes, 1);
  if (!int3_only.empty()) text_sync();
  for (size_t i = 0; i < n; ++i) {
    if (!sites[i]->armed) continue;
    sites[i]->armed = false;
    g_saved.erase(sites[i]->addr);
  }
}

void mark_gone(Site* site) {
  std::lock_guard lock(g_text_mu);
  site->gone = true;
  if (site->armed) g_saved.erase(site->addr);
  if (site->optimized)
    for (unsigned i = 1; i < kJmpRel32Len; ++i) g_saved.erase(site->addr + i);
  site->armed = false;
  site->optimized = false;
}

uintptr_t site_address(const Site* site) { return site->addr; }

int read_text(uintptr_t addr, void* buf, size_t n) {
  std::lock_guard lock(g_text_mu);
  return read_text_locked(addr, buf, n);
}

void set_boost_enabled(bool on) {
  std::lock_guard lock(g_text_mu);
  g_boost_enabled = on;
}

}  // namespace probefs::arch
