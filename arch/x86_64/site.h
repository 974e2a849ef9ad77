// The arch-private Site and the state shared by the x86-64 backend's files.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <vector>
#include <mutex>

#include "arch/arch.h"
#include "arch/x86_64/isa/insn.h"

namespace probefs::arch {

// How the probed instruction runs after a hit.
enum class RunMode : uint8_t {
  kEmulate,     // nop, relative jmp/jcc/call/loop, ret: computed in the trap handler
  kBoost,       // out-of-line copy followed by a jmp back
  kSingleStep,  // same-length copy, trap flag set
};

struct Detour;  // optimize.cc

struct Site {
  uintptr_t addr = 0;
  x86_64::Insn insn;
  RunMode mode = RunMode::kBoost;
  uint8_t* boost_slot = nullptr;  // relocated copy + jmp back (nullptr when unusable)
  uintptr_t boost_return = 0;     // where in it the jmp back starts (0: it has none)
  uint8_t* step_slot = nullptr;   // same-length copy for single-stepping
  bool armed = false;
  bool gone = false;
  // Jump optimization (optimize.cc).
  Detour* detour = nullptr;         // built by prepare_optimized()
  bool detour_saves_vector = false; // which of the two thunks the detour calls
  DetourEntry detour_entry = DetourEntry::kPlain;  // the block of the detour the jmp enters
  bool detour_return_saves_vector = true;          // and its return trampoline
  uint8_t region_len = 0;           // bytes the jmp replaces
  bool optimized = false;           // the jmp is written
  // While set, int3 hits resume in the detour's copy of the whole region rather than in
  // the boosted copy of one instruction (which would return into the region's middle).
  std::atomic<uintptr_t> detour_resume{0};
};

// How many detour handler calls this thread is inside: the thunks count their calls into
// the handlers (optprobe_thunk.S), so that a thread on its way back through a detour is
// known while the code it returns to changes (thread_fixup).
extern "C" __attribute__((visibility("hidden"))) thread_local constinit unsigned long
    probefs_arch_detour_depth __attribute__((tls_model("initial-exec")));

// Shared by the backend's files.
extern Callbacks g_callbacks;         // set once by install()

// Is the calling thread (interrupted at interrupted_ip) inside the SIGTRAP handler or on
// its way back from it? Such a thread may still resume where it decided to before.
bool thread_in_trap_path(uintptr_t interrupted_ip);

// Where signal handlers installed through libc return to (0 before install()): the first
// word of every signal frame, which is how thread_fixup finds frames on a stack.
uintptr_t signal_restorer();
extern std::mutex g_text_mu;  // guards g_saved and the text of every site
// Original bytes of every byte we changed in code: int3 first bytes, jmp tails.
extern std::map<uintptr_t, uint8_t>& g_saved;

// optimize.cc, for site.cc. With g_text_mu held: puts the int3 back in place of the jmp of
// each optimized site, in one window in which the other running threads are parked; with
// `then_original` the original first byte too (the site is disarmed). False (warned) when
// some code could not be written: that site stays optimized, or an int3 probe.
bool unoptimize_locked(Site* const* sites, size_t n, bool then_original);
bool unoptimize_locked(Site* site, bool then_original);
// The boosted copies ever built for an instruction at `addr` (by any probe there, past or
// present: a thread may still be in one long after): where each starts, and its jmp back
// (0: none). With g_text_mu held.
struct BoostCopy {
  uintptr_t start;
  uintptr_t jmp_back;
};
std::vector<BoostCopy> boost_copies_at(uintptr_t addr);
// Drops what the optimizer keeps for a site being released (takes g_text_mu).
void forget_site_detour(const Site* site);

}  // namespace probefs::arch
