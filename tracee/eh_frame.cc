#include "tracee/eh_frame.h"

#include <elfutils/libdw.h>
#include <gelf.h>

#include <algorithm>
#include <cstring>
#include <unordered_map>

namespace probefs::tracee {
namespace {

// Pointer encodings of .eh_frame and the LSDA (the LSB's DW_EH_PE_*); dwarf.h names only
// some of them.
constexpr uint8_t kPeAbsptr = 0x00;
constexpr uint8_t kPeOmit = 0xff;
constexpr uint8_t kPeFormatMask = 0x0f;
constexpr uint8_t kPeApplyMask = 0x70;
constexpr uint8_t kPePcrel = 0x10;
constexpr uint8_t kPeIndirect = 0x80;

// Reads a value in one of the DW_EH_PE formats; false for formats code addresses never
// use or when the bytes run out. Little-endian unless `msb`.
bool read_encoded(const uint8_t*& p, const uint8_t* end, uint8_t format, bool elf64, bool msb,
                  uint64_t* out) {
  auto fixed = [&](size_t n, bool is_signed) {
    if (static_cast<size_t>(end - p) < n) return false;
    uint64_t v = 0;
    for (size_t i = 0; i < n; ++i) {
      uint64_t byte = p[msb ? i : n - 1 - i];
      v = (v << 8) | byte;
    }
    if (is_signed && n < 8 && (v >> (8 * n - 1)) != 0) v |= ~uint64_t{0} << (8 * n);
    p += n;
    *out = v;
    return true;
  };
  auto leb = [&](bool is_signed) {
    uint64_t v = 0;
    unsigned shift = 0;
    uint8_t byte = 0;
    do {
      if (p >= end || shift >= 64) return false;
      byte = *p++;
      v |= uint64_t{byte & 0x7fu} << shift;
      shift += 7;
    } while (byte & 0x80);
    if (is_signed && shift < 64 && (byte & 0x40)) v |= ~uint64_t{0} << shift;
    *out = v;
    return true;
  };
  switch (format) {
    case 0x00: return fixed(elf64 ? 8 : 4, false);  // absptr
    case 0x01: return leb(false);                   // uleb128
    case 0x02: return fixed(2, false);
    case 0x03: return fixed(4, false);
    case 0x04: return fixed(8, false);
    case 0x09: return leb(true);                    // sleb128
    case 0x0a: return fixed(2, true);
    case 0x0b: return fixed(4, true);
    case 0x0c: return fixed(8, true);
    default: return false;
  }
}

bool read_uleb(const uint8_t*& p, const uint8_t* end, uint64_t* out) {
  return read_encoded(p, end, 0x01, true, false, out);
}

// Reads a pointer: the format, then the application (absolute, or relative to the
// field's own address `field_vaddr`). Indirect pointers and the other applications
// (datarel, textrel, funcrel, aligned) are not used by GCC or Clang for what we read.
bool read_pointer(const uint8_t*& p, const uint8_t* end, uint8_t enc, uint64_t field_vaddr,
                  bool elf64, bool msb, uint64_t* out) {
  if (enc & kPeIndirect) return false;
  uint64_t v;
  if (!read_encoded(p, end, enc & kPeFormatMask, elf64, msb, &v)) return false;
  switch (enc & kPeApplyMask) {
    case 0:
      break;
    case kPePcrel:
      v += field_vaddr;
      break;
    default:
      return false;
  }
  if (!elf64) v &= 0xffffffffu;
  *out = v;
  return true;
}

// What an FDE needs from its CIE (the augmentation string and its data).
struct CieInfo {
  bool ok = false;           // the augmentation is understood
  bool has_z = false;        // FDEs carry a length-prefixed augmentation data block
  uint8_t fde_encoding = kPeAbsptr;   // 'R'
  uint8_t lsda_encoding = kPeOmit;    // 'L'
};

CieInfo parse_cie(const Dwarf_CIE& cie, bool elf64, bool msb) {
  CieInfo info;
  const char* aug = cie.augmentation;
  if (aug == nullptr || aug[0] == '\0') {
    info.ok = true;
    return info;
  }
  if (aug[0] != 'z' || cie.augmentation_data == nullptr) return info;
  info.has_z = true;
  const uint8_t* p = cie.augmentation_data;
  const uint8_t* end = p + cie.augmentation_data_size;
  for (const char* a = aug + 1; *a != '\0'; ++a) {
    switch (*a) {
      case 'R':
        if (p >= end) return info;
        info.fde_encoding = *p++;
        break;
      case 'L':
        if (p >= end) return info;
        info.lsda_encoding = *p++;
        break;
      case 'P': {  // personality: encoding byte, then a pointer in that encoding
        if (p >= end) return info;
        const uint8_t enc = *p++;
        uint64_t ignored;
        if (!read_encoded(p, end, enc & kPeFormatMask, elf64, msb, &ignored)) return info;
        break;
      }
      case 'S':  // signal frame
      case 'B':  // AArch64 BTI
        break;
      default:
        return info;
    }
  }
  info.ok = true;
  return info;
}

// The allocated section holding vaddr: its bytes and address.
struct SectionBytes {
  const uint8_t* data = nullptr;
  uint64_t addr = 0;
  uint64_t size = 0;
  bool contains(uint64_t a) const { return data != nullptr && a >= addr && a - addr < size; }
};

SectionBytes section_at(Elf* elf, uint64_t vaddr) {
  for (Elf_Scn* scn = elf_nextscn(elf, nullptr); scn != nullptr; scn = elf_nextscn(elf, scn)) {
    GElf_Shdr sh;
    if (gelf_getshdr(scn, &sh) == nullptr || sh.sh_type != SHT_PROGBITS) continue;
    if (!(sh.sh_flags & SHF_ALLOC) || vaddr < sh.sh_addr || vaddr - sh.sh_addr >= sh.sh_size) {
      continue;
    }
    Elf_Data* data = elf_getdata(scn, nullptr);
    if (data == nullptr || data->d_buf == nullptr || data->d_size != sh.sh_size) return {};
    return {static_cast<const uint8_t*>(data->d_buf), sh.sh_addr, sh.sh_size};
  }
  return {};
}

}  // namespace

bool parse_lsda(const uint8_t* lsda, const uint8_t* end, uint64_t lsda_vaddr,
                uint64_t func_start, bool elf64, std::vector<uint64_t>* out) {
  const uint8_t* p = lsda;
  auto vaddr_of = [&](const uint8_t* q) { return lsda_vaddr + static_cast<uint64_t>(q - lsda); };
  if (p >= end) return false;
  const uint8_t lpstart_encoding = *p++;
  uint64_t lpstart = func_start;
  if (lpstart_encoding != kPeOmit &&
      !read_pointer(p, end, lpstart_encoding, vaddr_of(p), elf64, false, &lpstart)) {
    return false;
  }
  if (p >= end) return false;
  const uint8_t ttype_encoding = *p++;
  uint64_t ignored;
  if (ttype_encoding != kPeOmit && !read_uleb(p, end, &ignored)) return false;
  if (p >= end) return false;
  const uint8_t callsite_encoding = *p++;
  // Call-site fields are offsets: a format, never an application.
  if (callsite_encoding == kPeOmit || (callsite_encoding & ~kPeFormatMask) != 0) return false;
  uint64_t table_len;
  if (!read_uleb(p, end, &table_len) || table_len > static_cast<uint64_t>(end - p)) return false;
  const uint8_t* table_end = p + table_len;
  while (p < table_end) {
    uint64_t start, len, pad, action;
    if (!read_encoded(p, table_end, callsite_encoding, elf64, false, &start) ||
        !read_encoded(p, table_end, callsite_encoding, elf64, false, &len) ||
        !read_encoded(p, table_end, callsite_encoding, elf64, false, &pad) ||
        !read_uleb(p, table_end, &action)) {
      return false;
    }
    if (pad != 0) out->push_back(elf64 ? lpstart + pad : (lpstart + pad) & 0xffffffffu);
  }
  return true;
}

// Decodes every FDE's own initial_location and address_range (libdw's frame queries narrow
// [start, end) to the CFA row around an address, not the whole function) and follows its
// LSDA pointer.
void EhFrame::load(Elf* elf) {
  if (loaded_) return;
  loaded_ = true;
  size_t shstrndx = 0;
  if (elf_getshdrstrndx(elf, &shstrndx) != 0) return;
  Elf_Scn* eh_frame = nullptr;
  GElf_Shdr sh;
  for (Elf_Scn* scn = elf_nextscn(elf, nullptr); scn != nullptr; scn = elf_nextscn(elf, scn)) {
    if (gelf_getshdr(scn, &sh) == nullptr || sh.sh_type != SHT_PROGBITS) continue;
    const char* name = elf_strptr(elf, shstrndx, sh.sh_name);
    if (name != nullptr && std::strcmp(name, ".eh_frame") == 0) {
      eh_frame = scn;
      break;
    }
  }
  if (eh_frame == nullptr) return;
  Elf_Data* data = elf_getdata(eh_frame, nullptr);
  const unsigned char* ident = reinterpret_cast<const unsigned char*>(elf_getident(elf, nullptr));
  if (data == nullptr || data->d_buf == nullptr || ident == nullptr) return;
  const bool elf64 = ident[EI_CLASS] == ELFCLASS64;
  const bool msb = ident[EI_DATA] == ELFDATA2MSB;
  const auto* base = static_cast<const uint8_t*>(data->d_buf);
  const uint8_t* section_end = base + data->d_size;
  auto vaddr_of = [&](const uint8_t* q) { return sh.sh_addr + static_cast<uint64_t>(q - base); };

  std::unordered_map<Dwarf_Off, CieInfo> cies;
  auto cie_of = [&](Dwarf_Off cie_offset) -> const CieInfo& {
    auto it = cies.find(cie_offset);
    if (it != cies.end()) return it->second;
    Dwarf_CFI_Entry entry;
    Dwarf_Off next;
    CieInfo info;
    if (dwarf_next_cfi(ident, data, true, cie_offset, &next, &entry) == 0 &&
        dwarf_cfi_cie_p(&entry)) {
      info = parse_cie(entry.cie, elf64, msb);
    }
    return cies.emplace(cie_offset, info).first->second;
  };

  SectionBytes lsda_section;  // the last one found: every LSDA is usually in one section
  Dwarf_Off offset = 0;
  while (offset != static_cast<Dwarf_Off>(-1) && offset < data->d_size) {
    Dwarf_CFI_Entry entry;
    Dwarf_Off next = static_cast<Dwarf_Off>(-1);
    int r = dwarf_next_cfi(ident, data, true, offset, &next, &entry);
    if (r > 0) break;
    if (r < 0) {
      if (next == static_cast<Dwarf_Off>(-1) || next <= offset) break;
      offset = next;
      continue;
    }
    offset = next;
    if (dwarf_cfi_cie_p(&entry)) continue;  // decoded on demand by cie_of
    const CieInfo& cie = cie_of(entry.fde.CIE_pointer);
    if (!cie.ok) continue;
    const uint8_t* p = entry.fde.start;
    const uint8_t* fde_end = std::min(entry.fde.end, section_end);
    if (p < base || p >= fde_end) continue;
    uint64_t start, range;
    if (!read_pointer(p, fde_end, cie.fde_encoding, vaddr_of(p), elf64, msb, &start)) continue;
    if (!read_encoded(p, fde_end, cie.fde_encoding & kPeFormatMask, elf64, msb, &range)) continue;
    if (range == 0) continue;
    const FdeRange fde{start, start + range};
    fdes_.push_back(fde);
    if (!cie.has_z || cie.lsda_encoding == kPeOmit) continue;
    uint64_t aug_len;
    if (!read_uleb(p, fde_end, &aug_len) || aug_len > static_cast<uint64_t>(fde_end - p)) {
      unreadable_.push_back(fde);
      continue;
    }
    const uint8_t* aug_end = p + aug_len;
    // A zero LSDA pointer: the function has no call sites that need one.
    const uint8_t* q = p;
    uint64_t raw;
    if (read_encoded(q, aug_end, cie.lsda_encoding & kPeFormatMask, elf64, msb, &raw) &&
        raw == 0) {
      continue;
    }
    uint64_t lsda;
    if (!read_pointer(p, aug_end, cie.lsda_encoding, vaddr_of(p), elf64, msb, &lsda)) {
      unreadable_.push_back(fde);
      continue;
    }
    if (!lsda_section.contains(lsda)) lsda_section = section_at(elf, lsda);
    if (!lsda_section.contains(lsda) ||
        !parse_lsda(lsda_section.data + (lsda - lsda_section.addr),
                    lsda_section.data + lsda_section.size, lsda, start, elf64, &landing_pads_)) {
      unreadable_.push_back(fde);
    }
  }
  std::sort(fdes_.begin(), fdes_.end(),
            [](const FdeRange& a, const FdeRange& b) { return a.start < b.start; });
  std::sort(landing_pads_.begin(), landing_pads_.end());
  landing_pads_.erase(std::unique(landing_pads_.begin(), landing_pads_.end()),
                      landing_pads_.end());
}

const FdeRange* EhFrame::covering(uint64_t vaddr) const {
  auto it = std::upper_bound(fdes_.begin(), fdes_.end(), vaddr,
                             [](uint64_t a, const FdeRange& f) { return a < f.start; });
  if (it == fdes_.begin()) return nullptr;
  --it;
  return vaddr < it->end ? &*it : nullptr;
}

void EhFrame::landing_pads_in(uint64_t start, uint64_t end, std::vector<uint64_t>* out) const {
  for (auto it = std::lower_bound(landing_pads_.begin(), landing_pads_.end(), start);
       it != landing_pads_.end() && *it < end; ++it) {
    out->push_back(*it);
  }
}

}  // namespace probefs::tracee
