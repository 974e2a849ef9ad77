// Libraries by name and probe locations back to source (see object_lookup.h).
#include "tools/object_lookup.h"

#include <gelf.h>
#include <fcntl.h>
#include <glob.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <optional>

#include "tools/debuginfo.h"
#include "tools/dwarf_points.h"
#include "tools/elf_image.h"

namespace probefs::tools {
namespace {

// The directories of /etc/ld.so.conf and the files it includes.
void ld_so_conf_dirs(const std::string& file, std::vector<std::string>* dirs, int depth = 0) {
  std::ifstream in(file);
  for (std::string line; depth < 8 && std::getline(in, line);) {
    line = line.substr(0, line.find('#'));
    while (!line.empty() && isspace(static_cast<unsigned char>(line.back()))) line.pop_back();
    size_t start = line.find_first_not_of(" \t");
    if (start == std::string::npos) continue;
    line = line.substr(start);
    if (line.rfind("include", 0) == 0) {
      std::string pattern = line.substr(line.find_first_not_of(" \t", 7));
      glob_t g{};
      if (glob(pattern.c_str(), 0, nullptr, &g) == 0)
        for (size_t i = 0; i < g.gl_pathc; ++i) ld_so_conf_dirs(g.gl_pathv[i], dirs, depth + 1);
      globfree(&g);
    } else if (line[0] == '/') {
      dirs->push_back(line);
    }
  }
}

// The link-time address of file offset OFF: through the PT_LOAD segment that holds it.
std::optional<uint64_t> address_of(const ElfImage& image, uint64_t off) {
  size_t n = 0;
  if (elf_getphdrnum(image.elf(), &n) != 0) return std::nullopt;
  for (size_t i = 0; i < n; ++i) {
    GElf_Phdr ph;
    if (gelf_getphdr(image.elf(), static_cast<int>(i), &ph) && ph.p_type == PT_LOAD &&
        off >= ph.p_offset && off < ph.p_offset + ph.p_filesz)
      return ph.p_vaddr + (off - ph.p_offset);
  }
  return std::nullopt;
}

}  // namespace

Result<std::string> mapped_library(int pid, const std::string& name) {
  std::ifstream maps("/proc/" + std::to_string(pid) + "/maps");
  if (!maps) return make_error(-ESRCH, "No process " + std::to_string(pid) + ".");
  const bool path = name.find('/') != std::string::npos;
  std::vector<std::string> stems = {name};
  if (!path && name.rfind("lib", 0) != 0) stems.push_back("lib" + name);
  for (std::string line; std::getline(maps, line);) {
    const size_t slash = line.find('/');
    if (slash == std::string::npos) continue;
    std::string file = line.substr(slash);
    if (file.size() > 10 && file.compare(file.size() - 10, 10, " (deleted)") == 0) continue;
    if (path) {
      if (file == name) return file;
      continue;
    }
    const std::string base = file.substr(file.rfind('/') + 1);
    for (const std::string& stem : stems)
      if (base == stem || base.rfind(stem + ".so", 0) == 0 ||
          (stem.find(".so") != std::string::npos && base.rfind(stem, 0) == 0))
        return file;
  }
  return make_error(-ENOENT, "Failed to find the library " + name + " in process " +
                                 std::to_string(pid) + ".");
}

namespace {
// An ELF object, not what else a library directory holds under a library's name: the
// development package's libc.so is a linker script (GROUP ( libc.so.6 ... )).
bool is_elf_file(const std::string& path) {
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  char magic[4] = {};
  const bool elf = read(fd, magic, sizeof(magic)) == 4 && memcmp(magic, "\x7f" "ELF", 4) == 0;
  close(fd);
  return elf;
}
}  // namespace

Result<std::string> find_library(const std::string& name) {
  if (name.find('/') != std::string::npos) return name;
  std::vector<std::string> dirs;
  if (const char* llp = getenv("LD_LIBRARY_PATH")) {
    std::string s = llp;
    for (size_t at = 0; at <= s.size();) {
      size_t colon = s.find(':', at);
      if (colon == std::string::npos) colon = s.size();
      if (colon > at) dirs.push_back(s.substr(at, colon - at));
      at = colon + 1;
    }
  }
  ld_so_conf_dirs("/etc/ld.so.conf", &dirs);
  for (const char* d : {"/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib64",
                        "/usr/lib64", "/lib", "/usr/lib"})
    dirs.push_back(d);
  const bool has_lib = name.rfind("lib", 0) == 0;
  for (const std::string& dir : dirs) {
    // The name itself, then with "lib" in front, then either with a .so suffix.
    std::vector<std::string> exact = {dir + "/" + name};
    if (!has_lib) exact.push_back(dir + "/lib" + name);
    for (const std::string& p : exact)
      if (is_elf_file(p)) return p;
    for (const std::string& stem : exact) {
      glob_t g{};
      std::string pattern = stem + ".so*";
      std::string found;
      if (glob(pattern.c_str(), 0, nullptr, &g) == 0)
        for (size_t i = 0; i < g.gl_pathc && found.empty(); ++i)
          if (is_elf_file(g.gl_pathv[i])) found = g.gl_pathv[i];
      globfree(&g);
      if (!found.empty()) return found;
    }
  }
  return make_error(-ENOENT, "Failed to find the library " + name + ".");
}

std::string describe_location(const std::string& location, bool uprobe, bool retprobe,
                              const std::vector<std::string>& debuginfo_dirs) {
  if (!uprobe) {  // perf's "SYM+OFF in MOD" for a probe in a module
    size_t colon = location.find(':');
    if (colon == std::string::npos) return location;
    return location.substr(colon + 1) + " in " + location.substr(0, colon);
  }
  size_t colon = location.rfind(':');
  if (colon == std::string::npos) return location;
  std::string path = location.substr(0, colon);
  uint64_t off = strtoull(location.c_str() + colon + 1, nullptr, 0);
  auto image = ElfImage::open(path);
  if (!image) return location;
  auto dbg = DebugInfo::open(**image, debuginfo_dirs);
  std::optional<uint64_t> addr = address_of(**image, off);
  if (!dbg || !addr) return location + " in " + path;
  auto where = describe_address(**dbg, *addr, retprobe);
  return (where ? *where : location) + " in " + path;
}

}  // namespace probefs::tools
