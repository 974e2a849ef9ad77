// Probe points from DWARF: where a spec's FUNC, FUNC:RLN, FUNC+OFFS, FUNC%return, FUNC;PTN,
// SRC:ALN or SRC;PTN lands, as perf probe finds it: every out-of-line instance and every
// inlined instance of a function, the line table's statement addresses for a line, the
// prologue skipped at -O0 so parameters are at their homes; and -L's listing of the lines
// that can be probed.
#pragma once

#include <elfutils/libdw.h>

#include <string>
#include <vector>

#include "tools/debuginfo.h"
#include "tools/probe_spec.h"
#include "tools/result.h"

namespace probefs::tools {

struct DwarfPlace {
  Dwarf_Addr addr = 0;            // link-time address of the probe
  std::string function;           // the function the place is in, by its DWARF name; for an
                                  // inlined instance, the inlined function's
  Dwarf_Addr function_entry = 0;  // that instance's entry (perf's "FUNC+OFF")
  bool inlined = false;           // an inlined instance
  std::vector<Dwarf_Die> scopes;  // innermost first at addr, ending with the CU
  std::string file;               // source file and line of addr (perf's "SRC:LINE")
  int line = 0;
};

// Every place POINT names. -ENOENT with perf's messages when there is none:
//   "Failed to find symbol FUNC in BINARY", "Specified source line is not found.",
//   "This line is sharing the address with other lines.", "No matched lines found in SRC."
Result<std::vector<DwarfPlace>> find_places(const DebugInfo& dbg, const ProbePoint& point,
                                            const std::string& binary);

// -L: perf probe's listing of RANGE: "<FUNC@SRC:LINE>" then each line, numbered relative
// to the function (absolute for a file range), its number indented when code can be probed
// there and not when it cannot.
Result<std::string> show_lines(const DebugInfo& dbg, const LineRange& range);

// -F: the names of the functions with code in DWARF, sorted, one each; FILTER is a glob.
std::vector<std::string> dwarf_functions(const DebugInfo& dbg, const std::string& filter);

}  // namespace probefs::tools
