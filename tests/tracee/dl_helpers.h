// The dynamic linker's own answers, used as the independent side of the resolver tests.
#pragma once

#include <dlfcn.h>
#include <link.h>

#include <cstdint>

namespace probefs::tracee::test_support {

template <typename F>
uintptr_t fn_addr(F* f) {
  return reinterpret_cast<uintptr_t>(reinterpret_cast<void*>(f));
}

// Size of the .dynsym symbol that starts exactly at addr, or 0.
inline uint64_t dynsym_size(uintptr_t addr) {
  Dl_info info;
  void* entry = nullptr;
  if (dladdr1(reinterpret_cast<void*>(addr), &info, &entry, RTLD_DL_SYMENT) == 0 ||
      entry == nullptr || reinterpret_cast<uintptr_t>(info.dli_saddr) != addr) {
    return 0;
  }
  return static_cast<const ElfW(Sym)*>(entry)->st_size;
}

}  // namespace probefs::tracee::test_support
