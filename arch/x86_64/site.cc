// Preparing, arming and disarming probe sites; out-of-line copies; reading code through
// our own patches.
#include <cerrno>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "arch/self_memory.h"
#include "arch/testing.h"
#include "arch/warn.h"
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
  uintptr_t boost_return = 0;  // the boosted copy's jmp back, kept from when it was built
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
      uintptr_t jmp_back = 0;
      if (!insn.ends_flow()) {
        jmp_back = pc + len;
        len += emit_jmp(code + len, pc + len, insn.next());
      }
      if (text_poke(pc, code, len) == 0) {
        s.boost = static_cast<uint8_t*>(at);
        s.boost_return = jmp_back;
      }
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
  if (!read_self_memory_all(addr, buf, n)) return -EFAULT;
  auto* b = static_cast<uint8_t*>(buf);
  for (auto it = g_saved.lower_bound(addr); it != g_saved.end() && it->first < addr + n; ++it)
    b[it->first - addr] = it->second;
  return 0;
}

}  // namespace

int own_a_page_of(uintptr_t addr) {
  uint8_t b = 0;
  std::lock_guard lock(g_text_mu);  // the engine's writes reopen the same descriptor
  if (!read_self_memory_all(addr, &b, 1)) return -EFAULT;
  return x86_64::text_poke_by_copy(addr, &b, 1);
}

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
  // May run off the mapping: the bytes stay 0 and decoding stops at func_end anyway.
  (void)read_text_locked(func_end, code.data() + span, kMaxInsnLen);
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
    site->boost_return = s.boost_return;
    site->step_slot = s.step;
    if (s.boost && (g_boost_enabled || !s.step)) site->mode = RunMode::kBoost;
    else if (s.step) site->mode = RunMode::kSingleStep;
    else return -EINVAL;  // a rip-relative operand out of reach of any copy
  }
  *out = site.release();
  return 0;
}

std::vector<BoostCopy> boost_copies_at(uintptr_t addr) {
  std::vector<BoostCopy> out;
  SlotKey from{};
  from.addr = addr;
  for (auto it = g_slots.lower_bound(from); it != g_slots.end() && it->first.addr == addr; ++it)
    if (it->second.boost)
      out.push_back({reinterpret_cast<uintptr_t>(it->second.boost), it->second.boost_return});
  return out;
}

void release(Site* site) {
  forget_site_detour(site);
  delete site;
}

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

int disarm(Site* site) {
  std::lock_guard lock(g_text_mu);
  if (!site->armed) return 0;
  if (site->optimized && !site->gone) {
    // Straight from the jmp to the original bytes, in one guarded window.
    if (!unoptimize_locked(site, true)) return -EIO;
    return 0;
  }
  if (site->gone) {
    site->armed = false;
    g_saved.erase(site->addr);
    return 0;
  }
  // Left in place, the int3 of a probe being removed kills the program at its next hit:
  // nothing answers for it any more.
  if (int rc = text_poke(site->addr, site->insn.bytes, 1);
      PROBEFS_WARN_ON_ONCE(rc != 0, "could not put back the byte under a probe's int3"))
    return rc;
  site->armed = false;
  g_saved.erase(site->addr);
  text_sync();
  return 0;
}

void disarm_batch(Site* const* sites, size_t n) {
  std::lock_guard lock(g_text_mu);
  std::vector<Site*> int3_only;
  for (size_t i = 0; i < n; ++i)
    if (sites[i]->armed && !sites[i]->optimized && !sites[i]->gone) int3_only.push_back(sites[i]);
  // The jmps go straight to the original bytes in one window (a failure is warned, and
  // leaves that site patched); then the int3s, a byte each.
  unoptimize_locked(sites, n, true);
  bool wrote = false;
  for (Site* site : int3_only) {
    if (PROBEFS_WARN_ON_ONCE(text_poke(site->addr, site->insn.bytes, 1) != 0,
                             "could not put back the byte under a probe's int3"))
      continue;
    site->armed = false;
    g_saved.erase(site->addr);
    wrote = true;
  }
  if (wrote) text_sync();
  for (size_t i = 0; i < n; ++i) {
    if (!sites[i]->gone) continue;
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

int testing::read_text(uintptr_t addr, void* buf, size_t n) {
  std::lock_guard lock(g_text_mu);
  return read_text_locked(addr, buf, n);
}

uintptr_t testing::boost_return(const Site* site) { return site->boost_return; }

void set_boost_enabled(bool on) {
  std::lock_guard lock(g_text_mu);
  g_boost_enabled = on;
}

}  // namespace probefs::arch
