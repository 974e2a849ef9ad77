// Probe points from DWARF: where a spec's FUNC, FUNC:RLN, FUNC+OFFS, FUNC;PTN, SRC:ALN or
// SRC;PTN lands, as perf probe finds it, and -L's listing of the lines that can be probed.
//
// The rules (perf probe's, so that both write the same definitions):
//   - FUNC: every DW_TAG_subprogram named FUNC (a glob) that has code, at its entry; when
//     it is only inlined, the entry of every inlined instance. In each compile unit the
//     first match is taken unless FUNC is a glob.
//   - At -O0 (the CU's producer says -O0 or no -O) the entry of FUNC with variable
//     arguments moves past the prologue, to the line table's next row, so that parameters
//     are in their homes.
//   - FUNC:RLN is the line FUNC's declaration line + RLN, in FUNC's file, anywhere in the
//     CU (inlined copies included); an address whose own line (the first statement row at
//     it) is another line is refused: "This line is sharing the address with other lines."
//   - SRC:ALN: every statement row of line ALN in the CUs that include SRC.
//   - ;PTN: the rows of the lines whose text, without whitespace, matches the glob PTN.
//   - Each place's scope is the function that best explains it: FUNC when named, else the
//     function declared nearest above the line, else the innermost; its variables are what
//     the place can fetch.
#pragma once

#include <elfutils/libdw.h>

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "tools/debuginfo.h"
#include "tools/probe_spec.h"
#include "tools/elf_image.h"
#include "tools/result.h"

namespace probefs::tools {

struct DwarfPlace {
  Dwarf_Addr addr = 0;           // link-time address of the probe
  std::string symbol;            // the out-of-line function holding addr (perf's SYM+OFF)
  Dwarf_Addr symbol_entry = 0;
  std::string scope_name;        // the scope's function (the inlined one for an instance)
  std::string linkage;           // its mangled name ("" for C)
  bool inlined = false;          // the scope is an inlined instance
  std::vector<Dwarf_Die> scopes; // for VarContext: innermost first, ending with the CU
  bool prologue_skipped = false;
  Dwarf_Addr unskipped = 0;      // the entry before the prologue was skipped
};

struct PlaceQuery {
  ProbePoint point;
  bool with_variables = false;  // the spec fetches variables (the -O0 prologue rule)
  size_t max_probes = 128;
  // --no-inlines: a function known by its abstract definition (declared inline, or
  // inlined somewhere) is not searched at all, its out-of-line copies included (perf).
  bool no_inlines = false;
  // -s/--source: source files are read under this directory (source_under) instead of
  // where the DWARF says they are.
  std::string source_prefix;
  // The object's symbols, for C++ functions DWARF gives no mangled name (lambdas).
  const ElfImage* image = nullptr;
};

// perf's search for a source file under a --source directory: PREFIX/PATH, then PATH
// with its leading directories dropped one at a time (PREFIX//tools/a.c, PREFIX//a.c for
// PATH /src/tools/a.c); the first that can be read, or nullopt.
std::optional<std::string> source_under(const std::string& prefix, const std::string& path);

// Every place QUERY names, in the order perf finds them (DIE order), each address once.
// An empty list when none is found (the caller says "Probe point '...' not found.");
// errors with perf's messages ("This line is sharing the address with other lines.",
// "Too many( > N) probe point found.", "Specified offset is out of FUNC").
Result<std::vector<DwarfPlace>> find_places(const DebugInfo& dbg, const PlaceQuery& query);

// -L: perf probe's listing of RANGE: "<FUNC@SRC:START>" (or "<SRC:START>") then each line
// of the range, numbered (relative to FUNC's declaration line) where code can be probed
// and blank-numbered where it cannot, and a few lines of context after a whole function.
// -ENOENT "Specified source line is not found." when nothing matches.
// With SOURCE_PREFIX (-s), the file is looked for under it (source_under), and -ENOENT
// "Failed to find source file path." when it is not there.
Result<std::string> show_lines(const DebugInfo& dbg, const LineRange& range,
                               const std::string& source_prefix = "");

// -l: perf's reading of a probed address back into the source: "FUNC" at an entry,
// "FUNC:RLN" where a line begins at the address (the line of an inlined instance's call
// when the address is its entry; relative to the inlined function inside one), else
// "FUNC+OFF"; then "@SRC", the source file shortened to its last 30 characters at a '/'.
// -ENOENT when no function of the DWARF holds ADDR.
Result<std::string> describe_address(const DebugInfo& dbg, Dwarf_Addr addr, bool retprobe);

}  // namespace probefs::tools
