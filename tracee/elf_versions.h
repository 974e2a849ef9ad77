// Symbol versions of an ELF object's .dynsym, from the GNU versioning sections: what the
// symbol index names its dynamic symbols with (tracee/elf_symbols.cc) and what IFUNC
// resolution matches references against (tracee/ifunc.h). Daemon side (libelf).
#pragma once

#include <gelf.h>
#include <libelf.h>

#include <cstddef>
#include <string>
#include <unordered_map>

namespace probefs::tracee {

// One 16-bit word per .dynsym entry in .gnu.version (SHT_GNU_versym, linked to the table),
// whose low 15 bits index a version and whose top bit marks a hidden, non-default one:
// ld.so binds a new reference to `pthread_cond_signal` to the one version without it
// (GLIBC_2.3.2), while GLIBC_2.2.5 is kept for programs linked before. Indexes 0 (local)
// and 1 (global, unversioned) and the definition flagged VER_FLG_BASE (the object's own
// name) carry no version.
struct DynsymVersions {
  Elf_Data* versym = nullptr;
  std::unordered_map<unsigned, std::string> names;  // version index -> version name
};

// The versions the object defines (.gnu.version_d): what its defined symbols carry.
DynsymVersions read_dynsym_versions(Elf* elf, size_t dynsym_index);

// The versions a .dynsym's words can stand for, references included: the definitions of
// .gnu.version_d and the needs of .gnu.version_r (what an undefined symbol asks for).
DynsymVersions read_reference_versions(Elf* elf, size_t dynsym_index);

// The version name of .dynsym entry i, or nullptr when it has none; *hidden says whether it
// is a hidden (non-default) one.
const std::string* version_of(const DynsymVersions& v, size_t i, bool* hidden);

}  // namespace probefs::tracee
