// A perf probe spec on one object -> the definitions perf probe would write for it: through
// the DWARF when the spec needs it or the object has it (dwarf_points, dwarf_vars), else
// through the symbol table (function entries, +OFFS, %return, raw arguments, $retval), as
// perf probe does for %return and for objects without debuginfo.
#pragma once

#include <string>
#include <vector>

#include "tools/debuginfo.h"
#include "tools/elf_image.h"
#include "tools/probe_spec.h"
#include "tools/result.h"
#include "tools/trace_probe.h"

namespace probefs::tools {

struct FinderOptions {
  size_t max_probes = 128;     // --max-probes
  bool kprobe_syntax = false;  // -k: MOD:SYM+OFF and @SYM globals
  bool no_inlines = false;     // --no-inlines (PlaceQuery::no_inlines)
  std::string source_prefix;   // -s (PlaceQuery::source_prefix)
};

// The group perf gives probes of an object: "probe_" + its basename up to the first
// character that cannot be in a name ("libc.so.6" -> "probe_libc").
std::string default_group(const std::string& path);

// The spec's place as perf shows it back: FUNC[+OFF][:LINE][%return][;PTN][@SRC], or
// @SRC:LINE / @SRC;PTN (a zero offset or line is none).
std::string point_text(const ProbePoint& p);

// Whether SPEC can only be placed with DWARF (a source file or line, a lazy pattern, a
// variable argument).
bool needs_dwarf(const ProbeSpec& spec);

// The probes of SPEC in IMAGE, DBG its DWARF or nullptr. Each gets the group and the event
// name perf would choose before it makes them unique (the caller does, against the events
// already defined). NOTES receives perf's informational lines ("Target program is compiled
// without optimization. Skipping prologue." ...). An empty result is an error:
// "Probe point 'SPEC' not found." (-ENOENT).
Result<std::vector<TraceProbe>> find_probes(const ElfImage& image, const DebugInfo* dbg,
                                            const ProbeSpec& spec, const FinderOptions& options,
                                            std::vector<std::string>* notes);

// The places of SPEC for -V: "@<SYM+OFF>" with the variables available there.
struct VarsAtPlace {
  std::string where;                    // "price_order+0", "main+588"
  std::vector<std::string> variables;   // "int\tdiscount" (available_variables)
};
Result<std::vector<VarsAtPlace>> variables_at(const ElfImage& image, const DebugInfo& dbg,
                                              const ProbeSpec& spec, bool externs,
                                              const FinderOptions& options, bool range = false);

}  // namespace probefs::tools
