// libc's function symbols as its .dynsym lists them, with their versions: the names a user
// can give as `libc:NAME` (default versions) and `libc:NAME@VERSION` (any version). Shared by
// the resolver tests and the libc-wide probe workload.
#pragma once

#include <dlfcn.h>
#include <fcntl.h>
#include <gelf.h>
#include <libelf.h>
#include <link.h>
#include <unistd.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace probefs::tracee::test_support {

struct LibcFunction {
  std::string name;
  std::string version;   // empty: unversioned
  bool is_default = true;  // not hidden: what ld.so binds `name` to
  bool ifunc = false;
  uint64_t value = 0;    // ELF virtual address
  uint64_t size = 0;
};

// The path of the libc.so.6 this process runs with.
inline std::string libc_path() {
  void* h = dlopen("libc.so.6", RTLD_NOW | RTLD_NOLOAD);
  if (h == nullptr) return {};
  link_map* lm = nullptr;
  std::string path;
  if (dlinfo(h, RTLD_DI_LINKMAP, &lm) == 0 && lm != nullptr) path = lm->l_name;
  dlclose(h);
  return path;
}

// Every defined FUNC and GNU_IFUNC symbol of .dynsym, in table order.
inline std::vector<LibcFunction> dynsym_functions(const std::string& path) {
  std::vector<LibcFunction> out;
  if (elf_version(EV_CURRENT) == EV_NONE) return out;
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return out;
  Elf* elf = elf_begin(fd, ELF_C_READ, nullptr);
  Elf_Data* syms = nullptr;
  Elf_Data* versym = nullptr;
  size_t strtab = 0;
  std::map<unsigned, std::string> versions;
  for (Elf_Scn* scn = elf ? elf_nextscn(elf, nullptr) : nullptr; scn; scn = elf_nextscn(elf, scn)) {
    GElf_Shdr sh;
    if (gelf_getshdr(scn, &sh) == nullptr) continue;
    if (sh.sh_type == SHT_DYNSYM) {
      syms = elf_getdata(scn, nullptr);
      strtab = sh.sh_link;
    } else if (sh.sh_type == SHT_GNU_versym) {
      versym = elf_getdata(scn, nullptr);
    } else if (sh.sh_type == SHT_GNU_verdef) {
      Elf_Data* d = elf_getdata(scn, nullptr);
      size_t off = 0;
      for (size_t n = 0; d && n < sh.sh_info; ++n) {
        GElf_Verdef def;
        GElf_Verdaux aux;
        if (!gelf_getverdef(d, static_cast<int>(off), &def)) break;
        if (gelf_getverdaux(d, static_cast<int>(off + def.vd_aux), &aux))
          versions[def.vd_ndx] = elf_strptr(elf, sh.sh_link, aux.vda_name);
        if (def.vd_next == 0) break;
        off += def.vd_next;
      }
    }
  }
  for (int i = 1; syms && i < static_cast<int>(syms->d_size / sizeof(Elf64_Sym)); ++i) {
    GElf_Sym s;
    if (!gelf_getsym(syms, i, &s)) continue;
    const int type = GELF_ST_TYPE(s.st_info);
    if ((type != STT_FUNC && type != STT_GNU_IFUNC) || s.st_shndx == SHN_UNDEF) continue;
    LibcFunction f;
    f.name = elf_strptr(elf, strtab, s.st_name);
    f.ifunc = type == STT_GNU_IFUNC;
    f.value = s.st_value;
    f.size = s.st_size;
    GElf_Versym v;
    if (versym && gelf_getversym(versym, i, &v)) {
      f.is_default = !(v & 0x8000);
      // Index 1 is the object's own name (VER_FLG_BASE): no version.
      if ((v & 0x7fff) > 1 && versions.count(v & 0x7fff)) f.version = versions[v & 0x7fff];
    }
    out.push_back(std::move(f));
  }
  if (elf) elf_end(elf);
  close(fd);
  return out;
}

}  // namespace probefs::tracee::test_support
