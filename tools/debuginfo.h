// Finds and opens the DWARF of an object the way users of gdb and perf expect:
//   1. the object itself, when it has .debug_info;
//   2. .gnu_debuglink: DIR/NAME, DIR/.debug/NAME, /usr/lib/debug/DIR/NAME (CRC checked);
//   3. the build-id: /usr/lib/debug/.build-id/XX/REST.debug (Debian's -dbgsym packages);
//   and with --debuginfo-dir D: D/NAME, D/.build-id/XX/REST.debug and D/DIR/NAME after 1
//   and before 2 (the object's own DWARF always wins: it cannot be out of date).
// DIR is the object's directory, NAME its .gnu_debuglink, XX/REST its build-id in hex. A
// debuglink candidate must have the CRC the link records, a build-id one the object's
// build-id; a candidate that fails is passed over, and the search goes on.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "tools/elf_image.h"
#include "tools/result.h"

// libdw's handles, opaque here, declared as libdw.h declares them.
struct Dwarf;
typedef struct Dwarf_CFI_s Dwarf_CFI;

namespace probefs::tools {

// Where distributions install debug files; a parameter of DebugInfo::open for tests.
inline constexpr char kSystemDebugRoot[] = "/usr/lib/debug";

// perf's second line under "The PATH file has no debug information.".
inline constexpr char kNoDebugInfoHint[] =
    "Rebuild with -g, or install an appropriate debuginfo package.";

class DebugInfo {
 public:
  // The DWARF for IMAGE; -ENODATA with perf's "The PATH file has no debug information." when
  // none is found (perf then fails with -ENOENT, or falls back to the symbols when the probe
  // needs no DWARF). EXTRA_DIRS are searched before the system's places (--debuginfo-dir);
  // DEBUG_ROOT stands for /usr/lib/debug.
  static Result<std::unique_ptr<DebugInfo>> open(
      const ElfImage& image, const std::vector<std::string>& extra_dirs,
      const std::string& debug_root = kSystemDebugRoot);
  ~DebugInfo();
  DebugInfo(const DebugInfo&) = delete;
  DebugInfo& operator=(const DebugInfo&) = delete;

  Dwarf* dwarf() const { return dwarf_; }
  // Call frame information for CFA computations: .eh_frame of the object, else .debug_frame
  // of the debug file; either may be nullptr.
  Dwarf_CFI* cfi() const;
  const std::string& debug_path() const { return debug_path_; }  // where the DWARF came from
  // The separate debug file's ELF (its .symtab names what a stripped object's lost), or
  // nullptr when the DWARF is the object's own.
  Elf* debug_elf() const { return debug_elf_; }

 private:
  DebugInfo() = default;
  Dwarf* dwarf_ = nullptr;
  Dwarf_CFI* eh_cfi_ = nullptr;     // dwarf_getcfi_elf(image's Elf): the image must outlive this
  Dwarf_CFI* debug_cfi_ = nullptr;  // dwarf_getcfi(dwarf_): .debug_frame
  Elf* debug_elf_ = nullptr;
  int debug_fd_ = -1;
  std::string debug_path_;
};

}  // namespace probefs::tools
