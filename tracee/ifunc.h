// GNU_IFUNC resolution: where a process calls the implementation of an IFUNC symbol
// (libc's memcpy, strlen, ...), found as the dynamic linker left it (IfuncChoice). Daemon
// side, for the ELF symbol index (tracee/elf_symbols.h): the index finds the symbol and
// answers for the process's objects; this file reads the objects' dynamic relocations and
// the process's memory, and runs a resolver only in this process.
#pragma once

#include <libelf.h>
#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "tracee/elf_symbols.h"

namespace probefs::tracee {

// `SYM@resolver`: the suffix that asks for an IFUNC's resolver rather than its
// implementation. No symbol version is called that.
inline constexpr std::string_view kResolverSuffix = "@resolver";

// The slots of one ELF object that the dynamic linker fills with the address of a
// function, ELF virtual addresses (x86-64 objects only: the relocation types are its).
struct IfuncSlots {
  // R_X86_64_IRELATIVE: (slot, resolver). ld.so stores there what the resolver returned,
  // at load time, whether or not binding is lazy.
  std::vector<std::pair<uint64_t, uint64_t>> irelative;
  // GLOB_DAT, JUMP_SLOT and 64-bit words that name a symbol with no addend: the slot, by
  // the name referenced, with the version the reference asks for (empty: none).
  struct SymbolSlot {
    uint64_t slot = 0;
    std::string version;
  };
  std::unordered_multimap<std::string, SymbolSlot> by_name;
  // [lo, hi) of .plt, .plt.sec and .plt.got: where a JUMP_SLOT not bound yet points.
  std::vector<std::pair<uint64_t, uint64_t>> plt;
};

// Reads an object's slots from its allocated SHT_RELA sections and its PLT sections; none
// for an object of another machine. The caller serialises calls on one Elf (libelf reads
// sections on demand).
IfuncSlots read_ifunc_slots(Elf* elf);

// An IFUNC symbol as the symbol index found it in one of the process's objects.
struct IfuncSymbol {
  std::string_view full;   // its name with its version: "memcpy@@GLIBC_2.14", "foo"
  uintptr_t resolver = 0;  // the symbol's value: its resolver, ELF virtual address
  size_t object = 0;       // the defining object, an index into IfuncObjects
  uintptr_t bias = 0;      // that object's load bias
  dev_t dev = 0;           // that object's file, as fstat gives it
  ino_t inode = 0;
  // That object's executable mappings, run-time [start, end).
  std::span<const std::pair<uintptr_t, uintptr_t>> code;
};

// The objects of the process as resolution reads them, in search order; the symbol index
// answers, and takes the locks it needs in each call (resolution holds none of them).
class IfuncObjects {
 public:
  virtual ~IfuncObjects() = default;
  virtual size_t count() const = 0;
  // Calls use() with object i's load bias and slots (read on first use) and returns true;
  // false, without calling it, where the object's file cannot be read. use() must not call
  // back into this object.
  virtual bool slots(size_t i,
                     const std::function<void(uintptr_t bias, const IfuncSlots&)>& use) const = 0;
  // Whether a function of some object's code starts at addr: what a slot must hold to be
  // an implementation (a slot that was not relocated yet holds a file's virtual address,
  // a lazy one its own PLT stub). *out describes it as describe() does.
  virtual bool function_at(uintptr_t addr, ResolvedSymbol* out) const = 0;
};

// Where process `pid` calls sym's implementation, in this order: what the dynamic linker
// stored in the defining object's IRELATIVE slots for sym's resolver; else in any object's
// slot bound to sym (GLOB_DAT, JUMP_SLOT, a function pointer), read from the process's
// memory; else, where nothing holds it yet, what the resolver returns, run in this process
// when `pid` is this process or maps the same file (and has the same GLIBC_TUNABLES). The
// choice (kRelocation, kBinding, kCalled) with *impl describing the implementation, or
// kUnknown (nothing found; *impl unspecified). Code of another process is never run.
IfuncChoice find_ifunc_implementation(pid_t pid, const IfuncSymbol& sym,
                                      const IfuncObjects& objects, ResolvedSymbol* impl);

}  // namespace probefs::tracee
