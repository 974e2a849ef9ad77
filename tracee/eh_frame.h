// The .eh_frame reader: the code ranges its FDEs cover, and the exception landing pads the
// LSDAs of those FDEs name. Daemon side (libelf, libdw); addresses are ELF virtual
// addresses of the object, before any load bias.
//
// How an FDE leads to landing pads (the LSB's exception frames and GCC's C++ LSDA):
//
//   .eh_frame   CIE "zPLR": personality, LSDA pointer encoding ('L'), FDE encoding ('R')
//               FDE: initial location, range, augmentation data = LSDA pointer
//                                                                   |
//   .gcc_except_table   LSDA  <-------------------------------------+
//               LPStart (default: the FDE's initial location), type table, call sites:
//               { start, length, landing pad offset from LPStart (0: none), action }
//
// The unwinder resumes a frame at LPStart + landing pad offset: a way into the function that
// no branch in it shows.
#pragma once

#include <libelf.h>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace probefs::tracee {

// One FDE's code, [start, end).
struct FdeRange {
  uint64_t start = 0;
  uint64_t end = 0;
};

// Parses one LSDA:
//
//   u8 lpstart_encoding   [LPStart in that encoding]   (omitted: LPStart = func_start)
//   u8 ttype_encoding     [uleb128 offset to the end of the type table]
//   u8 callsite_encoding  uleb128 call-site table length
//   call sites: start, length, landing pad (callsite_encoding), uleb128 action
//
// `lsda` .. `end` are the LSDA's bytes up to the end of its section, `lsda_vaddr` the
// LSDA's address (for a pc-relative LPStart), `func_start` the FDE's initial location.
// Appends LPStart + pad of every call site that has a landing pad. false for a malformed
// or unsupported table (out may then hold some of its pads).
bool parse_lsda(const uint8_t* lsda, const uint8_t* end, uint64_t lsda_vaddr,
                uint64_t func_start, bool elf64, std::vector<uint64_t>* out);

// One object's .eh_frame, read once.
class EhFrame {
 public:
  // Reads the .eh_frame section of `elf` and the LSDAs its FDEs point to. Without the
  // section, it stays empty.
  void load(Elf* elf);
  bool loaded() const { return loaded_; }

  // The FDE whose range holds vaddr, or nullptr.
  const FdeRange* covering(uint64_t vaddr) const;

  // Appends the landing pads in [start, end), ascending.
  void landing_pads_in(uint64_t start, uint64_t end, std::vector<uint64_t>* out) const;

  const std::vector<FdeRange>& fdes() const { return fdes_; }
  const std::vector<uint64_t>& landing_pads() const { return landing_pads_; }
  // FDEs that name an LSDA this reader could not parse; their functions' landing pads are
  // unknown.
  const std::vector<FdeRange>& unreadable_lsdas() const { return unreadable_; }

 private:
  bool loaded_ = false;
  std::vector<FdeRange> fdes_;           // sorted by start
  std::vector<uint64_t> landing_pads_;   // sorted, unique
  std::vector<FdeRange> unreadable_;
};

}  // namespace probefs::tracee
