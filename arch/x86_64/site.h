// The arch-private Site and the state shared by the x86-64 backend's files.
#pragma once

#include <cstdint>

#include "arch/arch.h"
#include "arch/x86_64/insn.h"

namespace probefs::arch {

// How the probed instruction runs after a hit.
enum class RunMode : uint8_t {
  kEmulate,     // nop, relative jmp/jcc/call/loop, ret: computed in the trap handler
  kBoost,       // out-of-line copy followed by a jmp back
  kSingleStep,  // same-length copy, trap flag set
};

struct Site {
  uintptr_t addr = 0;
  x86_64::Insn insn;
  RunMode mode = RunMode::kBoost;
  uint8_t* boost_slot = nullptr;  // relocated copy + jmp back (nullptr when unusable)
  uint8_t* step_slot = nullptr;   // same-length copy for single-stepping
  bool armed = false;
  bool gone = false;
};

}  // namespace probefs::arch
