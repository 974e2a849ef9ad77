// Text output of the trace files (daemon side; pure functions, any thread): event lines as
// `trace` and `trace_pipe` show them, the `trace` header and the `[LOST N EVENTS]` line.
// Records come from shared memory written by traced processes, so every offset inside
// one is checked before it is followed.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "events/compile.h"

namespace probefs::events {

// Names addresses for kprobe-style lines and the symbol/symstr types (daemon side).
struct SymbolInfo {
  std::string_view name;
  uint64_t offset = 0;   // addr - symbol start
  uint64_t size = 0;     // symbol size
  std::string_view module;  // printed as " [module]" when not empty
  // Printed as " (note)" after all of that when not empty: what the probe was asked for,
  // where that name resolved to code named otherwise (an IFUNC's implementation).
  std::string_view note;
};

class Symbolizer {
 public:
  virtual ~Symbolizer() = default;
  virtual bool lookup(uint64_t addr, SymbolInfo* out) = 0;
};

struct LineContext {
  std::string_view comm;  // "<...>" when the thread's name is not known
  int32_t pid = 0;
  uint32_t cpu = 0;
  uint64_t ts_ns = 0;
};

// Appends one line (with its newline):
//   "%16s-%-7d [%03d] %5s %5lu.%06lu: %s: <body>\n"
// The body is `(0xADDR)` / `(0xRET <- 0xFUNC)` for uprobe-style events and
// `(sym+off/size)` / `(caller+off/size <- func)` for kprobe-style ones, then ` name=value`
// for each argument. A synthetic event's (ev.synthetic) body is the kernel's
// print_synth_event(): `name=value` joined by blanks, each as synth_field_fmt() of its
// type, a gfp_t followed by " (FLAGS)" (with the NUL the kernel leaves in it), a stack as
// "STACK:\n" and a "=> addr\n" line per address. Returns false (and appends nothing) if
// `len` is too short.
// Safe for any bytes in rec[0, len), checked by check_record (record.h) or not: nothing
// outside them is read, and the line is bounded by the event's layout, not by lengths the
// record claims. A string prints only when its __data_loc names at most kMaxStringSize
// bytes of the record after those of the string printed before it, as the record writer
// lays them out; any other prints "(fault)", the kernel's text for a string it could not
// fetch.
bool format_trace_line(std::string& out, const CompiledEvent& ev, const LineContext& ctx,
                       const uint8_t* rec, uint32_t len, Symbolizer* sym = nullptr);

// The 12-line header of the `trace` file.
std::string trace_header(uint64_t entries, uint64_t written, int cpus);

// One line of uprobe_profile: "  %s %-44s %15lu\n" (path as defined, event, hits).
void format_profile_line(std::string& out, std::string_view path, std::string_view event,
                         uint64_t hits);

// "CPU:%d [LOST %lu EVENTS]\n"
void format_lost_events(std::string& out, uint32_t cpu, uint64_t lost);

// A symbol as trace lines name it (the kernel's %pS): NAME+0xOFF/0xSIZE [MODULE] (NOTE),
// each part present when not empty, names clipped as in trace lines.
void format_symbol(std::string& out, const SymbolInfo& si);

}  // namespace probefs::events
