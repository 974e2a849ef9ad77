#include "tracee/elf_versions.h"

namespace probefs::tracee {

DynsymVersions read_dynsym_versions(Elf* elf, size_t dynsym_index) {
  DynsymVersions v;
  for (Elf_Scn* scn = elf_nextscn(elf, nullptr); scn != nullptr; scn = elf_nextscn(elf, scn)) {
    GElf_Shdr sh;
    if (gelf_getshdr(scn, &sh) == nullptr) continue;
    if (sh.sh_type == SHT_GNU_versym && sh.sh_link == dynsym_index) {
      v.versym = elf_getdata(scn, nullptr);
    } else if (sh.sh_type == SHT_GNU_verdef) {
      Elf_Data* data = elf_getdata(scn, nullptr);
      if (data == nullptr) continue;
      // A chain of Verdef records, each with its names (Verdaux) after it; the first name
      // is the version's. Bounded by the section's declared count and its size.
      size_t off = 0;
      for (size_t n = 0; n < sh.sh_info && off < data->d_size; ++n) {
        GElf_Verdef def;
        if (gelf_getverdef(data, static_cast<int>(off), &def) == nullptr) break;
        GElf_Verdaux aux;
        if (!(def.vd_flags & VER_FLG_BASE) && def.vd_cnt > 0 &&
            gelf_getverdaux(data, static_cast<int>(off + def.vd_aux), &aux) != nullptr) {
          if (const char* name = elf_strptr(elf, sh.sh_link, aux.vda_name))
            v.names.emplace(def.vd_ndx, name);
        }
        if (def.vd_next == 0) break;
        off += def.vd_next;
      }
    }
  }
  return v;
}

DynsymVersions read_reference_versions(Elf* elf, size_t dynsym_index) {
  DynsymVersions v = read_dynsym_versions(elf, dynsym_index);
  for (Elf_Scn* scn = elf_nextscn(elf, nullptr); scn != nullptr; scn = elf_nextscn(elf, scn)) {
    GElf_Shdr sh;
    if (gelf_getshdr(scn, &sh) == nullptr || sh.sh_type != SHT_GNU_verneed) continue;
    Elf_Data* data = elf_getdata(scn, nullptr);
    if (data == nullptr) continue;
    // A chain of Verneed records (one per object needed), each with its Vernaux entries
    // (one per version of it); bounded by the declared counts and the section's size.
    size_t off = 0;
    for (size_t n = 0; n < sh.sh_info && off < data->d_size; ++n) {
      GElf_Verneed need;
      if (gelf_getverneed(data, static_cast<int>(off), &need) == nullptr) break;
      size_t aux_off = off + need.vn_aux;
      for (size_t k = 0; k < need.vn_cnt && aux_off < data->d_size; ++k) {
        GElf_Vernaux aux;
        if (gelf_getvernaux(data, static_cast<int>(aux_off), &aux) == nullptr) break;
        if (const char* name = elf_strptr(elf, sh.sh_link, aux.vna_name))
          v.names.emplace(aux.vna_other, name);
        if (aux.vna_next == 0) break;
        aux_off += aux.vna_next;
      }
      if (need.vn_next == 0) break;
      off += need.vn_next;
    }
  }
  return v;
}

const std::string* version_of(const DynsymVersions& v, size_t i, bool* hidden) {
  GElf_Versym word;
  if (v.versym == nullptr || gelf_getversym(v.versym, static_cast<int>(i), &word) == nullptr)
    return nullptr;
  auto it = v.names.find(word & 0x7fff);
  if (it == v.names.end()) return nullptr;
  *hidden = (word & 0x8000) != 0;
  return &it->second;
}

}  // namespace probefs::tracee
