// DebugInfo: the search for an object's DWARF (itself, .gnu_debuglink, build-id) with libdw.
#include "tools/debuginfo.h"

#include <elfutils/libdw.h>
#include <fcntl.h>
#include <libelf.h>
#include <unistd.h>

#include <cerrno>

namespace probefs::tools {
namespace {

// What makes a candidate file the right one.
enum class Check { kNone, kCrc, kBuildId };

struct Candidate {
  std::string path;
  Check check;
};

std::vector<Candidate> candidates(const ElfImage& image,
                                  const std::vector<std::string>& extra_dirs,
                                  const std::string& debug_root) {
  const std::string& link = image.debuglink();
  const std::string& id = image.build_id();
  const std::string dir = image.path().substr(0, image.path().rfind('/'));
  const std::string id_path =
      id.size() > 2 ? "/.build-id/" + id.substr(0, 2) + "/" + id.substr(2) + ".debug" : "";
  std::vector<Candidate> out;
  if (image.has_debug_info()) out.push_back({image.path(), Check::kNone});
  for (const std::string& d : extra_dirs) {
    if (!link.empty()) out.push_back({d + "/" + link, Check::kCrc});
    if (!id_path.empty()) out.push_back({d + id_path, Check::kBuildId});
    if (!link.empty()) out.push_back({d + dir + "/" + link, Check::kCrc});
  }
  if (!link.empty()) {
    out.push_back({dir + "/" + link, Check::kCrc});
    out.push_back({dir + "/.debug/" + link, Check::kCrc});
    out.push_back({debug_root + dir + "/" + link, Check::kCrc});
  }
  if (!id_path.empty()) out.push_back({debug_root + id_path, Check::kBuildId});
  return out;
}

}  // namespace

Result<std::unique_ptr<DebugInfo>> DebugInfo::open(const ElfImage& image,
                                                   const std::vector<std::string>& extra_dirs,
                                                   const std::string& debug_root) {
  for (const Candidate& c : candidates(image, extra_dirs, debug_root)) {
    // Owns what is opened until it is handed over, so every way out of one try cleans up.
    std::unique_ptr<DebugInfo> info(new DebugInfo);
    info->debug_fd_ = ::open(c.path.c_str(), O_RDONLY | O_CLOEXEC);
    if (info->debug_fd_ < 0) continue;
    if (c.check == Check::kCrc && debuglink_crc32(info->debug_fd_) != image.debuglink_crc())
      continue;
    info->debug_elf_ = elf_begin(info->debug_fd_, ELF_C_READ_MMAP, nullptr);
    if (info->debug_elf_ == nullptr || elf_kind(info->debug_elf_) != ELF_K_ELF) continue;
    if (c.check == Check::kBuildId && elf_build_id(info->debug_elf_) != image.build_id())
      continue;
    info->dwarf_ = dwarf_begin_elf(info->debug_elf_, DWARF_C_READ, nullptr);
    if (info->dwarf_ == nullptr) continue;
    info->debug_path_ = c.path;
    info->eh_cfi_ = dwarf_getcfi_elf(image.elf());
    info->debug_cfi_ = dwarf_getcfi(info->dwarf_);
    return info;
  }
  return make_error(-ENODATA, "The " + image.path() + " file has no debug information.");
}

DebugInfo::~DebugInfo() {
  if (eh_cfi_ != nullptr) dwarf_cfi_end(eh_cfi_);
  if (dwarf_ != nullptr) dwarf_end(dwarf_);  // frees debug_cfi_ too
  if (debug_elf_ != nullptr) elf_end(debug_elf_);
  if (debug_fd_ >= 0) close(debug_fd_);
}

Dwarf_CFI* DebugInfo::cfi() const { return eh_cfi_ != nullptr ? eh_cfi_ : debug_cfi_; }

}  // namespace probefs::tools
