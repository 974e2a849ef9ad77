#include "tools/sdt_notes.h"

#include <gelf.h>

#include <cerrno>
#include <cstring>

namespace probefs::tools {

namespace {

constexpr uint32_t kStapsdtNoteType = 3;

// .stapsdt.base's address, or 0 when the object has none.
uint64_t stapsdt_base(Elf* elf) {
  size_t shstrndx = 0;
  if (elf_getshdrstrndx(elf, &shstrndx) != 0) return 0;
  for (Elf_Scn* scn = elf_nextscn(elf, nullptr); scn; scn = elf_nextscn(elf, scn)) {
    GElf_Shdr sh;
    if (!gelf_getshdr(scn, &sh)) continue;
    const char* name = elf_strptr(elf, shstrndx, sh.sh_name);
    if (name && std::strcmp(name, ".stapsdt.base") == 0) return sh.sh_addr;
  }
  return 0;
}

// The NUL-terminated string at desc[*at], advancing *at past it; false past the end.
bool take_string(const char* desc, size_t size, size_t* at, std::string* out) {
  if (*at >= size) return false;
  const void* nul = std::memchr(desc + *at, '\0', size - *at);
  if (!nul) return false;
  const size_t len = static_cast<const char*>(nul) - (desc + *at);
  out->assign(desc + *at, len);
  *at += len + 1;
  return true;
}

// An x86-64 register of any width as the kernel's fetch arguments name the whole
// register (pt_regs): "eax" -> "ax", "r8d" -> "r8"; "" for one they do not have.
std::string pt_regs_name(std::string_view r) {
  static constexpr const char* kLegacy[][5] = {
      // 64, 32, 16, 8 low, pt_regs
      {"rax", "eax", "ax", "al", "ax"}, {"rbx", "ebx", "bx", "bl", "bx"},
      {"rcx", "ecx", "cx", "cl", "cx"}, {"rdx", "edx", "dx", "dl", "dx"},
      {"rsi", "esi", "si", "sil", "si"}, {"rdi", "edi", "di", "dil", "di"},
      {"rbp", "ebp", "bp", "bpl", "bp"}, {"rsp", "esp", "sp", "spl", "sp"},
  };
  for (const auto& row : kLegacy)
    for (int i = 0; i < 4; ++i)
      if (r == row[i]) return row[4];
  // r8..r15 with their b/w/d suffixes.
  if (r.size() >= 2 && r[0] == 'r' && r[1] >= '0' && r[1] <= '9') {
    size_t end = 1;
    while (end < r.size() && r[end] >= '0' && r[end] <= '9') ++end;
    const std::string_view number = r.substr(1, end - 1);
    const std::string_view suffix = r.substr(end);
    const int n = std::stoi(std::string(number));
    if (n >= 8 && n <= 15 && (suffix.empty() || suffix == "d" || suffix == "w" || suffix == "b"))
      return "r" + std::string(number);
  }
  return "";
}

bool is_number(std::string_view s) {
  if (!s.empty() && (s[0] == '-' || s[0] == '+')) s.remove_prefix(1);
  if (s.empty()) return false;
  for (char c : s)
    if (!(c >= '0' && c <= '9')) return false;
  return true;
}

}  // namespace

std::vector<SdtNote> sdt_notes(const ElfImage& image) {
  std::vector<SdtNote> out;
  Elf* elf = image.elf();
  if (!elf) return out;
  const uint64_t base_now = stapsdt_base(elf);
  for (Elf_Scn* scn = elf_nextscn(elf, nullptr); scn; scn = elf_nextscn(elf, scn)) {
    GElf_Shdr sh;
    if (!gelf_getshdr(scn, &sh) || sh.sh_type != SHT_NOTE) continue;
    Elf_Data* data = elf_getdata(scn, nullptr);
    if (!data || !data->d_buf) continue;
    size_t offset = 0, name_at = 0, desc_at = 0;
    GElf_Nhdr nh;
    while ((offset = gelf_getnote(data, offset, &nh, &name_at, &desc_at)) > 0) {
      const char* bytes = static_cast<const char*>(data->d_buf);
      if (nh.n_type != kStapsdtNoteType || nh.n_namesz != sizeof "stapsdt" ||
          std::memcmp(bytes + name_at, "stapsdt", sizeof "stapsdt") != 0 || nh.n_descsz < 24)
        continue;
      const char* desc = bytes + desc_at;
      SdtNote n;
      uint64_t base = 0;
      std::memcpy(&n.pc, desc, 8);
      std::memcpy(&base, desc + 8, 8);
      std::memcpy(&n.semaphore, desc + 16, 8);
      size_t at = 24;
      if (!take_string(desc, nh.n_descsz, &at, &n.provider) ||
          !take_string(desc, nh.n_descsz, &at, &n.name) ||
          !take_string(desc, nh.n_descsz, &at, &n.args))
        continue;
      if (base_now != 0 && base != 0) {  // prelinked: move by what .stapsdt.base moved
        n.pc += base_now - base;
        if (n.semaphore) n.semaphore += base_now - base;
      }
      out.push_back(std::move(n));
    }
  }
  return out;
}

std::vector<std::string> sdt_argument_specs(std::string_view args) {
  std::vector<std::string> out;
  size_t i = 0;
  while (i < args.size()) {
    while (i < args.size() && args[i] == ' ') ++i;
    const size_t start = i;
    while (i < args.size() && args[i] != ' ') ++i;
    if (i > start) out.emplace_back(args.substr(start, i - start));
  }
  return out;
}

Result<TraceArg> sdt_argument(std::string_view spec, int index) {
  auto unsupported = [&] {
    return make_error(-EINVAL, "Unsupported SDT argument: " + std::string(spec));
  };
  const size_t at = spec.find('@');
  if (at == std::string_view::npos) return unsupported();
  std::string_view size = spec.substr(0, at);
  const std::string_view operand = spec.substr(at + 1);
  const bool is_signed = !size.empty() && size[0] == '-';
  if (is_signed) size.remove_prefix(1);
  TraceArg arg;
  arg.name = "arg" + std::to_string(index);
  if (size == "1") arg.type = is_signed ? "s8" : "u8";
  else if (size == "2") arg.type = is_signed ? "s16" : "u16";
  else if (size == "4") arg.type = is_signed ? "s32" : "u32";
  else if (size == "8") arg.type = is_signed ? "s64" : "u64";
  else return unsupported();
  if (!operand.empty() && operand[0] == '%') {  // a register
    const std::string reg = pt_regs_name(operand.substr(1));
    if (reg.empty()) return unsupported();
    arg.fetch = "%" + reg;
    return arg;
  }
  if (!operand.empty() && operand[0] == '$') {  // an immediate
    if (!is_number(operand.substr(1))) return unsupported();
    arg.fetch = "\\" + std::string(operand.substr(1));
    return arg;
  }
  // DISP(%reg): a memory operand with a base register alone.
  const size_t open = operand.find('(');
  if (open == std::string_view::npos || operand.back() != ')' || operand[open + 1] != '%')
    return unsupported();
  const std::string_view disp = operand.substr(0, open);
  if (!disp.empty() && !is_number(disp)) return unsupported();  // sym(%rip) and the like
  const std::string reg = pt_regs_name(operand.substr(open + 2, operand.size() - open - 3));
  if (reg.empty()) return unsupported();
  std::string d = disp.empty() ? "0" : std::string(disp);
  if (d[0] != '-' && d[0] != '+') d = "+" + d;
  arg.fetch = d + "(%" + reg + ")";
  return arg;
}

}  // namespace probefs::tools
