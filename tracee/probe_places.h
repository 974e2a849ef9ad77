// Where a parsed definition lands in one target: the run-time address(es), the function
// around each (for the engine's boundary and optimizer checks) and the name `kprobes/list`
// shows. Daemon side; pure given a process's symbols and mappings.
//
//   uprobe syntax  PATH:OFFSET   every executable mapping of the file (device and inode,
//                                not the name) that covers OFFSET: a file mapped twice
//                                (dlmopen) gets two places
//   kprobe syntax  SYM[+OFFS]    the first object that defines SYM, executable first
//                  MOD:SYM[+OFFS] in MOD only; kNotYet while MOD is not loaded
//                  [MOD:]%PROVIDER:NAME  every place of that USDT point (SDT note) in
//                                MOD, or in the first object that has it; its semaphore
//                                is the place's reference counter
//                  MEMADDR       that address
//
// A kprobe-syntax SYM that is an IFUNC lands on the implementation the target calls, as
// ProcessSymbols::resolve finds it (OFFS counts from there), and `SYM@resolver` on the
// resolver; the uprobe syntax's file offsets stay file offsets, whatever is there.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "events/definition.h"
#include "events/errors.h"
#include "tracee/elf_symbols.h"
#include "tracee/proc_maps.h"

namespace probefs::tracee {

// A file as uprobes know it: by identity, so that a renamed or replaced path still
// matches what the process mapped.
struct FileIdentity {
  dev_t dev = 0;
  ino_t inode = 0;
};

// stat() of a uprobe's PATH. 0 or a negative errno.
[[nodiscard]] int identify_file(const std::string& path, FileIdentity* out);

// The file offset a uprobe definition needs for function `symbol` of the ELF file at
// `path` (what perf probe writes into uprobe_events): the symbol's address mapped through
// the PT_LOAD segment that holds it (an IFUNC's own, its resolver: a file alone has no
// implementation). 0, -ENOENT (no such file or symbol), -ENOEXEC.
[[nodiscard]] int symbol_file_offset(const std::string& path, std::string_view symbol,
                                     uint64_t* offset);

struct ProbePlace {
  uintptr_t addr = 0;
  FunctionBounds bounds;   // {0,0} when no symbol or FDE covers addr
  std::string symbol;      // the function's name where known ("" otherwise)
  uint64_t symbol_offset = 0;  // addr - the function's start
  std::string module;      // object basename, "" for the executable
  // What kprobes/list and trace lines add after the place's name (ifunc_note): the symbol
  // as the definition asked for it, where the place is an IFUNC's implementation or
  // resolver. "" otherwise.
  std::string note;
  // A uprobe's reference counter (PATH:OFFSET(REF_CTR_OFFSET), an SDT semaphore): the
  // run-time address of the u16 at that file offset in the writable mapping of the same
  // load, or 0 where none maps it (yet).
  uintptr_t ref_ctr = 0;
  // A USDT point's argument spec (its SDT note's), to bind $argN to; "" otherwise.
  std::string sdt_args;
};

enum class PlaceStatus : uint8_t {
  kPlaced,  // `places` holds one or more places
  kNotYet,  // not in this target now; it may be later (a file or module not mapped yet)
  kAbsent,  // SYM (no module) is not in this target
  kError,   // the definition cannot work in this target: *diag says why
};

// `file` is the identity of def.path for uprobe syntax (ignored otherwise). `maps` are the
// target's current mappings (read_maps), `syms` its symbols, reloaded by the caller when
// the mappings changed.
PlaceStatus place_probe(const events::ProbeDefinition& def, const FileIdentity& file,
                        const std::vector<Mapping>& maps, const ProcessSymbols& syms,
                        std::vector<ProbePlace>* places, events::Diagnostic* diag);

}  // namespace probefs::tracee
